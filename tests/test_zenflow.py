"""ZenFlow (`zero_optimization.zenflow`, DeepSpeed 0.17.5+) on the toy (conftest.py), by hand.

The toy model has N = 115,008 parameters; at DP=1 the partition is all of them, and with
`topk_ratio` 0.5 ZenFlow selects 57,504 gradient elements. Unbound at DP=1 from DeepSpeed
0.17.6 the optimizer process gets the toy's 4 cores less the ceil(0.5 x 4) = 2 the training
process keeps: 2 threads. Host memory never binds on the toy.
"""

from __future__ import annotations

import pytest

from zerosim.api import simulate_summary
from zerosim.engine.plan import plan_of
from zerosim.errors import ScenarioError, UnsupportedConfigError
from zerosim.hardware import costs
from zerosim.hardware.profile import load_profile
from zerosim.shipped import CHECKOUT
from zerosim.validation.offload_binding import load_offload_study, timed_step_s

N = 115_008
SELECTED = N // 2
US = 1e-6


def _zenflow(version: str = "0.17.6", stage: int = 2, **options) -> dict:
    settings = {"update_interval": 2, "overlap_step": True, "topk_ratio": 0.5} | options
    return {"runtime": {"deepspeed_version": version},
            "deepspeed": {"zero_optimization": {"stage": stage, "zenflow": settings}}}


def _span(result, op: str, stream: str) -> tuple[float, float]:
    spans = result.spans
    row = spans[(spans.op == op) & (spans.stream == stream)].iloc[0]
    return row.start_s / US, row.end_s / US


def test_a_window_of_update_interval_steps(toy):
    """DeepSpeed makes update_interval the gradient accumulation; the micro-batch stays the
    config's."""
    scenario = toy.scenario(_zenflow(update_interval=3))
    assert scenario.deepspeed.gradient_accumulation_steps == 3
    assert scenario.deepspeed.train_micro_batch_size_per_gpu == 1
    assert scenario.deepspeed.to_dict()["zero_optimization"]["zenflow"]["update_interval"] == 3
    phases = toy.run(_zenflow(update_interval=3)).phases
    assert list(phases.phase) == ["forward", "backward"] * 3 + ["update"]


def test_the_overlapped_window_by_hand(toy):
    """The optimizer process steps the previous window from the iteration's start: Adam over N
    at 2 threads x 1e8/s (575.04 us), then `stale_param.copy_(p.data.clone())`: the clone's
    fresh pages zeroed (4 B x N at 2 threads x 1 GB/s, 230.016 us) and 16 B x N at 2 GB/s
    (920.064 us), to 1725.12 us, long after the window's two steps. The boundary's step waits
    for it, then copies the snapshot back: a pageable fp32 H2D (4 B x N at 5 GB/s, 92.0064 us)
    and its cast on the GPU (6 B x N, 0.690048 us); the host unscales this window's gradients
    (8 B x N at 4 threads x 1 GB/s, 230.016 us) and launches the selective step over the
    57,504 selected elements: the saved columns copied in (4 B each) with the AdamW's first
    kernels (20 B) and the column gather (4 B, strided), 1.610112 us; after the step counts,
    the rest (20 B) and the scatter back (4 B), 1.380096 us."""
    result = toy.run(_zenflow())
    assert _span(result, "cpu adam sub-group 0 (previous window)", "cpu.zenflow") == (
        pytest.approx(0.0), pytest.approx(575.04))
    assert _span(result, "stale snapshot sub-group 0", "cpu.zenflow") == (
        pytest.approx(575.04), pytest.approx(1725.12))
    assert _span(result, "fp32 params sub-group 0 (pageable)", "pcie.h2d") == (
        pytest.approx(1725.12), pytest.approx(1817.1264))
    assert _span(result, "unscale sub-group 0", "cpu") == (
        pytest.approx(1817.1264), pytest.approx(2047.1424))
    assert _span(result, "zenflow step: columns and adamw", "compute") == (
        pytest.approx(2047.1424), pytest.approx(2048.752512))
    iteration = 2048.752512 + 1.380096
    assert result.summary["iteration_s"] / US == pytest.approx(iteration, rel=1e-12)
    assert result.summary["zenflow_step_s"] / US == pytest.approx(iteration / 2, rel=1e-12)


