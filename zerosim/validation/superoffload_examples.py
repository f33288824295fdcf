"""What DeepSpeedExamples says SuperOffload reaches on one GH200, and the TFLOPS its script
counts, beside zerosim's replay of the example it ships (data/superoffload_examples.yaml).

Reported, not judged: round figures for "common" settings, the model and the DeepSpeed release
inferred. Pure: the data and the script's count; `zerosim.validation.validate` simulates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zerosim.shipped import shipped_root
from zerosim.validation.reference import reference_data

DATA_FILE = "superoffload_examples.yaml"
CHECKPOINTED_PASSES = 4
"""finetune_zero3.py `estimate_transformer_tflops`: the forward counted four times with
activation checkpointing (three without)."""


@dataclass(frozen=True)
class SuperOffloadClaims:
    group: str
    source: str
    scenario: Path
    version: str
    zero_offload_overrides: Mapping[str, Any]
    tflops: float
    over_zero_offload: float


def load_superoffload_claims() -> SuperOffloadClaims:
    data = reference_data(DATA_FILE)
    return SuperOffloadClaims(data["group"], data["source"], shipped_root() / data["scenario"],
                              data["version"], dict(data["zero_offload_overrides"]),
                              data["superoffload_tflops"], data["superoffload_over_zero_offload"])


def script_tflops(params: int, sequence: int, layers: int, hidden: int, batch: int,
                  step_s: float, *, checkpointed: bool = True) -> float:
    """The TFLOPS finetune_zero3.py prints for a step of `step_s`: batch x (2 c params x seq +
    2 x 2 c layers x hidden x seq^2) / 1e12 / step_s, c the passes it counts."""
    passes = CHECKPOINTED_PASSES if checkpointed else CHECKPOINTED_PASSES - 1
    per_sequence = (2 * passes * params * sequence
                    + 2 * 2 * passes * layers * hidden * sequence ** 2)
    return batch * per_sequence / 1e12 / step_s
