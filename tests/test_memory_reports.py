"""DeepSpeed's `memory_breakdown`: rank 0's `gc.collect()` at each of the engine's memory
reports, four per micro-batch and two per step, outside the phases' timers."""

from __future__ import annotations

import warnings

import pytest

import zerosim
from zerosim.engine.plan import plan_of
from zerosim.engine.probes import memory_reports as zerosim_memory_reports
from zerosim.errors import ScenarioError
from zerosim.runs import MEMORY_BREAKDOWN
from zerosim.scenario.deepspeed import changes_nothing, memory_reports_per_step
from zerosim.stacks import load_stack
from zerosim.validation import loop_gap, polaris

COLLECTOR = {"runtime": {"framework": {
    "host": {"gc_per_object_ns": {"value": 100, "basis": "assumed", "source": "toy"}},
    "processes": {"gc_objects": {"value": 1000, "basis": "assumed", "source": "toy"},
                  "gc_objects_per_tensor": {"value": 10, "basis": "assumed", "source": "toy"},
                  "gc_objects_per_zero3_tensor": {"value": 0, "basis": "assumed",
                                                  "source": "toy"}},
}}}
TOY_TENSORS = 2 * 9 + 3
"""Two layers of q, k, v, o, gate, up, down and two norms; the embedding, the final norm and
the untied output layer."""
REPORT_S = 100e-9 * (1000 + 10 * TOY_TENSORS)
"""One collection on the toy stack's 3 GHz reference core, which the toy profile's is."""


def _with(toy, memory_breakdown: bool, steps: int = 1) -> zerosim.Result:
    return toy.run({**COLLECTOR, "deepspeed": {"memory_breakdown": memory_breakdown,
                                               "gradient_accumulation_steps": steps}})


def test_the_toy_has_the_tensors_counted(toy):
    assert len(plan_of(toy.scenario(COLLECTOR)).all_params) == TOY_TENSORS


@pytest.mark.parametrize("steps", [1, 2])
def test_each_report_adds_one_collection_outside_the_phases(toy, steps):
    """With the GPU idle at each report, the iteration grows by the reports' collections
    exactly (4 per micro-batch, 2 per step) and no timed phase changes."""
    off, on = _with(toy, False, steps), _with(toy, True, steps)
    assert memory_reports_per_step(steps) == 4 * steps + 2
    grown = on.summary["iteration_s"] - off.summary["iteration_s"]
    assert grown == pytest.approx(memory_reports_per_step(steps) * REPORT_S, rel=1e-9)
    assert on.summary["memory_reports_s"] == pytest.approx(grown, rel=1e-9)
    assert off.summary["memory_reports_s"] == 0
    untimed = {phase for phase, s in off.summary["phases_s"].items() if s is None}
    assert untimed == {phase for phase, s in on.summary["phases_s"].items() if s is None}
    for phase, seconds in off.summary["phases_s"].items():
        if phase not in untimed:
            assert on.summary["phases_s"][phase] == pytest.approx(seconds, rel=1e-12), phase


def test_the_first_forward_starts_after_two_reports(toy):
    """The last step's report after it (the iteration runs from one step's end to the next)
    and the forward's own before it."""
    on = _with(toy, True)
    start = on.phases.set_index(["phase", "micro_batch"]).loc[("forward", 0), "start_s"]
    assert start == pytest.approx(2 * REPORT_S, rel=1e-12)


def test_a_stack_without_a_collector_time_costs_nothing(toy):
    from zerosim.scenario.support import UnpricedReportsWarning

    off = toy.run({"deepspeed": {"memory_breakdown": False}})
    with pytest.warns(UnpricedReportsWarning):
        on = toy.run({"deepspeed": {"memory_breakdown": True}})
    assert on.summary["iteration_s"] == off.summary["iteration_s"]


