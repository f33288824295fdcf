"""Closed-form memory needed for model states (params, gradients, optimizer states).

Stages 2 and 3 reproduce DeepSpeed's estimators to the byte and its printout to the character:
`deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs[_all_cold]` and
`deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs[_all_cold]` (read at
DeepSpeed 0.16.5, commit 38327e07; the ZeRO-3 one is unchanged since it was added in PR #965,
2021). The `_all_live` wrappers only count a model's parameters first: total = unique
parameters, largest layer = most parameters owned directly by one module; zerosim's
`zerosim.models.total_params` / `largest_layer_params` are those counts for catalog models.

DeepSpeed's rules that matter for exact numbers:

* every byte count is truncated with `int()`: the partitioned GPU term on its own
  (`int(18 * total_params / total_gpus)`) and then both totals (`int(cpu_mem), int(gpu_mem)`);
* the CPU products are evaluated left to right in floating point, e.g.
  `total_params * 18 * gpus_factor * additional_buffer_factor` with `gpus_factor = 1 / num_nodes`;
* the "without zero.Init" CPU figures take `max(4 * num_gpus_per_node, 18 * gpus_factor)`: each
  rank of a node first builds the whole model in fp32 on the host;
* "GB" in the printout is 2**30 bytes: `f" {cpu_mem/2**30:7.2f}GB | {gpu_mem/2**30:6.2f}GB | "`;
* the header prints `int(total_params/1e6)` M params, and "node"/"GPU" become plural above 1;
* the CPU device in the Options column is `f'{OffloadDeviceEnum.cpu:4}'`, i.e. "cpu " padded to
  the width of "none". That is what the docs page shows (Python <= 3.10); under Python >= 3.11
  `format()` of a `str`-mixin Enum gives "OffloadDeviceEnum.cpu" instead, a DeepSpeed cosmetic
  bug zerosim does not copy.

ZeRO-2 changed in DeepSpeed 0.14.3 (PR #5099, 2024-06-04) for `offload_optimizer=none`: GPU bytes
went from `4 * N + int(16 * N / total_gpus)` (fp32 params and grads, as on the docs page, whose
table prints 15.93GB for 2851M params on 8 GPUs) to `2 * N + int(18 * N / total_gpus)`
(16-bit params; 11.28GB for the same case). `zero2_rule="current"` (default) follows DeepSpeed
today, `zero2_rule="docs"` reproduces the docs page and DeepSpeed <= 0.14.2.

Stages 0 and 1 have no DeepSpeed estimator; they use the formulas of Intel's "Memory-Efficient
Training on Intel Gaudi Processors with DeepSpeed" article (mixed precision with Adam, K = 12):
plain data parallelism needs 2N + 2N + KN = 16N bytes per GPU, ZeRO-1 needs 2N + 2N + KN/Nd.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, Literal

from zerosim import models
from zerosim.behaviours import resolve_behaviours
from zerosim.errors import ScenarioError
from zerosim.models.breakdown import Recipe
from zerosim.models.catalog import require_catalog_model
from zerosim.units import GiB

# --- Units of DeepSpeed's printout -----------------------------------------------------------
# DeepSpeed divides by 2**30 and prints "GB"; the "M" params in its header is int(n / 1e6).
DEEPSPEED_GB = GiB
PARAMS_PER_M = 1e6
UNIT_LABEL = "GiB (DeepSpeed prints GB)"
# `f'{OffloadDeviceEnum.cpu:4}'`: device names padded to the width of "none".
DEVICE_NAME_WIDTH = 4
DEVICE_CPU = "cpu"
DEVICE_NONE = "none"

# --- Bytes per parameter, DeepSpeed estimators (docs page "Memory Requirements") --------------
# "when pytorch creates a model it creates it in fp32 by default (4 bytes)": the 4 of 4*n_gpus.
FP32_INIT_BYTES_PER_PARAM = 4
# ZeRO-3 "largest_layer_memory = 4*largest_layer_params": 2 B fp16 params gathered + 2 B fp16
# grads computed for the largest layer on one GPU.
LARGEST_LAYER_BYTES_PER_PARAM = 4
# ZeRO-3 "16b for fp32: 4b params, 4b grads, 4b momentum and 4b variance per parameter".
FP32_MASTER_STATE_BYTES_PER_PARAM = 16
# ZeRO-3 "18": those 16 bytes "+2b for fp16 params".
FP32_STATE_AND_FP16_PARAM_BYTES_PER_PARAM = 18
# ZeRO-3 offload_optimizer=cpu, offload_param=none: "2 * params / total number of gpus" on GPU.
FP16_PARAM_BYTES_PER_PARAM = 2
# ZeRO-2 offload_optimizer=cpu: "2 * params" on GPU (fp16 params); host holds at least the
# 16 fp32 bytes above, or each rank's fp32 copy: max(4 * total_gpus, 16) bytes per param.
ZERO2_OFFLOAD_GPU_BYTES_PER_PARAM = 2
ZERO2_OFFLOAD_CPU_MIN_BYTES_PER_PARAM = 16
# ZeRO-2 offload_optimizer=none: (replicated, partitioned) GPU bytes per param.
# "docs": docs page and DeepSpeed <= 0.14.2, "4 * params + 16 * params / total gpus".
# "current": DeepSpeed >= 0.14.3, "2 = params_16bit, 18 = 2_grads_16bit + 4_grads_32bit +
# 4_params_32bit + 8_optimizer_states_32bit(momentum and variance)".
Zero2Rule = Literal["current", "docs"]
ZERO2_NO_OFFLOAD_GPU_BYTES_PER_PARAM: dict[str, tuple[int, int]] = {
    "current": (2, 18),
    "docs": (4, 16),
}

# --- Bytes per parameter, Gaudi article (mixed precision + Adam) ------------------------------
# "2N bytes for bfloat16 parameters and 2N bytes for bfloat16 gradients" and "For the Adam
# optimizer, K is 12" (fp32 params, momentum, variance: 4N each).
GAUDI_PARAM_BYTES_PER_PARAM = 2
GAUDI_GRAD_BYTES_PER_PARAM = 2
ADAM_K_BYTES_PER_PARAM = 12

DEFAULT_BUFFER_FACTOR = 1.5  # DeepSpeed's additional_buffer_factor default
ZERO3_STAGE = 3
STAGES = (0, 1, 2, 3)

_SOURCES = {
    0: "plain data parallelism, 2N + 2N + 12N per GPU (Intel Gaudi DeepSpeed article)",
    1: "ZeRO-1, 2N + 2N + 12N/Nd per GPU (Intel Gaudi DeepSpeed article); host as DeepSpeed's "
       "ZeRO-2 estimator",
    2: "deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs_all_cold",
    3: "deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs_all_cold",
}


def _pad_device(device: str) -> str:
    return f"{device:{DEVICE_NAME_WIDTH}}"


@dataclass(frozen=True)
class EstimateRow:
    """One line of DeepSpeed's table: whole bytes (DeepSpeed truncates with `int()`)."""

    per_cpu_bytes: float
    per_gpu_bytes: float
    offload_param: str | None  # "cpu" | "none"; None below ZeRO-3
    offload_optimizer: str  # "cpu" | "none"
    zero_init: int | None  # 1 | 0; None below ZeRO-3

    @property
    def options(self) -> str:
        """DeepSpeed's Options column, devices padded to 4 characters, e.g.
        "offload_param=cpu , offload_optimizer=cpu , zero_init=1" or "offload_optimizer=cpu "."""
        parts = []
        if self.offload_param is not None:
            parts.append(f"offload_param={_pad_device(self.offload_param)}")
        parts.append(f"offload_optimizer={_pad_device(self.offload_optimizer)}")
        if self.zero_init is not None:
            parts.append(f"zero_init={self.zero_init}")
        return ", ".join(parts)

    @property
    def per_cpu_GB(self) -> float:
        return self.per_cpu_bytes / DEEPSPEED_GB

    @property
    def per_gpu_GB(self) -> float:
        return self.per_gpu_bytes / DEEPSPEED_GB

    def to_text(self) -> str:
        return f" {self.per_cpu_GB:7.2f}GB | {self.per_gpu_GB:6.2f}GB | {self.options}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "offload_param": self.offload_param,
            "offload_optimizer": self.offload_optimizer,
            "zero_init": self.zero_init,
            "options": self.options,
            "per_cpu_GB": self.per_cpu_GB,
            "per_gpu_GB": self.per_gpu_GB,
            "per_cpu_bytes": self.per_cpu_bytes,
            "per_gpu_bytes": self.per_gpu_bytes,
        }


