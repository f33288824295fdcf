"""`zerosim calibrate`: fit named profile and stack values to measured phase times.

Robust least squares (`scipy.optimize.least_squares`, trust-region reflective with bounds, a
soft-L1 loss) on log(simulated / measured) in log-parameter space, with forward-difference
Jacobians whose columns are simulated in parallel. Every evaluation runs the scenarios through
the same code path as `zerosim run`, with the candidate values as overrides. Parameters are
named `key` (a hardware-profile key, for every scenario), `<profile>:key` (only the scenarios on
that profile: values per testbed) or `stack.key` (the software stack, shared by every scenario).
After the fit, the Jacobian's singular values and the parameters' standard errors and
correlations say what the data pins down: a value it does not is reported as not identified.
Deterministic: fixed start (the profiles' values), fixed steps.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from zerosim.api import simulate
from zerosim.errors import ScenarioError, ScenarioWarning
from zerosim.hardware.profile import (
    AT_LEAST_ONE_KEYS,
    CAPACITY_KEYS,
    FRACTION_KEYS,
    QUANTITIES,
    builtin_profile_tree,
    parse_profile,
    profile_tree_from_file,
)
from zerosim.inputs.files import read_input_text
from zerosim.inputs.tables import read_table
from zerosim.results.folders import write_table, write_text_whole
from zerosim.scenario import load_scenario, parse_overrides
from zerosim.units import ordered_sum
from zerosim.vocabulary import PHASE_TIMES, Status
from zerosim.yamlio import read_yaml_file

PER_STEP_KEYS = ("forward_per_step", "backward_per_step")
"""Phase totals over one optimizer step (all micro-batches), as the Polaris runs measure them."""
PHASE_KEYS = (*PHASE_TIMES, "iteration", *PER_STEP_KEYS)
PROBE_KEYS = ("probe.pcie_drop_during_unscale",)
"""Rows that are not phase times but a probe of the scenario's machine (a fraction, in the
`seconds` column): the PCIe throughput lost by a pinned copy while unscale runs."""
JACOBIAN_STEP = 0.02
"""Relative step of the forward differences (in log space: 2%)."""
MAX_ITERATIONS = 25
LOG_PENALTY = 10.0
"""Residual of a case that did not finish (OOM): far worse than any real miss."""
TOLERANCE = 1e-5
LOSS_SCALE = 0.1
"""Soft-L1 scale: residuals beyond ~10% count linearly, not quadratically (robust to outliers)."""
START_MARGIN = 0.02
"""A start on a bound is moved this fraction of the (log) range inside: the trust-region
reflective method's scaling makes a variable that sits on its bound creep away from it."""
SINGULAR_FLOOR = 1e-9
"""Directions of the Jacobian weaker than this fraction of the strongest are treated as this
weak (not dropped): the values along them get a huge, not a zero, standard error."""
MAX_LOG_STD = math.log(100.0)
"""Standard errors are capped at 100x (9900%): beyond, the data says nothing about the value."""
IDENTIFIED_REL_STD = 0.25
"""A fitted value whose standard error exceeds 25% of it is not identified by the data."""


@dataclass(frozen=True)
class Measurement:
    scenario: Path
    overrides: tuple[str, ...]
    phase: str
    seconds: float
    row: int

    @property
    def label(self) -> str:
        extra = f" [{'; '.join(self.overrides)}]" if self.overrides else ""
        return f"{self.scenario.name}{extra} {self.phase}"


@dataclass(frozen=True)
class Parameter:
    key: str
    start: float
    low: float
    high: float


@dataclass
class Fit:
    parameters: list[Parameter]
    values: dict[str, float]
    train: list[Measurement]
    holdout: list[Measurement]
    simulated: dict[int, float]
    iterations: int
    history: list[float] = field(default_factory=list)
    identifiability: Identifiability | None = None

    def rel_error(self, m: Measurement) -> float:
        return self.simulated[m.row] / m.seconds - 1.0

    def rms(self, rows: Sequence[Measurement]) -> float:
        if not rows:
            return float("nan")
        return math.sqrt(ordered_sum(self.rel_error(m) ** 2 for m in rows) / len(rows))


