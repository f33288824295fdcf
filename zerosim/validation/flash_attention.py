"""flash-attn's causal kernel, forward and backward, as FlashAttention-2's release timed it on
an A100 and an H100 and as this project's node probe timed PyTorch's copy of it on an H200,
against the kernel model, and the three GPU values it pins.

`zerosim/validation/data/fa2_flash_attention.yaml` and `h200_sdpa_flash_attention.yaml` hold
the bars: TFLOPS at head dimension 64 and 128, sequence 512 to 16384, 16384 tokens. Each row
is priced as the engine prices a module's fused attention
(`zerosim.models.kernels.flash_attention` and `flash_backward`,
`zerosim.hardware.costs.kernels_s`), and `fit_flash_rates` fits
`gpu.flash_attention_efficiency` (the long-loop, large-head rate),
`gpu.flash_attention_block_keys` and `gpu.flash_attention_softmax_dims`
(`zerosim.hardware.costs.flash_fraction`) to one GPU's rows. Pure: no SimPy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from zerosim.hardware import costs
from zerosim.hardware.profile import HardwareProfile, load_profile
from zerosim.models.kernels import FusedAttention, flash_attention, flash_backward
from zerosim.validation.eager_attention import FORWARD_AND_BACKWARD_FLOPS
from zerosim.validation.leastsq import covariance
from zerosim.validation.reference import reference_data

DATA_FILES = ("fa2_flash_attention.yaml", "h200_sdpa_flash_attention.yaml")
FITTED = ("flash_attention_efficiency", "flash_attention_block_keys",
          "flash_attention_softmax_dims")
"""The profile fields `fit_flash_rates` fits, in order."""


@dataclass(frozen=True)
class FlashRow:
    """One bar: a causal forward and backward over `tokens` at `seq` and `head_dim`."""

    tokens: int
    hidden: int
    head_dim: int
    seq: int
    tflops: float
    kernel: str = "FlashAttention-2"

    @property
    def case(self) -> str:
        return f"{self.kernel} causal s{self.seq} d{self.head_dim}"

    def forward(self, dtype_bytes: int) -> FusedAttention:
        return flash_attention(self.tokens, self.seq, self.hidden, self.hidden, self.head_dim,
                               dtype_bytes)


@dataclass(frozen=True)
class FlashTable:
    gpu: str
    profile_name: str
    group: str
    dtype_bytes: int
    rows: tuple[FlashRow, ...]
    data_file: str
    sm_clock_fraction: float | None = None
    """The SM clock the bars ran at, as a fraction of the one the profile's values are for,
    where the profile prices long runs at a lower one (None: the profile's)."""

    @property
    def profile(self) -> HardwareProfile:
        profile = load_profile(self.profile_name)
        if self.sm_clock_fraction is None:
            return profile
        return replace(profile, sm_clock_fraction=self.sm_clock_fraction)


def flash_tables() -> list[FlashTable]:
    return [FlashTable(g["gpu"], g["profile"], g["group"], data["dtype_bytes"],
                       tuple(FlashRow(data["tokens"], data["hidden"], r["head_dim"], r["seq"],
                                      r["TFLOPS"], g.get("kernel", "FlashAttention-2"))
                             for r in g["rows"]),
                       name, g.get("sm_clock_fraction"))
            for name in DATA_FILES for data in (reference_data(name),) for g in data["gpus"]]


def modelled_tflops(table: FlashTable, row: FlashRow,
                    profile: HardwareProfile | None = None) -> float:
    """The bar as the model gives it: the benchmark's counted FLOPs (3.5 causal forwards)
    over the modelled forward and backward kernels' time."""
    forward = row.forward(table.dtype_bytes)
    seconds = costs.kernels_s((forward, flash_backward(forward)), profile or table.profile)
    return FORWARD_AND_BACKWARD_FLOPS * forward.flops / seconds / 1e12


@dataclass(frozen=True)
class FlashFit:
    """One GPU's three values fitted to its bars, with their standard errors and
    correlations, and each row's modelled / measured - 1 at them."""

    values: tuple[float, float, float]
    std: tuple[float, float, float]
    correlations: tuple[tuple[float, ...], ...]
    errors: tuple[float, ...]


def fit_flash_rates(table: FlashTable) -> FlashFit:
    """Least squares on log(modelled / measured TFLOPS) over the three values of `FITTED`,
    everything else as the table's profile has it."""
    from scipy.optimize import least_squares

    base = table.profile

    def errors(x: np.ndarray) -> list[float]:
        profile = replace(base, **dict(zip(FITTED, (float(v) for v in x), strict=True)))
        return [modelled_tflops(table, r, profile) / r.tflops - 1 for r in table.rows]

    result = least_squares(lambda x: [math.log1p(e) for e in errors(x)],
                           [getattr(base, name) or start
                            for name, start in zip(FITTED, (0.5, 200.0, 10.0), strict=True)],
                           bounds=([0.05, 0.0, 0.0], [1.0, 5000.0, 500.0]),
                           x_scale=[0.1, 100.0, 10.0])
    cov = covariance(result.jac, result.fun)
    std = np.sqrt(np.diag(cov))
    corr = cov / np.outer(std, std)
    return FlashFit(tuple(float(v) for v in result.x), tuple(float(s) for s in std),
                    tuple(tuple(float(c) for c in row) for row in corr),
                    tuple(errors(result.x)))


def flash_table(gpu_prefix: str) -> FlashTable:
    return next(t for t in flash_tables() if t.gpu.startswith(gpu_prefix))