@dataclass(frozen=True)
class Estimate:
    """Model-state memory for one stage and cluster shape, one row per offload option."""

    stage: int  # 0 = plain data parallel, 1, 2, 3
    total_params: int
    largest_layer_params: int | None
    num_gpus_per_node: int
    num_nodes: int
    additional_buffer_factor: float
    rows: tuple[EstimateRow, ...]
    zero2_rule: str = "current"

    @property
    def total_gpus(self) -> int:
        return self.num_nodes * self.num_gpus_per_node

    def _header(self) -> list[str]:
        nodes_str = "nodes" if self.num_nodes > 1 else "node"
        gpus_str = "GPUs" if self.num_gpus_per_node > 1 else "GPU"
        software = f"SW: Model with {int(self.total_params / PARAMS_PER_M)}M total params"
        if self.stage == ZERO3_STAGE:
            software += (f", {int(self.largest_layer_params / PARAMS_PER_M)}M largest layer "
                         "params")
        return [
            "Estimated memory needed for params, optim states and gradients for a:",
            f"HW: Setup with {self.num_nodes} {nodes_str}, {self.num_gpus_per_node} {gpus_str} "
            "per node.",
            software + ".",
            "  per CPU  |  per GPU |   Options",
        ]

    def to_text(self) -> str:
        """DeepSpeed's printout (no trailing newline); stages 0 and 1 in ZeRO-2's layout."""
        return "\n".join(self._header() + [row.to_text() for row in self.rows])

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "stage": self.stage,
            "source": _SOURCES[self.stage],
            "total_params": self.total_params,
            "largest_layer_params": self.largest_layer_params,
            "num_gpus_per_node": self.num_gpus_per_node,
            "num_nodes": self.num_nodes,
            "total_gpus": self.total_gpus,
            "additional_buffer_factor": self.additional_buffer_factor,
        }
        if self.stage == 2:
            data["zero2_rule"] = self.zero2_rule
        data["unit"] = UNIT_LABEL
        data["bytes_per_GB"] = DEEPSPEED_GB
        data["rows"] = [row.to_dict() for row in self.rows]
        return data


