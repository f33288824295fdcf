"""DeepSpeed behaviours that changed between releases: one table, resolved once per scenario.

Each row names the behaviour, the first release that has it, and where that was read (a PR or
a file at a tag). `resolve_behaviours(version)` turns the table into one frozen record that the
scenario carries; the engine, the defaults and the estimator read that record and never compare
versions themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

Version = tuple[int, int, int]
"""A DeepSpeed release as (major, minor, patch)."""


def format_version(version: Version) -> str:
    return ".".join(str(part) for part in version)


@dataclass(frozen=True)
class Behaviour:
    name: str
    since: Version
    source: str
    what: str


BEHAVIOURS: tuple[Behaviour, ...] = (
    Behaviour("zero2_estimator_16bit_params", (0, 14, 3),
              "PR #5099 (2024-06-04), stage_1_and_2.py estimate_zero2_model_states_mem_needs",
              "the ZeRO-2 no-offload estimator counts 2 B/param replicated + 18 B/param "
              "partitioned, not 4 + 16"),
    Behaviour("boundary_flush_cast_on_gpu", (0, 15, 4),
              "stage3.py partition_grads, read at v0.15.3 and v0.15.4",
              "the boundary's fp32 gradient is cast on the GPU, then copied to the host "
              "(before: a cross-dtype copy_ into a pageable 16-bit temporary, cast on the CPU)"),
    Behaviour("boundary_flush_pinned_staging", (0, 15, 4),
              "PR #6670 'fix memcpy issue on backward for zero-infinity' (ff1c5435, first in "
              "v0.15.4): stage3.py partition_grads and _create_fp32_partitions "
              "(pinned_grad_buffer)",
              "ZeRO-3 offload: the boundary's fp32 gradient goes D2H into one pinned staging "
              "buffer of the largest partition (pinned whatever pin_memory says), then "
              "get_accelerator().synchronize() waits for every stream, the compute stream's "
              "queued backward included, then the host copies it into the sub-group's fp32 "
              "gradient"),
    Behaviour("boundary_flush_staging_removed", (0, 16, 3),
              "PR #6962 'Using explicit GPU upcast for ZeRO-Offload' (c17dc33c, first in "
              "v0.16.3): stage3.py partition_grads",
              "the staging of boundary_flush_pinned_staging is gone: the GPU-cast fp32 "
              "gradient is copied D2H straight into the sub-group's fp32 gradient, the host "
              "waiting for the reduction stream only"),
    Behaviour("live_count_reset_at_forward", (0, 15, 4),
              "PR #6662 'Use one param coordinator for both train/inference scenarios' "
              "(351569dd, first in v0.15.4): parameter_offload.py _start_of_forward_hook, "
              "stage3.py backward",
              "ZeRO-3: reset_step, which zeroes the coordinator's live-parameter count, runs "
              "at the start of each forward instead of the end of each backward, so the "
              "first micro-batch after a step counts what is gathered exactly"),
    Behaviour("live_count_reset_by_step_only", (0, 16, 0),
              "PR #6726 'Fix potential memory issues when use deepspeed Z3' (cd20a3bb, first "
              "in v0.16.0): partitioned_param_coordinator.py reset_step, "
              "release_and_reset_all",
              "ZeRO-3: reset_step no longer zeroes the live count; the step does, after "
              "releasing every parameter, so the count never drifts"),
    Behaviour("live_count_reset_by_step_only_rolled_back", (0, 16, 8),
              "PR #7258 'rollback #6726' (f4595025, first in v0.16.8)",
              "reset_step zeroes the live count again, at the start of each forward"),
    Behaviour("backward_leftovers_released", (0, 19, 3),
              "PR #8148 'Z3: Support for activation ckpt with frozen params' (a31eb316, "
              "first in v0.19.3): stage3.py backward, partitioned_param_coordinator.py "
              "release_backward_leftovers",
              "ZeRO-3: the end of each backward releases what modules whose post-backward "
              "hook never fired still hold (the embeddings), external parameters excepted"),
    Behaviour("zero12_check_grad_overflow_key", (0, 17, 1),
              "PR #6976 'Improve overflow handling in ZeRO' (e440506b, first in v0.17.1): "
              "engine.py _configure_zero_optimizer, stage_1_and_2.py step, "
              "precision_config.py DeepSpeedBF16Config",
              "ZeRO-1/2 with bf16: the step checks the gradients for overflow when "
              "bf16.check_grad_overflow says so (before: only fp16 runs checked; ZeRO-3 "
              "still checks fp16 only)"),
    Behaviour("bf16_check_grad_overflow_default_true", (0, 19, 3),
              "PR #8035 'Enable bf16 check_grad_overflow by default (matching fp16)' "
              "(f0253c86, first in v0.19.3): precision_config.py",
              "bf16.check_grad_overflow defaults to true (0.17.1-0.19.2: false)"),
    Behaviour("zero3_reduced_grads_in_accumulation_dtype", (0, 19, 2),
              "PR #8056 'Consistent fp32 grads flow' (56e7e0c5, first in v0.19.2): stage3.py "
              "__avg_scatter_contiguous_grads, __avg_scatter_grads",
              "ZeRO-3: a reduction in a communication_data_type other than the model dtype is "
              "cast back to the gradient accumulation dtype, not the model dtype (none when "
              "the two are the same, as with fp32 communication and fp32 accumulation)"),
    Behaviour("gradient_clipping_default_one", (0, 19, 3),
              "runtime/config.py GRADIENT_CLIPPING_DEFAULT, read at v0.19.3",
              "gradient_clipping defaults to 1.0 instead of 0"),
    Behaviour("boundary_flush_non_blocking", (0, 19, 5),
              "PR #8207 'fix(zero3): async grad offload + pinned offload buffers by default'",
              "the boundary's fp32 gradient copy is non_blocking and overlaps the backward"),
    Behaviour("offload_pin_memory_default_true", (0, 19, 5),
              "PR #8207, offload_config.py",
              "offload_optimizer/offload_param.pin_memory default to true"),
    Behaviour("coalesced_collectives", (0, 6, 0),
              "PR #1453 'Various ZeRO Stage3 Optimizations + Improvements (including bfloat16 "
              "support)' (merged 2022-01-20 as 4912e0ad; in v0.6.0, not in v0.5.10): "
              "runtime/comm/coalesced_collectives.py reduce_scatter_coalesced, "
              "partition_parameters.py all_gather_coalesced",
              "ZeRO-3 all-gathers a module's parameters and reduce-scatters a bucket's "
              "gradients as one collective each (before: one collective per tensor)"),
    Behaviour("fetch_waits_on_device", (0, 6, 0),
              "PR #1453 (4912e0ad, first in v0.6.0): stage3.py PartitionedParameterCoordinator"
              ".fetch_sub_module; before it, stage3.py at v0.4.0-v0.5.10 fetch_sub_module, "
              "_synchronize_communication and prefetch_next_sub_modules",
              "ZeRO-3: a module's fetch makes the compute stream wait for its parameters' "
              "all-gathers and the host runs on (before: a module that gathered parameters, "
              "or found them in flight, waits on the host for every all-gather issued since "
              "the last such wait and for the whole device, torch.cuda.synchronize(); each "
              "module then formats every parameter's norm into a debug message that is not "
              "printed, a norm kernel and a blocking .item() each; it prefetches only when no "
              "all-gather was issued since that wait, and makes each prefetched parameter's "
              "buffer with torch.zeros and calls torch.cuda.synchronize() before its "
              "all-gather, partition_parameters.py _allgather_param)"),
    Behaviour("bounded_fetch_events", (0, 6, 0),
              "PR #1453 (4912e0ad, first in v0.6.0): stage3.py "
              "PartitionedParameterCoordinator.fetch_sub_module, __max_ongoing_fetch_events "
              "(moved into partitioned_param_coordinator.py by PR #1901, v0.6.2)",
              "the host blocks in a module's pre-forward/backward hook while more than two "
              "fetch events (one per gathered parameter it waited on) are unfinished "
              "(before: the host waits for the whole device instead, fetch_waits_on_device)"),
    Behaviour("zero_config_model", (0, 7, 0),
              "runtime/zero/config.py and runtime/config_utils.py read at v0.6.7 and v0.7.0",
              "zero_optimization is a pydantic model: the parameter-offload flag is "
              "cpu_offload_param (before: cpu_offload_params), a deprecated key beside its "
              "replacement is an error (before: the deprecated flag won), and stage3_* keys "
              "may be given by their field names (prefetch_bucket_size, ...)"),
    Behaviour("hjson_config_files", (0, 8, 1),
              "PR #2783 'add support for hjson config files' (4079077c, first in v0.8.1): "
              "runtime/config.py DeepSpeedConfig.__init__",
              "a ds_config file is read with hjson (comments, trailing commas, missing commas "
              "at line ends are accepted; before: strict JSON); duplicate keys are refused "
              "in both"),
    Behaviour("cpu_adam_without_pinned_tiles", (0, 14, 3),
              "PR #5409 'CPUAdam fp16 and bf16 support' (first in v0.14.3): "
              "csrc/includes/cpu_adam.h Adam_Optimizer, read at v0.14.2 and v0.14.3",
              "DeepSpeedCPUAdam no longer pins two tile buffers (before: its C++ optimizer, "
              "built with CUDA, cudaMallocHost'ed 2 x TILE floats, TILE = 128 Mi elements: "
              "1 GiB of pinned host memory per optimizer, one per rank)"),
    Behaviour("zero12_compute_waits_for_reduction", (0, 14, 3),
              "PR #5606 'Fix overlap communication of ZeRO stage 1 and 2' (a41729f6, first in "
              "v0.14.3): stage_1_and_2.py average_tensor, "
              "get_accelerator().current_stream().wait_stream(stream); still there at v0.19.5 "
              "(DeepSpeed issue #8364)",
              "ZeRO-1/2 with overlap_comm: each bucket's reduction makes the default stream "
              "wait for everything queued on the reduction stream before it (the previous "
              "bucket's reduction and its partition copies), so the backward overlaps one "
              "bucket's reduction at most (before: only the reduction stream waited for the "
              "default stream)"),
    Behaviour("zero12_compute_waits_for_each_bucket", (0, 17, 5),
              "PR #7371 'fix #7188' (f897b673, first in v0.17.5): stage_1_and_2.py "
              "reduce_independent_p_g_buckets_and_remove_grads",
              "ZeRO-1/2 with overlap_comm and contiguous_gradients: once a full bucket's "
              "reduction is issued, the default stream waits for the reduction stream, that "
              "bucket's reduction and partition copies included, so the backward overlaps no "
              "reduction (the fix for a buffer-index bug of PR #6993, 0.17.2)"),
    Behaviour("zero12_bucket_wait_removed", (0, 18, 5),
              "PR #7805 'Fix ping-pong buffer index reset and removing redundant stream "
              "sync' (15ad92b4, first in v0.18.5): stage_1_and_2.py",
              "the wait of zero12_compute_waits_for_each_bucket is gone again: the "
              "backward overlaps the reductions as before 0.17.5"),
    Behaviour("zero2_accumulator_stays_on_gpu", (0, 15, 2),
              "PR #6550 'Fix gradient accumulation for Z2+offload' (c85c8703, first in "
              "v0.15.2): stage_1_and_2.py async_accumulate_grad_in_cpu_via_gpu",
              "ZeRO-2 offload with gradient accumulation: only the first micro-batch copies "
              "its gradient to the host accumulator; later ones bring it back and add, "
              "without sending the sum back (before: every micro-batch but the boundary's "
              "sent it back)"),
    Behaviour("zero2_accumulator_sent_back_always", (0, 19, 0),
              "PR #7967 'Fix zero 1 and 2 CPU-offloaded gradient norm' (9d632f10, first in "
              "v0.19.0): stage_1_and_2.py async_accumulate_grad_in_cpu_via_gpu",
              "ZeRO-2 offload with gradient accumulation: every micro-batch after the first "
              "brings the host accumulator back, adds and sends the sum back, the boundary's "
              "included"),
    Behaviour("zero12_averages_filled_part", (0, 14, 1),
              "PR #5268 'Average only valid part of the ipg buffer' (75e579e7, first in "
              "v0.14.1): stage_1_and_2.py reduce_ipg_grads",
              "ZeRO-1/2 with contiguous_gradients: average_tensor gets the filled part of the "
              "IPG buffer (before: the whole buffer, reduce_bucket_size elements however "
              "full, divided in place and, without reduce_scatter, all-reduced whole)"),
    Behaviour("zero12_copy_back_fp32_to_gpu", (0, 14, 1),
              "PR #5301 'fix pagable h2d memcpy' (7b5b0660, first in v0.14.1): "
              "stage_1_and_2.py __init__ (the fp32 partition pinned) and step, "
              "bit16_partitions[partition_id].data.copy_(fp32_partition.to(device).data)",
              "ZeRO-1/2 offload: the fp32 master partition is pinned whatever pin_memory "
              "says, and the step's copy-back sends it H2D whole into a fp32 GPU temporary "
              "(the host waits), which the GPU casts into the 16-bit partition (before: a "
              "CPU cast into a pageable 16-bit temporary, then a pageable H2D)"),
    Behaviour("zero12_copy_back_via_16bit_host_buffer", (0, 17, 0),
              "PR #7309 'Fix the GPU memory usage of ZeRO-Offload (only update "
              "stage_1_and_2.py)' (17c8be07, first in v0.17.0): stage_1_and_2.py __init__ "
              "param_buffer_of_bit16_for_cpu_offload_groups and step",
              "ZeRO-1/2 offload: the step casts the fp32 partition on the CPU into a 16-bit "
              "host buffer made at start-up (pinned when pin_memory), then copies it H2D "
              "with non_blocking=True: the host waits only when the buffer is pageable "
              "(before: the fp32 GPU temporary of zero12_copy_back_fp32_to_gpu, 'about 3x "
              "params_FP16' of GPU memory)"),
    Behaviour("zero12_master_pinned_only_with_pin_memory", (0, 18, 3),
              "PR #7689 'stage 1-2: don't pin memory if not configured' (c502d3ac, first in "
              "v0.18.3): stage_1_and_2.py __init__",
              "ZeRO-1/2 offload: the fp32 master partition is pinned only when "
              "offload_optimizer.pin_memory is true (0.14.1-0.18.2: always)"),
    Behaviour("grad_hooks_count_used_params", (0, 18, 5),
              "PR #7780 'Fix gradient checkpointing with use_reentrant=True / PyTorch-style "
              "backward / ZeRO-3' (311674ff, first in v0.18.5): stage_1_and_2.py and "
              "stage3.py gradient hooks, runtime/utils.py count_used_parameters_in_backward",
              "ZeRO-1/2/3: every parameter's gradient hook counts the model's parameters "
              "the running backward uses, a Python loop over all of them"),
    Behaviour("grad_hooks_count_once_per_phase", (0, 18, 7),
              "PR #7886 'Fix hook count performance regression from v0.18.5' (6c59d544, "
              "first in v0.18.7): base_optimizer.py should_refresh_expected_hook_count",
              "the count of grad_hooks_count_used_params runs at a backward phase's first "
              "hook only (the backward's, and each reentrant checkpoint's recompute)"),
    Behaviour("zenflow", (0, 17, 5),
              "PR #7391 'Add Zenflow code for Stage 1 & 2' (1d7b90ad, first in v0.17.5): "
              "runtime/zenflow/zenflow_stage_1_and_2.py, runtime/zenflow/engine.py",
              "zero_optimization.zenflow is read (ZeRO-1/2 with the optimizer on the CPU): "
              "the top-k gradient columns are updated on the GPU at every step, the rest "
              "accumulate for update_interval steps and are stepped on the CPU, with "
              "overlap_step in a process of its own while the next steps run (before: the "
              "key is refused)"),
    Behaviour("zenflow_worker_affinity_split", (0, 17, 6),
              "PR #7506 'Autotune ZenFlow affinity' (43537d0a, first in v0.17.6): "
              "zenflow_utils.py start_optimizer_process",
              "ZenFlow's optimizer process runs on the rank's cores after the first "
              "ceil(pt_reserved_cores_perc x n), which the training process keeps (before: "
              "on os.cpu_count() / world_size logical CPUs of its own, counted from CPU 0 "
              "whatever the rank's binding)"),
    Behaviour("zenflow_native_worker", (0, 19, 3),
              "PR #8058 'run the overlapped CPU optimizer in a native process' (1ddbe484, "
              "first in v0.19.3): zenflow_utils.py, zenflow_stage_1_and_2.py "
              "wait_last_update_and_copy",
              "ZenFlow's optimizer process steps the partition in C++ and writes the stale "
              "fp32 snapshot as it goes (before: a Python process that clones the stepped "
              "partition and copies the clone into the snapshot); the copy-back is "
              "bit16.copy_(snapshot), a CPU cast and a blocking H2D (before: "
              "snapshot.to(device), a blocking fp32 H2D, cast on the GPU)"),
    Behaviour("twin_flow_gpu_subgroups_first", (0, 18, 0),
              "PR #7559 'SuperOffload Release' (af56ed4d, first in v0.18.0): stage3.py "
              "_create_fp32_partitions, subgroup_to_device",
              "Twin-Flow (offload_optimizer.ratio < 1): the first int((1 - ratio) x n) of the "
              "n sub-groups are stepped on the GPU and the rest on the CPU (before: the first "
              "int(ratio x n) on the CPU and the rest, the last ones, on the GPU)"),
    Behaviour("super_offload", (0, 18, 0),
              "PR #7559 'SuperOffload Release' (af56ed4d, first in v0.18.0): "
              "runtime/zero/offload_config.py, runtime/superoffload/superoffload_stage3.py",
              "offload_optimizer.super_offload and cpuadam_cores_perc are read (ZeRO-3): an "
              "optimizer process on its own cores steps each sub-group as the boundary "
              "backward completes its gradients (before: the keys are refused)"),
    Behaviour("superoffload_shared_buffers", (0, 18, 9),
              "PR #7906 'fix(superoffload) preserve multi-group updates with shared cpu "
              "buffers' (729df6ca, first in v0.18.9): superoffload_stage3.py, "
              "superoffload_utils.py",
              "SuperOffload casts and copies each gradient to the host as it is partitioned, "
              "synchronises the stream once a sub-group is complete and only then hands it to "
              "the optimizer process, steps nothing early when gradient_clipping is set, and "
              "writes every CPU sub-group back into the 16-bit partition in the step (before: "
              "buckets cut at sub-group edges, each sub-group's gradient concatenated on the "
              "GPU and submitted at once, a rollback and re-step when the norm clips, and "
              "_reassign_or_swap_out_partitioned_parameters only re-viewing a CPU "
              "sub-group's 16-bit partition, without copying its fp32 update into it)"),
    Behaviour("low_precision_master_weights", (0, 18, 3),
              "PR #7700 'Low-precision master params/grads/optimizer states' (39a682d7, first "
              "in v0.18.3): runtime/precision_config.py, base_optimizer.py "
              "_configure_master_weights, stage3.py _create_fp32_partitions",
              "bf16.bf16_master_weights_and_grads keeps the optimizer's master params and "
              "gradients in bf16 (offloaded: DeepSpeedCPUAdam over bf16 params, Adam moments in "
              "fp32 unless optimizer.params.fp32_optimizer_states is false) and "
              "bf16.bf16_optimizer_states is read (before: the keys are refused)"),
    Behaviour("bf16_optimizer_states_on_cpu", (0, 19, 1),
              "PR #8010 'Support bf16 optimizer states with CPU offload' (3c337b54, first in "
              "v0.19.1): engine.py _configure_basic_optimizer, base_optimizer.py "
              "_configure_master_weights",
              "with bf16.bf16_optimizer_states the engine builds DeepSpeedCPUAdam with "
              "fp32_optimizer_states=False, so offloaded Adam moments are bf16 (before: fp32 "
              "unless optimizer.params.fp32_optimizer_states said false)"),
    Behaviour("module_granularity_threshold", (0, 16, 0),
              "PR #6649 'add zero3 module_granularity_threshold to zero optimization' "
              "(7af3a4be, first in v0.16.0): zero/config.py, parameter_offload.py "
              "_set_z3_leaf_modules_by_threshold",
              "zero_optimization.module_granularity_threshold (stage3_module_granularity_"
              "threshold) is read: ZeRO-3 makes a leaf of each outermost module whose "
              "parameters per module under it, itself included, are at most the threshold; "
              "its hook fetches everything under it at once and no module inside fires a "
              "hook (before: the key is refused)"),
    Behaviour("leaf_fetch_skips_event_bound", (0, 16, 3),
              "PR #6694 'Reduce the device bubble introduced by heavy loop synchronization in "
              "coalesced fetch/release(z3_leaf_module)' (b0040b6c, first in v0.16.3): "
              "partitioned_param_coordinator.py fetch_sub_module (fast_fetch)",
              "with module_granularity_threshold set, the host waits on a leaf module's "
              "parameters without recording an event per parameter, so the bound on "
              "unfinished fetch events never holds it there"),
    Behaviour("leaf_module_config", (0, 18, 0),
              "PR #7604 'Improve leaf module interface (enable via config, ...)' (7d9a2f2b, "
              "first in v0.18.0): zero/leaf_module_config.py, utils/z3_leaf_module.py "
              "apply_zero_leaf_module_config, engine.py _configure_distributed_model",
              "zero_optimization.leaf_module (classes, names, name_suffixes) is read, and by "
              "default makes transformers' MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock and "
              "Qwen3MoeSparseMoeBlock ZeRO-3 leaves (before: the key is refused, and a module "
              "is a leaf only where the training script says so)"),
    Behaviour("autotp_training", (0, 16, 4),
              "PR #7004 'autotp training' (f04649d2, first in v0.16.4): "
              "runtime/tensor_parallel/config.py TPTrainingConfig",
              "tensor_parallel.autotp_size > 1 trains with automatic tensor parallelism "
              "(before: the tensor_parallel key is ignored)"),
    Behaviour("unmanaged_accumulation", (0, 19, 4),
              "PRs #8184, #8203 and #8217 'Unmanaged gradient accumulation' (7a31fe66, "
              "3c737a1c, e75d1150, first in v0.19.4): runtime/engine.py "
              "is_gradient_accumulation_boundary, step; zero/stage3.py "
              "finalize_gradient_accumulation_boundary",
              "managed_gradient_accumulation: false is read: no backward is the accumulation "
              "boundary, step() is (it finalizes what the boundary backward would have done); "
              "with the optimizer or the parameters offloaded the engine asserts (before: the "
              "key is ignored)"),
    Behaviour("unmanaged_accumulation_offload", (0, 19, 5),
              "PR #8225 'Unmanaged gradient accumulation: ZeRO offload support' (cf443004, "
              "first in v0.19.5): zero/stage3.py _finalize_offload_gradient_accumulation",
              "unmanaged gradient accumulation runs with ZeRO offload: ZeRO-3's step() opens "
              "by bringing each accumulated host gradient partition back to the GPU, taking "
              "its norm and copying it into the fp32 gradient, the boundary flush's work "
              "(before: the engine asserts)"),
    Behaviour("mics", (0, 9, 2),
              "PR #2964 'Tentative implementation of MiCS' (2e99f6ed, first in v0.9.2): "
              "zero/mics.py, zero/mics_utils.py, zero/config.py",
              "zero_optimization.mics_shard_size (MiCS: ZeRO-3 partitions the parameters, "
              "gradients and optimizer states over groups of that many consecutive ranks, "
              "all-reduces the gradient partitions across the groups at the accumulation "
              "boundary) and mics_hierarchical_params_gather (a group's all-gather across "
              "its nodes, then within each) are read (before: refused)"),
    Behaviour("distributed_attention", (0, 10, 2),
              "PR #4198 'DeepSpeed Ulysses release' (a855405e, first in v0.10.2): "
              "sequence/layer.py DistributedAttention",
              "Megatron-DeepSpeed's --ds-sequence-parallel-size runs its attention inside "
              "DeepSpeed's DistributedAttention: Q, K and V all-to-all'd from a slice of the "
              "sequence at every head to every token at a share of the heads, the output back "
              "(before: no such layer)"),
    Behaviour("sequence_parallel_fp32_reduction", (0, 11, 2),
              "PR #4530 'Fix the sequence-parallelism for the dense model architecture' "
              "(ec029e76, first in v0.11.2): runtime/engine.py, runtime/config.py "
              "seq_parallel_communication_data_type",
              "with a sequence-parallel group of more than one rank the engine reduces the "
              "gradients in seq_parallel_communication_data_type, fp32 by default, whatever "
              "communication_data_type says (before: communication_data_type)"),
    Behaviour("single_all_to_all", (0, 12, 4),
              "PR #4695 'Communication Optimization for Large-Scale Training' (2afa1c7f, first "
              "in v0.12.4): sequence/layer.py single_all_to_all",
              "DistributedAttention exchanges each tensor by one all_to_all_single of a "
              "transposed copy (before: torch.tensor_split into contiguous pieces, a list "
              "all_to_all and torch.cat)"),
    Behaviour("distributed_attention_batch_dim", (0, 14, 5),
              "PR #5823 'Fix the bug of deepspeed sequence parallel working with batch size "
              "larger than 1' (ffe0af23, first in v0.14.5): sequence/layer.py "
              "DistributedAttention.forward(query, key, value, batch_dim_idx, ...)",
              "DistributedAttention's forward takes the batch dimension's index as its fourth "
              "argument, where Megatron-DeepSpeed of early 2024 (the stack's revision, "
              "1df5712) hands it the attention mask"),
    Behaviour("ulysses_hf", (0, 17, 0),
              "PR #7268 'Ulysses SP for HF Integration' (4d00b38a, first in v0.17.0): "
              "runtime/sequence_parallel/ulysses_sp.py UlyssesSPAttentionHF, "
              "UlyssesSPDataLoaderAdapter; runtime/engine.py (seq_data_parallel_group, "
              "seq_parallel_communication_data_type)",
              "sequence_parallel_size > 1 trains transformers' models with Ulysses sequence "
              "parallelism (Arctic Long Sequence Training): each rank of a group of that "
              "many holds a slice of the sequence, and all-to-alls hand each rank every "
              "token of its share of the attention heads (before: no such attention for "
              "transformers' models)"),
    Behaviour("tiled_mlp", (0, 17, 0),
              "PR #7268 'Ulysses SP for HF Integration' (4d00b38a, first in v0.17.0): "
              "runtime/sequence_parallel/ulysses_sp.py TiledMLP; zero/stage3.py "
              "reduce_independent_p_g_buckets_and_remove_grads reads ds_grad_is_ready",
              "a gated MLP can run over slices of the sequence (Arctic Long Sequence "
              "Training's tiled MLP compute): its forward saves only its input, its backward "
              "runs each slice's forward again, and ZeRO reduces the weights' gradients after "
              "the last slice (before: no TiledMLP, nor ds_grad_is_ready)"),
    Behaviour("tiled_loss", (0, 17, 4),
              "PR #7437 'adding TiledFusedLogitsLoss' (3292e07a, first in v0.17.4): "
              "runtime/sequence_parallel/ulysses_sp.py TiledFusedLogitsLoss",
              "the output layer and the loss can run over slices of the tokens, each slice's "
              "backward inside the forward (Arctic Long Sequence Training's tiled logits and "
              "loss): no whole logits tensor, only the hidden states' gradient kept for the "
              "backward (before: no TiledFusedLogitsLoss)"),
    Behaviour("zero_plus_plus", (0, 10, 0),
              "PR #3784 'ZeRO++' (d18aa2c7, first in v0.10.0): zero/config.py, "
              "partition_parameters.py _partition_param_sec and all_gather_coalesced "
              "(quantize), utils/groups.py _create_zero_param_parallel_group",
              "zero_optimization.zero_hpz_partition_size (hpZ: a secondary partition of "
              "each parameter over groups of that many consecutive ranks), "
              "zero_quantized_weights (qwZ: int8 all-gathers with fp32 scales, quantized and "
              "dequantized on DeepSpeed's all-gather stream) and zero_quantized_gradients "
              "(qgZ: ZeRO-3 reduces each multi-dimensional gradient by int4 all-to-alls "
              "within its node, then across nodes, where the ranks span several; "
              "coalesced_collectives.py all_to_all_quant_reduce) are read (before: refused)"),
    Behaviour("hpz_secondary_by_presence", (0, 13, 2),
              "PR #4906 'Enable hpz based on secondary tensor presence' (75ed63c9, first in "
              "v0.13.2): partition_parameters.py all_gather_coalesced, "
              "partitioned_param_coordinator.py __all_gather_params_",
              "a ZeRO-3 fetch all-gathers over the hpZ group wherever the parameters have a "
              "secondary partition, forward and backward alike, and over every rank where "
              "they have none (one call each); each release re-copies the secondary "
              "partition from the gathered parameter (before: the forward flag picks, which "
              "zerosim does not replay)"),
    Behaviour("qgz_indivisible_fallback", (0, 13, 2),
              "PR #5056 '[Zero++ qgZ] Fall back to reduce_scatter if tensor.numel() % (2 * "
              "global_world_size) != 0' (592325ab, first in v0.13.2): "
              "coalesced_collectives.py all_to_all_quant_reduce",
              "qgZ reduce-scatters a multi-dimensional gradient whose element count is not a "
              "multiple of twice the world size, as a vector (before: its all-to-all fails "
              "on the buffers' sizes, which zerosim refuses)"),
    Behaviour("qgz_loco", (0, 16, 2),
              "PR #6730 'Merge LoCo with Zero++' (1b58ba5e, first in v0.16.2): "
              "coalesced_collectives.py all_to_all_loco_quant_reduce, zero/config.py "
              "zeropp_loco_param",
              "zero_optimization.zeropp_loco_param (err_beta, reset_T) adds LoCo's error "
              "feedback to qgZ: each matrix's quantization errors within and across nodes "
              "kept as int8 on the GPU between steps, dequantized into the next reduction "
              "(before: refused)"),
    Behaviour("hpz_secondary_sync", (0, 13, 5),
              "PR #5216 '[zero++] Synchronize at the end of secondary partitioning' "
              "(4578c249, first in v0.13.5): partition_parameters.py _partition_param_sec",
              "after copying a parameter's secondary partition the host synchronizes the "
              "current (compute) stream, once per parameter tensor"),
    Behaviour("hpz_secondary_once", (0, 14, 3),
              "PR #5613 'fixes in _partition_param_sec function' (b6e24adb, first in "
              "v0.14.3): partition_parameters.py _partition_param_sec",
              "a parameter's secondary partition is copied (and synchronized) only when it "
              "is made, at its first release after a step, not at every release"),
    Behaviour("hpz_secondary_zeroed", (0, 19, 5),
              "PR #8210 'Fix ZeRO++ secondary shard copy for small params' (2d4488ef, first "
              "in v0.19.5): partition_parameters.py _partition_param_sec",
              "the secondary partition is zeroed (zero_()) before the copy into it"),
)


@dataclass(frozen=True)
class Behaviours:
    """Which rows of `BEHAVIOURS` a DeepSpeed release has (field names are row names)."""

    zero2_estimator_16bit_params: bool
    boundary_flush_cast_on_gpu: bool
    boundary_flush_pinned_staging: bool
    boundary_flush_staging_removed: bool
    live_count_reset_at_forward: bool
    live_count_reset_by_step_only: bool
    live_count_reset_by_step_only_rolled_back: bool
    backward_leftovers_released: bool
    gradient_clipping_default_one: bool
    zero3_reduced_grads_in_accumulation_dtype: bool
    zero12_check_grad_overflow_key: bool
    bf16_check_grad_overflow_default_true: bool
    boundary_flush_non_blocking: bool
    offload_pin_memory_default_true: bool
    coalesced_collectives: bool
    fetch_waits_on_device: bool
    bounded_fetch_events: bool
    zero_config_model: bool
    hjson_config_files: bool
    autotp_training: bool
    zero12_compute_waits_for_reduction: bool
    zero12_compute_waits_for_each_bucket: bool
    zero12_bucket_wait_removed: bool
    grad_hooks_count_used_params: bool
    grad_hooks_count_once_per_phase: bool
    zero2_accumulator_stays_on_gpu: bool
    zero2_accumulator_sent_back_always: bool
    cpu_adam_without_pinned_tiles: bool
    zero12_averages_filled_part: bool
    zero12_copy_back_fp32_to_gpu: bool
    zero12_copy_back_via_16bit_host_buffer: bool
    zero12_master_pinned_only_with_pin_memory: bool
    zenflow: bool
    zenflow_worker_affinity_split: bool
    zenflow_native_worker: bool
    twin_flow_gpu_subgroups_first: bool
    super_offload: bool
    superoffload_shared_buffers: bool
    low_precision_master_weights: bool
    bf16_optimizer_states_on_cpu: bool
    module_granularity_threshold: bool
    leaf_fetch_skips_event_bound: bool
    leaf_module_config: bool
    unmanaged_accumulation: bool
    unmanaged_accumulation_offload: bool
    mics: bool
    distributed_attention: bool
    sequence_parallel_fp32_reduction: bool
    single_all_to_all: bool
    distributed_attention_batch_dim: bool
    ulysses_hf: bool
    tiled_mlp: bool
    tiled_loss: bool
    zero_plus_plus: bool
    hpz_secondary_by_presence: bool
    qgz_indivisible_fallback: bool
    qgz_loco: bool
    hpz_secondary_sync: bool
    hpz_secondary_once: bool
    hpz_secondary_zeroed: bool
    fork_options: bool = False
    """The Deep Optimizer States keys are read (a build of the fork)."""

    @property
    def boundary_flush_stages_in_pinned_buffer(self) -> bool:
        """ZeRO-3's boundary flush goes through one pinned staging buffer (0.15.4 to 0.16.2:
        added by one row, taken out by the next)."""
        return self.boundary_flush_pinned_staging and not self.boundary_flush_staging_removed

    @property
    def live_count_reset(self) -> str:
        """When ZeRO-3's coordinator zeroes its live-parameter count: at the end of each
        backward ("backward", up to 0.15.3), at the start of each forward ("forward", 0.15.4
        to 0.15.x and from 0.16.8), or only in the step, after releasing everything ("step",
        0.16.0 to 0.16.7)."""
        if (self.live_count_reset_by_step_only
                and not self.live_count_reset_by_step_only_rolled_back):
            return "step"
        return "forward" if self.live_count_reset_at_forward else "backward"

    @property
    def used_params_counted(self) -> str:
        """When ZeRO's gradient hooks count the parameters the backward uses: never ("never",
        up to 0.18.4), at every hook ("every_hook", 0.18.5 and 0.18.6), at a backward
        phase's first hook ("per_phase", from 0.18.7)."""
        if not self.grad_hooks_count_used_params:
            return "never"
        return "per_phase" if self.grad_hooks_count_once_per_phase else "every_hook"

    @property
    def zero12_waits_for_each_bucket(self) -> bool:
        """ZeRO-1/2's default stream waits for each full bucket's reduction (0.17.5 to
        0.18.4)."""
        return (self.zero12_compute_waits_for_each_bucket
                and not self.zero12_bucket_wait_removed)

    def in_effect(self) -> dict[str, bool | str]:
        """What the rows that one release adds and a later one takes out come to (the
        properties above), for `zerosim check`."""
        return {"boundary_flush_stages_in_pinned_buffer":
                self.boundary_flush_stages_in_pinned_buffer,
                "zero12_waits_for_each_bucket": self.zero12_waits_for_each_bucket,
                "live_count_reset": self.live_count_reset,
                "used_params_counted": self.used_params_counted,
                "hpz_secondary_recopied": self.hpz_secondary_recopied}

    @property
    def hpz_secondary_recopied(self) -> bool:
        """Every release copies hpZ's secondary partition again (0.13.2 to 0.14.2: added by
        one row, taken out by the next)."""
        return self.hpz_secondary_by_presence and not self.hpz_secondary_once

    def describe(self) -> dict[str, bool]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class ForkBuild:
    """A commit of a DeepSpeed fork whose `deepspeed.__version__` carries it as a local label
    (`0.13.3+4570a955`). `differs` says how its own code departs from the step zerosim
    replays for the fork's options ("" where it is that step)."""

    commit: str
    date: str
    title: str
    differs: str = ""
    fixed_gap: int = 0
    """The gap the build's own step hard-codes (0: it reads `prefetch_optimizer_gap`)."""
    binds_cores: bool = False
    """Its launcher takes a `--bind_core_list` in any order (`deepspeed/utils/numa.py`
    `parse_range_list` without the ascending check, from c7da512a on): the change a core list
    in GPU order needs on Polaris, where GPU 0 hangs off NUMA domain 3. The runs of these
    builds are taken as launched with `--bind_cores_to_rank` and that list (`BOUND_LAUNCH`)."""


