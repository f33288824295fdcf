"""Where a reduced gradient partition goes: the `partition_grads` of each mode.

`HostPartitions` (stage 3, optimizer offloaded; stage3.py `partition_grads`): the first
micro-batch moves each partition D2H into the host accumulation buffer and back, later ones
bring the accumulator H2D, add on the GPU and send it back; at the boundary the fp32 gradient
goes to the optimizer's host buffer as the DeepSpeed version does it (`BoundaryFlush`).
`HostAccumulation` (stages 1/2, optimizer offloaded; stage_1_and_2.py
`async_accumulate_grad_in_cpu_via_gpu` and the boundary `copy_(src.float(), non_blocking=True)`).
`GpuPartitions` (no offload): the partition is copied into, or added to, its HBM buffer.
"""

from __future__ import annotations

from typing import Protocol

from zerosim.engine.gradients import BucketEntry
from zerosim.engine.interleaved import GpuGradients
from zerosim.engine.plan import Param
from zerosim.engine.rank import Gen, RankCore
from zerosim.engine.software import (
    FINALIZE_DISPATCHES_PER_TENSOR,
    GRAD_NORM_CHUNK_NUMEL,
    ZERO2_FINALIZE_DISPATCHES_PER_PARAM,
)
from zerosim.engine.streams import Body
from zerosim.hardware import costs
from zerosim.units import FP32_BYTES, FP64_BYTES
from zerosim.vocabulary import Category, OpKind, Stream

ADD_PASSES = 3.0
"""An in-place add on the GPU: read both operands, write one."""


def _per_param(bucket: list[BucketEntry], move, end=None) -> Body:
    """The host thread issues the bucket's copies one by one; when one blocks, it waits for
    everything before it on the stream, so the whole bucket is one in-order op (`end`, if
    given, runs after the last)."""
    def body() -> Gen:
        for entry in bucket:
            yield from move(entry.param)
        if end is not None:
            yield from end()
    return body


def _finalize_each(core: RankCore, work, dispatches: int, *, host_waits: bool,
                   end=None) -> Gen:
    """Unmanaged accumulation's finalize at the start of step(): for each parameter tensor in
    the optimizer's order, the host's `dispatches` launches, then `work(param, name)` as one
    op on the default stream (`end`, if given, after the last), the host waiting for each
    where `host_waits`. Returns the last op's event, for the step to wait on."""
    plan = core.plan
    params = sorted(plan.all_params, key=plan.group_of)
    done = None
    for i, param in enumerate(params):
        yield from core.issue_kernels(dispatches)
        name = plan.modules[param.module].name

        def body(param: Param = param, name: str = name, last: bool = i == len(params) - 1
                 ) -> Gen:
            yield from work(param, name)
            if last and end is not None:
                yield from end()

        done = core.compute.launch(f"finalize grad {name}", body, kind=OpKind.PARTITION_GRADS,
                                   nbytes=core.accum_bytes * param.partition_numel)
        if host_waits:
            yield done
    return done


class PartitionedEveryMicroBatch:
    """What ZeRO-3's sinks share: every micro-batch's gradients are reduced and partitioned as
    their buckets fill, and none is held for the backward's end."""

    def reduces_at(self, micro: int, boundary: bool) -> bool:
        return True

    def frees_grads_after_backward(self, boundary: bool) -> bool:
        return False


