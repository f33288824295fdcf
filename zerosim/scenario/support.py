"""What zerosim replays, decided in one place when a scenario is resolved, so `zerosim check`,
the sweep pre-check and `zerosim run` refuse exactly the same configurations."""

from __future__ import annotations

import warnings
from typing import Any

from zerosim.errors import ScenarioWarning, UnsupportedConfigError
from zerosim.scenario.deepspeed import SEQUENCE_PARALLEL_KEY

ZERO = "deepspeed.zero_optimization"


def check_supported(scenario: Any) -> None:
    """Raise `UnsupportedConfigError` for a configuration the engine does not replay."""
    for rule in (_needs_16bit_training, _no_tensor_parallel, _offload_needs_zero,
                 _param_offload_needs_stage3, _nvme_param_offload_needs_optimizer_offload,
                 _twin_flow_needs_offload, _what_ifs_need_offloaded_stage3, _nvme_needs_drives,
                 _what_ifs_not_with_nvme, _interleaved_update_is_offloaded_stage3,
                 _step_what_ifs_not_with_the_interleaved_update,
                 _zenflow_is_zero12_with_a_fixed_interval, _super_offload_is_replayed,
                 _low_precision_master_is_replayed, _nvme_buffers_suffice,
                 _hpz_is_replayed, _qgz_groups_fit, _qgz_reduces_by_reduce_scatter,
                 _qgz_tensors_divide, _mics_replicas_reduce_on_the_gpu,
                 _mics_gathers_from_the_gpu, _mics_hierarchy_spans_nodes, _mics_alone,
                 _unmanaged_accumulation_is_replayed, _ulysses_runs, _ulysses_is_replayed,
                 _tiled_mlp_runs, _tiled_loss_runs, _liger_kernel_runs,
                 _packed_documents_run):
        rule(scenario)


class InertWhatIfWarning(ScenarioWarning):
    """A what-if (or a framework flag) switched on that changes nothing in this
    configuration."""


class UnpricedReportsWarning(ScenarioWarning):
    """`memory_breakdown` on with a software stack that prices no garbage collection."""


class ForkStepFailsWarning(ScenarioWarning):
    """A layout the Deep Optimizer States fork's step, as its code reads, stops on."""


class UnreplayedRollbackWarning(ScenarioWarning):
    """SuperOffload before DeepSpeed 0.18.9 steps the sub-groups early even with gradient
    clipping, and rolls them back and re-steps them when the norm clips, which depends on the
    data: zerosim replays the steps where it does not clip."""


class LeafModuleWarning(ScenarioWarning):
    """ZeRO-3 leaf-module settings that flag nothing (DeepSpeed warns likewise), or that
    zerosim cannot place in the model it builds."""


class ZeroPlusPlusWarning(ScenarioWarning):
    """ZeRO++ settings that change nothing in this configuration."""


class TilingWarning(ScenarioWarning):
    """A tiled call that DeepSpeed runs otherwise than zerosim replays it."""


class MicsWarning(ScenarioWarning):
    """MiCS settings that change nothing in this configuration."""


class UnreplayedSelectionWarning(ScenarioWarning):
    """ZenFlow re-selects its gradient columns every few steps, which zerosim does not
    replay."""


def warn_inert(scenario: Any) -> None:
    """Warn about settings that are valid but do nothing here (a sweep may pass through them
    on purpose, so they are not refused)."""
    _warn_unpriced_reports(scenario)
    _warn_inert_gpu_update(scenario)
    _warn_gpu_subgroup_of_a_later_param_group(scenario)
    _warn_zenflow_selection_by_steps(scenario)
    _warn_superoffload_rollback(scenario)
    _warn_idle_leaf_rules(scenario)
    _warn_idle_zero_plus_plus(scenario)
    _warn_idle_loco(scenario)
    _warn_idle_mics(scenario)
    _warn_replicas_never_reduced(scenario)
    _warn_checkpoint_flags_without_checkpointing(scenario)
    _warn_tiled_mlp_released_between_slices(scenario)


def _warn_tiled_mlp_released_between_slices(scenario: Any) -> None:
    """ZeRO-3 keeps a module's parameters gathered after its call where it comes again within
    `stage3_max_reuse_distance` parameters of the trace (partitioned_param_coordinator.py
    `__params_to_release`); between a tiled MLP's slices a projection waits for the other
    two. Below that, DeepSpeed gathers each projection again every slice, which zerosim does
    not replay (it keeps them gathered through the call)."""
    ds, model = scenario.deepspeed, scenario.model
    between = 2 * model.hidden_size * model.intermediate_size
    if (scenario.runtime.tiled_mlp_shards is not None and ds.stage == 3
            and ds.stage3_max_reuse_distance <= between):
        warnings.warn(f"{scenario.source}: stage3_max_reuse_distance "
                      f"{ds.stage3_max_reuse_distance:g} is not above the {between:g} "
                      "parameters a tiled MLP's projection waits for between slices: "
                      "DeepSpeed gathers each projection again every slice, zerosim keeps "
                      "them gathered through the call (priced short)", TilingWarning,
                      stacklevel=5)


def _warn_checkpoint_flags_without_checkpointing(scenario: Any) -> None:
    """Megatron-DeepSpeed's checkpointing flags with no block checkpointed: DeepSpeed takes
    them, and nothing calls its checkpoint."""
    runtime = scenario.runtime
    said = [key for key in ("checkpoint_in_cpu", "synchronize_each_layer")
            if getattr(runtime, key)]
    if said and not scenario.activation_checkpointing:
        warnings.warn(f"{scenario.source}: runtime.{said[0]} does nothing without "
                      "activation_checkpointing: no block is checkpointed",
                      InertWhatIfWarning, stacklevel=5)


def _warn_idle_zero_plus_plus(scenario: Any) -> None:
    """ZeRO++ asked for where DeepSpeed does nothing with it: below ZeRO-3 (only ZeRO-3 reads
    the keys), on one rank (nothing to gather); and qgZ on one node: `__avg_scatter_grads`
    takes it only where the ranks over the GPUs a node has (`device_count()`) make more than
    one node."""
    ds = scenario.deepspeed
    zpp = ds.zero_plus_plus
    said = [key for key, value in (("zero_hpz_partition_size", zpp.hpz_partition_size > 1),
                                   ("zero_quantized_weights", zpp.quantized_weights),
                                   ("zero_quantized_gradients", zpp.quantized_gradients))
            if value]
    if not said:
        return
    if ds.stage != 3:
        why = f"does nothing at ZeRO-{ds.stage}: only ZeRO-3 reads ZeRO++'s keys"
    elif scenario.data_parallel == 1:
        why = "does nothing on one rank: there is nothing to gather from other ranks"
    elif zpp.quantized_gradients and not zpp.quantizes_gradients(
            ds.stage, scenario.data_parallel, scenario.hardware.gpus_per_node):
        said = ["zero_quantized_gradients"]
        why = (f"does nothing on one node ({scenario.data_parallel} ranks, "
               f"{scenario.hardware.gpus_per_node} GPUs a node): DeepSpeed quantizes the "
               "gradients only across nodes and reduce-scatters them here as without it")
    else:
        return
    warnings.warn(f"{scenario.source}: {ZERO}.{said[0]} {why}", ZeroPlusPlusWarning,
                  stacklevel=5)


