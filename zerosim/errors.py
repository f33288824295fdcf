"""Errors that explain themselves: which file, which key, what was expected, what was given.

What an error quotes from the input is bounded: a value is shown in at most `SHOWN_CHARS`
characters (a 5000-digit number, a million-character text or a billion-laughs structure costs
no more to show than a short one), file names and key paths in at most `PLACE_CHARS`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

SHOWN_CHARS = 80
"""The most characters of a value an error message quotes."""
DESCRIBED_CHARS = 300
"""The most characters of a description zerosim wrote for a `got` (it may hold a path)."""
PLACE_CHARS = 200
"""The most characters of a file name or a key path an error message quotes."""
EXPECTED_CHARS = 1000
"""The most characters of the `expected` text (it may list known keys)."""
YAML_WORDS = {True: "true", False: "false", None: "null"}
"""How true, false and null are shown: as the user wrote them."""
LARGE_INT_BITS = 256
"""Integers wider than this are described by their digit count, not written out."""


class ZerosimError(Exception):
    """Base class for every error zerosim raises on purpose."""


class Described(str):
    """A `got` that is already a description ('a directory', 'nothing'), shown unquoted."""

    def __repr__(self) -> str:
        return str(self)


class ScenarioError(ZerosimError, ValueError):
    """Invalid user input: a scenario, a hardware profile, a ds_config or an override."""

    def __init__(self, source: str | Path | None, key_path: str, expected: str, got: Any):
        self.source = str(source) if source is not None else "<inline>"
        self.key_path = key_path or "<root>"
        self.expected = expected
        self.got = got
        super().__init__(
            f"{clip(self.source, PLACE_CHARS)}: {clip(self.key_path, PLACE_CHARS)}: "
            f"expected {clip(expected, EXPECTED_CHARS)}, got {shown(got)}"
        )


class UnsupportedConfigError(ScenarioError):
    """A configuration zerosim refuses: DeepSpeed would refuse it too, or zerosim does not
    model it (yet). Decided once, when the scenario is resolved (`zerosim.scenario.support`),
    so `check`, `sweep` and `run` agree."""


class ScenarioWarning(UserWarning):
    """Something about an input worth telling the user, naming the field; nothing is refused.
    The CLI prints each once on stderr as `warning: ...`."""


def with_scenario_warnings(load: Callable[[], T]) -> tuple[T, list[ScenarioWarning]]:
    """What `load()` returns and the `ScenarioWarning`s it gave, each caught rather than shown,
    for the caller to show once or to note where it belongs."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ScenarioWarning)
        result = load()
    return result, [w.message for w in caught if issubclass(w.category, ScenarioWarning)]


def clip(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, the cut marked with '...'."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    """A short rendering of `value`, in time proportional to `limit`, never to its size."""
    if isinstance(value, Described):
        return clip(str.__str__(value), DESCRIBED_CHARS)
    return clip(_bounded_repr(value, limit + 1), limit)


def _bounded_repr(value: Any, budget: int) -> str:
    if isinstance(value, Described):
        return str.__str__(value)[:budget]
    if isinstance(value, str):
        return repr(value[:budget]) + ("..." if len(value) > budget else "")
    if isinstance(value, int) and not isinstance(value, bool):
        return _int_text(value)
    if isinstance(value, Mapping):
        return _container("{", "}", ((f"{_bounded_repr(k, budget)}: ", v)
                                     for k, v in value.items()), budget)
    if isinstance(value, list | tuple | set | frozenset):
        return _container("[", "]", (("", item) for item in value), budget)
    if isinstance(value, bool) or value is None:
        return YAML_WORDS[value]
    return repr(value)[:budget] if isinstance(value, float) else _object_text(value, budget)


def _int_text(value: int) -> str:
    if value.bit_length() <= LARGE_INT_BITS:
        return str(value)
    digits = int(value.bit_length() * 0.30103) + 1
    return f"an integer of about {digits} digits"


def _container(opening: str, closing: str, items, budget: int) -> str:
    parts: list[str] = []
    used = len(opening)
    for prefix, item in items:
        if used >= budget:
            parts.append("...")
            break
        text = prefix + _bounded_repr(item, budget - used)
        parts.append(text)
        used += len(text) + 2
    return opening + ", ".join(parts) + closing


def _object_text(value: Any, budget: int) -> str:
    try:
        return repr(value)[:budget]
    except Exception:
        return f"a {type(value).__name__}"
