"""Results of a run: DataFrames, summary and exporters.

The entry points load on first use, so `zerosim.results.summary` (pure Python) does not load
pandas.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zerosim.results.load import load_result
    from zerosim.results.result import Result, build_result

_ENTRY_POINTS = {
    "Result": "zerosim.results.result",
    "build_result": "zerosim.results.result",
    "load_result": "zerosim.results.load",
}

__all__ = ["Result", "build_result", "load_result"]


def __getattr__(name: str) -> Any:
    if name not in _ENTRY_POINTS:
        raise AttributeError(f"module 'zerosim.results' has no attribute {name!r}")
    value = getattr(import_module(_ENTRY_POINTS[name]), name)
    globals()[name] = value
    return value
