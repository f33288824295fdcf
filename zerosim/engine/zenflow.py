"""ZenFlow (DeepSpeed 0.17.5+, `zero_optimization.zenflow`) for ZeRO-1/2 with the optimizer
on the CPU, as zenflow_stage_1_and_2.py, zenflow/engine.py and zenflow_torch_adam.py do it.

DeepSpeed makes `update_interval` the run's gradient accumulation (`configure_zenflow`), so one
replayed iteration is a window of that many training steps, each a micro-batch here, ending at
the optimizer boundary. Each step's backward is ZeRO-1/2's with the optimizer offloaded (the
host accumulator of `sinks.HostAccumulation` included) plus, after every bucket's reduction
(`average_tensor`), `SelectiveUpdate.after_reduce`: the top-k gradient columns of the bucket
gathered by their owner, broadcast to every rank, and stepped on the GPU by a torch AdamW in
the params' 16-bit dtype (`group_step`), or at the boundary kept for the step.

The boundary's step is `OverlappedStep` with `overlap_step` (ZenFlowZeroOptimizerParallel):
the host waits for the optimizer process to finish the previous window's update, copies that
update back into the 16-bit partition and all-gathers it, unscales this window's gradients on
the CPU and hands them to the process; then `selective_optimizer_step` steps every selected
column on the GPU. The process (`Worker`) steps them while the next window runs. In the steady
state a window replays, the update it waits for is the previous window's, started as the
window began: zerosim runs that one from the iteration's start on the worker's cores, where its
host-memory traffic meets the window's copies and CPU work. Without `overlap_step`
(ZenFlowZeroOptimizerSequential) the boundary's CPU step is ZeRO-1/2's own (`CpuStep`), then
the selective step.
"""

from __future__ import annotations

import math

import simpy

from zerosim.engine.gradients import BucketEntry
from zerosim.engine.optimizer import (
    CopyBack,
    PostStep,
    begin_step,
    offloaded_grad_norms,
    read_backward_overflow_flag,
)
from zerosim.engine.rank import Gen, RankCore
from zerosim.engine.software import (
    ZENFLOW_ADAMW_LAUNCHES_AFTER_SYNC,
    ZENFLOW_ADAMW_LAUNCHES_BEFORE_SYNC,
    ZENFLOW_STEP_COUNT_READS,
)
from zerosim.engine.streams import InOrderStream, NcclQueue
from zerosim.hardware import costs
from zerosim.scenario.deepspeed import ZenFlowSettings
from zerosim.vocabulary import Category, Collective, OpKind, Phase, Stream

GATHER_PASSES = 2.0
"""A gather or a copy: read the bytes, write them."""


