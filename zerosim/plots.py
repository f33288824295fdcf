"""Figures of a run: timeline, memory over time, PCIe throughput, phase breakdown, sweeps.

Every function builds a fresh :class:`matplotlib.figure.Figure` (no pyplot, so nothing leaks
into a global figure registry and any backend, Agg included, works) and returns it; save it
with ``fig.savefig(path)`` or let a notebook display it. Colours come from one module-level
mapping so that a stream or a memory category has the same colour in every figure; the palette
is Okabe-Ito (colour-blind safe), extended with Paul Tol's muted colours where a figure needs
more than eight.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.textpath import TextPath
from matplotlib.ticker import EngFormatter, FuncFormatter, NullFormatter

from zerosim.results.groups import identical_rank_groups
from zerosim.results.trace import (
    STREAM_NAMES,
    link_name,
    memory_kind,
    memory_levels,
    phase_label,
    stream_name,
)
from zerosim.units import GB, GiB, figure_text, ordered_sum
from zerosim.vocabulary import (
    PHASE_TIMES,
    Category,
    DeviceKind,
    LinkKind,
    Phase,
    PhaseTime,
    Status,
    Stream,
    base_category,
    device_name,
    device_parts,
    devices_of,
    is_gpu,
    resource_name,
    span_kind,
    split_resource,
)

# Okabe & Ito (2008), "Color Universal Design"; plus Paul Tol's muted scheme for extra slots.
OKABE_ITO = {
    "orange": "#E69F00", "sky blue": "#56B4E9", "bluish green": "#009E73", "yellow": "#F0E442",
    "blue": "#0072B2", "vermillion": "#D55E00", "reddish purple": "#CC79A7", "black": "#000000",
}
TOL_MUTED = ("#332288", "#88CCEE", "#44AA99", "#117733", "#999933", "#DDCC77", "#CC6677",
             "#882255", "#AA4499")
GREY = "#999999"

STREAMS: tuple[Stream, ...] = tuple(Stream)
"""Rows of a rank in the timeline, top to bottom."""
STREAM_LABELS: dict[str, str] = {stream: STREAM_NAMES[stream] for stream in Stream}
STREAM_COLORS: dict[Stream, str] = {
    Stream.HOST: "#555555",
    Stream.COMPUTE: OKABE_ITO["blue"],
    Stream.ALLGATHER: OKABE_ITO["sky blue"],
    Stream.FETCH_COPIES: OKABE_ITO["sky blue"],
    Stream.REDUCE: OKABE_ITO["orange"],
    Stream.PCIE_H2D: OKABE_ITO["bluish green"],
    Stream.PCIE_D2H: OKABE_ITO["vermillion"],
    Stream.CPU: OKABE_ITO["reddish purple"],
    Stream.FLUSH: TOL_MUTED[6],
    Stream.CPU_FLUSH: TOL_MUTED[8],
    Stream.OPTIMIZER_GPU: TOL_MUTED[0],
    Stream.STATE_TO_GPU: TOL_MUTED[2],
    Stream.COPY_BACK: TOL_MUTED[3],
    Stream.CPU_COPY_BACK: TOL_MUTED[7],
    Stream.COPIER_PARAMS: TOL_MUTED[2],
    Stream.COPIER_EXP_AVG: TOL_MUTED[4],
    Stream.COPIER_EXP_AVG_SQ: TOL_MUTED[5],
    Stream.COPIER_FP16: TOL_MUTED[3],
    Stream.CPU_DOWNSCALE: TOL_MUTED[8],
    Stream.CPU_ZENFLOW: TOL_MUTED[7],
    Stream.CPU_SUPEROFFLOAD: TOL_MUTED[7],
    Stream.NVME_READ: TOL_MUTED[4],
    Stream.NVME_WRITE: TOL_MUTED[5],
    Stream.SWAP: TOL_MUTED[1],
}

# Memory categories, bottom of the stack first. A label such as "fp32 grads (pinned)" takes
# the colour and position of its category (`vocabulary.base_category`); the GPU copies of
# the optimizer's buffers share the colours of the host ones.
MEMORY_COLORS: dict[Category, str] = {
    # GPU HBM
    Category.RUNTIME_CONTEXT: GREY,
    Category.FRAMEWORK_BUFFERS: "#BBBBBB",
    Category.PARAMS_16BIT: OKABE_ITO["blue"],
    Category.PARAMS_PERSISTENT: TOL_MUTED[0],
    Category.IPG_BUCKET: OKABE_ITO["yellow"],
    Category.PARAMS_GATHERED: OKABE_ITO["sky blue"],
    Category.PARAMS_SECONDARY: "#4477AA",
    Category.QUANTIZED_GATHER: "#CCBB44",
    Category.QUANTIZED_REDUCE: "#EE7733",
    Category.QGZ_ERROR_FEEDBACK: "#AA3377",
    Category.GRADS: OKABE_ITO["orange"],
    Category.GRAD_PARTITIONS: OKABE_ITO["vermillion"],
    Category.BOUNDARY_GRAD_BUFFER: TOL_MUTED[6],
    Category.ACTIVATIONS: OKABE_ITO["bluish green"],
    Category.WORKSPACE: OKABE_ITO["reddish purple"],
    # host memory (and the optimizer on the GPU)
    Category.FP32_MASTER: TOL_MUTED[2],
    Category.FP32_MASTER_GPU: TOL_MUTED[2],
    Category.OPTIMIZER_STATES: TOL_MUTED[7],
    Category.OPTIMIZER_STATES_GPU: TOL_MUTED[7],
    Category.PREFETCHED_STATE: TOL_MUTED[8],
    Category.FP32_GRADS: TOL_MUTED[5],
    Category.FP32_GRADS_GPU: TOL_MUTED[5],
    Category.GRAD_ACCUMULATION: TOL_MUTED[4],
    Category.SWAP_BUFFERS: TOL_MUTED[1],
    Category.CPU_ADAM_BUFFERS: TOL_MUTED[3],
    Category.FORKED_PAGES: "#DDDDDD",
    Category.RANK_PROCESSES: "#C8C8C8",
    Category.OS: "#B0B0B0",
    Category.PAGEABLE_TEMPORARIES: OKABE_ITO["black"],
}
MEMORY_ORDER = tuple(MEMORY_COLORS)
_SPARE_COLORS = (TOL_MUTED[1], TOL_MUTED[3], TOL_MUTED[6], TOL_MUTED[8], "#DDDDDD")

PHASE_KEYS = PHASE_TIMES
PHASE_LABELS = {PhaseTime.FORWARD: "forward",
                PhaseTime.BACKWARD_NON_BOUNDARY: "backward\n(non-boundary)",
                PhaseTime.BACKWARD_BOUNDARY: "backward\n(boundary)",
                PhaseTime.UPDATE: "optimizer\nupdate"}
PHASE_BAND_COLORS = {Phase.FORWARD: "#E4EFF9", Phase.BACKWARD: "#FCF0DE",
                     Phase.UPDATE: "#F1EAF0"}
PHASE_STRIP_COLORS = {Phase.FORWARD: "#B9D7EF", Phase.BACKWARD: "#F6D3A1",
                      Phase.UPDATE: "#DCC8D9"}
BOUNDARY_HATCH_COLOR = "#EBCB9B"
SIMULATED_COLOR = OKABE_ITO["blue"]
MEASURED_COLOR = OKABE_ITO["orange"]
OOM_COLOR = OKABE_ITO["vermillion"]

TITLE_SIZE = 11


def memory_color(category: str) -> str:
    """The colour of a memory category label (the same in every figure); a label no
    `Category` makes gets a spare colour picked by its text."""
    base = base_category(category)
    if base is not None and base in MEMORY_COLORS:
        return MEMORY_COLORS[base]
    return _SPARE_COLORS[zlib.crc32(str(category).encode()) % len(_SPARE_COLORS)]


def stream_color(stream: str) -> str:
    """The colour of a stream (the same in every figure)."""
    return STREAM_COLORS.get(stream, GREY)


def _category_key(category: str) -> tuple[int, str]:
    base = base_category(category)
    rank = MEMORY_ORDER.index(base) if base in MEMORY_ORDER else len(MEMORY_ORDER)
    return rank, category


def _new_figure(width: float, height: float) -> Figure:
    return Figure(figsize=(width, height), layout="constrained")


def _scenario_name(result) -> str:
    return str(result.summary.get("scenario", result.scenario_name))


def _end_time(result) -> float:
    """The last instant of the run: the end of the last phase, span or memory change."""
    candidates = [0.0]
    for frame, column in ((result.phases, "end_s"), (result.spans, "end_s"),
                          (result.memory, "t_s"), (result.links, "t_s")):
        if not frame.empty:
            candidates.append(float(frame[column].max()))
    oom = result.summary.get("oom")
    if oom:  # leave room after the failure so that its marker is not on the frame
        candidates.append(float(oom["t_s"]) * 1.04)
    return max(candidates)


# ------------------------------------------------------------------------------ phase bands

def _phase_rows(phases: pd.DataFrame, rank: int | None) -> pd.DataFrame:
    if phases.empty:
        return phases
    if rank is None or rank not in set(phases["rank"]):
        rank = int(phases["rank"].min())
    return phases[phases["rank"] == rank].sort_values("start_s")


def _boundary(phases: pd.DataFrame) -> int | None:
    backward = phases[phases.phase == Phase.BACKWARD]
    return None if backward.empty else int(backward.micro_batch.max())


def _draw_phase_bands(ax, phases: pd.DataFrame, *, rank: int | None = None) -> None:
    """Shade each phase of `rank` behind the data."""
    for row in _phase_rows(phases, rank).itertuples(index=False):
        ax.axvspan(row.start_s, row.end_s, color=PHASE_BAND_COLORS.get(row.phase, "#EEEEEE"),
                   zorder=0, lw=0)


STRIP_HEIGHT_IN = 0.36
LABEL_FONT = 8.5


def _text_width_in(text: str, size: float) -> float:
    return TextPath((0, 0), text, size=size).get_extents().width / 72


def _phase_strip(ax, phases: pd.DataFrame, *, rank: int | None, t_range: tuple[float, float],
                 axes_width_in: float) -> None:
    """A thin band above a time axis naming each phase: 'fwd 0', 'bwd 1 (boundary)',
    'update'. A phase too narrow for its name gets it without the parenthesis, or rotated;
    the widest phases are labelled first and a label that would collide is left out."""
    rows = _phase_rows(phases, rank)
    boundary = _boundary(phases)
    lo, hi = t_range
    per_in = axes_width_in / max(hi - lo, 1e-12)
    pad_in = 0.06
    rotated_in = LABEL_FONT / 72
    candidates = []
    for row in rows.itertuples(index=False):
        start, end = max(row.start_s, lo), min(row.end_s, hi)
        if end <= start:
            continue
        ax.broken_barh([(start, end - start)], (0, 1), edgecolor="white", lw=0.8,
                       facecolors=PHASE_STRIP_COLORS.get(row.phase, "#CCCCCC"))
        if row.phase == Phase.BACKWARD and int(row.micro_batch) == boundary:
            ax.broken_barh([(start, end - start)], (0, 1), facecolors="none", hatch="//",
                           edgecolor=BOUNDARY_HATCH_COLOR, lw=0)
        candidates.append((end - start, (start + end) / 2,
                           phase_label(row.phase, int(row.micro_batch), boundary),
                           phase_label(row.phase, int(row.micro_batch), None)))
    placed: list[tuple[float, float]] = []
    for width, middle, text, short in sorted(candidates, reverse=True):
        width_in, centre_in = width * per_in, (middle - lo) * per_in
        for label, rotation in ((text, 0), (short, 0), (short, 90)):
            extent = rotated_in if rotation else _text_width_in(label, LABEL_FONT)
            if rotation == 0 and extent + pad_in > width_in:
                continue
            left, right = centre_in - extent / 2, centre_in + extent / 2
            if all(right <= a or left >= b for a, b in placed):
                placed.append((left, right))
                ax.text(middle, 0.5, label, ha="center", va="center", fontsize=LABEL_FONT,
                        rotation=rotation)
            break
    ax.set_ylim(0, 1)
    ax.set_yticks([])
    ax.tick_params(axis="x", labelbottom=False, length=0)
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)


def _time_figure(width: float, main_heights: Sequence[float], phases: pd.DataFrame,
                 legend_in: float = 2.4):
    """A figure of stacked time axes sharing x, with a phase strip on top when there are
    phases. Returns (fig, strip_ax or None, [main axes], axes width in inches)."""
    fig = _new_figure(width, ordered_sum(main_heights) + 1.1 + (STRIP_HEIGHT_IN if not phases.empty
                                                        else 0.0))
    heights = ([STRIP_HEIGHT_IN] if not phases.empty else []) + list(main_heights)
    axes = fig.subplots(len(heights), 1, sharex=True, squeeze=False,
                        gridspec_kw={"height_ratios": heights, "hspace": 0.02})[:, 0]
    strip = axes[0] if not phases.empty else None
    main = list(axes[1:] if strip is not None else axes)
    return fig, strip, main, width - legend_in - 1.2


# ------------------------------------------------------------------------------ timeline

def _lighter(color: str, amount: float) -> tuple[float, float, float]:
    r, g, b = to_rgb(color)
    return (r + (1 - r) * amount, g + (1 - g) * amount, b + (1 - b) * amount)


def _title(strip, ax, text: str) -> None:
    (strip if strip is not None else ax).set_title(text, fontsize=TITLE_SIZE)


MAX_TIMELINE_RANKS = 8
"""Past this many ranks, `timeline` folds ranks with identical spans into one row group."""


def _ranks_label(group: Sequence[int]) -> str:
    if len(group) == 1:
        return f"rank {group[0]}"
    if list(group) == list(range(group[0], group[-1] + 1)):
        return f"ranks {group[0]}-{group[-1]} (x{len(group)})"
    return f"ranks {group[0]}, {group[1]}{', ...' if len(group) > 2 else ''} (x{len(group)})"


def timeline(result, ranks: Iterable[int] | None = None,
             t_range: tuple[float, float] | None = None) -> Figure:
    """One row per rank x stream (compute, all-gather, reduce, PCIe H2D, PCIe D2H, CPU), every
    span a bar, with the phases (forward / backward per micro-batch, update) shaded behind and
    named above. Consecutive spans of a row alternate between two shades of the stream's
    colour, so back-to-back spans stay distinguishable. Without `ranks`, a run of more than
    `MAX_TIMELINE_RANKS` ranks shows ranks with identical spans as one row group with their
    count, and at most `MAX_TIMELINE_RANKS` groups."""
    spans = result.spans
    all_ranks = sorted({int(r) for r in spans["rank"]} | {int(r) for r in result.phases["rank"]})
    chosen = sorted({int(r) for r in ranks}) if ranks is not None else all_ranks
    missing = sorted(set(chosen) - set(all_ranks)) if all_ranks else []
    if missing:
        raise ValueError(f"no rank {', '.join(map(str, missing))} in this run; ranks: "
                         f"{', '.join(map(str, all_ranks))}")
    chosen = chosen or [0]
    folded = [[rank] for rank in chosen]
    folding = ranks is None and len(chosen) > MAX_TIMELINE_RANKS
    if folding:
        folded = identical_rank_groups(spans, chosen)
        chosen = [group[0] for group in folded[:MAX_TIMELINE_RANKS]]
    labels = {group[0]: _ranks_label(group) for group in folded}
    lo, hi = t_range if t_range is not None else (0.0, _end_time(result))
    spans = spans[spans["rank"].isin(chosen)]
    if t_range is not None:
        spans = spans[(spans.end_s >= lo) & (spans.start_s <= hi)]
    rows: list[tuple[int, str]] = []  # (rank, stream), top to bottom
    for rank in chosen:
        present = set(spans.loc[spans["rank"] == rank, "stream"])
        streams = [s for s in STREAMS if s in present] + sorted(present - set(STREAMS))
        rows.extend((rank, s) for s in (streams or [Stream.COMPUTE]))
    fig, strip, (ax,), width_in = _time_figure(12, [0.3 * len(rows) + 0.3], result.phases,
                                                legend_in=0.0)
    groups = spans.groupby(["rank", "stream"], sort=False)
    keys = set(groups.groups)
    y_ticks, y_labels = [], []
    for index, (rank, stream) in enumerate(rows):
        y = len(rows) - 1 - index
        y_ticks.append(y)
        name = stream_name(stream)
        y_labels.append(f"{labels[rank]}  {name}" if len(chosen) > 1 or folding else name)
        if (rank, stream) not in keys:
            continue
        group = groups.get_group((rank, stream)).sort_values("start_s", kind="stable")
        bars = np.column_stack([group.start_s.to_numpy(dtype=float),
                                (group.end_s - group.start_s).to_numpy(dtype=float)])
        color = stream_color(stream)
        for parity, shade in ((0, color), (1, _lighter(color, 0.45))):
            ax.broken_barh(bars[parity::2], (y - 0.38, 0.76), facecolors=shade, lw=0,
                           zorder=2, rasterized=True)
    first_row = 0
    for rank in chosen[:-1]:
        first_row += sum(1 for r, _ in rows if r == rank)
        ax.axhline(len(rows) - first_row - 0.5, color="#555555", lw=0.7, zorder=3)
    _draw_phase_bands(ax, result.phases, rank=chosen[0])
    if strip is not None:
        _phase_strip(strip, result.phases, rank=chosen[0], t_range=(lo, hi),
                     axes_width_in=width_in)
    ax.set_yticks(y_ticks, y_labels)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlim(*_time_span(lo, hi))
    ax.set_xlabel("time (s)")
    ax.tick_params(axis="y", length=0)
    ax.grid(axis="x", color="#BBBBBB", lw=0.5, zorder=1)
    title = f"{_scenario_name(result)}: timeline per rank and stream"
    if folding:
        title += (f" ({len(all_ranks)} ranks, identical ones folded"
                  + (f"; the first {len(chosen)} of {len(folded)} groups" if len(folded) >
                     len(chosen) else "") + ")")
    elif len(chosen) < len(all_ranks):
        title += f" (ranks {', '.join(map(str, chosen))} of {len(all_ranks)})"
    if result.summary.get("status") == Status.OOM:
        title += " - out of memory"
    _title(strip, ax, title)
    _mark_oom(ax, result, device=None, y_data=False)
    return fig


# ------------------------------------------------------------------------------ memory

def memory_stack(memory: pd.DataFrame, device: str) -> pd.DataFrame:
    """Level (bytes) of every category of `device` after each change: one row per time at
    which anything changed, one column per category in stacking order (bottom first). The
    curves are steps: a row holds until the next one."""
    if not (memory.device == device).any():
        return pd.DataFrame(index=pd.Index([], name="t_s", dtype=float))
    wide = memory_levels(memory, device)
    return wide[sorted(wide.columns, key=_category_key)]


def memory_total_at(memory: pd.DataFrame, device: str, t_s: float) -> float:
    """Bytes in use on `device` at time `t_s` (after every change at `t_s`)."""
    stack = memory_stack(memory, device)
    before = stack[stack.index <= t_s]
    return 0.0 if before.empty else float(before.iloc[-1].sum())


def _device_rank(device: str) -> int | None:
    kind, index = device_parts(device) or (None, None)
    return index if kind is DeviceKind.GPU else None


def _gib(value: float) -> str:
    return f"{value:.1f}" if value >= 0.095 or value == 0 else f"{value:.2g}"


def memory_over_time(result, device: str = device_name(DeviceKind.GPU, 0)) -> Figure:
    """Memory of one device (``gpu0``, ``gpu1``, ..., ``host0``) over the iteration, stacked by
    category as step curves, with the capacity line and, for an OOM run, where it failed."""
    stack = memory_stack(result.memory, device)
    if stack.empty:
        known = sorted(set(result.memory.device))
        raise ValueError(f"no memory records for device {device!r}; devices: {known}")
    end = max(_end_time(result), float(stack.index.max()))
    times = np.append(stack.index.to_numpy(dtype=float), end)
    levels = stack.to_numpy(dtype=float) / GiB
    levels = np.vstack([levels, levels[-1:]])
    fig, strip, (ax,), width_in = _time_figure(11, [3.6], result.phases)
    bottom = np.zeros(len(times))
    peaks = stack.max() / GiB
    for column, category in enumerate(stack.columns):
        top = bottom + levels[:, column]
        ax.fill_between(times, bottom, top, step="post", color=memory_color(category),
                        label=f"{category} (peak {_gib(peaks[category])})", lw=0, zorder=2,
                        rasterized=len(times) > 2000)
        bottom = top
    ax.step(times, bottom, where="post", color="#222222", lw=0.7, zorder=3,
            label=f"total (peak {_gib(bottom.max())})", gid="memory-total")
    capacity = result.capacities.get(device)
    if capacity:
        ax.axhline(capacity / GiB, color="#000000", ls="--", lw=1.1, zorder=4,
                   label=f"capacity {_gib(capacity / GiB)}", gid="memory-capacity")
    rank = _device_rank(device)
    _draw_phase_bands(ax, result.phases, rank=rank)
    if strip is not None:
        _phase_strip(strip, result.phases, rank=rank, t_range=(0.0, end),
                     axes_width_in=width_in)
    _mark_oom(ax, result, device=device, y_data=True)
    ax.set_xlim(*_time_span(0.0, end))
    ax.set_ylim(0.0, max(bottom.max(), (capacity or 0) / GiB, 1e-3) * 1.06)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("memory (GiB)")
    title = f"{_scenario_name(result)}: {device} {memory_kind(device)} by category"
    if result.summary.get("status") == Status.OOM:
        title += " - out of memory"
    _title(strip, ax, title)
    ax.grid(axis="y", color="#DDDDDD", lw=0.5, zorder=1)
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.005, 1.0),
              fontsize=8, frameon=False, title="GiB", title_fontsize=8, alignment="left")
    return fig


def _mark_oom(ax, result, *, device: str | None, y_data: bool) -> None:
    """A dotted vertical line and a cross where the run ran out of memory (on `device`, or on
    any device when None), with what failed written to its left."""
    oom = result.summary.get("oom")
    if result.summary.get("status") != Status.OOM or not oom:
        return
    if device is not None and oom.get("device") != device:
        return
    t = float(oom["t_s"])
    requested = float(oom.get("requested_GiB") or 0.0)
    in_use = float(oom.get("in_use_GiB") or 0.0)
    text = _oom_text(oom)
    ax.axvline(t, color=OOM_COLOR, lw=1.2, ls=":", zorder=5)
    style = {"marker": "X", "ms": 11, "color": OOM_COLOR, "ls": "none", "zorder": 6,
             "label": "OOM", "gid": "oom-marker", "clip_on": False}
    box = {"boxstyle": "round,pad=0.3", "facecolor": "white", "edgecolor": OOM_COLOR,
           "alpha": 0.9}
    if y_data:
        ax.plot([t], [in_use + requested], **style)
        ax.annotate(text, xy=(t, in_use + requested), xytext=(-12, -10),
                    textcoords="offset points", ha="right", va="top", fontsize=8,
                    color=OOM_COLOR, zorder=7, bbox=box)
    else:
        ax.plot([t], [0.5], transform=ax.get_xaxis_transform(), **style)
        ax.annotate(text, xy=(t, 0.5), xycoords=ax.get_xaxis_transform(), xytext=(-12, 0),
                    textcoords="offset points", ha="right", va="center", fontsize=8,
                    color=OOM_COLOR, zorder=7, bbox=box)


def _oom_text(oom: Mapping[str, Any]) -> str:
    """What ran out of memory, where and when, in three lines."""
    requested = float(oom.get("requested_GiB") or 0.0)
    in_use = float(oom.get("in_use_GiB") or 0.0)
    capacity = oom.get("capacity_GiB")
    return (f"out of memory on {oom.get('device')} at {float(oom['t_s']):.4g} s:\n"
            f"{oom.get('allocation', '?')} needs {requested:.2f} GiB ({oom.get('category', '?')})"
            f"\nwith {in_use:.2f} GiB in use"
            + (f" of {float(capacity):.2f} GiB" if capacity is not None else ""))


# ------------------------------------------------------------------------------ PCIe

def _binned_rate(times: np.ndarray, rates: np.ndarray, end: float, bins: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Mean of a piecewise-constant rate over `bins` equal windows of [0, end]: the exact
    integral over each window divided by its width. `times` starts at 0."""
    knots = np.append(times, end)
    cumulative = np.concatenate([[0.0], np.cumsum(rates * np.diff(knots))])
    edges = np.linspace(0.0, end, bins + 1)
    return edges, np.diff(np.interp(edges, knots, cumulative)) / np.diff(edges)


