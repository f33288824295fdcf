"""`zerosim sensitivity`: which hardware and software-stack values a prediction hangs on.

Each numeric value of the scenario's hardware profile and software stack is moved by a relative
step down and up, one at a time with every other value held, and the scenario simulated again.
The elasticity d ln(time) / d ln(value) of the iteration and of each phase is the percentage a
1% error in that value moves the prediction: -1 for a phase that one bandwidth alone bounds, 0
for a value the configuration never touches (the network of a single node). Ranked, and shown
beside each value's basis, it tells a user which values of a new machine to measure before
trusting a prediction: an `assumed` value with a large elasticity is its weakest point.

Capacities (HBM, host memory and what the OS holds of it, NVMe, the CUDA context) decide
whether a configuration fits, not how long it takes, and are left out. A value of 0 has no
relative step and is listed as such. A side whose value leaves the key's valid range (a
fraction above 1, a number outside its plausible range) or whose run does not fit is
dropped, and the elasticity is taken one-sided, from the base run.

Beside the elasticities, each alternative reading of the profile's data (its `alternatives`:
sets of values the calibration data fit about as well, or that a sibling part's measurement
says a run may meet; `zerosim.hardware.alternatives`) is run whole, and what it changes of the
iteration and each phase is reported: the difference between readings that the data cannot
tell apart, which no standard error covers.
"""

from __future__ import annotations

import math
import sys
import time
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zerosim.errors import ScenarioError, ZerosimError, with_scenario_warnings
from zerosim.hardware.alternatives import OVERRIDE_KEY, Alternative
from zerosim.hardware.cpus import BF16_ADAM_KEYS, FP16_ADAM_KEYS, LOW_PRECISION_ADAM_KEYS
from zerosim.hardware.profile import (
    AT_LEAST_ONE_KEYS,
    CAPACITY_KEYS,
    FRACTION_KEYS,
    QUANTITIES,
)
from zerosim.stacks import GC_OBJECT_KEY, LEAF_HOOK_KEY, PLAIN_COLLECTIVE_KEY, REPEAT_HOOK_KEY
from zerosim.stacks import TUNABLE_KEYS as STACK_KEYS
from zerosim.units import ordered_sum
from zerosim.vocabulary import PHASE_TIMES, Status

DEFAULT_STEP = 0.1
"""Relative step of the central differences: each value at x (1 - 0.1) and x (1 + 0.1)."""
SHOWN_ELASTICITY = 0.005
"""Values whose elasticity of the iteration is smaller than this in magnitude (a 1% error
moving it by less than 0.005%) are counted but not listed unless asked (`--all`)."""
ELASTICITY_DIGITS = 9
"""Elasticities are rounded to this many decimals: two runs whose times differ in the last
bit (a value the configuration does not use) give 0, not 1e-15."""
QUANTITIES_SHOWN = ("iteration", *PHASE_TIMES)
"""The times whose elasticities each row carries: the iteration, then the phase means."""
ALTERNATIVE_COLUMNS = ("alternative", "sets", "carried_from", "iteration_s",
                       *(f"change_{q}_pct" for q in QUANTITIES_SHOWN), "note", "source")
COLUMNS = ("key", "basis", "stderr_pct", "value", "low", "high",
           *(f"elasticity_{q}" for q in QUANTITIES_SHOWN), "iteration_sigma_pct",
           "against_physics", "note")

MORE_IS_FASTER = frozenset({
    "hardware.gpu.peak_16bit_TFLOPS", "hardware.gpu.hbm_GBps", "hardware.gpu.sm_clock_fraction",
    "hardware.gpu.gemm_efficiency", "hardware.gpu.flash_attention_efficiency",
    "hardware.gpu.memory_efficiency", "hardware.gpu.gemm_memory_efficiency",
    "hardware.gpu.strided_memory_efficiency", "hardware.gpu.softmax_memory_efficiency",
    "hardware.gpu.cuda_malloc_GBps", "hardware.pcie.h2d_pinned_GBps",
    "hardware.pcie.d2h_pinned_GBps", "hardware.pcie.h2d_pageable_GBps",
    "hardware.pcie.d2h_pageable_GBps", "hardware.pcie.switch_uplink_GBps",
    "hardware.nvlink.bus_GBps", "hardware.network.nic_GBps",
    "hardware.host.cpu_boost_GHz", "hardware.host.memory_GBps_per_domain",
    "hardware.host.socket_link_GBps", "hardware.host.socket_link_total_GBps",
    "hardware.cpu.adam_params_per_s_per_thread",
    *(f"hardware.{key}" for key in LOW_PRECISION_ADAM_KEYS.values()),
    "hardware.cpu.fp16_check_elements_per_s_per_thread", "hardware.cpu.elementwise_GBps_per_thread",
    "hardware.cpu.page_zeroing_GBps", "hardware.cpu.cast_threads",
    "hardware.nvme.read_GBps_per_drive", "hardware.nvme.write_GBps_per_drive"})
