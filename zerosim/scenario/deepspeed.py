"""The `deepspeed:` section: ds_config.json keys verbatim, with DeepSpeed's code defaults.

Defaults are the values DeepSpeed's code uses (its docs disagree in places), version-aware where
they changed. Keys zerosim does not model are collected and reported once; keys that cannot
change time or memory (logging, schedules, loss-scale knobs) are accepted silently.
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
)

from zerosim.behaviours import (
    DEEP_OPTIMIZER_STATES_REPOSITORY,
    Behaviours,
    fork_build,
    fork_settings,
    unknown_build_text,
)
from zerosim.errors import ScenarioError, ScenarioWarning
from zerosim.inputs import check_section
from zerosim.scenario.batch import batch_sizes
from zerosim.scenario.hf_trainer import AutoFill, TrainerContext, fill_auto
from zerosim.scenario.legacy import translate_legacy
from zerosim.scenario.validation import validate_section

# ds_config keys accepted without a warning because they cannot change time or memory.
NO_EFFECT_KEYS = {
    "steps_per_print", "wall_clock_breakdown", "dump_state", "prescale_gradients",
    "gradient_predivide_factor", "scheduler", "tensorboard", "wandb", "csv_monitor",
    "comms_logger", "flops_profiler", "seed", "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer", "fp16.loss_scale", "fp16.initial_scale_power",
    "fp16.loss_scale_window", "fp16.hysteresis", "fp16.min_loss_scale", "fp16.auto_cast",
    "fp16.consecutive_hysteresis", "optimizer.params", "zero_optimization.allgather_partitions",
    "zero_optimization.load_from_fp32_weights", "zero_optimization.elastic_checkpoint",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save",
    "zero_optimization.stage3_gather_fp16_weights_on_model_save",
    "zero_optimization.ignore_unused_parameters", "zero_optimization.round_robin_gradients",
    "activation_checkpointing",
}
READ_BENEATH_NO_EFFECT = ("optimizer.params.torch_adam",
                          "optimizer.params.fp32_optimizer_states")
"""Keys zerosim reads inside a NO_EFFECT_KEYS section (`_torch_adam`, `_master_precision`)."""
FRAMEWORK_OVERRIDDEN_KEYS = ("activation_checkpointing",)
"""Sections a training script that calls DeepSpeed's own helpers reads, but not the frameworks
zerosim replays: Megatron-DeepSpeed hands `deepspeed.checkpointing.configure` its own flags
(`--partition-activations`, `--checkpoint-in-cpu`, ...; store_true, never None), which override
the section, and the Hugging Face Trainer checkpoints with `torch.utils.checkpoint`. No effect
(NO_EFFECT_KEYS), but said once, as a user who set one expects it to act."""
MODELLED_OPTIMIZERS = {"adam", "adamw", "cpuadam", "deepspeedcpuadam"}
CLOSED_SECTIONS = {
    "optimizer": ("type", "params", "legacy_fusion"),
    "scheduler": ("type", "params"),
}
"""ds_config sections whose every key DeepSpeed knows (runtime/config.py reads these and no
others): any other key is a mistake, refused with the nearest known key."""


class _Open(BaseModel):
    """ds_config sections keep unknown keys so they can be reported, not rejected."""

    model_config = ConfigDict(extra="allow", frozen=True)


class _Precision(_Open):
    enabled: bool = False


class _Fp16(_Precision):
    fp16_master_weights_and_grads: StrictBool = False


class _Bf16(_Precision):
    check_grad_overflow: bool | None = None
    bf16_master_weights_and_grads: StrictBool = False
    bf16_optimizer_states: StrictBool = False


def _whole(value: Any) -> Any:
    """DeepSpeed's int fields take 1e8 from JSON as 100000000; 1.5 is refused."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# Defaults of DeepSpeed 0.13.3 (runtime/zero/offload_config.py, runtime/swap_tensor/constants.py).
OPTIMIZER_BUFFER_COUNT = 4
PARAM_BUFFER_COUNT = 5
PARAM_BUFFER_SIZE = 100_000_000
PARAM_MAX_IN_CPU = 1_000_000_000
AIO_BLOCK_SIZE = 1_048_576
AIO_QUEUE_DEPTH = 8
AIO_THREAD_COUNT = 1


class _OffloadOptimizer(_Open):
    device: Literal["none", "cpu", "nvme"] = "none"
    nvme_path: str | None = None
    pin_memory: bool | None = None
    ratio: float = Field(1.0, gt=0, le=1)
    buffer_count: int = Field(OPTIMIZER_BUFFER_COUNT, ge=0)
    pipeline_read: bool = False
    pipeline_write: bool = False
    fast_init: bool = False
    part_grads_async: bool = False
    prefetch_optimizer: bool = False
    prefetch_optimizer_gap: int = Field(0, ge=0)
    super_offload: bool = False
    cpuadam_cores_perc: float = Field(0.8, ge=0, le=1)

    _whole = field_validator("buffer_count", "prefetch_optimizer_gap", mode="before")(_whole)


class _OffloadParam(_Open):
    device: Literal["none", "cpu", "nvme"] = "none"
    nvme_path: str | None = None
    pin_memory: bool = False
    buffer_count: int = Field(PARAM_BUFFER_COUNT, ge=0)
    buffer_size: int = Field(PARAM_BUFFER_SIZE, ge=0)
    max_in_cpu: int = Field(PARAM_MAX_IN_CPU, ge=0)

    _whole = field_validator("buffer_count", "buffer_size", "max_in_cpu", mode="before")(_whole)


class _Aio(_Open):
    """The top-level `aio` block (runtime/swap_tensor/aio_config.py). DeepSpeed reads it with
    no checks; a zero count or size breaks its aio handle or makes the I/O alignment 0
    (`_io_aligned_numel` then takes a modulo by zero), so zerosim wants each >= 1."""

    block_size: int = Field(AIO_BLOCK_SIZE, ge=1)
    queue_depth: int = Field(AIO_QUEUE_DEPTH, ge=1)
    thread_count: int = Field(AIO_THREAD_COUNT, ge=1)
    single_submit: bool = False
    overlap_events: bool = True

    _whole = field_validator("block_size", "queue_depth", "thread_count", mode="before")(_whole)


class _ZenFlow(_Open):
    """`zero_optimization.zenflow` (runtime/zenflow/zenflow_config.py, DeepSpeed 0.17.5+)."""

    topk_ratio: float = Field(0.1, ge=0, le=1)
    select_strategy: Literal["auto", "step", "epoch"] = "auto"
    select_interval: Literal["auto"] | int = "auto"
    update_interval: Literal["auto"] | int = "auto"
    overlap_step: bool = False
    offload: bool = False
    auto_ratio: float = Field(0.99, ge=0, le=1)
    full_warm_up_rounds: int = Field(0, ge=0)
    pt_reserved_cores_perc: float = Field(0.5, ge=0, le=1)
    steps_per_epoch: int | None = None
    """Set by DeepSpeed from the data loader ("should not be set by users"); read, unused."""

    _whole = field_validator("select_interval", "update_interval", "full_warm_up_rounds",
                             mode="before")(_whole)


def _listed(value: Any) -> Any:
    """DeepSpeed's leaf-module lists take one string as a list of it."""
    return [value] if isinstance(value, str) else value


