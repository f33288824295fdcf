"""Alternative readings of a profile's data: named sets of its values that the measurements
behind the profile fit about as well as the values it ships, or that a measurement of a
sibling part says a run may meet (a clock held down by the power cap, a slower session).

A profile's `alternatives` section names each, says where it comes from and what it sets, by
the dotted keys a scenario's `hardware.overrides` takes, in the same units:

    alternatives:
      stream_host_memory:
        source: "host memory at what STREAM measures on this CPU, and the values the
                 calibration data then refit"
        set: {host.memory_GBps_per_domain: 243, pcie.h2d_pageable_GBps: 14.55}

A key under `stack.` (`stack.allocator.heap_reuse_MiB`) sets a value of the scenario's software
stack, where the reading is of the node's environment more than of its parts (the C library's
heap on that node); the stack checks it when a scenario runs the alternative.

An alternative may instead take a shipped profile's alternative of the same name whole
(`carried_from: h100-jlse`), as a value may take another profile's. A scenario runs one with
`hardware.alternative: NAME` (`--set hardware.alternative=NAME`): its values apply before the
scenario's own overrides, each with basis `override` and a source naming the alternative.
`zerosim sensitivity` runs every alternative of the scenario's profile beside the shipped
values. Pure: no SimPy.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from zerosim.errors import ScenarioError
from zerosim.inputs import check_plausible

SECTION = "alternatives"
OVERRIDE_KEY = "hardware.alternative"
"""The scenario key (and `--set` path) that runs one of the profile's alternatives."""
STACK_PREFIX = "stack."
"""How an alternative names a value of the scenario's software stack."""
NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
"""An alternative's name: lower case, digits and underscores, as a sweep axis writes it."""
FIELDS = frozenset({"source", "set", "carried_from"})


@dataclass(frozen=True)
class Alternative:
    """One reading: the profile values it sets (dotted keys, the keys' units) and why."""

    name: str
    source: str
    values: Mapping[str, float]
    carried_from: str | None = None
    """The shipped profile whose alternative of the same name this one is."""

    def overrides(self, profile: str) -> dict[str, dict[str, Any]]:
        """Its profile values as `hardware.overrides` entries, each with its provenance."""
        return self._entries(profile, stack=False)

    def stack_overrides(self, profile: str) -> dict[str, dict[str, Any]]:
        """Its stack values as `runtime.framework.overrides` entries (without `stack.`)."""
        return self._entries(profile, stack=True)

    def _entries(self, profile: str, *, stack: bool) -> dict[str, dict[str, Any]]:
        origin = f"alternative {self.name} of profile {profile}"
        return {key.removeprefix(STACK_PREFIX): {"value": value, "basis": "override",
                                                  "source": origin}
                for key, value in self.values.items() if key.startswith(STACK_PREFIX) == stack}

    def describe(self) -> str:
        """'host.memory_GBps_per_domain 243, pcie.h2d_pageable_GBps 14.55'."""
        return ", ".join(f"{key} {value:g}" for key, value in self.values.items())


CheckValue = Callable[[str, Any, str], float]
"""Checks one value of an alternative against its profile key (`key`, `value`, `key_path`)
and returns it as a float, or raises `ScenarioError`."""
CarriedSection = Callable[[str, str], Mapping[str, Any]]
"""A shipped profile's `alternatives` section (`origin`, `key_path` of the reference)."""


def parse_alternatives(raw: Any, source: str, *, check_value: CheckValue,
                       carried_section: CarriedSection) -> tuple[Alternative, ...]:
    """A profile's `alternatives` section, checked: each name, its source, and each value it
    sets (`check_value`: a known numeric key, a valid and plausible value), or the shipped
    profile's alternative it carries (`carried_section`)."""
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise ScenarioError(source, SECTION, "a mapping of alternative names to {source, set}",
                            raw)
    return tuple(_alternative(name, spec, source, check_value, carried_section)
                 for name, spec in raw.items())


def _alternative(name: Any, spec: Any, source: str, check_value: CheckValue,
                 carried_section: CarriedSection) -> Alternative:
    key_path = f"{SECTION}.{name}"
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ScenarioError(source, key_path, "a name of lower-case letters, digits and "
                            "underscores, starting with a letter", name)
    if not isinstance(spec, Mapping):
        raise ScenarioError(source, key_path, "{source: '...', set: {key: value}} or "
                            "{carried_from: a shipped profile}", spec)
    unknown = sorted(set(spec) - FIELDS, key=str)
    if unknown:
        raise ScenarioError(source, f"{key_path}.{unknown[0]}",
                            "only source, set and carried_from", unknown[0])
    if "carried_from" in spec:
        return _carried(name, spec, source, key_path, check_value, carried_section)
    text = spec.get("source")
    if not isinstance(text, str) or not text.strip():
        raise ScenarioError(source, f"{key_path}.source", "a non-empty text saying where the "
                            "alternative comes from", text)
    check_plausible(f"hardware.{SECTION}.source", text, source=source,
                    key_path=f"{key_path}.source")
    values = spec.get("set")
    if not isinstance(values, Mapping) or not values:
        raise ScenarioError(source, f"{key_path}.set", "a mapping of profile keys to values "
                            "(e.g. host.memory_GBps_per_domain: 243)", values)
    checked = {str(key): check_value(str(key), value, f"{key_path}.set.{key}")
               for key, value in values.items()}
    return Alternative(name, text, MappingProxyType(checked))


def _carried(name: str, spec: Mapping[str, Any], source: str, key_path: str,
             check_value: CheckValue, carried_section: CarriedSection) -> Alternative:
    """The alternative `spec` carries from a shipped profile: that profile's alternative of
    the same name, which must set its values itself."""
    if set(spec) != {"carried_from"}:
        extra = sorted(set(spec) - {"carried_from"})[0]
        raise ScenarioError(source, f"{key_path}.{extra}", "carried_from alone (the "
                            "alternative is the shipped profile's, whole)", extra)
    origin = spec["carried_from"]
    section = carried_section(origin, f"{key_path}.carried_from")
    if name not in section:
        raise ScenarioError(source, f"{key_path}.carried_from",
                            f"a shipped profile with an alternative called {name}", origin)
    if not isinstance(section[name], Mapping) or "carried_from" in section[name]:
        raise ScenarioError(source, f"{key_path}.carried_from", "a profile whose alternative "
                            f"{name} sets its values itself", origin)
    own = _alternative(name, section[name], f"profile {origin}", check_value, carried_section)
    return Alternative(name, own.source, own.values, carried_from=str(origin))


def find_alternative(alternatives: tuple[Alternative, ...], name: Any, *, profile: str,
                     source: str, key_path: str) -> Alternative:
    """The alternative `name` of a profile, or an error that lists the profile's."""
    for alternative in alternatives:
        if alternative.name == name:
            return alternative
    names = ", ".join(a.name for a in alternatives)
    expected = (f"one of profile {profile}'s alternatives ({names})" if names else
                f"nothing: profile {profile} has no alternatives")
    raise ScenarioError(source, key_path, expected, name)
