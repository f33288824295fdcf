"""Model states: what a rank holds for the whole iteration, where, by mode (pure: no SimPy).

Offloaded modes follow what DeepSpeed allocates (stage3.py, stage_1_and_2.py). Without offload
the GPU holds what DeepSpeed's own estimators count (`zerosim estimate`): stage 3 18 B per
partitioned parameter (16-bit param, fp32 master, fp32 gradient, two Adam states), stages 1/2
2 B per parameter replicated plus 12 B (stage 1) or 18 B (stage 2, its 16-bit gradient
partition and fp32 gradient) per partitioned one, stage 0 the 16-bit params and 12 B of fp32
state for every parameter; the 16-bit gradients that stages 0 and 1 keep across micro-batches
are tracked as `grads` while they live. With bf16 master params (`bf16_master_weights_and_grads`)
the master copy, its gradient and the moments take their dtypes' sizes (`_master_sizes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from zerosim.behaviours import Behaviours
from zerosim.engine.plan import Plan
from zerosim.hardware import costs, nvme
from zerosim.hardware.profile import HardwareProfile
from zerosim.scenario import DeepSpeedConfig
from zerosim.units import BYTES_PER_DTYPE, FP16_BYTES, FP32_BYTES, ordered_sum
from zerosim.vocabulary import BufferKind, Category, DeviceKind, host_buffer

if TYPE_CHECKING:
    from zerosim.stacks import SoftwareStack

ADAM_STATES = 2
"""exp_avg and exp_avg_sq, fp32 each."""
CPU_ADAM_TILE_BUFFERS_BYTES = 2 * costs.CPU_ADAM_TILE_ELEMENTS * FP32_BYTES
"""DeepSpeedCPUAdam's C++ optimizer before DeepSpeed 0.14.3, built with CUDA
(csrc/includes/cpu_adam.h, `Adam_Optimizer`): two `cudaMallocHost` buffers of TILE floats
(simd.h: TILE = 128 * 1024 * 1024), 1 GiB of pinned host memory per optimizer. Allocated by
the CUDA runtime, not PyTorch's caching host allocator: no rounding."""


@dataclass(frozen=True)
class Holding:
    device: DeviceKind
    category: Category
    nbytes: float
    what: str
    buffer: BufferKind = BufferKind.NONE


def _host_allocations(sizes: list[float], buffer: BufferKind) -> float:
    """Host bytes that allocations of `sizes` take: each rounded when pinned."""
    if buffer is BufferKind.PINNED:
        return float(ordered_sum(costs.pinned_bytes(n) for n in sizes))
    return float(ordered_sum(sizes))


REWRITTEN_AFTER_FORK = frozenset({Category.FP32_MASTER})
"""Host state DeepSpeed makes with the optimizer, before the framework's data loader forks its
workers, and rewrites in place at every step: the fp32 master partition (stage3.py
`_create_fp32_partitions`, stage_1_and_2.py `single_partition_of_fp32_groups`: `.float()`
copies in pageable memory, which CPU Adam updates in place). DeepSpeedCPUAdam makes the Adam
moments at its first step, after the fork (lazy state, DeepSpeed 0.13.3), and a pinned buffer
is never copied: the NVIDIA driver maps pinned system memory `VM_SHARED`, 'to avoid any
undesired copy-on-write effects' (open-gpu-kernel-modules, nv-mmap.c `nvidia_mmap_helper`)."""


def model_states(ds: DeepSpeedConfig, plan: Plan, profile: HardwareProfile,
                 behaviours: Behaviours, stack: SoftwareStack | None = None) -> list[Holding]:
    """Every static allocation of one rank, in the order DeepSpeed makes them, then what the
    framework's processes hold besides (`forked_pages`, `rank_processes`; none without a
    `stack`)."""
    held = [Holding(DeviceKind.GPU, Category.RUNTIME_CONTEXT, profile.runtime_context_bytes,
                    "CUDA context"), *_framework_buffers(plan)]
    if ds.offload_optimizer.enabled:
        held += _cpu_adam_buffers(behaviours)
        held += (_offloaded_stage3(ds, plan, behaviours) if ds.stage == 3
                 else _offloaded_stage12(ds, plan, behaviours))
    else:
        held += _on_gpu(ds, plan)
    held += _loco_error_feedback(ds, plan, profile, behaviours)
    if stack is None:
        return held
    return held + forked_pages(held, stack.dataloader_workers) + rank_processes(stack)


