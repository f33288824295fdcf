"""Chrome / Perfetto trace (JSON trace-event format) of a run.

Layout, as Perfetto shows it (https://ui.perfetto.dev, Open trace file):

- one process per rank, "rank R (gpuR)", holding one thread (track) per stream: "phases"
  (fwd 0, bwd 0, ..., bwd 1 (boundary), update), on the rank `zerosim run` reports "critical
  path" (what each phase waited on, `Result.critical_path`: the op, or "host" for its host
  thread), then the rank's streams in `STREAM_ORDER`
  ("compute", "all-gather", "reduce", "PCIe H2D", "PCIe D2H", "CPU", "flush", ...,
  "NVMe read", "NVMe write", "swap"; see `STREAM_NAMES`); and the counters of its GPU: HBM
  in GiB by category (plus the total) and PCIe / NVLink throughput in GB/s;
- one process per host, "host0 (CPU, memory)": host memory in GiB by category (plus the
  total), memory bandwidth per NUMA domain in GB/s, CPU threads busy;
- an instant event "out of memory" where an OOM run failed.

A compact trace (`TraceDetail.compact`, `zerosim run --compact-trace`) is for large runs: one
rank per group of ranks with identical timelines (its process named after the group) and
every counter track cut to at most `COMPACT_COUNTER_POINTS` samples: per interval, each value's
maximum at the interval's first change and its level at the last, so peaks and final levels
survive.

Times are written in microseconds with exactly three decimals, i.e. whole nanoseconds, the
resolution Perfetto stores; a slice's end is quantised the same way, so two slices that touch
in the simulation also touch in Perfetto and slices on one track never overlap (an in-order
stream has no overlapping spans; anything that would overlap goes to an extra lane track,
"PCIe D2H (2)").
"""

from __future__ import annotations

import gc
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from zerosim.results.groups import identical_rank_groups
from zerosim.units import GB, GiB, ordered_sum
from zerosim.vocabulary import (
    DeviceKind,
    LinkKind,
    Phase,
    Status,
    Stream,
    device_name,
    device_parts,
    is_gpu,
    split_resource,
)

NS_PER_S = 1_000_000_000
PHASES_TRACK = "phases"
"""The track of a rank's phases (not a stream of the engine)."""
CRITICAL_TRACK = "critical path"
"""The track of what each phase of the reported rank waited on (`Result.critical_path`)."""
STREAM_ORDER: tuple[str, ...] = (PHASES_TRACK, CRITICAL_TRACK, *Stream)
"""Tracks of a rank, top to bottom: the phases, the critical path (the reported rank's), then
every stream in `Stream`'s order."""
STREAM_NAMES: dict[str, str] = {
    PHASES_TRACK: "phases",
    CRITICAL_TRACK: "critical path",
    Stream.HOST: "host thread",
    Stream.COMPUTE: "compute",
    Stream.ALLGATHER: "all-gather",
    Stream.FETCH_COPIES: "fetch copies",
    Stream.REDUCE: "reduce",
    Stream.PCIE_H2D: "PCIe H2D",
    Stream.PCIE_D2H: "PCIe D2H",
    Stream.CPU: "CPU",
    Stream.FLUSH: "flush",
    Stream.CPU_FLUSH: "CPU flush",
    Stream.OPTIMIZER_GPU: "optimizer (GPU)",
    Stream.STATE_TO_GPU: "optimizer state in (GPU)",
    Stream.COPY_BACK: "copy-back",
    Stream.CPU_COPY_BACK: "CPU copy-back",
    Stream.COPIER_PARAMS: "copier: fp32 params",
    Stream.COPIER_EXP_AVG: "copier: exp_avg",
    Stream.COPIER_EXP_AVG_SQ: "copier: exp_avg_sq",
    Stream.COPIER_FP16: "copier: 16-bit params",
    Stream.CPU_DOWNSCALE: "CPU downscale",
    Stream.CPU_ZENFLOW: "CPU ZenFlow optimizer",
    Stream.CPU_SUPEROFFLOAD: "CPU SuperOffload optimizer",
    Stream.NVME_READ: "NVMe read",
    Stream.NVME_WRITE: "NVMe write",
    Stream.SWAP: "swap",
}
"""Display name of each track."""
_TRACK_INDEX = {str(track): index for index, track in enumerate(STREAM_ORDER)}
LANES_PER_STREAM = 1000
HOST_PID_OFFSET = 1000
OTHER_PID_OFFSET = 2000
LINK_NAMES: dict[LinkKind, str] = {
    LinkKind.PCIE_H2D: "PCIe H2D",
    LinkKind.PCIE_D2H: "PCIe D2H",
    LinkKind.NVLINK: "NVLink",
    LinkKind.PEER: "GPU peers (PCIe)",
    LinkKind.SWITCH_H2D: "PCIe switch uplink H2D",
    LinkKind.SWITCH_D2H: "PCIe switch uplink D2H",
    LinkKind.NIC: "NIC",
    LinkKind.HOST_MEMORY: "memory",
    LinkKind.SOCKET_LINK: "socket link",
    LinkKind.CPU: "CPU",
    LinkKind.NVME_READ: "NVMe read",
    LinkKind.NVME_WRITE: "NVMe write",
}
"""Display name of each kind of shared resource."""
KIND_COLUMNS = ("op_kind", "buffer_kind")
"""Span columns copied into a slice's args when set."""
COMPACT_COUNTER_POINTS = 2000
"""Samples per counter track in a compact trace (two per interval: its maximum, its end)."""


