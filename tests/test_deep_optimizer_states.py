"""The Deep Optimizer States fork (DataStates/DeepSpeed): its keys only for its builds, its
boundary flush and its interleaved update on the toy (conftest.py), by hand.

The toy gets test_whatif.py's room (64 hardware threads, 4 threads per rank: host memory never
binds). Sub-groups: N0 = 57,472 and N1 = 57,536 elements; with prefetch_optimizer_gap 2,
sub-group 0 is stepped on the CPU (after starting the moves) and sub-group 1 on the GPU.
"""

from __future__ import annotations

import pytest
from test_whatif import N0, N1, ROOMY, US, _update

from zerosim.behaviours import fork_build
from zerosim.engine.plan import interleaved_devices
from zerosim.errors import ScenarioError
from zerosim.scenario.deepspeed import ForkBuildWarning
from zerosim.vocabulary import UpdateDevice

DOS = "0.13.3+4570a955"
GPU, CPU, PREFETCH = UpdateDevice.GPU, UpdateDevice.CPU, UpdateDevice.CPU_PREFETCH


def _fork(version: str = DOS, *, param: str = "none", **options) -> dict:
    patch = {key: dict(value) for key, value in ROOMY.items()}
    patch["runtime"]["deepspeed_version"] = version
    patch["deepspeed"] = {"zero_optimization": {
        "offload_optimizer": {"device": "cpu", "pin_memory": True, **options},
        "offload_param": {"device": param}}}
    return patch


def test_every_gap_th_sub_group_steps_on_the_gpu():
    """stage3.py `get_opt_update_device`: x % gap == 0 first, then (x + 1) % gap == 0."""
    assert interleaved_devices(7, 3) == (PREFETCH, CPU, GPU, PREFETCH, CPU, GPU, PREFETCH)
    assert interleaved_devices(4, 2) == (PREFETCH, GPU, PREFETCH, GPU)


@pytest.mark.parametrize("label", ["4570a955", "4570a95", "4570a95581d89ba7", "D18D6F81",
                                   "8074cd62", "fa8c1df2"])
def test_a_build_is_named_by_a_commit_prefix(label):
    assert fork_build(label) is not None


@pytest.mark.parametrize("label", ["", "457", "5ab4b4bd", "dd3690c5"])
def test_other_labels_are_no_fork_build(label):
    assert fork_build(label) is None


@pytest.mark.parametrize("version, options, key", [
    ("0.13.3", {"prefetch_optimizer": True, "prefetch_optimizer_gap": 3}, "prefetch_optimizer"),
    ("0.13.3", {"part_grads_async": True}, "part_grads_async"),
    ("0.13.3", {"prefetch_optimizer_gap": 3}, "prefetch_optimizer_gap"),
    (DOS, {"prefetch_optimizer": True}, "prefetch_optimizer_gap"),
    (DOS, {"prefetch_optimizer": True, "prefetch_optimizer_gap": 1}, "prefetch_optimizer_gap"),
    (DOS, {"prefetch_optimizer": True, "prefetch_optimizer_gap": 2, "ratio": 0.5},
     "prefetch_optimizer"),
    (DOS, {"prefetch_optimizer": True, "prefetch_optimizer_gap": 2, "param": "cpu"},
     "prefetch_optimizer"),
])
def test_the_fork_keys_are_refused_where_the_fork_would_not_run_them(toy, version, options,
                                                                      key):
    with pytest.raises(ScenarioError) as error:
        toy.scenario(_fork(version, **options))
    assert error.value.key_path == f"deepspeed.zero_optimization.offload_optimizer.{key}"


@pytest.mark.parametrize("commit", ["fa8c1df2", "8074cd62", "c7da512a", "5ab4b4bd"])
def test_an_earlier_or_unknown_build_is_replayed_as_the_later_step_with_a_warning(toy, commit):
    """A build labels the commit it was installed from; the code that ran may be later. A
    source build that reads the keys is the fork's: a release refuses them."""
    with pytest.warns(ForkBuildWarning, match=f"build {commit}"):
        earlier = toy.run(_fork(f"0.13.3+{commit}", prefetch_optimizer=True,
                                prefetch_optimizer_gap=2))
    later = toy.run(_fork(prefetch_optimizer=True, prefetch_optimizer_gap=2))
    assert earlier.summary["iteration_s"] == later.summary["iteration_s"]