PCIE_BINS = 200


def pcie_throughput(result, gpu: int = 0) -> Figure:
    """GB/s through GPU `gpu`'s PCIe link, one panel per direction: the instantaneous rate as
    a step curve (constant between two changes) and its mean over short windows on top."""
    fig, strip, axes, width_in = _time_figure(11, [1.9, 1.9], result.phases)
    end = _end_time(result)
    links = result.links
    directions = ((Stream.PCIE_H2D, LinkKind.PCIE_H2D), (Stream.PCIE_D2H, LinkKind.PCIE_D2H))
    for ax, (stream, link) in zip(axes, directions, strict=True):
        rows = links[links.resource == resource_name(device_name(DeviceKind.GPU, gpu), link)]
        color = stream_color(stream)
        name = stream_name(stream)
        _draw_phase_bands(ax, result.phases, rank=gpu)
        if rows.empty or end <= 0:
            ax.text(0.5, 0.5, f"no {name} traffic", transform=ax.transAxes, ha="center",
                    va="center", color="#666666")
        else:
            rates_at = rows.groupby("t_s", sort=True).rate.last()
            times = rates_at.index.to_numpy(dtype=float)
            rates = rates_at.to_numpy(dtype=float) / GB
            if times[0] > 0:
                times, rates = np.insert(times, 0, 0.0), np.insert(rates, 0, 0.0)
            x, y = np.append(times, end), np.append(rates, rates[-1])
            ax.fill_between(x, 0, y, step="post", color=_lighter(color, 0.2), lw=0, zorder=2,
                            label="rate", rasterized=len(x) > 2000)
            edges, mean = _binned_rate(times, rates, end, bins=PCIE_BINS)
            ax.step(edges, np.append(mean, mean[-1]), where="post", color="#000000", lw=1.0,
                    zorder=3, label=f"mean over {_duration(end / PCIE_BINS)}")
            moved = float(np.sum(rates * np.diff(x)))
            ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False,
                      title=f"{name}: {moved:.1f} GB", title_fontsize=8, alignment="left")
        ax.set_ylabel(f"{name} (GB/s)")
        ax.set_ylim(bottom=0)
        ax.grid(axis="y", color="#DDDDDD", lw=0.5, zorder=1)
    if strip is not None:
        _phase_strip(strip, result.phases, rank=gpu, t_range=(0.0, end),
                     axes_width_in=width_in)
    axes[-1].set_xlim(*_time_span(0.0, end))
    axes[-1].set_xlabel("time (s)")
    title = f"{_scenario_name(result)}: {device_name(DeviceKind.GPU, gpu)} PCIe throughput"
    if result.summary.get("status") == Status.OOM:
        title += " - out of memory"
    _title(strip, axes[0], title)
    return fig