class _LeafModule(BaseModel):
    """`zero_optimization.leaf_module` (runtime/zero/leaf_module_config.py, DeepSpeed 0.18.0+:
    a `DeepSpeedConfigModel`, which refuses any other key). `classes` None: DeepSpeed's
    default list."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    classes: list[StrictStr] | None = None
    names: list[StrictStr] = Field(default_factory=list)
    name_suffixes: list[StrictStr] = Field(default_factory=list)

    _listed = field_validator("classes", "names", "name_suffixes", mode="before")(_listed)


class _Zero(_Open):
    stage: Literal[0, 1, 2, 3] = 0
    overlap_comm: bool | None = None
    contiguous_gradients: bool = True
    reduce_scatter: bool = True
    reduce_bucket_size: float = Field(5e8, gt=0)
    allgather_bucket_size: float = Field(5e8, gt=0)
    sub_group_size: float = Field(1e9, gt=0)
    stage3_prefetch_bucket_size: float = Field(5e7, ge=0)
    stage3_max_live_parameters: float = Field(1e9, ge=0)
    stage3_max_reuse_distance: float = Field(1e9, ge=0)
    stage3_param_persistence_threshold: float = Field(1e5, ge=0)
    offload_optimizer: _OffloadOptimizer = _OffloadOptimizer()
    offload_param: _OffloadParam = _OffloadParam()
    zenflow: _ZenFlow | None = None
    module_granularity_threshold: int = Field(0, ge=0, validation_alias=AliasChoices(
        "module_granularity_threshold", "stage3_module_granularity_threshold"))
    leaf_module: _LeafModule | None = None
    zero_hpz_partition_size: int = Field(1, ge=0)
    zero_quantized_weights: bool = False
    zero_quantized_gradients: bool = False
    zeropp_loco_param: dict[str, Any] | None = None
    mics_shard_size: int = -1
    mics_hierarchical_params_gather: bool = False

    _whole = field_validator("module_granularity_threshold", "zero_hpz_partition_size",
                             "mics_shard_size", mode="before")(_whole)


class _Optimizer(_Open):
    type: str = "Adam"
    params: dict[str, Any] = Field(default_factory=dict)


class _DataTypes(_Open):
    grad_accum_dtype: Literal["fp32", "fp16", "bf16"] | None = None


class _DeepSpeedRaw(_Open):
    train_micro_batch_size_per_gpu: int | None = Field(None, ge=1)
    gradient_accumulation_steps: int | None = Field(None, ge=1)
    train_batch_size: int | None = Field(None, ge=1)
    fp16: _Fp16 = _Fp16()
    bf16: _Bf16 = _Bf16()
    gradient_clipping: float | None = Field(None, ge=0)
    optimizer: _Optimizer = _Optimizer()
    data_types: _DataTypes = _DataTypes()
    communication_data_type: Literal["fp32", "fp16", "bf16"] | None = None
    sequence_parallel_size: StrictInt = Field(1, ge=1)
    """Read raw by DeepSpeed's batch arithmetic (a text would not divide the world size), and
    before this section is validated (`_sequence_groups`): a whole number only."""
    seq_parallel_communication_data_type: Literal["fp32", "fp16", "bf16"] | None = None
    zero_optimization: _Zero = _Zero()
    aio: _Aio | None = None
    memory_breakdown: StrictBool = False
    """DeepSpeed reads it raw and tests its truth (`engine.memory_breakdown()`), so a string
    "false" would turn the reports on: only true and false are taken."""
    managed_gradient_accumulation: StrictBool = True
    """Read raw as well (`get_scalar_param`), and tested by its falsity: only true and false
    are taken."""

    _whole = field_validator("sequence_parallel_size", mode="before")(_whole)


@dataclass(frozen=True)
class OffloadSettings:
    """One of `offload_optimizer` / `offload_param`. Defaults are DeepSpeed 0.13.3's for
    `offload_optimizer`; the resolved `offload_param` carries its own (buffer_count 5).
    `buffer_size` and `max_in_cpu` are `offload_param` keys, `ratio`, `pipeline_read`,
    `pipeline_write` and `fast_init` `offload_optimizer` keys; the other section keeps them at
    their defaults."""

    device: str
    pin_memory: bool
    ratio: float = 1.0
    nvme_path: str | None = None
    buffer_count: int = OPTIMIZER_BUFFER_COUNT
    buffer_size: int = PARAM_BUFFER_SIZE
    max_in_cpu: int = PARAM_MAX_IN_CPU
    pipeline_read: bool = False
    pipeline_write: bool = False
    fast_init: bool = False
    part_grads_async: bool = False
    prefetch_optimizer: bool = False
    prefetch_optimizer_gap: int = 0
    gpu_subgroups_first: bool = False
    """Twin-Flow steps the first sub-groups on the GPU, not the last (DeepSpeed 0.18.0+,
    `twin_flow_gpu_subgroups_first`)."""
    super_offload: bool = False
    """SuperOffload (DeepSpeed 0.18.0+): an optimizer process steps each sub-group as the
    boundary backward completes its gradients (`zerosim.engine.superoffload`)."""
    cpuadam_cores_perc: float = 0.8
    """The share of the rank's CPUs SuperOffload's optimizer process runs on."""

    @property
    def enabled(self) -> bool:
        return self.device != "none"

    @property
    def nvme(self) -> bool:
        return self.device == "nvme"

    @property
    def pipelined(self) -> bool:
        """DeepSpeed picks PipelinedOptimizerSwapper when either is set (offload_config.py
        `set_pipeline`, stage3.py _configure_tensor_swapping)."""
        return self.pipeline_read or self.pipeline_write


@dataclass(frozen=True)
class AioSettings:
    """The `aio` block: how DeepSpeed's libaio handles submit swaps. Recorded, and used for the
    swap-buffer alignment and the smallest swapped tensor (zerosim.hardware.nvme); what share
    of the drives' bandwidth they reach is not modelled (no published basis)."""

    block_size: int = AIO_BLOCK_SIZE
    queue_depth: int = AIO_QUEUE_DEPTH
    thread_count: int = AIO_THREAD_COUNT
    single_submit: bool = False
    overlap_events: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"block_size": self.block_size, "queue_depth": self.queue_depth,
                "thread_count": self.thread_count, "single_submit": self.single_submit,
                "overlap_events": self.overlap_events}


@dataclass(frozen=True)
class ZenFlowSettings:
    """`zero_optimization.zenflow` as resolved. `update_interval` None is DeepSpeed's "auto"
    (the gradients' norms decide when the CPU update runs: `zerosim.scenario.support`
    refuses it); otherwise DeepSpeed makes it the run's gradient accumulation
    (`configure_zenflow`), and one replayed iteration is that many training steps. The
    gradient selection, once per epoch by default, and the `full_warm_up_rounds` before it
    are start-up work that a steady-state window does not hold."""

    topk_ratio: float = 0.1
    update_interval: int | None = None
    overlap_step: bool = False
    offload: bool = False
    select_strategy: str = "auto"
    select_interval: int | str = "auto"
    full_warm_up_rounds: int = 0
    pt_reserved_cores_perc: float = 0.5

    def to_dict(self) -> dict[str, Any]:
        return {"topk_ratio": self.topk_ratio, "select_strategy": self.select_strategy,
                "select_interval": self.select_interval,
                "update_interval": ("auto" if self.update_interval is None
                                    else self.update_interval),
                "overlap_step": self.overlap_step, "offload": self.offload,
                "full_warm_up_rounds": self.full_warm_up_rounds,
                "pt_reserved_cores_perc": self.pt_reserved_cores_perc}


@dataclass(frozen=True)
class LeafSettings:
    """What makes modules ZeRO-3 leaves, as resolved (`zerosim.models.leaves` finds them): the
    granularity threshold (0: off), and the classes, full names and name suffixes of
    `leaf_module` (DeepSpeed 0.18.0+, whose default classes are transformers' three
    mixture-of-experts blocks). `fast_fetch`: the host waits on a leaf's parameters without
    the bound on unfinished fetch events (a threshold set, DeepSpeed 0.16.3+)."""

    granularity_threshold: int = 0
    classes: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    name_suffixes: tuple[str, ...] = ()
    fast_fetch: bool = False

    @property
    def any(self) -> bool:
        return bool(self.granularity_threshold or self.classes or self.names
                    or self.name_suffixes)

    def to_dict(self) -> dict[str, Any]:
        """The keys as the ds_config writes them (none that a release without them refuses)."""
        listed = {"classes": list(self.classes), "names": list(self.names),
                  "name_suffixes": list(self.name_suffixes)}
        return {**({"module_granularity_threshold": self.granularity_threshold}
                   if self.granularity_threshold else {}),
                **({"leaf_module": listed} if any(listed.values()) else {})}