def _warn_idle_loco(scenario: Any) -> None:
    """LoCo given where qgZ does not act: `__avg_scatter_grads` reads it only in qgZ's
    branch (ZeRO-3, `zero_quantized_gradients`, ranks across nodes)."""
    ds = scenario.deepspeed
    zpp = ds.zero_plus_plus
    if zpp.loco is not None and not zpp.loco_acts(ds.stage, scenario.data_parallel,
                                                  scenario.hardware.gpus_per_node):
        warnings.warn(f"{scenario.source}: {ZERO}.zeropp_loco_param does nothing here: LoCo "
                      "feeds back qgZ's quantization errors, and qgZ acts only at ZeRO-3 with "
                      "zero_quantized_gradients over ranks on more than one node",
                      ZeroPlusPlusWarning, stacklevel=5)


def _warn_idle_mics(scenario: Any) -> None:
    """MiCS asked for where DeepSpeed builds no MiCS optimizer: below ZeRO-3 (only ZeRO-3's
    branch reads `mics_shard_size`), or the hierarchical gather without a shard size; and
    where it does, that its optimizer wants the model built under `MiCS_Init`, which neither
    shipped stack's training script does."""
    ds = scenario.deepspeed
    if ds.mics.shard_size > 0 and ds.stage != 3:
        warnings.warn(f"{scenario.source}: {ZERO}.mics_shard_size does nothing at "
                      f"ZeRO-{ds.stage}: only ZeRO-3 builds MiCS's optimizer", MicsWarning,
                      stacklevel=5)
    elif ds.mics.hierarchical and not ds.mics.acts(ds.stage):
        warnings.warn(f"{scenario.source}: {ZERO}.mics_hierarchical_params_gather does "
                      "nothing without a mics_shard_size above 0 at ZeRO-3", MicsWarning,
                      stacklevel=5)
    elif ds.mics.acts(ds.stage):
        warnings.warn(f"{scenario.source}: {ZERO}.mics_shard_size: {scenario.stack.name} "
                      "builds the model under deepspeed.zero.Init (Megatron-DeepSpeed's "
                      "pretrain_gpt.py, transformers' from_pretrained), on which DeepSpeed's "
                      "MiCS optimizer asserts ('Sharded parameters don't have the "
                      "MiCS_CommGroups attached'); zerosim replays the run as built under "
                      "deepspeed.zero.MiCS_Init, as the training script must then build it",
                      MicsWarning, stacklevel=5)


def _warn_replicas_never_reduced(scenario: Any) -> None:
    """MiCS's all-reduce across the replicas runs where the optimizer's boundary flag is set
    during a backward (`allreduce_mics_shard_grads`), which unmanaged accumulation never sets:
    the replicas' gradients are never combined, and zerosim replays it so."""
    ds = scenario.deepspeed
    if not ds.managed_accumulation and ds.mics.replicas(ds.stage, scenario.data_parallel) > 1:
        warnings.warn(f"{scenario.source}: deepspeed.managed_gradient_accumulation: false with "
                      "MiCS: no backward is the boundary, so MiCS never all-reduces the "
                      "gradient partitions across its shard groups (its check reads the "
                      "boundary flag in the backward); replayed as DeepSpeed runs it",
                      MicsWarning, stacklevel=5)


def _warn_idle_leaf_rules(scenario: Any) -> None:
    """`module_granularity_threshold` or a `leaf_module` entry given but flagging no module:
    below ZeRO-3 (no hooks to spare), a threshold under every module's granularity
    (DeepSpeed logs the finest), or a class, name or suffix of no module zerosim builds
    (`zerosim.models.leaves`: transformers' Llama-style names, the classes of the model
    types in `HF_CLASSES`)."""
    from zerosim.scenario.deepspeed import DEFAULT_LEAF_MODULE_CLASSES

    rules = scenario.deepspeed.leaves
    classes = () if rules.classes == DEFAULT_LEAF_MODULE_CLASSES else rules.classes
    given = {"module_granularity_threshold": rules.granularity_threshold,
             "leaf_module": classes or rules.names or rules.name_suffixes}
    said = [key for key, value in given.items() if value]
    if not said:
        return
    if scenario.deepspeed.stage != 3:
        _warn_leaves(scenario, said[0], f"does nothing at ZeRO-{scenario.deepspeed.stage}: "
                     "only ZeRO-3 hooks modules and fetches their parameters")
        return
    from zerosim.engine.plan import leaves_of

    found = leaves_of(scenario)
    if found.finest is not None:
        name, grain = found.finest
        _warn_leaves(scenario, "module_granularity_threshold",
                     f"{rules.granularity_threshold} makes no module a leaf: the finest, "
                     f"'{name}', has a granularity of {grain}")
    unplaced = [f"class {c}" for c in found.unmatched_classes if c in classes] + [
        f"name {n}" for n in found.unmatched_names] + [
        f"name suffix {n}" for n in found.unmatched_suffixes]
    if unplaced:
        _warn_leaves(scenario, "leaf_module", f"{', '.join(unplaced)} match no module of "
                     f"the model as zerosim builds it (names as transformers' Llama has them, "
                     f"model.layers.N.self_attn; classes of known model types), so nothing is "
                     f"a leaf by them")


def _warn_leaves(scenario: Any, key: str, what: str) -> None:
    warnings.warn(f"{scenario.source}: {ZERO}.{key} {what}", LeafModuleWarning, stacklevel=6)


def _warn_superoffload_rollback(scenario: Any) -> None:
    """SuperOffload up to 0.18.8 with `gradient_clipping`: `check_clip_grads` decides at each
    step whether to roll back and re-step every CPU sub-group, on the gradients' norm."""
    ds = scenario.deepspeed
    if (not ds.offload_optimizer.super_offload or not ds.gradient_clipping
            or scenario.behaviours.superoffload_shared_buffers):
        return
    warnings.warn(
        f"{scenario.source}: deepspeed.gradient_clipping: {ds.gradient_clipping:g} with "
        f"SuperOffload on DeepSpeed {scenario.runtime.version_text}: its sub-groups are stepped "
        "during the backward and, at a step whose gradient norm exceeds the clip, rolled back "
        "and stepped again in the step; zerosim replays a step where the norm does not clip",
        UnreplayedRollbackWarning, stacklevel=5)


def _warn_zenflow_selection_by_steps(scenario: Any) -> None:
    """ZenFlow's `select_strategy: step` re-selects the top-k columns every `select_interval`
    steps (`update_selected_channels` after each reduction, the fp32 partition re-synced from
    the GPU, the moments cleared); a replayed window holds none of that, as with the default
    once-per-epoch selection."""
    zenflow = scenario.deepspeed.zenflow
    if zenflow is None or zenflow.select_strategy != "step" or not zenflow.select_interval:
        return
    warnings.warn(
        f"{scenario.source}: {ZERO}.zenflow.select_interval: {zenflow.select_interval} steps "
        "between selections of the gradient columns; zerosim does not replay the selection "
        "(its column sums, top-k and index broadcasts, and the fp32 partition re-synced from "
        "the GPU), so a window that holds one is priced short", UnreplayedSelectionWarning,
        stacklevel=5)


