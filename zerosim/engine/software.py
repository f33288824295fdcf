"""Constants of the software stack (not of the hardware), with where they come from."""

MAX_PARAM_REDUCE_EVENTS = 2
"""DeepSpeed stage3.py `max_param_reduce_events`: the host synchronises on the oldest gradient
reduction once more than this many are outstanding."""

DEVICE_SCALAR_BYTES = 8
"""An all-reduced scalar (overflow flag, gradient norm)."""

STAGE0_ALLREDUCE_BUCKET_NUMEL = 500_000_000
"""DeepSpeed engine.py `MEMORY_OPT_ALLREDUCE_SIZE`: without ZeRO, `allreduce_gradients` reduces
the gradients at the boundary in flat buffers of this many elements."""
