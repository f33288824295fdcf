"""The Python entry points: load a scenario, simulate it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from zerosim.engine.simulate import run_engine
from zerosim.results import Result, build_result
from zerosim.scenario import Scenario, load_scenario


def simulate(scenario: Scenario | str | Path,
             overrides: Iterable[str] | Mapping[str, Any] | None = None, *,
             observer: Callable[[Any], None] | None = None) -> Result:
    """Replay one training iteration of `scenario` (a Scenario, or a path to its YAML).

    `observer(ctx)` is called with the engine's run context just before it starts
    (`zerosim.progress.RunProgress.observe` draws a progress line from it)."""
    if not isinstance(scenario, Scenario):
        scenario = load_scenario(scenario, overrides)
    elif overrides:
        raise ValueError("overrides apply to a scenario path; pass them to load_scenario")
    return build_result(run_engine(scenario, observer=observer))
