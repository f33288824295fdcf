"""`zerosim tune`: the fastest configuration of a scenario that fits.

The search crosses the knobs a user weighs (ZeRO stage, what is offloaded, micro-batch size and
gradient accumulation for the scenario's global batch, `reduce_bucket_size`, `sub_group_size`,
the Twin-Flow ratio, activation checkpointing (its checkpoints in host memory too), Arctic
Long Sequence Training's tiled loss and tiled MLP where the release and the model take them,
the interleaved update's gap on a build of the
Deep Optimizer States fork, cores bound to each rank on a node of several NUMA domains, the
OpenMP threads per rank where the default pools oversubscribe the node, ZeRO-3 leaf modules
by granularity on DeepSpeed 0.16.0+, ZeRO++'s hpZ, qwZ and qgZ and MiCS's shard groups where
the ranks span nodes and,
when freed, the study's what-ifs, the master precision, Liger-Kernel and Ulysses's group size,
the global batch of sequences held), keeps
only the combinations the engine replays, drops those whose memory floor already exceeds a
device (model states plus one micro-batch's saved activations on the GPU, model states of
every rank of a node in host memory: the engine would run out of memory at or before the end
of the first forward), and simulates the rest on the sweep executors; an NVMe offload waits
for its host-memory twin and runs only if that did not fit (otherwise it moves the same states
through a slower path), and so do checkpoints in host memory for their twin on the GPU and a
tiled call for its twin without it.
Each knob is free (searched) or fixed (the scenario's own value).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from itertools import product
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zerosim.errors import ZerosimError
from zerosim.results.summary import PEAK_ERROR_FRACTION, tight_memory, tight_text
from zerosim.scenario.deepspeed import SEQUENCE_PARALLEL_KEY
from zerosim.units import ordered_sum
from zerosim.vocabulary import Status

if TYPE_CHECKING:
    from zerosim.scenario import Scenario

Z = "deepspeed.zero_optimization."
KNOBS = ("stage", "offload", "micro_batch", "reduce_bucket_size", "sub_group_size", "ratio",
         "checkpointing", "gap", "binding", "threads", "leaves", "zero_plus_plus", "mics",
         "tiling", "what_if", "master", "liger", "sequence_parallel")
FREE_BY_DEFAULT = ("stage", "offload", "micro_batch", "reduce_bucket_size", "sub_group_size",
                   "ratio", "checkpointing", "gap", "binding", "threads", "leaves",
                   "zero_plus_plus", "mics", "tiling")
STAGES = (0, 1, 2, 3)
OFFLOADS = ("none", "params", "cpu", "cpu+params")
"""What is searched: nothing offloaded, the params alone (the optimizer on the GPU), the
optimizer, optimizer and params (to host memory)."""
PARAMS_ALONE = "params"
NVME_OFFLOADS = ("nvme", "nvme+params")
"""Also searched when the hardware profile has NVMe drives (simulated only where the CPU twin
did not fit)."""
NVME_PATH = "/local_nvme"
"""The `nvme_path` a searched NVMe offload names (zerosim touches no file system)."""
REDUCE_BUCKET_SIZES = (2e8, 5e8, 1e9)
SUB_GROUP_SIZES = (1e8, 1e9)
RATIOS = (1.0, 0.5)
CHECKPOINTS_IN_HOST = "cpu"
"""The `checkpointing` knob's value for activation checkpointing with each checkpoint in host
memory (`runtime.checkpoint_in_cpu`: Megatron-DeepSpeed's `--checkpoint-in-cpu`, Arctic
Long Sequence Training's patch of `torch.utils.checkpoint`), searched beside off and on."""
NO_TILING = "none"
TILED_PARTS = ("loss", "mlp")
"""The `tiling` knob's value without a tiled call, and its parts: `loss` (the logits and the
loss over slices, `runtime.tiled_loss_shards`), `mlp` (`runtime.tiled_mlp_shards`), joined by
`+`, each at `auto` slices or, as a scenario gives it, a count after the part's name
(`mlp4`); searched where the release and the model take the part (`tiling_choices`);
elsewhere the knob is None and sets nothing."""
GAPS = (0, 2, 3, 4)
"""The fork's `prefetch_optimizer_gap` searched on one of its builds (0: no interleaved
update); elsewhere the knob keeps 0."""
BINDINGS = (False, True)
"""`runtime.bind_cores_to_rank`, searched on a node of several NUMA domains for the offloaded
configurations (whose host work it moves); elsewhere the knob keeps the scenario's value."""
DEFAULT_THREADS = 0
"""The `threads` knob's value for the default pool (`runtime.cpu_threads_per_rank` unset): one
thread per physical core, or the rank's share of them when bound. The knob also tries the count
that fills the node's hardware threads without oversubscribing them (`OMP_NUM_THREADS`), for
the offloaded configurations, where the default pools oversubscribe the node."""
WHAT_IFS = ("none", "overlap_copy_back", "buffer_boundary_grads", "gpu_update_every")
MASTERS = ("fp32", "bf16", "bf16+moments", "fp16", "fp16+moments")
"""The optimizer's master params and gradients, fp32 or in the training's 16-bit dtype
(`bf16.bf16_master_weights_and_grads`, `fp16.fp16_master_weights_and_grads`), and with 16-bit
ones the Adam moments too (`bf16_optimizer_states`; DeepSpeedCPUAdam's `fp32_optimizer_states`
off): searched with `--free master` only (they change the numerics), under 16-bit training on
DeepSpeed 0.18.3+, fp32 and the training dtype's (`masters`); elsewhere the knob is None and
sets nothing."""
NO_LEAVES = 0
"""The `leaves` knob's value without leaves by granularity; its others are the
`module_granularity_threshold` values that make distinct sets of ZeRO-3 leaves of the model
(`plan.granularity_thresholds`), searched at stage 3 on DeepSpeed 0.16.0+; elsewhere the knob
is None and sets nothing."""
NO_ZERO_PLUS_PLUS = "none"
"""The `zero_plus_plus` knob's value without ZeRO++; its others join with `+` the parts `hpzG`
(secondary partitions over groups of G ranks, G a node's GPUs), `qwz` (int8 all-gathers) and
`qgz` (int4 all-to-all gradient reductions): `qwz`, `qgz`, `hpzG`, `hpzG+qwz` and
`hpzG+qwz+qgz`, searched at stage 3 on DeepSpeed 0.10.0+ (hpZ from 0.13.2, where zerosim
replays it; qgZ where whole nodes hold the ranks) when the ranks span nodes, where the
all-gathers and reductions cross the network; elsewhere the knob is None and sets nothing."""
NO_MICS = "none"
"""The `mics` knob's value without MiCS; its others `micsS` (shard groups of S consecutive
ranks) and `micsSh` (the same with the hierarchical all-gather), searched at stage 3 with
nothing offloaded (with more than one group DeepSpeed all-reduces the gradient partitions on
the GPU, and offloading keeps them in host memory) and without ZeRO++, on DeepSpeed 0.9.2+,
where the ranks span whole nodes (`mics_choices`); elsewhere the knob is None and sets
nothing."""
GPU_UPDATE_EVERY = 4
TIE_FRACTION = 0.005
"""Iteration times closer than this fraction are reported as a tie."""
MEMORY_SLACK_BYTES = 2**20
"""A floor above capacity by less than this is simulated anyway (rounding of allocations)."""
COLUMNS = ("rank", "status", "stage", "offload", "micro_batch", "gradient_accumulation",
           "reduce_bucket_size", "sub_group_size", "ratio", "checkpointing", "gap", "binding",
           "threads", "leaves", "zero_plus_plus", "mics", "tiling", "what_if", "master",
           "liger", "sequence_parallel", "iteration_s",
           "tokens_per_s", "peak_hbm_GiB", "peak_host_GiB", "note")


class TuneError(ZerosimError):
    """A knob name that does not exist, or one both fixed and freed."""


@dataclass(frozen=True)
class Config:
    """One combination of knob values."""

    stage: int
    offload: str
    micro_batch: int
    gradient_accumulation: int
    reduce_bucket_size: float
    sub_group_size: float
    ratio: float
    what_if: str
    checkpointing: bool | str = False
    """Activation checkpointing: off, on, or `CHECKPOINTS_IN_HOST`."""
    gap: int = 0
    """The fork's interleaved update: every gap-th sub-group on the GPU (0: off)."""
    binding: bool = False
    """Each rank's threads and pages on its part of the node (`runtime.bind_cores_to_rank`)."""
    threads: int = DEFAULT_THREADS
    """OpenMP threads per rank (`runtime.cpu_threads_per_rank`; 0: the default pool)."""
    master: str | None = None
    """One of `MASTERS`, or None where the release or the precision has no such choice."""
    leaves: int | None = None
    """`module_granularity_threshold` (0: none), or None where the release does not read it."""
    zero_plus_plus: str | None = None
    """`NO_ZERO_PLUS_PLUS` or ZeRO++'s parts (see there), or None where the release does not
    read ZeRO++'s keys."""
    mics: str | None = None
    """`NO_MICS`, `micsS` or `micsSh` (see there), or None where the release does not read
    MiCS's keys."""
    tiling: str | None = None
    """`NO_TILING` or tiled parts (`TILED_PARTS`), or None where neither can run."""
    liger: bool | None = None
    """Liger-Kernel's kernels (`runtime.liger_kernel`), or None where the stack or the model
    cannot run them (`liger_refusal`)."""
    sequence_parallel: int | None = None
    """Ulysses's group size (`deepspeed.sequence_parallel_size`; 1: off), or None where no size
    above 1 runs. Searched with `--free sequence_parallel` only, over the sizes that divide the
    ranks and that the release, the stack and the model take (`sequence_parallel_choices`),
    the global batch of sequences held: groups of S ranks make ranks / S data-parallel groups,
    each training S / S0 times the scenario's sequences a step (S0 its own size); a size where
    that is not a whole number, or not divided by the micro-batch, is skipped."""

    def tiled(self, part: str) -> int | str | None:
        """The part's slices: a count, `auto`, or None (not tiled)."""
        for given in (self.tiling or NO_TILING).split("+"):
            if given.startswith(part):
                count = given.removeprefix(part)
                return int(count) if count else "auto"
        return None

    @property
    def mics_shard_size(self) -> int:
        """MiCS's shard group size (-1: off, DeepSpeed's default)."""
        if self.mics in (None, NO_MICS):
            return -1
        return int(self.mics.removeprefix("mics").removesuffix("h"))

    @property
    def mics_hierarchical(self) -> bool:
        return self.mics_shard_size > 0 and self.mics.endswith("h")

    @property
    def hpz_group(self) -> int:
        """hpZ's group size (1: off)."""
        hpz = (self.zero_plus_plus or "").split("+")[0]
        return int(hpz.removeprefix("hpz")) if hpz.startswith("hpz") else 1

    @property
    def quantized_weights(self) -> bool:
        return "qwz" in (self.zero_plus_plus or "").split("+")

    @property
    def quantized_gradients(self) -> bool:
        return "qgz" in (self.zero_plus_plus or "").split("+")

    def devices(self) -> tuple[str, str]:
        """Where the optimizer and the 16-bit params live (`offload_*.device`)."""
        if self.offload == PARAMS_ALONE:
            return "none", "cpu"
        optimizer, _, params = self.offload.partition("+")
        return optimizer, optimizer if params else "none"

    def overrides(self) -> dict[str, Any]:
        optimizer, params = self.devices()
        out: dict[str, Any] = {
            Z + "stage": self.stage,
            Z + "offload_optimizer.device": optimizer,
            Z + "offload_param.device": params,
            "deepspeed.train_micro_batch_size_per_gpu": self.micro_batch,
            "deepspeed.gradient_accumulation_steps": self.gradient_accumulation,
            Z + "reduce_bucket_size": self.reduce_bucket_size,
            Z + "sub_group_size": self.sub_group_size,
            Z + "offload_optimizer.ratio": self.ratio,
            "what_if.overlap_copy_back": self.what_if == "overlap_copy_back",
            "what_if.buffer_boundary_grads": self.what_if == "buffer_boundary_grads",
            "what_if.gpu_update_every": GPU_UPDATE_EVERY if self.what_if == "gpu_update_every"
            else 0,
            "activation_checkpointing": bool(self.checkpointing),
            Z + "offload_optimizer.prefetch_optimizer": self.gap > 0,
            Z + "offload_optimizer.prefetch_optimizer_gap": self.gap,
            "runtime.bind_cores_to_rank": self.binding,
            "runtime.cpu_threads_per_rank": self.threads or None,
        }
        if params != "none":
            out[Z + "offload_param.pin_memory"] = True
        if self.master is not None:
            dtype = self.master.removesuffix("+moments")
            moments = self.master.endswith("+moments")
            out["deepspeed.bf16.bf16_master_weights_and_grads"] = dtype == "bf16"
            out["deepspeed.bf16.bf16_optimizer_states"] = dtype == "bf16" and moments
            out["deepspeed.fp16.fp16_master_weights_and_grads"] = dtype == "fp16"
            if optimizer != "none":  # DeepSpeedCPUAdam's own flag (FusedAdam has none)
                out["deepspeed.optimizer.params.fp32_optimizer_states"] = not moments
        if self.leaves is not None:
            out[Z + "module_granularity_threshold"] = self.leaves
        if self.zero_plus_plus is not None:
            out[Z + "zero_hpz_partition_size"] = self.hpz_group
            out[Z + "zero_quantized_weights"] = self.quantized_weights
            out[Z + "zero_quantized_gradients"] = self.quantized_gradients
        if self.mics is not None:
            out[Z + "mics_shard_size"] = self.mics_shard_size
            out[Z + "mics_hierarchical_params_gather"] = self.mics_hierarchical
        out["runtime.checkpoint_in_cpu"] = self.checkpointing == CHECKPOINTS_IN_HOST
        if self.tiling is not None:
            out["runtime.tiled_loss_shards"] = self.tiled("loss")
            out["runtime.tiled_mlp_shards"] = self.tiled("mlp")
        if self.liger is not None:
            out["runtime.liger_kernel"] = self.liger
        if self.sequence_parallel is not None:
            out[SEQUENCE_PARALLEL_KEY] = self.sequence_parallel
        for section, device in (("offload_optimizer", optimizer), ("offload_param", params)):
            if device == "nvme":
                out[Z + f"{section}.nvme_path"] = NVME_PATH
        return out

    def cpu_twin(self) -> Config:
        """The same configuration with host memory in place of NVMe."""
        return replace(self, offload=self.offload.replace("nvme", "cpu"))

    def twin(self) -> Config | None:
        """The configuration this one only slows down wherever that one fits, which it waits
        for: an NVMe offload's host-memory twin (NVMe only adds swaps to the same work),
        checkpoints in host memory's twin on the GPU (they only add copies), and a tiled
        call's twin without its last part (a tiled MLP runs its forward again, a tiled loss
        the same products in more pieces); None for the others."""
        if "nvme" in self.offload:
            return self.cpu_twin()
        if self.checkpointing == CHECKPOINTS_IN_HOST:
            return replace(self, checkpointing=True)
        if self.tiling not in (None, NO_TILING):
            parts = self.tiling.split("+")[:-1]
            return replace(self, tiling="+".join(parts) or NO_TILING)
        return None

    def describe(self) -> str:
        optimizer, params = self.devices()
        if optimizer == "none":
            mode = "CPU params, GPU optimizer" if params != "none" else "no offload"
        else:
            mode = f"{optimizer.upper()} optimizer" + (" + params" if params != "none" else "")
        parts = [f"ZeRO-{self.stage}, {mode}",
                 f"micro-batch {self.micro_batch}x{self.gradient_accumulation}",
                 f"buckets {_short(self.reduce_bucket_size)}"]
        if self.stage == 3 and self.offload != "none":
            parts.append(f"sub-groups {_short(self.sub_group_size)}")
        if self.ratio < 1:
            parts.append(f"Twin-Flow {self.ratio:g}")
        if self.checkpointing == CHECKPOINTS_IN_HOST:
            parts.append("checkpointing, checkpoints in host memory")
        elif self.checkpointing:
            parts.append("checkpointing")
        if self.gap:
            parts.append(f"interleaved update, gap {self.gap}")
        if self.binding:
            parts.append("cores bound")
        if self.threads:
            parts.append(f"{self.threads} threads per rank")
        if self.leaves:
            parts.append(f"leaf modules at granularity {_short(self.leaves)}")
        if self.hpz_group > 1:
            parts.append(f"hpZ over {self.hpz_group} ranks")
        if self.quantized_weights:
            parts.append("qwZ")
        if self.quantized_gradients:
            parts.append("qgZ")
        if self.mics_shard_size > 0:
            parts.append(f"MiCS over {self.mics_shard_size} ranks"
                         + (", hierarchical" if self.mics_hierarchical else ""))
        for part, what in (("loss", "tiled loss"), ("mlp", "tiled MLP")):
            if (slices := self.tiled(part)) is not None:
                parts.append(what + ("" if slices == "auto" else f" ({slices} slices)"))
        if self.liger:
            parts.append("Liger-Kernel")
        if (self.sequence_parallel or 1) > 1:
            parts.append(f"Ulysses over {self.sequence_parallel} ranks")
        if self.what_if != "none":
            parts.append(self.what_if)
        if self.master not in (None, "fp32"):
            dtype = self.master.removesuffix("+moments")
            parts.append(f"{dtype} master" + (" and moments" if self.master != dtype else ""))
        return ", ".join(parts)


def _short(value: float) -> str:
    """5e8, 1.5e9: a size as a DeepSpeed config writes it."""
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa.removesuffix('.0')}e{int(exponent)}"