def _duration(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


# ------------------------------------------------------------------------------ phases

def _as_summaries(summaries) -> dict[str, Mapping[str, Any]]:
    if isinstance(summaries, Mapping) and "phases_s" in summaries:
        return {str(summaries.get("scenario", "simulated")): summaries}
    if hasattr(summaries, "summary"):
        return {str(summaries.summary.get("scenario", "simulated")): summaries.summary}
    return {str(label): getattr(s, "summary", s) for label, s in summaries.items()}


def phase_breakdown(summaries, measured: Mapping[str, Mapping[str, float]] | None = None
                    ) -> Figure:
    """Phase times (forward, backward non-boundary, backward boundary, update), one panel per
    phase so that a 0.3 s forward and a 12 s boundary backward are both readable.

    `summaries`: {label: summary dict} (a single summary dict or Result works too).
    `measured`: {label: {phase: seconds}} drawn next to the simulated bar of the same label.
    """
    sims = _as_summaries(summaries)
    measured = dict(measured or {})
    labels = list(sims) + [k for k in measured if k not in sims]
    fig = _new_figure(max(9.0, 2.2 * len(PHASE_KEYS) + 0.45 * len(labels) * len(PHASE_KEYS)),
                      4.2)
    axes = fig.subplots(1, len(PHASE_KEYS))
    width = 0.38 if measured else 0.6
    x = np.arange(len(labels))
    for ax, phase in zip(axes, PHASE_KEYS, strict=True):
        sim_values = [_phase_value(sims.get(label, {}).get("phases_s", {}), phase)
                      for label in labels]
        offset = -width / 2 if measured else 0.0
        missing = ["OOM" if sims.get(label, {}).get("status") == Status.OOM else "n/a"
                   for label in labels]
        _bars(ax, x + offset, sim_values, width, SIMULATED_COLOR, "simulated", missing=missing)
        if measured:
            meas_values = [_phase_value(measured.get(label, {}), phase) for label in labels]
            _bars(ax, x + width / 2, meas_values, width, MEASURED_COLOR, "measured",
                  hatch="///")
        ax.set_title(PHASE_LABELS[phase], fontsize=10)
        ax.set_xticks(x, labels, rotation=30 if max(map(len, labels)) > 8 else 0,
                      ha="right" if max(map(len, labels)) > 8 else "center", fontsize=8)
        ax.set_ylim(0, _top(ax))
        ax.grid(axis="y", color="#DDDDDD", lw=0.5)
        ax.set_axisbelow(True)
    axes[0].set_ylabel("time (s)")
    if measured:
        handles = [Patch(facecolor=SIMULATED_COLOR, label="simulated"),
                   Patch(facecolor=MEASURED_COLOR, hatch="///", edgecolor="white",
                         label="measured")]
        fig.legend(handles=handles, loc="outside lower center", ncols=2, frameon=False,
                   fontsize=9)
    names = sorted({str(s.get("scenario")) for s in sims.values() if s.get("scenario")})
    title = "phase times" + (" (mean per micro-batch, slowest rank)" if sims else "")
    nothing_finished = bool(sims) and not measured and all(
        s.get("status") == Status.OOM for s in sims.values())
    if nothing_finished:
        title = "out of memory: no phase finished"
        _oom_box(fig, next(iter(sims.values())).get("oom"))
        for ax in axes:
            ax.set_yticks([])
        axes[0].set_ylabel("")
    if names:
        title = f"{', '.join(names)}: {title}"
    fig.suptitle(title, fontsize=TITLE_SIZE, color=OOM_COLOR if nothing_finished else None)
    return fig


def _oom_box(fig: Figure, oom: Mapping[str, Any] | None) -> None:
    """What ran out of memory, across the middle of the figure."""
    if oom:
        fig.text(0.5, 0.5, _oom_text(oom), ha="center", va="center", fontsize=11,
                 color=OOM_COLOR, zorder=10,
                 bbox={"boxstyle": "round,pad=0.5", "facecolor": "white",
                       "edgecolor": OOM_COLOR})


def _phase_value(values: Mapping[str, Any], phase: str) -> float:
    value = values.get(phase) if values else None
    return float("nan") if value is None else float(value)


def _bars(ax, x, values, width, color, label, hatch=None, missing=None) -> None:
    """Bars with their seconds on top; a missing value says why (`missing`: 'n/a', 'OOM')."""
    heights = np.nan_to_num(np.asarray(values, dtype=float), nan=0.0)
    bars = ax.bar(x, heights, width, color=color, label=label, hatch=hatch,
                  edgecolor="white" if hatch else color, lw=0.6, zorder=2)
    reasons = missing or ["n/a"] * len(values)
    for bar, value, reason in zip(bars, values, reasons, strict=True):
        text = reason if math.isnan(value) else _seconds(value)
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    xytext=(0, 2), textcoords="offset points", ha="center", va="bottom",
                    fontsize=7, color=OOM_COLOR if text == "OOM" else None)


