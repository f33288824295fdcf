"""`zerosim sensitivity`: the values tried, the elasticity arithmetic, and what the engine says
about values a configuration does or does not touch."""

import json
import math
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import invoke_for_table

from zerosim.cli import main
from zerosim.errors import ScenarioError, ScenarioWarning
from zerosim.hardware.profile import load_profile
from zerosim.hardware.provenance import parse_provenance
from zerosim.scenario import load_scenario
from zerosim.sensitivity import (
    COLUMNS,
    MORE_IS_FASTER,
    MORE_IS_SLOWER,
    Candidate,
    DoesNotFit,
    Sensitivity,
    SensitivityOutcome,
    candidates,
    elasticity,
    expected_sign,
    measure,
    sensitivity,
    steps,
)
from zerosim.stacks import load_stack

DP1 = "scenarios/llama13b_dp1.yaml"


def test_values_tried_are_a_relative_step_either_side_and_a_fraction_stops_at_one():
    assert steps("hardware.pcie.h2d_pinned_GBps", 55.0, 0.1) == (
        pytest.approx(49.5, abs=1e-12), pytest.approx(60.5, abs=1e-12), "")
    low, high, note = steps("hardware.gpu.gemm_efficiency", 0.924, 0.1)
    assert (low, high, note) == (pytest.approx(0.8316, abs=1e-12), 1.0, "")
    assert steps("hardware.gpu.memory_efficiency", 1.0, 0.1) == (0.9, None, "")
    assert steps("hardware.gpu.gemm_latency_us", 0.0, 0.1) == (None, None,
                                                                "0: no relative step")


def test_elasticity_of_a_time_inversely_proportional_to_the_value_is_minus_one():
    def time(x: float) -> float:
        return 12.0 / x

    assert elasticity(time(2.0), (1.8, time(1.8)), (2.2, time(2.2)), 2.0) == -1.0
    assert elasticity(time(2.0), None, (2.2, time(2.2)), 2.0) == -1.0
    assert elasticity(time(2.0), (1.8, time(1.8)), (2.2, None), 2.0) == -1.0


def test_elasticity_of_an_additive_part_is_its_share_of_the_time():
    """T(x) = 6 + 2 x at x = 1: central difference ln(T(1.1) / T(0.9)) / ln(1.1 / 0.9)."""
    expected = round(math.log(8.2 / 7.8) / math.log(1.1 / 0.9), 9)
    assert elasticity(8.0, (0.9, 7.8), (1.1, 8.2), 1.0) == expected


def test_elasticity_is_none_without_a_time_and_zero_without_a_change():
    assert elasticity(None, (0.9, 1.0), (1.1, 1.0), 1.0) is None
    assert elasticity(1.0, None, None, 1.0) is None
    assert elasticity(1.0, (0.9, None), (1.1, None), 1.0) is None
    zero = elasticity(3.0, (0.9, 3.0), (1.1, 3.0), 1.0)
    assert zero == 0.0 and math.copysign(1.0, zero) == 1.0


def test_a_side_that_does_not_fit_is_named_and_the_other_side_gives_the_elasticity():
    base = {"iteration": 10.0, "forward": 1.0, "backward_non_boundary": None,
            "backward_boundary": 5.0, "update": 4.0}
    c = Candidate("hardware.pcie.h2d_pinned_GBps", "measured", 50.0, 45.0, 55.0)
    high = {"status": "ok", "iteration_s": 10.0 * (50 / 55), "phases_s.forward": 1.0,
            "phases_s.backward_non_boundary": None, "phases_s.backward_boundary": 5.0,
            "phases_s.update": 4.0 * (50 / 55)}
    row, = measure([c], base, {(c.key, "low"): {"status": "oom"}, (c.key, "high"): high})
    assert row.iteration == -1.0 and row.update == -1.0
    assert row.forward == 0.0 and row.backward_non_boundary is None
    assert row.note == "at 45 (low) the configuration does not fit"


def test_candidates_are_every_numeric_value_but_the_capacities_and_keys_are_checked():
    scenario = load_scenario(DP1)
    keys = [c.key for c in candidates(scenario, 0.1)]
    assert "hardware.pcie.h2d_pinned_GBps" in keys and "stack.host.fetch_hook_us" in keys
    assert "hardware.gpu.hbm_GiB" not in keys and "hardware.host.memory_GiB" not in keys
    assert len(keys) == len(set(keys))
    with pytest.raises(ScenarioError, match=r"--key.*numeric hardware or stack value"):
        candidates(scenario, 0.1, ["hardware.gpu.hbm_GiB"])
    twice = ["stack.host.step_ms", "hardware.pcie.h2d_pinned_GBps", "stack.host.step_ms"]
    assert [c.key for c in candidates(scenario, 0.1, twice)] == twice[:2]