def replayed(config: Config) -> bool:
    """Whether the engine replays the combination (and DeepSpeed accepts it)."""
    if config.stage == 0 and config.offload != "none":
        return False
    if config.offload != "none" and config.offload != "cpu" and config.stage != 3:
        return False  # parameter or NVMe offload: ZeRO-3 only
    offloaded3 = config.stage == 3 and config.offload not in ("none", PARAMS_ALONE)
    if config.ratio < 1 and not (offloaded3 and config.offload == "cpu"):
        return False
    if config.gap and not (offloaded3 and config.offload == "cpu" and config.ratio == 1
                           and config.what_if in ("none", "buffer_boundary_grads")):
        return False
    if config.master not in (None, "fp32") and not _replays_low_precision_master(config):
        return False
    if config.leaves and config.stage != 3:
        return False
    if config.zero_plus_plus not in (None, NO_ZERO_PLUS_PLUS) and config.stage != 3:
        return False
    if config.mics_shard_size > 0 and (config.stage != 3 or config.offload != "none"
                                       or config.zero_plus_plus not in (None,
                                                                        NO_ZERO_PLUS_PLUS)):
        return False
    if config.liger and config.tiled("loss") is not None:
        return False  # Liger's fused loss replaces the call the tiled loss slices
    if (config.sequence_parallel or 1) > 1 and (
            config.gap or config.mics_shard_size > 0
            or config.zero_plus_plus not in (None, NO_ZERO_PLUS_PLUS)):
        return False  # `support._ulysses_is_replayed`
    return config.what_if == "none" or (offloaded3 and "nvme" not in config.offload)


