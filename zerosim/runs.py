"""Measured runs in the Deep Optimizer States artifact format: read them, turn each into a
scenario on a hardware profile, predict them and, where the table has measurements, say how far
the prediction is.

The format is that of the study's public artifacts (`zerosim/validation/data/
polaris_zero3_offload_runs.csv`, repository `mauryaavinash95/deep-optimizer-states-results`):
one row per run of Megatron-DeepSpeed training a Llama-style GPT under DeepSpeed ZeRO with the
optimizer offloaded to the CPU. The configuration columns are required; the measured ones
(`fwd_ms_mean`, `bwd_ms_mean`, `step_ms_mean`, `iter_ms_mean`: milliseconds per optimizer step,
all micro-batches; `smu_train_rank0_peak_Max_MA_GB`, rank 0's peak allocated GPU memory;
`cpu_used_GB_peak_during_training`) are read where present. Both memory columns are GiB
whatever their names say: they are DeepSpeed's `see_memory_usage` figures ("smu"; `Max_MA` and
"CPU Virtual Memory: used"), which divide by 1024**3 and print "GB" (runtime/utils.py).
Rows that repeat a configuration are simulated once and compared with their mean.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zerosim.behaviours import (
    FORK_BASE_RELEASE,
    FORK_KEYS,
    STUDY_FORK_BUILD,
    empties_cache_each_phase,
    fork_build,
    fork_settings,
    launched_bound,
    unknown_build_text,
)
from zerosim.errors import Described, ScenarioError
from zerosim.inputs.tables import read_table
from zerosim.results.critical import WAITS_ON, WAITS_ON_KEYS
from zerosim.units import GiB, ordered_sum
from zerosim.vocabulary import SIMULATED, Status

if TYPE_CHECKING:
    import pandas as pd

    from zerosim.hardware.profile import HardwareProfile
    from zerosim.scenario import Scenario

STACK = "megatron-deepspeed"
MEMORY_BREAKDOWN = True
"""The format's runs print DeepSpeed's memory reports: its memory columns are their `Max_MA`
and "CPU Virtual Memory" lines, which the engine prints during training only with
`memory_breakdown` on (as the same group's MLP-Offload logs show it in their ds_config)."""
MEASURED_PHASES = ("forward", "backward", "update", "iteration")
"""What a run measures, per optimizer step."""
TIME_COLUMNS = {"forward": "fwd_ms_mean", "backward": "bwd_ms_mean", "update": "step_ms_mean",
                "iteration": "iter_ms_mean"}
GPU_MEMORY_COLUMN = "smu_train_rank0_peak_Max_MA_GB"
HOST_MEMORY_COLUMN = "cpu_used_GB_peak_during_training"
COUNT_COLUMNS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                 "num_key_value_heads", "seq_length", "padded_vocab_size", "num_gpus",
                 "micro_batch_size", "grad_accum_steps", "sub_group_size",
                 "reduce_bucket_size", "prefetch_bucket_size")
"""Configuration columns holding a positive whole number (1e8 and 100000000.0 both read)."""
FLAG_COLUMNS = ("untie_embeddings_and_output_weights", "use_flash_attn", "bf16",
                "checkpoint_activations", "offload_optimizer_pin_memory", "overlap_comm")
"""Configuration columns holding True or False."""
DEFAULTS = {"sub_group_size": "1000000000", "reduce_bucket_size": "500000000",
            "prefetch_bucket_size": "50000000", "untie_embeddings_and_output_weights": "True",
            "use_flash_attn": "False", "bf16": "True", "checkpoint_activations": "True",
            "offload_optimizer_pin_memory": "True", "overlap_comm": "True", "zero_stage": "3",
            "deepspeed_version": "0.13.3"}
"""What a table may leave out, and the value a missing column takes: DeepSpeed's defaults for
the bucket and sub-group sizes, the artifacts' set-up for the rest (bf16, activation
checkpointing, eager attention, untied embeddings, pinned buffers, `overlap_comm`, ZeRO-3,
DeepSpeed 0.13.3). A warning names each column filled."""
ARTIFACT_SEQUENCE = 2048
"""The sequence length of every artifact run: a run's name says when it has another."""
REQUIRED_COLUMNS = tuple(c for c in (*COUNT_COLUMNS, *FLAG_COLUMNS, "zero_stage",
                                     "deepspeed_version") if c not in DEFAULTS)
"""The model's shape, the GPUs and the batch: what no default can stand for."""
FORK_COLUMNS = FORK_KEYS
"""Optional columns: the Deep Optimizer States fork's `offload_optimizer` keys (False, False
and 0 when absent or empty), also as the table spells `offload_optimizer_pin_memory`
(`offload_optimizer_part_grads_async`, ...); a run that sets one is replayed on the build its
`deepspeed_version` names (`zerosim.behaviours.DEEP_OPTIMIZER_STATES_BUILDS`)."""
OFFLOAD_PREFIX = "offload_optimizer_"
BIND_COLUMN = "bind_cores_to_rank"
"""Optional column: True where the run was launched with `--bind_cores_to_rank` and a core
list in GPU order (`runtime.bind_cores_to_rank`); when absent or empty, what the build says
(`behaviours.launched_bound`: the Deep Optimizer States builds from c7da512a on)."""
NODES_COLUMNS = ("num_nodes", "nnodes")
"""Optional column (either name): the nodes the run's GPUs were spread over, evenly; when
absent or empty, as many of the profile's nodes as the GPUs fill (`MeasuredRun.nodes`)."""
PARAMS_COLUMN = "params_analytic_total"
"""Optional column: the table's parameter count of the model, checked against the model zerosim
builds from the shape columns (a difference is a warning: the model replayed is not the run's)."""
INFORMATIONAL_COLUMNS = ("n_iters_averaged",)
"""Columns read as what they are, with no bearing on a prediction: how many iterations each
measurement averages."""
SUPPORTED = {"swiglu": ("True",), "normalization": ("rmsnorm",)}
"""Columns whose other values describe a model the stack does not build (a GELU MLP, a
LayerNorm), with what is supported."""
ZERO = "deepspeed.zero_optimization"
SCENARIO_COLUMNS = {
    "model.num_hidden_layers": "num_layers", "model.hidden_size": "hidden_size",
    "model.intermediate_size": "ffn_hidden_size",
    "model.num_attention_heads": "num_attention_heads",
    "model.num_key_value_heads": "num_key_value_heads", "model.vocab_size": "padded_vocab_size",
    "model.tie_word_embeddings": "untie_embeddings_and_output_weights",
    "model.max_position_embeddings": "seq_length", "sequence_length": "seq_length",
    "activation_checkpointing": "checkpoint_activations", "attention": "use_flash_attn",
    "data_parallel": "num_gpus", "deepspeed.train_micro_batch_size_per_gpu": "micro_batch_size",
    "deepspeed.gradient_accumulation_steps": "grad_accum_steps", "deepspeed.bf16": "bf16",
    "deepspeed.fp16": "bf16", f"{ZERO}.stage": "zero_stage",
    f"{ZERO}.overlap_comm": "overlap_comm",
    f"{ZERO}.reduce_bucket_size": "reduce_bucket_size",
    f"{ZERO}.stage3_prefetch_bucket_size": "prefetch_bucket_size",
    f"{ZERO}.sub_group_size": "sub_group_size",
    f"{ZERO}.offload_optimizer.device": "zero_stage",
    f"{ZERO}.offload_optimizer.pin_memory": "offload_optimizer_pin_memory",
    **{f"{ZERO}.offload_optimizer.{key}": key for key in FORK_COLUMNS},
    "runtime.deepspeed_version": "deepspeed_version",
    "runtime.empty_cache_each_phase": "deepspeed_version",
    "runtime.bind_cores_to_rank": BIND_COLUMN}
