"""Ulysses sequence parallelism on H100s as Hugging Face's blog measured it (Qwen3-4B, TRL's
SFTTrainer; data/hf_ulysses_blog.yaml): each run's peak GPU memory per rank and tokens per
second, and the overrides that turn the scenario into each run.

Pure: the data and the scenario overrides; `zerosim.validation.validate` simulates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zerosim.shipped import shipped_root
from zerosim.units import GiB
from zerosim.validation.reference import reference_data

DATA_FILE = "hf_ulysses_blog.yaml"


@dataclass(frozen=True)
class BlogRun:
    """One benchmark run: its GPUs, Ulysses group and sequence, and what the post printed
    (a peak in bytes, or the memory an out-of-memory run needed; tokens per second where
    given)."""

    gpus: int
    sequence_parallel: int
    sequence_length: int
    peak_bytes: float | None
    needed_bytes: float | None
    tokens_per_s: float | None

    @property
    def name(self) -> str:
        group = f"SP={self.sequence_parallel}" if self.sequence_parallel > 1 else "no SP"
        return (f"{self.gpus} GPU{'s' if self.gpus > 1 else ''}, {group}, "
                f"{self.sequence_length // 1024}K tokens")

    def overrides(self) -> dict[str, Any]:
        return {"data_parallel": self.gpus, "sequence_length": self.sequence_length,
                "deepspeed.sequence_parallel_size": self.sequence_parallel}


@dataclass(frozen=True)
class BlogRuns:
    group: str
    source: str
    scenario: Path
    stated_overrides: Mapping[str, Any]
    """What turns the scenario (the configuration the peaks identify) into the one the post
    states."""
    runs: tuple[BlogRun, ...]


def _bytes(record: Mapping[str, Any], key: str) -> float | None:
    return record[key] * GiB if key in record else None


def load_blog_runs() -> BlogRuns:
    data = reference_data(DATA_FILE)
    runs = tuple(BlogRun(r["gpus"], r["sequence_parallel"], r["sequence_length"],
                         _bytes(r, "peak_GiB"), _bytes(r, "out_of_memory_needing_GiB"),
                         r.get("tokens_per_s"))
                 for r in data["runs"])
    return BlogRuns(data["group"], data["source"], shipped_root() / data["scenario"],
                    dict(data["stated_overrides"]), runs)
