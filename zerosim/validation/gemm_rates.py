"""`zerosim fit-gemm`: a GPU's GEMM rates fitted to a measured table of GEMM throughputs.

The GEMM model (`hardware.costs.gemm_s`) has four values a datasheet does not give:
`gpu.gemm_efficiency`, the fraction of dense peak a long K loop reaches on full waves,
`gpu.gemm_k_overhead`, each output tile's fixed cost in steps of K, `gpu.gemm_latency_us`,
each kernel's fixed time outside its waves of tiles, and `gpu.gemm_memory_efficiency`, the
fraction of HBM peak a GEMM streams at where its bytes bound it. A cuBLAS(Lt) benchmark of
several shapes pins them: large squares against each other (4096^3 runs below 8192^3 by the
tile cost), a short K, small shapes (a few microseconds each, where the latency shows) and
memory-bound ones (eager attention's batched products of a short K). This fits them by least
squares on log(modelled / measured) with the rest of the profile (peak, SMs, tiles, HBM) as it
is; a value the table cannot pin is held at the profile's, by `--hold` or because no shape of
the table is bound by it. A table timed one call at a time between CUDA events on an idle
GPU (PyTorch's eager way of timing a matmul) holds in every time the host launching that call,
a constant the fit takes as a value of the measurement (`launch_delay_us`), not of the GPU: the
kernel's own latency, which it adds to, is then held. Pure: no SimPy.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from zerosim.errors import Described, ScenarioError
from zerosim.hardware.costs import gemm_s
from zerosim.hardware.profile import HardwareProfile
from zerosim.inputs.documents import parse_json
from zerosim.inputs.files import read_input_text
from zerosim.inputs.tables import read_table
from zerosim.models.kernels import Gemm
from zerosim.units import ordered_sum
from zerosim.validation.leastsq import covariance

COLUMNS = ("m", "n", "k", "TFLOPS")
BATCH = "batch"
"""An optional column: products per kernel (a batched GEMM), 1 where it is absent."""


@dataclass(frozen=True)
class GemmRate:
    """One value `zerosim fit-gemm` fits: its profile key, the profile field and its scale (the
    field in SI, the key in its unit), and its bounds in the key's unit."""

    key: str
    field: str
    scale: float
    low: float
    high: float
    step: float
    """The fit's typical step in the key's unit (least_squares' `x_scale`)."""
    digits: int


RATES = (
    GemmRate("gemm_efficiency", "gemm_efficiency", 1.0, 1e-4, 1.0, 0.1, 3),
    GemmRate("gemm_k_overhead", "gemm_k_overhead", 1.0, 0.0, 1e5, 100.0, 0),
    GemmRate("gemm_latency_us", "gemm_latency_s", 1e-6, 0.0, 100.0, 1.0, 2),
    GemmRate("gemm_memory_efficiency", "gemm_memory_efficiency", 1.0, 0.05, 1.0, 0.1, 3),
)
"""The GEMM model's values a datasheet does not give (bounds: their plausible ranges)."""
RATE_KEYS = tuple(rate.key for rate in RATES)


@dataclass(frozen=True)
class GemmRow:
    """One measured GEMM: `batch` products of an (m x k) by (k x n) matrix at `tflops`."""

    m: int
    n: int
    k: int
    tflops: float
    batch: int = 1

    @classmethod
    def from_record(cls, record: dict) -> GemmRow:
        """A row of a shipped reference table (keys m, n, k, TFLOPS and optionally batch)."""
        return cls(record["m"], record["n"], record["k"], record["TFLOPS"],
                   record.get("batch", 1))

    @property
    def gemm(self) -> Gemm:
        return Gemm(self.m, self.n, self.k, batch=self.batch)

    @property
    def shape(self) -> str:
        text = f"{self.m}x{self.n}x{self.k}"
        return text if self.batch == 1 else f"{self.batch}x{text}"