def _loco_error_feedback(ds: DeepSpeedConfig, plan: Plan, profile: HardwareProfile,
                         behaviours: Behaviours) -> list[Holding]:
    """LoCo's error feedback, where qgZ acts with it: made at the first reduction of each
    matrix and kept from step to step, so held all through a steady iteration."""
    if not ds.zero_plus_plus.loco_acts(ds.stage, plan.ranks, profile.gpus_per_node):
        return []
    nbytes = plan.loco_error_feedback_bytes(profile.gpus_per_node,
                                            behaviours.qgz_indivisible_fallback)
    return [Holding(DeviceKind.GPU, Category.QGZ_ERROR_FEEDBACK, nbytes,
                    "LoCo's int8 errors of every quantized matrix")]


def rank_processes(stack: SoftwareStack) -> list[Holding]:
    """What a rank's processes hold in host memory besides its tensors (the stack's
    `processes.rank_resident_GiB`)."""
    if stack.rank_resident_bytes <= 0:
        return []
    return [Holding(DeviceKind.HOST, Category.RANK_PROCESSES, stack.rank_resident_bytes,
                    "the rank's processes besides its tensors")]


def node_holdings(profile: HardwareProfile) -> list[Holding]:
    """What a node's host memory holds whatever its ranks do (`host.os_resident_GiB`)."""
    if profile.os_resident_bytes <= 0:
        return []
    return [Holding(DeviceKind.HOST, Category.OS, profile.os_resident_bytes,
                    "the OS and the node's services")]


def forked_pages(held: list[Holding], workers: int) -> list[Holding]:
    """What forked data-loader workers keep of a rank's host state: a forked child shares the
    rank's pageable pages copy-on-write, so every page of `REWRITTEN_AFTER_FORK` state is held
    twice once the rank has rewritten it, the rank's new copy and the workers' old one (one
    old copy however many workers share it)."""
    if workers <= 0:
        return []
    nbytes = ordered_sum(h.nbytes for h in held if h.device is DeviceKind.HOST
                 and h.category in REWRITTEN_AFTER_FORK and h.buffer is not BufferKind.PINNED)
    if nbytes <= 0:
        return []
    return [Holding(DeviceKind.HOST, Category.FORKED_PAGES, nbytes,
                    "fp32 partition as it was before the fork, kept by the data loader's workers")]


def _cpu_adam_buffers(behaviours: Behaviours) -> list[Holding]:
    """The offloaded optimizer is a DeepSpeedCPUAdam, whose C++ side pinned two tile buffers
    until DeepSpeed 0.14.3."""
    if behaviours.cpu_adam_without_pinned_tiles:
        return []
    return [Holding(DeviceKind.HOST, Category.CPU_ADAM_BUFFERS, CPU_ADAM_TILE_BUFFERS_BYTES,
                    "DeepSpeedCPUAdam tile buffers", BufferKind.PINNED)]


def _framework_buffers(plan: Plan) -> list[Holding]:
    """Buffers the framework allocates on first use and reuses for the rest of the run
    (Megatron's global memory buffer for the raw attention scores): the largest any module
    asks for."""
    largest = max((m.buffer_bytes for m in plan.modules), default=0.0)
    if largest <= 0:
        return []
    return [Holding(DeviceKind.GPU, Category.FRAMEWORK_BUFFERS, largest, "attention scores")]


def _sizes(ds: DeepSpeedConfig, plan: Plan) -> tuple[int, int, int]:
    """Bytes per element of the training dtype (the 16-bit params and the IPG buckets, which
    DeepSpeed makes in it whatever `communication_data_type` says) and of the gradient
    accumulation dtype; the model's parameter count."""
    dtype = BYTES_PER_DTYPE[ds.dtype]
    accum = BYTES_PER_DTYPE[ds.grad_accum_dtype]
    total = sum(p.numel for p in plan.all_params)
    return dtype, accum, total


