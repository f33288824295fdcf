"""What a least-squares fit at its optimum says of its values' uncertainty. Pure: no SimPy."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


def covariance(jacobian: np.ndarray, residuals: np.ndarray) -> np.ndarray:
    """The values' covariance from the Jacobian and the residuals at the optimum: the
    residuals' variance (over the degrees of freedom left) times (J^T J)^-1, a pseudo-inverse
    so that a value the residuals do not move gives no error rather than a failure."""
    rows, cols = jacobian.shape
    variance = float(residuals @ residuals) / max(rows - cols, 1)
    return np.linalg.pinv(jacobian.T @ jacobian) * variance


@dataclass(frozen=True)
class StreamingFit:
    """A streaming rate (a fraction of HBM peak) that makes modelled times meet measured ones,
    everything else priced as the profile has it."""

    value: float
    std: float
    errors: tuple[float, ...]
    """modelled / measured - 1 per measurement at `value`."""


def fit_rate(measured_s: Sequence[float], modelled: Callable[[float], list[float]],
             start: float) -> StreamingFit:
    """Least squares on log(modelled / measured) over one streaming rate in (0.05, 1]; its
    standard error from the Jacobian at the optimum."""
    from scipy.optimize import least_squares

    def residuals(x: np.ndarray) -> list[float]:
        return [math.log(m / s) for m, s in zip(modelled(float(x[0])), measured_s, strict=True)]

    result = least_squares(residuals, [start], bounds=([0.05], [1.0]), x_scale=[0.1])
    std = math.sqrt(float(covariance(result.jac, result.fun)[0, 0]))
    value = float(result.x[0])
    return StreamingFit(value, std, tuple(m / s - 1 for m, s in
                                          zip(modelled(value), measured_s, strict=True)))
