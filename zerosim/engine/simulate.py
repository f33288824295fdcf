"""Run one iteration of a scenario: build the machine, start the ranks, collect the records."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, field, replace
from heapq import heappop, heappush
from typing import Any

import simpy
from simpy.events import NORMAL, URGENT, Initialize, Process, Timeout

from zerosim.engine.compose import build_rank
from zerosim.engine.conditions import AllDone
from zerosim.engine.flows import RateChange
from zerosim.engine.machine import Machine, network_shapes
from zerosim.engine.memory import MemoryPool, NodePool, OutOfMemory
from zerosim.engine.plan import Plan, plan_of
from zerosim.engine.rank import RunContext
from zerosim.engine.records import MemorySample, PeerWait, PhaseSpan, Span, Table, with_copies
from zerosim.engine.states import node_holdings
from zerosim.engine.symmetry import rank_classes
from zerosim.hardware.placement import folded_nodes, place_ranks, simulated_rank_count
from zerosim.scenario import Scenario
from zerosim.vocabulary import DeviceKind, Status, Stream, device_name

COPY_ENGINE_STREAMS = frozenset(s for s in Stream if s.is_copy_engine)
_new_timeout = Timeout.__new__
_new_initialize = Initialize.__new__


class LeanProcess(Process):
    """SimPy's `Process` with the same `_resume` steps, minus what the engine never reads:
    it does not track `env.active_process`, looks its generator up once per resume and
    schedules its own end straight into the queue of events due now (`Environment.schedule`
    at normal priority without delay). The engine resumes a process for most of its events."""

    def _resume(self, event: simpy.Event) -> None:
        send = self._generator.send
        while True:
            try:
                event = send(event._value) if event._ok else self._throw(event)
            except StopIteration as stop:
                self._ok, self._value = True, (stop.args[0] if stop.args else None)
                self.env.soon.append(self)
                return
            except BaseException as error:
                error.__traceback__ = error.__traceback__.tb_next
                self._ok, self._value = False, error
                self.env.soon.append(self)
                return
            try:
                callbacks = event.callbacks
            except AttributeError:
                raise RuntimeError(f'Invalid yield value "{event}"') from None
            if callbacks is not None:
                callbacks.append(self._resume)
                self._target = event
                return

    def _throw(self, event: simpy.Event) -> simpy.Event:
        """Hand a failed event to the generator, as SimPy does: its own copy of the error."""
        event._defused = True
        error = type(event._value)(*event._value.args)
        error.__cause__ = event._value
        return self._generator.throw(error)


_new_process = LeanProcess.__new__


@dataclass
class RawRun:
    """The records of one run, before they become DataFrames."""

    scenario: Scenario
    plan: Plan
    status: str
    spans: Table[Span]
    phases: Table[PhaseSpan]
    memory: Table[MemorySample]
    """Empty when the run was asked for its summary only."""
    links: Table[RateChange]
    """Empty when the run was asked for its summary only."""
    capacities: dict[str, int]
    peaks: dict[str, int]
    oom: dict | None = None
    events: int | None = None
    """SimPy events processed (when asked; None after an OOM)."""
    checks: list[str] = field(default_factory=list)
    node_copies: tuple[int, ...] = (1,)
    """How many of the run's nodes each simulated node stands for (`node_copies`): node 0
    for every full node, a partly filled last node (simulated as node 1) for itself. The
    tables hold the simulated ranks and devices; totals over every rank weigh each node's by
    it."""
    stands_for: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Each simulated rank, with the ranks of its node it stands for, itself first
    (`folded_classes`; empty: every rank of the tables stands for itself alone). The tables
    hold the simulated ranks and their GPUs; host and NVMe levels are the node's, every rank
    of it counted."""
    gpus_for: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Each simulated rank's GPU, with the GPUs of the ranks it stands for, itself first."""
    peer_waits: Table[PeerWait] = field(default_factory=lambda: Table(PeerWait))
    """Each simulated rank that reached a collective before the last of its peers, where
    the host thread is recorded (what a critical path follows from rank to rank); empty
    otherwise."""

    def every_rank(self) -> RawRun:
        """This run with its tables, capacities and peaks given for every rank of the
        simulated node(s): each simulated rank's rows copied for the ranks it stands for,
        whose timelines are equal to its own (`symmetry`)."""
        if not self.stands_for:
            return self
        gpus = self.gpus_for
        return replace(
            self, spans=with_copies(self.spans, 0, self.stands_for),
            phases=with_copies(self.phases, 0, self.stands_for),
            peer_waits=with_copies(self.peer_waits, 0, self.stands_for),
            memory=with_copies(self.memory, 1, gpus),
            capacities=_for_every_gpu(self.capacities, gpus),
            peaks=_for_every_gpu(self.peaks, gpus), stands_for={}, gpus_for={})