class SelectiveUpdate:
    """ZenFlow's GPU side: `_process_selected_fp32_groups_grad` after each bucket's reduction
    and `selective_optimizer_step` at the boundary. Selections count `topk_ratio` of every
    gradient element (one-dimensional tensors, taken whole by ZenFlow, are a few in ten
    thousand of a transformer's)."""

    def __init__(self, core: RankCore, settings: ZenFlowSettings, nccl: NcclQueue):
        self.core = core
        self.settings = settings
        self.nccl = nccl
        """The data-parallel group's NCCL queue, where the reductions go (the broadcasts are
        on the same process group)."""
        self.held: list[tuple[Category, int]] = []
        """The selected gradients and saved columns the boundary's buckets leave for the
        step."""

    def selected(self, numel: float) -> float:
        return self.settings.topk_ratio * numel

    def _strided_s(self, nbytes: float, strided_nbytes: float) -> float:
        """HBM time of kernels moving `nbytes`, `strided_nbytes` of them gathers or scatters
        of scattered columns, at the strided rate."""
        return costs.hbm_s(nbytes + strided_nbytes, self.core.profile, strided_nbytes)

    def after_reduce(self, bucket: list[BucketEntry], stream: InOrderStream,
                     boundary: bool) -> Gen:
        """On the reduction's stream, after its reductions: each owner gathers its slice's
        selected rows and copies them into a flat buffer, broadcasts it (one call per owner:
        as many bytes per GPU as an all-gather of the whole selection), and every rank clones
        each parameter's share. Then at the boundary `temp_copy_param` saves each param's
        selected columns; before it, `group_step` steps them."""
        core, d = self.core, self.core.dtype_bytes
        params = len(bucket)
        selected = self.selected(sum(e.param.numel for e in bucket))
        owned = self.selected(sum(e.param.partition_numel for e in bucket))
        owners = sum(1 for e in bucket if e.param.partition_numel)
        yield from core.issue_kernels(2 * owners + params)
        core.launches += core.distributed * len(core.ranks)
        yield from core.pay_launches()
        gather_s = core.hbm_seconds(2 * GATHER_PASSES * d * owned, passes=1.0)
        clone_s = core.hbm_seconds(GATHER_PASSES * d * selected, passes=1.0)
        key = core.next_key(Collective.ALL_GATHER)
        turn = self.nccl.issue()
        held: dict[str, int] = {}

        def select() -> Gen:
            flat = core.gpu.allocate(Category.GRAD_PARTITIONS, d * selected,
                                     "ZenFlow's selected gradients (flat)")
            yield from core.gpu_kernel(gather_s, stream)
            yield from turn.wait()
            if core.distributed:
                yield from core.machine.collective(core.rank, key, Collective.ALL_GATHER,
                                                   d * selected, core.ranks,
                                                   OpKind.SELECTIVE_UPDATE)
            turn.done()
            clones = core.gpu.allocate(Category.GRAD_PARTITIONS, d * selected,
                                       "ZenFlow's selected gradients")
            yield from core.gpu_kernel(clone_s, stream)
            core.gpu.free(Category.GRAD_PARTITIONS, flat)
            held["clones"] = clones

        stream.launch(f"zenflow select {params} params", select,
                      kind=OpKind.SELECTIVE_UPDATE, nbytes=d * selected)
        if boundary:
            yield from self._save_columns(stream, params, selected, held)
        else:
            yield from self._group_step(stream, params, selected, held)

    def _save_columns(self, stream: InOrderStream, params: int, selected: float,
                      held: dict[str, int]) -> Gen:
        """`temp_copy_param`: each param's selected columns gathered and cloned; they and the
        selected gradients wait for the boundary's step."""
        core, d = self.core, self.core.dtype_bytes
        yield from core.issue_kernels(2 * params)
        seconds = self._strided_s(GATHER_PASSES * d * selected, GATHER_PASSES * d * selected)

        def save() -> Gen:
            saved = core.gpu.allocate(Category.WORKSPACE, d * selected,
                                      "ZenFlow's saved columns")
            yield from core.gpu_kernel(seconds, stream)
            self.held += [(Category.GRAD_PARTITIONS, held.pop("clones")),
                          (Category.WORKSPACE, saved)]

        stream.launch(f"zenflow save {params} params' columns", save,
                      kind=OpKind.SELECTIVE_UPDATE, nbytes=d * selected)

    def _group_step(self, stream: InOrderStream, params: int, selected: float,
                    held: dict[str, int]) -> Gen:
        """`group_step` over the bucket's params, on the reduction's stream: each param's
        selected columns gathered, the AdamW's first kernels, then its step counts read back
        (the host waits for the stream), the rest of the AdamW and the columns scattered back;
        the selected gradients go. With `offload` the moments come in from pinned host memory
        first and go back after."""
        core = self.core
        yield from core.issue_kernels(params + ZENFLOW_ADAMW_LAUNCHES_BEFORE_SYNC)
        before, after = self._adamw_halves(selected)
        moments = 2 * core.dtype_bytes * selected

        def first() -> Gen:
            if self.settings.offload:
                held["moments"] = core.gpu.allocate(Category.OPTIMIZER_STATES_GPU, moments,
                                                    "ZenFlow's moments (offloaded)")
                yield from core.dma("h2d", moments, pinned=core.pinned,
                                    op="zenflow moments", kind=OpKind.STATE_TO_GPU)
            yield from core.gpu_kernel(before, stream)

        stream.launch(f"zenflow adamw {params} params", first, kind=OpKind.SELECTIVE_UPDATE,
                      nbytes=core.dtype_bytes * selected)
        yield from core.wait_for_stream(stream, ZENFLOW_STEP_COUNT_READS * params)
        yield from core.issue_kernels(ZENFLOW_ADAMW_LAUNCHES_AFTER_SYNC + params)

        def second() -> Gen:
            yield from core.gpu_kernel(after, stream)
            if self.settings.offload:
                yield from core.dma("d2h", moments, pinned=core.pinned,
                                    op="zenflow moments", kind=OpKind.STATE_TO_HOST)
                core.gpu.free(Category.OPTIMIZER_STATES_GPU, held.pop("moments"))
            core.gpu.free(Category.GRAD_PARTITIONS, held.pop("clones"))

        stream.launch(f"zenflow adamw {params} params (after the step counts)", second,
                      kind=OpKind.SELECTIVE_UPDATE, nbytes=core.dtype_bytes * selected)

    def _adamw_halves(self, selected: float) -> tuple[float, float]:
        """GPU time of the selective AdamW before and after its step counts are read: the
        column gather and the first kernels; the rest and the scatter back."""
        d = self.core.dtype_bytes
        strided = GATHER_PASSES * d * selected
        before = costs.TORCH_ADAMW_PASSES_BEFORE_BIAS_CORRECTION * d * selected
        after = (costs.TORCH_ADAMW_PASSES - costs.TORCH_ADAMW_PASSES_BEFORE_BIAS_CORRECTION
                 ) * d * selected
        return self._strided_s(before, strided), self._strided_s(after, strided)

    def boundary_step(self) -> Gen:
        """`selective_optimizer_step` after the model step (engine.py `step`, `zenflow_step`):
        every param's selected columns gathered and overwritten with the saved ones, the
        AdamW over them all on the default stream (the host reading the step counts back),
        the columns scattered back; the saved columns and selected gradients go."""
        core = self.core
        params = len(core.plan.all_params)
        selected = self.selected(sum(p.numel for p in core.plan.all_params))
        d = core.dtype_bytes
        before, after = self._adamw_halves(selected)
        restore = core.hbm_seconds(GATHER_PASSES * d * selected, passes=1.0)
        yield from core.issue_kernels(2 * params + ZENFLOW_ADAMW_LAUNCHES_BEFORE_SYNC)
        core.compute.launch("zenflow step: columns and adamw", core.gpu_time(
            restore + before, core.compute), kind=OpKind.SELECTIVE_UPDATE, nbytes=d * selected)
        yield from core.wait_for_stream(core.compute, ZENFLOW_STEP_COUNT_READS * params)
        yield from core.issue_kernels(ZENFLOW_ADAMW_LAUNCHES_AFTER_SYNC + params)
        held, self.held = self.held, []

        def finish() -> Gen:
            yield from core.gpu_kernel(after, core.compute)
            for category, amount in held:
                core.gpu.free(category, amount)

        core.compute.launch("zenflow step: adamw (after the step counts)", finish,
                            kind=OpKind.SELECTIVE_UPDATE, nbytes=d * selected)


