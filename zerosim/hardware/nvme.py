"""NVMe swapping (ZeRO-Infinity) as DeepSpeed 0.13.3 sizes it: pure arithmetic, no SimPy.

What is swapped around each optimizer sub-group, how large the pinned swap buffers are and when
a tensor is small enough to stay in memory. Each function names the DeepSpeed code it follows
(paths under `deepspeed/runtime/`, tag v0.13.3); docs/nvme.md tells the whole story.
"""

from __future__ import annotations

from zerosim.hardware.costs import pinned_bytes

MIN_AIO_BYTES = 1024**2
"""swap_tensor/utils.py MIN_AIO_BYTES: tensors under max(this, aio.block_size) are not swapped."""

AIO_ALIGNED_BYTES = 1024
"""swap_tensor/utils.py AIO_ALIGNED_BYTES: swap lengths are rounded up to this x thread_count."""

FP32_BYTES = 4
"""The optimizer swapper's dtype (stage3.py _configure_tensor_swapping: torch.float32)."""

ADAM_SWAPPED_TENSORS = 3
"""Tensors of a sub-group's OptimizerStateSwapInfo with DeepSpeedCPUAdam: the fp32 partition,
exp_avg and exp_avg_sq (`step` is a Python int, not a tensor)."""

OPTIMIZER_BUFFERS_PER_SUB_GROUP = ADAM_SWAPPED_TENSORS + 1
"""Pinned buffers one sub-group holds while it steps: its tensors plus one for its gradient
(partitioned_optimizer_swapper.py swap_in_optimizer_state, `required_buffer_count`)."""

OPTIMIZER_SWAP_IN_BYTES_PER_ELEMENT = (ADAM_SWAPPED_TENSORS + 1) * FP32_BYTES
"""Read before a sub-group's step: fp32 param, exp_avg, exp_avg_sq and the fp32 gradient."""

OPTIMIZER_SWAP_OUT_BYTES_PER_ELEMENT = ADAM_SWAPPED_TENSORS * FP32_BYTES
"""Written after it: fp32 param, exp_avg, exp_avg_sq (the gradient is dropped, not written)."""

GRADIENT_SWAP_OUT_BYTES_PER_ELEMENT = FP32_BYTES
"""Written in the boundary backward: each fp32 gradient partition (stage3.py partition_grads ->
optimizer_swapper.swap_out_gradients)."""


def io_alignment_elements(element_bytes: int, thread_count: int) -> int:
    """Elements a swap length is a multiple of: AIO_ALIGNED_BYTES x thread_count bytes
    (optimizer_utils.py OptimizerSwapper.__init__ `numel_alignment`; the param swapper the same)."""
    return AIO_ALIGNED_BYTES * thread_count // element_bytes


def io_aligned_numel(numel: int, element_bytes: int, thread_count: int) -> int:
    """`_io_aligned_numel`: `numel` rounded up to the I/O alignment."""
    alignment = io_alignment_elements(element_bytes, thread_count)
    remainder = numel % alignment
    return numel if remainder == 0 else numel + alignment - remainder


def min_swap_bytes(block_size: int) -> int:
    """`min_aio_bytes`: the smallest tensor that is swapped, max(1 MiB, aio.block_size)."""
    return max(MIN_AIO_BYTES, block_size)


def swappable(numel: int, element_bytes: int, block_size: int) -> bool:
    """`swappable_tensor`: a sub-group (optimizer) or a parameter partition (params) smaller
    than `min_swap_bytes` stays in host memory instead of going to NVMe."""
    return numel * element_bytes >= min_swap_bytes(block_size)


def optimizer_buffers_needed(swappable_sub_groups: int, *, pipeline_read: bool,
                             pipeline_write: bool) -> int:
    """Pinned buffers the optimizer swapper must have (`offload_optimizer.buffer_count`) for a
    rank with `swappable_sub_groups` sub-groups on NVMe.

    The sub-group being stepped holds OPTIMIZER_BUFFERS_PER_SUB_GROUP buffers; with
    `pipeline_read` the next sub-group's read holds as many again, with `pipeline_write` the
    previous sub-group's write does until it completes (pipelined_optimizer_swapper.py
    swap_in_optimizer_state / swap_out_optimizer_state); the first and last sub-groups have no
    previous or next one, so n sub-groups keep at most n in flight. Fewer buffers and DeepSpeed
    fails at the first step: `assert pinned_buffers is not None` (partitioned swapper) or
    "PipelinedOptimizerSwapper ran out of swap buffers, try increasing 'buffer_count'". Even
    with nothing to swap it needs one: utils.py SwapBufferManager.__init__ reads
    `all_buffers[0]`.
    """
    if swappable_sub_groups <= 0:
        return 1
    overlapped = min(swappable_sub_groups - 1, int(pipeline_read) + int(pipeline_write))
    return OPTIMIZER_BUFFERS_PER_SUB_GROUP * (1 + overlapped)