def _master_sizes(ds: DeepSpeedConfig) -> tuple[int, int]:
    """Bytes per element of the optimizer's master params (and of their gradients), and of
    each Adam moment: fp32, or bf16 as `bf16.bf16_master_weights_and_grads` and the moments'
    dtype say."""
    return BYTES_PER_DTYPE[ds.master_dtype], BYTES_PER_DTYPE[ds.optimizer_state_dtype]


def _offloaded_stage3(ds: DeepSpeedConfig, plan: Plan, behaviours: Behaviours
                      ) -> list[Holding]:
    gpu, host = DeviceKind.GPU, DeviceKind.HOST
    dtype, accum, _ = _sizes(ds, plan)
    part = plan.partition_numel
    held = _stage3_params(ds, plan, dtype)
    held.append(Holding(gpu, Category.PARAMS_PERSISTENT, dtype * plan.persistent_numel,
                        "persistent params"))
    if ds.contiguous_gradients:
        held.append(Holding(gpu, Category.IPG_BUCKET, dtype * ds.reduce_bucket_size,
                            "IPG bucket buffer"))
    kind = host_buffer(ds.offload_optimizer.pin_memory)
    on_cpu, on_gpu = plan.numel_on("cpu"), plan.numel_on("gpu")
    master_bytes, state_bytes = _master_sizes(ds)
    cpu_groups = [master_bytes * size for g, size in enumerate(plan.subgroups)
                  if g not in plan.gpu_subgroups and g not in plan.nvme_subgroups]
    # stage3.py initialize_optimizer_states: one fp32 gradient buffer per sub-group, pinned
    # when pin_memory; _setup_for_real_optimizer: one accumulation buffer for the whole
    # partition (grad_partitions_flat_buffer), pinned likewise.
    gradients = [
        *_fp32_gradients(ds, plan, cpu_groups, kind,
                         behaviours.superoffload_shared_buffers),
        Holding(host, Category.GRAD_ACCUMULATION, _host_allocations([accum * part], kind),
                "host gradient accumulation buffer", kind),
    ]
    if behaviours.boundary_flush_stages_in_pinned_buffer:
        # stage3.py _create_fp32_partitions (0.15.4-0.16.2): pinned_grad_buffer, fp32 of the
        # largest parameter partition, pinned whatever pin_memory says
        largest = max((p.partition_numel for p in plan.all_params), default=0)
        gradients.append(Holding(host, Category.FP32_GRADS,
                                 _host_allocations([FP32_BYTES * largest], BufferKind.PINNED),
                                 "pinned gradient staging buffer", BufferKind.PINNED))
    if plan.interleaved:
        return [*held, *_interleaved_states(ds, plan), *gradients]
    master = BufferKind.PAGEABLE if ds.offload_optimizer.super_offload else BufferKind.NONE
    return [
        *held,
        Holding(host, Category.FP32_MASTER, master_bytes * on_cpu,
                f"{ds.master_dtype} partition", master),
        Holding(host, Category.OPTIMIZER_STATES, ADAM_STATES * state_bytes * on_cpu,
                "exp_avg, exp_avg_sq"),
        *gradients,
        # Twin-Flow's GPU sub-groups: torch.optim.AdamW makes its moments in the params' dtype
        Holding(gpu, Category.FP32_MASTER_GPU, master_bytes * on_gpu,
                f"Twin-Flow {ds.master_dtype} partition"),
        Holding(gpu, Category.OPTIMIZER_STATES_GPU, ADAM_STATES * master_bytes * on_gpu,
                "Twin-Flow Adam states"),
        Holding(gpu, Category.FP32_GRADS_GPU, master_bytes * on_gpu,
                f"Twin-Flow {ds.master_dtype} gradients"),
        *_swapped_optimizer(ds, plan),
    ]


