"""The study's proposed optimisations and Twin-Flow, each on the toy (conftest.py), by hand.

The toy here gets 64 hardware threads and 4 threads per rank, so that no CPU kernel waits for
threads and host memory never binds: every overlap below is exact arithmetic.
Sub-groups: 57,472 and 57,536 elements (sub_group_size 50000 over the 115,008 parameters).
"""

import pytest

from zerosim.behaviours import resolve_behaviours
from zerosim.scenario.version import parse_version

N0, N1 = 57_472, 57_536
US = 1e-6
ROOMY = {"hardware": {"host": {"cores_per_socket": 64}},
         "runtime": {"cpu_threads_per_rank": 4}}


def _update(result):
    p = result.phases
    row = p[p.phase == "update"].iloc[0]
    return row.end_s - row.start_s


def _with(patch, **what_if):
    merged = {key: dict(value) for key, value in patch.items()}
    merged["what_if"] = what_if
    return merged


def test_overlapping_the_copy_back_hides_sub_group_0s_copy_back(toy):
    """Unscale of sub-group 1 (8 B x N1 at 4 threads x 1 GB/s = 115.072 us) plus its Adam
    (N1 at 4 x 1e8/s = 143.84 us) outlast sub-group 0's copy-back: page zeroing (2 B x N0 at
    2 threads x 1 GB/s = 57.472 us), cast (6 B x N0 at 2 GB/s = 172.416 us) and the pageable
    H2D (2 B x N0 at 5 GB/s = 22.9888 us), 252.8768 us in all, which therefore vanishes."""
    serial = _update(toy.run(ROOMY))
    overlapped = toy.run(_with(ROOMY, overlap_copy_back=True))
    assert serial - _update(overlapped) == pytest.approx(252.8768 * US, rel=1e-9)
    spans = overlapped.spans
    casts = spans[spans.stream == "cpu.copy-back"]
    adam1 = spans[spans.op == "cpu adam sub-group 1"].iloc[0]
    cast0 = casts[casts.op == "cast fp32→16-bit sub-group 0"].iloc[0]
    assert cast0.start_s < adam1.end_s  # the copy-back runs beside the next Adam


def test_buffered_boundary_grads_flush_in_the_background(toy):
    plain = toy.run(ROOMY)
    buffered = toy.run(_with(ROOMY, buffer_boundary_grads=True))
    spans = buffered.spans
    assert spans[spans.op.str.startswith("zero pages")].empty  # no fresh pageable temporaries
    flushes = spans[(spans.stream == "pcie.d2h") & spans.op.str.startswith("async flush")]
    assert flushes.bytes.sum() == 2 * (N0 + N1)  # the 16-bit partition, once, pinned
    assert set(flushes.op.str.endswith("(pinned)")) == {True}
    memory = buffered.memory
    held = memory[memory.category == "boundary grad buffer"]
    assert held.bytes.max() > 0 and held.bytes.iloc[-1] == 0
    phase = plain.summary["phases_s"]["backward_boundary"]
    assert buffered.summary["phases_s"]["backward_boundary"] < phase


def test_boundary_grads_are_not_buffered_when_hbm_has_no_room(toy):
    """HBM set to exactly the plain run's peak: when the one bucket (2 B x 115,008) is reduced,
    it does not fit beside what is allocated, so the flush falls back to DeepSpeed's own path
    and the run is identical to the plain one."""
    peak = toy.run().summary["peak_hbm_GiB"]
    tight = {"hardware": {"gpu": {"hbm_GiB": {"value": peak, "basis": "assumed",
                                               "source": "test"}}}}
    plain = toy.run(tight)
    asked = toy.run(_with(tight, buffer_boundary_grads=True))
    assert plain.status == asked.status == "ok"
    assert asked.summary["iteration_s"] == plain.summary["iteration_s"]
    assert (asked.memory.category == "boundary grad buffer").sum() == 0