class HostPartitions(PartitionedEveryMicroBatch):
    """Stage 3 with the optimizer offloaded."""

    def __init__(self, core: RankCore, flush: BoundaryFlush):
        self.core = core
        self.flush = flush

    def partition(self, bucket: list[BucketEntry], micro: int, boundary: bool
                  ) -> tuple[Body, bool]:
        buffered = boundary and self.flush.can_buffer(bucket)
        stays_on_gpu = boundary and self.flush.stays_on_gpu(bucket)
        pageable = boundary and self.flush.flushes_to_shared_memory(bucket)

        def move(param: Param) -> Gen:
            return self._move(param, micro, boundary, buffered)

        end = self.flush.swap.swap_out_gradients if boundary else None
        return (_per_param(bucket, move, end),
                pageable or self._host_blocks(boundary, buffered or stays_on_gpu))

    def finalize(self) -> Gen:
        """Unmanaged accumulation (`managed_gradient_accumulation: false`, DeepSpeed 0.19.5:
        `_finalize_offload_gradient_accumulation`): no backward was the boundary, so step()
        opens with the boundary's work, tensor by tensor in the optimizer's groups, on the
        default stream: the accumulated host partition back to the GPU (`.to(device,
        non_blocking=True)`), its fp64 norm, then the boundary flush into the fp32 gradient
        (and, for sub-groups on NVMe, their swap-out after the last). The host issues each
        tensor's ops in turn (waiting for them where a copy is pageable); returns the last
        one, which the step's overflow check or norms wait for (`begin_step`)."""
        return (yield from _finalize_each(self.core, self._finalize_tensor,
                                          FINALIZE_DISPATCHES_PER_TENSOR,
                                          host_waits=self._host_blocks(True, False),
                                          end=self.flush.swap.swap_out_gradients))

    def _finalize_tensor(self, param: Param, name: str) -> Gen:
        core = self.core
        acc = core.accum_bytes * param.partition_numel
        buffer = core.gpu.allocate(Category.GRAD_PARTITIONS, acc, f"grad buffer {name}")
        yield from core.dma("h2d", acc, pinned=core.pinned, op=f"accum → GPU {name}",
                            kind=OpKind.GRAD_FROM_HOST)
        yield from fp64_grad_norm(core, param.partition_numel, name,
                                  source_bytes=core.accum_bytes)
        yield from self.flush.send(param, name, False)
        core.gpu.free(Category.GRAD_PARTITIONS, buffer)

    def _host_blocks(self, boundary: bool, non_blocking: bool) -> bool:
        """Any copy to or from pageable memory blocks the host thread (SuperOffload's flush
        into shared memory too: `BoundaryFlush.flushes_to_shared_memory`), and so does the
        boundary flush unless it is `non_blocking` (`boundary_flush_non_blocking`, the fork's
        `part_grads_async`, SuperOffload's) or none of the bucket leaves the GPU (the what-if
        buffers it, or all of it belongs to sub-groups the interleaved update steps on the
        GPU)."""
        if not self.core.pinned:
            return True
        return (boundary and not self.flush.non_blocking() and not non_blocking)

    def _move(self, param: Param, micro: int, boundary: bool, buffered: bool) -> Gen:
        core = self.core
        name = core.plan.modules[param.module].name
        acc = core.accum_bytes * param.partition_numel
        pinned = core.pinned
        if micro == 0:
            yield from core.dma("d2h", acc, pinned=pinned, op=f"grad → accum {name}",
                                kind=OpKind.GRAD_TO_HOST)
            buffer = core.gpu.allocate(Category.GRAD_PARTITIONS, acc, f"grad buffer {name}")
            yield from core.dma("h2d", acc, pinned=pinned, op=f"accum → GPU {name}",
                                kind=OpKind.GRAD_FROM_HOST)
        else:
            buffer = core.gpu.allocate(Category.GRAD_PARTITIONS, acc, f"grad buffer {name}")
            yield from core.dma("h2d", acc, pinned=pinned, op=f"accum → GPU {name}",
                                kind=OpKind.GRAD_FROM_HOST)
            yield from core.gpu_kernel(core.hbm_seconds(acc, ADD_PASSES), core.reduction_stream)
            yield from core.dma("d2h", acc, pinned=pinned, op=f"accum → host {name}",
                                kind=OpKind.GRAD_TO_HOST)
        if boundary:
            yield from fp64_grad_norm(core, param.partition_numel, name,
                                      source_bytes=core.accum_bytes)
            yield from self.flush.send(param, name, buffered)
        core.gpu.free(Category.GRAD_PARTITIONS, buffer)