def _fp32_gradients(ds: DeepSpeedConfig, plan: Plan, cpu_groups: list[float],
                    kind: BufferKind, shared: bool) -> list[Holding]:
    """The CPU sub-groups' fp32 gradient buffers. With SuperOffload the optimizer process pins
    one buffer of the largest sub-group (`max_grad_numel`) to copy each gradient into, and
    from DeepSpeed 0.18.9 (`shared`) the buffers are in shared memory in the steady state:
    the optimizer queue's `share_memory_` copied each into a new, pageable segment at the
    first step, and the pinned block it left went back to PyTorch's caching host allocator,
    which keeps it (up to 0.18.8 the gradients went to the process as CUDA tensors and the
    buffers stayed where they were)."""
    host = DeviceKind.HOST
    own = [Holding(host, Category.FP32_GRADS, _host_allocations(cpu_groups, kind),
                   f"{ds.master_dtype} gradients", kind)]
    if not ds.offload_optimizer.super_offload:
        return own
    pinned = BufferKind.PINNED
    worker = Holding(host, Category.FP32_GRADS,
                     costs.pinned_bytes(FP32_BYTES * max(plan.subgroups, default=0)),
                     "SuperOffload process's pinned gradient buffer", pinned)
    if not shared:
        return [*own, worker]
    return [
        Holding(host, Category.FP32_GRADS, sum(cpu_groups), "fp32 gradients (shared memory)",
                BufferKind.PAGEABLE),
        Holding(host, Category.FP32_GRADS,
                _host_allocations(cpu_groups, kind) if kind is pinned else 0.0,
                "fp32 gradients' pinned blocks, cached by PyTorch's host allocator", pinned),
        worker,
    ]


def _interleaved_states(ds: DeepSpeedConfig, plan: Plan) -> list[Holding]:
    """Deep Optimizer States' interleaved update (DataStates/DeepSpeed@4570a955, stage3.py
    `_create_fp32_partitions`, `opt_transfers`): each sub-group's fp32 params, and a copy of
    its exp_avg and exp_avg_sq, in pinned host memory; DeepSpeedCPUAdam's own states for
    the sub-groups it steps; gap - 1 pinned 16-bit buffers of the largest sub-group; and in
    HBM what the last step left: the fp32 params, exp_avg and exp_avg_sq of its last GPU
    sub-group (the step re-allocates them for a GPU sub-group of another size,
    `InterleavedStep`), and that sub-group's fp32 gradient where no sub-group after it
    releases it (`Plan.interleaved_grad_outlives_step`; `GpuGradients`)."""
    gpu, host, pinned = DeviceKind.GPU, DeviceKind.HOST, BufferKind.PINNED
    sizes = plan.subgroups
    on_gpu = [size for g, size in enumerate(sizes) if plan.interleaved_on_gpu(g)]
    on_cpu = sum(sizes) - sum(on_gpu)
    last = plan.last_interleaved_gpu_group
    last_size = 0 if last is None else sizes[last]
    gap = ds.offload_optimizer.prefetch_optimizer_gap
    fp32 = _host_allocations([FP32_BYTES * size for size in sizes], pinned)
    return [
        Holding(host, Category.FP32_MASTER, fp32, "fp32 partition", pinned),
        Holding(host, Category.OPTIMIZER_STATES, ADAM_STATES * FP32_BYTES * on_cpu,
                "exp_avg, exp_avg_sq"),
        Holding(host, Category.OPTIMIZER_STATES, ADAM_STATES * fp32,
                "exp_avg, exp_avg_sq copies for the GPU moves", pinned),
        Holding(host, Category.SWAP_BUFFERS,
                (gap - 1) * costs.pinned_bytes(FP16_BYTES * max(sizes)),
                "pinned 16-bit buffers", pinned),
        Holding(gpu, Category.OPTIMIZER_STATES_GPU, interleaved_gpu_state_bytes(last_size),
                "fp32 params, exp_avg, exp_avg_sq of the last GPU sub-group"),
        Holding(gpu, Category.FP32_GRADS_GPU,
                FP32_BYTES * last_size if plan.interleaved_grad_outlives_step else 0,
                "fp32 grads of the last GPU sub-group, kept until the next step"),
    ]


def interleaved_gpu_state_bytes(elements: int) -> int:
    """HBM of a GPU sub-group's fp32 params, exp_avg and exp_avg_sq in the interleaved
    update."""
    return (1 + ADAM_STATES) * FP32_BYTES * elements


