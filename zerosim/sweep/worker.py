"""The function every executor runs: one point in, one plain row out (picklable both ways)."""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Mapping
from typing import Any

from zerosim.vocabulary import Status

SKIPPED_SUMMARY_KEYS = ("checks",)  # lists of text: one row per point has no room for them
JSON_SUMMARY_KEYS = ("oom",)        # kept whole, as one JSON cell


def plain(value: Any) -> Any:
    """numpy scalars -> Python scalars, so rows pickle and print the same everywhere."""
    item = getattr(value, "item", None)
    if item is not None and not isinstance(value, str | bytes):
        try:
            return item()
        except (TypeError, ValueError):
            return value
    return value


def to_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=plain)


def flatten_summary(summary: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"phases_s": {"update": 1.0}}` -> `{"phases_s.update": 1.0}`; lists are dropped,
    `oom` becomes its JSON text (empty when there was none)."""
    flat: dict[str, Any] = {}
    for key, value in summary.items():
        name = f"{prefix}{key}"
        if not prefix and key in JSON_SUMMARY_KEYS:
            flat[name] = None if value is None else to_json(value)
        elif not prefix and key in SKIPPED_SUMMARY_KEYS:
            continue
        elif isinstance(value, Mapping):
            flat.update(flatten_summary(value, f"{name}."))
        elif isinstance(value, list | tuple | set):
            continue
        else:
            flat[name] = plain(value)
    return flat


def error_text(err: BaseException) -> str:
    return " / ".join(f"{type(err).__name__}: {err}".splitlines())


def run_point(base: str, overrides: dict[str, Any], point_id: str, explain: bool = False
              ) -> dict[str, Any]:
    """Simulate `base` with `overrides`: `{point_id, status, <summary fields>, error, wall_s}`;
    with `explain`, the summary's `waits_on` too (`waits_on.forward`, ...: what each phase
    waited on, `api.simulate_summary`).

    Any exception inside the simulation is a row with status `error` and the exception's text;
    an out-of-memory configuration is a row with status `oom`.
    """
    from zerosim.api import simulate_summary
    from zerosim.errors import ScenarioWarning

    started = time.perf_counter()
    row: dict[str, Any] = {"point_id": point_id}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ScenarioWarning)
            summary = simulate_summary(base, overrides, explain=explain)
    except Exception as err:
        row["status"] = Status.ERROR
        row["error"] = error_text(err)
    else:
        row.update(flatten_summary(summary))
        row["error"] = ""
    row["wall_s"] = time.perf_counter() - started
    return row