"""The column each key of a run's scenario (`MeasuredRun.scenario`) takes its value from, for
an error in the scenario to name the cell to change (the optimizer is offloaded in every run,
so a stage that cannot offload it is the stage's column; the build says whether the cache is
emptied)."""


@dataclass(frozen=True)
class MeasuredRun:
    """One row: the run's configuration and, where the table has them, its measurements."""

    row: int
    """1 for the first data row."""
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    seq_length: int
    padded_vocab_size: int
    gpus: int
    micro_batch_size: int
    grad_accum_steps: int
    sub_group_size: int
    reduce_bucket_size: int
    prefetch_bucket_size: int
    untied_embeddings: bool
    flash_attention: bool
    bf16: bool
    checkpoint_activations: bool
    pin_memory: bool
    overlap_comm: bool
    zero_stage: int
    build: str
    """The DeepSpeed version as the run reported it (`0.13.3+<commit>` for a source build)."""
    params: int | None = None
    part_grads_async: bool = False
    prefetch_optimizer: bool = False
    prefetch_optimizer_gap: int = 0
    bind_cores_to_rank: bool = False
    """Launched with each rank bound to its part of the node (`runtime.bind_cores_to_rank`;
    column `bind_cores_to_rank`, else what the build says: `behaviours.launched_bound`)."""
    nodes_given: int | None = None
    """The table's node count (`NODES_COLUMNS`), None where it gives none."""
    nodes_column: str = NODES_COLUMNS[0]
    """The column that gave it (for errors)."""
    seconds: Mapping[str, float] = field(default_factory=dict)
    """Measured seconds per optimizer step, by `MEASURED_PHASES`, where the table has them."""
    peak_gpu_bytes: float | None = None
    """Rank 0's peak allocated GPU memory."""
    peak_host_bytes: float | None = None
    """Host memory in use on the node at its peak, every process counted."""

    @property
    def uses_fork_options(self) -> bool:
        return any(fork_settings(self).values())

    @property
    def deepspeed_version(self) -> str:
        """The release a source build is based on (`0.13.3+c7da512a` -> `0.13.3`), or the
        build itself when the run sets the fork's options."""
        return self.build if self.uses_fork_options else self.build.partition("+")[0]

    @property
    def empties_cache(self) -> bool:
        """A fork build's engine empties the CUDA cache at every phase
        (`behaviours.EMPTY_CACHE_EACH_PHASE`), whichever release the run is replayed on."""
        return empties_cache_each_phase(None, self.build.partition("+")[2])

    @property
    def fork_suffix(self) -> str:
        """`-async`, `-gap3`: the fork's options in a configuration's name."""
        gap = self.prefetch_optimizer_gap
        return ("-async" if self.part_grads_async else "") + (
            (f"-gap{gap}" if gap else "-interleaved") if self.prefetch_optimizer else "")

    @property
    def launch_suffix(self) -> str:
        """`-bound` or `-unbound` where the run's binding is not its build's
        (`behaviours.launched_bound`), else nothing."""
        if self.bind_cores_to_rank == launched_bound(self.build):
            return ""
        return "-bound" if self.bind_cores_to_rank else "-unbound"

    @property
    def setup_suffix(self) -> str:
        """What the run sets otherwise than the artifacts' set-up (`DEFAULTS`, a sequence of
        `ARTIFACT_SEQUENCE`), in its name: `-z2`, `-fp16`, `-flash`, `-s4096`, so that two
        configurations of one table never share a name; nothing for the shipped runs."""
        differs = [
            (self.zero_stage != int(DEFAULTS["zero_stage"]), f"-z{self.zero_stage}"),
            (not self.bf16, "-fp16"), (self.flash_attention, "-flash"),
            (not self.checkpoint_activations, "-nockpt"), (not self.pin_memory, "-pageable"),
            (not self.overlap_comm, "-nooverlap"), (not self.untied_embeddings, "-tied"),
            (self.seq_length != ARTIFACT_SEQUENCE, f"-s{self.seq_length}"),
            (self.reduce_bucket_size != int(DEFAULTS["reduce_bucket_size"]),
             f"-rb{self.reduce_bucket_size:.0e}"),
            (self.prefetch_bucket_size != int(DEFAULTS["prefetch_bucket_size"]),
             f"-pb{self.prefetch_bucket_size:.0e}")]
        return "".join(text for differ, text in differs if differ)

    @property
    def size_text(self) -> str:
        """`11.20b` from the table's parameter count, else the shape (`L40h5120`)."""
        if self.params:
            return f"{self.params / 1e9:.2f}b"
        return f"L{self.num_layers}h{self.hidden_size}"

    @property
    def name(self) -> str:
        return self.name_with_accumulation(str(self.grad_accum_steps))

    def name_with_accumulation(self, steps: str) -> str:
        """The configuration's name with `steps` as its accumulation (`1..16` names a
        series: `series.AccumulationSeries`)."""
        nodes = f"-{self.nodes_given}n" if self.nodes_given is not None else ""
        return (f"{self.size_text}-dp{self.gpus}{nodes}-mb{self.micro_batch_size}"
                f"-ga{steps}-sg{self.sub_group_size:.0e}{self.setup_suffix}"
                f"{self.fork_suffix}{self.launch_suffix}").replace("+", "")

    @property
    def config_key(self) -> tuple[Any, ...]:
        """What the simulation depends on (runs that repeat a configuration share it)."""
        return (self.num_layers, self.hidden_size, self.ffn_hidden_size,
                self.num_attention_heads, self.num_key_value_heads, self.seq_length,
                self.padded_vocab_size, self.gpus, self.micro_batch_size,
                self.grad_accum_steps, self.sub_group_size, self.reduce_bucket_size,
                self.prefetch_bucket_size, self.untied_embeddings, self.flash_attention,
                self.bf16, self.checkpoint_activations, self.pin_memory, self.overlap_comm,
                self.zero_stage, self.deepspeed_version, self.part_grads_async,
                self.prefetch_optimizer, self.prefetch_optimizer_gap, self.bind_cores_to_rank,
                self.empties_cache, self.nodes_given)

    @property
    def series_key(self) -> tuple[Any, ...]:
        """`config_key` but the accumulation: the runs of one gradient-accumulation series
        (`series.accumulation_series`) share it."""
        return replace(self, grad_accum_steps=0).config_key

    def nodes(self, gpus_per_node: int) -> int:
        """The table's node count where it gives one, else as many nodes of `gpus_per_node`
        GPUs as the run's GPUs fill."""
        if self.nodes_given is not None:
            return self.nodes_given
        return math.ceil(self.gpus / gpus_per_node)

    def node_overrides(self, profile: HardwareProfile, source: str = "<runs>"
                       ) -> dict[str, Any]:
        """The profile overrides that spread the run over its nodes: the node count, and,
        where the table puts fewer GPUs on a node than the profile's node holds, that many
        GPUs per node, the first ones (a launcher's local ranks take GPUs 0, 1, ... in
        order). More GPUs on a node than it holds is an error naming the row."""
        nodes = self.nodes(profile.gpus_per_node)
        per_node = self.gpus // nodes if self.nodes_given is not None else profile.gpus_per_node
        if per_node > profile.gpus_per_node:
            raise ScenarioError(
                source, f"row {self.row}.{self.nodes_column}",
                f"at least {math.ceil(self.gpus / profile.gpus_per_node)} nodes "
                f"({profile.name} has {profile.gpus_per_node} GPUs a node)", self.nodes_given)
        overrides: dict[str, Any] = {"nodes": nodes} if nodes > 1 else {}
        if per_node < profile.gpus_per_node and self.nodes_given is not None:
            overrides["gpu"] = {"per_node": per_node,
                                "numa_domain": list(profile.gpu_numa_domain[:per_node])}
        return overrides

    def scenario(self, hardware: str | Path, *, profile: HardwareProfile,
                 name_prefix: str = "", description: str = "", keep_build: bool = False,
                 source: str = "<runs>") -> dict[str, Any]:
        """The run as a zerosim scenario mapping on the profile `hardware` (a built-in name or
        a YAML file; `profile`, its loaded form), spread over its nodes (`node_overrides`); on
        the build itself rather than its release when `keep_build` (the fork's options come
        from elsewhere, `--set`)."""
        reference: dict[str, Any] = (
            {"file": str(Path(hardware).resolve())} if _is_file(hardware)
            else {"profile": str(hardware)})
        if overrides := self.node_overrides(profile, source):
            reference["overrides"] = overrides
        precision = {"bf16": {"enabled": True}} if self.bf16 else {"fp16": {"enabled": True}}
        return {
            "name": f"{name_prefix}{self.name}",
            "description": description or f"run of table row {self.row}",
            "model": self.model_fields(),
            "sequence_length": self.seq_length,
            "activation_checkpointing": self.checkpoint_activations,
            "attention": "flash" if self.flash_attention else "eager",
            "hardware": reference if "overrides" in reference or "file" in reference
            else str(hardware),
            "data_parallel": self.gpus,
            "deepspeed": {
                "train_micro_batch_size_per_gpu": self.micro_batch_size,
                "gradient_accumulation_steps": self.grad_accum_steps,
                **precision,
                "optimizer": {"type": "Adam"},
                "memory_breakdown": MEMORY_BREAKDOWN,
                "zero_optimization": {
                    "stage": self.zero_stage, "overlap_comm": self.overlap_comm,
                    "reduce_bucket_size": self.reduce_bucket_size,
                    "stage3_prefetch_bucket_size": self.prefetch_bucket_size,
                    "sub_group_size": self.sub_group_size,
                    "offload_optimizer": {"device": "cpu", "pin_memory": self.pin_memory,
                                          **self._fork_options()},
                },
            },
            "runtime": {"deepspeed_version": self.build if keep_build else self.deepspeed_version,
                        "framework": STACK,
                        **({"bind_cores_to_rank": True} if self.bind_cores_to_rank else {}),
                        **({"empty_cache_each_phase": True} if self.empties_cache else {})},
        }

    def column_of(self, key_path: str) -> str | None:
        """The column that a value of `scenario`'s tree at `key_path`, or below it, comes from
        (`SCENARIO_COLUMNS`; the nodes the run spreads over, from its node count's column or
        else from num_gpus), None where no column gives it."""
        columns = {**SCENARIO_COLUMNS, "hardware.overrides": (
            self.nodes_column if self.nodes_given is not None else "num_gpus")}
        keys = [k for k in columns if key_path == k or key_path.startswith(k + ".")]
        return columns[max(keys, key=len)] if keys else None

    def _fork_options(self) -> dict[str, Any]:
        return fork_settings(self) if self.uses_fork_options else {}

    def model_fields(self) -> dict[str, Any]:
        """The model of the shape columns, as a scenario's `model` mapping (Megatron-DeepSpeed's
        Llama-style GPT: the `llama` family)."""
        return {"name": f"megatron-{self.size_text}", "family": "llama",
                "hidden_size": self.hidden_size, "num_hidden_layers": self.num_layers,
                "intermediate_size": self.ffn_hidden_size,
                "num_attention_heads": self.num_attention_heads,
                "num_key_value_heads": self.num_key_value_heads,
                "vocab_size": self.padded_vocab_size,
                "tie_word_embeddings": not self.untied_embeddings,
                "max_position_embeddings": self.seq_length}

    def model_params(self) -> int:
        """Parameters of the model zerosim builds from the shape columns (pure: no SimPy)."""
        from zerosim.models import ModelSpec, total_params

        return total_params(ModelSpec(**self.model_fields()))