def _warn_unpriced_reports(scenario: Any) -> None:
    """`memory_breakdown` on with a stack that leaves out a value its reports are priced
    with (a zero given on purpose is a value)."""
    from zerosim.stacks import GC_OBJECT_KEY, GC_OBJECTS_KEYS, GC_ZERO3_KEY

    stack = scenario.stack
    needed = [GC_OBJECT_KEY, *GC_OBJECTS_KEYS]
    if scenario.deepspeed.stage != 3:
        needed.remove(GC_ZERO3_KEY)
    missing = [key for key in needed if key not in stack.provenance]
    if scenario.deepspeed.memory_breakdown and missing:
        warnings.warn(
            f"{scenario.source}: deepspeed.memory_breakdown: true is priced short here: the "
            f"software stack {stack.name} has no {' and no '.join(missing)} (0 in their "
            "place), so each memory report's gc.collect() is cheaper than it is or free",
            UnpricedReportsWarning, stacklevel=5)


def _warn_inert_gpu_update(scenario: Any) -> None:
    every = scenario.what_if.gpu_update_every
    if not every:
        return
    from zerosim.engine.plan import plan_of

    plan = plan_of(scenario)
    count = len(plan.subgroups)
    if not any((group + 1) % every == 0 and group not in plan.gpu_subgroups
               for group in range(count)):
        warnings.warn(
            f"{scenario.source}: what_if.gpu_update_every: {every} updates no sub-group on the "
            f"GPU: each rank has {count} optimizer sub-group(s) (sub_group_size "
            f"{scenario.deepspeed.sub_group_size:.3g}), so none is moved to the GPU",
            InertWhatIfWarning, stacklevel=5)


def _warn_gpu_subgroup_of_a_later_param_group(scenario: Any) -> None:
    """The fork's interleaved update (DataStates/DeepSpeed@4570a955 stage3.py) steps a GPU
    sub-group through its backup AdamW by first deleting `backup_optimizer.param_groups[g]
    ['params'][0]` (`step`, line 2246). For g > 0 that group is the CPU optimizer's own dict
    (`add_param_group(self.optimizer.param_groups[i])`, line 246), whose `params` the setup
    emptied (line 963), so the `del` raises IndexError. zerosim replays the sub-group as a
    GPU one; a run of that code would stop at its first step."""
    if not scenario.deepspeed.offload_optimizer.prefetch_optimizer:
        return
    from zerosim.engine.plan import plan_of

    plan = plan_of(scenario)
    failing = [g for g in range(len(plan.subgroups))
               if plan.interleaved_on_gpu(g) and plan.subgroup_param_group[g] > 0]
    if failing:
        warnings.warn(
            f"{scenario.source}: {ZERO}.offload_optimizer.prefetch_optimizer_gap: "
            f"{scenario.deepspeed.offload_optimizer.prefetch_optimizer_gap} puts sub-group "
            f"{failing[0]} of {len(plan.subgroups)}, of the optimizer's parameter group "
            f"{plan.subgroup_param_group[failing[0]]} ({scenario.stack.name} hands the "
            "one-dimensional tensors over apart), on the GPU, where the fork's step as "
            "written raises IndexError (stage3.py at 4570a955, line 2246); zerosim replays it "
            "as a GPU sub-group", ForkStepFailsWarning, stacklevel=5)


def _refuse(scenario: Any, key: str, expected: str, got: Any) -> None:
    raise UnsupportedConfigError(scenario.source, key, expected, got)


def _needs_16bit_training(scenario: Any) -> None:
    if scenario.deepspeed.dtype == "fp32":
        _refuse(scenario, "deepspeed.fp16.enabled",
                "fp16 or bf16 enabled (without either DeepSpeed trains in fp32, which zerosim "
                "does not replay: it models 16-bit mixed precision; an 'auto' enabled takes "
                "the scenario's precision, fp16 or bf16, in the block the ds_config has)",
                "neither fp16.enabled nor bf16.enabled true (fp32 training)")


def _no_tensor_parallel(scenario: Any) -> None:
    size = scenario.deepspeed.autotp_size
    if size > 1:
        _refuse(scenario, "deepspeed.tensor_parallel.autotp_size",
                "0 or 1 (DeepSpeed from 0.16.4 would split every layer over that many GPUs; "
                "zerosim replays data parallelism only)", size)


def _offload_needs_zero(scenario: Any) -> None:
    ds = scenario.deepspeed
    if ds.stage == 0 and ds.offload_optimizer.enabled:
        _refuse(scenario, f"{ZERO}.offload_optimizer.device",
                "'none' at stage 0 (DeepSpeed offloads the optimizer only under ZeRO 1-3)",
                ds.offload_optimizer.device)


def _param_offload_needs_stage3(scenario: Any) -> None:
    ds = scenario.deepspeed
    if ds.stage < 3 and ds.offload_param.enabled:
        _refuse(scenario, f"{ZERO}.offload_param.device",
                f"'none' below stage 3 (parameter offload is a ZeRO-3 feature; stage is "
                f"{ds.stage})", ds.offload_param.device)


def _nvme_param_offload_needs_optimizer_offload(scenario: Any) -> None:
    ds = scenario.deepspeed
    if ds.offload_param.nvme and not ds.offload_optimizer.enabled:
        _refuse(scenario, f"{ZERO}.offload_optimizer.device",
                "the optimizer offloaded too when parameters go to NVMe (zerosim does not "
                "model NVMe parameter offload with the optimizer on the GPU)",
                ds.offload_optimizer.device)


def _twin_flow_needs_offload(scenario: Any) -> None:
    ds = scenario.deepspeed
    if ds.offload_optimizer.ratio < 1 and not ds.offload_optimizer.enabled:
        _refuse(scenario, f"{ZERO}.offload_optimizer.ratio",
                "1.0 unless the optimizer is offloaded (Twin-Flow splits offloaded state)",
                ds.offload_optimizer.ratio)


def _what_ifs_need_offloaded_stage3(scenario: Any) -> None:
    ds, what_if = scenario.deepspeed, scenario.what_if
    for name in ("overlap_copy_back", "buffer_boundary_grads", "gpu_update_every"):
        if getattr(what_if, name) and (ds.stage < 3 or not ds.offload_optimizer.enabled):
            _refuse(scenario, f"what_if.{name}",
                    "off unless ZeRO stage 3 offloads the optimizer (the study's what-ifs "
                    f"change that replay; stage {ds.stage}, offload_optimizer "
                    f"{ds.offload_optimizer.device})", getattr(what_if, name))


def _nvme_sections(scenario: Any) -> list[tuple[str, Any]]:
    ds = scenario.deepspeed
    return [(name, settings) for name, settings in (("offload_optimizer", ds.offload_optimizer),
                                                    ("offload_param", ds.offload_param))
            if settings.nvme]


