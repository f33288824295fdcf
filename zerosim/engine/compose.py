"""Pick a rank program's parts from the scenario: the one place that knows which part serves
which ZeRO stage and offload target.

| part                  | chosen by                    | variants                                  |
|-----------------------|------------------------------|-------------------------------------------|
| parameter coordinator | stage; offload_param.device  | replicated; partitioned from HBM, host or |
|                       |                              | NVMe                                      |
| gradient path         | stage                        | boundary all-reduce (0); IPG buckets      |
| gradient sink         | stage; offload_optimizer     | host partitions (3); host accumulation    |
|                       |                              | (1/2); GPU partitions (no offload)        |
| boundary flush        | DeepSpeed behaviours; fork   | CPU cast; GPU cast (blocking or not);     |
|                       | options; super_offload       | kept in HBM (interleaved GPU sub-groups); |
|                       |                              | GPU cast into shared memory; a sub-group  |
|                       |                              | concatenated and cast on the GPU          |
| accumulation boundary | managed_gradient_accumulation| the last backward; step() (unmanaged:     |
|                       |                              | ZeRO-3's offloaded flush opens the step)  |
| buckets               | super_offload (to 0.18.8)    | by reduce_bucket_size; one per sub-group  |
| collectives per call  | stage; DeepSpeed behaviours  | coalesced; one per tensor (ZeRO-3 < 0.6)  |
| optimizer step        | offload_optimizer            | CPU (sub-groups or one group); GPU        |
|                       | (optimizer.params.torch_adam;| (FusedAdam or torch AdamW; each group     |
|                       | offload_param; zenflow;      | written back to host params); interleaved |
|                       | super_offload)               | CPU/GPU (Deep Optimizer States            |
|                       |                              | `prefetch_optimizer`); ZenFlow's step,    |
|                       |                              | overlapped with its optimizer process;    |
|                       |                              | SuperOffload's, its process stepping      |
|                       |                              | sub-groups during the backward            |
| after each reduction  | zenflow                      | nothing; ZenFlow's selective update       |
| after each partition  | super_offload; mics_shard_   | nothing; SuperOffload's hand-over of the  |
|                       | size                         | sub-groups a bucket completes; MiCS's     |
|                       |                              | all-reduce across the replicas (boundary) |
| optimizer state store | offload_optimizer.device     | in memory; swapped to NVMe                |
| overflow check (CPU   | stage                        | over the host's 16-bit gradients (3); the |
| step)                 |                              | flag the backward's GPU checks set (1/2)  |
| copy-back             | offload_param; stage;        | CPU cast + H2D; fp32 H2D + GPU cast       |
|                       | DeepSpeed behaviours;        | (ZeRO-1/2 0.14.1-0.16; ZenFlow's, pageable|
|                       | zenflow; master dtype        | to 0.19.2); CPU cast into a 16-bit host   |
|                       |                              | buffer + H2D (ZeRO-1/2 from 0.17.0); cast |
|                       |                              | into host params (and swap out to NVMe);  |
|                       |                              | H2D of bf16 master params                 |
| post-step gather      | stage                        | persistent params (3); all params (1/2)   |
| NCCL queues           | stack `process_groups`;      | one for the all-gathers and one for the   |
|                       | mics_shard_size              | gradient reductions; one for both         |
| model states          | stage; offloads              | `states.model_states`                     |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from zerosim.engine.gradients import (
    BoundaryAllReduce,
    GradientPath,
    IpgBuckets,
    SubGroupBuckets,
)
from zerosim.engine.interleaved import GpuGradients, InterleavedStep
from zerosim.engine.mics import ReplicaAllReduce
from zerosim.engine.optimizer import (
    CopyBack,
    CpuStep,
    GpuStep,
    PostStep,
    allgather_updated,
    cast_into_16bit_buffer_then_upload,
    cast_into_host_params,
    cast_then_upload,
    check_overflow_on_host,
    download_into_host_params,
    nothing_to_gather,
    read_backward_overflow_flag,
    regather_persistent,
    upload_fp32_then_cast_on_gpu,
    upload_master_partition,
)
from zerosim.engine.params import (
    ParameterCoordinator,
    PartitionedParams,
    PartitionsInHbm,
    PartitionsInHost,
    ReplicatedParams,
)
from zerosim.engine.plan import update_groups
from zerosim.engine.program import OptimizerStep, RankProgram
from zerosim.engine.quantized_gradients import QuantizedGradientReduction
from zerosim.engine.rank import Gen, RankCore, RunContext
from zerosim.engine.sinks import (
    BoundaryFlush,
    ConcatenatedSubGroups,
    GpuPartitions,
    HostAccumulation,
    HostPartitions,
)
from zerosim.engine.states import model_states
from zerosim.engine.streams import NcclQueue
from zerosim.engine.superoffload import AdamWorker, SubGroupHandOff, SuperOffloadStep
from zerosim.engine.swapping import (
    InMemoryStates,
    OptimizerSwapper,
    PartitionsOnNvme,
    cast_into_host_or_swap_out,
)
from zerosim.engine.zenflow import OverlappedStep, SelectiveUpdate, Worker, then_selective_step
from zerosim.hardware import costs
from zerosim.vocabulary import Collective


def build_rank(ctx: RunContext, rank: int) -> RankProgram:
    core = RankCore(ctx, rank)
    states = OptimizerSwapper(core) if core.plan.nvme_subgroups else InMemoryStates()
    gpu_gradients = GpuGradients(core) if core.plan.interleaved else None
    gathers = NcclQueue(core.env)
    reductions = gathers if _one_nccl_stream(core) else NcclQueue(core.env)
    zenflow = _zenflow(core, reductions)
    superoffload = _superoffload(core)
    params = _params(core, gathers)
    gradients = _gradients(core, states, gpu_gradients, reductions, zenflow, superoffload)
    return RankProgram(core, params, gradients,
                       _optimizer(core, states, gpu_gradients, zenflow, superoffload,
                                  _post_step(core, params), _deferred_boundary(core, gradients)),
                       model_states(core.ds, core.plan, core.profile, core.behaviours,
                                    ctx.scenario.stack),
                       background=(zenflow.worker.start,) if zenflow and zenflow.worker else ())


def _deferred_boundary(core: RankCore, gradients: GradientPath) -> Callable[[], Gen] | None:
    """Unmanaged accumulation (`managed_gradient_accumulation: false`): what step() does
    first, the boundary's work the offloaded sink deferred (`HostPartitions.finalize` at
    ZeRO-3, `HostAccumulation.finalize` at ZeRO-2); nothing elsewhere (without offload there
    is none)."""
    if core.ds.managed_accumulation:
        return None
    sink = getattr(gradients, "sink", None)
    return sink.finalize if isinstance(sink, HostPartitions | HostAccumulation) else None


def _one_nccl_stream(core: RankCore) -> bool:
    """Whether the all-gathers and the gradient reductions share one process group, so one
    NCCL stream: as the stack's training script makes the groups, but with MiCS, whose
    optimizer takes the parameters' shard group for its reductions, on every stack, unless
    its hierarchical gather runs the all-gathers on its groups across and within the
    nodes."""
    mics = core.ds.mics
    if mics.acts(core.ds.stage):
        return not mics.hierarchical
    return core.ctx.scenario.stack.one_process_group


@dataclass(frozen=True)
class ZenFlowParts:
    """ZenFlow's parts (`zenflow.py`): its GPU work after each reduction and at the step, and
    with `overlap_step` the optimizer process."""

    selective: SelectiveUpdate
    worker: Worker | None


def _zenflow(core: RankCore, reductions: NcclQueue) -> ZenFlowParts | None:
    settings = core.ds.zenflow
    if settings is None:
        return None
    threads = core.ctx.scenario.zenflow_worker_threads()
    worker = (Worker(core, update_groups(core.plan, core.ds.stage), threads)
              if threads is not None else None)
    return ZenFlowParts(SelectiveUpdate(core, settings, reductions), worker)


@dataclass(frozen=True)
class SuperOffloadParts:
    """SuperOffload's parts (`superoffload.py`): its optimizer process, the hand-over of the
    sub-groups each boundary bucket completes and, up to DeepSpeed 0.18.8, the partition of
    whole sub-groups concatenated on the GPU (`concatenated`; from 0.18.9 ZeRO-3's host
    partitions, into shared memory)."""

    worker: AdamWorker
    hand_off: SubGroupHandOff
    concatenated: ConcatenatedSubGroups | None

    @property
    def early(self) -> bool:
        return self.hand_off.early


def _superoffload(core: RankCore) -> SuperOffloadParts | None:
    threads = core.ctx.scenario.superoffload_worker_threads()
    if threads is None:
        return None
    shared = core.behaviours.superoffload_shared_buffers
    concatenated = None if shared else ConcatenatedSubGroups(core)
    worker = AdamWorker(core, threads, concatenated)
    early = not core.ds.gradient_clipping or not shared
    return SuperOffloadParts(worker, SubGroupHandOff(core, worker, early=early,
                                                     synchronises=shared), concatenated)


def _params(core: RankCore, nccl: NcclQueue) -> ParameterCoordinator:
    if core.ds.stage < 3:
        return ReplicatedParams()
    sources = {"none": PartitionsInHbm, "cpu": PartitionsInHost, "nvme": PartitionsOnNvme}
    source = sources[core.ds.offload_param.device]()
    return PartitionedParams(core, source, nccl, per_tensor=_per_tensor_collectives(core),
                             bounded_fetches=core.behaviours.bounded_fetch_events,
                             drains=not core.behaviours.fetch_waits_on_device)


def _per_tensor_collectives(core: RankCore) -> bool:
    """ZeRO-3 before DeepSpeed batched its collectives (`coalesced_collectives`)."""
    return core.ds.stage == 3 and not core.behaviours.coalesced_collectives


def _gradients(core: RankCore, states: OptimizerSwapper | InMemoryStates,
               gpu_gradients: GpuGradients | None, nccl: NcclQueue,
               zenflow: ZenFlowParts | None, superoffload: SuperOffloadParts | None
               ) -> GradientPath:
    ds = core.ds
    if ds.stage == 0:
        return BoundaryAllReduce(core)
    collective = Collective.REDUCE_SCATTER if ds.reduce_scatter else Collective.ALL_REDUCE
    if not ds.offload_optimizer.enabled:
        sink = GpuPartitions(core)
    elif superoffload is not None and superoffload.concatenated is not None:
        sink = superoffload.concatenated
    elif ds.stage == 3:
        sink = HostPartitions(core, BoundaryFlush(core, states, gpu_gradients,
                                                  shared_grads=superoffload is not None))
    else:
        overlapped = zenflow is not None and zenflow.worker is not None
        sink = HostAccumulation(core, flush_pinned=False if overlapped else None,
                                reduces_every_step=zenflow is not None)
    return IpgBuckets(core, sink, collective, nccl, per_tensor=_per_tensor_collectives(core),
                      compute_waits=_compute_waits_for_reduction(core),
                      waits_for_each_bucket=_compute_waits_for_each_bucket(core),
                      copies_on_compute=ds.stage in (1, 2),
                      after_reduce=zenflow.selective if zenflow else None,
                      after_partition=(superoffload.hand_off if superoffload
                                       else _replica_all_reduce(core)),
                      transposed_copies=zenflow is not None,
                      by_subgroup=(SubGroupBuckets(core.plan)
                                   if superoffload and superoffload.concatenated else None),
                      quantized=_quantized_gradients(core, nccl))


def _replica_all_reduce(core: RankCore) -> ReplicaAllReduce | None:
    """MiCS's all-reduce of the gradient partitions across the shard groups, where there is
    more than one."""
    if len(core.ctx.groups.replicas[core.rank]) > 1:
        return ReplicaAllReduce(core)
    return None


def _quantized_gradients(core: RankCore, nccl: NcclQueue) -> QuantizedGradientReduction | None:
    """qgZ's reduction where it acts: ZeRO-3 over ranks that span more than one node."""
    if core.ds.zero_plus_plus.quantizes_gradients(core.ds.stage, len(core.ranks),
                                                  core.profile.gpus_per_node):
        return QuantizedGradientReduction(core, nccl)
    return None


