"""The summary of a run, from its records alone (no pandas: a sweep point or `zerosim run
--no-files` builds no table).

Every figure is computed as the DataFrame reductions it replaces computed it, to the bit: a
phase time is pandas' grouped mean per rank (`groupby("rank").mean()`: numpy's `reduceat`
when the rows come rank by rank, else a Kahan-compensated sum; then one division), then the
slowest rank; a PCIe total is exact (integral byte counts) or, failing that, numpy's pairwise
sum in the spans table's order.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from zerosim.engine.records import PhaseSpan, Span, Table, with_copies
from zerosim.hardware import costs
from zerosim.units import GB, GiB
from zerosim.vocabulary import (
    PCIE_STREAMS,
    PHASE_TIMES,
    DeviceKind,
    Phase,
    PhaseTime,
    Status,
    device_kind,
    devices_of,
)

if TYPE_CHECKING:
    from zerosim.engine.simulate import RawRun

EXACT_FLOAT_INTEGERS = 2**53


def kahan_mean(values: list[float]) -> float:
    """pandas' grouped mean of one group when the groups interleave (Cython `group_mean`):
    compensated sum, then a division."""
    total = compensation = 0.0
    for value in values:
        y = value - compensation
        t = total + y
        compensation = t - total - y
        if compensation != compensation:
            compensation = 0.0
        total = t
    return total / len(values)


def grouped_means(ranks: list[int], values: list[float]) -> list[float]:
    """`groupby(ranks).mean()` of `values` (in row order), as pandas computes it."""
    if all(a <= b for a, b in itertools.pairwise(ranks)):
        import numpy as np

        starts = [i for i, rank in enumerate(ranks) if i == 0 or rank != ranks[i - 1]]
        sizes = [b - a for a, b in zip(starts, [*starts[1:], len(ranks)], strict=True)]
        sums = np.add.reduceat(np.array(values, dtype=float), starts)
        return [float(total) for total in sums / np.array(sizes, dtype=float)]
    by_rank: dict[int, list[float]] = {}
    for rank, value in zip(ranks, values, strict=True):
        by_rank.setdefault(rank, []).append(value)
    return [kahan_mean(group) for group in by_rank.values()]


def phase_time(phase: str, micro: int, last: int) -> PhaseTime | None:
    """Which summary phase time a phase of micro-batch `micro` counts in (`last`: the
    accumulation boundary's micro-batch)."""
    if phase == Phase.FORWARD:
        return PhaseTime.FORWARD
    if phase == Phase.UPDATE:
        return PhaseTime.UPDATE
    if phase == Phase.BACKWARD and micro < last:
        return PhaseTime.BACKWARD_NON_BOUNDARY
    if phase == Phase.BACKWARD and micro == last:
        return PhaseTime.BACKWARD_BOUNDARY
    return None


def last_to_finish(rows: Iterable[tuple]) -> int | None:
    """The rank whose last phase ends last (the lowest such rank), from (rank, phase,
    micro_batch, start_s, end_s) rows; None without rows."""
    ends: dict[int, float] = {}
    for rank, _, _, _, end_s in rows:
        ends[rank] = max(ends.get(rank, end_s), end_s)
    return min(ends, key=lambda r: (-ends[r], r)) if ends else None


def phase_seconds(phases: Table[PhaseSpan], accumulation_steps: int
                  ) -> dict[str, float | None]:
    """Mean per micro-batch on each rank, then the slowest rank."""
    return _per_phase(phases, accumulation_steps, lambda row: row[4] - row[3])


def compute_held_seconds(phases: Table[PhaseSpan], accumulation_steps: int
                         ) -> dict[str, float | None]:
    """How long kernels on other streams held the compute kernels back on the SMs: mean per
    micro-batch on each rank, then the rank held longest."""
    column = [f.name for f in fields(PhaseSpan)].index("compute_held_s")
    return _per_phase(phases, accumulation_steps, lambda row: row[column])


def _per_phase(phases: Table[PhaseSpan], accumulation_steps: int,
               value: Callable[[tuple], float]) -> dict[str, float | None]:
    """`value` of each phase record: its mean per micro-batch on each rank, then the
    largest over the ranks, per kind of phase."""
    if not len(phases):
        return dict.fromkeys(PHASE_TIMES)
    last = accumulation_steps - 1
    chosen: dict[PhaseTime, tuple[list[int], list[float]]] = {k: ([], []) for k in PhaseTime}
    for row in phases.rows:
        key = phase_time(row[1], row[2], last)
        if key is None:
            continue
        chosen[key][0].append(row[0])
        chosen[key][1].append(value(row))
    return {key.value: max(grouped_means(ranks, values)) if ranks else None
            for key, (ranks, values) in chosen.items()}


def rank0_phase_memory(phases: Table[PhaseSpan], accumulation_steps: int, field: str
                       ) -> dict[str, float | None]:
    """Rank 0's GPU memory in GiB, its CUDA context included, per kind of phase (the last
    micro-batch's): the phase record's `field`, `allocated_end_bytes` or
    `allocated_peak_bytes`."""
    last = accumulation_steps - 1
    column = [f.name for f in fields(PhaseSpan)].index(field)
    chosen: dict[str, float | None] = dict.fromkeys(PHASE_TIMES)
    for row in phases.rows:
        key = phase_time(row[1], row[2], last)
        if row[0] == 0 and key is not None:
            chosen[key.value] = row[column] / GiB
    return chosen


def total_bytes(spans: Table[Span], stream: str,
                stands_for: dict[int, tuple[int, ...]] | None = None) -> float:
    """The bytes of every span on `stream`, summed as `spans.bytes.sum()` over the sorted
    spans table sums them; a folded run's rows count once per rank they stand for
    (`RawRun.every_rank`)."""
    copies = stands_for or {}
    rows = [(start_s, other, nbytes)  # as `with_copies` gives them: each rank it stands for
            for rank, on, start_s, nbytes in zip(spans.column(0), spans.column(1),
                                                 spans.column(5), spans.column(7), strict=True)
            if on == stream for other in copies.get(rank, (rank,))]
    values = [row[2] for row in rows]
    if all(float(v).is_integer() and v >= 0 for v in values):
        total = math.fsum(values)
        if total < EXACT_FLOAT_INTEGERS:
            return total  # every partial sum is exact, in any order
    import numpy as np

    rows.sort(key=lambda row: (row[0], row[1]))  # the table's order: start_s, rank
    return float(np.array([row[2] for row in rows], dtype=float).sum())


def pcie_totals(spans: Table[Span], stands_for: dict[int, tuple[int, ...]] | None = None
                ) -> dict[str, float]:
    """`total_bytes` of each PCIe stream (`PCIE_STREAMS`), by direction: one pass over the
    spans when every byte count is integral (the sum is then exact in any order), else
    `total_bytes` itself."""
    copies = stands_for or {}
    picked: dict[str, list[Any]] = {stream.value: [] for stream in PCIE_STREAMS.values()}
    for rank, on, nbytes in zip(spans.column(0), spans.column(1), spans.column(7),
                                strict=True):
        values = picked.get(on)
        if values is not None:
            others = copies.get(rank)
            if others is None:
                values.append(nbytes)
            else:
                values.extend([nbytes] * len(others))
    totals = {}
    for direction, stream in PCIE_STREAMS.items():
        values = picked[stream.value]
        if all(map(float.is_integer, map(float, values))) and (not values or min(values) >= 0):
            total = math.fsum(values)
            if total < EXACT_FLOAT_INTEGERS:
                totals[direction] = total
                continue
        totals[direction] = total_bytes(spans, stream, stands_for)
    return totals


def oom_text(oom: dict[str, Any], *, with_time: bool = True) -> str:
    """A summary's `oom` record as one line: the device, what did not fit and how full it was
    (`zerosim run` prints it under its tables, `zerosim predict` under its rows)."""
    when = f" at t={oom['t_s']:.3f} s" if with_time else ""
    return (f"out of memory on {oom['device']}{when}: {oom['allocation']} ({oom['category']}) "
            f"needs {oom['requested_GiB']:.2f} GiB with {oom['in_use_GiB']:.2f} of "
            f"{oom['capacity_GiB']:.2f} GiB in use")


CAPACITY_KEYS = {DeviceKind.GPU: "hardware.gpu.hbm_GiB",
                 DeviceKind.HOST: "hardware.host.memory_GiB"}
"""The `--set` key of each kind of device's memory (a GPU's HBM, a node's host memory),
which `capacity_that_fits` raises; an NVMe drive's capacity is per drive, and not raised."""


def capacity_that_fits(oom: dict[str, Any]) -> tuple[str, float] | None:
    """The `--set` key and value (GiB, the next 0.01 above what was in use plus what it asked
    for) under which the allocation that did not fit would have. None for a device whose
    capacity `CAPACITY_KEYS` does not name. A later allocation may still need more."""
    key = CAPACITY_KEYS.get(device_kind(oom["device"]))
    if key is None:
        return None
    needed = oom["in_use_GiB"] + oom["requested_GiB"]
    return key, (math.floor(needed * 100) + 1) / 100


PEAK_ERROR_FRACTION = 0.04
"""How far zerosim's memory peaks sit from measured ones (`zerosim validate`: rank 0's peak
allocated GPU memory -2.9% to +1.0% on the two testbeds, the H200 VM's real DeepSpeed runs
-0.5% to +4.0%): a configuration that fits by less than this may not fit in a real run."""


def tight_memory(summary: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(what, peak GiB, capacity GiB) of the fullest GPU and node when a run that fits comes
    within `PEAK_ERROR_FRACTION` of their capacity."""
    if summary.get("status") != Status.OK:
        return []
    pairs = (("HBM", summary.get("peak_hbm_GiB"), summary.get("hbm_capacity_GiB")),
             ("host memory", summary.get("peak_host_GiB"), summary.get("host_capacity_GiB")))
    return [(what, peak, capacity) for what, peak, capacity in pairs
            if peak is not None and capacity and peak > (1 - PEAK_ERROR_FRACTION) * capacity]


def tight_text(summary: dict[str, Any]) -> str:
    """`tight_memory` as one line, 'peak HBM 39.21 of 39.59 GiB, peak host memory ...' ("" when
    nothing is tight)."""
    return ", ".join(f"peak {what} {peak:.2f} of {capacity:.2f} GiB"
                     for what, peak, capacity in tight_memory(summary))


def _pcie_bytes_of_every_node(raw: RawRun) -> dict[str, float]:
    """PCIe bytes by direction over every rank of the run: each simulated node's spans count
    once per node it stands for (`RawRun.node_copies`)."""
    if len(set(raw.node_copies)) == 1:
        return {d: total * raw.node_copies[0]
                for d, total in pcie_totals(raw.spans, raw.stands_for).items()}
    per_node = raw.scenario.hardware.gpus_per_node
    stands_for = {rank: raw.stands_for.get(rank, (rank,)) * raw.node_copies[rank // per_node]
                  for rank in set(raw.spans.column(0))}
    return pcie_totals(raw.spans, stands_for)


def _memory_reports_s(raw: RawRun) -> float:
    """What DeepSpeed's memory reports take of an iteration (0 without `memory_breakdown`)."""
    from zerosim.engine.probes import memory_reports

    reports = memory_reports(raw.scenario)
    return 0.0 if reports is None else reports.per_step_s


def _zenflow_step_s(ds: Any, iteration: float | None) -> float | None:
    """With ZenFlow an iteration is a window of `update_interval` training steps, each one
    micro-batch and one call of the engine's `step` (what ZenFlow's users time per step); None
    without ZenFlow."""
    if ds.zenflow is None or not iteration:
        return None
    return iteration / ds.gradient_accumulation_steps


def summarize(raw: RawRun) -> dict[str, Any]:
    """The summary of every rank: a folded run's phases and PCIe spans are given for every
    rank of the simulated node (as `RawRun.every_rank` gives them; its GPU peaks are those of
    the ranks it simulated), then totals multiply by the nodes folded."""
    scenario = raw.scenario
    ds = scenario.deepspeed
    ranks = scenario.data_parallel
    phases = with_copies(raw.phases, 0, raw.stands_for)
    iteration = (max(row[4] for row in phases.rows)
                 if raw.status == Status.OK and len(phases) else None)
    pcie_bytes = _pcie_bytes_of_every_node(raw)
    model_flops = costs.model_flops_per_microbatch(list(raw.plan.modules))
    tflops = (model_flops * ds.gradient_accumulation_steps / iteration / 1e12
              if iteration else None)
    hbm_peaks = [raw.peaks[d] for d in devices_of(raw.peaks, DeviceKind.GPU)]
    host_peaks = [raw.peaks[d] for d in devices_of(raw.peaks, DeviceKind.HOST)]
    nvme_peaks = [raw.peaks[d] for d in devices_of(raw.peaks, DeviceKind.NVME)]
    return {
        "scenario": scenario.name,
        "status": raw.status,
        "hardware": scenario.hardware.name,
        "data_parallel": ranks,
        "nodes": -(-ranks // scenario.hardware.gpus_per_node),
        "deepspeed_version": scenario.runtime.version_text,
        "iteration_s": iteration,
        "zenflow_step_s": _zenflow_step_s(ds, iteration),
        "phases_s": phase_seconds(phases, ds.gradient_accumulation_steps),
        "compute_held_s": compute_held_seconds(phases, ds.gradient_accumulation_steps),
        "memory_reports_s": _memory_reports_s(raw) if iteration else None,
        "tflops_per_gpu": tflops,
        "tokens_per_s": scenario.tokens_per_iteration / iteration if iteration else None,
        "peak_hbm_GiB": max(hbm_peaks) / GiB,
        "hbm_after_GiB": rank0_phase_memory(phases, ds.gradient_accumulation_steps,
                                            "allocated_end_bytes"),
        "hbm_phase_peak_GiB": rank0_phase_memory(phases, ds.gradient_accumulation_steps,
                                                 "allocated_peak_bytes"),
        "hbm_capacity_GiB": scenario.hardware.hbm_bytes / GiB,
        "peak_host_GiB": max(host_peaks) / GiB,
        "peak_nvme_GiB": max(nvme_peaks) / GiB if nvme_peaks else None,
        "host_capacity_GiB": scenario.hardware.host_memory_bytes / GiB,
        "pcie_GB": {d: b / GB for d, b in pcie_bytes.items()},
        "pcie_mean_GBps": {d: (b / ranks / iteration / GB if iteration else None)
                           for d, b in pcie_bytes.items()},
        "partition_numel": raw.plan.partition_numel,
        "oom": raw.oom,
        "checks": raw.checks,
    }