def read_measurements(path: Path) -> list[Measurement]:
    """CSV with columns scenario, overrides (k=v separated by ';'), phase, seconds."""
    rows = []
    text = read_input_text(path, key_path="<root>", what="calibration CSV")
    header, table = read_table(text, str(path), label="line", first=2)
    missing = {"scenario", "phase", "seconds"} - set(header)
    if missing:
        raise ScenarioError(path, "<header>", "columns scenario, overrides, phase, seconds",
                            header)
    for number, row in enumerate(table, start=2):
        phase = row["phase"].strip()
        if phase not in PHASE_KEYS + PROBE_KEYS:
            raise ScenarioError(path, f"line {number}.phase",
                                f"one of {PHASE_KEYS + PROBE_KEYS}", phase)
        seconds = _seconds(path, number, row["seconds"])
        scenario = (path.parent / row["scenario"].strip()).resolve()
        overrides = tuple(o.strip() for o in (row.get("overrides") or "").split(";")
                          if o.strip())
        rows.append(Measurement(scenario, overrides, phase, seconds, number))
    if not rows:
        raise ScenarioError(path, "<rows>", "at least one measurement", "none")
    return rows


def _seconds(path: Path, number: int, text: str) -> float:
    """A row's measurement: a finite number > 0 (a NaN or an infinity would reach the fit's
    log residuals)."""
    try:
        seconds = float(text)
    except ValueError:
        raise ScenarioError(path, f"line {number}.seconds", "a number", text) from None
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ScenarioError(path, f"line {number}.seconds", "a finite time > 0", seconds)
    return seconds


def _tree_values(tree: dict[str, Any], keys: Sequence[str]) -> dict[str, float]:
    values = {}
    for key in keys:
        node: Any = tree
        for part in key.split("."):
            node = node.get(part, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict) and isinstance(node.get("value"), int | float):
            values[key] = float(node["value"])
    return values


def _profile_values(tree: dict[str, Any], name: str) -> dict[str, float]:
    """A profile's numbers in their keys' units, those its CPU model derives included."""
    profile = parse_profile(tree, name)
    return {key: float(p.value) for key, p in profile.provenance.items() if key in QUANTITIES}


def _stack_keys() -> list[str]:
    from zerosim.stacks import TUNABLE_KEYS

    return list(TUNABLE_KEYS)


@dataclass(frozen=True)
class Bases:
    """The raw profiles and stack the measured scenarios start from."""

    profiles: dict[str, dict[str, Any]]
    """Profile name -> its raw tree."""
    stack_name: str
    stack: dict[str, Any]
    profile_of: dict[tuple[Path, tuple[str, ...]], str]
    """(scenario, overrides) -> the name of its profile."""


def _raw_profile(scenario: Path) -> tuple[dict[str, Any], str]:
    raw = read_yaml_file(scenario).get("hardware")
    if isinstance(raw, str):
        return builtin_profile_tree(raw), raw
    if isinstance(raw, dict) and "profile" in raw:
        return builtin_profile_tree(raw["profile"]), raw["profile"]
    if isinstance(raw, dict) and "file" in raw:
        path = scenario.parent / raw["file"]
        return profile_tree_from_file(path, source=str(scenario),
                                      key_path="hardware.file"), path.stem
    raise ScenarioError(scenario, "hardware", "a profile name or {file: ...}", raw)


def _raw_stack(scenario: Path) -> dict[str, Any]:
    from zerosim.stacks import DEFAULT_STACK, builtin_stack_tree

    raw = (read_yaml_file(scenario).get("runtime") or {}).get("framework")
    raw = {"stack": raw or DEFAULT_STACK} if raw is None or isinstance(raw, str) else raw
    if "name" in raw:
        return raw
    if "file" in raw:
        return read_yaml_file(scenario.parent / raw["file"], referenced_from=str(scenario),
                              key_path="runtime.framework.file")
    return builtin_stack_tree(raw.get("stack", DEFAULT_STACK))


def base_trees(measurements: list[Measurement]) -> Bases:
    """The profiles of the scenarios (any number) and their stack (one, shared)."""
    profiles: dict[str, dict[str, Any]] = {}
    profile_of = {}
    stacks = set()
    for m in sorted({(m.scenario, m.overrides) for m in measurements}):
        scenario = load_scenario(m[0], list(m[1]))
        tree, _ = _raw_profile(m[0])
        profiles.setdefault(scenario.hardware.name, tree)
        profile_of[m] = scenario.hardware.name
        stacks.add(scenario.stack.name)
    if len(stacks) != 1:
        raise ScenarioError("calibration data", "runtime.framework",
                            "scenarios that share one software stack", sorted(stacks))
    stack_name = stacks.pop()
    return Bases(profiles, stack_name, _raw_stack(next(iter(profile_of))[0]), profile_of)


