"""A sweep straight into a DataFrame, for notebooks and scripts: nothing written.

`sweep_frame` takes a sweep spec file or the same sections as Python values, validates every
point as `zerosim sweep` does (one `SweepError` naming each bad axis value, before anything
runs), runs the points on the same executors and returns the table `zerosim sweep` writes to
results.csv, read as pandas reads that file: the same columns in the same order, the same
values. Run twice, it gives the same frame (the wall times, which differ, are left out as
results.csv leaves them out).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zerosim.errors import ScenarioWarning
from zerosim.sweep.runner import ProgressBar, drive, open_executor
from zerosim.sweep.spec import Point, SweepSpec, inline_sweep, load_sweep, validate
from zerosim.sweep.store import leading_columns, point_row, result_cells, result_columns
from zerosim.sweep.worker import error_text
from zerosim.vocabulary import Status

if TYPE_CHECKING:
    import pandas as pd


def sweep_frame(base: str | Path | None = None, *, spec: str | Path | None = None,
                overrides: Mapping[str, Any] | Iterable[str] | None = None,
                grid: Mapping[str, Any] | None = None,
                zip: Mapping[str, Any] | None = None,
                variants: list[Mapping[str, Any]] | None = None,
                workers: int | None = 1, dask: str | None = None, explain: bool = False,
                progress: bool = False) -> pd.DataFrame:
    """Every point of a sweep, one row each in point order, as `zerosim sweep`'s results.csv.

    Either `spec`, a sweep file (`overrides` then apply on top, as the command's `--set`), or
    `base`, a scenario path relative to the working folder, with the spec's sections as Python
    values: `overrides` (the spec's `set`: every point), `grid` (each axis a list or a range
    `{start, stop, num, scale}`), `zip` and `variants` (`[{name, set: {...}}]`). `workers=1`
    runs in this process (the default: a notebook sees the engine's own errors), `None` one
    process per CPU; `dask` is "local" or a scheduler's address. `explain` adds what each
    phase waited on (`waits_on.<phase>` columns). A point that does not fit is a row with
    status `oom`; one the engine fails on, status `error` and its text in `error`.
    """
    from zerosim.results.folders import table_as_read

    chosen = _spec(base, spec, overrides, grid, zip, variants)
    points = chosen.points()
    for note in validate(chosen, points):
        warnings.warn(note, ScenarioWarning, stacklevel=2)
    rows = _run(chosen, points, workers=workers, dask=dask, explain=explain, progress=progress)
    leading = leading_columns(chosen.axis_columns)
    table = [point_row(leading, point, result_cells(leading, rows[point.index]))
             for point in points]
    return table_as_read(result_columns(leading, table), table)


def _spec(base: str | Path | None, spec: str | Path | None,
          overrides: Mapping[str, Any] | Iterable[str] | None, grid: Mapping[str, Any] | None,
          zipped: Mapping[str, Any] | None, variants: list[Mapping[str, Any]] | None
          ) -> SweepSpec:
    if (base is None) == (spec is None):
        raise TypeError("sweep_frame takes either base (a scenario, with grid, zip or "
                        "variants) or spec (a sweep file), not both and not neither")
    if spec is not None:
        if grid is not None or zipped is not None or variants is not None:
            raise TypeError("sweep_frame(spec=...) takes its axes from the file: give grid, "
                            "zip and variants with base instead")
        return load_sweep(spec, overrides)
    if overrides is not None and not isinstance(overrides, Mapping):
        from zerosim.scenario import parse_overrides

        overrides = parse_overrides(overrides)
    return inline_sweep(base, overrides=overrides, grid=grid, zip=zipped,
                        variants=None if variants is None else list(variants))


def _run(spec: SweepSpec, points: list[Point], *, workers: int | None, dask: str | None,
         explain: bool, progress: bool) -> dict[int, Mapping[str, Any]]:
    """Each point's worker row by point index; a point its executor could not run is a row
    with status `error` and the executor's text."""
    from collections import Counter

    rows: dict[int, Mapping[str, Any]] = {}
    counts: Counter = Counter()
    with open_executor(workers, dask, len(points)) as (executor, window, _), \
            ProgressBar(progress, spec.name, len(points), 0, counts) as bar:
        def on_row(point: Point, row: Mapping[str, Any]) -> None:
            rows[point.index] = row
            counts[row["status"]] += 1
            bar.advance(counts)

        def on_failure(point: Point, error: BaseException) -> None:
            on_row(point, {"status": Status.ERROR, "error": error_text(error)})

        drive(executor, window, str(spec.base), points, on_row, on_failure, explain=explain)
    return rows