"""Values a larger one of which can only give the work more of a resource (a bandwidth, a
rate, a clock, an efficiency, threads): a time they lengthen is against their physics."""
MORE_IS_SLOWER = frozenset({
    "hardware.gpu.gemm_k_overhead", "hardware.gpu.gemm_latency_us",
    "hardware.gpu.flash_attention_block_keys", "hardware.gpu.flash_attention_softmax_dims",
    "hardware.gpu.kernel_gap_us", "hardware.pcie.latency_us", "hardware.nvlink.latency_us",
    "hardware.network.latency_us", "hardware.host.remote_access_cost",
    "hardware.cpu.page_zeroing_contention", "hardware.cpu.oversubscription_penalty",
    "hardware.cpu.oversubscribed_region_ms", "hardware.nvme.latency_us",
    *(f"stack.{key}" for key in (*STACK_KEYS, GC_OBJECT_KEY, LEAF_HOOK_KEY,
                                  PLAIN_COLLECTIVE_KEY, REPEAT_HOOK_KEY))})
"""Values a larger one of which can only add work or wait (a latency, a fixed cost, a host
time, a contention or cost factor, bytes moved): a time they shorten is against their
physics. `hardware.host.dma_memory_weight` is in neither: it shares a domain's bandwidth
between copies and CPU kernels, so a larger one speeds the one and slows the other."""


def expected_sign(key: str) -> int:
    """The sign a value's elasticity of a time should have: -1 (a larger value can only
    shorten it), +1 (only lengthen it), 0 (either)."""
    if key in MORE_IS_FASTER:
        return -1
    return 1 if key in MORE_IS_SLOWER else 0


class DoesNotFit(ZerosimError):
    """The scenario itself does not fit in memory: it has no times to differentiate."""


@dataclass(frozen=True)
class Sensitivity:
    """One value's effect on the prediction: elasticities d ln(time) / d ln(value), None
    where the time does not exist (a phase the configuration does not run) or could not be
    differentiated."""

    key: str
    """`hardware.<profile key>` or `stack.<stack key>`, as `--set` names it."""
    basis: str
    value: float
    low: float | None
    high: float | None
    """The values tried (None: that side was not run)."""
    iteration: float | None
    forward: float | None
    backward_non_boundary: float | None
    backward_boundary: float | None
    update: float | None
    note: str = ""
    stderr: float | None = None
    """The value's relative standard error, where its provenance states one."""

    def elasticity(self, quantity: str) -> float | None:
        return getattr(self, quantity)

    @property
    def against_physics(self) -> bool:
        """The iteration moves the other way from what a larger value can do to it
        (`expected_sign`), by at least `SHOWN_ELASTICITY` per 1%: a larger bandwidth
        lengthening it, a larger latency shortening it. Contention can make that real (a copy
        that ends sooner runs into a kernel it missed before), but rarely by much; a large one
        is where to look for a fault in the model."""
        sign = expected_sign(self.key)
        e = self.iteration
        return bool(sign and e is not None and e * sign <= -SHOWN_ELASTICITY)

    @property
    def iteration_sigma(self) -> float | None:
        """The iteration's relative 1-sigma error from this value's standard error alone
        (first order: |elasticity| x relative standard error)."""
        if self.stderr is None or self.iteration is None:
            return None
        return abs(self.iteration) * self.stderr

    def as_row(self) -> dict[str, Any]:
        row = {"key": self.key, "basis": self.basis,
               "stderr_pct": None if self.stderr is None else 100 * self.stderr,
               "value": self.value, "low": self.low, "high": self.high}
        row.update({f"elasticity_{q}": self.elasticity(q) for q in QUANTITIES_SHOWN})
        sigma = self.iteration_sigma
        row["iteration_sigma_pct"] = None if sigma is None else 100 * sigma
        row["against_physics"] = self.against_physics
        row["note"] = self.note
        return row