IN0, IN1 = 16 * N0 / 10e9, 16 * N1 / 10e9
"""Sub-group state (fp32 master, Adam moments, fp32 gradient: 16 B/element) into HBM over
pinned PCIe at 10 GB/s."""
STEP0, STEP1 = 42 * N0 / 1e12 + 12 * N0 / 10e9, 42 * N1 / 1e12 + 12 * N1 / 10e9
"""The GPU step (42 B/element at 1e12 B/s), then the state back (12 B/element at 10 GB/s)."""


def _gpu_spans(result):
    spans = result.spans
    steps = spans[spans.stream == "optimizer.gpu"].set_index("op")
    arrivals = spans[spans.stream == "optimizer.gpu.in"].set_index("op")
    return arrivals, steps


def test_every_second_sub_group_steps_on_the_gpu(toy):
    """Sub-group 1's state comes in on a stream of its own, the GPU steps it and sends it back
    on another; sub-group 0 steps on the CPU."""
    result = toy.run(_with(ROOMY, gpu_update_every=2))
    spans = result.spans
    assert spans[spans.op == "cpu adam sub-group 1"].empty
    assert len(spans[spans.op == "cpu adam sub-group 0"]) == 1
    arrivals, steps = _gpu_spans(result)
    arrival, step = arrivals.loc["state in sub-group 1"], steps.loc["gpu adam sub-group 1"]
    assert arrival.end_s - arrival.start_s == pytest.approx(IN1, rel=1e-9)
    assert step.start_s == arrival.end_s
    assert step.end_s - step.start_s == pytest.approx(STEP1, rel=1e-9)
    state = spans[spans.op.str.startswith("state sub-group 1")]
    assert sorted(state.bytes) == [12 * N1, 16 * N1]


def test_the_next_sub_groups_state_comes_in_while_the_last_goes_out(toy):
    """Both sub-groups on the GPU, two states fit in HBM: sub-group 1's state crosses H2D
    right after sub-group 0's (as sub-group 0 is stepped and sent back D2H), so the update's
    GPU part is IN0 + IN1 + STEP1, not IN0 + STEP0 + IN1 + STEP1."""
    arrivals, steps = _gpu_spans(toy.run(_with(ROOMY, gpu_update_every=1)))
    t0 = arrivals.loc["state in sub-group 0"].start_s
    assert arrivals.loc["state in sub-group 1"].start_s == pytest.approx(t0 + IN0, rel=1e-9)
    assert steps.loc["gpu adam sub-group 0"].end_s == pytest.approx(t0 + IN0 + STEP0, rel=1e-9)
    assert steps.loc["gpu adam sub-group 1"].start_s == pytest.approx(t0 + IN0 + IN1,
                                                                      rel=1e-9)
    assert steps.loc["gpu adam sub-group 1"].end_s == pytest.approx(t0 + IN0 + IN1 + STEP1,
                                                                    rel=1e-9)


def test_with_room_for_one_state_the_next_waits_for_the_last_to_go_out(toy):
    """HBM set to what the update starts with plus one and a half sub-groups' state: one
    buffer, so sub-group 1's state comes in only once sub-group 0's is back on the host."""
    roomy = toy.run(_with(ROOMY, gpu_update_every=1))
    arrivals, _ = _gpu_spans(roomy)
    memory = roomy.memory
    gpu = memory[(memory.device == "gpu0") & (memory.t_s < arrivals.start_s.min())]
    before = gpu.groupby("category").bytes.last().sum()
    hbm_GiB = (before + 1.5 * 16 * N1) / 2**30
    tight = {**ROOMY, "hardware": {**ROOMY["hardware"], "gpu": {"hbm_GiB": {
        "value": hbm_GiB, "basis": "assumed", "source": "test"}}}}
    arrivals, steps = _gpu_spans(toy.run(_with(tight, gpu_update_every=1)))
    t0 = arrivals.loc["state in sub-group 0"].start_s
    assert arrivals.loc["state in sub-group 1"].start_s == pytest.approx(t0 + IN0 + STEP0,
                                                                         rel=1e-9)
    assert steps.loc["gpu adam sub-group 1"].end_s == pytest.approx(
        t0 + IN0 + STEP0 + IN1 + STEP1, rel=1e-9)


