"""Software-stack profiles: what the training framework and DeepSpeed add on top of the hardware.

A hardware profile says what the machine can do; a stack file (`zerosim/stacks/<name>.yaml`)
says what the software asks of it: how a transformer block is cut into the modules ZeRO-3
fetches (fused QKV and gate/up projections or separate ones), which memory-bound kernels each
module launches besides its GEMMs, and what the rank's host thread spends per kernel launch,
per ZeRO-3 module hook and per collective. Host times are quoted for a core at the stack's
`host.reference_GHz`; a rank's host thread runs them scaled by the profile's
`host.cpu_boost_GHz`. Pure: no SimPy.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from zerosim.errors import ScenarioError
from zerosim.hardware.provenance import (
    Provenance,
    check_carried,
    parse_provenance,
    provenance_values,
)
from zerosim.inputs import check_plausible, referenced_path
from zerosim.models.breakdown import (
    ANY_ACTIVATION,
    QKV_LAYOUTS,
    ActivationMemory,
    Elementwise,
    FusedSoftmax,
    LossMemory,
    Recipe,
    ScoreMemory,
    UngatedActivation,
)
from zerosim.models.leaves import MODULE_TREES
from zerosim.units import MS, US, GiB, MiB
from zerosim.yamlio import dotted_leaf, flatten_nested, parse_yaml_text, read_yaml_file

DEFAULT_STACK = "megatron-deepspeed"
"""The study's stack (`runtime.framework` when a scenario names none): the study and the Polaris
runs come from the same group's Megatron-DeepSpeed set-up (see the stack file)."""
LAYOUTS = {"modules.qkv": ("fused", "separate"), "modules.gate_up": ("fused", "separate")}
OUTPUT_WEIGHT_KEY = "modules.output_weight"
OUTPUT_WEIGHTS = ("module", "external")
"""How the framework uses the untied output layer: by calling it (`module`, the default) or by
reading its weight from the model's own forward (`external`: a ZeRO-3 external parameter)."""
SYNCS_KEY = "modules.syncs_before_mlp"
"""The optional count of host-blocking synchronisations between a block's attention and its
MLP (`Recipe.syncs_before_mlp`), as `{count: N, source: '...'}` (0 when absent)."""
USED_PARAM_CHECK_KEY = "host.used_param_check_us"
"""The optional host time DeepSpeed's `count_used_parameters_in_backward` spends per model
parameter it inspects (`SoftwareStack.used_param_check_s`; 0 when absent)."""
STEP_TENSOR_KEY = "host.step_per_tensor_us"
REGATHER_TENSOR_KEY = "host.regather_per_tensor_us"
"""The optional host times of a ZeRO-3 optimizer step per parameter tensor (releasing it,
flattening its gradient, unflattening its partition) and per persistent tensor re-gathered
after it (`SoftwareStack.step_tensor_s`, `regather_tensor_s`; 0 when absent)."""
LEAF_HOOK_KEY = "host.leaf_hook_share"
"""The optional share of `host.fetch_hook_us` that a ZeRO-3 leaf's hook still pays for each
module with parameters inside it beyond its first (`SoftwareStack.leaf_hook_share`; 0 when
absent: a leaf's hook costs one module's)."""
REPEAT_HOOK_KEY = "host.repeat_hook_share"
"""The optional share of `host.fetch_hook_us` that a module's ZeRO-3 hooks cost when it runs
again with its parameters already gathered, as each slice of a tiled MLP calls its modules
(`SoftwareStack.repeat_hook_share`; 0 when absent: unpriced)."""
HOOK_SHARES = {LEAF_HOOK_KEY: "leaf_hook_share", REPEAT_HOOK_KEY: "repeat_hook_share"}
"""The optional shares of a module's hook time, by key -> `SoftwareStack` field."""
PLAIN_COLLECTIVE_KEY = "host.plain_collective_us"
"""The optional host time of a collective called straight through `deepspeed.comm`, outside
the bookkeeping of ZeRO's coalesced calls (Ulysses's all-to-alls, qgZ's, qwZ's scales:
`SoftwareStack.plain_collective_launch_s`; absent: the stack's `host.collective_launch_us`)."""
GC_OBJECT_KEY = "host.gc_per_object_ns"
"""The optional host time of a full `gc.collect()` per object the collector tracks
(`SoftwareStack.gc_object_s`; 0 when absent): what DeepSpeed's `memory_breakdown` costs."""
OPTIONAL_HOST_TIMES = {USED_PARAM_CHECK_KEY: ("used_param_check_s", US),
                       STEP_TENSOR_KEY: ("step_tensor_s", US),
                       REGATHER_TENSOR_KEY: ("regather_tensor_s", US),
                       PLAIN_COLLECTIVE_KEY: ("plain_collective_s", US),
                       GC_OBJECT_KEY: ("gc_object_s", 1e-9)}
"""Optional per-item host-time keys -> (`SoftwareStack` field, scale to seconds)."""
GC_ZERO3_KEY = "processes.gc_objects_per_zero3_tensor"
GC_OBJECTS_KEYS = {"processes.gc_objects": "gc_objects",
                   "processes.gc_objects_per_tensor": "gc_objects_per_tensor",
                   GC_ZERO3_KEY: "gc_objects_per_zero3_tensor"}
