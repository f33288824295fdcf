"""Provenance of a number in a profile, a CPU catalog or a stack: `{value, basis, source}`.

`basis` is `spec` (vendor datasheet), `measured` (a published or own measurement), `fitted`
(written by `zerosim calibrate`), `assumed` (a stated estimate awaiting a fit) or `override`
(patched by a scenario); zerosim itself writes `derived` for a value it computed from others
(the source gives the formula and its inputs), which no file may claim.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from zerosim.errors import ScenarioError
from zerosim.inputs import check_plausible

BASES = ("spec", "measured", "fitted", "assumed", "override")
DERIVED = "derived"


@dataclass(frozen=True)
class Provenance:
    value: Any
    basis: str
    source: str


def parse_provenance(raw: Any, source: str, key: str, *, table: str = "hardware",
                     bases: tuple[str, ...] = BASES) -> Provenance:
    """A `{value, basis, source}` leaf, checked; `table` is its prefix in the plausible-range
    table (`hardware` for profiles, `stack` for software stacks); `bases` those it may claim."""
    if not isinstance(raw, Mapping):
        raise ScenarioError(source, key, "{value: ..., basis: spec|measured|fitted|assumed, "
                            "source: '...'}", raw)
    unknown = set(raw) - {"value", "basis", "source"}
    if unknown:
        raise ScenarioError(source, f"{key}.{sorted(unknown)[0]}",
                            "only value, basis and source", sorted(unknown)[0])
    if raw.get("basis") not in bases:
        raise ScenarioError(source, f"{key}.basis", f"one of {', '.join(bases)}",
                            raw.get("basis"))
    if not isinstance(raw.get("source"), str) or not raw["source"].strip():
        raise ScenarioError(source, f"{key}.source", "a non-empty text saying where the value "
                            "comes from", raw.get("source"))
    check_plausible(f"{table}.{key}.source", raw["source"], source=source,
                    key_path=f"{key}.source")
    return Provenance(raw.get("value"), raw["basis"], raw["source"])

