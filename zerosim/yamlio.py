"""YAML reading for scenarios, profiles, ds_configs and sweep specs: through the input boundary
(`zerosim.inputs`), with YAML 1.2 number rules so `5e8` is a float as users expect.

A text already parsed in this process (a profile, a sweep's base scenario: every point of a
sweep worker reads them again) is not parsed again; each caller gets its own copy
(`copy_tree`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from zerosim.inputs import parse_yaml, read_input_text

PARSED_TEXTS_KEPT = 64
_SCALARS = frozenset({str, int, float, bool, type(None)})
"""Types `copy.deepcopy` gives back as they are (`copy._deepcopy_atomic`)."""


@lru_cache(maxsize=PARSED_TEXTS_KEPT)
def _parsed(text: str, source: str) -> Any:
    return parse_yaml(text, source)


def parse_yaml_text(text: str, source: str) -> Any:
    parsed = _parsed(text, source)
    return parsed if isinstance(parsed, str | int | float | bool | None) else copy_tree(parsed)


def copy_tree(tree: Any) -> Any:
    """`copy.deepcopy(tree)` for a tree of mappings, lists and scalars (parsed YAML or JSON, a
    scenario's mapping), in a quarter of the time: a `dict` or a `list` is copied once, a
    second reference to it (a YAML alias) getting the same copy, as deepcopy does; scalars
    are shared, as deepcopy shares them; anything else goes to deepcopy itself, with the
    same memo."""
    return _copy(tree, {})


def _copy(value: Any, memo: dict[int, Any]) -> Any:
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is not dict and kind is not list:
        return copy.deepcopy(value, memo)
    known = memo.get(id(value))
    if known is not None:
        return known
    if kind is list:
        items: list[Any] = []
        memo[id(value)] = items
        items.extend([item if type(item) in _SCALARS else _copy(item, memo) for item in value])
        return items
    mapping: dict[Any, Any] = {}
    memo[id(value)] = mapping
    for key, item in value.items():
        mapping[key if type(key) in _SCALARS else _copy(key, memo)] = (
            item if type(item) in _SCALARS else _copy(item, memo))
    return mapping


def read_yaml_file(path: Path, *, referenced_from: str | None = None,
                   key_path: str = "<root>") -> Any:
    text = read_input_text(path, referenced_from=referenced_from, key_path=key_path)
    return parse_yaml_text(text, str(path))


def parse_scalar(text: str) -> Any:
    """Value of a `--set key=value` right-hand side, read as a YAML scalar or flow mapping."""
    return parse_yaml(text, "--set") if text.strip() else ""


def dotted_leaf(tree: Mapping[str, Any], dotted: str) -> Any:
    """`tree["a"]["b"]` for `"a.b"`, or None where the path does not exist."""
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def flatten_nested(overrides: Mapping[str, Any], descend: Callable[[str, Mapping[str, Any]], bool],
                   prefix: str = "") -> dict[str, Any]:
    """`{a: {b: 1}}` -> `{"a.b": 1}`: nested overrides patch the keys they name, not the whole
    section. `descend(dotted, value)` says whether a mapping value is a section to go into
    (True) or one value to set whole (False); dotted keys pass through as they are."""
    flat: dict[str, Any] = {}
    for key, value in overrides.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value and descend(dotted, value):
            flat.update(flatten_nested(value, descend, f"{dotted}."))
        else:
            flat[dotted] = value
    return flat