def _compute_waits_for_reduction(core: RankCore) -> bool:
    """ZeRO-1/2's `average_tensor` makes the default stream wait for the reduction stream
    from DeepSpeed 0.14.3 (`zero12_compute_waits_for_reduction`); ZeRO-3 never does."""
    return (core.ds.stage in (1, 2) and core.ds.overlap_comm
            and core.behaviours.zero12_compute_waits_for_reduction)


def _compute_waits_for_each_bucket(core: RankCore) -> bool:
    """ZeRO-1/2's default stream waits for each full bucket's reduction from DeepSpeed
    0.17.5 to 0.18.4 (PR #7371, removed by PR #7805), with `overlap_comm` and
    `contiguous_gradients`."""
    ds = core.ds
    return (ds.stage in (1, 2) and ds.overlap_comm and ds.contiguous_gradients
            and core.behaviours.zero12_waits_for_each_bucket)


def _post_step(core: RankCore, params: ParameterCoordinator) -> PostStep:
    """The step's `_post_step`: the gathers after it, then, with hpZ, every secondary
    partition dropped (`invalidate_secondary_tensor`, last)."""
    gathers = {0: nothing_to_gather, 3: regather_persistent}.get(core.ds.stage,
                                                                 allgather_updated)
    if not isinstance(params, PartitionedParams) or params.hpz == 1:
        return gathers

    def run(core: RankCore) -> Gen:
        yield from gathers(core)
        params.invalidate_secondaries()
    return run


