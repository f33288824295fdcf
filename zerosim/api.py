"""The Python entry points: load a scenario, simulate it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zerosim.engine.records import PhaseSpan, Table, with_copies
from zerosim.engine.simulate import run_engine
from zerosim.results.summary import summarize
from zerosim.scenario import Scenario, load_scenario
from zerosim.vocabulary import Status

if TYPE_CHECKING:
    from zerosim.results import Result
    from zerosim.results.critical import RankPath


def simulate(scenario: Scenario | str | Path,
             overrides: Iterable[str] | Mapping[str, Any] | None = None, *,
             fold: bool = True, fold_nodes: bool = True,
             observer: Callable[[Any], None] | None = None) -> Result:
    """Replay one training iteration of `scenario` (a Scenario, or a path to its YAML).

    When the ranks fill two or more identical nodes, only node 0 is simulated (every node
    runs the same timeline) and the tables hold its ranks and devices; the summary covers
    every rank. Within a node, one rank of each class of mirror ranks is simulated (ranks a
    symmetry of the node maps onto one another run the same timeline) and the tables repeat
    its rows for the others. `fold=False` simulates every rank (`fold_nodes=False`, its older
    name, too). `observer(ctx)` is called with the engine's run context just before it starts
    (`zerosim.progress.RunProgress.observe` draws a progress line from it).
    """
    from zerosim.results import build_result

    return build_result(run_engine(_resolved(scenario, overrides), fold=fold and fold_nodes,
                                   observer=observer))


def simulate_summary(scenario: Scenario | str | Path,
                     overrides: Iterable[str] | Mapping[str, Any] | None = None, *,
                     explain: bool = False) -> dict[str, Any]:
    """`simulate(...).summary` without the tables: what a sweep point keeps. With `explain`,
    also `waits_on`: per phase time, what the reported rank's phase waited on
    (`results.critical.waits_texts`, the text of `zerosim run`'s critical-path table)."""
    return simulate_brief(scenario, overrides, explain=explain).summary


@dataclass(frozen=True)
class Brief:
    """A run's summary and its phase records (`records.PhaseSpan` rows, for every rank of
    the simulated node(s), as `Result.phases`), without tables."""

    summary: dict[str, Any]
    phases: Table[PhaseSpan]
    critical: RankPath | None = None
    """With `explain`: what each phase time of the reported rank waited on
    (`results.critical.engine_path_totals`), what `zerosim run` tabulates."""


def simulate_brief(scenario: Scenario | str | Path,
                   overrides: Iterable[str] | Mapping[str, Any] | None = None, *,
                   observer: Callable[[Any], None] | None = None,
                   explain: bool = False) -> Brief:
    """What `zerosim run --no-files` prints: the summary (equal to `simulate(...).summary`)
    and the phases, with no memory or link log and no DataFrame (pandas is not loaded).
    `explain` records the host thread too (the same events), adds the summary's `waits_on`
    (`simulate_summary`) and gives the critical path's totals (`Brief.critical`)."""
    raw = run_engine(_resolved(scenario, overrides), full=False, observer=observer,
                     host_spans=explain)
    summary, critical = summarize(raw), None
    if explain:
        from zerosim.results.critical import WAITS_ON, engine_path_totals, waits_texts

        if raw.status == Status.OK:
            critical = engine_path_totals(raw)
        summary[WAITS_ON] = None if critical is None else waits_texts(critical)
    return Brief(summary, with_copies(raw.phases, 0, raw.stands_for), critical)


def _resolved(scenario: Scenario | str | Path,
              overrides: Iterable[str] | Mapping[str, Any] | None) -> Scenario:
    if not isinstance(scenario, Scenario):
        return load_scenario(scenario, overrides)
    if overrides:
        raise ValueError("overrides apply to a scenario path; pass them to load_scenario")
    return scenario
