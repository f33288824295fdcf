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
from zerosim.units import BYTES_PER_DTYPE, FP32_BYTES, FP64_BYTES, ordered_sum

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


def adam_host_bytes(param_bytes: int, state_bytes: int) -> HostBytes:
    """CPU Adam reads the param and grad and writes the param (home); reads and writes exp_avg
    and exp_avg_sq (spread)."""
    return HostBytes(home=3 * param_bytes, spread=4 * state_bytes)


def unscale_host_bytes(grad_bytes: int) -> HostBytes:
    """unscale_and_clip_grads: an in-place multiply of the master gradient (read, write)."""
    return HostBytes(home=2 * grad_bytes)


ADAM_HOST_BYTES = adam_host_bytes(FP32_BYTES, FP32_BYTES)
"""With fp32 params, grads and moments: 28 B per element."""

UNSCALE_HOST_BYTES = unscale_host_bytes(FP32_BYTES)
"""Of a fp32 gradient: read 4 B, write 4 B."""


@dataclass(frozen=True)
class AdamPrecision:
    """What DeepSpeedCPUAdam steps: its params and gradients (the master partition's dtype) and
    Adam's moments, fp32 both unless `bf16.bf16_master_weights_and_grads` (DeepSpeed 0.18.3+)
    or `fp16.fp16_master_weights_and_grads` makes the first 16-bit and, with
    `fp32_optimizer_states` off, the second too."""

    params: str = "fp32"
    states: str = "fp32"

    @property
    def param_bytes(self) -> int:
        return BYTES_PER_DTYPE[self.params]

    @property
    def state_bytes(self) -> int:
        return BYTES_PER_DTYPE[self.states]

    @property
    def host_bytes(self) -> HostBytes:
        return adam_host_bytes(self.param_bytes, self.state_bytes)

    @property
    def unscale_bytes(self) -> HostBytes:
        return unscale_host_bytes(self.param_bytes)

    def params_per_s_per_thread(self, profile: HardwareProfile) -> float:
        """The loop's per-thread ceiling for these dtypes (`zerosim/hardware/cpus.yaml`,
        `bf16_cpu_adam`, `fp16_cpu_adam`: a different loop, not only fewer bytes)."""
        if self.params == "fp32":
            return profile.adam_params_per_s_per_thread
        states = "" if self.states == "fp32" else "_states"
        return getattr(profile, f"adam_{self.params}{states}_params_per_s_per_thread")


FP32_ADAM = AdamPrecision()

SUPEROFFLOAD_GRAD_COPY_HOST_BYTES = HostBytes(home=8)
"""SuperOffload's optimizer process copies a sub-group's fp32 gradient out of shared memory
into its own pinned buffer (`param_grad_cpu.copy_(param_grad)`): read 4 B, write 4 B, each
buffer first touched by one process's main thread."""

OVERFLOW_CHECK_HOST_BYTES = HostBytes(home=4, spread=12)
"""ZeRO-3's fp16 overflow check with the optimizer offloaded (stage3.py `has_overflow`):
`isinf(b).any()` and `isnan(b).any()` over the host's 16-bit gradient buffer `b` (pinned: home
pages), which PyTorch computes as `b.abs() == inf` and `b != b` (ATen TensorCompare.cpp):
`b` read twice (4 B), and through fresh temporaries the pool's threads first touch (spread)
`abs` writes 2 B, `==` reads them and writes a bool, `!=` writes a bool, each `any()` reads
one (8 B), with 4 B of fresh pages zeroed: 16 B per element of host traffic. Its time is the
CPU's (`cpu.fp16_check_elements_per_s_per_thread`, measured whole), the traffic what it takes
from the other ranks' copies and kernels."""

OVERFLOW_CHECK_GPU_BYTES_PER_ELEMENT = 4
"""The same check on the GPU (stage3.py without offload), priced as its two 2-byte reads of
the buffer: the temporaries' traffic at HBM rates is a fraction of a millisecond."""

OVERFLOW_CHECK_REGIONS = 5
"""The check's OpenMP parallel regions: `abs`, `==`, `any`, `!=`, `any`."""