@dataclass(frozen=True)
class ZeroPlusPlusSettings:
    """ZeRO++ (DeepSpeed 0.10.0+, PR #3784), as resolved: hpZ's
    `hpz_partition_size` (`zero_hpz_partition_size`; 1: off), how many consecutive ranks
    share a secondary partition of every parameter, which the fetches after a parameter's
    first release since the step all-gather over those ranks alone; qwZ's
    `quantized_weights` (`zero_quantized_weights`), all-gathers of int8 blocks and their
    fp32 scales, quantized before and dequantized after; qgZ's `quantized_gradients`
    (`zero_quantized_gradients`), int4 all-to-all gradient reductions across nodes."""

    hpz_partition_size: int = 1
    quantized_weights: bool = False
    quantized_gradients: bool = False
    """qgZ (`zero_quantized_gradients`): ZeRO-3 reduces each multi-dimensional gradient by
    int4 all-to-alls within its node and then across nodes, instead of a reduce-scatter, where
    the ranks span several nodes (`quantizes_gradients`)."""
    loco: tuple[float, int] | None = None
    """LoCo (`zeropp_loco_param`, 0.16.2+): its `err_beta` and `reset_T`; where qgZ acts, each
    matrix's quantization errors are kept between steps and fed into the next reduction."""

    @property
    def any(self) -> bool:
        return self.hpz_partition_size > 1 or self.quantized_weights

    def quantizes_gradients(self, stage: int, world: int, gpus_per_node: int) -> bool:
        """Whether qgZ acts: ZeRO-3, and DeepSpeed's node count, the world over the GPUs a
        node has (`device_count()`, floored), above one (stage3.py `__avg_scatter_grads`)."""
        return self.quantized_gradients and stage == 3 and world // gpus_per_node > 1

    def loco_acts(self, stage: int, world: int, gpus_per_node: int) -> bool:
        """Whether LoCo's error feedback runs: given, where qgZ acts."""
        return self.loco is not None and self.quantizes_gradients(stage, world, gpus_per_node)

    def hpz_group(self, world: int) -> int:
        """Ranks per secondary partition: DeepSpeed's `_create_zero_param_parallel_group`
        takes min(size, world); 1 where hpZ is off."""
        return min(self.hpz_partition_size, world) if self.hpz_partition_size > 1 else 1

    def to_dict(self) -> dict[str, Any]:
        """The keys as the ds_config writes them (none that a release without them refuses)."""
        return {**({"zero_hpz_partition_size": self.hpz_partition_size}
                   if self.hpz_partition_size != 1 else {}),
                **({"zero_quantized_weights": True} if self.quantized_weights else {}),
                **({"zero_quantized_gradients": True} if self.quantized_gradients else {}),
                **({"zeropp_loco_param": {"err_beta": self.loco[0], "reset_T": self.loco[1]}}
                   if self.loco is not None else {})}


@dataclass(frozen=True)
class MicsSettings:
    """MiCS (DeepSpeed 0.9.2+, PR #2964), as resolved: `shard_size` (`mics_shard_size`; 0 or
    less: off), how many consecutive ranks partition the parameters, gradients and optimizer
    states among themselves, the other groups of as many holding replicas of them; and
    `hierarchical` (`mics_hierarchical_params_gather`), a shard group's all-gather first
    across its nodes, then within each node. Only ZeRO-3 reads them."""

    shard_size: int = -1
    hierarchical: bool = False

    def acts(self, stage: int) -> bool:
        """Whether the engine builds MiCS's optimizer: ZeRO-3 with a shard size above 0
        (engine.py `_configure_zero_optimizer`)."""
        return stage == 3 and self.shard_size > 0

    def partition_ranks(self, stage: int, world: int) -> int:
        """The ranks each parameter is partitioned over: the shard group where MiCS acts,
        every rank otherwise."""
        return self.shard_size if self.acts(stage) else world

    def replicas(self, stage: int, world: int) -> int:
        """How many shard groups hold the same partitions (1 without MiCS)."""
        return world // self.partition_ranks(stage, world)

    def to_dict(self) -> dict[str, Any]:
        """The keys as the ds_config writes them (none where they are off)."""
        return {**({"mics_shard_size": self.shard_size} if self.shard_size > 0 else {}),
                **({"mics_hierarchical_params_gather": True} if self.hierarchical else {})}


def memory_reports_per_step(gradient_accumulation_steps: int) -> int:
    """DeepSpeed's memory reports in an optimizer step with `memory_breakdown` on: before and
    after each micro-batch's forward and backward, and before and after the step
    (runtime/engine.py `forward`, `backward`, `step`)."""
    return 4 * gradient_accumulation_steps + 2


@dataclass(frozen=True)
class DeepSpeedConfig:
    """The resolved ds_config: every value zerosim uses, defaults filled in."""

    train_micro_batch_size_per_gpu: int
    gradient_accumulation_steps: int
    dtype: str
    grad_accum_dtype: str
    communication_dtype: str
    gradient_clipping: float
    optimizer: str
    check_grad_overflow: bool
    stage: int
    overlap_comm: bool
    contiguous_gradients: bool
    reduce_scatter: bool
    reduce_bucket_size: int
    allgather_bucket_size: int
    sub_group_size: int
    stage3_prefetch_bucket_size: int
    stage3_max_live_parameters: int
    stage3_max_reuse_distance: int
    stage3_param_persistence_threshold: int
    offload_optimizer: OffloadSettings
    offload_param: OffloadSettings
    aio: AioSettings = AioSettings()
    train_batch_size: int | None = None
    """train_micro_batch_size_per_gpu x gradient_accumulation_steps x data_parallel."""
    autotp_size: int = 0
    """`tensor_parallel.autotp_size` where the release trains with it (0: not read)."""
    torch_adam: bool = False
    """`optimizer.params.torch_adam`: DeepSpeed builds PyTorch's `torch.optim.Adam(W)` in
    place of its FusedAdam (engine.py `_configure_basic_optimizer`)."""
    memory_breakdown: bool = False
    """The engine prints rank 0's memory before and after each forward, backward and step
    (`see_memory_usage(..., force=True)`), each time after a full `gc.collect()`."""
    zenflow: ZenFlowSettings | None = None
    """ZenFlow's options (DeepSpeed 0.17.5+), None without the key."""
    master_dtype: str = "fp32"
    """The optimizer's master params and gradient partitions: "bf16" with
    `bf16.bf16_master_weights_and_grads` (DeepSpeed 0.18.3+), "fp16" with
    `fp16.fp16_master_weights_and_grads`."""
    optimizer_state_dtype: str = "fp32"
    """Adam's exp_avg and exp_avg_sq (`_master_precision`)."""
    leaves: LeafSettings = LeafSettings()
    """What makes modules ZeRO-3 leaves (`_leaves`)."""
    zero_plus_plus: ZeroPlusPlusSettings = ZeroPlusPlusSettings()
    """hpZ, qwZ and qgZ (`_zero_plus_plus`)."""
    mics: MicsSettings = MicsSettings()
    """MiCS's shard groups (`_mics`)."""
    managed_accumulation: bool = True
    """`managed_gradient_accumulation` (DeepSpeed 0.19.4+): false makes step() the
    accumulation boundary instead of the last micro-batch's backward."""
    sequence_parallel_size: int = 1
    """Ulysses sequence parallelism (`sequence_parallel_size`): groups of that many
    consecutive ranks each train on one slice of the same sequences, exchanging them by
    all-to-alls around each attention (1: off). Batch sizes count the groups, not the ranks."""

    def sequence_groups(self, world: int) -> int:
        """How many sequence-parallel groups `world` ranks make: the data-parallel degree of
        the batch (`world` without sequence parallelism)."""
        return world // self.sequence_parallel_size

    @property
    def low_precision_master(self) -> bool:
        return self.master_dtype != "fp32"

    @property
    def memory_reports(self) -> int:
        """The engine's memory reports in one optimizer step (none without
        `memory_breakdown`)."""
        if not self.memory_breakdown:
            return 0
        return memory_reports_per_step(self.gradient_accumulation_steps)

    def to_dict(self) -> dict[str, Any]:
        """The resolved config in ds_config.json shape."""
        zero = {
            "stage": self.stage,
            "overlap_comm": self.overlap_comm,
            "contiguous_gradients": self.contiguous_gradients,
            "reduce_scatter": self.reduce_scatter,
            "reduce_bucket_size": self.reduce_bucket_size,
            "allgather_bucket_size": self.allgather_bucket_size,
            "sub_group_size": self.sub_group_size,
            "stage3_prefetch_bucket_size": self.stage3_prefetch_bucket_size,
            "stage3_max_live_parameters": self.stage3_max_live_parameters,
            "stage3_max_reuse_distance": self.stage3_max_reuse_distance,
            "stage3_param_persistence_threshold": self.stage3_param_persistence_threshold,
            "offload_optimizer": _offload_optimizer_dict(self.offload_optimizer),
            "offload_param": _offload_param_dict(self.offload_param),
            **({"zenflow": self.zenflow.to_dict()} if self.zenflow is not None else {}),
            **self.leaves.to_dict(),
            **self.zero_plus_plus.to_dict(),
            **self.mics.to_dict(),
        }
        return {
            "train_batch_size": self.train_batch_size,
            "train_micro_batch_size_per_gpu": self.train_micro_batch_size_per_gpu,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "fp16": {"enabled": self.dtype == "fp16",
                     **({"fp16_master_weights_and_grads": True}
                        if self.master_dtype == "fp16" else {})},
            "bf16": {"enabled": self.dtype == "bf16",
                     **({"check_grad_overflow": self.check_grad_overflow}
                        if self.dtype == "bf16" else {}),
                     **({"bf16_master_weights_and_grads": True,
                         "bf16_optimizer_states": self.optimizer_state_dtype == "bf16"}
                        if self.master_dtype == "bf16" else {})},
            "gradient_clipping": self.gradient_clipping,
            "optimizer": {"type": self.optimizer, **self._optimizer_params()},
            "data_types": {"grad_accum_dtype": self.grad_accum_dtype},
            "communication_data_type": self.communication_dtype,
            "zero_optimization": zero,
            "aio": self.aio.to_dict(),
            "memory_breakdown": self.memory_breakdown,
            **({} if self.managed_accumulation else {"managed_gradient_accumulation": False}),
            **({"sequence_parallel_size": self.sequence_parallel_size,
                "seq_parallel_communication_data_type": self.communication_dtype}
               if self.sequence_parallel_size > 1 else {}),
        }


    def _optimizer_params(self) -> dict[str, Any]:
        params: dict[str, Any] = {}
        if self.torch_adam:
            params["torch_adam"] = True
        if self.low_precision_master and self.optimizer_state_dtype != "fp32":
            params["fp32_optimizer_states"] = False
        return {"params": params} if params else {}