def _replays_low_precision_master(config: Config) -> bool:
    """16-bit master params: the optimizer in host memory (the params beside it at most), or,
    bf16 ones only, on the GPU with bf16 moments and the params there too; no NVMe, no
    interleaved update, no what-if (`support._low_precision_master_is_replayed`, and
    DeepSpeed's own refusals: fp16 master weights want the optimizer offloaded)."""
    if config.stage == 0 or "nvme" in config.offload or config.gap or config.what_if != "none":
        return False
    if config.offload == "none":
        return config.master == "bf16+moments"
    return config.offload != PARAMS_ALONE


def as_given(scenario: Scenario) -> Config:
    """The scenario's own knob values."""
    ds, what_if = scenario.deepspeed, scenario.what_if
    offload = ds.offload_optimizer.device
    if ds.offload_param.device != "none":
        offload = PARAMS_ALONE if offload == "none" else offload + "+params"
    chosen = "none"
    for name in WHAT_IFS[1:]:
        if getattr(what_if, name):
            chosen = name
    o = ds.offload_optimizer
    return Config(ds.stage, offload, ds.train_micro_batch_size_per_gpu,
                  ds.gradient_accumulation_steps, float(ds.reduce_bucket_size),
                  float(ds.sub_group_size), o.ratio, chosen,
                  CHECKPOINTS_IN_HOST if (scenario.activation_checkpointing
                                          and scenario.runtime.checkpoint_in_cpu)
                  else scenario.activation_checkpointing,
                  o.prefetch_optimizer_gap if o.prefetch_optimizer else 0,
                  scenario.runtime.bind_cores_to_rank,
                  scenario.runtime.cpu_threads_per_rank or DEFAULT_THREADS,
                  _master(scenario),
                  ds.leaves.granularity_threshold
                  if scenario.behaviours.module_granularity_threshold else None,
                  _zero_plus_plus(scenario), _mics(scenario), _tiling(scenario),
                  _liger(scenario), _sequence_parallel(scenario))