def _is_file(hardware: str | Path) -> bool:
    text = str(hardware)
    return text.endswith((".yaml", ".yml")) or Path(text).is_file()


def _whole(text: str, least: int) -> int | None:
    """`text` as a whole number of at least `least`, None if it is not one: 1e8, 100000000 and
    100000000.0 all read, as a table written by pandas may hold them (a column with an empty
    cell holds floats)."""
    try:
        value = float(text)
    except ValueError:
        return None
    if not (math.isfinite(value) and value >= least and value == int(value)):
        return None
    return int(value)


def _count(source: str, row: int, column: str, text: str) -> int:
    value = _whole(text, 1)
    if value is None:
        raise ScenarioError(source, f"row {row}.{column}", "a positive whole number", text)
    return value


FLAG_TEXTS = {"true": True, "false": False, "1": True, "0": False, "1.0": True, "0.0": False}
"""How a table may write a flag: Python's True/False in any case, or 1/0 (a boolean column
with an empty cell, written by pandas after a cast to float, holds 1.0/0.0)."""


def _flag(source: str, row: int, column: str, text: str) -> bool:
    value = FLAG_TEXTS.get(text.strip().lower())
    if value is None:
        raise ScenarioError(source, f"row {row}.{column}", "True or False", text)
    return value


def sets_fork_options(overrides: Mapping[str, Any]) -> bool:
    """Whether `--set` switches on one of the fork's options for every row."""
    return any(path.rpartition(".")[2] in FORK_COLUMNS and value
               for path, value in overrides.items())


def _fork_options(source: str, row: int, r: Mapping[str, str]) -> dict[str, Any]:
    """The optional `FORK_COLUMNS`, where the table has them and the row fills them."""
    options: dict[str, Any] = {}
    for key in FORK_COLUMNS:
        filled = [(c, r[c].strip()) for c in (key, OFFLOAD_PREFIX + key)
                  if (r.get(c) or "").strip()]
        values = {_fork_value(source, row, column, text) for column, text in filled}
        if len(values) > 1:
            raise ScenarioError(source, f"row {row}.{OFFLOAD_PREFIX + key}",
                                f"the value of column {key}", filled[1][1])
        if values:
            options[key] = values.pop()
    return options


def _fork_value(source: str, row: int, column: str, text: str) -> bool | int:
    if not column.endswith("_gap"):
        return _flag(source, row, column, text)
    value = _whole(text, 0)
    if value is None:
        raise ScenarioError(source, f"row {row}.{column}", "a whole number >= 0", text)
    return value


MISSING = frozenset({"", "nan", "na", "n/a", "#n/a", "null", "none", "-"})
"""What a cell holds where the row gives no value, in any case: empty, or what pandas writes
and reads for a missing value (`NaN`, `NA`, `N/A`, `null`, `None`) and a dash. In an optional
column (a measurement, an option with a default) it is an empty cell; in a configuration
column, a bad value."""


def _blanked(r: Mapping[str, str | None]) -> dict[str, str | None]:
    """The row with a cell written as missing (`MISSING`) emptied, in every column but the
    configuration columns no default stands for (`REQUIRED_COLUMNS`)."""
    return {column: "" if column not in REQUIRED_COLUMNS and text is not None
            and text.strip().lower() in MISSING else text for column, text in r.items()}


def _measured(source: str, row: int, column: str, text: str | None) -> float | None:
    if text is None or not text.strip():
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise ScenarioError(source, f"row {row}.{column}", "a positive measurement", text)
    return value