def parse_parameter(spec: str, bases: Bases) -> Parameter:
    """`key`, `<profile>:key` or `stack.key`, optionally `=low:high` (bounds in the key's
    unit); default bounds x/10 .. x*10. The fit starts from the current value, brought
    within the bounds."""
    name, _, bounds = spec.partition("=")
    name = name.strip()
    profile, _, key = name.rpartition(":")
    if name.startswith("stack."):
        values = _tree_values(bases.stack, _stack_keys())
        key = name.removeprefix("stack.")
        start = values.get(key)
        expected = f"a stack value (stack.{', stack.'.join(_stack_keys())})"
    else:
        names = [profile] if profile else sorted(bases.profiles)
        if any(n not in bases.profiles for n in names):
            raise ScenarioError("--param", name, f"a profile of the data "
                                f"({', '.join(sorted(bases.profiles))})", profile)
        starts = {_profile_values(bases.profiles[n], n).get(key) for n in names}
        start = starts.pop() if len(starts) == 1 and key not in CAPACITY_KEYS else None
        expected = (f"a numeric profile key that times depend on ("
                    f"{', '.join(k for k in QUANTITIES if k not in CAPACITY_KEYS)}), the same "
                    "start on every profile it applies to (else name one: <profile>:key)")
    if start is None:
        raise ScenarioError("--param", name, expected, name)
    if bounds:
        try:
            low, high = (float(x) for x in bounds.split(":"))
        except ValueError:
            raise ScenarioError("--param", name, "bounds as low:high", bounds) from None
    else:
        low, high = start / 10, start * 10
    if key in FRACTION_KEYS:
        high = min(high, 1.0)
    if key in AT_LEAST_ONE_KEYS:
        low = max(low, 1.0)
    if not 0 < low <= high:
        raise ScenarioError("--param", name, "0 < low <= high", f"{low}:{high}")
    return Parameter(name, min(max(start, low), high), low, high)


Simulator = Callable[[Path, tuple[str, ...]], dict[str, Any]]


def _simulate_summary(scenario: Path, overrides: tuple[str, ...]) -> dict[str, Any]:
    """The run's summary plus the probes of its machine."""
    from zerosim.validation.validate import pcie_drop_during_unscale

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScenarioWarning)  # a trial value, not the user's input
        loaded = load_scenario(scenario, list(overrides))
    summary = dict(simulate(loaded).summary)
    summary["probes"] = {"probe.pcie_drop_during_unscale":
                         pcie_drop_during_unscale(loaded.hardware)}
    summary["gradient_accumulation_steps"] = loaded.deepspeed.gradient_accumulation_steps
    return summary


def _per_step(summary: dict[str, Any], phase: str) -> float | None:
    """A phase's total over the optimizer step, from the per-micro-batch means (as `zerosim
    predict` adds them up)."""
    from zerosim.runs import per_step_seconds

    totals = per_step_seconds(summary["phases_s"], summary["gradient_accumulation_steps"])
    return totals[phase.removesuffix("_per_step")]


def _phase_value(summary: dict[str, Any], phase: str) -> float:
    if phase in PROBE_KEYS:
        return float(summary["probes"][phase])
    if summary["status"] != Status.OK:
        return math.inf
    if phase == "iteration":
        value = summary["iteration_s"]
    elif phase in PER_STEP_KEYS:
        value = _per_step(summary, phase)
    else:
        value = summary["phases_s"][phase]
    return math.inf if value is None else float(value)


def _override(name: str, value: float) -> str:
    key = name.rpartition(":")[2]
    return f"{key}={value!r}" if key.startswith("stack.") else f"hardware.{key}={value!r}"