def _tiling(scenario: Scenario) -> str | None:
    """The scenario's `tiling` knob value; None where no tiled call can run."""
    runtime = scenario.runtime
    given = [part + ("" if slices == "auto" else str(slices))
             for part, slices in (("loss", runtime.tiled_loss_shards),
                                  ("mlp", runtime.tiled_mlp_shards)) if slices is not None]
    if not given and not tiling_choices(scenario):
        return None
    return "+".join(given) or NO_TILING


def _liger(scenario: Scenario) -> bool | None:
    """The scenario's `liger` knob value; None where Liger-Kernel cannot run."""
    from zerosim.scenario.support import liger_refusal

    if scenario.runtime.liger_kernel:
        return True
    return None if liger_refusal(scenario) else False


def _sequence_parallel(scenario: Scenario) -> int | None:
    """The scenario's `sequence_parallel` knob value; None where no group size above 1 can
    run."""
    size = scenario.deepspeed.sequence_parallel_size
    return size if size > 1 or len(sequence_parallel_choices(scenario)) > 1 else None


def sequence_parallel_choices(scenario: Scenario) -> list[int]:
    """The Ulysses group sizes the `sequence_parallel` knob tries: 1 and every divisor of the
    ranks the release, the stack and the model take (`support.sequence_parallel_refusal`)."""
    from zerosim.scenario.support import sequence_parallel_refusal

    return [size for size in _divisors(scenario.data_parallel)
            if size == 1 or not sequence_parallel_refusal(scenario, size)]


def tiling_choices(scenario: Scenario) -> list[str]:
    """What the `tiling` knob tries: each tiled part the release and the model take
    (`support.tiling_refusal`), and both together, at `auto` slices."""
    from zerosim.scenario.support import tiling_refusal

    parts = [part for part in TILED_PARTS if not tiling_refusal(scenario, part)]
    return parts + (["+".join(parts)] if len(parts) > 1 else [])


def _mics(scenario: Scenario) -> str | None:
    """The scenario's `mics` knob value; None where its release reads no MiCS key."""
    if not scenario.behaviours.mics:
        return None
    settings = scenario.deepspeed.mics
    if settings.shard_size <= 0:
        return NO_MICS
    return f"mics{settings.shard_size}" + ("h" if settings.hierarchical else "")