def _optimizer(core: RankCore, states: OptimizerSwapper | InMemoryStates,
               gpu_gradients: GpuGradients | None, zenflow: ZenFlowParts | None,
               superoffload: SuperOffloadParts | None, post_step: PostStep,
               first: Callable[[], Gen] | None = None) -> OptimizerStep:
    ds = core.ds
    groups = update_groups(core.plan, ds.stage)
    if not ds.offload_optimizer.enabled:
        adam = costs.TORCH_ADAMW if ds.torch_adam else costs.fused_adam(core.adam_precision)
        write_back = download_into_host_params if ds.offload_param.enabled else None
        return GpuStep(core, groups, post_step, adam, write_back,
                       cast_bytes=_gpu_params_copy_bytes(core))
    if gpu_gradients is not None:
        return InterleavedStep(core, groups, post_step, gpu_gradients)
    if superoffload is not None:
        return SuperOffloadStep(core, groups, _copy_back(core), post_step,
                                superoffload.worker, check_overflow_on_host,
                                early=superoffload.early,
                                writes_back=superoffload.concatenated is None)
    if zenflow is not None and zenflow.worker is not None:
        return OverlappedStep(core, groups, _zenflow_copy_back(core), post_step,
                              zenflow.worker, zenflow.selective)
    if zenflow is not None:
        post_step = then_selective_step(post_step, zenflow.selective)
    check = check_overflow_on_host if ds.stage == 3 else read_backward_overflow_flag
    return CpuStep(core, groups, _copy_back(core), post_step, states, check, first=first)