@dataclass(frozen=True)
class TraceDetail:
    """What a trace keeps: every counter change or at most `counter_points` per track, every
    rank or one per group of identical ranks (`rank_groups`: the ranks each kept rank stands
    for, keyed by the kept rank)."""

    counter_points: int | None = None
    rank_groups: Mapping[int, Sequence[int]] | None = None

    @classmethod
    def compact(cls, spans: pd.DataFrame) -> TraceDetail:
        ranks = sorted(int(r) for r in set(spans["rank"]))
        groups = identical_rank_groups(spans, ranks)
        return cls(COMPACT_COUNTER_POINTS, {group[0]: tuple(group) for group in groups})

    def keeps(self, rank: int) -> bool:
        return self.rank_groups is None or rank in self.rank_groups

    def describe(self) -> dict[str, Any]:
        """What the trace's `otherData` says about its detail."""
        out: dict[str, Any] = {}
        if self.counter_points is not None:
            out["counters"] = (f"at most {self.counter_points} samples per track: per interval "
                               "the maximum of each value and its level at the end")
        if self.rank_groups is not None:
            out["ranks"] = {str(k): list(v) for k, v in sorted(self.rank_groups.items())}
        return out


def stream_name(stream: str) -> str:
    """The display name of a stream (the stream itself when it has none)."""
    return STREAM_NAMES.get(stream, str(stream))


def link_name(resource: str) -> str:
    """'gpu0 PCIe H2D', 'host0 NUMA1 memory', 'host0 numa0->numa1', 'host0 switch1 PCIe switch
    uplink H2D': a resource for people."""
    device, kind, where = split_resource(resource)
    if kind is LinkKind.HOST_MEMORY:
        return f"{device} {where.upper()} memory"
    if kind is None or kind is LinkKind.SOCKET_LINK:
        return f"{device} {where}"
    if where:
        return f"{device} {where} {LINK_NAMES[kind]}"
    return f"{device} {LINK_NAMES[kind]}"


def phase_label(phase: str, micro_batch: int, boundary: int | None) -> str:
    """'fwd 0', 'bwd 1 (boundary)', 'update': the name of one phase of one micro-batch."""
    if phase == Phase.FORWARD:
        return f"fwd {micro_batch}"
    if phase == Phase.BACKWARD:
        return f"bwd {micro_batch}" + (" (boundary)" if micro_batch == boundary else "")
    return str(phase)