"""The optional objects a rank's process holds for Python's collector to walk: besides the
model's parameter tensors, per tensor, and per tensor more under ZeRO-3
(`SoftwareStack.gc_objects_held`; 0 when absent)."""
RESIDENT_KEY = "processes.rank_resident_GiB"
"""The optional host memory each rank's processes hold besides its tensors
(`SoftwareStack.rank_resident_bytes`), a `{value, basis, source}` leaf (0 when absent)."""
WORKERS_KEY = "processes.dataloader_workers"
"""The optional count of worker processes each rank's data loader forks once the model and the
optimizer are built (`SoftwareStack.dataloader_workers`), as `{count: N, source: '...'}` (0
when absent)."""
GROUPED_QKV_KEY = "modules.grouped_qkv"
GROUPED_QKV_CHOICES = ("as_qkv", *QKV_LAYOUTS)
"""How a model with grouped-query attention has its Q, K and V projections cut, as `{value:
..., source: '...'}` (`as_qkv`, the default: as `modules.qkv` says; `fused`, `q_kv`: Q apart,
K and V in one projection; `separate`; `Recipe.grouped_qkv`)."""
EXPERTS_KEY = "modules.experts"
EXPERTS_CHOICES = ("per_expert", "fused")
"""How a mixture-of-experts block holds its experts, as `{value: ..., source: '...'}`
(`per_expert`, the default: an `nn.ModuleList` of MLP modules, each fetched by ZeRO-3 as its
hooks fire, transformers 4; `fused`: one module of `[experts, ...]` weight tensors run by
grouped GEMMs, fetched at once, transformers 5; `Recipe.fused_experts`)."""
MOE_BLOCK_KEY = "modules.moe_block"
MOE_BLOCK_CHOICES = ("hooked", "leaf")
"""How ZeRO-3 hooks a mixture-of-experts block, as `{value: ..., source: '...'}` (`hooked`,
the default: each of its modules with parameters is fetched as its own hooks fire; `leaf`: the
training script makes the block a ZeRO-3 leaf, `deepspeed.utils.set_z3_leaf_modules`, one
fetch of everything under it; `Recipe.moe_block_leaf`)."""
MODULE_TREE_KEY = "modules.module_tree"
"""How the framework wraps the layers in its top-level modules, as `{value: ..., source:
'...'}` (`transformers`, the default: `XForCausalLM` holding `model` and `lm_head`;
`megatron`: `GPTModel`, `language_model`, its `embedding` and `encoder`;
`Recipe.module_tree`, `zerosim.models.leaves`)."""
CHECKPOINT_KEY = "modules.checkpoint_function"
CHECKPOINT_CHOICES = ("torch", "deepspeed")
"""Which function checkpoints a block, as `{value: ..., source: '...'}` (`torch`, the default:
`torch.utils.checkpoint`, which keeps the block's input on the GPU unless Arctic Long
Sequence Training's patch moves it to host memory (`runtime.checkpoint_in_cpu`); `deepspeed`:
`deepspeed.checkpointing.checkpoint`, which can keep it in host memory
(`runtime.checkpoint_in_cpu`) and synchronize the device around each block
(`runtime.synchronize_each_layer`); `Recipe.deepspeed_checkpointing`)."""
SEQUENCE_PARALLEL_KEY = "modules.sequence_parallel"
SEQUENCE_PARALLEL_CHOICES = ("none", "ulysses_hf", "distributed_attention")
"""How the framework runs Ulysses sequence parallelism (`deepspeed.sequence_parallel_size`), as
`{value: ..., source: '...'}` (`none`, the default: it does not; `ulysses_hf`: DeepSpeed's
UlyssesSPAttentionHF inside transformers' attention; `distributed_attention`: its attention
inside DeepSpeed's DistributedAttention, as Megatron-DeepSpeed does;
`Recipe.sequence_parallel`)."""
PACKED_DOCUMENTS_KEY = "modules.packed_documents"
PACKED_DOCUMENTS_CHOICES = ("none", "varlen")
"""What the framework's flash attention does with documents packed into one sequence (the
scenario's `document_length`), as `{value: ..., source: '...'}` (`none`, the default: it
attends over the whole sequence; `varlen`: position ids that restart at each document send
flash attention down its variable-length path, each document attending only within itself;
`Recipe.packed_documents`)."""
KV_REPEAT_KEY = "modules.kv_repeat"
KV_REPEAT_CHOICES = ("in_attention", "before_rotary")
"""Where grouped-query attention's K and V are expanded to every head, as `{value: ...,
source: '...'}` (`in_attention`, the default: inside eager attention, after the rotary
embedding, as transformers does; `before_rotary`: right after the QKV split, whatever the
attention kernel, so the rotary embedding acts on the expanded K, as Megatron-DeepSpeed does;
`Recipe.kv_repeat_before_rotary`)."""
ULYSSES_KERNEL_OPS = ("ulysses_inputs", "ulysses_kv_repeat", "ulysses_output",
                      "ulysses_output_batch")
"""The copies DeepSpeed's Ulysses makes around its all-to-alls (`Recipe.ulysses_inputs`, ...):
a stack that runs no Ulysses leaves them out."""
KERNEL_OPS = ("norm", "projection_split", "query_split", "rotary", "kv_repeat",
              "attention_inputs", "matmul_inputs", "score_operands", "scores", "context",
              "activation", "residual", "softcap", "loss", *ULYSSES_KERNEL_OPS)
OPTIONAL_KERNEL_OPS = ("projection_split", "query_split", "attention_inputs", "matmul_inputs",
                       "score_operands", "softcap", *ULYSSES_KERNEL_OPS)
"""Kernel entries a stack may leave out (no kernels)."""
LAYER_NORM_OP = "layer_norm"
"""The optional kernel entry of a LayerNorm model's norms where the stack runs them otherwise
than its `norm` (`Recipe.layer_norm`); left out, LayerNorms are priced as `norm`."""
GROUPS_KEY = "process_groups.params_and_gradients"
GROUP_CHOICES = ("separate", "same")
"""Whether ZeRO-3's parameter all-gathers and its gradient reductions run on one process group
(`same`: one NCCL communicator, one NCCL stream per GPU, so they run in the order the host
issued them) or on two (`separate`, the default), as `{value: same, source: '...'}`."""
PARAM_GROUPS_KEY = "optimizer.param_groups"
PARAM_GROUP_CHOICES = ("one", "weight_decay_split")
"""How the framework hands the model's parameters to the optimizer: `one` group (DeepSpeed
building it from `model_parameters`, the default), or `weight_decay_split`: the tensors it
decays, then the one-dimensional ones (biases and norms) in a group of their own, as
Megatron's `get_param_groups` does; DeepSpeed partitions each group apart (ZeRO-3's
sub-groups, ZeRO-1/2's flat partitions), as `{value: weight_decay_split, source: '...'}`."""
HOST_TIMES = {"host.kernel_launch_us": ("kernel_launch_s", US),
              "host.fetch_hook_us": ("fetch_hook_s", US),
              "host.collective_launch_us": ("collective_launch_s", US),
              "host.micro_batch_ms": ("micro_batch_s", MS),
              "host.step_ms": ("step_s", MS)}
