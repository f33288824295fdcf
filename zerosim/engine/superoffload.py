"""SuperOffload (DeepSpeed 0.18.0+, `offload_optimizer.super_offload`) for ZeRO-3 with the
optimizer on the CPU, as superoffload_stage3.py and superoffload_utils.py run it from 0.18.9
(PR #7906, `superoffload_shared_buffers`), and as 0.18.0 to 0.18.8 did (at the end).

The rank starts an optimizer process (`superoffload_optimizer_worker`) on the last
`cpuadam_cores_perc` of its CPUs (`costs.superoffload_worker_threads`): a DeepSpeedCPUAdam that
takes one sub-group at a time from a queue, copies its fp32 gradient into a pinned buffer of
its own and steps it. Handing a sub-group over pickles its fp32 params and gradient through a
`torch.multiprocessing` queue, which moves their storage into shared memory the first time
(`share_memory_`): from the second step on, the steady state zerosim replays, both are
pageable shared memory (`states._fp32_gradients`).

Boundary backward (`partition_grads`): each gradient partition is cast on the GPU and copied
into its sub-group's fp32 gradient with `non_blocking=True`, which into shared memory runs at
the pageable rate with the host waiting (`sinks.BoundaryFlush`); once a bucket has completed a
sub-group, the host synchronises the stream and, without gradient clipping, hands each
completed CPU sub-group to the process (`SubGroupHandOff`), which steps it while the backward
goes on (`AdamWorker`).

Step (`SuperOffloadStep`): the host waits for the process to finish (polling its result queue
with 1 ms sleeps), then the usual overflow check and norms, then per sub-group the unscale
(on the fp32 gradient the process has already used: it runs all the same), Twin-Flow's GPU
step for GPU sub-groups, and the blocking copy-back of each CPU sub-group into the 16-bit
partition. With `gradient_clipping` set nothing is stepped early: each CPU sub-group is
unscaled, handed over and waited for in the step, one after another (`_step_with_clipping`).

Up to 0.18.8 a bucket holds one sub-group (`gradients.SubGroupBuckets`), concatenated and cast
on the GPU at the boundary and handed over at once as a CUDA tensor, whatever the clipping,
which the process copies D2H itself (`sinks.ConcatenatedSubGroups`); the gradients stay
pinned, and the step writes no CPU sub-group back into the 16-bit partition.
"""

from __future__ import annotations

import math
from collections import Counter

import simpy

from zerosim.engine.gradients import BucketEntry
from zerosim.engine.optimizer import (
    CopyBack,
    OverflowCheck,
    PostStep,
    begin_step,
    cpu_adam,
    gpu_adam,
    offloaded_grad_norms,
)
from zerosim.engine.rank import Gen, RankCore
from zerosim.engine.sinks import ConcatenatedSubGroups
from zerosim.engine.software import SUPEROFFLOAD_POLL_S
from zerosim.hardware import costs
from zerosim.units import FP32_BYTES
from zerosim.vocabulary import Category, OpKind, Stream


class AdamWorker:
    """The optimizer process: each handed-over sub-group in turn, its fp32 gradient copied into
    the process's pinned buffer (`param_grad_cpu.copy_`), then `step_subgroup`
    (DeepSpeedCPUAdam), on the process's `threads`. From 0.18.9 the gradient is copied out of
    shared memory on the process's threads; up to 0.18.8 it came as a CUDA tensor
    (`gradients`: the sink holding each sub-group's fp32 copy on the GPU), which the process
    copies D2H itself, freeing the GPU copy. It shares the node's cores and host memory with
    the ranks' own work; the process's OpenMP team is taken to be one thread per CPU it was
    given."""

    def __init__(self, core: RankCore, threads: int,
                 gradients: ConcatenatedSubGroups | None = None):
        self.core = core
        self.threads = threads
        self.gradients = gradients
        self.last: simpy.Event | None = None
        """The last handed-over sub-group's step (the queue runs in order)."""

    def submit(self, group: int, elements: int, after: simpy.Event | None = None) -> None:
        """`async_step`: queue the sub-group (from 0.18.9 its tensors are already in shared
        memory: nothing to copy on the host's side); `after`: what its gradient's GPU copy
        waits for."""
        self.last = self.core.env.process(self._step(group, elements, self.last, after))

    def _step(self, group: int, elements: int, before: simpy.Event | None,
              after: simpy.Event | None) -> Gen:
        for event in (before, after):
            if event is not None and event.callbacks is not None:
                yield event
        core, m = self.core, self.core.machine
        if self.gradients is not None:
            yield from core.dma("d2h", FP32_BYTES * elements, pinned=True,
                                op=f"fp32 grad sub-group {group} (optimizer process)",
                                kind=OpKind.GRAD_FLUSH)
            core.gpu.free(Category.GRAD_PARTITIONS, self.gradients.held.pop(group))
        else:
            yield from core.cpu_work(
                f"copy fp32 grad sub-group {group}", OpKind.GRAD_FLUSH,
                m.elementwise(core.rank, elements, costs.SUPEROFFLOAD_GRAD_COPY_HOST_BYTES,
                              threads=self.threads),
                nbytes=FP32_BYTES * elements, track=Stream.CPU_SUPEROFFLOAD)
        yield from core.cpu_work(f"cpu adam sub-group {group}", OpKind.OPTIMIZER_STEP,
                                 cpu_adam(m, core.rank, elements, threads=self.threads),
                                 track=Stream.CPU_SUPEROFFLOAD)

    def wait(self) -> Gen:
        """`_wait_for_async_operations`, `_wait_for_single_async_result`: the host takes the
        results off the queue, sleeping `SUPEROFFLOAD_POLL_S` whenever it finds none, so it
        sees the last one at its first wake-up after the process has put it there."""
        if self.last is None or self.last.callbacks is None:
            return
        since = self.core.env.now
        yield self.last
        waited = self.core.env.now - since
        late = math.ceil(waited / SUPEROFFLOAD_POLL_S) * SUPEROFFLOAD_POLL_S - waited
        if late > 0:
            yield self.core.env.timeout(late)


