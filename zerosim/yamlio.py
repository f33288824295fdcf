"""YAML reading with YAML 1.2 number rules, so `5e8` is a float as users expect.

libyaml's parser is used where PyYAML has it, and a text already parsed in this process (a
profile, a sweep's base scenario) is not parsed again: each caller gets its own copy.
"""

from __future__ import annotations

import copy
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from zerosim.errors import ScenarioError

PARSED_TEXTS_KEPT = 64


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """SafeLoader that also reads `5e8`, `1e-3` and `.5` as floats (PyYAML needs `5.0e+8`)."""


_FLOAT_12 = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+0123456789."))


def parse_yaml_text(text: str, source: str) -> Any:
    parsed = _parse(text, source)
    return parsed if isinstance(parsed, str | int | float | bool | None) else copy.deepcopy(
        parsed)


@lru_cache(maxsize=PARSED_TEXTS_KEPT)
def _parse(text: str, source: str) -> Any:
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "<root>"
        raise ScenarioError(source, where, "valid YAML", str(err).splitlines()[0]) from None


def read_yaml_file(path: Path, *, referenced_from: str | None = None,
                   key_path: str = "<root>") -> Any:
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ScenarioError(referenced_from or str(path), key_path, "an existing file",
                            str(path)) from None
    return parse_yaml_text(text, str(path))


def parse_scalar(text: str) -> Any:
    """Value of a `--set key=value` right-hand side, read as a YAML scalar or flow mapping."""
    return parse_yaml_text(text, "--set") if text.strip() else ""
