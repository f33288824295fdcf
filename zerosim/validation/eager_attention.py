"""Eager attention's forward as PyTorch users timed it on an A100 and an H100, against the kernel
model.

Each data file (`EAGER_ATTENTION_FILES`) holds a published benchmark of unfused attention: the
score product (a batched GEMM whose K is the head dimension), softmax over the scores, the
context product, and whatever copies or elementwise ops its code adds, with the times it
measured per sequence length. This prices those kernels the way the engine prices a module's
(`zerosim.hardware.costs.kernels_s`), and says what streaming rate the softmax would need for
the measured time, the other kernels priced on a given profile: that separates the score
product's share of the time from the softmax's only as far as the profile's GEMM values hold.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from zerosim.hardware import costs
from zerosim.hardware.profile import HardwareProfile, load_profile
from zerosim.models.kernels import Gemm, Kernel, MemoryPass
from zerosim.validation.leastsq import StreamingFit, fit_rate
from zerosim.validation.reference import reference_data

EAGER_ATTENTION_FILES = ("a100_eager_attention.yaml", "h100_pcie_eager_attention.yaml")
SOFTMAX = "softmax"


@dataclass(frozen=True)
class AttentionRow:
    """One measured call: its sequence length, batch and forward time."""

    seq: int
    batch: int
    forward_s: float

    @property
    def case(self) -> str:
        return f"eager attention s{self.seq} b{self.batch}"


def attention_table(name: str) -> dict[str, Any]:
    return reference_data(name)


def attention_rows(table: dict[str, Any]) -> list[AttentionRow]:
    return [AttentionRow(r["seq"], r["batch"], r["forward_ms"] * 1e-3) for r in table["rows"]]


def table_profile(table: dict[str, Any]) -> HardwareProfile:
    """The profile the table is priced on, with the measured part's own values."""
    return load_profile(table["profile"], overrides=table.get("profile_overrides"))


def _product(kind: str, row: AttentionRow, table: dict[str, Any]) -> Gemm:
    products, d, s = row.batch * table["heads"], table["head_dim"], row.seq
    if kind == "scores":
        return Gemm(s, s, d, products, table["dtype_bytes"])
    return Gemm(s, d, s, products, table["dtype_bytes"])


def _memory_pass(spec: dict[str, Any], row: AttentionRow, table: dict[str, Any]) -> MemoryPass:
    products, s = row.batch * table["heads"], row.seq
    per_tensor = {"scores": products * s * s, "head_elements": products * s * table["head_dim"]}
    elements = spec.get("tensors", 1) * per_tensor[spec["over"]]
    return MemoryPass(spec["bytes_per_element"] * elements, count=spec["kernels"]
                      * spec.get("tensors", 1),
                      strided_nbytes=spec.get("strided_bytes_per_element", 0) * elements,
                      softmax_nbytes=spec.get("softmax_bytes_per_element", 0) * elements)


def attention_kernels(row: AttentionRow, table: dict[str, Any]) -> dict[str, Kernel]:
    """The benchmark's kernels in issue order, by name."""
    return {spec["name"]: (_product(spec["product"], row, table) if "product" in spec
                           else _memory_pass(spec, row, table))
            for spec in table["kernels"]}


def modelled_forward_s(row: AttentionRow, table: dict[str, Any],
                       profile: HardwareProfile | None = None) -> float:
    """The GPU seconds of the benchmark's kernels, priced as the engine prices a module's
    kernels, on the table's profile or on `profile`."""
    return costs.kernels_s(tuple(attention_kernels(row, table).values()),
                           profile or table_profile(table))


def softmax_rate_needed(row: AttentionRow, table: dict[str, Any],
                        profile: HardwareProfile | None = None) -> float:
    """The fraction of HBM peak the softmax would have to stream at for the measured time,
    the other kernels priced on the table's profile or on `profile`."""
    profile = profile or table_profile(table)
    kernels = attention_kernels(row, table)
    softmax = kernels.pop(SOFTMAX)
    others_s = costs.kernels_s(tuple(kernels.values()), profile)
    softmax_s = row.forward_s - others_s - softmax.count * profile.kernel_gap_s
    return softmax.nbytes / (softmax_s * profile.hbm_Bps)


def fit_softmax_efficiency(table: dict[str, Any], profile: HardwareProfile | None = None
                           ) -> StreamingFit:
    """`gpu.softmax_memory_efficiency` that meets the table's forward times, every other
    kernel priced on the table's profile or on `profile`."""
    profile = profile or table_profile(table)
    rows = attention_rows(table)
    return fit_rate([r.forward_s for r in rows], lambda value: [
        modelled_forward_s(r, table, replace(profile, softmax_memory_efficiency=value))
        for r in rows], profile.memory_efficiency)