def _seconds(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def _top(ax) -> float:
    heights = [p.get_height() for p in ax.patches] or [1.0]
    return max(max(heights), 1e-9) * 1.18


# ------------------------------------------------------------------------------ activity

def _phase_window(result, rank: int, phase: str, micro_batch: int | None
                  ) -> tuple[float, float, int]:
    rows = result.phases[(result.phases["rank"] == rank) & (result.phases.phase == phase)]
    if rows.empty:
        raise ValueError(f"rank {rank} has no {phase!r} phase (status "
                         f"{result.summary.get('status')}); phases: "
                         f"{sorted(set(result.phases.phase))}")
    if micro_batch is None:
        micro_batch = int(rows.micro_batch.max())
    chosen = rows[rows.micro_batch == micro_batch]
    if chosen.empty:
        raise ValueError(f"rank {rank} has no {phase!r} phase for micro-batch {micro_batch}; "
                         f"micro-batches: {sorted(set(rows.micro_batch))}")
    row = chosen.iloc[0]
    return float(row.start_s), float(row.end_s), micro_batch


def activity(result, *, rank: int = 0, phase: str = Phase.BACKWARD,
             micro_batch: int | None = None) -> pd.DataFrame:
    """Where the time of one phase goes on one rank: busy seconds per stream and op kind
    (`span_kind`: the spans' `op_kind` and `buffer_kind` fields; spans clipped to the phase),
    with the share of the phase's length each one covers.
    `micro_batch` None picks the last one (for backward, the accumulation boundary).
    Streams run concurrently, so the shares add up to more than 1 when they overlap."""
    start, end, _ = _phase_window(result, rank, phase, micro_batch)
    spans = result.spans[(result.spans["rank"] == rank) & (result.spans.end_s > start)
                         & (result.spans.start_s < end)]
    busy = spans.end_s.clip(upper=end) - spans.start_s.clip(lower=start)
    kinds = [span_kind(k, b, o) for k, b, o in zip(spans.op_kind, spans.buffer_kind, spans.op,
                                                    strict=True)]
    table = (spans.assign(kind=kinds, busy_s=busy)
             .groupby(["stream", "kind"], sort=False)
             .agg(spans=("op", "size"), busy_s=("busy_s", "sum"), bytes=("bytes", "sum"))
             .reset_index())
    table["share"] = table.busy_s / max(end - start, 1e-12)
    return table.sort_values("busy_s", ascending=False, ignore_index=True)


def link_activity(result, *, rank: int = 0, phase: str = Phase.BACKWARD,
                  micro_batch: int | None = None) -> pd.DataFrame:
    """What each shared resource did during one phase of one rank, from `result.links`:
    seconds with traffic, the amount moved (GB; thread-seconds for a CPU) and the mean rate
    while active. Shows work that has no span of its own, e.g. page zeroing in host memory.
    Resources of other GPUs than rank's are left out."""
    start, end, _ = _phase_window(result, rank, phase, micro_batch)
    rows = []
    for resource, group in result.links.groupby("resource", sort=True):
        device, kind, _ = split_resource(str(resource))
        if is_gpu(device) and device != device_name(DeviceKind.GPU, rank):
            continue
        group = group.sort_values("t_s", kind="stable")
        knots = np.append(group.t_s.to_numpy(dtype=float), max(end, float(group.t_s.max())))
        lo, hi = np.clip(knots[:-1], start, end), np.clip(knots[1:], start, end)
        rate = group.rate.to_numpy(dtype=float)
        active = float(((hi - lo) * (rate > 0)).sum())
        amount = float(((hi - lo) * rate).sum())
        unit = "thread-s" if kind is LinkKind.CPU else "GB"
        amount = amount if unit == "thread-s" else amount / GB
        rows.append({"resource": str(resource), "active_s": active,
                     "share": active / max(end - start, 1e-12), "amount": amount,
                     "unit": unit, "mean_rate_when_active": amount / active if active else 0.0})
    frame = pd.DataFrame(rows, columns=["resource", "active_s", "share", "amount", "unit",
                                        "mean_rate_when_active"])
    return frame.sort_values("active_s", ascending=False, ignore_index=True)


def phase_activity(result, *, rank: int = 0, phase: str = Phase.BACKWARD,
                   micro_batch: int | None = None, top: int = 14) -> Figure:
    """Where one phase of one rank goes: busy time per stream and op kind (bars coloured by
    stream, see `activity`) and, below, how long each shared resource carried traffic (see
    `link_activity`), both against the length of the phase."""
    start, end, micro_batch = _phase_window(result, rank, phase, micro_batch)
    length = end - start
    table = activity(result, rank=rank, phase=phase, micro_batch=micro_batch).head(top)
    links = link_activity(result, rank=rank, phase=phase, micro_batch=micro_batch)
    links = links[links.active_s > 0]
    fig = _new_figure(10, 2.0 + 0.27 * (max(len(table), 1) + max(len(links), 1)))
    axes = fig.subplots(2, 1, sharex=True, height_ratios=[max(len(table), 1),
                                                          max(len(links), 1)])
    busy = [(f"{stream_name(r.stream)}: {r.kind}", r.busy_s, r.share,
             f"{r.spans} spans", stream_color(r.stream)) for r in table.itertuples()]
    carried = [(_link_label(r.resource), r.active_s, r.share,
                f"{r.amount:.3g} {r.unit}", LINK_COLOR) for r in links.itertuples()]
    for ax, bars, xlabel in ((axes[0], busy, None),
                             (axes[1], carried, "time within the phase (s)")):
        y = np.arange(len(bars))[::-1]
        ax.barh(y, [b[1] for b in bars], color=[b[4] for b in bars], zorder=2)
        for yy, (_, seconds, share, extra, _) in zip(y, bars, strict=True):
            ax.annotate(f"{seconds:.2f} s ({share:.0%}, {extra})", (seconds, yy),
                        xytext=(3, 0), textcoords="offset points", va="center",
                        fontsize=7.5, zorder=4,
                        bbox={"boxstyle": "square,pad=0.1", "facecolor": "white",
                              "edgecolor": "none", "alpha": 0.8})
        ax.set_yticks(y, [b[0] for b in bars], fontsize=8)
        ax.axvline(length, color="#000000", ls="--", lw=1, zorder=3)
        ax.grid(axis="x", color="#DDDDDD", lw=0.5)
        ax.set_axisbelow(True)
        if xlabel:
            ax.set_xlabel(xlabel)
    axes[0].set_ylabel("busy, per stream and op", fontsize=9)
    axes[1].set_ylabel("resource carrying\ntraffic (links)", fontsize=9)
    axes[1].annotate(f"phase length {length:.2f} s", (length, 0.0),
                     xycoords=("data", "axes fraction"), xytext=(-4, 4),
                     textcoords="offset points", ha="right", va="bottom", fontsize=8)
    widest = max([length] + [b[1] for b in busy + carried])
    axes[1].set_xlim(0, widest * 1.35)
    boundary = _boundary(result.phases)
    axes[0].set_title(f"{_scenario_name(result)}: where "
                      f"{phase_label(phase, micro_batch, boundary)} goes on rank {rank}",
                      fontsize=TITLE_SIZE)
    present = list(dict.fromkeys(table.stream))
    axes[0].legend(handles=[Patch(facecolor=stream_color(s), label=stream_name(s))
                            for s in present], loc="upper left", bbox_to_anchor=(1.01, 1.0),
                   fontsize=8, title="stream", title_fontsize=8, frameon=False)
    return fig


LINK_COLOR = GREY
OTHER_COLOR = "#DDDDDD"
CRITICAL_SHADES = (0.0, 0.35, 0.6, 0.75)
"""How much lighter than its stream's colour each further kind of that stream is drawn."""
CRITICAL_HATCHES = (None, "//", "..", "xx")
"""And its hatch, so that kinds of one stream stay apart."""
CRITICAL_AXES_SHARE = 0.55
"""The bars' share of the figure's width (the legend takes the rest)."""


def critical_path_chart(result, *, top: int = 10) -> Figure:
    """What each phase of the reported rank waited on (`Result.critical_path`): one bar per
    phase time, split by share into what it waited on (coloured by its stream, the host
    thread's work dark grey, lighter and hatched for a stream's later kinds), the `top` kinds
    of the iteration named and the rest as 'other'; the phase's seconds per iteration at the
    bar's end; under the axis, the seconds of the path on other ranks' ops, where the rank
    waited for them in a collective."""
    from zerosim.results.critical import rank_path, reported_rank

    rank = reported_rank(result)
    path = result.critical_path
    walked = None if rank is None else rank_path(path, rank)
    totals = {} if walked is None else walked.kinds
    rows = [key for key in PHASE_KEYS if totals.get(key)]
    overall: dict[str, float] = {}
    for key in rows:
        for kind, seconds in totals[key]:
            overall[kind] = overall.get(kind, 0.0) + seconds
    named = sorted(overall, key=lambda k: (-overall[k], k))[:top]
    stream_of = {span_kind(k, b, o): st for k, b, o, st in zip(
        path.op_kind, path.buffer_kind, path.op, path.stream, strict=True)}
    seen: dict[str, int] = {}
    colors, hatches = {}, {}
    for kind in sorted(named, key=lambda k: (-overall[k], k)):
        stream = stream_of.get(kind, "")
        shade = seen.get(stream, 0)
        seen[stream] = shade + 1
        colors[kind] = _lighter(stream_color(stream),
                                CRITICAL_SHADES[min(shade, len(CRITICAL_SHADES) - 1)])
        hatches[kind] = CRITICAL_HATCHES[shade % len(CRITICAL_HATCHES)]
    width_in = 10 * CRITICAL_AXES_SHARE
    fig = _new_figure(10, 1.6 + 0.55 * max(len(rows), 1))
    ax = fig.subplots()
    y = np.arange(len(rows))[::-1]
    for yy, key in zip(y, rows, strict=True):
        length = ordered_sum(seconds for _, seconds in totals[key])
        shares = [(k, sec) for k, sec in totals[key] if k in colors]
        other = length - ordered_sum(sec for _, sec in shares)
        if other > 0:
            shares.append(("other", other))
        left = 0.0
        for kind, seconds in shares:
            share = seconds / length if length > 0 else 0.0
            ax.barh(yy, share, left=left, color=colors.get(kind, OTHER_COLOR),
                    hatch=hatches.get(kind), edgecolor="white", lw=0.5, zorder=2)
            if share * width_in >= _text_width_in(kind, 7) + 0.1:
                ax.text(left + share / 2, yy, f"{kind}\n{_duration(seconds)}", ha="center",
                        va="center", fontsize=7, zorder=3,
                        bbox={"boxstyle": "square,pad=0.1", "facecolor": "white",
                              "edgecolor": "none", "alpha": 0.7})
            left += share
        ax.annotate(_duration(length), (1.0, yy), xytext=(4, 0), textcoords="offset points",
                    va="center", fontsize=8)
    ax.set_yticks(y, [PHASE_LABELS[key].replace("\n", " ") for key in rows], fontsize=9)
    ax.set_xlim(0, 1)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0%}"))
    label = "share of the phase (seconds per iteration at the right)"
    if walked is not None and walked.through:
        label += "\nof which on other ranks' ops, where the rank waited for them: " + ", ".join(
            f"rank {other} {_duration(seconds)}" for other, seconds in walked.through.items())
    ax.set_xlabel(label)
    ax.set_title(f"{_scenario_name(result)}: what each phase waited on "
                 f"(critical path of rank {rank})", fontsize=TITLE_SIZE)
    handles = [Patch(facecolor=colors[k], hatch=hatches[k], edgecolor="white",
                     label=f"{k} ({_duration(overall[k])})") for k in named]
    if any(k not in colors for key in rows for k, _ in totals[key]):
        handles.append(Patch(facecolor=OTHER_COLOR, label="other"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.08, 1.0), fontsize=8,
              frameon=False, title="waited on (iteration)", title_fontsize=8)
    return fig


