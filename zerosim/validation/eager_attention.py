"""Eager attention as PyTorch users timed it on an A100 and an H100, against the kernel model.

Each data file (`EAGER_ATTENTION_FILES`) holds a published benchmark of unfused attention: the
score product (a batched GEMM whose K is the head dimension), softmax over the scores, the
context product, and whatever copies or elementwise ops its code adds, with the times it
measured per sequence length: of the forward, or of the forward and the backward (the
backward's kernels read off autograd, `backward_kernels`). A file may time several GPUs with
the same code (`gpus`), its rows several head dimensions (over a fixed width, `hidden`) and a
causal mask. This prices those kernels the way the engine prices a module's
(`zerosim.hardware.costs.kernels_s`), and says what streaming rate the softmax would need for
the measured time, the other kernels priced on a given profile: that separates the score
product's share of the time from the softmax's only as far as the profile's GEMM values hold.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from zerosim.hardware import costs
from zerosim.hardware.profile import HardwareProfile, load_profile
from zerosim.models.kernels import Gemm, Kernel, MemoryPass
from zerosim.validation.leastsq import StreamingFit, fit_rate
from zerosim.validation.reference import reference_data

EAGER_ATTENTION_FILES = ("a100_eager_attention.yaml", "h100_pcie_eager_attention.yaml",
                         "fa2_eager_attention.yaml")
SOFTMAX = "softmax"
FORWARD_AND_BACKWARD_FLOPS = 3.5
"""FlashAttention's benchmark counts a forward and a backward as 3.5 forwards (`flops()` in
benchmarks/benchmark_flash_attention.py: the backward as 2.5)."""


@dataclass(frozen=True)
class AttentionRow:
    """One measured call: its shape and the time it took (of the table's `timed` passes)."""

    seq: int
    batch: int
    measured_s: float
    heads: int
    head_dim: int
    causal: bool = False
    labelled: bool = False
    """Name the head dimension and the mask in the case (a table that varies them)."""

    @property
    def products(self) -> int:
        return self.batch * self.heads

    @property
    def case(self) -> str:
        case = f"eager attention s{self.seq} b{self.batch}"
        if self.labelled:
            case += f" d{self.head_dim}" + (" causal" if self.causal else "")
        return case

    @property
    def counted_flops(self) -> float:
        """The FLOPs FlashAttention's benchmark credits one forward with: the two products
        (4 b s^2 h d), halved with a causal mask (whatever the code computes)."""
        return 4 * self.batch * self.seq**2 * self.heads * self.head_dim / (
            2 if self.causal else 1)


def attention_tables(name: str) -> list[dict[str, Any]]:
    """The file's tables, one per GPU it was timed on (`gpus`), each with the shared code."""
    data = reference_data(name)
    if "gpus" not in data:
        return [data]
    shared = {k: v for k, v in data.items() if k != "gpus"}
    return [shared | gpu for gpu in data["gpus"]]


def attention_table(name: str) -> dict[str, Any]:
    (table,) = attention_tables(name)
    return table


def _measured_s(r: dict[str, Any], row: AttentionRow, table: dict[str, Any]) -> float:
    if "forward_ms" in r:
        return r["forward_ms"] * 1e-3
    passes = FORWARD_AND_BACKWARD_FLOPS if table.get("timed") == "forward_and_backward" else 1
    return passes * row.counted_flops / (r["TFLOPS"] * 1e12)


def attention_rows(table: dict[str, Any]) -> list[AttentionRow]:
    rows = []
    for r in table["rows"]:
        d = r.get("head_dim", table.get("head_dim"))
        heads = table["hidden"] // d if "hidden" in table else table["heads"]
        row = AttentionRow(r["seq"], r["batch"], 0.0, heads, d, r.get("causal", False),
                           "hidden" in table)
        rows.append(replace(row, measured_s=_measured_s(r, row, table)))
    return rows


def table_profile(table: dict[str, Any]) -> HardwareProfile:
    """The profile the table is priced on, with the measured part's own values."""
    return load_profile(table["profile"], overrides=table.get("profile_overrides"))


PRODUCTS = {
    "scores": lambda s, d: (s, s, d),  # Q K^T: K is the head dimension
    "context": lambda s, d: (s, d, s),  # P V: K is the sequence
    "score_gradient": lambda s, d: (s, s, d),  # dP = dO V^T
    "value_gradient": lambda s, d: (s, d, s),  # dV = P^T dO
    "query_gradient": lambda s, d: (s, d, s),  # dQ = dS K
    "key_gradient": lambda s, d: (d, s, s),  # dK^T = Q^T dS
}
"""Each batched product's (m, n, k) for a sequence s and a head dimension d."""


def _product(kind: str, row: AttentionRow, table: dict[str, Any]) -> Gemm:
    m, n, k = PRODUCTS[kind](row.seq, row.head_dim)
    return Gemm(m, n, k, row.products, table["dtype_bytes"])


def _memory_pass(spec: dict[str, Any], row: AttentionRow) -> MemoryPass:
    s = row.seq
    head_elements = row.products * s * row.head_dim
    per_tensor = {"scores": row.products * s * s, "head_elements": head_elements,
                  "packed_qkv": 3 * head_elements, "mask": s * s}
    elements = spec.get("tensors", 1) * per_tensor[spec["over"]]
    return MemoryPass(spec["bytes_per_element"] * elements, count=spec["kernels"]
                      * spec.get("tensors", 1),
                      strided_nbytes=spec.get("strided_bytes_per_element", 0) * elements,
                      softmax_nbytes=spec.get("softmax_bytes_per_element", 0) * elements)


def _kernels(specs: list[dict[str, Any]], row: AttentionRow, table: dict[str, Any]
             ) -> Iterator[tuple[str, Kernel]]:
    for spec in specs:
        if spec.get("causal") and not row.causal:
            continue
        yield spec["name"], (_product(spec["product"], row, table) if "product" in spec
                             else _memory_pass(spec, row))


def attention_kernels(row: AttentionRow, table: dict[str, Any]) -> dict[str, Kernel]:
    """The benchmark's forward kernels in issue order, by name."""
    return dict(_kernels(table["kernels"], row, table))


def backward_kernels(row: AttentionRow, table: dict[str, Any]) -> dict[str, Kernel]:
    """The kernels its backward launches, by name (none where the table times forwards)."""
    return dict(_kernels(table.get("backward_kernels", []), row, table))


def modelled_s(row: AttentionRow, table: dict[str, Any],
               profile: HardwareProfile | None = None) -> float:
    """The GPU seconds of the benchmark's timed kernels, priced as the engine prices a module's
    kernels, on the table's profile or on `profile`."""
    kernels = (*attention_kernels(row, table).values(), *backward_kernels(row, table).values())
    return costs.kernels_s(kernels, profile or table_profile(table))


def softmax_rate_needed(row: AttentionRow, table: dict[str, Any],
                        profile: HardwareProfile | None = None) -> float:
    """The fraction of HBM peak the softmax would have to stream at for the measured time of
    a forward, the other kernels priced on the table's profile or on `profile`."""
    profile = profile or table_profile(table)
    kernels = attention_kernels(row, table)
    softmax = kernels.pop(SOFTMAX)
    others_s = costs.kernels_s(tuple(kernels.values()), profile)
    softmax_s = row.measured_s - others_s - softmax.count * profile.kernel_gap_s
    return softmax.nbytes / (softmax_s * profile.hbm_Bps)


def fit_softmax_efficiency(table: dict[str, Any], profile: HardwareProfile | None = None
                           ) -> StreamingFit:
    """`gpu.softmax_memory_efficiency` that meets the table's times, every other kernel priced
    on the table's profile or on `profile`."""
    profile = profile or table_profile(table)
    rows = attention_rows(table)
    return fit_rate([r.measured_s for r in rows], lambda value: [
        modelled_s(r, table, replace(profile, softmax_memory_efficiency=value))
        for r in rows], profile.memory_efficiency)