@dataclass(frozen=True)
class FittedRate:
    key: str
    value: float
    """In the key's unit."""
    std: float
    """Standard error from the Jacobian at the optimum, in the key's unit (0 when held)."""
    held: bool
    unbound: bool = False
    """Held because no row of the table is bound by it (a memory-bound rate on a table of
    compute-bound shapes): the table cannot pin it."""
    beside_launch: bool = False
    """Held because the table's times hold the launch of each call (`launch_in_timing`), a
    constant this value adds to: the table cannot tell the two apart."""

    @property
    def rel_std(self) -> float:
        return self.std / self.value if self.value else math.inf


LAUNCH_DELAY_KEY = "launch_delay_us"
"""The measurement's value a table timed one call at a time adds to every row: the host's
launch of the call, which the CUDA events around it enclose when the GPU waits for it."""
LAUNCH_DELAY = GemmRate(LAUNCH_DELAY_KEY, "", 1e-6, 0.0, 1000.0, 1.0, 2)


@dataclass(frozen=True)
class GemmFit:
    rates: tuple[FittedRate, ...]
    correlations: tuple[tuple[float, ...], ...]
    """Between the free values (`free_keys`: the free rates in `rates` order, then the launch
    delay where the table's times hold one)."""
    modelled_tflops: tuple[float, ...]
    """Per row of the table, with the fitted values (and the launch delay, as measured)."""
    launch_delay: FittedRate | None = None
    """In microseconds, where the table's times hold the launch of each call (not a profile
    value: what the measurement adds to the kernel's time)."""

    @property
    def free_keys(self) -> list[str]:
        return ([r.key for r in self.rates if not r.held]
                + ([self.launch_delay.key] if self.launch_delay else []))

    def rate(self, key: str) -> FittedRate:
        return next(r for r in self.rates if r.key == key)

    @property
    def efficiency(self) -> float:
        return self.rate("gemm_efficiency").value

    @property
    def k_overhead(self) -> float:
        return self.rate("gemm_k_overhead").value

    @property
    def latency_us(self) -> float:
        return self.rate("gemm_latency_us").value

    def errors(self, rows: list[GemmRow]) -> list[float]:
        """modelled / measured - 1, per row."""
        return [t / r.tflops - 1 for t, r in zip(self.modelled_tflops, rows, strict=True)]

    def rms(self, rows: list[GemmRow]) -> float:
        errors = [math.log(1 + e) for e in self.errors(rows)]
        return math.sqrt(ordered_sum(e * e for e in errors) / len(errors))