def _link_label(resource: str) -> str:
    cpu = split_resource(resource)[1] is LinkKind.CPU
    return link_name(resource) + (" threads" if cpu else "")


# ------------------------------------------------------------------------------ sweeps

def _axis_label(column: str) -> str:
    """A column name with its unit spelled out: `phases_s.update` -> 'phases_s.update (s)'."""
    lowered = column.lower()
    if lowered.endswith("_per_s"):
        return f"{column} ({column.rsplit('.', 1)[-1][:-len('_per_s')]}/s)"
    units = (("_gib", "GiB"), ("_gbps", "GB/s"), ("_gb", "GB"), ("_s", "s"), ("tflops", "TFLOPS"))
    for suffix, unit in units:
        if lowered.endswith(suffix) or (unit == "s" and lowered.startswith("phases_s.")):
            return f"{column} ({unit})"
        if unit == "TFLOPS" and suffix in lowered:
            return f"{column} ({unit})"
    return column


def _is_numeric(values: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)


def _fmt(value: Any) -> str:
    if isinstance(value, float | np.floating):
        return f"{value:g}"
    return str(value)


def _frame_title(frame: pd.DataFrame, text: str) -> str:
    if "scenario" in frame.columns:
        names = frame["scenario"].dropna().unique()
        if len(names) == 1:
            return f"{names[0]}: {text}"
    return text


