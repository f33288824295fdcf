"""Deep Optimizer States' interleaved update (`offload_optimizer.prefetch_optimizer`), as the
fork's stage3.py `step`, `opt_transfers` and `downsample_fp32_fp16` do it at
DataStates/DeepSpeed@4570a955 (the same step from d8048a5e to d18d6f81).

Sub-groups are stepped in order; every gap-th one on the GPU (`plan.interleaved_devices`),
counted over every sub-group of every parameter group the framework hands the optimizer
(Megatron's norms are the last: `plan.optimizer_param_groups`; where one of a later group
falls on the GPU the fork's step raises IndexError, `scenario.support`, and it is replayed
as a GPU sub-group):

- the first of each run of CPU sub-groups (`CPU_PREFETCH`) starts the moves around the GPU
  ones: the previous GPU sub-group's fp32 params, exp_avg and exp_avg_sq go D2H, then the next
  one's come H2D, each on its own copier stream (three `async_copier`s, pinned host memory);
  its 16-bit partition is written from the GPU fp32 params on the GPU. The rank's thread then
  waits for the 16-bit copies queued so far (below) and steps the sub-group on the CPU;
- a GPU sub-group waits for the three copiers, then runs its Adam on the GPU (the fork's
  `torch.optim.AdamW`, priced as one fused pass): its gradient never left HBM (the boundary
  backward copied it into a GPU buffer in the accumulation dtype, which the `CPU_PREFETCH`
  sub-group before it cast to fp32), and its 16-bit partition is written by the next
  `CPU_PREFETCH` sub-group, not by its step;
- a CPU sub-group is unscaled and stepped by DeepSpeedCPUAdam with no copy-back; after the
  last CPU sub-group before a GPU one (or the last of all), a helper thread casts the run's
  fp32 params to 16 bits (`.half()` into a fresh tensor, then into one of gap - 1 pinned
  buffers) and queues each H2D on a fourth copier.

After the loop the thread waits for the 16-bit copies queued so far, and nothing else of the
helper's: the future of its last job is never awaited. The step's timer therefore stops while
the helper may still be casting the last run; that cast and the copies it queues run on past
the step, over the next iteration's forward (`HELPER_STREAMS`, left running by `core.end`).
"""

from __future__ import annotations

from collections.abc import Iterable

from zerosim.engine.conditions import AllDone
from zerosim.engine.optimizer import (
    PostStep,
    begin_step,
    check_overflow_on_host,
    gpu_adam,
    host_allocation,
    offloaded_grad_norms,
    unscale_and_adam_on_cpu,
)
from zerosim.engine.rank import Gen, RankCore
from zerosim.engine.states import interleaved_gpu_state_bytes
from zerosim.hardware import costs
from zerosim.units import FP16_BYTES, FP32_BYTES
from zerosim.vocabulary import Category, OpKind, Stream, UpdateDevice

STATE_COPIERS = {Stream.COPIER_PARAMS: "params", Stream.COPIER_EXP_AVG: "exp_avg",
                 Stream.COPIER_EXP_AVG_SQ: "exp_avg_sq"}
"""One copier per fp32 tensor a GPU sub-group brings in and sends back, and that tensor."""

HELPER_STREAMS = frozenset({Stream.CPU_DOWNSCALE, Stream.COPIER_FP16})
"""What the helper thread does and queues, which the step does not wait for after its last
wait on the 16-bit copier."""


