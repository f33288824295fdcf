"""ZeRO-3 with the optimizer on NVMe, measured on the study's H100 node: the baseline runs of
the MLP-Offload study (`data/mlp_offload_h100_nvme.yaml`, its header gives the source and the
set-up read off each log).

Four Megatron-DeepSpeed models of 44-106 B parameters at DP=4 and micro-batch 1, DeepSpeed
0.13.3 with `offload_optimizer: nvme` (pipelined reads and writes, aio with 4 threads), ranks
bound to their socket. Each is replayed on `h100-jlse` as a Polaris run is on `polaris-a100`
(`zerosim.runs.MeasuredRun.scenario`), with the NVMe offload in place of the CPU one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from statistics import fmean
from typing import Any

from zerosim.hardware.profile import load_profile
from zerosim.runs import MeasuredRun
from zerosim.units import GiB

DATA_FILE = "mlp_offload_h100_nvme.yaml"
NAME_PREFIX = "mlp-offload-"
NVME_OFFLOAD = {"device": "nvme", "nvme_path": "/tmp/", "pin_memory": True,
                "pipeline_read": True, "pipeline_write": True}
"""`offload_optimizer` of every run but its `buffer_count` (the logs' ds_config)."""
ZERO_SET_UP = {"reduce_scatter": False}
"""What else the logs' ds_config sets in `zero_optimization` (its `zero_config` line reads
`contiguous_gradients=True reduce_scatter=False`; scripts/config-n-run.sh writes
`"reduce_scatter": false`): ZeRO-3 all-reduces each bucket in place."""
AIO = {"block_size": 2097152, "queue_depth": 8, "thread_count": 4, "single_submit": False,
       "overlap_events": True}
"""The logs' `aio` section (queue_depth as DeepSpeed printed it: the default 8)."""
WARM_UP_ITERATIONS = 1
"""Left out of the means: the first step reads no swapped state yet."""
PHASE_AFTER = {"forward": "forward", "backward": "backward", "step": "update"}
"""`rank0_MA_after_GiB` keys (DeepSpeed's "Engine after ..." lines) -> zerosim's phases."""
TIME_KEYS = {"forward": "fwd_ms", "backward": "bwd_ms", "update": "step_ms",
             "iteration": "iter_ms"}


@dataclass(frozen=True)
class NvmeRun:
    """One baseline run: its shape, its swap buffers and its steady-state measurements."""

    name: str
    run: MeasuredRun
    buffer_count: int
    seconds: dict[str, float]
    """Mean per optimizer step over the iterations after the warm-up, by phase."""
    between_phases_s: float
    """Mean over the same iterations of Megatron's iteration time less DeepSpeed's timed
    forward, backward and step: what the training loop spends outside them."""
    memory_report_s: float
    """Mean over the same iterations of one of DeepSpeed's memory reports, timed in the log
    from the backward's start marker to its "Engine before backward" line: rank 0's full
    `gc.collect()`."""
    peak_allocated_bytes: float
    allocated_after_bytes: dict[str, float]
    """Rank 0's allocated bytes when each phase ends (forward, backward, update), in every
    iteration after the first."""
    forward_peak_bytes: float
    """Rank 0's peak allocated bytes during a forward after the first step."""
    node_host_bytes: float
    """The node's host memory in use at its highest after the first step (every process)."""
    log: str
    hardware: str
    """The profile it is replayed on (the data file's `hardware`)."""
    stack_overrides: Mapping[str, Any]
    """The stack keys the framework's revision these runs ran changes (the data file's
    `stack_overrides`: Megatron-DeepSpeed's dist_nvme_opt branch)."""

    def scenario(self) -> dict[str, Any]:
        tree = self.run.scenario(self.hardware, profile=load_profile(self.hardware),
                                 name_prefix=NAME_PREFIX,
                                 description=f"MLP-Offload baseline run, {self.log}")
        zero = tree["deepspeed"]["zero_optimization"]
        zero["offload_optimizer"] = {**NVME_OFFLOAD, "buffer_count": self.buffer_count}
        zero.update(ZERO_SET_UP)
        tree["deepspeed"]["aio"] = dict(AIO)
        tree["runtime"]["framework"] = {"stack": tree["runtime"]["framework"],
                                        "overrides": dict(self.stack_overrides)}
        return tree


def load_data() -> dict[str, Any]:
    import yaml

    text = (resources.files("zerosim.validation") / "data" / DATA_FILE).read_text("utf-8")
    return yaml.safe_load(text)


def _steady_mean(values: list[float]) -> float:
    return fmean(values[WARM_UP_ITERATIONS:]) / 1000


def _between_phases(run: Mapping[str, Any]) -> float:
    """The steady mean of each iteration less its timed phases, in seconds."""
    return _steady_mean([i - f - b - s for i, f, b, s in zip(
        run["iter_ms"], run["fwd_ms"], run["bwd_ms"], run["step_ms"], strict=True)])


def load_runs() -> list[NvmeRun]:
    """The runs in file order (smallest model first)."""
    data = load_data()
    runs = []
    for row, r in enumerate(data["runs"], start=1):
        measured = MeasuredRun(
            row=row, num_layers=r["num_layers"], hidden_size=r["hidden_size"],
            ffn_hidden_size=r["ffn_hidden_size"], num_attention_heads=r["num_attention_heads"],
            num_key_value_heads=r["num_key_value_heads"], seq_length=r["seq_length"],
            padded_vocab_size=r["padded_vocab_size"], gpus=4,
            micro_batch_size=r["micro_batch_size"],
            grad_accum_steps=r["global_batch_size"] // (4 * r["micro_batch_size"]),
            sub_group_size=100_000_000, reduce_bucket_size=500_000_000,
            prefetch_bucket_size=50_000_000, untied_embeddings=True, flash_attention=False,
            bf16=True, checkpoint_activations=True, pin_memory=True, overlap_comm=True,
            zero_stage=3, build="0.13.3", params=r["params"], bind_cores_to_rank=True)
        runs.append(NvmeRun(
            name=f"{NAME_PREFIX}{measured.name}", run=measured, buffer_count=r["buffer_count"],
            seconds={phase: _steady_mean(r[key]) for phase, key in TIME_KEYS.items()},
            between_phases_s=_between_phases(r),
            memory_report_s=_steady_mean(r["memory_report_ms"]),
            peak_allocated_bytes=r["rank0_peak_Max_MA_GiB"] * GiB,
            allocated_after_bytes={PHASE_AFTER[key]: value * GiB
                                   for key, value in r["rank0_MA_after_GiB"].items()},
            forward_peak_bytes=r["rank0_forward_Max_MA_GiB"] * GiB,
            node_host_bytes=r["node_host_in_use_GiB"] * GiB,
            log=r["log"],
            hardware=data["hardware"], stack_overrides=data["stack_overrides"]))
    return runs


CALIBRATION_PHASES = {"forward": "forward_per_step", "backward": "backward_per_step",
                      "update": "update"}
"""The phases a calibration row is written for (`zerosim calibrate` keys): the boundary
backward writes every gradient through the swap buffers and the step reads 16 B and writes
12 B per element (the drives' two rates); the forward touches no drive, and the 48.16B one,
128 layers of hidden 5120 on the H100, is host-bound (the stack's hook time)."""


def write_calibration_files(folder: Path) -> Path:
    """One scenario file per run under `folder/h100_nvme/` and `folder/h100_nvme_runs.csv`
    with their forward, backward and step as calibration rows."""
    import yaml

    scenario_dir = folder / "h100_nvme"
    scenario_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for each in load_runs():
        path = scenario_dir / f"{each.name}.yaml"
        header = (f"# Generated by zerosim.validation.mlp_offload from {DATA_FILE}: "
                  f"{each.log}\n")
        path.write_text(header + yaml.safe_dump(each.scenario(), sort_keys=False, width=100))
        for phase, key in CALIBRATION_PHASES.items():
            rows.append(f"h100_nvme/{path.name},,{key},{each.seconds[phase]:.5g}")
    table = folder / "h100_nvme_runs.csv"
    table.write_text("scenario,overrides,phase,seconds\n" + "\n".join(rows) + "\n")
    return table