def _time_span(start_s: float, end_s: float) -> tuple[float, float]:
    """A time axis's limits, at least a microsecond wide: a run that ran out of memory at its
    first allocation ends where it starts, and matplotlib warns on equal limits."""
    return start_s, max(end_s, start_s + 1e-6)


def _check_columns(frame: pd.DataFrame, *columns: str | None) -> None:
    for column in columns:
        if column is not None and column not in frame.columns:
            raise KeyError(f"column {column!r} not in the sweep frame; columns: "
                           f"{list(frame.columns)}")


def _ordered_values(values: pd.Series) -> list:
    """Distinct values: sorted when numeric, else in order of first appearance (so that
    '0.9.0' stays before '0.13.3' if the sweep listed it first)."""
    distinct = list(dict.fromkeys(values.dropna()))
    return sorted(distinct) if _is_numeric(values) else distinct


def _value_axis(ax, values: list, numeric: bool) -> None:
    """Ticks at the swept values; large numbers in engineering notation (5e8 -> 500M)."""
    if numeric:
        positive = [v for v in values if v > 0]
        log = bool(positive) and len(positive) == len(values) and max(values) / min(values) >= 10
        if log:
            ax.set_xscale("log")
        where = np.log10(values) if log else np.asarray(values, dtype=float)
        spread = float(where.max() - where.min()) if len(where) else 0.0
        gaps = np.diff(where)
        if 1 < len(values) <= 12 and spread > 0 and gaps.min() >= 0.06 * spread:
            ax.set_xticks(values)
        if max(abs(v) for v in values) >= 1e4:
            ax.xaxis.set_major_formatter(EngFormatter(sep=""))
            ax.xaxis.set_minor_formatter(NullFormatter())
    else:
        ax.set_xticks(range(len(values)), [_fmt(v) for v in values])


