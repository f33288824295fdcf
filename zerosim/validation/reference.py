"""Published reference data shipped with zerosim (every source is in data/study.yaml and
data/deepspeed_estimator.yaml)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from importlib import resources
from typing import Any

from zerosim.vocabulary import PHASE_TIMES
from zerosim.yamlio import parse_yaml_text

PHASES = PHASE_TIMES


@dataclass(frozen=True)
class Observation:
    key: str
    value: float
    source: str
    inconsistent: str | None = None


@dataclass(frozen=True)
class Table1Row:
    """A column of the study's Table 1: a catalog model, or a nominal parameter count."""

    size: str
    model: str | None
    params: int | None
    model_states_GB: float
    optimizer_states_GB: float


@dataclass(frozen=True)
class Study:
    title: str
    setup: str
    scenario: dict[str, Any]
    table2: dict[int, dict[str, float]]
    table2_source: str
    excluded: dict[str, str]
    observations: dict[str, Observation]
    table1: tuple[Table1Row, ...]
    table1_source: str
    table1_tolerance: float
    table1_tolerance_reason: str

    def scenario_for(self, data_parallel: int) -> dict[str, Any]:
        tree = copy.deepcopy(self.scenario)
        tree["name"] = f"study-llama2-13b-dp{data_parallel}"
        tree["data_parallel"] = data_parallel
        return tree


@dataclass(frozen=True)
class EstimatorTable:
    """A table DeepSpeed's documentation prints, with the arguments of the call behind it."""

    name: str
    call: str
    arguments: dict[str, Any]
    printed: str
    source: str


def reference_data(name: str) -> dict[str, Any]:
    """A file of `zerosim/validation/data/` (published measurements with their source), parsed."""
    text = (resources.files("zerosim.validation") / "data" / name).read_text()
    return parse_yaml_text(text, f"zerosim/validation/data/{name}")


def load_estimator_tables() -> tuple[EstimatorTable, ...]:
    data = reference_data("deepspeed_estimator.yaml")
    return tuple(EstimatorTable(t["name"], t["call"], dict(t["arguments"]), t["printed"],
                                data["source"]) for t in data["tables"])


def load_study() -> Study:
    data = reference_data("study.yaml")
    observations = {
        key: Observation(key, float(entry["value"]), entry["source"], entry.get("inconsistent"))
        for key, entry in data["observations"].items()
    }
    table = data["table2"]
    return Study(
        title=data["study"]["title"],
        setup=data["study"]["setup"],
        scenario=data["study"]["scenario"],
        table2={int(dp): {k: float(v) for k, v in row.items()}
                for dp, row in table["cases"].items()},
        table2_source=table["source"],
        excluded=dict(table.get("excluded", {})),
        observations=observations,
        table1=tuple(Table1Row(size, row.get("model"), row.get("params"),
                               float(row["model_states_GB"]), float(row["optimizer_states_GB"]))
                     for size, row in data["table1"]["cases"].items()),
        table1_source=data["table1"]["source"],
        table1_tolerance=float(data["table1"]["tolerance"]),
        table1_tolerance_reason=data["table1"]["tolerance_reason"],
    )