class ConcatenatedSubGroups(PartitionedEveryMicroBatch):
    """SuperOffload's `partition_grads` up to DeepSpeed 0.18.8 (buckets cut at sub-group edges,
    `gradients.SubGroupBuckets`): nothing before the boundary (no host accumulation: only the
    boundary micro-batch's gradients reach the optimizer); at the boundary each partition's
    fp64 norm, then the sub-group's partitions concatenated and cast to fp32 on the GPU
    (`torch.cat(...).to(fp32)`: read and write 16-bit, read 16-bit and write 4 B) and copied
    `non_blocking` into its fp32 gradient: pinned host memory for a CPU sub-group, HBM for a
    Twin-Flow one. The fp32 copy on the GPU stays allocated until the optimizer process has
    copied it out too (it got it as a CUDA tensor through its queue): `held[group]`."""

    def __init__(self, core: RankCore):
        self.core = core
        self.held: dict[int, int] = {}
        """Each handed-over sub-group's fp32 copy on the GPU, until the process frees it."""

    def partition(self, bucket: list[BucketEntry], micro: int, boundary: bool
                  ) -> tuple[Body, bool]:
        core = self.core
        if not boundary:
            return core.no_kernel, False
        sizes: dict[int, int] = {}
        for entry in bucket:
            group = core.plan.group_of(entry.param)
            sizes[group] = sizes.get(group, 0) + entry.param.partition_numel

        def body() -> Gen:
            for entry in bucket:
                param = entry.param
                yield from fp64_grad_norm(core, param.partition_numel,
                                          core.plan.modules[param.module].name,
                                          source_bytes=core.dtype_bytes)
            for group, elements in sizes.items():
                yield from self._concatenate(group, elements)

        return body, False

    def _concatenate(self, group: int, elements: int) -> Gen:
        core, d = self.core, self.core.dtype_bytes
        name = f"sub-group {group}"
        flat = core.gpu.allocate(Category.GRAD_PARTITIONS, d * elements, f"concatenated {name}")
        fp32 = core.gpu.allocate(Category.GRAD_PARTITIONS, FP32_BYTES * elements,
                                 f"fp32 gradient {name}")
        yield from core.gpu_kernel(core.hbm_seconds((3 * d + FP32_BYTES) * elements,
                                                    passes=1.0), core.reduction_stream)
        core.gpu.free(Category.GRAD_PARTITIONS, flat)
        if group in core.plan.gpu_subgroups:
            yield from core.gpu_kernel(core.hbm_seconds(FP32_BYTES * elements),
                                       core.reduction_stream)
            core.gpu.free(Category.GRAD_PARTITIONS, fp32)
            return
        yield from fp32_d2h(core, elements, name)
        self.held[group] = fp32


class GradientSwap(Protocol):
    def swaps(self, param: Param) -> bool: ...
    def flush_gradient(self, param: Param, name: str) -> Gen: ...
    def swap_out_gradients(self) -> Gen: ...


