"""Every ZeRO mode on the engine of parts: exact toy timelines worked out by hand, and model
states tied to `zerosim estimate`.

Toy node, model and units as in `test_engine_timeline.py` (picoseconds; the toy GPU moves 1e12
HBM bytes/s). At DP=1 the partition of every parameter is the parameter (115008 elements).
"""

from __future__ import annotations

import math

import pytest
from conftest import toy_stack

import zerosim
from zerosim.engine.plan import plan_of
from zerosim.engine.states import model_states
from zerosim.errors import ScenarioError
from zerosim.estimate import estimate_model_states
from zerosim.vocabulary import BufferKind, Category, DeviceKind, OpKind, Stream

PS = 1e-12
N = 115008  # toy parameters
FORWARD_END = 1652224  # the forward of the toy at 8 tokens (test_engine_timeline.py)
BACKWARD_END = 3 * FORWARD_END + 6 * 3072  # 4975104: twice the forward, and six input-gradient
# sums of 3072 ps (test_engine_timeline.py)
COPIES_END = 5435136  # the last gradient copied into the IPG bucket (test_engine_timeline.py)
GROUPS = (57472, 57536)  # ZeRO-3 sub-groups at sub_group_size 50000
GPU_ADAM_PS = 42  # per element: unscale 8 B + Adam 28 B + cast to 16 bits 6 B, 1 pass each
OVERFLOW_CHECK_PS = 4  # one read of the 4 B fp32 gradient
NORM_PS = 18  # the fp64 norm of the 16-bit gradient: read 2 B, write 8 B and read them back
FP32_GRAD_PS = 10  # flatten the 16-bit partitions (read 2, write 2), cast (read 2, write 4)


def _no_offload(stage: int, **zero) -> dict:
    return {"deepspeed": {"zero_optimization": {"stage": stage,
                                                "offload_optimizer": {"device": "none"},
                                                **zero}}}


def _phase_ends(result) -> dict[str, float]:
    phases = result.phases
    return {f"{row.phase} {row.micro_batch}": row.end_s / PS for row in phases.itertuples()}


def _ops(result, stream: Stream, phase: str) -> list[tuple[str, float, float]]:
    """Rank 0's ops on `stream` during `phase`: (op, start_ps, end_ps)."""
    spans = result.spans
    chosen = spans[(spans.stream == stream) & (spans.phase == phase) & (spans["rank"] == 0)]
    chosen = chosen.sort_values(["start_s", "end_s"], kind="stable")
    return [(r.op, r.start_s / PS, r.end_s / PS) for r in chosen.itertuples()]


def _assert_ops(ops: list[tuple[str, float, float]],
                expected: list[tuple[str, float, float]]) -> None:
    assert [op for op, _, _ in ops] == [op for op, _, _ in expected]
    assert [t for _, *ts in ops for t in ts] == pytest.approx(
        [t for _, *ts in expected for t in ts], rel=1e-9)


# ------------------------------------------------------------------------- no offload


def test_zero3_without_offload_keeps_partitions_and_steps_on_the_gpu(toy):
    """Backward: the bucket is reduced (DP=1: `reduce_scatter_coalesced` concatenates the
    gradients into its flat buffer and pre-divides it, 2 passes over 2N B each = 920064 ps; the
    one-rank collective then moves nothing) and its partitions copied into their HBM buffer
    (2 passes over 2N B). Update: the overflow check reads the fp32 gradients (4N ps), the
    fp64 norms (18N ps), then per sub-group its fp32 gradient (10 ps/element) and its fused
    Adam (42 ps/element)."""
    result = toy.run(_no_offload(3))
    reduced = COPIES_END + 8 * N  # 6355200
    partitioned = reduced + 4 * N  # 6815232
    _assert_ops(_ops(result, Stream.REDUCE, "backward")[-2:], [
        ("reduce-scatter 0M", COPIES_END, reduced),
        ("partition grads 21 params", reduced, partitioned)])
    checked = partitioned + OVERFLOW_CHECK_PS * N  # 7275264
    normed = checked + NORM_PS * N  # 9345408
    cast0 = normed + FP32_GRAD_PS * GROUPS[0]  # 9920128
    first = cast0 + GPU_ADAM_PS * GROUPS[0]  # 12333952
    cast1 = first + FP32_GRAD_PS * GROUPS[1]  # 12909312
    second = cast1 + GPU_ADAM_PS * GROUPS[1]  # 15325824
    _assert_ops(_ops(result, Stream.COMPUTE, "update"), [
        ("overflow check", partitioned, checked),
        ("gradient norms", checked, normed),
        ("fp32 gradient sub-group 0", normed, cast0),
        ("gpu adam sub-group 0", cast0, first),
        ("fp32 gradient sub-group 1", first, cast1),
        ("gpu adam sub-group 1", cast1, second)])
    assert _phase_ends(result) == pytest.approx({"forward 0": FORWARD_END,
                                                 "backward 0": partitioned,
                                                 "update 0": 15325824})
    assert result.spans[result.spans.stream.isin([Stream.PCIE_H2D, Stream.PCIE_D2H])].empty
    assert result.summary["pcie_GB"] == {"h2d": 0.0, "d2h": 0.0}