def _for_every_gpu(values: dict[str, int], gpus: dict[str, tuple[str, ...]]) -> dict[str, int]:
    return {other: value for device, value in values.items()
            for other in gpus.get(device, (device,))}


class Environment(simpy.Environment):
    """SimPy's environment with the events due now kept out of its heap, in two queues.

    SimPy processes events by (time, priority, insertion). Urgent events (a process start) are
    always due now and come before anything else; events due now at normal priority and
    scheduled now (a succeeded event, a zero timeout) come after every event already in the
    heap for now, which was inserted earlier, and among themselves in insertion order. So the
    two queues give exactly SimPy's order, without a heap push and pop for most events.
    `run_until` drives it (SimPy's `step` and `run` would not see the queues).

    `now` is a plain attribute rather than SimPy's property (the engine reads the clock for
    most events); `run_until` keeps it equal to `_now`.
    """

    now: float = 0.0

    def __init__(self) -> None:
        super().__init__()
        self.now = self._now
        self.urgent: deque[simpy.Event] = deque()
        self.soon: deque[simpy.Event] = deque()
        self.timeout = self._timeout  # SimPy binds its own per instance
        self.process = self._process

    def schedule(self, event: simpy.Event, priority: int = NORMAL, delay: float = 0) -> None:
        at = self._now + delay
        if at != self._now:
            heappush(self._queue, (at, priority, next(self._eid), event))
        elif priority == URGENT:
            self.urgent.append(event)
        else:
            self.soon.append(event)

    def _timeout(self, delay: float = 0, value: Any = None) -> Timeout:
        """SimPy's `Timeout(env, delay, value)` and its scheduling, inlined: the engine makes
        one per host step, GPU kernel and flow wake-up."""
        if delay < 0:
            raise ValueError(f"Negative delay {delay}")
        event = _new_timeout(Timeout)
        event.env = self
        event.callbacks = []
        event._value = value
        event._delay = delay
        event._ok = True
        now = self.now
        at = now + delay
        if at != now:
            heappush(self._queue, (at, NORMAL, next(self._eid), event))
        else:
            self.soon.append(event)
        return event

    def _process(self, generator: Generator[simpy.Event, Any, Any]) -> Process:
        """SimPy's `Process(env, generator)` and its `Initialize` event, inlined: the engine
        starts one per stream op."""
        if not hasattr(generator, "throw"):
            raise ValueError(f"{generator} is not a generator.")
        process = _new_process(LeanProcess)
        process.env = self
        process.callbacks = []
        process._generator = generator
        start = _new_initialize(Initialize)
        start.env = self
        start.callbacks = [process._resume]
        start._value = None
        start._ok = True
        self.urgent.append(start)
        process._target = start
        return process


def run_until(env: Environment, until: simpy.Event) -> int:
    """`env.run(until)` for `Environment`: the same events in the same order, as one loop.
    Returns the events processed."""
    queue, processed, now = env._queue, 0, env._now
    urgent, soon = env.urgent, env.soon
    next_urgent, next_soon = urgent.popleft, soon.popleft
    while until.callbacks is not None:
        if urgent:
            event = next_urgent()
        elif queue and queue[0][0] == now:
            event = heappop(queue)[3]
        elif soon:
            event = next_soon()
        elif queue:
            now, _, _, event = heappop(queue)
            env._now = env.now = now
        else:
            raise RuntimeError(f"no scheduled event left before {until!r}")
        processed += 1
        callbacks, event.callbacks = event.callbacks, None
        for callback in callbacks:
            callback(event)
        if not event._ok and not hasattr(event, "_defused"):
            failure = type(event._value)(*event._value.args)
            failure.__cause__ = event._value
            raise failure
    return processed


def _pools(env: simpy.Environment, machine: Machine, log: Table[MemorySample] | None
           ) -> dict[str, MemoryPool]:
    """A pool per simulated GPU, per node for its host memory and its drives (`NodePool`
    when a simulated rank stands for mirror ranks)."""
    profile = machine.profile
    node_pool = NodePool if machine.folds_ranks else MemoryPool
    pools = {}
    for placement in machine.simulated:
        pools[placement.device] = MemoryPool(placement.device, profile.hbm_bytes,
                                             lambda: env.now, log)
        if placement.host_device not in pools:
            pools[placement.host_device] = node_pool(
                placement.host_device, profile.host_memory_bytes, lambda: env.now, log)
            if profile.has_nvme:
                nvme = device_name(DeviceKind.NVME, placement.node)
                pools[nvme] = node_pool(nvme, profile.nvme_bytes_per_node, lambda: env.now, log)
    return pools