# --- Validation -------------------------------------------------------------------------------

def _count(value: Any, key: str, what: str) -> int:
    """A positive whole number (2851e6 is accepted as 2851000000)."""
    ok = (isinstance(value, Real) and not isinstance(value, bool)
          and math.isfinite(value) and float(value).is_integer() and value > 0)
    if not ok:
        raise ScenarioError(None, key, f"{what} as a positive whole number", value)
    return int(value)


def _validate(stage: int, total_params: Any, largest_layer_params: Any, num_gpus_per_node: Any,
              num_nodes: Any, additional_buffer_factor: Any,
              zero2_rule: str) -> tuple[int, int | None]:
    if stage not in STAGES:
        raise ScenarioError(None, "--stage", "one of 0, 1, 2, 3", stage)
    total = _count(total_params, "--total-params", "the total parameter count")
    if largest_layer_params is None:
        if stage == ZERO3_STAGE:
            raise ScenarioError(
                None, "--largest-layer-params",
                "the parameter count of the largest layer for ZeRO-3 (each GPU gathers it "
                "whole; use --model for a catalog model)", None)
        largest = None
    else:
        largest = _count(largest_layer_params, "--largest-layer-params",
                         "the largest layer's parameter count")
        if largest > total:
            raise ScenarioError(None, "--largest-layer-params",
                                f"at most --total-params ({total})", largest)
    for key, value in (("--gpus-per-node", num_gpus_per_node), ("--nodes", num_nodes)):
        if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
            raise ScenarioError(None, key, "a whole number >= 1", value)
    factor_ok = (isinstance(additional_buffer_factor, Real)
                 and not isinstance(additional_buffer_factor, bool)
                 and math.isfinite(additional_buffer_factor) and additional_buffer_factor > 0)
    if not factor_ok:
        raise ScenarioError(None, "--buffer-factor", "a finite number > 0",
                            additional_buffer_factor)
    if zero2_rule not in ZERO2_NO_OFFLOAD_GPU_BYTES_PER_PARAM:
        raise ScenarioError(None, "zero2_rule",
                            f"one of {', '.join(ZERO2_NO_OFFLOAD_GPU_BYTES_PER_PARAM)}",
                            zero2_rule)
    return total, largest


