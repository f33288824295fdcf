"""What DeepSpeed decides before time matters (pure; no SimPy): partitions, persistence,
release-or-keep after forward, optimizer sub-groups."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from types import MappingProxyType
from typing import Any

from zerosim.hardware import costs, nvme
from zerosim.hardware.profile import HardwareProfile
from zerosim.models.breakdown import (
    EMBEDDING_KIND,
    Module,
    Recipe,
    Workload,
    auto_loss_shards,
    auto_tiled_shards,
    build_modules,
    shapes_of,
    vector_flags,
)
from zerosim.models.kernels import kernel_count
from zerosim.models.leaves import (
    LeafRules,
    Leaves,
    find_leaves,
    hold_in_first,
    leaf_thresholds,
)
from zerosim.models.spec import ModelSpec
from zerosim.scenario import DeepSpeedConfig, Scenario
from zerosim.units import BYTES_PER_DTYPE, FP32_BYTES
from zerosim.vocabulary import UpdateDevice

QGZ_SCALE_BYTES = 4
"""qgZ's quantizers keep one fp32 scale a group (symmetric)."""
MODELS_REMEMBERED = 8
"""Models, plans and GPU times a process keeps between runs (`plan_of`, `module_costs`): a
sweep or tune worker runs the same few models many times."""


@dataclass(frozen=True)
class Param:
    module: int
    index: int
    numel: int
    partition_numel: int
    persistent: bool


