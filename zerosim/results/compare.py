"""Two runs side by side: which settings differ, how each phase's time moved and what moved
it on the critical path (`zerosim diff A B`).

A phase's critical path tiles the phase (`results.critical`), so the changes of what it waited
on add up to the change of the phase: the comparison says which mechanisms a what-if moved, not
only by how much.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zerosim.results.critical import path_totals, reported_rank
from zerosim.units import ordered_sum
from zerosim.vocabulary import PHASE_TIMES

if TYPE_CHECKING:
    from zerosim.results.result import Result

SCENARIO_FILE = "scenario.json"
"""What `zerosim run` writes of the resolved scenario beside the result."""
QUIET_SETTINGS = ("description", "source", "unmodelled_keys", "auto_filled")
"""Top-level scenario keys a comparison does not list: text about the run, not the run."""
BETWEEN_PHASES = "between_phases"
ITERATION = "iteration"


@dataclass(frozen=True)
class WaitChange:
    """Seconds per iteration one phase waited on one kind of op (or the host), in A and B."""

    kind: str
    a_s: float
    b_s: float

    @property
    def change_s(self) -> float:
        return self.b_s - self.a_s


@dataclass(frozen=True)
class PhaseChange:
    """A phase time per iteration on each run's reported rank (or the time between phases, or
    the iteration), with what moved on its critical path, largest change first."""

    key: str
    a_s: float | None
    b_s: float | None
    waits: tuple[WaitChange, ...] = ()

    @property
    def change_s(self) -> float | None:
        return None if self.a_s is None or self.b_s is None else self.b_s - self.a_s


@dataclass(frozen=True)
class Comparison:
    a_name: str
    b_name: str
    settings: tuple[tuple[str, Any, Any], ...]
    """(dotted key, A's value, B's value) of every setting that differs; `None` where a run
    lacks the key; empty when a run has no scenario to compare."""
    phases: tuple[PhaseChange, ...]
    figures: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    """Other summary figures, A's and B's: status, TFLOPS, peak HBM and host memory."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "a": self.a_name, "b": self.b_name,
            "settings": [{"key": k, "a": a, "b": b} for k, a, b in self.settings],
            "phases": [{"phase": p.key, "a_s": p.a_s, "b_s": p.b_s, "change_s": p.change_s,
                        "waits": [{"kind": w.kind, "a_s": w.a_s, "b_s": w.b_s,
                                   "change_s": w.change_s} for w in p.waits]}
                       for p in self.phases],
            "figures": {k: {"a": a, "b": b} for k, (a, b) in self.figures.items()},
        }


def flat_settings(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A resolved scenario as dotted keys; a profile value with its provenance
    (`{"value": ..., "basis": ..., "source": ...}`) stands for its value."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if not prefix and key in QUIET_SETTINGS:
            continue
        if isinstance(value, Mapping) and "value" in value and "basis" in value:
            flat[name] = value["value"]
        elif isinstance(value, Mapping) and value:
            flat.update(flat_settings(value, f"{name}."))
        else:
            flat[name] = value
    return flat


DERIVED_SETTINGS = "deepspeed_behaviours."
"""Settings a scenario does not set but its DeepSpeed version implies (`behaviours`): listed
after the ones it sets."""


def setting_changes(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None
                    ) -> tuple[tuple[str, Any, Any], ...]:
    """The settings that differ, those a scenario sets first, then those its DeepSpeed
    version implies, each part in key order."""
    if a is None or b is None:
        return ()
    fa, fb = flat_settings(a), flat_settings(b)
    keys = sorted(fa.keys() | fb.keys(), key=lambda k: (k.startswith(DERIVED_SETTINGS), k))
    return tuple((key, fa.get(key), fb.get(key)) for key in keys if fa.get(key) != fb.get(key))


def _waits(result: Result) -> dict[str, dict[str, float]]:
    rank = reported_rank(result)
    if rank is None:
        return {}
    return {key: dict(kinds) for key, kinds in path_totals(result.critical_path, rank).items()}


def _wait_changes(a: Mapping[str, float], b: Mapping[str, float]) -> tuple[WaitChange, ...]:
    changes = [WaitChange(kind, a.get(kind, 0.0), b.get(kind, 0.0)) for kind in a.keys() | b.keys()]
    return tuple(sorted(changes, key=lambda w: (-abs(w.change_s), w.kind)))


def _iteration(result: Result) -> float | None:
    value = result.summary.get("iteration_s")
    return None if value is None else float(value)


def compare(a: Result, b: Result, a_scenario: Mapping[str, Any] | None = None,
            b_scenario: Mapping[str, Any] | None = None) -> Comparison:
    """A and B side by side: each phase's seconds per iteration on each run's reported rank
    (the sum of its critical path), what moved on that path, the time between phases and the
    iteration, and the resolved scenarios' differences where both are given."""
    wa, wb = _waits(a), _waits(b)
    phases = []
    for key in PHASE_TIMES:
        if key not in wa and key not in wb:
            continue
        a_s = ordered_sum(wa[key].values()) if key in wa else None
        b_s = ordered_sum(wb[key].values()) if key in wb else None
        phases.append(PhaseChange(key, a_s, b_s, _wait_changes(wa.get(key, {}),
                                                               wb.get(key, {}))))
    ia, ib = _iteration(a), _iteration(b)

    def between(iteration: float | None, waits: dict[str, dict[str, float]]) -> float | None:
        return None if iteration is None else iteration - ordered_sum(ordered_sum(k.values())
                                                              for k in waits.values())

    phases.append(PhaseChange(BETWEEN_PHASES, between(ia, wa), between(ib, wb)))
    phases.append(PhaseChange(ITERATION, ia, ib))
    figures = {key: (a.summary.get(key), b.summary.get(key))
               for key in ("status", "tflops_per_gpu", "tokens_per_s", "peak_hbm_GiB",
                           "peak_host_GiB")}
    return Comparison(a.scenario_name, b.scenario_name, setting_changes(a_scenario, b_scenario),
                      tuple(phases), figures)


def _scenario_of(folder: Path) -> dict[str, Any] | None:
    path = folder / SCENARIO_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError):
        return None


def folder_run(folder: str | Path) -> tuple[Result, dict[str, Any] | None]:
    """The result `zerosim run` wrote in `folder` and its resolved scenario (`scenario.json`,
    None without one)."""
    from zerosim.results.load import load_result

    return load_result(folder), _scenario_of(Path(folder))


def compare_folders(a: str | Path, b: str | Path) -> Comparison:
    """`compare` of two folders `zerosim run` wrote (their `scenario.json` for the settings)."""
    (result_a, scenario_a), (result_b, scenario_b) = folder_run(a), folder_run(b)
    return compare(result_a, result_b, scenario_a, scenario_b)