@dataclass(frozen=True)
class AlternativeReading:
    """One alternative of the profile, run whole: its times, or why it has none."""

    alternative: Alternative
    times: Mapping[str, float | None] | None
    """The iteration and phase times (s); None where the run did not fit or failed."""
    note: str = ""

    def change(self, quantity: str, base: Mapping[str, float | None]) -> float | None:
        """The relative change of a time against the base run (+0.05: 5% longer)."""
        if self.times is None:
            return None
        now, then = self.times.get(quantity), base.get(quantity)
        if now is None or then is None or then <= 0:
            return None
        return now / then - 1

    def as_row(self, base: Mapping[str, float | None]) -> dict[str, Any]:
        alt = self.alternative
        row: dict[str, Any] = {"alternative": alt.name, "sets": alt.describe(),
                               "carried_from": alt.carried_from,
                               "iteration_s": None if self.times is None
                               else self.times.get("iteration")}
        for q in QUANTITIES_SHOWN:
            change = self.change(q, base)
            row[f"change_{q}_pct"] = None if change is None else 100 * change
        row["note"] = self.note
        row["source"] = alt.source
        return row


@dataclass
class SensitivityOutcome:
    scenario_name: str
    hardware: str
    step: float
    base: dict[str, float | None]
    """The base run's iteration and phase times (s)."""
    rows: list[Sensitivity]
    runs: int = 0
    executor: str = ""
    wall_s: float = 0.0
    files: list[Path] = field(default_factory=list)
    alternatives: list[AlternativeReading] = field(default_factory=list)
    """The profile's alternative readings, each run whole."""

    def stated_sigma(self) -> tuple[float, int]:
        """The iteration's relative 1-sigma error from every value with a stated standard
        error, taken as independent (first order, in quadrature), and how many there are.
        Assumed values have none and are not in it."""
        sigmas = [r.iteration_sigma for r in self.rows if r.iteration_sigma is not None]
        return math.sqrt(ordered_sum(x * x for x in sigmas)), len(sigmas)

    def against_physics(self) -> list[Sensitivity]:
        """The values that move the iteration against their physics (`Sensitivity.against_physics`),
        largest first."""
        return sorted((r for r in self.rows if r.against_physics),
                      key=lambda r: (-abs(r.iteration or 0.0), r.key))

    def ranked(self, *, everything: bool = False) -> list[Sensitivity]:
        """By |elasticity of the iteration|, largest first; the negligible ones only when
        asked."""
        rows = sorted(self.rows, key=lambda r: (-abs(r.iteration or 0.0), r.key))
        if everything:
            return rows
        return [r for r in rows if r.iteration is None or abs(r.iteration) >= SHOWN_ELASTICITY]


@dataclass(frozen=True)
class Candidate:
    """One value to move: its override path, basis, current value and the values tried."""

    key: str
    basis: str
    value: float
    low: float | None
    high: float | None
    note: str = ""
    stderr: float | None = None


def steps(key: str, value: float, step: float) -> tuple[float | None, float | None, str]:
    """The values a key is tried at: x (1 - step) and x (1 + step), the upper one held at 1 for
    a fraction, the lower one at 1 for a cost factor (None: not tried)."""
    if value == 0:
        return None, None, "0: no relative step"
    low: float | None = value * (1 - step)
    high: float | None = value * (1 + step)
    bare = key.removeprefix("hardware.")
    if bare in FRACTION_KEYS and high > 1.0:
        high = 1.0 if value < 1.0 else None
    if bare in AT_LEAST_ONE_KEYS and low < 1.0:
        low = 1.0 if value > 1.0 else None
    return low, high, ""


