"""The validation report: a markdown table, a CSV, the study's simulated-vs-measured plot and
the Polaris runs' predicted-vs-measured plot."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from matplotlib.figure import Figure

from zerosim.hardware.profile import HardwareProfile
from zerosim.runs import MEASURED_PHASES, run_to_run_sd
from zerosim.stacks import DEFAULT_STACK
from zerosim.units import ordered_sum
from zerosim.validation.polaris import PROFILE as POLARIS_PROFILE
from zerosim.validation.polaris import SOURCE as POLARIS_SOURCE
from zerosim.validation.polaris import configurations as polaris_configurations
from zerosim.validation.reference import Study, load_estimator_tables
from zerosim.validation.validate import POLARIS_GROUP, SESSION_GROUP, Cell, cells_frame
from zerosim.vocabulary import JUDGED, Verdict

if TYPE_CHECKING:
    from zerosim.results.result import Result

STATUS_MARK = {Verdict.PASS: "pass", Verdict.FAIL: "**FAIL**", Verdict.EXCLUDED: "excluded",
               Verdict.REPORTED: "reported"}


def format_value(value: float, unit: str) -> str:
    """A measured or simulated value as the report prints it (GB to DeepSpeed's 0.01; three
    significant digits below 0.1, where two decimals would hide the error)."""
    if unit == "GB":
        return f"{value:.2f}"
    if unit == "params/s":
        return f"{value:.3g}"
    if unit == "":
        return f"{value:.3f}"
    return f"{value:.3g}" if abs(value) >= 100 or abs(value) < 0.1 else f"{value:.2f}"


def _tolerance(cell: Cell) -> str:
    return f"±{cell.tolerance:g}{' ' + cell.unit if cell.unit else ''}" if cell.absolute \
        else f"±{cell.tolerance:.0%}"


def _fitted_values(profile: HardwareProfile) -> list[str]:
    rows = [(key, p) for key, p in profile.provenance.items() if p.basis == "fitted"]
    if not rows:
        return []
    lines = ["", "## Fitted profile values", "", "| key | value | source |", "|---|---|---|"]
    lines += [f"| `{key}` | {p.value:g} | {p.source} |" for key, p in rows]
    return lines


def polaris_scatter_text() -> str:
    """How far one Polaris run scatters about its configuration's mean, phase by phase: the
    finest a cell of one run can be judged."""
    configurations = polaris_configurations()
    repeated = sum(len(c.runs) > 1 for c in configurations)
    scatter = ", ".join(f"{phase} {sd:.1%}" for phase in MEASURED_PHASES
                        if (sd := run_to_run_sd(configurations, phase)) is not None)
    return (f"One run scatters about its configuration's mean by (standard deviation pooled "
            f"over the {repeated} configurations measured more than once) {scatter}: a cell of "
            "n runs cannot be judged finer than that over sqrt(n).")


@dataclass(frozen=True)
class GroupSummary:
    """One group of cells at a glance: how many are judged and pass, how many are reported,
    and the judged relative errors' rms and largest (None where every judged cell has an
    absolute tolerance)."""

    group: str
    judged: int
    passed: int
    reported: int
    rms: float | None
    largest: float | None


def group_summaries(cells: list[Cell]) -> list[GroupSummary]:
    """Every group of `cells`, in the order the cells first name it."""
    groups: dict[str, list[Cell]] = {}
    for cell in cells:
        groups.setdefault(cell.group, []).append(cell)
    summaries = []
    for group, members in groups.items():
        judged = [c for c in members if c.status in JUDGED]
        errors = [c.rel_error for c in judged if not c.absolute]
        summaries.append(GroupSummary(
            group, len(judged), sum(c.status == Verdict.PASS for c in judged),
            sum(c.status == Verdict.REPORTED for c in members),
            math.sqrt(ordered_sum(e * e for e in errors) / len(errors)) if errors else None,
            max(errors, key=abs) if errors else None))
    return summaries


def summary_table(cells: list[Cell]) -> list[str]:
    """The report's table of groups at a glance (markdown lines)."""
    lines = ["| group | judged | pass | reported | rms error (judged) | largest |",
             "|---|---|---|---|---|---|"]
    for s in group_summaries(cells):
        rms = "" if s.rms is None else f"{s.rms:.1%}"
        largest = "" if s.largest is None else f"{s.largest:+.1%}"
        lines.append(f"| {s.group} | {s.judged} | {s.passed} | {s.reported} | {rms} | "
                     f"{largest} |")
    return lines