def _offload_optimizer_dict(o: OffloadSettings) -> dict[str, Any]:
    return {"device": o.device, "nvme_path": o.nvme_path, "pin_memory": o.pin_memory,
            "ratio": o.ratio, "buffer_count": o.buffer_count, "pipeline_read": o.pipeline_read,
            "pipeline_write": o.pipeline_write, "fast_init": o.fast_init,
            **_fork_keys(o),
            **({"super_offload": True, "cpuadam_cores_perc": o.cpuadam_cores_perc}
               if o.super_offload else {})}


def _fork_keys(o: OffloadSettings) -> dict[str, Any]:
    """The Deep Optimizer States keys, where a scenario sets them (a release has none)."""
    keys = fork_settings(o)
    return keys if any(keys.values()) else {}


def _offload_param_dict(o: OffloadSettings) -> dict[str, Any]:
    return {"device": o.device, "nvme_path": o.nvme_path, "pin_memory": o.pin_memory,
            "buffer_count": o.buffer_count, "buffer_size": o.buffer_size,
            "max_in_cpu": o.max_in_cpu}


TYPO_CUTOFF = 0.8


def _extras(model: BaseModel, source: str, prefix: str = "") -> list[str]:
    """Unknown keys, depth first; one that looks like a misspelt known key is an error."""
    known = list(type(model).model_fields)
    found = []
    for key in model.model_extra or {}:
        close = difflib.get_close_matches(key, known, n=1, cutoff=TYPO_CUTOFF)
        if close:
            raise ScenarioError(source, f"deepspeed.{prefix}{key}",
                                f"a known key (did you mean '{close[0]}'?)", key)
        found.append(f"{prefix}{key}")
    for name in known:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            found.extend(_extras(value, source, f"{prefix}{name}."))
    return found


def check_closed_sections(data: Any, source: str) -> None:
    """A key DeepSpeed does not know in a closed section (`optimizer.tpye`) is an error."""
    if not isinstance(data, dict):
        return
    for section, known in CLOSED_SECTIONS.items():
        block = data.get(section)
        if not isinstance(block, dict):
            continue
        for key in block:
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.5)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                raise ScenarioError(source, f"deepspeed.{section}.{key}",
                                    f"one of the keys DeepSpeed reads in {section} "
                                    f"({', '.join(known)}){hint}", key)


def unmodelled_keys(raw: _DeepSpeedRaw, source: str) -> list[str]:
    """Keys present in the ds_config that zerosim neither models nor knows to be harmless."""
    keys = []
    for key in _extras(raw, source):
        if any(key == k or key.startswith(f"{k}.") for k in NO_EFFECT_KEYS):
            continue
        keys.append(f"deepspeed.{key}")
    return keys


def changes_nothing(key: str) -> bool:
    """Whether setting the ds_config `key` (`steps_per_print`, `fp16.loss_scale`) changes
    nothing zerosim replays, at any stage: it is one of the NO_EFFECT_KEYS, or beneath one,
    and holds no key zerosim reads (`optimizer.params` holds `torch_adam`). Resolution drops
    such keys before anything reads them, so a sweep of one would give identical rows."""
    if any(read == key or read.startswith(f"{key}.") or key.startswith(f"{read}.")
           for read in READ_BENEATH_NO_EFFECT):
        return False
    return any(key == k or key.startswith(f"{k}.") for k in NO_EFFECT_KEYS)


def _torch_adam(raw: _DeepSpeedRaw, zero: _Zero, source: str) -> bool:
    """`optimizer.params.torch_adam`, for a GPU optimizer only: DeepSpeed would build
    PyTorch's Adam over host tensors in place of DeepSpeedCPUAdam, which zerosim does not
    price."""
    key = "deepspeed.optimizer.params.torch_adam"
    value = raw.optimizer.params.get("torch_adam", False)
    if not isinstance(value, bool):
        raise ScenarioError(source, key, "true or false", value)
    if value and raw.optimizer.type.lower() not in ("adam", "adamw"):
        raise ScenarioError(source, key, "false unless optimizer.type is Adam or AdamW "
                            "(DeepSpeed reads it for those two only)", value)
    if value and zero.offload_optimizer.device != "none":
        raise ScenarioError(source, key, "false with the optimizer offloaded (DeepSpeed would "
                            "step PyTorch's Adam on the host tensors; zerosim prices "
                            "DeepSpeedCPUAdam there)", value)
    return value


def _dtype(raw: _DeepSpeedRaw, source: str) -> str:
    """The training dtype; "fp32" when neither is enabled (DeepSpeed's default)."""
    if raw.fp16.enabled and raw.bf16.enabled:
        raise ScenarioError(source, "deepspeed.bf16.enabled",
                            "fp16 and bf16 not both enabled (DeepSpeed: 'bfloat16 and fp16 modes "
                            "cannot be simultaneously enabled')", True)
    if raw.bf16.enabled:
        return "bf16"
    if raw.fp16.enabled:
        return "fp16"
    return "fp32"


def _checks_grad_overflow(raw: _DeepSpeedRaw, dtype: str, stage: int,
                          behaviours: Behaviours) -> bool:
    """Whether the step checks the gradients for overflow: fp16 runs always; bf16 runs of
    ZeRO-1/2 as `bf16.check_grad_overflow` says from DeepSpeed 0.17.1 (default false, true
    from 0.19.3), never before; ZeRO-3 checks fp16 only in every release."""
    if dtype == "fp16":
        return True
    if dtype != "bf16" or stage not in (1, 2) or not behaviours.zero12_check_grad_overflow_key:
        return False
    stated = raw.bf16.check_grad_overflow
    return behaviours.bf16_check_grad_overflow_default_true if stated is None else stated


ZERO_KEY = "deepspeed.zero_optimization"


NVME_PATH_WHY = {
    "offload_param": "DeepSpeed asserts '\"nvme_path\" in DeepSpeed Config cannot be None if "
                     "remote device is nvme' (partition_parameters.py _validate_remote_device)",
    "offload_optimizer": "DeepSpeed builds its swap folder from it (stage3.py "
                         "_configure_tensor_swapping) and fails without one",
}


def _check_nvme(zero: _Zero, source: str) -> None:
    """What DeepSpeed 0.13.3 itself refuses about NVMe offload, whatever the model (docs/nvme.md;
    the model-dependent limits are in zerosim.hardware.nvme)."""
    for section, why in NVME_PATH_WHY.items():
        if getattr(zero, section).device == "nvme" and not getattr(zero, section).nvme_path:
            raise ScenarioError(source, f"{ZERO_KEY}.{section}.nvme_path",
                                f"a filesystem path on the NVMe drives when {section}.device is "
                                f"'nvme' ({why})", "nothing")
    if zero.offload_optimizer.device == "nvme" and zero.stage != 3:
        raise ScenarioError(
            source, f"{ZERO_KEY}.offload_optimizer.device",
            "'cpu' or 'none' unless stage is 3 (NVMe offloading is available only with ZeRO "
            "stage 3: only stage3.py has the optimizer swapper, and DeepSpeed's "
            "stage_1_and_2.py would silently offload to 'cpu' instead)", "nvme")
    if zero.offload_optimizer.device == "nvme" and zero.offload_optimizer.buffer_count < 1:
        raise ScenarioError(
            source, f"{ZERO_KEY}.offload_optimizer.buffer_count",
            "at least 1 with device 'nvme' (DeepSpeed's SwapBufferManager reads its first "
            "buffer; a sub-group on NVMe needs 4, more with pipeline_read/pipeline_write)",
            zero.offload_optimizer.buffer_count)