DEEP_OPTIMIZER_STATES_REPOSITORY = "DataStates/DeepSpeed, branch deep-optimizer-states"
"""The Deep Optimizer States fork (Maurya et al., 2024), based on DeepSpeed master of
2024-02-22 (dd3690c5, between 0.13.2 and 0.13.3). Its builds add three
`zero_optimization.offload_optimizer` keys (runtime/zero/offload_config.py):
`part_grads_async` (the boundary gradient copy to the host is `non_blocking`),
`prefetch_optimizer` and `prefetch_optimizer_gap` (every gap-th sub-group is updated on the
GPU, its state moved in and out while the CPU updates the others)."""

DEEP_OPTIMIZER_STATES_BUILDS: tuple[ForkBuild, ...] = (
    ForkBuild("fa8c1df2", "2024-03-25", "Working version of Stage-3 opt-swap-in/out with Async "
              "copier", "reads prefetch_optimizer only, with the gap fixed at 3, and steps "
              "through a work-in-progress version of the interleaved update", fixed_gap=3),
    ForkBuild("8074cd62", "2024-03-28", "Working version of deep optimizer states",
              "reads prefetch_optimizer only, with the gap fixed at 4; its boundary copy is "
              "always non_blocking; its step moves the GPU sub-groups' state on one copier "
              "stream, runs their Adam on a stream of its own that the host synchronizes on, "
              "and writes the CPU sub-groups' 16-bit partitions by a raw H2D of their fp32 "
              "bytes", fixed_gap=4),
    ForkBuild("c7da512a", "2024-04-08", "Stash pipline parallel code",
              "moves the GPU sub-groups' state on one copier stream, runs their Adam on a "
              "stream of its own that the host synchronizes on, and writes the CPU "
              "sub-groups' 16-bit partitions by a raw H2D of their fp32 bytes",
              binds_cores=True),
    ForkBuild("d8048a5e", "2024-04-13", "Async downscaling of CPU-updated subgroups",
              binds_cores=True),
    ForkBuild("5c3f1413", "2024-06-05", "Middleware submission", binds_cores=True),
    ForkBuild("f4b9a296", "2024-04-05", "Add datastates init file (branch hybrid_opt_offload, "
              "on 5c3f1413; stage3.py as there)", binds_cores=True),
    ForkBuild("6132c06b", "2024-06-05", "Add FlexScience benchmarking for "
              "hybrid_opt_offloading (branch hybrid_opt_offload)",
              "its stage3.py keeps a stash's conflict markers, so it does not import as "
              "committed; the code around them steps a GPU sub-group twice and keeps a "
              "Twin-Flow part of the sub-groups on the GPU", binds_cores=True),
    ForkBuild("4570a955", "2024-09-30", "Cleanup DataStates from Deep-Optimizer-States",
              binds_cores=True),
    ForkBuild("d18d6f81", "2024-10-03", "Update script to support "
              "https://github.com/microsoft/DeepSpeed/issues/5603", binds_cores=True),
)
"""The fork's builds. zerosim replays the options as d8048a5e and later do them (the step of
4570a955). A build reports the commit it was installed from; with a development install
(`pip install -e`) the code that runs may be later, so the earlier labels are accepted and
replayed the same way, with a warning naming how their own code differs."""

