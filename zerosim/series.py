"""Gradient-accumulation series in a table of measured runs: where a prediction's error sits.

Runs that differ only in gradient accumulation spend, per optimizer step, what every
micro-batch costs (its forward and its non-boundary backward) times the accumulation, plus
what the step costs once (the boundary's flush, the update, the step's bookkeeping). A
straight line through each time against the accumulation splits the two, for the measured
runs and for their predictions alike, so an error shows as a per-micro-batch one (the GPU
work, the hooks) or a per-step one (the flush, the update). Pure arithmetic on
`runs.Prediction`s: nothing here simulates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from zerosim.results.folders import write_table
from zerosim.runs import BETWEEN_PHASES, Prediction
from zerosim.units import ordered_sum
from zerosim.vocabulary import Status

MIN_SERIES_STEPS = 3
"""Distinct accumulation counts a series needs: two fix a line exactly, a third tests it."""
SERIES_QUANTITIES = ("forward", "backward", "iteration", BETWEEN_PHASES)
"""The times accumulation repeats (`runs.MEASURED_PHASES` but the update, which it does
not), and the loop outside DeepSpeed's timers (`runs.BETWEEN_PHASES`: with
`memory_breakdown`, four of its memory reports come with each micro-batch and two with the
step)."""


@dataclass(frozen=True)
class Split:
    """A time per optimizer step as `per_step_s + per_micro_batch_s x accumulation`."""

    per_micro_batch_s: float
    per_step_s: float


@dataclass(frozen=True)
class SeriesSplit:
    """One time of a series, split for the measured runs and for their predictions."""

    quantity: str
    """One of `SERIES_QUANTITIES`."""
    measured: Split
    predicted: Split

    @property
    def error_per_micro_batch(self) -> float | None:
        """(predicted - measured) / measured of the per-micro-batch cost; None where the
        measured line does not rise with the accumulation."""
        measured = self.measured.per_micro_batch_s
        if measured <= 0:
            return None
        return self.predicted.per_micro_batch_s / measured - 1

    @property
    def difference_per_step_s(self) -> float:
        """Predicted minus measured per-step cost, in seconds (a relative error would mean
        nothing where the step costs next to nothing, as in the forward)."""
        return self.predicted.per_step_s - self.measured.per_step_s


@dataclass(frozen=True)
class AccumulationSeries:
    """Configurations of a table that differ only in gradient accumulation."""

    name: str
    """The configurations' name with the accumulation as a range (`11.20b-dp1-mb4-ga1..16-
    sg1e08`)."""
    steps: tuple[int, ...]
    """Their accumulation counts, ascending."""
    runs: int
    """Measured runs behind the split (a repeated configuration counts each run)."""
    splits: tuple[SeriesSplit, ...]


ROUNDING = 1e-9
"""An intercept below this fraction of the mean time is the subtraction's rounding (times
exactly proportional to the accumulation): it is zero."""


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> Split:
    """Least-squares line of `ys` on `xs` (at least two distinct xs)."""
    n = len(xs)
    mean_x, mean_y = ordered_sum(xs) / n, ordered_sum(ys) / n
    sxx = ordered_sum((x - mean_x) ** 2 for x in xs)
    slope = ordered_sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx
    intercept = mean_y - slope * mean_x
    if abs(intercept) < ROUNDING * abs(mean_y):
        intercept = 0.0
    return Split(per_micro_batch_s=slope, per_step_s=intercept)


def accumulation_series(predictions: Sequence[Prediction]) -> list[AccumulationSeries]:
    """Every series of `MIN_SERIES_STEPS` or more accumulation counts among the simulated
    configurations, in first-seen order; each time split where every run measured it.

    Both lines are fitted over the same points, one per measured run: a run's measurement
    for the measured line, its configuration's prediction for the predicted one."""
    groups: dict[tuple, list[Prediction]] = {}
    for p in predictions:
        if p.status == Status.OK:
            groups.setdefault(p.configuration.first.series_key, []).append(p)
    series = []
    for members in groups.values():
        steps = sorted({p.configuration.first.grad_accum_steps for p in members})
        if len(steps) < MIN_SERIES_STEPS:
            continue
        members.sort(key=lambda p: p.configuration.first.grad_accum_steps)
        splits = tuple(split for q in SERIES_QUANTITIES
                       if (split := _split(members, q)) is not None)
        if splits:
            configuration = members[0].configuration
            first = configuration.first
            apart = configuration.name.removeprefix(first.name)
            series.append(AccumulationSeries(
                first.name_with_accumulation(f"{steps[0]}..{steps[-1]}") + apart, tuple(steps),
                sum(len(p.configuration.runs) for p in members), splits))
    return series


def _split(members: Sequence[Prediction], quantity: str) -> SeriesSplit | None:
    xs, measured, predicted = [], [], []
    for p in members:
        values = p.configuration.values(quantity)
        estimate = p.predicted.get(quantity)
        if estimate is None or len(values) != len(p.configuration.runs):
            return None
        ga = p.configuration.first.grad_accum_steps
        xs += [ga] * len(values)
        measured += values
        predicted += [estimate] * len(values)
    return SeriesSplit(quantity, fit_line(xs, measured), fit_line(xs, predicted))


SERIES_COLUMNS = ("series", "grad_accum_steps", "runs", "quantity",
                  "measured_per_micro_batch_s", "predicted_per_micro_batch_s",
                  "error_per_micro_batch", "measured_per_step_s", "predicted_per_step_s",
                  "difference_per_step_s")
"""`series.csv`: one row per series and time."""


def series_rows(series: Sequence[AccumulationSeries]) -> list[dict[str, object]]:
    return [{"series": s.name, "grad_accum_steps": " ".join(map(str, s.steps)),
             "runs": s.runs, "quantity": split.quantity,
             "measured_per_micro_batch_s": split.measured.per_micro_batch_s,
             "predicted_per_micro_batch_s": split.predicted.per_micro_batch_s,
             "error_per_micro_batch": split.error_per_micro_batch,
             "measured_per_step_s": split.measured.per_step_s,
             "predicted_per_step_s": split.predicted.per_step_s,
             "difference_per_step_s": split.difference_per_step_s}
            for s in series for split in s.splits]


def write_series(series: Sequence[AccumulationSeries], path: Path) -> Path:
    """`series.csv` beside `predictions.csv` (the header alone where the table has no
    series)."""
    return write_table(path, SERIES_COLUMNS, series_rows(series))