def _ns(seconds: np.ndarray | float) -> np.ndarray:
    return np.rint(np.asarray(seconds, dtype=float) * NS_PER_S).astype(np.int64)


def _us(ns: int) -> float:
    """Whole nanoseconds as microseconds (three decimals; exact on the way back)."""
    return int(ns) / 1000


def _finite(value: float) -> float:
    return float(value) if math.isfinite(value) else 0.0


def assign_lanes(starts_ns: Iterable[int], ends_ns: Iterable[int]) -> list[int]:
    """Greedy lane per slice (given in start order) so that slices in one lane never overlap:
    a slice may start exactly where the previous one in its lane ended."""
    lane_ends: list[int] = []
    lanes = []
    for start, end in zip(starts_ns, ends_ns, strict=True):
        for lane, free_at in enumerate(lane_ends):
            if start >= free_at:
                lane_ends[lane] = max(end, start)
                lanes.append(lane)
                break
        else:
            lane_ends.append(max(end, start))
            lanes.append(len(lane_ends) - 1)
    return lanes


def thread_id(stream: str, lane: int) -> int:
    base = _TRACK_INDEX.get(str(stream), len(STREAM_ORDER))
    return base * LANES_PER_STREAM + lane


def _thread_name(stream: str, lane: int) -> str:
    name = stream_name(stream)
    return name if lane == 0 else f"{name} ({lane + 1})"


def _phase_rows(phases: pd.DataFrame) -> pd.DataFrame:
    """Phases as span-like rows on a 'phases' stream, named 'fwd 0' ... 'update'."""
    backward = phases[phases.phase == Phase.BACKWARD]
    boundary = None if backward.empty else int(backward.micro_batch.max())
    names = [phase_label(p, int(m), boundary)
             for p, m in zip(phases.phase, phases.micro_batch, strict=True)]
    return phases.assign(stream=PHASES_TRACK, op=names, bytes=0.0)


def _critical_rows(critical: pd.DataFrame | None) -> pd.DataFrame:
    """The critical path's steps as span-like rows on its track, each named by the op it
    waited on (or 'host'), and by that op's rank where it is another's."""
    if critical is None:
        return pd.DataFrame()
    names = [(op or stream) + ("" if op_rank == rank else f" (rank {op_rank})")
             for op, stream, rank, op_rank in zip(critical.op, critical.stream, critical["rank"],
                                                  critical.op_rank, strict=True)]
    return critical.assign(stream=CRITICAL_TRACK, op=names, bytes=0.0)


def _slices(spans: pd.DataFrame, phases: pd.DataFrame, critical: pd.DataFrame | None = None
            ) -> tuple[list[dict], set]:
    kinds = [c for c in KIND_COLUMNS if c in spans.columns]
    columns = ["rank", "stream", "phase", "micro_batch", "op", "start_s", "end_s", "bytes",
               *kinds]
    phase_rows = _phase_rows(phases).assign(**dict.fromkeys(kinds, ""))
    critical_rows = _critical_rows(critical)
    frames = [f[columns] for f in (spans, phase_rows, critical_rows) if not f.empty]
    if not frames:
        return [], set()
    everything = pd.concat(frames, ignore_index=True)
    everything = everything.assign(start_ns=_ns(everything.start_s),
                                   end_ns=_ns(everything.end_s))
    events, threads = [], set()
    for (rank, stream), group in everything.groupby(["rank", "stream"], sort=True):
        group = group.sort_values(["start_ns", "end_ns"], kind="stable")
        starts, ends = group.start_ns.tolist(), group.end_ns.tolist()
        lanes = assign_lanes(starts, ends)
        tracks = {lane: thread_id(stream, lane) for lane in set(lanes)}
        threads.update((int(rank), tid, _thread_name(stream, lane))
                       for lane, tid in tracks.items())
        events += _slice_events(group, kinds, int(rank), [tracks[lane] for lane in lanes],
                                starts, ends)
    return events, threads


