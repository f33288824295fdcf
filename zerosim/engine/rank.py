"""What every part of a rank program shares: its streams, phase, memory, copies and compute.

A `RankCore` is one data-parallel rank's host thread (a SimPy process) with the queues it issues
work onto. The parts of a rank program (parameter coordinator, gradient path, optimizer step,
model states: see `compose.py`) each hold the core and act through it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import simpy

from zerosim.behaviours import Behaviours
from zerosim.engine.conditions import AllDone
from zerosim.engine.machine import Direction, Machine
from zerosim.engine.memory import AllocatorReserve, MemoryPool, shared
from zerosim.engine.plan import Plan, ProcessGroups, module_costs, process_groups
from zerosim.engine.records import MemorySample, PhaseSpan, Span, Table
from zerosim.engine.streams import Body, InOrderStream, SharedSMs
from zerosim.hardware import costs
from zerosim.models.breakdown import Exchange
from zerosim.scenario import Scenario
from zerosim.units import BYTES_PER_DTYPE
from zerosim.vocabulary import (
    PCIE_STREAMS,
    BufferKind,
    Category,
    Collective,
    DeviceKind,
    OpKind,
    Phase,
    Stream,
    device_name,
    host_buffer,
)

Gen = Generator[simpy.Event, Any, Any]
Waits = tuple[simpy.Event, ...]
"""Events to `yield from` one after the other (each succeeding with None)."""

EXCHANGE_KINDS = {Collective.ALL_TO_ALL: OpKind.ALL_TO_ALL,
                  Collective.ALL_GATHER: OpKind.ALL_GATHER}
"""The op kind of a module's in-line collective (`Exchange.kind`)."""
_HOST_BUFFER = {pinned: host_buffer(pinned).value for pinned in (True, False)}
"""A copy's host buffer as records hold it: plain text, made once (`.value` is slow)."""
_DMA_SUFFIX = {pinned: f" ({text})" for pinned, text in _HOST_BUFFER.items()}
_PCIE_TRACK = {direction: stream.value for direction, stream in PCIE_STREAMS.items()}


class Gil:
    """CPython's global interpreter lock in a rank's process, where it times anything: a
    call into C++ bound without `gil_scoped_release` (DeepSpeedCPUAdam's `adam_update`,
    csrc/adam/cpu_adam.cpp) holds it until it returns, so another Python thread cannot
    start its next statement meanwhile; PyTorch's ops release it while they run."""

    __slots__ = ("env", "held", "released")

    def __init__(self, env: simpy.Environment):
        self.env = env
        self.held = False
        self.released: simpy.Event | None = None
        """Fires when the call holding the lock returns: made by the first thread that waits
        for it (none is made while no other thread waits)."""

    def hold(self) -> None:
        self.held = True

    def release(self) -> None:
        released, self.released, self.held = self.released, None, False
        if released is not None:
            released.succeed()

    def acquire(self) -> Waits:
        """What another thread waits for before its next statement, to `yield from`."""
        if not self.held:
            return ()
        if self.released is None:
            self.released = self.env.event()
        return (self.released,)


@dataclass
class RunContext:
    """Everything the ranks of one run share."""

    env: simpy.Environment
    scenario: Scenario
    machine: Machine
    plan: Plan
    pools: dict[str, MemoryPool]
    spans: Table[Span] = field(default_factory=lambda: Table(Span))
    phases: Table[PhaseSpan] = field(default_factory=lambda: Table(PhaseSpan))
    memory_log: Table[MemorySample] = field(default_factory=lambda: Table(MemorySample))
    record_host: bool = False
    """Record the host thread's work as spans (`Stream.HOST`): where every record is kept."""

    def __post_init__(self) -> None:
        self.world = tuple(range(self.scenario.data_parallel))
        """Every data-parallel rank, simulated or not (one tuple the ranks share)."""
        ds = self.scenario.deepspeed
        self.groups: ProcessGroups = process_groups(
            self.world, ds.mics.partition_ranks(ds.stage, len(self.world)),
            self.scenario.hardware.gpus_per_node, ds.mics.acts(ds.stage) and ds.mics.hierarchical,
            ds.sequence_parallel_size)
        """Per rank, the ranks of its partition group, replicas, MiCS's hierarchy and its
        Ulysses group."""
        self.costs = module_costs(self.scenario)
        """Each module's GPU time and kernel launches (every rank runs every module once per
        micro-batch)."""