INF_OR_NAN_GPU_BYTES_PER_ELEMENT = 4 + 5 + 5 + 3 + 5 + 4
"""stage_1_and_2.py `_has_inf_or_nan` on a gradient, besides reading it: `x.float()` writes 4
B, `isnan` and `isinf` each read 4 and write 1, `logical_or` reads 2 and writes 1, `.float()`
reads 1 and writes 4, `max` reads 4; 6 kernels."""

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


def fp64_norm_hbm_bytes(elements: float, source_bytes: int) -> float:
    """HBM traffic of a gradient's norm taken as DeepSpeed takes it, `g.double().norm(2)`:
    the gradient read (`source_bytes` per element), its fp64 copy written and read back."""
    return (source_bytes + 2 * FP64_BYTES) * elements


@dataclass(frozen=True)
class GpuAdam:
    """How an optimizer steps a sub-group's flat fp32 partition on the GPU, its unscale
    (`grad.mul_`, 8 B) included: HBM bytes per element, and the fp32 temporary it allocates
    while it runs, bytes per element."""

    bytes_per_element: float
    temporary_bytes_per_element: int = 0


def fused_adam(precision: AdamPrecision) -> GpuAdam:
    """DeepSpeed's FusedAdam (`multi_tensor_adam.cu`), the optimizer of a run without offload:
    one pass reading the param, gradient and both moments and writing the param and moments,
    after the unscale, at `precision`'s sizes; nothing allocated."""
    return GpuAdam(precision.unscale_bytes.total + precision.host_bytes.total)


FUSED_ADAM = fused_adam(FP32_ADAM)
"""Over fp32 master params and moments: 28 B, after the 8 B unscale; 36 B."""

TORCH_ADAMW_PASSES_BYTES = 8 + 12 + 8 + 12 + 8 + 8 + 8 + 16
"""`torch.optim.AdamW`'s multi-tensor step (PyTorch 2.x `_multi_tensor_adamw`, the default
for CUDA params), one pass over fp32 tensors each: the decoupled weight decay
`_foreach_mul_(params)` (8 B; Megatron's default decay is not 0), `_foreach_lerp_(exp_avgs,
grads)` (12), `_foreach_mul_(exp_avg_sqs)` (8), `_foreach_addcmul_(exp_avg_sqs, grads, grads)`
(12), `exp_avg_sq_sqrt = _foreach_sqrt(exp_avg_sqs)` (8, a new tensor), `_foreach_div_` and
`_foreach_add_(exp_avg_sq_sqrt)` (8 each), `_foreach_addcdiv_(params, exp_avgs,
exp_avg_sq_sqrt)` (16): 80 B per element."""

TORCH_ADAMW_PASSES_BEFORE_BIAS_CORRECTION = (8 + 12 + 8 + 12) / FP32_BYTES
"""Of `TORCH_ADAMW_PASSES_BYTES`, in passes of one element: the kernels `_multi_tensor_adamw`
launches before it reads each step count back to the host for the bias corrections
(`_get_value(step)` with capturable off: the weight decay, the lerp, the mul and the addcmul,
10 passes); the other 10 follow."""

TORCH_ADAMW_PASSES = TORCH_ADAMW_PASSES_BYTES / FP32_BYTES
"""The same step in passes of one element, 20: ZenFlow's selective AdamW runs it over 16-bit
tensors (the columns it gathers from a 16-bit param, its 16-bit gradient and moments)."""

ZENFLOW_STALE_COPY_HOST_BYTES = HostBytes(home=8, spread=8)
"""ZenFlow's optimizer process up to DeepSpeed 0.19.2, after each partition's Adam:
`stale_param.copy_(p.data.clone())`: the clone reads the fp32 master (home: `share_memory_`
copied it into shared memory from the rank's thread) and writes a fresh temporary its pool
faults in (spread), the copy reads that and writes the snapshot (home, copied into shared
memory the same way): 16 B per element."""

ZENFLOW_NATIVE_STALE_HOST_BYTES = HostBytes(home=4)
"""From 0.19.3 the native process writes the fp32 snapshot as its Adam goes (`adam_update_multi`
writes `stale` beside the param): 4 B per element more on the Adam's pass."""