def _run(source: str, row: int, r: Mapping[str, str],
         relabelled: list[int] | None = None) -> MeasuredRun:
    for column, allowed in SUPPORTED.items():
        if column in r and r[column].strip() not in allowed:
            raise ScenarioError(source, f"row {row}.{column}", f"{' or '.join(allowed)} (the "
                                f"{STACK} stack builds a Llama-style block)", r[column])
    counts = {c: _count(source, row, c, r[c]) for c in COUNT_COLUMNS}
    data_parallel = r.get("data_parallel_size", "").strip()
    if data_parallel and _count(source, row, "data_parallel_size", data_parallel) != counts[
            "num_gpus"]:
        raise ScenarioError(source, f"row {row}.data_parallel_size", f"num_gpus "
                            f"({counts['num_gpus']}): zerosim replays data parallelism alone, "
                            "not tensor or pipeline parallelism", data_parallel)
    flags = {c: _flag(source, row, c, r[c]) for c in FLAG_COLUMNS}
    stage = _whole(r["zero_stage"].strip(), 0)
    if stage not in (0, 1, 2, 3):
        raise ScenarioError(source, f"row {row}.zero_stage", "0, 1, 2 or 3", r["zero_stage"])
    if not r["deepspeed_version"].strip():
        raise ScenarioError(source, f"row {row}.deepspeed_version", "a DeepSpeed version",
                            r["deepspeed_version"])
    seconds = {}
    for phase, column in TIME_COLUMNS.items():
        value = _measured(source, row, column, r.get(column))
        if value is not None:
            seconds[phase] = value / 1000
    gpu = _measured(source, row, GPU_MEMORY_COLUMN, r.get(GPU_MEMORY_COLUMN))
    host = _measured(source, row, HOST_MEMORY_COLUMN, r.get(HOST_MEMORY_COLUMN))
    params = r.get(PARAMS_COLUMN)
    nodes = _nodes(source, row, r, counts["num_gpus"])
    fork = _fork_options(source, row, r)
    build = _fork_build_if_options(r["deepspeed_version"].strip(), fork, row, relabelled)
    bound = (r.get(BIND_COLUMN) or "").strip()
    return MeasuredRun(
        row=row, num_layers=counts["num_layers"], hidden_size=counts["hidden_size"],
        ffn_hidden_size=counts["ffn_hidden_size"],
        num_attention_heads=counts["num_attention_heads"],
        num_key_value_heads=counts["num_key_value_heads"], seq_length=counts["seq_length"],
        padded_vocab_size=counts["padded_vocab_size"], gpus=counts["num_gpus"],
        micro_batch_size=counts["micro_batch_size"], grad_accum_steps=counts["grad_accum_steps"],
        sub_group_size=counts["sub_group_size"], reduce_bucket_size=counts["reduce_bucket_size"],
        prefetch_bucket_size=counts["prefetch_bucket_size"],
        untied_embeddings=flags["untie_embeddings_and_output_weights"],
        flash_attention=flags["use_flash_attn"], bf16=flags["bf16"],
        checkpoint_activations=flags["checkpoint_activations"],
        pin_memory=flags["offload_optimizer_pin_memory"], overlap_comm=flags["overlap_comm"],
        zero_stage=stage, build=build,
        bind_cores_to_rank=(_flag(source, row, BIND_COLUMN, bound) if bound
                            else launched_bound(build)),
        params=_count(source, row, PARAMS_COLUMN, params) if params else None,
        **nodes, **fork, seconds=seconds, peak_gpu_bytes=None if gpu is None else gpu * GiB,
        peak_host_bytes=None if host is None else host * GiB)


def _fork_build_if_options(build: str, fork: Mapping[str, Any], row: int,
                           relabelled: list[int] | None) -> str:
    """A measured run that sets one of the fork's options ran the fork, whatever its label
    says: on the plain fork base release (`0.13.3`, as a build installed without its git
    metadata reports itself) it is taken as the study's own build, `STUDY_FORK_BUILD`, and
    `relabelled` collects its row for a warning. Any other label stays as the table gives it."""
    if build == FORK_BASE_RELEASE and any(fork.values()):
        if relabelled is not None:
            relabelled.append(row)
        return f"{FORK_BASE_RELEASE}+{STUDY_FORK_BUILD}"
    return build


def _nodes(source: str, row: int, r: Mapping[str, str], gpus: int) -> dict[str, Any]:
    """The row's node count and the column that gives it (`NODES_COLUMNS`, the first one
    given), as `MeasuredRun` fields; it must split the GPUs evenly. Nothing where the table
    gives none."""
    for column in NODES_COLUMNS:
        text = (r.get(column) or "").strip()
        if text:
            nodes = _count(source, row, column, text)
            if gpus % nodes:
                raise ScenarioError(source, f"row {row}.{column}",
                                    f"a divisor of num_gpus ({gpus}): the GPUs spread evenly",
                                    text)
            return {"nodes_given": nodes, "nodes_column": column}
    return {}


@dataclass(frozen=True)
class RefusedRow:
    """A row of a table that zerosim cannot read as a run or cannot replay, and why."""

    row: int
    """1 for the first data row."""
    error: ScenarioError
    """The refusal, naming the table, the row and the column, as a refused file's would."""


def read_runs_text(text: str, source: str, refused: list[RefusedRow] | None = None
                   ) -> list[MeasuredRun]:
    """Every row of a table in the artifact format, in order; a missing configuration column
    is an error, and so is a bad value of a row (naming the row and the column) and a row of
    more or fewer fields than the header (`inputs.tables.read_table`, naming the row). Given a
    `refused` list, a row whose values are bad is appended to it instead and left out (what
    `zerosim predict` does with a table of many runs), unless no row is left."""
    header, table = read_table(text, source, delimiter=_delimiter(text))
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise ScenarioError(source, "<header>",
                            f"the configuration columns {', '.join(REQUIRED_COLUMNS)}",
                            Described(f"no column {missing[0]!r}"))
    filled = {c: v for c, v in DEFAULTS.items() if c not in header}
    if filled:
        _warn(f"{source}: no column {', '.join(filled)}; every run takes "
              + ", ".join(f"{c}={v}" for c, v in filled.items()))
    blanks: dict[str, list[int]] = {}
    relabelled: list[int] = []
    runs = []
    for row, r in enumerate(table, start=1):
        try:
            runs.append(_run(source, row, filled | _with_defaults(_blanked(r), row, blanks),
                             relabelled))
        except ScenarioError as err:
            if refused is None:
                raise
            refused.append(RefusedRow(row, err))
    for column, rows in blanks.items():
        _warn(f"{source}: row(s) {_row_list(rows)}: no {column}; they take "
              f"{column}={DEFAULTS[column]}")
    if relabelled:
        _warn(f"{source}: row(s) {_row_list(relabelled)}: the fork's options on release "
              f"{FORK_BASE_RELEASE}, which refuses them: the runs were the fork's, replayed on "
              f"the study's build {FORK_BASE_RELEASE}+{STUDY_FORK_BUILD} (its launch bound, its "
              "CUDA cache emptied at every phase)")
    if not runs:
        if refused:
            raise refused[0].error
        raise ScenarioError(source, "<rows>", "at least one run", Described("none"))
    _warn_unread_columns(source, header)
    _warn_unknown_builds(source, runs, BIND_COLUMN in header)
    _warn_other_models(source, runs)
    return runs


def _delimiter(text: str) -> str:
    """The table's separator, read off its header line: commas as the artifacts write them,
    else tabs or semicolons (a table saved from a spreadsheet), else commas."""
    header = text.partition("\n")[0]
    return next((d for d in (",", "\t", ";") if d in header), ",")


def _with_defaults(r: Mapping[str, str | None], row: int,
                   blanks: dict[str, list[int]]) -> dict[str, str]:
    """The row with an empty cell of a `DEFAULTS` column given that column's default, as a
    missing column is (a table joining runs that recorded different settings leaves cells
    empty); `blanks` collects the rows per column, for one warning each."""
    filled = dict(r)
    for column, default in DEFAULTS.items():
        if column in filled and not (filled[column] or "").strip():
            filled[column] = default
            blanks.setdefault(column, []).append(row)
    return filled


def _row_list(rows: Sequence[int], shown: int = 10) -> str:
    listed = ", ".join(str(r) for r in rows[:shown])
    return listed + (f" and {len(rows) - shown} more" if len(rows) > shown else "")