class BoundaryFlush:
    """The boundary's fp32 gradient of one partition, on its way to the optimizer (to NVMe
    when its sub-group's state is swapped: `swap`)."""

    def __init__(self, core: RankCore, swap: GradientSwap,
                 gpu_gradients: GpuGradients | None = None, *, shared_grads: bool = False):
        self.core = core
        self.swap = swap
        self.gpu_gradients = gpu_gradients
        """Where the interleaved update keeps its GPU sub-groups' gradients (None without)."""
        self.shared_grads = shared_grads
        """SuperOffload: the CPU sub-groups' fp32 gradients are in shared, pageable memory
        (`superoffload.py`), where a `non_blocking` D2H runs at the pageable rate, the host
        waiting for it."""
        self.cast_accumulated = costs.HostBytes(home=core.accum_bytes + FP32_BYTES)
        """What casting the accumulated gradient into the fp32 buffer touches per element."""
        self.cast_16bit = costs.HostBytes(home=core.dtype_bytes + FP32_BYTES)
        """What casting a 16-bit temporary into the fp32 buffer touches per element."""
        self.copy_staged = costs.HostBytes(home=2 * FP32_BYTES)
        """What copying the pinned staging buffer into the fp32 buffer touches per element."""

    def can_buffer(self, bucket: list[BucketEntry]) -> bool:
        """What-if: buffer a boundary bucket on the GPU only if it fits in free HBM now, with
        what moving one partition holds besides (its 16-bit copy back from the host and its
        fp64 copy for the norm)."""
        core = self.core
        numels = [e.param.partition_numel for e in bucket]
        moving = max(core.accum_bytes * n + fp64_norm_bytes(n) for n in numels)
        need = core.accum_bytes * sum(numels) + moving
        return (core.what_if.buffer_boundary_grads
                and core.gpu.used + need <= core.gpu.capacity)

    def non_blocking(self) -> bool:
        """The copy to the host is `non_blocking`: DeepSpeed from 0.19.5, the Deep Optimizer
        States fork's `part_grads_async`, SuperOffload's `partition_grads`."""
        o = self.core.ds.offload_optimizer
        return (self.core.behaviours.boundary_flush_non_blocking or o.part_grads_async
                or o.super_offload)

    def flushes_to_shared_memory(self, bucket: list[BucketEntry]) -> bool:
        """Some gradient of the bucket goes to a CPU sub-group's fp32 gradient in shared
        memory (SuperOffload): the host waits for the bucket's copies."""
        plan = self.core.plan
        return self.shared_grads and any(not plan.on_gpu(e.param) for e in bucket)

    def stays_on_gpu(self, bucket: list[BucketEntry]) -> bool:
        """Every gradient of the bucket goes to a sub-group the interleaved update steps on
        the GPU."""
        plan = self.core.plan
        return bool(plan.interleaved) and all(
            plan.interleaved_on_gpu(plan.group_of(e.param)) for e in bucket)

    def send(self, param: Param, name: str, buffered: bool) -> Gen:
        """As each DeepSpeed version does it. Where the gradients accumulate in the master
        gradients' dtype (fp32 accumulation; bf16 with bf16 master weights) the buffer already
        holds it: a plain D2H, no cast."""
        core = self.core
        elements = param.partition_numel
        group = core.plan.group_of(param)
        if self.gpu_gradients is not None and core.plan.interleaved_on_gpu(group):
            yield from self.gpu_gradients.receive(group, elements)
        elif core.plan.on_gpu(param):
            seconds = core.hbm_seconds((core.accum_bytes + core.master_bytes) * elements,
                                       passes=1.0)
            yield from core.gpu_kernel(seconds, core.reduction_stream)
        elif self.shared_grads:
            yield from self._into_shared_memory(elements, name)
        elif buffered:
            yield from self._buffer_and_flush_async(elements, name)
        elif self.swap.swaps(param):
            yield from self.swap.flush_gradient(param, name)
        elif core.ds.grad_accum_dtype == core.ds.master_dtype:
            yield from master_grad_d2h(core, elements, name)
        elif not core.behaviours.boundary_flush_cast_on_gpu and not self.non_blocking():
            yield from self._via_cpu_cast(elements, name)
        elif core.behaviours.boundary_flush_stages_in_pinned_buffer and not self.non_blocking():
            yield from self._via_pinned_staging(elements, name)
        else:
            yield from gpu_cast_then_d2h(core, elements, name)

    def _into_shared_memory(self, elements: int, name: str) -> Gen:
        """SuperOffload's `fp32_grad.copy_(grad_buffer.to(fp32), non_blocking=True)` into a
        CPU sub-group's fp32 gradient, which `torch.multiprocessing` moved into shared memory
        when it was first handed to the optimizer process (`share_memory_` takes the pinned
        buffer's bytes to a new, pageable segment): the cast on the GPU (none when the
        gradients accumulate in fp32), then a D2H at the pageable rate."""
        core = self.core
        if core.ds.grad_accum_dtype == "fp32":
            yield from fp32_d2h(core, elements, name, pinned=False)
        else:
            yield from gpu_cast_then_d2h(core, elements, name, pinned=False)

    def _buffer_and_flush_async(self, elements: int, name: str) -> Gen:
        """What-if (study section 4): keep the boundary gradient in GPU memory freed by the
        activations and flush it in the background: a D2H on its own stream, then the cast
        into the fp32 buffer by a host helper thread. Nothing waits for it until the step."""
        core = self.core
        nbytes = core.accum_bytes * elements
        buffered = core.gpu.allocate(Category.BOUNDARY_GRAD_BUFFER, nbytes,
                                     f"buffered grad {name}")
        yield from core.gpu_kernel(core.hbm_seconds(nbytes), core.reduction_stream)

        def flush() -> Gen:
            yield from core.dma("d2h", nbytes, pinned=core.pinned, op=f"async flush {name}",
                                kind=OpKind.GRAD_FLUSH)
            core.gpu.free(Category.BOUNDARY_GRAD_BUFFER, buffered)
            if core.accum_bytes != FP32_BYTES:
                yield from core.cpu_work(
                    f"cast fp16→fp32 {name}", OpKind.CAST,
                    core.machine.elementwise(core.rank, elements, self.cast_accumulated,
                                             threads=core.profile.cast_threads),
                    nbytes=nbytes, track=Stream.CPU_FLUSH)

        core.stream(Stream.FLUSH).launch(f"async flush {name}", flush, kind=OpKind.GRAD_FLUSH,
                                         nbytes=nbytes)

    def _via_pinned_staging(self, elements: int, name: str) -> Gen:
        """DeepSpeed 0.15.4 to 0.16.2 (`boundary_flush_pinned_staging`): the GPU casts the
        gradient to fp32, a blocking D2H puts it in the pinned staging buffer,
        `get_accelerator().synchronize()` holds the host until the compute stream has run
        what it queued, then the host copies the staging buffer into the sub-group's fp32
        gradient (read 4 B, write 4 B per element)."""
        core = self.core
        yield from gpu_cast_then_d2h(core, elements, name, pinned=True)
        drained = core.compute.idle_event()
        if drained is not None:
            yield drained
        yield from core.cpu_work(
            f"copy staged fp32 grad {name}", OpKind.GRAD_FLUSH,
            core.machine.elementwise(core.rank, elements, self.copy_staged,
                                     threads=core.profile.cast_threads),
            nbytes=FP32_BYTES * elements)

    def _via_cpu_cast(self, elements: int, name: str) -> Gen:
        """PyTorch's blocking cross-dtype D2H: a D2H into a pageable 16-bit temporary (its
        pages zeroed first when they are fresh), then a cast into the fp32 buffer on the CPU."""
        yield from self.core.download_with_cpu_cast(
            elements, self.core.dtype_bytes, self.cast_16bit, name=name,
            copy_op=f"fp32 flush {name}", cast_op=f"cast fp16→fp32 {name}",
            kind=OpKind.GRAD_FLUSH)


