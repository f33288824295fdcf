"""Parameter coordinators: how a rank gets a module's 16-bit parameters before it runs.

`ReplicatedParams` (stages 0-2): every GPU holds them all; nothing to fetch.
`PartitionedParams` (stage 3, partitioned_param_coordinator.py): all-gather each module's
partitions before use, prefetch ahead in trace order within `stage3_prefetch_bucket_size` and
`stage3_max_live_parameters`, release after use unless the module comes back within
`stage3_max_reuse_distance`. Where the partition lives before the all-gather is a `ParamSource`:
in HBM, in host memory (`offload_param: cpu`), or on NVMe.

The host thread does not wait for an all-gather, with one bound: `fetch_sub_module` records an
event on the all-gather stream for every parameter it waits on and, with more than
`MAX_ONGOING_FETCH_EVENTS` of them unfinished, blocks until the oldest finishes (DeepSpeed
0.13.3's `__max_ongoing_fetch_events`, from 0.6.0), before it issues the prefetches. Before
0.6.0 the host waited for the whole device at a fetch instead (`PartitionedParams.drains`).

A module's own fetch and each prefetch are one all-gather call over all their tensors
(`__all_gather_params`); a call of several tensors is split out of its flat buffer at the
first wait on it (`_Bundle`).

Two streams: PyTorch runs every all-gather on the process group's NCCL stream
(`Stream.ALLGATHER`, in issue order, each after what DeepSpeed's all-gather stream holds when
it is issued); DeepSpeed's `__allgather_stream` (`Stream.FETCH_COPIES`) takes the waits and the
copies out of a flat buffer, so a split waits for its own all-gather, not for the prefetches
issued since.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from itertools import chain
from math import ceil, isqrt
from typing import Protocol

import simpy

from zerosim.engine.conditions import AllDone
from zerosim.engine.rank import Gen, RankCore
from zerosim.engine.streams import NcclQueue
from zerosim.hardware import costs
from zerosim.vocabulary import Category, Collective, OpKind, Stream


class ParameterCoordinator(Protocol):
    module_hooks: bool
    """Whether DeepSpeed hooks every module's forward and backward (ZeRO-3's coordinator)."""

    def reset_step(self, micro: int) -> None: ...
    def fetch_external(self) -> Gen: ...
    def fetch(self, index: int) -> simpy.Event | None: ...
    def wait_ongoing(self, index: int, ready: simpy.Event | None) -> Gen: ...
    def prefetch_after(self, index: int, backward: bool) -> Iterable[simpy.Event]: ...
    def release(self, index: int, *, backward: bool) -> Iterable[simpy.Event]: ...
    def release_after_backward(self) -> Iterable[simpy.Event]: ...
    def release_all(self) -> Iterable[simpy.Event]: ...
    def keep_after_forward(self, index: int) -> bool: ...


class ReplicatedParams:
    """Stages 0-2: the 16-bit parameters are resident on every GPU."""

    module_hooks = False

    def reset_step(self, micro: int) -> None:
        return

    def fetch_external(self) -> Gen:
        return
        yield

    def fetch(self, index: int) -> simpy.Event | None:
        return None

    def wait_ongoing(self, index: int, ready: simpy.Event | None) -> Gen:
        return ready
        yield

    def prefetch_after(self, index: int, backward: bool) -> Iterable[simpy.Event]:
        return ()

    def release(self, index: int, *, backward: bool) -> Iterable[simpy.Event]:
        return ()

    def release_after_backward(self) -> Iterable[simpy.Event]:
        return ()

    def release_all(self) -> Iterable[simpy.Event]:
        return ()

    def keep_after_forward(self, index: int) -> bool:
        return True


class ParamSource(Protocol):
    def bring(self, core: RankCore, index: int, partition_numel: int) -> Gen:
        """Make the module's partition readable by the GPU (before its all-gather)."""
        ...

    @property
    def always_gathers(self) -> bool:
        """Whether even one rank must run the gather op (its partition is not in HBM)."""
        ...


class PartitionsInHbm:
    always_gathers = False

    def bring(self, core: RankCore, index: int, partition_numel: int) -> Gen:
        return
        yield


class PartitionsInHost:
    """`offload_param: cpu`: every fetch starts with an H2D of the 16-bit partition."""

    always_gathers = True

    def bring(self, core: RankCore, index: int, partition_numel: int) -> Gen:
        yield from core.dma("h2d", core.dtype_bytes * partition_numel,
                            pinned=core.ds.offload_param.pin_memory,
                            op=f"fetch {core.plan.modules[index].name}",
                            kind=OpKind.PARAM_FETCH)