def optimizer_swap_buffer_bytes(largest_sub_group_numel: int, *, buffer_count: int,
                                thread_count: int) -> int:
    """Pinned host memory of the optimizer swapper, allocated once at start-up.

    optimizer_utils.py OptimizerSwapper.__init__: `SwapBufferManager(num_elems=largest_numel,
    count=buffer_count, dtype=torch.float32)` with `largest_numel` the I/O-aligned size of the
    rank's largest sub-group partition (stage3.py passes max(fp16_partitioned_groups_flat_numel));
    utils.py SwapBufferManager pins `count` tensors of that many fp32 elements, each through
    the CUDA accelerator's `pin_memory` (`tensor.pin_memory()`: PyTorch's caching host
    allocator, which pins the next power of two, `costs.pinned_bytes`).
    """
    aligned = io_aligned_numel(largest_sub_group_numel, FP32_BYTES, thread_count)
    return buffer_count * pinned_bytes(aligned * FP32_BYTES)


def param_swap_buffer_bytes(*, buffer_count: int, buffer_size: int, thread_count: int,
                            element_bytes: int = 2) -> int:
    """Pinned host memory of the parameter swapper, allocated once at start-up.

    partitioned_param_swapper.py AsyncPartitionedParameterSwapper._configure_aio: one pinned
    tensor of `aligned_elements_per_buffer x param_buffer_count` elements of the model dtype,
    `aligned_elements_per_buffer` being `offload_param.buffer_size` I/O-aligned, pinned
    through PyTorch's caching host allocator (the next power of two, `costs.pinned_bytes`).
    """
    aligned = io_aligned_numel(buffer_size, element_bytes, thread_count)
    return pinned_bytes(buffer_count * aligned * element_bytes)


def param_partition_fits(partition_numel: int, *, buffer_size: int, element_bytes: int,
                         block_size: int) -> bool:
    """Whether DeepSpeed can place a parameter partition with `offload_param.device: nvme`.

    A partition big enough to be swapped must be strictly smaller than one swap buffer
    (partitioned_param_swapper.py get_buffer: `assert numel < self.elements_per_buffer`,
    "More elements ... than buffer size"); smaller ones stay in host memory.
    """
    if not swappable(partition_numel, element_bytes, block_size):
        return True
    return partition_numel < buffer_size


class GradientSwapBuffers:
    """The pinned buffers the boundary backward writes fp32 gradients through to NVMe, as
    DeepSpeed 0.13.3 fills them (swap_tensor/async_swapper.py `AsyncTensorSwapper`, given every
    buffer of the optimizer swapper by optimizer_utils.py `_swap_out_gradients`:
    `allocate_all`).

    A gradient goes into the current buffer (its I/O-aligned length). When it does not fit, the
    current buffer is submitted to the aio write handle and a free one taken; when none is
    free, the host thread first waits for every submitted write (`_flush_buffers_until_complete`,
    timer `async_swap_gradient_wait`), which frees them all. So once more gradient is in flight
    than the buffers hold, the backward proceeds at the drives' write rate. Pure bookkeeping:
    the engine issues the writes and the waits."""

    def __init__(self, count: int, buffer_numel: int, *, thread_count: int):
        self.count = count
        self.buffer_numel = io_aligned_numel(buffer_numel, FP32_BYTES, thread_count)
        self.thread_count = thread_count
        self.free = count
        self.current: int | None = None
        """Elements in the buffer being filled; None when none is taken."""

    def insert(self, numel: int) -> tuple[int, bool]:
        """Place one gradient of `numel` elements: the elements of a buffer submitted for
        writing first (0 if none) and whether the host must then wait for every write in
        flight before the gradient's copy into the buffer."""
        aligned = io_aligned_numel(numel, FP32_BYTES, self.thread_count)
        if aligned > self.buffer_numel:
            raise ValueError(f"a gradient of {numel} elements exceeds a swap buffer of "
                             f"{self.buffer_numel} (DeepSpeed asserts the same)")
        submitted, wait = 0, False
        if self.current is not None and self.current + aligned > self.buffer_numel:
            submitted, self.current = self.current, None
            if self.free == 0:
                wait, self.free = True, self.count
        if self.current is None:
            self.free -= 1
            self.current = 0
        self.current += aligned
        return submitted, wait

    def release(self) -> int:
        """`release_buffers` before the step: the partly filled buffer is submitted (its
        elements returned) and, after the caller's wait for every write, all are free."""
        submitted = self.current or 0
        self.current, self.free = None, self.count
        return submitted
