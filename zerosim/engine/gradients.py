"""The gradient path of a rank: gradients held on the GPU, IPG buckets and their reduction.

`IpgBuckets` follows `reduce_independent_p_g_buckets_and_remove_grads` /
`__reduce_and_partition_ipg_grads` (stage3.py) and `reduce_ipg_grads` (stage_1_and_2.py): each
gradient is copied into the bucket as its module's backward ends; a full bucket is reduced
(reduce-scatter or all-reduce) on the reduction stream, then handed to a `GradientSink` that
moves or accumulates this rank's partition wherever the mode keeps it (see `sinks.py`).
`BoundaryAllReduce` is stage 0: no buckets during the backward, one blocking all-reduce of all
gradients at the accumulation boundary (engine.py `allreduce_gradients`).
"""

from __future__ import annotations

import math
from collections import Counter, deque
from typing import NamedTuple, Protocol

import simpy

from zerosim.engine.plan import Param, Plan
from zerosim.engine.quantized_gradients import QuantizedGradientReduction
from zerosim.engine.rank import Gen, RankCore
from zerosim.engine.software import MAX_PARAM_REDUCE_EVENTS, STAGE0_ALLREDUCE_BUCKET_NUMEL
from zerosim.engine.streams import Body, InOrderStream, NcclQueue
from zerosim.hardware import costs
from zerosim.units import BYTES_PER_DTYPE
from zerosim.vocabulary import Category, Collective, OpKind


class BucketEntry(NamedTuple):
    param: Param
    in_bucket: bool
    """Copied into the contiguous IPG buffer (else reduced in place and freed after)."""


class GradientStore:
    """The 16-bit gradients a backward produces, held on the GPU until they are reduced (or,
    in stages 0 and 1, accumulated across micro-batches until the boundary)."""

    def __init__(self, core: RankCore):
        self.core = core
        self.grads: dict[tuple[int, int], int] = {}

    def produce(self, index: int) -> None:
        core = self.core
        for param in core.plan.params[index]:
            key = (index, param.index)
            if key not in self.grads:
                self.grads[key] = core.gpu.allocate(Category.GRADS,
                                                    core.dtype_bytes * param.numel,
                                                    core.plan.modules[index].name)

    def free(self, param: Param) -> None:
        self.core.gpu.free(Category.GRADS, self.grads.pop((param.module, param.index)))

    def free_all(self) -> None:
        for key in list(self.grads):
            self.core.gpu.free(Category.GRADS, self.grads.pop(key))


class GradientSink(Protocol):
    """Where a reduced bucket's partition goes: `partition_grads` of the mode."""

    def reduces_at(self, micro: int, boundary: bool) -> bool:
        """Whether this micro-batch's gradients are bucketed and reduced at all."""
        ...

    def partition(self, bucket: list[BucketEntry], micro: int, boundary: bool
                  ) -> tuple[Body, bool]:
        """The in-order op that moves the bucket's partitions, and whether the host thread
        waits for it."""
        ...

    def frees_grads_after_backward(self, boundary: bool) -> bool: ...


class AfterReduce(Protocol):
    """Work a mode adds on the reduction's stream after each bucket's reductions, before its
    partitions move (ZenFlow's `_process_selected_fp32_groups_grad`: `zenflow.SelectiveUpdate`)."""

    def after_reduce(self, bucket: list[BucketEntry], stream: InOrderStream,
                     boundary: bool) -> Gen: ...


class AfterPartition(Protocol):
    """Work a mode adds on the host once a bucket's partition copies are issued (and, where
    the host waits for them, done): SuperOffload hands each sub-group the bucket completes to
    its optimizer process (`superoffload.SubGroupHandOff`). `moved` is the copies' event."""

    def after_partition(self, bucket: list[BucketEntry], moved: simpy.Event,
                        boundary: bool) -> Gen: ...