WAITS_SHOWN = 3
"""What each phase of a study run waits on longest, in the report's critical-path table."""


def critical_path_lines(results: Mapping[int, Result]) -> list[str]:
    """The study's runs (by data-parallel degree): what each phase of the rank that finishes
    last waits on, the three largest waits per phase over the iteration."""
    from zerosim.results.critical import path_totals, reported_rank
    from zerosim.vocabulary import PHASE_TIMES

    totals = {}
    for dp, result in sorted(results.items()):
        rank = reported_rank(result)
        if rank is not None:
            totals[dp] = path_totals(result.critical_path, rank)
    if not totals:
        return []
    lines = ["", "## What the study's phases wait on in the model", "",
             "Each phase's critical path on the rank that finishes last, as `zerosim run` prints "
             "it (followed to the rank that joined a collective last where it waited for one: "
             "at DP=2 and 4, rank 1, whose pinned buffers sit on the other socket from its GPU, "
             "so the non-boundary backward waits on its gradient copies): seconds per "
             "iteration, the three largest waits (the host thread's `hooks`, "
             "`launch`, `cuda_malloc` and `collective_launch`; the streams' ops by kind): the "
             "mechanism each Table 2 cell's agreement rests on.", "",
             "| phase | " + " | ".join(f"DP={dp}" for dp in totals) + " |",
             "|---|" + "---|" * len(totals)]
    for key in PHASE_TIMES:
        cells = [", ".join(f"{kind} {seconds:.3f}" for kind, seconds in
                           per_phase.get(key, [])[:WAITS_SHOWN]) or "-"
                 for per_phase in totals.values()]
        if any(cell != "-" for cell in cells):
            lines.append(f"| {key.replace('_', ' ')} | " + " | ".join(cells) + " |")
    return lines


