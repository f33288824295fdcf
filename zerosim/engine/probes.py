"""Lone kernels on the engine's machine model: what `zerosim check` and `zerosim validate` time
without replaying a whole iteration, through the same `Machine` and kernels the engine runs."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import simpy

from zerosim.engine.machine import Machine
from zerosim.engine.optimizer import cpu_adam
from zerosim.engine.plan import plan_of, update_groups
from zerosim.hardware.costs import FP32_ADAM, AdamPrecision
from zerosim.hardware.placement import CoreOrder
from zerosim.hardware.profile import HardwareProfile

if TYPE_CHECKING:
    from zerosim.scenario import Scenario

UNBOUND_ADAM_PARAMS_PER_S_PER_THREAD = 1e12
"""A per-thread rate no CPU reaches: Adam with its compute ceiling lifted, bound by host
memory alone."""


def cpu_adam_seconds(profile: HardwareProfile, elements: float, *, ranks: int = 1,
                     threads_per_rank: int | None = None, bound: bool = False,
                     core_order: CoreOrder = "by_gpu",
                     precision: AdamPrecision = FP32_ADAM) -> float:
    """`ranks` ranks of one node each stepping `elements` with DeepSpeedCPUAdam at once, as the
    engine replays a sub-group's step: until the last of them is done."""
    env = simpy.Environment()
    machine = Machine(env, profile, ranks, threads_per_rank, bound=bound,
                      core_order=core_order)
    for rank in range(ranks):
        env.process(cpu_adam(machine, rank, elements, precision=precision))
    env.run()
    return env.now


def without_adam_ceiling(profile: HardwareProfile) -> HardwareProfile:
    """`profile` with DeepSpeedCPUAdam's per-thread compute ceilings lifted."""
    unbound = UNBOUND_ADAM_PARAMS_PER_S_PER_THREAD
    return replace(profile, adam_params_per_s_per_thread=unbound,
                   adam_bf16_params_per_s_per_thread=unbound,
                   adam_bf16_states_params_per_s_per_thread=unbound,
                   adam_fp16_params_per_s_per_thread=unbound,
                   adam_fp16_states_params_per_s_per_thread=unbound)


@dataclass(frozen=True)
class AdamRates:
    """What one sub-group's CPU Adam step runs at on the scenario's fullest node, every rank of
    it stepping at once (DeepSpeed's ranks reach their updates together), per rank."""

    ranks: int
    elements: int
    """What one DeepSpeedCPUAdam call steps: the rank's first ZeRO-3 sub-group
    (`zero_optimization.sub_group_size`, or the whole partition if smaller), its whole
    partition at stages 1 and 2."""
    params_per_s: float
    """params/s of the slowest rank, as the engine replays it."""
    threads_params_per_s: float
    """The rank's pool: threads x the per-thread ceiling (`cpu.adam_params_per_s_per_thread`,
    or its 16-bit counterpart for 16-bit master params)."""
    memory_params_per_s: float
    """The same step with no compute ceiling: what host memory lets each rank reach."""

    @property
    def binding(self) -> str:
        """What holds the step: host memory when the ranks reach what it allows, else their
        threads (fewer, or oversubscribed, than memory could feed)."""
        reached = self.params_per_s >= self.memory_params_per_s * (1 - 1e-9)
        return "host memory" if reached else "its threads"

    def to_dict(self) -> dict[str, Any]:
        """What `zerosim check --json` prints as `cpu_adam`."""
        return {**asdict(self), "held_by": self.binding}


def node_adam_rates(scenario: Scenario) -> AdamRates:
    """The scenario's CPU Adam on its fullest node (`AdamRates`): on the ranks' pools, or on
    SuperOffload's optimizer processes' threads."""
    profile = scenario.hardware
    runtime = scenario.runtime
    ranks = scenario.ranks_on_fullest_node
    elements = update_groups(plan_of(scenario), scenario.deepspeed.stage)[0]
    worker = scenario.superoffload_worker_threads()
    threads = worker if worker is not None else scenario.cpu_pools().threads_per_rank
    ds = scenario.deepspeed
    precision = AdamPrecision(ds.master_dtype, ds.optimizer_state_dtype)

    def seconds(p: HardwareProfile) -> float:
        return cpu_adam_seconds(p, elements, ranks=ranks,
                                threads_per_rank=(worker if worker is not None
                                                  else runtime.cpu_threads_per_rank),
                                bound=runtime.bind_cores_to_rank,
                                core_order=runtime.bind_core_list, precision=precision)

    return AdamRates(ranks, elements, elements / seconds(profile),
                     threads * precision.params_per_s_per_thread(profile),
                     elements / seconds(without_adam_ceiling(profile)))


@dataclass(frozen=True)
class MemoryReports:
    """DeepSpeed's memory reports with `memory_breakdown` on, as the engine prices them."""

    per_step: int
    """Reports in one optimizer step: four per micro-batch, two per step."""
    objects: float
    """What each report's `gc.collect()` walks in rank 0's process."""
    each_s: float

    @property
    def per_step_s(self) -> float:
        return self.per_step * self.each_s

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "per_step_s": self.per_step_s}


def memory_reports(scenario: Scenario) -> MemoryReports | None:
    """The memory reports' count and time a step (None without `memory_breakdown`)."""
    ds, stack = scenario.deepspeed, scenario.stack
    if not ds.memory_breakdown:
        return None
    tensors, partitioned = len(plan_of(scenario).all_params), ds.stage == 3
    return MemoryReports(
        per_step=ds.memory_reports,
        objects=stack.gc_objects_held(tensors, partitioned=partitioned),
        each_s=stack.memory_report_s(tensors, scenario.hardware.cpu_boost_Hz,
                                     partitioned=partitioned))
