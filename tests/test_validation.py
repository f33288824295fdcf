"""Regression against the study's published measurements, through `zerosim run`'s code path.

One hardware profile (h100-jlse, ten values fitted by `zerosim calibrate` on Table 2) for every
cell; no per-cell, per-DP or per-phase factor anywhere.
"""

from pathlib import Path

import pytest
import yaml

from zerosim.validation.reference import PHASES, load_study
from zerosim.validation.validate import judge, validate

ROOT = Path(__file__).resolve().parent.parent

@pytest.fixture(scope="module")
def cells():
    found, _ = validate()
    return {(c.group, c.case, c.quantity): c for c in found}


@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("case", ["DP=1", "DP=2", "DP=4"])
def test_table2_phase_within_10_percent(cells, case, phase):
    cell = cells[("Table 2", case, phase)]
    assert abs(cell.rel_error) <= 0.10, f"{case} {phase}: {cell.simulated:.3f} s vs {cell.measured}"


@pytest.mark.parametrize("case", ["DP=1", "DP=2"])
def test_tflops_within_10_percent(cells, case):
    assert abs(cells[("Table 2", case, "TFLOPS per GPU")].rel_error) <= 0.10


def test_dp4_tflops_is_excluded_as_inconsistent_with_its_own_row(cells):
    cell = cells[("Table 2", "DP=4", "TFLOPS per GPU")]
    assert cell.status == "excluded" and "inconsistent" in cell.note
    # The study's own formula on its own phase times gives about 43; zerosim lands near it.
    assert cell.simulated == pytest.approx(43, rel=0.10)


@pytest.mark.parametrize("quantity", ["GPU memory at forward start",
                                      "activations of one micro-batch",
                                      "GPU memory during the update"])
def test_memory_observations_within_10_percent(cells, quantity):
    assert abs(cells[("memory", "DP=1", quantity)].rel_error) <= 0.10


def test_update_equal_at_dp2_and_dp4(cells):
    assert abs(cells[("observations", "DP=2,4", "update DP=4 / update DP=2")].rel_error) <= 0.10


def test_boundary_backward_share_of_the_dp1_iteration(cells):
    cell = cells[("observations", "DP=1", "boundary backward share of the iteration")]
    assert abs(cell.rel_error) <= 0.10


@pytest.mark.parametrize("size", ["7B", "13B", "30B", "70B", "130B", "175B"])
def test_table1_columns_within_8_percent(cells, size):
    """Through `zerosim estimate`'s code path; the 8% and its reason are in study.yaml."""
    (case,) = {c for g, c, _ in cells if g == "Table 1" and c.startswith(f"{size} ")}
    for quantity in ("model states", "optimizer states"):
        cell = cells[("Table 1", case, quantity)]
        assert cell.status == "pass" and abs(cell.rel_error) <= 0.08, (size, quantity)


def test_deepspeed_estimator_tables_to_the_printed_hundredth(cells):
    """Every GB DeepSpeed's docs print for t5-3b: 6 rows x 2 for ZeRO-3, 2 x 2 for ZeRO-2."""
    estimator = [c for c in cells.values() if c.group == "DeepSpeed estimator"]
    assert len(estimator) == 16
    assert all(c.absolute and c.tolerance == 0.005 for c in estimator)
    assert all(f"{c.simulated:.2f}" == f"{c.measured:.2f}" for c in estimator)
    assert {c.status for c in estimator} == {"pass"}


@pytest.mark.parametrize(("simulated", "status"), [(71.694, "pass"), (71.686, "pass"),
                                                   (71.70, "fail"), (71.68, "fail")])
def test_absolute_tolerance_is_half_the_printed_digit(simulated, status):
    cell = judge("DeepSpeed estimator", "t", "per CPU", "GB", 71.69, simulated, 0.005,
                 absolute=True)
    assert cell.status == status


def test_every_judged_cell_passes(cells):
    statuses = {c.status for c in cells.values()}
    assert statuses <= {"pass", "fail", "excluded", "reported"}
    assert [(c.case, c.quantity) for c in cells.values() if c.status == "fail"] == []


@pytest.mark.parametrize("dp", [1, 2, 4])
def test_study_scenario_files_match_the_reference_setup(dp):
    """scenarios/llama13b_dp*.yaml are the validated cases as files: keep them identical."""
    study = load_study().scenario_for(dp)
    on_disk = yaml.safe_load((ROOT / "scenarios" / f"llama13b_dp{dp}.yaml").read_text())
    on_disk["deepspeed"]["zero_optimization"]["reduce_bucket_size"] = float(
        on_disk["deepspeed"]["zero_optimization"]["reduce_bucket_size"])
    study["deepspeed"]["zero_optimization"]["reduce_bucket_size"] = float(
        study["deepspeed"]["zero_optimization"]["reduce_bucket_size"])
    for key in ("model", "sequence_length", "activation_checkpointing", "attention",
                "hardware", "data_parallel", "deepspeed", "runtime"):
        assert on_disk[key] == study[key], key