def test_the_selective_work_after_each_reduction_by_hand(toy):
    """After the bucket's reduce-scatter, on the reduction stream: the owner's gather of its
    selected rows and the copy into the flat buffer (4 passes of 2 B x 57,504) and each
    param's clone (2 passes): 0.690048 us; then a step's AdamW in two launches around the read
    of the step counts, or at the boundary the saved columns (a strided gather and a clone,
    0.460032 us)."""
    result = toy.run(_zenflow())
    spans = result.spans[result.spans.stream == "reduce"]
    select = spans[spans.op.str.startswith("zenflow select")]
    assert list(select.micro_batch) == [0, 1]
    assert ((select.end_s - select.start_s) / US).tolist() == pytest.approx([0.690048] * 2)
    first = spans[(spans.micro_batch == 0) & spans.op.str.startswith("zenflow")]
    assert list(first.op) == ["zenflow select 21 params", "zenflow adamw 21 params",
                              "zenflow adamw 21 params (after the step counts)"]
    (save,) = spans[spans.op.str.startswith("zenflow save")].itertuples()
    assert save.micro_batch == 1
    assert (save.end_s - save.start_s) / US == pytest.approx(0.460032)


def test_the_gradients_are_copied_into_the_bucket_transposed(toy):
    """ZenFlow's `grad_reduc.permute(...).contiguous()` before the copy: 4 passes of the
    gradient's bytes instead of 2 (the toy's strided rate is its contiguous one)."""
    plain = toy.run({"deepspeed": {"zero_optimization": {"stage": 2}},
                     "runtime": {"deepspeed_version": "0.17.6"}}).spans
    zen = toy.run(_zenflow()).spans

    def copy_s(spans) -> float:
        row = spans[spans.op == "copy grad lm_head"].iloc[0]
        return row.end_s - row.start_s

    assert copy_s(zen) == pytest.approx(2 * copy_s(plain), rel=1e-12)


def test_the_native_worker_writes_the_snapshot_as_it_steps(toy):
    """From 0.19.3 one pass, the snapshot written beside the param (no clone), and the
    copy-back casts on the CPU into a pageable 16-bit temporary, then a blocking H2D."""
    result = toy.run(_zenflow("0.19.5"))
    worker = result.spans[result.spans.stream == "cpu.zenflow"]
    assert list(worker.op) == ["cpu adam sub-group 0 (previous window)"]
    assert (worker.end_s.iloc[0] - worker.start_s.iloc[0]) / US == pytest.approx(575.04)
    h2d = result.spans[(result.spans.stream == "pcie.h2d") & (result.spans.phase == "update")]
    assert list(h2d.op) == ["params sub-group 0 (pageable)"]
    assert list(h2d.bytes) == [2 * N]
    assert h2d.start_s.iloc[0] >= worker.end_s.iloc[0]


def test_without_overlap_step_the_boundary_steps_on_the_cpu_then_the_selection(toy):
    """ZenFlowZeroOptimizerSequential: ZeRO-1/2's own CPU step at the boundary, no optimizer
    process, then the selective step."""
    result = toy.run(_zenflow(overlap_step=False))
    spans = result.spans
    assert spans[spans.stream == "cpu.zenflow"].empty
    update = spans[spans.phase == "update"]
    ops = list(update.sort_values("start_s").op)
    assert ops.index("cpu adam sub-group 0") < ops.index("zenflow step: columns and adamw")


def test_the_overlapped_step_holds_two_of_each_buffer(toy):
    """Host: two fp32 gradient buffers and two of each Adam moment (the process double-buffers
    them by window), the stale snapshot, all in shared (pageable) memory; HBM: the selective
    AdamW's two moments over the selected columns, in the params' 16 bits."""
    first = toy.run(_zenflow()).memory.groupby(["device", "category"]).bytes.first()
    assert first["host0", "fp32 grads (pageable)"] == 2 * 4 * N
    assert first["host0", "optimizer states"] == 2 * 8 * N
    assert first["host0", "optimizer states (pageable)"] == 4 * N
    assert first["host0", "fp32 master params (pageable)"] == 4 * N
    assert first["gpu0", "optimizer states (GPU)"] == 2 * 2 * SELECTED


@pytest.mark.parametrize(("version", "bound", "reserved", "ranks", "threads"), [
    ("0.17.5", False, 0.5, 2, 128),  # 256 logical CPUs // 2 ranks, whatever the binding
    ("0.17.6", False, 0.5, 2, 32),   # 128 physical // 2, less ceil(0.5 x 64)
    ("0.17.6", True, 0.5, 2, 32),    # the launcher's 64 cores a rank, less 32
    ("0.17.6", True, 0.0, 2, 64),    # nothing kept: every core
    ("0.17.6", True, 1.0, 2, 64),    # everything kept: DeepSpeed gives the process all
    ("0.17.6", True, 0.5, 8, 8),     # 16 cores a rank, less 8
])
def test_the_optimizer_process_cores(version, bound, reserved, ranks, threads):
    """`start_optimizer_process` on a DGX A100 (2 x 64 cores, 2 threads each)."""
    from zerosim.behaviours import resolve_behaviours
    from zerosim.scenario.version import parse_version

    split = resolve_behaviours(parse_version(version)).zenflow_worker_affinity_split
    profile = load_profile("dgx-a100")
    assert costs.zenflow_worker_threads(profile, ranks, ranks, bound=bound,
                                        reserved_share=reserved, split=split) == threads