def _nvme_needs_drives(scenario: Any) -> None:
    for name, settings in _nvme_sections(scenario):
        if not scenario.hardware.has_nvme:
            _refuse(scenario, f"{ZERO}.{name}.device",
                    f"'cpu' or 'none' on {scenario.hardware.name} (its profile has no NVMe "
                    "drives: nvme.drives_per_node is 0)", settings.device)


def _what_ifs_not_with_nvme(scenario: Any) -> None:
    what_if = scenario.what_if
    if scenario.deepspeed.offload_optimizer.nvme and (what_if.gpu_update_every
                                                      or what_if.buffer_boundary_grads):
        _refuse(scenario, "what_if", "no gpu_update_every or buffer_boundary_grads with the "
                "optimizer on NVMe (zerosim does not model them with swapped state)",
                what_if.model_dump())


def _interleaved_update_is_offloaded_stage3(scenario: Any) -> None:
    """The fork's `prefetch_optimizer` replaces ZeRO-3's CPU step with the 16-bit partition
    in HBM: what zerosim replays (the fork also changes stage_1_and_2.py, not replayed)."""
    ds = scenario.deepspeed
    o = ds.offload_optimizer
    if o.prefetch_optimizer and (ds.stage != 3 or o.device != "cpu" or o.ratio < 1
                                 or ds.offload_param.enabled):
        _refuse(scenario, f"{ZERO}.offload_optimizer.prefetch_optimizer",
                "true only with stage 3, offload_optimizer.device 'cpu', ratio 1.0 and no "
                "offload_param (zerosim replays the fork's interleaved update of ZeRO-3 with "
                "the 16-bit partition in HBM)", f"stage {ds.stage}, device '{o.device}', "
                f"ratio {o.ratio}, offload_param '{ds.offload_param.device}'")


def _step_what_ifs_not_with_the_interleaved_update(scenario: Any) -> None:
    """The interleaved update replaces the CPU step that `overlap_copy_back` and
    `gpu_update_every` change."""
    what_if = scenario.what_if
    if scenario.deepspeed.offload_optimizer.prefetch_optimizer:
        for name in ("overlap_copy_back", "gpu_update_every"):
            if getattr(what_if, name):
                _refuse(scenario, f"what_if.{name}", "off with the Deep Optimizer States "
                        "fork's prefetch_optimizer (its interleaved update replaces the step "
                        "this what-if changes)", getattr(what_if, name))


def _zenflow_is_zero12_with_a_fixed_interval(scenario: Any) -> None:
    """zerosim replays ZenFlow's ZeRO-1/2 optimizer (`zenflow_stage_1_and_2.py`) over a
    window of `update_interval` training steps; ZeRO-3's (DeepSpeed 0.18.1+) is not modelled,
    and an "auto" interval is set at run time by the gradients' norms."""
    ds = scenario.deepspeed
    zenflow = ds.zenflow
    if zenflow is None:
        return
    if ds.stage not in (1, 2):
        _refuse(scenario, f"{ZERO}.stage", "1 or 2 with zenflow (zerosim replays ZenFlow's "
                "ZeRO-1/2 optimizer; its ZeRO-3 one, from DeepSpeed 0.18.1, is not modelled)",
                ds.stage)
    if zenflow.update_interval is None:
        _refuse(scenario, f"{ZERO}.zenflow.update_interval",
                "a whole number of steps (with 'auto' ZenFlow runs the CPU update when the "
                "accumulated gradients' norms say so, which depends on the data: give the "
                "interval to replay, 4 in DeepSpeed's ZenFlow examples)", "auto")


def _super_offload_is_replayed(scenario: Any) -> None:
    """zerosim replays SuperOffload (`offload_optimizer.super_offload`) with the optimizer state
    in host memory and DeepSpeed's own step around it: NVMe swapping and the study's
    what-ifs are not modelled with it."""
    ds = scenario.deepspeed
    if not ds.offload_optimizer.super_offload:
        return
    for name, settings in (("offload_optimizer", ds.offload_optimizer),
                           ("offload_param", ds.offload_param)):
        if settings.nvme:
            _refuse(scenario, f"{ZERO}.{name}.device", "'cpu' or 'none' with super_offload "
                    "(zerosim does not replay SuperOffload with state on NVMe)", "nvme")
    for name in ("overlap_copy_back", "buffer_boundary_grads", "gpu_update_every"):
        if getattr(scenario.what_if, name):
            _refuse(scenario, f"what_if.{name}", "off with super_offload (the what-if changes "
                    "DeepSpeed's own CPU step, which SuperOffload's replaces)",
                    getattr(scenario.what_if, name))


def _hpz_is_replayed(scenario: Any) -> None:
    """hpZ is replayed from DeepSpeed 0.13.2, where a fetch uses the secondary partitions
    wherever they exist (PR #4906); before, the coordinator's forward flag (grad enabled at
    the module's pre-forward hook) picked the process group, which zerosim does not
    replay."""
    ds = scenario.deepspeed
    if (ds.stage == 3 and ds.zero_plus_plus.hpz_group(scenario.data_parallel) > 1
            and not scenario.behaviours.hpz_secondary_by_presence):
        _refuse(scenario, f"{ZERO}.zero_hpz_partition_size", "1 before DeepSpeed 0.13.2 "
                "(zerosim replays hpZ as PR #4906 made it: before, the forward flag picks "
                "between the secondary and the primary partitions, not modelled)",
                ds.zero_plus_plus.hpz_partition_size)


def _qgz_groups_fit(scenario: Any) -> None:
    """qgZ's all-to-all groups, which the engine builds whenever `zero_quantized_gradients`
    is on, at any stage (utils/groups.py `_get_local_all_to_all_group`): one of the
    `device_count()` consecutive ranks of each node, and one of each local index across the
    nodes. A world above one node's GPUs that they do not divide fails: under two nodes'
    worth the builder asserts; from two, the ranks past the last full node get no group, and
    ZeRO-3's first reduction fails looking theirs up."""
    ds = scenario.deepspeed
    world, per_node = scenario.data_parallel, scenario.hardware.gpus_per_node
    if (ds.zero_plus_plus.quantized_gradients and world > per_node and world % per_node
            and (ds.stage == 3 or world < 2 * per_node)):
        _refuse(scenario, f"{ZERO}.zero_quantized_gradients", f"false with {world} ranks on "
                f"nodes of {per_node} GPUs (DeepSpeed's all-to-all groups take whole nodes: "
                f"the ranks must be a multiple of {per_node} or fewer)", True)


def _qgz_reduces_by_reduce_scatter(scenario: Any) -> None:
    """ZeRO-3 given qgZ's groups asserts `reduce_scatter` (stage3.py: 'when enable
    all_to_all_reduce, reduce_scatter should also be enabled for data type checks'), on one
    node too."""
    ds = scenario.deepspeed
    if ds.stage == 3 and ds.zero_plus_plus.quantized_gradients and not ds.reduce_scatter:
        _refuse(scenario, f"{ZERO}.reduce_scatter", "true with zero_quantized_gradients "
                "(DeepSpeed's ZeRO-3 asserts it: 'when enable all_to_all_reduce, "
                "reduce_scatter should also be enabled')", False)