def _stage3_params(ds: DeepSpeedConfig, plan: Plan, dtype: int) -> list[Holding]:
    """The 16-bit partition: in HBM, in host memory (`offload_param: cpu`), or on NVMe beyond
    `max_in_cpu` with its pinned swap buffers and the re-use pool the step writes through
    (stage3.py `_create_param_groups_fp16_flat_cpu_memory`, `reserve_partitioned_swap_space`;
    docs/nvme.md)."""
    part = plan.partition_numel
    if not ds.offload_param.enabled:
        return [Holding(DeviceKind.GPU, Category.PARAMS_16BIT, dtype * part, "fp16 partition")]
    host, pinned = DeviceKind.HOST, host_buffer(ds.offload_param.pin_memory)
    on_nvme = plan.nvme_param_numel
    if not ds.offload_param.nvme:
        return [Holding(host, Category.PARAMS_16BIT, _host_allocations([dtype * part], pinned),
                        "fp16 partition (the param group's flat buffer)", pinned),
                Holding(host, Category.PARAMS_16BIT, zero_init_partitions_cached(plan, dtype,
                                                                                 pinned),
                        "zero.Init's per-parameter partitions, cached by the host allocator",
                        pinned),
                *_host_secondary_partitions(ds, plan, dtype, pinned)]
    held = [Holding(host, Category.PARAMS_16BIT, dtype * (part - on_nvme), "fp16 partition",
                    pinned)]
    if ds.offload_param.nvme:
        pool = plan.swap_out_pool_numel(dtype, ds.aio.thread_count)
        held += [
            Holding(DeviceKind.NVME, Category.PARAMS_16BIT, dtype * on_nvme,
                    "fp16 partition swap files"),
            Holding(host, Category.SWAP_BUFFERS, nvme.param_swap_buffer_bytes(
                buffer_count=ds.offload_param.buffer_count,
                buffer_size=ds.offload_param.buffer_size, thread_count=ds.aio.thread_count,
                element_bytes=dtype), "parameter swap buffers", BufferKind.PINNED),
            Holding(host, Category.SWAP_BUFFERS, costs.pinned_bytes(dtype * pool),
                    "16-bit swap-out pool of the largest sub-group", BufferKind.PINNED),
        ]
    return held


def _host_secondary_partitions(ds: DeepSpeedConfig, plan: Plan, dtype: int,
                               buffer: BufferKind) -> list[Holding]:
    """hpZ with `offload_param: cpu`: each non-persistent parameter's secondary partition
    (its share over the hpZ group) lives in host memory, pinned with `pin_memory`, made at
    its first release after a step and dropped by the step; PyTorch's host cache keeps the
    pinned blocks for the next iteration's, so they stay resident (a pageable one is held
    from the forward to the step, where the peak is)."""
    group = ds.zero_plus_plus.hpz_group(plan.ranks)
    if group == 1:
        return []
    sizes = [dtype * share for share in plan.secondary_shares(group)]
    return [Holding(DeviceKind.HOST, Category.PARAMS_SECONDARY,
                    _host_allocations(sizes, buffer), "hpZ secondary partitions", buffer)]


def zero_init_partitions_cached(plan: Plan, dtype: int, buffer: BufferKind) -> float:
    """`offload_param: cpu` with `pin_memory`: zero.Init pins each non-persistent parameter's
    16-bit partition on its own (partition_parameters.py `_partition_param`:
    `get_accelerator().pin_memory(partitioned_tensor)`), then the ZeRO-3 optimizer copies
    them into the param group's pinned flat buffer and points them there (stage3.py
    `_create_param_groups_fp16_flat_cpu_memory`, `_move_to_flat_buffer`). PyTorch's caching
    host allocator keeps each freed block, rounded to its power of two, for reuse that never
    comes, so they stay resident beside the flat buffer. Pageable ones go back to the C
    allocator (none held)."""
    if buffer is not BufferKind.PINNED:
        return 0.0
    return _host_allocations([dtype * p.partition_numel for params in plan.params
                              for p in params if not p.persistent], buffer)


