"""DeepSpeed's own timings of ZeRO-2 Offload on a DGX A100, with and without
`--bind_cores_to_rank` (its core-binding study of 2025), beside zerosim's.

Reported, not judged: the runs' DeepSpeed version, attention kernel and averaging are partly
inferred (data/deepspeed_offload_dgx_a100.yaml says how), and nothing in zerosim is fitted on
them. Pure: the data and the timed span; `zerosim.validation.validate` simulates the runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zerosim.shipped import shipped_root
from zerosim.units import ordered_sum
from zerosim.validation.reference import reference_data
from zerosim.vocabulary import PhaseTime, Status

DATA_FILE = "deepspeed_offload_dgx_a100.yaml"


@dataclass(frozen=True)
class OffloadRun:
    """One published step time and the scenario (with overrides) that replays its run."""

    name: str
    scenario: Path
    overrides: Mapping[str, Any]
    step_s: float
    runs_s: tuple[float, ...]
    """The separate runs the published figure averages, where the source lists them."""
    source: str


@dataclass(frozen=True)
class StepRatio:
    """One run's step time over another's (`over` / `under`), by their names."""

    name: str
    over: str
    under: str


@dataclass(frozen=True)
class OffloadStudy:
    group: str
    timed: str
    runs: tuple[OffloadRun, ...]
    ratios: tuple[StepRatio, ...]


def load_offload_study() -> OffloadStudy:
    data = reference_data(DATA_FILE)
    runs = tuple(OffloadRun(r["name"], shipped_root() / r["scenario"], dict(r["overrides"]),
                            r["step_ms"] / 1000, tuple(v / 1000 for v in r.get("runs_ms", ())),
                            r["source"])
                 for r in data["runs"])
    ratios = tuple(StepRatio(r["name"], r["over"], r["under"]) for r in data["ratios"])
    return OffloadStudy(data["group"], data["timed"], runs, ratios)


def timed_step_s(summary: Mapping[str, Any]) -> float | None:
    """What the script's per-step timer holds, from a run's summary: its forward, backward and
    update (one micro-batch a step), not the work between them (the data loader's next
    batch, which the timer leaves out). With ZenFlow an iteration is a window of steps (one
    micro-batch each, the last the boundary): the window's phases over its steps, as the
    blog's averages over many steps take them. None when the run did not finish."""
    if summary["status"] != Status.OK:
        return None
    phases = {key: seconds or 0.0 for key, seconds in summary["phases_s"].items()}
    if summary.get("zenflow_step_s") is None:
        return ordered_sum(phases.values())
    steps = round(summary["iteration_s"] / summary["zenflow_step_s"])
    window = (steps * phases[PhaseTime.FORWARD] + (steps - 1)
              * phases[PhaseTime.BACKWARD_NON_BOUNDARY] + phases[PhaseTime.BACKWARD_BOUNDARY]
              + phases[PhaseTime.UPDATE])
    return window / steps