@pytest.mark.parametrize(("patch", "key"), [
    (_zenflow("0.17.4"), "deepspeed.zero_optimization.zenflow"),
    ({**_zenflow(), "deepspeed": {"zero_optimization": {
        "stage": 2, "offload_optimizer": {"device": "none"},
        "zenflow": {"update_interval": 2}}}},
     "deepspeed.zero_optimization.offload_optimizer.device"),
    ({**_zenflow(), "deepspeed": {"zero_optimization": {
        "stage": 2, "overlap_comm": False, "zenflow": {"update_interval": 2, "offload": True}}}},
     "deepspeed.zero_optimization.overlap_comm"),
    (_zenflow(update_interval=0), "deepspeed.zero_optimization.zenflow.update_interval"),
    (_zenflow(select_interval=4), "deepspeed.zero_optimization.zenflow.select_interval"),
    (_zenflow(select_strategy="step"), "deepspeed.zero_optimization.zenflow.select_interval"),
    (_zenflow(select_strategy="step", select_interval=1),
     "deepspeed.zero_optimization.zenflow.select_interval"),
])
def test_what_deepspeed_refuses_is_refused(toy, patch, key):
    with pytest.raises(ScenarioError) as error:
        toy.scenario(patch)
    assert error.value.key_path == key


@pytest.mark.parametrize(("patch", "key"), [
    (_zenflow(stage=3), "deepspeed.zero_optimization.stage"),
    (_zenflow(update_interval="auto"), "deepspeed.zero_optimization.zenflow.update_interval"),
])
def test_what_zerosim_does_not_replay_is_refused(toy, patch, key):
    with pytest.raises(UnsupportedConfigError) as error:
        toy.scenario(patch)
    assert error.value.key_path == key


def test_the_timed_step_of_a_window_is_its_phases_over_its_steps():
    """Four steps: 4 forwards of 0.5 s, 3 non-boundary backwards of 1 s, the boundary's 2 s
    and the update's 1 s make 8 s, 2 s a step."""
    summary = {"status": "ok", "iteration_s": 8.25, "zenflow_step_s": 8.25 / 4,
               "phases_s": {"forward": 0.5, "backward_non_boundary": 1.0,
                            "backward_boundary": 2.0, "update": 1.0}}
    assert timed_step_s(summary) == 2.0


