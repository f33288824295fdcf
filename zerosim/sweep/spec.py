"""Sweep specs: a base scenario, fixed overrides and axes (grid, zip, variants) -> points.

A spec is a YAML file::

    base: ../llama13b_dp4.yaml          # relative to the sweep file
    set: {runtime.deepspeed_version: "0.19.5"}      # applied to every point
    grid:                               # cartesian product of every axis
      data_parallel: [1, 2, 4]
      deepspeed.zero_optimization.sub_group_size: {start: 1e8, stop: 1e9, num: 4, scale: log}
    zip:                                # advanced together (equal lengths): one axis
      model: [llama2-7b, llama2-13b]
      sequence_length: [4096, 2048]
    variants:                           # explicit points: one more axis
      - {name: pinned, set: {deepspeed.zero_optimization.offload_optimizer.pin_memory: true}}
      - {name: pageable, set: {deepspeed.zero_optimization.offload_optimizer.pin_memory: false}}

Points are the product grid x zip x variants (a missing section counts as one empty point),
enumerated with the first grid axis slowest and the variants fastest. Each point's overrides
are `set` (with the command line's `--set` on top), then its grid, zip and variant values; a
path may be swept by only one of grid, zip and variants, and variants may override `set`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zerosim.errors import ScenarioError, ScenarioWarning, with_scenario_warnings
from zerosim.inputs import read_input_text
from zerosim.scenario import check_override_path, load_scenario, scenario_from_dict
from zerosim.scenario.deepspeed import changes_nothing
from zerosim.scenario.loader import override_behind
from zerosim.yamlio import parse_yaml_text, read_yaml_file

SPEC_KEYS = ("base", "description", "set", "grid", "zip", "variants")
RANGE_KEYS = ("start", "stop", "num", "scale")
VARIANT_KEYS = ("name", "set")
VARIANT_COLUMN = "variant"
RANGE_DIGITS = 12  # range values are rounded to 12 significant digits: 1..1000 in 4 log steps
MAX_LISTED_PROBLEMS = 20


class SweepError(ScenarioError):
    """Invalid points of a sweep, all reported together before anything runs."""

    def __init__(self, source: str, problems: list[ScenarioError], invalid_points: int):
        first = problems[0]
        super().__init__(first.source, first.key_path, first.expected, first.got)
        self.problems = problems
        self.invalid_points = invalid_points
        if len(problems) == 1:
            self.message = str(first)
        else:
            lines = [str(p) for p in problems[:MAX_LISTED_PROBLEMS]]
            if len(problems) > MAX_LISTED_PROBLEMS:
                lines.append(f"... and {len(problems) - MAX_LISTED_PROBLEMS} more")
            self.message = (f"{source}: {invalid_points} invalid point(s), "
                            f"{len(problems)} problems; nothing was run:\n  " + "\n  ".join(lines))

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Variant:
    name: str
    set: dict[str, Any]


@dataclass(frozen=True)
class Point:
    """One scenario to simulate: `overrides` is what `load_scenario` gets."""

    index: int
    point_id: str
    overrides: dict[str, Any]
    values: dict[str, Any]                      # column -> swept value (the CSV's axis columns)
    origins: dict[str, str] = field(repr=False)  # override path -> where it came from in the spec

    def describe(self) -> str:
        return ", ".join(f"{k}={_short(v)}" for k, v in self.values.items()) or "base"


@dataclass(frozen=True)
class SweepSpec:
    source: str                   # the spec file as given, for messages
    path: Path
    base: Path
    description: str
    fixed: dict[str, Any]         # `set:` plus the command line's --set
    grid: dict[str, list[Any]]
    zip: dict[str, list[Any]]
    variants: list[Variant]
    text: str                     # the spec file's text, copied into the output folder ("" inline)
    fixed_origins: dict[str, str] = field(repr=False, default_factory=dict)

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def axis_columns(self) -> list[str]:
        """The swept columns, in spec order: grid, zip, then `variant` and variants' paths."""
        columns = [*self.grid, *self.zip]
        if self.variants:
            columns.append(VARIANT_COLUMN)
            for variant in self.variants:
                columns.extend(p for p in variant.set if p not in columns)
        return columns

    @property
    def axis_labels(self) -> dict[str, str]:
        """Each swept column's shortest dotted tail that no other swept column ends with
        (`offload_optimizer.device` beside `offload_param.device`, `reduce_bucket_size`
        alone): what the terminal table heads it and a plot's file is named after."""
        columns = self.axis_columns
        return {column: _shortest_unique_tail(column, columns) for column in columns}

    @property
    def plot_axes(self) -> list[str]:
        """The axes worth plotting against: grid and zip paths, then the variant name."""
        return [*self.grid, *self.zip, *([VARIANT_COLUMN] if self.variants else [])]

    def points(self) -> list[Point]:
        grid_axes = [[(path, i, v) for i, v in enumerate(values)]
                     for path, values in self.grid.items()]
        length = len(next(iter(self.zip.values()))) if self.zip else 1
        zip_rows = [[(path, i, values[i]) for path, values in self.zip.items()]
                    for i in range(length)]
        variants: list[tuple[int, Variant] | None] = (
            list(enumerate(self.variants)) if self.variants else [None])
        variant_paths = [c for c in self.axis_columns if c != VARIANT_COLUMN
                         and c not in self.grid and c not in self.zip]
        points: list[Point] = []
        for index, (*grid_values, zip_row, variant) in enumerate(
                itertools.product(*grid_axes, zip_rows, variants)):
            overrides = dict(self.fixed)
            origins = dict(self.fixed_origins)
            values: dict[str, Any] = {}
            for path, i, value in grid_values:
                overrides[path] = values[path] = value
                origins[path] = f"grid.{path}[{i}]"
            for path, i, value in zip_row:
                overrides[path] = values[path] = value
                origins[path] = f"zip.{path}[{i}]"
            if variant is not None:
                i, chosen = variant
                values[VARIANT_COLUMN] = chosen.name
                for path in variant_paths:
                    values[path] = chosen.set.get(path, self.fixed.get(path))
                for path, value in chosen.set.items():
                    overrides[path] = value
                    origins[path] = f"variants[{i}].set.{path}"
            points.append(Point(index, point_id(overrides), overrides, values, origins))
        _check_unique(self, points)
        return points


