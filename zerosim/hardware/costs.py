"""Pure cost functions: how long an op takes, or how many bytes it moves, on a profile.

Nothing here knows about SimPy or time-varying contention: the engine turns these amounts into
timeouts (exclusive GPU streams) or flows (shared links and host memory).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from zerosim.hardware.profile import HardwareProfile
from zerosim.models.breakdown import Module
from zerosim.models.kernels import FusedAttention, Gemm, Kernel

BACKWARD_FLOPS_FACTOR = 2.0
"""Backward computes grads w.r.t. inputs and weights: twice the forward matmul work (used for
the conventional model-FLOPs count; the engine prices each module's backward kernels)."""

@dataclass(frozen=True)
class HostBytes:
    """Host-memory bytes per element (or per copied byte), by where the buffers they touch live.

    `home`: buffers the rank's host thread allocates or first touches (pinned buffers, the
    driver's staging buffers, the fp32 master params and gradients, a pageable D2H target);
    `spread`: tensors first touched by the rank's multi-threaded CPU pool (the optimizer
    states that `zeros_like` fills in parallel, the output of a CPU-side cast).
    """

    home: float = 0.0
    spread: float = 0.0

    @property
    def total(self) -> float:
        return self.home + self.spread


ADAM_HOST_BYTES = HostBytes(home=12, spread=16)
"""CPU Adam reads the fp32 param and grad and writes the param (home); reads and writes
exp_avg and exp_avg_sq (spread): 28 B per element."""

UNSCALE_HOST_BYTES = HostBytes(home=8)
"""unscale_and_clip_grads: an in-place multiply of the fp32 gradient (read 4 B, write 4 B)."""

OVERFLOW_CHECK_HOST_BYTES = HostBytes(home=4)
"""The fp16 overflow check reads every fp32 gradient once."""

HOME_PAGES = HostBytes(home=1)
"""A buffer on the rank's home pages, per byte (where a pageable buffer lives by default)."""

SPREAD_PAGES = HostBytes(spread=1)
"""A buffer first touched by the rank's CPU pool, per byte (a CPU-side cast's output)."""

PINNED_DMA_HOST_BYTES = HOME_PAGES
"""Host-memory bytes per byte of a DMA to or from pinned memory (pinned buffers are home)."""

NVME_AIO_HOST_BYTES = HOME_PAGES
"""Host-memory bytes per byte of an aio transfer between the NVMe drives and a swap buffer: the
drive's DMA touches the buffer once. DeepSpeed's swap buffers are pinned by the rank's host
thread at start-up (swap_tensor/utils.py SwapBufferManager), so they are home pages."""


def nvme_node_Bps(profile: HardwareProfile, direction: str) -> float:
    """What a node's NVMe drives move together in one direction ('read': drives -> host,
    'write': host -> drives), a large transfer being striped evenly over every drive."""
    per_drive = (profile.nvme_read_Bps_per_drive if direction == "read"
                 else profile.nvme_write_Bps_per_drive)
    return profile.nvme_drives_per_node * per_drive


def nvme_transfer_s(nbytes: float, profile: HardwareProfile, direction: str) -> float:
    """An uncontended aio transfer of `nbytes`: the drives' latency, then the striped stream."""
    if nbytes <= 0:
        return 0.0
    return profile.nvme_latency_s + nbytes / nvme_node_Bps(profile, direction)


def pageable_dma_host_bytes(buffer: HostBytes) -> HostBytes:
    """Host-memory bytes per byte of a pageable copy: the DMA to or from the driver's pinned
    staging buffer (home), then a memcpy between it (home) and the pageable buffer, which
    lives where `buffer` (1 B in all) says."""
    return HostBytes(home=2 + buffer.home, spread=buffer.spread)


GPU_STEP_BYTES_PER_ELEMENT = UNSCALE_HOST_BYTES.total + ADAM_HOST_BYTES.total + 6
"""A sub-group stepped on the GPU: unscale, Adam, then the fp32 -> 16-bit cast (4 B + 2 B)."""

GPU_STATE_BYTES_PER_ELEMENT = 16
"""What a GPU step needs from the host: fp32 param, gradient, exp_avg, exp_avg_sq."""

GPU_STATE_WRITEBACK_BYTES_PER_ELEMENT = 12
"""What goes back after it: fp32 param, exp_avg, exp_avg_sq."""


def hbm_s(nbytes: float, profile: HardwareProfile) -> float:
    """Bytes streamed through HBM by a memory-bound kernel."""
    return nbytes / (profile.hbm_Bps * profile.memory_efficiency)


def wave_quantisation(gemm: Gemm, profile: HardwareProfile) -> float:
    """Fraction of the SMs' tile slots a GEMM fills: its output tiles run in waves of one tile
    per SM, and a last partial wave leaves SMs idle (1.0 when the tiles fill every wave)."""
    tiles = (math.ceil(gemm.m / profile.gemm_tile_m) * math.ceil(gemm.n / profile.gemm_tile_n)
             * gemm.batch)
    waves = math.ceil(tiles / profile.sm_count)
    return tiles / (waves * profile.sm_count)


def gemm_s(gemm: Gemm, profile: HardwareProfile) -> float:
    """Roofline time of a GEMM: its FLOPs at the achievable fraction of dense peak, reduced by
    wave quantisation, or its minimum HBM traffic, whichever takes longer."""
    rate = profile.peak_16bit_flops * profile.gemm_efficiency * wave_quantisation(gemm, profile)
    return max(gemm.flops / rate, hbm_s(gemm.nbytes, profile))


def kernel_s(kernel: Kernel, profile: HardwareProfile) -> float:
    """GPU time of one kernel (or of a `MemoryPass`'s kernels), with the per-kernel gap."""
    if isinstance(kernel, Gemm):
        return gemm_s(kernel, profile) + profile.kernel_gap_s
    if isinstance(kernel, FusedAttention):
        rate = profile.peak_16bit_flops * profile.flash_attention_efficiency
        return max(kernel.flops / rate, hbm_s(kernel.nbytes, profile)) + profile.kernel_gap_s
    arithmetic = kernel.flops / (profile.peak_16bit_flops * profile.gemm_efficiency)
    return max(arithmetic, hbm_s(kernel.nbytes, profile)) + kernel.count * profile.kernel_gap_s


def kernels_s(kernels: Sequence[Kernel], profile: HardwareProfile) -> float:
    """GPU time of kernels that run one after another on a stream."""
    return sum(kernel_s(k, profile) for k in kernels)


def module_forward_s(module: Module, profile: HardwareProfile) -> float:
    return kernels_s(module.kernels, profile)


def module_backward_s(module: Module, profile: HardwareProfile) -> float:
    return kernels_s(module.backward_kernels, profile)


def hbm_copy_s(nbytes: float, profile: HardwareProfile, *, passes: float = 2.0) -> float:
    """A device-local copy or elementwise kernel: `passes` x bytes through HBM (read + write)."""
    return hbm_s(passes * nbytes, profile)


@dataclass(frozen=True)
class RingCost:
    """What a ring collective puts on each link, and its fixed latency."""

    bytes_per_link: float
    latency_s: float


def ring_all_gather(total_bytes: float, ranks: int, *, latency_s: float) -> RingCost:
    """Ring all-gather (or reduce-scatter) of a `total_bytes` tensor over `ranks` ranks."""
    if ranks <= 1:
        return RingCost(0.0, 0.0)
    return RingCost((ranks - 1) / ranks * total_bytes, (ranks - 1) * latency_s)


def ring_all_reduce(total_bytes: float, ranks: int, *, latency_s: float) -> RingCost:
    """Ring all-reduce: a reduce-scatter then an all-gather."""
    if ranks <= 1:
        return RingCost(0.0, 0.0)
    return RingCost(2 * (ranks - 1) / ranks * total_bytes, 2 * (ranks - 1) * latency_s)


@dataclass(frozen=True)
class CollectiveStep:
    """One level of a (hierarchical) collective: every GPU of node i moves `bytes_per_gpu[i]`
    bytes (per direction) over `link` (`"nvlink"`: its own NVLink port; `"network"`: its
    node's NICs, shared with the node's other GPUs), after `latency_s` of ring-step latency."""

    link: str
    bytes_per_gpu: tuple[float, ...]
    latency_s: float


def hierarchical_collective(kind: str, total_bytes: float, gpus_per_node: Sequence[int], *,
                            nvlink_latency_s: float, network_latency_s: float
                            ) -> tuple[CollectiveStep, ...]:
    """The steps of a collective of a `total_bytes` tensor (the gathered size) over ranks that
    sit `gpus_per_node[i]` to a node, in the order they run.

    One node: a single NVLink ring, `ring_all_gather` (all-gather, reduce-scatter) or
    `ring_all_reduce`. Several nodes: the bandwidth-optimal two-level decomposition NCCL-style
    hierarchical collectives use. With N = sum(g_i) ranks, n nodes and S = total_bytes:

    - reduce-scatter: (1) within each node a ring reduce-scatter of S over NVLink: each GPU sends
      (g_i - 1)/g_i x S, (g_max - 1) steps of nvlink latency; (2) across nodes each GPU
      reduce-scatters its S/g_i share with its peers on the other nodes: the data a node must
      send is what the ranks of the other nodes own, (N - g_i)/N x S, split over its g_i GPUs
      ((n - 1)/n x S / g per GPU when every node has g), (n - 1) steps of network latency.
    - all-gather: the same two levels in the reverse order (across nodes first, then within).
    - all-reduce: intra-node reduce-scatter, inter-node all-reduce of each GPU's share
      (2 x (N - g_i)/N x S / g_i per GPU, 2 (n - 1) network steps), intra-node all-gather.

    The levels run one after the other (no chunk pipelining between them), so a multi-node
    collective costs the sum of its levels. A level with nothing to move (one GPU per node, or
    one node) is left out.
    """
    if kind not in ("all_gather", "reduce_scatter", "all_reduce"):
        raise ValueError(f"unknown collective {kind!r}")
    if len(gpus_per_node) == 1:
        ring = ring_all_reduce if kind == "all_reduce" else ring_all_gather
        cost = ring(total_bytes, gpus_per_node[0], latency_s=nvlink_latency_s)
        return (CollectiveStep("nvlink", (cost.bytes_per_link,), cost.latency_s),)
    ranks = sum(gpus_per_node)
    nodes = len(gpus_per_node)
    g_max = max(gpus_per_node)
    intra = CollectiveStep("nvlink", tuple((g - 1) / g * total_bytes for g in gpus_per_node),
                           (g_max - 1) * nvlink_latency_s)
    passes = 2 if kind == "all_reduce" else 1
    inter = CollectiveStep(
        "network", tuple(passes * (ranks - g) / ranks * total_bytes / g for g in gpus_per_node),
        passes * (nodes - 1) * network_latency_s)
    if g_max == 1:
        return (inter,)
    if kind == "reduce_scatter":
        return intra, inter
    if kind == "all_gather":
        return inter, intra
    return intra, inter, intra


def cpu_oversubscription(ranks_on_node: int, threads_per_rank: int, hardware_threads: int) -> float:
    """How many times the ranks' OpenMP pools cover the node's hardware threads (>= 1)."""
    return max(1.0, ranks_on_node * threads_per_rank / hardware_threads)


def cpu_capacity_threads(profile: HardwareProfile, oversubscription: float) -> float:
    """Useful thread-seconds per second on a node once oversubscription costs are paid."""
    return profile.hardware_threads / (1 + profile.oversubscription_penalty
                                       * (oversubscription - 1))


def model_flops_per_microbatch(modules: list[Module]) -> float:
    """Conventional model FLOPs (forward + backward = 3x forward, dense attention)."""
    return (1 + BACKWARD_FLOPS_FACTOR) * sum(m.model_flops for m in modules)