def _swapped_optimizer(ds: DeepSpeedConfig, plan: Plan) -> list[Holding]:
    """With the optimizer on NVMe the swapped sub-groups' fp32 master, Adam states and fp32
    gradients live in swap files; host memory keeps `buffer_count` pinned buffers of the
    largest sub-group (optimizer_utils.py `OptimizerSwapper.__init__`)."""
    if not plan.nvme_subgroups:
        return []
    on_nvme = plan.numel_on("nvme")
    largest = plan.largest_swapped_subgroup
    nvme_device = DeviceKind.NVME
    return [
        Holding(nvme_device, Category.FP32_MASTER, FP32_BYTES * on_nvme, "fp32 swap files"),
        Holding(nvme_device, Category.OPTIMIZER_STATES, ADAM_STATES * FP32_BYTES * on_nvme,
                "exp_avg, exp_avg_sq swap files"),
        Holding(nvme_device, Category.FP32_GRADS, FP32_BYTES * on_nvme, "fp32 gradient swap"),
        Holding(DeviceKind.HOST, Category.SWAP_BUFFERS, nvme.optimizer_swap_buffer_bytes(
            largest, buffer_count=ds.offload_optimizer.buffer_count,
            thread_count=ds.aio.thread_count), "optimizer swap buffers", BufferKind.PINNED),
    ]


def ipg_buffers(ds: DeepSpeedConfig) -> int:
    """Stage 1/2 keep a second IPG buffer to fill while the first is reduced."""
    return 2 if ds.overlap_comm else 1


def stage12_master_pinned(ds: DeepSpeedConfig, behaviours: Behaviours) -> bool:
    """Whether ZeRO-1/2's fp32 master partition is pinned: always from DeepSpeed 0.14.1
    (`zero12_copy_back_fp32_to_gpu`), as `pin_memory` says from 0.18.3, never before."""
    if behaviours.zero12_master_pinned_only_with_pin_memory:
        return ds.offload_optimizer.pin_memory
    return behaviours.zero12_copy_back_fp32_to_gpu


def _offloaded_stage12(ds: DeepSpeedConfig, plan: Plan, behaviours: Behaviours
                       ) -> list[Holding]:
    """stage_1_and_2.py `__init__`: the fp32 master partition (pinned as
    `stage12_master_pinned` says), the Adam moments CPU Adam makes, the fp32 gradient
    partition (pinned when `pin_memory`), from DeepSpeed 0.17.0 a 16-bit copy-back buffer
    of the partition (pinned when `pin_memory`), and with gradient accumulation the host
    accumulator (stage 1 too: its boundary reduction goes through it), which with bf16 master
    gradients is a slice of them (`buffer_to_accumulate_to_in_cpu`): nothing more. The master
    partition, its gradient and the moments have the dtypes `_master_sizes` says."""
    gpu, host = DeviceKind.GPU, DeviceKind.HOST
    dtype, accum, total = _sizes(ds, plan)
    master_bytes, state_bytes = _master_sizes(ds)
    part = plan.partition_numel
    kind = host_buffer(ds.offload_optimizer.pin_memory)
    master = BufferKind.PINNED if stage12_master_pinned(ds, behaviours) else BufferKind.NONE
    overlapped = ds.zenflow is not None and ds.zenflow.overlap_step
    grads, copies = kind, 1
    if overlapped:  # two of each, and `share_memory_` copies them into pageable memory
        master, grads, copies = BufferKind.PAGEABLE, BufferKind.PAGEABLE, 2
    held = [
        Holding(gpu, Category.PARAMS_16BIT, dtype * total, "replicated 16-bit params"),
        Holding(gpu, Category.IPG_BUCKET, ipg_buffers(ds) * dtype * ds.reduce_bucket_size,
                "IPG bucket buffers"),
        Holding(host, Category.FP32_MASTER, _host_allocations([master_bytes * part], master),
                f"{ds.master_dtype} partition", master),
        Holding(host, Category.OPTIMIZER_STATES, copies * ADAM_STATES * state_bytes * part,
                "exp_avg, exp_avg_sq" + (" (two of each)" if overlapped else "")),
        Holding(host, Category.FP32_GRADS,
                _host_allocations([master_bytes * part] * copies, grads),
                f"{ds.master_dtype} gradients" + (" (two buffers)" if overlapped else ""),
                grads),
    ]
    if ds.zenflow is not None:
        held += _zenflow_holdings(ds, plan, dtype)
    if behaviours.zero12_copy_back_via_16bit_host_buffer:
        held.append(Holding(host, Category.PARAMS_16BIT,
                            _host_allocations([dtype * part], kind),
                            "16-bit copy-back buffer", kind))
    if ds.gradient_accumulation_steps > 1 and not ds.low_precision_master:
        held.append(Holding(host, Category.GRAD_ACCUMULATION, accum * part,
                            "accumulated_grads_in_cpu", kind))
    return held


