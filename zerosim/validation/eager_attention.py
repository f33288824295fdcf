"""Eager attention's forward on an A100, as a PyTorch user timed it, against the kernel model.

`zerosim/validation/data/a100_eager_attention.yaml` holds the float16 baseline of a published
attention benchmark on an A100 80GB: F.normalize of q and k, the score product (a batched GEMM
whose K is the head dimension, 64), a scale, softmax, the context product. This prices those
kernels the way the engine prices a module's (`zerosim.hardware.costs.kernels_s`), and says
what the other reading of the table would need: with the score product bound only by its bytes
(no per-tile cost), the softmax's streaming rate that makes up the measured time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zerosim.hardware import costs
from zerosim.hardware.profile import HardwareProfile
from zerosim.models.kernels import Gemm, Kernel, MemoryPass
from zerosim.validation.reference import reference_data

DATA_FILE = "a100_eager_attention.yaml"


@dataclass(frozen=True)
class AttentionRow:
    """One measured sequence length and its forward time."""

    seq: int
    forward_s: float

    @property
    def case(self) -> str:
        return f"eager attention s{self.seq}"


def attention_data() -> dict[str, Any]:
    return reference_data(DATA_FILE)


def attention_rows(data: dict[str, Any] | None = None) -> list[AttentionRow]:
    return [AttentionRow(r["seq"], r["forward_ms"] * 1e-3)
            for r in (data or attention_data())["rows"]]


def _pass(data: dict[str, Any], name: str, elements: int) -> MemoryPass:
    spec = data["kernels"][name]
    return MemoryPass(spec["bytes_per_element"] * elements, count=spec["kernels"])


def attention_kernels(row: AttentionRow, data: dict[str, Any] | None = None
                      ) -> dict[str, Kernel]:
    """The baseline's kernels in issue order, by name."""
    data = data or attention_data()
    products, d, s = data["batch"] * data["heads"], data["head_dim"], row.seq
    scores = products * s * s
    return {"normalize": _pass(data, "normalize", 2 * products * s * d),
            "scores": Gemm(s, s, d, products, data["dtype_bytes"]),
            "scale": _pass(data, "scale", scores),
            "softmax": _pass(data, "softmax", scores),
            "context": Gemm(s, d, s, products, data["dtype_bytes"])}


def modelled_forward_s(row: AttentionRow, profile: HardwareProfile,
                       data: dict[str, Any] | None = None) -> float:
    """The GPU seconds of the baseline's kernels on `profile`, priced as the engine prices
    a module's kernels."""
    return costs.kernels_s(tuple(attention_kernels(row, data).values()), profile)


def softmax_rate_needed(row: AttentionRow, profile: HardwareProfile,
                        data: dict[str, Any] | None = None) -> float:
    """The fraction of HBM peak the softmax would have to stream at for the measured time,
    the other kernels priced on `profile`."""
    kernels = attention_kernels(row, data)
    softmax = kernels.pop("softmax")
    others_s = costs.kernels_s(tuple(kernels.values()), profile)
    softmax_s = row.forward_s - others_s - softmax.count * profile.kernel_gap_s
    return softmax.nbytes / (softmax_s * profile.hbm_Bps)