class Evaluator:
    """Simulates each distinct (scenario, overrides) once per candidate parameter vector;
    the simulations of several candidates (a Jacobian) run in parallel when a pool is given.
    A `<profile>:key` parameter only patches the scenarios on that profile."""

    def __init__(self, parameters: list[Parameter], simulator: Simulator = _simulate_summary,
                 pool: Executor | None = None,
                 profile_of: dict[tuple[Path, tuple[str, ...]], str] | None = None):
        self.parameters = parameters
        self.simulator = simulator
        self.pool = pool
        self.profile_of = profile_of or {}
        self.calls = 0

    def _applies(self, name: str, case: tuple[Path, tuple[str, ...]]) -> bool:
        profile = name.rpartition(":")[0]
        return not profile or self.profile_of.get(case) == profile

    def simulated_many(self, candidates: list[dict[str, float]], rows: list[Measurement]
                       ) -> list[dict[int, float]]:
        cases = sorted({(m.scenario, m.overrides) for m in rows})
        jobs = [(case[0], case[1] + tuple(_override(k, v) for k, v in values.items()
                                          if self._applies(k, case)))
                for values in candidates for case in cases]
        self.calls += len(jobs)
        mapper = self.pool.map if self.pool is not None else map
        summaries = list(mapper(self.simulator, *zip(*jobs, strict=True)))
        out = []
        for c in range(len(candidates)):
            by_case = dict(zip(cases, summaries[c * len(cases):(c + 1) * len(cases)],
                               strict=True))
            out.append({m.row: _phase_value(by_case[(m.scenario, m.overrides)], m.phase)
                        for m in rows})
        return out

    def simulated(self, values: dict[str, float], rows: list[Measurement]) -> dict[int, float]:
        return self.simulated_many([values], rows)[0]

    def residuals_many(self, thetas: list[np.ndarray], rows: list[Measurement]
                       ) -> list[np.ndarray]:
        sims = self.simulated_many([self.values(t) for t in thetas], rows)
        return [np.array([_residual(s[m.row], m) for m in rows]) for s in sims]

    def residuals(self, theta: np.ndarray, rows: list[Measurement]) -> np.ndarray:
        return self.residuals_many([theta], rows)[0]

    def values(self, theta: np.ndarray) -> dict[str, float]:
        return {p.key: float(math.exp(t)) for p, t in zip(self.parameters, theta, strict=True)}


def _residual(simulated: float, m: Measurement) -> float:
    """log(simulated / measured) for times; the relative error for probes, which can be 0."""
    if m.phase in PROBE_KEYS:
        return simulated / m.seconds - 1.0
    return math.log(simulated / m.seconds) if math.isfinite(simulated) else LOG_PENALTY


@dataclass(frozen=True)
class Identifiability:
    """What the data pins down, from the Jacobian J of the residuals in log-parameter space
    at the solution: its singular values, each value's relative standard error
    (sqrt(diag((J^T J)^-1) s^2), s^2 the residual variance) and the correlation matrix."""

    singular_values: tuple[float, ...]
    rel_std: dict[str, float]
    correlation: dict[tuple[str, str], float]
    at_bound: dict[str, bool]

    def identified(self, key: str) -> bool:
        return not self.at_bound[key] and self.rel_std[key] <= IDENTIFIED_REL_STD


def identifiability(jacobian: np.ndarray, residuals: np.ndarray, parameters: list[Parameter],
                    theta: np.ndarray) -> Identifiability:
    keys = [p.key for p in parameters]
    rows, cols = jacobian.shape
    variance = float(residuals @ residuals) / max(rows - cols, 1)
    _, singular, vt = np.linalg.svd(jacobian, full_matrices=False)
    floor = max(float(singular.max()), 1.0) * SINGULAR_FLOOR
    covariance = (vt.T / np.maximum(singular, floor) ** 2) @ vt * variance
    std = np.sqrt(np.diag(covariance))
    correlation = np.clip(covariance / np.outer(std, std), -1.0, 1.0)
    at_bound = {p.key: bool(t <= math.log(p.low) + 1e-3 or t >= math.log(p.high) - 1e-3)
                for p, t in zip(parameters, theta, strict=True)}
    return Identifiability(
        singular_values=tuple(float(x) for x in singular),
        rel_std={k: float(math.expm1(min(s, MAX_LOG_STD))) for k, s in zip(keys, std, strict=True)},
        correlation={(a, b): float(correlation[i, j]) for i, a in enumerate(keys)
                     for j, b in enumerate(keys) if i < j},
        at_bound=at_bound)