def sweep_metric(frame: pd.DataFrame, x: str, metric: str, hue: str | None = None) -> Figure:
    """`metric` against the swept column `x`, one line per value of `hue`. Points whose run
    ran out of memory (a `status` column equal to 'oom') are marked with a cross on the x
    axis; several rows with the same x (and hue) are drawn as points joined at their mean."""
    _check_columns(frame, x, metric, hue)
    fig = _new_figure(8.5, 4.5)
    ax = fig.add_subplot()
    numeric_x = _is_numeric(frame[x])
    x_values = _ordered_values(frame[x])
    position = {v: (float(v) if numeric_x else float(i)) for i, v in enumerate(x_values)}
    groups = ([(None, frame)] if hue is None else
              [(v, frame[frame[hue] == v]) for v in _ordered_values(frame[hue])])
    colors = [c for name, c in OKABE_ITO.items() if name not in ("vermillion", "yellow")]
    colors += list(TOL_MUTED)
    oom_x: list[float] = []
    for index, (value, group) in enumerate(groups):
        xs = np.array([position[v] for v in group[x]], dtype=float)
        ys = pd.to_numeric(group[metric], errors="coerce").to_numpy(dtype=float)
        color = colors[index % len(colors)]
        label = None if hue is None else f"{hue} = {_fmt(value)}"
        means = pd.Series(ys).groupby(xs).mean().dropna()
        ax.plot(means.index, means.to_numpy(), marker="o", ms=4, lw=1.6, color=color,
                label=label)
        if len(means) < np.isfinite(ys).sum():
            ax.plot(xs, ys, marker="o", ms=3, ls="none", color=color, alpha=0.5)
        if "status" in group.columns:
            oom_x.extend(xs[(group["status"] == Status.OOM).to_numpy()])
    if oom_x:
        ax.plot(oom_x, np.zeros(len(oom_x)), marker="X", ms=9, ls="none", color=OOM_COLOR,
                transform=ax.get_xaxis_transform(), clip_on=False, label="out of memory",
                zorder=5)
    _value_axis(ax, x_values, numeric_x)
    ax.set_xlabel(_axis_label(x))
    ax.set_ylabel(_axis_label(metric))
    ax.set_ylim(bottom=0)
    ax.grid(color="#DDDDDD", lw=0.5)
    ax.set_title(_frame_title(frame, f"{metric} vs {x}"), fontsize=TITLE_SIZE)
    if hue is not None or oom_x:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return fig


def sweep_heatmap(frame: pd.DataFrame, x: str, y: str, metric: str) -> Figure:
    """`metric` over the grid of swept columns `x` (columns) and `y` (rows), each cell
    annotated with its value (the mean if several rows share it); a cell whose run ran out of
    memory reads 'OOM', a cell with no run stays blank."""
    _check_columns(frame, x, y, metric)
    values = frame.assign(_metric=pd.to_numeric(frame[metric], errors="coerce"))
    columns, index = _ordered_values(frame[x]), _ordered_values(frame[y])
    grid = values.groupby([y, x], sort=False)["_metric"].mean().unstack(x)
    grid = grid.reindex(index=index, columns=columns)
    oom = None
    if "status" in frame.columns:
        oom = (values.assign(_oom=values["status"] == Status.OOM)
               .groupby([y, x], sort=False)["_oom"].any().unstack(x)
               .reindex(index=index, columns=columns))
    fig = _new_figure(max(6.5, 2.5 + 0.9 * len(columns)), max(3.5, 1.6 + 0.5 * len(index)))
    ax = fig.add_subplot()
    data = grid.to_numpy(dtype=float)
    cmap = colormaps["viridis"].with_extremes(bad="#E4E4E4")
    image = ax.imshow(np.ma.masked_invalid(data), aspect="auto", cmap=cmap, origin="lower")
    finite = data[np.isfinite(data)]
    middle = (finite.min() + finite.max()) / 2 if finite.size else 0.0
    for (row, col), value in np.ndenumerate(data):
        if np.isfinite(value):
            text, color = figure_text(value, 3), ("white" if value < middle else "black")
        elif oom is not None and _truthy(oom.iloc[row, col]):
            text, color = "OOM", OOM_COLOR
        else:
            continue
        ax.text(col, row, text, ha="center", va="center", fontsize=8, color=color)
    ax.set_xticks(range(len(columns)), [_fmt_eng(v) for v in columns])
    ax.set_yticks(range(len(index)), [_fmt_eng(v) for v in index])
    ax.set_xlabel(_axis_label(x))
    ax.set_ylabel(_axis_label(y))
    fig.colorbar(image, ax=ax).set_label(_axis_label(metric))
    fig.suptitle(_frame_title(frame, f"{metric} over {x} and {y}"), fontsize=TITLE_SIZE)
    return fig


def _truthy(value: Any) -> bool:
    return bool(value) if pd.notna(value) else False


def _fmt_eng(value: Any) -> str:
    if isinstance(value, int | float | np.integer | np.floating) and abs(value) >= 1e4:
        return EngFormatter(sep="")(value)
    return _fmt(value)


# ------------------------------------------------------------------------------ all at once

def gpu_devices(result) -> list[str]:
    """The GPUs with memory records, in index order (gpu0, gpu1, ..., gpu10)."""
    return devices_of(result.memory.device.unique(), DeviceKind.GPU)


def host_devices(result) -> list[str]:
    return devices_of(result.memory.device.unique(), DeviceKind.HOST)