"""Host-time keys -> (field, scale to seconds)."""
TUNABLE_KEYS = (*HOST_TIMES, "kernels.backward_bytes_factor")
"""The stack's numeric values a fit or a sensitivity study may move (the host times and the
elementwise backward's traffic factor); the rest are read off the framework's code."""
STRIDED_KEY = "strided_bytes_per_element"
"""The optional key of a `kernels` entry: its bytes moved by kernels on strided or broadcast
views, which stream at the GPU's `gpu.strided_memory_efficiency`."""
BF16_KEY = "bf16"
"""The optional key of a `kernels` entry: the op's kernels and bytes in bfloat16 runs, where
they differ from float16's (an entry of the same keys, `Elementwise.bf16`)."""
FUSED_SOFTMAX_KEY = "modules.fused_softmax"
"""The optional shapes a stack's fused softmax kernel serves, as `{min_keys: N, max_keys: N,
multiple_of: N, source: '...'}` (`Recipe.fused_softmax`); given, `kernels.scores.unfused`
prices the framework's path for the other shapes (and `attention_memory.unfused` what it
holds where that differs)."""
UNFUSED_KEY = "unfused"
"""The optional key of the `scores` entry (and of `attention_memory`): the kernels and bytes
(what is held) where the fused softmax kernel does not serve the shape (`Elementwise.unfused`,
`ScoreMemory.unfused`)."""
SINKS_KEY = "sinks"
"""The optional key of the `scores` entry (and of `attention_memory`): the kernels and bytes
(what is held) of a model with attention sinks (`Elementwise.sinks`, `ScoreMemory.sinks`)."""
FLASH_KEY = "flash"
"""The optional key of a `kernels` entry: the op's kernels and bytes with flash-attn's kernel
(`attention: flash`), where they differ from the other paths' (`Elementwise.flash`; it may
hold its own `bf16`)."""
TRANSPOSES_BATCH_KEY = "transposes_batch"
"""The optional flag of a `kernels` entry: a copy into the layout with the sequence and batch
dimensions swapped, which launches nothing at micro-batch 1 (`Elementwise.transposes_batch`)."""
SOFTMAX_KEY = "softmax_bytes_per_element"
BACKWARD_SOFTMAX_KEY = "backward_softmax_bytes_per_element"
"""The optional keys of a `kernels` entry: of its contiguous bytes (forward, backward), those
PyTorch's softmax kernel moves over attention scores, priced at the GPU's
`gpu.softmax_memory_efficiency`."""
SOURCE_KEY = "source_bytes_per_element"
"""The optional key of a `kernels` entry: bytes per element of a smaller source the op reads
once (`Elementwise.source_bytes_per_element`)."""
BACKWARD_KEY = "backward_bytes_per_element"
BACKWARD_STRIDED_KEY = "backward_strided_bytes_per_element"
BACKWARD_KERNELS_KEY = "backward_kernels"
"""The optional keys of a `kernels` entry whose backward is read off its code: the bytes its
backward moves per element, of those the strided ones (required when the forward has strided
bytes), and how many kernels it launches (absent: as many as the forward); without them the
backward moves `backward_bytes_factor` times the forward's in as many kernels."""
HEAP_REUSE_KEY = "allocator.heap_reuse_MiB"
"""The optional allocator key: host temporaries up to this size reuse heap pages."""
SCORE_MEMORY = ("saved", "forward_workspace", "backward_workspace", "buffer")
"""`attention_memory` keys: `ScoreMemory` fields, bytes per eager-attention score."""
LOSS_MEMORY = ("saved", "transient", "backward")
"""`loss_memory` keys: `LossMemory` fields, bytes per logit."""
ACTIVATION_MEMORY = ("norm_saved", "norm_saved_per_row", "layer_norm_saved",
                     "layer_norm_saved_per_row", "activation_saved", "gated_activation_saved")
"""`activation_memory` keys: `ActivationMemory` fields, bytes for 16-bit training."""
LIGER_KEY = "liger_kernel"
LIGER_KERNEL_OPS = ("norm", "rotary", "activation", "loss")
"""What transformers' `use_liger_kernel` replaces (`apply_liger_kernel_to_<model>`'s defaults:
rms_norm, rope, swiglu or geglu, fused_linear_cross_entropy): the stack's `liger_kernel`
section prices each as Liger-Kernel's Triton kernel, and what the norms and the activation
keep for their backward (`activation_memory`)."""
UNGATED_KEY = "ungated_activations"
"""The optional section of an ungated MLP's activation functions by name (`*`: any other),
each a `kernels` entry with `saved`, the bytes per intermediate element it keeps for its
backward (`Recipe.ungated_activations`)."""
SAVED_KEY = "saved"


@dataclass(frozen=True)
class SoftwareStack:
    """A stack in SI units. Host times are on a core at `reference_Hz`."""

    name: str
    description: str
    recipe: Recipe
    reference_Hz: float
    kernel_launch_s: float
    """Host time to issue one kernel (PyTorch's eager dispatch and the CUDA launch)."""
    fetch_hook_s: float
    """Host time of ZeRO-3's pre- and post-hooks around one module that owns parameters (the
    parameter coordinator's fetch, prefetch and release bookkeeping), per pass."""
    collective_launch_s: float
    """Host time per collective a rank launches (DeepSpeed's bookkeeping and the NCCL call)."""
    micro_batch_s: float
    """Host time per micro-batch outside forward and backward: the framework fetching and
    broadcasting the batch and averaging the loss over the data-parallel group."""
    step_s: float
    """Host time per optimizer step outside the phases (zeroing, timers, logging)."""
    provenance: Mapping[str, Provenance] = field(repr=False, compare=False)
    used_param_check_s: float = 0.0
    """Host time per model parameter DeepSpeed's `count_used_parameters_in_backward` inspects
    (the gradient hooks of 0.18.5 on: `Behaviours.used_params_counted`)."""
    step_tensor_s: float = 0.0
    """Host time of a ZeRO-3 optimizer step per parameter tensor besides the kernels it
    launches: `_partition_all_parameters` releasing it, `_prepare_sub_group` flattening its
    gradient, `_reassign_or_swap_out_partitioned_parameters` unflattening its partition."""
    regather_tensor_s: float = 0.0
    """Host time per persistent tensor the step's `_post_step` gathers again."""
    plain_collective_s: float | None = None
    """Host time of a collective called straight through `deepspeed.comm`, outside the
    bookkeeping of ZeRO's coalesced calls (None: not given; `plain_collective_launch_s`)."""
    leaf_hook_share: float = 0.0
    """What a ZeRO-3 leaf's hooks cost beyond one module's, per module with parameters inside
    it beyond its first, as a share of `fetch_hook_s`: the leaf spares those modules' own hooks
    and the parameter-less modules' around them, not the fetch, wait and release of their
    tensors (`RankCore.fetch_hooks`)."""
    repeat_hook_share: float = 0.0
    """What a module's ZeRO-3 hooks cost when it runs again with its parameters already
    gathered (each slice of a tiled MLP calling it), as a share of `fetch_hook_s`: the
    coordinator's bookkeeping without the fetch (`RankCore.fetch_hooks`)."""
    heap_reuse_bytes: float = 0.0
    """Host temporaries up to this size come from the C allocator's heap, on pages earlier
    temporaries faulted in; larger ones are mapped fresh and the kernel zeroes their pages on
    first touch (0: every temporary is fresh)."""
    one_process_group: bool = False
    """The parameter all-gathers and the gradient reductions share one NCCL communicator
    (`process_groups.params_and_gradients: same`), so each waits for every collective the host
    issued before it, of either kind."""
    rank_resident_bytes: float = 0.0
    """Host memory each rank's processes hold besides the tensors zerosim tracks: the Python
    interpreter, the framework's and CUDA's host state, the data loader's workers."""
    gc_object_s: float = 0.0
    """Host time of a full `gc.collect()` per object Python's collector tracks."""
    gc_objects: float = 0.0
    """Objects a rank's process holds for the collector besides the model's parameter tensors
    (the interpreter's, the libraries', the framework's)."""
    gc_objects_per_tensor: float = 0.0
    """Objects the collector tracks per parameter tensor with the parameters replicated (the
    tensor, the module that owns it, the optimizer's state of it)."""
    gc_objects_per_zero3_tensor: float = 0.0
    """Objects more per parameter tensor under ZeRO-3 (its partition, DeepSpeed's attributes
    and functions on it, the hooks on its module)."""
    vector_param_group: bool = False
    """The optimizer gets the one-dimensional parameters (biases, norms) as a second group,
    after the others (`optimizer.param_groups: weight_decay_split`)."""
    liger_recipe: Recipe | None = None
    """The recipe with Liger-Kernel's patch applied (the stack's `liger_kernel` section; None:
    the stack has none), which `runtime.liger_kernel` runs (`with_liger_kernel`)."""
    dataloader_workers: int = 0
    """Worker processes each rank's data loader forks after the optimizer is built. Forked
    children share the rank's pages copy-on-write, so a page of pageable host state that
    existed before the fork and that the rank writes afterwards is held twice: once by the rank
    (its new copy), once by the workers (the old one)."""

    def layout(self) -> dict[str, Any]:
        """The stack's structural choices, as its file spells them (for `zerosim check`)."""
        r = self.recipe
        fused, separate = LAYOUTS["modules.qkv"]
        return {"qkv": fused if r.fused_qkv else separate,
                "gate_up": fused if r.fused_gate_up else separate,
                "output_weight": OUTPUT_WEIGHTS[r.external_output_weight],
                "syncs_before_mlp": r.syncs_before_mlp,
                "grouped_qkv": r.grouped_qkv or GROUPED_QKV_CHOICES[0],
                "kv_repeat": KV_REPEAT_CHOICES[r.kv_repeat_before_rotary],
                "experts": EXPERTS_CHOICES[r.fused_experts],
                "moe_block": MOE_BLOCK_CHOICES[r.moe_block_leaf],
                "module_tree": r.module_tree,
                "checkpoint_function": CHECKPOINT_CHOICES[r.deepspeed_checkpointing],
                "sequence_parallel": r.sequence_parallel,
                "packed_documents": r.packed_documents,
                "process_groups": GROUP_CHOICES[self.one_process_group],
                "param_groups": PARAM_GROUP_CHOICES[self.vector_param_group],
                "dataloader_workers": self.dataloader_workers}

    def with_liger_kernel(self) -> SoftwareStack:
        """The stack running Liger-Kernel's kernels (itself where it has none to run: the
        scenario's rules refuse that)."""
        if self.liger_recipe is None:
            return self
        return replace(self, recipe=self.liger_recipe)

    def gc_objects_held(self, tensors: int, *, partitioned: bool) -> float:
        """The objects a full collection walks in a process training `tensors` parameter
        tensors, partitioned by ZeRO-3 or not."""
        per_tensor = self.gc_objects_per_tensor + (
            self.gc_objects_per_zero3_tensor if partitioned else 0.0)
        return self.gc_objects + per_tensor * tensors

    def memory_report_s(self, tensors: int, core_Hz: float, *, partitioned: bool) -> float:
        """One of DeepSpeed's memory reports on a core of `core_Hz`: a full `gc.collect()` in
        a process training `tensors` parameter tensors (`gc_objects_held`)."""
        return (self.on_core(self.gc_object_s, core_Hz)
                * self.gc_objects_held(tensors, partitioned=partitioned))

    @property
    def plain_collective_launch_s(self) -> float:
        """Host time per collective called straight through `deepspeed.comm`: the stack's own
        value for such a call, else what it charges ZeRO's coalesced collectives."""
        if self.plain_collective_s is None:
            return self.collective_launch_s
        return self.plain_collective_s

    def on_core(self, seconds: float, core_Hz: float) -> float:
        """A host time of this stack on a core of `core_Hz` (Python's work scales with clock)."""
        return seconds * self.reference_Hz / core_Hz