def mics_choices(scenario: Scenario) -> list[str]:
    """What the `mics` knob tries where whole nodes hold the ranks, on two nodes or more:
    shard groups of whole nodes that divide the ranks, flat where fewer than all of them (a
    group of every rank gathers as ZeRO-3 does), hierarchical where they span two nodes or
    more and split evenly over them (`create_mics_comm_groups`), every rank included."""
    world, per_node = scenario.data_parallel, scenario.hardware.gpus_per_node
    if not scenario.behaviours.mics or world % per_node or world <= per_node:
        return []
    sizes = [per_node * nodes for nodes in range(1, world // per_node + 1)
             if world % (per_node * nodes) == 0]
    flat = [f"mics{size}" for size in sizes if size < world]
    return flat + [f"mics{size}h" for size in sizes if size >= 2 * per_node]


def _zero_plus_plus(scenario: Scenario) -> str | None:
    """The scenario's `zero_plus_plus` knob value; None where its release reads no ZeRO++
    key."""
    if not scenario.behaviours.zero_plus_plus:
        return None
    settings = scenario.deepspeed.zero_plus_plus
    group = settings.hpz_group(scenario.data_parallel)
    parts = ([f"hpz{group}"] if group > 1 else []) + (["qwz"] if settings.quantized_weights
                                                       else [])
    parts += ["qgz"] if settings.quantized_gradients else []
    return "+".join(parts) or NO_ZERO_PLUS_PLUS


def zero_plus_plus_choices(scenario: Scenario) -> list[str]:
    """What the `zero_plus_plus` knob tries: where the ranks span nodes, qwZ; where whole nodes
    hold them (DeepSpeed's all-to-all groups and hpZ's groups of a node need them), qgZ, and
    from 0.13.2 hpZ with a group per node, alone, with qwZ and with both (ZeRO++ whole); none
    on one node (NVLink carries the collectives there, and hpZ's group would be every
    rank)."""
    hardware, behaviours = scenario.hardware, scenario.behaviours
    world, per_node = scenario.data_parallel, hardware.gpus_per_node
    if not behaviours.zero_plus_plus or world <= per_node:
        return []
    if world % per_node:
        return ["qwz"]
    hpz = f"hpz{per_node}"
    return ["qwz", "qgz", *([hpz, f"{hpz}+qwz", f"{hpz}+qwz+qgz"]
                            if behaviours.hpz_secondary_by_presence else [])]


def _master(scenario: Scenario) -> str | None:
    """The scenario's `MASTERS` value; None where its release or its precision has no 16-bit
    master params to choose."""
    ds = scenario.deepspeed
    if ds.dtype == "fp32" or not scenario.behaviours.low_precision_master_weights:
        return None
    if not ds.low_precision_master:
        return "fp32"
    moments = "+moments" if ds.optimizer_state_dtype != "fp32" else ""
    return f"{ds.master_dtype}{moments}"


def masters(base: Config, training: str) -> list[str | None]:
    """The master precisions a search tries: fp32 and the `training` dtype's, where the
    scenario has the choice (`base.master` not None)."""
    if base.master is None:
        return [None]
    return [m for m in MASTERS if m == "fp32" or m.startswith(training)]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def free_knobs(free: Iterable[str] = (), fix: Iterable[str] = ()) -> frozenset[str]:
    free, fix = set(free), set(fix)
    for option, names in (("--free", free), ("--fix", fix)):
        for name in sorted(names):
            if name not in KNOBS:
                raise TuneError(f"{option} {name}: expected one of {', '.join(KNOBS)}, got "
                                f"{name!r}")
    if free & fix:
        both = sorted(free & fix)[0]
        raise TuneError(f"--fix {both}: expected a knob not also freed, got {both!r}, given to "
                        "--free too")
    return frozenset((set(FREE_BY_DEFAULT) | free) - fix)


def candidates(base: Config, free: frozenset[str], *, nvme: bool = False,
               fork: bool = False, numa: bool = False, filling_threads: int = 0,
               thresholds: Iterable[int] = (), training: str = "bf16",
               zero_plus_plus: Iterable[str] = (), mics: Iterable[str] = (),
               tilings: Iterable[str] = (), sequence_parallel: Iterable[int] = ()
               ) -> list[Config]:
    """Every replayed combination of the free knobs' values (fixed ones keep `base`'s), the
    scenario as given first; NVMe offloads too when `nvme` (the profile has drives), the
    interleaved update's gaps when `fork` (a Deep Optimizer States build), bound and unbound
    ranks when `numa` (the node has several NUMA domains), the default pool and
    `filling_threads` per rank when that is given (the default pools oversubscribe the node),
    no leaves and each of `thresholds` where the release reads the granularity threshold,
    none and each of `zero_plus_plus` where the release reads ZeRO++'s keys, none and each of
    `mics` where it reads MiCS's, none and each of `tilings` where a tiled call can run, the
    master precisions of the `training` dtype, checkpointing with its checkpoints in host
    memory, and each of the `sequence_parallel` group sizes, the global batch held
    (`Config.sequence_parallel`)."""
    per_gpu = base.micro_batch * base.gradient_accumulation
    offloads = [*OFFLOADS, *(NVME_OFFLOADS if nvme else ())]
    values: dict[str, list[Any]] = {
        "stage": list(STAGES) if "stage" in free else [base.stage],
        "offload": offloads if "offload" in free else [base.offload],
        "micro_batch": [],
        "reduce_bucket_size": (sorted({*REDUCE_BUCKET_SIZES, base.reduce_bucket_size})
                               if "reduce_bucket_size" in free else [base.reduce_bucket_size]),
        "sub_group_size": (sorted({*SUB_GROUP_SIZES, base.sub_group_size})
                           if "sub_group_size" in free else [base.sub_group_size]),
        "ratio": sorted({*RATIOS, base.ratio}, reverse=True) if "ratio" in free else [base.ratio],
        "what_if": list(WHAT_IFS) if "what_if" in free else [base.what_if],
        "checkpointing": (list(dict.fromkeys([False, True, CHECKPOINTS_IN_HOST,
                                               base.checkpointing]))
                          if "checkpointing" in free else [base.checkpointing]),
        "gap": sorted({*GAPS, base.gap}) if "gap" in free and fork else [base.gap],
        "binding": list(BINDINGS) if "binding" in free and numa else [base.binding],
        "threads": (sorted({DEFAULT_THREADS, filling_threads, base.threads})
                    if "threads" in free and filling_threads else [base.threads]),
        "master": masters(base, training) if "master" in free else [base.master],
        "leaves": (sorted({NO_LEAVES, *thresholds, base.leaves})
                   if "leaves" in free and base.leaves is not None else [base.leaves]),
        "zero_plus_plus": (list(dict.fromkeys([NO_ZERO_PLUS_PLUS, *zero_plus_plus,
                                               base.zero_plus_plus]))
                           if "zero_plus_plus" in free and base.zero_plus_plus is not None
                           else [base.zero_plus_plus]),
        "mics": (list(dict.fromkeys([NO_MICS, *mics, base.mics]))
                 if "mics" in free and base.mics is not None else [base.mics]),
        "tiling": (list(dict.fromkeys([NO_TILING, *tilings, base.tiling]))
                   if "tiling" in free and base.tiling is not None else [base.tiling]),
        "liger": ([False, True] if "liger" in free and base.liger is not None
                  else [base.liger]),
    }
    sizes = (list(dict.fromkeys([base.sequence_parallel, *sequence_parallel]))
             if "sequence_parallel" in free and base.sequence_parallel is not None
             else [base.sequence_parallel])
    found = [base]
    for size in sizes:
        per_group = _sequences_per_group(per_gpu, base.sequence_parallel, size)
        if per_group is None:
            continue
        values["micro_batch"] = [micro for micro in (
            _divisors(per_group) if "micro_batch" in free else [base.micro_batch])
            if per_group % micro == 0]
        for (stage, offload, micro, bucket, sub_group, ratio, what_if, checkpointing, gap,
             binding, threads, master, leaves, zero_plus_plus_value, mics_value, tiling,
             liger) in product(*values.values()):
            config = Config(stage, offload, micro, per_group // micro, bucket, sub_group, ratio,
                            what_if, checkpointing, gap, binding, threads, master, leaves,
                            zero_plus_plus_value, mics_value, tiling, liger, size)
            if replayed(config) and _matters(config, base):
                found.append(config)
    return list(dict.fromkeys(found))


def _sequences_per_group(per_gpu: int, given: int | None, size: int | None) -> int | None:
    """Sequences each data-parallel group trains per step at Ulysses group size `size`, where
    the scenario's `given` size trains `per_gpu` (the global batch held); None where that is
    not a whole number."""
    given, size = given or 1, size or 1
    if per_gpu * size % given:
        return None
    return per_gpu * size // given


def _matters(config: Config, base: Config) -> bool:
    """Sub-group size only changes an offloaded ZeRO-3 step, binding and the threads per rank
    only an offloaded run's host work, leaves only ZeRO-3's hooks, ZeRO++ only ZeRO-3's
    fetches: elsewhere keep the base value (ZeRO++ none), so that equal runs are not
    simulated twice."""
    if (config.offload in ("none", PARAMS_ALONE)
            and (config.binding, config.threads) != (base.binding, base.threads)):
        return False
    if config.stage != 3 and config.leaves != base.leaves:
        return False
    if config.stage != 3 and config.zero_plus_plus not in (None, NO_ZERO_PLUS_PLUS):
        return False
    if not (config.stage == 3 and config.offload != "none"):
        return config.sub_group_size == base.sub_group_size
    return True


def memory_floor(scenario: Scenario) -> tuple[float, float]:
    """Bytes the engine must hold at the end of the first forward: on one GPU (model states
    and the micro-batch's saved activations) and in one node's host memory (every rank's
    model states)."""
    from zerosim.engine.plan import plan_of
    from zerosim.engine.states import model_states, node_holdings
    from zerosim.vocabulary import DeviceKind

    plan = plan_of(scenario)
    states = model_states(scenario.deepspeed, plan, scenario.hardware, scenario.behaviours,
                          scenario.stack)
    gpu = ordered_sum(h.nbytes for h in states if h.device == DeviceKind.GPU)
    host = ordered_sum(h.nbytes for h in states if h.device == DeviceKind.HOST)
    node = ordered_sum(h.nbytes for h in node_holdings(scenario.hardware))
    activations = ordered_sum(m.saved_bytes for m in plan.modules)
    return gpu + activations, host * scenario.ranks_on_fullest_node + node


def prune_reason(scenario: Scenario) -> str:
    """Why the configuration cannot fit (empty when it may)."""
    gpu, host = memory_floor(scenario)
    profile = scenario.hardware
    if gpu > profile.hbm_bytes + MEMORY_SLACK_BYTES:
        return f"HBM floor {gpu / 2**30:.1f} GiB > {profile.hbm_bytes / 2**30:.1f} GiB"
    if host > profile.host_memory_bytes + MEMORY_SLACK_BYTES:
        return f"host floor {host / 2**30:.1f} GiB > {profile.host_memory_bytes / 2**30:.1f} GiB"
    return ""


@dataclass
class TuneOutcome:
    scenario: Scenario
    rows: list[dict[str, Any]]
    """Ranked: fitting configurations by iteration time, then the others."""
    simulated: int = 0
    pruned: int = 0
    wall_s: float = 0.0
    executor: str = ""
    files: list[Path] = field(default_factory=list)

    @property
    def best(self) -> dict[str, Any] | None:
        return self.rows[0] if self.rows and self.rows[0]["status"] == Status.OK else None


def _row(config: Config, status: str, note: str = "") -> dict[str, Any]:
    return {"status": status, "stage": config.stage, "offload": config.offload,
            "micro_batch": config.micro_batch,
            "gradient_accumulation": config.gradient_accumulation,
            "reduce_bucket_size": config.reduce_bucket_size,
            "sub_group_size": config.sub_group_size, "ratio": config.ratio,
            "checkpointing": config.checkpointing, "gap": config.gap,
            "binding": config.binding, "threads": config.threads,
            "leaves": "" if config.leaves is None else config.leaves,
            "zero_plus_plus": config.zero_plus_plus or "",
            "mics": config.mics or "",
            "tiling": config.tiling or "",
            "what_if": config.what_if,
            "master": config.master or "",
            "liger": "" if config.liger is None else config.liger,
            "sequence_parallel": ("" if config.sequence_parallel is None
                                  else config.sequence_parallel),
            "iteration_s": None, "tokens_per_s": None,
            "peak_hbm_GiB": None, "peak_host_GiB": None, "note": note, "config": config,
            "phases_s": {}, "tight": ()}


def _simulated(row: dict[str, Any], result: Mapping[str, Any]) -> None:
    row["status"] = result.get("status", Status.ERROR)
    row["note"] = result.get("error") or ""
    if row["status"] == Status.OOM and result.get("oom"):
        oom = json.loads(result["oom"])
        row["note"] = f"out of memory on {oom['device']}: {oom['allocation']}"
    iteration = result.get("iteration_s")
    if row["status"] == Status.OK and iteration:
        row["iteration_s"] = iteration
        row["tokens_per_s"] = result["tokens_per_s"]
    row["peak_hbm_GiB"] = result.get("peak_hbm_GiB")
    row["peak_host_GiB"] = result.get("peak_host_GiB")
    row["tight"] = tuple(what for what, _, _ in tight_memory(dict(result)))
    if row["tight"]:
        row["note"] = (f"tight: {tight_text(dict(result))}, within {PEAK_ERROR_FRACTION:.0%}: "
                       "a real run may not fit")
    row["phases_s"] = {k.removeprefix("phases_s."): v for k, v in result.items()
                       if k.startswith("phases_s.")}


def tune(scenario_path: str | Path, *, overrides: Mapping[str, Any] | None = None,
         free: Iterable[str] = (), fix: Iterable[str] = (), workers: int | None = None,
         dask: str | None = None, out_dir: str | Path | None = None,
         on_progress: Callable[[int, int], None] | None = None) -> TuneOutcome:
    """Search the free knobs of the scenario at `scenario_path`; write `tune.csv` to
    `out_dir` when given."""
    from zerosim.engine.plan import granularity_thresholds
    from zerosim.errors import ScenarioError
    from zerosim.export import write_configuration
    from zerosim.scenario import load_scenario
    from zerosim.sweep.runner import drive, open_executor
    from zerosim.sweep.spec import Point, point_id

    started = time.perf_counter()
    fixed = dict(overrides or {})
    scenario = load_scenario(scenario_path, fixed)
    if scenario.deepspeed.zenflow is not None:
        raise TuneError(f"{scenario.source}: deepspeed.zero_optimization.zenflow: expected a "
                        "scenario without ZenFlow (its update_interval is the run's gradient "
                        "accumulation and it needs ZeRO-1/2 with the optimizer on the CPU, "
                        "which are knobs tune moves; compare ZenFlow's settings with zerosim "
                        "sweep over zero_optimization.zenflow keys), got a zenflow section")
    if scenario.deepspeed.offload_optimizer.super_offload:
        raise TuneError(f"{scenario.source}: deepspeed.zero_optimization.offload_optimizer."
                        "super_offload: expected false (SuperOffload needs ZeRO-3 with the "
                        "optimizer on the CPU, which are knobs tune moves; compare it with "
                        "zerosim sweep over offload_optimizer.super_offload), got true")
    base = as_given(scenario)
    rows: list[dict[str, Any]] = []
    todo: list[Point] = []
    deferred: list[Point] = []
    extra = nvme_overrides(scenario)
    searched = candidates(base, free_knobs(free, fix), nvme=scenario.hardware.has_nvme,
                          fork=scenario.behaviours.fork_options,
                          numa=scenario.hardware.numa_domains > 1,
                          filling_threads=filling_threads(scenario),
                          thresholds=granularity_thresholds(scenario)
                          if base.leaves is not None else (),
                          training=scenario.deepspeed.dtype,
                          zero_plus_plus=zero_plus_plus_choices(scenario),
                          mics=mics_choices(scenario),
                          tilings=tiling_choices(scenario) if base.tiling is not None else (),
                          sequence_parallel=sequence_parallel_choices(scenario)
                          if base.sequence_parallel is not None else ())
    row_of: dict[Config, dict[str, Any]] = {}
    for config in searched:
        point_overrides = fixed | config.overrides() | (
            extra if "nvme" in config.offload else {})
        row = row_of[config] = _row(config, Status.PENDING)
        row["overrides"] = point_overrides
        rows.append(row)
        try:
            reason = prune_reason(load_scenario(scenario_path, point_overrides))
        except ScenarioError as err:
            row["status"], row["note"] = Status.REFUSED, str(err)
            continue
        if reason:
            row["status"], row["note"] = Status.PRUNED, reason
            continue
        point = Point(len(rows) - 1, point_id(point_overrides), point_overrides,
                      {"config": config.describe()}, {})
        waits_for = config.twin()
        twin = row_of.get(waits_for) if waits_for is not None else None
        (deferred if twin is not None and twin["status"] == Status.PENDING else todo).append(point)
    outcome = TuneOutcome(scenario, rows, pruned=0)

    def on_row(point: Point, result: Mapping[str, Any]) -> None:
        _simulated(rows[point.index], result)
        if on_progress is not None:
            on_progress(sum(r["status"] != Status.PENDING for r in rows), len(rows))

    def on_failure(point: Point, error: BaseException) -> None:
        rows[point.index]["status"], rows[point.index]["note"] = Status.ERROR, str(error)

    with open_executor(workers, dask, len(todo) + len(deferred)) as (
            executor, window, outcome.executor):
        drive(executor, window, str(scenario_path), todo, on_row, on_failure)
        outcome.simulated = len(todo)
        while deferred:
            now, deferred = _not_dominated(deferred, rows, row_of)
            drive(executor, window, str(scenario_path), now, on_row, on_failure)
            outcome.simulated += len(now)
    outcome.pruned = sum(r["status"] == Status.PRUNED for r in rows)
    outcome.rows = rank_rows(rows)
    outcome.wall_s = time.perf_counter() - started
    if out_dir is not None:
        outcome.files = [write_csv(outcome.rows, Path(out_dir) / "tune.csv")]
        for stem, row in chosen(outcome.rows):
            outcome.files += write_configuration(scenario_path, row["overrides"],
                                                 Path(out_dir), stem,
                                                 header=configuration_header(
                                                     row, stem, scenario_path, Path(out_dir)))
    return outcome


def fastest_with_room(fitting: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The fastest of the ranked fitting rows whose peaks are not tight."""
    return next((r for r in fitting if not r.get("tight")), None)


def chosen(rows: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(file stem, row) of the configurations tune writes as files: the fastest that fits
    and, where its peak is tight, the fastest with room to spare."""
    fitting = [r for r in rows if r["status"] == Status.OK]
    if not fitting:
        return []
    picks = [("fastest", fitting[0])]
    if fitting[0]["tight"] and (roomy := fastest_with_room(fitting)) is not None:
        picks.append(("fastest_with_room", roomy))
    return picks


def configuration_header(row: Mapping[str, Any], stem: str, scenario_path: str | Path,
                         folder: Path) -> str:
    """What heads a configuration's scenario file: what it is, what it gave, how to use it
    (the paths as the command was given them)."""
    config: Config = row["config"]
    written = folder / f"{stem}.yaml"
    lines = [f"zerosim tune's {stem.replace('_', ' ')} configuration: {config.describe()}",
             f"{row['iteration_s']:.3f} s per iteration, {row['tokens_per_s']:,.0f} tokens/s, "
             f"peak HBM {row['peak_hbm_GiB']:.1f} GiB, peak host memory "
             f"{row['peak_host_GiB']:.1f} GiB",
             f"zerosim diff {scenario_path} {written} lists what it changes and what moved",
             f"zerosim run {written} replays it with every record; {stem}_ds_config.json is "
             "its deepspeed section as a ds_config;",
             "runtime.bind_cores_to_rank is the launcher's --bind_cores_to_rank, "
             "runtime.cpu_threads_per_rank its OMP_NUM_THREADS"]
    if config.what_if != "none":
        lines.append(f"what_if.{config.what_if} is a what-if zerosim replays, not a setting "
                     "DeepSpeed has")
    if "nvme" in config.offload:
        lines.append(f"nvme_path {NVME_PATH} stands for your drives' mount point")
    return "\n".join(lines)


def filling_threads(scenario: Scenario) -> int:
    """The OpenMP threads per rank that fill the fullest node's hardware threads without
    oversubscribing them, when its ranks' default pools do oversubscribe it (0 otherwise)."""
    from zerosim.hardware.costs import cpu_pools

    pools = cpu_pools(scenario.hardware, scenario.ranks_on_fullest_node, None)
    return pools.filling_threads if pools.oversubscription > 1 else 0


def nvme_overrides(scenario: Scenario) -> dict[str, Any]:
    """What a searched NVMe offload sets besides its device and path: a parameter swap buffer
    larger than the largest parameter partition (DeepSpeed asserts it)."""
    from zerosim.engine.plan import plan_of

    largest = max((p.partition_numel for p in plan_of(scenario).all_params), default=0)
    size = max(scenario.deepspeed.offload_param.buffer_size, largest + 1)
    return {Z + "offload_param.buffer_size": size}


def _not_dominated(deferred: list[Any], rows: list[dict[str, Any]],
                   row_of: Mapping[Config, dict[str, Any]]) -> tuple[list[Any], list[Any]]:
    """Of the configurations waiting for their twins (`Config.twin`), those to simulate now
    and those still waiting. One whose twin, or its twin's twin (an NVMe offload with its
    checkpoints in host memory: its host-memory twin, then that one's with them on the GPU),
    fits is pruned; one whose chain of twins holds one still pending waits; the others (every
    twin out of memory, pruned by its floor or refused) run. Where none can run yet, all
    run."""
    now, waiting = [], []
    for point in deferred:
        config = rows[point.index]["config"]
        fits, pending = None, False
        twin = config.twin()
        while twin is not None and twin in row_of:
            status = row_of[twin]["status"]
            if status == Status.OK:
                fits = twin
                break
            pending = pending or status == Status.PENDING
            twin = twin.twin()
        if fits is not None:
            rows[point.index]["status"] = Status.PRUNED
            rows[point.index]["note"] = _dominated_note(config, fits)
        elif pending:
            waiting.append(point)
        else:
            now.append(point)
    return (now, waiting) if now else (waiting, [])


def _dominated_note(config: Config, fits: Config) -> str:
    if fits == config.twin() and "nvme" in config.offload:
        return f"slower than {fits.offload} offload, which fits: NVMe only adds swaps"
    if fits == config.twin() and config.checkpointing == CHECKPOINTS_IN_HOST:
        return ("slower than the checkpoints on the GPU, which fit: in host memory they only "
                "add copies")
    if fits == config.twin():
        return f"slower than {fits.describe()}, which fits: tiling only adds work"
    return (f"slower than {fits.describe()}, which fits: NVMe, checkpoints in host memory and "
            "tiling only add swaps, copies and work")


STATUS_ORDER = {Status.OK: 0, Status.OOM: 1, Status.PRUNED: 2, Status.REFUSED: 3, Status.ERROR: 4}


def rank_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    ranked = sorted(rows, key=lambda r: (STATUS_ORDER.get(r["status"], 5),
                                         r["iteration_s"] or 0.0))
    for position, row in enumerate(ranked, start=1):
        row["rank"] = position if row["status"] == Status.OK else None
    return ranked


def write_csv(rows: list[dict[str, Any]], path: Path) -> Path:
    from zerosim.results.folders import write_table

    return write_table(path, COLUMNS, rows)


def iteration_parts(row: Mapping[str, Any]) -> dict[str, float]:
    """Seconds of one iteration spent in each phase (phase means times their count)."""
    phases, steps = row["phases_s"], row["gradient_accumulation"]
    counts = {"forward": steps, "backward_non_boundary": steps - 1, "backward_boundary": 1,
              "update": 1}
    return {phase: (phases.get(phase) or 0.0) * count for phase, count in counts.items()}


def why_best(rows: list[dict[str, Any]]) -> str:
    """One sentence: what the best configuration is and where it beats the next one."""
    fitting = [r for r in rows if r["status"] == Status.OK]
    if not fitting:
        return "no configuration fits"
    best = fitting[0]
    text = (f"fastest: {best['config'].describe()}, {best['iteration_s']:.2f} s per "
            f"iteration ({best['tokens_per_s']:,.0f} tokens/s)")
    if best.get("tight"):
        safe = fastest_with_room(fitting)
        text += (f", its peak {' and '.join(best['tight'])} within {PEAK_ERROR_FRACTION:.0%} "
                 "of the device's memory" + (
                     f" (the fastest with room to spare: {safe['config'].describe()}, "
                     f"{safe['iteration_s']:.2f} s)" if safe is not None else ""))
    if len(fitting) == 1:
        return text + "; it is the only one that fits"
    runner = fitting[1]
    gap = runner["iteration_s"] - best["iteration_s"]
    if gap < TIE_FRACTION * best["iteration_s"]:
        return text + (f"; {runner['config'].describe()} is as fast (within "
                       f"{gap * 1e3:.0f} ms)")
    mine, theirs = iteration_parts(best), iteration_parts(runner)
    phase = max(mine, key=lambda p: theirs[p] - mine[p])
    return (text + f"; the next, {runner['config'].describe()}, takes {gap:.2f} s more, most "
            f"of it in {phase.replace('_', ' ')} ({theirs[phase] - mine[phase]:+.2f} s)")
