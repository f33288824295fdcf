"""A configuration zerosim found, as the files a user runs: a scenario for `zerosim run` and
the ds_config DeepSpeed reads.

`zerosim tune` searches with overrides of the user's scenario (`--set` paths). The files hold
only the overrides that change what zerosim resolves (a knob at DeepSpeed's default, or one
that the configuration makes inert, is left out: a release that does not know a key refuses a
ds_config naming it), applied to the user's own scenario tree, so its keys, its `auto`
values and its ds_config file stay as they were written (its comments do not: the tree is
written anew).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from zerosim.errors import ScenarioError, ScenarioWarning
from zerosim.inputs.plausible import FOLDER_NAME_MAX_BYTES, PLAUSIBLE
from zerosim.results.folders import write_text_whole
from zerosim.scenario import Scenario, load_scenario
from zerosim.scenario.loader import apply_scenario_overrides, resolve_deepspeed_data
from zerosim.yamlio import read_yaml_file

FILE_REFERENCES = (("model", "hf_config"), ("hardware", "file"), ("deepspeed", "file"),
                   ("runtime", "framework", "file"))
"""The keys of a scenario that name a file, relative to the scenario's folder."""


def _quiet_load(path: Path, overrides: Mapping[str, Any]) -> Scenario:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScenarioWarning)
        return load_scenario(path, dict(overrides))


def _resolved(path: Path, overrides: Mapping[str, Any]) -> Scenario:
    """What the scenario resolves to, whichever keys `auto` filled (a value the Hugging Face
    Trainer would fill in alike resolves the same)."""
    return replace(_quiet_load(path, overrides), auto_filled=())


def minimal_overrides(path: str | Path, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """`overrides` less each one without which the scenario at `path` resolves the same,
    dropped one at a time in their order (what is left still resolves to what all of them
    do)."""
    path = Path(path)
    target = _resolved(path, overrides)
    kept = dict(overrides)
    for key in overrides:
        trial = {k: v for k, v in kept.items() if k != key}
        try:
            unchanged = _resolved(path, trial) == target
        except ScenarioError:
            unchanged = False
        if unchanged:
            kept = trial
    return kept


def _rebased(tree: dict[str, Any], base_dir: Path, folder: Path) -> dict[str, Any]:
    """`tree` with each relative file reference (`FILE_REFERENCES`) made relative to
    `folder` instead of the scenario's own folder `base_dir`."""
    for *parents, key in FILE_REFERENCES:
        holder: Any = tree
        for parent in parents:
            holder = holder.get(parent) if isinstance(holder, dict) else None
        if not isinstance(holder, dict) or not isinstance(holder.get(key), str):
            continue
        if not os.path.isabs(holder[key]):
            holder[key] = os.path.relpath(os.path.abspath(base_dir / holder[key]),
                                          os.path.abspath(folder))
    return tree


def scenario_tree(path: str | Path, overrides: Mapping[str, Any], *, folder: Path,
                  name: str) -> dict[str, Any]:
    """The scenario at `path` with `overrides` applied, named `name`, its file references
    valid from `folder`, whole numbers written as integers."""
    path = Path(path)
    tree = apply_scenario_overrides(dict(read_yaml_file(path)), dict(overrides), str(path))
    tree = {"name": name, **{k: v for k, v in tree.items() if k != "name"}}
    return _whole_numbers(_rebased(tree, path.parent, folder))


def ds_config(tree: Mapping[str, Any], base_dir: Path, scenario: Scenario) -> dict[str, Any]:
    """The scenario tree's `deepspeed` section as DeepSpeed reads it: a `{file: ...}`
    reference read (as the scenario's DeepSpeed release reads it) with the keys beside it
    merged in; whole numbers written as integers (DeepSpeed's integer fields)."""
    data, _ = resolve_deepspeed_data(tree.get("deepspeed") or {}, scenario.source, base_dir,
                                     scenario.behaviours)
    return _whole_numbers(data)


def _whole_numbers(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _whole_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(item) for item in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _named(name: str, stem: str) -> str:
    """`<name>-<stem>`, the name cut short where the whole would pass the longest name a
    scenario takes (its characters within the byte limit too)."""
    suffix = f"-{stem}"
    limit = PLAUSIBLE["name"].max_chars - len(suffix)
    while len(name[:limit].encode()) > FOLDER_NAME_MAX_BYTES - len(suffix):
        limit -= 1
    return name[:limit] + suffix


def write_configuration(path: str | Path, overrides: Mapping[str, Any], folder: Path,
                        stem: str, *, header: str) -> list[Path]:
    """`<stem>.yaml` (the scenario at `path` with the overrides that matter, named
    `<its name>-<stem>`, runnable from `folder`) and `<stem>_ds_config.json` (its `deepspeed`
    section as a ds_config) in `folder`; `header` heads the YAML as comment lines."""
    path, folder = Path(path), Path(folder)
    kept = minimal_overrides(path, overrides)
    scenario = _quiet_load(path, kept)
    tree = scenario_tree(path, kept, folder=folder, name=_named(scenario.name, stem))
    comments = "".join(f"# {line}\n" for line in header.splitlines())
    scenario_file = write_text_whole(
        folder / f"{stem}.yaml",
        comments + yaml.safe_dump(tree, sort_keys=False, allow_unicode=True))
    config_file = write_text_whole(
        folder / f"{stem}_ds_config.json",
        json.dumps(ds_config(tree, folder, scenario), indent=2) + "\n")
    return [scenario_file, config_file]