class GpuGradients:
    """The boundary's gradients of the GPU-stepped sub-groups, kept in HBM from the backward
    to the step (stage3.py `partition_grads`: `prefetch_optimizer_gpu_fp32_grads`, despite its
    name allocated in the gradient accumulation dtype, 16-bit unless `grad_accum_dtype` says
    fp32), then cast to fp32 as the sub-group's gradient for its Adam (`opt_transfers`)."""

    def __init__(self, core: RankCore):
        self.core = core
        self.accumulated: dict[int, int] = {}
        """Per GPU sub-group, its buffer in the accumulation dtype (the backward's copies)."""
        self.fp32: dict[int, int] = {}
        """Per GPU sub-group, its fp32 gradient (from the cast until the next one replaces
        it)."""

    def receive(self, group: int, elements: int) -> Gen:
        """`gpu_fp32_grad_tensor.copy_(grad_buffer)`: a copy within HBM, both sides in the
        accumulation dtype; the first gradient of a sub-group allocates the sub-group's
        buffer."""
        core = self.core
        if group not in self.accumulated:
            self.accumulated[group] = core.gpu.allocate(
                Category.BOUNDARY_GRAD_BUFFER, core.accum_bytes * core.plan.subgroups[group],
                f"grads of GPU sub-group {group}")
        yield from core.gpu_kernel(core.hbm_seconds(core.accum_bytes * elements),
                                   core.reduction_stream)

    def to_fp32(self, group: int) -> Gen:
        """`.grad = prefetch_optimizer_gpu_fp32_grads[group].to(torch.float32)`, then `del`
        of the buffer: a cast on the default stream into a new fp32 tensor (the host's
        `cudaMalloc` where the step emptied the cache), the buffer freed once it has run; an
        fp32 buffer is the gradient as it is (`.to` returns it)."""
        core = self.core
        if group not in self.accumulated:
            return
        elements = core.plan.subgroups[group]
        if core.accum_bytes == FP32_BYTES:
            self.fp32[group] = self.accumulated.pop(group)
            return
        yield from host_allocation(core, FP32_BYTES * elements)
        self.fp32[group] = core.gpu.allocate(Category.FP32_GRADS_GPU, FP32_BYTES * elements,
                                             f"fp32 grads of GPU sub-group {group}")
        cast = core.hbm_op(core.compute, f"grads→fp32 sub-group {group}", OpKind.CAST,
                           (core.accum_bytes + FP32_BYTES) * elements, passes=1.0)
        buffer = self.accumulated.pop(group)
        core.release_device_memory(buffer)
        core.when_done(cast, lambda: core.gpu.free(Category.BOUNDARY_GRAD_BUFFER, buffer))

    def release(self, group: int) -> None:
        """`prefetch_optimizer_gpu_fp32_params.grad = None`: the sub-group's fp32 gradient,
        back to the CUDA cache."""
        if group in self.fp32:
            category = (Category.BOUNDARY_GRAD_BUFFER if self.core.accum_bytes == FP32_BYTES
                        else Category.FP32_GRADS_GPU)
            held = self.fp32.pop(group)
            self.core.gpu.free(category, held)
            self.core.release_device_memory(held)

    def release_all(self) -> None:
        """The step's end. Where the last GPU sub-group is the last sub-group of all, its
        fp32 gradient outlives the step in the fork (no later sub-group sets `.grad = None`;
        the next step's first move replaces it): the model states count it from the start
        of the run (`states.model_states`), and `InterleavedStep` frees that count when the
        next move replaces it, so this one stays, as the model states' (in their category).
        Every other is freed."""
        core = self.core
        last = core.plan.last_interleaved_gpu_group
        if core.plan.interleaved_grad_outlives_step and last in self.fp32:
            kept = self.fp32.pop(last)
            if core.accum_bytes == FP32_BYTES:
                core.gpu.free(Category.BOUNDARY_GRAD_BUFFER, kept)
                core.gpu.allocate(Category.FP32_GRADS_GPU, kept, f"fp32 grads of GPU sub-group "
                                  f"{last}")
        for group in list(self.fp32):
            self.release(group)
        for group in list(self.accumulated):
            core.gpu.free(Category.BOUNDARY_GRAD_BUFFER, self.accumulated.pop(group))