def _slice_events(group: pd.DataFrame, kinds: Sequence[str], pid: int, tids: Sequence[int],
                  starts: Sequence[int], ends: Sequence[int]) -> list[dict]:
    """One complete ("X") event per row of one track's rows in order, each on its lane's
    thread: the op, its phase, micro-batch and bytes, and the kinds that are set."""
    kind_values = [group[column].tolist() for column in kinds]
    kind_rows = zip(*kind_values, strict=True) if kinds else ((),) * len(group)
    events = []
    for name, phase, micro_batch, nbytes, tid, start, end, kind_row in zip(
            group.op.tolist(), group.phase.tolist(), group.micro_batch.tolist(),
            group.bytes.tolist(), tids, starts, ends, kind_rows, strict=True):
        args = {"phase": str(phase), "micro_batch": int(micro_batch), "bytes": _finite(nbytes)}
        for column, value in zip(kinds, kind_row, strict=True):
            if isinstance(value, str) and value:
                args[column] = value
        events.append({"name": str(name), "cat": str(phase), "ph": "X", "pid": pid, "tid": tid,
                       "ts": _us(start), "dur": _us(max(end - start, 0)), "args": args})
    return events


def memory_levels(memory: pd.DataFrame, device: str) -> pd.DataFrame:
    """Level (bytes) of every category of `device` at each time it changed: one row per time,
    one column per category, forward-filled step curves (the last change at a time wins)."""
    rows = memory[memory.device == device]
    rows = rows.iloc[np.argsort(rows.t_s.to_numpy(), kind="stable")]
    wide = rows.pivot_table(index="t_s", columns="category", values="bytes", aggfunc="last")
    wide.columns.name = None
    return wide.ffill().fillna(0.0)


def _device_pid(device: str, ranks: set[int], others: dict[str, int]) -> int:
    """gpuN lives in rank N's process, hostN in its host process, anything else alone."""
    kind, index = device_parts(device) or (None, -1)
    if kind is DeviceKind.GPU and index in ranks:
        return index
    if kind is DeviceKind.HOST:
        return HOST_PID_OFFSET + index
    return others.setdefault(device, OTHER_PID_OFFSET + len(others))


def _memory_counters(memory: pd.DataFrame, device: str, pid: int) -> list[dict]:
    """One counter event per instant at which a category changed: the changed categories'
    levels and the device total, in GiB (each arg becomes its own Perfetto track)."""
    rows = memory[memory.device == device]
    name = f"{device} {memory_kind(device)} GiB"
    order = np.argsort(rows.t_s.to_numpy(), kind="stable")
    times = _ns(rows.t_s.to_numpy()[order]).tolist()
    categories = rows.category.to_numpy()[order].tolist()
    levels_now = rows.bytes.to_numpy(dtype=float)[order].tolist()
    events: list[dict] = []
    levels: dict[str, float] = {}
    changed: dict[str, float] = {}
    for index, (t_ns, category, level) in enumerate(zip(times, categories, levels_now,
                                                        strict=True)):
        levels[str(category)] = float(level)
        changed[str(category)] = float(level) / GiB
        if index + 1 < len(times) and times[index + 1] == t_ns:
            continue
        args = dict(changed)
        args["total"] = ordered_sum(levels.values()) / GiB
        events.append({"name": name, "ph": "C", "pid": pid, "ts": _us(t_ns), "args": args})
        changed = {}
    return events


def memory_kind(device: str) -> str:
    """What a device's memory is called: 'HBM' on a GPU, 'memory' elsewhere."""
    return "HBM" if is_gpu(device) else "memory"


def _link_name(resource: str) -> tuple[str, str]:
    """('gpu0 PCIe H2D', 'GB/s') for 'gpu0.pcie.h2d'; the CPU counts threads, not bytes."""
    kind = split_resource(resource)[1]
    if kind is LinkKind.CPU:
        return link_name(resource), "threads busy"
    if kind is LinkKind.HOST_MEMORY:
        return f"{link_name(resource)} bandwidth", "GB/s"
    return link_name(resource), "GB/s"