def torch_adamw(param_bytes: int) -> GpuAdam:
    """`torch.optim.AdamW` over params of `param_bytes` per element, whose moments it makes in
    the params' dtype: its passes (`TORCH_ADAMW_PASSES`) and the unscale over tensors of that
    size, and `exp_avg_sq_sqrt`, one element's worth, held while it runs."""
    return GpuAdam(unscale_host_bytes(param_bytes).total + TORCH_ADAMW_PASSES * param_bytes,
                   param_bytes)


TORCH_ADAMW = torch_adamw(FP32_BYTES)
"""The GPU optimizer DeepSpeed's ZeRO-3 steps a sub-group with when the CPU optimizer does
not: `backup_optimizer`, a `torch.optim.AdamW` (stage3.py, the sub-groups of an
`offload_optimizer.ratio` below 1, and the Deep Optimizer States fork's GPU sub-groups), over
fp32 master params: 88 B per element with the unscale, and `exp_avg_sq_sqrt`, 4 B per element,
held while it runs."""

CAST_TO_16BIT_BYTES_PER_ELEMENT = 6
"""The fp32 -> 16-bit copy of a stepped partition on the GPU (read 4 B, write 2 B)."""


def params_copy_bytes(master_bytes: int, dtype_bytes: int) -> int:
    """Writing a stepped master partition into the 16-bit params on the GPU, per element:
    read the master, write the param (a cast from fp32, a copy from bf16)."""
    return master_bytes + dtype_bytes


GPU_STEP_BYTES_PER_ELEMENT = FUSED_ADAM.bytes_per_element + CAST_TO_16BIT_BYTES_PER_ELEMENT
"""A sub-group stepped on the GPU, fused: unscale, Adam, then the fp32 -> 16-bit cast (the
what-if GPU update of `what_if.gpu_update_every`)."""

GPU_STATE_BYTES_PER_ELEMENT = 16
"""What a GPU step needs from the host: fp32 param, gradient, exp_avg, exp_avg_sq."""

GPU_STATE_WRITEBACK_BYTES_PER_ELEMENT = 12
"""What goes back after it: fp32 param, exp_avg, exp_avg_sq."""


def pinned_bytes(nbytes: float) -> int:
    """What one pinned host allocation of `nbytes` takes: PyTorch's caching host allocator
    (behind `tensor.pin_memory()` and `pin_memory=True`, which DeepSpeed's CUDA accelerator's
    `pin_memory` calls; ATen's CachingHostAllocator) rounds every request up to the next power
    of two and pins all of it (`cudaHostAlloc` of the rounded size), so a 4e8-byte buffer
    holds 2^29 = 536,870,912 bytes."""
    if nbytes <= 0:
        return 0
    return 1 << (math.ceil(nbytes) - 1).bit_length()


def hbm_s(nbytes: float, profile: HardwareProfile, strided_nbytes: float = 0.0,
          softmax_nbytes: float = 0.0) -> float:
    """Bytes streamed through HBM by memory-bound kernels, `strided_nbytes` of them by kernels
    on strided or broadcast views (PyTorch's non-vectorized path, `MemoryPass`) and
    `softmax_nbytes` by PyTorch's softmax over attention scores. The last two run at rates the
    SMs' issue of loads and work on rows set, not HBM, so they slow with the SM clock
    (`sm_clock_fraction`); contiguous streams, bound by HBM and its own clock, do not."""
    contiguous = nbytes - strided_nbytes - softmax_nbytes
    return (contiguous / (profile.hbm_Bps * profile.memory_efficiency)
            + strided_nbytes / (profile.hbm_Bps * profile.strided_memory_efficiency
                                * profile.sm_clock_fraction)
            + softmax_nbytes / (profile.hbm_Bps * profile.softmax_memory_efficiency
                                * profile.sm_clock_fraction))


