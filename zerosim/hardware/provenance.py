"""Provenance of a number in a profile, a CPU catalog or a stack: `{value, basis, source}`.

`basis` is `spec` (vendor datasheet), `measured` (a published or own measurement), `fitted`
(written by `zerosim calibrate`), `assumed` (a stated estimate awaiting a fit) or `override`
(patched by a scenario); zerosim itself writes `derived` for a value it computed from others
(the source gives the formula and its inputs), which no file may claim.

A `fitted` or `measured` value may say how well it is known: `stderr_pct`, its standard error
in percent of the value (what `zerosim calibrate` or the fit behind a measured value gave).
`zerosim sensitivity` carries it into the prediction's uncertainty.

A value taken over from another shipped profile (the same CPU family's fitted rate, the same
GPU's measured one) or stack names it: `carried_from: h100-jlse`. The loader then holds the two
equal (`check_carried`), so a refit of the source cannot leave its copies behind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from zerosim.errors import ScenarioError
from zerosim.inputs import check_plausible

BASES = ("spec", "measured", "fitted", "assumed", "override")
DERIVED = "derived"
WITH_STDERR = ("measured", "fitted")
"""Bases whose values may carry a standard error."""
MAX_STDERR_PCT = 1000.0


@dataclass(frozen=True)
class Provenance:
    value: Any
    basis: str
    source: str
    stderr: float | None = None
    """Relative standard error (a fraction of the value), when one is known."""
    carried_from: str | None = None
    """The shipped profile (or stack) whose value for the same key this one is, when it says
    so (`check_carried`)."""

    def as_dict(self) -> dict[str, Any]:
        """As a file writes it: value, basis, source, and stderr_pct when known."""
        out = {"value": self.value, "basis": self.basis, "source": self.source}
        if self.stderr is not None:
            out["stderr_pct"] = round(100 * self.stderr, 6)
        if self.carried_from is not None:
            out["carried_from"] = self.carried_from
        return out

    def describe_basis(self) -> str:
        """'fitted ±4%', 'assumed, carried from h100-jlse', or the basis alone."""
        text = basis_text(self.basis, self.stderr)
        return text if self.carried_from is None else f"{text}, carried from {self.carried_from}"


def basis_text(basis: str, stderr: float | None) -> str:
    """'fitted ±4%', or the basis alone when no standard error is known."""
    return basis if stderr is None else f"{basis} ±{100 * stderr:.2g}%"


def parse_provenance(raw: Any, source: str, key: str, *, table: str = "hardware",
                     bases: tuple[str, ...] = BASES) -> Provenance:
    """A `{value, basis, source}` leaf, checked; `table` is its prefix in the plausible-range
    table (`hardware` for profiles, `stack` for software stacks); `bases` those it may claim."""
    if not isinstance(raw, Mapping):
        raise ScenarioError(source, key, "{value: ..., basis: spec|measured|fitted|assumed, "
                            "source: '...'}", raw)
    unknown = set(raw) - {"value", "basis", "source", "stderr_pct", "carried_from"}
    if unknown:
        raise ScenarioError(source, f"{key}.{sorted(unknown)[0]}",
                            "only value, basis, source, stderr_pct and carried_from",
                            sorted(unknown)[0])
    if raw.get("basis") not in bases:
        raise ScenarioError(source, f"{key}.basis", f"one of {', '.join(bases)}",
                            raw.get("basis"))
    if not isinstance(raw.get("source"), str) or not raw["source"].strip():
        raise ScenarioError(source, f"{key}.source", "a non-empty text saying where the value "
                            "comes from", raw.get("source"))
    check_plausible(f"{table}.{key}.source", raw["source"], source=source,
                    key_path=f"{key}.source")
    return Provenance(raw.get("value"), raw["basis"], raw["source"],
                      _stderr(raw, source, key), _carried_from(raw, source, key))


def _stderr(raw: Mapping[str, Any], source: str, key: str) -> float | None:
    """`stderr_pct` as a fraction: a number in (0, 1000] on a fitted or measured value."""
    if "stderr_pct" not in raw:
        return None
    pct = raw["stderr_pct"]
    if raw["basis"] not in WITH_STDERR:
        raise ScenarioError(source, f"{key}.stderr_pct", "a standard error only on a "
                            f"{' or '.join(WITH_STDERR)} value", f"basis {raw['basis']}")
    if isinstance(pct, bool) or not isinstance(pct, int | float) or not (
            0 < pct <= MAX_STDERR_PCT):
        raise ScenarioError(source, f"{key}.stderr_pct", "a standard error in percent of the "
                            f"value, in (0, {MAX_STDERR_PCT:g}]", pct)
    return float(pct) / 100


def _carried_from(raw: Mapping[str, Any], source: str, key: str) -> str | None:
    """`carried_from` as given: a shipped profile's or stack's name (its loader checks the
    value: `check_carried`)."""
    name = raw.get("carried_from")
    if name is None:
        return None
    if not isinstance(name, str) or not name.strip():
        raise ScenarioError(source, f"{key}.carried_from", "the name of the shipped profile "
                            "or stack the value is taken from", name)
    return name


def check_carried(provenance: Mapping[str, Provenance], name: str, source: str, *, kind: str,
                  names: Sequence[str], values_of: Callable[[str], Mapping[str, Any]]) -> None:
    """Every value of a profile or stack (`kind`) called `name` that says `carried_from: X` is
    shipped `kind` X's value for the same key (`values_of(X)`: its values by dotted key)."""
    for key, prov in provenance.items():
        origin = prov.carried_from
        if origin is None:
            continue
        if origin not in names or origin == name:
            raise ScenarioError(source, f"{key}.carried_from", f"another shipped {kind}'s name "
                                f"({', '.join(n for n in names if n != name)})", origin)
        carried = values_of(origin)
        if key not in carried:
            raise ScenarioError(source, f"{key}.carried_from",
                                f"a shipped {kind} that gives {key}", origin)
        if prov.value != carried[key]:
            raise ScenarioError(source, f"{key}.value", f"{origin}'s {key}, {carried[key]!r}, "
                                f"which it says it carries (carried_from: {origin}): copy the "
                                "value over, or drop carried_from", prov.value)


def provenance_values(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """The values of a file's `{value, basis, source}` leaves, by dotted key."""
    values: dict[str, Any] = {}
    for key, node in tree.items():
        if isinstance(node, Mapping) and "value" in node:
            values[f"{prefix}{key}"] = node["value"]
        elif isinstance(node, Mapping):
            values.update(provenance_values(node, f"{prefix}{key}."))
    return values