def _qgz_tensors_divide(scenario: Any) -> None:
    """Before DeepSpeed 0.13.2 (PR #5056) qgZ all-to-alls every multi-dimensional gradient,
    and one whose element count is not a multiple of twice the world size fails there on
    the buffers' sizes; from 0.13.2 it is reduce-scattered instead."""
    ds, world = scenario.deepspeed, scenario.data_parallel
    if (scenario.behaviours.qgz_indivisible_fallback or not ds.zero_plus_plus
            .quantizes_gradients(ds.stage, world, scenario.hardware.gpus_per_node)):
        return
    from zerosim.engine.plan import plan_of

    plan = plan_of(scenario)
    for param in plan.all_params:
        if plan.qgz_groups(param, falls_back=False) and param.numel % (2 * world):
            _refuse(scenario, f"{ZERO}.zero_quantized_gradients", "false before DeepSpeed "
                    f"0.13.2 with a gradient of {param.numel:,} elements "
                    f"({plan.modules[param.module].name}), not a multiple of twice the {world} "
                    "ranks (its int4 all-to-all fails on the buffers' sizes; PR #5056 made "
                    "0.13.2 reduce-scatter it instead)", True)


def _low_precision_master_is_replayed(scenario: Any) -> None:
    """zerosim replays bf16 master weights (`bf16.bf16_master_weights_and_grads`, DeepSpeed
    0.18.3+) and fp16 ones (`fp16.fp16_master_weights_and_grads`, as 0.18.3+ steps them) with
    DeepSpeed's own step over the whole optimizer, in host memory or (bf16 moments) in HBM,
    Twin-Flow's GPU sub-groups included. NVMe, ZenFlow, SuperOffload, PyTorch's AdamW as the
    optimizer and the study's what-ifs are not modelled with them, nor ZeRO-2's fp16 master
    weights before 0.18.3, a path of their own."""
    ds = scenario.deepspeed
    if not ds.low_precision_master:
        return
    if not scenario.behaviours.low_precision_master_weights:
        _refuse(scenario, "deepspeed.fp16.fp16_master_weights_and_grads", "false before "
                "DeepSpeed 0.18.3 (zerosim replays fp16 master weights as 0.18.3+ steps them, "
                "through the master-weights path PR #7700 made common to fp16 and bf16; up to "
                "0.18.2 ZeRO-2 has a path of its own, not modelled)", True)
    why = (f"with {ds.master_dtype}_master_weights_and_grads (zerosim replays it with ")
    o = ds.offload_optimizer
    if o.nvme:
        _refuse(scenario, f"{ZERO}.offload_optimizer.device", "'cpu' or 'none' " + why +
                "the optimizer in host memory or in HBM: on NVMe it is not modelled)", o.device)
    if ds.offload_param.enabled and not (o.device == "cpu" and ds.offload_param.device == "cpu"):
        _refuse(scenario, f"{ZERO}.offload_param.device", "'none', or 'cpu' with the optimizer "
                "on the CPU, " + why + "the params on the GPU, or in host memory beside the "
                "optimizer)", ds.offload_param.device)
    if ds.torch_adam:
        _refuse(scenario, "deepspeed.optimizer.params.torch_adam", "false " + why +
                "DeepSpeedCPUAdam or FusedAdam as the optimizer)", True)
    if o.super_offload:
        _refuse(scenario, f"{ZERO}.offload_optimizer.super_offload", "false " + why +
                "DeepSpeed's own step; SuperOffload's optimizer process copies each gradient "
                "into a fp32 pinned buffer, superoffload_utils.py, which does not match the "
                "16-bit params it steps, up to 0.19.5)", True)
    if ds.zenflow is not None:
        _refuse(scenario, f"{ZERO}.zenflow", "absent " + why + "DeepSpeed's own step)",
                "a zenflow section")
    if ds.grad_accum_dtype != ds.master_dtype:
        _refuse(scenario, "deepspeed.data_types.grad_accum_dtype", f"{ds.master_dtype} " + why +
                f"the gradients accumulated in {ds.master_dtype}, the master gradients' dtype)",
                ds.grad_accum_dtype)
    for name in ("overlap_copy_back", "buffer_boundary_grads", "gpu_update_every"):
        if getattr(scenario.what_if, name):
            _refuse(scenario, f"what_if.{name}", "off " + why + "DeepSpeed's own step: the "
                    "what-ifs move fp32 state)", getattr(scenario.what_if, name))


def _nvme_buffers_suffice(scenario: Any) -> None:
    """DeepSpeed's own limits that depend on the model (docs/nvme.md): enough optimizer swap
    buffers for the pipelining asked for, enough parameter swap buffers for the widest ZeRO-3
    leaf's tensors, and parameter partitions smaller than one buffer."""
    if not _nvme_sections(scenario):
        return
    from zerosim.engine.plan import plan_of
    from zerosim.hardware import nvme

    ds, plan = scenario.deepspeed, plan_of(scenario)
    opt = ds.offload_optimizer
    needed = nvme.optimizer_buffers_needed(len(plan.nvme_subgroups),
                                           pipeline_read=opt.pipeline_read,
                                           pipeline_write=opt.pipeline_write)
    if opt.nvme and opt.buffer_count < needed:
        _refuse(scenario, f"{ZERO}.offload_optimizer.buffer_count",
                f"at least {needed} (DeepSpeed: 'ran out of swap buffers, try increasing "
                "buffer_count': 4 per sub-group in flight, with "
                f"{len(plan.nvme_subgroups)} swapped sub-groups)", opt.buffer_count)
    widest = max((plan.nvme_tensors(m) for m in range(len(plan.modules))), default=0)
    if widest > ds.offload_param.buffer_count:
        _refuse(scenario, f"{ZERO}.offload_param.buffer_count",
                f"at least {widest}, the tensors on NVMe of the widest ZeRO-3 leaf, which its "
                "hook swaps in at once (DeepSpeed asserts 'Not enough buffers')",
                ds.offload_param.buffer_count)
    largest = max((p.partition_numel for p in plan.all_params
                   if (p.module, p.index) in plan.nvme_params), default=0)
    if largest and largest >= ds.offload_param.buffer_size:
        _refuse(scenario, f"{ZERO}.offload_param.buffer_size",
                f"more than {largest} elements, the largest parameter partition on NVMe "
                "(DeepSpeed asserts numel < elements_per_buffer)", ds.offload_param.buffer_size)


def _mics_replicas_reduce_on_the_gpu(scenario: Any) -> None:
    """With more than one shard group, MiCS all-reduces each bucket's gradient partitions
    across the groups at the accumulation boundary (`allreduce_mics_shard_grads`), which
    raises where those partitions live in host memory, as ZeRO-3 keeps them with the
    optimizer offloaded (to the CPU or NVMe)."""
    ds, world = scenario.deepspeed, scenario.data_parallel
    replicas = ds.mics.replicas(ds.stage, world)
    if replicas > 1 and ds.offload_optimizer.enabled:
        _refuse(scenario, f"{ZERO}.offload_optimizer.device", "none with mics_shard_size "
                f"{ds.mics.shard_size} below the {world} ranks (DeepSpeed raises 'Local "
                "sharding has no support for CPU offloading' at the first accumulation "
                f"boundary: MiCS all-reduces the gradient partitions across its {replicas} "
                "shard groups on the GPU, and the offloaded optimizer keeps them in host "
                "memory)", ds.offload_optimizer.device)