def test_zero2_without_offload_steps_its_whole_partition_at_once(toy):
    """The backward of ZeRO-3 at DP=1 but for the reduction: one pre-divide of the bucket
    (2 passes over 2N B = 460032 ps) instead of ZeRO-3's concatenation and pre-divide; the
    norms, then one fp32 gradient and one Adam over all N elements. The bucket is the model
    (`reduce_bucket_size` N): DeepSpeed 0.13.3 divides the whole IPG buffer."""
    result = toy.run(_no_offload(2, reduce_bucket_size=N))
    partitioned = COPIES_END + 4 * N + 4 * N  # the pre-divide, then the partition copy: 6355200
    start = partitioned + OVERFLOW_CHECK_PS * N  # 6815232
    normed = start + NORM_PS * N  # 8885376
    cast = normed + FP32_GRAD_PS * N  # 10035456
    _assert_ops(_ops(result, Stream.COMPUTE, "update")[1:], [
        ("gradient norms", start, normed),
        ("fp32 gradient sub-group 0", normed, cast),
        ("gpu adam sub-group 0", cast, cast + GPU_ADAM_PS * N)])  # to 14865792
    assert result.summary["iteration_s"] == pytest.approx(14865792 * PS, rel=1e-12)


def test_zero0_reduces_nothing_during_the_backward(toy):
    """Stage 0 at DP=1: no IPG bucket, no reduction; the step follows the backward."""
    result = toy.run(_no_offload(0))
    assert _ops(result, Stream.REDUCE, "backward") == []
    assert _phase_ends(result) == pytest.approx({
        "forward 0": FORWARD_END, "backward 0": BACKWARD_END,
        "update 0": BACKWARD_END + (OVERFLOW_CHECK_PS + GPU_ADAM_PS) * N})  # 10265472


def test_zero0_all_reduces_at_the_boundary_on_the_compute_stream(toy):
    """Two ranks: after the boundary backward, one blocking ring all-reduce of the 16-bit
    gradients (2 x (2-1)/2 x 2N B = 230016 B per link at 100 GB/s = 2300160 ps)."""
    result = toy.run(_no_offload(0), gpus=2)
    ops = [op for op in _ops(result, Stream.COMPUTE, "backward") if op[0].startswith("all")]
    _assert_ops(ops, [("all-reduce 0M", BACKWARD_END, BACKWARD_END + 2300160)])