def known_columns() -> frozenset[str]:
    """Every column `read_runs_text` reads or knows to have no bearing on a prediction."""
    return frozenset((*COUNT_COLUMNS, *FLAG_COLUMNS, *DEFAULTS, *SUPPORTED,
                      *TIME_COLUMNS.values(), GPU_MEMORY_COLUMN, HOST_MEMORY_COLUMN,
                      "data_parallel_size", PARAMS_COLUMN, BIND_COLUMN, *NODES_COLUMNS,
                      *INFORMATIONAL_COLUMNS,
                      *FORK_COLUMNS, *(OFFLOAD_PREFIX + c for c in FORK_COLUMNS)))


def _warn_unread_columns(source: str, header: Sequence[str]) -> None:
    """A column zerosim does not read cannot change a prediction: say so rather than let a
    setting the table records (another parallelism, an option) pass unseen."""
    known = known_columns()
    unread = [c for c in header if c not in known]
    if unread:
        _warn(f"{source}: column(s) {', '.join(unread)} not read: the predictions do not "
              "depend on them")


def _warn_unknown_builds(source: str, runs: Sequence[MeasuredRun], binding_given: bool
                         ) -> None:
    """Rows of a source build that is not a Deep Optimizer States commit zerosim knows: what
    they are replayed as (a build it knows tells how its runs were launched, this one
    cannot), one warning per build."""
    rows_by_build: dict[str, list[int]] = {}
    for run in runs:
        label = run.build.partition("+")[2]
        if label and fork_build(label) is None:
            rows_by_build.setdefault(run.build, []).append(run.row)
    launch = ("" if binding_given else
              f"; launched unbound, as the builds before c7da512a were (a {BIND_COLUMN} "
              "column says otherwise)")
    for build, rows in rows_by_build.items():
        _warn(f"{source}: row(s) {_row_list(rows)}: {unknown_build_text(build)}: "
              "replayed as the fork, its CUDA cache "
              f"emptied at every phase, its options as d8048a5e and later read them{launch} "
              "(docs/deep_optimizer_states.md)")


def _warn_other_models(source: str, runs: Sequence[MeasuredRun]) -> None:
    """Rows whose `params_analytic_total` differs from the parameters of the model zerosim
    builds from their shape columns (one warning per shape)."""
    rows_by_shape: dict[tuple[int, int], list[int]] = {}
    for run in runs:
        if run.params is not None:
            built = run.model_params()
            if built != run.params:
                rows_by_shape.setdefault((run.params, built), []).append(run.row)
    for (table, built), rows in rows_by_shape.items():
        _warn(f"{source}: row(s) {_row_list(rows)}: {PARAMS_COLUMN} is {table:,}, "
              f"the model zerosim builds from the shape columns has {built:,} "
              f"({built / table - 1:+.2%}): the run's model is not the one replayed (biases, "
              "tied embeddings or another MLP would differ so)")


def _warn(message: str) -> None:
    import warnings

    from zerosim.errors import ScenarioWarning

    warnings.warn(message, ScenarioWarning, stacklevel=3)


def read_runs(path: str | Path, refused: list[RefusedRow] | None = None) -> list[MeasuredRun]:
    """`read_runs_text` of the table at `path`."""
    from zerosim.inputs.files import read_input_text

    return read_runs_text(read_input_text(Path(path)), str(path), refused)


@dataclass(frozen=True)
class Configuration:
    """Runs that repeat one configuration, measured values averaged over them."""

    runs: tuple[MeasuredRun, ...]
    name: str = ""
    """Its name in its table (`distinct_names`); the first run's name where not given."""

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", self.runs[0].name)

    @property
    def first(self) -> MeasuredRun:
        return self.runs[0]

    def values(self, quantity: str) -> list[float]:
        """What each run measured of `quantity` (`QUANTITIES`), where it did."""
        if quantity == PEAK_ALLOCATED:
            measured = [r.peak_gpu_bytes for r in self.runs]
        elif quantity == PEAK_HOST:
            measured = [r.peak_host_bytes for r in self.runs]
        elif quantity == BETWEEN_PHASES:
            measured = [between_phases_s(r.seconds) for r in self.runs]
        else:
            measured = [r.seconds.get(quantity) for r in self.runs]
        return [v for v in measured if v is not None]

    @property
    def was_measured(self) -> bool:
        """Whether the table measured any of its runs: then it ran, and fitted its hardware."""
        return any(self.values(quantity) for quantity in QUANTITIES)

    def measured(self, quantity: str) -> float | None:
        """The runs' mean of `quantity`, None where none measured it."""
        values = self.values(quantity)
        return ordered_sum(values) / len(values) if values else None

    def spread(self, quantity: str) -> float | None:
        """How far the runs' measurements of `quantity` scatter: (largest - smallest) / mean,
        where two or more runs measured it; a prediction of the configuration cannot be
        judged more finely."""
        values = self.values(quantity)
        if len(values) < 2:
            return None
        return (max(values) - min(values)) / (ordered_sum(values) / len(values))

    def deviations(self, quantity: str) -> list[float]:
        """Each run's `quantity` relative to the runs' mean (empty below two runs)."""
        values = self.values(quantity)
        if len(values) < 2:
            return []
        mean = ordered_sum(values) / len(values)
        return [value / mean - 1 for value in values]

    @property
    def peak_gpu_bytes(self) -> float | None:
        return self.measured(PEAK_ALLOCATED)

    @property
    def peak_host_bytes(self) -> float | None:
        return self.measured(PEAK_HOST)


def between_phases_s(seconds: Mapping[str, float | None]) -> float | None:
    """The iteration less the forward, backward and update, where all four are given."""
    times = [seconds.get(q) for q in MEASURED_PHASES]
    if any(t is None for t in times):
        return None
    forward, backward, update, iteration = times
    return iteration - forward - backward - update


OFF_REPEATS = 0.10
"""How far one run's phase sits from the mean of its configuration's other runs before
`zerosim predict` names the run: twice the Polaris table's pooled scatter of one forward
(5.9%) is about this, and the table's runs measured on a slower GPU sit 16-17% off."""
TIMED_PHASES = ("forward", "backward", "update")


@dataclass(frozen=True)
class OffRepeat:
    """A run some phase of which sits `OFF_REPEATS` or more from the mean of its
    configuration's other runs."""

    run: MeasuredRun
    others: tuple[int, ...]
    """The rows of the configuration's other runs."""
    configuration: str
    """Its configuration's name."""
    deviations: dict[str, float]
    """Per phase it and the others measured: its value over the others' mean, minus 1."""


def runs_off_their_repeats(configurations: Iterable[Configuration],
                           threshold: float = OFF_REPEATS) -> list[OffRepeat]:
    """Runs a phase of which differs from the same configuration's other runs by `threshold`
    or more; of a pair only the first, over the second (two runs cannot say which is off). A
    run whose GPU-bound phases are off together while its update, on the CPU, is not points
    at the GPU's clock, not at the model."""
    found = []
    for configuration in configurations:
        runs = configuration.runs
        for run in runs[:1] if len(runs) == 2 else runs:
            others = [r for r in runs if r is not run]
            deviations = {}
            for phase in TIMED_PHASES:
                values = [o.seconds[phase] for o in others if o.seconds.get(phase) is not None]
                if values and run.seconds.get(phase) is not None:
                    deviations[phase] = run.seconds[phase] * len(values) / ordered_sum(values) - 1
            if any(abs(d) >= threshold for d in deviations.values()):
                found.append(OffRepeat(run, tuple(o.row for o in others), configuration.name,
                                       deviations))
    return found


def run_to_run_sd(configurations: Iterable[Configuration], quantity: str) -> float | None:
    """How far one run scatters about its configuration's mean in `quantity`: the relative
    standard deviation pooled over the configurations measured more than once, each losing one
    degree of freedom to its own mean (None without such a configuration). A prediction of a
    configuration of n runs cannot be judged more finely than this over sqrt(n)."""
    squares, freedom = 0.0, 0
    for configuration in configurations:
        deviations = configuration.deviations(quantity)
        squares += ordered_sum(d * d for d in deviations)
        freedom += max(len(deviations) - 1, 0)
    return math.sqrt(squares / freedom) if freedom else None


