"""`"auto"` in a ds_config, filled as the Hugging Face Trainer fills it.

Read in transformers' `integrations/deepspeed.py`, `HfTrainerDeepSpeedConfig`:
`trainer_config_process` fills the batch sizes, gradient accumulation, gradient clipping and
`fp16/bf16.enabled` from `TrainingArguments`, and records a mismatch when the ds_config gives a
concrete value that differs from one the Trainer was given (`fill_match`; the Trainer then
refuses to start); `trainer_config_finalize` fills `reduce_bucket_size` = h^2 and, under ZeRO-3,
`stage3_prefetch_bucket_size` = int(0.9 h^2) and `stage3_param_persistence_threshold` = 10 h
from the model's `hidden_size` (`fill_only`, no mismatch check). Optimizer and scheduler
params are filled too but change neither time nor memory, so zerosim leaves them.

An `"auto"` the Trainer does not fill inside `zero_optimization` is dropped by DeepSpeed itself
(`DeepSpeedConfigModel.__init__` removes "auto" values), so DeepSpeed's default applies.

The scenario gives the Trainer's arguments: `trainer:` holds `per_device_train_batch_size`,
`gradient_accumulation_steps` and `max_grad_norm` (TrainingArguments names; what it leaves
out takes the Trainer's default: 8, 1, 1.0), `precision:` is the Trainer's `--fp16` / `--bf16`
(default neither: fp32).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from zerosim.errors import ScenarioError

AUTO = "auto"
Precision = Literal["fp16", "bf16", "fp32"]
ZERO = "zero_optimization"


class TrainerArgs(BaseModel):
    """The `trainer:` section: Hugging Face TrainingArguments that fill "auto" values."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    per_device_train_batch_size: int = Field(8, ge=1)
    gradient_accumulation_steps: int = Field(1, ge=1)
    max_grad_norm: float = Field(1.0, ge=0)


@dataclass(frozen=True)
class AutoFill:
    """One "auto" the Trainer (or DeepSpeed, for what the Trainer leaves) resolved."""

    key: str
    value: Any
    origin: str
    defaulted: bool = False
    """Filled from a Trainer default the scenario did not state (worth a warning)."""

    def describe(self) -> str:
        return f"deepspeed.{self.key} = {self.value} ({self.origin})"


@dataclass(frozen=True)
class TrainerContext:
    """What the Trainer knows when it fills the config."""

    args: TrainerArgs
    args_given: frozenset[str]
    precision: Precision | None
    world_size: int
    hidden_size: int


class _Filler:
    """`fill_match` / `fill_only` over a ds_config tree, recording what was filled."""

    def __init__(self, tree: dict[str, Any], source: str) -> None:
        self.tree = tree
        self.source = source
        self.filled: list[AutoFill] = []

    def node(self, key: str) -> tuple[dict[str, Any] | None, str]:
        *parents, leaf = key.split(".")
        node: Any = self.tree
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        return (node if isinstance(node, dict) else None), leaf

    def fill(self, key: str, value: Any, origin: str, *, hf_key: str | None = None,
             must_match: bool = False, defaulted: bool = False) -> None:
        node, leaf = self.node(key)
        if node is None:
            return
        if node.get(leaf) == AUTO:
            node[leaf] = value
            self.filled.append(AutoFill(key, value, origin, defaulted))
            return
        given = node.get(leaf)
        if must_match and given is not None and given != value:
            raise ScenarioError(
                self.source, f"deepspeed.{key}",
                f"{value!r}, the value of {hf_key} (the Hugging Face Trainer refuses a ds_config "
                "value that mismatches its TrainingArguments; 'auto' takes it)", given)


def _origin(name: str, context: TrainerContext) -> str:
    if name in context.args_given:
        return f"trainer.{name}"
    return f"trainer.{name}, the Hugging Face default"


def _batch_and_clipping(filler: _Filler, context: TrainerContext) -> None:
    args, given = context.args, context.args_given
    micro, accum = args.per_device_train_batch_size, args.gradient_accumulation_steps
    pairs = (("train_micro_batch_size_per_gpu", micro, "per_device_train_batch_size"),
             ("gradient_accumulation_steps", accum, "gradient_accumulation_steps"),
             ("gradient_clipping", args.max_grad_norm, "max_grad_norm"))
    for key, value, name in pairs:
        filler.fill(key, value, _origin(name, context), hf_key=f"trainer.{name}",
                    must_match=name in given, defaulted=name not in given)
    batch_given = bool({"per_device_train_batch_size", "gradient_accumulation_steps"} & given)
    filler.fill("train_batch_size", context.world_size * micro * accum,
                f"data_parallel x per_device_train_batch_size x gradient_accumulation_steps = "
                f"{context.world_size} x {micro} x {accum}",
                hf_key="train_batch_size (calculated)", must_match=batch_given,
                defaulted=not batch_given)


def _precision(filler: _Filler, context: TrainerContext) -> None:
    precision = context.precision or "fp32"
    origin = (f"precision: {precision}" if context.precision
              else "precision not given: the Trainer's default, neither --fp16 nor --bf16")
    for dtype in ("fp16", "bf16"):
        filler.fill(f"{dtype}.enabled", precision == dtype, origin, hf_key="precision",
                    must_match=context.precision is not None,
                    defaulted=context.precision is None)


def _hidden_size_keys(filler: _Filler, context: TrainerContext) -> None:
    h = context.hidden_size
    filler.fill(f"{ZERO}.reduce_bucket_size", h * h, f"hidden_size^2 = {h}^2")
    zero = filler.tree.get(ZERO)
    if isinstance(zero, dict) and zero.get("stage") == 3:
        filler.fill(f"{ZERO}.stage3_prefetch_bucket_size", int(0.9 * h * h),
                    f"int(0.9 x hidden_size^2), hidden_size {h}")
        filler.fill(f"{ZERO}.stage3_param_persistence_threshold", 10 * h,
                    f"10 x hidden_size = 10 x {h}")


def _drop_remaining(node: dict[str, Any], prefix: str, filler: _Filler) -> None:
    """DeepSpeed's config models drop "auto" values: its default applies."""
    for key in list(node):
        if node[key] == AUTO:
            del node[key]
            filler.filled.append(AutoFill(f"{prefix}{key}", "DeepSpeed's default",
                                          "not filled by the Trainer; DeepSpeed drops 'auto'"))
        elif isinstance(node[key], dict):
            _drop_remaining(node[key], f"{prefix}{key}.", filler)


def fill_auto(tree: dict[str, Any], context: TrainerContext, source: str
              ) -> tuple[dict[str, Any], tuple[AutoFill, ...]]:
    """Replace "auto" in `tree` (a fresh copy the caller owns) as the Trainer does."""
    filler = _Filler(tree, source)
    _batch_and_clipping(filler, context)
    _precision(filler, context)
    _hidden_size_keys(filler, context)
    if isinstance(tree.get(ZERO), dict):
        _drop_remaining(tree[ZERO], f"{ZERO}.", filler)
    return tree, tuple(filler.filled)
