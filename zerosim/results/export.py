"""Write a result to a folder: summary.json, capacities.json (bytes per device), CSV (and
Parquet with pyarrow) of spans, memory, phases, links and peer waits, critical_path.csv,
trace.json, and with `figures` the plots.

Everything is written into a temporary folder beside the destination, which then replaces the
destination in one rename (`zerosim.results.folders`): an interrupted or failed run leaves the
previous complete output, or nothing. JSON files are strict JSON: a value that is not a finite
number is written as null, never as NaN or Infinity.
"""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zerosim.results.folders import staged_folder
from zerosim.results.load import CAPACITIES_FILE
from zerosim.results.result import Result
from zerosim.results.trace import TraceDetail, build_trace

TABLES = ("spans", "memory", "phases", "links", "peer_waits")
CRITICAL_PATH_FILE = "critical_path.csv"
"""`Result.critical_path`, derived from spans and phases (a loaded result computes it again)."""


def has_parquet() -> bool:
    return importlib.util.find_spec("pyarrow") is not None


def strict_json(data: Any, **options: Any) -> str:
    """`json.dumps` that never writes NaN or Infinity (they become null)."""
    try:
        return json.dumps(data, allow_nan=False, **options)
    except ValueError:
        return json.dumps(_finite_or_none(data), allow_nan=False, **options)


def trace_json(trace: dict[str, Any]) -> bytes:
    """The trace as JSON: by orjson where it is installed (several times faster on a trace of
    a million events; it writes NaN and Infinity as null too), else by `strict_json`."""
    try:
        import orjson
    except ImportError:
        return strict_json(trace).encode("utf-8")
    return orjson.dumps(trace)


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_none(v) for v in value]
    return value


def write_outputs(result: Result, out_dir: Path, *, extra: dict[str, object] | None = None,
                  figures: Callable[[Result, Path], object] | None = None,
                  compact_trace: bool = False,
                  on_published: Callable[[], object] | None = None) -> list[Path]:
    """Write every output file and publish the folder; `extra` maps file names to objects
    written as JSON, `figures(result, folder)` draws into the folder before it is published.
    `compact_trace`: one rank per group of identical ranks and sampled counters in
    `trace.json` (`TraceDetail.compact`); the tables stay whole. `on_published()` runs once
    the folder is in place (`folders.publish`)."""
    with staged_folder(out_dir, on_published) as staging:
        _write_files(result, staging, extra or {}, compact_trace)
        if figures is not None:
            figures(result, staging)
        names = sorted(p.name for p in staging.iterdir())
    target = Path(out_dir)
    return [target / name for name in names]


def _write_files(result: Result, folder: Path, extra: dict[str, object],
                 compact_trace: bool) -> None:
    _write_text(folder / "summary.json", strict_json(result.summary, indent=2) + "\n")
    capacities = {d: int(b) for d, b in sorted(result.capacities.items())}
    _write_text(folder / CAPACITIES_FILE, strict_json(capacities, indent=2) + "\n")
    for name in TABLES:
        frame = getattr(result, name)
        frame.to_csv(folder / f"{name}.csv", index=False)
        if has_parquet():
            frame.to_parquet(folder / f"{name}.parquet", index=False)
    result.critical_path.to_csv(folder / CRITICAL_PATH_FILE, index=False)
    detail = TraceDetail.compact(result.spans) if compact_trace else TraceDetail()
    trace = build_trace(result.spans, result.phases, result.memory, result.links,
                        result.scenario_name, summary=result.summary, detail=detail,
                        critical=result.critical_path)
    (folder / "trace.json").write_bytes(trace_json(trace))
    for name, payload in extra.items():
        _write_text(folder / name, strict_json(payload, indent=2, default=str) + "\n")


def _write_text(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