@pytest.mark.parametrize("value", ["sometimes", "false", "true", 0, 1])
def test_memory_breakdown_is_modelled_and_takes_only_true_or_false(value):
    """DeepSpeed tests the raw value's truth, so "false" would print the reports there."""
    assert not changes_nothing("deepspeed.memory_breakdown")
    with pytest.raises(ScenarioError) as err:
        zerosim.scenario_from_dict({
            "model": "llama2-7b", "sequence_length": 1024, "hardware": "h100-jlse",
            "deepspeed": {"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True},
                          "memory_breakdown": value}})
    assert err.value.key_path == "deepspeed.memory_breakdown"


def test_a_run_out_of_memory_has_no_report_time(toy):
    """As it has no iteration: a summary of a run that did not finish carries no time."""
    from zerosim.scenario.support import UnpricedReportsWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnpricedReportsWarning)
        result = toy.run({**COLLECTOR, "deepspeed": {"memory_breakdown": True},
                          "hardware": {"gpu": {"hbm_GiB": {"value": 0.001, "basis": "assumed",
                                                           "source": "toy"}}}})
    assert result.status == "oom"
    assert result.summary["iteration_s"] is None and result.summary["memory_reports_s"] is None


def test_the_study_format_runs_report_memory():
    """The Deep Optimizer States format's memory columns are the reports' own lines."""
    run = polaris.load_runs()[0]
    assert MEMORY_BREAKDOWN is True
    assert polaris.scenario(run)["deepspeed"]["memory_breakdown"] is True


def test_shipped_values_are_the_loop_fit():
    """The megatron-deepspeed stack's collector time and per-step loop are what
    zerosim.validation.loop_gap fits on the Polaris runs, with the per-micro-batch loop held."""
    stack = load_stack("megatron-deepspeed")
    fit = loop_gap.fit()
    assert fit.runs == 41
    assert round(fit.gc_per_object_s * 1e9) == round(stack.gc_object_s * 1e9) == 152
    assert round(fit.step_s * 1e3) == round(stack.step_s * 1e3) == 71
    assert fit.gc_per_object_se / fit.gc_per_object_s < 0.02
    assert stack.provenance["host.gc_per_object_ns"].basis == "fitted"
    assert stack.provenance["host.micro_batch_ms"].basis == "assumed"


@pytest.mark.parametrize(("stack", "name"), [("megatron-deepspeed", "gc_megatron"),
                                           ("hf-transformers", "gc_hf")])
def test_the_stacks_object_counts_are_the_probes(stack, name):
    """The counts each stack carries are its probe's lines through four processes (2-72
    layers) at ZeRO-3 and ZeRO-2, rounded: the stage-2 slope per tensor, the difference what
    ZeRO-3 adds; every process's count lies within 0.1% of its line."""
    import json
    from pathlib import Path

    folder = Path(__file__).parents[1] / "benchmarks" / "node_probe"
    lines = {}
    for stage, suffix in ((3, ""), (2, "_stage2")):
        record = json.loads((folder / f"{name}{suffix}_devbox_2026-12-05.json").read_text())
        assert record["stack"] == stack and record.get("stage", 3) == stage
        base, per_tensor = record["objects_besides_tensors"], record["objects_per_tensor"]
        for run in record["runs"]:
            assert run["objects"] == pytest.approx(base + per_tensor * run["tensors"],
                                                   rel=1e-3)
        lines[stage] = base, per_tensor
    loaded = load_stack(stack)
    assert loaded.gc_objects == pytest.approx(lines[3][0], abs=500)
    assert loaded.gc_objects == pytest.approx(lines[2][0], abs=1000)
    assert loaded.gc_objects_per_tensor == round(lines[2][1])
    assert loaded.gc_objects_per_zero3_tensor == round(lines[3][1] - lines[2][1])