def elasticity(base: float | None, low: tuple[float, float | None] | None,
               high: tuple[float, float | None] | None, value: float) -> float | None:
    """d ln(time) / d ln(value) from the base time and (value, time) on each side: central
    where both sides ran, one-sided from the base where one did, None where neither did or a
    time is missing or not positive."""
    if base is None or base <= 0:
        return None
    sides = [p for p in (low, high) if p is not None and p[1] is not None and p[1] > 0]
    if len(sides) == 2:
        (v0, t0), (v1, t1) = sides
    elif len(sides) == 1:
        (v0, t0), (v1, t1) = (value, base), sides[0]
    else:
        return None
    return round((math.log(t1) - math.log(t0)) / (math.log(v1) - math.log(v0)),
                 ELASTICITY_DIGITS) + 0.0


def _unread(scenario, key: str) -> bool:
    """A hardware value the scenario's replay never reads: the bf16 (fp16) CPU Adam ceilings
    without bf16 (fp16) master params."""
    master = scenario.deepspeed.master_dtype
    return ((key in BF16_ADAM_KEYS.values() and master != "bf16")
            or (key in FP16_ADAM_KEYS.values() and master != "fp16"))


def _makes_plain_calls(scenario) -> bool:
    """Whether the scenario's replay makes plain `deepspeed.comm` calls (which
    `host.plain_collective_us` prices): Ulysses's exchanges, qgZ's all-to-alls, qwZ's scale
    all-gathers."""
    ds, world = scenario.deepspeed, scenario.data_parallel
    zpp = ds.zero_plus_plus
    return (ds.sequence_parallel_size > 1
            or zpp.quantizes_gradients(ds.stage, world, scenario.hardware.gpus_per_node)
            or (zpp.quantized_weights and ds.stage == 3 and world > 1))


def _repeats_hooks(scenario) -> bool:
    """Whether ZeRO-3 hooks fire again on gathered parameters (a tiled MLP or loss outside
    any leaf, which only ZeRO-3's plan holds: what `host.repeat_hook_share` prices)."""
    from zerosim.engine.plan import plan_of

    return bool(plan_of(scenario).tiled)


def _has_leaves(scenario) -> bool:
    """Whether ZeRO-3 makes leaves of the scenario's model (which `host.leaf_hook_share`
    prices)."""
    from zerosim.engine.plan import leaves_of

    return bool(leaves_of(scenario).spans)


def candidates(scenario, step: float, keys: Iterable[str] = ()) -> list[Candidate]:
    """Every numeric hardware and stack value of a loaded scenario (or only `keys`, given as
    `--set` names them), with the values each is tried at."""
    found = {f"hardware.{key}": prov for key, prov in scenario.hardware.provenance.items()
             if key in QUANTITIES and key not in CAPACITY_KEYS
             and not _unread(scenario, key)}
    found.update({f"stack.{key}": scenario.stack.provenance[key] for key in STACK_KEYS})
    if memory_reports := scenario.stack.provenance.get(GC_OBJECT_KEY):
        found[f"stack.{GC_OBJECT_KEY}"] = memory_reports
    if (leaf_hooks := scenario.stack.provenance.get(LEAF_HOOK_KEY)) and _has_leaves(scenario):
        found[f"stack.{LEAF_HOOK_KEY}"] = leaf_hooks
    if (plain := scenario.stack.provenance.get(PLAIN_COLLECTIVE_KEY)) and _makes_plain_calls(
            scenario):
        found[f"stack.{PLAIN_COLLECTIVE_KEY}"] = plain
    if (repeats := scenario.stack.provenance.get(REPEAT_HOOK_KEY)) and _repeats_hooks(scenario):
        found[f"stack.{REPEAT_HOOK_KEY}"] = repeats
    wanted = list(dict.fromkeys(keys)) or list(found)
    unknown = [k for k in wanted if k not in found]
    if unknown:
        raise ScenarioError("--key", unknown[0], "a numeric hardware or stack value of the "
                            f"scenario ({', '.join(found)})", unknown[0])
    out = []
    for key in wanted:
        prov = found[key]
        value = float(prov.value)
        low, high, note = steps(key, value, step)
        out.append(Candidate(key, prov.basis, value, low, high, note, prov.stderr))
    return out


