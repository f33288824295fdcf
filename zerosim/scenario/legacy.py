"""ds_config keys DeepSpeed still reads under an older name, mapped as DeepSpeed maps them.

Read in DeepSpeed's `runtime/zero/config.py` and `runtime/config_utils.py`
(`DeepSpeedConfigModel._process_deprecated_field`) at v0.13.3 and v0.19.5, and at v0.6.7 for
the dictionary-based config that came before the pydantic model of v0.7.0
(`zerosim.behaviours` row `zero_config_model`):

* `cpu_offload: true` becomes `offload_optimizer: {device: cpu}` and the parameter-offload
  flag `offload_param: {device: cpu}`; that flag is `cpu_offload_param` from 0.7.0 and was
  `cpu_offload_params` before (0.13.3's own docstring still prints the old name, its model
  refuses it). A false flag leaves the section at its default.
* `cpu_offload_use_pin_memory` is only warned about (`set_new_param=False`): DeepSpeed drops
  its value, so `pin_memory` keeps the offload section's own value.
* `stage3_gather_fp16_weights_on_model_save` becomes `stage3_gather_16bit_weights_on_model_save`.
* From 0.7.0 a deprecated key beside its replacement is an error ("Cannot provide deprecated
  parameter ... together"); before, the deprecated flag won and the section was not read.
* From 0.7.0 every `stage3_*` key may also be given by its field name (`prefetch_bucket_size`,
  pydantic's `allow_population_by_field_name`); both names at once are refused as an extra
  field.
* `zero_optimization: true|false` is the oldest format: stage 1 (with the top-level
  `allgather_size` as `allgather_bucket_size`) or 0 (`read_zero_config_deprecated`).
* `bfloat16` is the name `bf16` had before 0.6.0; DeepSpeed still reads it when `bf16` is absent.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from zerosim.behaviours import Behaviours
from zerosim.errors import ScenarioError

ZERO = "zero_optimization"

# zero_optimization field names that the stage3_ aliases stand for (0.7.0 and later).
FIELD_NAMES = {
    "prefetch_bucket_size": "stage3_prefetch_bucket_size",
    "param_persistence_threshold": "stage3_param_persistence_threshold",
    "model_persistence_threshold": "stage3_model_persistence_threshold",
    "max_live_parameters": "stage3_max_live_parameters",
    "max_reuse_distance": "stage3_max_reuse_distance",
    "gather_16bit_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",
}


@dataclass(frozen=True)
class _Flag:
    """A deprecated boolean that switches an offload section to `{device: cpu}`."""

    key: str
    section: str


OPTIMIZER_FLAG = _Flag("cpu_offload", "offload_optimizer")
PARAM_FLAG_MODEL = _Flag("cpu_offload_param", "offload_param")
PARAM_FLAG_DICT = _Flag("cpu_offload_params", "offload_param")
PIN_MEMORY_FLAG = "cpu_offload_use_pin_memory"
FP16_SAVE_KEY = "stage3_gather_fp16_weights_on_model_save"


def translate_legacy(data: Mapping[str, Any], behaviours: Behaviours, source: str
                     ) -> tuple[dict[str, Any], list[str]]:
    """The ds_config with legacy keys replaced as DeepSpeed replaces them, and one warning
    line per legacy key (each names the key and what it became)."""
    tree = copy.deepcopy(dict(data))
    notes: list[str] = []
    if isinstance(tree.get(ZERO), bool):
        _boolean_zero(tree, notes)
    if "bfloat16" in tree:
        _bfloat16(tree, notes)
    zero = tree.get(ZERO)
    if isinstance(zero, dict):
        if behaviours.zero_config_model:
            _model_rules(zero, source, notes)
        else:
            _dict_rules(zero, notes)
    return tree, notes


def _boolean_zero(tree: dict[str, Any], notes: list[str]) -> None:
    enabled = tree[ZERO]
    zero: dict[str, Any] = {"stage": 1 if enabled else 0}
    if enabled and "allgather_size" in tree:
        zero["allgather_bucket_size"] = tree.pop("allgather_size")
    tree[ZERO] = zero
    notes.append(f"deepspeed.{ZERO}: {enabled} is DeepSpeed's deprecated format; read as "
                 f"{zero} (read_zero_config_deprecated)")


def _bfloat16(tree: dict[str, Any], notes: list[str]) -> None:
    old = tree.pop("bfloat16")
    if "bf16" in tree:
        notes.append("deepspeed.bfloat16: ignored, DeepSpeed reads bf16 first and it is given")
        return
    tree["bf16"] = old
    notes.append("deepspeed.bfloat16: the name bf16 had before DeepSpeed 0.6.0; read as bf16")


def _dep(key: str) -> str:
    return f"deepspeed.{ZERO}.{key}"


def _model_rules(zero: dict[str, Any], source: str, notes: list[str]) -> None:
    """DeepSpeed 0.7.0 and later: the pydantic model's deprecated fields and aliases."""
    if PARAM_FLAG_DICT.key in zero:
        raise ScenarioError(
            source, _dep(PARAM_FLAG_DICT.key),
            f"'{PARAM_FLAG_MODEL.key}' or offload_param (DeepSpeed 0.7.0 and later refuse the "
            f"pre-0.7.0 name '{PARAM_FLAG_DICT.key}': extra fields not permitted)",
            PARAM_FLAG_DICT.key)
    for flag in (OPTIMIZER_FLAG, PARAM_FLAG_MODEL):
        if flag.key in zero:
            _refuse_both(zero, flag.key, flag.section, source)
            _apply_flag(zero, flag, notes)
    if FP16_SAVE_KEY in zero:
        new = "stage3_gather_16bit_weights_on_model_save"
        _refuse_both(zero, FP16_SAVE_KEY, new, source)
        zero[new] = zero.pop(FP16_SAVE_KEY)
        notes.append(f"{_dep(FP16_SAVE_KEY)}: deprecated, read as {new}")
    _drop_pin_memory_flag(zero, notes)
    for name, alias in FIELD_NAMES.items():
        if name in zero:
            if alias in zero:
                raise ScenarioError(source, _dep(name),
                                    f"only one of {alias} and {name} (DeepSpeed reads {alias} "
                                    f"and refuses {name} beside it: extra fields not permitted)",
                                    zero[name])
            zero[alias] = zero.pop(name)


