"""Optimizer steps: on the CPU (optimizer offloaded) or on the GPU (no offload), then the
gathers that follow a step.

`CpuStep` follows stage3.py `step` (sub-group by sub-group: unscale, DeepSpeedCPUAdam, blocking
copy-back; Twin-Flow's GPU sub-groups and the study's what-ifs in between) and, with one group
for the whole partition, stage_1_and_2.py's offloaded step. `GpuStep` is the fused GPU Adam of
a step without offload, memory-bound on HBM. The copy-back and the post-step gather are parts
chosen by `compose.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import simpy

from zerosim.engine.machine import Machine
from zerosim.engine.rank import Gen, RankCore, Waits
from zerosim.engine.software import (
    DEVICE_SCALAR_BYTES,
    GRAD_NORM_DISPATCHES_PER_PARTITION,
    ZERO3_OFFLOAD_NORM,
    ZERO12_OFFLOAD_NORM,
)
from zerosim.engine.states import stage12_master_pinned
from zerosim.hardware import costs
from zerosim.units import FP32_BYTES, FP64_BYTES
from zerosim.vocabulary import Category, Collective, OpKind, Phase, Stream

CopyBack = Callable[[RankCore, int, int, Stream], Gen]
"""(core, sub-group, elements, track): write a stepped group's 16-bit params where the GPU
reads them."""
WriteBack = Callable[[RankCore, int, int, simpy.Event], Gen]
"""(core, sub-group, elements, its Adam's kernels): write a group stepped on the GPU into 16-bit
params in host memory, on the host thread."""
PostStep = Callable[[RankCore], Gen]
"""What follows a step's loop on the host (the gathers it issues)."""


def gpu_adam(core: RankCore, group: int, elements: int, adam: costs.GpuAdam, *,
             cast_bytes: float = costs.CAST_TO_16BIT_BYTES_PER_ELEMENT) -> Gen:
    """`launch_gpu_adam`, the host first taking the optimizer's temporary from the CUDA cache
    (`cudaMalloc` where the phase emptied it: `RankCore.reserve_s`) and dropping it once the
    launch returns; the caching allocator hands the block to the next request on the stream.
    Returns the kernels' event."""
    yield from host_allocation(core, adam.temporary_bytes_per_element * elements, dropped=True)
    return launch_gpu_adam(core, group, elements, adam, cast_bytes=cast_bytes)


def host_allocation(core: RankCore, nbytes: float, *, dropped: bool = False) -> Waits:
    """The host's `cudaMalloc` for `nbytes` the step takes from the CUDA cache (none unless the
    phase emptied it), to `yield from`; `dropped`: the host lets go of them at once (a
    temporary of ops it has launched), so the next request reuses the block."""
    seconds = core.reserve_s(nbytes)
    if dropped:
        core.release_device_memory(nbytes)
    return core.host_time(seconds, OpKind.CUDA_MALLOC)


def launch_gpu_adam(core: RankCore, group: int, elements: int, adam: costs.GpuAdam, *,
                    cast_bytes: float = costs.CAST_TO_16BIT_BYTES_PER_ELEMENT) -> simpy.Event:
    """Unscale, Adam (`adam`: FusedAdam or PyTorch's AdamW) and the write of the 16-bit params
    (`cast_bytes` per element: the fp32 -> 16-bit cast; 0 where nothing is written) of a group
    whose state is in HBM: GPU kernels the host launches without waiting. The optimizer's
    temporary is allocated at the launch and freed once its kernels have run (the HBM it
    holds; its `cudaMalloc` is `gpu_adam`'s)."""
    per_element = adam.bytes_per_element + cast_bytes
    nbytes = per_element * elements
    seconds = core.hbm_seconds(nbytes, passes=1.0)
    temporary = adam.temporary_bytes_per_element * elements

    def body() -> Gen:
        held = (core.gpu.allocate(Category.WORKSPACE, temporary, f"adam sub-group {group}")
                if temporary else None)
        yield from core.gpu_kernel(seconds, core.compute)
        if held is not None:
            core.gpu.free(Category.WORKSPACE, held)

    return core.compute.launch(f"gpu adam sub-group {group}", body,
                               kind=OpKind.OPTIMIZER_STEP, nbytes=nbytes)


class StateStore(Protocol):
    """Where the offloaded optimizer state lives between steps (`swapping.py`)."""

    def before_step(self) -> Gen: ...
    def swap_in(self, group: int) -> Gen: ...
    def swap_out(self, group: int) -> Gen: ...


class CpuStep:
    def __init__(self, core: RankCore, groups: tuple[int, ...], copy_back: CopyBack,
                 post_step: PostStep, states: StateStore, check_overflow: OverflowCheck, *,
                 first: Callable[[], Gen] | None = None):
        self.core = core
        self.groups = groups
        self.copy_back = copy_back
        self.post_step = post_step
        self.states = states
        self.check_overflow = check_overflow
        self.first = first
        """What the step does before anything else (unmanaged accumulation's finalize of the
        boundary's work: `sinks.HostPartitions.finalize`)."""
        self._gpu_copied_out: list[simpy.Event] = []
        self._gpu_state_buffers: int | None = None

    def run(self) -> Gen:
        core = self.core
        yield from begin_step(core, lambda: self.check_overflow(core),
                              lambda: offloaded_grad_norms(core), first=self.first)
        yield from self.states.before_step()
        for group, elements in enumerate(self.groups):
            if group in core.plan.gpu_subgroups:
                yield from gpu_adam(core, group, elements, costs.torch_adamw(core.master_bytes),
                                    cast_bytes=costs.params_copy_bytes(core.master_bytes,
                                                                       core.dtype_bytes))
            elif self._steps_on_gpu(group):
                self._step_prefetched_on_gpu(group, elements)
            else:
                yield from self._update_on_cpu(group, elements)
        yield from self.post_step(core)
        yield from core.end()

    def _steps_on_gpu(self, group: int) -> bool:
        """What-if: every k-th sub-group is updated on the GPU (`what_if.gpu_update_every`)."""
        every = self.core.what_if.gpu_update_every
        return every > 0 and (group + 1) % every == 0

    def _step_prefetched_on_gpu(self, group: int, elements: int) -> None:
        """What-if (study section 4): bring the sub-group's fp32 state and gradient to the GPU
        on a stream of its own while the CPU steps the other sub-groups, update it there and
        send the state back on another, so that the next sub-group's state comes in (H2D)
        while this one's goes out (D2H); the 16-bit params are written on the GPU. Two
        sub-groups' state are in HBM at once when they fit beside what the step started
        with, else one: a copy-in then waits for the previous copy-out."""
        core = self.core
        state = costs.GPU_STATE_BYTES_PER_ELEMENT * elements
        back = costs.GPU_STATE_WRITEBACK_BYTES_PER_ELEMENT * elements
        held: list[int] = []

        def copy_in() -> Gen:
            held.append(core.gpu.allocate(Category.PREFETCHED_STATE, state, f"sub-group {group}"))
            yield from core.dma("h2d", state, pinned=core.pinned, op=f"state sub-group {group}",
                                kind=OpKind.STATE_TO_GPU)

        def update_and_copy_out() -> Gen:
            yield from core.gpu_kernel(
                core.hbm_seconds(costs.GPU_STEP_BYTES_PER_ELEMENT * elements, passes=1.0),
                core.stream(Stream.OPTIMIZER_GPU))
            yield from core.dma("d2h", back, pinned=core.pinned, op=f"state sub-group {group}",
                                kind=OpKind.STATE_TO_HOST)
            core.gpu.free(Category.PREFETCHED_STATE, held.pop())

        buffers = self._state_buffers(state)
        freed = self._gpu_copied_out[-buffers] if len(self._gpu_copied_out) >= buffers else None
        arrived = core.stream(Stream.STATE_TO_GPU).launch(
            f"state in sub-group {group}", copy_in, kind=OpKind.STATE_TO_GPU, nbytes=state,
            after=[freed])
        self._gpu_copied_out.append(core.stream(Stream.OPTIMIZER_GPU).launch(
            f"gpu adam sub-group {group}", update_and_copy_out, kind=OpKind.OPTIMIZER_STEP,
            nbytes=back, after=[arrived]))

    def _state_buffers(self, state: float) -> int:
        """How many GPU-stepped sub-groups' state may be in HBM at once: two when twice the
        first one's fits in what is free when it is launched (sub-groups are alike but the
        last, smaller; nothing else grows in HBM during the step), else one."""
        if self._gpu_state_buffers is None:
            gpu = self.core.gpu
            free = gpu.capacity - gpu.used
            self._gpu_state_buffers = 2 if 2 * state <= free else 1
        return self._gpu_state_buffers

    def _update_on_cpu(self, group: int, elements: int) -> Gen:
        core = self.core
        yield from self.states.swap_in(group)
        yield from unscale_and_adam_on_cpu(core, group, elements)
        if core.what_if.overlap_copy_back:
            core.stream(Stream.COPY_BACK).launch(
                f"copy-back sub-group {group}",
                lambda: self.copy_back(core, group, elements, Stream.CPU_COPY_BACK),
                kind=OpKind.PARAM_COPY_BACK)
        else:
            yield from self.copy_back(core, group, elements, Stream.CPU)
        yield from self.states.swap_out(group)


OverflowCheck = Callable[[RankCore], Gen]
"""How an offloaded step finds an overflow in the gradients (`compose` picks it by stage)."""


def check_overflow_on_host(core: RankCore) -> Gen:
    """stage3.py `has_overflow` with the optimizer offloaded: `isinf(b).any()` and
    `isnan(b).any()` over the host's 16-bit gradient buffer, compute-bound on the rank's pool
    (`cpu.fp16_check_elements_per_s_per_thread`) in PyTorch's parallel regions
    (`costs.OVERFLOW_CHECK_REGIONS`)."""
    yield from core.cpu_work(
        "overflow check", OpKind.OVERFLOW_CHECK,
        core.machine.cpu_kernel(
            core.rank, core.plan.partition_numel, host=costs.OVERFLOW_CHECK_HOST_BYTES,
            elements_per_s_per_thread=core.profile.fp16_check_elements_per_s_per_thread,
            regions=costs.OVERFLOW_CHECK_REGIONS))


def read_backward_overflow_flag(core: RankCore) -> Gen:
    """ZeRO-1/2 with the optimizer offloaded: the boundary backward checked each gradient on
    the GPU as it offloaded it (stage_1_and_2.py `update_offload_overflow_tracker_for_param_grad`,
    `HostAccumulation`), and the step only reads that flag (`has_overflow`: `local_overflow`
    with `cpu_offload`): nothing to price."""
    yield from ()


def offloaded_grad_norms(core: RankCore) -> Gen:
    """The global gradient norm of an offloaded step: per norm group (a ZeRO-3 sub-group, a
    ZeRO-1/2 parameter group) `complete_grad_norm_calculation_for_cpu_offload` combines the
    norms the boundary backward left on the GPU, waits for the sum and all-reduces it over
    the data-parallel group; the next group's wait follows that all-reduce, so the host pays
    each group's ops and all-reduce in turn (`software.NormDispatches`)."""
    dispatches = ZERO3_OFFLOAD_NORM if core.ds.stage == 3 else ZERO12_OFFLOAD_NORM
    for tensors in core.plan.norm_group_tensors:
        yield from core.issue_kernels(dispatches.per_tensor * tensors + dispatches.per_group)
        yield from core.collective(Collective.ALL_REDUCE, DEVICE_SCALAR_BYTES)
    yield from core.issue_kernels(dispatches.per_step)


def all_reduce_norm(core: RankCore) -> Gen:
    """One all-reduced norm (a step without ZeRO)."""
    yield from core.collective(Collective.ALL_REDUCE, DEVICE_SCALAR_BYTES)


def unscale_and_adam_on_cpu(core: RankCore, group: int, elements: int) -> Gen:
    """`unscale_and_clip_grads` on the fp32 gradient, then DeepSpeedCPUAdam, on the rank's
    thread; `adam_update` holds the GIL throughout (`RankCore.gil`)."""
    m = core.machine
    precision = core.adam_precision
    yield from core.cpu_work(f"unscale sub-group {group}", OpKind.UNSCALE,
                             m.elementwise(core.rank, elements, precision.unscale_bytes))
    core.gil.hold()
    yield from core.cpu_work(f"cpu adam sub-group {group}", OpKind.OPTIMIZER_STEP,
                             cpu_adam(m, core.rank, elements, precision=precision))
    core.gil.release()


def cpu_adam(machine: Machine, rank: int, elements: float, *, threads: int | None = None,
             precision: costs.AdamPrecision = costs.FP32_ADAM) -> Gen:
    """DeepSpeedCPUAdam's `adam_update` over `elements` elements (fp32, or what `precision`
    says) on `rank`'s OpenMP pool (or `threads` of a process of its own), one parallel region
    per tile (what `zerosim validate` also times alone)."""
    return machine.cpu_kernel(rank, elements, host=precision.host_bytes,
                              elements_per_s_per_thread=(
                                  precision.params_per_s_per_thread(machine.profile)),
                              threads=threads,
                              regions=math.ceil(elements / costs.CPU_ADAM_TILE_ELEMENTS))


def cast_then_upload(core: RankCore, group: int, elements: int, track: Stream) -> Gen:
    """`fp16_partition.copy_(fp32_partition)`: a CPU cast into a pageable temporary (the
    pool's threads fault its pages in when they are fresh, so they spread like it; then they
    read the fp32 master at home), then a blocking H2D. The what-if `overlap_copy_back` runs
    it on a helper thread (`track`)."""
    threads = core.profile.cast_threads
    temp_bytes = core.dtype_bytes * elements
    temp = core.host.allocate(Category.PAGEABLE_TEMPORARIES, temp_bytes,
                              f"sub-group {group} cast")

    def zero_then_cast() -> Gen:
        yield from core.zero_fresh_pages(temp_bytes, threads=threads, where=costs.SPREAD_PAGES)
        yield from core.machine.elementwise(
            core.rank, elements, costs.HostBytes(home=FP32_BYTES, spread=core.dtype_bytes),
            threads=threads)

    yield from core.cpu_work(f"cast fp32→16-bit sub-group {group}", OpKind.CAST,
                             zero_then_cast(), track=track)

    def upload() -> Gen:
        yield from core.dma("h2d", temp_bytes, pinned=False, buffer=costs.SPREAD_PAGES,
                            op=f"params sub-group {group}", kind=OpKind.PARAM_COPY_BACK)

    yield core.compute.launch(f"H2D params sub-group {group}", upload,
                              kind=OpKind.PARAM_COPY_BACK, nbytes=temp_bytes)
    core.host.free(Category.PAGEABLE_TEMPORARIES, temp)


def upload_fp32_then_cast_on_gpu(core: RankCore, group: int, elements: int, track: Stream,
                                 *, pinned: bool | None = None) -> Gen:
    """ZeRO-1/2 from DeepSpeed 0.14.1 to 0.16.x (`zero12_copy_back_fp32_to_gpu`):
    `bit16.copy_(fp32_partition.to(device))`. `.to` copies the fp32 partition (pinned in
    these releases, `stage12_master_pinned`, unless `pinned` says otherwise) H2D into a fp32
    GPU temporary, the host waiting for it; the compute stream then casts it into the 16-bit
    partition and the temporary goes. Nothing runs on the host's pool (`track` unused)."""
    fp32 = FP32_BYTES * elements
    temp = core.gpu.allocate(Category.WORKSPACE, fp32, f"sub-group {group} fp32 params")

    if pinned is None:
        pinned = stage12_master_pinned(core.ds, core.behaviours)

    def upload() -> Gen:
        yield from core.dma("h2d", fp32, pinned=pinned, op=f"fp32 params sub-group {group}",
                            kind=OpKind.PARAM_COPY_BACK)

    def cast() -> Gen:
        yield from core.gpu_kernel(
            core.hbm_seconds((FP32_BYTES + core.dtype_bytes) * elements, passes=1.0),
            core.compute)
        core.gpu.free(Category.WORKSPACE, temp)

    yield core.compute.launch(f"H2D fp32 params sub-group {group}", upload,
                              kind=OpKind.PARAM_COPY_BACK, nbytes=fp32)
    core.compute.launch(f"cast fp32→16-bit sub-group {group}", cast, kind=OpKind.CAST,
                        nbytes=fp32)


def cast_into_16bit_buffer_then_upload(core: RankCore, group: int, elements: int,
                                       track: Stream) -> Gen:
    """ZeRO-1/2 from DeepSpeed 0.17.0 (`zero12_copy_back_via_16bit_host_buffer`):
    `bit16_buffer.copy_(fp32_partition)`, a CPU cast into the 16-bit host buffer made at
    start-up (its pages faulted in then: pinned ones by the rank's thread, pageable ones by
    `torch.full`'s pool; from bf16 master params a plain copy), then
    `bit16.copy_(bit16_buffer, non_blocking=True)`: from a pinned
    buffer the H2D is queued on the compute stream and the host goes on, from a pageable one
    the host waits for it."""
    nbytes = core.dtype_bytes * elements
    buffer = costs.HOME_PAGES if core.pinned else costs.SPREAD_PAGES
    cast = costs.HostBytes(home=core.master_bytes + buffer.home * core.dtype_bytes,
                           spread=buffer.spread * core.dtype_bytes)
    yield from core.cpu_work(f"{_into_params(core)} sub-group {group}", OpKind.CAST,
                             core.machine.elementwise(core.rank, elements, cast,
                                                      threads=core.profile.cast_threads),
                             track=track)

    def upload() -> Gen:
        yield from core.dma("h2d", nbytes, pinned=core.pinned, buffer=buffer,
                            op=f"params sub-group {group}", kind=OpKind.PARAM_COPY_BACK)

    uploaded = core.compute.launch(f"H2D params sub-group {group}", upload,
                                   kind=OpKind.PARAM_COPY_BACK, nbytes=nbytes)
    if not core.pinned:
        yield uploaded


def upload_master_partition(core: RankCore, group: int, elements: int, track: Stream) -> Gen:
    """ZeRO-3 with bf16 master params (`bf16.bf16_master_weights_and_grads`): stage3.py
    `_reassign_or_swap_out_partitioned_parameters` copies the stepped partition into the 16-bit
    one, `fp16_flat.copy_(fp32_flat)`, now of one dtype: no cast, a blocking H2D straight from
    the master partition, pageable (`_create_fp32_partitions` clones it from a `.to("cpu")`,
    on the rank's home pages). Nothing runs on the host's pool (`track` unused)."""
    nbytes = core.dtype_bytes * elements

    def upload() -> Gen:
        yield from core.dma("h2d", nbytes, pinned=False, buffer=costs.HOME_PAGES,
                            op=f"params sub-group {group}", kind=OpKind.PARAM_COPY_BACK)

    yield core.compute.launch(f"H2D params sub-group {group}", upload,
                              kind=OpKind.PARAM_COPY_BACK, nbytes=nbytes)


def cast_into_host_params(core: RankCore, group: int, elements: int, track: Stream) -> Gen:
    """With `offload_param` the 16-bit partition lives in host memory: the cast (a plain copy
    from bf16 master params) writes it there and nothing crosses PCIe until the next fetch."""
    cast = costs.HostBytes(home=core.master_bytes + core.dtype_bytes)
    yield from core.cpu_work(f"{_into_params(core)} sub-group {group}", OpKind.CAST,
                             core.machine.elementwise(core.rank, elements, cast,
                                                      threads=core.profile.cast_threads),
                             track=track)


def _into_params(core: RankCore) -> str:
    """What writing the master partition into the 16-bit one is: a cast, or a copy."""
    master = core.ds.master_dtype
    return "cast fp32→16-bit" if master == "fp32" else f"copy {master}"


def download_into_host_params(core: RankCore, group: int, elements: int,
                              stepped: simpy.Event) -> Gen:
    """`offload_param` with the optimizer on the GPU: stage3.py
    `_reassign_or_swap_out_partitioned_parameters` writes the stepped fp32 partition into the
    16-bit one in host memory, `fp16_flat.copy_(fp32_flat)`, blocking: the host waits for the
    group's Adam, then PyTorch converts on the CPU (a D2H of the fp32 bytes into a pageable
    temporary, cast into the host partition)."""
    yield stepped
    yield from core.download_with_cpu_cast(
        elements, FP32_BYTES, costs.HostBytes(home=FP32_BYTES + core.dtype_bytes),
        name=f"sub-group {group}", copy_op=f"fp32 params sub-group {group}",
        cast_op=f"cast fp32→16-bit sub-group {group}", kind=OpKind.PARAM_COPY_BACK)


class GpuStep:
    """The optimizer on the GPU: the overflow check and the gradient norms on the GPU, then
    per group the fp32 gradient made from the 16-bit partitions and the optimizer (`adam`:
    DeepSpeed's FusedAdam, or PyTorch's AdamW with `torch_adam`; unscale, Adam, cast to 16
    bits), kernels the host launches without waiting; with the parameters offloaded, the
    host writes each group back (`write_back`).

    Stages 1-3 take the norm of each gradient partition in fp64 (`get_grad_norm_direct`:
    `g.double().norm(2)`, one copy alive at a time), then make a group's fp32 gradient only
    when it steps: `flatten(averaged_gradients).to(fp32)` (stage3.py
    `_prepare_fp32_grad_for_sub_group`, stage_1_and_2.py `step`), dropped once its Adam has
    run (`_release_sub_group`; `single_partition_of_fp32_groups[i].grad = None`)."""

    def __init__(self, core: RankCore, groups: tuple[int, ...], post_step: PostStep,
                 adam: costs.GpuAdam, write_back: WriteBack | None = None, *,
                 cast_bytes: float = costs.CAST_TO_16BIT_BYTES_PER_ELEMENT):
        self.core = core
        self.groups = groups
        self.post_step = post_step
        self.adam = adam
        self.write_back = write_back
        """Where the 16-bit params are written when not in HBM (None: on the GPU)."""
        self.cast_bytes = cast_bytes if write_back is None else 0
        """Per element, writing the stepped master into the 16-bit params on the GPU."""
        self.casts_gradient = core.accum_bytes != core.master_bytes
        """Whether the flat gradient is cast into a master gradient of its own (fp32 master
        params; with bf16 ones `.to(bf16)` gives the flat copy itself)."""

    def run(self) -> Gen:
        core = self.core
        norms = self._gradient_norms if core.ds.stage > 0 else lambda: all_reduce_norm(core)
        yield from begin_step(core, self._check_overflow, norms)
        for group, size in enumerate(self.groups):
            release = None
            if core.ds.stage > 0:
                yield from self._master_gradient_allocations(size)
                release = self._launch_master_gradient(group, size)
            stepped = yield from gpu_adam(core, group, size, self.adam,
                                          cast_bytes=self.cast_bytes)
            if release is not None:
                core.release_device_memory(self._master_gradient_bytes(size))
                core.when_done(stepped, release)
            if self.write_back is not None:
                yield from self.write_back(core, group, size, stepped)
        yield from self.post_step(core)
        yield from core.end()

    def _gradient_norms(self) -> Gen:
        """Every partition's fp64 norm (its gradient read, 8 B written and read back), the
        host dispatching each partition's ops in turn; the host waits for the result
        (`float(total_norm)`) and its all-reduce (one per norm group, queued back to back
        without a host wait between them: taken as one)."""
        core = self.core
        elements = sum(self.groups)
        params = core.plan.all_params
        if core.ds.stage == 3:
            largest = max(p.partition_numel for p in params)
        else:  # a stage 1/2 partition holds at most a whole tensor's slice of its flat range
            largest = min(max(p.numel for p in params), core.plan.partition_numel)
        seconds = core.hbm_seconds(costs.fp64_norm_hbm_bytes(elements, core.accum_bytes),
                                   passes=1.0)
        yield from core.issue_kernels(GRAD_NORM_DISPATCHES_PER_PARTITION
                                      * sum(core.plan.norm_group_tensors))

        def body() -> Gen:
            copy = core.gpu.allocate(Category.GRAD_PARTITIONS, FP64_BYTES * largest,
                                     "fp64 norm copy")
            yield from core.sms.compute(seconds)
            core.gpu.free(Category.GRAD_PARTITIONS, copy)

        yield core.compute.launch("gradient norms", body, kind=OpKind.GRAD_NORM,
                                  nbytes=core.accum_bytes * elements)
        yield from all_reduce_norm(core)

    def _master_gradient_bytes(self, elements: int) -> int:
        """What the group's master gradient holds until `_release_sub_group`."""
        core = self.core
        return (core.master_bytes if self.casts_gradient else core.accum_bytes) * elements

    def _master_gradient_allocations(self, elements: int) -> Gen:
        """The host's `cudaMalloc` for a group's master gradient (`_launch_master_gradient`):
        the flat 16-bit copy, dropped once cast, and the fp32 gradient, dropped by
        `_release_sub_group` once the group's Adam is launched (with bf16 master params the
        flat copy is the gradient)."""
        core = self.core
        yield from host_allocation(core, core.accum_bytes * elements)
        if self.casts_gradient:
            yield from host_allocation(core, core.master_bytes * elements)
            core.release_device_memory(core.accum_bytes * elements)

    def _launch_master_gradient(self, group: int, elements: int) -> Callable[[], None]:
        """The group's master gradient: the 16-bit partitions flattened (a copy: read and
        write the 16-bit bytes) and cast to fp32 (read them, write 4 B), the flat copy freed
        once cast; with bf16 master params the flat copy itself. Returns what frees it, once
        the group's Adam has run."""
        core = self.core
        flat_bytes = core.accum_bytes * elements
        cast = core.accum_bytes + core.master_bytes if self.casts_gradient else 0
        seconds = core.hbm_seconds((2 * core.accum_bytes + cast) * elements, passes=1.0)
        held: dict[str, tuple[Category, int]] = {}

        def body() -> Gen:
            flat = core.gpu.allocate(Category.GRAD_PARTITIONS, flat_bytes,
                                     f"flat gradient sub-group {group}")
            if not self.casts_gradient:
                held["grad"] = (Category.GRAD_PARTITIONS, flat)
                yield from core.sms.compute(seconds)
                return
            held["grad"] = (Category.FP32_GRADS, core.gpu.allocate(
                Category.FP32_GRADS, core.master_bytes * elements,
                f"fp32 gradient sub-group {group}"))
            yield from core.sms.compute(seconds)
            core.gpu.free(Category.GRAD_PARTITIONS, flat)

        core.compute.launch(f"{core.ds.master_dtype} gradient sub-group {group}", body,
                            kind=OpKind.CAST, nbytes=flat_bytes)
        return lambda: core.gpu.free(*held["grad"])

    def _check_overflow(self) -> Gen:
        """4 B per element on the GPU (stage3.py `has_overflow` without offload runs `isinf`
        and `isnan` over the 16-bit `grad_partitions_flat_buffer`: 2 x 2 B); the host waits
        for the flag."""
        elements = sum(self.groups)
        yield self.core.hbm_op(self.core.compute, "overflow check", OpKind.OVERFLOW_CHECK,
                               costs.OVERFLOW_CHECK_GPU_BYTES_PER_ELEMENT * elements,
                               passes=1.0)


def begin_step(core: RankCore, check_overflow: Callable[[], Gen],
               norms: Callable[[], Gen], first: Callable[[], Gen] | None = None) -> Gen:
    """The update phase opens (with `first`, what a mode's step does before anything else:
    SuperOffload's wait for its optimizer process; unmanaged accumulation's finalize, whose
    GPU work, returned, the step waits for once its host work per tensor is done, where the
    overflow check or the norms first read what it made), then (ZeRO-3) the host's work per
    parameter tensor in the step, taken together here (`step_tensor_s`: releasing the
    gathered ones, then per sub-group flattening the gradients and unflattening the
    partition), then the overflow check (`DeepSpeedConfig.check_grad_overflow`: fp16, and bf16
    ZeRO-1/2 where the release and the config say so) and its all-reduced flag, then the
    gradient norms and their all-reduces (`norms`)."""
    core.begin(Phase.UPDATE, core.ds.gradient_accumulation_steps - 1)
    pending = (yield from first()) if first is not None else None
    if core.ds.stage == 3:
        yield from core.host_time(core.step_tensor_s * len(core.plan.all_params),
                                  OpKind.STEP_BOOKKEEPING)
    if pending is not None:
        yield pending
    if core.ds.check_grad_overflow:
        yield from check_overflow()
        yield from core.collective(Collective.ALL_REDUCE, DEVICE_SCALAR_BYTES)
    yield from norms()


def gather_all(core: RankCore, op: str, nbytes: float) -> simpy.Event:
    key = core.next_key(Collective.ALL_GATHER)

    def body() -> Gen:
        yield from core.machine.collective(core.rank, key, Collective.ALL_GATHER, nbytes,
                                           core.ranks)

    return core.stream(Stream.ALLGATHER).launch(op, body, kind=OpKind.ALL_GATHER,
                                                nbytes=nbytes)


def regather_persistent(core: RankCore) -> Gen:
    """Stage 3 `_post_step`: persistent parameters are re-gathered, each its own all-gather
    (partition_parameters.py `_allgather_params_coalesced` issues one
    `all_gather_into_tensor` per tensor), the host's work per tensor before each
    (`regather_tensor_s`)."""
    for param in core.plan.all_params:
        if not param.persistent:
            continue
        yield from core.host_time(core.regather_tensor_s, OpKind.STEP_BOOKKEEPING)
        if core.distributed:
            gather_all(core, "all-gather persistent param", core.dtype_bytes * param.numel)


def allgather_updated(core: RankCore) -> Gen:
    """Stages 1/2 `all_gather_dp_groups`: the updated 16-bit partitions, in allgather
    buckets."""
    total = core.dtype_bytes * sum(p.numel for p in core.plan.all_params)
    chunk = core.dtype_bytes * core.ds.allgather_bucket_size
    start = 0
    while core.distributed and start < total:
        gather_all(core, "all-gather updated params", min(chunk, total - start))
        start += chunk
    yield from ()


def nothing_to_gather(core: RankCore) -> Gen:
    """Stage 0: every rank stepped every parameter."""
    yield from ()