OFFLOAD_OPTIMIZER_KEY = f"{ZERO_KEY}.offload_optimizer"


class ForkBuildWarning(ScenarioWarning):
    """A Deep Optimizer States build whose own code departs from the step zerosim replays."""


def _fork_gap(zero: _Zero, label: str) -> int:
    """The interleaved update's gap: the key, or where a run switches the update on without
    it, the gap the named build hard-codes (fa8c1df2: 3, 8074cd62: 4)."""
    o = zero.offload_optimizer
    build = fork_build(label)
    if o.prefetch_optimizer and not o.prefetch_optimizer_gap and build is not None:
        return build.fixed_gap
    return o.prefetch_optimizer_gap


def _check_fork_options(zero: _Zero, behaviours: Behaviours, label: str, source: str) -> None:
    """The Deep Optimizer States keys (`zerosim.behaviours.DEEP_OPTIMIZER_STATES_BUILDS`):
    only a build of that fork reads them, and its step divides by the gap minus one. Where
    zerosim replays the interleaved update is decided with the other modes
    (`support._interleaved_update_is_offloaded_stage3`)."""
    o = zero.offload_optimizer
    keys = fork_settings(o)
    used = [key for key, value in keys.items() if value]
    if not used:
        return
    if not behaviours.fork_options:
        raise ScenarioError(
            source, f"{OFFLOAD_OPTIMIZER_KEY}.{used[0]}",
            "absent unless runtime.deepspeed_version names a build of the Deep Optimizer "
            f"States fork ({DEEP_OPTIMIZER_STATES_REPOSITORY}) by its local label, like "
            "\"0.13.3+4570a955\" (a DeepSpeed release refuses the key)", keys[used[0]])
    build = fork_build(label)
    if build is None:
        differs = unknown_build_text(label)
    else:
        differs = f"build {build.commit} {build.differs}" if build.differs else ""
    if differs:
        warnings.warn(f"{source}: runtime.deepspeed_version: {differs}; zerosim replays "
                      "the fork's options as d8048a5e and later builds do them "
                      "(docs/deep_optimizer_states.md)", ForkBuildWarning, stacklevel=5)
    if not o.prefetch_optimizer:
        return
    if _fork_gap(zero, label) < 2:
        raise ScenarioError(
            source, f"{OFFLOAD_OPTIMIZER_KEY}.prefetch_optimizer_gap", "at least 2 with "
            "prefetch_optimizer (every gap-th sub-group is updated on the GPU; the fork's step "
            "divides by gap - 1)", o.prefetch_optimizer_gap)


SUPER_OFFLOAD_KEYS = ("super_offload", "cpuadam_cores_perc")


def _check_super_offload(zero: _Zero, behaviours: Behaviours, source: str) -> None:
    """SuperOffload's keys (offload_config.py, DeepSpeed 0.18.0+): a release before does not
    know them (its offload config forbids extra keys). DeepSpeed builds SuperOffload's
    optimizer for ZeRO-3 only, where its step reads `subgroup_to_device`, which only an
    offloaded optimizer sets; zerosim refuses what that leaves meaningless or broken. Where
    zerosim replays it is decided with the other modes (`support._super_offload_is_replayed`)."""
    o = zero.offload_optimizer
    given = [key for key in SUPER_OFFLOAD_KEYS if key in o.model_fields_set]
    if given and not behaviours.super_offload:
        raise ScenarioError(source, f"{OFFLOAD_OPTIMIZER_KEY}.{given[0]}",
                            "absent before DeepSpeed 0.18.0 (SuperOffload came with PR #7559; "
                            "an earlier release refuses the key)", getattr(o, given[0]))
    if not o.super_offload:
        return
    if zero.stage != 3:
        raise ScenarioError(source, f"{OFFLOAD_OPTIMIZER_KEY}.super_offload",
                            f"true only with stage 3 (DeepSpeed builds SuperOffload's optimizer "
                            f"for ZeRO-3 alone; stage is {zero.stage})", o.super_offload)
    if o.device == "none":
        raise ScenarioError(source, f"{OFFLOAD_OPTIMIZER_KEY}.device",
                            "'cpu' with super_offload (its step looks up each sub-group's "
                            "device, which only an offloaded optimizer assigns)", o.device)


BF16_KEY = "deepspeed.bf16"
LOW_PRECISION_KEYS = ("bf16_master_weights_and_grads", "bf16_optimizer_states")


def _master_precision(raw: _DeepSpeedRaw, zero: _Zero, dtype: str, behaviours: Behaviours,
                      source: str) -> dict[str, str]:
    """The dtypes of the optimizer's master params and gradients and of Adam's moments, as
    DeepSpeed 0.18.3+ sets them (PR #7700): `bf16.bf16_master_weights_and_grads` makes the
    master partition and its gradient bf16 (`_configure_master_weights`); the moments are the
    optimizer's own: offloaded, DeepSpeedCPUAdam keeps them fp32 unless built with
    `fp32_optimizer_states=False` (`optimizer.params`; from 0.19.1, PR #8010, the engine sets it
    so whenever `bf16.bf16_optimizer_states` is on), on the GPU FusedAdam makes them in the
    params' dtype. Refused where DeepSpeed refuses: a release before 0.18.3 (its bf16 config
    forbids unknown keys), without ZeRO, the optimizer states without the master weights, the
    master weights without an offloaded optimizer unless the states are bf16 too
    (`_enforce_optimizer_offload`)."""
    bf16 = raw.bf16
    given = [key for key in LOW_PRECISION_KEYS if key in bf16.model_fields_set]
    if given and not behaviours.low_precision_master_weights:
        raise ScenarioError(source, f"{BF16_KEY}.{given[0]}", "absent before DeepSpeed 0.18.3 "
                            "(low-precision master weights came with PR #7700; an earlier "
                            "release refuses the key)", getattr(bf16, given[0]))
    fp32_states = _fp32_optimizer_states(raw, source)
    if not bf16.bf16_master_weights_and_grads:
        if bf16.bf16_optimizer_states:
            raise ScenarioError(source, f"{BF16_KEY}.bf16_optimizer_states", "false unless "
                                "bf16_master_weights_and_grads is true (DeepSpeed asserts "
                                "'bf16_optimizer_states requires bf16_master_weights_and_grads')",
                                True)
        return _fp16_master(raw, zero, dtype, behaviours, fp32_states, source)
    key = f"{BF16_KEY}.bf16_master_weights_and_grads"
    if zero.stage == 0:
        raise ScenarioError(source, key, "false without ZeRO (DeepSpeed asserts "
                            "'Bf16_master_weights_and_grads is only supported with ZeRO Stage "
                            "1, 2, or 3')", True)
    if dtype != "bf16":
        raise ScenarioError(source, key, "false unless bf16.enabled is true (zerosim replays "
                            f"bf16 master weights under bf16 training; this one trains in "
                            f"{dtype})", True)
    offloaded = zero.offload_optimizer.device != "none"
    if not offloaded and not bf16.bf16_optimizer_states:
        raise ScenarioError(source, f"{ZERO_KEY}.offload_optimizer.device", "'cpu' or 'nvme' "
                            "with bf16_master_weights_and_grads and fp32 optimizer states "
                            "(DeepSpeed asserts 'Master weights feature requires ZeRO Offload "
                            "with DeepSpeedCPUAdam')", zero.offload_optimizer.device)
    if not offloaded or (bf16.bf16_optimizer_states and behaviours.bf16_optimizer_states_on_cpu):
        states = "bf16"
    else:
        states = "fp32" if fp32_states else "bf16"
    return {"master_dtype": "bf16", "optimizer_state_dtype": states}


FP16_MASTER_KEY = "deepspeed.fp16.fp16_master_weights_and_grads"