def fp64_norm_bytes(elements: int, chunked: bool = True) -> int:
    """The fp64 copy `fp64_grad_norm` holds for a partition of `elements`."""
    return FP64_BYTES * (min(elements, GRAD_NORM_CHUNK_NUMEL) if chunked else elements)


def fp64_grad_norm(core: RankCore, elements: int, name: str, *, source_bytes: int,
                   chunked: bool = True) -> Gen:
    """A gradient partition's norm on the GPU as DeepSpeed takes it, `x.double().norm(2)`:
    a fp64 copy (the gradient read, `source_bytes` per element; 8 B written) that the norm
    reads back, one copy alive at a time: stage 3's `_constant_buffered_norm2` makes it
    `GRAD_NORM_CHUNK_NUMEL` elements at a time (`chunked`), stages 1/2 copy the whole
    partition."""
    temp = core.gpu.allocate(Category.GRAD_PARTITIONS, fp64_norm_bytes(elements, chunked),
                             f"fp64 norm {name}")
    seconds = core.hbm_seconds(costs.fp64_norm_hbm_bytes(elements, source_bytes), passes=1.0)
    yield from core.gpu_kernel(seconds, core.reduction_stream)
    core.gpu.free(Category.GRAD_PARTITIONS, temp)


def gpu_cast(core: RankCore, elements: int, name: str) -> Gen:
    """`src.float()` on the GPU: a fp32 temporary (6 B/element through HBM). Returns the
    temporary's allocation, for `free_fp32_cast`."""
    fp32 = FP32_BYTES * elements
    temp = core.gpu.allocate(Category.GRAD_PARTITIONS, fp32, f"fp32 cast {name}")
    yield from core.gpu_kernel(core.hbm_seconds(fp32, passes=1.5), core.reduction_stream)
    return temp


def free_fp32_cast(core: RankCore, temp: int) -> None:
    core.gpu.free(Category.GRAD_PARTITIONS, temp)


def fp32_d2h(core: RankCore, elements: int, name: str, *, pinned: bool | None = None
             ) -> Gen:
    """A D2H of a fp32 gradient, 4 B/element (into the optimizer's host buffer, pinned or
    not, unless told)."""
    yield from core.dma("d2h", FP32_BYTES * elements,
                        pinned=core.pinned if pinned is None else pinned,
                        op=f"fp32 grad {name}", kind=OpKind.GRAD_FLUSH)


