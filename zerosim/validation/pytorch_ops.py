"""PyTorch's own ops on an A100 and an H100, as Liger-Kernel's benchmarks timed its baselines,
against the kernel model.

`zerosim/validation/data/liger_pytorch_ops.yaml` holds the tables: elementwise ops (a
contiguous chain, a chunk's halves, the rotary embedding's broadcast products), a Llama MLP
(three projections and the gate's activation) and an output layer with its cross entropy;
and Liger's own RMSNorm, rotary embedding and SwiGLU MLP, priced with the stack's
`liger_kernel` entries (nothing is fitted to them). This prices each row's kernels the way the
engine prices a module's (`zerosim.hardware.costs.kernels_s`), with a stack's kernel entry where
the op is one the stack runs, and fits the two sets of GPU values these tables pin:
`gpu.strided_memory_efficiency` (the tables marked `fits` it) and, on the A100, the GEMM values
together with Azure's cuBLASLt table (`fit_a100_gemm_rates`); the A100's strided rate comes from
the Polaris runs (`zerosim calibrate`), against which the A100 rotary table is reported. Pure:
no SimPy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from zerosim.hardware import costs
from zerosim.hardware.profile import HardwareProfile, load_profile
from zerosim.models.breakdown import (
    Elementwise,
    Recipe,
    Workload,
    elementwise_pass,
    input_gradient_sum,
)
from zerosim.models.kernels import Gemm, Kernel, MemoryPass, linear_backward
from zerosim.stacks import load_stack
from zerosim.validation.gemm_rates import GemmRow
from zerosim.validation.leastsq import StreamingFit, covariance, fit_rate
from zerosim.validation.reference import reference_data

DATA_FILE = "liger_pytorch_ops.yaml"
AZURE_FILE = "azure_nd_gpu_benchmarks.yaml"


@dataclass(frozen=True)
class OpRow:
    """One timed call: its shape (the table's named sizes) and its time."""

    sizes: Mapping[str, int]
    measured_s: float

    def label(self, table: OpTable) -> str:
        return " ".join(f"{k} {v}" for k, v in self.sizes.items()
                        if k in (*table.elements, "tokens"))


PASSES = {"forward": (False,), "forward_and_backward": (False, True), "backward": (True,)}
"""What a table's time holds, pass by pass (True: a backward): the forward's kernels, those and
then the backward's, or the backward's alone (each derived as the engine derives a module's
backward: a projection's input and weight gradients; a memory-bound pass read off the code
where the stack's entry has it, else its `backward_bytes_factor` times the forward)."""


@dataclass(frozen=True)
class OpTable:
    """One op timed at several sizes on one GPU: `elementwise` (one pass over the product of
    the `elements` sizes), `mlp` (a Llama MLP: gate and up projections, the activation pass
    over tokens x ffn, the down projection) or `linear_loss` (an output layer, tokens x vocab
    logits from the hidden states, then the loss's pass over the logits); `timed` says which
    passes its times hold (`PASSES`), `backward_bytes_factor` is its stack's."""

    name: str
    gpu: str
    profile_name: str
    kind: str
    elementwise: Elementwise
    elements: tuple[str, ...]
    fits: str | None
    reported: str | None
    """Why the table is reported, not judged (None: judged)."""
    code: str
    rows: tuple[OpRow, ...]
    timed: str = "forward"
    backward_bytes_factor: float = 2.0
    accumulates_weight_gradients: bool = False
    """The timed backward adds the projections' weight gradients into the `.grad` the earlier
    calls left (do_bench clears the input's gradient only): AccumulateGrad's in-place add."""
    accumulates_input_gradient: bool = False
    """The timed backward adds the input's gradient into the `.grad` the earlier calls left
    (do_bench given no tensor to clear)."""
    liger: bool = False
    """The table times Liger-Kernel's own kernel (priced with the stack's `liger_kernel`
    entry), not one of its PyTorch baselines."""

    @property
    def profile(self) -> HardwareProfile:
        return load_profile(self.profile_name)


def _elementwise(spec: Mapping[str, Any]) -> tuple[Elementwise, float]:
    """A table's pass and its backward's traffic factor: a stack's kernel entry by name, or
    the counts written in the table, its backward's too where it has them (else the stacks'
    default factor)."""
    if "stack" in spec:
        stack = load_stack(spec["stack"])
        recipe = (stack.with_liger_kernel() if spec.get("liger_kernel") else stack).recipe
        return getattr(recipe, spec["op"]), recipe.backward_bytes_factor
    return (Elementwise(spec["kernels"], spec["bytes_per_element"],
                        spec.get("strided_bytes_per_element", 0.0),
                        spec.get("backward_bytes_per_element"),
                        spec.get("backward_strided_bytes_per_element", 0.0),
                        spec.get("backward_kernels")),
            Recipe().backward_bytes_factor)


def _table(t: Mapping[str, Any]) -> OpTable:
    elementwise, factor = _elementwise(t["pass"])
    return OpTable(t["name"], t["gpu"], t["profile"], t["kind"], elementwise,
                   tuple(t.get("elements", ())), t.get("fits"), t.get("reported"), t["code"],
                   tuple(OpRow({k: v for k, v in r.items() if k != "ms"}, r["ms"] * 1e-3)
                         for r in t["rows"]),
                   t.get("timed", "forward"), factor,
                   accumulates_weight_gradients=_accumulated(t, "weight_gradients"),
                   accumulates_input_gradient=_accumulated(t, "input_gradient"),
                   liger=bool(t["pass"].get("liger_kernel")))


def _accumulated(t: Mapping[str, Any], key: str) -> bool:
    return key in t and t[key]["value"] == "accumulated"


def op_tables() -> list[OpTable]:
    return [_table(t) for t in reference_data(DATA_FILE)["tables"]]


def op_table(name: str) -> OpTable:
    return next(t for t in op_tables() if t.name == name)


BF16 = Workload(sequence_length=1, bfloat16=True)
"""Every table times 16-bit tensors: its passes are priced as a 16-bit run's."""


def forward_kernels(table: OpTable, row: OpRow) -> tuple[Kernel, ...]:
    """The kernels one forward launches, in order."""
    if table.kind == "mlp":
        t, h, f = row.sizes["tokens"], row.sizes["hidden"], row.sizes["ffn"]
        return (Gemm(t, f, h), Gemm(t, f, h), *elementwise_pass(table.elementwise, t * f, BF16),
                Gemm(t, h, f))
    if table.kind == "linear_loss":
        t, h, v = row.sizes["tokens"], row.sizes["hidden"], row.sizes["vocab"]
        return (Gemm(t, v, h), *elementwise_pass(table.elementwise, t * v, BF16))
    return elementwise_pass(table.elementwise,
                            math.prod(row.sizes[k] for k in table.elements), BF16)


def backward_kernels(table: OpTable, row: OpRow) -> tuple[Kernel, ...]:
    """The kernels one backward launches: each forward kernel's backward, as the engine
    derives a module's; an MLP's input, read by the gate and the up projections, sums its two
    gradients; and the benchmark's AccumulateGrad adds each weight gradient (and the input's,
    where the table says so) into the one the earlier calls left (read 2 + 2, write 2 B per
    element), where it keeps them."""
    kernels: list[Kernel] = []
    for kernel in forward_kernels(table, row):
        kernels += (linear_backward(kernel) if isinstance(kernel, Gemm)
                    else (kernel.backward(table.backward_bytes_factor),))
    if table.kind == "mlp":
        t, h, f = row.sizes["tokens"], row.sizes["hidden"], row.sizes["ffn"]
        kernels.append(input_gradient_sum(t * h, BF16))
        if table.accumulates_weight_gradients:
            kernels.append(_accumulation(3 * h * f, 3))
    if table.kind == "linear_loss":
        t, h, v = row.sizes["tokens"], row.sizes["hidden"], row.sizes["vocab"]
        if table.accumulates_weight_gradients:
            kernels.append(_accumulation(v * h))
        if table.accumulates_input_gradient:
            kernels.append(_accumulation(t * h))
    return tuple(kernels)


def _accumulation(elements: float, tensors: int = 1) -> MemoryPass:
    """AccumulateGrad's in-place adds of new gradients into 16-bit `.grad`s, one kernel a
    tensor: read 2 + 2, write 2 B an element."""
    return MemoryPass(3 * BF16.dtype_bytes * elements, tensors)


def row_kernels(table: OpTable, row: OpRow) -> tuple[Kernel, ...]:
    """The kernels the timed call launches: its forward's, its backward's, or both in turn."""
    return tuple(kernel for backward in PASSES[table.timed]
                 for kernel in (backward_kernels(table, row) if backward
                                else forward_kernels(table, row)))


def modelled_s(table: OpTable, row: OpRow, profile: HardwareProfile | None = None) -> float:
    """The call's GPU time as the engine prices its kernels, on the table's profile or on
    `profile`."""
    return costs.kernels_s(row_kernels(table, row), profile or table.profile)


def implied_strided_rate(table: OpTable, row: OpRow) -> float:
    """The fraction of HBM peak the row's strided bytes would stream at for the measured
    time, its other bytes at the profile's STREAM rate and each kernel paying its gap."""
    profile = table.profile
    (memory,) = row_kernels(table, row)
    left = (row.measured_s - memory.count * profile.kernel_gap_s
            - costs.hbm_s(memory.nbytes - memory.strided_nbytes, profile))
    return memory.strided_nbytes / left / profile.hbm_Bps


def fit_strided_rate(table: OpTable) -> StreamingFit:
    """`gpu.strided_memory_efficiency` that makes the table's modelled calls meet its rows."""
    profile = table.profile
    return fit_rate([r.measured_s for r in table.rows], lambda value: [
        modelled_s(table, r, replace(profile, strided_memory_efficiency=value))
        for r in table.rows], profile.strided_memory_efficiency)


def azure_a100() -> Mapping[str, Any]:
    return reference_data(AZURE_FILE)["a100_sxm4_80gb"]


def azure_rows() -> list[GemmRow]:
    return [GemmRow.from_record(r) for r in azure_a100()["gemm_fp16"]]


def azure_modelled_tflops(row: GemmRow, profile: HardwareProfile, clock_ratio: float) -> float:
    """Azure's rate of `row` as the model gives it at a clock `clock_ratio` of the one PyTorch's
    calls ran at: the table runs each shape for minutes (10,000 warm-up calls), at the clocks
    an A100 sustains at its power limit, where a training step's and do_bench's calls run in
    bursts: the SM clock (`gpu.sm_clock_fraction`) slows its tensor cores, not its HBM."""
    at_clock = replace(profile, sm_clock_fraction=profile.sm_clock_fraction * clock_ratio)
    return row.gemm.flops / costs.gemm_s(row.gemm, at_clock) / 1e12


@dataclass(frozen=True)
class A100GemmFit:
    """The A100's GEMM values fitted to PyTorch's MLP calls and Azure's table together, with
    the clock Azure's sustained runs ran at as a value of that measurement."""

    efficiency: float
    k_overhead: float
    clock_ratio: float
    std: tuple[float, float, float]
    correlations: tuple[tuple[float, ...], ...]
    errors: tuple[float, ...]
    """modelled / measured - 1: the MLP tables' rows, then Azure's."""


def a100_mlp_tables() -> list[OpTable]:
    """The A100 MLP tables the GEMM values are fitted to (their forwards)."""
    return [t for t in op_tables()
            if t.kind == "mlp" and t.profile_name == "dgx-a100" and t.fits]


def fit_a100_gemm_rates(profile: HardwareProfile | None = None) -> A100GemmFit:
    """Least squares on log(modelled / measured) over `gpu.gemm_efficiency`,
    `gpu.gemm_k_overhead` and Azure's clock ratio, the kernel latency and everything else as
    `dgx-a100` has them (the MLP rows' activation pass at its stack's rates)."""
    from scipy.optimize import least_squares

    base = profile or load_profile("dgx-a100")
    mlp = [(t, r) for t in a100_mlp_tables() for r in t.rows]
    azure = azure_rows()

    def errors(x: np.ndarray) -> list[float]:
        fitted = replace(base, gemm_efficiency=float(x[0]), gemm_k_overhead=float(x[1]))
        return ([modelled_s(t, r, fitted) / r.measured_s - 1 for t, r in mlp]
                + [r.tflops / azure_modelled_tflops(r, fitted, float(x[2])) - 1 for r in azure])

    result = least_squares(lambda x: [math.log1p(e) for e in errors(x)],
                           [base.gemm_efficiency, base.gemm_k_overhead, 1.0],
                           bounds=([0.5, 0.0, 0.7], [1.0, 3000.0, 1.2]),
                           x_scale=[0.1, 100.0, 0.1])
    cov = covariance(result.jac, result.fun)
    std = np.sqrt(np.diag(cov))
    corr = cov / np.outer(std, std)
    return A100GemmFit(float(result.x[0]), float(result.x[1]), float(result.x[2]),
                       (float(std[0]), float(std[1]), float(std[2])),
                       tuple(tuple(float(c) for c in row) for row in corr),
                       tuple(errors(result.x)))