def _times(row: Mapping[str, Any] | None) -> dict[str, float | None] | None:
    """A run's iteration and phase times, None unless it ran and fitted."""
    if row is None or row.get("status") != Status.OK:
        return None
    times = {"iteration": row.get("iteration_s")}
    times.update({p: row.get(f"phases_s.{p}") for p in PHASE_TIMES})
    return times


def _side_note(name: str, row: Mapping[str, Any] | None, value: float | None) -> str:
    """Why one side of a value gave no time: its run did not fit, or it failed."""
    if value is None or row is None or row.get("status") == Status.OK:
        return ""
    if row.get("status") == Status.OOM:
        return f"at {value:g} ({name}) the configuration does not fit"
    return f"{value:g} ({name}) failed: {row.get('error', '')}"


def _loaded_with_warnings(scenario_path: str | Path, overrides: Mapping[str, Any]):
    """The scenario and the `ScenarioWarning`s its load gave, caught rather than shown."""
    from zerosim.scenario import load_scenario

    return with_scenario_warnings(lambda: load_scenario(scenario_path, overrides))


def _accepted(candidate: Candidate, scenario_path: str | Path,
              fixed: Mapping[str, Any], known: frozenset[str] = frozenset()) -> Candidate:
    """The candidate without the sides whose value the scenario refuses (outside the key's
    plausible range, past a physical ceiling), each named in its note: loading is cheap, so
    a refused value never reaches a worker. A warning a side's value brings that the scenario
    itself does not (`known`: one rate now faster than another it may not pass) is in the note
    too, not on the terminal."""
    from dataclasses import replace

    sides, notes = {}, [candidate.note] if candidate.note else []
    for side in ("low", "high"):
        value = getattr(candidate, side)
        if value is None:
            continue
        try:
            _, warned = _loaded_with_warnings(scenario_path, {**fixed, candidate.key: value})
        except ScenarioError as err:
            sides[side] = None
            notes.append(f"{value:g} ({side}) refused, expected {err.expected}: one-sided")
            continue
        notes += [f"at {value:g} ({side}) the scenario warns: {text}"
                  for text in dict.fromkeys(map(str, warned)) if text not in known]
    return replace(candidate, **sides, note="; ".join(notes))


def measure(candidates_: list[Candidate], base: dict[str, float | None],
            rows: Mapping[tuple[str, str], Mapping[str, Any]]) -> list[Sensitivity]:
    """The elasticities of each candidate from the rows of its runs (keyed by (key, side))."""
    out = []
    for c in candidates_:
        low_row, high_row = rows.get((c.key, "low")), rows.get((c.key, "high"))
        low_times, high_times = _times(low_row), _times(high_row)
        values = {}
        for q in QUANTITIES_SHOWN:
            low = None if c.low is None else (c.low, None if low_times is None
                                              else low_times[q])
            high = None if c.high is None else (c.high, None if high_times is None
                                                else high_times[q])
            values[q] = elasticity(base[q], low, high, c.value)
        notes = [n for n in (c.note, _side_note("low", low_row, c.low),
                             _side_note("high", high_row, c.high)) if n]
        out.append(Sensitivity(c.key, c.basis, c.value, c.low, c.high, note="; ".join(notes),
                               stderr=c.stderr, **values))
    return out


