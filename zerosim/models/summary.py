"""What `zerosim check` and `zerosim estimate` print about a model: parameter counts, FLOPs per
token and the per-module breakdown, grouped over layers and experts (pure)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from zerosim.models.breakdown import Recipe, Workload, build_modules
from zerosim.models.spec import ModelSpec
from zerosim.units import ordered_sum

TRAINING_FLOPS_FACTOR = 3
"""Forward plus backward: the backward of a matmul is two matmuls of the forward's size."""
_INDEX = re.compile(r"\.\d+(?=\.|$)")


@dataclass(frozen=True)
class ModuleGroup:
    """Modules that differ only in their layer or expert index (`layers.*.mlp.experts.*.w1`)."""

    pattern: str
    kind: str
    count: int
    params: int
    """Parameters of all `count` modules."""
    forward_flops_per_token: float
    """Forward FLOPs of all `count` modules per token of the micro-batch."""


@dataclass(frozen=True)
class ModelSummary:
    name: str
    sequence_length: int
    total_params: int
    active_params: float
    """Parameters a token's forward uses: every expert counted at the share of tokens it
    computes (num_experts_per_tok / num_experts)."""
    largest_module_params: int
    forward_flops_per_token: float
    """Forward FLOPs per token at `sequence_length`, attention counted dense (the usual
    convention for model FLOPs)."""
    groups: tuple[ModuleGroup, ...]

    @property
    def training_flops_per_token(self) -> float:
        return TRAINING_FLOPS_FACTOR * self.forward_flops_per_token

    def to_text(self) -> str:
        """Plain text: the counts, then one line per module group."""
        lines = [
            f"Model {self.name}: {self.total_params:,} parameters "
            f"({self.active_params:,.0f} active per token), largest module "
            f"{self.largest_module_params:,}",
            f"FLOPs per token at sequence length {self.sequence_length}: forward "
            f"{self.forward_flops_per_token:.4g}, training (forward + backward) "
            f"{self.training_flops_per_token:.4g}",
            f"{'module':<44} {'kind':<10} {'count':>6} {'parameters':>16} "
            f"{'fwd FLOPs/token':>16}",
        ]
        lines += [f"{g.pattern:<44} {g.kind:<10} {g.count:>6} {g.params:>16,} "
                  f"{g.forward_flops_per_token:>16.4g}" for g in self.groups]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "sequence_length": self.sequence_length,
            "total_params": self.total_params, "active_params": self.active_params,
            "largest_module_params": self.largest_module_params,
            "forward_flops_per_token": self.forward_flops_per_token,
            "training_flops_per_token": self.training_flops_per_token,
            "modules": [{"module": g.pattern, "kind": g.kind, "count": g.count,
                         "params": g.params,
                         "forward_flops_per_token": g.forward_flops_per_token}
                        for g in self.groups],
        }


def _expert_share(spec: ModelSpec, name: str) -> float:
    """The share of the tokens a routed expert's module computes (a module of every expert,
    `Recipe.fused_experts`, computes each expert's share of them)."""
    if spec.moe is None or not (".experts." in name or name.endswith(".experts")):
        return 1.0
    return spec.moe.routed_share


def summarize(spec: ModelSpec, sequence_length: int, recipe: Recipe | None = None
              ) -> ModelSummary:
    """The model at one sequence of `sequence_length` tokens (micro-batch 1), cut into modules
    as `recipe` (a software stack's) cuts it; without one, as the model's code is read."""
    workload = Workload(sequence_length=sequence_length)
    modules = (build_modules(spec, workload) if recipe is None
               else build_modules(spec, workload, recipe))
    tokens = float(sequence_length)
    groups: dict[str, list[Any]] = {}
    for m in modules:
        pattern = _INDEX.sub(".*", m.name)
        entry = groups.setdefault(pattern, [m.kind, 0, 0, 0.0])
        entry[1] += 1
        entry[2] += m.params
        entry[3] += m.model_flops / tokens
    active = ordered_sum(m.params * _expert_share(spec, m.name) for m in modules)
    return ModelSummary(
        name=spec.name, sequence_length=sequence_length,
        total_params=sum(m.params for m in modules), active_params=active,
        largest_module_params=max(m.params for m in modules),
        forward_flops_per_token=ordered_sum(m.model_flops for m in modules) / tokens,
        groups=tuple(ModuleGroup(p, kind, count, params, flops)
                     for p, (kind, count, params, flops) in groups.items()))