def _non_negative(prov: Provenance, source: str, key: str, *, positive: bool = False) -> float:
    value = prov.value
    ok = (not isinstance(value, bool) and isinstance(value, int | float)
          and value == value and value != float("inf") and (value > 0 if positive else value >= 0))
    if not ok:
        expected = "a finite number > 0" if positive else "a finite number >= 0"
        raise ScenarioError(source, f"{key}.value", expected, value)
    check_plausible(f"stack.{key}", value, source=source, key_path=f"{key}.value")
    return float(value)


def _bytes(raw: Mapping[str, Any], key: str, field_name: str, source: str,
           most: tuple[float, str] | None = None) -> float:
    """A `kernels` entry's bytes per element: in [0, 1000), and at most `most` (the value
    and its name) where another of the entry's bytes bounds it."""
    value = raw[field_name]
    highest = 1e3 if most is None else most[0]
    expected = ("a number in [0, 1000)" if most is None
                else f"a number in [0, {most[1]} = {most[0]:g}]")
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not 0 <= value < 1e3 or value > highest):
        raise ScenarioError(source, f"{key}.{field_name}", expected, value)
    return float(value)


def _elementwise(tree: Mapping[str, Any], op: str, source: str) -> Elementwise:
    key = f"kernels.{op}"
    raw = dotted_leaf(tree, key)
    if raw is None and op in OPTIONAL_KERNEL_OPS:
        return Elementwise()
    nested = (SINKS_KEY, UNFUSED_KEY, BF16_KEY) if op == "scores" else (FLASH_KEY, BF16_KEY)
    return _kernel_entry(raw, key, source, nested)


def _kernel_entry(raw: Any, key: str, source: str, nested: tuple[str, ...]) -> Elementwise:
    """One `kernels` entry (or one of its variants, which may nest the variants after
    theirs: `flash` may hold a `bf16`): counts and bytes, checked."""
    required = {"kernels", "bytes_per_element", "source"}
    optional = {STRIDED_KEY, SOURCE_KEY, BACKWARD_KEY, BACKWARD_STRIDED_KEY,
                BACKWARD_KERNELS_KEY, SOFTMAX_KEY, BACKWARD_SOFTMAX_KEY, TRANSPOSES_BATCH_KEY,
                *nested}
    if not isinstance(raw, Mapping) or not required <= set(raw) <= required | optional:
        variants = "".join(f" {name}: {{...}}," for name in nested)
        raise ScenarioError(source, key, "{kernels: N, bytes_per_element: B, "
                            f"[{STRIDED_KEY}: S, {SOURCE_KEY}: SB, {BACKWARD_KEY}: BB, "
                            f"{BACKWARD_STRIDED_KEY}: BS, {BACKWARD_KERNELS_KEY}: BN, "
                            f"{SOFTMAX_KEY}: M, "
                            f"{BACKWARD_SOFTMAX_KEY}: BM, {TRANSPOSES_BATCH_KEY}: true,"
                            f"{variants}] source: '...'}}", raw)
    entry = _counts_and_bytes(raw, key, source)
    transposes = raw.get(TRANSPOSES_BATCH_KEY, False)
    if not isinstance(transposes, bool):
        raise ScenarioError(source, f"{key}.{TRANSPOSES_BATCH_KEY}", "true or false",
                            transposes)
    variants = {name: _kernel_entry(raw[name], f"{key}.{name}", source,
                                    nested[nested.index(name) + 1:])
                for name in nested if name in raw}
    source_bytes = _bytes(raw, key, SOURCE_KEY, source) if SOURCE_KEY in raw else 0.0
    return replace(entry, transposes_batch=transposes, source_bytes_per_element=source_bytes,
                   **_softmax_bytes(raw, key, source, entry), **variants)