def sensitivity(scenario_path: str | Path, *, overrides: Mapping[str, Any] | None = None,
                step: float = DEFAULT_STEP, keys: Iterable[str] = (),
                workers: int | None = None, out_dir: str | Path | None = None
                ) -> SensitivityOutcome:
    """Move each value of the scenario at `scenario_path` by `step` both ways and measure the
    elasticities, and run each alternative of its profile whole; write `sensitivity.csv` (and
    `alternatives.csv`) to `out_dir` when given."""
    import warnings

    from zerosim.sweep.runner import drive, open_executor
    from zerosim.sweep.spec import Point

    if not 0 < step < 1:
        raise ScenarioError("--step", "step", "a relative step in (0, 1)", step)
    started = time.perf_counter()
    fixed = dict(overrides or {})
    scenario, warned = _loaded_with_warnings(scenario_path, fixed)
    for warning in warned:  # the scenario's own, once, as a load would give them
        warnings.warn(warning, stacklevel=2)
    tried = [_accepted(c, scenario_path, fixed, frozenset(map(str, warned)))
             for c in candidates(scenario, step, keys)]
    points = [Point(0, "base", fixed, {}, {})]
    labels: list[tuple[str, str]] = [("", "base")]
    for c in tried:
        for side, value in (("low", c.low), ("high", c.high)):
            if value is None:
                continue
            labels.append((c.key, side))
            points.append(Point(len(points), f"{c.key}:{side}", fixed | {c.key: value}, {}, {}))
    readings = list(scenario.hardware.other_alternatives)
    first_reading = len(points)
    for alternative in readings:
        points.append(Point(len(points), f"alternative:{alternative.name}",
                            fixed | {OVERRIDE_KEY: alternative.name}, {}, {}))
    rows: dict[int, Mapping[str, Any]] = {}

    def on_row(point: Point, row: Mapping[str, Any]) -> None:
        rows[point.index] = row

    def on_failure(point: Point, error: BaseException) -> None:
        rows[point.index] = {"status": Status.ERROR, "error": str(error)}

    with open_executor(workers, None, len(points)) as (executor, window, where):
        drive(executor, window, str(scenario_path), points, on_row, on_failure)
    base = _times(rows[0])
    if rows[0].get("status") == Status.OOM:
        raise DoesNotFit(f"{scenario_path}: the configuration does not fit (status oom): "
                         "it has no times to differentiate")
    if base is None:
        raise RuntimeError(f"the scenario's own run failed: {rows[0].get('error')}")
    by_side = {labels[i]: rows[i] for i in range(1, first_reading)}
    outcome = SensitivityOutcome(scenario.name, scenario.hardware.label, step, base,
                                 measure(tried, base, by_side), runs=len(points),
                                 executor=where, wall_s=time.perf_counter() - started,
                                 alternatives=[
                                     _reading(alternative, rows[first_reading + i])
                                     for i, alternative in enumerate(readings)])
    if out_dir is not None:
        outcome.files = [write_table(outcome, Path(out_dir) / "sensitivity.csv")]
        if outcome.alternatives:
            outcome.files.append(write_alternatives(outcome,
                                                    Path(out_dir) / "alternatives.csv"))
    return outcome


def _reading(alternative: Alternative, row: Mapping[str, Any]) -> AlternativeReading:
    """An alternative's run as a reading: its times, or why it has none."""
    times = _times(row)
    if times is not None:
        return AlternativeReading(alternative, times)
    note = ("the configuration does not fit with it" if row.get("status") == Status.OOM
            else f"it failed: {row.get('error', '')}")
    return AlternativeReading(alternative, None, note)


def write_table(outcome: SensitivityOutcome, path: Path) -> Path:
    """Every row, ranked, as CSV (written whole: an interrupted write leaves the old file)."""
    from zerosim.results.folders import write_table as write_csv_table

    return write_csv_table(path, COLUMNS, (r.as_row() for r in outcome.ranked(everything=True)))


def write_alternatives(outcome: SensitivityOutcome, path: Path) -> Path:
    """Each alternative reading's times and changes against the base run, as CSV."""
    from zerosim.results.folders import write_table as write_csv_table

    return write_csv_table(path, ALTERNATIVE_COLUMNS,
                           (r.as_row(outcome.base) for r in outcome.alternatives))


def write_charts(outcome: SensitivityOutcome, folder: Path) -> list[Path]:
    """sensitivity.png for the iteration and sensitivity_<phase>.png for each phase the
    scenario runs (`plots.sensitivity_chart`)."""
    from zerosim.plots import save_figure, sensitivity_chart

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for quantity in QUANTITIES_SHOWN:
        if outcome.base.get(quantity) is None:
            continue
        name = "sensitivity.png" if quantity == "iteration" else f"sensitivity_{quantity}.png"
        paths.append(save_figure(sensitivity_chart(outcome, quantity), folder / name, dpi=110))
    return paths


class _CallableModule(types.ModuleType):
    """This module, callable as its `sensitivity`: the package exports that function under
    the module's own name, and an `import zerosim.sensitivity` made before `zerosim.sensitivity`
    is first read binds the name to the module, so `zerosim.sensitivity(...)` works either way."""

    def __call__(self, *args: Any, **kwargs: Any) -> SensitivityOutcome:
        return sensitivity(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