STUDY_FORK_BUILD = "5c3f1413"
"""The fork's commit of the study itself ("Middleware submission", 2024-06-05), which a
measured run that sets the fork's options on a plain release label is taken to have run: a
release refuses the keys, and a build installed without its git metadata reports no label."""

FORK_BASE_RELEASE = "0.13.3"
"""The release every build of the fork reports as its version (`0.13.3+<commit>`)."""

BOUND_LAUNCH = (
    "c7da512a relaxes the launcher's core-list parser and nothing else of it; the same author's "
    "later runs (mauryaavinash95/MLP-Offload logs, 2024-11) launch with --bind_cores_to_rank "
    "and a --bind_core_list out of ascending order; and the four DP=4 runs of c7da512a measure "
    "an update 1.5x faster than the other builds' at the same size, as ranks on their own "
    "NUMA domain's memory would (docs/deep_optimizer_states.md)")
"""Why the runs of a `binds_cores` build are replayed with `runtime.bind_cores_to_rank`."""


def launched_bound(version: str) -> bool:
    """Whether the runs of a DeepSpeed version (`0.13.3+c7da512a`) are taken as launched with
    cores bound to each rank (`ForkBuild.binds_cores`): False for a release."""
    label = version.partition("+")[2]
    build = fork_build(label) if label else None
    return bool(build and build.binds_cores)


