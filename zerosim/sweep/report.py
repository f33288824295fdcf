"""What `zerosim sweep` prints: a one-line account and a table of the points."""

from __future__ import annotations

import csv
from typing import Any

from rich.console import Console
from rich.table import Table

from zerosim.sweep.runner import SweepOutcome
from zerosim.units import figure_text
from zerosim.vocabulary import Status

TABLE_METRICS = {"iteration_s": "iteration s", "tokens_per_s": "tokens/s",
                 "tflops_per_gpu": "TFLOPS/GPU", "peak_hbm_GiB": "peak HBM GiB",
                 "peak_host_GiB": "peak host GiB"}
ZENFLOW_METRIC = {"zenflow_step_s": "s per step"}
"""Shown after the iteration when a point runs ZenFlow, whose iteration is a window of
`update_interval` training steps."""
MAX_TABLE_ROWS = 30
CONSOLE_WIDTH = 120
FASTEST_SHOWN = 10


def _number(text: str) -> str:
    """Numbers to 4 significant digits (5e8 stays 5e+08), anything else as written."""
    if text in ("", "true", "false"):
        return text or "-"
    try:
        return f"{float(text):.4g}"
    except ValueError:
        return text


def _figure(text: str) -> str:
    """A result as `units.figure_text` writes it to 4 digits, anything else as `_number`."""
    try:
        return figure_text(float(text), 4)
    except ValueError:
        return _number(text)


def _rows(outcome: SweepOutcome) -> list[dict[str, str]]:
    with open(outcome.results_csv, newline="") as handle:
        return list(csv.DictReader(handle))


def _metrics(rows: list[dict[str, Any]]) -> dict[str, str]:
    """The table's figures: the time per training step too where a point runs ZenFlow."""
    if not any(row.get("zenflow_step_s") for row in rows):
        return TABLE_METRICS
    first, *rest = TABLE_METRICS.items()
    return dict([first, *ZENFLOW_METRIC.items(), *rest])


def _step_s(row: dict[str, Any]) -> float:
    """The time per training step: the iteration but for ZenFlow's windows of several
    steps."""
    return float(row.get("zenflow_step_s") or row["iteration_s"])


def fastest(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The points that finished, the most tokens per second first: the shortest step where
    every point trains on as many tokens, and the right order where a sweep moves the batch
    (micro-batch, accumulation, ranks). Rows written without `tokens_per_s` (a results.csv
    resumed from an earlier zerosim) are ranked by the time per step."""
    timed = [row for row in rows if row.get("iteration_s")]
    if all(row.get("tokens_per_s") for row in timed):
        return sorted(timed, key=lambda row: -float(row["tokens_per_s"]))
    return sorted(timed, key=_step_s)


def _table(outcome: SweepOutcome, rows: list[dict[str, Any]], title: str) -> Table:
    axes = outcome.spec.axis_columns
    metrics = _metrics(rows)
    table = Table(title=title, title_justify="left", caption_justify="left",
                  caption="- in an axis column: the base scenario's value")
    labels = outcome.spec.axis_labels
    for column in axes:
        table.add_column(labels[column], overflow="fold")
    table.add_column("status")
    for label in metrics.values():
        table.add_column(label, justify="right")
    for row in rows:
        status = row.get("status", "")
        colour = {Status.OK: "green", Status.OOM: "yellow"}.get(status, "red")
        table.add_row(*(_number(row.get(c, "")) for c in axes), f"[{colour}]{status}[/{colour}]",
                      *(_figure(row.get(m, "")) for m in metrics))
    return table


def render_outcome(outcome: SweepOutcome, console: Console | None = None) -> None:
    console = console or Console(soft_wrap=False, width=max(Console().width, CONSOLE_WIDTH))
    for note in outcome.notes:
        console.print(f"[yellow]warning:[/yellow] {note}", highlight=False)
    counts = ", ".join(f"{outcome.counts[s]} {s}" for s in (Status.OK, Status.OOM, Status.ERROR)
                       if outcome.counts[s])
    done = outcome.total - len(outcome.not_run)
    rate = f", {outcome.points_per_s:.2f} points/s" if outcome.ran else ""
    how = f" {outcome.executor}" if outcome.executor else ""
    console.print(f"[bold]{outcome.spec.name}[/bold]: {done} of {outcome.total} points "
                  f"({counts or 'none'}); ran {outcome.ran}{how} in {outcome.wall_s:.1f} s"
                  f"{rate}, {outcome.resumed.kept} already in results.csv", highlight=False)
    if outcome.resumed.stale:
        console.print(f"{outcome.resumed.stale} rows of points no longer in the sweep moved to "
                      "results.stale.csv", highlight=False)
    for point, error in outcome.not_run[:10]:
        console.print(f"[red]not run:[/red] point {point.index} ({point.describe()}): {error}",
                      highlight=False)
    rows = _rows(outcome)
    if len(rows) <= MAX_TABLE_ROWS:
        console.print(_table(outcome, rows, "points"))
    else:
        shown = fastest(rows)[:FASTEST_SHOWN]
        if shown:
            console.print(_table(outcome, shown, f"the {len(shown)} fastest points (the most "
                                                 "tokens per second)"))
    console.print(f"results: {outcome.results_csv}", highlight=False)