def _refuse_both(zero: dict[str, Any], old: str, new: str, source: str) -> None:
    if new in zero:
        raise ScenarioError(source, _dep(old),
                            f"either {old} or {new} (DeepSpeed: \"Cannot provide deprecated "
                            f"parameter '{old}' and replacing parameter '{new}' together\")",
                            zero[old])


def _apply_flag(zero: dict[str, Any], flag: _Flag, notes: list[str]) -> None:
    value = zero.pop(flag.key)
    if value:
        zero[flag.section] = {"device": "cpu"}
    became = f"{flag.section}: {{device: cpu}}" if value else f"no {flag.section}"
    notes.append(f"{_dep(flag.key)}: deprecated, read as {became}")


def _drop_pin_memory_flag(zero: dict[str, Any], notes: list[str]) -> None:
    if PIN_MEMORY_FLAG in zero:
        value = zero.pop(PIN_MEMORY_FLAG)
        notes.append(f"{_dep(PIN_MEMORY_FLAG)}: deprecated; DeepSpeed warns and drops the value "
                     f"({value}), set pin_memory in offload_optimizer / offload_param instead")


def _dict_rules(zero: dict[str, Any], notes: list[str]) -> None:
    """DeepSpeed before 0.7.0 (`DeepSpeedZeroConfig._initialize`): a flag that is present
    replaces its section, which is then not read."""
    if PARAM_FLAG_MODEL.key in zero:
        value = zero.pop(PARAM_FLAG_MODEL.key)
        notes.append(f"{_dep(PARAM_FLAG_MODEL.key)}: ignored, DeepSpeed before 0.7.0 reads "
                     f"{PARAM_FLAG_DICT.key} (got {value})")
    for flag in (OPTIMIZER_FLAG, PARAM_FLAG_DICT):
        if flag.key in zero:
            if flag.section in zero:
                notes.append(f"{_dep(flag.section)}: not read, {flag.key} is given and DeepSpeed "
                             "before 0.7.0 takes the flag")
                zero.pop(flag.section)
            _apply_flag(zero, flag, notes)
    _drop_pin_memory_flag(zero, notes)