def master_grad_d2h(core: RankCore, elements: int, name: str, *, pinned: bool | None = None
                    ) -> Gen:
    """`master_grad.copy_(grad.to(master dtype))` where the gradient already has the master
    gradient's dtype (fp32 accumulation; bf16 with bf16 master weights): no cast, a D2H of the
    master's bytes (into a buffer pinned as `pin_memory` says, unless told)."""
    yield from core.dma("d2h", core.master_bytes * elements,
                        pinned=core.pinned if pinned is None else pinned,
                        op=f"{core.ds.master_dtype} flush {name}", kind=OpKind.GRAD_FLUSH)


def gpu_cast_then_d2h(core: RankCore, elements: int, name: str, *, pinned: bool | None = None
                      ) -> Gen:
    """`copy_(src.float())`: cast to fp32 into a GPU temporary, then a D2H of it (into the
    optimizer's host buffer, pinned or not, unless told)."""
    temp = yield from gpu_cast(core, elements, name)
    yield from fp32_d2h(core, elements, name, pinned=pinned)
    free_fp32_cast(core, temp)


class HostAccumulation:
    """Stages 1/2 with the optimizer offloaded."""

    def __init__(self, core: RankCore, *, flush_pinned: bool | None = None,
                 reduces_every_step: bool = False):
        self.core = core
        self.flush_pinned = flush_pinned
        """Whether the boundary's fp32 gradient buffer is pinned, where that is not
        `pin_memory` (ZenFlow's overlapped step copies into buffers `share_memory_` moved to
        shared, pageable memory); None: as `pin_memory` says."""
        self.reduces_every_step = reduces_every_step or core.ds.stage == 2
        """Stage 2 reduces at every micro-batch, stage 1 at the boundary only, unless ZenFlow
        runs it (engine.py `allreduce_gradients`: `elif self.zenflow: reduce_gradients`,
        after each backward; replayed as stage 2's, bucket by bucket during it)."""
        self.accumulates = (core.ds.gradient_accumulation_steps > 1
                            or not core.ds.managed_accumulation)
        """`copy_grads_in_partition` runs `async_accumulate_grad_in_cpu_via_gpu` whenever
        gradient accumulation is on: stage 2 at every micro-batch, stage 1 at the boundary
        only (its one reduction), where, not being the first micro-batch, it brings the host
        accumulator back and adds it, as every release does; with unmanaged accumulation at
        every backward, none being the boundary (0.19.5: `micro_step_id > 0 or not
        is_gradient_accumulation_boundary()`)."""

    def reduces_at(self, micro: int, boundary: bool) -> bool:
        """Stage 1 keeps accumulating full gradients on the GPU and reduces at the boundary."""
        return self.reduces_every_step or boundary

    def finalize(self) -> Gen:
        """Unmanaged accumulation at stage 2 (`managed_gradient_accumulation: false`, DeepSpeed
        0.19.5: `_finalize_cpu_offload_gradient_accumulation`): step() opens with the
        boundary's work, parameter by parameter in the optimizer's groups, on the default
        stream: the accumulated host gradient back to the GPU
        (`_restore_cpu_offload_grad_to_gpu`: an H2D into the temporary buffer, then its
        clone), then what the boundary backward does (`_boundary_work`), the host waiting at
        each for the overflow tracker's result. Returns the last op's event."""
        return (yield from _finalize_each(self.core, self._finalize_param,
                                          ZERO2_FINALIZE_DISPATCHES_PER_PARAM, host_waits=True))

    def _finalize_param(self, param: Param, name: str) -> Gen:
        core = self.core
        acc = core.accum_bytes * param.partition_numel
        yield from core.dma("h2d", acc, pinned=core.pinned, op=f"accum → GPU {name}",
                            kind=OpKind.GRAD_FROM_HOST)
        yield from core.gpu_kernel(core.hbm_seconds(acc), core.reduction_stream)
        yield from self._boundary_work(param, name)

    def frees_grads_after_backward(self, boundary: bool) -> bool:
        return self.reduces_every_step or boundary

    def partition(self, bucket: list[BucketEntry], micro: int, boundary: bool
                  ) -> tuple[Body, bool]:
        def move(param: Param) -> Gen:
            return self._move(param, micro, boundary)

        return _per_param(bucket, move), not self.core.pinned or boundary

    def _sends_sum_back(self, boundary: bool) -> bool:
        """Whether a micro-batch after the first sends the accumulated gradient back to the
        host, as `async_accumulate_grad_in_cpu_via_gpu` does in each release: every one from
        0.19.0, none from 0.15.2, all but the boundary's before."""
        behaviours = self.core.behaviours
        if behaviours.zero2_accumulator_sent_back_always:
            return True
        return not behaviours.zero2_accumulator_stays_on_gpu and not boundary

    def _move(self, param: Param, micro: int, boundary: bool) -> Gen:
        """At the boundary, `set_norm_for_param_grad_in_gpu` (the partition's fp64 norm),
        `update_overflow_tracker_for_param_grad` (`_has_inf_or_nan` over the parameter's
        gradient, whose result `if` turns into a blocking copy: the host waits for the
        reduction stream at every parameter, `partition`), then
        `async_inplace_copy_grad_to_fp32_buffer_from_gpu` (a GPU cast to fp32 first, none to
        bf16 master gradients). With bf16 master gradients the host accumulator is a slice of
        them (`buffer_to_accumulate_to_in_cpu`), as large as the partition's part, priced
        alike."""
        core = self.core
        name = core.plan.modules[param.module].name
        acc = core.accum_bytes * param.partition_numel
        if self.accumulates:
            if micro == 0:
                yield from core.dma("d2h", acc, pinned=core.pinned, op=f"grad → accum {name}",
                                    kind=OpKind.GRAD_TO_HOST)
            else:
                yield from core.dma("h2d", acc, pinned=core.pinned, op=f"accum → GPU {name}",
                                    kind=OpKind.GRAD_FROM_HOST)
                yield from core.gpu_kernel(core.hbm_seconds(acc, ADD_PASSES),
                                           core.reduction_stream)
                if self._sends_sum_back(boundary):
                    yield from core.dma("d2h", acc, pinned=core.pinned,
                                        op=f"accum → host {name}", kind=OpKind.GRAD_TO_HOST)
        if boundary:
            yield from self._boundary_work(param, name)

    def _boundary_work(self, param: Param, name: str) -> Gen:
        """The partition's fp64 norm, the overflow check over the parameter's gradient, and
        its cast and D2H into the fp32 buffer (see `_move`)."""
        core = self.core
        elements = param.partition_numel
        yield from fp64_grad_norm(core, elements, name, source_bytes=core.dtype_bytes,
                                  chunked=False)
        checked = param.numel if elements else 0
        yield from core.gpu_kernel(
            core.hbm_seconds((core.dtype_bytes + costs.INF_OR_NAN_GPU_BYTES_PER_ELEMENT)
                             * checked, passes=1.0), core.reduction_stream)
        if core.ds.low_precision_master:
            yield from master_grad_d2h(core, elements, name, pinned=self.flush_pinned)
        else:
            yield from gpu_cast_then_d2h(core, elements, name, pinned=self.flush_pinned)


class GpuPartitions:
    """No offload: this rank's reduced partition is copied into its HBM gradient buffer on
    the first micro-batch and added to it on later ones (stage 3 `partition_grads`, stage
    1/2 `copy_grads_in_partition` / averaged gradients)."""

    def __init__(self, core: RankCore):
        self.core = core

    def reduces_at(self, micro: int, boundary: bool) -> bool:
        return self.core.ds.stage != 1 or boundary

    def frees_grads_after_backward(self, boundary: bool) -> bool:
        return self.core.ds.stage != 1 or boundary

    def partition(self, bucket: list[BucketEntry], micro: int, boundary: bool
                  ) -> tuple[Body, bool]:
        core = self.core
        nbytes = core.accum_bytes * sum(e.param.partition_numel for e in bucket)
        passes = 2.0 if micro == 0 or core.ds.stage == 1 else ADD_PASSES
        return core.gpu_time(core.hbm_seconds(nbytes, passes), core.reduction_stream), False

