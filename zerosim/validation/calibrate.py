"""`zerosim calibrate`: fit named hardware-profile values to measured phase times.

Least squares on log(simulated / measured) in log-parameter space (Levenberg-Marquardt with
forward-difference Jacobians, bounds by projection). Every evaluation runs the scenarios
through the same code path as `zerosim run`, with the candidate values as hardware overrides.
Deterministic: fixed start (the profile's values), fixed steps.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from zerosim.api import simulate
from zerosim.errors import ScenarioError
from zerosim.hardware.profile import QUANTITIES, builtin_profile_tree, profile_tree_from_file
from zerosim.scenario import load_scenario, parse_overrides
from zerosim.vocabulary import PHASE_TIMES

PHASE_KEYS = (*PHASE_TIMES, "iteration")
PROBE_KEYS = ("probe.pcie_drop_during_unscale",)
"""Rows that are not phase times but a probe of the scenario's machine (a fraction, in the
`seconds` column): the PCIe throughput lost by a pinned copy while unscale runs."""
FRACTION_KEYS = {k for k, (_, _, _, expected) in QUANTITIES.items() if "fraction" in expected}
JACOBIAN_STEP = 0.02
"""Relative step of the forward differences (in log space: 2%)."""
MAX_ITERATIONS = 25
LOG_PENALTY = 10.0
"""Residual of a case that did not finish (OOM): far worse than any real miss."""
TOLERANCE = 1e-5


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

    def rel_error(self, m: Measurement) -> float:
        return self.simulated[m.row] / m.seconds - 1.0

    def rms(self, rows: Sequence[Measurement]) -> float:
        if not rows:
            return float("nan")
        return math.sqrt(sum(self.rel_error(m) ** 2 for m in rows) / len(rows))


def read_measurements(path: Path) -> list[Measurement]:
    """CSV with columns scenario, overrides (k=v separated by ';'), phase, seconds."""
    rows = []
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = {"scenario", "phase", "seconds"} - set(reader.fieldnames or [])
        if missing:
            raise ScenarioError(path, "<header>", "columns scenario, overrides, phase, seconds",
                                reader.fieldnames)
        for number, row in enumerate(reader, start=2):
            phase = row["phase"].strip()
            if phase not in PHASE_KEYS + PROBE_KEYS:
                raise ScenarioError(path, f"line {number}.phase",
                                    f"one of {PHASE_KEYS + PROBE_KEYS}", phase)
            try:
                seconds = float(row["seconds"])
            except ValueError:
                raise ScenarioError(path, f"line {number}.seconds", "a number",
                                    row["seconds"]) from None
            if seconds <= 0:
                raise ScenarioError(path, f"line {number}.seconds", "a time > 0", seconds)
            scenario = (path.parent / row["scenario"].strip()).resolve()
            overrides = tuple(o.strip() for o in (row.get("overrides") or "").split(";")
                              if o.strip())
            rows.append(Measurement(scenario, overrides, phase, seconds, number))
    if not rows:
        raise ScenarioError(path, "<rows>", "at least one measurement", "none")
    return rows


def parse_parameter(spec: str, profile_values: dict[str, float]) -> Parameter:
    """`key` or `key=low:high` (bounds in the key's unit); default bounds x/10 .. x*10."""
    key, _, bounds = spec.partition("=")
    key = key.strip()
    if key not in profile_values:
        raise ScenarioError("--param", key, f"a numeric profile key ({', '.join(QUANTITIES)})",
                            key)
    start = profile_values[key]
    if bounds:
        try:
            low, high = (float(x) for x in bounds.split(":"))
        except ValueError:
            raise ScenarioError("--param", key, "bounds as low:high", bounds) from None
    else:
        low, high = start / 10, start * 10
    if key in FRACTION_KEYS:
        high = min(high, 1.0)
    if not 0 < low <= start <= high:
        raise ScenarioError("--param", key, f"0 < low <= start ({start}) <= high",
                            f"{low}:{high}")
    return Parameter(key, start, low, high)


def _profile_values(tree: dict[str, Any]) -> dict[str, float]:
    values = {}
    for key in QUANTITIES:
        node: Any = tree
        for part in key.split("."):
            node = node.get(part, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict) and isinstance(node.get("value"), int | float):
            values[key] = float(node["value"])
    return values


def base_profile_tree(measurements: list[Measurement]) -> tuple[dict[str, Any], str]:
    """The raw profile of the scenarios (they must all use the same one)."""
    names = {load_scenario(m.scenario, m.overrides).hardware.name for m in measurements}
    if len(names) != 1:
        raise ScenarioError("calibration data", "scenario",
                            "scenarios that share one hardware profile", sorted(names))
    first = measurements[0]
    raw = yaml.safe_load(first.scenario.read_text()).get("hardware")
    if isinstance(raw, str):
        return builtin_profile_tree(raw), raw
    if isinstance(raw, dict) and "profile" in raw:
        return builtin_profile_tree(raw["profile"]), raw["profile"]
    if isinstance(raw, dict) and "file" in raw:
        path = first.scenario.parent / raw["file"]
        return profile_tree_from_file(path, source=str(first.scenario),
                                      key_path="hardware.file"), path.stem
    raise ScenarioError(first.scenario, "hardware", "a profile name or {file: ...}", raw)


Simulator = Callable[[Path, tuple[str, ...]], dict[str, Any]]


def _simulate_summary(scenario: Path, overrides: tuple[str, ...]) -> dict[str, Any]:
    """The run's summary plus the probes of its machine."""
    from zerosim.validation.validate import pcie_drop_during_unscale

    loaded = load_scenario(scenario, list(overrides))
    summary = dict(simulate(loaded).summary)
    summary["probes"] = {"probe.pcie_drop_during_unscale":
                         pcie_drop_during_unscale(loaded.hardware)}
    return summary


def _phase_value(summary: dict[str, Any], phase: str) -> float:
    if phase in PROBE_KEYS:
        return float(summary["probes"][phase])
    if summary["status"] != "ok":
        return math.inf
    value = summary["iteration_s"] if phase == "iteration" else summary["phases_s"][phase]
    return math.inf if value is None else float(value)


class Evaluator:
    """Simulates each distinct (scenario, overrides) once per candidate parameter vector;
    the simulations of several candidates (a Jacobian) run in parallel when a pool is given."""

    def __init__(self, parameters: list[Parameter], simulator: Simulator = _simulate_summary,
                 pool: Executor | None = None):
        self.parameters = parameters
        self.simulator = simulator
        self.pool = pool
        self.calls = 0

    def simulated_many(self, candidates: list[dict[str, float]], rows: list[Measurement]
                       ) -> list[dict[int, float]]:
        cases = sorted({(m.scenario, m.overrides) for m in rows})
        jobs = [(scenario, overrides + tuple(f"hardware.{k}={v!r}" for k, v in values.items()))
                for values in candidates for scenario, overrides in cases]
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


def _project(theta: np.ndarray, parameters: list[Parameter]) -> np.ndarray:
    low = np.log([p.low for p in parameters])
    high = np.log([p.high for p in parameters])
    return np.clip(theta, low, high)


def fit(measurements: list[Measurement], parameters: list[Parameter], *,
        holdout: Sequence[Measurement] = (), simulator: Simulator = _simulate_summary,
        max_iterations: int = MAX_ITERATIONS, pool: Executor | None = None,
        progress: Callable[[int, float], None] | None = None) -> Fit:
    holdout_rows = {m.row for m in holdout}
    train = [m for m in measurements if m.row not in holdout_rows]
    if not train:
        raise ScenarioError("--holdout", "<rows>", "at least one row left to fit on", "none")
    evaluator = Evaluator(parameters, simulator, pool)
    theta = np.log([p.start for p in parameters])
    r = evaluator.residuals(theta, train)
    cost = float(r @ r)
    damping = 1e-2
    history = [cost]
    iterations = 0
    for iterations in range(1, max_iterations + 1):
        steps = [JACOBIAN_STEP if theta[j] + JACOBIAN_STEP <= math.log(parameters[j].high)
                 else -JACOBIAN_STEP for j in range(len(parameters))]
        shifted = [theta + step * np.eye(len(parameters))[j] for j, step in enumerate(steps)]
        columns = evaluator.residuals_many(shifted, train)
        jacobian = np.column_stack([(col - r) / step for col, step in
                                    zip(columns, steps, strict=True)])
        gradient = jacobian.T @ r
        normal = jacobian.T @ jacobian
        improved = False
        for _ in range(8):
            lhs = normal + damping * np.diag(np.diag(normal) + 1e-9)
            candidate = _project(theta - np.linalg.solve(lhs, gradient), parameters)
            r_new = evaluator.residuals(candidate, train)
            cost_new = float(r_new @ r_new)
            if cost_new < cost:
                improved = cost - cost_new > TOLERANCE * max(cost, 1e-12)
                theta, r, cost = candidate, r_new, cost_new
                damping = max(damping / 3, 1e-6)
                break
            damping *= 4
        history.append(cost)
        if progress is not None:
            progress(iterations, cost)
        if not improved:
            break
    values = evaluator.values(theta)
    simulated = evaluator.simulated(values, list(measurements))
    return Fit(parameters, values, train, list(holdout), simulated, iterations, history)


def fitted_profile_tree(tree: dict[str, Any], result: Fit, data_name: str) -> dict[str, Any]:
    """The base profile with the fitted values and their provenance."""
    import copy

    fitted = copy.deepcopy(tree)
    note = (f"fitted by zerosim calibrate on {data_name} ({len(result.train)} rows, rms error "
            f"{result.rms(result.train):.1%})")
    for key, value in result.values.items():
        node = fitted
        parts = key.split(".")
        for part in parts[:-1]:
            node = node[part]
        node[parts[-1]] = {"value": float(f"{value:.4g}"), "basis": "fitted", "source": note}
    return fitted


def write_outputs(result: Fit, tree: dict[str, Any], data_path: Path, out_dir: Path,
                  profile_name: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    profile = fitted_profile_tree(tree, result, data_path.name)
    profile["name"] = profile_name
    paths = [out_dir / f"{profile_name}.yaml", out_dir / "residuals.csv"]
    paths[0].write_text(yaml.safe_dump(profile, sort_keys=False, width=120))
    with paths[1].open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["line", "split", "case", "measured_s", "simulated_s", "rel_error"])
        for m in sorted(result.train + result.holdout, key=lambda m: m.row):
            split = "holdout" if m in result.holdout else "train"
            writer.writerow([m.row, split, m.label, m.seconds, f"{result.simulated[m.row]:.6g}",
                             f"{result.rel_error(m):+.4f}"])
    return paths


def select_holdout(measurements: list[Measurement], pattern: str | None) -> list[Measurement]:
    """Rows whose scenario file name or overrides contain `pattern`."""
    if not pattern:
        return []
    chosen = [m for m in measurements
              if pattern in m.scenario.name or any(pattern in o for o in m.overrides)]
    if not chosen:
        raise ScenarioError("--holdout", pattern, "a text matching some rows' scenario or "
                            "overrides", pattern)
    return chosen


def calibrate(data_path: Path, parameter_specs: Sequence[str], *, holdout: str | None = None,
              max_iterations: int = MAX_ITERATIONS, pool: Executor | None = None,
              progress: Callable[[int, float], None] | None = None
              ) -> tuple[Fit, dict[str, Any], str]:
    measurements = read_measurements(data_path)
    for m in measurements:
        parse_overrides(list(m.overrides))
    tree, name = base_profile_tree(measurements)
    values = _profile_values(tree)
    if not parameter_specs:
        raise ScenarioError("--param", "<none>", "at least one profile key to fit, e.g. "
                            "--param gpu.matmul_efficiency=0.1:0.9", "none")
    parameters = [parse_parameter(spec, values) for spec in parameter_specs]
    result = fit(measurements, parameters, holdout=select_holdout(measurements, holdout),
                 max_iterations=max_iterations, pool=pool, progress=progress)
    return result, tree, name
