"""Read a result back from the folder `write_outputs` wrote, without simulating again."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from zerosim.errors import ZerosimError
from zerosim.results.result import Result
from zerosim.units import GiB
from zerosim.vocabulary import is_gpu

CAPACITIES_FILE = "capacities.json"
TABLE_FILES = ("spans", "memory", "phases", "links")
KIND_COLUMNS = {"spans": ("op_kind", "buffer_kind"), "memory": ("buffer_kind",)}
"""Text columns that are often empty: CSV gives an empty field back as NaN, older folders
lack them."""
REQUIRED_FILES = ("summary.json", *(f"{name}.csv" for name in TABLE_FILES))
PEER_WAITS_FILE = "peer_waits.csv"
"""`Result.peer_waits`; a folder written before it was recorded has none."""


class ResultFilesError(ZerosimError):
    """A result folder is missing a file or holds one that cannot be read."""


def _capacities(folder: Path, summary: dict, memory: pd.DataFrame) -> dict[str, int]:
    """Bytes per device: from capacities.json, or (older folders) from the summary's
    hbm_capacity_GiB / host_capacity_GiB for every device seen in memory.csv."""
    path = folder / CAPACITIES_FILE
    if path.exists():
        return {str(k): int(v) for k, v in json.loads(path.read_text()).items()}
    capacities = {}
    for device in sorted(set(memory.device)):
        key = "hbm_capacity_GiB" if is_gpu(device) else "host_capacity_GiB"
        if summary.get(key) is not None:
            capacities[device] = int(float(summary[key]) * GiB)
    return capacities


def _kind_columns(name: str, table: pd.DataFrame) -> pd.DataFrame:
    """`table` with its kind columns as text ('' where empty), added if the file predates
    them."""
    columns = {c: (table[c].astype(object).fillna("").astype(str) if c in table.columns
                   else "")
               for c in KIND_COLUMNS.get(name, ())}
    return table.assign(**columns) if columns else table


def load_result(folder: str | Path) -> Result:
    """The `Result` saved in `folder` (summary.json, spans/memory/phases/links CSV and, when
    present, capacities.json and peer_waits.csv), as `zerosim run` wrote it."""
    folder = Path(folder)
    missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
    if missing:
        raise ResultFilesError(f"{folder}: not a zerosim result folder, missing "
                               f"{', '.join(missing)} (write one with `zerosim run`)")
    try:
        summary = json.loads((folder / "summary.json").read_text())
        tables = {name: _kind_columns(name, pd.read_csv(folder / f"{name}.csv"))
                  for name in TABLE_FILES}
        waits = folder / PEER_WAITS_FILE
        optional = {"peer_waits": pd.read_csv(waits)} if waits.is_file() else {}
    except (ValueError, OSError) as err:
        raise ResultFilesError(f"{folder}: cannot read the result files: {err}") from err
    name = str(summary.get("scenario", folder.name))
    return Result(name, tables["spans"], tables["memory"], tables["phases"], tables["links"],
                  summary, _capacities(folder, summary, tables["memory"]), **optional)