class SubGroupBuckets:
    """SuperOffload's `reduce_independent_p_g_buckets_and_remove_grads` up to DeepSpeed 0.18.8:
    a bucket holds the gradients of one optimizer sub-group and is reduced as soon as it holds
    all of them, whatever `reduce_bucket_size` says (the contiguous buffer still takes only
    what fits in it). A gradient of another sub-group that comes while a bucket is open waits
    for it to be reduced, then goes into the next bucket."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.sizes = Counter(plan.group_of(p) for p in plan.all_params)
        """Parameters per sub-group (`sub_group_to_param_num`)."""
        self.group: int | None = None
        self.waiting: deque[tuple[Param, simpy.Event]] = deque()

    def add(self, buckets: IpgBuckets, param: Param, produced: simpy.Event, micro: int,
            boundary: bool) -> Gen:
        group = self.plan.group_of(param)
        if buckets.bucket and group != self.group:
            self.waiting.append((param, produced))
            return
        self.group = group
        buckets.append(param, produced)
        if len(buckets.bucket) < self.sizes[group]:
            return
        yield from buckets.reduce(micro, boundary)
        while self.waiting:
            param, produced = self.waiting.popleft()
            self.group = self.plan.group_of(param)
            buckets.append(param, produced)


class GradientPath(Protocol):
    store: GradientStore

    def add(self, param: Param, produced: simpy.Event, micro: int, boundary: bool) -> Gen: ...
    def epilogue(self, micro: int, boundary: bool) -> Gen: ...


class IpgBuckets:
    def __init__(self, core: RankCore, sink: GradientSink, collective: Collective,
                 nccl: NcclQueue, *, per_tensor: bool = False, compute_waits: bool = False,
                 waits_for_each_bucket: bool = False, copies_on_compute: bool = False,
                 after_reduce: AfterReduce | None = None,
                 after_partition: AfterPartition | None = None,
                 transposed_copies: bool = False, by_subgroup: SubGroupBuckets | None = None,
                 quantized: QuantizedGradientReduction | None = None):
        self.core = core
        self.sink = sink
        self.collective = collective
        self.nccl = nccl
        """The process group's NCCL stream (`params.PartitionedParams.nccl`)."""
        self.per_tensor = per_tensor
        """DeepSpeed before `coalesced_collectives`: one reduction per gradient tensor."""
        self.compute_waits = compute_waits
        """Each reduction first makes the compute stream wait for what the reduction stream
        holds (ZeRO-1/2's `average_tensor` from 0.14.3: `current_stream().wait_stream`)."""
        self.waits_for_each_bucket = waits_for_each_bucket
        """Once a full bucket's reduction and partition copies are issued, the compute stream
        waits for them (ZeRO-1/2, 0.17.5 to 0.18.4)."""
        self.store = GradientStore(core)
        self.bucket: list[BucketEntry] = []
        self.bucket_numel = 0
        self.outstanding: deque[simpy.Event] = deque()
        self.stream = core.reduction_stream
        self.copies = core.compute if copies_on_compute else self.stream
        """Where each gradient is copied into the bucket: ZeRO-3 on the reduction stream
        (`__add_grad_to_ipg_bucket`), ZeRO-1/2 on the default stream
        (`reduce_independent_p_g_buckets_and_remove_grads`), the reduction then waiting for
        it (`average_tensor`: `stream.wait_stream(current_stream)`)."""
        self.after_reduce = after_reduce
        self.after_partition = after_partition
        self.by_subgroup = by_subgroup
        """Buckets cut at optimizer sub-group edges (SuperOffload before DeepSpeed 0.18.9)."""
        self.quantized = quantized
        """qgZ across nodes: each bucket reduced tensor by tensor by int4 all-to-alls."""
        self.transposed_copies = transposed_copies
        """Each gradient is copied into the bucket transposed (ZenFlow's
        `grad_reduc.permute(...).contiguous()`, then the copy): a strided pass more (taken for
        every gradient)."""
        self.names = {c: (c.value.replace("_", "-"), OpKind(c.value))
                      for c in (collective, Collective.REDUCE_SCATTER)}
        """How each reduction's op is named, and its kind (`Enum.value` is slow on the hot
        path)."""

    def add(self, param: Param, produced: simpy.Event, micro: int, boundary: bool) -> Gen:
        """`__add_grad_to_ipg_bucket`: reduce the bucket first if the gradient would overflow
        it, then copy the gradient in (or, without contiguous gradients, wait for it). With
        `by_subgroup`, a bucket holds one optimizer sub-group instead."""
        if not self.sink.reduces_at(micro, boundary):
            return
        if self.by_subgroup is not None:
            yield from self.by_subgroup.add(self, param, produced, micro, boundary)
            return
        core, size = self.core, self.core.ds.reduce_bucket_size
        if self.bucket and self.bucket_numel + param.numel > size:
            done = yield from self.reduce(micro, boundary)
            if self.waits_for_each_bucket:
                core.compute.launch("wait for the reduction stream", core.no_kernel,
                                    kind=OpKind.STREAM_WAIT, after=(done,))
        self.append(param, produced)

    def append(self, param: Param, produced: simpy.Event) -> None:
        """Copy the gradient into the contiguous buffer where it fits (else it is reduced in
        place, once produced), and count it in the bucket."""
        core, size = self.core, self.core.ds.reduce_bucket_size
        in_bucket = core.ds.contiguous_gradients and self.bucket_numel + param.numel <= size
        if in_bucket:
            nbytes = core.dtype_bytes * param.numel
            name = f"copy grad {core.plan.modules[param.module].name}"
            if self.transposed_copies:
                seconds = costs.hbm_s(4 * nbytes, core.profile, strided_nbytes=2 * nbytes)
                copy = self.copies.launch(name, core.gpu_time(seconds, self.copies),
                                          kind=OpKind.GRAD_TO_BUCKET, after=(produced,),
                                          nbytes=nbytes)
            else:
                copy = core.hbm_op(self.copies, name, OpKind.GRAD_TO_BUCKET, nbytes,
                                   after=(produced,))
            core.when_done(copy, lambda: self.store.free(param))
        else:
            self.stream.launch("wait grad", core.no_kernel, kind=OpKind.GRAD_WAIT,
                               after=(produced,))
        self.bucket.append(BucketEntry(param, in_bucket))
        self.bucket_numel += param.numel

    def output_numel(self, bucket: list[BucketEntry], collective: Collective) -> int:
        """What the reduction of a bucket allocates until its partitions are consumed.

        A coalesced reduce-scatter (DeepSpeed's `reduce_scatter_coalesced`) concatenates every
        gradient's rank chunks, each padded to ceil(numel / ranks), into one flat buffer and
        reduce-scatters it in place, the output being a view of it: the whole padded bucket
        stays allocated. A single tensor that divides evenly is used as it is (nothing new).
        ZeRO-3's all-reduce (`__avg_scatter_contiguous_grads`) reduces the contiguous buffer
        in place and hands out views of it (only a last rank's chunk of a tensor that does
        not divide evenly is copied, padded: left out). Per-tensor reductions and ZeRO-1/2's
        all-reduces allocate the bucket's partitions only.
        """
        ranks = len(self.core.ranks)
        if collective == Collective.ALL_REDUCE and self.core.ds.stage == 3:
            return 0
        if self.per_tensor or collective != Collective.REDUCE_SCATTER:
            return sum(e.param.partition_numel for e in bucket)
        if len(bucket) == 1 and bucket[0].param.numel % ranks == 0:
            return 0
        return sum(math.ceil(e.param.numel / ranks) * ranks for e in bucket)

    def collective_for(self, bucket: list[BucketEntry]) -> Collective:
        """The collective that reduces `bucket`. ZeRO-3 all-reduces a bucket only when
        `reduce_scatter` is off and the bucket sits whole in the contiguous buffer
        (`__reduce_and_partition_ipg_grads`: contiguous_gradients and no more elements than
        reduce_bucket_size); any other bucket, a gradient larger than the buffer, or every
        bucket without contiguous gradients, goes through `reduce_scatter_coalesced`."""
        if (self.collective == Collective.ALL_REDUCE and self.core.ds.stage == 3
                and not all(entry.in_bucket for entry in bucket)):
            return Collective.REDUCE_SCATTER
        return self.collective

    def averaged_numel(self, bucket: list[BucketEntry], numel: int) -> int:
        """What ZeRO-1/2's `average_tensor` divides in place (and, without `reduce_scatter`,
        all-reduces) for a bucket of `numel` gradient elements: up to DeepSpeed 0.14.0 the
        whole IPG buffer, `reduce_bucket_size` elements however full, from 0.14.1 its filled
        part (`zero12_averages_filled_part`); a gradient larger than the buffer is reduced
        as itself."""
        ds = self.core.ds
        whole_buffer = (ds.stage in (1, 2) and ds.contiguous_gradients
                        and not self.core.behaviours.zero12_averages_filled_part
                        and all(entry.in_bucket for entry in bucket))
        return max(numel, int(ds.reduce_bucket_size)) if whole_buffer else numel

    def cast_seconds(self, bucket: list[BucketEntry], collective: Collective, numel: int
                     ) -> tuple[float, float]:
        """GPU time of the casts around a reduction in a `communication_data_type` other than
        the gradients' (before, after it), each a read of one dtype and a write of the other:
        the bucket's `numel` elements into the communication dtype (stage3.py
        `__avg_scatter_grads` / `__avg_scatter_contiguous_grads`, stage_1_and_2.py
        `average_tensor`), and back: ZeRO-3's reduce-scatter casts only this rank's
        partitions, an all-reduce and ZeRO-1/2 the whole buffer. ZeRO-3 casts back to the
        model dtype, from DeepSpeed 0.19.2 to the accumulation dtype
        (`zero3_reduced_grads_in_accumulation_dtype`), not at all when that is the
        communication dtype."""
        core, ds = self.core, self.core.ds
        if ds.communication_dtype == ds.dtype:
            return 0.0, 0.0
        target = ds.dtype
        if ds.stage == 3 and core.behaviours.zero3_reduced_grads_in_accumulation_dtype:
            target = ds.grad_accum_dtype
        back = (sum(e.param.partition_numel for e in bucket)
                if ds.stage == 3 and collective == Collective.REDUCE_SCATTER else numel)
        cast_in = core.hbm_seconds((core.comm_bytes + core.dtype_bytes) * numel, passes=1.0)
        if target == ds.communication_dtype:
            return cast_in, 0.0
        target_bytes = BYTES_PER_DTYPE[target]
        return cast_in, core.hbm_seconds((core.comm_bytes + target_bytes) * back, passes=1.0)

    def scaling_seconds(self, collective: Collective, out_numel: int, numel: int
                        ) -> tuple[float, float]:
        """GPU time of what a bucket's reduction does on its stream besides the collective,
        (before, after) it; each kernel a read and a write of its bytes through HBM.

        ZeRO-3 (`reduce_scatter_coalesced`): `torch.cat` of the rank chunks into the flat
        buffer (`out_numel` elements; none when one tensor is used in place), then the
        pre-divide `div_(world_size)` over that buffer, before the collective; its all-reduce
        (`__avg_scatter_contiguous_grads`) pre-divides the bucket in place. ZeRO-1/2
        (`average_tensor`): the pre-divide `div_` of the bucket before its reduces, in the
        IPG buffer's training dtype, or, for an all-reduce (`gradient_reduction_w_predivide`
        with `postscale_gradients`), the `mul_` that scales it after, in the communication
        dtype. ZeRO-3 scales in the communication dtype. With one rank the collective has
        nothing to move. Per-tensor reductions (before `coalesced_collectives`): nothing is
        timed here."""
        if self.per_tensor:
            return 0.0, 0.0
        core = self.core
        if core.ds.stage == 3:
            flat = out_numel or numel
            return core.hbm_seconds(core.comm_bytes * (out_numel + flat)), 0.0
        if collective == Collective.REDUCE_SCATTER:
            return core.hbm_seconds(core.dtype_bytes * numel), 0.0
        return 0.0, core.hbm_seconds(core.comm_bytes * numel)

    def reduce(self, micro: int, boundary: bool) -> Gen:
        """Reduce the bucket, then hand its partitions to the sink; at most
        `MAX_PARAM_REDUCE_EVENTS` reductions stay outstanding. Returns the event of the
        partition copies."""
        core = self.core
        while self.outstanding and self.outstanding[0].callbacks is None:
            self.outstanding.popleft()
        if len(self.outstanding) > MAX_PARAM_REDUCE_EVENTS:
            yield self.outstanding.popleft()
        bucket, numel = self.bucket, self.bucket_numel
        self.bucket, self.bucket_numel = [], 0
        if self.quantized is not None:
            held = yield from self._reduce_quantized(bucket, numel)
        else:
            held = yield from self._reduce_whole(bucket, numel)
        if self.after_reduce is not None:
            yield from self.after_reduce.after_reduce(bucket, self.stream, boundary)
        body, host_waits = self.sink.partition(bucket, micro, boundary)
        moved = core.accum_bytes * sum(e.param.partition_numel for e in bucket)
        done = self.stream.launch(f"partition grads {len(bucket)} params", body,
                                  kind=OpKind.PARTITION_GRADS, nbytes=moved)
        core.when_done(done, lambda: self._free_partitions(held))
        self.outstanding.append(done)
        if host_waits:
            yield done
        if self.after_partition is not None:
            yield from self.after_partition.after_partition(bucket, done, boundary)
        return done

    def _reduce_whole(self, bucket: list[BucketEntry], numel: int) -> Gen:
        """Issue the bucket's reduction as one op on the reduction stream: the collective
        (or, before `coalesced_collectives`, one a tensor) with its scalings and casts.
        Returns what it holds until the partitions are moved (filled as it runs)."""
        core = self.core
        collective = self.collective_for(bucket)
        averaged = self.averaged_numel(bucket, numel)
        reduced = averaged if collective == Collective.ALL_REDUCE else numel
        sizes = [e.param.numel for e in bucket] if self.per_tensor else [reduced]
        keys = [core.next_key(collective) for _ in sizes]
        core.launches += core.distributed * len(sizes)
        yield from core.pay_launches()
        out_numel = self.output_numel(bucket, collective)
        out_bytes = core.comm_bytes * out_numel
        before_s, after_s = self.scaling_seconds(collective, out_numel, averaged)
        cast_in_s, cast_out_s = self.cast_seconds(bucket, collective, averaged)
        before_s, after_s = before_s + cast_in_s, after_s + cast_out_s
        cast_bytes = core.comm_bytes * averaged if cast_in_s else 0
        held: list[int] = []
        turn = self.nccl.issue()

        def reduce_body() -> Gen:
            held.append(core.gpu.allocate(Category.GRAD_PARTITIONS, out_bytes,
                                          "reduce-scatter buffer"))
            cast = core.gpu.allocate(Category.GRAD_PARTITIONS, cast_bytes,
                                     "gradients in the communication dtype")
            if before_s:
                yield from core.gpu_kernel(before_s, self.stream)
            yield from turn.wait()
            if core.distributed:
                for key, size in zip(keys, sizes, strict=True):
                    yield from core.machine.collective(core.rank, key, collective,
                                                       core.comm_bytes * size, core.ranks)
            elif not (before_s or after_s):
                yield from core.gpu_kernel(core.hbm_seconds(core.comm_bytes * reduced),
                                           self.stream)
            turn.done()
            if after_s:
                yield from core.gpu_kernel(after_s, self.stream)
            core.gpu.free(Category.GRAD_PARTITIONS, cast)
            self._free_unbucketed(bucket)

        label, kind = self.names[collective]
        copied = self.copies.idle_event() if self.copies is not self.stream else None
        if self.compute_waits:
            core.compute.launch("wait for the reduction stream", core.no_kernel,
                                kind=OpKind.STREAM_WAIT, after=(self.stream.idle_event(),))
        self.stream.launch(f"{label} {reduced / 1e6:.0f}M", reduce_body, kind=kind,
                           after=(copied,), nbytes=core.comm_bytes * reduced)
        return held

    def _reduce_quantized(self, bucket: list[BucketEntry], numel: int) -> Gen:
        """qgZ (`QuantizedGradientReduction`): the bucket's tensors in parameter order, one op
        each; the gradients outside the contiguous buffer are freed after the last."""
        assert self.quantized is not None
        cast_s = self.cast_seconds(bucket, Collective.REDUCE_SCATTER, numel)
        cast_bytes = self.core.comm_bytes * numel if cast_s[0] else 0
        params = sorted((e.param for e in bucket), key=lambda p: (p.module, p.index))
        held, last = yield from self.quantized.reduce(params, self.stream, cast_s, cast_bytes)
        self.core.when_done(last, lambda: self._free_unbucketed(bucket))
        return held

    def _free_unbucketed(self, bucket: list[BucketEntry]) -> None:
        """Gradients reduced where they lie (outside the contiguous buffer) go once reduced."""
        for entry in bucket:
            if not entry.in_bucket:
                self.store.free(entry.param)

    def _free_partitions(self, held: list[int]) -> None:
        for nbytes in held:
            self.core.gpu.free(Category.GRAD_PARTITIONS, nbytes)

    def epilogue(self, micro: int, boundary: bool) -> Gen:
        """`independent_gradient_partition_epilogue`: the last bucket, then synchronize."""
        if self.bucket:
            yield from self.reduce(micro, boundary)
        yield from self.core.synchronize()
        if self.sink.frees_grads_after_backward(boundary):
            self.store.free_all()