def simulated_ranks(scenario: Scenario, *, fold: bool = True) -> int:
    """Ranks the engine runs: node 0's standing for every full node, and a partly filled last
    node's beside them (`placement.folded_nodes`); every rank with `fold` off."""
    ranks = scenario.data_parallel
    return simulated_rank_count(ranks, scenario.hardware.gpus_per_node) if fold else ranks


def node_copies(scenario: Scenario, *, fold: bool = True) -> tuple[int, ...]:
    """How many of the run's nodes each simulated node stands for (`RawRun.node_copies`)."""
    per_node = scenario.hardware.gpus_per_node
    if not fold:
        return (1,) * -(-scenario.data_parallel // per_node)
    return folded_nodes(scenario.data_parallel, per_node)


def folded_classes(scenario: Scenario, *, fold: bool = True) -> tuple[tuple[int, ...], ...]:
    """The classes of the ranks `simulated_ranks` places: the engine simulates the first rank
    of each, standing for the class. Mirror ranks of one node (`symmetry.rank_classes`) share
    a class; every rank is its own class when `fold` is off or the placed ranks span several
    nodes (a partly filled last node)."""
    placed = place_ranks(scenario.hardware, simulated_ranks(scenario, fold=fold),
                         bound=scenario.runtime.bind_cores_to_rank,
                         core_order=scenario.runtime.bind_core_list)
    if not fold:
        return tuple((pl.rank,) for pl in placed)
    return rank_classes(scenario.hardware, placed)


def run_engine(scenario: Scenario, *, count_events: bool = False, full: bool = True,
               fold: bool = True, observer: Callable[[RunContext], None] | None = None,
               host_spans: bool | None = None) -> RawRun:
    """Simulate one iteration. `full=False` keeps only what the summary needs: no memory log
    and no link rates (the timeline is the same). The host thread's work is recorded as spans
    (`Stream.HOST`) with every record, or as `host_spans` says (what a critical path needs
    beside the other spans; the same events either way). `fold=False` simulates every rank, even on
    identical nodes or mirror ranks of a node (see `simulated_ranks`, `folded_classes`); a
    run that folds mirror ranks is simulated again without when it could differ from the full
    simulation (`_exact`). `observer(ctx)` is called just before the simulation starts (a
    progress line)."""
    placed = simulated_ranks(scenario, fold=fold)
    classes = folded_classes(scenario, fold=fold)
    copies = node_copies(scenario, fold=fold)
    host = full if host_spans is None else host_spans
    raw, pools = _simulate(scenario, placed, classes, copies, count_events, full, host,
                           observer)
    if not _exact(raw, pools):
        alone = tuple((rank,) for rank in range(placed))
        raw, pools = _simulate(scenario, placed, alone, copies, count_events, full, host,
                               observer)
    return raw


def _exact(raw: RawRun, pools: dict[str, MemoryPool]) -> bool:
    """Whether a run equals the full simulation: always, unless it folded mirror ranks and
    either ran out of memory (which allocation fails first depends on the order of the
    ranks' changes within an instant) or a node pool's peak could depend on that order
    (`NodePool.order_free`)."""
    if not raw.stands_for:
        return True
    return raw.status == Status.OK and all(pool.order_free for pool in pools.values()
                                      if isinstance(pool, NodePool))


def _simulate(scenario: Scenario, simulated: int, classes: tuple[tuple[int, ...], ...],
              copies: tuple[int, ...], count_events: bool, full: bool, host_spans: bool,
              observer: Callable[[RunContext], None] | None
              ) -> tuple[RawRun, dict[str, MemoryPool]]:
    env = Environment()
    plan = plan_of(scenario)
    threads, bound = scenario.runtime.cpu_threads_per_rank, scenario.runtime.bind_cores_to_rank
    order = scenario.runtime.bind_core_list
    waits = Table(PeerWait)
    machine = Machine(env, scenario.hardware, simulated, threads, bound=bound,
                      core_order=order, record_rates=full, classes=classes,
                      shapes=network_shapes(scenario.hardware, simulated, threads, classes,
                                            bound, order),
                      run_nodes=tuple(sum(copies[:node]) for node in range(len(copies))),
                      peer_waits=waits if host_spans else None)
    log = Table(MemorySample)
    pools = _pools(env, machine, log if full else None)
    ctx = RunContext(env, scenario, machine, plan, pools, memory_log=log,
                     record_host=host_spans)
    ranks = [env.process(build_rank(ctx, rank).run()) for rank in machine.stands_for]
    if observer is not None:
        observer(ctx)
    status, oom, events = Status.OK, None, None
    try:
        _node_holdings(machine, pools, hold=True)
        events = run_until(env, AllDone(env, ranks))
    except OutOfMemory as err:
        status, oom = Status.OOM, err.to_dict()
    links = machine.flows.rate_table()
    raw = RawRun(scenario, plan, status, ctx.spans, ctx.phases, log, links,
                 {name: pool.capacity for name, pool in pools.items()},
                 {name: pool.peak for name, pool in pools.items()}, oom,
                 events if count_events else None,
                 node_copies=copies, peer_waits=waits, **_folding(machine))
    if status == Status.OK:
        machine.assert_idle()
        _node_holdings(machine, pools, hold=False)
        raw.checks = check_invariants(raw, pools)
    return raw, pools


def _node_holdings(machine: Machine, pools: dict[str, MemoryPool], *, hold: bool) -> None:
    """What each simulated node's host memory holds for the whole run (`node_holdings`):
    taken before the ranks start, given back after them so that the end-of-run check finds
    every allocation freed."""
    for host in dict.fromkeys(placement.host_device for placement in machine.simulated):
        for held in node_holdings(machine.profile):
            if hold:
                pools[host].allocate(held.category, held.nbytes, held.what, held.buffer)
            else:
                pools[host].free(held.category, round(held.nbytes), held.buffer)


def _folding(machine: Machine) -> dict[str, dict]:
    """`RawRun.stands_for` and `RawRun.gpus_for` of a run that folded mirror ranks."""
    if not machine.folds_ranks:
        return {}
    device = {pl.rank: pl.device for pl in machine.placements}
    return {"stands_for": dict(machine.stands_for),
            "gpus_for": {device[rank]: tuple(device[r] for r in members)
                         for rank, members in machine.stands_for.items()}}


def check_invariants(raw: RawRun, pools: dict[str, MemoryPool]) -> list[str]:
    """End-of-run checks (after ASTRA-sim): nothing in flight, every transient freed, no
    overlapping spans on an exclusive stream. Raises on a violation; returns what was checked."""
    leftovers = {f"{name}:{cat}": level for name, pool in pools.items()
                 for cat, level in pool.levels.items() if level != 0}
    if leftovers:
        raise RuntimeError(f"memory not freed at the end of the iteration: {leftovers}")
    spans = raw.spans
    if _in_order(spans):
        return list(CHECKS)
    starts, ends = spans.column(5), spans.column(6)
    by_stream: dict[tuple[int, str], list[int]] = {}
    for k, key in enumerate(zip(spans.column(0), spans.column(1), strict=True)):
        if key[1] not in COPY_ENGINE_STREAMS:
            by_stream.setdefault(key, []).append(k)
    for (rank, stream), rows in by_stream.items():
        rows.sort(key=lambda k: (starts[k], ends[k]))
        for before, after in itertools.pairwise(rows):
            if starts[after] < ends[before] - 1e-12:
                ops = spans.column(4)
                raise RuntimeError(f"rank {rank} stream {stream}: {ops[before]!r} and "
                                   f"{ops[after]!r} overlap")
    return list(CHECKS)


CHECKS = ("no flow or collective in flight", "every allocation freed",
          "no overlap on an in-order stream")


def _in_order(spans: Table[Span]) -> bool:
    """Whether each in-order stream's spans come in the order `check_invariants` sorts them
    in (by start, then end) and none starts before the one before it ended: one pass, no
    sort (an in-order stream records its ops in the order they ran). False sends the check
    the long way, which finds the overlap, if any."""
    last: dict[tuple[int, str], tuple[float, float]] = {}
    get = last.get
    keys = zip(spans.column(0), spans.column(1), strict=True)
    for key, start, end in zip(keys, spans.column(5), spans.column(6), strict=True):
        if key[1] in COPY_ENGINE_STREAMS:
            continue
        before = get(key)
        if before is not None:
            start_before, end_before = before
            if (start < end_before - 1e-12 or start < start_before
                    or (start == start_before and end < end_before)):
                return False
        last[key] = (start, end)
    return True