class RankCore:
    """One rank's host thread, streams and memory, and the primitive activities it issues."""

    def __init__(self, ctx: RunContext, rank: int):
        self.ctx = ctx
        self.env = ctx.env
        self.rank = rank
        self.ds = ctx.scenario.deepspeed
        self.behaviours: Behaviours = ctx.scenario.behaviours
        self.what_if = ctx.scenario.what_if
        self.profile = ctx.scenario.hardware
        self.machine = ctx.machine
        self.plan = ctx.plan
        self.placement = ctx.machine.placements[rank]
        self.gpu = ctx.pools[self.placement.device]
        stands_for = len(ctx.machine.stands_for[rank])
        self.host = shared(ctx.pools[self.placement.host_device], stands_for)
        self.nvme = shared(ctx.pools.get(device_name(DeviceKind.NVME, self.placement.node)),
                           stands_for)
        self.ranks = ctx.groups.partition[rank]
        """The ranks its ZeRO partitions span, and its collectives with them: every rank, or
        with MiCS its shard group."""
        self._group_key = None if self.ranks is ctx.world else self.ranks[0]
        """What tells its shard group's collectives from another's (None: every rank's)."""
        self.label_prefix = f"rank{rank} "
        """What the rank's flows' labels start with (`FlowNetwork.assert_idle` names them)."""
        self.phase, self.micro = Phase.SETUP.value, -1
        self.in_phase = False
        """Between `begin` and `end`: host work outside is tagged `Phase.BETWEEN`."""
        """The phase as records hold it: plain text (`records.Table`)."""
        self._phase_start = 0.0
        self._held_at_start = 0.0
        """The SMs' `held` when the phase began."""
        self._timer_handover: tuple[float, float] | None = None
        """(host time, timer stop) of the last phase's end (see `end`)."""
        self._seq: dict[str, int] = {}
        self.streams: dict[Stream, InOrderStream] = {}
        self.compute = self.stream(Stream.COMPUTE)
        self.sms = SharedSMs(self.env)
        self.gil = Gil(self.env)
        self.dtype_bytes = BYTES_PER_DTYPE[self.ds.dtype]
        self.comm_bytes = BYTES_PER_DTYPE[self.ds.communication_dtype]
        self.accum_bytes = BYTES_PER_DTYPE[self.ds.grad_accum_dtype]
        self.adam_precision = costs.AdamPrecision(self.ds.master_dtype,
                                                  self.ds.optimizer_state_dtype)
        self.master_bytes = self.adam_precision.param_bytes
        """Per element of the optimizer's master params and of their gradients."""
        self.pinned = self.ds.offload_optimizer.pin_memory
        self.buffer = host_buffer(self.pinned)
        self.activations: dict[int, int] = {}
        self.launches = 0
        self.plain_launches = 0
        """Collectives called straight through `deepspeed.comm` since the last
        `pay_launches` (qgZ's all-to-alls, qwZ's scales), at `plain_collective_s` each."""
        stack, core_Hz = ctx.scenario.stack, self.profile.cpu_boost_Hz
        self.kernel_launch_s = stack.on_core(stack.kernel_launch_s, core_Hz)
        self.fetch_hook_s = stack.on_core(stack.fetch_hook_s, core_Hz)
        self.leaf_hook_share = stack.leaf_hook_share
        self.repeat_hook_share = stack.repeat_hook_share
        self.collective_launch_s = stack.on_core(stack.collective_launch_s, core_Hz)
        self.plain_collective_s = stack.on_core(stack.plain_collective_launch_s, core_Hz)
        self.micro_batch_s = stack.on_core(stack.micro_batch_s, core_Hz)
        self.step_s = stack.on_core(stack.step_s, core_Hz)
        self.memory_report_s = (stack.memory_report_s(len(self.plan.all_params), core_Hz,
                                                      partitioned=self.ds.stage == 3)
                                if self.ds.memory_breakdown else 0.0)
        """One `see_memory_usage` of the engine's with `memory_breakdown` on: rank 0's full
        `gc.collect()` over every object its process holds (its other ranks wait for it at
        their next collective)."""
        self.count_used_params_s = (stack.on_core(stack.used_param_check_s, core_Hz)
                                    * len(self.plan.all_params))
        """One `count_used_parameters_in_backward` over the model's parameters."""
        self.step_tensor_s = stack.on_core(stack.step_tensor_s, core_Hz)
        self.regather_tensor_s = stack.on_core(stack.regather_tensor_s, core_Hz)
        self.heap_reuse_bytes = stack.heap_reuse_bytes
        self.empties_cache = ctx.scenario.runtime.empty_cache_each_phase
        self.reserves: defaultdict[Stream, AllocatorReserve] | None = None
        """Per CUDA stream, what the caching allocator has reserved since the phase emptied
        the cache (None when it did not: see `reserve_s`)."""
        self.deferred_host_s = 0.0
        """Host time of allocations made where the host does not yield (an all-gather's
        buffers), paid with the collective launches (`pay_launches`)."""

    def stream(self, name: Stream) -> InOrderStream:
        if name not in self.streams:
            self.streams[name] = InOrderStream(self.env, self.rank, name, self.ctx.spans,
                                               self._tag)
        return self.streams[name]

    def _tag(self) -> tuple[str, int]:
        return self.phase, self.micro

    @property
    def distributed(self) -> bool:
        return len(self.ranks) > 1

    def next_key(self, kind: str, group: tuple[int, ...] | None = None
                 ) -> tuple[str, int] | tuple[str, int, int]:
        """Collective keys: every rank issues collectives of a kind in the same order. Those
        over a group short of every rank also name it by its first rank: `group`, or by
        default the rank's shard group (MiCS)."""
        seq = self._seq.get(kind, 0)
        self._seq[kind] = seq + 1
        tag = self._group_key if group is None else group[0]
        if tag is None:
            return kind, seq
        return kind, seq, tag

    # ------------------------------------------------------------------ phases

    def begin(self, phase: Phase, micro: int) -> None:
        self.phase, self.micro = phase._value_, micro
        self.in_phase = True
        self._phase_start = self._timer_start()
        self._held_at_start = self.sms.held
        self.gpu.reset_window()
        if self.empties_cache:
            self.reserves = defaultdict(AllocatorReserve)

    def end(self, *, host_waits: bool = True, left_running: frozenset[Stream] = frozenset()
            ) -> Gen:
        """Wait until every stream of this rank is idle, then record the phase as DeepSpeed's
        timers measure it (`utils/timer.py`, 0.13.3: `Timer.start` and `stop` record a CUDA
        event on the current stream; the CUDA accelerator keeps no host timers).

        A phase whose host code ends by waiting for its work (`host_waits`: the backward's
        epilogue, the step's last copies) ends when all of it is done. The forward's does not:
        its timer stops when the compute stream has run the forward's kernels, and what is
        still in flight on other streams (the last prefetches, which feed the backward) falls
        in the next phase, whose timer starts then (`_timer_start`) and whose first kernels wait
        for it. Streams in `left_running` are work the host neither waited for nor queued
        before the timer stopped (a helper thread's): it runs on past the phase's end."""
        compute_done = None
        if not host_waits:
            if (pending := self.compute.idle_event()) is not None:
                yield pending
            compute_done = self.env.now
        yield from self.synchronize(left_running)
        end_s = self.env.now if compute_done is None else compute_done
        self._timer_handover = (self.env.now, end_s)
        self.ctx.phases.add((self.rank, self.phase, self.micro, self._phase_start, end_s,
                             self.gpu.used, self.gpu.window_peak,
                             self.sms.held - self._held_at_start))
        self.in_phase = False

    def _timer_start(self) -> float:
        """When the phase's timer starts: where the last phase's timer stopped, when this phase
        begins at once after it (the engine's host waited there for other streams, which
        DeepSpeed's host would not have; the phase's compute waits for them instead); else
        the host's time."""
        handover, self._timer_handover = self._timer_handover, None
        if handover is not None and handover[0] == self.env.now:
            return handover[1]
        return self.env.now

    def wait_for_stream(self, stream: InOrderStream, syncs: int) -> Gen:
        """`syncs` blocking copies on `stream` (a scalar made on the GPU from Python: PyTorch
        copies it and synchronises the stream): the host waits until the stream has run all
        it was given, then pays each copy's dispatch as a launch."""
        if (pending := stream.idle_event()) is not None:
            yield pending
        yield from self.issue_kernels(syncs)

    def synchronize(self, left_running: frozenset[Stream] = frozenset()) -> Gen:
        while True:
            pending = [e for name, s in self.streams.items()
                       if name not in left_running and (e := s.idle_event()) is not None]
            if not pending:
                return
            yield AllDone(self.env, pending)

    # ------------------------------------------------------------------ helpers

    def when_done(self, event: simpy.Event | None, action: Callable[[], None]) -> None:
        """Run `action` once `event` has completed (at once if it already has); not when it
        failed (an op that ran out of memory): what the action releases was never made, and
        the run is ending with the failure."""
        if event is None or event.callbacks is None:
            if event is None or event.ok:
                action()
        else:
            event.callbacks.append(lambda done: action() if done.ok else None)

    @property
    def reduction_stream(self) -> InOrderStream:
        """Where gradients are bucketed, reduced and partitioned: DeepSpeed's reduction stream
        with `overlap_comm`, else the default stream, in line with compute."""
        return self.stream(Stream.REDUCE) if self.ds.overlap_comm else self.compute

    def gpu_kernel(self, seconds: float, stream: InOrderStream) -> Iterable[simpy.Event]:
        """A GPU kernel of `seconds` (alone on the GPU) run by an op on `stream`, to
        `yield from`: the SMs are shared between streams (`SharedSMs`)."""
        if stream is self.compute:
            return self.sms.compute(seconds)
        return self.sms.side(seconds)

    @staticmethod
    def no_kernel() -> tuple[simpy.Event, ...]:
        """The body of an op that only orders its stream (a wait on other events): nothing
        runs on the SMs."""
        return ()

    def gpu_time(self, seconds: float, stream: InOrderStream) -> Body:
        """An op's body that runs one GPU kernel of `seconds` on `stream`."""
        return lambda: self.gpu_kernel(seconds, stream)

    def hbm_seconds(self, nbytes: float, passes: float = 2.0) -> float:
        return costs.hbm_copy_s(nbytes, self.profile, passes=passes)

    def hbm_op(self, stream: InOrderStream, op: str, kind: OpKind, nbytes: float, *,
               passes: float = 2.0, after: tuple[simpy.Event | None, ...] = ()
               ) -> simpy.Event:
        """A device-local copy or elementwise kernel on `stream`."""
        return stream.launch(op, self.gpu_time(self.hbm_seconds(nbytes, passes), stream),
                             kind=kind, after=after, nbytes=nbytes)

    def dma(self, direction: Direction, nbytes: float, *, pinned: bool, op: str, kind: OpKind,
            buffer: costs.HostBytes = costs.HOME_PAGES) -> Gen:
        """A host<->device copy, also drawn on the rank's copy-engine track."""
        start = self.env.now
        yield from self.machine.dma(self.rank, direction, nbytes, pinned=pinned, buffer=buffer,
                                    label=self.label_prefix + op)
        self.ctx.spans.add((self.rank, _PCIE_TRACK[direction], self.phase, self.micro,
                            op + _DMA_SUFFIX[pinned], start, self.env.now, nbytes, kind._value_,
                            _HOST_BUFFER[pinned]))

    def nvme_io(self, direction: Literal["read", "write"], nbytes: float, *, op: str,
                kind: OpKind) -> Gen:
        """An aio transfer between the node's NVMe drives and a pinned swap buffer, drawn on
        the rank's NVMe track (in the phase it was issued in: the boundary's gradient writes
        end during the step that waits for them)."""
        start, phase, micro = self.env.now, self.phase, self.micro
        io = self.machine.nvme_read if direction == "read" else self.machine.nvme_write
        yield from io(self.rank, nbytes, label=self.label_prefix + op)
        track = Stream.NVME_READ if direction == "read" else Stream.NVME_WRITE
        self.ctx.spans.add((self.rank, track._value_, phase, micro, op, start, self.env.now,
                            nbytes, kind._value_, BufferKind.NVME._value_))

    def cpu_work(self, op: str, kind: OpKind, work: Gen, nbytes: float = 0.0,
                 track: Stream = Stream.CPU, tag: tuple[str, int] | None = None) -> Gen:
        """CPU work done by the thread running it (it blocks that thread), drawn on `track`
        (`cpu` for the rank's main thread), in the phase it ends in unless `tag` (phase,
        micro-batch) names the one it belongs to."""
        start = self.env.now
        yield from work
        phase, micro = tag if tag is not None else (self.phase, self.micro)
        self.ctx.spans.add((self.rank, track._value_, phase, micro, op, start,
                            self.env.now, nbytes, kind._value_, ""))

    def gets_fresh_pages(self, nbytes: float) -> bool:
        """Whether a new host temporary of `nbytes` gets fresh pages, which the kernel zeroes
        on first touch: the C allocator serves one below the stack's `heap_reuse_bytes` (its
        mmap threshold) from its heap, on pages an earlier temporary already faulted in, and
        maps the others anew. One of exactly the threshold is mapped too: glibc compares the
        request with its header and alignment added (`sysmalloc`: nb >= mmap_threshold)."""
        return nbytes > 0 and nbytes >= self.heap_reuse_bytes

    def zero_fresh_pages(self, nbytes: float, *, threads: float,
                         where: costs.HostBytes = costs.HOME_PAGES) -> Gen:
        """The kernel zeroing a new host temporary's pages, when they are fresh."""
        if self.gets_fresh_pages(nbytes):
            yield from self.machine.zero_pages(self.rank, nbytes, threads=threads, where=where)

    def download_with_cpu_cast(self, elements: int, source_bytes: int, cast: costs.HostBytes,
                               *, name: str, copy_op: str, cast_op: str, kind: OpKind) -> Gen:
        """PyTorch's blocking cross-dtype D2H (`cpu_dst.copy_(gpu_src)`, the conversion on the
        CPU): a D2H into a pageable temporary of the source's dtype (`source_bytes` per
        element), whose pages the driver's staging thread faults in first when they are
        fresh, then a cast into the destination on the rank's pool (`cast`: what it touches
        per element); the temporary goes."""
        nbytes = source_bytes * elements
        temp = self.host.allocate(Category.PAGEABLE_TEMPORARIES, nbytes, f"temp {name}")
        if self.gets_fresh_pages(nbytes):
            yield from self.cpu_work(f"zero pages {name}", OpKind.ZERO_PAGES,
                                     self.machine.zero_pages(self.rank, nbytes, threads=1,
                                                             label=f"zero pages {name}"),
                                     nbytes=nbytes)
        yield from self.dma("d2h", nbytes, pinned=False, op=copy_op, kind=kind)
        yield from self.cpu_work(cast_op, OpKind.CAST,
                                 self.machine.elementwise(self.rank, elements, cast,
                                                          threads=self.profile.cast_threads),
                                 nbytes=nbytes)
        self.host.free(Category.PAGEABLE_TEMPORARIES, temp)

    def collective(self, kind: Collective, nbytes: float) -> Gen:
        """Join the next collective of `kind` over every rank (the host waits for it). Where
        the run keeps every record, the wait is a span of `Stream.HOST` (op kind the
        collective's), from the join to the collective's end: the same events either way."""
        joined = self.machine.collective(self.rank, self.next_key(kind), kind, nbytes,
                                         self.ranks)
        return self._host_wait(joined, OpKind(kind._value_)) if self.ctx.record_host else joined

    def _host_wait(self, waits: Gen, kind: OpKind) -> Gen:
        """`waits` delegated whole, then recorded as the host's wait for them."""
        start = self.env.now
        phase = self.phase if self.in_phase else Phase.BETWEEN._value_
        yield from waits
        self.ctx.spans.add((self.rank, Stream.HOST._value_, phase, self.micro, kind._value_,
                            start, self.env.now, 0.0, kind._value_, ""))

    def host_time(self, seconds: float, kind: OpKind, *,
                  malloc_s: float = 0.0) -> Waits:
        """The rank's host thread busy for `seconds` (Python, dispatch, bookkeeping) doing
        `kind` of work, the first `malloc_s` of it in `cudaMalloc`, to `yield from`: its one
        timeout, or none, in a tuple rather than a generator. The same event at the same
        point, without a generator per call (a third of a run's timeouts); `yield from` a
        tuple works as the engine's timeouts carry no value. Where the run keeps every record
        the work is a span of `Stream.HOST` (`_record_host`)."""
        if seconds <= 0:
            return ()
        if self.ctx.record_host:
            self._record_host(seconds, kind, malloc_s)
        return (self.env.timeout(seconds),)

    def _record_host(self, seconds: float, kind: OpKind, malloc_s: float) -> None:
        """The span of host work begun now: it ends at `now + seconds`, the instant its timeout
        fires (`Environment._timeout` schedules it there), its `cudaMalloc` a span of its own
        before it. Outside a phase it belongs to `Phase.BETWEEN`."""
        now, text = self.env.now, kind._value_
        phase = self.phase if self.in_phase else Phase.BETWEEN._value_
        host, spans = Stream.HOST._value_, self.ctx.spans
        begin = now
        if malloc_s > 0:
            begin = now + malloc_s
            spans.add((self.rank, host, phase, self.micro, OpKind.CUDA_MALLOC._value_, now,
                       begin, 0.0, OpKind.CUDA_MALLOC._value_, ""))
        spans.add((self.rank, host, phase, self.micro, text, begin, now + seconds, 0.0, text,
                   ""))

    def report_memory(self, calls: int = 1) -> Gen:
        """`calls` of DeepSpeed's `see_memory_usage(..., force=memory_breakdown)` in a row
        (runtime/engine.py: before and after each forward, backward and step, outside their
        timers; utils.py: `gc.collect()` first), the GIL held throughout. Right after a phase
        they begin where its timer stopped: the engine's host waited there for what the
        forward left in flight (`end`), DeepSpeed's went on to the reports meanwhile; if that
        wait outlasted them, the next phase's timer starts where they ended."""
        if self.memory_report_s <= 0:
            return
        begin = self.env.now
        if self._timer_handover is not None and self._timer_handover[0] == begin:
            begin = self._timer_handover[1]
        done = begin + calls * self.memory_report_s
        if done <= self.env.now:
            self._timer_handover = (self.env.now, done)
            return
        if self.ctx.record_host:
            self._record_host(done - self.env.now, OpKind.MEMORY_REPORT, 0.0)
        self.gil.hold()
        yield self.env.timeout(done - self.env.now)
        self.gil.release()

    def fetch_hooks(self, modules: int = 1, *, apart: int = 1, repeats: int = 0) -> Waits:
        """Host time of ZeRO-3's pre/post hooks around a module that owns parameters, around
        a leaf that holds `modules` such modules (`SoftwareStack.leaf_hook_share`), or around
        a tiled call's `apart` such modules, each hooked, with `repeats` more calls on
        parameters already gathered (`SoftwareStack.repeat_hook_share`)."""
        return self.host_time(self.fetch_hook_s * (1 + self.leaf_hook_share * (modules - 1)
                                                   + (apart - 1)
                                                   + self.repeat_hook_share * repeats),
                              OpKind.HOOKS)

    def reserve_s(self, nbytes: float, stream: Stream = Stream.COMPUTE) -> float:
        """Host seconds `cudaMalloc` takes for `nbytes` asked of the CUDA cache on `stream`:
        none, except in a phase that began by emptying it (`begin`), for the growth beyond
        what the phase has already reserved for that stream. PyTorch's caching allocator
        serves a stream's requests only from blocks freed on that stream, so DeepSpeed's
        all-gather stream (gathered parameters, flat all-gather buffers) reserves its own.
        Without emptying, the cache holds the previous iteration's reserve."""
        if self.reserves is None:
            return 0.0
        return self.reserves[stream].allocate(nbytes) / self.profile.cuda_malloc_Bps

    def release_device_memory(self, nbytes: float, stream: Stream = Stream.COMPUTE) -> None:
        """Device memory back to the CUDA cache of `stream` (see `reserve_s`)."""
        if self.reserves is not None:
            self.reserves[stream].free(nbytes)

    def issue_kernels(self, launches: int, device_bytes: float = 0.0) -> Waits:
        """Host time to launch a module's kernels (`launches` of them), with the `cudaMalloc`
        of the device memory they ask for (`device_bytes`; `reserve_s`), as PyTorch
        allocates an op's outputs when it launches it; the GPU runs them once queued."""
        malloc_s = self.reserve_s(device_bytes)
        return self.host_time(launches * self.kernel_launch_s + malloc_s, OpKind.LAUNCH,
                              malloc_s=malloc_s)

    def pay_launches(self) -> Waits:
        """Host time of the collectives launched since the last call (ZeRO's, then the plain
        calls among them: `plain_launches`), with the `cudaMalloc` of their buffers
        (`deferred_host_s`)."""
        launches, self.launches = self.launches, 0
        plain, self.plain_launches = self.plain_launches, 0
        deferred, self.deferred_host_s = self.deferred_host_s, 0.0
        return self.host_time(launches * self.collective_launch_s
                              + plain * self.plain_collective_s + deferred,
                              OpKind.COLLECTIVE_LAUNCH)

    # ------------------------------------------------------------------ compute

    def forward_body(self, index: int, seconds: float, activation_bytes: float) -> Body:
        """A module's forward (or recompute): its saved activations are allocated when it
        starts and held until its backward; its workspace only while it runs."""
        module = self.plan.modules[index]

        def body() -> Gen:
            saved = self.gpu.allocate(Category.ACTIVATIONS, activation_bytes, module.name)
            self.activations[index] = self.activations.get(index, 0) + saved
            workspace = self.gpu.allocate(Category.WORKSPACE, module.transient_bytes,
                                          module.name)
            yield from self.sms.compute(seconds)
            self.gpu.free(Category.WORKSPACE, workspace)
        return body

    def launch_with_exchanges(self, index: int, body: Body, label: str, kind: OpKind, *,
                              backward: bool, after: tuple[simpy.Event | None, ...] = ()
                              ) -> Gen:
        """Launch module `index`'s op `body` on the compute stream with the collectives it
        runs in line over the rank's sequence-parallel group (`Module.exchanges`), each an op
        of its own before or after it; a backward runs the gradients' ones in the reverse
        order (the forward's after ones first). The host pays each call's launch
        (`plain_collective_s`) as it issues them, all with the module. Returns the module op's
        event."""
        module = self.plan.modules[index]
        exchanges = module.exchanges
        if backward:
            exchanges = tuple(e for e in reversed(exchanges) if e.backward)
        if not exchanges:
            return self.compute.launch(label, body, kind=kind, after=after)
        yield from self.host_time(len(exchanges) * self.plain_collective_s,
                                  OpKind.COLLECTIVE_LAUNCH)
        group = self.ctx.groups.sequence[self.rank]
        ops = [(self.next_key(f"ulysses {e.kind}", group), e) for e in exchanges]
        first = [op for op in ops if op[1].after == backward]
        for key, exchange in first:
            self._launch_exchange(key, exchange, module.name, group, after)
            after = ()
        done = self.compute.launch(label, body, kind=kind, after=after)
        for key, exchange in ops:
            if exchange.after != backward:
                self._launch_exchange(key, exchange, module.name, group, ())
        return done

    def _launch_exchange(self, key: tuple[Any, ...], exchange: Exchange, module: str,
                         group: tuple[int, ...], after: tuple[simpy.Event | None, ...]) -> None:
        self.compute.launch(
            f"ulysses {exchange.kind} {exchange.tensor} {module}",
            lambda: self.machine.collective(self.rank, key, exchange.kind, exchange.nbytes,
                                            group),
            kind=EXCHANGE_KINDS[exchange.kind], after=after, nbytes=exchange.nbytes)

    def backward_body(self, index: int, seconds: float,
                      on_end: Callable[[], None] | None = None) -> Body:
        """A module's backward: holds its backward workspace while it runs, frees its
        activations and produces its gradients at the end."""
        module = self.plan.modules[index]

        def body() -> Gen:
            workspace = self.gpu.allocate(Category.WORKSPACE, module.backward_transient_bytes,
                                          module.name)
            yield from self.sms.compute(seconds)
            self.gpu.free(Category.WORKSPACE, workspace)
            self.gpu.free(Category.ACTIVATIONS, self.activations.pop(index, 0))
            if on_end is not None:
                on_end()
        return body