def configurations(runs: Iterable[MeasuredRun]) -> list[Configuration]:
    """Distinct configurations in first-seen order."""
    groups: dict[tuple[Any, ...], list[MeasuredRun]] = {}
    for run in runs:
        groups.setdefault(run.config_key, []).append(run)
    names = distinct_names([g[0] for g in groups.values()])
    return [Configuration(tuple(g), name) for g, name in zip(groups.values(), names, strict=True)]


def distinct_names(firsts: Sequence[MeasuredRun]) -> list[str]:
    """The names of configurations (their first runs), each its own: where two would share
    one, as runs of several builds do (a bound and an unbound launch, 0.13.3 and 0.14.0),
    each gets its build (`-ds0.14.0`, `-ds0.13.3-d18d6f81`), then, if still shared, its first
    row (`-r12`)."""
    names = _named_apart([r.name for r in firsts], firsts,
                         lambda r: f"-ds{r.build.replace('+', '-')}")
    return _named_apart(names, firsts, lambda r: f"-r{r.row}")


def _named_apart(names: list[str], firsts: Sequence[MeasuredRun],
                 suffix: Callable[[MeasuredRun], str]) -> list[str]:
    shared = {n for n in names if names.count(n) > 1}
    return [n + suffix(r) if n in shared else n for n, r in zip(names, firsts, strict=True)]


def per_step_seconds(phases_s: Mapping[str, float | None], grad_accum_steps: int
                     ) -> dict[str, float | None]:
    """A summary's per-micro-batch phase means as the runs measure them, per optimizer step:
    the forward of every micro-batch, the backward of every micro-batch (the last one at the
    accumulation boundary), the update."""
    forward, other = phases_s.get("forward"), phases_s.get("backward_non_boundary")
    boundary = phases_s.get("backward_boundary")
    return {
        "forward": None if forward is None else grad_accum_steps * forward,
        "backward": None if boundary is None else boundary + (grad_accum_steps - 1) * (
            other or 0.0),
        "update": phases_s.get("update"),
    }


PEAK_ALLOCATED = "peak allocated GPU memory"
"""Rank 0's peak of `torch.cuda.max_memory_allocated`, in bytes (the tables' `..._GB` column,
which holds GiB)."""
PEAK_HOST = "node host memory in use, peak"
"""The node's host memory in use at its highest, every process and the OS, in bytes (the
tables' `cpu_used_GB_peak_during_training`, which holds GiB)."""
MEMORY_QUANTITIES = (PEAK_ALLOCATED, PEAK_HOST)
"""Quantities in bytes (shown and written in GiB)."""
QUANTITIES = (*MEASURED_PHASES, *MEMORY_QUANTITIES)
"""What a prediction is compared on: the times per optimizer step, rank 0's peak allocated
GPU memory and the node's peak host memory."""
BETWEEN_PHASES = "between phases"
"""The iteration less its three timed phases, seconds per optimizer step: the training loop
outside DeepSpeed's timers and, with `memory_breakdown`, its memory reports. Derived from a
run's four times; written to the table, not printed (a small difference of large times)."""
MEMORY_REPORTS = "memory reports"
"""What DeepSpeed's memory reports take of `BETWEEN_PHASES` (predicted only)."""
WRITTEN_QUANTITIES = (*QUANTITIES, BETWEEN_PHASES)
"""What `predictions.csv` compares, predicted against measured."""


@dataclass(frozen=True)
class Prediction:
    """A configuration's simulated times (seconds per optimizer step) and memory, beside its
    runs' mean measurements."""

    configuration: Configuration
    scenario_name: str
    nodes: int
    status: str
    """`ok`, `oom` (it does not fit: a result), `refused` (zerosim does not replay it; `error`
    says why, naming the row and column) or `error` (it could not be simulated)."""
    predicted: Mapping[str, float | None]
    """By `QUANTITIES`: seconds, or bytes for the memory."""
    error: str = ""
    oom: str = ""
    """With status `oom`: the device and the allocation that did not fit (`oom_text`)."""
    timed_with: Mapping[str, float] = field(default_factory=dict)
    """With status `oom`, for a measured configuration (which fitted when it ran): the
    memory (`--set` key: GiB) its predicted times were simulated with (`simulate_tree`);
    empty when it was not timed."""
    tight: str = ""
    """With status `ok`: the fullest GPU's or node's peak where it comes within the memory
    model's error of the capacity (`results.summary.tight_memory`), as 'peak HBM 39.21 of
    39.59 GiB': a real run may not fit."""
    waits_on: Mapping[str, str | None] = field(default_factory=dict)
    """With `--explain`: per summary phase time, what the phase waited on over the step
    (`results.critical.waits_texts`); empty otherwise."""

    def measured(self, quantity: str) -> float | None:
        return self.configuration.measured(quantity)

    @property
    def timed_with_text(self) -> str:
        """`timed_with` as `--set` would take it: 'hardware.gpu.hbm_GiB=39.82'."""
        return " ".join(f"{key}={value:.2f}" for key, value in self.timed_with.items())

    def rel_error(self, quantity: str) -> float | None:
        """(predicted - measured) / measured, None where either is missing."""
        predicted, measured = self.predicted.get(quantity), self.measured(quantity)
        if predicted is None or measured is None:
            return None
        return predicted / measured - 1


MAX_CAPACITY_RAISES = 8
"""How many times `simulate_tree` raises a device's memory for a measured configuration that
the model puts over it (each raise covers the allocation that did not fit; a later one may
need more)."""


def simulate_tree(tree: Mapping[str, Any], overrides: Mapping[str, Any], source: str, *,
                  measured: bool = False, explain: bool = False) -> dict[str, Any]:
    """One configuration in a worker: its summary and its profile's CUDA context size (what
    `torch.cuda.max_memory_allocated` does not count); with `explain`, the summary's
    `waits_on` (`api.simulate_summary`).

    A `measured` configuration ran, so it fitted its hardware: where the model puts it over a
    device's memory (status `oom`), and no override sets that memory, it is simulated again
    with the memory raised to what the allocation needed (`capacity_that_fits`), as often
    as needed up to `MAX_CAPACITY_RAISES`: the summary's `oom` stays the first one, and
    `timed_with` holds the raised values (the `--set` key and GiB) its times were taken
    with."""
    from zerosim.results.summary import capacity_that_fits

    summary = _summary_of(tree, overrides, source, explain)
    first_oom = summary.get("oom")
    raised: dict[str, float] = {}
    raises = 0
    while measured and summary["status"] == Status.OOM and raises < MAX_CAPACITY_RAISES:
        fits = capacity_that_fits(summary["oom"])
        if fits is None or fits[0] in overrides:
            break
        raised[fits[0]] = fits[1]
        raises += 1
        summary = _summary_of(tree, {**overrides, **raised}, source, explain)
    if raised:
        summary["oom"], summary["timed_with"] = first_oom, raised
    return summary


def _summary_of(tree: Mapping[str, Any], overrides: Mapping[str, Any], source: str,
                explain: bool = False) -> dict[str, Any]:
    import warnings

    from zerosim.api import simulate_summary
    from zerosim.errors import ScenarioWarning

    scenario = _scenario_of(tree, overrides, source)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScenarioWarning)
        summary = simulate_summary(scenario, explain=explain)
    summary["runtime_context_bytes"] = scenario.hardware.runtime_context_bytes
    return summary


def _scenario_of(tree: Mapping[str, Any], overrides: Mapping[str, Any], source: str
                 ) -> Scenario:
    """The resolved scenario, as `zerosim check` resolves a file (its warnings were the
    table's to give: `read_runs_text`)."""
    import warnings

    from zerosim.errors import ScenarioWarning
    from zerosim.scenario import scenario_from_dict

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScenarioWarning)
        return scenario_from_dict(tree, source=source, overrides=overrides)