def _gpu_params_copy_bytes(core: RankCore) -> int:
    """Writing a group stepped on the GPU into the 16-bit params, per element: none at ZeRO-3
    with bf16 master params, which are the 16-bit partition itself (`_create_fp32_partitions`
    keeps a flat partition of the master's dtype on the device as its master copy, so the
    step's `copy_` is of a tensor onto itself); else a cast, or a copy, of the master."""
    if core.ds.stage == 3 and core.ds.low_precision_master:
        return 0
    return costs.params_copy_bytes(core.master_bytes, core.dtype_bytes)


def _zenflow_copy_back(core: RankCore) -> CopyBack:
    """ZenFlow's `wait_last_update_and_copy` from the optimizer process's fp32 snapshot, in
    shared (pageable) memory: `bit16.copy_(snapshot.to(device))` up to DeepSpeed 0.19.2 (a
    blocking fp32 H2D, cast on the GPU), `bit16.copy_(snapshot)` from 0.19.3 (a CPU cast into
    a pageable temporary, a blocking H2D)."""
    if core.behaviours.zenflow_native_worker:
        return cast_then_upload
    return partial(upload_fp32_then_cast_on_gpu, pinned=False)


def _copy_back(core: RankCore) -> CopyBack:
    """How a stepped group's 16-bit params reach where the GPU reads them: into the host
    partition with `offload_param`; ZeRO-1/2 as its DeepSpeed release does it; else (ZeRO-3,
    and ZeRO-1/2 up to 0.14.0) a CPU cast into a pageable temporary and a blocking H2D; from
    bf16 master params a blocking H2D of the partition itself."""
    offloaded = {"cpu": cast_into_host_params, "nvme": cast_into_host_or_swap_out}
    if core.ds.offload_param.device in offloaded:
        return offloaded[core.ds.offload_param.device]
    if core.ds.low_precision_master and core.ds.stage == 3:
        return upload_master_partition
    behaviours = core.behaviours
    if core.ds.stage in (1, 2):
        if behaviours.zero12_copy_back_via_16bit_host_buffer:
            return cast_into_16bit_buffer_then_upload
        if behaviours.zero12_copy_back_fp32_to_gpu:
            return upload_fp32_then_cast_on_gpu
    return cast_then_upload
