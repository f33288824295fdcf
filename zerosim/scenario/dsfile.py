"""A ds_config file read as DeepSpeed reads it.

`DeepSpeedConfig.__init__` (runtime/config.py) opens a path with `json.load` before 0.8.1 and
with `hjson.load` from 0.8.1 (`zerosim.behaviours` row `hjson_config_files`), both with
`dict_raise_error_on_duplicate_keys`. hjson accepts what the tutorials print: comments,
trailing commas, a missing comma at the end of a line. Files that are not `.json` / `.hjson`
are zerosim's YAML form of a ds_config.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from zerosim.behaviours import Behaviours
from zerosim.errors import Described, ScenarioError
from zerosim.inputs import read_input_text
from zerosim.inputs.documents import MAX_DEPTH, check_tree_shape
from zerosim.yamlio import read_yaml_file

JSON_SUFFIXES = {".json", ".hjson"}


class _DuplicateKeys(ValueError):
    def __init__(self, keys: list[str]) -> None:
        super().__init__(keys)
        self.keys = keys


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    tree = dict(pairs)
    if len(tree) != len(pairs):
        counts = Counter(key for key, _ in pairs)
        raise _DuplicateKeys([key for key, count in counts.items() if count > 1])
    return tree


class _NoHjson(ValueError):
    """hjson (a zerosim dependency) is not installed and the file is not strict JSON."""


def _parse(text: str, lenient: bool) -> Any:
    """Strict JSON first (the same tree hjson gives for it); hjson for the rest."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as err:
        if not lenient:
            raise
        strict_error = err
    try:
        import hjson
    except ImportError:
        raise _NoHjson(f"not strict JSON ({strict_error}) and hjson is not installed "
                       "(pip install hjson, or pip install -e . again)") from None
    return hjson.loads(text, object_pairs_hook=_no_duplicates)


def read_ds_config(path: Path, *, behaviours: Behaviours, referenced_from: str,
                   key_path: str) -> Any:
    if path.suffix.lower() not in JSON_SUFFIXES:
        return read_yaml_file(path, referenced_from=referenced_from, key_path=key_path)
    text = read_input_text(path, referenced_from=referenced_from, key_path=key_path)
    reader = "hjson (DeepSpeed 0.8.1 and later)" if behaviours.hjson_config_files else \
        "strict JSON (DeepSpeed before 0.8.1)"
    try:
        tree = _parse(text, behaviours.hjson_config_files)
    except RecursionError:
        raise ScenarioError(str(path), "<root>", f"at most {MAX_DEPTH} levels of nesting",
                            Described("deeper nesting")) from None
    except _DuplicateKeys as err:
        raise ScenarioError(str(path), ", ".join(err.keys),
                            "each key once (DeepSpeed: 'Duplicate keys in DeepSpeed config')",
                            err.keys) from None
    except ValueError as err:
        raise ScenarioError(str(path), "<root>", f"a ds_config that {reader} can read",
                            str(err).splitlines()[0]) from None
    check_tree_shape(tree, str(path))
    return tree