def _mics_gathers_from_the_gpu(scenario: Any) -> None:
    """MiCS's all-gather (`_flat_all_gather_with_coalescing_manager`) hands NCCL each
    partition where it lives, which fails for partitions in host memory; its hierarchical
    gather copies them to the GPU first, which zerosim does not replay."""
    ds = scenario.deepspeed
    if ds.mics.acts(ds.stage) and ds.offload_param.enabled:
        _refuse(scenario, f"{ZERO}.offload_param.device", "none with mics_shard_size "
                "(MiCS's all-gather hands NCCL the partitions where they live, in host "
                "memory, which NCCL rejects; zerosim does not replay its hierarchical gather "
                "from the host either)", ds.offload_param.device)


def _mics_hierarchy_spans_nodes(scenario: Any) -> None:
    """For the hierarchical gather `create_mics_comm_groups` asserts that a shard group spans
    more than one node (its size over the GPUs a node has, `device_count()`, floored: 'no
    need for hierarchy allgather') and splits evenly over those nodes."""
    ds, per_node = scenario.deepspeed, scenario.hardware.gpus_per_node
    if not (ds.mics.acts(ds.stage) and ds.mics.hierarchical):
        return
    size = ds.mics.shard_size
    span = size // per_node
    if span <= 1:
        _refuse(scenario, f"{ZERO}.mics_hierarchical_params_gather", f"false with "
                f"mics_shard_size {size} on nodes of {per_node} GPUs (DeepSpeed asserts "
                "'sharding spans on single node, no need for hierarchy allgather': a shard "
                f"group needs at least {2 * per_node} ranks)", True)
    if size % span:
        _refuse(scenario, f"{ZERO}.mics_hierarchical_params_gather", f"false with "
                f"mics_shard_size {size}, which does not split evenly over the {span} "
                f"nodes' worth of {per_node} GPUs it spans (DeepSpeed asserts it)", True)


def _mics_alone(scenario: Any) -> None:
    """zerosim replays MiCS on ZeRO-3's own parts: not beside ZeRO++ (MiCS's all-gather
    bypasses hpZ's secondary partitions and qwZ's quantization; qgZ's groups span every
    rank where MiCS's partitions span a shard group), SuperOffload (MiCS's optimizer takes
    the place of its one) or the fork's interleaved update."""
    ds = scenario.deepspeed
    if not ds.mics.acts(ds.stage):
        return
    zpp, o = ds.zero_plus_plus, ds.offload_optimizer
    for key, value, on in (("zero_hpz_partition_size", zpp.hpz_partition_size,
                            zpp.hpz_partition_size > 1),
                           ("zero_quantized_weights", True, zpp.quantized_weights),
                           ("zero_quantized_gradients", True, zpp.quantized_gradients),
                           ("offload_optimizer.super_offload", True, o.super_offload),
                           ("offload_optimizer.prefetch_optimizer", True,
                            o.prefetch_optimizer)):
        if on:
            _refuse(scenario, f"{ZERO}.{key}", "off with mics_shard_size (zerosim replays "
                    "MiCS on ZeRO-3's own parts, not beside ZeRO++, SuperOffload or the "
                    "fork's interleaved update: MiCS's all-gather bypasses hpZ's and qwZ's, "
                    "qgZ's groups span every rank, MiCS's optimizer replaces SuperOffload's)",
                    value)


def _unmanaged_accumulation_is_replayed(scenario: Any) -> None:
    """`managed_gradient_accumulation: false` where DeepSpeed asserts (engine.py
    `_do_sanity_check`: ZeRO offload before 0.19.5; `overlap_comm` below ZeRO-2) and where
    zerosim does not replay it: ZeRO-0/1, whose reduction moves into step(); ZenFlow;
    SuperOffload. ZeRO-2 and ZeRO-3 are replayed: no backward is the boundary, and an
    offloaded step() opens with the boundary's flush (`sinks.HostPartitions.finalize`,
    `sinks.HostAccumulation.finalize`)."""
    ds = scenario.deepspeed
    if ds.managed_accumulation:
        return
    key = "deepspeed.managed_gradient_accumulation"
    offloaded = [name for name, settings in (("optimizer state", ds.offload_optimizer),
                                             ("parameter", ds.offload_param))
                 if settings.enabled]
    if offloaded and not scenario.behaviours.unmanaged_accumulation_offload:
        _refuse(scenario, key, f"true with ZeRO {offloaded[0]} offload before DeepSpeed "
                f"0.19.5 (the engine asserts 'managed_gradient_accumulation=False is not "
                f"supported with ZeRO {offloaded[0]} offload')", False)
    if ds.stage < 2 and ds.overlap_comm:
        _refuse(scenario, key, f"true with overlap_comm at ZeRO-{ds.stage} (the engine "
                "asserts 'managed_gradient_accumulation=False supports ZeRO overlap_comm "
                "only with ZeRO stage 2')", False)
    if ds.stage < 2:
        _refuse(scenario, key, f"true at ZeRO-{ds.stage} (zerosim does not replay unmanaged "
                "accumulation there: the gradients' reduction moves from the last backward "
                "into step())", False)
    if ds.zenflow is not None:
        _refuse(scenario, key, "true with ZenFlow (not replayed)", False)
    if ds.offload_optimizer.super_offload:
        _refuse(scenario, key, "true with super_offload (not replayed)", False)