def save_all(result, out_dir: str | Path, formats: Sequence[str] = ("png", "svg"),
             *, dpi: int = 150) -> list[Path]:
    """Write the timeline, memory over time (every GPU and host), PCIe throughput (every GPU),
    phase-breakdown figures, what each phase waited on (`critical_path_chart`) and, for each
    phase rank 0 ran, where its last instance's time goes (`phase_activity`: the last
    forward, the boundary backward, the update) into
    `out_dir`, one file per figure and format."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figures: list[tuple[str, Figure]] = [("timeline", timeline(result))]
    for device in gpu_devices(result) + host_devices(result):
        figures.append((f"memory_{device}", memory_over_time(result, device)))
    for device in gpu_devices(result):
        figures.append((f"pcie_{device}", pcie_throughput(result, _device_rank(device))))
    figures.append(("phases", phase_breakdown(result.summary)))
    if not result.critical_path.empty:
        figures.append(("critical_path", critical_path_chart(result)))
    for phase in _phases_of(result, rank=0):
        figures.append((f"activity_{phase}", phase_activity(result, rank=0, phase=phase)))
    written = []
    for name, fig in figures:
        for fmt in formats:
            path = out / f"{name}.{fmt}"
            written.append(save_figure(fig, path, dpi=dpi, metadata=_metadata(fmt)))
    return written


def save_figure(fig: Figure, path: str | Path, **options) -> Path:
    """`fig.savefig` in the format of `path`'s suffix, written whole or not at all
    (`results.folders.atomic_write`): a full disk leaves no truncated image."""
    from zerosim.results.folders import atomic_write

    path = Path(path)
    return atomic_write(path, lambda handle: fig.savefig(handle, format=path.suffix[1:],
                                                         **options), binary=True)


def _phases_of(result, *, rank: int) -> list[str]:
    """The phases `rank` ran, in the order of the iteration (none of a run that ran out of
    memory before its first phase)."""
    ran = set(result.phases[result.phases["rank"] == rank].phase)
    return [p.value for p in (Phase.FORWARD, Phase.BACKWARD, Phase.UPDATE) if p.value in ran]


def _metadata(fmt: str) -> dict[str, Any] | None:
    """Drop the creation date from SVG/PDF so that redrawing the same result gives the same
    file."""
    if fmt == "svg":
        return {"Date": None}
    if fmt == "pdf":
        return {"CreationDate": None}
    return None


BASIS_COLORS = {"spec": OKABE_ITO["blue"], "measured": OKABE_ITO["bluish green"],
                "fitted": OKABE_ITO["sky blue"], "derived": OKABE_ITO["reddish purple"],
                "assumed": OKABE_ITO["vermillion"], "override": GREY}
"""A value's basis (`zerosim.hardware.provenance`), most trusted first; red for the assumed
ones, the weak points."""


def sensitivity_chart(outcome, quantity: str = "iteration", top: int = 15) -> Figure:
    """The `top` values of a `zerosim sensitivity` outcome by the elasticity of `quantity`
    (`iteration` or a phase of `summary["phases_s"]`), one bar each, coloured by basis; a
    value with a stated standard error is labelled with the share of the time its 1-sigma
    error moves."""
    if quantity not in ("iteration", *PHASE_KEYS):
        raise ValueError(f"quantity: expected iteration or one of {', '.join(PHASE_KEYS)}, "
                         f"got {quantity!r}")
    rows = sorted((r for r in outcome.rows if r.elasticity(quantity)),
                  key=lambda r: -abs(r.elasticity(quantity)))[:top][::-1]
    fig = _new_figure(8.5, 1.2 + 0.32 * max(len(rows), 1))
    ax = fig.subplots()
    values = [r.elasticity(quantity) for r in rows]
    y = np.arange(len(rows))
    ax.barh(y, values, color=[BASIS_COLORS.get(r.basis, GREY) for r in rows], zorder=2)
    for i, row in enumerate(rows):
        if row.stderr is not None:
            ax.annotate(f"±{100 * abs(values[i]) * row.stderr:.1f}% (1σ)", (values[i], i),
                        xytext=(3 if values[i] > 0 else -3, 0), textcoords="offset points",
                        ha="left" if values[i] > 0 else "right", va="center", fontsize=7)
    ax.set_yticks(y, [r.key for r in rows], fontsize=8)
    ax.axvline(0, color="black", lw=0.6)
    reach = max((abs(v) for v in values), default=1.0)
    ax.set_xlim(-1.35 * reach if min(values, default=0) < 0 else -0.05 * reach,
                1.35 * reach if max(values, default=0) > 0 else 0.05 * reach)
    ax.grid(axis="x", color="#DDDDDD", lw=0.5)
    ax.set_axisbelow(True)
    label = "iteration" if quantity == "iteration" else PHASE_LABELS[quantity].replace("\n", " ")
    ax.set_xlabel(f"elasticity of the {label}: % change per 1% change of the value")
    shown = [b for b in BASIS_COLORS if any(r.basis == b for r in rows)]
    ax.legend(handles=[Patch(facecolor=BASIS_COLORS.get(b, GREY), label=b) for b in shown],
              loc="lower right", fontsize=8, frameon=False)
    base = outcome.base.get(quantity)
    fig.suptitle(f"{outcome.scenario_name} on {outcome.hardware}: what the {label}"
                 + (f" ({_duration(base)})" if base else "") + " hangs on",
                 fontsize=TITLE_SIZE)
    return fig


PREDICTION_PANELS = ("forward", "backward", "update", "iteration")
"""The per-step times `predicted_vs_measured` draws, one panel each."""


def predicted_vs_measured(points: Iterable[tuple[str, float, float, str]], title: str,
                          tolerance: float = 0.15) -> Figure:
    """Predicted against measured seconds per optimizer step, one log-log panel per time of
    `PREDICTION_PANELS`, the `tolerance` band around equality. `points`: (time, measured,
    predicted, group) tuples, one colour per group (a DeepSpeed build: a table mixes builds
    that run differently); `PredictOutcome.points()` gives them for `zerosim predict`."""
    points = list(points)
    groups = sorted({group for *_, group in points})
    palette = [OKABE_ITO[c] for c in ("blue", "vermillion", "bluish green", "orange",
                                      "reddish purple", "sky blue")] + list(TOL_MUTED)
    colors = dict(zip(groups, palette, strict=False))
    fig = _new_figure(12, 3.6)
    axes = fig.subplots(1, len(PREDICTION_PANELS))
    for ax, quantity in zip(axes, PREDICTION_PANELS, strict=True):
        pairs = [(m, s, g) for q, m, s, g in points if q == quantity]
        for group in groups:
            ax.scatter([m for m, _, g in pairs if g == group],
                       [s for _, s, g in pairs if g == group], s=16, zorder=3,
                       color=colors[group], label=group)
        values = [v for m, s, _ in pairs for v in (m, s)] or [1.0]
        low, high = min(values) / 1.3, max(values) * 1.3
        ax.plot([low, high], [low, high], color="black", lw=0.8)
        ax.fill_between([low, high], [low * (1 - tolerance), high * (1 - tolerance)],
                        [low * (1 + tolerance), high * (1 + tolerance)],
                        color=OKABE_ITO["sky blue"], alpha=0.25, lw=0)
        ax.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high))
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
            axis.set_minor_formatter(NullFormatter())
        ax.set_title(quantity, fontsize=10)
        ax.set_xlabel("measured (s per step)", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0].set_ylabel("predicted (s per step)", fontsize=8)
    if groups:
        axes[-1].legend(fontsize=7, loc="upper left", frameon=False, title="build",
                        title_fontsize=7)
    fig.suptitle(f"{title}: predicted against measured (band ±{tolerance:.0%})",
                 fontsize=TITLE_SIZE)
    return fig
