"""Fluid flow sharing on top of SimPy, in the manner of SimGrid's LMM flow model.

SimPy only knows discrete events; it cannot share a bandwidth between concurrent transfers.
This module adds that layer. A *flow* is an amount of work that crosses a set of
:class:`SharedResource` objects; while it runs at rate ``r`` (units of work per second) it
consumes ``coefficient * r`` of each resource it crosses. Rates are assigned by weighted
max-min fairness (progressive filling) and recomputed whenever a flow starts or ends, for
the flows connected to it through shared resources only (max-min fairness decomposes over
connected components, so the other flows keep their rates); the earliest completion is then
(re)scheduled as a single SimPy timeout.

The module is generic: a resource is any capacity (a link in bytes/s, a memory system in
bytes/s, a pool of cores in FLOP/s) and a flow is any fluid piece of work.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import simpy

from zerosim.engine.records import Table

MEMO_SIZE = 100_000
"""Reallocations remembered (`Reallocations`) before the memo restarts."""
REL_TOL = 1e-12
"""Relative tolerance for "a resource is saturated", "a flow is finished" and "a rate changed".

Floating-point sums of rates and products of rate by elapsed time are exact only up to a
few ulps; without a tolerance a saturated resource or a finished flow could be missed by
one rounding step, which would cost an extra allocation round or an extra wake-up.
"""


@dataclass(eq=False)
class SharedResource:
    """A capacity shared by flows, e.g. ``"gpu0.pcie.h2d"`` in bytes/s.

    ``eq=False`` keeps identity equality and hashing, so two resources with the same
    fields are still distinct keys in a flow's usage mapping. The network copies the
    capacity when the resource is added; changing the field afterwards has no effect.
    """

    name: str
    capacity: float


@dataclass(frozen=True)
class FlowRecord:
    """One finished flow, as a flat record for results."""

    label: str
    start_s: float
    end_s: float
    amount: float
    resources: tuple[str, ...]


@dataclass(frozen=True)
class RateChange:
    """The usage of one resource changed at time ``t_s``.

    ``rate`` is the sum over active flows of ``coefficient * flow_rate`` on that resource.
    The usage is piecewise constant: it holds from ``t_s`` until the next change of the
    same resource.
    """

    t_s: float
    resource: str
    rate: float


class _Flow:
    """Mutable state of one active flow."""

    __slots__ = (
        "amount",
        "event",
        "label",
        "rate",
        "remaining",
        "resources",
        "serial",
        "shape",
        "start_s",
    )

    def __init__(
        self,
        serial: int,
        amount: float,
        shape: Usage,
        label: str,
        start_s: float,
        event: simpy.Event,
    ):
        self.serial = serial
        self.amount = amount
        self.remaining = amount
        self.shape = shape
        self.resources = shape.resources
        self.label = label
        self.start_s = start_s
        self.event = event
        self.rate = 0.0


def _allocate(flows: list[_Flow], capacities: list[float]) -> dict[int, float]:
    """Assign every flow its weighted max-min fair rate; return the usage per resource touched.

    Progressive filling in closed form: all unfrozen flows run at ``weight * t``; each round
    jumps ``t`` to the smallest level at which a resource saturates or a flow reaches its
    max_rate, and freezes the flows concerned at their rate there. A resource's load and usage
    are exact sums (`math.fsum`) of its flows' terms, so the result does not depend on the
    order the flows started in: two mirror-image flows always get the same rate, and a flow
    that stands for several alike (`FlowNetwork.usage` with copies) gets what each would get
    (mirror ranks: `symmetry.py`). Resources are keyed by their creation index.
    """
    if len(flows) == 1 and not flows[0].shape.repeats:
        return _allocate_alone(flows[0], capacities)
    # Per resource: the flows crossing it with their weighted coefficients, the frozen usage.
    crossing: dict[int, list[tuple[int, float]]] = {}
    frozen_usage: dict[int, list[float]] = {}
    for position, flow in enumerate(flows):
        weight = flow.shape.weight
        for idx, coef in flow.shape.pairs:
            crossing.setdefault(idx, []).append((position, coef * weight))
            frozen_usage[idx] = []
    unfrozen = set(range(len(flows)))
    level = 0.0
    while unfrozen:
        # Usage at level t is used + load * t; clamping to the current level keeps the level
        # monotone when rounding left a resource a hair over capacity.
        limits = {}
        for idx, terms in crossing.items():
            load = [term for position, term in terms if position in unfrozen]
            if load:
                limits[idx] = max(level, (capacities[idx] - math.fsum(frozen_usage[idx]))
                                  / math.fsum(load))
        flow_limit = min([flows[position].shape.level_limit for position in unfrozen])
        level = max(level, min(min(limits.values(), default=math.inf), flow_limit))
        threshold = level * (1.0 + REL_TOL)
        saturated = {idx for idx, limit in limits.items() if limit <= threshold}
        for position in sorted(unfrozen):
            flow = flows[position]
            if flow.shape.level_limit <= threshold or not saturated.isdisjoint(flow.resources):
                # Freeze the flow at its rate: its usage becomes fixed, its load leaves.
                rate = flow.shape.weight * level
                if flow.shape.max_rate is not None and flow.shape.max_rate < rate:
                    rate = flow.shape.max_rate
                flow.rate = rate
                for idx, coef in flow.shape.pairs:
                    frozen_usage[idx].append(coef * rate)
                unfrozen.discard(position)
    return {idx: math.fsum(terms) for idx, terms in frozen_usage.items()}


def _allocate_alone(flow: _Flow, capacities: list[float]) -> dict[int, float]:
    """:func:`_allocate` for a flow that shares no resource: one round, same arithmetic.

    Alone, the flow freezes at the lowest of its resources' saturation levels
    ``capacity / (coef * weight)`` and its own limit, exactly as in the general loop.
    """
    level, weight = flow.shape.level_limit, flow.shape.weight
    for idx, coef in flow.shape.pairs:
        limit = capacities[idx] / (coef * weight)
        if limit < level:
            level = limit
    rate = weight * level
    if flow.shape.max_rate is not None and flow.shape.max_rate < rate:
        rate = flow.shape.max_rate
    flow.rate = rate
    return {idx: coef * rate for idx, coef in flow.shape.pairs}


_Reallocation = tuple[tuple[int, ...] | None, tuple[float, ...], tuple[tuple[int, float], ...]]
"""What `FlowNetwork._reallocated` works out."""


class _State:
    """The shapes of the active flows, in start order (what a reallocation depends on), with
    where each change seen so far led: `started[shape]` and `finished[positions]` (the
    positions of the flows that ended, ascending) give the next state and the reallocation
    that change makes. Compared by identity: `Reallocations` makes one per distinct tuple of
    shapes."""

    __slots__ = ("finished", "shapes", "started")

    def __init__(self, shapes: tuple[Usage, ...]):
        self.shapes = shapes
        self.started: dict[Usage, tuple[_State, _Reallocation]] = {}
        self.finished: dict[tuple[int, ...], tuple[_State, _Reallocation]] = {}


class Reallocations:
    """The reallocations worked out by networks of the same resources and capacities, whose
    flows had the same shapes (`Usage` objects), to share and extend: a graph of the states
    met (`_State`), each change remembered once it has been worked out. A reallocation is a
    pure function of the active flows' shapes in start order and of the change (the flow
    started, or which ones ended), and the same few situations recur all run long, so a
    change already seen costs one look-up by the identity of a shape or by a few positions
    (rather than hashing every active shape). Restarts after `MEMO_SIZE` changes."""

    def __init__(self) -> None:
        self.size = 0
        self._states: dict[tuple[Usage, ...], _State] = {}
        self.empty = self.state(())

    def state(self, shapes: tuple[Usage, ...]) -> _State:
        """The one state of these shapes."""
        known = self._states.get(shapes)
        if known is None:
            known = self._states[shapes] = _State(shapes)
        return known

    def remember(self, table: dict[Any, tuple[_State, _Reallocation]], key: Any,
                 after: tuple[Usage, ...], reallocation: _Reallocation
                 ) -> tuple[_State, _Reallocation]:
        """Record that the change `key` of a state (`table`: its `started` or `finished`)
        leads to the state of shapes `after` with `reallocation`."""
        if self.size >= MEMO_SIZE:
            for state in self._states.values():
                state.started.clear()
                state.finished.clear()
            self.size = 0
        known = table[key] = (self.state(after), reallocation)
        self.size += 1
        return known


def _require_positive(what: str, value: float) -> None:
    if not 0 < value < math.inf:
        raise ValueError(f"{what} must be a finite number > 0, got {value!r}")


@dataclass(frozen=True, slots=True, eq=False)
class Usage:
    """A checked flow shape: sorted (resource index, coefficient) pairs, the max_rate and the
    weight. `FlowNetwork.usage` makes one; many flows alike can start from it. Compared by
    identity: it keys the network's memo of allocations.

    A flow may stand for several alike flows that always run at the same rate (mirror images
    of one another: `symmetry.py`); its pairs are then theirs together, and a
    resource two of them cross appears twice (`repeats`)."""

    pairs: tuple[tuple[int, float], ...]
    max_rate: float | None
    weight: float
    resources: tuple[int, ...]
    """The distinct resources crossed, in index order."""
    repeats: bool
    level_limit: float
    """Filling level at which the flow reaches its own max_rate."""

    @classmethod
    def of(cls, pairs: tuple[tuple[int, float], ...], max_rate: float | None, weight: float
           ) -> Usage:
        resources = tuple(sorted({idx for idx, _ in pairs}))
        return cls(pairs, max_rate, weight, resources, len(resources) < len(pairs),
                   math.inf if max_rate is None else max_rate / weight)


def _usage_pairs(
    index: Mapping[SharedResource, int],
    usage: Mapping[SharedResource, float],
    max_rate: float | None,
    weight: float,
) -> tuple[tuple[int, float], ...]:
    """A flow's usage as sorted (resource index, coefficient) pairs, after checking it."""
    _require_positive("weight", weight)
    if max_rate is not None:
        _require_positive("max_rate", max_rate)
    pairs = []
    for resource, coef in usage.items():
        idx = index.get(resource)
        if idx is None:
            raise ValueError(f"resource {resource!r} does not belong to this network")
        if not 0 < coef < math.inf:
            _require_positive(f"usage coefficient of resource {resource.name!r}", coef)
        pairs.append((idx, coef))
    if not pairs and max_rate is None:
        raise ValueError("a flow that uses no resource needs a max_rate, got max_rate=None")
    pairs.sort()
    return tuple(pairs)


