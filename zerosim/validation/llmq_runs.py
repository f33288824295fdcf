"""LLaMA-Factory's DeepSpeed ZeRO offload baselines on RTX 4090s, as IST-DASLab's LLMQ
repository timed them (data/llmq_rtx4090.yaml): each run's step time and the overrides that
turn its ZeRO stage's scenario into it.

Pure: the data and the scenario overrides; `zerosim.validation.validate` simulates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zerosim.shipped import shipped_root
from zerosim.validation.reference import reference_data

DATA_FILE = "llmq_rtx4090.yaml"


@dataclass(frozen=True)
class LlmqRun:
    """One timed run: its GPUs, model, ZeRO stage, batch, and tqdm's elapsed seconds after its
    first and second optimizer steps."""

    gpus: int
    model: str
    stage: int
    micro_batch: int
    accumulation: int
    elapsed_s: tuple[int, int]

    @property
    def name(self) -> str:
        return (f"{self.model}, {self.gpus}x RTX 4090, ZeRO-{self.stage}, "
                f"{self.micro_batch}x{self.accumulation}")

    @property
    def step_s(self) -> float:
        """The second step's time: the difference of the two elapsed stamps."""
        return float(self.elapsed_s[1] - self.elapsed_s[0])

    def overrides(self) -> dict[str, Any]:
        return {"model": self.model, "data_parallel": self.gpus,
                "trainer.per_device_train_batch_size": self.micro_batch,
                "trainer.gradient_accumulation_steps": self.accumulation}


@dataclass(frozen=True)
class LlmqRuns:
    group: str
    source: str
    scenarios: Mapping[int, Path]
    """Each ZeRO stage's scenario."""
    runs: tuple[LlmqRun, ...]


def load_llmq_runs() -> LlmqRuns:
    data = reference_data(DATA_FILE)
    runs = tuple(LlmqRun(r["gpus"], r["model"], r["stage"], r["micro_batch"],
                         r["accumulation"], tuple(r["elapsed_s"]))
                 for r in data["runs"])
    root = shipped_root()
    return LlmqRuns(data["group"], data["source"],
                    {int(stage): root / path for stage, path in data["scenarios"].items()}, runs)
