"""The `deepspeed:` section: ds_config.json keys verbatim, with DeepSpeed's code defaults.

Defaults are the values DeepSpeed's code uses (its docs disagree in places), version-aware where
they changed. Keys zerosim does not model are collected and reported once; keys that cannot
change time or memory (logging, schedules, loss-scale knobs) are accepted silently.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from zerosim.behaviours import Behaviours
from zerosim.errors import ScenarioError
from zerosim.scenario.validation import validate_section

# ds_config keys accepted without a warning because they cannot change time or memory.
NO_EFFECT_KEYS = {
    "steps_per_print", "wall_clock_breakdown", "dump_state", "prescale_gradients",
    "gradient_predivide_factor", "scheduler", "tensorboard", "wandb", "csv_monitor",
    "comms_logger", "flops_profiler", "memory_breakdown", "seed", "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer", "fp16.loss_scale", "fp16.initial_scale_power",
    "fp16.loss_scale_window", "fp16.hysteresis", "fp16.min_loss_scale", "fp16.auto_cast",
    "fp16.consecutive_hysteresis", "optimizer.params", "zero_optimization.allgather_partitions",
    "zero_optimization.load_from_fp32_weights", "zero_optimization.elastic_checkpoint",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save",
    "zero_optimization.stage3_gather_fp16_weights_on_model_save",
    "zero_optimization.ignore_unused_parameters", "zero_optimization.round_robin_gradients",
    "zero_optimization.offload_optimizer.buffer_count",
    "zero_optimization.offload_optimizer.fast_init", "zero_optimization.offload_param.buffer_count",
    "zero_optimization.offload_param.buffer_size", "zero_optimization.offload_param.max_in_cpu",
    "zero_optimization.offload_optimizer.nvme_path", "zero_optimization.offload_param.nvme_path",
}
MODELLED_OPTIMIZERS = {"adam", "adamw", "cpuadam", "deepspeedcpuadam"}


class _Open(BaseModel):
    """ds_config sections keep unknown keys so they can be reported, not rejected."""

    model_config = ConfigDict(extra="allow", frozen=True)


class _Precision(_Open):
    enabled: bool = False


class _OffloadOptimizer(_Open):
    device: Literal["none", "cpu", "nvme"] = "none"
    pin_memory: bool | None = None
    ratio: float = Field(1.0, gt=0, le=1)


class _OffloadParam(_Open):
    device: Literal["none", "cpu", "nvme"] = "none"
    pin_memory: bool = False


def _number_not_auto(value: Any) -> Any:
    if value == "auto":
        raise ValueError("a number ('auto' is filled in by the Hugging Face Trainer; "
                         "zerosim needs the concrete value)")
    return value


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

    _no_auto = field_validator(
        "reduce_bucket_size", "allgather_bucket_size", "sub_group_size",
        "stage3_prefetch_bucket_size", "stage3_max_live_parameters", "stage3_max_reuse_distance",
        "stage3_param_persistence_threshold", mode="before")(_number_not_auto)


class _Optimizer(_Open):
    type: str = "Adam"


class _DataTypes(_Open):
    grad_accum_dtype: Literal["fp32", "fp16", "bf16"] | None = None


class _DeepSpeedRaw(_Open):
    train_micro_batch_size_per_gpu: int = Field(1, ge=1)
    gradient_accumulation_steps: int = Field(1, ge=1)
    train_batch_size: int | None = Field(None, ge=1)
    fp16: _Precision = _Precision()
    bf16: _Precision = _Precision()
    gradient_clipping: float | None = Field(None, ge=0)
    optimizer: _Optimizer = _Optimizer()
    data_types: _DataTypes = _DataTypes()
    communication_data_type: Literal["fp32", "fp16", "bf16"] | None = None
    zero_optimization: _Zero = _Zero()

    _no_auto = field_validator("train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                               "train_batch_size", "gradient_clipping",
                               mode="before")(_number_not_auto)


@dataclass(frozen=True)
class OffloadSettings:
    device: str
    pin_memory: bool
    ratio: float = 1.0

    @property
    def enabled(self) -> bool:
        return self.device != "none"


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
            "offload_optimizer": {"device": self.offload_optimizer.device,
                                  "pin_memory": self.offload_optimizer.pin_memory,
                                  "ratio": self.offload_optimizer.ratio},
            "offload_param": {"device": self.offload_param.device,
                              "pin_memory": self.offload_param.pin_memory},
        }
        return {
            "train_micro_batch_size_per_gpu": self.train_micro_batch_size_per_gpu,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "fp16": {"enabled": self.dtype == "fp16"},
            "bf16": {"enabled": self.dtype == "bf16"},
            "gradient_clipping": self.gradient_clipping,
            "optimizer": {"type": self.optimizer},
            "data_types": {"grad_accum_dtype": self.grad_accum_dtype},
            "communication_data_type": self.communication_dtype,
            "zero_optimization": zero,
        }


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


def unmodelled_keys(raw: _DeepSpeedRaw, source: str) -> list[str]:
    """Keys present in the ds_config that zerosim neither models nor knows to be harmless."""
    keys = []
    for key in _extras(raw, source):
        if any(key == k or key.startswith(f"{k}.") for k in NO_EFFECT_KEYS):
            continue
        keys.append(f"deepspeed.{key}")
    return keys


def _dtype(raw: _DeepSpeedRaw, source: str) -> str:
    if raw.fp16.enabled and raw.bf16.enabled:
        raise ScenarioError(source, "deepspeed.bf16.enabled",
                            "fp16 and bf16 not both enabled", True)
    if raw.bf16.enabled:
        return "bf16"
    if raw.fp16.enabled:
        return "fp16"
    raise ScenarioError(source, "deepspeed.fp16.enabled",
                        "fp16 or bf16 enabled (zerosim models 16-bit mixed precision)", False)


def resolve_deepspeed(data: Any, *, behaviours: Behaviours, source: str, data_parallel: int
                      ) -> tuple[DeepSpeedConfig, list[str]]:
    """Validate the section and fill DeepSpeed's code defaults for a release's behaviours."""
    raw: _DeepSpeedRaw = validate_section(_DeepSpeedRaw, data or {}, source=source,
                                          prefix="deepspeed")
    zero = raw.zero_optimization
    dtype = _dtype(raw, source)
    micro, accum = raw.train_micro_batch_size_per_gpu, raw.gradient_accumulation_steps
    if raw.train_batch_size is not None and raw.train_batch_size != micro * accum * data_parallel:
        raise ScenarioError(
            source, "deepspeed.train_batch_size",
            f"train_micro_batch_size_per_gpu x gradient_accumulation_steps x data_parallel = "
            f"{micro} x {accum} x {data_parallel} = {micro * accum * data_parallel}",
            raw.train_batch_size)
    if raw.optimizer.type.lower() not in MODELLED_OPTIMIZERS:
        raise ScenarioError(source, "deepspeed.optimizer.type",
                            "Adam, AdamW or CPUAdam (the optimizers zerosim models)",
                            raw.optimizer.type)
    if zero.offload_optimizer.ratio < 1 and zero.stage != 3:
        raise ScenarioError(source, "deepspeed.zero_optimization.offload_optimizer.ratio",
                            "1.0 unless stage is 3 (Twin-Flow is a ZeRO-3 feature)",
                            zero.offload_optimizer.ratio)
    pin_default = behaviours.offload_pin_memory_default_true
    clip_default = 1.0 if behaviours.gradient_clipping_default_one else 0.0
    offload_opt = OffloadSettings(
        zero.offload_optimizer.device,
        pin_default if zero.offload_optimizer.pin_memory is None
        else zero.offload_optimizer.pin_memory,
        zero.offload_optimizer.ratio)
    resolved = DeepSpeedConfig(
        train_micro_batch_size_per_gpu=micro,
        gradient_accumulation_steps=accum,
        dtype=dtype,
        grad_accum_dtype=raw.data_types.grad_accum_dtype or dtype,
        communication_dtype=raw.communication_data_type or dtype,
        gradient_clipping=clip_default if raw.gradient_clipping is None
        else raw.gradient_clipping,
        optimizer=raw.optimizer.type,
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
        offload_param=OffloadSettings(zero.offload_param.device, zero.offload_param.pin_memory),
    )
    return resolved, unmodelled_keys(raw, source)