def _fp16_master(raw: _DeepSpeedRaw, zero: _Zero, dtype: str, behaviours: Behaviours,
                 fp32_states: bool, source: str) -> dict[str, str]:
    """`fp16.fp16_master_weights_and_grads`: the master params and gradients in fp16, under
    fp16 training. Every release zerosim knows reads it: up to 0.18.2 for ZeRO-2 alone
    (config.py asserts 'only supported with ZeRO Stage 2 for now'), from 0.18.3 (PR #7700) for
    ZeRO-1/2/3 through the `_configure_master_weights` bf16's goes through; always with the
    optimizer offloaded to DeepSpeedCPUAdam (`_enforce_cpu_offload`,
    `_enforce_optimizer_offload`), whose moments stay fp32 unless `fp32_optimizer_states` is
    off. Refused where DeepSpeed refuses; what zerosim replays is `support`'s."""
    if not raw.fp16.fp16_master_weights_and_grads:
        return {}
    if dtype != "fp16":
        raise ScenarioError(source, FP16_MASTER_KEY, "false unless fp16.enabled is true (fp16 "
                            f"master weights belong to fp16 training; this one trains in "
                            f"{dtype})", True)
    if zero.stage == 0 or (zero.stage != 2 and not behaviours.low_precision_master_weights):
        allowed = "1, 2 or 3" if behaviours.low_precision_master_weights else "2"
        raise ScenarioError(source, FP16_MASTER_KEY, f"false unless ZeRO stage is {allowed} "
                            "(DeepSpeed's config asserts it for this release)", True)
    if zero.offload_optimizer.device == "none":
        raise ScenarioError(source, f"{ZERO_KEY}.offload_optimizer.device", "'cpu' or 'nvme' "
                            "with fp16_master_weights_and_grads (DeepSpeed asserts the optimizer "
                            "offloaded to DeepSpeedCPUAdam)", zero.offload_optimizer.device)
    return {"master_dtype": "fp16", "optimizer_state_dtype": "fp32" if fp32_states else "fp16"}


def _fp32_optimizer_states(raw: _DeepSpeedRaw, source: str) -> bool:
    """`optimizer.params.fp32_optimizer_states`, DeepSpeedCPUAdam's choice of fp32 Adam
    moments over the params' dtype (default true); it matters only for 16-bit master params."""
    value = raw.optimizer.params.get("fp32_optimizer_states", True)
    if not isinstance(value, bool):
        raise ScenarioError(source, "deepspeed.optimizer.params.fp32_optimizer_states",
                            "true or false", value)
    return value


LEAF_MODULE_KEY = f"{ZERO_KEY}.leaf_module"
GRANULARITY_KEY = f"{ZERO_KEY}.module_granularity_threshold"
DEFAULT_LEAF_MODULE_CLASSES = (
    "transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock",
    "transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
    "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock",
)
"""runtime/zero/leaf_module_config.py `DEFAULT_LEAF_MODULE_CLASSES` (0.18.0 to 0.19.5)."""


def _leaves(zero: _Zero, behaviours: Behaviours, source: str) -> LeafSettings:
    """`module_granularity_threshold` (alias `stage3_module_granularity_threshold`, DeepSpeed
    0.16.0+) and `leaf_module` (0.18.0+, applied to the model by the engine whatever the
    stage, with its default classes when the key is absent), refused by a release before
    them (its ZeRO config forbids unknown keys). Lists keep their first occurrences, as
    `DeepSpeedZeroLeafModuleConfig` dedupes them."""
    if "stage3_module_granularity_threshold" in (zero.model_extra or {}):
        raise ScenarioError(source, f"{ZERO_KEY}.stage3_module_granularity_threshold",
                            "one of module_granularity_threshold and its alias "
                            "stage3_module_granularity_threshold (DeepSpeed reads one key)",
                            zero.model_extra["stage3_module_granularity_threshold"])
    threshold = zero.module_granularity_threshold
    if "module_granularity_threshold" in zero.model_fields_set and not (
            behaviours.module_granularity_threshold):
        raise ScenarioError(source, GRANULARITY_KEY, "absent before DeepSpeed 0.16.0 (it came "
                            "with PR #6649; an earlier release refuses the key)", threshold)
    raw = zero.leaf_module
    if "leaf_module" in zero.model_fields_set and not behaviours.leaf_module_config:
        raise ScenarioError(source, LEAF_MODULE_KEY, "absent before DeepSpeed 0.18.0 (it came "
                            "with PR #7604; an earlier release refuses the key)",
                            None if raw is None else raw.model_dump())
    classes: tuple[str, ...] = ()
    if behaviours.leaf_module_config:
        given = None if raw is None else raw.classes
        classes = DEFAULT_LEAF_MODULE_CLASSES if given is None else tuple(given)
    names = () if raw is None else tuple(raw.names)
    suffixes = () if raw is None else tuple(raw.name_suffixes)
    return LeafSettings(
        granularity_threshold=threshold,
        classes=tuple(dict.fromkeys(classes)), names=tuple(dict.fromkeys(names)),
        name_suffixes=tuple(dict.fromkeys(suffixes)),
        fast_fetch=threshold > 0 and behaviours.leaf_fetch_skips_event_bound)


ZERO_PLUS_PLUS_KEYS = ("zero_hpz_partition_size", "zero_quantized_weights",
                       "zero_quantized_gradients")
LOCO_KEYS = ("err_beta", "reset_T")


def _loco(raw: dict[str, Any] | None, behaviours: Behaviours, source: str
          ) -> tuple[float, int] | None:
    """`zeropp_loco_param` (DeepSpeed 0.16.2+, PR #6730): a release before it refuses the key
    (its config model forbids unknown ones); `all_to_all_loco_quant_reduce` reads
    `loco_param['err_beta']` and `['reset_T']` with no default, so both must be given."""
    if raw is None:
        return None
    key = f"{ZERO_KEY}.zeropp_loco_param"
    if not behaviours.qgz_loco:
        raise ScenarioError(source, key, "absent before DeepSpeed 0.16.2 (LoCo came with PR "
                            "#6730; an earlier release refuses the key)", raw)
    for name in LOCO_KEYS:
        if name not in raw:
            raise ScenarioError(source, f"{key}.{name}", "a value (DeepSpeed reads "
                                f"loco_param['{name}'] at qgZ's first reduction, with no "
                                "default)", "absent")
    unknown = sorted(set(raw) - set(LOCO_KEYS))
    if unknown:
        raise ScenarioError(source, f"{key}.{unknown[0]}", "err_beta or reset_T (the keys "
                            "LoCo reads)", unknown[0])
    beta, reset = raw["err_beta"], raw["reset_T"]
    if isinstance(beta, bool) or not isinstance(beta, int | float):
        raise ScenarioError(source, f"{key}.err_beta", "a number in [0, 1]", beta)
    if isinstance(reset, bool) or not isinstance(reset, int):
        raise ScenarioError(source, f"{key}.reset_T", "a whole number of steps", reset)
    return float(beta), reset


def _zero_plus_plus(zero: _Zero, behaviours: Behaviours, world: int, source: str
                    ) -> ZeroPlusPlusSettings:
    """`zero_hpz_partition_size`, `zero_quantized_weights` and `zero_quantized_gradients`
    (DeepSpeed 0.10.0+, PR #3784), refused where DeepSpeed fails on them: a release before
    them forbids the keys; the data-parallel world must split into groups of min(size, world)
    ranks (`_create_zero_param_parallel_group`'s `_ensure_divisibility`); with the parameters
    on NVMe the secondary partition would be made on `remote_device` 'nvme', which
    `torch.empty` rejects. qgZ's own refusals need the node's GPUs and the model
    (`support._qgz_groups_fit`, `_qgz_reduces_by_reduce_scatter`, `_qgz_tensors_divide`)."""
    for key in ZERO_PLUS_PLUS_KEYS:
        if key in zero.model_fields_set and not behaviours.zero_plus_plus:
            raise ScenarioError(source, f"{ZERO_KEY}.{key}", "absent before DeepSpeed 0.10.0 "
                                "(ZeRO++ came with PR #3784; an earlier release refuses the "
                                "key)", getattr(zero, key))
    settings = ZeroPlusPlusSettings(zero.zero_hpz_partition_size, zero.zero_quantized_weights,
                                    zero.zero_quantized_gradients,
                                    _loco(zero.zeropp_loco_param, behaviours, source))
    group = settings.hpz_group(world)
    key = f"{ZERO_KEY}.zero_hpz_partition_size"
    if world % group:
        raise ScenarioError(source, key, f"a size whose min with the {world} data-parallel "
                            f"ranks divides them (DeepSpeed asserts '{world} is not divisible "
                            f"by {group}')", zero.zero_hpz_partition_size)
    if group > 1 and zero.stage == 3 and zero.offload_param.device == "nvme":
        raise ScenarioError(source, key, "1 with offload_param.device nvme (DeepSpeed makes "
                            "each secondary partition with torch.empty on remote_device "
                            "'nvme', which PyTorch rejects)", zero.zero_hpz_partition_size)
    return settings


class IgnoredKeyWarning(ScenarioWarning):
    """A ds_config key the scenario's DeepSpeed release reads nothing of."""