class Worker:
    """ZenFlow's optimizer process (`zenflow_optimizer_process`): DeepSpeedCPUAdam over the
    rank's fp32 partition, one parameter group after another, on its own cores
    (`costs.zenflow_worker_threads`), then the fp32 snapshot the next boundary copies back.
    Up to DeepSpeed 0.19.2 a Python process: the Adam's OpenMP regions, then
    `stale_param.copy_(p.data.clone())` (the clone's fresh pages zeroed by the kernel); from
    0.19.3 a native pool that writes the snapshot as it steps."""

    def __init__(self, core: RankCore, groups: tuple[int, ...], threads: int):
        self.core = core
        self.groups = groups
        self.threads = threads
        self.native = core.behaviours.zenflow_native_worker
        self.done: simpy.Event | None = None

    def start(self) -> None:
        """The previous window's update, submitted as this window began."""
        self.done = self.core.env.process(self._update())

    def wait(self) -> Gen:
        """`wait_last_update_and_copy`: the host blocks until the process is done."""
        if self.done is not None and self.done.callbacks is not None:
            yield self.done

    def _update(self) -> Gen:
        core, m = self.core, self.core.machine
        tag = (Phase.UPDATE._value_, core.ds.gradient_accumulation_steps - 1)
        for group, elements in enumerate(self.groups):
            host = costs.ADAM_HOST_BYTES
            if self.native:
                host = costs.HostBytes(home=host.home + costs.ZENFLOW_NATIVE_STALE_HOST_BYTES.home,
                                       spread=host.spread)
            regions = 0 if self.native else math.ceil(elements / costs.CPU_ADAM_TILE_ELEMENTS)
            yield from core.cpu_work(
                f"cpu adam sub-group {group} (previous window)", OpKind.OPTIMIZER_STEP,
                m.cpu_kernel(core.rank, elements, host=host,
                             elements_per_s_per_thread=core.profile.adam_params_per_s_per_thread,
                             threads=self.threads, regions=regions),
                track=Stream.CPU_ZENFLOW, tag=tag)
            if not self.native:
                yield from core.cpu_work(f"stale snapshot sub-group {group}", OpKind.CAST,
                                         self._snapshot(elements), track=Stream.CPU_ZENFLOW,
                                         tag=tag)

    def _snapshot(self, elements: int) -> Gen:
        """`stale_param.copy_(p.data.clone())` on the process's threads."""
        core = self.core
        nbytes = costs.FP32_BYTES * elements
        temp = core.host.allocate(Category.PAGEABLE_TEMPORARIES, nbytes,
                                  "ZenFlow's clone of the stepped partition")
        yield from core.zero_fresh_pages(nbytes, threads=self.threads,
                                         where=costs.SPREAD_PAGES)
        yield from core.machine.elementwise(core.rank, elements,
                                            costs.ZENFLOW_STALE_COPY_HOST_BYTES,
                                            threads=self.threads)
        core.host.free(Category.PAGEABLE_TEMPORARIES, temp)