def _ulysses_runs(scenario: Any) -> None:
    """Where DeepSpeed's Ulysses stops, as the stack runs it (its `modules.sequence_parallel`):
    UlyssesSPAttentionHF (runtime/sequence_parallel/ulysses_sp.py, 0.17.0 to 0.19.5) raises
    before 0.17.0, on eager attention (it wants a 4D mask SP discards), and unless the size
    divides the attention heads and divides, or is divided by, the key-value heads;
    DistributedAttention (sequence/layer.py, 0.10.2+) under Megatron-DeepSpeed asserts that
    the size divides the attention heads (and, with K and V not expanded first, their heads),
    and from 0.14.5 its forward takes the batch dimension where the stack's revision hands it
    the attention mask. Either shards the sequence evenly."""
    size = scenario.deepspeed.sequence_parallel_size
    if size == 1:
        return
    path, behaviours = scenario.stack.recipe.sequence_parallel, scenario.behaviours
    model = scenario.model
    heads, kv_heads = model.num_attention_heads, model.num_key_value_heads
    if path == "ulysses_hf":
        if not behaviours.ulysses_hf:
            _refuse(scenario, SEQUENCE_PARALLEL_KEY, "1 before DeepSpeed 0.17.0 (Ulysses for "
                    "transformers' models, UlyssesSPAttentionHF, is new in 0.17.0)", size)
        if scenario.attention == "eager":
            _refuse(scenario, "attention", "flash or sdpa with sequence_parallel_size "
                    f"{size} (DeepSpeed raises: 'eager attn_implementation isn't currently "
                    "supported by Ulysses sequence parallelism because it requires a 4D "
                    "attention_mask')", scenario.attention)
        if kv_heads % size and size % kv_heads:
            _refuse(scenario, SEQUENCE_PARALLEL_KEY, f"a divisor or a multiple of the {kv_heads} "
                    f"key-value heads (DeepSpeed raises 'KV attention head count {kv_heads} "
                    f"is not divisible by SP size {size} or vice versa')", size)
    if path == "distributed_attention":
        if not behaviours.distributed_attention:
            _refuse(scenario, SEQUENCE_PARALLEL_KEY, "1 before DeepSpeed 0.10.2 (DeepSpeed-"
                    "Ulysses's DistributedAttention is new in 0.10.2)", size)
        if behaviours.distributed_attention_batch_dim:
            _refuse(scenario, SEQUENCE_PARALLEL_KEY, f"1 with the {scenario.stack.name} stack "
                    "on DeepSpeed 0.14.5 or later (DistributedAttention.forward takes the "
                    "batch dimension's index where the stack's Megatron-DeepSpeed revision "
                    "hands it the attention mask)", size)
        if kv_heads % size and not scenario.stack.recipe.kv_repeat_before_rotary:
            _refuse(scenario, SEQUENCE_PARALLEL_KEY, f"a divisor of the {kv_heads} key-value "
                    "heads, which DistributedAttention exchanges as they are", size)
    if heads % size:
        _refuse(scenario, SEQUENCE_PARALLEL_KEY, f"a divisor of the {heads} attention heads "
                f"(DeepSpeed raises 'Attention head count {heads} is not divisible by SP "
                f"size {size}'; Megatron-DeepSpeed asserts it)", size)
    if scenario.sequence_length % size:
        _refuse(scenario, SEQUENCE_PARALLEL_KEY, f"a divisor of sequence_length "
                f"{scenario.sequence_length} (each rank of a group takes an equal slice)",
                size)


def _ulysses_is_replayed(scenario: Any) -> None:
    """zerosim replays Ulysses where the stack says how its framework runs it
    (`modules.sequence_parallel`), around standard multi-head or grouped-query attention,
    with ZeRO's own partitioning over every rank. Not: DistributedAttention's list all-to-all
    before 0.12.4, or its flash path (before 0.14.5 it gathers a [batch, sequence, ...] layout
    along the batch, so each slice would attend only to itself); MLA or attention sinks (their
    heads do not take the exchange as it is); MiCS or ZeRO++ (their groups), ZenFlow,
    SuperOffload or the fork's interleaved update."""
    ds = scenario.deepspeed
    size = ds.sequence_parallel_size
    if size == 1:
        return
    path = scenario.stack.recipe.sequence_parallel
    if path == "none":
        _refuse(scenario, "runtime.framework", f"a stack that says how its framework runs "
                f"Ulysses (modules.sequence_parallel) with sequence_parallel_size {size}",
                scenario.stack.name)
    if path == "distributed_attention":
        if not scenario.behaviours.single_all_to_all:
            _refuse(scenario, SEQUENCE_PARALLEL_KEY, "1 before DeepSpeed 0.12.4 (zerosim "
                    "replays DistributedAttention's single all_to_all_single, not the list "
                    "all_to_all of tensor_split pieces before it)", size)
        if scenario.attention != "eager":
            _refuse(scenario, "attention", f"eager with sequence_parallel_size {size} on "
                    f"the {scenario.stack.name} stack (its flash path hands "
                    "DistributedAttention [batch, sequence, ...] tensors, which DeepSpeed "
                    "before 0.14.5 gathers along the batch: each slice would attend only to "
                    "itself, not replayed)", scenario.attention)
    model = scenario.model
    for flag, what in ((model.mla is not None, "multi-head latent attention"),
                       (model.attention_sinks, "attention sinks")):
        if flag:
            _refuse(scenario, SEQUENCE_PARALLEL_KEY, f"1 for a model with {what} (zerosim does "
                    "not replay Ulysses around it)", size)
    zpp, o = ds.zero_plus_plus, ds.offload_optimizer
    for key, value, on in (("zero_optimization.mics_shard_size", ds.mics.shard_size,
                            ds.mics.acts(ds.stage)),
                           ("zero_optimization.zero_hpz_partition_size",
                            zpp.hpz_partition_size, zpp.hpz_partition_size > 1),
                           ("zero_optimization.zero_quantized_weights", True,
                            zpp.quantized_weights),
                           ("zero_optimization.zero_quantized_gradients", True,
                            zpp.quantized_gradients),
                           ("zero_optimization.zenflow", "set", ds.zenflow is not None),
                           ("zero_optimization.offload_optimizer.super_offload", True,
                            o.super_offload),
                           ("zero_optimization.offload_optimizer.prefetch_optimizer", True,
                            o.prefetch_optimizer)):
        if on:
            _refuse(scenario, f"deepspeed.{key}", f"off with sequence_parallel_size {size} "
                    "(zerosim replays Ulysses beside ZeRO's own partitioning over every rank, "
                    "not with MiCS, ZeRO++, ZenFlow, SuperOffload or the fork's interleaved "
                    "update)", value)


TILED_MLP = "runtime.tiled_mlp_shards"
TILED_LOSS = "runtime.tiled_loss_shards"


def _tiled_shards(scenario: Any, key: str, behaviour: str, since: str, call: str) -> Any:
    """A tiled call's slice count (None: not tiled), refused before the DeepSpeed release
    that brings `call`."""
    shards = getattr(scenario.runtime, key.removeprefix("runtime."))
    if shards is not None and not getattr(scenario.behaviours, behaviour):
        _refuse(scenario, key, f"unset before DeepSpeed {since} ({call} is new in {since})",
                shards)
    return shards


def tiling_refusal(scenario: Any, part: str) -> str:
    """Why the scenario cannot tile `part` (`loss` or `mlp`) at `auto` slices, as the rules
    above say ('' where it can): what `zerosim tune`'s tiling knob offers."""
    from dataclasses import replace

    key, rule = {"loss": ("tiled_loss_shards", _tiled_loss_runs),
                 "mlp": ("tiled_mlp_shards", _tiled_mlp_runs)}[part]
    return _refusal(rule, replace(scenario, runtime=replace(scenario.runtime, **{key: "auto"})))


def sequence_parallel_refusal(scenario: Any, size: int) -> str:
    """Why the scenario cannot run Ulysses over groups of `size` ranks, as the rules above say
    ('' where it can): what `zerosim tune`'s `sequence_parallel` knob offers."""
    from dataclasses import replace

    sized = replace(scenario, deepspeed=replace(scenario.deepspeed,
                                                sequence_parallel_size=size))
    return _refusal(_ulysses_runs, sized) or _refusal(_ulysses_is_replayed, sized)


def _refusal(rule: Any, scenario: Any) -> str:
    """What `rule` refuses in `scenario` ('' where it passes)."""
    try:
        rule(scenario)
    except UnsupportedConfigError as refusal:
        return str(refusal)
    return ""