EMPTY_CACHE_EACH_PHASE = (
    "every build of the fork (DEEP_OPTIMIZER_STATES_BUILDS, fa8c1df2 to d18d6f81) calls "
    "get_accelerator().empty_cache() at the start and the end of DeepSpeedEngine.forward, "
    "backward and step (runtime/engine.py; the timers start after it and stop before it), "
    "which upstream DeepSpeed does not; the study's runs did the same (\"we only relinquish "
    "memory back to the system at the beginning of each forward, backward, and update "
    "stage\", Breaking the Memory Wall, section 3.4)")
"""Why a fork build's runs empty the CUDA cache at every phase (`runtime.empty_cache_each_phase`
says so for any other run)."""


def empties_cache_each_phase(stated: bool | None, label: str) -> bool:
    """Whether a run empties the CUDA cache at every phase: as `runtime.empty_cache_each_phase`
    states it, else what its build does: a source build is taken as the fork's, as for its
    options (`resolve_behaviours`), and a release does not."""
    return bool(label) if stated is None else stated


FORK_KEYS = ("part_grads_async", "prefetch_optimizer", "prefetch_optimizer_gap")
"""The fork's `offload_optimizer` keys; the raw and resolved settings and a measured run carry
them under these names."""


def fork_settings(holder: object) -> dict[str, bool | int]:
    """The fork's keys as `holder` (settings or a run) has them."""
    return {key: getattr(holder, key) for key in FORK_KEYS}


