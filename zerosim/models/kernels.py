"""The GPU kernels a module launches, as shapes and byte counts (pure; no hardware, no time).

A module's forward is a short list of kernels: GEMMs (described by their M, N, K and batch, so a
cost function can apply a roofline with wave quantisation over the SMs), memory-bound passes
(norms, activations, residual adds, softmax, casts: bytes through HBM) and, under flash
attention, one fused attention kernel. `hardware/costs.py` prices them on a profile.
"""

from __future__ import annotations

from dataclasses import dataclass

FLASH_BACKWARD_FLOPS_FACTOR = 2.5
"""FlashAttention-2's backward runs five GEMM-sized products (recomputing the scores, then dV,
dP, dQ, dK) against the forward's two: 2.5x the forward FLOPs (Dao, FlashAttention-2, sec. 3)."""


@dataclass(frozen=True)
class Gemm:
    """`batch` products of an (m x k) by (k x n) matrix, 16-bit operands and output."""

    m: int
    n: int
    k: int
    batch: int = 1
    dtype_bytes: int = 2

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.batch

    @property
    def nbytes(self) -> float:
        """Operands read once and the output written once: the GEMM's minimum HBM traffic."""
        return float(self.dtype_bytes * self.batch
                     * (self.m * self.k + self.k * self.n + self.m * self.n))


@dataclass(frozen=True)
class MemoryPass:
    """`count` elementwise kernels moving `nbytes` through HBM together and doing `flops` of
    arithmetic (a few per element: on a real GPU the bytes always take longer).

    `strided_nbytes` of those bytes are moved by kernels with an operand that is a strided or
    broadcast view (a chunk's half, a permuted tensor, an expanded one): PyTorch's
    elementwise kernels take their vectorized path only when every operand is contiguous, and
    otherwise load one 16-bit element at a time, below the STREAM rate."""

    nbytes: float
    count: int = 1
    flops: float = 0.0
    strided_nbytes: float = 0.0
    backward_nbytes: float | None = None
    """What the kernels' backward moves, where it is read off their code (None: a factor of
    the forward's bytes, `backward`)."""
    backward_strided_nbytes: float = 0.0
    softmax_nbytes: float = 0.0
    """Of the contiguous bytes, those PyTorch's softmax kernel moves over attention scores
    (priced at the GPU's `softmax_memory_efficiency`)."""
    backward_softmax_nbytes: float = 0.0
    backward_count: int | None = None
    """How many kernels the backward launches, where read off its code (None: `count`)."""

    def backward(self, factor: float) -> MemoryPass:
        """The kernels' backward, as many kernels: the bytes read off their code where known,
        else `factor` times the forward's bytes (and arithmetic)."""
        if self.backward_nbytes is None:
            return MemoryPass(self.nbytes * factor, self.count, self.flops * factor,
                              self.strided_nbytes * factor,
                              softmax_nbytes=self.softmax_nbytes * factor)
        ratio = self.backward_nbytes / self.nbytes if self.nbytes else 0.0
        count = self.count if self.backward_count is None else self.backward_count
        return MemoryPass(self.backward_nbytes, count, self.flops * ratio,
                          self.backward_strided_nbytes,
                          softmax_nbytes=self.backward_softmax_nbytes)


@dataclass(frozen=True)
class FusedAttention:
    """One fused (flash) attention kernel: the FLOPs it executes, its HBM input/output, how
    many keys each query's loop visits on average (`keys`: half the sequence under a causal
    mask) and the head dimension (`head_dim`), which set how far below its long-loop rate it
    runs (`zerosim.hardware.costs.flash_fraction`)."""

    flops: float
    nbytes: float
    keys: float
    head_dim: float


Kernel = Gemm | MemoryPass | FusedAttention


def flash_attention(tokens: float, sequence: int, q_width: int, kv_width: int, head_dim: int,
                    dtype_bytes: int) -> FusedAttention:
    """flash-attn's causal forward over `tokens` tokens of `sequence`: the two products of the
    queries' `q_width` with the keys up to each query, half the full score matrix's FLOPs;
    Q, K, V and the output through HBM once."""
    return FusedAttention(2.0 * tokens * sequence * q_width,
                          dtype_bytes * tokens * (2 * q_width + 2 * kv_width),
                          keys=sequence / 2, head_dim=head_dim)


def flash_backward(forward: FusedAttention) -> FusedAttention:
    """Its backward: `FLASH_BACKWARD_FLOPS_FACTOR` times the forward's FLOPs, twice its bytes
    (the inputs, the output and its gradient in, the three gradients out), the same loops."""
    return FusedAttention(FLASH_BACKWARD_FLOPS_FACTOR * forward.flops, 2 * forward.nbytes,
                          forward.keys, forward.head_dim)


def linear_backward(forward: Gemm) -> tuple[Gemm, Gemm]:
    """A linear layer's backward: the input gradient (dY W^T) and the weight gradient (X^T dY)."""
    f = forward
    return (Gemm(f.m, f.k, f.n, f.batch, f.dtype_bytes),
            Gemm(f.k, f.n, f.m, f.batch, f.dtype_bytes))


def kernel_count(kernels: tuple[Kernel, ...]) -> int:
    """How many kernels the host launches for these."""
    return sum(k.count if isinstance(k, MemoryPass) else 1 for k in kernels)
