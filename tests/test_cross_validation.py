"""Predictions on data the fit never saw (slow: marked `calibration`, run with
`python -m pytest -m calibration`).

The shared software-stack values (host time per ZeRO-3 module hook and per collective) are
fitted on one testbed and used to predict the other; Polaris's hardware values and the stack
are fitted without one model size and used to predict it. Every fit starts from the shipped
values and goes through `zerosim calibrate`, the same code path a user runs.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from zerosim.validation.calibrate import Measurement, calibrate

pytestmark = pytest.mark.calibration

DATA = Path(__file__).resolve().parents[1] / "scenarios" / "calibration"
STUDY = DATA / "study_table2.csv"
POLARIS = DATA / "polaris_runs.csv"
H100_NVME = DATA / "h100_nvme_runs.csv"
STACK = ["stack.host.fetch_hook_us=100:5000"]
"""The stack value every fit frees; kernel launches and the per-collective time are held at
their shipped values: the joint fit on all three testbeds identifies the per-collective time
only with the study's DP=1 forward, which issues no collective, beside the DP=4 forwards."""
POLARIS_HARDWARE = [
    "polaris-a100:cpu.elementwise_GBps_per_thread=0.3:20",
    "polaris-a100:cpu.cast_threads=1:64",
    "polaris-a100:cpu.oversubscription_penalty=0.001:3",
    "polaris-a100:host.memory_GBps_per_domain=12.8:51.2",
    "polaris-a100:host.remote_access_cost=1:4",
]
"""The Polaris values the joint fit identifies (scenarios/calibration/README.md); the rest
stay at their shipped values (the GEMM rates are measured, not fitted)."""
TESTBED_TOLERANCE = 0.20


def _calibrate(paths, specs, holdout):
    with ProcessPoolExecutor(2) as pool:
        fit, _ = calibrate(paths, specs, holdout=[holdout], max_iterations=10, pool=pool)
    return fit


def _held(fit, prefix: str) -> list[Measurement]:
    """The held-out rows of the testbed or model a test holds out."""
    return [m for m in fit.holdout if m.scenario.name.startswith(prefix)]


def _errors_over_repeats(rows: list[Measurement], fit) -> dict[str, float]:
    """Relative error per configuration and phase against the mean of its repeated runs, as
    `zerosim validate` judges them: a repeat's own scatter (up to 37% between two runs of one
    configuration in the Polaris data) is not the model's error. Repeats share a scenario and
    overrides, so they share one simulated value."""
    measured: dict[str, list[float]] = {}
    simulated: dict[str, float] = {}
    for m in rows:
        measured.setdefault(m.label, []).append(m.seconds)
        simulated[m.label] = fit.simulated[m.row]
    return {label: simulated[label] / (sum(values) / len(values)) - 1.0
            for label, values in measured.items()}


def _worst(rows: list[Measurement], fit, phase: str) -> float:
    return max(abs(e) for e in _errors_over_repeats(
        [m for m in rows if m.phase == phase], fit).values())


def test_stack_fitted_on_the_study_predicts_the_polaris_iterations_within_20_percent():
    fit = _calibrate([STUDY, POLARIS], STACK, "polaris-")
    assert all(m.scenario.name.startswith("llama13b") for m in fit.train)
    print("hook", fit.values, _errors_over_repeats(
        [m for m in _held(fit, "polaris-") if m.phase == "iteration"], fit))
    assert _worst(_held(fit, "polaris-"), fit, "iteration") <= TESTBED_TOLERANCE


STUDY_PHASES_PER_ITERATION = {"forward": 2, "backward_non_boundary": 1, "backward_boundary": 1,
                              "update": 1}
"""Table 2's phases are per micro-batch means; an iteration of gradient accumulation 2 is two
forwards, one backward of each kind and the update."""


@pytest.fixture(scope="module")
def fitted_on_polaris():
    """The stack on the other measurements: Polaris's runs and the MLP-Offload runs (the
    study's node, another study's runs): Polaris's forwards pin the hook where the blocking
    syncs before each MLP expose it, the H100 node's host-bound ones where they run host-bound."""
    fit = _calibrate([STUDY, POLARIS, H100_NVME], STACK, "llama13b")
    assert all(m.scenario.name.startswith(("polaris", "mlp-offload")) for m in fit.train)
    return fit