@dataclass
class _Bundle:
    """An all-gather call whose first wait has work to do on DeepSpeed's all-gather stream
    (`AllGatherCoalescedHandle.wait`): a call of several tensors copies each out of the flat
    buffer; a quantized one (qwZ) dequantizes the int8 blocks first."""

    tensors: int
    nbytes: float
    """The gathered 16-bit bytes."""
    waiting: int
    """Modules of the call whose hook has not yet waited on it."""
    copies: simpy.Event | None = None
    """The copies out of the flat buffer, once the first module's wait has issued them."""
    extra: int = 0
    quantized: bool = False
    quantized_held: int = 0
    """qwZ's int8 buffer and scales, held from the call to the last module's wait."""


QUANTIZER_TARGET_GROUP = 8000
"""partition_parameters.py `CUDAQuantizer.target_group_size`: elements per quantization group
(one fp32 scale each) aimed below."""

QUANTIZER_SCALE_BYTES = 4
"""Each group's scale is fp32 (`quant_scale_buffer`)."""


@lru_cache(maxsize=4096)
def quantization_groups(numel: int) -> int:
    """How many groups `CUDAQuantizer.quantize` cuts `numel` elements into: from
    ceil(numel / 8000) up to the first count g with numel divisible by 8g, then doubled while
    numel stays divisible by 16g and groups stay above 8000 elements. Where no such count
    exists (numel not a multiple of 8) DeepSpeed's assertion fails; zerosim keeps the
    ceil(numel / 8000) groups then (only the scales' few bytes depend on it)."""
    groups = ceil(numel / QUANTIZER_TARGET_GROUP)
    if numel <= 0 or numel % 8:
        return max(groups, 1)
    blocks = numel // 8
    divisors = [d for k in range(1, isqrt(blocks) + 1) if blocks % k == 0
                for d in (k, blocks // k) if d >= groups]
    if not divisors:
        return groups
    groups = min(divisors)
    while numel % (16 * groups) == 0 and numel / groups > QUANTIZER_TARGET_GROUP:
        groups *= 2
    return groups


MAX_ONGOING_FETCH_EVENTS = 2
"""partitioned_param_coordinator.py (0.13.3) `__max_ongoing_fetch_events`."""


class PartitionedParams:
    """ZeRO-3's partitioned parameter coordinator for one rank.

    With ZeRO++ (DeepSpeed 0.10.0+): hpZ keeps, besides each parameter's partition over every
    rank, a secondary partition over its group of `zero_hpz_partition_size` consecutive ranks
    (`_partition_param_sec`), made when a gathered parameter is first released after a step
    (0.13.2-0.14.2: at every release), on the GPU or, with `offload_param: cpu`, in host
    memory; a fetch of parameters that have one all-gathers it over the group alone, and the
    step drops them all (`invalidate_secondary_tensor`). qwZ quantizes what a call gathers
    to int8 blocks with fp32 scales on DeepSpeed's all-gather stream, all-gathers both, and
    dequantizes at the first wait.
    """

    module_hooks = True

    def __init__(self, core: RankCore, source: ParamSource, nccl: NcclQueue, *,
                 per_tensor: bool = False, bounded_fetches: bool = True, drains: bool = False):
        self.core = core
        self.source = source
        self.nccl = nccl
        """The process group's NCCL stream: each all-gather runs after what was issued there
        before it (gradient reductions too, where the stack puts them on the same group)."""
        self.per_tensor = per_tensor
        """DeepSpeed before `coalesced_collectives`: one all-gather per parameter tensor."""
        self.bounded_fetches = bounded_fetches
        """DeepSpeed from 0.6.0 (`bounded_fetch_events`): the host waits on old fetches."""
        self.drains = drains
        """DeepSpeed before 0.6.0 (`fetch_waits_on_device` off): a fetch waits on the host for
        the whole device and every parameter's norm (`_drain`)."""
        self.issued_since_drain = False
        """Whether an all-gather was issued since the host last drained the device (before
        0.6.0 its handle stays in `in_flight_handles` until then, and no prefetch starts)."""
        plan = core.plan
        n = len(plan.modules)
        self.gathered: list[simpy.Event | None] = [None] * n
        self.gathered_bytes = [0] * n
        self.is_gathered = [False] * n
        self.live_numel = 0
        self.trace = [i for i in range(n) if plan.gathered_numel[i] > 0]
        self.forward_position = {m: pos for pos, m in enumerate(self.trace)}
        self.allgather = core.stream(Stream.ALLGATHER)
        self.copies = core.stream(Stream.FETCH_COPIES)
        self.ongoing: deque[simpy.Event] = deque()
        self.waited = [True] * n
        """Whether the host has waited on the module's fetch since it was issued (DeepSpeed's
        inflight registry, which the wait empties)."""
        self.to_gather = plan.gathered_tensors
        self.partition_numel = plan.gathered_partition_numel
        self.bundles: dict[int, _Bundle] = {}
        """Modules whose tensors came in a coalesced all-gather of several, not yet waited on."""
        self.on_nvme = {i: n for i in self.trace if (n := plan.nvme_tensors(i))}
        """Modules whose partition is read from NVMe into swap buffers before its gather, and
        how many buffers each takes: one per tensor (a ZeRO-3 leaf holds several)."""
        self.swap_buffers_held = 0
        self.not_gathered = list(range(len(self.trace)))
        """Forward-trace positions of the modules not gathered, ascending (what a prefetch may
        take, without walking past the gathered ones)."""
        behaviours = core.behaviours
        self.kept_after_backward = (plan.external if behaviours.backward_leftovers_released
                                    else plan.unreleased_modules)
        """What is still gathered when a backward ends: what no module hook releases, less
        the embeddings from DeepSpeed 0.19.3 (`backward_leftovers_released`)."""
        self.kept_numel = sum(plan.gathered_numel[i] for i in self.kept_after_backward)
        self.live_count_reset = behaviours.live_count_reset
        self.drift = 0
        """How far DeepSpeed's live count is below what is gathered (`reset_step`)."""
        zero_plus_plus = core.ds.zero_plus_plus
        world = len(core.ranks)
        self.hpz = zero_plus_plus.hpz_group(world)
        """Ranks per secondary partition (hpZ; 1: off)."""
        first = core.rank // self.hpz * self.hpz
        self.hpz_ranks = tuple(range(first, first + self.hpz))
        self.hpz_groups = world // self.hpz
        self.secondary_numel = [numel * self.hpz_groups for numel in self.partition_numel]
        self.has_secondary = [False] * len(plan.modules)
        self.secondary_held = [0] * len(plan.modules)
        self.secondary_on_host = core.ds.offload_param.device == "cpu"
        self.recopies_secondary = behaviours.hpz_secondary_recopied
        self.quantized = zero_plus_plus.quantized_weights and not self.per_tensor
        mics, groups = core.ds.mics, core.ctx.groups
        self.flat_split = not mics.acts(core.ds.stage)
        """A call of several tensors lands in one flat buffer and is split at its first wait
        (ZeRO-3's `AllGatherCoalescedHandle`); MiCS's all-gather writes each parameter's
        buffer itself."""
        self.hierarchy = ((groups.inter_node[core.rank], groups.intra_node[core.rank])
                          if groups.inter_node else None)
        """MiCS's hierarchical gather: its groups across the nodes, then within its node."""

    def reset_step(self, micro: int) -> None:
        """Where DeepSpeed's live count stands as micro-batch `micro`'s forward starts.
        Zeroed at each backward's end (up to 0.15.3) while `kept_after_backward` is still
        gathered, then, after the step has released it and taken it off the count, it is
        that far below zero at every forward; zeroed at each forward's start (0.15.4 on,
        but 0.16.0-0.16.7), it is exact after a step and that far below on later
        micro-batches; zeroed only by the step's release of everything (0.16.0-0.16.7), it
        is exact. The prefetcher may hold `stage3_max_live_parameters` plus the drift."""
        drift = {"backward": self.kept_numel, "forward": self.kept_numel if micro else 0,
                 "step": 0}
        self.drift = drift[self.live_count_reset]

    def keep_after_forward(self, index: int) -> bool:
        return self.core.plan.keep_after_forward[index]

    def fetch_external(self) -> Gen:
        """The top module's pre-forward hook, first of every forward: one all-gather of the
        external params (`Plan.external`), which the forward's kernels then wait for."""
        external = tuple(sorted(self.core.plan.external))
        if not external:
            return
        self._gather(external)
        for index in external:
            yield from self.wait_ongoing(index, self.gathered[index])

    def fetch(self, index: int) -> simpy.Event | None:
        """All-gather a module's params unless they are gathered or on their way."""
        if not self.is_gathered[index]:
            self._gather((index,))
        return self.gathered[index]

    def _gather(self, indices: tuple[int, ...], *, zeroed: bool = False) -> None:
        """One all-gather call over the modules' parameters (`__all_gather_params`: a module's
        own fetch, or every module of one prefetch); with hpZ, one over the group for those
        with a secondary partition, then one over every rank for the others. `zeroed`: the
        gathered buffers are zero-filled before it (`_prefetch_draining`)."""
        core, plan = self.core, self.core.plan
        todo = [i for i in indices if not self.is_gathered[i] and plan.gathered_numel[i] > 0]
        if not todo:
            return
        for index in todo:
            self.is_gathered[index] = True
            self.swap_buffers_held += self.on_nvme.get(index, 0)
            del self.not_gathered[bisect_left(self.not_gathered, self.forward_position[index])]
            self.live_numel += plan.gathered_numel[index]
            self.waited[index] = False
            self.gathered[index] = None
        if not core.distributed and not self.source.always_gathers:
            return
        if self.hpz == 1:
            self._issue(todo, secondary=False, zeroed=zeroed)
            return
        with_secondary = [index for index in todo if self.has_secondary[index]]
        for modules, secondary in ((with_secondary, True),
                                   ([i for i in todo if not self.has_secondary[i]], False)):
            if modules:
                self._issue(modules, secondary=secondary)

    def _issue(self, todo: list[int], *, secondary: bool, zeroed: bool = False) -> None:
        """`all_gather_coalesced` over the modules' tensors: from their secondary partitions
        over the hpZ group, or from their partitions over every rank; `zeroed`: each gathered
        buffer zero-filled on the same stream first."""
        core, plan = self.core, self.core.plan
        tensors = [p for index in todo for p in self.to_gather[index]]
        numel = sum([plan.gathered_numel[index] for index in todo])
        sizes = [p.numel for p in tensors] if self.per_tensor else [numel]
        ranks = self.hpz_ranks if secondary else core.ranks
        hierarchy = self._hierarchical_keys(len(tensors))
        keys = ([] if hierarchy is not None
                else [self._key(Collective.ALL_GATHER, ranks) for _ in sizes] if secondary
                else [core.next_key(Collective.ALL_GATHER) for _ in sizes])
        quantized = self.quantized and core.distributed
        core.launches += core.distributed * len(sizes)
        self.issued_since_drain = True
        core.plain_launches += core.distributed * len(sizes) * quantized
        for index in todo:
            self.gathered_bytes[index], reserve_s = self._hold(
                core.dtype_bytes * plan.gathered_numel[index], plan.modules[index].name)
            core.deferred_host_s += reserve_s
        names = " + ".join([plan.modules[index].name for index in todo])
        shares = [(self.secondary_numel if secondary else self.partition_numel)[index]
                  for index in todo]
        if self.source.always_gathers:
            self._bring(todo, names, shares)
        element_bytes, scale_bytes, quantized_held = core.dtype_bytes, 0, 0
        if quantized:
            element_bytes = 1
            scale_bytes = (QUANTIZER_SCALE_BYTES * quantization_groups(sum(shares))
                           * len(ranks))
            quantized_held = self._quantize(names, sum(shares), len(tensors), numel,
                                            scale_bytes)
            scale_key = self._key("all_gather_scales", ranks)
        turn = self.nccl.issue()

        def body() -> Gen:
            yield from turn.wait()
            if zeroed:
                yield from core.gpu_kernel(core.hbm_seconds(core.dtype_bytes * numel, passes=1),
                                           self.allgather)
            if hierarchy is not None:
                yield from self._gather_hierarchically(hierarchy, element_bytes * sum(shares),
                                                       element_bytes * numel)
            else:
                for key, size in zip(keys, sizes, strict=True):
                    yield from core.machine.collective(core.rank, key, Collective.ALL_GATHER,
                                                       element_bytes * size, ranks)
            if scale_bytes:
                yield from core.machine.collective(core.rank, scale_key, Collective.ALL_GATHER,
                                                   scale_bytes, ranks)
            turn.done()

        label = f"all-gather {names}" + (f" over its hpZ group of {len(ranks)}" if secondary
                                         else "")
        event = self.allgather.launch(label, body, kind=OpKind.ALL_GATHER,
                                      nbytes=element_bytes * numel + scale_bytes,
                                      after=(self.copies.idle_event(),))
        if core.distributed and not self.per_tensor and (
                (len(tensors) > 1 and self.flat_split) or quantized):
            bundle = _Bundle(len(tensors), core.dtype_bytes * numel, waiting=len(todo),
                             quantized=quantized, quantized_held=quantized_held)
            for index in todo:
                self.bundles[index] = bundle
        for index in todo:
            self.gathered[index] = event

    def _hierarchical_keys(self, tensors: int) -> tuple[tuple, tuple] | None:
        """With MiCS's hierarchical gather, the keys of a call's two all-gathers (across the
        nodes, then within the node), the second one's launch and the two copies a tensor
        between them paid on the host (the call's count the first); None otherwise."""
        if self.hierarchy is None:
            return None
        core = self.core
        inter, intra = self.hierarchy
        core.launches += 1
        core.deferred_host_s += 2 * tensors * core.kernel_launch_s
        return (core.next_key(f"{Collective.ALL_GATHER} inter-node", inter),
                core.next_key(f"{Collective.ALL_GATHER} intra-node", intra))

    def _gather_hierarchically(self, keys: tuple[tuple, tuple], share_bytes: int,
                               nbytes: int) -> Gen:
        """`_hierarchical_all_gather_params`: this rank's partitions all-gathered over its
        group across the shard group's nodes, one per node (`async_op=False`: the stream
        waits), the result cloned and copied into place (two copies of it), then one
        all-gather within the node of the whole parameters' bytes (`nbytes`)."""
        core = self.core
        inter, intra = self.hierarchy
        inter_key, intra_key = keys
        across = share_bytes * len(inter)
        yield from core.machine.collective(core.rank, inter_key, Collective.ALL_GATHER,
                                           across, inter)
        yield from core.gpu_kernel(core.hbm_seconds(2 * across), self.allgather)
        yield from core.machine.collective(core.rank, intra_key, Collective.ALL_GATHER,
                                           nbytes, intra)

    def _key(self, kind: str, ranks: tuple[int, ...]) -> tuple:
        """A collective's key: the call's sequence number among the rank's calls of its kind,
        and, for a group short of every rank (hpZ), which group."""
        if ranks is self.core.ranks:
            return self.core.next_key(kind)
        return (*self.core.next_key(f"{kind} hpz"), ranks[0])

    def _quantize(self, names: str, share_numel: int, tensors: int, numel: int,
                  scale_bytes: int) -> int:
        """qwZ before the all-gather, on DeepSpeed's all-gather stream: the partitions
        concatenated (`torch.cat`, for several tensors) and quantized to int8 with a scale per
        group, into buffers for the gathered int8 blocks and scales. Returns the bytes held
        until the call's last wait."""
        core = self.core
        element = core.dtype_bytes
        several = tensors > 1
        held = core.gpu.allocate(Category.QUANTIZED_GATHER,
                                 numel + share_numel + scale_bytes, f"qwZ {names}")
        core.deferred_host_s += ((1 + several) * core.kernel_launch_s
                                 + core.reserve_s(held, Stream.FETCH_COPIES))
        core.hbm_op(self.copies, f"quantize {names}", OpKind.QUANTIZE,
                    (2 * element * several + element + 1) * share_numel, passes=1)
        return held

    def _bring(self, todo: list[int], names: str, shares: list[int]) -> None:
        """The partitions (`shares` numel each: secondary ones with hpZ) copied to the GPU
        (and read from NVMe first, where they live there) on DeepSpeed's all-gather stream,
        where `all_gather_coalesced` makes them (`ds_tensor.to(device)`), so the all-gather
        issued after them waits for them and they do not wait for the all-gathers issued
        before."""
        core = self.core

        def body() -> Gen:
            for index, share in zip(todo, shares, strict=True):
                yield from self.source.bring(core, index, share)

        nbytes = core.dtype_bytes * sum(shares)
        self.copies.launch(f"fetch {names}", body, kind=OpKind.PARAM_FETCH, nbytes=nbytes)

    def wait_ongoing(self, index: int, ready: simpy.Event | None) -> Gen:
        """The host's wait on a module's in-flight parameters: one event per parameter tensor
        it gathers, and a block on the oldest unfinished one while more than
        `MAX_ONGOING_FETCH_EVENTS` are; a leaf's wait records none where the fetch is DeepSpeed's
        fast one (`Plan.fast_leaf_fetch`), though it still blocks on older ones. Returns the
        event the module's kernels wait for."""
        if self.drains:
            return (yield from self._drain(index))
        if self.waited[index]:
            return ready
        self.waited[index] = True
        ready = yield from self._split_bundle(index, ready)
        ready = self._behind_copies(ready)
        if ready is None or not self.bounded_fetches:
            return ready
        plan = self.core.plan
        records = not (plan.fast_leaf_fetch and index in plan.leaves)
        for param in plan.params[index]:
            if param.persistent:
                continue
            while self.ongoing and self.ongoing[0].triggered:
                self.ongoing.popleft()
            if len(self.ongoing) > MAX_ONGOING_FETCH_EVENTS:
                yield self.ongoing.popleft()
            if records:
                self.ongoing.append(ready)
        return ready

    def _drain(self, index: int) -> Gen:
        """`fetch_sub_module` before DeepSpeed 0.6.0 (stage3.py, v0.4.0-v0.5.10): a module
        that gathered parameters or found them in flight waits on the host for every
        all-gather issued since the last such wait and then for the whole device
        (`_synchronize_communication`: `comm_stream.synchronize()`, `torch.cuda.synchronize()`);
        then, whether or not it gathered, each of its parameters' norm is formatted into a
        debug message that `print_rank_0(..., force=False)` drops, `f"... norm={param.norm()}"`:
        a norm kernel on the compute stream, then `.item()`, a blocking copy that waits for it.
        So the host never runs ahead of the GPU past a module with parameters. Returns None:
        what the module's kernels need has run."""
        core = self.core
        if not self.waited[index]:
            self.waited[index] = True
            yield from core.synchronize()
            self.issued_since_drain = False
        name = core.plan.modules[index].name
        for param in core.plan.params[index]:
            yield from core.issue_kernels(1)
            core.hbm_op(core.compute, f"norm {name}", OpKind.PARAM_NORM,
                        core.dtype_bytes * param.numel, passes=1)
            yield from core.wait_for_stream(core.compute, 1)
        return None

    def _behind_copies(self, ready: simpy.Event | None) -> simpy.Event | None:
        """`fetch_sub_module` makes the compute stream wait for DeepSpeed's whole all-gather
        stream (`wait_stream`), so with offloaded partitions a module's kernels also wait for
        the copies in of the partitions prefetched since its own all-gather was issued."""
        tail = self.copies.idle_event()
        if ready is None or tail is None or tail is ready or not self.source.always_gathers:
            return ready
        return AllDone(self.core.env, [ready, tail])

    def _split_bundle(self, index: int, ready: simpy.Event | None) -> Gen:
        """`AllGatherCoalescedHandle.wait`: an all-gather of several tensors lands in one flat
        buffer; the first wait on any of them copies every tensor out of it (one `torch.cat`
        per tensor, on DeepSpeed's all-gather stream once that call's all-gather has run: the
        handle's wait), and the flat buffer is freed when the registry
        drops the handle, at the wait on its last module. Until then the bundle is held twice.
        """
        bundle = self.bundles.pop(index, None)
        if bundle is None:
            return ready
        core = self.core
        if bundle.copies is None:
            split = bundle.tensors > 1
            reserve_s = 0.0
            if split:
                bundle.extra, reserve_s = self._hold(bundle.nbytes, "all-gather flat buffer")
            yield from core.host_time((bundle.tensors * split + bundle.quantized)
                                      * core.kernel_launch_s + reserve_s, OpKind.LAUNCH,
                                      malloc_s=reserve_s)
            if bundle.quantized:
                ready = core.hbm_op(self.copies, "dequantize all-gather", OpKind.DEQUANTIZE,
                                    bundle.nbytes * (1 + 1 / core.dtype_bytes), passes=1,
                                    after=(ready,))
            bundle.copies = ready if not split else core.hbm_op(
                self.copies, "split all-gather", OpKind.GATHER_SPLIT, bundle.nbytes,
                after=(ready,))
        self._leave(bundle)
        return bundle.copies

    def _hold(self, nbytes: float, what: str) -> tuple[int, float]:
        """Gathered parameters (or a flat all-gather buffer) allocated on DeepSpeed's
        all-gather stream: the bytes held, and the host seconds `cudaMalloc` takes for them
        where the phase emptied the CUDA cache (`RankCore.reserve_s`: that stream's own
        pool)."""
        core = self.core
        held = core.gpu.allocate(Category.PARAMS_GATHERED, nbytes, what)
        return held, core.reserve_s(held, Stream.FETCH_COPIES)

    def _drop(self, held: int) -> None:
        """What `_hold` allocated, freed back to the all-gather stream's pool."""
        self.core.gpu.free(Category.PARAMS_GATHERED, held)
        self.core.release_device_memory(held, Stream.FETCH_COPIES)

    def _leave(self, bundle: _Bundle) -> None:
        """One module of the bundle is done with the handle; the last frees the flat buffer
        (and qwZ's int8 buffer)."""
        bundle.waiting -= 1
        if bundle.waiting:
            return
        if bundle.extra:
            self._drop(bundle.extra)
        if bundle.quantized_held:
            self.core.gpu.free(Category.QUANTIZED_GATHER, bundle.quantized_held)
            self.core.release_device_memory(bundle.quantized_held, Stream.FETCH_COPIES)

    def prefetch_after(self, index: int, backward: bool) -> Iterable[simpy.Event]:
        """`fetch_sub_module`'s prefetch, run by every module's pre-hook (a module without
        parameters too): fetch ahead in trace order while fewer than
        min(`stage3_prefetch_bucket_size`, live budget) numel are issued, in one all-gather
        call; as in DeepSpeed, the module that crosses the bound is still fetched. The live
        budget is `stage3_max_live_parameters` less the gathered numel, plus the count's
        drift (`reset_step`), which DeepSpeed's count leaves out. The forward's trace goes
        on into the backward's, which takes the modules in reverse. A module whose partition
        is on NVMe needs one of `offload_param.buffer_count` swap buffers per tensor, held until
        its release: without enough free the prefetch stops there (DeepSpeed keeps the trace's
        order). Returns what the host waits for meanwhile: nothing, but before DeepSpeed 0.6.0
        (`_prefetch_draining`)."""
        if self.drains and self.issued_since_drain:
            return ()
        ds, numel = self.core.ds, self.core.plan.gathered_numel
        budget = min(ds.stage3_prefetch_bucket_size,
                     ds.stage3_max_live_parameters + self.drift - self.live_numel)
        if budget <= 0:
            return ()
        pending = self.not_gathered
        here = bisect_left(pending, bisect_left(self.trace, index))
        if backward:
            later: Iterable[int] = range(here - 1, -1, -1)
        else:
            ahead = here + (here < len(pending) and self.trace[pending[here]] == index)
            later = chain(range(ahead, len(pending)), range(ahead - 1, -1, -1))
        issued = 0
        ahead_modules = []
        swap_buffers = self.core.ds.offload_param.buffer_count - self.swap_buffers_held
        for k in later:
            if issued >= budget:
                break
            module = self.trace[pending[k]]
            need = self.on_nvme.get(module, 0)
            if need > swap_buffers:
                break
            swap_buffers -= need
            ahead_modules.append(module)
            issued += numel[module]
        if self.drains:
            return self._prefetch_draining(ahead_modules)
        if ahead_modules:
            self._gather(tuple(ahead_modules))
        return ()

    def _prefetch_draining(self, modules: list[int]) -> Gen:
        """A prefetch before DeepSpeed 0.6.0 (partition_parameters.py `_allgather_param`,
        v0.4.0-v0.5.10): each parameter's gathered buffer is made with `torch.zeros` on the
        coordinator's stream, then `torch.cuda.synchronize()`, then its all-gather is launched:
        the host waits for the whole device, the all-gather just launched included, before
        each next one, so only the last all-gather of a prefetch overlaps the module's kernels.
        zerosim waits once per module: a module's tensors are gathered back to back on the
        stream either way (one wait per tensor would delay each next launch by the host's
        return from the wait alone)."""
        for module in modules:
            yield from self.core.synchronize()
            self._gather((module,), zeroed=True)
            yield from self.core.pay_launches()

    def release(self, index: int, *, backward: bool) -> None:
        """Release a module's gathered params when the host's post-hook runs: after its
        forward, unless they are external (no hook of theirs runs); after its backward, unless
        no post-backward hook fires for it (`Plan.unreleased_modules`).

        The memory counts as allocated from the host's all-gather call to this release, as
        PyTorch's caching allocator counts it (`memory_allocated`): DeepSpeed's `free_param`
        calls `record_stream`, so the block is only *reused* once the GPU has finished with
        it, but it stops counting as allocated at once. What the GPU still holds
        is reserved, not allocated, memory; when HBM runs short the allocator waits for the
        streams and reuses those blocks rather than failing.
        """
        plan = self.core.plan
        if index in (plan.unreleased_modules if backward else plan.external):
            return ()
        if self.hpz > 1 and self._makes_secondary(index):
            return self._release_into_secondary(index)
        self._free(index)
        return ()

    def _makes_secondary(self, index: int) -> bool:
        """With hpZ, whether releasing the module's gathered parameters copies them into
        secondary partitions: at the first release since the step, or every release (0.13.2
        to 0.14.2)."""
        return (self.is_gathered[index]
                and (self.recopies_secondary or not self.has_secondary[index]))

    def _release_into_secondary(self, index: int) -> Gen:
        yield from self._make_secondary(index)
        self._free(index)

    def _make_secondary(self, index: int) -> Gen:
        """`_partition_param_sec` for each of the module's gathered tensors: its share copied
        (zeroed first, from 0.19.5) into its secondary partition, then, from 0.13.5, the host
        synchronizes the current stream, the compute stream, once per tensor."""
        core = self.core
        name = core.plan.modules[index].name
        fresh = not self.has_secondary[index]
        self.has_secondary[index] = True
        if self.secondary_on_host:
            yield from self._make_secondary_on_host(name, index, fresh)
            return
        behaviours, element = core.behaviours, core.dtype_bytes
        if fresh:
            held = self.secondary_held[index] = core.gpu.allocate(
                Category.PARAMS_SECONDARY, element * self.secondary_numel[index], name)
            yield from core.host_time(core.reserve_s(held), OpKind.CUDA_MALLOC)
        zeroed = behaviours.hpz_secondary_zeroed
        for tensor in self.to_gather[index]:
            yield from core.issue_kernels(1 + zeroed)
            core.hbm_op(core.compute, f"secondary {name}", OpKind.SECONDARY_PARTITION,
                        element * tensor.partition_numel * self.hpz_groups, passes=2 + zeroed)
            if behaviours.hpz_secondary_sync:
                yield from core.wait_for_stream(core.compute, 0)

    def _make_secondary_on_host(self, name: str, index: int, fresh: bool) -> Gen:
        """With `offload_param: cpu` the secondary partitions live in host memory
        (`remote_device`), pinned with `pin_memory` (held for the run: `zerosim.engine.states`,
        as PyTorch's host cache keeps the blocks the step lets go): a new one is made pageable
        and copied into a pinned block (`pin_memory()`); 0.19.5 zeroes it on the CPU; the
        share goes there by a blocking D2H, which waits for the compute stream."""
        core = self.core
        element, pinned = core.dtype_bytes, core.ds.offload_param.pin_memory
        for tensor in self.to_gather[index]:
            share = tensor.partition_numel * self.hpz_groups
            if fresh and pinned:
                yield from core.cpu_work(
                    f"pin secondary {name}", OpKind.SECONDARY_PARTITION,
                    core.machine.elementwise(core.rank, share, costs.HostBytes(home=2 * element)),
                    nbytes=element * share)
            if core.behaviours.hpz_secondary_zeroed:
                yield from core.cpu_work(
                    f"zero secondary {name}", OpKind.SECONDARY_PARTITION,
                    core.machine.elementwise(core.rank, share, costs.HostBytes(home=element)),
                    nbytes=element * share)
            yield from core.wait_for_stream(core.compute, 1)
            yield from core.dma("d2h", element * share, pinned=pinned,
                                op=f"secondary {name}", kind=OpKind.SECONDARY_PARTITION)

    def _free(self, index: int) -> None:
        if not self.is_gathered[index]:
            return
        unwaited = self.bundles.pop(index, None)
        if unwaited is not None:
            self._leave(unwaited)
        self.is_gathered[index] = False
        self.swap_buffers_held -= self.on_nvme.get(index, 0)
        insort(self.not_gathered, self.forward_position[index])
        self.live_numel -= self.core.plan.gathered_numel[index]
        self.gathered[index] = None
        self._drop(self.gathered_bytes[index])
        self.gathered_bytes[index] = 0

    def release_after_backward(self) -> Iterable[simpy.Event]:
        """Free what is still gathered when a backward ends (prefetched, never used), but not
        `kept_after_backward`: the next micro-batch and the step find the external params
        gathered, and up to 0.19.2 the embeddings too."""
        return self._release_each([index for index in self.trace
                                   if index not in self.kept_after_backward])

    def release_all(self) -> Iterable[simpy.Event]:
        """The optimizer step's `_partition_all_parameters`, first thing in the step."""
        return self._release_each(self.trace)

    def _release_each(self, indices: list[int]) -> Iterable[simpy.Event]:
        """Partition every module of `indices` still gathered; with hpZ each gets its
        secondary partitions there, as any partition of an available parameter makes them."""
        if self.hpz > 1:
            return self._release_each_into_secondaries(indices)
        for index in indices:
            self._free(index)
        return ()

    def _release_each_into_secondaries(self, indices: list[int]) -> Gen:
        for index in indices:
            if self._makes_secondary(index):
                yield from self._make_secondary(index)
            self._free(index)

    def invalidate_secondaries(self) -> None:
        """The step's `invalidate_secondary_tensor` (`_post_step`): every secondary partition
        dropped, so the next forward gathers from the partitions over every rank."""
        for held in self.secondary_held:
            if held:
                self.core.gpu.free(Category.PARAMS_SECONDARY, held)
                self.core.release_device_memory(held)
        self.secondary_held = [0] * len(self.secondary_held)
        self.has_secondary = [False] * len(self.has_secondary)