def _link_counters(links: pd.DataFrame, pid_of: Mapping[str, int]) -> list[dict]:
    events = []
    for resource, rows in links.groupby("resource", sort=True):
        name, unit = _link_name(str(resource))
        scale = 1.0 if unit == "threads busy" else 1 / GB
        pid = pid_of[split_resource(str(resource))[0]]
        rows = rows.assign(t_ns=_ns(rows.t_s)).drop_duplicates("t_ns", keep="last")
        rates = rows.rate.to_numpy(dtype=float) * scale
        rates[~np.isfinite(rates)] = 0.0
        events += [{"name": name, "ph": "C", "pid": pid, "ts": _us(t_ns), "args": {unit: rate}}
                   for t_ns, rate in zip(rows.t_ns.tolist(), rates.tolist(), strict=True)]
    return events


def _oom_event(summary: Mapping[str, Any] | None, pid_of: Mapping[str, int]) -> list[dict]:
    oom = (summary or {}).get("oom")
    if not summary or summary.get("status") != Status.OOM or not oom:
        return []
    pid = pid_of.get(str(oom.get("device")), 0)
    return [{"name": "out of memory", "ph": "i", "s": "p", "pid": pid, "tid": 0,
             "ts": _us(int(_ns(float(oom["t_s"])))), "args": dict(oom)}]