def test_stack_fitted_on_polaris_predicts_the_study_iterations_within_20_percent(
        fitted_on_polaris):
    """What the issue asks of the held-out testbed: its iterations (Table 2 gives phases; an
    iteration is their sum, two forwards for the two micro-batches)."""
    fit = fitted_on_polaris
    measured: dict[str, float] = {}
    simulated: dict[str, float] = {}
    for m in _held(fit, "llama13b"):
        count = STUDY_PHASES_PER_ITERATION.get(m.phase, 0)
        measured[m.scenario.name] = measured.get(m.scenario.name, 0.0) + count * m.seconds
        simulated[m.scenario.name] = (simulated.get(m.scenario.name, 0.0)
                                      + count * fit.simulated[m.row])
    assert sorted(measured) == ["llama13b_dp1.yaml", "llama13b_dp2.yaml", "llama13b_dp4.yaml"]
    errors = {name: simulated[name] / measured[name] - 1 for name in measured}
    print("hook", fit.values, errors)
    assert max(abs(e) for e in errors.values()) <= TESTBED_TOLERANCE, errors


def test_stack_fitted_on_polaris_predicts_every_study_phase_within_20_percent(
        fitted_on_polaris):
    """The study's forwards are host-bound: the hook time the other runs pin prices them only
    with the `cudaMalloc` time their emptied CUDA cache costs (27.4 GB of activations reserved
    anew per forward, at the study node's shipped rate). Before that mechanism the forwards
    came out 22-26% short here and this was a strict xfail."""
    fit = fitted_on_polaris
    held = [m for m in _held(fit, "llama13b") if not m.phase.startswith("probe")]
    print({m.label: round(fit.rel_error(m), 4) for m in held})
    assert max(abs(fit.rel_error(m)) for m in held) <= TESTBED_TOLERANCE


def test_fitted_without_the_11b_model_polaris_predicts_its_iterations_within_20_percent():
    fit = _calibrate([POLARIS], STACK + POLARIS_HARDWARE, "polaris-11.20b")
    held = _held(fit, "polaris-11.20b")
    assert {m.scenario.name.split("-dp")[0] for m in held} == {"polaris-11.20b"}
    print("values", fit.values, _errors_over_repeats(
        [m for m in held if m.phase == "iteration"], fit))
    assert _worst(held, fit, "iteration") <= TESTBED_TOLERANCE


def test_oversubscription_fitted_on_the_5_9b_dp4_runs_predicts_the_11b_dp4_phases():
    """The study's DP=1,2 -> DP=4 question restated where the data identifies it: on Polaris
    (64 hardware threads) one and two ranks of 32 threads do not oversubscribe, four do, so
    the 5.9B model's DP=4 runs pin the cost that the 11.2B model's DP=4 runs then test (its
    two runs apart: one ran on a slower GPU, replayed at that GPU's clock)."""
    fit = _calibrate([POLARIS], STACK + POLARIS_HARDWARE, "polaris-11.20b-dp4")
    held = _held(fit, "polaris-11.20b-dp4")
    assert {m.scenario.name for m in held} == {"polaris-11.20b-dp4-mb4-ga1-sg1e08.yaml"}
    errors = {label: round(e, 4) for label, e in _errors_over_repeats(held, fit).items()}
    print("values", fit.values, errors)
    assert len(errors) == 8  # four phases, the run on a slower GPU (row 4) apart from row 13
    assert max(abs(e) for e in errors.values()) <= 0.15, errors


def test_region_cost_fitted_on_polaris_predicts_the_study_dp4_boundary_within_5_percent():
    """The join an OpenMP region waits for while four unbound ranks' pools oversubscribe the
    node (`cpu.oversubscribed_region_ms`, one value for every profile) fitted with Polaris's
    page zeroing on the Polaris runs alone, whose unbound DP=4 backwards show it: the study's
    DP=4 boundary backward (243 casts per rank on 96-thread pools, four on 192 threads), -8.5%
    without it, is then a prediction."""
    fit = _calibrate([STUDY, POLARIS], ["cpu.oversubscribed_region_ms=0.1:10",
                                        "polaris-a100:cpu.page_zeroing_GBps=1:20"], "llama13b")
    assert all(m.scenario.name.startswith("polaris") for m in fit.train)
    boundary = [m for m in _held(fit, "llama13b_dp4") if m.phase == "backward_boundary"]
    assert len(boundary) == 1
    print("values", fit.values, fit.rel_error(boundary[0]))
    assert abs(fit.rel_error(boundary[0])) <= 0.05
