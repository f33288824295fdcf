"""Run one iteration of a scenario: build the machine, start the ranks, collect the records."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import simpy

from zerosim.engine.compose import build_rank
from zerosim.engine.flows import RateChange
from zerosim.engine.machine import Machine
from zerosim.engine.memory import MemoryPool, OutOfMemory
from zerosim.engine.plan import Plan, make_plan, workload_of
from zerosim.engine.rank import RunContext
from zerosim.engine.records import MemorySample, PhaseSpan, Span, Table
from zerosim.models.breakdown import build_modules
from zerosim.scenario import Scenario
from zerosim.vocabulary import DeviceKind, Stream, device_name

COPY_ENGINE_STREAMS = frozenset(s for s in Stream if s.is_copy_engine)


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
    """SimPy events processed (counted only when asked: counting costs about 8%)."""
    checks: list[str] = field(default_factory=list)
    copies: int = 1
    """How many nodes each simulated node stands for (`simulated_ranks`): the tables hold
    the simulated ranks and devices; totals over every rank multiply by it."""


class CountingEnvironment(simpy.Environment):
    """A SimPy environment that counts the events it processes (for benchmarks)."""

    def __init__(self) -> None:
        super().__init__()
        self.processed = 0

    def step(self) -> None:
        self.processed += 1
        super().step()


def _pools(env: simpy.Environment, machine: Machine, log: Table[MemorySample] | None
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


def simulated_ranks(scenario: Scenario, *, fold: bool = True) -> int:
    """Ranks the engine runs: node 0's alone when the ranks fill two or more identical nodes
    (every node then runs the same timeline: nodes share nothing but collectives, which are
    sized for every rank), else all of them."""
    ranks, per_node = scenario.data_parallel, scenario.hardware.gpus_per_node
    if fold and ranks > per_node and ranks % per_node == 0:
        return per_node
    return ranks


def run_engine(scenario: Scenario, *, count_events: bool = False, full: bool = True,
               fold: bool = True, observer: Callable[[RunContext], None] | None = None
               ) -> RawRun:
    """Simulate one iteration. `full=False` keeps only what the summary needs: no memory log
    and no link rates (the timeline is the same). `fold=False` simulates every node even when
    they are identical (see `simulated_ranks`). `observer(ctx)` is called just before the
    simulation starts (a progress line)."""
    env = CountingEnvironment() if count_events else simpy.Environment()
    modules = build_modules(scenario.model, workload_of(scenario), scenario.stack.recipe)
    plan = make_plan(scenario, modules)
    simulated = simulated_ranks(scenario, fold=fold)
    machine = Machine(env, scenario.hardware, simulated,
                      scenario.runtime.cpu_threads_per_rank, record_rates=full)
    log = Table(MemorySample)
    pools = _pools(env, machine, log if full else None)
    ctx = RunContext(env, scenario, machine, plan, pools, memory_log=log)
    ranks = [env.process(build_rank(ctx, rank).run()) for rank in range(simulated)]
    if observer is not None:
        observer(ctx)
    status, oom = "ok", None
    try:
        env.run(simpy.AllOf(env, ranks))
    except OutOfMemory as err:
        status, oom = "oom", err.to_dict()
    links = machine.flows.rate_table()
    raw = RawRun(scenario, plan, status, ctx.spans, ctx.phases, log, links,
                 {name: pool.capacity for name, pool in pools.items()},
                 {name: pool.peak for name, pool in pools.items()}, oom,
                 env.processed if count_events else None,
                 copies=scenario.data_parallel // simulated)
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
    by_stream: dict[tuple[int, str], list[tuple]] = {}
    for row in raw.spans.rows:
        if row[1] not in COPY_ENGINE_STREAMS:
            by_stream.setdefault((row[0], row[1]), []).append(row)
    for (rank, stream), rows in by_stream.items():
        rows.sort(key=lambda r: (r[5], r[6]))
        for before, after in itertools.pairwise(rows):
            if after[5] < before[6] - 1e-12:
                raise RuntimeError(f"rank {rank} stream {stream}: {before[4]!r} and {after[4]!r} "
                                   "overlap")
    return ["no flow or collective in flight", "every allocation freed",
            "no overlap on an in-order stream"]