class FlowNetwork:
    """Flows sharing resources under weighted max-min fairness, driven by a SimPy environment.

    On every change (a flow starts or ends) the remaining work of all active flows is
    advanced to ``env.now``, the rates of the flows connected to the change through shared
    resources are recomputed and one timeout is scheduled for the earliest completion.
    Timeouts made stale by a later change are ignored (SimPy cannot cancel an event, so a
    stale timeout still fires, and may still advance ``env.now`` once the network is idle;
    take makespans from the flow records, not from ``env.now`` after ``env.run()``).

    ``record_rates=False`` skips the per-resource usage log (:attr:`rate_changes`);
    ``keep_records=False`` skips :attr:`records`, and flow events then succeed with ``None``.
    ``memo``: the reallocations remembered by earlier networks of the same resources and
    capacities, whose flows had the same shapes (`Usage` objects), to share and extend.
    """

    def __init__(
        self, env: simpy.Environment, *, record_rates: bool = True, keep_records: bool = True,
        memo: Reallocations | None = None
    ):
        self._env = env
        self._record_rates = record_rates
        self._keep_records = keep_records
        self._resources: list[SharedResource] = []
        self._capacities: list[float] = []
        self._index: dict[SharedResource, int] = {}
        self._names: set[str] = set()
        self._active: list[_Flow] = []
        """The active flows, in start order."""
        self._serial = 0
        self._last_update = env.now
        self._wakeup: simpy.Event | None = None
        self._wakeup_at: float | None = None
        self._rates = _RateLog(env)
        self._memo = Reallocations() if memo is None else memo
        self._state = self._memo.empty
        """The active flows' shapes, in start order (what a reallocation depends on)."""
        self._shapes: dict[tuple[Any, ...], Usage] = {}
        """The shapes `start` has checked, by value: equal flows share one (and its memo)."""
        self.records: list[FlowRecord] = []
        self._wake = self._on_timeout
        self._record_usage = self._rates.note if record_rates else None

    def add_resource(self, name: str, capacity: float) -> SharedResource:
        if name in self._names:
            raise ValueError(f"duplicate resource name {name!r}")
        _require_positive(f"capacity of resource {name!r}", capacity)
        resource = SharedResource(name, capacity)
        self._index[resource] = len(self._resources)
        self._resources.append(resource)
        self._capacities.append(capacity)
        self._rates.add_resource(name)
        self._names.add(name)
        return resource

    def start(
        self,
        amount: float,
        usage: Mapping[SharedResource, float],
        *,
        max_rate: float | None = None,
        weight: float = 1.0,
        label: str = "",
    ) -> simpy.Event:
        """Start a flow of ``amount`` units of work; the event succeeds with its FlowRecord.

        While the flow runs at rate ``r`` it consumes ``usage[res] * r`` of each resource.
        ``max_rate`` bounds ``r``; ``weight`` sets the flow's share under contention.
        """
        key = (tuple(usage.items()), max_rate, weight)
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._shapes[key] = self.usage(usage, max_rate=max_rate, weight=weight)
        return self.start_usage(amount, shape, label=label)

    def usage(self, usage: Mapping[SharedResource, float], *, max_rate: float | None = None,
              weight: float = 1.0, copies: Iterable[Mapping[SharedResource, float]] = ()
              ) -> Usage:
        """`usage`, `max_rate` and `weight` checked once, for `start_usage`. `copies`: the
        usages of the flows alike that this one also stands for (same max_rate and weight,
        always the same rate): the flow then loads each resource as they all would."""
        pairs = _usage_pairs(self._index, usage, max_rate, weight)
        for copy in copies:
            pairs = tuple(sorted(pairs + _usage_pairs(self._index, copy, max_rate, weight)))
        return Usage.of(pairs, max_rate, weight)

    def start_usage(self, amount: float, usage: Usage, *, label: str = "") -> simpy.Event:
        """:meth:`start` with a flow shape checked before (:meth:`usage`)."""
        if not 0 <= amount < math.inf:
            raise ValueError(f"amount must be a finite number >= 0, got {amount!r}")
        flow_usage = usage.pairs
        now = self._env.now
        event = simpy.Event(self._env)
        if amount == 0:
            self._finish_record(amount, flow_usage, label, now, event)
            return event
        self._advance()
        serial = self._serial
        flow = _Flow(serial, amount, usage, label, now, event)
        self._serial = serial + 1
        self._active.append(flow)
        state = self._state
        known = state.started.get(usage)
        if known is None:
            known = self._memo.remember(state.started, usage, (*state.shapes, usage),
                                        self._reallocated([flow], flow.resources))
        self._settle(known)
        return event

    def rate_of(self, event: simpy.Event) -> float:
        """Current rate of the active flow started with ``event``."""
        for flow in self._active:
            if flow.event is event:
                return flow.rate
        raise ValueError(f"{event!r} is not an active flow of this network")

    @property
    def active_count(self) -> int:
        return len(self._active)

    @property
    def rate_changes(self) -> list[RateChange]:
        """Usage changes per resource, in time order, then resource creation order.

        Changes of one resource at one instant are coalesced into a single row holding the
        final value (several flows often start at the same instant).
        """
        return list(self._rates.changes())

    def rate_table(self) -> Table[RateChange]:
        """:attr:`rate_changes` as a `Table` (empty without ``record_rates``)."""
        return self._rates.changes()

    def assert_idle(self) -> None:
        """End-of-run invariant: raise RuntimeError if any flow is still in flight."""
        if not self._active:
            return
        in_flight = ", ".join(
            f"{flow.label or '<unlabelled>'} ({flow.remaining:g} of {flow.amount:g} left)"
            for flow in self._active
        )
        raise RuntimeError(f"{len(self._active)} flow(s) still in flight: {in_flight}")

    def _advance(self) -> None:
        """Bring every active flow's remaining work up to ``env.now``."""
        now = self._env.now
        elapsed = now - self._last_update
        if elapsed > 0:
            for flow in self._active:
                flow.remaining -= flow.rate * elapsed
            self._last_update = now

    def _settle(self, known: tuple[_State, _Reallocation] | None) -> None:
        """After a change (None: a wake-up that finished no flow): move to the state it leads
        to, give the flows of the changed component(s) their new rates (see `_reallocated`),
        then (re)schedule the wake-up for the earliest completion."""
        active = self._active
        if known is not None:
            self._state, (positions, rates, usage) = known
            if positions is None:
                for flow, rate in zip(active, rates, strict=True):
                    flow.rate = rate
            else:
                for position, rate in zip(positions, rates, strict=True):
                    active[position].rate = rate
            if self._record_usage is not None:
                self._record_usage(usage)
        if not active:
            self._wakeup_at = None
            return
        delay = math.inf
        for flow in active:
            left = flow.remaining / flow.rate
            if left < delay:
                delay = left
        if delay < 0.0:
            delay = 0.0
        env = self._env
        wakeup_at = env.now + delay
        if wakeup_at == self._wakeup_at:
            return
        self._wakeup_at = wakeup_at
        timeout = env.timeout(delay)
        timeout.callbacks.append(self._wake)
        self._wakeup = timeout

    def _reallocated(self, flows: list[_Flow], seeds: Iterable[int]) -> _Reallocation:
        """Recompute the rates of the flows connected to ``flows`` (started) or ``seeds``:
        the component's flows (their positions among the active ones, None for all of them),
        their rates, and the new usage of every resource it touched, as (resource, usage)
        pairs in resource order.

        Weighted max-min fairness decomposes over the connected components of the graph of
        flows and shared resources, so flows outside the component(s) of the change keep
        their rates. ``seeds`` are the resources the change touched: those of the started
        flows, or of the finished ones, whose usage must be recorded even when no flow
        crosses them any more. It depends only on the active flows' shapes in start order
        and on the change (capacities never change), and the same few situations recur all
        run long, so the network remembers it (`Reallocations`)."""
        component, touched = self._component(flows, seeds)
        used = self._allocated(component) if component else {}
        rates = tuple([flow.rate for flow in component])
        usage = tuple([(idx, used.get(idx, 0.0)) for idx in sorted(touched)])
        if len(component) == len(self._active):
            return None, rates, usage
        position = {flow.serial: i for i, flow in enumerate(self._active)}
        return tuple([position[flow.serial] for flow in component]), rates, usage

    def _allocated(self, component: list[_Flow]) -> dict[int, float]:
        """`_allocate` over a component (tests replace it to check the memo)."""
        return _allocate(component, self._capacities)

    def _component(
        self, flows: list[_Flow], seeds: Iterable[int]
    ) -> tuple[list[_Flow], Iterable[int]]:
        """Flows (in start order) and resources reachable from the seeds via shared resources.

        Few flows are active at a time (a handful per rank), so the component grows by
        sweeping the active flows, in start order, until no other one touches it."""
        active = self._active
        if len(active) == len(flows):
            return flows, seeds  # no other flow is active
        touched = set(seeds)
        members = {flow.serial for flow in flows}
        others = [flow for flow in active if flow.serial not in members]
        grown = True
        while grown and others:
            grown, outside = False, []
            for flow in others:
                if touched.isdisjoint(flow.resources):
                    outside.append(flow)
                else:
                    touched.update(flow.resources)
                    members.add(flow.serial)
                    grown = True
            others = outside
        if len(members) == len(flows):
            return flows, touched
        return [flow for flow in active if flow.serial in members], touched

    def _on_timeout(self, event: simpy.Event) -> None:
        """Timeout callback: only the latest scheduled wake-up counts, older ones are stale."""
        if event is not self._wakeup:
            return
        self._wakeup = None
        self._wakeup_at = None
        self._advance()
        now = self._env.now
        # Finished up to REL_TOL, or so close that its end is not a later float time.
        active = self._active
        ended = tuple([position for position, flow in enumerate(active)
                       if flow.remaining <= REL_TOL * flow.amount
                       or now + flow.remaining / flow.rate <= now])
        if ended:
            done = [active[position] for position in ended]
            self._active = active = [flow for flow in active if flow not in done]
            for flow in done:
                self._finish_record(flow.amount, flow.shape.pairs, flow.label, flow.start_s,
                                    flow.event)
            state = self._state
            known = state.finished.get(ended)
            if known is None:
                freed = {idx for flow in done for idx in flow.resources}
                known = self._memo.remember(state.finished, ended,
                                            tuple([flow.shape for flow in active]),
                                            self._reallocated([], freed))
        else:
            known = None
        self._settle(known)

    def _finish_record(
        self,
        amount: float,
        usage: tuple[tuple[int, float], ...],
        label: str,
        start_s: float,
        event: simpy.Event,
    ) -> None:
        if not self._keep_records:
            event.succeed()
            return
        resources = self._resources
        names = tuple([resources[idx].name for idx, _ in usage])
        record = FlowRecord(label, start_s, self._env.now, amount, names)
        self.records.append(record)
        event.succeed(record)


