"""What a least-squares fit at its optimum says of its values' uncertainty. Pure: no SimPy."""

from __future__ import annotations

import numpy as np


def covariance(jacobian: np.ndarray, residuals: np.ndarray) -> np.ndarray:
    """The values' covariance from the Jacobian and the residuals at the optimum: the
    residuals' variance (over the degrees of freedom left) times (J^T J)^-1, a pseudo-inverse
    so that a value the residuals do not move gives no error rather than a failure."""
    rows, cols = jacobian.shape
    variance = float(residuals @ residuals) / max(rows - cols, 1)
    return np.linalg.pinv(jacobian.T @ jacobian) * variance