def test_offloaded_selective_moments_cross_pcie_at_each_step(toy):
    """`offload`: the selective AdamW's moments live in pinned host memory; each `group_step`
    brings them in (2 x 2 B x 57,504) and sends them back; each param's two are pinned
    apart."""
    result = toy.run(_zenflow(offload=True))
    moments = result.spans[result.spans.op == "zenflow moments (pinned)"]
    assert list(moments.stream) == ["pcie.h2d", "pcie.d2h"]
    assert list(moments.bytes) == [4 * SELECTED] * 2
    first = result.memory.groupby(["device", "category"]).bytes.first()
    sizes = [2 * p.numel // 2 for p in plan_of(toy.scenario(_zenflow())).all_params] * 2
    assert first["host0", "optimizer states (pinned)"] == sum(map(costs.pinned_bytes, sizes))
    on_gpu = result.memory[(result.memory.device == "gpu0")
                           & (result.memory.category == "optimizer states (GPU)")]
    assert list(on_gpu.bytes) == [4 * SELECTED, 0]  # only while the one group_step runs


ZENFLOW_SCENARIO = CHECKOUT / "scenarios" / "dgx_a100_offload" / "qwen2.5-3b-zenflow.yaml"


def test_the_shipped_scenario_is_the_study_run_it_names():
    """scenarios/dgx_a100_offload/qwen2.5-3b-zenflow.yaml replays the blog's bound run with
    the new worker binding, as `zerosim validate` does from the plain scenario."""
    (run,) = [r for r in load_offload_study().runs
              if r.name == "qwen2.5-3b ZenFlow, bound, new worker binding"]
    shipped = simulate_summary(ZENFLOW_SCENARIO)
    validated = simulate_summary(run.scenario, run.overrides)
    assert shipped["iteration_s"] == validated["iteration_s"]
    assert shipped["zenflow_step_s"] == pytest.approx(shipped["iteration_s"] / 4, rel=1e-15)


def test_run_prints_the_time_per_training_step():
    from click.testing import CliRunner

    from zerosim.cli import main

    result = CliRunner().invoke(main, ["run", str(ZENFLOW_SCENARIO), "--no-files"])
    assert result.exit_code == 0, result.output
    assert "a window of 4 training steps (update_interval)" in result.output
    assert "s per training step" in result.output


def test_zero1_reduces_at_every_step_under_zenflow(toy):
    """engine.py reduces ZeRO-1's gradients after every backward when ZenFlow runs (`elif
    self.zenflow: reduce_gradients`), not at the boundary only."""
    spans = toy.run(_zenflow(stage=1)).spans
    reductions = spans[spans.op_kind == "reduce_scatter"]
    assert sorted(set(reductions.micro_batch)) == [0, 1]
    plain = toy.run({"runtime": {"deepspeed_version": "0.17.6"},
                     "deepspeed": {"gradient_accumulation_steps": 2,
                                   "zero_optimization": {"stage": 1}}}).spans
    assert sorted(set(plain[plain.op_kind == "reduce_scatter"].micro_batch)) == [1]


def test_tune_refuses_a_zenflow_scenario():
    """ZenFlow fixes the stage, the offload and the accumulation that tune moves."""
    from zerosim.tune import TuneError, tune

    with pytest.raises(TuneError, match=r"zero_optimization\.zenflow"):
        tune(ZENFLOW_SCENARIO)


def test_a_selection_every_few_steps_is_said_not_to_be_replayed(toy):
    from zerosim.scenario.support import UnreplayedSelectionWarning

    with pytest.warns(UnreplayedSelectionWarning, match="select_interval: 4 steps"):
        toy.scenario(_zenflow(select_strategy="step", select_interval=4))


def test_only_what_zenflow_shares_leaves_pinned_memory(toy):
    """`share_memory_` moves the fp32 master, the gradient buffers and the snapshot; the host
    accumulator and the 16-bit copy-back buffer stay pinned (`pin_memory`)."""
    first = toy.run(_zenflow("0.17.6")).memory.groupby(["device", "category"]).bytes.first()
    assert first["host0", "grad accumulation (pinned)"] == 2 * N
    assert first["host0", "params 16-bit (pinned)"] == costs.pinned_bytes(2 * N)


def test_a_sweep_of_zenflow_points_shows_and_ranks_by_the_time_per_step():
    from zerosim.sweep.report import TABLE_METRICS, _metrics, _step_s

    plain = {"iteration_s": "3.0", "zenflow_step_s": ""}
    windows = [{"iteration_s": "4.0", "zenflow_step_s": "2.0"},
               {"iteration_s": "6.0", "zenflow_step_s": "0.75"}]
    assert _metrics([plain]) == TABLE_METRICS
    assert list(_metrics([plain, *windows]))[:2] == ["iteration_s", "zenflow_step_s"]
    assert sorted([plain, *windows], key=_step_s) == [windows[1], windows[0], plain]


def test_a_sweep_ranks_its_fastest_points_by_tokens_per_second():
    """Points that train on different batches are ranked by throughput, not by iteration;
    rows without the column (an earlier zerosim's) by the time per step."""
    from zerosim.sweep.report import fastest

    small = {"iteration_s": "2.0", "tokens_per_s": "1000", "zenflow_step_s": ""}
    large = {"iteration_s": "3.0", "tokens_per_s": "1500", "zenflow_step_s": ""}
    failed = {"iteration_s": "", "tokens_per_s": ""}
    assert fastest([small, failed, large]) == [large, small]
    old = {"iteration_s": "1.0", "zenflow_step_s": ""}
    assert fastest([small, large, old]) == [old, small, large]


@pytest.mark.parametrize(("patch", "key"), [
    (_zenflow(top_k_ratio=0.2), "deepspeed.zero_optimization.zenflow.top_k_ratio"),
    (_zenflow(cores=4), "deepspeed.zero_optimization.zenflow.cores"),
    (_zenflow("0.17.5", pt_reserved_cores_perc=0.5),
     "deepspeed.zero_optimization.zenflow.pt_reserved_cores_perc"),
])
def test_zenflow_config_refuses_keys_it_does_not_have(toy, patch, key):
    """ZenFlowConfig forbids extra keys; `pt_reserved_cores_perc` is 0.17.6's."""
    with pytest.raises(ScenarioError) as error:
        toy.scenario(patch)
    assert error.value.key_path == key