def _zenflow_holdings(ds: DeepSpeedConfig, plan: Plan, dtype: int) -> list[Holding]:
    """What ZenFlow adds (`ds.zenflow`): the selective AdamW's exp_avg and exp_avg_sq, in the
    params' dtype, over the selected columns of every param (each rank steps them all), in
    HBM or, with `offload`, in host memory (each param's two pinned apart when `pin_memory`);
    with `overlap_step` the optimizer process's fp32 snapshot of the partition
    (`stale_param`, in shared memory, made after the data loader forked: its workers never
    see it). The two Adam moments per state and the two gradient buffers of the overlapped
    step are counted with ZeRO-1/2's own holdings (`_offloaded_stage12`), which
    `share_memory_` moves into shared, pageable memory."""
    zenflow = ds.zenflow
    moments = [dtype * zenflow.topk_ratio * p.numel for p in plan.all_params] * 2
    what = "ZenFlow's selected-column exp_avg, exp_avg_sq"
    if zenflow.offload:
        kind = host_buffer(ds.offload_optimizer.pin_memory)
        held = [Holding(DeviceKind.HOST, Category.OPTIMIZER_STATES,
                        _host_allocations(moments, kind), what, kind)]
    else:
        held = [Holding(DeviceKind.GPU, Category.OPTIMIZER_STATES_GPU, ordered_sum(moments), what)]
    if zenflow.overlap_step:
        held.append(Holding(DeviceKind.HOST, Category.OPTIMIZER_STATES,
                            FP32_BYTES * plan.partition_numel,
                            "ZenFlow's stale fp32 snapshot of the partition",
                            BufferKind.PAGEABLE))
    return held


def _on_gpu(ds: DeepSpeedConfig, plan: Plan) -> list[Holding]:
    gpu = DeviceKind.GPU
    dtype, accum, total = _sizes(ds, plan)
    stepped = plan.partition_numel if ds.stage > 0 else total
    if ds.stage == 3:
        held = [*_stage3_params(ds, plan, dtype),
                Holding(gpu, Category.PARAMS_PERSISTENT, dtype * plan.persistent_numel,
                        "persistent params")]
        if ds.contiguous_gradients:
            held.append(Holding(gpu, Category.IPG_BUCKET, dtype * ds.reduce_bucket_size,
                                "IPG bucket buffer"))
    else:
        held = [Holding(gpu, Category.PARAMS_16BIT, dtype * total, "replicated 16-bit params")]
        if ds.stage > 0:
            held.append(Holding(gpu, Category.IPG_BUCKET,
                                ipg_buffers(ds) * dtype * ds.reduce_bucket_size,
                                "IPG bucket buffers"))
    master_bytes, state_bytes = _master_sizes(ds)
    if ds.stage == 3 and ds.low_precision_master:
        master_bytes = 0  # the bf16 partition is its own master copy (`_create_fp32_partitions`)
    held += [Holding(gpu, Category.FP32_MASTER, master_bytes * stepped,
                     f"{ds.master_dtype} master params"),
             Holding(gpu, Category.OPTIMIZER_STATES, ADAM_STATES * state_bytes * stepped,
                     "exp_avg, exp_avg_sq")]
    # The gradient partitions the backward reduces into stay for the run (stage3.py
    # grad_partitions_flat_buffer, stage_1_and_2.py grads_in_partition); the fp32 gradient
    # exists only while its group steps (`optimizer.GpuStep`).
    if ds.stage >= 2:
        held.append(Holding(gpu, Category.GRAD_ACCUMULATION, accum * stepped,
                            "gradient partitions"))
    return held