def test_the_leaf_hook_share_is_a_value_where_zero3_makes_leaves():
    """`host.leaf_hook_share` prices ZeRO-3 leaves: offered (and a larger one slower) where
    the scenario has leaves, not where it has none."""
    tinyllama = "scenarios/h200_vm/tinyllama_hooks.yaml"
    key = "stack.host.leaf_hook_share"
    assert key not in [c.key for c in candidates(load_scenario(tinyllama), 0.1)]
    leaves = load_scenario(tinyllama, {
        "deepspeed.zero_optimization.module_granularity_threshold": 4e6})
    assert key in [c.key for c in candidates(leaves, 0.1)] and expected_sign(key) == 1


def test_the_plain_collective_time_is_a_value_where_the_replay_makes_plain_calls():
    """`host.plain_collective_us` prices plain `deepspeed.comm` calls: offered (and a larger
    one slower) under Ulysses, not on the study's node, which makes none."""
    key = "stack.host.plain_collective_us"
    assert key not in [c.key for c in candidates(load_scenario(DP1), 0.1)]
    ulysses = load_scenario("scenarios/llama8b_ulysses_dgx_h100.yaml")
    assert key in [c.key for c in candidates(ulysses, 0.1)] and expected_sign(key) == 1


@pytest.fixture(scope="module")
def dp1():
    return sensitivity(DP1, workers=1, keys=["hardware.network.nic_GBps",
                                             "hardware.pcie.h2d_pageable_GBps",
                                             "stack.host.fetch_hook_us",
                                             "hardware.gpu.cuda_malloc_GBps",
                                             "stack.host.step_ms"])


def test_a_single_node_run_does_not_touch_the_network(dp1):
    row, = [r for r in dp1.rows if r.key == "hardware.network.nic_GBps"]
    assert [row.elasticity(q) for q in ("iteration", "forward", "backward_boundary",
                                        "update")] == [0.0, 0.0, 0.0, 0.0]
    assert row.backward_non_boundary == 0.0  # the study's DP=1 runs two micro-batches


def test_the_study_update_waits_on_the_pageable_copy_back_and_its_forward_on_the_hooks(dp1):
    rows = {r.key: r for r in dp1.rows}
    pageable, hooks = rows["hardware.pcie.h2d_pageable_GBps"], rows["stack.host.fetch_hook_us"]
    assert -1.0 < pageable.update < -0.1 and pageable.forward == 0.0
    # the host-bound forward splits between the hooks and the cudaMalloc waits of its emptied
    # cache (27.4 GB of activations reserved anew)
    malloc = rows["hardware.gpu.cuda_malloc_GBps"]
    assert 0.3 < hooks.forward <= 1.0 and hooks.update == 0.0
    assert -1.0 < malloc.forward < -0.1
    assert hooks.forward - malloc.forward == pytest.approx(1.0, abs=0.15)


def test_the_per_step_host_time_adds_once_to_the_iteration(dp1):
    """stack.host.step_ms is spent once per optimizer step on the rank's host thread, at the
    stack's 3.0 GHz scaled to the profile's 3.8: the iteration is T0 + a (x / x0 - 1)."""
    row, = [r for r in dp1.rows if r.key == "stack.host.step_ms"]
    t0 = dp1.base["iteration"]
    part = 0.071 * 3.0 / 3.8
    expected = round(math.log((t0 + 0.1 * part) / (t0 - 0.1 * part)) / math.log(1.1 / 0.9), 9)
    assert row.iteration == pytest.approx(expected, abs=2e-9)
    assert row.forward == row.update == 0.0


def test_cli_ranks_the_values_and_writes_every_row(tmp_path):
    out = tmp_path / "sens"
    output, rows = invoke_for_table(["sensitivity", DP1, "--workers", "1", "--out", str(out),
                                     "--key", "hardware.network.nic_GBps",
                                     "--key", "hardware.pcie.h2d_pageable_GBps"],
                                    out / "sensitivity.csv")
    assert "hardware.pcie.h2d_pageable_GBps" in output
    assert "1 more move the iteration by less than" in output
    assert "against physics: none" in output
    assert list(rows[0]) == list(COLUMNS)
    assert [r["key"] for r in rows] == ["hardware.pcie.h2d_pageable_GBps",
                                        "hardware.network.nic_GBps"]