def _softmax_bytes(raw: Mapping[str, Any], key: str, source: str, entry: Elementwise
                   ) -> dict[str, float]:
    """The entry's softmax bytes, forward and backward (the keys are `Elementwise`'s field
    names): at most its contiguous ones."""
    backward = entry.backward_bytes_per_element
    if BACKWARD_SOFTMAX_KEY in raw and backward is None:
        raise ScenarioError(source, f"{key}.{BACKWARD_KEY}", f"given with {BACKWARD_SOFTMAX_KEY}",
                            "absent")
    bounds = {SOFTMAX_KEY: (entry.bytes_per_element - entry.strided_bytes_per_element,
                            "the contiguous bytes_per_element"),
              BACKWARD_SOFTMAX_KEY: ((backward or 0.0) - entry.backward_strided_bytes_per_element,
                                     "the contiguous backward_bytes_per_element")}
    return {name: _bytes(raw, key, name, source, bounds[name])
            for name in (SOFTMAX_KEY, BACKWARD_SOFTMAX_KEY) if name in raw}


def _kernel_count(raw: Mapping[str, Any], key: str, field_name: str, source: str) -> int:
    count = raw[field_name]
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ScenarioError(source, f"{key}.{field_name}", "an integer >= 0", count)
    check_plausible("stack.kernels.*.kernels", count, source=source,
                    key_path=f"{key}.{field_name}")
    return count


def _counts_and_bytes(raw: Mapping[str, Any], key: str, source: str) -> Elementwise:
    """A `kernels` entry's kernel counts and its bytes forward and backward, checked."""
    count = _kernel_count(raw, key, "kernels", source)
    nbytes = _bytes(raw, key, "bytes_per_element", source)
    strided = (_bytes(raw, key, STRIDED_KEY, source, (nbytes, "bytes_per_element"))
               if STRIDED_KEY in raw else 0.0)
    if BACKWARD_KEY not in raw:
        for name in (BACKWARD_STRIDED_KEY, BACKWARD_KERNELS_KEY):
            if name in raw:
                raise ScenarioError(source, f"{key}.{BACKWARD_KEY}", f"given with {name}",
                                    "absent")
        return Elementwise(count, nbytes, strided)
    backward = _bytes(raw, key, BACKWARD_KEY, source)
    if strided and BACKWARD_STRIDED_KEY not in raw:
        raise ScenarioError(source, f"{key}.{BACKWARD_STRIDED_KEY}",
                            f"given, as the forward moves {STRIDED_KEY}", "absent")
    backward_strided = (_bytes(raw, key, BACKWARD_STRIDED_KEY, source,
                               (backward, BACKWARD_KEY))
                        if BACKWARD_STRIDED_KEY in raw else 0.0)
    backward_count = (_kernel_count(raw, key, BACKWARD_KERNELS_KEY, source)
                      if BACKWARD_KERNELS_KEY in raw else None)
    if backward and not (count if backward_count is None else backward_count):
        raise ScenarioError(source, f"{key}.{BACKWARD_KERNELS_KEY}",
                            f"an integer >= 1, as {BACKWARD_KEY} is {backward:g}",
                            raw.get(BACKWARD_KERNELS_KEY, "absent"))
    return Elementwise(count, nbytes, strided, backward, backward_strided, backward_count)


def _memory_section(tree: Mapping[str, Any], section: str, keys: tuple[str, ...], source: str,
                    provenance: dict[str, Provenance], *, nested: tuple[str, ...] = ()
                    ) -> dict[str, float]:
    """An optional section of `{value, basis, source}` leaves in bytes (`attention_memory`,
    `loss_memory`, `activation_memory`, `attention_memory.bf16`): the values it gives, by
    key; what it leaves out keeps the default; `nested` names sub-sections it may hold besides."""
    given = dotted_leaf(tree, section)
    if given is None:
        return {}
    if not isinstance(given, Mapping):
        raise ScenarioError(source, section, "a mapping", type(given).__name__)
    extra = set(given) - set(keys) - set(nested)
    if extra:
        raise ScenarioError(source, f"{section}.{sorted(extra)[0]}",
                            f"one of {', '.join((*keys, *nested))}", sorted(extra)[0])
    values = {}
    for name in keys:
        if name in given:
            key = f"{section}.{name}"
            provenance[key] = parse_provenance(given[name], source, key, table="stack")
            values[name] = _non_negative(provenance[key], source, key)
    return values


