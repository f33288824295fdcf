"""zerosim: a discrete-event simulator of DeepSpeed ZeRO offloaded training iterations.

The entry points load on first use, so `import zerosim.models` or `zerosim.estimate` (pure
layers) never loads the engine (SimPy) or the results (pandas).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zerosim.api import simulate
    from zerosim.results import Result
    from zerosim.scenario import Scenario, load_scenario, scenario_from_dict

_ENTRY_POINTS = {
    "simulate": "zerosim.api",
    "Result": "zerosim.results",
    "Scenario": "zerosim.scenario",
    "load_scenario": "zerosim.scenario",
    "scenario_from_dict": "zerosim.scenario",
}

__all__ = ["Result", "Scenario", "load_scenario", "scenario_from_dict", "simulate"]


def __getattr__(name: str) -> Any:
    if name not in _ENTRY_POINTS:
        raise AttributeError(f"module 'zerosim' has no attribute {name!r}")
    value = getattr(import_module(_ENTRY_POINTS[name]), name)
    globals()[name] = value
    return value