def test_zero1_without_offload_reduces_only_at_the_boundary(toy):
    """GA=2: the first backward leaves its gradients on the GPU (no bucket, no reduction), the
    boundary reduces them; ZeRO-1 keeps the full 16-bit gradients for both micro-batches."""
    result = toy.run(_no_offload(1) | {"deepspeed": {
        "gradient_accumulation_steps": 2,
        "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "none"}}}})
    spans = result.spans
    reduce = spans[spans.stream == Stream.REDUCE]
    assert set(reduce.micro_batch) == {1}
    grads = result.memory[(result.memory.device == "gpu0")
                          & (result.memory.category == Category.GRADS)]
    assert grads.bytes.max() == 2 * N


# ------------------------------------------------------------------ ZeRO-1/2, offloaded


@pytest.mark.parametrize("stage", [1, 2])
def test_zero12_offload_sends_the_fp32_gradient_per_parameter(toy, stage):
    """GA=1: after the local reduction (460032 ps) each parameter's partition gets its fp64
    norm (`set_norm_for_param_grad_in_gpu`: 2n B read, 8n B written and read back = 18n ps),
    its overflow check (`_has_inf_or_nan`: the 2n B gradient read, 26n B more over its six
    kernels = 28n ps), is cast to fp32 on the GPU (1.5 passes over 4n B = 6n ps) and copied
    D2H into pinned memory (4n B at 10 GB/s = 400n ps), one after another: 452 ps x 115008 =
    51983616 ps. The bucket is the model (`reduce_bucket_size` N), which DeepSpeed 0.13.3
    divides whole."""
    result = toy.run({"deepspeed": {"zero_optimization": {"stage": stage,
                                                          "reduce_bucket_size": N}}})
    flush = result.spans[result.spans.op_kind == OpKind.GRAD_FLUSH]
    assert list(flush.bytes) == [4 * n for n in _grad_order_numels()]
    backward_end = COPIES_END + 4 * N + 452 * N  # 57878784
    assert flush.end_s.max() / PS == pytest.approx(backward_end)
    # The update reads the overflow flag those checks set (no check of its own on the host),
    # then unscale 2000, Adam 2500, zero + cast 4000 and the pageable H2D 400 ps per element,
    # for the whole partition at once.
    update = result.phases.set_index("phase").loc["update"]
    assert update.end_s / PS - update.start_s / PS == pytest.approx(8900 * N)
    cpu = [op for op, _, _ in _ops(result, Stream.CPU, "update")]
    assert cpu == ["unscale sub-group 0", "cpu adam sub-group 0",
                   "cast fp32→16-bit sub-group 0"]


def _grad_order_numels() -> list[int]:
    from test_engine_timeline import GRAD_ORDER, PARAMS

    return [PARAMS[name] for name in GRAD_ORDER]


def test_zero2_offload_dp2_all_gathers_the_updated_params(toy):
    """After the step each rank all-gathers the 16-bit params: 2N B in one bucket."""
    result = toy.run({"deepspeed": {"zero_optimization": {"stage": 2}}}, gpus=2)
    gathers = result.spans[(result.spans.stream == Stream.ALLGATHER)
                           & (result.spans.phase == "update")]
    assert list(gathers.op) == ["all-gather updated params"] * 2
    assert list(gathers.bytes) == [2 * N, 2 * N]


# --------------------------------------------------------------- states vs the estimator

DP = 4


@pytest.fixture(scope="module")
def states_at_setup():
    """GPU levels of each category right after the model states are allocated, per stage,
    with the parameters handed to the optimizer as one group, as the estimator takes them
    (Megatron-DeepSpeed hands its norms over apart: `test_megatron_hands_the_norms_to_the_
    optimizer_as_a_group_of_their_own`)."""
    levels = {}
    for stage in (0, 1, 2, 3):
        result = zerosim.simulate("scenarios/llama13b_dp4.yaml", {
            "deepspeed.zero_optimization.stage": stage,
            "deepspeed.zero_optimization.offload_optimizer.device": "none",
            "deepspeed.zero_optimization.stage3_param_persistence_threshold": 0,
            "model": "llama2-7b", "hardware.gpu.hbm_GiB": 1000,
            "stack.optimizer.param_groups.value": "one"})
        memory = result.memory[(result.memory.device == "gpu0") & (result.memory.t_s == 0)]
        gpu = result.memory[result.memory.device == "gpu0"]
        levels[stage] = (memory.groupby("category").bytes.last().to_dict(),
                         gpu[gpu.category == Category.GRADS].bytes.max(),
                         gpu[gpu.category == Category.FP32_GRADS].bytes.max())
    return levels


MODEL_STATES = {Category.PARAMS_16BIT, Category.FP32_MASTER, Category.OPTIMIZER_STATES,
                Category.FP32_GRADS, Category.GRAD_ACCUMULATION}


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_model_states_without_offload_equal_what_zerosim_estimate_says(states_at_setup, stage):
    """Llama-2-7B (6,738,415,616 params, every tensor divisible by 4) on 4 GPUs: the model
    states the engine holds (plus, in stages 0 and 1, the full 16-bit gradients they keep, and
    in stage 3 the largest layer's gathered params and gradients) equal the estimator's
    no-offload GPU row, with its fp32 gradient partition (4 B per element of the partition P)
    read as the runtime holds gradients: stage 2 keeps its 16-bit partitions and makes the
    fp32 gradient of its one group, the whole partition, while it steps (the step's peak is
    the estimator's); stage 3 keeps its 16-bit partitions (2 B) and makes a sub-group's fp32
    gradient only while that one steps (the estimator's 4 B are 2 B more than it holds
    outside the step; in the step one sub-group's, 4 B each)."""
    from zerosim import models

    spec = models.CATALOG["llama2-7b"]
    total, largest = models.total_params(spec), models.largest_layer_params(spec)
    estimate = estimate_model_states(stage=stage, total_params=total,
                                     largest_layer_params=largest, num_gpus_per_node=DP,
                                     additional_buffer_factor=1.0)
    expected = next(r for r in estimate.rows if r.offload_optimizer == "none"
                    and r.offload_param in (None, "none")).per_gpu_bytes
    levels, grads_peak, fp32_grads_peak = states_at_setup[stage]
    held = sum(v for k, v in levels.items() if k in MODEL_STATES)
    partition = total // DP
    if stage in (0, 1):
        assert grads_peak == 2 * total
        held += grads_peak
    if stage == 2:
        assert fp32_grads_peak == 4 * partition
        held += fp32_grads_peak
    if stage == 3:
        # the larger sub-group: DeepSpeed closes one once it reaches sub_group_size (1e9)
        assert fp32_grads_peak == 4 * 1_006_672_896 and partition == 1_006_672_896 + 677_931_008
        held += 4 * largest + 2 * partition
    assert held == expected


@pytest.mark.parametrize(("version", "waits"), [("0.13.3", False), ("0.14.3", True)])
def test_zero12_from_0_14_3_the_backward_waits_for_the_last_buckets_reduction(toy, version,
                                                                              waits):
    """ZeRO-2 with overlap_comm on two GPUs, one gradient of lm_head per bucket (16384
    elements), the first of two micro-batches (at the boundary the overflow check's blocking
    copies hold the host at every bucket anyway): from 0.14.3, `average_tensor` makes the
    default stream wait for what the reduction stream holds when each bucket is reduced, the
    bucket before's reduction and partition copies included, so each wait after the first
    ends no earlier than the partition copies of the bucket before; 0.13.3 only makes the
    reduction stream wait for the default stream. The gradients are copied into the bucket
    on the default stream."""
    def backward(version: str):
        result = toy.run({"runtime": {"deepspeed_version": version}, "deepspeed": {
            "gradient_accumulation_steps": 2,
            "zero_optimization": {"stage": 2, "reduce_bucket_size": 16384}}}, gpus=2)
        spans = result.spans
        return result, spans[(spans["rank"] == 0) & (spans.phase == "backward")
                             & (spans.micro_batch == 0)]

    result, spans = backward(version)
    compute = spans[spans.stream == Stream.COMPUTE]
    stream_waits = compute[compute.op_kind == OpKind.STREAM_WAIT].sort_values("start_s")
    partitions = spans[spans.op_kind == OpKind.PARTITION_GRADS].sort_values("start_s")
    assert len(partitions) > 2
    if not waits:
        assert stream_waits.empty
        return
    assert len(stream_waits) == len(partitions)  # one per bucket, the epilogue's included
    for k in range(1, len(stream_waits)):
        assert stream_waits.end_s.iloc[k] >= partitions.end_s.iloc[k - 1]
    # The compute stream's last kernel ends later than 0.13.3's; the phase itself ends with
    # the reduction stream's partition copies (the toy's PCIe bounds them) in both.
    _, earlier = backward("0.13.3")
    assert compute.end_s.max() > earlier[earlier.stream == Stream.COMPUTE].end_s.max()
    phases = result.phases
    end = phases[(phases["rank"] == 0) & (phases.phase == "backward")
                 & (phases.micro_batch == 0)].end_s.iloc[0]
    assert end == pytest.approx(partitions.end_s.max(), rel=1e-12)


@pytest.mark.parametrize(("version", "sent_back"), [
    ("0.13.3", [True, False]),  # every micro-batch but the boundary's sends the sum back
    ("0.15.2", [False, False]),  # PR #6550: none does
    ("0.19.0", [True, True]),  # PR #7967: every one does
])
def test_zero2_offload_accumulation_by_version(toy, version, sent_back):
    """ZeRO-2 offload, GA=3: micro-batch 0 copies each partition to the host accumulator;
    micro-batches 1 and 2 bring it back H2D and add, and send the sum back D2H as the
    release's `async_accumulate_grad_in_cpu_via_gpu` does."""
    result = toy.run({"runtime": {"deepspeed_version": version}, "deepspeed": {
        "gradient_accumulation_steps": 3, "zero_optimization": {"stage": 2}}})
    spans = result.spans[result.spans.phase == "backward"]
    params = len(_grad_order_numels())
    for micro, sends in zip((1, 2), sent_back, strict=True):
        mine = spans[spans.micro_batch == micro]
        assert (mine.op_kind == OpKind.GRAD_FROM_HOST).sum() == params
        assert (mine.op_kind == OpKind.GRAD_TO_HOST).sum() == (params if sends else 0)
    first = spans[spans.micro_batch == 0]
    assert (first.op_kind == OpKind.GRAD_TO_HOST).sum() == params


@pytest.mark.parametrize(("version", "pinned", "ops", "update_ps"), [
    # up to 0.14.0: zero the pageable temporary's pages (2 B at 1 GB/s on 2 threads) and cast
    # (read 4 B, write 2 B at 1 GB/s per thread on 2) = 4000, then a 2 B pageable H2D = 400
    ("0.13.3", True, [("cpu", "cast fp32→16-bit sub-group 0", 4500, 8500),
                      ("pcie.h2d", "params sub-group 0 (pageable)", 8500, 8900)], 8900),
    # 0.14.1 (PR #5301): the fp32 partition, pinned whatever pin_memory says, H2D whole
    # (4 B at 10 GB/s = 400), then the GPU casts it (read 4 B, write 2 B at 1e12 B/s = 6)
    ("0.14.1", False, [("pcie.h2d", "fp32 params sub-group 0 (pinned)", 4500, 4900),
                       ("compute", "cast fp32→16-bit sub-group 0", 4900, 4906)], 4906),
    # 0.17.0 (PR #7309): a CPU cast into the start-up 16-bit buffer (no fresh pages: 3000),
    # then its H2D, 2 B at the pinned 10 GB/s (200) or the pageable 5 GB/s (400)
    ("0.17.0", True, [("cpu", "cast fp32→16-bit sub-group 0", 4500, 7500),
                      ("pcie.h2d", "params sub-group 0 (pinned)", 7500, 7700)], 7700),
    ("0.18.3", False, [("cpu", "cast fp32→16-bit sub-group 0", 4500, 7500),
                       ("pcie.h2d", "params sub-group 0 (pageable)", 7500, 7900)], 7900),
])
def test_zero12_offload_copy_back_by_version(toy, version, pinned, ops, update_ps):
    """ZeRO-2 offload, DP=1 (the partition is all N elements), times in ps per element from
    the update's start: unscale (2000) and CPU Adam (2500) as in every release (the overflow
    flag was set by the boundary backward's checks on the GPU), then the copy-back as the
    release's `step` does it."""
    result = toy.run({"runtime": {"deepspeed_version": version}, "deepspeed": {
        "zero_optimization": {"stage": 2, "offload_optimizer": {"pin_memory": pinned}}}})
    update = result.phases.set_index("phase").loc["update"]
    assert (update.end_s - update.start_s) / PS / N == pytest.approx(update_ps)
    spans = result.spans[(result.spans.phase == "update") & (result.spans["rank"] == 0)]
    found = []
    for stream, op, _, _ in ops:
        row = spans[(spans.stream == stream) & (spans.op == op)].iloc[0]
        found.append((stream, op, (row.start_s - update.start_s) / PS / N,
                      (row.end_s - update.start_s) / PS / N))
    assert [f[:2] for f in found] == [o[:2] for o in ops]
    assert [t for f in found for t in f[2:]] == pytest.approx(
        [t for o in ops for t in o[2:]], rel=1e-9)
    gpu = result.memory[(result.memory.device == "gpu0")
                        & (result.memory.category == Category.WORKSPACE)]
    in_update = gpu[(gpu.t_s >= update.start_s) & (gpu.t_s < update.end_s)]
    fp32_temporary = 4 * N if version == "0.14.1" else 0
    assert max(in_update.bytes, default=0) == fp32_temporary


@pytest.mark.parametrize(("version", "pin_memory", "master", "buffer"), [
    ("0.13.3", True, BufferKind.NONE, None),
    ("0.14.1", False, BufferKind.PINNED, None),
    ("0.17.0", True, BufferKind.PINNED, BufferKind.PINNED),
    ("0.18.3", False, BufferKind.NONE, BufferKind.PAGEABLE),
    ("0.18.3", True, BufferKind.PINNED, BufferKind.PINNED),
])
def test_zero12_offload_host_states_by_version(version, pin_memory, master, buffer):
    """Where stage_1_and_2.py puts the fp32 master partition (pinned always from 0.14.1,
    PR #5301; as pin_memory says from 0.18.3, PR #7689) and the 16-bit copy-back buffer of
    0.17.0 on (PR #7309); a pinned one is rounded up to a power of two, as PyTorch's caching
    host allocator pins it."""
    scenario = zerosim.load_scenario("scenarios/llama13b_dp4.yaml", {
        "runtime.deepspeed_version": version, "deepspeed.zero_optimization.stage": 2,
        "deepspeed.zero_optimization.offload_optimizer.pin_memory": pin_memory})
    plan = plan_of(scenario)
    held = model_states(scenario.deepspeed, plan, scenario.hardware, scenario.behaviours)
    host = {(h.category, h.what): h for h in held if h.device is DeviceKind.HOST}
    part = plan.partition_numel
    fp32 = host[(Category.FP32_MASTER, "fp32 partition")]
    assert fp32.buffer is master
    assert fp32.nbytes == (2 ** math.ceil(math.log2(4 * part)) if master is BufferKind.PINNED
                           else 4 * part)
    copy_back = host.get((Category.PARAMS_16BIT, "16-bit copy-back buffer"))
    assert (copy_back.buffer if copy_back else None) is buffer
    if buffer is BufferKind.PAGEABLE:
        assert copy_back.nbytes == 2 * part


@pytest.mark.parametrize(("version", "each_bucket"), [("0.17.4", False), ("0.17.5", True),
                                                      ("0.18.4", True), ("0.18.5", False)])
def test_zero12_from_0_17_5_to_0_18_4_compute_waits_for_each_bucket(toy, version, each_bucket):
    """The setting of the 0.14.3 test above. From 0.17.5 (PR #7371) to 0.18.4 (PR #7805 took
    it out), once a full bucket's reduction is issued the default stream waits for the
    reduction stream, so no backward kernel issued after that runs before the bucket's
    partition copies end: one more wait per bucket but the epilogue's."""
    result = toy.run({"runtime": {"deepspeed_version": version}, "deepspeed": {
        "gradient_accumulation_steps": 2,
        "zero_optimization": {"stage": 2, "reduce_bucket_size": 16384}}}, gpus=2)
    spans = result.spans
    spans = spans[(spans["rank"] == 0) & (spans.phase == "backward") & (spans.micro_batch == 0)]
    compute = spans[spans.stream == Stream.COMPUTE].sort_values("start_s", kind="stable")
    waits = compute[compute.op_kind == OpKind.STREAM_WAIT]
    partitions = spans[spans.op_kind == OpKind.PARTITION_GRADS].sort_values("start_s")
    buckets = len(partitions)
    assert buckets > 2
    assert len(waits) == (2 * buckets - 1 if each_bucket else buckets)
    kernels = compute[compute.op_kind != OpKind.STREAM_WAIT]
    during = sum(int(kernels.start_s.between(start, end, inclusive="neither").sum())
                 for start, end in zip(partitions.start_s, partitions.end_s, strict=True))
    if each_bucket:
        assert during == 0  # no backward kernel starts while a bucket is reduced/partitioned
    else:
        assert during > 0


@pytest.mark.parametrize(("version", "checkpointing", "counts"), [
    ("0.18.4", False, 0),
    ("0.18.5", False, 21),  # PR #7780: at each of the 21 parameters' gradient hooks
    ("0.18.5", True, 21),
    ("0.18.7", False, 1),  # PR #7886: at the backward's first hook
    ("0.18.7", True, 3),  # ... and at the first after each of the two blocks' recomputes
])
def test_gradient_hooks_count_the_used_parameters_by_version(toy, version, checkpointing,
                                                             counts):
    """ZeRO-2 without offload, at 1 us per parameter inspected: a count over the toy's 21
    parameter tensors holds the host 21 us, so the backward takes at least that many counts'
    time and at most that plus the backward of 0.18.4, which counts nothing."""
    from conftest import q, toy_stack

    stack = toy_stack()
    stack["host"]["used_param_check_us"] = q(1.0)

    def backward_s(version: str) -> float:
        result = toy.run({"activation_checkpointing": checkpointing,
                          "runtime": {"deepspeed_version": version, "framework": stack},
                          **_no_offload(2)})
        row = result.phases.set_index("phase").loc["backward"]
        return row.end_s - row.start_s

    plain = backward_s("0.18.4")
    assert plain < 21e-6
    hooks_s = counts * 21e-6
    assert hooks_s <= backward_s(version) <= hooks_s + plain


@pytest.mark.parametrize("reduce_scatter", [True, False])
def test_zero12_up_to_0_14_0_averages_the_whole_ipg_buffer(toy, reduce_scatter):
    """ZeRO-2 without offload on two GPUs, a 2N-element IPG buffer holding the model's N
    gradient elements. Up to 0.14.0 `average_tensor` takes the whole buffer: with
    reduce_scatter it divides all 2N elements in place (2 passes over 2 B each: 4 ps per
    element) before reduce-scattering the filled part, N more elements than 0.14.1 (PR #5268)
    divides; without, it all-reduces the whole buffer (4N B against 2N)."""
    def reduction(version: str):
        result = toy.run({"runtime": {"deepspeed_version": version},
                          **_no_offload(2, reduce_bucket_size=2 * N,
                                        reduce_scatter=reduce_scatter)}, gpus=2)
        spans = result.spans
        kind = OpKind.REDUCE_SCATTER if reduce_scatter else OpKind.ALL_REDUCE
        chosen = spans[(spans["rank"] == 0) & (spans.phase == "backward")
                       & (spans.stream == Stream.REDUCE) & (spans.op_kind == kind)]
        assert len(chosen) == 1
        return chosen.iloc[0]

    before, after = reduction("0.14.0"), reduction("0.14.1")
    if reduce_scatter:
        assert before.bytes == after.bytes == 2 * N
        assert (before.end_s - before.start_s) - (after.end_s - after.start_s) == pytest.approx(
            4 * N * PS, rel=1e-9)
    else:
        assert (before.bytes, after.bytes) == (4 * N, 2 * N)


@pytest.mark.parametrize(("version", "sent_back"), [("0.13.3", False), ("0.19.0", True)])
def test_zero1_offload_with_accumulation_goes_through_the_host_accumulator(toy, version,
                                                                             sent_back):
    """ZeRO-1 offload, GA=3: only the boundary reduces, and its `copy_grads_in_partition`
    runs `async_accumulate_grad_in_cpu_via_gpu` (gradient accumulation is on) past the first
    micro-batch: each parameter's accumulator comes back H2D and is added (from 0.19.0 the sum
    is sent back too); the earlier micro-batches move nothing."""
    result = toy.run({"runtime": {"deepspeed_version": version}, "deepspeed": {
        "gradient_accumulation_steps": 3, "zero_optimization": {"stage": 1}}})
    spans = result.spans[result.spans.phase == "backward"]
    params = len(_grad_order_numels())
    moves = spans.op_kind.isin([OpKind.GRAD_FROM_HOST, OpKind.GRAD_TO_HOST])
    assert spans[moves].micro_batch.unique().tolist() == [2]
    boundary = spans[spans.micro_batch == 2]
    assert (boundary.op_kind == OpKind.GRAD_FROM_HOST).sum() == params
    assert (boundary.op_kind == OpKind.GRAD_TO_HOST).sum() == (params if sent_back else 0)


@pytest.mark.parametrize("stage", [2, 3])
def test_a_communication_dtype_other_than_the_gradients_adds_two_casts(toy, stage):
    """fp16 training with `communication_data_type: fp32`, DP=1, one bucket of the model's N
    gradient elements: the IPG buffers stay in fp16 (DeepSpeed makes them in the training
    dtype: 2 B per element of `reduce_bucket_size`, not 4), the gradients are copied into the
    bucket as fp16, and the bucket's reduction casts all N elements to fp32 and back (read
    2 B, write 4 B, then the reverse: 12 ps per element at the toy's 1e12 B/s), holding the
    fp32 copy (4N B) meanwhile. ZeRO-3's concatenation and pre-divide then run on fp32 (2
    passes over 2 more bytes each: 8 ps more); ZeRO-2's `div_` stays on its fp16 buffer."""
    zero = {"stage": stage, "reduce_bucket_size": N, "offload_optimizer": {"device": "none"}}

    def run(comm: str | None):
        patch = {"deepspeed": {"zero_optimization": zero}}
        if comm:
            patch["deepspeed"]["communication_data_type"] = comm
        return toy.run(patch)

    same, fp32 = run(None), run("fp32")
    memory = fp32.memory[fp32.memory.device == "gpu0"]
    buffers = 2 if stage == 2 else 1  # ZeRO-1/2's second IPG buffer with overlap_comm
    assert memory[memory.category == "ipg bucket"].bytes.iloc[0] == buffers * 2 * N

    def reduction(result):
        spans = result.spans
        chosen = spans[(spans.stream == Stream.REDUCE) & (spans.phase == "backward")
                       & spans.op_kind.isin([OpKind.REDUCE_SCATTER, OpKind.ALL_REDUCE])]
        assert len(chosen) == 1
        return chosen.iloc[0]

    longer = ((reduction(fp32).end_s - reduction(fp32).start_s)
              - (reduction(same).end_s - reduction(same).start_s))
    scaling = 8 if stage == 3 else 0  # ZeRO-3 concatenates and divides after the cast
    assert longer == pytest.approx((12 + scaling) * N * PS, rel=1e-9)
    partitions = memory[memory.category == "grad partitions"]
    assert partitions.bytes.max() >= 4 * N


def test_from_0_19_2_zero3_keeps_fp32_reduced_gradients_for_fp32_accumulation(toy):
    """ZeRO-3, fp16 training, fp32 communication and fp32 accumulation, DP=2: up to 0.19.1
    each reduce-scattered partition is cast back to fp16 (read 4 B, write 2 B: 6 ps per
    element of the rank's partitions); from 0.19.2 (PR #8056) to the accumulation dtype,
    fp32 already: no cast, the reduction that much shorter."""
    def reduction_s(version: str) -> float:
        result = toy.run({"runtime": {"deepspeed_version": version}, "deepspeed": {
            "communication_data_type": "fp32", "data_types": {"grad_accum_dtype": "fp32"},
            "zero_optimization": {"reduce_bucket_size": N,
                                  "offload_optimizer": {"device": "none"}}}}, gpus=2)
        spans = result.spans
        chosen = spans[(spans["rank"] == 0) & (spans.stream == Stream.REDUCE)
                       & (spans.phase == "backward") & (spans.op_kind == OpKind.REDUCE_SCATTER)]
        assert len(chosen) == 1
        return chosen.end_s.iloc[0] - chosen.start_s.iloc[0]

    partition = sum(-(-n // 2) for n in _grad_order_numels())
    assert reduction_s("0.19.1") - reduction_s("0.19.2") == pytest.approx(
        6 * partition * PS, rel=1e-9)


@pytest.mark.parametrize("pin_memory", [True, False])
def test_zero3_parameter_offload_holds_the_flat_buffer_and_the_cached_init_partitions(pin_memory):
    """TinyLlama 1.1B (DP=1) with `offload_param: cpu`: the param group's flat buffer of
    1,100,048,384 16-bit elements (2.2 GB, pinned in 2^32 B), and zero.Init's own pinned
    partition of every non-persistent tensor, each in its power of two and kept by PyTorch's
    host cache: the embedding and the LM head (65.5M elements, 2^27 B each) and per layer q and
    o (2^23 each), k and v (2^20 each), gate, up and down (23.1 MB, 2^25 each): 2,764 MiB. The
    norms (2048 elements, under the persistence threshold) stay on the GPU. Pageable
    partitions: the flat buffer alone, unrounded."""
    scenario = zerosim.load_scenario("scenarios/h200_vm/tinyllama_param.yaml", {
        "deepspeed.zero_optimization.offload_param.pin_memory": pin_memory})
    plan = plan_of(scenario)
    held = model_states(scenario.deepspeed, plan, scenario.hardware, scenario.behaviours)
    params = [h for h in held if h.device is DeviceKind.HOST
              and h.category is Category.PARAMS_16BIT]
    MiB = 2 ** 20
    if pin_memory:
        per_layer = 2 * 8 * MiB + 2 * 1 * MiB + 3 * 32 * MiB
        assert [h.nbytes for h in params] == [2 ** 32, 22 * per_layer + 2 * 128 * MiB]
    else:
        assert [h.nbytes for h in params] == [2 * 1_100_048_384, 0]


def test_zero3_parameter_offload_with_the_optimizer_on_the_gpu_writes_each_group_back(toy):
    """`offload_param: cpu` with `offload_optimizer: none`: the update runs as without offload
    (overflow check 4N ps, fp64 norms 18N, per sub-group its fp32 gradient 10 ps/element), but
    the Adam writes no 16-bit partition on the GPU (36 ps/element: no cast), and the host then
    copies the group into its 16-bit partition in host memory as PyTorch's blocking
    cross-dtype copy does: it waits for the Adam, one thread faults in the fp32 temporary's
    fresh pages (4 B at 1 GB/s: 4000 ps/element), the pageable D2H moves them (4 B at 5 GB/s:
    800), and the cast reads them and writes the 16-bit partition on 2 threads (6 B at 2 GB/s:
    3000); only then does the next group's fp32 gradient start."""
    result = toy.run({"deepspeed": {"zero_optimization": {
        "offload_optimizer": {"device": "none"},
        "offload_param": {"device": "cpu", "pin_memory": True}}}})
    start = result.phases[result.phases.phase == "update"].start_s.iloc[0] / PS
    normed = start + (OVERFLOW_CHECK_PS + NORM_PS) * N
    compute, host, d2h = [], [], []
    t = normed
    for group, n in enumerate(GROUPS):
        cast = t + FP32_GRAD_PS * n
        stepped = cast + (GPU_ADAM_PS - 6) * n
        compute += [(f"fp32 gradient sub-group {group}", t, cast),
                    (f"gpu adam sub-group {group}", cast, stepped)]
        zeroed = stepped + 4000 * n
        moved = zeroed + 800 * n
        t = moved + 3000 * n
        host += [(f"zero pages sub-group {group}", stepped, zeroed),
                 (f"cast fp32→16-bit sub-group {group}", moved, t)]
        d2h.append((f"fp32 params sub-group {group} (pageable)", zeroed, moved))
    _assert_ops(_ops(result, Stream.COMPUTE, "update")[2:], compute)
    _assert_ops(_ops(result, Stream.CPU, "update"), host)
    _assert_ops(_ops(result, Stream.PCIE_D2H, "update"), d2h)
    assert _phase_ends(result)["update 0"] == pytest.approx(t, rel=1e-9)


def test_zero3_parameter_offload_with_the_optimizer_on_the_gpu_keeps_fp32_state_in_hbm(toy):
    """The 16-bit partition moves to pinned host memory (the flat buffer and zero.Init's
    cached per-tensor partitions); the fp32 master and both Adam moments stay in HBM."""
    scenario = toy.scenario({"deepspeed": {"zero_optimization": {
        "offload_optimizer": {"device": "none"},
        "offload_param": {"device": "cpu", "pin_memory": True}}}})
    held = model_states(scenario.deepspeed, plan_of(scenario), scenario.hardware,
                        scenario.behaviours)
    where = {(h.device, h.category) for h in held if h.nbytes > 0}
    assert (DeviceKind.HOST, Category.PARAMS_16BIT) in where
    assert (DeviceKind.GPU, Category.PARAMS_16BIT) not in where
    gpu = {h.category: h.nbytes for h in held if h.device is DeviceKind.GPU}
    assert gpu[Category.FP32_MASTER] == 4 * N
    assert gpu[Category.OPTIMIZER_STATES] == 8 * N


def test_torch_adam_steps_with_pytorchs_adamw_and_its_temporary(toy):
    """`optimizer.params.torch_adam` makes DeepSpeed build `torch.optim.AdamW`: per sub-group
    88 B/element through HBM (unscale 8, the eight foreach passes 80) and the 16-bit cast (6),
    and its `exp_avg_sq_sqrt` (4 B/element) in HBM while it runs."""
    result = toy.run({"deepspeed": {"optimizer": {"type": "AdamW",
                                                  "params": {"torch_adam": True}},
                                    "zero_optimization": {"offload_optimizer": {
                                        "device": "none"}}}})
    adams = [(op, end - start) for op, start, end in _ops(result, Stream.COMPUTE, "update")
             if op.startswith("gpu adam")]
    assert adams == [(f"gpu adam sub-group {g}", pytest.approx((88 + 6) * n, rel=1e-9))
                     for g, n in enumerate(GROUPS)]
    memory, start = result.memory, result.phases.start_s.iloc[-1]
    workspace = memory[(memory.device == "gpu0") & (memory.category == "workspace")
                       & (memory.t_s >= start)]
    assert list(workspace.bytes) == [4 * GROUPS[0], 0, 4 * GROUPS[1], 0]


@pytest.mark.parametrize(("optimizer", "zero", "expected"), [
    ({"type": "AdamW", "params": {"torch_adam": "yes"}}, {}, "true or false"),
    ({"type": "AdamW", "params": {"torch_adam": True}}, {},
     "false with the optimizer offloaded"),
    ({"type": "CPUAdam", "params": {"torch_adam": True}}, {"offload_optimizer": {
        "device": "none"}}, "false unless optimizer.type is Adam or AdamW")])
def test_torch_adam_is_refused_where_deepspeed_would_not_build_it_on_the_gpu(toy, optimizer,
                                                                            zero, expected):
    with pytest.raises(ScenarioError) as err:
        toy.scenario({"deepspeed": {"optimizer": optimizer, "zero_optimization": zero}})
    assert err.value.key_path == "deepspeed.optimizer.params.torch_adam"
    assert expected in err.value.expected


def test_parameters_on_nvme_need_the_optimizer_offloaded(toy):
    with pytest.raises(ScenarioError) as err:
        toy.scenario({"deepspeed": {"zero_optimization": {
            "offload_optimizer": {"device": "none"},
            "offload_param": {"device": "nvme", "nvme_path": "/local_nvme"}}}})
    assert err.value.key_path == "deepspeed.zero_optimization.offload_optimizer.device"
    assert "NVMe parameter offload" in err.value.expected


@pytest.mark.parametrize(("stage", "gpus", "tensors"), [(3, 1, 21), (3, 2, 21), (2, 2, 12)])
def test_the_host_dispatches_each_gradient_tensors_norm(toy, stage, gpus, tensors):
    """`get_grad_norm_direct` runs `g.to(device).double().norm(2)` per gradient tensor the rank
    holds, three ops at the stack's launch time (1 us here): ZeRO-3 a slice of all 21 of the
    toy's tensors, ZeRO-2 at DP=2 those its half of the flat range holds (21 / 2, rounded up,
    and one the boundary cuts: 12), so the norms start 63 or 36 us after the overflow check
    (and, at DP=2, its flag's all-reduce: 8 B over the toy's 100 GB/s, 80 ps)."""
    patch = _no_offload(stage)
    patch["runtime"] = {"framework": {**toy_stack(), "host": {
        **toy_stack()["host"], "kernel_launch_us": {"value": 1, "basis": "assumed",
                                                    "source": "test"}}}}
    ops = {op: (start, end) for op, start, end in _ops(toy.run(patch, gpus=gpus),
                                                      Stream.COMPUTE, "update")}
    gap = ops["gradient norms"][0] - ops["overflow check"][1]
    flag = 80 if gpus > 1 else 0
    assert gap == pytest.approx(3 * tensors * 1e6 + flag, rel=1e-12)


def test_a_zero3_step_pays_the_hosts_work_per_tensor_and_per_persistent_tensor(toy):
    """`host.step_per_tensor_us` (1 us here) for each of the toy's 21 parameter tensors, at the
    step's start, and `host.regather_per_tensor_us` (1 us) for each of the 5 norms that persist
    (threshold 64 elements), after the loop: the CPU step, all on the host, ends 26 us later;
    nothing before it moves."""
    def run(us: float):
        stack = toy_stack()
        stack["host"] = {**stack["host"], **{
            key: {"value": us, "basis": "assumed", "source": "test"}
            for key in ("step_per_tensor_us", "regather_per_tensor_us")}}
        return toy.run({"runtime": {"framework": stack}, "deepspeed": {"zero_optimization": {
            "stage3_param_persistence_threshold": 64}}})

    before, after = (run(us).phases.set_index("phase") for us in (0, 1))
    assert after.loc["update", "start_s"] == before.loc["update", "start_s"]
    grown = (after.loc["update", "end_s"] - after.loc["update", "start_s"]) - (
        before.loc["update", "end_s"] - before.loc["update", "start_s"])
    assert grown == pytest.approx((21 + 5) * 1e-6, rel=1e-9)


def test_a_zero3_step_gathers_each_persistent_tensor_apart(toy):
    """`_post_step` re-gathers the persistent parameters through `_allgather_params_coalesced`,
    which issues one `all_gather_into_tensor` per tensor: on two GPUs the toy's 5 norms
    (64 elements each, threshold 64) make 5 all-gathers of 2 x 64 B after the step."""
    result = toy.run({"deepspeed": {"zero_optimization": {
        "stage3_param_persistence_threshold": 64}}}, gpus=2)
    spans = result.spans
    gathers = spans[(spans["rank"] == 0) & (spans.stream == Stream.ALLGATHER)
                    & (spans.phase == "update")]
    assert list(gathers.op) == ["all-gather persistent param"] * 5
    assert list(gathers.bytes) == [2 * 64] * 5