def _assert_twin_flow(result, *, gpu: tuple[int, int], cpu: int) -> None:
    """Sub-group `gpu` = (index, size) has its Adam state (8 B a parameter) in HBM and steps
    there, 94 B x size at 1e12 B/s; the other's state, of `cpu` elements, is in host memory."""
    memory = result.memory
    gpu_states = memory[(memory.device == "gpu0") & (memory.category == "optimizer states (GPU)")]
    host_states = memory[(memory.device == "host0") & (memory.category == "optimizer states")]
    group, size = gpu
    assert gpu_states.bytes.max() == 8 * size
    assert host_states.bytes.max() == 8 * cpu
    spans = result.spans
    step = spans[spans.op == f"gpu adam sub-group {group}"].iloc[0]
    assert step.end_s - step.start_s == pytest.approx(94 * size / 1e12, rel=1e-9)


def test_twin_flow_keeps_the_last_sub_group_on_the_gpu(toy):
    """ratio 0.5 with two sub-groups: int(0.5 x 2) = 1 sub-group on the CPU (the first), the
    last on the GPU (stage3.py `subgroup_to_device`): its fp32 state is in HBM, its gradient
    never crosses PCIe at the boundary, and its step runs on the GPU: PyTorch's AdamW with the
    unscale (88 B) and the cast to 16 bits (6 B), 94 B x N1 at 1e12 B/s."""
    result = toy.run({"deepspeed": {"zero_optimization": {"offload_optimizer": {"ratio": 0.5}}}})
    _assert_twin_flow(result, gpu=(1, N1), cpu=N0)
    spans = result.spans
    flushed = spans[(spans.stream == "pcie.d2h") & spans.op.str.startswith("fp32 flush")]
    assert flushed.bytes.sum() == 2 * N0


def test_twin_flow_keeps_the_first_sub_group_on_the_gpu_from_deepspeed_0_18(toy):
    """From DeepSpeed 0.18.0 stage3.py puts sub-group i on the CPU when i >= int((1 - ratio)
    x n): ratio 0.5 over two sub-groups steps the first (N0) on the GPU, 94 B x N0 at 1e12
    B/s, and the second is flushed and stepped on the CPU."""
    result = toy.run({"deepspeed": {"zero_optimization": {"offload_optimizer": {"ratio": 0.5}}},
                      "runtime": {"deepspeed_version": "0.18.0"}})
    _assert_twin_flow(result, gpu=(0, N0), cpu=N1)
    spans = result.spans
    assert not (spans.op == "gpu adam sub-group 1").any()
    flushed = spans[(spans.stream == "pcie.d2h") & spans.op.str.startswith("fp32 grad")]
    assert flushed.bytes.sum() == 4 * N1


@pytest.mark.parametrize(("version", "ratio", "count", "on_gpu"), [
    ("0.17.6", 0.9, 10, {9}), ("0.18.0", 0.9, 10, set()), ("0.18.0", 0.9, 37, {0, 1, 2}),
    ("0.17.6", 0.9, 37, {33, 34, 35, 36}), ("0.19.5", 0.25, 4, {0, 1, 2})])
def test_twin_flow_sub_groups_on_the_gpu_by_release(version, ratio, count, on_gpu):
    """DeepSpeed's own floating-point products: (1 - 0.9) x 10 is 0.9999..., so from 0.18.0
    ratio 0.9 over ten sub-groups steps none on the GPU; before, int(0.9 x 10) = 9 on the
    CPU leaves the last one there."""
    from zerosim.engine.plan import _gpu_subgroups

    first = resolve_behaviours(parse_version(version)).twin_flow_gpu_subgroups_first
    assert _gpu_subgroups(count, ratio, first) == frozenset(on_gpu)


def test_what_ifs_are_off_by_default(toy):
    assert toy.scenario().what_if.model_dump() == {
        "overlap_copy_back": False, "buffer_boundary_grads": False, "gpu_update_every": 0}