class InterleavedStep:
    def __init__(self, core: RankCore, groups: tuple[int, ...], post_step: PostStep,
                 gradients: GpuGradients):
        self.core = core
        self.groups = groups
        self.post_step = post_step
        self.gradients = gradients
        self.devices = core.plan.interleaved
        last = core.plan.last_interleaved_gpu_group
        self.buffer_elements = 0 if last is None else groups[last]
        """The size of the GPU fp32 params, exp_avg and exp_avg_sq (`opt_transfers`): the
        last GPU sub-group's, as the previous step left them (`states.model_states`)."""
        self.buffer_bytes = round(interleaved_gpu_state_bytes(self.buffer_elements))
        self.carried_grad = (round(FP32_BYTES * self.buffer_elements)
                             if core.plan.interleaved_grad_outlives_step else 0)
        """The previous step's last fp32 gradient, on those params until replaced."""
        self.stale: list[tuple[int, int]] = []
        """Buffers (state bytes, gradient bytes) replaced by a GPU sub-group of another size,
        alive until that sub-group's step drops them from the backup optimizer."""

    def run(self) -> Gen:
        core = self.core
        yield from begin_step(core, lambda: check_overflow_on_host(core),
                              lambda: offloaded_grad_norms(core))
        to_downscale: list[int] = []
        for group, elements in enumerate(self.groups):
            device = self.devices[group]
            if device is UpdateDevice.GPU:
                yield from self._wait(STATE_COPIERS)
                self._drop_stale()
                yield from gpu_adam(core, group, elements, costs.TORCH_ADAMW, cast_bytes=0)
                continue
            if device is UpdateDevice.CPU_PREFETCH:
                yield from self._move_states(group)
                yield from self._wait((Stream.COPIER_FP16,))
            yield from unscale_and_adam_on_cpu(core, group, elements)
            to_downscale.append(group)
            if group + 1 == len(self.groups) or self.devices[group + 1] is UpdateDevice.GPU:
                self._downscale(tuple(to_downscale))
                to_downscale = []
        yield from self._wait((Stream.COPIER_FP16,))
        self.gradients.release_all()
        yield from self.post_step(core)
        yield from core.end(left_running=HELPER_STREAMS)

    def _wait(self, streams: Iterable[Stream]) -> Gen:
        """`async_copier.wait()`: the thread blocks until what the copier has queued is done."""
        pending = [e for s in streams if (e := self.core.stream(s).idle_event()) is not None]
        if pending:
            yield AllDone(self.core.env, pending)

    def _neighbour_on_gpu(self, group: int, step: int) -> int | None:
        """`get_prev_next_subgroup_on_gpu`: the nearest GPU sub-group before (step -1) or
        after (step +1) `group`."""
        g = group
        while 0 <= g < len(self.groups):
            if self.devices[g] is UpdateDevice.GPU:
                return g
            g += step
        return None

    def _move_states(self, group: int) -> Gen:
        """`opt_transfers`: the previous GPU sub-group's 16-bit partition written on the GPU
        and its state sent back, then the next one's state brought in."""
        core = self.core
        previous = self._neighbour_on_gpu(group, -1)
        following = self._neighbour_on_gpu(group, +1)
        if previous is not None:
            self.gradients.release(previous)
            size = self.groups[previous]
            core.hbm_op(core.compute, f"fp32→16-bit sub-group {previous}", OpKind.CAST,
                        (FP32_BYTES + core.dtype_bytes) * size, passes=1.0)
            self._copy_each("d2h", previous, OpKind.STATE_TO_HOST)
        if following is not None:
            yield from self._fit_buffers(following)
            yield from self.gradients.to_fp32(following)
            if self.carried_grad:
                core.gpu.free(Category.FP32_GRADS_GPU, self.carried_grad)
                core.release_device_memory(self.carried_grad)
                self.carried_grad = 0
            self._copy_each("h2d", following, OpKind.STATE_TO_GPU)

    def _fit_buffers(self, group: int) -> Gen:
        """`opt_transfers` makes new GPU fp32 params, exp_avg and exp_avg_sq when the next
        GPU sub-group's size differs from theirs (the host's `cudaMalloc` where the step
        emptied the cache); the old ones (with the gradient they carry) stay referenced by the
        backup optimizer until that sub-group's step (`_drop_stale`)."""
        elements = self.groups[group]
        if elements == self.buffer_elements:
            return
        nbytes = interleaved_gpu_state_bytes(elements)
        yield from host_allocation(self.core, nbytes)
        fresh = self.core.gpu.allocate(Category.OPTIMIZER_STATES_GPU, nbytes,
                                       f"fp32 params, exp_avg, exp_avg_sq of GPU sub-group "
                                       f"{group}")
        self.stale.append((self.buffer_bytes, self.carried_grad))
        self.buffer_elements, self.buffer_bytes, self.carried_grad = elements, fresh, 0

    def _drop_stale(self) -> None:
        """A GPU sub-group's step deletes the backup optimizer's old param and state."""
        for states, grad in self.stale:
            self.core.gpu.free(Category.OPTIMIZER_STATES_GPU, states)
            self.core.gpu.free(Category.FP32_GRADS_GPU, grad)
            self.core.release_device_memory(states + grad)
        self.stale = []

    def _copy_each(self, direction: str, group: int, kind: OpKind) -> None:
        core = self.core
        nbytes = FP32_BYTES * self.groups[group]
        for stream, tensor in STATE_COPIERS.items():
            core.stream(stream).launch(
                f"{tensor} {direction} sub-group {group}",
                lambda: core.dma(direction, nbytes, pinned=True,
                                 op=f"state sub-group {group}", kind=kind),
                kind=kind, nbytes=nbytes)

    def _downscale(self, groups: tuple[int, ...]) -> None:
        """`downsample_fp32_fp16` on the helper thread (one op per sub-group on its track):
        `.half()` into a fresh 16-bit tensor (its pages faulted in by the cast's threads), a
        copy into a pinned buffer, and the H2D queued on the 16-bit copier."""
        for group in groups:
            elements = self.groups[group]
            self.core.stream(Stream.CPU_DOWNSCALE).launch(
                f"fp32→16-bit sub-group {group}", lambda g=group: self._downscale_one(g),
                kind=OpKind.CAST, nbytes=FP16_BYTES * elements)

    def _downscale_one(self, group: int) -> Gen:
        """Each of the helper's statements (the `.half()`, the copy into the pinned buffer,
        the copier's `copy`) starts only when the rank's thread is not inside CPU Adam,
        which holds the GIL (`RankCore.gil`); once started, PyTorch's op runs on with the GIL
        released."""
        core, m = self.core, self.core.machine
        elements = self.groups[group]
        threads = core.profile.cast_threads
        temp_bytes = FP16_BYTES * elements
        yield from core.gil.acquire()
        temp = core.host.allocate(Category.PAGEABLE_TEMPORARIES, temp_bytes,
                                  f"sub-group {group} .half()")
        yield from core.zero_fresh_pages(temp_bytes, threads=threads, where=costs.SPREAD_PAGES)
        yield from m.elementwise(core.rank, elements,
                                 costs.HostBytes(home=FP32_BYTES, spread=FP16_BYTES),
                                 threads=threads)
        yield from core.gil.acquire()
        yield from m.elementwise(core.rank, elements,
                                 costs.HostBytes(home=FP16_BYTES, spread=FP16_BYTES),
                                 threads=threads)
        core.host.free(Category.PAGEABLE_TEMPORARIES, temp)
        yield from core.gil.acquire()
        core.stream(Stream.COPIER_FP16).launch(
            f"16-bit h2d sub-group {group}",
            lambda: core.dma("h2d", temp_bytes, pinned=True, op=f"params sub-group {group}",
                             kind=OpKind.PARAM_COPY_BACK),
            kind=OpKind.PARAM_COPY_BACK, nbytes=temp_bytes)