def gemm_tiles(profile: HardwareProfile) -> tuple[tuple[int, int], ...]:
    """The output tiles cuBLAS picks from: the profile's large tile and its halves (rows, then
    columns), the smaller ones taken when the large one would leave SMs idle."""
    m, n = profile.gemm_tile_m, profile.gemm_tile_n
    return ((m, n), (max(1, m // 2), n), (max(1, m // 2), max(1, n // 2)))


def _wave_fill(gemm: Gemm, tile_m: int, tile_n: int, sm_count: int) -> float:
    tiles = math.ceil(gemm.m / tile_m) * math.ceil(gemm.n / tile_n) * gemm.batch
    waves = math.ceil(tiles / sm_count)
    return tiles / (waves * sm_count)


def wave_quantisation(gemm: Gemm, profile: HardwareProfile) -> float:
    """Fraction of the SMs' tile slots a GEMM fills: its output tiles run in waves of one tile
    per SM, and a last partial wave leaves SMs idle (1.0 when the tiles fill every wave), with
    the tile of `gemm_tiles` that fills them best."""
    return max(_wave_fill(gemm, m, n, profile.sm_count) for m, n in gemm_tiles(profile))


def k_loop_fraction(gemm: Gemm, profile: HardwareProfile) -> float:
    """Share of a tile's time spent in its K loop: each output tile also pays a fixed cost
    (prologue, epilogue, the write of its outputs) worth `gemm_k_overhead` steps of K, so a
    short K (attention's head dimension, a thin projection) runs further below peak."""
    return gemm.k / (gemm.k + profile.gemm_k_overhead)


def flash_fraction(kernel: FusedAttention, profile: HardwareProfile) -> float:
    """Share of a fused attention kernel's time spent at its long-loop rate: each block of
    queries also pays a fixed cost (loading it, the last rescale and write of its output)
    worth `flash_attention_block_keys` keys of its loop, and each score a softmax step (max,
    exp, sum, rescale, outside the tensor cores) worth `flash_attention_softmax_dims` of the
    head dimension's products, so short sequences and small heads run further below it."""
    keys = kernel.keys / (kernel.keys + profile.flash_attention_block_keys)
    dims = kernel.head_dim / (kernel.head_dim + profile.flash_attention_softmax_dims)
    return keys * dims


def gemm_s(gemm: Gemm, profile: HardwareProfile) -> float:
    """Roofline time of a GEMM: its FLOPs at the achievable fraction of dense peak, reduced by
    wave quantisation and by the fixed cost of each tile, or its minimum HBM traffic at the
    rate a GEMM streams (`gemm_memory_efficiency`), whichever takes longer; plus the kernel's
    fixed time outside its waves of tiles (`gemm_latency_s`: ramping up to the first tiles and
    draining the last, which no other tile hides)."""
    rate = (profile.tensor_flops * profile.gemm_efficiency
            * wave_quantisation(gemm, profile) * k_loop_fraction(gemm, profile))
    streaming = gemm.nbytes / (profile.hbm_Bps * profile.gemm_memory_efficiency)
    return max(gemm.flops / rate, streaming) + profile.gemm_latency_s


def kernel_s(kernel: Kernel, profile: HardwareProfile) -> float:
    """GPU time of one kernel (or of a `MemoryPass`'s kernels), with the per-kernel gap."""
    if isinstance(kernel, Gemm):
        return gemm_s(kernel, profile) + profile.kernel_gap_s
    if isinstance(kernel, FusedAttention):
        rate = (profile.tensor_flops * profile.flash_attention_efficiency
                * flash_fraction(kernel, profile))
        return max(kernel.flops / rate, hbm_s(kernel.nbytes, profile)) + profile.kernel_gap_s
    arithmetic = kernel.flops / (profile.tensor_flops * profile.gemm_efficiency)
    return (max(arithmetic, hbm_s(kernel.nbytes, profile, kernel.strided_nbytes,
                                  kernel.softmax_nbytes))
            + kernel.count * profile.kernel_gap_s)


def kernels_s(kernels: Sequence[Kernel], profile: HardwareProfile) -> float:
    """GPU time of kernels that run one after another on a stream."""
    return ordered_sum(kernel_s(k, profile) for k in kernels)


def module_forward_s(module: Module, profile: HardwareProfile) -> float:
    return kernels_s(module.kernels, profile)


def module_backward_s(module: Module, profile: HardwareProfile) -> float:
    return kernels_s(module.backward_kernels, profile)


def hbm_copy_s(nbytes: float, profile: HardwareProfile, *, passes: float = 2.0) -> float:
    """A device-local copy or elementwise kernel: `passes` x bytes through HBM (read + write)."""
    return hbm_s(passes * nbytes, profile)


@dataclass(frozen=True)
class RingCollective:
    """NCCL's ring over every rank of a collective, as one pipelined transfer.

    Every GPU moves `bytes_per_gpu` (per direction) at the ring's common rate. Of each ring's
    g_i hops out of node i, g_i - 1 stay on NVLink and one leaves the node through its NICs,
    so a GPU of node i loads its own NVLink port with `nvlink_share[i]` of its bytes and its
    node's NICs (pooled, shared with the node's other GPUs) with `network_share[i]`: the node
    as a whole sends all of one GPU's bytes out. `latency_s`: the ring's steps, the
    inter-node ones at the network's latency; an all-reduce across nodes, NCCL's tree's where
    that is shorter (`tree_all_reduce_latency`)."""

    bytes_per_gpu: float
    nvlink_share: tuple[float, ...]
    network_share: tuple[float, ...]
    latency_s: float


def ring_collective(kind: str, total_bytes: float, gpus_per_node: Sequence[int], *,
                    nvlink_latency_s: float, network_latency_s: float) -> RingCollective:
    """A collective of a `total_bytes` tensor (the gathered size) over ranks that sit
    `gpus_per_node[i]` to a node, as NCCL runs it: one ring through every rank.

    NCCL implements all-gather and reduce-scatter only as a ring (Singh et al., "The Big
    Send-off", arXiv 2504.18658: "NCCL and RCCL implement only the ring algorithm for
    all-gather and reduce-scatter"), and a ring for large all-reduces. With N ranks on n nodes
    and S = total_bytes, each GPU sends (N - 1)/N x S (twice that for all-reduce, a
    reduce-scatter then an all-gather). A ring leaves each node once, so a node's NICs carry
    as much as one GPU sends: its bandwidth is min(NVLink port / nvlink share, node NICs), the
    NCCL bus bandwidth of an inter-node ring. Steps as NCCL's tuning model counts them
    (src/graph/tuning.cc): N - 1 (all-reduce 2(N - 1)), of which n - 1 (2(n - 1)) cross
    nodes at the network's latency and the rest run at NVLink's. A small all-reduce across
    nodes (`TREE_ALL_REDUCE_MAX_BYTES`) takes NCCL's tree's latency where that is shorter
    (`tree_all_reduce_latency`).
    """
    if kind not in ("all_gather", "reduce_scatter", "all_reduce"):
        raise ValueError(f"unknown collective {kind!r}")
    passes = 2 if kind == "all_reduce" else 1
    ranks = sum(gpus_per_node)
    nodes = len(gpus_per_node)
    steps = passes * (ranks - 1)
    inter_steps = passes * (nodes - 1)
    latency_s = (steps - inter_steps) * nvlink_latency_s + inter_steps * network_latency_s
    if kind == "all_reduce" and nodes > 1 and total_bytes <= TREE_ALL_REDUCE_MAX_BYTES:
        latency_s = min(latency_s, tree_all_reduce_latency(
            gpus_per_node, nvlink_latency_s=nvlink_latency_s,
            network_latency_s=network_latency_s))
    nbytes = passes * (ranks - 1) / ranks * total_bytes
    if nodes == 1:
        return RingCollective(nbytes, (1.0,), (0.0,), latency_s)
    return RingCollective(nbytes, tuple((g - 1) / g for g in gpus_per_node),
                          tuple(1 / g for g in gpus_per_node), latency_s)


def all_to_all(total_bytes: float, gpus_per_node: Sequence[int], *, nvlink_latency_s: float,
               network_latency_s: float) -> RingCollective:
    """An all-to-all of a `total_bytes` buffer per rank (`all_to_all_single`: each rank sends
    one N-th of it to every rank, itself included) over ranks that sit `gpus_per_node[i]` to
    a node. NCCL runs it as a send and a receive to each peer at once (grouped point-to-point
    calls), so a GPU sends (N - 1)/N x S in one step, at one step's latency (the network's
    when the ranks span nodes). Of a GPU's peers, g_i - 1 are on its node (its NVLink port)
    and N - g_i beyond it (its node's NICs, pooled with the node's other GPUs): one on each
    node (qgZ's inter-node groups) sends everything through the NICs, all on one node
    (its intra-node groups) everything over NVLink."""
    ranks = sum(gpus_per_node)
    nbytes = (ranks - 1) / ranks * total_bytes
    if len(gpus_per_node) == 1:
        return RingCollective(nbytes, (1.0,), (0.0,), nvlink_latency_s)
    peers = ranks - 1
    return RingCollective(nbytes, tuple((g - 1) / peers for g in gpus_per_node),
                          tuple((ranks - g) / peers for g in gpus_per_node), network_latency_s)


TREE_ALL_REDUCE_MAX_BYTES = 64 * 1024
"""The all-reduces across nodes zerosim starts after NCCL's tree's latency: those of at most
64 KiB, where ALCF's nccl-tests on Polaris stay latency-bound (on 8 nodes an 8-byte one takes
61 us, 64 KiB 234 us, then the time grows with the size, 753 us at 1 MiB, as NCCL's
low-latency protocols move little data a step; on 256 nodes 183, 512 and 978 us). Larger
ones take the ring's latency and rate, which price the step's buckets (the 64 MiB all-gathers
+4.5% over 2 nodes and +2.5% over 8); in between (64 KiB to 64 MiB) neither is NCCL's:
zerosim issues none there but the persistent parameters' gathers, which are all-gathers."""


def tree_all_reduce_latency(gpus_per_node: Sequence[int], *, nvlink_latency_s: float,
                            network_latency_s: float) -> float:
    """The steps of NCCL's tree all-reduce across nodes (src/graph/trees.cc, tuning.cc): a
    chain through each node's GPUs over NVLink and a double binary tree over the nodes, the
    partial sums going up it and the result coming down, so 2 (g - 1) NVLink steps and
    2 ceil(log2 n) network ones (g the most GPUs on a node, n the nodes), each at the ring's
    step latency. ALCF's nccl-tests on Polaris time an 8-byte all-reduce at 23 us (2 nodes),
    61 us (8) and 184 us (256, NCCL 2.21), where this gives 58, 78 and 128 us and the ring
    106, 454 and 14,838 (`zerosim validate`, collective latencies)."""
    levels = math.ceil(math.log2(len(gpus_per_node)))
    return 2 * ((max(gpus_per_node) - 1) * nvlink_latency_s + levels * network_latency_s)


def zenflow_worker_threads(profile: HardwareProfile, world: int, ranks_on_node: int, *,
                           bound: bool, reserved_share: float, split: bool) -> int:
    """The cores of ZenFlow's optimizer process, one thread on each.

    From DeepSpeed 0.17.6 (`split`, zenflow_utils.py `start_optimizer_process`): the rank's
    cores, the physical cores its launcher bound it to (`bound`) or, unbound, an even share
    of the node's physical cores over the world's ranks, less the first ceil(reserved_share x
    n) the training process keeps (none kept where that leaves none or all). Before: the
    logical CPUs os.cpu_count() // world_size from CPU 0 up, whatever the binding."""
    if not split:
        return max(1, profile.hardware_threads // world)
    cores = (max(1, profile.physical_cores // ranks_on_node) if bound
             else max(1, profile.physical_cores // world))
    kept = math.ceil(reserved_share * cores)
    return cores - kept if 0 < kept < cores else cores


def superoffload_worker_threads(profile: HardwareProfile, ranks_on_node: int, *,
                                bound: bool, cores_perc: float) -> int:
    """The CPUs of SuperOffload's optimizer process, one thread on each
    (superoffload_utils.py `SuperOffloadCPUOptimizer._set_cpu_affinity`): of the CPUs in the
    rank's affinity, its physical cores when its launcher bound it (`bound`), else every
    logical CPU of the node, the training process keeps the first int((1 - cores_perc) x n)
    and the optimizer process takes the rest (psutil reads an empty list as every CPU: all n
    when either side would get none). Unbound ranks' processes all take the same last CPUs of
    the node, so they share them: an even share each."""
    cpus = max(1, profile.physical_cores // ranks_on_node) if bound else profile.hardware_threads
    worker = cpus - int((1 - cores_perc) * cpus) or cpus
    return worker if bound else max(1, worker // ranks_on_node)


def default_threads_per_rank(profile: HardwareProfile, ranks_on_node: int, *,
                             bound: bool = False) -> int:
    """PyTorch's intra-op default, which the OpenMP pool of DeepSpeedCPUAdam inherits when
    OMP_NUM_THREADS is unset (DeepSpeed's launcher leaves it unset unless it binds): one thread
    per physical core (c10 TaskThreadPoolBase::defaultNumThreads), not per hardware thread.
    A launcher that binds (`--bind_cores_to_rank`) sets OMP_NUM_THREADS to the rank's share of
    the physical cores (deepspeed.utils.numa.get_numactl_cmd)."""
    if bound:
        return max(1, profile.physical_cores // ranks_on_node)
    return profile.physical_cores


@dataclass(frozen=True)
class CpuPools:
    """The OpenMP pools of the ranks on a node: how far together they oversubscribe its
    hardware threads, and what that costs (`zerosim check` prints it; the engine runs it)."""

    ranks_on_node: int
    threads_per_rank: int
    hardware_threads: int
    oversubscription: float
    """Threads asked over hardware threads, at least 1."""
    capacity_threads: float
    """Useful thread-seconds per second the node's CPU gives them together."""
    region_wait_s: float
    """What each OpenMP parallel region waits at its join."""

    @property
    def filling_threads(self) -> int:
        """Threads per rank that fill the node's hardware threads without oversubscribing
        them (what `OMP_NUM_THREADS` would be set to)."""
        return max(1, self.hardware_threads // self.ranks_on_node)


def cpu_pools(profile: HardwareProfile, ranks_on_node: int, threads_per_rank: int | None, *,
              bound: bool = False) -> CpuPools:
    """The pools of `ranks_on_node` ranks of `threads_per_rank` threads each (None: the
    default, `default_threads_per_rank`)."""
    threads = threads_per_rank or default_threads_per_rank(profile, ranks_on_node, bound=bound)
    factor = cpu_oversubscription(ranks_on_node, threads, profile.hardware_threads)
    return CpuPools(ranks_on_node, threads, profile.hardware_threads, factor,
                    cpu_capacity_threads(profile, factor),
                    oversubscribed_region_s(profile, factor))


def cpu_oversubscription(ranks_on_node: int, threads_per_rank: int, hardware_threads: int) -> float:
    """How many times the ranks' OpenMP pools cover the node's hardware threads (>= 1)."""
    return max(1.0, ranks_on_node * threads_per_rank / hardware_threads)


def oversubscribed_region_s(profile: HardwareProfile, oversubscription: float) -> float:
    """What one OpenMP parallel region loses on a node whose pools oversubscribe its hardware
    threads (`cpu_oversubscription` > 1): its join waits for team threads the other pools'
    threads, spinning after their own regions, keep off the cores."""
    return profile.oversubscribed_region_s * (oversubscription - 1)


def cpu_capacity_threads(profile: HardwareProfile, oversubscription: float) -> float:
    """Useful thread-seconds per second on a node once oversubscription costs are paid."""
    return profile.hardware_threads / (1 + profile.oversubscription_penalty
                                       * (oversubscription - 1))


CPU_ADAM_TILE_ELEMENTS = 128 * 1024 * 1024
"""DeepSpeedCPUAdam steps a flat tensor tile by tile (csrc/includes/simd.h, TILE), one
OpenMP parallel region per tile."""


def model_flops_per_microbatch(modules: list[Module]) -> float:
    """Conventional model FLOPs (forward + backward = 3x forward, dense attention)."""
    return (1 + BACKWARD_FLOPS_FACTOR) * ordered_sum(m.model_flops for m in modules)
