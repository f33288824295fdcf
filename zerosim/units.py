"""Unit conversions: inputs carry units in their key names; inside it is bytes and seconds.
And how zerosim adds floats up (`ordered_sum`)."""

from collections.abc import Iterable
from functools import reduce
from operator import add

GB = 1e9
GiB = 2**30
MiB = 2**20
TFLOPS = 1e12
US = 1e-6
MS = 1e-3
GHZ = 1e9

BYTES_PER_DTYPE = {"fp32": 4, "fp16": 2, "bf16": 2}
FP32_BYTES = BYTES_PER_DTYPE["fp32"]
FP16_BYTES = BYTES_PER_DTYPE["fp16"]
FP64_BYTES = 8


def figure_text(value: float, digits: int) -> str:
    """A figure to `digits` significant digits, or whole with thousands separators from where
    that would take an exponent (tokens per second: 16,682, not 1.668e+04)."""
    if abs(value) >= 10**digits - 0.5:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def ordered_sum(values: Iterable[float], start: float = 0) -> float:
    """`sum(values, start)` as Python 3.11 adds floats: one after another, each addition
    rounded. From Python 3.12, `sum` compensates the rounding of floats (Neumaier), which moves
    a total in its last bits; zerosim adds floats that feed a result with this, so a run is the
    same to the bit on Python 3.11, 3.12 and 3.13 (`tests/test_determinism.py`)."""
    return reduce(add, values, start)
