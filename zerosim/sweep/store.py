"""The sweep's files: rows appended as points finish, then rewritten in point order.

`results.csv` holds one row per point: `index`, `point_id`, the swept values (one column per
dotted path, plus `variant`), `status`, every summary field flattened (`phases_s.update`,
`pcie_GB.h2d`, ...) and `error`. Rows are appended (flush + fsync) as points complete, so a
kill loses at most the points in flight; at the end the file is rewritten sorted by `index`
(temp file + `os.replace`), which makes it byte-identical whatever the executor. Wall times,
which differ from run to run, live in `timings.csv`.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from zerosim.errors import ZerosimError
from zerosim.results.folders import atomic_write, write_table
from zerosim.sweep.spec import Point
from zerosim.sweep.worker import plain, to_json

RESULTS_CSV = "results.csv"
TIMINGS_CSV = "timings.csv"
STALE_CSV = "results.stale.csv"
RESULTS_PARQUET = "results.parquet"
LOCK_FILE = ".sweep.lock"
COLLISION_PREFIX = "result."     # a summary field named like a swept column (data_parallel)
TIMING_COLUMNS = ["index", "point_id", "wall_s"]


class SweepStoreError(ZerosimError):
    """The output folder cannot be used (not a sweep's folder, or another sweep writes it)."""


def cell(value: Any) -> str:
    """The CSV text of a value: the same text whether it comes from a worker or a re-read."""
    value = plain(value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return " / ".join(value.splitlines()) if "\n" in value or "\r" in value else value
    return to_json(value)


def read_rows(path: Path) -> tuple[list[str], list[dict[str, str]], int]:
    """Header, rows and how many broken lines were dropped (a last line cut by a kill)."""
    if not os.path.lexists(path):
        return [], [], 0
    text = _sweep_text(path)
    dropped = 0
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
        dropped += 1
    lines = list(csv.reader(io.StringIO(text)))
    if not lines:
        return [], [], dropped
    header, body = lines[0], lines[1:]
    rows = [dict(zip(header, line, strict=True)) for line in body if len(line) == len(header)]
    return header, rows, dropped + len(body) - len(rows)


def _sweep_text(path: Path) -> str:
    """A file the sweep wrote earlier, as text; one that is not (a folder, bytes that are not
    UTF-8, a damaged CSV) is refused before anything in the folder is touched."""
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            text = handle.read()
    except UnicodeDecodeError:
        raise SweepStoreError(f"{path}: expected the UTF-8 CSV a zerosim sweep writes, got "
                              "bytes that are not UTF-8; choose another --out") from None
    except OSError as err:
        raise SweepStoreError(f"{path}: expected the CSV a zerosim sweep writes, got "
                              f"{'a folder' if path.is_dir() else err.strerror}; choose "
                              "another --out") from None
    if "\0" in text:
        raise SweepStoreError(f"{path}: expected the CSV a zerosim sweep writes, got a NUL "
                              "byte; choose another --out")
    return text


@contextlib.contextmanager
def locked(out_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on the folder so that two sweeps never write the same files."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: no lock
        yield
        return
    with open(out_dir / LOCK_FILE, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SweepStoreError(f"{out_dir}: another zerosim sweep is writing to this "
                                  "folder") from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def leading_columns(axis_columns: Iterable[str]) -> list[str]:
    """results.csv's first columns: the point's index and id, then its swept values."""
    return ["index", "point_id", *axis_columns]


def result_cells(leading: list[str], result: Mapping[str, Any]) -> dict[str, str]:
    """A worker's row as results.csv's cells: each field's text (`cell`), a field named like
    a swept column prefixed `result.`; the wall time is timings.csv's, not a result."""
    taken = set(leading) - {"status", "error"}
    return {f"{COLLISION_PREFIX}{key}" if key in taken else key: cell(value)
            for key, value in result.items() if key not in ("point_id", "wall_s")}


def point_row(leading: list[str], point: Point, cells: Mapping[str, str]) -> dict[str, str]:
    """The point's row of results.csv: its leading columns, then its cells."""
    row = {"index": str(point.index), "point_id": point.point_id}
    for column in leading[2:]:
        row[column] = cell(point.values.get(column))
    for key, value in cells.items():
        row.setdefault(key, value)
    return row


def result_columns(leading: list[str], rows: Iterable[Mapping[str, str]]) -> list[str]:
    """results.csv's header: the leading columns, `status`, every other field in the order
    the rows first give it, then `error`."""
    seen = {*leading, "status", "error"}
    middle: list[str] = []
    for row in rows:
        for key in row:
            if key not in seen:
                seen.add(key)
                middle.append(key)
    return [*leading, "status", *middle, "error"]


@dataclass(frozen=True)
class Resumed:
    kept: int       # rows of points still in the sweep: these points are not run again
    stale: int      # rows of points no longer in the sweep: moved to results.stale.csv
    repaired: int   # broken or duplicated lines dropped


class ResultStore:
    """results.csv and timings.csv in `out_dir`, for the points of one sweep."""

    def __init__(self, out_dir: Path, axis_columns: list[str]):
        self.out_dir = out_dir
        self.results_path = out_dir / RESULTS_CSV
        self.timings_path = out_dir / TIMINGS_CSV
        self.leading = leading_columns(axis_columns)
        self.rows: dict[str, dict[str, str]] = {}
        self.timings: dict[str, dict[str, str]] = {}
        self.columns: list[str] = []
        self._results: IO[str] | None = None
        self._timings: IO[str] | None = None
        self._writer: Any = None
        self._timing_writer: Any = None

    # -------------------------------------------------------------- reading

    def resume(self, points: list[Point]) -> Resumed:
        """Read what an earlier (possibly killed) run of this sweep wrote."""
        by_id = {p.point_id: p for p in points}
        header, rows, repaired = read_rows(self.results_path)
        missing = [c for c in ("index", "point_id", "status") if c not in header]
        if header and missing:
            raise SweepStoreError(f"{self.results_path} is not a zerosim sweep's results file "
                                  f"(no {missing[0]!r} column); choose another --out")
        old_leading = set(header[: header.index("status")] if "status" in header else [])
        stale: list[dict[str, str]] = []
        for row in rows:
            point = by_id.get(row["point_id"])
            if point is None:
                stale.append(row)
            elif point.point_id in self.rows:
                repaired += 1
            else:
                cells = {k: v for k, v in row.items() if k not in old_leading}
                self.rows[point.point_id] = self._row(point, cells)
        _, timings, _ = read_rows(self.timings_path)
        for row in timings:
            point = by_id.get(row.get("point_id", ""))
            if point is not None and point.point_id in self.rows:
                self.timings[point.point_id] = {"index": str(point.index),
                                                "point_id": point.point_id,
                                                "wall_s": row.get("wall_s", "")}
        if stale:
            self._keep_stale(stale)
        if self.rows or repaired or stale:
            self.columns = self._columns(self.rows.values())
            self._reopen()
        return Resumed(len(self.rows), len(stale), repaired)

    def _keep_stale(self, stale: list[dict[str, str]]) -> None:
        path = self.out_dir / STALE_CSV
        header, earlier, _ = read_rows(path)
        known = {r.get("point_id") for r in earlier}
        rows = earlier + [r for r in stale if r["point_id"] not in known]
        columns = list(header)
        for row in rows:
            columns.extend(k for k in row if k not in columns)
        write_table(path, columns, rows)

    # -------------------------------------------------------------- writing

    def _row(self, point: Point, cells: Mapping[str, str]) -> dict[str, str]:
        return point_row(self.leading, point, cells)

    def _columns(self, rows: Iterable[Mapping[str, str]]) -> list[str]:
        return result_columns(self.leading, rows)

    def add(self, point: Point, result: Mapping[str, Any]) -> dict[str, str]:
        """Record a worker's row; append it to results.csv and timings.csv at once."""
        row = self._row(point, result_cells(self.leading, result))
        replaced = point.point_id in self.rows
        self.rows[point.point_id] = row
        timing = {"index": str(point.index), "point_id": point.point_id,
                  "wall_s": cell(result.get("wall_s"))}
        self.timings[point.point_id] = timing
        if self._results is None or replaced or any(k not in self.columns for k in row):
            self.columns = self._columns(self.rows.values())
            self._reopen()
        else:
            self._writer.writerow([row.get(c, "") for c in self.columns])
            self._results.flush()
            os.fsync(self._results.fileno())
            self._timing_writer.writerow([timing[c] for c in TIMING_COLUMNS])
            self._timings.flush()
        return row

    def _reopen(self) -> None:
        """Rewrite both files with every row so far, then keep them open for appending."""
        self.close()
        write_table(self.results_path, self.columns, self.rows.values())
        write_table(self.timings_path, TIMING_COLUMNS, self.timings.values())
        self._results = open(self.results_path, "a", newline="")  # noqa: SIM115
        self._timings = open(self.timings_path, "a", newline="")  # noqa: SIM115
        self._writer = csv.writer(self._results, lineterminator="\n")
        self._timing_writer = csv.writer(self._timings, lineterminator="\n")

    def close(self) -> None:
        for handle in (self._results, self._timings):
            if handle is not None:
                handle.close()
        self._results = self._timings = None

    def finish(self) -> list[Path]:
        """Rewrite results.csv and timings.csv sorted by point index; add results.parquet."""
        self.close()
        ordered = sorted(self.rows.values(), key=lambda r: int(r["index"]))
        self.columns = self._columns(ordered)
        write_table(self.results_path, self.columns, ordered)
        write_table(self.timings_path, TIMING_COLUMNS,
                  sorted(self.timings.values(), key=lambda r: int(r["index"])))
        written = [self.results_path, self.timings_path]
        parquet = write_parquet(self.results_path, self.out_dir / RESULTS_PARQUET)
        if parquet is not None:
            written.append(parquet)
        return written


def write_parquet(csv_path: Path, target: Path) -> Path | None:
    """A Parquet copy of the CSV when pyarrow is installed (None otherwise)."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return None
    import pandas as pd

    frame = pd.read_csv(csv_path)
    return atomic_write(target, lambda handle: frame.to_parquet(handle, index=False),
                        binary=True)
