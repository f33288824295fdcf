"""Results of a run: DataFrames, summary and exporters.

The entry points load on first use, so `zerosim.results.summary` (pure Python) does not load
pandas.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zerosim import lazy_getattr

if TYPE_CHECKING:
    from zerosim.results.load import load_result
    from zerosim.results.result import Result, build_result

_ENTRY_POINTS = {
    "Result": "zerosim.results.result",
    "build_result": "zerosim.results.result",
    "load_result": "zerosim.results.load",
}

__all__ = ["Result", "build_result", "load_result"]

__getattr__ = lazy_getattr("zerosim.results", _ENTRY_POINTS, globals())
