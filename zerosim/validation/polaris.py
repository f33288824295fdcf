"""The Polaris runs: measured ZeRO-3 CPU-offload iterations on one ALCF Polaris node.

`data/polaris_zero3_offload_runs.csv` holds 41 public runs from the Deep Optimizer States
study's artifacts (Maurya et al., 2024; repository `mauryaavinash95/deep-optimizer-states-results`)
on 4x A100-SXM4-40GB with one AMD EPYC 7543P: DeepSpeed 0.13.3, Megatron-DeepSpeed (fused QKV,
SwiGLU, RMSNorm, untied embeddings, grouped-query attention), bf16, activation checkpointing,
eager attention, `overlap_comm`. Only these runs of that repository are used for fitting; its
other runs are how zerosim's predictions are judged and are not part of the project.

Time columns are milliseconds per optimizer step (all micro-batches together); the memory
column is rank 0's peak allocated GPU memory in GB (1e9 bytes).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

SOURCE = ("Deep Optimizer States study artifacts (Maurya et al., 2024), repository "
          "mauryaavinash95/deep-optimizer-states-results: ZeRO-3 CPU-offload runs on one ALCF "
          "Polaris node")
DATA_FILE = "polaris_zero3_offload_runs.csv"
PROFILE = "polaris-a100"
STACK = "megatron-deepspeed"
MEASURED_PHASES = ("forward", "backward", "update", "iteration")
"""What each run measured, per optimizer step (the CSV's fwd, bwd, step and iter columns)."""
_COLUMNS = {"forward": "fwd_ms_mean", "backward": "bwd_ms_mean", "update": "step_ms_mean",
            "iteration": "iter_ms_mean"}


@dataclass(frozen=True)
class PolarisRun:
    """One measured run (a row of the CSV), its configuration and its measurements."""

    row: int
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    seq_length: int
    padded_vocab_size: int
    params: int
    gpus: int
    micro_batch_size: int
    grad_accum_steps: int
    sub_group_size: int
    reduce_bucket_size: int
    prefetch_bucket_size: int
    iterations_averaged: int
    build: str
    """The DeepSpeed build the run used (`0.13.3+<commit>`): the runs come from four builds."""
    seconds: dict[str, float]
    """Measured seconds per optimizer step, by `MEASURED_PHASES`."""
    peak_gpu_bytes: float
    """Rank 0's peak allocated GPU memory."""
    peak_host_bytes: float
    """Host memory in use on the node at its peak during training, every process counted."""

    @property
    def model_name(self) -> str:
        return f"megatron-{self.params / 1e9:.2f}b"

    @property
    def config_key(self) -> tuple[Any, ...]:
        """What the simulation depends on (runs that repeat a configuration share it)."""
        return (self.num_layers, self.hidden_size, self.ffn_hidden_size,
                self.num_attention_heads, self.num_key_value_heads, self.seq_length,
                self.padded_vocab_size, self.gpus, self.micro_batch_size,
                self.grad_accum_steps, self.sub_group_size, self.reduce_bucket_size,
                self.prefetch_bucket_size)

    @property
    def name(self) -> str:
        return (f"polaris-{self.params / 1e9:.2f}b-dp{self.gpus}-mb{self.micro_batch_size}"
                f"-ga{self.grad_accum_steps}-sg{self.sub_group_size:.0e}").replace("+", "")

    def scenario(self) -> dict[str, Any]:
        """The run as a zerosim scenario mapping."""
        return {
            "name": self.name,
            "description": f"Polaris run (CSV row {self.row}): {SOURCE}",
            "model": {
                "name": self.model_name, "family": "llama",
                "hidden_size": self.hidden_size, "num_hidden_layers": self.num_layers,
                "intermediate_size": self.ffn_hidden_size,
                "num_attention_heads": self.num_attention_heads,
                "num_key_value_heads": self.num_key_value_heads,
                "vocab_size": self.padded_vocab_size, "tie_word_embeddings": False,
                "max_position_embeddings": self.seq_length,
            },
            "sequence_length": self.seq_length,
            "activation_checkpointing": True,
            "attention": "eager",
            "hardware": PROFILE,
            "data_parallel": self.gpus,
            "deepspeed": {
                "train_micro_batch_size_per_gpu": self.micro_batch_size,
                "gradient_accumulation_steps": self.grad_accum_steps,
                "bf16": {"enabled": True},
                "optimizer": {"type": "Adam"},
                "zero_optimization": {
                    "stage": 3, "overlap_comm": True,
                    "reduce_bucket_size": self.reduce_bucket_size,
                    "stage3_prefetch_bucket_size": self.prefetch_bucket_size,
                    "sub_group_size": self.sub_group_size,
                    "offload_optimizer": {"device": "cpu", "pin_memory": True},
                },
            },
            "runtime": {"deepspeed_version": "0.13.3", "framework": STACK},
        }


def _run(row: int, r: dict[str, str]) -> PolarisRun:
    def integer(key: str) -> int:
        return int(float(r[key]))

    return PolarisRun(
        row=row, num_layers=integer("num_layers"), hidden_size=integer("hidden_size"),
        ffn_hidden_size=integer("ffn_hidden_size"),
        num_attention_heads=integer("num_attention_heads"),
        num_key_value_heads=integer("num_key_value_heads"), seq_length=integer("seq_length"),
        padded_vocab_size=integer("padded_vocab_size"),
        params=integer("params_analytic_total"), gpus=integer("num_gpus"),
        micro_batch_size=integer("micro_batch_size"),
        grad_accum_steps=integer("grad_accum_steps"), sub_group_size=integer("sub_group_size"),
        reduce_bucket_size=integer("reduce_bucket_size"),
        prefetch_bucket_size=integer("prefetch_bucket_size"),
        iterations_averaged=integer("n_iters_averaged"), build=r["deepspeed_version"],
        seconds={phase: float(r[column]) / 1000 for phase, column in _COLUMNS.items()},
        peak_gpu_bytes=float(r["smu_train_rank0_peak_Max_MA_GB"]) * 1e9,
        peak_host_bytes=float(r["cpu_used_GB_peak_during_training"]) * 1e9)


def load_runs() -> list[PolarisRun]:
    """Every run in the shipped CSV, in file order (row 1 is the first data row)."""
    text = (resources.files("zerosim.validation") / "data" / DATA_FILE).read_text("utf-8")
    return [_run(row, r) for row, r in enumerate(csv.DictReader(io.StringIO(text)), start=1)]


@dataclass(frozen=True)
class Configuration:
    """Runs that repeat one configuration, measured values averaged over them."""

    runs: tuple[PolarisRun, ...]

    @property
    def first(self) -> PolarisRun:
        return self.runs[0]

    def measured(self, phase: str) -> float:
        return sum(r.seconds[phase] for r in self.runs) / len(self.runs)

    @property
    def peak_gpu_bytes(self) -> float:
        return sum(r.peak_gpu_bytes for r in self.runs) / len(self.runs)

    @property
    def peak_host_bytes(self) -> float:
        return sum(r.peak_host_bytes for r in self.runs) / len(self.runs)

    def spread(self, phase: str) -> float:
        """(max - min) / mean of the repeats: how much the measurement itself varies."""
        values = [r.seconds[phase] for r in self.runs]
        return (max(values) - min(values)) / self.measured(phase)


def configurations(runs: Sequence[PolarisRun] | None = None) -> list[Configuration]:
    """Distinct configurations in first-seen order."""
    groups: dict[tuple[Any, ...], list[PolarisRun]] = {}
    for run in runs if runs is not None else load_runs():
        groups.setdefault(run.config_key, []).append(run)
    return [Configuration(tuple(g)) for g in groups.values()]


CALIBRATION_PHASES = {"forward": "forward_per_step", "backward": "backward_per_step",
                      "update": "update", "iteration": "iteration"}
"""How each measured column appears in a calibration CSV (`zerosim calibrate` phase keys)."""


def write_calibration_files(folder: Path) -> Path:
    """One scenario file per distinct configuration under `folder/polaris/`, and
    `folder/polaris_runs.csv` with every run's measurements as calibration rows."""
    import yaml

    scenario_dir = folder / "polaris"
    scenario_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for configuration in configurations():
        run = configuration.first
        path = scenario_dir / f"{run.name}.yaml"
        header = f"# Generated by zerosim.validation.polaris from CSV row {run.row}: {SOURCE}.\n"
        path.write_text(header + yaml.safe_dump(run.scenario(), sort_keys=False, width=100))
        for each in configuration.runs:
            for column, phase in CALIBRATION_PHASES.items():
                rows.append(f"polaris/{path.name},,{phase},{each.seconds[column]:.5g}")
    table = folder / "polaris_runs.csv"
    table.write_text("scenario,overrides,phase,seconds\n" + "\n".join(rows) + "\n")
    return table