def test_replicated_parameters_hold_fewer_objects(toy):
    """At stages 0-2 a report walks the per-tensor objects without ZeRO-3's."""
    objects = {stage: 1000 + (10 + 20 * (stage == 3)) * TOY_TENSORS for stage in (2, 3)}
    collector = {"runtime": {"framework": {**COLLECTOR["runtime"]["framework"], "processes": {
        **COLLECTOR["runtime"]["framework"]["processes"],
        "gc_objects_per_zero3_tensor": {"value": 20, "basis": "assumed", "source": "toy"}}}}}
    for stage in (2, 3):
        scenario = toy.scenario({**collector, "deepspeed": {
            "memory_breakdown": True, "zero_optimization": {"stage": stage}}})
        reports = zerosim_memory_reports(scenario)
        assert reports.objects == objects[stage]
        assert reports.each_s == pytest.approx(100e-9 * objects[stage], rel=1e-12)


def test_check_says_what_the_reports_cost():
    """`zerosim check`'s line and `--json` entry: ten reports a step at GA 2, each a
    collection over the stack's objects for llama13b's 243 tensors on the 3.8 GHz Xeon."""
    import json

    from click.testing import CliRunner

    from zerosim.cli import main

    objects = 421_000 + 252 * 243
    each = 152e-9 * objects * 3.0 / 3.8
    result = CliRunner().invoke(main, ["check", "scenarios/llama13b_dp4.yaml", "--json"])
    assert result.exit_code == 0, result.output
    reports = json.loads(result.output)["memory_reports"]
    assert reports["per_step"] == 10 and reports["objects"] == objects
    assert reports["each_s"] == pytest.approx(each, rel=1e-12)
    assert reports["per_step_s"] == pytest.approx(10 * each, rel=1e-12)
    text = CliRunner().invoke(main, ["check", "scenarios/llama13b_dp4.yaml"]).output
    assert "breakdown   10 memory reports a step (memory_breakdown)" in text
    assert f"{objects:,} objects" in text
    off = CliRunner().invoke(main, ["check", "scenarios/llama13b_dp4.yaml", "--json", "--set",
                                    "deepspeed.memory_breakdown=false"])
    assert "memory_reports" not in json.loads(off.output)


def test_sensitivity_moves_the_collectors_time_per_object():
    """A stack that prices the reports offers its time per object to `zerosim sensitivity`,
    a value a larger one of which can only lengthen the iteration."""
    from zerosim.scenario import load_scenario
    from zerosim.sensitivity import candidates, expected_sign

    key = "stack.host.gc_per_object_ns"
    found = {c.key: c for c in candidates(load_scenario("scenarios/llama13b_dp4.yaml"), 0.1)}
    assert found[key].value == 152 and found[key].basis == "fitted"
    assert expected_sign(key) == 1


def test_reports_on_a_stack_that_prices_no_collection_warn(toy):
    """The toy stack has no collector values: the reports would silently cost nothing."""
    from zerosim.scenario.support import UnpricedReportsWarning

    with pytest.warns(UnpricedReportsWarning, match="memory_breakdown: true is priced short"):
        toy.scenario({"deepspeed": {"memory_breakdown": True}})
    partial = {"runtime": {"framework": {
        "host": COLLECTOR["runtime"]["framework"]["host"],
        "processes": {"gc_objects_per_tensor": {"value": 10, "basis": "assumed",
                                                "source": "toy"}}}}}
    with pytest.warns(UnpricedReportsWarning, match="has no processes.gc_objects "):
        toy.scenario({**partial, "deepspeed": {"memory_breakdown": True}})
    replicated_only = {"runtime": {"framework": {
        "host": COLLECTOR["runtime"]["framework"]["host"],
        "processes": {key: value for key, value
                      in COLLECTOR["runtime"]["framework"]["processes"].items()
                      if key != "gc_objects_per_zero3_tensor"}}}}
    with pytest.warns(UnpricedReportsWarning, match="no processes.gc_objects_per_zero3_tensor"):
        toy.scenario({**replicated_only, "deepspeed": {"memory_breakdown": True}})
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnpricedReportsWarning)
        toy.scenario({**COLLECTOR, "deepspeed": {"memory_breakdown": True}})
        toy.scenario({"deepspeed": {"memory_breakdown": False}})
        toy.scenario({**replicated_only, "deepspeed": {
            "memory_breakdown": True, "zero_optimization": {"stage": 2}}})