# --- DeepSpeed's estimators, same expressions in the same order -------------------------------

def zero2_mem_needs(total_params: int, num_gpus_per_node: int, num_nodes: int,
                    cpu_offload: bool, additional_buffer_factor: float,
                    zero2_rule: Zero2Rule = "current") -> tuple[int, int]:
    """(cpu_mem, gpu_mem) bytes, as DeepSpeed's `estimate_zero2_model_states_mem_needs`.

    offload_optimizer=cpu: GPU = 2N; CPU = N * max(4 * total_gpus, 16) * buffer_factor.
    offload_optimizer=none: GPU = 2N + int(18N / total_gpus) (DeepSpeed >= 0.14.3) or
    4N + int(16N / total_gpus) (docs page, DeepSpeed <= 0.14.2);
    CPU = N * 4 * gpus_per_node * buffer_factor (the fp32 model built on the host per rank).
    """
    total_gpus = num_nodes * num_gpus_per_node
    if cpu_offload:
        gpu_mem = ZERO2_OFFLOAD_GPU_BYTES_PER_PARAM * total_params
        cpu_mem = total_params * max(FP32_INIT_BYTES_PER_PARAM * total_gpus,
                                     ZERO2_OFFLOAD_CPU_MIN_BYTES_PER_PARAM) \
            * additional_buffer_factor
    else:
        replicated, partitioned = ZERO2_NO_OFFLOAD_GPU_BYTES_PER_PARAM[zero2_rule]
        gpu_mem = replicated * total_params + int(partitioned * total_params / total_gpus)
        cpu_mem = _fp32_init_cpu_bytes(total_params, num_gpus_per_node, additional_buffer_factor)
    return int(cpu_mem), int(gpu_mem)


def _fp32_init_cpu_bytes(params: int, num_gpus_per_node: int, factor: float) -> float:
    """Every rank of a node builds `params` in fp32 on the host: params * 4 * n_gpus * factor."""
    return params * FP32_INIT_BYTES_PER_PARAM * num_gpus_per_node * factor


def _zero3_offload_cpu_bytes(total_params: int, state_bytes: int, num_gpus_per_node: int,
                             gpus_factor: float, zero_init: bool, factor: float) -> float:
    """Host bytes with the optimizer offloaded: the node's share of `state_bytes` per param,
    or each rank's fp32 model copy if larger and zero.Init is off."""
    if zero_init:
        return total_params * state_bytes * gpus_factor * factor
    per_param = max(FP32_INIT_BYTES_PER_PARAM * num_gpus_per_node, state_bytes * gpus_factor)
    return total_params * per_param * factor


def zero3_mem_needs(total_params: int, largest_layer_params: int, num_gpus_per_node: int,
                    num_nodes: int, cpu_offload: bool, cpu_offload_params: bool,
                    zero_init: bool, additional_buffer_factor: float) -> tuple[int, int]:
    """(cpu_mem, gpu_mem) bytes, as DeepSpeed's `estimate_zero3_model_states_mem_needs`.

    With L = 4 * largest_layer_params, gpus_factor = 1 / num_nodes, n = GPUs per node:

    * offload param + optimizer: GPU = L; CPU = N * 18 * gpus_factor * f (zero.Init) or
      N * max(4n, 18 * gpus_factor) * f;
    * offload optimizer only: GPU = L + int(2N / total_gpus); CPU as above with 16 for 18;
    * no offload: GPU = L + int(18N / total_gpus); CPU = largest * 4n * f (zero.Init) or
      N * 4n * f.
    """
    total_gpus = num_nodes * num_gpus_per_node
    gpus_factor = 1 / num_nodes
    largest_layer_memory = LARGEST_LAYER_BYTES_PER_PARAM * largest_layer_params
    if cpu_offload:
        if cpu_offload_params:
            gpu_mem = largest_layer_memory
            state_bytes = FP32_STATE_AND_FP16_PARAM_BYTES_PER_PARAM
        else:
            gpu_mem = largest_layer_memory + int(
                FP16_PARAM_BYTES_PER_PARAM * total_params / total_gpus)
            state_bytes = FP32_MASTER_STATE_BYTES_PER_PARAM
        cpu_mem = _zero3_offload_cpu_bytes(total_params, state_bytes, num_gpus_per_node,
                                           gpus_factor, zero_init, additional_buffer_factor)
    else:
        gpu_mem = largest_layer_memory + int(
            FP32_STATE_AND_FP16_PARAM_BYTES_PER_PARAM * total_params / total_gpus)
        built_on_host = largest_layer_params if zero_init else total_params
        cpu_mem = _fp32_init_cpu_bytes(built_on_host, num_gpus_per_node, additional_buffer_factor)
    return int(cpu_mem), int(gpu_mem)