class OverlappedStep:
    """ZenFlowZeroOptimizerParallel's `step` at the window's boundary, then the engine's
    `zenflow_step`: the gradients' norms (`scaled_global_norm`), the wait for the optimizer
    process, the copy-back of its update into the 16-bit partition (`copy_back`, by release)
    and the all-gather (`post_step`), the unscale of this window's gradients on the rank's
    pool (`zenflow_cpu_optimizer_step`; the submit costs nothing), then the selective step."""

    def __init__(self, core: RankCore, groups: tuple[int, ...], copy_back: CopyBack,
                 post_step: PostStep, worker: Worker, selective: SelectiveUpdate):
        self.core = core
        self.groups = groups
        self.copy_back = copy_back
        self.post_step = post_step
        self.worker = worker
        self.selective = selective

    def run(self) -> Gen:
        core = self.core
        yield from begin_step(core, lambda: read_backward_overflow_flag(core),
                              lambda: offloaded_grad_norms(core))
        yield from self.worker.wait()
        for group, elements in enumerate(self.groups):
            yield from self.copy_back(core, group, elements, Stream.CPU)
        yield from self.post_step(core)
        for group, elements in enumerate(self.groups):
            yield from core.cpu_work(
                f"unscale sub-group {group}", OpKind.UNSCALE,
                core.machine.elementwise(core.rank, elements, costs.UNSCALE_HOST_BYTES))
        yield from self.selective.boundary_step()
        yield from core.end()


def then_selective_step(post_step: PostStep, selective: SelectiveUpdate) -> PostStep:
    """ZeRO-1/2's post-step gather, then ZenFlow's selective step (engine.py `step` runs
    `zenflow_step` after the model step): the sequential ZenFlow's step."""
    def run(core: RankCore) -> Gen:
        yield from post_step(core)
        yield from selective.boundary_step()
    return run