def _managed_accumulation(raw: _DeepSpeedRaw, behaviours: Behaviours, source: str) -> bool:
    """`managed_gradient_accumulation` (DeepSpeed 0.19.4+, a top-level key read with
    `get_scalar_param`): a release before it ignores the key, as its top-level config does
    any key it does not know, and so does zerosim, with a warning."""
    if raw.managed_gradient_accumulation:
        return True
    if not behaviours.unmanaged_accumulation:
        warnings.warn(f"{source}: deepspeed.managed_gradient_accumulation: false does nothing "
                      "before DeepSpeed 0.19.4 (the release ignores the key): the last "
                      "micro-batch's backward stays the accumulation boundary",
                      IgnoredKeyWarning, stacklevel=6)
        return True
    return False


MICS_KEYS = ("mics_shard_size", "mics_hierarchical_params_gather")


def _mics(zero: _Zero, behaviours: Behaviours, world: int, source: str) -> MicsSettings:
    """`mics_shard_size` and `mics_hierarchical_params_gather` (DeepSpeed 0.9.2+, PR #2964),
    refused where DeepSpeed fails on them: a release before them lacks the keys (0.7.0 to
    0.9.1 refuse them: their ZeRO config forbids unknown keys); where MiCS acts the shard
    size must divide the data-parallel ranks (mics_utils.py `_generate_mics_config` asserts
    it). The hierarchical gather's own refusal needs the node's GPUs
    (`support._mics_hierarchy_spans_nodes`)."""
    for key in MICS_KEYS:
        if key in zero.model_fields_set and not behaviours.mics:
            raise ScenarioError(source, f"{ZERO_KEY}.{key}", "absent before DeepSpeed 0.9.2 "
                                "(MiCS came with PR #2964; 0.7.0 to 0.9.1 refuse the key, "
                                "earlier releases ignore it)", getattr(zero, key))
    settings = MicsSettings(zero.mics_shard_size, zero.mics_hierarchical_params_gather)
    if settings.acts(zero.stage) and world % settings.shard_size:
        raise ScenarioError(source, f"{ZERO_KEY}.mics_shard_size", f"a divisor of the {world} "
                            "data-parallel ranks (DeepSpeed asserts 'dp group size is not "
                            "dividable by dp_shard_size')", zero.mics_shard_size)
    return settings


ZENFLOW_KEY = f"{ZERO_KEY}.zenflow"


def _zenflow(zero: _Zero, behaviours: Behaviours, source: str) -> ZenFlowSettings | None:
    """`zero_optimization.zenflow`, refused where DeepSpeed refuses it: a release before
    0.17.5 does not know the key (its ZeRO config forbids extra keys); ZenFlow's optimizer
    raises "Zenflow must be used with cpu offload" and asserts `overlap_comm` for its
    `offload`; `configure_zenflow` and the config's validator raise on the select and update
    intervals below."""
    raw = zero.zenflow
    if raw is None:
        return None
    if not behaviours.zenflow:
        raise ScenarioError(source, ZENFLOW_KEY, "absent before DeepSpeed 0.17.5 (ZenFlow "
                            "came with PR #7391; an earlier release refuses the key)",
                            "a zenflow section")
    _check_zenflow_keys(raw, behaviours, source)
    if zero.offload_optimizer.device != "cpu":
        raise ScenarioError(source, f"{ZERO_KEY}.offload_optimizer.device",
                            "'cpu' with zenflow (DeepSpeed: 'Zenflow must be used with cpu "
                            "offload')", zero.offload_optimizer.device)
    if raw.offload and not zero.overlap_comm:
        raise ScenarioError(source, f"{ZERO_KEY}.overlap_comm", "true with zenflow.offload "
                            "(DeepSpeed asserts 'offload selective optimizer should be used "
                            "with overlap_comm')", zero.overlap_comm)
    update = raw.update_interval
    if update != "auto" and update < 1:
        raise ScenarioError(source, f"{ZENFLOW_KEY}.update_interval",
                            "'auto' or a whole number >= 1 (DeepSpeed makes it the gradient "
                            "accumulation)", update)
    _check_zenflow_selection(raw, source)
    return ZenFlowSettings(
        topk_ratio=raw.topk_ratio, update_interval=None if update == "auto" else update,
        overlap_step=raw.overlap_step, offload=raw.offload,
        select_strategy=raw.select_strategy, select_interval=raw.select_interval,
        full_warm_up_rounds=raw.full_warm_up_rounds,
        pt_reserved_cores_perc=raw.pt_reserved_cores_perc)


def _check_zenflow_keys(raw: _ZenFlow, behaviours: Behaviours, source: str) -> None:
    """ZenFlow's config is a `DeepSpeedConfigModel`, which forbids keys it does not have;
    `pt_reserved_cores_perc` came with PR #7506 (0.17.6)."""
    known = list(type(raw).model_fields)
    for key in raw.model_extra or {}:
        close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.5)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ScenarioError(source, f"{ZENFLOW_KEY}.{key}", "one of the keys of DeepSpeed's "
                            f"ZenFlowConfig, which refuses any other{hint}", key)
    if ("pt_reserved_cores_perc" in raw.model_fields_set
            and not behaviours.zenflow_worker_affinity_split):
        raise ScenarioError(source, f"{ZENFLOW_KEY}.pt_reserved_cores_perc", "absent before "
                            "DeepSpeed 0.17.6 (PR #7506 added it; 0.17.5's ZenFlowConfig "
                            "refuses keys it does not have)", raw.pt_reserved_cores_perc)


def _check_zenflow_selection(raw: _ZenFlow, source: str) -> None:
    """`configure_zenflow`: the "auto" strategy takes no interval (it raises `Warning`, an
    exception), the others need one, and a fixed selection interval of steps may not be
    shorter than a fixed update interval."""
    key = f"{ZENFLOW_KEY}.select_interval"
    interval = raw.select_interval
    if raw.select_strategy == "auto" and interval != "auto":
        raise ScenarioError(source, key, "'auto' with select_strategy 'auto' (DeepSpeed "
                            "raises: the auto strategy selects once per epoch)", interval)
    if raw.select_strategy != "auto" and interval == "auto":
        raise ScenarioError(source, key, f"a whole number with select_strategy "
                            f"'{raw.select_strategy}' (DeepSpeed: 'If don't use auto select "
                            "strategy, select_interval must be a number')", interval)
    if interval != "auto" and interval < 0:
        raise ScenarioError(source, key, "a whole number >= 0", interval)
    update = raw.update_interval
    if (raw.select_strategy == "step" and update != "auto" and interval != 0
            and interval < update):
        raise ScenarioError(source, key, f"0 or at least update_interval ({update}) "
                            "(DeepSpeed: 'Select interval must be greater or equal to update "
                            "interval')", interval)


def _accumulation(steps: int, zenflow: ZenFlowSettings | None) -> int:
    """ZenFlow with a fixed update interval makes it the engine's gradient accumulation
    (`configure_zenflow`: `_config.gradient_accumulation_steps = update_interval`), whatever
    the config says; the micro-batch stays what the config's sizes give."""
    if zenflow is None or zenflow.update_interval is None:
        return steps
    return zenflow.update_interval


def _aio_settings(raw: _Aio | None) -> AioSettings:
    raw = raw or _Aio()
    return AioSettings(raw.block_size, raw.queue_depth, raw.thread_count, raw.single_submit,
                       raw.overlap_events)


def _offload_optimizer(raw: _OffloadOptimizer, behaviours: Behaviours, gap: int
                       ) -> OffloadSettings:
    pin_default = behaviours.offload_pin_memory_default_true
    return OffloadSettings(
        raw.device, pin_default if raw.pin_memory is None else raw.pin_memory, raw.ratio,
        nvme_path=raw.nvme_path, buffer_count=raw.buffer_count,
        pipeline_read=raw.pipeline_read, pipeline_write=raw.pipeline_write,
        fast_init=raw.fast_init, part_grads_async=raw.part_grads_async,
        prefetch_optimizer=raw.prefetch_optimizer, prefetch_optimizer_gap=gap,
        gpu_subgroups_first=behaviours.twin_flow_gpu_subgroups_first,
        super_offload=raw.super_offload, cpuadam_cores_perc=raw.cpuadam_cores_perc)


def _offload_param(raw: _OffloadParam) -> OffloadSettings:
    return OffloadSettings(
        raw.device, raw.pin_memory, nvme_path=raw.nvme_path, buffer_count=raw.buffer_count,
        buffer_size=raw.buffer_size, max_in_cpu=raw.max_in_cpu)