class _RateLog:
    """The usage of every resource over time, one row per change (coalesced per instant).

    Most instants see one reallocation, so the usages staged for the current instant are
    kept as the (resource, usage) pairs given, and merged only when there are several."""

    def __init__(self, env: simpy.Environment):
        self._env = env
        self._names: list[str] = []
        self._recorded: list[float] = []
        self._pending: list[tuple[tuple[int, float], ...]] = []
        self._pending_t = env.now
        self._changes: Table[RateChange] = Table(RateChange)

    def add_resource(self, name: str) -> None:
        self._names.append(name)
        self._recorded.append(0.0)

    def changes(self) -> Table[RateChange]:
        self._flush()
        return self._changes

    def note(self, usage: tuple[tuple[int, float], ...]) -> None:
        """Stage the new usage of every resource of the recomputed component(s), as
        (resource, usage) pairs in resource order."""
        now = self._env.now
        if now != self._pending_t:
            self._flush()
            self._pending_t = now
        self._pending.append(usage)

    def _flush(self) -> None:
        """Append a RateChange, in resource order, for each staged usage (the last staged, for
        a resource staged several times) that differs from the last recorded one by more than
        REL_TOL: ``not math.isclose(rate, last, rel_tol=REL_TOL)``, in its own arithmetic,
        inlined. Usages are finite (as capacities and max rates are) and never negative (sums
        of rates times positive coefficients), so the larger of the two bounds the tolerance
        and the difference is the larger minus the smaller, with no `abs`."""
        pending = self._pending
        if not pending:
            return
        if len(pending) == 1:
            staged = pending[0]
        else:
            merged: dict[int, float] = {}
            for usage in pending:
                merged.update(usage)
            staged = tuple(sorted(merged.items()))
        add, names, recorded, t_s = self._changes.add, self._names, self._recorded, self._pending_t
        for idx, rate in staged:
            last = recorded[idx]
            if (rate - last > REL_TOL * rate) if rate > last else (
                    rate < last and last - rate > REL_TOL * last):
                add((t_s, names[idx], rate))
                recorded[idx] = rate
        pending.clear()
