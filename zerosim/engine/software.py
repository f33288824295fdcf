"""Constants of the software stack (not of the hardware), with where they come from."""

MAX_PARAM_REDUCE_EVENTS = 2
"""DeepSpeed stage3.py `max_param_reduce_events`: the host synchronises on the oldest gradient
reduction once more than this many are outstanding."""

GRAD_NORM_CHUNK_NUMEL = 250_000_000
"""DeepSpeed stage3.py `_constant_buffered_norm2(input, buffer_size=250000000)`: at the
accumulation boundary each gradient partition's norm is taken in fp64, chunk by chunk of this
many elements (`part.data.double().norm(2)`), so the GPU holds one fp64 copy of up to this
many elements at a time (every release from 0.10 to 0.16)."""

DEVICE_SCALAR_BYTES = 8
"""An all-reduced scalar (overflow flag, gradient norm)."""

STAGE0_ALLREDUCE_BUCKET_NUMEL = 500_000_000
"""DeepSpeed engine.py `MEMORY_OPT_ALLREDUCE_SIZE`: without ZeRO, `allreduce_gradients` reduces
the gradients at the boundary in flat buffers of this many elements."""

GRAD_NORM_DISPATCHES_PER_PARTITION = 3
"""The host's ops per gradient partition when the step takes the norm on the GPU (stage3.py and
stage_1_and_2.py `get_grad_norm_direct`: `g.to(device, non_blocking=True).double().norm(2)`,
one Python iteration per partition), each at the stack's `kernel_launch_us`."""

PYTORCH_GRAIN_SIZE = 32_768
"""PyTorch's `at::internal::GRAIN_SIZE`: `at::parallel_for` (TensorIterator's `for_each`, so
every elementwise op and cast on the CPU) runs a range of fewer elements serially in the
calling thread, with no OpenMP parallel region (ATen Parallel-inl.h: `(end - begin) <
grain_size` runs `f(begin, end)` inline)."""