def test_an_unknown_build_without_the_options_says_its_cache_is_emptied(toy, recwarn):
    """Without the fork's options a source build is still taken as the fork's, its CUDA cache
    emptied at every phase: an unknown commit says so, unless the scenario states the cache
    itself; a known commit says nothing."""
    with pytest.warns(ForkBuildWarning, match=r"build 5ab4b4bd is not a commit of the Deep "
                      r"Optimizer States fork zerosim knows: replayed as the fork, its CUDA "
                      r"cache emptied at every phase"):
        unknown = toy.scenario(_fork("0.13.3+5ab4b4bd"))
    assert unknown.runtime.empty_cache_each_phase
    stated = _fork("0.13.3+5ab4b4bd")
    stated["runtime"]["empty_cache_each_phase"] = False
    recwarn.clear()
    toy.scenario(stated)
    toy.scenario(_fork("0.13.3+fa8c1df2"))
    assert not [w for w in recwarn if issubclass(w.category, ForkBuildWarning)]


def test_a_replayed_build_takes_its_options_without_a_warning(toy, recwarn):
    toy.scenario(_fork(part_grads_async=True))
    assert not [w for w in recwarn if issubclass(w.category, ForkBuildWarning)]


def test_part_grads_async_casts_on_the_gpu_and_does_not_block_the_backward(toy):
    """`copy_(grad, non_blocking=True)`: PyTorch casts on the source device and copies the
    fp32 gradient D2H into the pinned buffer; no pageable temporary, no page zeroing."""
    blocking = toy.run(_fork())
    asynchronous = toy.run(_fork(part_grads_async=True))
    spans = asynchronous.spans
    backward = spans[spans.phase == "backward"]
    assert backward[backward.op.str.startswith("zero pages")].empty
    fp32 = backward[(backward.stream == "pcie.d2h") & backward.op.str.startswith("fp32 grad")]
    assert fp32.bytes.sum() == 4 * (N0 + N1)
    assert set(fp32.op.str.endswith("(pinned)")) == {True}
    phases = "backward_boundary"
    assert (asynchronous.summary["phases_s"][phases] < blocking.summary["phases_s"][phases])


def test_the_gpu_sub_groups_gradients_stay_in_hbm(toy):
    """Sub-group 1's gradients are copied into a GPU buffer in the accumulation dtype (the
    fork's `prefetch_optimizer_gpu_fp32_grads`, 16-bit here: 2 B x N1); only sub-group 0's go
    to the host (a 2 B pageable temporary each). The step's first move casts the buffer into
    sub-group 1's fp32 gradient (4 B x N1 beside the one the model states keep from the last
    step) and frees it once cast; the step's end frees that gradient."""
    result = toy.run(_fork(prefetch_optimizer=True, prefetch_optimizer_gap=2))
    spans = result.spans
    flushes = spans[(spans.stream == "pcie.d2h") & spans.op.str.startswith("fp32 flush")]
    assert flushes.bytes.sum() == 2 * N0
    memory = result.memory
    held = memory[memory.category == "boundary grad buffer"]
    assert list(held.bytes) == [2 * N1, 0]
    fp32 = memory[memory.category == "fp32 grads (GPU)"]
    assert list(fp32.bytes) == [4 * N1, 8 * N1, 4 * N1, 0]
    cast = spans[spans.op == "grads→fp32 sub-group 1"]
    assert list(cast.stream) == ["compute"] and list(cast.phase) == ["update"]
    assert held.t_s.iloc[1] == cast.end_s.iloc[0] and fp32.t_s.iloc[1] == cast.start_s.iloc[0]


