"""zerosim: a discrete-event simulator of DeepSpeed ZeRO offloaded training iterations.

The entry points load on first use, so `import zerosim.models` or `zerosim.estimate` (pure
layers) never loads the engine (SimPy) or the results (pandas).
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zerosim.api import simulate
    from zerosim.results import Result
    from zerosim.runs import predict_frame
    from zerosim.scenario import Scenario, load_scenario, scenario_from_dict
    from zerosim.sensitivity import sensitivity
    from zerosim.sweep.frame import sweep_frame

_ENTRY_POINTS = {
    "simulate": "zerosim.api",
    "Result": "zerosim.results",
    "Scenario": "zerosim.scenario",
    "load_scenario": "zerosim.scenario",
    "scenario_from_dict": "zerosim.scenario",
    "predict_frame": "zerosim.runs",
    "sensitivity": "zerosim.sensitivity",
    "sweep_frame": "zerosim.sweep.frame",
}

__all__ = ["Result", "Scenario", "load_scenario", "predict_frame", "scenario_from_dict",
           "sensitivity", "simulate", "sweep_frame"]


def lazy_getattr(package: str, entry_points: dict[str, str],
                 namespace: MutableMapping[str, Any]) -> Callable[[str], Any]:
    """A package's `__getattr__` that imports each entry point's module on first use."""
    def getattr_(name: str) -> Any:
        if name not in entry_points:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(entry_points[name]), name)
        namespace[name] = value
        return value
    return getattr_


__getattr__ = lazy_getattr("zerosim", _ENTRY_POINTS, globals())