def sample_counters(events: list[dict], points: int) -> list[dict]:
    """At most `points` counter events for one track (events of one name and process, in time
    order): the track's span cut into `points // 2` equal intervals, each giving one event at
    its first change with every value's maximum over the interval and one at its last change
    with the levels there (until then the previous interval's last level holds)."""
    if len(events) <= points:
        return events
    frame = pd.DataFrame([e["args"] for e in events]).ffill()
    times = np.array([e["ts"] for e in events], dtype=float)
    span = times[-1] - times[0]
    bins = max(points // 2, 1)
    index = np.minimum(((times - times[0]) / span * bins).astype(int), bins - 1)
    columns = [str(c) for c in frame.columns]
    maxima = frame.groupby(index, sort=True).max().to_numpy(dtype=float)
    ends = pd.Series(np.arange(len(frame))).groupby(index, sort=True).agg(["first", "last"])
    levels = frame.to_numpy(dtype=float)
    sampled: list[dict] = []
    template = {k: v for k, v in events[0].items() if k not in ("ts", "args")}
    for row, (first, last) in enumerate(zip(ends["first"].tolist(), ends["last"].tolist(),
                                            strict=True)):
        sampled.append({**template, "ts": float(times[first]),
                        "args": _present(columns, maxima[row])})
        if last != first:
            sampled.append({**template, "ts": float(times[last]),
                            "args": _present(columns, levels[last])})
    return sampled


def _present(columns: Sequence[str], values: np.ndarray) -> dict[str, float]:
    """The values that are set (a track's columns not yet seen are NaN), by column."""
    return {column: value for column, value in zip(columns, values.tolist(), strict=True)
            if value == value}


def _sampled(counters: list[dict], points: int | None) -> list[dict]:
    if points is None:
        return counters
    tracks: dict[tuple[str, int], list[dict]] = {}
    for event in counters:
        tracks.setdefault((event["name"], event["pid"]), []).append(event)
    return [e for track in tracks.values() for e in sample_counters(track, points)]


def _kept_devices(memory: pd.DataFrame, links: pd.DataFrame, detail: TraceDetail
                  ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Memory and link rows of the kept ranks' GPUs and of every other device."""
    def kept(device: str) -> bool:
        parts = device_parts(device)
        return parts is None or parts[0] is not DeviceKind.GPU or detail.keeps(parts[1])

    kept_devices = [d for d in set(memory.device) if kept(str(d))]
    kept_resources = [r for r in set(links.resource) if kept(split_resource(str(r))[0])]
    return (memory[memory.device.isin(kept_devices)], links[links.resource.isin(kept_resources)])


def _rank_process_name(rank: int, detail: TraceDetail) -> str:
    gpu = device_name(DeviceKind.GPU, rank)
    group = (detail.rank_groups or {}).get(rank, (rank,))
    if len(group) == 1:
        return f"rank {rank} ({gpu})"
    listed = ", ".join(str(r) for r in group[:4]) + (", ..." if len(group) > 4 else "")
    return f"rank {rank} ({gpu}) = ranks {listed} (x{len(group)})"


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a trace is built: its events are a million
    dicts on a large run, none in a cycle, and the collector's passes over them as they pile up
    took two fifths of the build (3.6 s -> 2.1 s for a DP=8 Llama-3.1-70B's 1.03 million
    events)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def build_trace(spans: pd.DataFrame, phases: pd.DataFrame, memory: pd.DataFrame,
                links: pd.DataFrame, scenario_name: str,
                summary: Mapping[str, Any] | None = None,
                detail: TraceDetail = TraceDetail(),
                critical: pd.DataFrame | None = None) -> dict[str, Any]:
    """The trace as a JSON-ready dict: {"traceEvents": [...], ...}; `critical`
    (`Result.critical_path`) adds a "critical path" track to its rank."""
    with _collector_paused():
        return _built_trace(spans, phases, memory, links, scenario_name, summary, detail,
                            critical)


def _built_trace(spans: pd.DataFrame, phases: pd.DataFrame, memory: pd.DataFrame,
                 links: pd.DataFrame, scenario_name: str, summary: Mapping[str, Any] | None,
                 detail: TraceDetail, critical: pd.DataFrame | None) -> dict[str, Any]:
    if detail.rank_groups is not None:
        spans = spans[spans["rank"].map(detail.keeps).astype(bool)]
        phases = phases[phases["rank"].map(detail.keeps).astype(bool)]
        if critical is not None:
            critical = critical[critical["rank"].map(detail.keeps).astype(bool)]
        memory, links = _kept_devices(memory, links, detail)
    slices, threads = _slices(spans, phases, critical)
    ranks = {r for r, _, _ in threads}
    devices = sorted(set(memory.device) | {split_resource(str(r))[0] for r in set(links.resource)},
                     key=lambda d: (not is_gpu(d), len(d), d))
    others: dict[str, int] = {}
    pid_of = {d: _device_pid(d, ranks, others) for d in devices}
    if summary and summary.get("status") == Status.OOM:
        threads.add((pid_of.get(str((summary.get("oom") or {}).get("device")), 0), 0,
                     PHASES_TRACK))
    meta: list[dict] = []

    def process(pid: int, name: str, sort_index: int) -> None:
        meta.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                     "args": {"name": name}})
        meta.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                     "args": {"sort_index": sort_index}})

    pids = {pid for pid, _, _ in threads} | set(pid_of.values())
    for pid in sorted(pids):
        if pid < HOST_PID_OFFSET:
            process(pid, _rank_process_name(pid, detail), pid)
        elif pid < OTHER_PID_OFFSET:
            process(pid, f"{device_name(DeviceKind.HOST, pid - HOST_PID_OFFSET)} (CPU, memory)",
                    pid)
        else:
            name = next(d for d, p in pid_of.items() if p == pid)
            process(pid, name, pid)
    for pid, tid, name in sorted(threads):
        meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                     "args": {"name": name}})
        meta.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                     "args": {"sort_index": tid}})
    counters = []
    for device in sorted(set(memory.device), key=lambda d: (not is_gpu(d), d)):
        counters += _memory_counters(memory, device, pid_of[device])
    counters += _link_counters(links, pid_of)
    counters = _sampled(counters, detail.counter_points)
    return {"traceEvents": meta + slices + counters + _oom_event(summary, pid_of),
            "displayTimeUnit": "ms",
            "otherData": {"scenario": scenario_name, "generator": "zerosim",
                          **detail.describe()}}

