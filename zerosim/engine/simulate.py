"""Run one iteration of a scenario: build the machine, start the ranks, collect the records."""

from __future__ import annotations

import gc
import itertools
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import simpy

from zerosim.engine.compose import build_rank
from zerosim.engine.flows import RateChange
from zerosim.engine.machine import Machine
from zerosim.engine.memory import MemoryPool, OutOfMemory
from zerosim.engine.plan import Plan, make_plan, workload_of
from zerosim.engine.rank import RunContext
from zerosim.engine.records import MemorySample, PhaseSpan, Span
from zerosim.models.breakdown import build_modules
from zerosim.scenario import Scenario
from zerosim.vocabulary import DeviceKind, Stream, device_name

GC_YOUNG_THRESHOLD = 50_000


@dataclass
class RawRun:
    """The records of one run, before they become DataFrames."""

    scenario: Scenario
    plan: Plan
    status: str
    spans: list[Span]
    phases: list[PhaseSpan]
    memory: list[MemorySample]
    links: list[RateChange]
    capacities: dict[str, int]
    peaks: dict[str, int]
    oom: dict | None = None
    events: int | None = None
    """SimPy events processed (counted only when asked: counting costs about 8%)."""
    checks: list[str] = field(default_factory=list)


class CountingEnvironment(simpy.Environment):
    """A SimPy environment that counts the events it processes (for benchmarks)."""

    def __init__(self) -> None:
        super().__init__()
        self.processed = 0

    def step(self) -> None:
        self.processed += 1
        super().step()


@contextmanager
def _quiet_garbage_collector():
    """The run allocates many short-lived events and few cycles: freeze what exists and collect
    the young generation less often (about 25% less engine time), then restore the settings."""
    thresholds = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def _pools(env: simpy.Environment, machine: Machine, log: list[MemorySample]
           ) -> dict[str, MemoryPool]:
    profile = machine.profile
    pools = {}
    for placement in machine.placements:
        pools[placement.device] = MemoryPool(placement.device, profile.hbm_bytes,
                                             lambda: env.now, log)
        if placement.host_device not in pools:
            pools[placement.host_device] = MemoryPool(
                placement.host_device, profile.host_memory_bytes, lambda: env.now, log)
            if profile.has_nvme:
                nvme = device_name(DeviceKind.NVME, placement.node)
                pools[nvme] = MemoryPool(nvme, profile.nvme_bytes_per_node, lambda: env.now, log)
    return pools


def run_engine(scenario: Scenario, *, count_events: bool = False,
               observer: Callable[[RunContext], None] | None = None) -> RawRun:
    """Simulate one iteration; `observer(ctx)` is called just before it starts (progress)."""
    env = CountingEnvironment() if count_events else simpy.Environment()
    modules = build_modules(scenario.model, workload_of(scenario))
    plan = make_plan(scenario, modules)
    machine = Machine(env, scenario.hardware, scenario.data_parallel,
                      scenario.runtime.cpu_threads_per_rank)
    log: list[MemorySample] = []
    pools = _pools(env, machine, log)
    ctx = RunContext(env, scenario, machine, plan, pools, memory_log=log)
    ranks = [env.process(build_rank(ctx, rank).run()) for rank in range(scenario.data_parallel)]
    if observer is not None:
        observer(ctx)
    status, oom = "ok", None
    try:
        with _quiet_garbage_collector():
            env.run(simpy.AllOf(env, ranks))
    except OutOfMemory as err:
        status, oom = "oom", err.to_dict()
    links = machine.flows.rate_changes
    raw = RawRun(scenario, plan, status, ctx.spans, ctx.phases, log, links,
                 {name: pool.capacity for name, pool in pools.items()},
                 {name: pool.peak for name, pool in pools.items()}, oom,
                 env.processed if count_events else None)
    if status == "ok":
        machine.assert_idle()
        raw.checks = check_invariants(raw, pools)
    return raw


def check_invariants(raw: RawRun, pools: dict[str, MemoryPool]) -> list[str]:
    """End-of-run checks (after ASTRA-sim): nothing in flight, every transient freed, no
    overlapping spans on an exclusive stream. Raises on a violation; returns what was checked."""
    leftovers = {f"{name}:{cat}": level for name, pool in pools.items()
                 for cat, level in pool.levels.items() if level != 0}
    if leftovers:
        raise RuntimeError(f"memory not freed at the end of the iteration: {leftovers}")
    by_stream: dict[tuple[int, str], list[Span]] = {}
    for span in raw.spans:
        if not Stream(span.stream).is_copy_engine:
            by_stream.setdefault((span.rank, span.stream), []).append(span)
    for (rank, stream), spans in by_stream.items():
        spans.sort(key=lambda s: (s.start_s, s.end_s))
        for before, after in itertools.pairwise(spans):
            if after.start_s < before.end_s - 1e-12:
                raise RuntimeError(f"rank {rank} stream {stream}: {before.op!r} and {after.op!r} "
                                   "overlap")
    return ["no flow or collective in flight", "every allocation freed",
            "no overlap on an in-order stream"]