def _positive_number(text: str, source: str, key: str, integer: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0 or (integer and value != int(value)):
        raise ScenarioError(source, key, "a positive integer" if integer else "a positive number",
                            text)
    return value


def read_gemm_table(path: str | Path) -> list[GemmRow]:
    """A CSV with the columns m, n, k, TFLOPS and optionally batch (one measured GEMM per row;
    other columns ignored)."""
    source = str(path)
    header, table = read_table(read_input_text(path, what="GEMM table"), source)
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise ScenarioError(source, "header", f"the columns {', '.join(COLUMNS)}",
                            ", ".join(header) or "no header")
    batched = BATCH in header
    rows = []
    for i, record in enumerate(table, start=1):
        m, n, k = (int(_positive_number(record[c] or "", source, f"row {i}.{c}", integer=True))
                   for c in ("m", "n", "k"))
        batch = (int(_positive_number(record[BATCH] or "", source, f"row {i}.{BATCH}",
                                      integer=True)) if batched else 1)
        tflops = _positive_number(record["TFLOPS"] or "", source, f"row {i}.TFLOPS",
                                  integer=False)
        rows.append(GemmRow(m, n, k, tflops, batch))
    return rows


@dataclass(frozen=True)
class GemmTable:
    """The measured GEMMs of a table, and whether each time holds the launch of its call."""

    rows: list[GemmRow]
    launch_in_timing: bool = False


PROBE_OPERANDS = (
    re.compile(r"\((?P<m>\d+) x (?P<k>\d+)\) @ \((?P=k) x (?P<n>\d+)\)"),
    re.compile(r"\((?P<batch>\d+) x (?P<m>\d+) x (?P<k>\d+)\) @ "
               r"\((?P=batch) x (?P=k) x (?P<n>\d+)\)"),
)
"""How the node probe's methods wrote a GEMM's operands before its records carried m, n, k
and batch: `(m x k) @ (k x n)` and `torch.bmm (batch x m x k) @ (batch x k x n)`."""
BACK_TO_BACK_MARK = "behind a lead call"
"""The node probe's method text for a GEMM timed over back-to-back calls (no launch in it)."""


def _probe_row(record: dict[str, Any], source: str, key_path: str
               ) -> tuple[GemmRow, bool] | None:
    """A node-probe GEMM record as a row, and whether its time is of one call; None for a
    record that is not a GEMM's."""
    method = str(record.get("method", ""))
    if all(key in record for key in ("m", "n", "k")):
        shape = {key: record[key] for key in ("m", "n", "k")} | {"batch": record.get("batch", 1)}
    else:
        found = next((m for m in (p.search(method) for p in PROBE_OPERANDS) if m), None)
        if found is None:
            return None
        shape = {"batch": 1} | found.groupdict()
    m, n, k, batch = (int(_positive_number(str(shape[key]), source, f"{key_path}.{key}",
                                           integer=True)) for key in ("m", "n", "k", "batch"))
    tflops = _positive_number(str(record.get("value")), source, f"{key_path}.value",
                              integer=False)
    one_call = record.get("calls", 1) == 1 and BACK_TO_BACK_MARK not in method
    return GemmRow(m, n, k, tflops, batch), one_call


def read_probe_gemms(path: str | Path) -> GemmTable:
    """The GEMMs of a node probe's JSON (`benchmarks/node_probe/probe_node.py`, sections g and
    h: every result in TFLOP/s with its operands), timed one call at a time if any was."""
    source = str(path)
    document = parse_json(read_input_text(path, what="node probe JSON"), source)
    results = document.get("results") if isinstance(document, dict) else None
    parsed = [_probe_row(record, source, f"results.{name}.{key}")
              for name, section in (results if isinstance(results, dict) else {}).items()
              if isinstance(section, dict) for key, record in section.items()
              if isinstance(record, dict) and record.get("unit") == "TFLOP/s"]
    found = [p for p in parsed if p is not None]
    if not found:
        raise ScenarioError(source, "results", "the node probe's GEMM results (sections g and "
                            "h: TFLOP/s with their operands)", "none")
    return GemmTable([row for row, _ in found], any(one for _, one in found))


def load_gemm_table(path: str | Path) -> GemmTable:
    """A CSV of measured GEMMs (`read_gemm_table`) or a node probe's JSON
    (`read_probe_gemms`), by the file's suffix."""
    if Path(path).suffix.lower() == ".json":
        return read_probe_gemms(path)
    return GemmTable(read_gemm_table(path))


def modelled_tflops(row: GemmRow, profile: HardwareProfile, launch_s: float = 0.0) -> float:
    """The modelled rate of `row`'s GEMM, as a measurement whose time holds `launch_s` of
    launch besides the kernel would give it."""
    gemm = row.gemm
    return gemm.flops / (gemm_s(gemm, profile) + launch_s) / 1e12


def _with(profile: HardwareProfile, values: dict[str, float]) -> HardwareProfile:
    """The profile with GEMM values given in their keys' units."""
    rates = {rate.key: rate for rate in RATES}
    return replace(profile, **{rates[key].field: value * rates[key].scale
                               for key, value in values.items()})


def _binds_a_row(rate: GemmRate, rows: list[GemmRow], profile: HardwareProfile) -> bool:
    """Whether some row's modelled rate moves when `rate` moves by 1% at the profile's value."""
    value = getattr(profile, rate.field) / rate.scale
    moved = _with(profile, {rate.key: value * 1.01 if value else rate.step * 0.01})
    return any(modelled_tflops(r, moved) != modelled_tflops(r, profile) for r in rows)


def fit_gemm_rates(rows: list[GemmRow], profile: HardwareProfile,
                   held: tuple[str, ...] = (), source: str = "GEMM table", *,
                   launch_in_timing: bool = False) -> GemmFit:
    """Least squares on log(modelled / measured) over the GEMM values not `held` (those keep
    the profile's), within their plausible ranges, from the profile's values; standard errors
    from the Jacobian at the optimum. `launch_in_timing`: each row's time holds the host's
    launch of the call (one call timed between CUDA events on an idle GPU), fitted as one more
    value, `launch_delay_us`, with the kernel latency held (the two add up)."""
    from scipy.optimize import least_squares

    unknown = sorted(set(held) - set(RATE_KEYS))
    if unknown:
        raise ScenarioError(source, "--hold", f"one of {', '.join(RATE_KEYS)}",
                            ", ".join(unknown))
    beside_launch = {"gemm_latency_us"} - set(held) if launch_in_timing else set()
    held = (*held, *beside_launch)
    unbound = {rate.key for rate in RATES
               if rate.key not in held and not _binds_a_row(rate, rows, profile)}
    free = [rate for rate in RATES if rate.key not in held and rate.key not in unbound]
    fitted_values = free + ([LAUNCH_DELAY] if launch_in_timing else [])
    if len(rows) <= len(fitted_values):
        raise ScenarioError(source, "rows", f"more than {len(fitted_values)} measured GEMMs "
                            f"({len(fitted_values)} values are fitted)", len(rows))
    shapes = len({(r.m, r.n, r.k, r.batch) for r in rows})
    if shapes <= len(fitted_values):
        raise ScenarioError(source, "rows", f"more than {len(fitted_values)} distinct shapes "
                            f"(m, n, k, batch; {len(fitted_values)} values are fitted, and "
                            "repeats of one shape pin down one rate)",
                            Described(f"{shapes} in {len(rows)} rows"))

    def split(x: np.ndarray) -> tuple[HardwareProfile, float]:
        values = {rate.key: float(v) for rate, v in zip(free, x[:len(free)], strict=True)}
        launch_s = float(x[-1]) * LAUNCH_DELAY.scale if launch_in_timing else 0.0
        return _with(profile, values), launch_s

    def residuals(x: np.ndarray) -> list[float]:
        fitted, launch_s = split(x)
        return [math.log(modelled_tflops(r, fitted, launch_s) / r.tflops) for r in rows]

    start = [min(max(getattr(profile, rate.field) / rate.scale, rate.low + 0.5 * rate.step),
                 rate.high) for rate in free] + ([LAUNCH_DELAY.step] if launch_in_timing else [])
    result = least_squares(residuals, start, bounds=([r.low for r in fitted_values],
                                                     [r.high for r in fitted_values]),
                           x_scale=[r.step for r in fitted_values])
    values_covariance = covariance(result.jac, result.fun)
    std = np.sqrt(np.clip(np.diag(values_covariance), 0.0, None))
    scale = np.where(std > 0, std, 1.0)
    correlations = values_covariance / np.outer(scale, scale)
    values = {rate.key: float(v) for rate, v in zip(free, result.x[:len(free)], strict=True)}
    stds = {rate.key: float(e) for rate, e in zip(free, std[:len(free)], strict=True)}
    rates = tuple(FittedRate(rate.key, values.get(rate.key, getattr(profile, rate.field)
                                                  / rate.scale),
                             stds.get(rate.key, 0.0), rate.key not in values,
                             rate.key in unbound, rate.key in beside_launch) for rate in RATES)
    fitted, launch_s = split(result.x)
    launch = (FittedRate(LAUNCH_DELAY_KEY, float(result.x[-1]), float(std[-1]), False)
              if launch_in_timing else None)
    return GemmFit(rates, tuple(tuple(float(c) for c in row) for row in correlations),
                   tuple(modelled_tflops(r, fitted, launch_s) for r in rows), launch)