PRIOR = {
    # The values h100-jlse carried before calibration (basis: assumed), the fit's start.
    "gpu.matmul_efficiency": ("0.05:0.95", 0.55),
    "gpu.op_overhead_us": ("1:3000", 60),
    "gpu.collective_launch_us": ("1:3000", 100),
    "host.memory_GBps_per_domain": ("50:307", 126),
    "host.socket_link_GBps": ("10:128", 40),
    "cpu.adam_params_per_s_per_thread": ("5e6:2e8", 4e7),
    "cpu.elementwise_GBps_per_thread": ("0.3:20", 4),
    "cpu.page_zeroing_GBps": ("0.3:30", 3),
    "cpu.oversubscription_penalty": ("0.001:3", 0.15),
    "cpu.cast_threads": ("1:96", 16),
}


@pytest.mark.calibration
@pytest.mark.xfail(strict=True, reason=(
    "fitted on DP=1 and DP=2 only, the DP=4 update comes out 27% short (forward -5%, "
    "non-boundary backward -8%, boundary backward -8% are within 15%): with PyTorch's pool of "
    "one thread per physical core, DP=1 and DP=2 run 96 and 192 OpenMP threads on 192 "
    "hardware threads and never oversubscribe, so the oversubscription cost that the study "
    "itself blames for DP=4's flat update is not identifiable from them and stays at its prior"))
def test_fit_on_dp1_and_dp2_predicts_every_dp4_phase_within_15_percent(tmp_path):
    """Cross-validation: start from the uncalibrated values, fit on the DP=1 and DP=2 rows of
    Table 2 only, and predict the DP=4 row the fit never saw."""
    from concurrent.futures import ProcessPoolExecutor

    from zerosim.hardware.profile import builtin_profile_tree
    from zerosim.validation.calibrate import calibrate

    tree = builtin_profile_tree("h100-jlse")
    for key, (_, value) in PRIOR.items():
        section, name = key.split(".")
        tree[section][name] = {"value": value, "basis": "assumed", "source": "prior"}
    (tmp_path / "prior.yaml").write_text(yaml.safe_dump(tree))
    study = load_study()
    lines = ["scenario,overrides,phase,seconds"]
    for dp, row in study.table2.items():
        case = study.scenario_for(dp)
        case["hardware"] = {"file": "prior.yaml"}
        (tmp_path / f"dp{dp}.yaml").write_text(yaml.safe_dump(case))
        lines += [f"dp{dp}.yaml,,{phase},{row[phase]}" for phase in PHASES]
    (tmp_path / "table2.csv").write_text("\n".join(lines) + "\n")
    specs = [f"{key}={bounds}" for key, (bounds, _) in PRIOR.items()]
    with ProcessPoolExecutor(2) as pool:
        fit, _, _ = calibrate(tmp_path / "table2.csv", specs, holdout="dp4", pool=pool)
    assert {m.scenario.name for m in fit.holdout} == {"dp4.yaml"}
    errors = {m.phase: fit.rel_error(m) for m in fit.holdout}
    assert all(abs(e) <= 0.15 for e in errors.values()), errors


def test_pcie_drop_probe_is_the_dma_share_of_a_saturated_numa_domain(cells):
    """The section 3.5 probe on h100-jlse: unscale (memory-bound, 8 B/element) and a pinned H2D
    share one domain of 307 GB/s in proportion to their weights, 1 (per byte) and
    dma_memory_weight w = 0.08768: the copy gets 307 w / (1 + w) = 24.75 GB/s of its 55. The
    probe times a 4 GiB transfer, each after the profile's 10 us PCIe latency."""
    w, size, latency = 0.08768, 4 * 2**30, 10e-6
    alone = latency + size / 55e9
    shared = latency + size / (307e9 * w / (1 + w))
    expected = 1 - alone / shared
    cell = cells[("observations", "probe", "PCIe drop while unscale runs")]
    assert cell.simulated == pytest.approx(expected, rel=1e-9)
    assert cell.status == "pass"


def test_a_case_that_did_not_fit_prints_oom_not_a_number():
    from dataclasses import replace

    from zerosim.validation.validate import judge

    cell = replace(judge("g", "case", "TFLOPS per GPU", "TFLOPS", 89.0, 0.0, None,
                         excluded="does not fit in zerosim (out of HBM)"), simulated_text="oom")
    assert cell.shown("0.00") == ("oom", "")
    assert judge("g", "c", "q", "s", 2.0, 2.5, 0.5).shown("2.50") == ("2.50", "+25.0%")