def parse_stack(tree: Any, source: str) -> SoftwareStack:
    """Validate a stack mapping and convert it to SI units."""
    if not isinstance(tree, Mapping):
        raise ScenarioError(source, "<root>", "a mapping", type(tree).__name__)
    known = {"name", "description", "modules", "kernels", "host", "attention_memory",
             "loss_memory", "activation_memory", "allocator", "process_groups", "processes",
             "optimizer", UNGATED_KEY, LIGER_KEY}
    for key in tree:
        if key not in known:
            raise ScenarioError(source, str(key), f"one of {', '.join(sorted(known))}", key)
    name = tree.get("name")
    if not isinstance(name, str) or not name:
        raise ScenarioError(source, "name", "a text", name)
    layout = {}
    for key, choices in LAYOUTS.items():
        value = dotted_leaf(tree, key)
        if value not in choices:
            raise ScenarioError(source, key, f"one of {', '.join(choices)}", value)
        layout[key] = value == "fused"
    output_weight = dotted_leaf(tree, OUTPUT_WEIGHT_KEY)
    if output_weight is None:
        output_weight = OUTPUT_WEIGHTS[0]
    if output_weight not in OUTPUT_WEIGHTS:
        raise ScenarioError(source, OUTPUT_WEIGHT_KEY, f"one of {', '.join(OUTPUT_WEIGHTS)}",
                            output_weight)
    module_keys = (*LAYOUTS, GROUPED_QKV_KEY, OUTPUT_WEIGHT_KEY, SYNCS_KEY, KV_REPEAT_KEY,
                   EXPERTS_KEY, MOE_BLOCK_KEY, MODULE_TREE_KEY, FUSED_SOFTMAX_KEY,
                   CHECKPOINT_KEY, SEQUENCE_PARALLEL_KEY, PACKED_DOCUMENTS_KEY)
    extra = set(tree.get("modules") or {}) - {k.removeprefix("modules.") for k in module_keys}
    if extra:
        raise ScenarioError(source, f"modules.{sorted(extra)[0]}",
                            ", ".join(k.removeprefix("modules.") for k in module_keys),
                            sorted(extra)[0])
    provenance: dict[str, Provenance] = {}
    factor_key = "kernels.backward_bytes_factor"
    factor = parse_provenance(dotted_leaf(tree, factor_key), source, factor_key, table="stack")
    provenance[factor_key] = factor
    recipe = Recipe(fused_qkv=layout["modules.qkv"], fused_gate_up=layout["modules.gate_up"],
                    external_output_weight=output_weight == "external",
                    syncs_before_mlp=_count_leaf(tree, SYNCS_KEY, 16, source),
                    grouped_qkv=_grouped_qkv(tree, source),
                    kv_repeat_before_rotary=_choice_leaf(
                        tree, KV_REPEAT_KEY, KV_REPEAT_CHOICES, source) == "before_rotary",
                    fused_experts=_choice_leaf(
                        tree, EXPERTS_KEY, EXPERTS_CHOICES, source) == "fused",
                    moe_block_leaf=_choice_leaf(
                        tree, MOE_BLOCK_KEY, MOE_BLOCK_CHOICES, source) == "leaf",
                    module_tree=_choice_leaf(tree, MODULE_TREE_KEY, MODULE_TREES, source),
                    deepspeed_checkpointing=_choice_leaf(
                        tree, CHECKPOINT_KEY, CHECKPOINT_CHOICES, source) == "deepspeed",
                    sequence_parallel=_choice_leaf(tree, SEQUENCE_PARALLEL_KEY,
                                                   SEQUENCE_PARALLEL_CHOICES, source),
                    packed_documents=_choice_leaf(tree, PACKED_DOCUMENTS_KEY,
                                                  PACKED_DOCUMENTS_CHOICES, source),
                    **{op: _elementwise(tree, op, source) for op in KERNEL_OPS},
                    layer_norm=None if dotted_leaf(tree, f"kernels.{LAYER_NORM_OP}") is None
                    else _elementwise(tree, LAYER_NORM_OP, source),
                    backward_bytes_factor=_non_negative(factor, source, factor_key),
                    score_memory=_score_memory(tree, source, provenance),
                    loss_memory=LossMemory(**_memory_section(
                        tree, "loss_memory", LOSS_MEMORY, source, provenance)),
                    activation_memory=ActivationMemory(**_memory_section(
                        tree, "activation_memory", ACTIVATION_MEMORY, source, provenance)),
                    fused_softmax=_fused_softmax(tree, source),
                    ungated_activations=_ungated_activations(tree, source))
    _check_unfused_path(recipe, source)
    known = {*KERNEL_OPS, LAYER_NORM_OP, "backward_bytes_factor"}
    extra = set(dotted_leaf(tree, "kernels") or {}) - known
    if extra:
        raise ScenarioError(source, f"kernels.{sorted(extra)[0]}",
                            f"one of {', '.join((*KERNEL_OPS, LAYER_NORM_OP))}",
                            sorted(extra)[0])
    reference = parse_provenance(dotted_leaf(tree, "host.reference_GHz"), source,
                                 "host.reference_GHz", table="stack")
    provenance["host.reference_GHz"] = reference
    times: dict[str, float] = {}
    for key, (attr, scale) in HOST_TIMES.items():
        prov = parse_provenance(dotted_leaf(tree, key), source, key, table="stack")
        provenance[key] = prov
        times[attr] = _non_negative(prov, source, key) * scale
    for key, (attr, scale) in OPTIONAL_HOST_TIMES.items():
        if dotted_leaf(tree, key) is not None:
            prov = parse_provenance(dotted_leaf(tree, key), source, key, table="stack")
            provenance[key] = prov
            times[attr] = _non_negative(prov, source, key) * scale
    for key, attr in HOOK_SHARES.items():
        if dotted_leaf(tree, key) is not None:
            prov = parse_provenance(dotted_leaf(tree, key), source, key, table="stack")
            provenance[key] = prov
            times[attr] = _non_negative(prov, source, key)
    known = {"reference_GHz", *(k[5:] for k in HOOK_SHARES), *(k[5:] for k in OPTIONAL_HOST_TIMES),
             *(k[5:] for k in HOST_TIMES)}
    extra = set(dotted_leaf(tree, "host") or {}) - known
    if extra:
        raise ScenarioError(source, f"host.{sorted(extra)[0]}", "a known host key",
                            sorted(extra)[0])
    reference_Hz = _non_negative(reference, source, "host.reference_GHz", positive=True) * 1e9
    stack = SoftwareStack(name=name, description=str(tree.get("description", "")),
                          recipe=recipe, reference_Hz=reference_Hz, provenance=provenance,
                          heap_reuse_bytes=_heap_reuse_bytes(tree, source, provenance),
                          one_process_group=_one_process_group(tree, source),
                          vector_param_group=_vector_param_group(tree, source),
                          dataloader_workers=_dataloader_workers(tree, source),
                          rank_resident_bytes=_rank_resident_bytes(tree, source, provenance),
                          liger_recipe=_liger_recipe(tree, recipe, source, provenance),
                          **_gc_objects(tree, source, provenance), **times)
    check_carried(provenance, name, source, kind="stack", names=stack_names(),
                  values_of=_builtin_stack_values)
    return stack


@functools.cache
def _builtin_stack_values(name: str) -> Mapping[str, Any]:
    """The values a shipped stack's file gives, by dotted key."""
    return MappingProxyType(provenance_values(builtin_stack_tree(name, source=f"stack {name}")))


def _liger_recipe(tree: Mapping[str, Any], recipe: Recipe, source: str,
                  provenance: dict[str, Provenance]) -> Recipe | None:
    """The optional `liger_kernel` section: `kernels` (each of `LIGER_KERNEL_OPS`, a `kernels`
    entry) and `activation_memory`, applied to the stack's recipe with Liger's fused loss."""
    section = tree.get(LIGER_KEY)
    if section is None:
        return None
    if not isinstance(section, Mapping) or set(section) != {"kernels", "activation_memory"}:
        raise ScenarioError(source, LIGER_KEY, "{kernels: {...}, activation_memory: {...}}",
                            section)
    kernels = section["kernels"]
    if not isinstance(kernels, Mapping) or set(kernels) != set(LIGER_KERNEL_OPS):
        raise ScenarioError(source, f"{LIGER_KEY}.kernels",
                            f"one entry each for {', '.join(LIGER_KERNEL_OPS)}", kernels)
    ops = {op: _kernel_entry(kernels[op], f"{LIGER_KEY}.kernels.{op}", source, ())
           for op in LIGER_KERNEL_OPS}
    memory = _memory_section(tree, f"{LIGER_KEY}.activation_memory", ACTIVATION_MEMORY,
                             source, provenance)
    return replace(recipe, **ops, fused_linear_loss=True,
                   activation_memory=replace(recipe.activation_memory, **memory))


def _ungated_activations(tree: Mapping[str, Any], source: str
                         ) -> tuple[tuple[str, UngatedActivation], ...]:
    """`ungated_activations` (none when absent): each function's kernels, as a `kernels`
    entry, and what it saves."""
    given = tree.get(UNGATED_KEY)
    if given is None:
        return ()
    if not isinstance(given, Mapping) or not given:
        raise ScenarioError(source, UNGATED_KEY, "a mapping of activation names "
                            f"('{ANY_ACTIVATION}' for any other) to kernel entries", given)
    found = []
    for name, raw in given.items():
        key = f"{UNGATED_KEY}.{name}"
        if not isinstance(raw, Mapping) or SAVED_KEY not in raw:
            raise ScenarioError(source, f"{key}.{SAVED_KEY}", "the bytes per intermediate "
                                "element the function keeps for its backward",
                                raw.get(SAVED_KEY, "absent") if isinstance(raw, Mapping)
                                else raw)
        kernels = _kernel_entry({k: v for k, v in raw.items() if k != SAVED_KEY}, key, source,
                                ())
        found.append((str(name), UngatedActivation(kernels, _bytes(raw, key, SAVED_KEY,
                                                                   source))))
    return tuple(found)