def fit(measurements: list[Measurement], parameters: list[Parameter], *,
        holdout: Sequence[Measurement] = (), simulator: Simulator = _simulate_summary,
        max_iterations: int = MAX_ITERATIONS, pool: Executor | None = None,
        progress: Callable[[int, float], None] | None = None,
        profile_of: dict[tuple[Path, tuple[str, ...]], str] | None = None) -> Fit:
    from scipy.optimize import least_squares

    holdout_rows = {m.row for m in holdout}
    train = [m for m in measurements if m.row not in holdout_rows]
    if not train:
        raise ScenarioError("--holdout", "<rows>", "at least one row left to fit on", "none")
    evaluator = Evaluator(parameters, simulator, pool, profile_of)
    low = np.log([p.low for p in parameters])
    high = np.log([p.high for p in parameters])
    history: list[float] = []

    def residuals(theta: np.ndarray) -> np.ndarray:
        r = evaluator.residuals(theta, train)
        history.append(float(r @ r))
        if progress is not None:
            progress(len(history), history[-1])
        return r

    def jacobian(theta: np.ndarray) -> np.ndarray:
        r = evaluator.residuals(theta, train)
        steps = [JACOBIAN_STEP if theta[j] + JACOBIAN_STEP <= high[j] else -JACOBIAN_STEP
                 for j in range(len(parameters))]
        shifted = [theta + step * np.eye(len(parameters))[j] for j, step in enumerate(steps)]
        columns = evaluator.residuals_many(shifted, train)
        return np.column_stack([(col - r) / step for col, step in
                                zip(columns, steps, strict=True)])

    margin = START_MARGIN * (high - low)
    start = np.clip(np.log([p.start for p in parameters]), low + margin, high - margin)
    solution = least_squares(residuals, start, jac=jacobian, bounds=(low, high),
                             loss="soft_l1", f_scale=LOSS_SCALE, method="trf",
                             max_nfev=max_iterations, xtol=1e-4, ftol=TOLERANCE)
    theta = solution.x
    values = evaluator.values(theta)
    simulated = evaluator.simulated(values, list(measurements))
    identified = identifiability(jacobian(theta), evaluator.residuals(theta, train),
                                 parameters, theta)
    return Fit(parameters, values, train, list(holdout), simulated, int(solution.nfev),
               history, identified)


def _set_fitted(tree: dict[str, Any], key: str, value: float, note: str,
                stderr: float | None = None) -> None:
    node = tree
    parts = key.split(".")
    for part in parts[:-1]:
        node = node[part]
    leaf: dict[str, Any] = {"value": float(f"{value:.4g}"), "basis": "fitted", "source": note}
    if stderr is not None and 0 < stderr <= 10:
        leaf["stderr_pct"] = float(f"{100 * stderr:.2g}")
    node[parts[-1]] = leaf


def _note(result: Fit, key: str, data_name: str) -> str:
    ident = result.identifiability
    how = (f"fitted by zerosim calibrate on {data_name} ({len(result.train)} rows, rms error "
           f"{result.rms(result.train):.1%})")
    if ident is None:
        return how
    return f"{how}; standard error {ident.rel_std[key]:.0%}" + (
        "" if ident.identified(key) else
        " - NOT identified by the data (at a bound or too uncertain)")