class SubGroupHandOff:
    """The end of SuperOffload's `partition_grads` at the boundary: the sub-groups whose last
    gradient partition the bucket moved are complete. From 0.18.9 (`synchronises`), if any
    is, the host synchronises the stream it partitions on (`current_stream().synchronize()`)
    and, without gradient clipping, hands each complete CPU sub-group to the optimizer
    process; up to 0.18.8 it hands them over at once, whatever the clipping, the process's
    copy of each gradient waiting for the GPU's cast."""

    def __init__(self, core: RankCore, worker: AdamWorker, *, early: bool, synchronises: bool):
        self.core = core
        self.worker = worker
        self.early = early
        """Sub-groups are stepped as they complete (no `gradient_clipping`, or a release
        before 0.18.9)."""
        self.synchronises = synchronises
        plan = core.plan
        self.missing = Counter(plan.group_of(p) for p in plan.all_params)
        """Gradient partitions each sub-group still waits for in the boundary backward."""

    def after_partition(self, bucket: list[BucketEntry], moved: simpy.Event,
                        boundary: bool) -> Gen:
        if not boundary:
            return
        plan = self.core.plan
        complete = []
        for entry in bucket:
            group = plan.group_of(entry.param)
            self.missing[group] -= 1
            if not self.missing[group]:
                complete.append(group)
        if not complete:
            return
        if self.synchronises and moved.callbacks is not None:
            yield moved
        if not self.early:
            return
        after = None if self.synchronises else moved
        for group in complete:
            if group not in plan.gpu_subgroups:
                self.worker.submit(group, plan.subgroups[group], after)


class SuperOffloadStep:
    """SuperOffload's `step`: the wait for the optimizer process, the overflow check and norms,
    then sub-group by sub-group the unscale, the GPU step of Twin-Flow's GPU sub-groups, with
    clipping (0.18.9+) the CPU sub-group's hand-over and wait, and from 0.18.9 (`writes_back`)
    the copy-back; up to 0.18.8 `_reassign_or_swap_out_partitioned_parameters` only re-views
    a CPU sub-group's 16-bit partition, and the step assumes the norm does not clip (a clip
    rolls back and re-steps every CPU sub-group, which depends on the data)."""

    def __init__(self, core: RankCore, groups: tuple[int, ...], copy_back: CopyBack,
                 post_step: PostStep, worker: AdamWorker, check_overflow: OverflowCheck, *,
                 early: bool, writes_back: bool):
        self.core = core
        self.groups = groups
        self.copy_back = copy_back
        self.post_step = post_step
        self.worker = worker
        self.check_overflow = check_overflow
        self.early = early
        self.writes_back = writes_back

    def run(self) -> Gen:
        core = self.core
        yield from begin_step(core, lambda: self.check_overflow(core),
                              lambda: offloaded_grad_norms(core), first=self.worker.wait)
        for group, elements in enumerate(self.groups):
            if group in core.plan.gpu_subgroups:
                yield from gpu_adam(core, group, elements, costs.TORCH_ADAMW)
                continue
            yield from core.cpu_work(
                f"unscale sub-group {group}", OpKind.UNSCALE,
                core.machine.elementwise(core.rank, elements, costs.UNSCALE_HOST_BYTES))
            if not self.early:
                self.worker.submit(group, elements)
                yield from self.worker.wait()
            if self.writes_back:
                yield from self.copy_back(core, group, elements, Stream.CPU)
        yield from self.post_step(core)
        yield from core.end()