def _score_memory(tree: Mapping[str, Any], source: str, provenance: dict[str, Provenance]
                  ) -> ScoreMemory:
    """`attention_memory`, with its optional `bf16`, `unfused` and `sinks` sub-sections: what
    bfloat16 runs hold, what the unfused softmax holds and what a model with attention sinks
    holds, where it differs."""
    variant_keys = (BF16_KEY, UNFUSED_KEY, SINKS_KEY)
    memory = ScoreMemory(**_memory_section(tree, "attention_memory", SCORE_MEMORY, source,
                                           provenance, nested=variant_keys))
    variants = {name: _memory_section(tree, f"attention_memory.{name}", SCORE_MEMORY, source,
                                      provenance)
                for name in variant_keys}
    return replace(memory, **{name: replace(memory, **values)
                              for name, values in variants.items() if values})


def _fused_softmax(tree: Mapping[str, Any], source: str) -> FusedSoftmax | None:
    """`modules.fused_softmax` (None when absent)."""
    raw = dotted_leaf(tree, FUSED_SOFTMAX_KEY)
    if raw is None:
        return None
    fields = ("min_keys", "max_keys", "multiple_of")
    if not isinstance(raw, Mapping) or set(raw) != {*fields, "source"}:
        raise ScenarioError(source, FUSED_SOFTMAX_KEY, "{min_keys: N, max_keys: N, "
                            "multiple_of: N, source: '...'}", raw)
    for name in fields:
        value = raw[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ScenarioError(source, f"{FUSED_SOFTMAX_KEY}.{name}", "an integer >= 1",
                                value)
    if raw["max_keys"] < raw["min_keys"]:
        raise ScenarioError(source, f"{FUSED_SOFTMAX_KEY}.max_keys",
                            f"at least min_keys = {raw['min_keys']}", raw["max_keys"])
    return FusedSoftmax(*(raw[name] for name in fields))


def _check_unfused_path(recipe: Recipe, source: str) -> None:
    """A fused softmax's shapes and the unfused path's price come together."""
    unfused = recipe.scores.unfused is not None
    if recipe.fused_softmax is not None and not unfused:
        raise ScenarioError(source, f"kernels.scores.{UNFUSED_KEY}",
                            f"given with {FUSED_SOFTMAX_KEY}", "absent")
    if recipe.fused_softmax is None and (unfused or recipe.score_memory.unfused is not None):
        what = "kernels.scores" if unfused else "attention_memory"
        raise ScenarioError(source, FUSED_SOFTMAX_KEY, f"given with {what}.{UNFUSED_KEY}",
                            "absent")


def _choice_leaf(tree: Mapping[str, Any], key: str, choices: tuple[str, ...],
                 source: str) -> str:
    """An optional `{value: CHOICE, source: '...'}` leaf (a scenario's override adds
    `basis: override`): its value, one of `choices` (the first when the leaf is absent)."""
    raw = dotted_leaf(tree, key)
    if raw is None:
        return choices[0]
    expected = " or ".join(choices)
    if not isinstance(raw, Mapping) or not {"value", "source"} <= set(raw) <= {
            "value", "basis", "source"}:
        raise ScenarioError(source, key, f"{{value: {expected}, source: '...'}}", raw)
    if raw["value"] not in choices:
        raise ScenarioError(source, f"{key}.value", expected, raw["value"])
    return raw["value"]


def _grouped_qkv(tree: Mapping[str, Any], source: str) -> str | None:
    """`modules.grouped_qkv` as `Recipe.grouped_qkv` (None: as `modules.qkv` says)."""
    choice = _choice_leaf(tree, GROUPED_QKV_KEY, GROUPED_QKV_CHOICES, source)
    return None if choice == GROUPED_QKV_CHOICES[0] else choice


def _one_process_group(tree: Mapping[str, Any], source: str) -> bool:
    """The optional `process_groups` section (see `GROUPS_KEY`): True for `same`."""
    return _section_choice(tree, GROUPS_KEY, GROUP_CHOICES, source) == "same"


def _vector_param_group(tree: Mapping[str, Any], source: str) -> bool:
    """The optional `optimizer` section (see `PARAM_GROUPS_KEY`): True for
    `weight_decay_split`."""
    return (_section_choice(tree, PARAM_GROUPS_KEY, PARAM_GROUP_CHOICES, source)
            == "weight_decay_split")


def _section_choice(tree: Mapping[str, Any], key: str, choices: tuple[str, ...],
                    source: str) -> str:
    """An optional section holding one `{value: CHOICE, source: '...'}` leaf, `key` being
    `section.leaf`: its value (the first choice when the section is absent)."""
    section_name, leaf = key.split(".")
    section = tree.get(section_name)
    if section is None:
        return choices[0]
    if not isinstance(section, Mapping) or set(section) != {leaf}:
        raise ScenarioError(source, section_name,
                            f"{{{leaf}: {{value: {' or '.join(choices)}, source: '...'}}}}",
                            section)
    return _choice_leaf(tree, key, choices, source)


def _count_leaf(tree: Mapping[str, Any], key: str, most: int, source: str) -> int:
    """An optional `{count: N, source: '...'}` leaf (`modules.syncs_before_mlp`,
    `processes.dataloader_workers`): N, from 0 to `most` (0 when absent)."""
    raw = dotted_leaf(tree, key)
    if raw is None:
        return 0
    if not isinstance(raw, Mapping) or set(raw) != {"count", "source"}:
        raise ScenarioError(source, key, "{count: N, source: '...'}", raw)
    count = raw["count"]
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= most:
        raise ScenarioError(source, f"{key}.count", f"an integer from 0 to {most}", count)
    return count


def _processes(tree: Mapping[str, Any], source: str) -> Mapping[str, Any]:
    """The optional `processes` section: `dataloader_workers` and `rank_resident_GiB`."""
    section = tree.get("processes")
    if section is None:
        return {}
    known = {"dataloader_workers", "rank_resident_GiB",
             *(k.split(".")[1] for k in GC_OBJECTS_KEYS)}
    if not isinstance(section, Mapping) or set(section) - known:
        raise ScenarioError(source, "processes", "{dataloader_workers: {count: N, source: "
                            "'...'}, rank_resident_GiB, gc_objects, gc_objects_per_tensor: "
                            "{value: V, basis: ..., source: '...'}}", section)
    return section


def _gc_objects(tree: Mapping[str, Any], source: str,
                provenance: dict[str, Provenance]) -> dict[str, float]:
    """The `processes` section's object counts (`GC_OBJECTS_KEYS`), where given."""
    section = _processes(tree, source)
    counts: dict[str, float] = {}
    for key, attr in GC_OBJECTS_KEYS.items():
        if key.split(".")[1] in section:
            prov = parse_provenance(dotted_leaf(tree, key), source, key, table="stack")
            provenance[key] = prov
            counts[attr] = _non_negative(prov, source, key)
    return counts


def _dataloader_workers(tree: Mapping[str, Any], source: str) -> int:
    _processes(tree, source)
    return _count_leaf(tree, WORKERS_KEY, 64, source)


def _rank_resident_bytes(tree: Mapping[str, Any], source: str,
                         provenance: dict[str, Provenance]) -> float:
    if "rank_resident_GiB" not in _processes(tree, source):
        return 0.0
    prov = parse_provenance(dotted_leaf(tree, RESIDENT_KEY), source, RESIDENT_KEY,
                            table="stack")
    provenance[RESIDENT_KEY] = prov
    return _non_negative(prov, source, RESIDENT_KEY) * GiB


def _heap_reuse_bytes(tree: Mapping[str, Any], source: str,
                      provenance: dict[str, Provenance]) -> float:
    """The optional `allocator` section: `heap_reuse_MiB`, in bytes (0 when absent)."""
    section = tree.get("allocator")
    if section is None:
        return 0.0
    if not isinstance(section, Mapping):
        raise ScenarioError(source, "allocator", "a mapping", type(section).__name__)
    extra = set(section) - {"heap_reuse_MiB"}
    if extra:
        raise ScenarioError(source, f"allocator.{sorted(extra)[0]}", "heap_reuse_MiB",
                            sorted(extra)[0])
    prov = parse_provenance(dotted_leaf(tree, HEAP_REUSE_KEY), source, HEAP_REUSE_KEY,
                            table="stack")
    provenance[HEAP_REUSE_KEY] = prov
    return _non_negative(prov, source, HEAP_REUSE_KEY) * MiB


def stack_names() -> list[str]:
    folder = resources.files("zerosim.stacks")
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir()
                  if p.name.endswith(".yaml"))