# --- Rows per stage ---------------------------------------------------------------------------

def _zero3_rows(total: int, largest: int, n_gpus: int, n_nodes: int,
                factor: float) -> list[EstimateRow]:
    """DeepSpeed's loop order: optimizer cpu/none, then param cpu/none, then zero_init 1/0."""
    rows = []
    for cpu_offload in (True, False):
        for cpu_offload_params in (True, False):
            if not cpu_offload and cpu_offload_params:
                continue
            for zero_init in (True, False):
                cpu, gpu = zero3_mem_needs(total, largest, n_gpus, n_nodes, cpu_offload,
                                           cpu_offload_params, zero_init, factor)
                rows.append(EstimateRow(
                    cpu, gpu, DEVICE_CPU if cpu_offload_params else DEVICE_NONE,
                    DEVICE_CPU if cpu_offload else DEVICE_NONE, 1 if zero_init else 0))
    return rows


def _zero2_rows(total: int, n_gpus: int, n_nodes: int, factor: float,
                zero2_rule: Zero2Rule) -> list[EstimateRow]:
    rows = []
    for cpu_offload in (True, False):
        cpu, gpu = zero2_mem_needs(total, n_gpus, n_nodes, cpu_offload, factor, zero2_rule)
        rows.append(EstimateRow(cpu, gpu, None, DEVICE_CPU if cpu_offload else DEVICE_NONE, None))
    return rows


def _replicated_model_bytes(total: int) -> int:
    """16-bit params + 16-bit grads, whole on every GPU: 2N + 2N (Gaudi article)."""
    return (GAUDI_PARAM_BYTES_PER_PARAM + GAUDI_GRAD_BYTES_PER_PARAM) * total


def _zero1_rows(total: int, n_gpus: int, n_nodes: int, factor: float) -> list[EstimateRow]:
    """ZeRO-1, after the Gaudi article: GPU = 2N + 2N + int(12N / Nd), Nd = total GPUs.

    offload_optimizer=cpu: the Adam states leave the GPU, which keeps 2N + 2N; the host holds
    what DeepSpeed's ZeRO-2 estimator puts there for offload_optimizer=cpu,
    N * max(4 * total_gpus, 16) * buffer_factor (DeepSpeed's stage 1 and 2 share one optimizer,
    `DeepSpeedZeroOptimizer`, and one host-side CPU-Adam layout).
    offload_optimizer=none: host = the fp32 model built per rank, N * 4 * gpus_per_node * f, as
    DeepSpeed's ZeRO-2 estimator.
    """
    total_gpus = n_nodes * n_gpus
    offload_cpu, _ = zero2_mem_needs(total, n_gpus, n_nodes, True, factor)
    no_offload_cpu, _ = zero2_mem_needs(total, n_gpus, n_nodes, False, factor)
    replicated = _replicated_model_bytes(total)
    partitioned = int(ADAM_K_BYTES_PER_PARAM * total / total_gpus)
    return [
        EstimateRow(offload_cpu, replicated, None, DEVICE_CPU, None),
        EstimateRow(no_offload_cpu, replicated + partitioned, None, DEVICE_NONE, None),
    ]