def test_the_interleaved_update_by_hand(toy):
    """After the overflow check, the fork's step (whose engine emptied the CUDA cache) first
    casts sub-group 1's gradient to a new fp32 tensor: `cudaMalloc` of 4 B x N1 = 230,144 B,
    at the 230.144 GB/s given here, 1 us on the host (dropping the 16-bit buffer and the last
    step's gradient returns 6 B x N1 to the cache, where AdamW's temporary later finds its 4 B
    x N1). Then sub-group 1's fp32 params, exp_avg and exp_avg_sq come H2D
    on three copiers at once (3 x 4 B x N1 over 10 GB/s: 69.0432 us) while the thread
    unscales sub-group 0 (8 B x N0 at 4 x 1 GB/s: 114.944 us) and steps it (N0 at 4 x 1e8/s:
    143.68 us); sub-group 1 then steps on the GPU (PyTorch's AdamW with the unscale, 88 B x N1
    at 1e12 B/s: 5.063168 us; its 16-bit cast waits for a later sub-group) while
    the helper thread casts sub-group 0: page zeroing (2 B x N0 at 2 threads x 1 GB/s:
    57.472 us), the cast (6 B x N0 at 2 GB/s: 172.416 us) and the copy into the pinned buffer
    (4 B x N0: 114.944 us), then its H2D (2 B x N0 at 10 GB/s: 11.4944 us). The step's timer
    stops when sub-group 1's Adam is done: the thread waited on the 16-bit copier when the
    helper had queued nothing, and the helper's cast and copy run on past the step (over the
    next iteration's forward), so the iteration ends with the step."""
    patch = _fork(prefetch_optimizer=True, prefetch_optimizer_gap=2)
    patch["hardware"]["gpu"] = {"cuda_malloc_GBps": {"value": 230.144, "basis": "assumed",
                                                     "source": "test"}}
    result = toy.run(patch)
    spans = result.spans.set_index("op")
    check_end = spans.loc["overflow check", "end_s"]

    def at(op: str, stream: str) -> tuple[float, float]:
        row = result.spans[(result.spans.op == op) & (result.spans.stream == stream)].iloc[0]
        return (row.start_s - check_end) / US, (row.end_s - check_end) / US

    for copier in ("params", "exp_avg", "exp_avg_sq"):
        assert at(f"{copier} h2d sub-group 1", f"copier.{copier}") == pytest.approx(
            (1, 70.0432), abs=1e-6)
    assert at("cpu adam sub-group 0", "cpu") == pytest.approx((115.944, 259.624), abs=1e-6)
    assert at("gpu adam sub-group 1", "compute") == pytest.approx((259.624, 264.687168),
                                                                   abs=1e-6)
    assert at("fp32→16-bit sub-group 0", "cpu.downscale") == pytest.approx(
        (259.624, 604.456), abs=1e-6)
    assert at("16-bit h2d sub-group 0", "copier.fp16") == pytest.approx(
        (604.456, 615.9504), abs=1e-6)
    assert _update(result) == pytest.approx(
        (check_end - spans.loc["overflow check", "start_s"]) + 264.687168 * US, rel=1e-12)
    assert result.summary["iteration_s"] == pytest.approx(check_end + 264.687168 * US,
                                                          rel=1e-12)


def test_the_interleaved_update_holds_its_buffers(toy):
    """Pinned host: every sub-group's fp32 params and an exp_avg/exp_avg_sq copy (rounded to
    powers of two), one pinned 16-bit buffer (gap - 1); HBM: one GPU sub-group's fp32 params
    and moments, and the last GPU sub-group's fp32 gradient carried to the next step."""
    result = toy.run(_fork(prefetch_optimizer=True, prefetch_optimizer_gap=2))
    first = result.memory.groupby(["device", "category"]).bytes.first()
    assert first["gpu0", "optimizer states (GPU)"] == 12 * N1
    assert first["gpu0", "fp32 grads (GPU)"] == 4 * N1
    assert first["host0", "optimizer states"] == 8 * N0  # DeepSpeedCPUAdam's, CPU sub-group
    assert first["host0", "fp32 master params (pinned)"] == 2 * 2**18  # 4 B x N -> 2^18 each
    assert first["host0", "optimizer states (pinned)"] == 4 * 2**18
    assert first["host0", "swap buffers (pinned)"] == 2**17  # 2 B x N1 = 115,072 -> 2^17
    adam = result.spans[result.spans.op == "gpu adam sub-group 1"].iloc[0]
    memory = result.memory
    workspace = memory[(memory.device == "gpu0") & (memory.category == "workspace")
                       & (memory.t_s >= adam.start_s) & (memory.t_s <= adam.end_s)]
    assert list(workspace.bytes) == [4 * N1, 0]  # AdamW's exp_avg_sq_sqrt, while it runs
    assert list(workspace.t_s) == [adam.start_s, adam.end_s]




def _hbm(result, category: str) -> list[int]:
    memory = result.memory
    return list(memory[(memory.device == "gpu0") & (memory.category == category)].bytes)