def check_scenarios(jobs: Iterable[tuple[Configuration, Mapping[str, Any]]],
                    overrides: Mapping[str, Any], source: str) -> list[ScenarioError | None]:
    """Resolve each configuration's scenario tree before anything is simulated: per
    configuration, None, or zerosim's refusal naming the table, the row and the column its
    value comes from (status `refused`; status `error` is left to a failure of the simulation
    itself). A refusal of a `--set` value is an error raised at once, as a bad option is, and
    so is a refusal of every configuration."""
    refusals: list[ScenarioError | None] = []
    for configuration, tree in jobs:
        try:
            _scenario_of(tree, overrides, source)
        except ScenarioError as err:
            place, setting = _refused_at(configuration.first, err.key_path, overrides)
            refusal = ScenarioError(source, place, err.expected, err.got)
            if setting is not None:
                raise refusal from None
            refusals.append(refusal)
        else:
            refusals.append(None)
    if refusals and all(refusals):
        raise refusals[0]
    return refusals


def _refused_at(run: MeasuredRun, key_path: str, overrides: Mapping[str, Any]
                ) -> tuple[str, str | None]:
    """Where a refusal of `run`'s scenario at `key_path` points, and the `--set` key behind it
    if one is: that `--set` (or the one behind the column that gives the value, as `--set
    ...stage=0` is behind an offload refused at stage 0), else the row's column, with the
    scenario key, whose value may be derived from the cell ('cpu', 'flash'), else the row and
    the key."""
    from zerosim.scenario.loader import override_behind

    column = run.column_of(key_path)
    setting = override_behind(key_path, overrides) or next(
        (path for path in overrides if column is not None and run.column_of(path) == column),
        None)
    if setting is not None:
        return f"row {run.row}: --set {setting}", setting
    if column is not None:
        return f"row {run.row}.{column}: {key_path}", None
    return f"row {run.row}: {key_path}", None


def _prediction(configuration: Configuration, name: str, nodes: int,
                summary: Mapping[str, Any] | BaseException) -> Prediction:
    if isinstance(summary, BaseException):
        return Prediction(configuration, name, nodes, Status.ERROR, {},
                          error=f"{type(summary).__name__}: {summary}")
    from zerosim.results.summary import oom_text, tight_text

    oom = summary.get("oom")
    oom_line = oom_text(oom, with_time=False) if oom else ""
    if summary["status"] != Status.OK:
        return Prediction(configuration, name, nodes, summary["status"], {}, oom=oom_line)
    steps = per_step_seconds(summary["phases_s"], configuration.first.grad_accum_steps)
    times = {**steps, "iteration": summary["iteration_s"]}
    predicted = {**times, BETWEEN_PHASES: between_phases_s(times),
                 MEMORY_REPORTS: summary["memory_reports_s"],
                 PEAK_ALLOCATED: summary["peak_hbm_GiB"] * GiB
                 - summary["runtime_context_bytes"],
                 PEAK_HOST: summary["peak_host_GiB"] * GiB}
    timed_with = summary.get("timed_with", {})
    status = Status.OOM if timed_with else Status.OK
    return Prediction(configuration, name, nodes, status, predicted, oom=oom_line,
                      timed_with=timed_with, tight="" if timed_with else tight_text(summary),
                      waits_on=summary.get(WAITS_ON) or {})


@dataclass
class PredictOutcome:
    source: str
    hardware: str
    predictions: list[Prediction]
    executor: str = ""
    wall_s: float = 0.0
    files: list[Path] = field(default_factory=list)
    refused_rows: list[RefusedRow] = field(default_factory=list)
    """Rows of the table that could not be read as runs (`read_runs`), with why."""

    @property
    def complete(self) -> bool:
        """Whether every row of the table was read and every configuration simulated (one
        that does not fit counts: it is a result)."""
        return not self.refused_rows and all(p.status in SIMULATED for p in self.predictions)

    def errors(self, quantity: str) -> list[float]:
        return [e for p in self.predictions if (e := p.rel_error(quantity)) is not None]

    def rms(self, quantity: str) -> float | None:
        errors = self.errors(quantity)
        return math.sqrt(ordered_sum(e * e for e in errors) / len(errors)) if errors else None

    def widest_spread(self, quantity: str) -> tuple[float, Prediction] | None:
        """The repeated configuration whose runs scatter most in `quantity`, with that
        spread (`Configuration.spread`); None when no configuration was measured twice."""
        spreads = [(spread, p) for p in self.predictions
                   if (spread := p.configuration.spread(quantity)) is not None]
        return max(spreads, key=lambda pair: pair[0]) if spreads else None

    def run_to_run_sd(self, quantity: str) -> float | None:
        """The table's pooled scatter of one run in `quantity` (`runs.run_to_run_sd`)."""
        return run_to_run_sd((p.configuration for p in self.predictions), quantity)

    def points(self) -> list[tuple[str, float, float, str]]:
        """(time, measured, predicted, DeepSpeed build) of every time a configuration both
        measured and predicted: what `plots.predicted_vs_measured` draws."""
        return [(q, p.measured(q), p.predicted[q], p.configuration.first.build)
                for p in self.predictions for q in MEASURED_PHASES
                if p.measured(q) is not None and p.predicted.get(q) is not None]

    @property
    def title(self) -> str:
        return f"{Path(self.source).name} on {self.hardware}"


TABLE_GIVEN_OVERRIDES = {
    "hardware": "--hardware NAME|FILE (hardware.<key> patches its values)",
    "model": "the table's model columns (model.<field> patches them)",
    "data_parallel": "the table's num_gpus",
}
"""`--set` keys whose value a predicted table gives otherwise: the override would replace it
silently while the table and its title still name the table's."""


def _check_table_overrides(overrides: Mapping[str, Any]) -> None:
    for key, instead in TABLE_GIVEN_OVERRIDES.items():
        if key in overrides:
            raise ScenarioError("--set", key, f"a value the rows do not give: the rows take it "
                                f"from {instead}", overrides[key])


def predict(runs: Sequence[MeasuredRun], hardware: str | Path, *,
            overrides: Mapping[str, Any] | None = None, workers: int | None = None,
            source: str = "<runs>", name_prefix: str = "", explain: bool = False,
            refused_rows: Sequence[RefusedRow] = ()) -> PredictOutcome:
    """Simulate each distinct configuration of `runs` on `hardware` (with `overrides`, as
    `--set` gives them, applied to every one) and set it beside its measurements; one that
    zerosim refuses to replay is not simulated but given status `refused` with the refusal,
    naming its row and column (`check_scenarios`; a refused `--set` is an error).
    `explain`: each prediction also says what its phases waited on (`Prediction.waits_on`);
    `refused_rows`: the table's rows `read_runs` could not read as runs, kept in the outcome."""
    import time

    from zerosim.hardware.profile import load_profile
    from zerosim.sweep.runner import open_executor

    started = time.perf_counter()
    _check_table_overrides(overrides or {})
    profile = load_profile(hardware)
    groups = configurations(runs)
    keep_build = sets_fork_options(overrides or {})
    jobs = []
    for configuration in groups:
        run = configuration.first
        rows = ", ".join(str(r.row) for r in configuration.runs)
        tree = run.scenario(hardware, profile=profile, name_prefix=name_prefix,
                            description=f"{source}, row(s) {rows}", keep_build=keep_build,
                            source=source) | {"name": f"{name_prefix}{configuration.name}"}
        jobs.append((configuration, tree["name"], run.nodes(profile.gpus_per_node), tree))
    refusals = check_scenarios(((c, tree) for c, _, _, tree in jobs), overrides or {}, source)
    accepted = [job for job, refusal in zip(jobs, refusals, strict=True) if refusal is None]
    simulated = []
    with open_executor(workers, None, len(accepted)) as (executor, _, where):
        futures = [executor.submit(simulate_tree, tree, dict(overrides or {}),
                                   f"{source} row {c.first.row}", measured=c.was_measured,
                                   explain=explain)
                   for c, _, _, tree in accepted]
        for (configuration, name, nodes, _), future in zip(accepted, futures, strict=True):
            error = future.exception()
            simulated.append(_prediction(configuration, name, nodes,
                                         error if error is not None else future.result()))
    in_order = iter(simulated)
    predictions = [next(in_order) if refusal is None else
                   Prediction(configuration, name, nodes, Status.REFUSED, {}, error=str(refusal))
                   for (configuration, name, nodes, _), refusal in zip(jobs, refusals,
                                                                      strict=True)]
    return PredictOutcome(source, str(hardware), predictions, where,
                          time.perf_counter() - started, refused_rows=list(refused_rows))


