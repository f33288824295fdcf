"""Write a result to a folder: summary.json, capacities.json (bytes per device), CSV (and
Parquet with pyarrow), trace.json.

Files are written into a temporary folder next to the destination and moved into place only
when all of them are complete, so an interrupted run leaves nothing half-written.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile
from pathlib import Path

from zerosim.results.load import CAPACITIES_FILE
from zerosim.results.result import Result
from zerosim.results.trace import build_trace, trace_json

TABLES = ("spans", "memory", "phases", "links")


def has_parquet() -> bool:
    return importlib.util.find_spec("pyarrow") is not None


def write_outputs(result: Result, out_dir: Path, *, extra: dict[str, object] | None = None
                  ) -> list[Path]:
    """Write every output file; `extra` maps file names to objects written as JSON."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".zerosim-", dir=out_dir))
    try:
        (staging / "summary.json").write_text(json.dumps(result.summary, indent=2) + "\n")
        (staging / CAPACITIES_FILE).write_text(
            json.dumps({d: int(b) for d, b in sorted(result.capacities.items())}, indent=2)
            + "\n")
        for name in TABLES:
            frame = getattr(result, name)
            frame.to_csv(staging / f"{name}.csv", index=False)
            if has_parquet():
                frame.to_parquet(staging / f"{name}.parquet", index=False)
        trace = build_trace(result.spans, result.phases, result.memory, result.links,
                            result.scenario_name, summary=result.summary)
        (staging / "trace.json").write_bytes(trace_json(trace))
        for name, payload in (extra or {}).items():
            (staging / name).write_text(json.dumps(payload, indent=2, default=str) + "\n")
        written = []
        for path in sorted(staging.iterdir()):
            target = out_dir / path.name
            path.replace(target)
            written.append(target)
        return written
    finally:
        shutil.rmtree(staging, ignore_errors=True)
