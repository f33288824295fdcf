"""YAML reading for scenarios, profiles, ds_configs and sweep specs: through the input boundary
(`zerosim.inputs`), with YAML 1.2 number rules so `5e8` is a float as users expect."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zerosim.inputs import parse_yaml, read_input_text


def parse_yaml_text(text: str, source: str) -> Any:
    return parse_yaml(text, source)


def read_yaml_file(path: Path, *, referenced_from: str | None = None,
                   key_path: str = "<root>") -> Any:
    text = read_input_text(path, referenced_from=referenced_from, key_path=key_path)
    return parse_yaml(text, str(path))


def parse_scalar(text: str) -> Any:
    """Value of a `--set key=value` right-hand side, read as a YAML scalar or flow mapping."""
    return parse_yaml(text, "--set") if text.strip() else ""