def _tiled_mlp_runs(scenario: Any) -> None:
    """DeepSpeed's TiledMLP, as Arctic Long Sequence Training patches a transformers model's
    MLP (`down_proj(act_fn(gate_proj(x)) * up_proj(x))`): new in 0.17.0, for a gated MLP
    whose gate and up projections are modules of their own; not a mixture of experts."""
    shards = _tiled_shards(scenario, TILED_MLP, "tiled_mlp", "0.17.0", "TiledMLP")
    if shards is None:
        return
    model, recipe = scenario.model, scenario.stack.recipe
    if not model.gated_mlp:
        _refuse(scenario, TILED_MLP, "unset for a model without a gated MLP (the tiled "
                "forward calls gate_proj, up_proj and down_proj)", shards)
    if model.fused_gate_up or recipe.fused_gate_up:
        _refuse(scenario, TILED_MLP, "unset where the gate and up projections are one module "
                f"(the {scenario.stack.name} stack's or the model's: the tiled forward calls "
                "gate_proj and up_proj)", shards)
    if any(model.is_moe_layer(layer) for layer in range(model.num_hidden_layers)):
        _refuse(scenario, TILED_MLP, "unset for a mixture-of-experts model (zerosim tiles "
                "dense MLPs only)", shards)


def _tiled_loss_runs(scenario: Any) -> None:
    """DeepSpeed's TiledFusedLogitsLoss as Arctic Long Sequence Training's trainer calls it
    (`lm_head` on each slice, then the model's `loss_function`): new in 0.17.4; zerosim
    replays it around an output layer of the model's own (not tied to the embeddings, whose
    gradient the slices would accumulate elsewhere), called as a module (not read by the
    model's forward, as Megatron-DeepSpeed's is), with no logit softcapping (the call skips
    the model's)."""
    shards = _tiled_shards(scenario, TILED_LOSS, "tiled_loss", "0.17.4",
                           "TiledFusedLogitsLoss")
    if shards is None:
        return
    model = scenario.model
    for flag, what in ((model.tie_word_embeddings, "an output layer tied to the embeddings"),
                       (scenario.stack.recipe.external_output_weight,
                        f"the {scenario.stack.name} stack, whose model reads the output "
                        "weight itself"),
                       (bool(model.logit_softcap), "logit softcapping, which the tiled call "
                        "skips")):
        if flag:
            _refuse(scenario, TILED_LOSS, f"unset with {what} (zerosim replays the tiled "
                    "loss around an untied lm_head module)", shards)


LIGER = "runtime.liger_kernel"
LIGER_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text",
                     "gemma3", "mixtral", "qwen3_moe", "olmo2", "olmo3")
"""The model types zerosim reads whose Liger-Kernel patch (monkey_patch.py
MODEL_TYPE_TO_APPLY_LIGER_FN, 0.6.2-0.8.2) replaces exactly the stack's `liger_kernel` entries:
RMSNorm, the rotary embedding, a SwiGLU (GeGLU) MLP on separate gate and up projections (the
experts' too, transformers 5's LigerExperts), and the head's fused linear cross entropy. Not
here: types the table lacks (the Trainer then patches nothing: yi, internlm2, qwen2_moe,
deepseek, glm4_moe, the gpt family), Phi-3 (its fused gate_up split and copied first),
GPT-OSS (its clamped expert activation) and Llama 4."""


def liger_refusal(scenario: Any) -> str:
    """Why the scenario cannot run Liger-Kernel's kernels, as the rule below says ('' where
    it can): what `zerosim tune`'s `liger` knob offers. The tiled loss is left out, since the
    knob searches without it."""
    from dataclasses import replace

    return _refusal(_liger_kernel_runs, replace(
        scenario, stack=scenario.stack.with_liger_kernel(),
        runtime=replace(scenario.runtime, liger_kernel=True, tiled_loss_shards=None)))


DOCUMENT_LENGTH = "document_length"


def _packed_documents_run(scenario: Any) -> None:
    """`document_length`: documents packed into each sequence attend only within themselves
    where the stack's flash attention takes them apart (`modules.packed_documents: varlen`,
    transformers' variable-length path, which it takes for a batch of one sequence), no
    longer than the sequence."""
    length = scenario.document_length
    if length is None:
        return
    if length > scenario.sequence_length:
        _refuse(scenario, DOCUMENT_LENGTH, f"at most sequence_length {scenario.sequence_length} "
                "(a document longer than the sequence is the whole sequence: leave the key "
                "out)", length)
    if scenario.stack.recipe.packed_documents != "varlen":
        _refuse(scenario, DOCUMENT_LENGTH, f"unset with the {scenario.stack.name} stack, whose "
                "flash attention attends over the whole sequence (modules.packed_documents "
                f"{scenario.stack.recipe.packed_documents})", length)
    if scenario.attention != "flash":
        _refuse(scenario, "attention", f"flash with document_length {length} (transformers' "
                "flash path attends within each packed document; its SDPA and eager paths "
                "mask the documents apart but compute every score)", scenario.attention)
    micro = scenario.deepspeed.train_micro_batch_size_per_gpu
    if micro > 1:
        _refuse(scenario, "deepspeed.train_micro_batch_size_per_gpu", "1 with document_length "
                "(transformers takes restarting position ids as packed documents only in a "
                "batch of one sequence: _is_packed_sequence)", micro)


def _liger_kernel_runs(scenario: Any) -> None:
    """transformers' `use_liger_kernel` (`runtime.liger_kernel`): a stack that prices
    Liger-Kernel's kernels, a model its patch covers (`LIGER_MODEL_TYPES`; a model given by
    its fields alone is read as Llama), and not beside DeepSpeed's tiled loss, whose output
    layer call Liger's fused loss replaces."""
    if not scenario.runtime.liger_kernel:
        return
    model, stack = scenario.model, scenario.stack
    if not stack.recipe.fused_linear_loss:
        _refuse(scenario, LIGER, f"false with the {stack.name} stack, which has no "
                "liger_kernel section (Liger-Kernel patches transformers' models: the "
                "hf-transformers stack)", True)
    model_type = model.model_type or ("llama" if model.family == "llama" else model.family)
    if model_type not in LIGER_MODEL_TYPES:
        _refuse(scenario, LIGER, "false for this model (zerosim replays Liger-Kernel's patch "
                f"for model types {', '.join(LIGER_MODEL_TYPES)})", f"true with a "
                f"{model_type} model")
    if (model.norm != "rms" or model.position_embedding != "rotary" or not model.gated_mlp
            or model.fused_gate_up or model.mla is not None):
        _refuse(scenario, LIGER, "false for a model without RMSNorm, rotary positions and a "
                "gated MLP on separate gate and up projections (what Liger-Kernel's kernels "
                "replace, as zerosim prices them)", True)
    if scenario.runtime.tiled_loss_shards is not None:
        _refuse(scenario, TILED_LOSS, "unset with runtime.liger_kernel (Liger's fused loss "
                "computes the output layer and the loss itself; the tiled loss would slice "
                "an output layer call the model no longer makes)",
                scenario.runtime.tiled_loss_shards)