FORK_OPTIONS = ("fork_options",)
"""The `Behaviours` field a fork build sets (`ForkBuild`), not a release."""


def fork_build(label: str) -> ForkBuild | None:
    """The Deep Optimizer States build a version's local label names (a commit prefix of at
    least 7 hex digits), if any."""
    label = label.lower()
    if len(label) < 7:
        return None
    for build in DEEP_OPTIMIZER_STATES_BUILDS:
        if build.commit.startswith(label) or label.startswith(build.commit):
            return build
    return None


def unknown_build_text(label: str) -> str:
    """How every message names a source build that is not in `DEEP_OPTIMIZER_STATES_BUILDS`."""
    return f"build {label} is not a commit of the Deep Optimizer States fork zerosim knows"


def resolve_behaviours(version: Version, label: str = "") -> Behaviours:
    """A release's behaviours; a source build's local label (`version_label`) adds the fork's
    options: a release refuses the keys, so a build that reads them is the fork's (one not in
    `DEEP_OPTIMIZER_STATES_BUILDS` is replayed like the others, with a warning)."""
    return Behaviours(**{row.name: version >= row.since for row in BEHAVIOURS},
                      fork_options=bool(label))


def behaviour_markdown_rows() -> list[str]:
    """The table as the markdown rows of docs/deepspeed_versions.md, oldest release first."""
    rows = sorted(BEHAVIOURS, key=lambda row: (row.since, row.name))
    return [f"| {format_version(row.since)} | `{row.name}` | {row.what} | {row.source} |"
            for row in rows]


def behaviour_table() -> list[dict[str, str]]:
    """The table as rows (for docs and `zerosim check`)."""
    return [{"behaviour": row.name, "since": format_version(row.since), "source": row.source,
             "what": row.what} for row in BEHAVIOURS]

