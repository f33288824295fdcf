"""What the Polaris runs spend outside DeepSpeed's three timers, and the values that price it.

Each run's iteration less its timed forward, backward and step is the training loop's own work
(Megatron-DeepSpeed's batch fetch and loss averaging per micro-batch; the scheduler, timers
and logging per step) and, with `memory_breakdown` on as in these runs, the engine's memory
reports: four per micro-batch (before and after its forward and its backward) and two per
step, each rank 0's full `gc.collect()` over every object its process holds
(`RankCore.report_memory`). So per optimizer step

    gap = micro_batch x GA + step + (4 GA + 2) x objects x per_object

with `objects` the stack's count for the run's parameter tensors (measured,
benchmarks/node_probe/gc_probe.py). The time per object and the per-step loop are fitted by
linear least squares over the 41 runs; the per-micro-batch loop is held at the stack's value
(assumed): it and the collections that grow with accumulation are one slope the runs cannot
split, and the fit with it free puts it below zero. Pure: no SimPy.

    python -m zerosim.validation.loop_gap     # prints the fit and the H100 node's checks
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from zerosim.runs import MeasuredRun, between_phases_s
from zerosim.scenario.deepspeed import memory_reports_per_step
from zerosim.units import ordered_sum
from zerosim.validation import leastsq
from zerosim.vocabulary import Status


@dataclass(frozen=True)
class LoopGapFit:
    """The fitted values, at the stack's reference clock, and how well the runs pin them."""

    gc_per_object_s: float
    gc_per_object_se: float
    step_s: float
    step_se: float
    correlation: float
    rms_s: float
    """The runs' root-mean-square residual, seconds per step."""
    runs: int


def measured_gap_s(run: MeasuredRun) -> float:
    """The run's iteration less its three timed phases, seconds per optimizer step."""
    gap = between_phases_s(run.seconds)
    if gap is None:
        raise ValueError(f"row {run.row} lacks one of the four times the gap needs")
    return gap


def objects_held(run: MeasuredRun) -> float:
    """What a full collection walks in the run's rank-0 process: the stack's objects for the
    model's parameter tensors, as the engine counts them."""
    from zerosim.engine.probes import memory_reports
    from zerosim.scenario import scenario_from_dict
    from zerosim.validation import polaris

    scenario = scenario_from_dict(polaris.scenario(run), source=polaris.case_name(run))
    return memory_reports(scenario).objects


def fit(runs: Sequence[MeasuredRun] | None = None) -> LoopGapFit:
    """The least-squares time per object and per-step loop over `runs` (the shipped Polaris
    runs when None), with each run's clock and the stack's per-micro-batch loop."""
    from zerosim.hardware.profile import load_profile
    from zerosim.stacks import load_stack
    from zerosim.validation import polaris

    runs = polaris.load_runs() if runs is None else list(runs)
    stack = load_stack(polaris.STACK)
    core_Hz = load_profile(polaris.PROFILE).cpu_boost_Hz
    to_reference = core_Hz / stack.reference_Hz
    micro_batch_s = stack.on_core(stack.micro_batch_s, core_Hz)
    gap = np.array([measured_gap_s(r) - micro_batch_s * r.grad_accum_steps for r in runs])
    design = np.array([[1.0, memory_reports_per_step(r.grad_accum_steps) * objects_held(r)]
                       for r in runs])
    values, *_ = np.linalg.lstsq(design, gap, rcond=None)
    residuals = gap - design @ values
    covariance = leastsq.covariance(design, residuals)
    se = np.sqrt(np.diag(covariance))
    return LoopGapFit(gc_per_object_s=float(values[1]) * to_reference,
                      gc_per_object_se=float(se[1]) * to_reference,
                      step_s=float(values[0]) * to_reference, step_se=float(se[0]) * to_reference,
                      correlation=float(covariance[0, 1] / (se[0] * se[1])),
                      rms_s=float(np.sqrt(np.mean(residuals ** 2))), runs=len(runs))


GROWTH_MICRO_BATCH = 4
"""The micro-batch of the configurations `data_parallel_growth` compares: the one the table
runs unbound at DP=1, 2 and 4 with one micro-batch a step."""


def data_parallel_growth(gaps: Iterable[tuple[MeasuredRun, float, float]]) -> dict[int, float]:
    """What the runs spend between their phases beyond zerosim, by data-parallel degree, less
    that at DP=1: over (configuration's first run, measured, predicted seconds between the
    phases per step), the mean of measured - predicted among the unbound configurations at
    micro-batch 4 and accumulation 1, at each degree, less the mean at DP=1 (seconds a step).
    The model prices the loop and rank 0's memory reports alike at every degree; on Polaris
    the runs' gap grows with the ranks, which nothing in the model accounts for."""
    by_degree: dict[int, list[float]] = {}
    for run, measured, predicted in gaps:
        if (not run.bind_cores_to_rank and run.micro_batch_size == GROWTH_MICRO_BATCH
                and run.grad_accum_steps == 1):
            by_degree.setdefault(run.gpus, []).append(measured - predicted)
    means = {degree: ordered_sum(excess) / len(excess)
             for degree, excess in sorted(by_degree.items())}
    if 1 not in means:
        raise ValueError("no unbound configuration at DP=1 to measure the growth from")
    return {degree: mean - means[1] for degree, mean in means.items()}