@dataclass(frozen=True)
class Plan:
    modules: tuple[Module, ...]
    params: tuple[tuple[Param, ...], ...]
    """Per module, its parameter tensors."""
    gathered_numel: tuple[int, ...]
    """Per module, the numel ZeRO-3 must all-gather before use (non-persistent params)."""
    keep_after_forward: tuple[bool, ...]
    """Per module, whether its gathered params survive until its backward (reuse distance)."""
    external: frozenset[int]
    """Modules whose params are ZeRO-3 external parameters of the top module: gathered by its
    pre-forward hook, at the start of the forward, and held until the optimizer step."""
    unreleased_modules: frozenset[int]
    """The external modules and the embeddings: no module hook releases their gathered params
    (a post-backward hook rides on the module's inputs, and token ids need no gradient)."""
    subgroups: tuple[int, ...]
    """Optimizer sub-groups of this rank, as partition numel."""
    subgroup_of: dict[tuple[int, int], int]
    """(module, parameter index) -> its optimizer sub-group."""
    subgroup_param_group: tuple[int, ...]
    """Per sub-group, the optimizer's parameter group it belongs to (`optimizer_param_groups`;
    DeepSpeed's `sub_group_to_group_id`)."""
    gpu_subgroups: frozenset[int]
    """Sub-groups whose fp32 state lives and steps on the GPU (Twin-Flow)."""
    nvme_subgroups: frozenset[int]
    """Sub-groups whose fp32 state is swapped to NVMe (`offload_optimizer: nvme`)."""
    interleaved: tuple[UpdateDevice, ...]
    """Per sub-group, where Deep Optimizer States' interleaved update steps it (empty without
    `prefetch_optimizer`)."""
    nvme_params: frozenset[tuple[int, int]]
    """(module, parameter index) of 16-bit partitions kept on NVMe (`offload_param: nvme`)."""
    partition_numel: int
    param_group_partitions: tuple[int, ...]
    """Per parameter group the optimizer gets (`optimizer_param_groups`), this rank's
    partition numel: what ZeRO-1/2 flatten and step one after another."""
    norm_group_tensors: tuple[int, ...]
    """Per group the step takes a gradient norm of and all-reduces (`_norm_group_tensors`),
    how many gradient tensors this rank holds a part of in it."""
    persistent_numel: int
    ranks: int
    leaves: Mapping[int, int] = field(default_factory=dict)
    """ZeRO-3 leaves (`zerosim.models.leaves`), by the module that holds each one's
    parameters, its first: how many of its modules had parameters of their own. Its hooks
    fetch them before its first module in the forward and its last in the backward; no module
    inside it fires a hook."""
    fast_leaf_fetch: bool = False
    """The host waits on a leaf's parameters without the bound on unfinished fetch events
    (`LeafSettings.fast_fetch`)."""
    tiled: Mapping[int, int] = field(default_factory=dict)
    """Tiled calls outside any leaf (`Module.tiled_span`: an MLP, a loss with its output
    layer), by the module that holds their parameters, its first: how many of its modules
    had parameters of their own, each of which fires its own hooks. Their parameters are
    gathered before the first module going forward and the last going back, as a leaf's are
    (a tiled loss's, whose backward runs in the forward, not then)."""

    @cached_property
    def forward_hooks(self) -> tuple[int | None, ...]:
        """Per module, whose parameters the hooks that fire before its forward (or recompute)
        fetch: its own, or at a leaf's first module the leaf's; None inside a leaf, where no
        hook fires."""
        return self._hooks(reverse=False)

    @cached_property
    def backward_hooks(self) -> tuple[int | None, ...]:
        """As `forward_hooks`, before each module's backward: a leaf's fire at its last
        module, the first the backward reaches."""
        return self._hooks(reverse=True)

    def _hooks(self, *, reverse: bool) -> tuple[int | None, ...]:
        hooks: list[int | None] = list(range(len(self.modules)))
        for first in (*self.leaves, *self.tiled):
            last = first + self.modules[first].keeps_gathered_for
            hooks[first:last + 1] = [None] * (last + 1 - first)
            hooks[last if reverse else first] = first
        if reverse:
            hooks = [None if target is not None and self.modules[target].backward_in_forward
                     else target for target in hooks]
        return tuple(hooks)

    @cached_property
    def gathered_tensors(self) -> tuple[tuple[Param, ...], ...]:
        """Per module, the tensors a ZeRO-3 all-gather brings (the non-persistent ones)."""
        return tuple(tuple(p for p in params if not p.persistent) for params in self.params)

    @cached_property
    def gathered_partition_numel(self) -> tuple[int, ...]:
        """Per module, one rank's partition of the tensors an all-gather brings."""
        return tuple(sum(p.partition_numel for p in tensors) for tensors in self.gathered_tensors)

    @cached_property
    def unreleased_numel(self) -> int:
        """Gathered numel of `unreleased_modules`. Up to DeepSpeed 0.15.3 `reset_step` zeroes
        the coordinator's live count at the end of a backward while they are still gathered;
        the step then releases them and takes them off it, so every later forward starts
        that far below zero and the prefetcher may hold this much beyond
        `stage3_max_live_parameters` (later releases: `PartitionedParams.reset_step`)."""
        return sum(self.gathered_numel[i] for i in self.unreleased_modules)

    @property
    def all_params(self) -> list[Param]:
        return [p for params in self.params for p in params]

    def secondary_shares(self, group: int) -> list[int]:
        """hpZ with groups of `group` ranks: each non-persistent tensor's secondary partition,
        its share over the group (numel), as `_partition_param_sec` sizes it."""
        return [p.partition_numel * (self.ranks // group) for p in self.all_params
                if not p.persistent]

    def qgz_groups(self, param: Param, falls_back: bool) -> int:
        """qgZ's quantization groups for `param`'s gradient (`all_to_all_quant_reduce`:
        max(its first two dimensions, the ranks)); 0 where it is reduce-scattered instead: a
        vector, or, where the release falls back (`qgz_indivisible_fallback`, 0.13.2+), a
        matrix whose element count is not a multiple of twice the ranks."""
        shape = shapes_of(self.modules[param.module])[param.index]
        if len(shape) < 2 or (falls_back and param.numel % (2 * self.ranks)):
            return 0
        return max(shape[0], shape[1], self.ranks)

    def loco_error_feedback_bytes(self, per_node: int, falls_back: bool) -> int:
        """What LoCo's error feedback keeps on one rank between its steps, for every matrix
        qgZ quantizes (`all_to_all_loco_quant_reduce`'s `p.intra_ef_buf` and `inter_ef_buf`):
        the error within the node as int8, n bytes and G fp32 scales, and across nodes,
        n / g bytes and G // g scales, g the node's GPUs."""
        total = 0
        for param in self.all_params:
            groups = self.qgz_groups(param, falls_back)
            if groups:
                total += (param.numel + param.numel // per_node
                          + QGZ_SCALE_BYTES * (groups + groups // per_node))
        return total

    def on_gpu(self, param: Param) -> bool:
        return self.subgroup_of[(param.module, param.index)] in self.gpu_subgroups

    def interleaved_on_gpu(self, group: int) -> bool:
        """Whether the interleaved update steps sub-group `group` on the GPU."""
        return bool(self.interleaved) and self.interleaved[group] is UpdateDevice.GPU

    @property
    def last_interleaved_gpu_group(self) -> int | None:
        """The interleaved update's last GPU sub-group (None without one): the fork's GPU
        fp32 params, exp_avg and exp_avg_sq are its size from one step to the next."""
        on_gpu = [g for g in range(len(self.interleaved)) if self.interleaved_on_gpu(g)]
        return on_gpu[-1] if on_gpu else None

    @property
    def interleaved_grad_outlives_step(self) -> bool:
        """Whether the last GPU sub-group's fp32 gradient outlives the step: only when it is
        the last sub-group of all, as no `CPU_PREFETCH` sub-group after it sets
        `.grad = None` (`opt_transfers`)."""
        last = self.last_interleaved_gpu_group
        return last is not None and last == len(self.interleaved) - 1

    def group_of(self, param: Param) -> int:
        return self.subgroup_of[(param.module, param.index)]

    def numel_on(self, device: str) -> int:
        """Partition numel whose optimizer state lives on `device` ('cpu', 'gpu' or 'nvme');
        'cpu' is what stays in host memory."""
        gpu = sum(size for g, size in enumerate(self.subgroups) if g in self.gpu_subgroups)
        nvme = sum(size for g, size in enumerate(self.subgroups) if g in self.nvme_subgroups)
        return {"gpu": gpu, "nvme": nvme}.get(device, self.partition_numel - gpu - nvme)

    def nvme_tensors(self, module: int) -> int:
        """How many of the module's 16-bit partitions live on NVMe: the swap buffers its
        fetch takes, one a tensor."""
        return sum(1 for p in self.params[module] if (p.module, p.index) in self.nvme_params)

    def params_on_nvme(self, module: int) -> int:
        """Partition numel of the module's 16-bit parameters that live on NVMe."""
        return sum(p.partition_numel for p in self.params[module]
                   if (p.module, p.index) in self.nvme_params)

    @property
    def largest_swapped_subgroup(self) -> int:
        """Numel of the largest sub-group on NVMe: the size of each optimizer swap buffer
        (0 when nothing is swapped)."""
        return max((self.subgroups[g] for g in self.nvme_subgroups), default=0)

    @property
    def nvme_param_numel(self) -> int:
        return sum(p.partition_numel for p in self.all_params
                   if (p.module, p.index) in self.nvme_params)

    def swap_out_pool_numel(self, element_bytes: int, thread_count: int) -> int:
        """Elements of the pinned pool DeepSpeed reserves for swapping 16-bit parameters out
        (stage3.py `_create_fp16_partitions_with_defragmentation`): the sub-group with the
        most partition elements (the first such), whose parameters' whole, unpartitioned
        sizes (`ds_numel`), each I/O-aligned, `reserve_partitioned_swap_space` adds up."""
        if not self.subgroups:
            return 0
        largest = self.subgroups.index(max(self.subgroups))
        return sum(nvme.io_aligned_numel(p.numel, element_bytes, thread_count)
                   for p in self.all_params
                   if self.subgroup_of[(p.module, p.index)] == largest)

    def subgroup_params_on_nvme(self, group: int) -> int:
        """Partition numel of the sub-group's 16-bit parameters that live on NVMe."""
        return sum(p.partition_numel for p in self.all_params
                   if self.subgroup_of[(p.module, p.index)] == group
                   and (p.module, p.index) in self.nvme_params)


def partition_numel(numel: int, ranks: int) -> int:
    """ZeRO-3 pads every parameter to a multiple of the ranks and keeps one slice per rank."""
    return math.ceil(numel / ranks)


def _keep_after_forward(numels: list[int], max_reuse_distance: int) -> list[bool]:
    """DeepSpeed scans the module trace ahead of the current module, counting params, and keeps
    a module's params when its backward comes within `max_reuse_distance` numel. Between a
    module's forward and its backward lie every later module twice (forward, then backward)."""
    keep = []
    for i in range(len(numels)):
        later = sum(numels[i + 1:])
        keep.append(numels[i] > 0 and 2 * later < max_reuse_distance)
    return keep


def _subgroups(param_groups: Sequence[Sequence[Param]], sub_group_size: int
               ) -> tuple[list[int], dict[tuple[int, int], int], list[int]]:
    """`_create_fp16_partitions_with_defragmentation`: one parameter group after another,
    `_create_fp16_sub_groups` closing a sub-group once its partition numel reaches the size
    (and at the group's end). Returns the sub-groups' sizes, each parameter's sub-group and
    each sub-group's parameter group (`sub_group_to_group_id`)."""
    groups: list[int] = []
    member: dict[tuple[int, int], int] = {}
    group_of: list[int] = []
    for index, params in enumerate(param_groups):
        current = 0
        for position, param in enumerate(params):
            member[(param.module, param.index)] = len(groups)
            current += param.partition_numel
            if current >= sub_group_size or position == len(params) - 1:
                groups.append(current)
                group_of.append(index)
                current = 0
    return groups, member, group_of


def optimizer_param_groups(modules: Sequence[Module], params: Sequence[Sequence[Param]],
                           vector_group: bool) -> tuple[tuple[Param, ...], ...]:
    """The parameter groups the framework hands the optimizer, in order: every tensor in one,
    or (`vector_group`, Megatron's `get_param_groups`) the tensors it decays, then the
    one-dimensional ones (biases and norms), each group in the model's order; empty groups
    are dropped, as DeepSpeed's engine drops them."""
    flat = [p for group in params for p in group]
    if not vector_group:
        return (tuple(flat),)
    vector = {(p.module, p.index) for m, group in enumerate(params)
              for p, flag in zip(group, vector_flags(modules[m]), strict=True) if flag}
    decayed = tuple(p for p in flat if (p.module, p.index) not in vector)
    vectors = tuple(p for p in flat if (p.module, p.index) in vector)
    return tuple(group for group in (decayed, vectors) if group)


def _norm_group_tensors(stage: int, ranks: int, param_groups: Sequence[Sequence[Param]],
                        member: dict[tuple[int, int], int], subgroups: int
                        ) -> tuple[int, ...]:
    """The groups whose gradient norms the step combines and all-reduces one after another,
    as how many gradient tensors the rank holds a part of in each: ZeRO-3's sub-groups
    (stage3.py `_get_norm_groups`; every rank holds a slice of every tensor), ZeRO-1/2's
    parameter groups (stage_1_and_2.py `scaled_global_norm` over `params_in_partition`: the
    tensors the rank's share of the group's flat range holds, taken as alike, a share of them
    and one the boundary cuts), or every tensor at once without ZeRO."""
    if stage == 3:
        counts = [0] * subgroups
        for group in member.values():
            counts[group] += 1
        return tuple(counts)
    if stage == 0:
        return (sum(len(group) for group in param_groups),)
    return tuple(len(group) if ranks == 1 else min(len(group), math.ceil(len(group) / ranks) + 1)
                 for group in param_groups)


def _gpu_subgroups(count: int, ratio: float, first: bool) -> frozenset[int]:
    """Twin-Flow (`offload_optimizer.ratio` < 1), as stage3.py `_create_fp32_partitions`
    assigns `subgroup_to_device`: up to DeepSpeed 0.17, sub-group i on the CPU when
    i < int(ratio x count), the remaining (last) ones on the GPU; from 0.18.0 (`first`), on
    the CPU when i >= int((1 - ratio) x count), the first ones on the GPU. The products are
    DeepSpeed's own, in floating point: ratio 0.9 over 10 sub-groups puts none on the GPU
    from 0.18.0 (int(0.0999... x 10) = 0), one before (int(9.0) = 9 on the CPU)."""
    if ratio >= 1:
        return frozenset()
    if first:
        return frozenset(range(int((1 - ratio) * count)))
    return frozenset(range(int(ratio * count), count))


def interleaved_devices(count: int, gap: int) -> tuple[UpdateDevice, ...]:
    """Deep Optimizer States' `get_opt_update_device` (DataStates/DeepSpeed@4570a955,
    stage3.py): sub-group x is updated on the CPU, and first starts the GPU transfers, when
    x % gap == 0; on the GPU when (x + 1) % gap == 0; on the CPU otherwise."""
    def device(x: int) -> UpdateDevice:
        if x % gap == 0:
            return UpdateDevice.CPU_PREFETCH
        return UpdateDevice.GPU if (x + 1) % gap == 0 else UpdateDevice.CPU
    return tuple(device(x) for x in range(count))


def _nvme_subgroups(groups: list[int], on_gpu: frozenset[int], ds: DeepSpeedConfig
                    ) -> frozenset[int]:
    """stage3.py `_swappable_optimizer_subgroup`: with the optimizer on NVMe, every CPU
    sub-group of at least `min_aio_bytes` of fp32 is swapped; smaller ones stay in memory."""
    if not ds.offload_optimizer.nvme:
        return frozenset()
    return frozenset(g for g, size in enumerate(groups) if g not in on_gpu
                     and nvme.swappable(size, FP32_BYTES, ds.aio.block_size))


def _nvme_params(params: list[Param], groups: list[int], member: dict[tuple[int, int], int],
                 ds: DeepSpeedConfig, dtype_bytes: int) -> frozenset[tuple[int, int]]:
    """With parameters on NVMe, partitions of at least `min_aio_bytes` start on NVMe; stage3.py
    `_move_to_flat_buffer` then moves the first sub-groups that fit in `max_in_cpu` elements
    into a pinned CPU buffer for good. What is left stays on NVMe."""
    if not ds.offload_param.nvme:
        return frozenset()
    in_cpu, used = set(), 0
    for group, size in enumerate(groups):
        if used + size > ds.offload_param.max_in_cpu:
            break
        in_cpu.add(group)
        used += size
    return frozenset((p.module, p.index) for p in params
                     if member[(p.module, p.index)] not in in_cpu
                     and nvme.swappable(p.partition_numel, dtype_bytes, ds.aio.block_size))


def make_plan(ds: DeepSpeedConfig, ranks: int, modules: Sequence[Module], *,
              vector_group: bool = False, leaves: Sequence[tuple[int, int]] = ()) -> Plan:
    """What DeepSpeed decides for `modules` under `ds` on `ranks` data-parallel ranks, the
    framework handing the optimizer the one-dimensional tensors apart or not
    (`optimizer_param_groups`), with ZeRO-3's `leaves` (first and last module of each)."""
    sharded = ds.stage == 3
    leaves = leaves if sharded else ()
    tiled = _tiled_spans(modules, leaves) if sharded else ()
    owners, tiled_owners = ({first: sum(1 for m in modules[first:last + 1] if m.params)
                             for first, last in spans} for spans in (leaves, tiled))
    modules = hold_in_first(modules, (*leaves, *tiled))
    params = []
    for m_index, module in enumerate(modules):
        params.append(tuple(
            Param(m_index, i, numel,
                  partition_numel(numel, ranks),
                  sharded and numel <= ds.stage3_param_persistence_threshold)
            for i, numel in enumerate(module.param_numels)))
    flat = [p for group in params for p in group]
    gathered = [sum(p.numel for p in group if not p.persistent) if sharded else 0
                for group in params]
    numels = [sum(p.numel for p in group) for group in params]
    external = frozenset(i for i, m in enumerate(modules) if m.external and gathered[i] > 0)
    embeddings = [i for i, m in enumerate(modules) if m.kind == EMBEDDING_KIND]
    param_groups = optimizer_param_groups(modules, params, vector_group)
    groups, member, group_of = _subgroups(param_groups, ds.sub_group_size)
    on_gpu = _gpu_subgroups(len(groups), ds.offload_optimizer.ratio,
                            ds.offload_optimizer.gpu_subgroups_first)
    return Plan(
        modules=tuple(modules),
        params=tuple(params),
        gathered_numel=tuple(gathered),
        keep_after_forward=tuple(_keep_after_forward(numels, ds.stage3_max_reuse_distance)),
        external=external,
        unreleased_modules=frozenset(i for i in (*external, *embeddings) if gathered[i] > 0),
        subgroups=tuple(groups),
        subgroup_of=member,
        subgroup_param_group=tuple(group_of),
        gpu_subgroups=on_gpu,
        nvme_subgroups=_nvme_subgroups(groups, on_gpu, ds),
        interleaved=(interleaved_devices(len(groups), ds.offload_optimizer.prefetch_optimizer_gap)
                     if ds.offload_optimizer.prefetch_optimizer else ()),
        nvme_params=_nvme_params(flat, groups, member, ds, BYTES_PER_DTYPE[ds.dtype]),
        partition_numel=sum(p.partition_numel for p in flat),
        param_group_partitions=tuple(sum(p.partition_numel for p in group)
                                     for group in param_groups),
        norm_group_tensors=_norm_group_tensors(ds.stage, ranks, param_groups, member,
                                               len(groups)),
        persistent_numel=sum(p.numel for p in flat if p.persistent),
        ranks=ranks,
        leaves=MappingProxyType(owners),
        fast_leaf_fetch=ds.leaves.fast_fetch,
        tiled=MappingProxyType(tiled_owners),
    )


def _tiled_spans(modules: Sequence[Module], leaves: Sequence[tuple[int, int]]
                 ) -> tuple[tuple[int, int], ...]:
    """The tiled calls' spans (first and last module: an MLP's, an output layer's with its
    loss) that meet no ZeRO-3 leaf: inside one, the leaf's hooks are the only ones that
    fire."""
    spans = ((i, i + m.tiled_span) for i, m in enumerate(modules) if m.tiled_span)
    return tuple((first, last) for first, last in spans
                 if not any(first <= end and start <= last for start, end in leaves))


def update_groups(plan: Plan, stage: int) -> tuple[int, ...]:
    """The element counts the optimizer steps one after another: ZeRO-3's sub-groups, the
    rank's flat partition of each parameter group at stages 1 and 2, every parameter without
    ZeRO."""
    if stage == 3:
        return plan.subgroups
    if stage > 0:
        return plan.param_group_partitions
    return (sum(p.numel for p in plan.all_params),)


def workload_of(scenario: Scenario) -> Workload:
    return Workload(
        sequence_length=scenario.sequence_length,
        micro_batch_size=scenario.deepspeed.train_micro_batch_size_per_gpu,
        attention=scenario.attention,
        activation_checkpointing=scenario.activation_checkpointing,
        checkpoint_in_cpu=scenario.activation_checkpointing and scenario.runtime.checkpoint_in_cpu,
        dtype_bytes=BYTES_PER_DTYPE[scenario.deepspeed.dtype],
        bfloat16=scenario.deepspeed.dtype == "bf16",
        sequence_parallel=scenario.deepspeed.sequence_parallel_size,
        document_length=scenario.document_length,
        **_tiling(scenario),
    )


def _tiling(scenario: Scenario) -> dict[str, Any]:
    """The workload's tiled MLP and loss (`runtime.tiled_mlp_shards`, `tiled_loss_shards`):
    their slices, counted as Arctic Long Sequence Training counts them where `auto` (the MLP's
    then agreed on every call)."""
    shards = scenario.runtime.tiled_mlp_shards
    if shards == "auto":
        per_rank = scenario.sequence_length // scenario.deepspeed.sequence_parallel_size
        out = {"tiled_mlp_shards": auto_tiled_shards(per_rank, scenario.model.hidden_size),
               "tiled_mlp_agreed": True}
    else:
        out = {"tiled_mlp_shards": shards} if shards is not None else {}
    loss = scenario.runtime.tiled_loss_shards
    if loss == "auto":
        tokens = (scenario.sequence_length * scenario.deepspeed.train_micro_batch_size_per_gpu
                  // scenario.deepspeed.sequence_parallel_size)
        out["tiled_loss_shards"] = auto_loss_shards(tokens, scenario.model.vocab_size)
    elif loss is not None:
        out["tiled_loss_shards"] = loss
    return out


def plan_of(scenario: Scenario) -> Plan:
    """The plan of a resolved scenario (pure: what `run_engine` starts from), remembered by
    what it depends on (the model, its workload and recipe, the DeepSpeed config, the ranks
    partitioning it: every data-parallel rank, or with MiCS a shard group) for the last few
    scenarios."""
    ds = scenario.deepspeed
    return _plan(scenario.model, workload_of(scenario), scenario.stack.recipe, ds,
                 ds.mics.partition_ranks(ds.stage, scenario.data_parallel),
                 scenario.stack.vector_param_group)


@lru_cache(maxsize=MODELS_REMEMBERED)
def _plan(spec: ModelSpec, workload: Workload, recipe: Recipe, ds: DeepSpeedConfig,
          ranks: int, vector_group: bool) -> Plan:
    modules = _modules(spec, workload, recipe)
    return make_plan(ds, ranks, modules, vector_group=vector_group,
                     leaves=_leaves(spec, workload, recipe, ds).spans)


@dataclass(frozen=True)
class ProcessGroups:
    """Per rank, the ranks its collectives span, each group one tuple its members share:
    `partition`, the ranks its parameters, gradients and optimizer states are partitioned
    over (every rank, or with MiCS its shard group of consecutive ranks); `replicas`, the
    ranks holding the same partitions in the other shard groups (itself alone without MiCS);
    and for MiCS's hierarchical gather `intra_node`, its shard group's ranks on its node,
    and `inter_node`, those of its local index on the group's other nodes (empty tuples
    otherwise). As mics_utils.py `create_mics_comm_groups` builds them. `sequence`: with
    Ulysses, its sequence-parallel group of consecutive ranks (parallel_state_sp.py
    `initialize_sequence_parallel`; empty without)."""

    partition: tuple[tuple[int, ...], ...]
    replicas: tuple[tuple[int, ...], ...]
    intra_node: tuple[tuple[int, ...], ...] = ()
    inter_node: tuple[tuple[int, ...], ...] = ()
    sequence: tuple[tuple[int, ...], ...] = ()


def _consecutive(world: tuple[int, ...], size: int
                 ) -> tuple[list[tuple[int, ...]], tuple[tuple[int, ...], ...]]:
    """The groups of `size` consecutive ranks (`world` itself when that is all), and per
    rank its group (the group's own tuple, which its members share)."""
    groups = [world] if size == len(world) else [world[i:i + size]
                                                  for i in range(0, len(world), size)]
    return groups, tuple(groups[r // size] for r in world)


def process_groups(world: tuple[int, ...], shard: int, per_node: int, hierarchical: bool,
                   sequence: int = 1) -> ProcessGroups:
    """The `ProcessGroups` of `world` partitioned over groups of `shard` consecutive ranks
    (`world` itself when `shard` is all of it), on nodes of `per_node` GPUs, with Ulysses
    groups of `sequence` consecutive ranks (none at 1)."""
    shards, partition = _consecutive(world, shard)
    replicas = [world[i::shard] for i in range(shard)]
    replica = tuple(replicas[r % shard] for r in world)
    groups = ProcessGroups(partition, replica,
                           sequence=_consecutive(world, sequence)[1] if sequence > 1 else ())
    if not hierarchical:
        return groups
    width = shard // (shard // per_node)
    """Ranks of a shard group per node: DeepSpeed's `n_gpu_per_node`, the group's size over
    the nodes it spans."""
    intra = [group[i:i + width] for group in shards for i in range(0, shard, width)]
    inter = {(group[0], i): group[i::width] for group in shards for i in range(width)}
    return replace(groups, intra_node=tuple(intra[r // width] for r in world),
                   inter_node=tuple(inter[partition[r][0], r % shard % width] for r in world))


def hpz_secondary_bytes(scenario: Scenario) -> int:
    """What one rank's hpZ secondary partitions hold once every parameter has one (from the
    first forward to the step): each non-persistent tensor's share over its group, 16-bit;
    0 without hpZ, or below ZeRO-3."""
    group = scenario.deepspeed.zero_plus_plus.hpz_group(scenario.data_parallel)
    if group == 1 or scenario.deepspeed.stage != 3:
        return 0
    return BYTES_PER_DTYPE[scenario.deepspeed.dtype] * sum(
        plan_of(scenario).secondary_shares(group))


def loco_error_feedback_bytes(scenario: Scenario) -> int:
    """What one rank keeps of LoCo's error feedback (`Plan.loco_error_feedback_bytes`); 0
    where qgZ does not act with it."""
    ds, profile = scenario.deepspeed, scenario.hardware
    if not ds.zero_plus_plus.loco_acts(ds.stage, scenario.data_parallel,
                                       profile.gpus_per_node):
        return 0
    return plan_of(scenario).loco_error_feedback_bytes(
        profile.gpus_per_node, scenario.behaviours.qgz_indivisible_fallback)


def leaves_of(scenario: Scenario) -> Leaves:
    """The ZeRO-3 leaves DeepSpeed makes of the scenario's model (`zerosim.models.leaves`):
    what the stack's script, `leaf_module` and `module_granularity_threshold` flag."""
    return _leaves(scenario.model, workload_of(scenario), scenario.stack.recipe,
                   scenario.deepspeed)


@lru_cache(maxsize=MODELS_REMEMBERED)
def _leaves(spec: ModelSpec, workload: Workload, recipe: Recipe, ds: DeepSpeedConfig
            ) -> Leaves:
    if ds.stage != 3:
        return Leaves()
    return find_leaves(_modules(spec, workload, recipe), _leaf_rules(spec, recipe, ds))


def _leaf_rules(spec: ModelSpec, recipe: Recipe, ds: DeepSpeedConfig) -> LeafRules:
    return LeafRules(kind=recipe.module_tree, model_type=spec.model_type,
                     moe_blocks=recipe.moe_block_leaf,
                     granularity_threshold=ds.leaves.granularity_threshold,
                     classes=ds.leaves.classes, names=ds.leaves.names,
                     name_suffixes=ds.leaves.name_suffixes)


def granularity_thresholds(scenario: Scenario) -> tuple[int, ...]:
    """The `module_granularity_threshold` values that make distinct sets of ZeRO-3 leaves of
    the scenario's model (`leaves.leaf_thresholds`), for a search."""
    spec, recipe = scenario.model, scenario.stack.recipe
    return leaf_thresholds(_modules(spec, workload_of(scenario), recipe),
                           _leaf_rules(spec, recipe, scenario.deepspeed))


@lru_cache(maxsize=MODELS_REMEMBERED)
def _modules(spec: ModelSpec, workload: Workload, recipe: Recipe) -> tuple[Module, ...]:
    """`build_modules`, remembered by value (building a 13 B model's modules costs about 5%
    of a run)."""
    return tuple(build_modules(spec, workload, recipe))


@dataclass(frozen=True)
class ModuleCosts:
    """Per module (by index), the GPU seconds of its forward and backward kernels on one
    hardware profile and how many kernels each launches."""

    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    forward_launches: tuple[int, ...]
    backward_launches: tuple[int, ...]


def module_costs(scenario: Scenario) -> ModuleCosts:
    """The `ModuleCosts` of the scenario's modules on its hardware, remembered by value as
    the plan is (a run needs every module's, and pricing their kernels costs about 2% of
    a run)."""
    return _module_costs(scenario.model, workload_of(scenario), scenario.stack.recipe,
                         scenario.hardware)


@lru_cache(maxsize=MODELS_REMEMBERED)
def _module_costs(spec: ModelSpec, workload: Workload, recipe: Recipe,
                  profile: HardwareProfile) -> ModuleCosts:
    modules = _modules(spec, workload, recipe)
    return ModuleCosts(
        forward_s=tuple([costs.module_forward_s(m, profile) for m in modules]),
        backward_s=tuple([costs.module_backward_s(m, profile) for m in modules]),
        forward_launches=tuple([kernel_count(m.kernels) for m in modules]),
        backward_launches=tuple([kernel_count(m.backward_kernels) for m in modules]))