def _zero0_rows(total: int, n_gpus: int, factor: float) -> list[EstimateRow]:
    """Plain data parallelism: GPU = 2N + 2N + 12N = 16N (Gaudi article: 16 GB for 1B params);
    host = the fp32 model built per rank, N * 4 * gpus_per_node * f. No offload row."""
    gpu = _replicated_model_bytes(total) + ADAM_K_BYTES_PER_PARAM * total
    cpu = int(_fp32_init_cpu_bytes(total, n_gpus, factor))
    return [EstimateRow(cpu, gpu, None, DEVICE_NONE, None)]


# --- Public API -------------------------------------------------------------------------------

def estimate_model_states(*, stage: int, total_params: int, largest_layer_params: int | None = None,
                          num_gpus_per_node: int = 1, num_nodes: int = 1,
                          additional_buffer_factor: float = DEFAULT_BUFFER_FACTOR,
                          zero2_rule: Zero2Rule = "current") -> Estimate:
    """Memory for params, gradients and optimizer states per GPU and per node's host.

    Stage 3 needs `largest_layer_params`; other stages keep it only for the record.
    `zero2_rule` picks DeepSpeed's ZeRO-2 no-offload GPU formula (see the module docstring).
    Raises `ScenarioError` for missing or invalid inputs.
    """
    total, largest = _validate(stage, total_params, largest_layer_params, num_gpus_per_node,
                               num_nodes, additional_buffer_factor, zero2_rule)
    factor = additional_buffer_factor
    if stage == ZERO3_STAGE:
        rows = _zero3_rows(total, largest, num_gpus_per_node, num_nodes, factor)
    elif stage == 2:
        rows = _zero2_rows(total, num_gpus_per_node, num_nodes, factor, zero2_rule)
    elif stage == 1:
        rows = _zero1_rows(total, num_gpus_per_node, num_nodes, factor)
    else:
        rows = _zero0_rows(total, num_gpus_per_node, factor)
    return Estimate(stage, total, largest, num_gpus_per_node, num_nodes, factor, tuple(rows),
                    zero2_rule)


def estimate_for_spec(spec: models.ModelSpec, *, stage: int, num_gpus_per_node: int = 1,
                      num_nodes: int = 1,
                      additional_buffer_factor: float = DEFAULT_BUFFER_FACTOR,
                      zero2_rule: Zero2Rule = "current", recipe: Recipe | None = None
                      ) -> Estimate:
    """`estimate_model_states` with the counts of a model (DeepSpeed's `_all_live`: every
    parameter, experts included, and the most any one module owns, the modules cut as
    `recipe`, a stack's, cuts them)."""
    return estimate_model_states(
        stage=stage, total_params=models.total_params(spec),
        largest_layer_params=models.largest_layer_params(spec, recipe),
        num_gpus_per_node=num_gpus_per_node,
        num_nodes=num_nodes, additional_buffer_factor=additional_buffer_factor,
        zero2_rule=zero2_rule)


def estimate_for_model(name: str, *, stage: int, num_gpus_per_node: int = 1, num_nodes: int = 1,
                       additional_buffer_factor: float = DEFAULT_BUFFER_FACTOR,
                       zero2_rule: Zero2Rule = "current") -> Estimate:
    """`estimate_model_states` with the counts of a catalog model (DeepSpeed's `_all_live`)."""
    spec = require_catalog_model(name, source=None, key_path="--model")
    return estimate_for_spec(spec, stage=stage, num_gpus_per_node=num_gpus_per_node,
                             num_nodes=num_nodes, additional_buffer_factor=additional_buffer_factor,
                             zero2_rule=zero2_rule)


def cluster_of(scenario: Any) -> tuple[int, int, int]:
    """(stage, GPUs per node, nodes) of a scenario's data-parallel ranks, for the estimator."""
    per_node = scenario.ranks_on_fullest_node
    return scenario.deepspeed.stage, per_node, -(-scenario.data_parallel // per_node)


def zero2_rule_for(version: tuple[int, int, int]) -> Zero2Rule:
    """The ZeRO-2 GPU formula a DeepSpeed version prints (`zerosim.behaviours`)."""
    return "current" if resolve_behaviours(version).zero2_estimator_16bit_params else "docs"