def _autotp_size(raw: _DeepSpeedRaw, behaviours: Behaviours, source: str) -> int:
    """DeepSpeed reads `tensor_parallel` from 0.16.4 (`autotp_training`); before, it is one
    of the keys it ignores."""
    section = (raw.model_extra or {}).get("tensor_parallel")
    if not behaviours.autotp_training or not isinstance(section, Mapping):
        return 0
    size = section.get("autotp_size", 0)
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ScenarioError(source, "deepspeed.tensor_parallel.autotp_size",
                            "a whole number >= 0", size)
    return size


SEQUENCE_PARALLEL_KEY = "deepspeed.sequence_parallel_size"


def _sequence_groups(data: Any, world: int, source: str) -> int:
    """The data-parallel degree DeepSpeed's batch arithmetic counts (runtime/config.py: with
    `sequence_parallel_size` in the config, the world size over it), read before the section
    is validated, as "auto" values are filled from it: the ranks over the sequence-parallel
    size, which must divide them (the groups are whole; Accelerate asserts
    `dp_replicate_size x dp_shard_size x sp_size = num_processes`). A value that is not a
    whole number >= 1 is left for the section's validation to refuse."""
    size = data.get("sequence_parallel_size", 1) if isinstance(data, Mapping) else 1
    if isinstance(size, float) and size.is_integer():
        size = int(size)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        return world
    if world % size:
        raise ScenarioError(source, SEQUENCE_PARALLEL_KEY,
                            f"a divisor of the {world} ranks (data_parallel): each "
                            "sequence-parallel group is that many whole ranks", size)
    return world // size


class SequenceParallelWarning(ScenarioWarning):
    """A ds_config value that sequence parallelism overrides."""


def _communication_dtype(raw: _DeepSpeedRaw, dtype: str, behaviours: Behaviours,
                         source: str) -> str:
    """The dtype ZeRO reduces gradients in: `communication_data_type` (default the training
    dtype), except under sequence parallelism from 0.11.2, where the engine replaces it with
    `seq_parallel_communication_data_type`, default fp32 (runtime/engine.py, 0.11.2 to
    0.19.5: `self.communication_data_type = self._config.seq_parallel_communication_data_type`
    once the sequence-parallel group has more than one rank), whatever
    `communication_data_type` says."""
    if raw.sequence_parallel_size == 1 or not behaviours.sequence_parallel_fp32_reduction:
        return raw.communication_data_type or dtype
    chosen = raw.seq_parallel_communication_data_type or "fp32"
    if raw.communication_data_type not in (None, chosen):
        warnings.warn(f"{source}: deepspeed.communication_data_type "
                      f"{raw.communication_data_type} does nothing with sequence_parallel_size "
                      f"{raw.sequence_parallel_size}: DeepSpeed reduces the gradients in "
                      f"seq_parallel_communication_data_type ({chosen}"
                      f"{'' if raw.seq_parallel_communication_data_type else ', its default'})",
                      SequenceParallelWarning, stacklevel=6)
    return chosen


@dataclass(frozen=True)
class DeepSpeedResolution:
    """A resolved ds_config and what resolving it said: ignored keys, legacy keys mapped (one
    warning line each) and the "auto" values filled."""

    config: DeepSpeedConfig
    unmodelled: tuple[str, ...]
    legacy: tuple[str, ...]
    auto: tuple[AutoFill, ...]
    overridden: tuple[str, ...] = ()
    """FRAMEWORK_OVERRIDDEN_KEYS given (`deepspeed.activation_checkpointing`)."""


def _prepare(data: Any, behaviours: Behaviours, trainer: TrainerContext, source: str
             ) -> tuple[Any, tuple[str, ...], tuple[AutoFill, ...]]:
    """Legacy keys mapped, then "auto" filled, before validation."""
    if not isinstance(data, Mapping):
        return data, (), ()
    tree, legacy = translate_legacy(data, behaviours, source)
    tree, auto = fill_auto(tree, trainer, source)
    return tree, tuple(legacy), auto


def resolve_deepspeed(data: Any, *, behaviours: Behaviours, source: str,
                      trainer: TrainerContext, build_label: str = "") -> DeepSpeedResolution:
    """Validate the section and fill DeepSpeed's code defaults for a release's behaviours
    (and a fork build's options: `build_label`, the version's local label)."""
    sequence_groups = _sequence_groups(data, trainer.world_size, source)
    data, legacy, auto = _prepare(data or {}, behaviours,
                                  replace(trainer, world_size=sequence_groups), source)
    check_closed_sections(data, source)
    raw: _DeepSpeedRaw = validate_section(_DeepSpeedRaw, data, source=source,
                                          prefix="deepspeed")
    check_section(data, prefix="deepspeed.", source=source, key_prefix="deepspeed.")
    zero = raw.zero_optimization
    dtype = _dtype(raw, source)
    batch = batch_sizes(raw.train_batch_size, raw.train_micro_batch_size_per_gpu,
                        raw.gradient_accumulation_steps, world_size=sequence_groups,
                        source=source)
    if raw.optimizer.type.lower() not in MODELLED_OPTIMIZERS:
        raise ScenarioError(source, "deepspeed.optimizer.type",
                            "Adam, AdamW or CPUAdam (the optimizers zerosim models)",
                            raw.optimizer.type)
    torch_adam = _torch_adam(raw, zero, source)
    if zero.offload_optimizer.ratio < 1 and zero.stage != 3:
        raise ScenarioError(source, "deepspeed.zero_optimization.offload_optimizer.ratio",
                            "1.0 unless stage is 3 (Twin-Flow is a ZeRO-3 feature)",
                            zero.offload_optimizer.ratio)
    _check_nvme(zero, source)
    _check_fork_options(zero, behaviours, build_label, source)
    _check_super_offload(zero, behaviours, source)
    zenflow = _zenflow(zero, behaviours, source)
    aio = _aio_settings(raw.aio)
    clip_default = 1.0 if behaviours.gradient_clipping_default_one else 0.0
    offload_opt = _offload_optimizer(zero.offload_optimizer, behaviours,
                                     _fork_gap(zero, build_label))
    resolved = DeepSpeedConfig(
        train_micro_batch_size_per_gpu=batch.train_micro_batch_size_per_gpu,
        gradient_accumulation_steps=_accumulation(batch.gradient_accumulation_steps, zenflow),
        dtype=dtype,
        grad_accum_dtype=raw.data_types.grad_accum_dtype or dtype,
        communication_dtype=_communication_dtype(raw, dtype, behaviours, source),
        gradient_clipping=clip_default if raw.gradient_clipping is None
        else raw.gradient_clipping,
        optimizer=raw.optimizer.type,
        check_grad_overflow=_checks_grad_overflow(raw, dtype, zero.stage, behaviours),
        stage=zero.stage,
        overlap_comm=(zero.stage == 3) if zero.overlap_comm is None else zero.overlap_comm,
        contiguous_gradients=zero.contiguous_gradients,
        reduce_scatter=zero.reduce_scatter,
        reduce_bucket_size=int(zero.reduce_bucket_size),
        allgather_bucket_size=int(zero.allgather_bucket_size),
        sub_group_size=int(zero.sub_group_size),
        stage3_prefetch_bucket_size=int(zero.stage3_prefetch_bucket_size),
        stage3_max_live_parameters=int(zero.stage3_max_live_parameters),
        stage3_max_reuse_distance=int(zero.stage3_max_reuse_distance),
        stage3_param_persistence_threshold=int(zero.stage3_param_persistence_threshold),
        offload_optimizer=offload_opt,
        offload_param=_offload_param(zero.offload_param),
        aio=aio,
        train_batch_size=batch.train_batch_size,
        autotp_size=_autotp_size(raw, behaviours, source),
        torch_adam=torch_adam,
        memory_breakdown=raw.memory_breakdown,
        zenflow=zenflow,
        **_master_precision(raw, zero, dtype, behaviours, source),
        leaves=_leaves(zero, behaviours, source),
        zero_plus_plus=_zero_plus_plus(zero, behaviours, trainer.world_size, source),
        mics=_mics(zero, behaviours, trainer.world_size, source),
        managed_accumulation=_managed_accumulation(raw, behaviours, source),
        sequence_parallel_size=raw.sequence_parallel_size,
    )
    unmodelled = [key for key in unmodelled_keys(raw, source)
                  if not (behaviours.autotp_training and key == "deepspeed.tensor_parallel")]
    overridden = tuple(f"deepspeed.{key}" for key in FRAMEWORK_OVERRIDDEN_KEYS
                       if isinstance(data, Mapping) and key in data)
    return DeepSpeedResolution(resolved, tuple(unmodelled), legacy, auto, overridden)