def _shortest_unique_tail(column: str, columns: Sequence[str]) -> str:
    parts = column.split(".")
    for count in range(1, len(parts) + 1):
        tail = ".".join(parts[-count:])
        if not any(other != column and (other == tail or other.endswith("." + tail))
                   for other in columns):
            return tail
    return column


def point_id(overrides: Mapping[str, Any]) -> str:
    """Stable id of a point: a short hash of the canonical JSON of its overrides."""
    text = json.dumps(overrides, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _check_unique(spec: SweepSpec, points: list[Point]) -> None:
    seen: dict[str, Point] = {}
    for point in points:
        other = seen.setdefault(point.point_id, point)
        if other is not point:
            raise ScenarioError(spec.source, f"point {point.index} ({point.describe()})",
                                f"a point different from point {other.index} "
                                f"({other.describe()})", point.overrides)


def _short(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 40 else text[:37] + "..."


# ---------------------------------------------------------------- parsing


def load_sweep(path: str | Path, overrides: Iterable[str] | Mapping[str, Any] | None = None
               ) -> SweepSpec:
    """Read and check a sweep spec's structure (the points are validated by `validate`)."""
    path = Path(path)
    source = str(path)
    text = read_input_text(path, what="sweep file")
    return spec_from_tree(parse_yaml_text(text, source), source=source, path=path,
                          base_dir=path.parent, text=text, overrides=overrides)


def inline_sweep(base: str | Path, *, overrides: Mapping[str, Any] | None = None,
                 grid: Mapping[str, Any] | None = None, zip: Mapping[str, Any] | None = None,
                 variants: list[Any] | None = None) -> SweepSpec:
    """A sweep given as Python values rather than a file: `overrides` is the spec's `set`,
    `base` is relative to the working folder, and the rest is checked as a spec file is. An
    axis may be any sequence of values (a tuple, a range, a NumPy array: its scalars become
    Python's), as a list in a file."""
    sections = {"base": str(base), "set": overrides, "grid": _listed(grid),
                "zip": _listed(zip), "variants": variants}
    tree = {key: value for key, value in sections.items() if value is not None}
    return spec_from_tree(tree, source=f"sweep of {base}", path=Path(base),
                          base_dir=Path.cwd(), text="", base_relative_to="the working folder")


def _listed(axes: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """Each axis given as a sequence (not a range mapping, not text) as a list of plain
    Python values."""
    from zerosim.sweep.worker import plain

    if not isinstance(axes, Mapping):
        return axes
    return {path: [plain(v) for v in values]
            if isinstance(values, Iterable) and not isinstance(values, str | bytes | Mapping)
            else values for path, values in axes.items()}


def spec_from_tree(tree: Any, *, source: str, path: Path, base_dir: Path, text: str,
                   overrides: Iterable[str] | Mapping[str, Any] | None = None,
                   base_relative_to: str = "the sweep file") -> SweepSpec:
    """A spec's parsed tree, its structure checked: what `load_sweep` and `inline_sweep`
    share, so a sweep given either way is refused alike."""
    from zerosim.scenario import parse_overrides

    if not isinstance(tree, Mapping):
        raise ScenarioError(source, "<root>", "a mapping with base and grid, zip or variants",
                            type(tree).__name__)
    for key in tree:
        if key not in SPEC_KEYS:
            raise ScenarioError(source, str(key), f"one of the known keys ({', '.join(SPEC_KEYS)})",
                                key)
    if "base" not in tree or not isinstance(tree["base"], str) or not tree["base"].strip():
        raise ScenarioError(source, "base", f"the path of a scenario YAML (relative to "
                            f"{base_relative_to})", tree.get("base"))
    base = (base_dir / tree["base"]).resolve()
    if not base.is_file():
        raise ScenarioError(source, "base", f"an existing scenario file (relative to "
                            f"{base_relative_to})", tree["base"])
    description = tree.get("description") or ""
    if not isinstance(description, str):
        raise ScenarioError(source, "description", "a string", description)

    fixed = _path_mapping(tree.get("set"), source, "set")
    fixed_origins = {p: f"set.{p}" for p in fixed}
    cli = parse_overrides(overrides)
    for key, value in cli.items():
        fixed[key] = value
        fixed_origins[key] = f"--set {key}"
    grid = {p: _axis_values(v, source, f"grid.{p}")
            for p, v in _path_mapping(tree.get("grid"), source, "grid").items()}
    zipped = {p: _axis_values(v, source, f"zip.{p}")
              for p, v in _path_mapping(tree.get("zip"), source, "zip").items()}
    if zipped:
        first, first_values = next(iter(zipped.items()))
        for p, values in zipped.items():
            if len(values) != len(first_values):
                raise ScenarioError(source, f"zip.{p}", f"a list as long as zip.{first} "
                                    f"({len(first_values)} values)", values)
    variants = _variants(tree.get("variants"), source)

    owner: dict[str, str] = {}
    for section, paths in (("grid", grid), ("zip", zipped),
                           ("variants", {p: 0 for v in variants for p in v.set})):
        for p in paths:
            if owner.setdefault(p, section) != section:
                raise ScenarioError(source, f"{section}.{p}", f"a path not already swept by "
                                    f"{owner[p]}", p)
    for key in cli:
        if key in owner:
            raise ScenarioError("--set", key, f"a path that {source} does not sweep "
                                f"({owner[key]} sweeps it)", key)
    return SweepSpec(source=source, path=path, base=base, description=description, fixed=fixed,
                     grid=grid, zip=zipped, variants=variants, text=text,
                     fixed_origins=fixed_origins)


def _path_mapping(value: Any, source: str, key: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ScenarioError(source, key, "a mapping of dotted scenario paths to values", value)
    return {check_override_path(path, source=source, key_path=f"{key}.{path}"): item
            for path, item in value.items()}


def _axis_values(value: Any, source: str, key: str) -> list[Any]:
    if isinstance(value, Mapping):
        return expand_range(value, source, key)
    if not isinstance(value, list) or not value:
        raise ScenarioError(source, key, "a non-empty list of values or a range "
                            "{start, stop, num, scale: linear|log}", value)
    return list(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def expand_range(spec: Mapping[str, Any], source: str, key: str) -> list[Any]:
    """`{start, stop, num, scale}` -> `num` values from start to stop, both included.

    `scale: linear` (default) spaces them evenly, `scale: log` geometrically. Values are
    rounded to 12 significant digits (so 1..1000 in 4 log steps is exactly 1, 10, 100, 1000);
    integer endpoints give integers.
    """
    for name in spec:
        if name not in RANGE_KEYS:
            raise ScenarioError(source, f"{key}.{name}",
                                f"one of the range keys ({', '.join(RANGE_KEYS)})", name)
    for name in ("start", "stop", "num"):
        if name not in spec:
            raise ScenarioError(source, f"{key}.{name}", "a value (a range needs start, stop "
                                "and num)", None)
    start, stop, num = spec["start"], spec["stop"], spec["num"]
    scale = spec.get("scale", "linear")
    for name, value in (("start", start), ("stop", stop)):
        if not _is_number(value):
            raise ScenarioError(source, f"{key}.{name}", "a finite number", value)
    if not isinstance(num, int) or isinstance(num, bool) or num < 1:
        raise ScenarioError(source, f"{key}.num", "an integer >= 1", num)
    if scale not in ("linear", "log"):
        raise ScenarioError(source, f"{key}.scale", "linear or log", scale)
    if scale == "log":
        for name, value in (("start", start), ("stop", stop)):
            if value <= 0:
                raise ScenarioError(source, f"{key}.{name}", "a number > 0 for scale: log",
                                    value)
    if num == 1:
        raw = [float(start)]
    elif scale == "linear":
        raw = [start + (stop - start) * i / (num - 1) for i in range(num)]
    else:
        lo, hi = math.log10(start), math.log10(stop)
        raw = [10 ** (lo + (hi - lo) * i / (num - 1)) for i in range(num)]
    raw[0] = float(start)
    if num > 1:
        raw[-1] = float(stop)
    values: list[Any] = [float(f"{v:.{RANGE_DIGITS}g}") for v in raw]
    if isinstance(start, int) and isinstance(stop, int):
        values = [round(v) for v in values]
        if len(set(values)) != len(values):
            raise ScenarioError(source, f"{key}.num", f"at most {abs(stop - start) + 1} values "
                                f"between the integer endpoints (or give them as floats: "
                                f"{float(start)})", num)
    return values


def _variants(value: Any, source: str) -> list[Variant]:
    if value is None:
        return []
    if not isinstance(value, list) or not value:
        raise ScenarioError(source, "variants", "a non-empty list of {name, set: {path: value}}",
                            value)
    variants: list[Variant] = []
    names: dict[str, int] = {}
    for i, item in enumerate(value):
        key = f"variants[{i}]"
        if not isinstance(item, Mapping):
            raise ScenarioError(source, key, "a mapping {name, set: {path: value}}", item)
        for name in item:
            if name not in VARIANT_KEYS:
                raise ScenarioError(source, f"{key}.{name}",
                                    f"one of the variant keys ({', '.join(VARIANT_KEYS)})", name)
        sets = _path_mapping(item.get("set"), source, f"{key}.set")
        name = item.get("name")
        if name is None:
            name = ", ".join(f"{p.rsplit('.', 1)[-1]}={_short(v)}" for p, v in sets.items())
            name = name or "base"
        if not isinstance(name, str) or not name:
            raise ScenarioError(source, f"{key}.name", "a non-empty string", name)
        if name in names:
            raise ScenarioError(source, f"{key}.name",
                                f"a name different from variants[{names[name]}]'s", name)
        names[name] = i
        variants.append(Variant(name, sets))
    return variants


# ---------------------------------------------------------------- validation


def _label(point: Point, key_path: str) -> tuple[str | None, Any]:
    """Which spec entry (`grid.x[2]`) an error at `key_path` comes from, and its value."""
    path = override_behind(key_path, point.overrides)
    if path is None:
        return None, None
    return point.origins[path], point.overrides[path]


def validate(spec: SweepSpec, points: list[Point]) -> list[str]:
    """Load every point's scenario; raise one SweepError listing every bad axis value.

    Returns the warnings worth showing once (ds_config keys the base sets but zerosim ignores).
    """
    _, warned = with_scenario_warnings(lambda: load_scenario(spec.base))
    notes = [str(warning) for warning in warned]
    tree = read_yaml_file(spec.base)
    problems: list[ScenarioError] = []
    seen: set[str] = set()
    invalid = 0

    def add(problem: ScenarioError) -> None:
        if str(problem) not in seen:
            seen.add(str(problem))
            problems.append(problem)

    resolved: dict[str, Point] = {}
    for point in points:
        try:
            scenario = _load_point(spec, tree, point)
        except ScenarioError as err:
            label, _ = _label(point, err.key_path)
            if label is None:
                label = f"point {point.index} ({point.describe()}): {err.key_path}"
            add(ScenarioError(spec.source, label, err.expected, err.got))
            invalid += 1
            continue
        ignored = _overrides_that_change_nothing(spec, point, scenario)
        for problem in ignored:
            add(problem)
        duplicate = None if ignored else _resolved_duplicate(spec, tree, point, scenario,
                                                            resolved)
        if duplicate is not None:
            add(duplicate)
        invalid += bool(ignored) or duplicate is not None
    if problems:
        raise SweepError(spec.source, problems, invalid)
    return notes


def _overrides_that_change_nothing(spec: SweepSpec, point: Point, scenario: Any
                                   ) -> list[ScenarioError]:
    """An error for each of the point's overrides that lands on ds_config keys zerosim ignores
    (`unmodelled_keys`, warned about in a run) or accepts silently because they cannot change
    time or memory (`changes_nothing`): setting it, or sweeping it, changes nothing."""
    problems = []
    for path, origin in point.origins.items():
        ignored = [k for k in scenario.unmodelled_keys if k == path or k.startswith(path + ".")]
        if ignored:
            expected = (f"a key zerosim models (it ignores {', '.join(ignored)}, so setting it "
                        "changes nothing)")
        elif path.startswith("deepspeed.") and changes_nothing(path.removeprefix("deepspeed.")):
            expected = (f"a key zerosim models (it takes {path} to change neither time nor "
                        "memory, so setting it changes nothing)")
        else:
            continue
        problems.append(ScenarioError(spec.source, origin, expected, point.overrides[path]))
    return problems


def _load_point(spec: SweepSpec, tree: Any, point: Point) -> Any:
    """The point's scenario, resolved as `zerosim run` resolves it (its warnings are the base's
    or its value's, told elsewhere)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScenarioWarning)
        return scenario_from_dict(tree, source=str(spec.base), base_dir=spec.base.parent,
                                  overrides=point.overrides)


def _resolved_duplicate(spec: SweepSpec, tree: Any, point: Point, scenario: Any,
                        resolved: dict[str, Point]) -> ScenarioError | None:
    """The error for a point whose resolved scenario is an earlier point's, or None.

    Different overrides can resolve alike (512 and 512.0, 5e8 and 500000000, a variant that
    sets the base's own value beside one that sets nothing): the sweep would simulate the same
    row twice. Points are grouped by the digest of the resolved scenario's repr (provenance is
    neither shown nor compared), and the earlier point is loaded again to confirm with ==, so
    no resolved scenario is kept.
    """
    digest = hashlib.sha256(repr(scenario).encode()).hexdigest()
    other = resolved.setdefault(digest, point)
    if other is point or _load_point(spec, tree, other) != scenario:
        return None
    return ScenarioError(spec.source, f"point {point.index} ({point.describe()})",
                         f"a point different from point {other.index} ({other.describe()}) "
                         "once resolved", point.overrides)
