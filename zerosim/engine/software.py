"""Constants of the software stack (not of the hardware), with where they come from."""

from dataclasses import dataclass

MAX_PARAM_REDUCE_EVENTS = 2
"""DeepSpeed stage3.py `max_param_reduce_events`: the host synchronises on the oldest gradient
reduction once more than this many are outstanding."""

GRAD_NORM_CHUNK_NUMEL = 250_000_000
"""DeepSpeed stage3.py `_constant_buffered_norm2(input, buffer_size=250000000)`: at the
accumulation boundary each gradient partition's norm is taken in fp64, chunk by chunk of this
many elements (`part.data.double().norm(2)`), so the GPU holds one fp64 copy of up to this
many elements at a time (every release from 0.10 to 0.16)."""

FINALIZE_DISPATCHES_PER_TENSOR = 7
"""The host's ops per gradient tensor in ZeRO-3's `_finalize_offload_gradient_accumulation`
(unmanaged accumulation with the optimizer offloaded, DeepSpeed 0.19.5): the accumulated
partition `.to(device, non_blocking=True)`, `_constant_buffered_norm2` (for a partition of
one chunk: `.double()`, `.norm(2)`, its square and the running sum, then the square root) and
the `.to(fp32)` that `copy_(..., non_blocking=True)` sends into the fp32 gradient, each at the
stack's `kernel_launch_us`."""

ZERO2_FINALIZE_DISPATCHES_PER_PARAM = 12
"""The host's ops per parameter in ZeRO-2's `_finalize_cpu_offload_gradient_accumulation`
(unmanaged accumulation with the optimizer offloaded, DeepSpeed 0.19.5): the accumulated
gradient's `copy_` into the temporary buffer and its `clone()`, the norm's `.double()` and
`.norm(2)`, `_has_inf_or_nan`'s six kernels (`costs.INF_OR_NAN_GPU_BYTES_PER_ELEMENT`), the
`.float()` and `copy_(..., non_blocking=True)` into the fp32 buffer, each at the stack's
`kernel_launch_us`."""

DEVICE_SCALAR_BYTES = 8
"""An all-reduced scalar (overflow flag, gradient norm)."""

STAGE0_ALLREDUCE_BUCKET_NUMEL = 500_000_000
"""DeepSpeed engine.py `MEMORY_OPT_ALLREDUCE_SIZE`: without ZeRO, `allreduce_gradients` reduces
the gradients at the boundary in flat buffers of this many elements."""

GRAD_NORM_DISPATCHES_PER_PARTITION = 3
"""The host's ops per gradient partition when the step takes the norm on the GPU (stage3.py and
stage_1_and_2.py `get_grad_norm_direct`: `g.to(device, non_blocking=True).double().norm(2)`,
one Python iteration per partition), each at the stack's `kernel_launch_us`."""


@dataclass(frozen=True)
class NormDispatches:
    """The host's ops (each at the stack's `kernel_launch_us`; a blocking copy of a scalar
    counts as one) when an offloaded step combines the gradient norms the boundary backward
    left on the GPU: per gradient tensor, per norm group (each one all-reduce follows;
    `Plan.norm_group_tensors`) and once per step."""

    per_tensor: int
    per_group: int
    per_step: int


ZERO3_OFFLOAD_NORM = NormDispatches(per_tensor=2, per_group=14, per_step=1)
"""stage3.py `complete_grad_norm_calculation_for_cpu_offload` per sub-group, then
`get_global_norm` (0.13.3): per tensor `param_norm**2` and `total_norm +=`; per sub-group the
blocking `float(total_norm)`, `FloatTensor([...])` (a copy to the GPU), the `all_reduce` call,
`[0]**(1/2)`, `isinf`, `isnan`, `logical_or`, `torch.tensor(-1.0, device=...)`, the two
products, `logical_not` and the sum that mask a non-finite norm, then `norm**2.0` and `+=`
in `get_global_norm`; per step `sqrt` of the GPU tensor (a blocking `float`). Releases from
0.17 mask in place and return `.cpu()`, 12 ops a sub-group: within the launch cost's spread.
The per-tensor part against a measurement: `benchmarks/node_probe/ds_step_probe.py` timed
`_get_norm_groups` on DeepSpeed 0.19.5's CPU accelerator growing by 12.05 us a tensor at
3.725 GHz (ds_step_devbox_2026-12-04.json), 14.96 us at the stacks' 3.0 GHz reference, where
two ops at `kernel_launch_us` 8 make 16."""

ZERO12_OFFLOAD_NORM = NormDispatches(per_tensor=1, per_group=4, per_step=3)
"""stage_1_and_2.py `scaled_global_norm` with `cpu_offload` (0.13.3): per tensor of the
rank's partition the blocking `param_norm.item()`; per parameter group `FloatTensor([...])`,
the `all_reduce` call, the blocking `.item()` of its result and `torch.tensor(norm,
device=...)`; per step `torch.stack`, `torch.norm` and the blocking comparison
`clip > 1` in `unscale_and_clip_grads`."""

PYTORCH_GRAIN_SIZE = 32_768
"""PyTorch's `at::internal::GRAIN_SIZE`: `at::parallel_for` (TensorIterator's `for_each`, so
every elementwise op and cast on the CPU) runs a range of fewer elements serially in the
calling thread, with no OpenMP parallel region (ATen Parallel-inl.h: `(end - begin) <
grain_size` runs `f(begin, end)` inline)."""

ZENFLOW_ADAMW_LAUNCHES_BEFORE_SYNC = 5
"""ZenFlow's selective AdamW (`zenflow_torch_adam.py` `_multi_tensor_adamw`) before it reads
the step counts back: the foreach add to the steps, the weight decay `mul_`, `lerp_`, `mul_`
and `addcmul_`, one launch each over the bucket's tensors."""

ZENFLOW_ADAMW_LAUNCHES_AFTER_SYNC = 4
"""After: `sqrt`, `div_`, `add_` and `addcdiv_`."""

ZENFLOW_STEP_COUNT_READS = 2
"""Per param, with capturable off: `_get_value(step)` for each of the two bias corrections, a
blocking `.item()` of the param's step count, which lives on the GPU."""

SUPEROFFLOAD_POLL_S = 0.001
"""SuperOffload's host, waiting for its optimizer process, sleeps this long whenever the result
queue is empty (superoffload_stage3.py `_wait_for_async_operations` and
`_wait_for_single_async_result`: `time.sleep(0.001)`)."""