def markdown(cells: list[Cell], study: Study, profile: HardwareProfile,
             results: Mapping[int, Result] | None = None) -> str:
    estimator_source = load_estimator_tables()[0].source
    judged = [c for c in cells if c.status in JUDGED]
    passed = sum(c.status == Verdict.PASS for c in judged)
    lines = [
        "# zerosim validation report",
        "",
        f"Reference: *{study.title}*. Setup: {study.setup}",
        "",
        f"Also: {study.table1_source}, and {estimator_source}. Both go through `zerosim "
        "estimate`'s code path, everything else through `zerosim run`'s. Their GB are 2^30 "
        "bytes, as DeepSpeed prints them; Table 1 is held to "
        f"±{study.table1_tolerance:.0%} because {study.table1_tolerance_reason}.",
        "",
        f"Also: the Polaris runs ({POLARIS_SOURCE}): per optimizer step, forward, backward and "
        "update within 15%, the iteration within 10%, rank 0's peak allocated GPU memory within "
        f"10%; repeated runs averaged. {polaris_scatter_text()} The table's rows 1-4 ran on "
        "a slower GPU (their forwards 16-17% slower than later repeats, their CPU updates "
        "not; `zerosim/validation/data/polaris_sessions.yaml`): they are judged at the plain "
        "profile, as a user would run them, and reported at the SM clock fitted on them in "
        f"'{SESSION_GROUP}'.",
        "",
        "Also: GPU-kernel and collective tables. Azure's cuBLASLt GEMMs of an A100 "
        "(`dgx-a100`) and PyTorch's BF16 GEMMs of the replayed transformers on an H100 SXM "
        "(`dgx-h100`, the node probe): the GEMM values are fitted to these tables, so their "
        "cells check the model's shape; XLA's autotuned H100 GEMMs, faster than PyTorch's, are "
        "reported beside them, and so are the node probe's plain PyTorch block, per layer, on "
        "an H100 and an H200 (`dgx-h200`, its values from the same probe's parts; with eager "
        "and with flash attention), transformers' own Llama layer forward and backward on the "
        "H200 (judged within 10%, nothing fitted to it), and "
        "published eager attentions on an A100 80GB and an H100 PCIe. nccl-tests bus "
        "bandwidths of Polaris, a DGX A100 and a p4d, and XLA's collectives over an HGX H100 "
        "board, through the engine's ring with each machine's profile. SuperOffload's Adam "
        "steps on a GH200's Grace, through the engine's CPU kernel: DeepSpeedCPUAdam's scalar "
        "loop (its cycles per element are measured on these rows, so they check the replay) "
        "and the study's SVE GraceAdam, reported against the same Adam bound by host memory "
        "alone.",
        "",
        f"Hardware profiles: `{profile.name}` for the study's cells, `{POLARIS_PROFILE}` for the "
        "Polaris runs; one software stack for both (`runtime.framework`, default "
        f"`{DEFAULT_STACK}`); no per-cell factors.",
        f"Judged cells: {passed} of {len(judged)} within tolerance.",
        "",
        *summary_table(cells),
        "",
        "| group | case | quantity | measured | simulated | error | tolerance | status | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        unit = f" {c.unit}" if c.unit else ""
        tol = _tolerance(c) if c.status in JUDGED else ""
        simulated, error = c.shown(f"{format_value(c.simulated, c.unit)}{unit}")
        lines.append(
            f"| {c.group} | {c.case} | {c.quantity} | {format_value(c.measured, c.unit)}{unit} | "
            f"{simulated} | {error} | {tol} | {STATUS_MARK[c.status]} | {c.note} |")
    lines += critical_path_lines(results or {})
    lines += _fitted_values(profile)
    lines += ["", "Regenerate with `zerosim validate` (writes this file, `validation.csv`, "
              "`validation.png`, the study's phase times, and `polaris.png`, the Polaris runs' "
              "per-step times predicted against measured, one colour per DeepSpeed build)."]
    return "\n".join(lines) + "\n"


def plot(cells: list[Cell]) -> Figure:
    fig = Figure(figsize=(6.5, 6))
    ax = fig.add_subplot()
    phases = [c for c in cells if c.group == "Table 2" and c.unit == "s"]
    colours = {Verdict.PASS: "#009E73", Verdict.FAIL: "#D55E00", Verdict.EXCLUDED: "#999999"}
    for c in phases:
        ax.scatter(c.measured, c.simulated, color=colours[c.status], zorder=3)
        ax.annotate(f"{c.case} {c.quantity}", (c.measured, c.simulated), fontsize=7,
                    xytext=(4, 2), textcoords="offset points")
    low = min(min(c.measured, c.simulated) for c in phases) / 1.5
    high = max(max(c.measured, c.simulated) for c in phases) * 1.5
    ax.plot([low, high], [low, high], color="black", lw=1, label="simulated = measured")
    ax.fill_between([low, high], [low * 0.9, high * 0.9], [low * 1.1, high * 1.1],
                    color="#56B4E9", alpha=0.25, label="±10%")
    ax.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high),
           xlabel="measured (s)", ylabel="simulated (s)",
           title="Table 2 phase times: simulated vs measured")
    ax.legend(loc="upper left")
    fig.tight_layout()
    return fig


def polaris_points(cells: list[Cell]) -> list[tuple[str, float, float, str]]:
    """The Polaris time cells as `plots.predicted_vs_measured` draws them: (time, measured,
    predicted, DeepSpeed build)."""
    return [(c.measure, c.measured, c.simulated, c.series)
            for c in cells if c.group == POLARIS_GROUP and c.series]


def write_report(cells: list[Cell], study: Study, profile: HardwareProfile, out_dir: Path,
                 results: Mapping[int, Result] | None = None) -> list[Path]:
    from zerosim.plots import predicted_vs_measured, save_figure
    from zerosim.results.folders import write_text_whole

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "README.md", out_dir / "validation.csv", out_dir / "validation.png"]
    write_text_whole(paths[0], markdown(cells, study, profile, results))
    write_text_whole(paths[1], cells_frame(cells).to_csv(index=False))
    save_figure(plot(cells), paths[2], dpi=110)
    points = polaris_points(cells)
    if points:
        paths.append(save_figure(predicted_vs_measured(
            points, f"Polaris runs on {POLARIS_PROFILE}"), out_dir / "polaris.png", dpi=110))
    return paths