COLUMN_NAMES = {"forward": "forward_s", "backward": "backward_s", "update": "update_s",
                "iteration": "iteration_s", PEAK_ALLOCATED: "peak_allocated_GiB",
                PEAK_HOST: "peak_host_GiB", BETWEEN_PHASES: "between_phases_s"}
"""Each quantity in a predictions table, with its unit (seconds per step; GiB, as the measured
tables and DeepSpeed's `see_memory_usage` give memory)."""
PREDICTION_COLUMNS = ("rows", "name", "gpus", "nodes", "build", "bind_cores_to_rank",
                      "empty_cache_each_phase", "status",
                      *(f"{kind}_{COLUMN_NAMES[q]}" for q in WRITTEN_QUANTITIES
                        for kind in ("predicted", "measured")),
                      "predicted_memory_reports_s",
                      *(f"error_{COLUMN_NAMES[q].rpartition('_')[0]}"
                        for q in WRITTEN_QUANTITIES),
                      *(f"spread_{COLUMN_NAMES[q].rpartition('_')[0]}"
                        for q in WRITTEN_QUANTITIES),
                      "error", "oom", "timed_with", "tight",
                      *(f"{WAITS_ON}_{key}" for key in WAITS_ON_KEYS))


def prediction_row(p: Prediction) -> dict[str, Any]:
    """One CSV row: times in seconds per optimizer step, memory in GiB."""
    run = p.configuration.first
    row: dict[str, Any] = {"rows": " ".join(str(r.row) for r in p.configuration.runs),
                           "name": p.scenario_name, "gpus": run.gpus, "nodes": p.nodes,
                           "build": run.build, "bind_cores_to_rank": run.bind_cores_to_rank,
                           "empty_cache_each_phase": run.empties_cache, "status": p.status,
                           "error": p.error, "oom": p.oom, "timed_with": p.timed_with_text,
                           "tight": p.tight,
                           "predicted_memory_reports_s": p.predicted.get(MEMORY_REPORTS),
                           **{f"{WAITS_ON}_{key}": p.waits_on.get(key) for key in WAITS_ON_KEYS}}
    for q in WRITTEN_QUANTITIES:
        scale = GiB if q in MEMORY_QUANTITIES else 1.0
        column = COLUMN_NAMES[q]
        predicted, measured = p.predicted.get(q), p.measured(q)
        row[f"predicted_{column}"] = None if predicted is None else predicted / scale
        row[f"measured_{column}"] = None if measured is None else measured / scale
        row[f"error_{column.rpartition('_')[0]}"] = p.rel_error(q)
        row[f"spread_{column.rpartition('_')[0]}"] = p.configuration.spread(q)
    return row


def refused_row(refused: RefusedRow) -> dict[str, Any]:
    """A row the table could not give as a run, as a CSV row: its number, status `refused`
    and why; nothing predicted."""
    return {"rows": str(refused.row), "status": Status.REFUSED, "error": str(refused.error)}


def outcome_rows(outcome: PredictOutcome) -> list[dict[str, Any]]:
    """Every configuration's row, then every row the table could not give as a run, as
    predictions.csv and `--json` write them."""
    return ([prediction_row(p) for p in outcome.predictions]
            + [refused_row(r) for r in outcome.refused_rows])


def off_repeat_rows(outcome: PredictOutcome) -> list[dict[str, Any]]:
    """`runs_off_their_repeats` of the table as JSON rows: the run's row, the other runs'
    rows, the configuration and each phase's deviation."""
    return [{"row": o.run.row, "others": list(o.others), "name": o.configuration,
             "deviations": o.deviations}
            for o in runs_off_their_repeats(p.configuration for p in outcome.predictions)]


def run_to_run_sd_row(outcome: PredictOutcome) -> dict[str, float | None]:
    """The table's pooled scatter of one run (`PredictOutcome.run_to_run_sd`) per quantity,
    under the quantity's short name (`forward`, `peak_allocated`)."""
    return {COLUMN_NAMES[q].rpartition("_")[0]: outcome.run_to_run_sd(q) for q in QUANTITIES}


def write_predictions(outcome: PredictOutcome, path: Path) -> Path:
    from zerosim.results.folders import write_table

    return write_table(path, PREDICTION_COLUMNS, outcome_rows(outcome))


def predict_frame(runs_table: str | Path, hardware: str | Path, *,
                  overrides: Mapping[str, Any] | Iterable[str] | None = None,
                  workers: int | None = None, explain: bool = False) -> pd.DataFrame:
    """`zerosim predict RUNS.csv --hardware NAME`'s predictions.csv as a DataFrame, nothing
    written: the table read as the command reads it (its warnings raised as warnings, a row it
    cannot read kept as a refused row), every configuration simulated on `hardware` with
    `overrides` (as `--set`), the same columns and values as pandas reads that file."""
    from zerosim.results.folders import table_as_read
    from zerosim.scenario.loader import parse_overrides

    refused: list[RefusedRow] = []
    runs = read_runs(runs_table, refused)
    outcome = predict(runs, hardware, overrides=parse_overrides(overrides), workers=workers,
                      source=str(runs_table), explain=explain, refused_rows=refused)
    return table_as_read(PREDICTION_COLUMNS, outcome_rows(outcome))


ALTERNATIVE_PREDICTION_COLUMNS = ("alternative", *PREDICTION_COLUMNS)
"""`alternatives.csv` of `zerosim predict --alternatives`: a predictions table's columns for
each configuration at each alternative reading, named in the first."""


@dataclass(frozen=True)
class AlternativePredictions:
    """The table predicted at one alternative reading of the profile's data."""

    name: str
    sets: str
    outcome: PredictOutcome


def predict_alternatives(runs: Sequence[MeasuredRun], hardware: str | Path, *,
                         overrides: Mapping[str, Any] | None = None,
                         workers: int | None = None, source: str = "<runs>"
                         ) -> list[AlternativePredictions]:
    """The table predicted at each alternative reading of `hardware`'s data (its
    `alternatives`, but the one `overrides` already runs), as `predict` predicts it."""
    from zerosim.hardware.alternatives import OVERRIDE_KEY
    from zerosim.hardware.profile import load_profile

    fixed = dict(overrides or {})
    chosen = fixed.get(OVERRIDE_KEY)
    return [AlternativePredictions(a.name, a.describe(), predict(
        runs, hardware, overrides=fixed | {OVERRIDE_KEY: a.name}, workers=workers,
        source=source)) for a in load_profile(hardware).alternatives if a.name != chosen]


def write_alternative_predictions(readings: Sequence[AlternativePredictions], path: Path
                                  ) -> Path:
    from zerosim.results.folders import write_table

    return write_table(path, ALTERNATIVE_PREDICTION_COLUMNS,
                       ({"alternative": r.name, **prediction_row(p)}
                        for r in readings for p in r.outcome.predictions))


def rms_row(outcome: PredictOutcome) -> dict[str, float | None]:
    """Each measured quantity's rms error over the table, by its short name."""
    return {COLUMN_NAMES[q].rpartition("_")[0]: outcome.rms(q) for q in MEASURED_PHASES}