class BoundaryAllReduce:
    """Stage 0: gradients accumulate in place on the GPU; at the boundary the host all-reduces
    them in buffers of `STAGE0_ALLREDUCE_BUCKET_NUMEL` on the default stream
    (`buffered_allreduce_fallback`), after the backward."""

    def __init__(self, core: RankCore):
        self.core = core
        self.store = GradientStore(core)

    def add(self, param: Param, produced: simpy.Event, micro: int, boundary: bool) -> Gen:
        return
        yield

    def epilogue(self, micro: int, boundary: bool) -> Gen:
        core = self.core
        if boundary and core.distributed:
            total = sum(p.numel for p in core.plan.all_params)
            start = 0
            while start < total:
                numel = min(STAGE0_ALLREDUCE_BUCKET_NUMEL, total - start)
                nbytes = core.comm_bytes * numel
                key = core.next_key(Collective.ALL_REDUCE)

                def body(key=key, nbytes=nbytes) -> Gen:
                    yield from core.machine.collective(core.rank, key, Collective.ALL_REDUCE,
                                                       nbytes, core.ranks)

                core.compute.launch(f"all-reduce {numel / 1e6:.0f}M", body,
                                    kind=OpKind.ALL_REDUCE, nbytes=nbytes)
                start += numel
        yield from core.synchronize()
        if boundary:
            self.store.free_all()
