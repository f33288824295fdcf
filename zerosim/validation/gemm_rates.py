"""`zerosim fit-gemm`: a GPU's GEMM rates fitted to a measured table of GEMM throughputs.

The GEMM model (`hardware.costs.gemm_s`) has two values a datasheet does not give:
`gpu.gemm_efficiency`, the fraction of dense peak a long K loop reaches on full waves, and
`gpu.gemm_k_overhead`, each output tile's fixed cost in steps of K. A cuBLAS(Lt) benchmark of a
few shapes pins both: large squares against each other (4096^3 runs below 8192^3 by the tile
cost), and a short-K shape. This fits them by least squares on log(modelled / measured) with
the rest of the profile (peak, SMs, tiles, HBM) as it is. Pure: no SimPy.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from zerosim.errors import ScenarioError
from zerosim.hardware.costs import gemm_s
from zerosim.hardware.profile import HardwareProfile
from zerosim.inputs.files import read_input_text
from zerosim.models.kernels import Gemm

COLUMNS = ("m", "n", "k", "TFLOPS")
MAX_K_OVERHEAD = 1e5
"""The plausible range's ceiling of `gpu.gemm_k_overhead`, the fit's upper bound."""


@dataclass(frozen=True)
class GemmRow:
    """One measured GEMM: an (m x k) by (k x n) product at `tflops` TFLOP/s."""

    m: int
    n: int
    k: int
    tflops: float


@dataclass(frozen=True)
class GemmFit:
    efficiency: float
    k_overhead: float
    efficiency_rel_std: float
    k_overhead_rel_std: float
    correlation: float
    modelled_tflops: tuple[float, ...]
    """Per row of the table, with the fitted values."""

    def rms(self, rows: list[GemmRow]) -> float:
        errors = [math.log(t / r.tflops) for t, r in zip(self.modelled_tflops, rows, strict=True)]
        return math.sqrt(sum(e * e for e in errors) / len(errors))


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
    """A CSV with the columns m, n, k, TFLOPS (one measured GEMM per row; other columns
    ignored)."""
    source = str(path)
    reader = csv.DictReader(io.StringIO(read_input_text(path, what="GEMM table")))
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise ScenarioError(source, "header", f"the columns {', '.join(COLUMNS)}",
                            ", ".join(reader.fieldnames or []) or "no header")
    rows = []
    for i, record in enumerate(reader, start=1):
        m, n, k = (int(_positive_number(record[c] or "", source, f"row {i}.{c}", integer=True))
                   for c in ("m", "n", "k"))
        tflops = _positive_number(record["TFLOPS"] or "", source, f"row {i}.TFLOPS",
                                  integer=False)
        rows.append(GemmRow(m, n, k, tflops))
    if len(rows) < 3:
        raise ScenarioError(source, "rows", "at least 3 measured GEMMs (2 values are fitted)",
                            len(rows))
    return rows


def modelled_tflops(row: GemmRow, profile: HardwareProfile) -> float:
    gemm = Gemm(row.m, row.n, row.k)
    return gemm.flops / gemm_s(gemm, profile) / 1e12


def _with(profile: HardwareProfile, efficiency: float, k_overhead: float) -> HardwareProfile:
    return replace(profile, gemm_efficiency=efficiency, gemm_k_overhead=k_overhead)


def fit_gemm_rates(rows: list[GemmRow], profile: HardwareProfile) -> GemmFit:
    """Least squares on log(modelled / measured) over gemm_efficiency in (0, 1] and
    gemm_k_overhead in [0, 1e5], from the profile's values; standard errors from the
    Jacobian at the optimum."""
    from scipy.optimize import least_squares

    def residuals(x: np.ndarray) -> list[float]:
        fitted = _with(profile, float(x[0]), float(x[1]))
        return [math.log(modelled_tflops(r, fitted) / r.tflops) for r in rows]

    start = [min(max(profile.gemm_efficiency, 1e-3), 1.0),
             min(max(profile.gemm_k_overhead, 1.0), MAX_K_OVERHEAD)]
    result = least_squares(residuals, start, bounds=([1e-4, 0.0], [1.0, MAX_K_OVERHEAD]),
                           x_scale=[0.1, 100.0])
    efficiency, k_overhead = (float(v) for v in result.x)
    jac = result.jac
    dof = max(len(rows) - 2, 1)
    variance = float(np.sum(result.fun ** 2)) / dof
    covariance = np.linalg.pinv(jac.T @ jac) * variance
    std = np.sqrt(np.clip(np.diag(covariance), 0.0, None))
    correlation = float(covariance[0, 1] / (std[0] * std[1])) if std[0] and std[1] else 0.0
    fitted = _with(profile, efficiency, k_overhead)
    return GemmFit(efficiency, k_overhead, float(std[0] / efficiency),
                   float(std[1] / k_overhead) if k_overhead else math.inf, correlation,
                   tuple(modelled_tflops(r, fitted) for r in rows))
