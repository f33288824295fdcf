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
0.13.3's `__max_ongoing_fetch_events`, from 0.6.2), before it issues the prefetches.

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
from itertools import chain
from typing import Protocol

import simpy

from zerosim.engine.conditions import AllDone
from zerosim.engine.rank import Gen, RankCore
from zerosim.engine.streams import NcclQueue
from zerosim.vocabulary import Category, Collective, OpKind, Stream


class ParameterCoordinator(Protocol):
    module_hooks: bool
    """Whether DeepSpeed hooks every module's forward and backward (ZeRO-3's coordinator)."""

    def reset_step(self, micro: int) -> None: ...
    def fetch_external(self) -> Gen: ...
    def fetch(self, index: int) -> simpy.Event | None: ...
    def wait_ongoing(self, index: int, ready: simpy.Event | None) -> Gen: ...
    def prefetch_after(self, index: int, backward: bool) -> None: ...
    def release(self, index: int, *, backward: bool) -> None: ...
    def release_after_backward(self) -> None: ...
    def release_all(self) -> None: ...
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

    def prefetch_after(self, index: int, backward: bool) -> None:
        return None

    def release(self, index: int, *, backward: bool) -> None:
        return None

    def release_after_backward(self) -> None:
        return None

    def release_all(self) -> None:
        return None

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
    """A coalesced all-gather of several tensors (`AllGatherCoalescedHandle`)."""

    tensors: int
    nbytes: float
    waiting: int
    """Modules of the call whose hook has not yet waited on it."""
    copies: simpy.Event | None = None
    """The copies out of the flat buffer, once the first module's wait has issued them."""
    extra: int = 0


MAX_ONGOING_FETCH_EVENTS = 2
"""partitioned_param_coordinator.py (0.13.3) `__max_ongoing_fetch_events`."""


class PartitionedParams:
    """ZeRO-3's partitioned parameter coordinator for one rank."""

    module_hooks = True

    def __init__(self, core: RankCore, source: ParamSource, nccl: NcclQueue, *,
                 per_tensor: bool = False, bounded_fetches: bool = True):
        self.core = core
        self.source = source
        self.nccl = nccl
        """The process group's NCCL stream: each all-gather runs after what was issued there
        before it (gradient reductions too, where the stack puts them on the same group)."""
        self.per_tensor = per_tensor
        """DeepSpeed before `coalesced_collectives`: one all-gather per parameter tensor."""
        self.bounded_fetches = bounded_fetches
        """DeepSpeed from 0.6.2 (`bounded_fetch_events`): the host waits on old fetches."""
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

    def _gather(self, indices: tuple[int, ...]) -> None:
        """One all-gather call over the modules' parameters (`__all_gather_params`: a module's
        own fetch, or every module of one prefetch)."""
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
        tensors = [p for index in todo for p in self.to_gather[index]]
        numel = sum([plan.gathered_numel[index] for index in todo])
        sizes = [p.numel for p in tensors] if self.per_tensor else [numel]
        keys = [core.next_key(Collective.ALL_GATHER) for _ in sizes]
        core.launches += core.distributed * len(sizes)
        for index in todo:
            self.gathered_bytes[index], reserve_s = self._hold(
                core.dtype_bytes * plan.gathered_numel[index], plan.modules[index].name)
            core.deferred_host_s += reserve_s
        names = " + ".join([plan.modules[index].name for index in todo])
        if self.source.always_gathers:
            self._bring(todo, names)
        turn = self.nccl.issue()

        def body() -> Gen:
            yield from turn.wait()
            for key, size in zip(keys, sizes, strict=True):
                yield from core.machine.collective(core.rank, key, Collective.ALL_GATHER,
                                                   core.dtype_bytes * size, core.ranks)
            turn.done()

        event = self.allgather.launch(f"all-gather {names}", body,
                                      kind=OpKind.ALL_GATHER, nbytes=core.dtype_bytes * numel,
                                      after=(self.copies.idle_event(),))
        if core.distributed and not self.per_tensor and len(tensors) > 1:
            bundle = _Bundle(len(tensors), core.dtype_bytes * numel, waiting=len(todo))
            for index in todo:
                self.bundles[index] = bundle
        for index in todo:
            self.gathered[index] = event

    def _bring(self, todo: list[int], names: str) -> None:
        """The partitions copied to the GPU (and read from NVMe first, where they live there)
        on DeepSpeed's all-gather stream, where `all_gather_coalesced` makes them
        (`ds_tensor.to(device)`), so the all-gather issued after them waits for them and they
        do not wait for the all-gathers issued before."""
        core = self.core

        def body() -> Gen:
            for index in todo:
                yield from self.source.bring(core, index, self.partition_numel[index])

        nbytes = core.dtype_bytes * sum([self.partition_numel[index] for index in todo])
        self.copies.launch(f"fetch {names}", body, kind=OpKind.PARAM_FETCH, nbytes=nbytes)

    def wait_ongoing(self, index: int, ready: simpy.Event | None) -> Gen:
        """The host's wait on a module's in-flight parameters: one event per parameter tensor
        it gathers, and a block on the oldest unfinished one while more than
        `MAX_ONGOING_FETCH_EVENTS` are; a leaf's wait records none where the fetch is DeepSpeed's
        fast one (`Plan.fast_leaf_fetch`), though it still blocks on older ones. Returns the
        event the module's kernels wait for."""
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
            bundle.extra, reserve_s = self._hold(bundle.nbytes, "all-gather flat buffer")
            yield from core.host_time(bundle.tensors * core.kernel_launch_s + reserve_s)
            bundle.copies = core.hbm_op(self.copies, "split all-gather", OpKind.GATHER_SPLIT,
                                        bundle.nbytes, after=(ready,))
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
        """One module of the bundle is done with the handle; the last frees the flat buffer."""
        bundle.waiting -= 1
        if bundle.waiting == 0 and bundle.extra:
            self._drop(bundle.extra)

    def prefetch_after(self, index: int, backward: bool) -> None:
        """`fetch_sub_module`'s prefetch, run by every module's pre-hook (a module without
        parameters too): fetch ahead in trace order while fewer than
        min(`stage3_prefetch_bucket_size`, live budget) numel are issued, in one all-gather
        call; as in DeepSpeed, the module that crosses the bound is still fetched. The live
        budget is `stage3_max_live_parameters` less the gathered numel, plus the count's
        drift (`reset_step`), which DeepSpeed's count leaves out. The forward's trace goes
        on into the backward's, which takes the modules in reverse. A module whose partition
        is on NVMe needs one of `offload_param.buffer_count` swap buffers per tensor, held until
        its release: without enough free the prefetch stops there (DeepSpeed keeps the trace's
        order)."""
        ds, numel = self.core.ds, self.core.plan.gathered_numel
        budget = min(ds.stage3_prefetch_bucket_size,
                     ds.stage3_max_live_parameters + self.drift - self.live_numel)
        if budget <= 0:
            return
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
        if ahead_modules:
            self._gather(tuple(ahead_modules))

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
        if index not in (plan.unreleased_modules if backward else plan.external):
            self._free(index)

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

    def release_after_backward(self) -> None:
        """Free what is still gathered when a backward ends (prefetched, never used), but not
        `kept_after_backward`: the next micro-batch and the step find the external params
        gathered, and up to 0.19.2 the embeddings too."""
        for index in self.trace:
            if index not in self.kept_after_backward:
                self._free(index)

    def release_all(self) -> None:
        """The optimizer step's `_partition_all_parameters`, first thing in the step."""
        for index in self.trace:
            self._free(index)