def loop_s(scenario) -> float:
    """What a resolved scenario's loop spends between the phases per optimizer step, as the
    engine prices it when nothing the phases left runs on: the stack's per-micro-batch and
    per-step times and the memory reports, on the profile's clock."""
    from zerosim.engine.probes import memory_reports

    ds, stack, core_Hz = scenario.deepspeed, scenario.stack, scenario.hardware.cpu_boost_Hz
    reports = memory_reports(scenario)
    return (stack.on_core(stack.micro_batch_s, core_Hz) * ds.gradient_accumulation_steps
            + stack.on_core(stack.step_s, core_Hz)
            + (0.0 if reports is None else reports.per_step_s))


def out_of_sample() -> list[tuple[str, float, float]]:
    """(run, measured, zerosim) seconds between the phases per step for the MLP-Offload runs
    on the H100 node, which nothing here is fitted on."""
    from zerosim.scenario import scenario_from_dict
    from zerosim.validation.mlp_offload import load_runs

    return [(run.name, run.between_phases_s,
             loop_s(scenario_from_dict(run.scenario(), source=run.name)))
            for run in load_runs()]


def one_report_out_of_sample() -> list[tuple[str, float, float]]:
    """(run, measured, zerosim) seconds of one memory report for the same runs, which their
    logs time apart (`NvmeRun.memory_report_s`)."""
    from zerosim.scenario import scenario_from_dict
    from zerosim.validation.mlp_offload import load_runs

    return [(run.name, run.memory_report_s,
             report_s(scenario_from_dict(run.scenario(), source=run.name)))
            for run in load_runs()]


def report_s(scenario) -> float:
    """What the engine prices one of a resolved scenario's memory reports at (0 without
    `memory_breakdown`)."""
    from zerosim.engine.probes import memory_reports

    reports = memory_reports(scenario)
    return 0.0 if reports is None else reports.each_s


def polaris_gaps() -> list[tuple[MeasuredRun, float, float]]:
    """(first run, measured, zerosim) seconds between the phases per step of each Polaris
    configuration, repeats averaged, as `zerosim validate` predicts them."""
    from zerosim.runs import BETWEEN_PHASES, predict
    from zerosim.validation import polaris

    outcome = predict(polaris.load_runs(), polaris.PROFILE, workers=1, source="Polaris CSV",
                      name_prefix=polaris.NAME_PREFIX)
    return [(p.configuration.first, p.configuration.measured(BETWEEN_PHASES),
             p.predicted[BETWEEN_PHASES]) for p in outcome.predictions if p.status == Status.OK]


def main() -> None:
    import argparse

    argparse.ArgumentParser(
        prog="python -m zerosim.validation.loop_gap",
        description="Fit the time per collected object and the per-step loop on the Polaris "
                    "runs' gaps between their phases; check them on the MLP-Offload runs."
    ).parse_args()
    result = fit()
    print(f"{result.runs} runs, at the stack's reference clock:\n"
          f"  host.gc_per_object_ns {result.gc_per_object_s * 1e9:.1f} "
          f"(standard error {result.gc_per_object_se / result.gc_per_object_s:.1%})\n"
          f"  host.step_ms {result.step_s * 1e3:.1f} "
          f"(standard error {result.step_se / result.step_s:.1%})\n"
          f"  correlation {result.correlation:+.2f}; rms residual {result.rms_s * 1e3:.1f} ms "
          f"a step\n"
          "out of sample, the MLP-Offload runs on h100-jlse at the shipped values "
          "(measured, zerosim):")
    for name, measured, predicted in out_of_sample():
        print(f"  {name}: {measured:.3f} s, {predicted:.3f} s ({predicted / measured - 1:+.1%})")
    print("the Polaris runs between their phases beyond zerosim, by data-parallel degree "
          "(unbound, micro-batch 4, accumulation 1), less DP=1's:")
    for degree, excess in data_parallel_growth(polaris_gaps()).items():
        print(f"  DP={degree}: {excess * 1e3:+.0f} ms a step")
    print("one memory report in the same runs (measured, zerosim):")
    for name, measured, predicted in one_report_out_of_sample():
        print(f"  {name}: {measured * 1e3:.1f} ms, {predicted * 1e3:.1f} ms "
              f"({predicted / measured - 1:+.1%})")


if __name__ == "__main__":
    main()