def builtin_stack_tree(name: str, *, source: str = "<inline>",
                       key_path: str = "runtime.framework") -> dict[str, Any]:
    if name not in stack_names():
        raise ScenarioError(source, key_path, f"a stack name ({', '.join(stack_names())}), "
                            "or a mapping {stack: name or file: path, overrides: {...}}", name)
    path = resources.files("zerosim.stacks") / f"{name}.yaml"
    return parse_yaml_text(path.read_text("utf-8"), f"zerosim/stacks/{name}.yaml")


def _patches_keys(override: Mapping[str, Any]) -> bool:
    """Whether a nested override names keys to patch (`host: {fetch_hook_us: 500}`,
    `kernels: {rotary: {kernels: 10}}`) rather than giving one entry whole: a `{value, basis,
    source}` value, or a module or kernel record with its own `source`."""
    return "value" not in override and "source" not in override


def apply_stack_overrides(tree: Mapping[str, Any], overrides: Mapping[str, Any], *,
                          source: str, key_path: str) -> dict[str, Any]:
    """Patch stack values by dotted key (`host.fetch_hook_us: 500`), or nested
    (`host: {fetch_hook_us: 500}`, as `--set runtime.framework.overrides.host.fetch_hook_us=500`
    gives it), which patches the keys it names, as a profile's overrides do; an entry with its
    own `source` replaces the entry whole (`_patches_keys`). A number keeps the key's unit and
    is recorded with basis `override`; a `{value, basis, source}` mapping replaces the value
    with its provenance."""
    patched = copy.deepcopy(dict(tree))
    flat = flatten_nested(overrides, lambda _, override: _patches_keys(override))
    for dotted, value in flat.items():
        parts = str(dotted).split(".")
        node: Any = patched
        for part in parts[:-1]:
            node = node.get(part) if isinstance(node, Mapping) else None
        leaf = parts[-1]
        if not isinstance(node, dict) or leaf not in node:
            raise ScenarioError(source, f"{key_path}.{dotted}", "an existing stack key", dotted)
        given_provenance = isinstance(value, Mapping) and "value" in value
        if isinstance(node[leaf], Mapping) and "value" in node[leaf] and not given_provenance:
            node[leaf] = {"value": value, "basis": "override", "source": f"override in {source}"}
        else:
            node[leaf] = value
    return patched


def resolve_stack(value: Any, *, source: str, base_dir: Path,
                  key_path: str = "runtime.framework",
                  first: tuple[str, Mapping[str, Any]] | None = None) -> SoftwareStack:
    """`runtime.framework`: a stack name, {stack: name | file: path, overrides: {...}} (no
    stack or file: the default stack), or a whole stack written inline (a mapping with
    `name`). `first`: (where they come from, stack values) patched in before the overrides:
    a hardware alternative's (`hardware.alternative`)."""
    if value is None:
        value = DEFAULT_STACK
    if isinstance(value, str):
        value = {"stack": value}
    if not isinstance(value, Mapping):
        raise ScenarioError(source, key_path, "a stack name or a mapping", value)
    if "name" in value:
        tree = dict(value) if first is None else apply_stack_overrides(
            value, first[1], source=source, key_path=first[0])
        return parse_stack(tree, f"{source}: {key_path}")
    unknown = set(value) - {"stack", "file", "overrides"}
    if unknown or ("stack" in value and "file" in value):
        raise ScenarioError(source, key_path, "at most one of stack: or file:, and optionally "
                            "overrides:", dict(value))
    if "file" not in value:
        value = {"stack": DEFAULT_STACK, **value}
    if "stack" in value:
        tree = builtin_stack_tree(str(value["stack"]), source=source, key_path=key_path)
        origin = f"stack {value['stack']}"
    else:
        path = referenced_path(base_dir, value["file"], source=source,
                               key_path=f"{key_path}.file", what="a software-stack file")
        tree = read_yaml_file(path, referenced_from=source, key_path=f"{key_path}.file")
        origin = str(path)
    overrides = value.get("overrides") or {}
    if not isinstance(overrides, Mapping):
        raise ScenarioError(source, f"{key_path}.overrides", "a mapping of stack keys to values",
                            overrides)
    if first is not None:
        tree = apply_stack_overrides(tree, first[1], source=source, key_path=first[0])
    if overrides:
        tree = apply_stack_overrides(tree, overrides, source=source,
                                     key_path=f"{key_path}.overrides")
    try:
        return parse_stack(tree, origin)
    except ScenarioError as err:
        overridden = err.key_path.removesuffix(".value")
        if overridden in overrides:
            raise ScenarioError(source, f"{key_path}.overrides.{overridden}", err.expected,
                                err.got) from None
        raise


def load_stack(name: str) -> SoftwareStack:
    """A built-in stack by name."""
    return resolve_stack(name, source=f"stack {name}", base_dir=Path("."))