def test_the_gpu_state_buffers_follow_the_sub_group_they_hold(toy):
    """`opt_transfers` keeps one set of GPU fp32 params, exp_avg and exp_avg_sq from step to
    step, sized as the last GPU sub-group left them, and makes new ones for a GPU sub-group
    of another size; the old ones (and the gradient they carry) live on in the backup
    optimizer until that sub-group's step deletes them. sub_group_size 30000 gives sub-groups
    of 32,832, 32,896, 32,832 and 16,448 elements: GPU sub-groups 1 and 3 at gap 2, and the
    last of them is the last of all, so its fp32 gradient outlives the step."""
    patch = _fork(prefetch_optimizer=True, prefetch_optimizer_gap=2)
    patch["deepspeed"]["zero_optimization"]["sub_group_size"] = 30000
    result = toy.run(patch)
    small, large = 16448, 32896
    assert _hbm(result, "optimizer states (GPU)") == [
        12 * small, 12 * (small + large), 12 * large, 12 * (large + small), 12 * small, 0]
    assert _hbm(result, "fp32 grads (GPU)") == [
        4 * small, 4 * (small + large), 4 * large, 0, 4 * small, 0]


def test_a_gpu_sub_group_followed_by_a_cpu_one_leaves_no_gradient(toy):
    """With a `CPU_PREFETCH` sub-group after the last GPU one (five sub-groups of 20,544 and
    one of 32,832 at gap 2: GPU sub-groups 1 and 3), its move sets `.grad = None`: no fp32
    gradient outlives the step, and the buffers, all of one size, are never made anew."""
    patch = _fork(prefetch_optimizer=True, prefetch_optimizer_gap=2)
    patch["deepspeed"]["zero_optimization"]["sub_group_size"] = 20000
    result = toy.run(patch)
    assert _hbm(result, "optimizer states (GPU)") == [12 * 20544, 0]
    assert _hbm(result, "fp32 grads (GPU)") == [4 * 20544, 0, 4 * 20544, 0]


@pytest.mark.parametrize("what_if", [{"overlap_copy_back": True}, {"gpu_update_every": 2}])
def test_the_step_what_ifs_are_refused_with_the_interleaved_update(toy, what_if):
    from zerosim.errors import UnsupportedConfigError

    patch = _fork(prefetch_optimizer=True, prefetch_optimizer_gap=2)
    patch["what_if"] = what_if
    with pytest.raises(UnsupportedConfigError) as error:
        toy.scenario(patch)
    assert error.value.key_path == f"what_if.{next(iter(what_if))}"


@pytest.mark.parametrize("hardware", ["polaris-a100", "h100-jlse"])
def test_the_shipped_sweep_prices_each_option_through_the_sweep_runner(hardware):
    """`scenarios/sweeps/deep_optimizer_states.yaml` on one node of either testbed of the
    fork's runs: the asynchronous flush shortens the iteration and each gap shortens it
    further (summary-only points), the interleaved update by shortening the update; an
    unbound launch slows the plain offload's update (ranks off their own NUMA domain)."""
    from pathlib import Path

    from zerosim.sweep import load_sweep, run_point

    root = Path(__file__).resolve().parent.parent
    spec = load_sweep(root / "scenarios" / "sweeps" / "deep_optimizer_states.yaml")
    rows = [run_point(str(spec.base), {**p.overrides, "hardware": hardware}, p.point_id)
            for p in spec.points()]
    assert [r["status"] for r in rows] == ["ok"] * 6
    plain, unbound, flush, *gaps = [r["iteration_s"] for r in rows]
    assert unbound > plain > flush > max(gaps)
    assert rows[1]["phases_s.update"] > rows[0]["phases_s.update"]
    assert max(r["phases_s.update"] for r in rows[3:]) < rows[2]["phases_s.update"]


@pytest.mark.parametrize("commit, gap", [("fa8c1df2", 3), ("8074cd62", 4)])
def test_a_build_that_fixes_the_gap_supplies_it_when_the_run_gives_none(toy, commit, gap):
    with pytest.warns(ForkBuildWarning):
        scenario = toy.scenario(_fork(f"0.13.3+{commit}", prefetch_optimizer=True))
    assert scenario.deepspeed.offload_optimizer.prefetch_optimizer_gap == gap