def test_cli_draws_the_iteration_and_each_phase_the_scenario_runs(tmp_path):
    out = tmp_path / "sens"
    result = CliRunner().invoke(main, ["sensitivity", DP1, "--workers", "1", "--out", str(out),
                                       "--plots", "--key", "stack.host.fetch_hook_us"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [
        "alternatives.csv", "sensitivity.csv", "sensitivity.png",
        "sensitivity_backward_boundary.png",
        "sensitivity_backward_non_boundary.png", "sensitivity_forward.png",
        "sensitivity_update.png"]
    refused = CliRunner().invoke(main, ["sensitivity", DP1, "--no-files", "--plots"])
    assert refused.exit_code == 2 and "--plots writes files" in refused.output


def test_the_chart_refuses_a_time_it_does_not_know(dp1):
    from zerosim import plots

    with pytest.raises(ValueError, match="quantity: expected iteration or one of"):
        plots.sensitivity_chart(dp1, "warmup")
    assert plots.sensitivity_chart(dp1, "update").axes


def test_cli_json_and_its_refusals(tmp_path):
    ok = CliRunner().invoke(main, ["sensitivity", DP1, "--workers", "1", "--no-files", "--json",
                                   "--all", "--key", "hardware.network.nic_GBps"])
    assert ok.exit_code == 0, ok.output
    data = json.loads(ok.output)
    assert data["rows"][0]["elasticity_iteration"] == 0.0
    assert data["against_physics"] == [] and data["rows"][0]["against_physics"] is False
    bad = CliRunner().invoke(main, ["sensitivity", DP1, "--no-files", "--key", "gpu.bogus"])
    assert bad.exit_code == 2 and "--key" in bad.output
    oom = CliRunner().invoke(main, ["sensitivity", DP1, "--no-files", "--workers", "1",
                                    "--set", "hardware.gpu.hbm_GiB=4",
                                    "--key", "hardware.network.nic_GBps"])
    assert oom.exit_code == 3 and "does not fit" in oom.output


def test_a_scenario_that_does_not_fit_is_refused_by_the_library_too():
    with pytest.raises(DoesNotFit):
        sensitivity(DP1, overrides={"hardware.gpu.hbm_GiB": 4}, workers=1,
                    keys=["hardware.network.nic_GBps"])


def test_a_fitted_or_measured_value_may_state_its_standard_error_and_nothing_else_may():
    fitted = parse_provenance({"value": 3.1, "basis": "fitted", "source": "a fit",
                               "stderr_pct": 5}, "p.yaml", "cpu.page_zeroing_GBps")
    assert fitted.stderr == 0.05 and fitted.describe_basis() == "fitted ±5%"
    assert fitted.as_dict() == {"value": 3.1, "basis": "fitted", "source": "a fit",
                                "stderr_pct": 5.0}
    for basis, pct, message in (("assumed", 5, "only on a measured or fitted value"),
                                ("measured", 0, r"in \(0, 1000\]"),
                                ("measured", True, r"in \(0, 1000\]"),
                                ("measured", "5%", r"in \(0, 1000\]")):
        with pytest.raises(ScenarioError, match=rf"p.yaml: x.stderr_pct: expected .*{message}"):
            parse_provenance({"value": 1, "basis": basis, "source": "s", "stderr_pct": pct},
                             "p.yaml", "x")


SHIPPED_PROFILES = ("h100-jlse", "polaris-a100", "dgx-a100", "dgx-h100", "dgx-h200",
                    "p4d-24xlarge", "gh200")


@pytest.mark.parametrize("name", SHIPPED_PROFILES)
def test_every_standard_error_a_shipped_source_states_is_also_its_stderr_pct(name):
    """A fitted or measured value whose source says "standard error N%" carries it as a
    number too (what sensitivity uses), the text's N being that number rounded."""
    provenance = {**load_profile(name).provenance,
                  **{f"{stack}.{k}": p for stack in ("megatron-deepspeed", "hf-transformers")
                     for k, p in load_stack(stack).provenance.items()}}
    for key, prov in provenance.items():
        stated = re.search(r"standard error (\d+)%", prov.source)
        if prov.basis not in ("fitted", "measured") or stated is None:
            continue
        assert prov.stderr is not None, key
        assert round(100 * prov.stderr) == int(stated.group(1)), key


def _row(key: str, iteration: float | None, stderr: float | None) -> Sensitivity:
    return Sensitivity(key, "fitted", 1.0, 0.9, 1.1, iteration, None, None, None, None,
                       stderr=stderr)


def test_the_stated_errors_add_in_quadrature_weighted_by_their_elasticities():
    outcome = SensitivityOutcome("s", "h", 0.1, {}, [
        _row("a", -0.5, 0.04), _row("b", 0.2, 0.10), _row("c", 0.9, None),
        _row("d", None, 0.3)])
    sigma, count = outcome.stated_sigma()
    assert count == 2
    assert sigma == pytest.approx(math.sqrt(0.02 ** 2 + 0.02 ** 2), abs=1e-15)
    assert outcome.rows[0].as_row()["iteration_sigma_pct"] == pytest.approx(2.0, abs=1e-12)
    assert outcome.rows[2].as_row()["iteration_sigma_pct"] is None


@pytest.mark.parametrize("name", SHIPPED_PROFILES)
def test_every_value_sensitivity_moves_has_the_direction_its_physics_allows(name):
    """A larger bandwidth, rate, clock, efficiency or thread count can only shorten a time, a
    larger latency, fixed cost, host time or contention only lengthen it; the one value that
    can do either is the bandwidth share between copies and CPU kernels."""
    keys = {c.key for c in candidates(load_scenario(DP1, {"hardware": name}), 0.1)}
    either = {k for k in keys if expected_sign(k) == 0}
    assert either <= {"hardware.host.dma_memory_weight"}, either
    assert not MORE_IS_FASTER & MORE_IS_SLOWER


def _signed(key: str, iteration: float | None) -> Sensitivity:
    return Sensitivity(key, "assumed", 1.0, 0.9, 1.1, iteration, None, None, None, None)


def test_a_value_moving_the_iteration_against_its_physics_is_named():
    bandwidth, latency = "hardware.pcie.h2d_pinned_GBps", "hardware.pcie.latency_us"
    weight = "hardware.host.dma_memory_weight"
    outcome = SensitivityOutcome("s", "h", 0.1, {}, [
        _signed(bandwidth, 0.004), _signed(latency, -0.02), _signed(weight, 0.5),
        _signed("hardware.nvlink.bus_GBps", 0.03), _signed("stack.host.step_ms", None),
        _signed("hardware.gpu.hbm_GBps", -0.4)])
    assert [r.key for r in outcome.against_physics()] == ["hardware.nvlink.bus_GBps", latency]
    assert outcome.rows[3].as_row()["against_physics"] is True
    assert outcome.rows[0].as_row()["against_physics"] is False


def test_no_value_moves_the_study_run_against_its_physics(dp1):
    assert dp1.against_physics() == []
    assert {expected_sign(r.key) * r.iteration >= 0 for r in dp1.rows} == {True}


@pytest.mark.filterwarnings("ignore::zerosim.errors.ScenarioWarning")  # a step's rates disagree
def test_no_value_moves_a_polaris_run_against_its_physics():
    """Every value of a bound DP=4 Polaris run (the fork's build c7da512a), each moved 10% both
    ways: none lengthens the iteration by being larger where it can only give more of a
    resource, or shortens it where it can only add work (`benchmarks/physics.py` runs the
    same check over twenty configurations)."""
    outcome = sensitivity("scenarios/calibration/polaris/polaris-5.95b-dp4-mb1-ga1-sg1e08.yaml",
                          workers=1)
    signed = [r for r in outcome.rows if expected_sign(r.key) and r.iteration is not None]
    assert len(signed) >= 40
    assert outcome.against_physics() == []
    assert min(expected_sign(r.key) * r.iteration for r in signed) >= 0


@pytest.mark.filterwarnings("error::zerosim.errors.ScenarioWarning")
def test_a_warning_a_step_brings_is_in_its_values_note_not_on_the_terminal():
    """Polaris's HBM streaming rate (0.79 of peak) stepped down to 0.711 puts the GEMMs' and
    the strided and softmax kernels' rates (0.79, 0.791, 0.79) above it, which the profile
    warns about: that side's run stands, and its warnings are in the value's note."""
    outcome = sensitivity("scenarios/calibration/polaris/polaris-5.95b-dp4-mb1-ga1-sg1e08.yaml",
                          workers=1, keys=["hardware.gpu.memory_efficiency"])
    row, = outcome.rows
    assert row.low == pytest.approx(0.711) and row.iteration is not None
    assert row.note.count("at 0.711 (low) the scenario warns: profile polaris-a100: gpu.") == 3


def test_the_scenarios_own_warnings_are_shown_once(tmp_path, recwarn):
    """The command shows them as it loads the scenario (`warning: ...`), and nothing after."""
    scenario = tmp_path / "hpz.yaml"
    text = Path(DP1).read_text().replace("    stage: 3\n",
                                         "    stage: 3\n    zero_hpz_partition_size: 2\n")
    assert "zero_hpz_partition_size" in text
    scenario.write_text(text)
    result = CliRunner().invoke(main, ["sensitivity", str(scenario), "--workers", "1",
                                       "--no-files", "--key", "hardware.network.nic_GBps"])
    assert result.exit_code == 0, result.output
    assert result.output.count("zero_hpz_partition_size") == 1
    assert "warning: " in result.output
    assert [w for w in recwarn if issubclass(w.category, ScenarioWarning)] == []
