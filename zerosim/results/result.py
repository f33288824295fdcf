"""`Result`: the records of a run as DataFrames, plus the summary users read first."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from zerosim.engine.flows import RateChange
from zerosim.engine.records import Span, Table
from zerosim.engine.simulate import RawRun
from zerosim.hardware import costs
from zerosim.scenario.version import format_version
from zerosim.units import GB, GiB
from zerosim.vocabulary import (
    PCIE_STREAMS,
    PHASE_TIMES,
    DeviceKind,
    LinkKind,
    Phase,
    PhaseTime,
    devices_of,
    split_resource,
)

PHASE_KEYS = PHASE_TIMES
SPAN_ORDER = ["start_s", "rank", "stream"]


def _frame(table: Table) -> pd.DataFrame:
    """One row per record, one column per field in declaration order; vocabulary members are
    written as their plain text."""
    if not len(table):
        return pd.DataFrame([], columns=list(table.names))
    return pd.DataFrame(table.columns(), columns=list(table.names))


def _sorted_spans(table: Table[Span]) -> pd.DataFrame:
    return _frame(table).sort_values(SPAN_ORDER, kind="stable", ignore_index=True)


@dataclass(frozen=True)
class Result:
    """One simulated iteration.

    `spans`: one row per activity (rank, stream, phase, micro_batch, op, start_s, end_s, bytes,
    op_kind, buffer_kind): `op` is display text; select on `stream`, `phase`, `op_kind`
    (`vocabulary.OpKind`) and `buffer_kind` (`vocabulary.BufferKind`).
    `memory`: step curves (t_s, device, category, bytes, buffer_kind) - the level after each
    change; `category` is the label `vocabulary.category_label` makes
    (`vocabulary.base_category` gives its `Category` back).
    `phases`: one row per rank x phase x micro-batch.
    `links`: usage of each shared resource over time (t_s, resource, rate, unit): bytes/s for
    PCIe directions, NVLink and host memory; busy hardware threads for a node's CPU.
    `summary`: iteration and phase times, TFLOPS, peaks, PCIe traffic, status.
    """

    scenario_name: str
    spans: pd.DataFrame
    memory: pd.DataFrame
    phases: pd.DataFrame
    links: pd.DataFrame
    summary: dict[str, Any]
    capacities: dict[str, int]

    @property
    def status(self) -> str:
        return self.summary["status"]


def _phase_seconds(phases: pd.DataFrame, accumulation_steps: int) -> dict[str, float | None]:
    """Mean per micro-batch on each rank, then the slowest rank."""
    if phases.empty:
        return dict.fromkeys(PHASE_KEYS)
    frame = phases.assign(duration=phases.end_s - phases.start_s)
    last = accumulation_steps - 1
    backward = frame.phase == Phase.BACKWARD
    selections = {
        PhaseTime.FORWARD: frame.phase == Phase.FORWARD,
        PhaseTime.BACKWARD_NON_BOUNDARY: backward & (frame.micro_batch < last),
        PhaseTime.BACKWARD_BOUNDARY: backward & (frame.micro_batch == last),
        PhaseTime.UPDATE: frame.phase == Phase.UPDATE,
    }
    out: dict[str, float | None] = {}
    for key, mask in selections.items():
        chosen = frame[mask]
        out[key.value] = (None if chosen.empty
                          else float(chosen.groupby("rank").duration.mean().max()))
    return out


def summarize(raw: RawRun, spans: pd.DataFrame, phases: pd.DataFrame) -> dict[str, Any]:
    scenario = raw.scenario
    ds = scenario.deepspeed
    ranks = scenario.data_parallel
    iteration = float(phases.end_s.max()) if raw.status == "ok" and not phases.empty else None
    pcie_bytes = {d: float(spans.loc[spans.stream == stream, "bytes"].sum()) * raw.copies
                  for d, stream in PCIE_STREAMS.items()}
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
        "deepspeed_version": format_version(scenario.runtime.deepspeed_version),
        "iteration_s": iteration,
        "phases_s": _phase_seconds(phases, ds.gradient_accumulation_steps),
        "tflops_per_gpu": tflops,
        "peak_hbm_GiB": max(hbm_peaks) / GiB,
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


def link_unit(resource: str) -> str:
    """CPU resources carry busy hardware threads; every other resource bytes per second."""
    return "threads" if split_resource(resource)[1] is LinkKind.CPU else "B/s"


def build_result(raw: RawRun) -> Result:
    spans = _sorted_spans(raw.spans)
    phases = _frame(raw.phases)
    memory = _frame(raw.memory)
    links = _frame(raw.links)
    links["unit"] = links.resource.map(link_unit)
    return Result(raw.scenario.name, spans, memory, phases, links,
                  summarize(raw, spans, phases), dict(raw.capacities))


def summary_of(raw: RawRun) -> dict[str, Any]:
    """The summary alone, equal to `build_result(raw).summary`: only the phases and the PCIe
    spans become (small) frames, in the order `build_result` gives them."""
    pcie = frozenset(PCIE_STREAMS.values())
    copies = Table(Span)
    copies.rows.extend(row for row in raw.spans.rows if row[1] in pcie)
    return summarize(raw, _sorted_spans(copies), _frame(raw.phases))