def fitted_trees(bases: Bases, result: Fit, data_name: str
                 ) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The base profiles and stack with the fitted values and their provenance."""
    import copy

    profiles = copy.deepcopy(bases.profiles)
    stack = copy.deepcopy(bases.stack)
    ident = result.identifiability
    for name, value in result.values.items():
        note = _note(result, name, data_name)
        stderr = ident.rel_std[name] if ident is not None and ident.identified(name) else None
        profile, _, key = name.rpartition(":")
        if key.startswith("stack."):
            _set_fitted(stack, key.removeprefix("stack."), value, note, stderr)
            continue
        for target in [profile] if profile else list(profiles):
            _set_fitted(profiles[target], key, value, note, stderr)
    return profiles, stack


def write_outputs(result: Fit, bases: Bases, data_name: str, out_dir: Path,
                  suffix: str = "-fitted") -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    profiles, stack = fitted_trees(bases, result, data_name)
    paths = []
    for name, tree in profiles.items():
        tree["name"] = f"{name}{suffix}"
        paths.append(write_text_whole(out_dir / f"{name}{suffix}.yaml",
                                      yaml.safe_dump(tree, sort_keys=False, width=120)))
    if any(k.rpartition(":")[2].startswith("stack.") for k in result.values):
        paths.append(write_text_whole(out_dir / f"{bases.stack_name}{suffix}.yaml",
                                      yaml.safe_dump(stack, sort_keys=False, width=120)))
    paths.append(write_table(out_dir / "residuals.csv", RESIDUAL_COLUMNS, _residual_rows(result)))
    if result.identifiability is not None:
        paths.append(write_text_whole(out_dir / "identifiability.md",
                                      identifiability_report(result)))
    return paths


RESIDUAL_COLUMNS = ("line", "split", "case", "measured_s", "simulated_s", "rel_error")


def _residual_rows(result: Fit) -> Iterator[dict[str, Any]]:
    for m in sorted(result.train + result.holdout, key=lambda m: (str(m.scenario), m.row)):
        yield dict(zip(RESIDUAL_COLUMNS, (
            m.row, "holdout" if m in result.holdout else "train", m.label, m.seconds,
            f"{result.simulated[m.row]:.6g}", f"{result.rel_error(m):+.4f}"), strict=True))


def identifiability_report(result: Fit) -> str:
    ident = result.identifiability
    assert ident is not None
    lines = ["# Identifiability of the fit", "",
             "Singular values of the Jacobian (log residuals vs log values): "
             + ", ".join(f"{s:.3g}" for s in ident.singular_values), "",
             "| value | fitted | standard error | at bound | identified |", "|---|---|---|---|---|"]
    for p in result.parameters:
        lines.append(f"| `{p.key}` | {result.values[p.key]:.4g} | {ident.rel_std[p.key]:.0%} "
                     f"| {'yes' if ident.at_bound[p.key] else 'no'} "
                     f"| {'yes' if ident.identified(p.key) else 'NO'} |")
    strong = [(a, b, c) for (a, b), c in ident.correlation.items() if abs(c) >= 0.8]
    lines += ["", "Correlations of |r| >= 0.8: " + ("none" if not strong else ", ".join(
        f"`{a}` / `{b}` {c:+.2f}" for a, b, c in strong)), ""]
    return "\n".join(lines)


def _matches(m: Measurement, pattern: str) -> bool:
    """Whether the row's scenario file name, phase or overrides contain `pattern`; `A&B`
    matches a row that matches both (one run's forward: `9.14b-dp4&forward`)."""
    return all(part in m.scenario.name or part in m.phase or any(part in o for o in m.overrides)
               for part in pattern.split("&"))


def select_holdout(measurements: list[Measurement],
                   patterns: str | Sequence[str] | None) -> list[Measurement]:
    """Rows whose scenario file name, phase or overrides contain any of `patterns` (one text,
    or several); each text must match some row."""
    if not patterns:
        return []
    texts = [patterns] if isinstance(patterns, str) else list(patterns)
    for pattern in texts:
        if not any(_matches(m, pattern) for m in measurements):
            raise ScenarioError("--holdout", pattern, "a text matching some rows' scenario, "
                                "phase or overrides", pattern)
    return [m for m in measurements if any(_matches(m, p) for p in texts)]


def select_only(measurements: list[Measurement], patterns: Sequence[str]) -> list[Measurement]:
    """The rows whose scenario file name, phase or overrides contain every one of `patterns`
    (all rows when there are none): one run's forward, say, out of a whole table."""
    chosen = [m for m in measurements if all(_matches(m, p) for p in patterns)]
    if not chosen:
        raise ScenarioError("--only", " ".join(patterns), "texts that some row's scenario, "
                            "phase or overrides all contain", "no row matching every one")
    return chosen


def read_all(paths: Sequence[Path]) -> list[Measurement]:
    """Measurements of several CSV files, rows numbered on from one file to the next."""
    rows: list[Measurement] = []
    for path in paths:
        offset = max((m.row for m in rows), default=0)
        rows += [Measurement(m.scenario, m.overrides, m.phase, m.seconds, offset + m.row)
                 for m in read_measurements(path)]
    return rows


def calibrate(data_paths: Path | Sequence[Path], parameter_specs: Sequence[str], *,
              only: Sequence[str] = (), holdout: str | Sequence[str] | None = None,
              max_iterations: int = MAX_ITERATIONS,
              pool: Executor | None = None,
              progress: Callable[[int, float], None] | None = None
              ) -> tuple[Fit, Bases]:
    paths = [data_paths] if isinstance(data_paths, Path) else list(data_paths)
    measurements = select_only(read_all(paths), only)
    for m in measurements:
        parse_overrides(list(m.overrides))
    bases = base_trees(measurements)
    if not parameter_specs:
        raise ScenarioError("--param", "<none>", "at least one value to fit, e.g. "
                            "--param gpu.gemm_efficiency=0.3:0.95", "none")
    parameters = [parse_parameter(spec, bases) for spec in parameter_specs]
    result = fit(measurements, parameters, holdout=select_holdout(measurements, holdout),
                 max_iterations=max_iterations, pool=pool, progress=progress,
                 profile_of=bases.profile_of)
    return result, bases
