"""Per-module breakdown of a transformer: parameters, FLOPs, HBM traffic and activation bytes.

A *module* here is what ZeRO-3 fetches as a unit: an `nn.Module` together with the parameters
it owns directly (`recurse=False`), plus the parameter-less ops (attention core, MLP activation,
loss) that carry compute and saved activations. Everything is pure arithmetic on a
`ModelSpec` and a workload; nothing here knows about time or hardware.

Activation accounting follows Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models" (MLSys 2023), adapted per family: 16-bit tensors saved for backward, fused
softmax storing only its 16-bit output under eager attention, and only the fp32 log-sum-exp per
head under flash attention. For Llama-2-13B at s=2048 on the study's stack this gives 29.5 GB
(27.5 GiB) per micro-batch, SwiGLU's saved output included, against the study's "about 27 GB"
of activations.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Literal

from zerosim.models.kernels import (
    FusedAttention,
    Gemm,
    Kernel,
    MemoryPass,
    flash_attention,
    flash_backward,
    linear_backward,
)
from zerosim.models.spec import ModelSpec
from zerosim.units import ordered_sum
from zerosim.vocabulary import Collective

OpClass = Literal["matmul", "attention", "elementwise", "embedding"]
EMBEDDING_KIND = "embedding"
"""`Module.kind` of a lookup table (token or position embeddings), whose input is indices."""
Attention = Literal["eager", "sdpa", "flash"]
"""How attention runs: `eager` (the two batched GEMMs with the softmax between them, its
probabilities stored), `sdpa` (PyTorch's scaled_dot_product_attention, which picks a fused
kernel for 16-bit causal attention, called on K and V expanded to every head) or `flash`
(flash-attn's kernel, which takes grouped K and V as they are). The two fused paths differ
only in the copies around the kernel, which the stack's `kernels.<op>.flash` entries give."""

FP32_BYTES = 4
MASK_BYTES = 1
ELEMENTWISE_FLOPS_PER_ELEMENT = 5


@dataclass(frozen=True)
class Workload:
    """What one micro-batch looks like to the model."""

    sequence_length: int
    micro_batch_size: int = 1
    attention: Attention = "eager"
    activation_checkpointing: bool = False
    checkpoint_in_cpu: bool = False
    """A checkpointed block's input is kept in host memory, not on the GPU (DeepSpeed's
    `CPU_CHECKPOINT`)."""
    dtype_bytes: int = 2
    bfloat16: bool = False
    """16-bit activations in bfloat16 (PyTorch runs some ops differently than in float16: it
    fuses softmax's up-cast for float16 only)."""
    sequence_parallel: int = 1
    """Ulysses sequence parallelism over that many ranks: each holds `sequence_length` over it
    of every sequence, and its attention takes every token of its share of the heads."""
    tiled_mlp_shards: int = 0
    """DeepSpeed's TiledMLP runs each block's gated MLP over slices of the rank's sequence,
    this many (0: not tiled; `_tiled_mlp`)."""
    tiled_mlp_agreed: bool = False
    """The slices are counted on every call of the MLP and agreed over the ranks (Arctic Long
    Sequence Training's: an all-reduce of the count read back by `.item()`, which blocks the
    host on the compute stream before each MLP's forward and recompute)."""
    tiled_loss_shards: int = 0
    """DeepSpeed's TiledFusedLogitsLoss runs the output layer and the loss over slices of the
    rank's tokens, this many, their backward inside the forward (0: not tiled;
    `_tiled_head`)."""
    document_length: int | None = None
    """Each sequence packs documents of this many tokens, and flash attention's
    variable-length path attends within each (None: one document, the whole sequence)."""

    @property
    def attention_span(self) -> int:
        """The tokens a query's document holds, the most its causal attention reads: under
        flash attention the packed document's, else the whole sequence's (eager attention and
        SDPA mask packed documents apart but compute every score)."""
        if self.attention != "flash" or self.document_length is None:
            return self.sequence_length
        return min(self.document_length, self.sequence_length)

    @property
    def fused_attention(self) -> bool:
        """Attention as one fused kernel (flash or SDPA's), which stores no probabilities."""
        return self.attention != "eager"

    @property
    def tokens(self) -> int:
        """The tokens one rank's modules take per micro-batch: its slice of each sequence."""
        return self.sequence_length * self.micro_batch_size // self.sequence_parallel

    @property
    def sequence_per_rank(self) -> int:
        """The tokens of one sequence a rank holds (all of it without sequence parallelism)."""
        return self.sequence_length // self.sequence_parallel


@dataclass(frozen=True)
class Exchange:
    """A collective over a rank's sequence-parallel group that a module runs on the compute
    stream, in line with its kernels (Ulysses's all-to-alls around the attention). `nbytes`
    is its size as `costs.all_to_all` and `costs.ring_collective` take it: the buffer each
    rank sends of an all-to-all, the gathered tensor of an all-gather. `after`: it runs
    after the module's kernels going forward (else before them); `backward`: the backward
    runs it again on the gradient (an all-to-all's backward is the reverse all-to-all), in
    the reverse order."""

    kind: Collective
    nbytes: float
    tensor: str
    """What it exchanges (for the op's name: `q`, `position_ids`, ...)."""
    after: bool = False
    backward: bool = True


@dataclass(frozen=True)
class Elementwise:
    """Memory-bound kernels a stack launches for one op: how many, and the forward HBM bytes
    per element of the tensor they act on (for 16-bit activations), of which
    `strided_bytes_per_element` by kernels on strided or broadcast views (see `MemoryPass`).
    `backward_bytes_per_element` (and its strided part), where the op's backward is read off
    its code; None: the recipe's `backward_bytes_factor` times the forward's;
    `backward_kernels`, how many kernels that backward launches (None: as many as the
    forward). `bf16`: the
    op's kernels in bfloat16 runs, where they differ (None: the same); `flash`: with
    flash-attn's kernel, where they differ (a layout it takes as it is, grouped K and V).
    `transposes_batch`: the op copies a tensor into the layout with the sequence and batch
    dimensions swapped, which at micro-batch 1 is already contiguous: it launches nothing
    there."""

    kernels: int = 0
    bytes_per_element: float = 0.0
    strided_bytes_per_element: float = 0.0
    backward_bytes_per_element: float | None = None
    backward_strided_bytes_per_element: float = 0.0
    backward_kernels: int | None = None
    bf16: Elementwise | None = None
    flash: Elementwise | None = None
    transposes_batch: bool = False
    softmax_bytes_per_element: float = 0.0
    """Of the contiguous bytes, those PyTorch's softmax kernel moves (`MemoryPass`)."""
    backward_softmax_bytes_per_element: float = 0.0
    source_bytes_per_element: float = 0.0
    """Bytes per element of the op's source where it is smaller than what the op writes (a
    broadcast copy reads each source element once; its backward, a sum, writes each once),
    forward and backward besides the per-element bytes, strided in the same share."""
    unfused: Elementwise | None = None
    """The scores' kernels where the stack's fused softmax kernel does not serve the shape
    (`Recipe.fused_softmax`; None: the same)."""
    sinks: Elementwise | None = None
    """The scores' kernels of a model with attention sinks (`ModelSpec.attention_sinks`:
    GPT-OSS joins them to the scores before its softmax; None: the same)."""


@dataclass(frozen=True)
class ScoreMemory:
    """What eager attention holds per attention score, in bytes for 16-bit training (scaled by
    the activation dtype's size / 2): `saved` from its forward to its backward,
    `forward_workspace` while its forward (or recompute) runs, `backward_workspace` while its
    backward runs besides what is saved, and `buffer` in a persistent buffer every layer reuses.

    The default is the textbook count: 16-bit probabilities saved, an fp32 softmax output
    while the forward runs. `bf16`: what it holds in bfloat16 runs, where that differs (None:
    the same)."""

    saved: float = 2.0
    forward_workspace: float = 4.0
    backward_workspace: float = 0.0
    buffer: float = 0.0
    bf16: ScoreMemory | None = None
    unfused: ScoreMemory | None = None
    """What it holds where the fused softmax kernel does not serve the shape (None: the
    same)."""
    sinks: ScoreMemory | None = None
    """What it holds for a model with attention sinks, in either 16-bit dtype (None: the
    same)."""


@dataclass(frozen=True)
class LossMemory:
    """What the loss holds per logit, in bytes: `saved` from its forward to its backward (None:
    the logits in the training dtype and their fp32 copy, the textbook count), `transient`
    besides that while its forward runs (the framework's casts and copies), `backward`
    besides the saved bytes while its backward runs (the gradients it makes, up to the one of
    the 16-bit logits it hands to the LM head)."""

    saved: float | None = None
    transient: float = 0.0
    backward: float = 0.0

    def saved_bytes(self, dtype_bytes: int) -> float:
        return dtype_bytes + FP32_BYTES if self.saved is None else self.saved


@dataclass(frozen=True)
class ActivationMemory:
    """What a norm and an MLP's activation keep for their backward, in bytes for 16-bit
    training (scaled by the activation dtype's size / 2). The default is a fused norm's
    (its 16-bit input per element and an fp32 statistic per row, apex's RMSNorm) and an
    activation that saves only its inputs (one for GELU, the gate's and the up projection's
    outputs for a gated one)."""

    norm_saved: float = 2.0
    """Per element of the normed tensor."""
    norm_saved_per_row: float = FP32_BYTES
    """Per token (a row's statistic)."""
    layer_norm_saved: float | None = None
    """A LayerNorm's, where the stack runs it otherwise than its RMSNorm (`Recipe.layer_norm`;
    None: `norm_saved`)."""
    layer_norm_saved_per_row: float | None = None
    """A LayerNorm's per token (its mean and inverse deviation; None: `norm_saved_per_row`)."""
    activation_saved: float = 2.0
    """Per intermediate element of an ungated MLP."""
    gated_activation_saved: float = 4.0
    """Per intermediate element of a gated MLP (SwiGLU, GeGLU)."""


@dataclass(frozen=True)
class UngatedActivation:
    """An ungated MLP's activation function as a stack's code runs it: its kernels, per
    intermediate element, and what it keeps for its backward (bytes per intermediate element
    for 16-bit training, its input included)."""

    kernels: Elementwise
    saved: float


ANY_ACTIVATION = "*"
"""The `Recipe.ungated_activations` entry for a function the stack does not list by name."""


@dataclass(frozen=True)
class Recipe:
    """How a software stack cuts a transformer block into modules and which memory-bound
    kernels each launches besides its GEMMs (`zerosim/stacks` builds one from a stack file).

    `fused_qkv`: one projection for Q, K and V (Megatron's `query_key_value`) instead of three;
    `fused_gate_up`: one projection for the SwiGLU gate and up halves (`dense_h_to_4h`).
    `external_output_weight`: the model's forward reads the output layer's weight itself
    (Megatron's `parallel_lm_logits(lm_output, output_layer.weight)`) instead of calling the
    output layer: to ZeRO-3 the untied head is an external parameter of the top module.
    `syncs_before_mlp`: host-blocking synchronisations a block's forward makes between its
    attention and its MLP (Megatron-DeepSpeed creates two scalars on the GPU there, each a
    blocking copy), so the host waits for the attention to finish before it calls the MLP.
    `grouped_qkv`: how a model with grouped-query attention has its Q, K and V projections
    cut where the stack cuts them otherwise than `fused_qkv` says (`QKV_LAYOUTS`; None: as
    `fused_qkv` says): Megatron-DeepSpeed as the Deep Optimizer States study ran it (early
    2024) made Q one projection and K and V another.
    `fused_experts`: a mixture-of-experts block holds every expert's weights in one module
    (transformers 5's `MixtralExperts`, `Qwen3MoeExperts`: a gate-up and a down tensor of
    `[experts, ...]`) that ZeRO-3 fetches at once and runs with grouped GEMMs, instead of one
    module per expert (an `nn.ModuleList` of MLPs: transformers 4).
    `moe_block_leaf`: the training script marks each mixture-of-experts block a ZeRO-3 leaf
    (DeepSpeed's `set_z3_leaf_modules`, as LLaMA-Factory does for MoE models): the block's
    hooks gather every parameter under it at once, its children fire no hooks, and their
    gradients are reduced when the block's backward ends (`zerosim.models.leaves`, which
    the plan applies under ZeRO-3). `module_tree`: how the framework wraps the layers in its
    top-level modules (`leaves.MODULE_TREES`), which the granularity threshold reads.
    `kv_repeat_before_rotary`: grouped-query attention's K and V are expanded to every head
    right after the QKV split, whatever the attention kernel, and the rotary embedding acts on
    the expanded K (Megatron-DeepSpeed); otherwise they are expanded inside eager attention,
    after the rotary embedding (transformers).
    Elementwise ops, each per element of: `norm` its input (`layer_norm` for a model whose
    norms are LayerNorms, `ModelSpec.norm` layer, where the stack runs them otherwise; None:
    as `norm`); `projection_split` the output of
    a projection that makes more than one of Q, K and V (`qkv_layout` fused: Q, K and V; q_kv:
    K and V), split into them by views, whose backward gathers their gradients back into one
    tensor; `query_split` Q (the copy out of
    the fused QKV output, grouped-query attention in the fused layout only); `rotary` Q and K
    (or the expanded K); `kv_repeat` the repeated K and V (grouped-query attention);
    `attention_inputs` Q, K and V (K and V as the kernel reads them) copied into the layout a
    fused attention kernel takes; `matmul_inputs` Q, K and V (K and V with their own heads)
    copied into the `[batch x heads, s, d]` layout eager attention's batched products take,
    where the stack's attention holds them as views of the projections' output, and each
    gradient copied back through the projection's view (K and V that a `kv_repeat` copy
    expanded are already in that layout: only their gradients' copies); `score_operands` Q
    and K as eager attention's score
    product reads them (what the product does to them besides the GEMM, a scale folded into
    it: Megatron's `baddbmm(alpha=...)` scales both gradients in its backward); `scores`
    the attention scores (eager only, besides the two batched GEMMs); `context` the attention
    output (the layout copy before the output projection); `activation` the MLP's
    intermediate; `residual` the hidden state (twice per block); `softcap` the scores or the
    logits a model caps (`ModelSpec.attention_softcap`, `logit_softcap`); `loss` the
    logits; under Ulysses sequence parallelism (`Workload.sequence_parallel`),
    `ulysses_inputs` Q, K and V as exchanged (laid out for the all-to-all and then for the
    attention kernel), `ulysses_kv_repeat` K and V replicated where the group outnumbers their
    heads, `ulysses_output` the attention output laid back after its all-to-all and
    `ulysses_output_batch` the copies that only a micro-batch above 1 makes there. A
    memory-bound kernel's backward moves its op's `backward_bytes_per_element` where the stack
    reads it off the code (in its `backward_kernels`), else `backward_bytes_factor` times its
    forward bytes, in as many kernels. `score_memory` is what eager attention keeps per
    score, `loss_memory` what the loss keeps per logit, `activation_memory` what a norm and
    an MLP's activation keep. `fused_softmax`: the shapes the
    stack's fused softmax kernel serves, where `scores` and `score_memory` have an `unfused`
    variant for the others.

    The default is the bare arithmetic: one-pass norms, activation and loss, nothing else.
    """

    fused_qkv: bool = False
    fused_gate_up: bool = False
    external_output_weight: bool = False
    syncs_before_mlp: int = 0
    grouped_qkv: str | None = None
    fused_experts: bool = False
    moe_block_leaf: bool = False
    module_tree: str = "transformers"
    deepspeed_checkpointing: bool = False
    """Blocks are checkpointed by `deepspeed.checkpointing.checkpoint` (Megatron-DeepSpeed with
    `--deepspeed-activation-checkpointing`), not `torch.utils.checkpoint`."""
    sequence_parallel: str = "none"
    """How the framework runs Ulysses (`ULYSSES_PATHS`): `none`, `ulysses_hf` (DeepSpeed's
    UlyssesSPAttentionHF in transformers' attention: the position ids gathered, K and V
    replicated where the group outnumbers their heads) or `distributed_attention` (DeepSpeed's
    DistributedAttention around Megatron-DeepSpeed's: K and V exchanged as the attention takes
    them, expanded to every head where the stack expands them first)."""
    packed_documents: str = "none"
    """What flash attention does with packed documents (`PACKED_DOCUMENTS_CHOICES`): `none`
    (it attends over the whole sequence) or `varlen` (each document within itself)."""
    kv_repeat_before_rotary: bool = False
    norm: Elementwise = Elementwise(1, 4)
    layer_norm: Elementwise | None = None
    projection_split: Elementwise = Elementwise()
    query_split: Elementwise = Elementwise()
    rotary: Elementwise = Elementwise()
    kv_repeat: Elementwise = Elementwise()
    attention_inputs: Elementwise = Elementwise()
    matmul_inputs: Elementwise = Elementwise()
    score_operands: Elementwise = Elementwise()
    scores: Elementwise = Elementwise()
    context: Elementwise = Elementwise()
    activation: Elementwise = Elementwise(1, 6)
    residual: Elementwise = Elementwise()
    softcap: Elementwise = Elementwise()
    loss: Elementwise = Elementwise(1, 10)
    ulysses_inputs: Elementwise = Elementwise()
    ulysses_kv_repeat: Elementwise = Elementwise()
    ulysses_output: Elementwise = Elementwise()
    ulysses_output_batch: Elementwise = Elementwise()
    backward_bytes_factor: float = 2.0
    score_memory: ScoreMemory = ScoreMemory()
    loss_memory: LossMemory = LossMemory()
    activation_memory: ActivationMemory = ActivationMemory()
    fused_softmax: FusedSoftmax | None = None
    ungated_activations: tuple[tuple[str, UngatedActivation], ...] = ()
    """An ungated MLP's activation by the name its model's config gives
    (`ModelSpec.activation`), `ANY_ACTIVATION` for the others; with no entry, `activation`
    priced for one input and `activation_memory.activation_saved` kept."""
    fused_linear_loss: bool = False
    """The model's forward hands the output weight and its hidden states to Liger-Kernel's
    LigerFusedLinearCrossEntropy (`runtime.liger_kernel`), which computes the logits, the loss
    and their gradients chunk by chunk without materialising the logits (`_fused_linear_loss`);
    the output layer's own forward is never called, so to ZeRO-3 its weight is an external
    parameter of the top module. `loss` is then the chunk's cross-entropy kernel."""

    def ungated_activation(self, name: str) -> UngatedActivation | None:
        """How the stack runs the ungated activation `name` (None: not listed)."""
        listed = dict(self.ungated_activations)
        return listed.get(name, listed.get(ANY_ACTIVATION))


@dataclass(frozen=True)
class FusedSoftmax:
    """The shapes a stack's fused softmax kernel serves: key lengths from `min_keys` to
    `max_keys`, query and key lengths and attention batches (micro-batch x heads) multiples
    of `multiple_of` (Megatron's `FusedScaleMaskSoftmax.is_kernel_available`); other shapes
    take the framework's unfused path (`kernels.scores.unfused`)."""

    min_keys: int
    max_keys: int
    multiple_of: int = 1

    def serves(self, sequence_length: int, attention_batches: int) -> bool:
        s, m = sequence_length, self.multiple_of
        return (self.min_keys <= s <= self.max_keys and s % m == 0
                and attention_batches % m == 0)


QKV_LAYOUTS = ("fused", "q_kv", "separate")
"""How Q, K and V are projected: one projection, Q apart from a fused K and V, or three."""


def qkv_layout(spec: ModelSpec, r: Recipe) -> str:
    """The model's Q/K/V projections under the stack (`QKV_LAYOUTS`): the stack's grouped
    layout for grouped-query attention where it has one, else fused where the stack or the
    model's own code fuses them (Megatron's `query_key_value`, GPT-2's `c_attn`)."""
    if spec.kv_hidden_size < spec.q_size and r.grouped_qkv is not None:
        return r.grouped_qkv
    return "fused" if r.fused_qkv or spec.fused_qkv else "separate"


STRIDED_DTYPE_BYTES = 2
"""The element size the strided path's rate is of: PyTorch's non-vectorized elementwise path
loads one element at a time, so 16-bit elements stream at `gpu.strided_memory_efficiency`, and
32-bit ones near STREAM's rate (HF's float32 add and RMSNorm, whose products broadcast, on an
H100: zerosim/validation/data/liger_pytorch_ops.yaml); an fp32 run's strided bytes are
priced as contiguous."""


def op_for(op: Elementwise, w: Workload) -> Elementwise:
    """The variant of a stack's op that the workload runs."""
    if w.attention == "flash" and op.flash is not None:
        op = op.flash
    if w.bfloat16 and op.bf16 is not None:
        op = op.bf16
    return op


def elementwise_pass(op: Elementwise, elements: float, w: Workload, flops: float = 0.0,
                     source_elements: float = 0.0) -> tuple[MemoryPass, ...]:
    """A stack's op over `elements` elements (read from `source_elements`, where it reads a
    smaller tensor once: `Elementwise.source_bytes_per_element`) as the kernels it launches
    (none if it launches none; its `flash` variant with flash-attn's kernel, its `bf16` one in
    bfloat16 runs): its bytes at the workload's element size, the strided ones only in 16-bit
    runs."""
    op = op_for(op, w)
    if (not (op.kernels or op.backward_kernels)
            or (op.transposes_batch and w.micro_batch_size == 1)):
        return ()
    size = w.dtype_bytes / 2
    source = op.source_bytes_per_element * size * source_elements
    sixteen_bit = w.dtype_bytes == STRIDED_DTYPE_BYTES

    def moved(per_element: float, strided_per_element: float) -> tuple[float, float]:
        """Bytes and strided bytes: the source's in the same strided share as the rest."""
        strided = strided_per_element if sixteen_bit else 0.0
        share = strided / per_element if per_element else 0.0
        return (per_element * size * elements + source,
                strided * size * elements + share * source)

    nbytes, strided = moved(op.bytes_per_element, op.strided_bytes_per_element)
    backward, backward_strided = (
        (None, 0.0) if op.backward_bytes_per_element is None
        else moved(op.backward_bytes_per_element, op.backward_strided_bytes_per_element))
    return (MemoryPass(nbytes, op.kernels, flops, strided, backward, backward_strided,
                       op.softmax_bytes_per_element * size * elements,
                       op.backward_softmax_bytes_per_element * size * elements,
                       op.backward_kernels),)


@dataclass(frozen=True)
class Module:
    """One fetch unit or parameter-less op, with its per-micro-batch costs.

    `saved_bytes` stay allocated from this module's forward until its backward;
    `transient_bytes` live only while its forward (or recompute) runs, `backward_transient_bytes`
    only while its backward runs; `buffer_bytes` is a persistent framework buffer it writes
    into, which every module of its kind reuses (the run holds the largest). `model_flops` is the
    forward work counted the conventional way (dense attention, no recompute), used for TFLOPS;
    `fwd_flops` is what the kernels execute (flash attention skips the masked half).
    `param_numels` lists the module's own parameter tensors (weight, then bias), and
    `one_dimensional` which of them are vectors (a bias, a norm's weight or bias, GPT-OSS's
    sinks; empty: none), which a framework may give the optimizer as a group of their own
    (`Recipe.vector_param_group`);
    `param_shapes` gives each tensor's shape where it has more than one dimension (empty:
    every tensor a vector of its numel; `shapes_of`), which qgZ's quantization groups follow;
    `recompute_bytes` are the activations a checkpointed block re-creates for this module.
    `kernels` and `backward_kernels` are what its forward and backward launch on the GPU.
    `external`: its weights are read by the enclosing module's forward, not through its own
    (see `Recipe.external_output_weight`). `host_syncs`: blocking synchronisations the host
    makes on the compute stream just before this module's forward (and its recompute), before
    its hooks run (see `Recipe.syncs_before_mlp`).
    """

    name: str
    kind: str
    op: OpClass
    layer: int | None
    params: int
    fwd_flops: float
    model_flops: float
    fwd_hbm_bytes: float
    saved_bytes: float
    transient_bytes: float = 0.0
    backward_transient_bytes: float = 0.0
    buffer_bytes: float = 0.0
    param_numels: tuple[int, ...] = ()
    one_dimensional: tuple[bool, ...] = ()
    param_shapes: tuple[tuple[int, ...], ...] = ()
    recompute_bytes: float = 0.0
    kernels: tuple[Kernel, ...] = ()
    backward_kernels: tuple[Kernel, ...] = ()
    external: bool = False
    host_syncs: int = 0
    keeps_gathered_for: int = 0
    """How many of the modules after this one run before its gathered parameters are released
    (a ZeRO-3 leaf's hook releases them after its last child: `zerosim.models.leaves`)."""
    checkpoint_bytes: float = 0.0
    """The first module of a checkpointed block: the block's input, which the checkpoint keeps
    for the block's recompute, in `saved_bytes` or, with `Workload.checkpoint_in_cpu`, in host
    memory."""
    exchanges: tuple[Exchange, ...] = ()
    """Collectives over the sequence-parallel group in line with its kernels, in issue order
    (Ulysses's attention core: `ulysses_exchanges`)."""
    tiled_span: int = 0
    """The first module of a tiled call (an MLP, `_tiled_mlp`; a loss's output layer,
    `_tiled_head`): how many of the modules after it the call runs. Under ZeRO-3 their
    parameters are gathered together before the call (forward, recompute, backward) and kept
    until it ends."""
    repeated_hooks: tuple[int, int] = (0, 0)
    """ZeRO-3 hook calls a tiled MLP's modules with parameters (or a tiled loss's output
    layer) make beyond one each, with their parameters already gathered (each slice calls
    them again): in its forward (and its recompute), and in its backward
    (`SoftwareStack.repeat_hook_share` prices them)."""
    backward_in_forward: bool = False
    """Its backward runs inside the forward (a tiled loss's output layer): no hook fires
    before it in the backward, which finds its gradients made."""
    backward_host_syncs: int = 0
    """Blocking synchronisations the host makes on the compute stream as its backward starts
    (Liger-Kernel's fused loss compares the loss's gradient with 1.0 by `torch.equal`)."""


def _with_backward(module: Module, kernels: tuple[Kernel, ...], r: Recipe) -> Module:
    """Attach forward kernels and derive the backward's: two GEMMs per linear GEMM, four
    batched GEMMs for eager attention's two, 2.5x a fused attention kernel's FLOPs, and each
    memory-bound pass's backward (`MemoryPass.backward`)."""
    backward: list[Kernel] = []
    for kernel in kernels:
        if isinstance(kernel, Gemm):
            backward.extend(linear_backward(kernel))
        elif isinstance(kernel, FusedAttention):
            backward.append(flash_backward(kernel))
        else:
            backward.append(kernel.backward(r.backward_bytes_factor))
    traffic = ordered_sum(k.nbytes for k in kernels)
    return replace(module, kernels=kernels, backward_kernels=tuple(backward),
                   fwd_hbm_bytes=traffic)


def vector_flags(module: Module) -> tuple[bool, ...]:
    """For each of the module's parameter tensors, whether it is one-dimensional."""
    return module.one_dimensional or (False,) * len(module.param_numels)


def shapes_of(module: Module) -> tuple[tuple[int, ...], ...]:
    """Each of the module's parameter tensors' shape (a vector where none is given)."""
    return module.param_shapes or tuple((numel,) for numel in module.param_numels)


GRADIENT_SUM_ELEMENTS = 3
"""Elements autograd's InputBuffer moves per element of a tensor that feeds several ops, for
each gradient after the first: `old + new` (or its in-place form), read 2, write 1."""


def input_gradient_sum(elements: float, w: Workload) -> MemoryPass:
    """The sum of one more gradient into a shared input's (torch/csrc/autograd/input_buffer.cpp
    `InputBuffer::add`): one kernel, when the later gradient arrives."""
    return MemoryPass(GRADIENT_SUM_ELEMENTS * w.dtype_bytes * elements, 1, elements)


def _linear(name: str, layer: int | None, d_in: int, d_out: int, bias: bool, w: Workload,
            saves_input: bool, r: Recipe, after: tuple[MemoryPass, ...] = (), *,
            tokens: float | None = None, sums_input_gradient: bool = False) -> Module:
    """A linear layer over `tokens` rows (the micro-batch's tokens unless an expert sees
    fewer). `sums_input_gradient`: its input feeds a projection later in the forward too,
    whose backward runs first, so autograd adds this one's input gradient to that one's."""
    t = w.tokens if tokens is None else tokens
    numels = (d_in * d_out, d_out) if bias else (d_in * d_out,)
    params = sum(numels)
    flops = 2.0 * d_in * d_out * t
    saved = w.dtype_bytes * d_in * t if saves_input else 0.0
    module = Module(name, "linear", "matmul", layer, params, flops, flops, 0.0, saved,
                    param_numels=numels, one_dimensional=(False, True)[:len(numels)],
                    param_shapes=((d_out, d_in), (d_out,))[:len(numels)])
    gemm = Gemm(t, d_out, d_in, dtype_bytes=w.dtype_bytes)
    module = _with_backward(module, (gemm, *after), r)
    if not sums_input_gradient:
        return module
    return replace(module, backward_kernels=(*module.backward_kernels,
                                             input_gradient_sum(d_in * t, w)))


def _norm(name: str, layer: int | None, h: int, bias: bool, w: Workload, r: Recipe, *,
          rows_per_token: int = 1, after: tuple[MemoryPass, ...] = ()) -> Module:
    """A norm over rows of `h` elements, `rows_per_token` of them per token (a per-head norm
    of Q or K normalises each head's row of `head_dim`), then the kernels `after` it (a
    residual add after a post-norm). `bias`: a LayerNorm (weight and bias), which the stack
    may run otherwise than its RMSNorm (`Recipe.layer_norm`)."""
    numels = (h, h) if bias else (h,)
    rows = rows_per_token * w.tokens
    elements = h * rows
    memory, scale = r.activation_memory, w.dtype_bytes / 2
    kernels, per_element, per_row = r.norm, memory.norm_saved, memory.norm_saved_per_row
    if bias and r.layer_norm is not None:
        kernels = r.layer_norm
        per_element = _given(memory.layer_norm_saved, per_element)
        per_row = _given(memory.layer_norm_saved_per_row, per_row)
    saved = per_element * scale * elements + per_row * rows
    flops = ELEMENTWISE_FLOPS_PER_ELEMENT * elements
    module = Module(name, "norm", "elementwise", layer, sum(numels), flops, 0.0, 0.0, saved,
                    param_numels=numels, one_dimensional=(True,) * len(numels))
    return _with_backward(module, (*elementwise_pass(kernels, elements, w, flops), *after), r)


def _given(value: float | None, otherwise: float) -> float:
    return otherwise if value is None else value


def exchanged_kv_width(spec: ModelSpec, w: Workload, r: Recipe) -> int:
    """Per token of a rank's slice, the width of K (and of V) that Ulysses exchanges and the
    attention gets. DistributedAttention takes them as the stack hands them over (expanded to
    every head where it expands them before the rotary embedding); UlyssesSPAttentionHF their
    own heads where the group's size divides them, else each rank one head of them,
    replicated first (`kv_replication_factor`), so the group exchanges as many heads as it has
    ranks. Without sequence parallelism, their width."""
    size, hkv = w.sequence_parallel, spec.kv_hidden_size
    if size == 1:
        return hkv
    if r.sequence_parallel == "distributed_attention":
        return spec.q_size if r.kv_repeat_before_rotary else hkv
    if spec.num_key_value_heads % size == 0:
        return hkv
    return size * spec.head_dim


def kv_width(spec: ModelSpec, w: Workload, r: Recipe) -> int:
    """The width per token of K (and of V) as the attention kernels read and save them:
    grouped-query attention's K and V expanded to every head where the stack expands them
    before the rotary embedding, or inside the attention where the path launches the copies
    (eager attention, SDPA; not flash-attn's kernel, which takes the groups as they are); as
    Ulysses exchanges them otherwise (`exchanged_kv_width`)."""
    q, hkv = spec.q_size, exchanged_kv_width(spec, w, r)
    if hkv < q and (r.kv_repeat_before_rotary or op_for(r.kv_repeat, w).kernels):
        return q
    return hkv


def split_width(spec: ModelSpec, r: Recipe) -> int:
    """The width per token of what a fused projection makes that the attention splits into
    Q, K and V (`projection_split`): all three in the fused layout, K and V in `q_kv`."""
    layout, q, hkv = qkv_layout(spec, r), spec.q_size, spec.kv_hidden_size
    return {"fused": q + 2 * hkv, "q_kv": 2 * hkv}.get(layout, 0)


def _attention_kernels(spec: ModelSpec, w: Workload, r: Recipe) -> tuple[Kernel, ...]:
    """The attention core's kernels in issue order. With grouped-query attention, Q is
    copied out of a fused QKV output (`query_split`), and a stack that expands K and V before
    the rotary embedding (`Recipe.kv_repeat_before_rotary`) does so whatever the attention
    kernel, its rotary embedding then acting on the expanded K; otherwise the attention path
    expands them after the rotary embedding (or, flash-attn, not at all). A fused kernel may
    need its inputs copied into its layout first (`attention_inputs`)."""
    q, hkv, a, s = spec.q_size, spec.kv_hidden_size, spec.num_attention_heads, \
        w.sequence_length
    t, d, heads = w.tokens, spec.head_dim, a * w.micro_batch_size // w.sequence_parallel
    grouped = hkv < q
    early = grouped and r.kv_repeat_before_rotary
    width = split_width(spec, r)
    projection = elementwise_pass(r.projection_split, t * width, w) if width else ()
    split = (elementwise_pass(r.query_split, t * q, w)
             if grouped and qkv_layout(spec, r) == "fused" else ())
    repeated = {"elements": 2 * t * q, "w": w, "source_elements": 2 * t * hkv}
    early_repeat = elementwise_pass(r.kv_repeat, **repeated) if early else ()
    key_width = q if early else hkv
    rotary = (elementwise_pass(r.rotary, t * (q + key_width), w)
              if spec.position_embedding == "rotary" else ())
    exchanged_kv = exchanged_kv_width(spec, w, r)
    repeat = (elementwise_pass(r.kv_repeat, 2 * t * q, w, source_elements=2 * t * exchanged_kv)
              if exchanged_kv < q and not early else ())
    exchanged, laid_back = _ulysses_kernels(spec, w, r)
    before = (*projection, *split, *early_repeat, *rotary, *exchanged, *repeat)
    context = (*elementwise_pass(r.context, t * q, w), *laid_back)
    if w.fused_attention:
        kv = kv_width(spec, w, r)
        inputs = elementwise_pass(r.attention_inputs, t * (q + 2 * kv), w)
        fused = flash_attention(t, w.attention_span, q, kv, d, w.dtype_bytes)
        return (*before, *inputs, fused, *context)
    query, key, value = _matmul_inputs(spec, w, r)
    scores = Gemm(s, s, d, heads, w.dtype_bytes)
    operands = elementwise_pass(r.score_operands, t * (q + kv_width(spec, w, r)), w)
    mix = Gemm(s, d, s, heads, w.dtype_bytes)
    capped = elementwise_pass(r.softcap, a * s * t, w) if spec.attention_softcap else ()
    softmax = elementwise_pass(_scores_op(spec, w, r), a * s * t, w)
    return (*before, *query, *key, scores, *operands, *capped, *softmax, *value, mix,
            *context)


POSITION_ID_BYTES = 8
"""transformers' position ids are int64."""


def _position_ids_bytes(w: Workload) -> int:
    """The position ids of a micro-batch's whole sequences, as Ulysses gathers them."""
    return POSITION_ID_BYTES * w.micro_batch_size * w.sequence_length


def _ulysses_kernels(spec: ModelSpec, w: Workload, r: Recipe
                     ) -> tuple[tuple[MemoryPass, ...], tuple[MemoryPass, ...]]:
    """The kernels around Ulysses's all-to-alls (none without sequence parallelism): before
    the attention, `UlyssesSPAttentionHF`'s position ids gathered over the group copied out of
    NCCL's flat buffer into each rank's tensor and joined (`torch.cat`: one kernel each, no
    gradient) and its K and V replicated where the group outnumbers their heads
    (`repeat_interleave`); Q, K and V laid out for the exchange (and for the kernel); after
    it, the output laid back into the rank's slice (the stack's `ulysses_*` entries)."""
    size = w.sequence_parallel
    if size == 1:
        return (), ()
    t, q, hkv = w.tokens, spec.q_size, spec.kv_hidden_size
    kv = exchanged_kv_width(spec, w, r)
    hf = r.sequence_parallel == "ulysses_hf"
    gathered = ((MemoryPass(4 * _position_ids_bytes(w), size + 1, backward_nbytes=0.0,
                            backward_count=0),) if hf else ())
    repeat = (elementwise_pass(r.ulysses_kv_repeat, 2 * t * kv, w, source_elements=2 * t * hkv)
              if hf and kv != hkv else ())
    inputs = elementwise_pass(r.ulysses_inputs, t * (q + 2 * kv), w)
    output = (*elementwise_pass(r.ulysses_output, t * q, w),
              *elementwise_pass(r.ulysses_output_batch, t * q, w))
    return (*gathered, *repeat, *inputs), output


def ulysses_exchanges(spec: ModelSpec, w: Workload, r: Recipe) -> tuple[Exchange, ...]:
    """Ulysses's collectives over the group (none without sequence parallelism):
    `UlyssesSPAttentionHF.forward` first all-gathers the position ids (one per token of the
    whole sequences; no gradient); then Q, K and V are each all-to-all'd, every rank sending
    its whole slice ([group, slice, batch, its heads, head dim]), the attention runs, and its
    output is all-to-all'd back (`_partition_global_sequence`; DistributedAttention's
    `_SeqAllToAll` likewise)."""
    if w.sequence_parallel == 1:
        return ()
    t, size = w.tokens, w.dtype_bytes
    q, kv = spec.q_size, exchanged_kv_width(spec, w, r)
    positions = ((Exchange(Collective.ALL_GATHER, _position_ids_bytes(w), "position_ids",
                           backward=False),) if r.sequence_parallel == "ulysses_hf" else ())
    return (*positions,
            *(Exchange(Collective.ALL_TO_ALL, size * t * width, name)
              for name, width in (("q", q), ("k", kv), ("v", kv))),
            Exchange(Collective.ALL_TO_ALL, size * t * q, "output", after=True))


ULYSSES_BUFFERS = 2
"""What Ulysses holds at once, per element of the tensors it exchanges: each tensor's layout
copy for the all-to-all and the all-to-all's output, until the copy into the kernel's layout
(which the attention keeps) is made and they go."""


def _ulysses_workspace(spec: ModelSpec, w: Workload, r: Recipe) -> float:
    """The bytes `ULYSSES_BUFFERS` come to for Q, K and V (the larger side: the output's
    exchange holds as much for Q alone), going forward and, for their gradients, back."""
    if w.sequence_parallel == 1:
        return 0.0
    q, kv = spec.q_size, exchanged_kv_width(spec, w, r)
    return ULYSSES_BUFFERS * w.dtype_bytes * w.tokens * (q + 2 * kv)


def _sinks_module(spec: ModelSpec, p: str, layer: int, w: Workload, r: Recipe) -> Module:
    """GPT-OSS's attention module owns one parameter of its own, a sink logit per head: its
    hooks fetch it before the projections' (no kernel of its own; eager attention joins the
    sinks to the scores, the `scores` entry's `sinks` variant)."""
    heads = spec.num_attention_heads
    return Module(f"{p}.{NAMES[spec.family].attention}", "sinks", "elementwise", layer, heads,
                  0.0, 0.0, 0.0, 0.0, param_numels=(heads,), one_dimensional=(True,))


SOFTCAP_SAVED_ELEMENTS = 1
"""Per capped element, 16-bit tensors `cap * tanh(x / cap)` keeps for its backward: tanh's
output (the division and the product by a number keep nothing)."""


def _softcap_saved(capped: bool, elements: float, w: Workload) -> float:
    return SOFTCAP_SAVED_ELEMENTS * w.dtype_bytes * elements if capped else 0.0


def _matmul_inputs(spec: ModelSpec, w: Workload, r: Recipe
                   ) -> tuple[tuple[MemoryPass, ...], ...]:
    """Eager attention's copies of Q, K and V into its batched products' layout
    (`Recipe.matmul_inputs`), each over its own heads: Q's before the score product, K's with
    it, V's before the product with the probabilities. K and V that grouped-query attention
    expanded with a copy (`kv_repeat`) reach the products in their layout, so only their
    gradients are copied, on their way back through the projections' views."""
    t, q, hkv = w.tokens, spec.q_size, spec.kv_hidden_size
    query = elementwise_pass(r.matmul_inputs, t * q, w)
    grouped = elementwise_pass(r.matmul_inputs, t * hkv, w)
    expanded = kv_width(spec, w, r) != hkv
    key = tuple(_backward_only(p, r.backward_bytes_factor) for p in grouped) if expanded \
        else grouped
    return query, key, key


def _backward_only(forward: MemoryPass, factor: float) -> MemoryPass:
    """A pass whose forward launches nothing and whose backward is `forward`'s."""
    backward = forward.backward(factor)
    return MemoryPass(0.0, 0, 0.0, 0.0, backward.nbytes, backward.strided_nbytes,
                      backward_count=backward.count)


def _fused_output_kept_apart(spec: ModelSpec, w: Workload, r: Recipe) -> float:
    """A fused attention kernel saves its output for its backward; where the stack copies
    that output into another layout (`context`) the output projection saves the copy, so the
    kernel's own is held besides (none where the projection reads it as it is)."""
    t, q = w.tokens, spec.q_size
    return w.dtype_bytes * t * q if elementwise_pass(r.context, t * q, w) else 0.0


def _softmax_unfused(spec: ModelSpec, w: Workload, r: Recipe) -> bool:
    """Eager attention's softmax takes the framework's unfused path: the stack's fused kernel
    does not serve this sequence length or batch of heads."""
    fused = r.fused_softmax
    return fused is not None and not fused.serves(
        w.sequence_length, w.micro_batch_size * spec.num_attention_heads // w.sequence_parallel)


def _scores_op(spec: ModelSpec, w: Workload, r: Recipe) -> Elementwise:
    if spec.attention_sinks and r.scores.sinks is not None:
        return r.scores.sinks
    if _softmax_unfused(spec, w, r) and r.scores.unfused is not None:
        return r.scores.unfused
    return r.scores


def _score_memory(spec: ModelSpec, w: Workload, r: Recipe) -> ScoreMemory:
    memory = r.score_memory
    if spec.attention_sinks and memory.sinks is not None:
        return memory.sinks
    if _softmax_unfused(spec, w, r) and memory.unfused is not None:
        memory = memory.unfused
    return memory.bf16 if w.bfloat16 and memory.bf16 is not None else memory


def _attention_core(spec: ModelSpec, layer: int, w: Workload, dropout: bool,
                    r: Recipe) -> Module:
    q, t = spec.q_size, w.tokens
    dense_flops = 4.0 * t * w.attention_span * q
    qkv_saved = w.dtype_bytes * t * (q + 2 * kv_width(spec, w, r))
    workspace = flash_backward_workspace(spec.num_attention_heads, spec.head_dim, w,
                                         grouped_kv=kv_width(spec, w, r) < q)
    core = _with_backward(_core_module(spec, layer, w, r, dense_flops, qkv_saved, dropout,
                                       _fused_output_kept_apart(spec, w, r), workspace),
                          _attention_kernels(spec, w, r), r)
    if w.sequence_parallel == 1:
        return core
    workspace = _ulysses_workspace(spec, w, r)
    return replace(core, exchanges=ulysses_exchanges(spec, w, r),
                   transient_bytes=core.transient_bytes + workspace,
                   backward_transient_bytes=core.backward_transient_bytes + workspace)


def flash_backward_workspace(heads: int, head_dim: int, w: Workload, *,
                             grouped_kv: bool) -> float:
    """What flash-attn 2's backward (`mha_bwd`, whose code PyTorch's SDPA flash backend
    vendors) allocates for its kernels besides the gradients it returns, in bytes: the query
    gradient's fp32 accumulator (`dq_accum`, the head dimension rounded up to 32, or to 256
    above 192), the row sums of the output times its gradient (`softmax_d`, fp32 a row and
    head) and, where K and V come grouped (fewer heads than Q), their gradients at every query
    head (`dk_expanded`, `dv_expanded`), summed over each group after the kernel."""
    rounded = -(-head_dim // 32) * 32 if head_dim <= 192 else 256
    rows = heads * w.tokens
    workspace = FP32_BYTES * rows * (rounded + 1)
    if grouped_kv:
        workspace += 2 * w.dtype_bytes * rows * head_dim
    return workspace


def _core_module(spec: ModelSpec, layer: int, w: Workload, r: Recipe, dense_flops: float,
                 qkv_saved: float, dropout: bool, output_kept: float,
                 flash_workspace: float) -> Module:
    """The attention core's module: Q, K and V as its products read them (`qkv_saved`),
    eager attention's memory per score (saved, held while it runs, a framework buffer) or a
    fused kernel's log-sum-exp and output (`output_kept` where the stack copies the output)
    and its backward's workspace (`flash_workspace`), and its FLOPs (a fused causal kernel
    skips the masked half of `dense_flops`)."""
    a, s, t = spec.num_attention_heads, w.sequence_length, w.tokens
    per_score = {"transient_bytes": 0.0}
    if w.attention == "eager":
        scores = a * s * t
        memory, scale = _score_memory(spec, w, r), w.dtype_bytes / 2 * scores
        saved = qkv_saved + memory.saved * scale + _softcap_saved(spec.attention_softcap,
                                                                  scores, w)
        if dropout:
            saved += MASK_BYTES * scores + w.dtype_bytes * scores
        per_score = {"transient_bytes": memory.forward_workspace * scale,
                     "backward_transient_bytes": memory.backward_workspace * scale,
                     "buffer_bytes": memory.buffer * scale}
        flops = dense_flops
    else:
        saved = qkv_saved + FP32_BYTES * a * t + output_kept
        per_score["backward_transient_bytes"] = flash_workspace
        flops = dense_flops / 2
    return Module(f"layers.{layer}.attn.core", "attention", "attention", layer, 0, flops,
                  dense_flops, 0.0, saved, **per_score)


MLA_COPY_PASSES = 2
"""Bytes per element, in elements' sizes, of MLA's copies (`torch.cat` of Q's two parts, K's
assembly from its parts in `expand_kv`): each element read once and written once; their
backward moves the same (the split's concatenation of the gradients, the rotary key's sum over
the heads)."""


def _mla_attention(spec: ModelSpec, p: str, layer: int, w: Workload, r: Recipe,
                   after: tuple[MemoryPass, ...]) -> Iterator[Module]:
    """Multi-head latent attention as transformers 5 runs it (DeepseekV3Attention.forward):
    Q from `q_proj`, or from `q_a_proj`, `q_a_layernorm` and `q_b_proj` through a latent;
    the K/V latent and the shared rotary key from `kv_a_proj_with_mqa` and `kv_a_layernorm`;
    `kv_b_proj` expanding the latent into every head's no-rope K and V; the core; `o_proj`
    from every head's V. The input projections read one normalised input, so autograd sums
    their input gradients."""
    mla, h, heads = spec.mla, spec.hidden_size, spec.num_attention_heads
    attention, bias = f"{p}.self_attn", spec.qkv_bias
    q_width = heads * mla.qk_head_dim
    if mla.q_lora_rank:
        yield _linear(f"{attention}.q_a_proj", layer, h, mla.q_lora_rank, bias, w, True, r,
                      sums_input_gradient=True)
        yield _norm(f"{attention}.q_a_layernorm", layer, mla.q_lora_rank, False, w, r)
        yield _linear(f"{attention}.q_b_proj", layer, mla.q_lora_rank, q_width, False, w, True,
                      r)
    else:
        yield _linear(f"{attention}.q_proj", layer, h, q_width, False, w, True, r,
                      sums_input_gradient=True)
    yield _linear(f"{attention}.kv_a_proj_with_mqa", layer, h,
                  mla.kv_lora_rank + mla.qk_rope_head_dim, bias, w, False, r)
    yield _norm(f"{attention}.kv_a_layernorm", layer, mla.kv_lora_rank, False, w, r)
    yield _linear(f"{attention}.kv_b_proj", layer, mla.kv_lora_rank,
                  heads * (mla.qk_nope_head_dim + mla.v_head_dim), False, w, True, r)
    yield _mla_core(spec, layer, w, r, spec.attention_dropout > 0)
    yield _linear(f"{attention}.o_proj", layer, heads * mla.v_head_dim, h,
                  spec.attention_out_bias, w, True, r, after=after)


def _mla_core(spec: ModelSpec, layer: int, w: Workload, r: Recipe, dropout: bool) -> Module:
    """MLA's core: the rotary embedding on Q's rotary part and the shared rotary key, Q made
    whole (`torch.cat`) and every head's K assembled (`expand_kv`: a new tensor, two copies),
    then attention over heads of `qk_head_dim` with V of `v_head_dim`: eager's two batched
    products around the stack's score kernels (V, a view of `kv_b_proj`'s output, copied into
    their layout), or one fused kernel; the output copied for `o_proj` as the stack does."""
    mla, a, s, t = spec.mla, spec.num_attention_heads, w.sequence_length, w.tokens
    q_width, v_width = a * mla.qk_head_dim, a * mla.v_head_dim
    copy = MLA_COPY_PASSES * w.dtype_bytes * t * q_width
    before = (*elementwise_pass(r.rotary, t * (a + 1) * mla.qk_rope_head_dim, w),
              MemoryPass(copy, 1, backward_nbytes=copy),
              MemoryPass(copy, 2, backward_nbytes=copy))
    context = elementwise_pass(r.context, t * v_width, w)
    dense_flops = 2.0 * t * w.attention_span * (q_width + v_width)
    if w.fused_attention:
        inputs = elementwise_pass(r.attention_inputs, t * (2 * q_width + v_width), w)
        fused = FusedAttention(dense_flops / 2, w.dtype_bytes * t * 2 * (q_width + v_width),
                               keys=w.attention_span / 2, head_dim=mla.qk_head_dim)
        kernels = (*before, *inputs, fused, *context)
    else:
        heads = a * w.micro_batch_size
        value = elementwise_pass(r.matmul_inputs, t * v_width, w)
        softmax = elementwise_pass(_scores_op(spec, w, r), a * s * t, w)
        kernels = (*before, Gemm(s, s, mla.qk_head_dim, heads, w.dtype_bytes), *softmax,
                   *value, Gemm(s, mla.v_head_dim, s, heads, w.dtype_bytes), *context)
    kept = w.dtype_bytes * t * v_width if context else 0.0
    module = _core_module(spec, layer, w, r, dense_flops,
                          w.dtype_bytes * t * (2 * q_width + v_width), dropout, kept,
                          flash_backward_workspace(a, mla.qk_head_dim, w, grouped_kv=False))
    return _with_backward(module, kernels, r)


def _mlp_activation(name: str, layer: int, i: int, function: str | None, w: Workload,
                    r: Recipe, tokens: float | None = None) -> Module:
    """The MLP's activation over `i` intermediate elements a token: a gated one (`function`
    None) as the recipe's `activation`; an ungated one as the stack runs `function`
    (`Recipe.ungated_activation`), or else the gated recipe for one input."""
    elements = i * (w.tokens if tokens is None else tokens)
    ungated = None if function is None else r.ungated_activation(function)
    memory = r.activation_memory
    if ungated is not None:
        per_element = ungated.saved
    else:
        per_element = (memory.gated_activation_saved if function is None
                       else memory.activation_saved)
    saved = per_element * w.dtype_bytes / 2 * elements
    module = Module(name, "activation", "elementwise", layer, 0,
                    ELEMENTWISE_FLOPS_PER_ELEMENT * elements, 0.0, 0.0, saved)
    if ungated is not None:
        return _with_backward(module, elementwise_pass(ungated.kernels, elements, w,
                                                       module.fwd_flops), r)
    # The recipe prices a gated activation (two inputs, one output): an ungated one moves
    # two elements where a gated one moves three.
    moved = elements * (2 if function is not None else 3) / 3
    return _with_backward(module, elementwise_pass(r.activation, moved, w, module.fwd_flops), r)


def _dropout_mask(name: str, layer: int | None, h: int, w: Workload, r: Recipe) -> Module:
    elements = h * w.tokens
    module = Module(name, "dropout", "elementwise", layer, 0, elements, 0.0, 0.0,
                    MASK_BYTES * elements)
    return _with_backward(module, (MemoryPass(2 * w.dtype_bytes * elements, 1, elements),), r)


@dataclass(frozen=True)
class _Names:
    """Module names in a block: Hugging Face's Llama names, or the gpt family's."""

    first_norm: str
    second_norm: str
    attention: str
    out: str


POST_NORMS = ("post_attention_layernorm", "post_feedforward_layernorm")
PRE_FEEDFORWARD_NORM = "pre_feedforward_layernorm"
"""Gemma-2's names for its norms on the attention's and the MLP's outputs and before the MLP
(`ModelSpec.post_norms`)."""
NAMES = {"llama": _Names("input_layernorm", "post_attention_layernorm", "self_attn", "o_proj"),
         "gpt": _Names("ln_1", "ln_2", "attn", "out_proj")}


def _attention_projections(spec: ModelSpec, p: str, layer: int, w: Workload, r: Recipe, *,
                           input_shared_later: bool) -> Iterator[Module]:
    """Q, K and V as one projection, as Q and a fused K and V, or as three (`qkv_layout`).
    Each but the last sums its input gradient into the later ones' (`_linear`); the last
    too where the MLP reads the same normalised input (`input_shared_later`)."""
    h, q, hkv, bias = spec.hidden_size, spec.q_size, spec.kv_hidden_size, spec.qkv_bias
    attention = f"{p}.{NAMES[spec.family].attention}"
    layout = qkv_layout(spec, r)
    each = spec.qk_norm in ("per_head", "full_width")
    if layout == "fused":
        yield _linear(f"{attention}.qkv_proj", layer, h, q + 2 * hkv, bias, w, True, r,
                      sums_input_gradient=input_shared_later)
        yield from _qk_norms(spec, attention, layer, w, r, "q", "k")
        return
    yield _linear(f"{attention}.q_proj", layer, h, q, bias, w, True, r,
                  sums_input_gradient=True)
    if each:
        yield from _qk_norms(spec, attention, layer, w, r, "q")
    if layout == "q_kv":
        yield _linear(f"{attention}.kv_proj", layer, h, 2 * hkv, bias, w, False, r,
                      sums_input_gradient=input_shared_later)
    else:
        yield _linear(f"{attention}.k_proj", layer, h, hkv, bias, w, False, r,
                      sums_input_gradient=True)
        if each:
            yield from _qk_norms(spec, attention, layer, w, r, "k")
        yield _linear(f"{attention}.v_proj", layer, h, hkv, bias, w, False, r,
                      sums_input_gradient=input_shared_later)
    if each and layout == "q_kv":
        yield from _qk_norms(spec, attention, layer, w, r, "k")
    elif not each:
        yield from _qk_norms(spec, attention, layer, w, r, "q", "k")


def _qk_norms(spec: ModelSpec, attention: str, layer: int, w: Workload, r: Recipe,
              *which: str) -> Iterator[Module]:
    """`q_norm` and `k_norm` (`ModelSpec.qk_norm`): the stack's norm over each head's row of
    Q or K, after the projection that makes it (Qwen3: `q_norm(q_proj(x).view(...))`) or
    after all three projections (Gemma-3), or over the projection's whole output (OLMo-2)."""
    if not spec.qk_norm:
        return
    heads = {"q": spec.num_attention_heads, "k": spec.num_key_value_heads}
    for name in which:
        if spec.qk_norm == "full_width":
            yield _norm(f"{attention}.{name}_norm", layer, heads[name] * spec.head_dim, False,
                        w, r)
        else:
            yield _norm(f"{attention}.{name}_norm", layer, spec.head_dim, False, w, r,
                        rows_per_token=heads[name])


def _dense_mlp(spec: ModelSpec, p: str, layer: int, width: int, w: Workload, r: Recipe, *,
               saves_input: bool, after: tuple[MemoryPass, ...] = (),
               tokens: float | None = None) -> Iterator[Module]:
    """A gated MLP (gate, up, act_fn, down; gate/up fused where the stack fuses them) or a
    plain one (fc_in, act, fc_out) of `width` over `tokens` rows."""
    h, bias = spec.hidden_size, spec.mlp_bias
    if not spec.gated_mlp:
        yield _linear(f"{p}.fc_in", layer, h, width, bias, w, saves_input, r, tokens=tokens)
        yield _mlp_activation(f"{p}.act", layer, width, spec.activation, w, r, tokens)
        yield _linear(f"{p}.fc_out", layer, width, h, bias, w, True, r, after, tokens=tokens)
        return
    if r.fused_gate_up or spec.fused_gate_up:
        yield _linear(f"{p}.gate_up_proj", layer, h, 2 * width, bias, w, saves_input, r,
                      tokens=tokens)
    else:
        yield _linear(f"{p}.gate_proj", layer, h, width, bias, w, saves_input, r, tokens=tokens,
                      sums_input_gradient=True)
        yield _linear(f"{p}.up_proj", layer, h, width, bias, w, False, r, tokens=tokens)
    yield _mlp_activation(f"{p}.act_fn", layer, width, None, w, r, tokens)
    yield _linear(f"{p}.down_proj", layer, width, h, bias, w, True, r, after, tokens=tokens)


def chunk_rows(rows: int, chunks: int) -> tuple[int, ...]:
    """The pieces `torch.chunk` cuts `rows` rows into when asked for `chunks`: ceil(rows /
    chunks) rows each, the last one shorter, fewer pieces where that size leaves none over."""
    return rows_of_size(rows, -(-rows // chunks))


def rows_of_size(rows: int, size: int) -> tuple[int, ...]:
    """`rows` cut into pieces of `size` rows, the last one shorter."""
    full, rest = divmod(rows, size)
    return (size,) * full + ((rest,) if rest else ())


def auto_tiled_shards(sequence_per_rank: int, hidden_size: int) -> int:
    """The slices Arctic Long Sequence Training's tiled MLP forward (and DeepSpeed's TiledMLP
    docstring) cuts the rank's sequence into: ceil(its length / the hidden size), so each
    slice's intermediate is no larger than the hidden state it comes from."""
    return -(-sequence_per_rank // hidden_size)


def _tiled_mlp(spec: ModelSpec, p: str, layer: int, width: int, w: Workload, r: Recipe, *,
               after: tuple[MemoryPass, ...]) -> list[Module]:
    """A gated MLP run by DeepSpeed's TiledMLP (runtime/sequence_parallel/ulysses_sp.py,
    0.17.0+), as Arctic Long Sequence Training patches `down(act(gate(x)) * up(x))`.

    Forward: the input saved, then the MLP over each slice of the sequence (`torch.chunk`
    along it) under `no_grad`, nothing else saved, and the slices' outputs concatenated.
    Backward, per slice of the flattened rows: the slice's forward again with a graph, its
    backward, its input gradient added into a zeroed gradient of the whole input; the weights'
    gradients accumulate over the slices (`ds_grad_is_ready` holds DeepSpeed's reduction back
    until the last). The modules keep their names and their forward kernels (each slice's in
    turn); the backward's work sits in the last, which the backward reaches first, so the
    weights' gradients are ready when it ends."""
    h, size = spec.hidden_size, w.dtype_bytes
    shards = w.tiled_mlp_shards
    forward_rows = [w.micro_batch_size * rows for rows in chunk_rows(w.sequence_per_rank, shards)]
    backward_rows = chunk_rows(w.tokens, shards)

    built: dict[int, list[Module]] = {}

    def pieces(rows: int) -> list[Module]:
        """The MLP's modules over `rows` rows (slices of a size are alike: built once)."""
        if rows not in built:
            built[rows] = list(_dense_mlp(spec, p, layer, width, w, r, saves_input=True,
                                          tokens=rows))
        return built[rows]

    whole, forward = pieces(w.tokens), [pieces(rows) for rows in forward_rows]
    weights = sum(m.params for m in whole)
    tensors = sum(len(m.param_numels) for m in whole)
    hooked = sum(1 for m in whole if m.params)
    largest = pieces(max(backward_rows))
    backward: list[Kernel] = [k.backward(r.backward_bytes_factor) for k in after]
    backward.append(MemoryPass(size * h * w.tokens))
    for index, rows in enumerate(backward_rows):
        shard = pieces(rows)
        backward.extend(k for m in shard for k in m.kernels)
        backward.extend(k for m in reversed(shard) for k in m.backward_kernels)
        backward.append(MemoryPass(GRADIENT_SUM_ELEMENTS * size * h * rows))
        if index:
            backward.append(MemoryPass(GRADIENT_SUM_ELEMENTS * size * weights, tensors))
    modules = []
    for k, module in enumerate(whole):
        kernels = tuple(kernel for shard in forward for kernel in shard[k].kernels)
        modules.append(replace(module, kernels=kernels, backward_kernels=(),
                               fwd_hbm_bytes=ordered_sum(kernel.nbytes for kernel in kernels),
                               saved_bytes=0.0, backward_transient_bytes=0.0))
    first, last = modules[0], modules[-1]
    modules[0] = replace(first, saved_bytes=size * h * w.tokens, host_syncs=int(w.tiled_mlp_agreed),
                         tiled_span=len(modules) - 1,
                         repeated_hooks=((len(forward_rows) - 1) * hooked,
                                         (2 * len(backward_rows) - 1) * hooked))
    concatenation = MemoryPass(2 * size * h * w.tokens)
    kernels = (*last.kernels, concatenation, *after)
    slice_activations = ordered_sum(m.saved_bytes for m in largest[1:])
    modules[-1] = replace(
        last, kernels=kernels, fwd_hbm_bytes=ordered_sum(kernel.nbytes for kernel in kernels),
        transient_bytes=size * (3 * width * max(forward_rows) + h * w.tokens),
        backward_kernels=tuple(backward),
        backward_transient_bytes=(size * (h * w.tokens + weights + 2 * width * max(backward_rows))
                                  + slice_activations))
    return modules


ROUTER_BYTES_PER_LOGIT = 10
"""The router's softmax in fp32 and top-k: read the 16-bit logits (2 B), write and read the
fp32 probabilities (4 + 4 B)."""
ROUTING_PASSES = 3
"""Per routed token and hidden element: the gather of the expert's input rows, the scaling of
its output by the routing weight, and the index_add into the block output (read and write
each)."""


def _moe_mlp(spec: ModelSpec, p: str, layer: int, w: Workload, r: Recipe,
             residual: tuple[MemoryPass, ...]) -> Iterator[Module]:
    """Router, then every expert in order (each one's hooks fire and ZeRO-3 fetches its
    parameters: transformers runs every expert of an `nn.ModuleList`), then the shared expert
    and its gate. Each expert computes its share of the routed tokens and saves its gathered
    input and scaled output besides what an MLP saves. Where the stack holds transformers'
    experts in one module (`Recipe.fused_experts`), transformers 5's order: the router, the
    experts module, the shared expert (Qwen2-MoE's first, `MoESpec.shared_expert_first`) and
    its gate."""
    moe = spec.moe
    shared = moe.shared_expert_intermediate_size
    if moe.experts_layout == "list" or (moe.experts_layout == "stack" and not r.fused_experts):
        yield _router(spec, p, layer, w, r)
        yield from _expert_list(spec, p, layer, w, r, () if shared else residual)
        yield from _shared_expert(spec, p, layer, w, r, residual)
        return
    first = bool(shared) and moe.shared_expert_first
    if first:
        yield from _dense_mlp(spec, f"{p}.shared_expert", layer, shared, w, r,
                              saves_input=False)
    yield _router(spec, p, layer, w, r)
    experts_last = not shared or (first and not moe.shared_expert_gate)
    experts = _every_token_experts if moe.routing == "every_token" else _fused_experts
    yield experts(spec, f"{p}.experts", layer, w, r, residual if experts_last else ())
    if shared and not first:
        yield from _shared_expert(spec, p, layer, w, r, residual)
    elif first and moe.shared_expert_gate:
        yield _shared_expert_gate(spec, p, layer, w, r, residual)


def _router(spec: ModelSpec, p: str, layer: int, w: Workload, r: Recipe) -> Module:
    """A bias-free linear to one logit per expert, its fp32 softmax and top-k (saved)."""
    logits = spec.moe.num_experts * w.tokens
    softmax = MemoryPass(ROUTER_BYTES_PER_LOGIT * logits, 3, ELEMENTWISE_FLOPS_PER_ELEMENT * logits)
    router = _linear(f"{p}.gate", layer, spec.hidden_size, spec.moe.num_experts,
                     spec.moe.router_bias, w, True, r, (softmax,))
    return replace(router, saved_bytes=router.saved_bytes + FP32_BYTES * logits)


EXPERT_SELECTION_SYNCS = 1
"""Host synchronisations before each expert of a module list: transformers 4's loop selects
the expert's rows with `idx, top_x = torch.where(expert_mask[expert_idx])`
(MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock, Qwen3MoeSparseMoeBlock) and DeepSeek-MoE's with
`hidden_states[flat_topk_idx == i]`, a data-dependent nonzero whose count PyTorch copies to the
host, which waits for the GPU's queue. Transformers 5's grouped path sorts and counts on the
GPU (`torch.sort`, `histc`, `cumsum`) without one."""


def _expert_list(spec: ModelSpec, p: str, layer: int, w: Workload, r: Recipe,
                 residual: tuple[MemoryPass, ...]) -> Iterator[Module]:
    """Every expert's MLP modules in order, the block's residual after the last one."""
    moe, h = spec.moe, spec.hidden_size
    routed = moe.tokens_per_expert(w.tokens)
    combine = MemoryPass(ROUTING_PASSES * 2 * w.dtype_bytes * routed * h, ROUTING_PASSES)
    for expert in range(moe.num_experts):
        last = expert == moe.num_experts - 1
        modules = list(_dense_mlp(spec, f"{p}.experts.{expert}", layer,
                                  moe.expert_intermediate_size, w, r, saves_input=True,
                                  after=(combine, *(residual if last else ())), tokens=routed))
        down = modules[-1]
        modules[-1] = replace(down, saved_bytes=down.saved_bytes + w.dtype_bytes * routed * h)
        modules[0] = replace(modules[0], host_syncs=EXPERT_SELECTION_SYNCS)
        yield from modules


def _shared_expert(spec: ModelSpec, p: str, layer: int, w: Workload, r: Recipe,
                   residual: tuple[MemoryPass, ...]) -> Iterator[Module]:
    """The shared expert after the routed ones (with its one-output sigmoid gate)."""
    moe = spec.moe
    if not moe.shared_expert_intermediate_size:
        return
    yield from _dense_mlp(spec, f"{p}.shared_expert", layer,
                          moe.shared_expert_intermediate_size, w, r, saves_input=False,
                          after=() if moe.shared_expert_gate else residual)
    if moe.shared_expert_gate:
        yield _shared_expert_gate(spec, p, layer, w, r, residual)


def _shared_expert_gate(spec: ModelSpec, p: str, layer: int, w: Workload, r: Recipe,
                        residual: tuple[MemoryPass, ...]) -> Module:
    return _linear(f"{p}.shared_expert_gate", layer, spec.hidden_size, 1, False, w, False, r,
                   residual)


GROUPED_ROW_PASSES = 5
"""transformers' `grouped_mm_experts_forward` (integrations/moe.py, 5.x), per routed row and
hidden element: the gather of the rows sorted by expert, its in-place masked fill, the masked
fill of the down product's output, the product with the routing weights and the gather back
to token order (each reads and writes the element)."""
GROUPED_INDEX_KERNELS = 7
"""Its kernels over the routed rows' indices alone (the sort of the expert ids, histc, cumsum,
the sentinel comparison, the clamp, the arange and the scatter of the inverse permutation):
launches whose bytes are negligible."""


def _fused_experts(spec: ModelSpec, name: str, layer: int, w: Workload, r: Recipe,
                   after: tuple[MemoryPass, ...]) -> Module:
    """Transformers 5's experts module (`Recipe.fused_experts`): every expert's gate-up and down
    weights, `[experts, 2 x width, h]` and `[experts, h, width]`, run as transformers' default
    `grouped_mm` path runs them: the routed rows sorted by expert and gathered, one grouped
    product for gate and up (its output masked), the stack's gated activation, one grouped
    product for down (masked), the routing weights, the rows back in token order and summed
    over each token's top k. Each expert computes its share of the rows (even routing), so
    the grouped products are priced as batched ones of that many rows. It saves what the
    experts of a module list save together: the sorted rows, the gated activation's inputs,
    the down product's input and output."""
    moe, h, size = spec.moe, spec.hidden_size, w.dtype_bytes
    width, experts = moe.expert_intermediate_size, moe.num_experts
    per_expert = moe.tokens_per_expert(w.tokens)
    rows = per_expert * experts
    gate_up = Gemm(per_expert, 2 * width, h, experts, size)
    down = Gemm(per_expert, h, width, experts, size)
    index = MemoryPass(0.0, GROUPED_INDEX_KERNELS)
    gather = MemoryPass(2 * 2 * size * rows * h, 2)
    masked_gate_up = MemoryPass(2 * size * rows * 2 * width)
    activation = elementwise_pass(r.activation, rows * width, w,
                                  ELEMENTWISE_FLOPS_PER_ELEMENT * rows * width)
    to_tokens = MemoryPass((GROUPED_ROW_PASSES - 2) * 2 * size * rows * h,
                           GROUPED_ROW_PASSES - 2)
    top_k_sum = MemoryPass(size * (rows + w.tokens) * h)
    numels = (experts * 2 * width * h, experts * h * width)
    shapes: tuple[tuple[int, ...], ...] = ((experts, 2 * width, h), (experts, h, width))
    biases: tuple[MemoryPass, ...] = ()
    if moe.expert_bias:
        numels = (numels[0], experts * 2 * width, numels[1], experts * h)
        shapes = (shapes[0], (experts, 2 * width), shapes[1], (experts, h))
        biases = (MemoryPass(BIAS_ROW_BYTES * size * rows * (2 * width + h), 4),)
    flops = gate_up.flops + down.flops
    saved = (2 * size * rows * h + size * rows * width
             + r.activation_memory.gated_activation_saved * size / 2 * rows * width)
    module = Module(name, "experts", "matmul", layer, sum(numels), flops, flops, 0.0, saved,
                    param_numels=numels, param_shapes=shapes)
    return _with_backward(module, (index, gather, gate_up, masked_gate_up, *activation, down,
                                   *biases, to_tokens, top_k_sum, *after), r)


def _every_token_experts(spec: ModelSpec, name: str, layer: int, w: Workload, r: Recipe,
                         after: tuple[MemoryPass, ...]) -> Module:
    """Transformers' Llama 4 experts (`Llama4TextMoe.forward`, `Llama4TextExperts`): every
    token repeated for every expert and scaled by its router score (zero where it is not
    routed), one batched product for gate and up over all of them, the stack's gated
    activation, one for down, the experts' outputs summed per token and added to the shared
    expert's. Every expert computes every token, `num_experts` dense MLPs' work, where the
    conventional count (its model FLOPs) is the routed share's. It saves the repeated rows
    (the scaling's and the first product's inputs), the activation's inputs and the down
    product's input."""
    moe, h, size, t = spec.moe, spec.hidden_size, w.dtype_bytes, w.tokens
    width, experts = moe.expert_intermediate_size, moe.num_experts
    rows = experts * t
    spread = MemoryPass(size * (t + rows) * h + 2 * size * rows * h, 2)
    gate_up = Gemm(t, 2 * width, h, experts, size)
    activation = elementwise_pass(r.activation, rows * width, w,
                                  ELEMENTWISE_FLOPS_PER_ELEMENT * rows * width)
    down = Gemm(t, h, width, experts, size)
    summed = MemoryPass(size * (rows + t) * h + 3 * size * t * h, 2)
    numels = (experts * h * 2 * width, experts * width * h)
    flops = gate_up.flops + down.flops
    saved = (2 * size * rows * h + size * rows * width
             + r.activation_memory.gated_activation_saved * size / 2 * rows * width)
    module = Module(name, "experts", "matmul", layer, sum(numels), flops,
                    flops * moe.routed_share, 0.0, saved, param_numels=numels,
                    param_shapes=((experts, h, 2 * width), (experts, width, h)))
    return _with_backward(module, (spread, gate_up, *activation, down, summed, *after), r)


BIAS_ROW_BYTES = 5
"""Bytes per output element, in elements' sizes, of a grouped product's bias
(`grouped_mm_experts_forward` with `has_bias`): each routed row's bias gathered
(`bias[expert_ids_g]`, read and written) and added to the product (two read, one written)."""


def _block_modules(spec: ModelSpec, layer: int, w: Workload, r: Recipe) -> Iterator[Module]:
    """A pre-norm block: norm, attention, (second norm,) MLP or MoE; with one norm, attention
    and MLP read the same normalised input (GPT-J, Falcon-7B)."""
    h, names = spec.hidden_size, NAMES[spec.family]
    p = f"layers.{layer}"
    norm_bias = spec.norm == "layer"
    residual = elementwise_pass(r.residual, h * w.tokens, w)
    before_post_norm = () if spec.post_norms else residual
    if spec.norms_per_block:
        yield _norm(f"{p}.{names.first_norm}", layer, h, norm_bias, w, r)
    if spec.attention_sinks:
        yield _sinks_module(spec, p, layer, w, r)
    if spec.mla is not None:
        yield from _mla_attention(spec, p, layer, w, r, before_post_norm)
    else:
        yield from _attention_projections(spec, p, layer, w, r,
                                          input_shared_later=spec.norms_per_block == 1)
        yield _attention_core(spec, layer, w, spec.attention_dropout > 0, r)
        yield _linear(f"{p}.{names.attention}.{names.out}", layer, spec.q_size, h,
                      spec.attention_out_bias, w, True, r, after=before_post_norm)
    if spec.post_norms:
        yield _norm(f"{p}.{POST_NORMS[0]}", layer, h, norm_bias, w, r, after=residual)
    if spec.hidden_dropout > 0:
        yield _dropout_mask(f"{p}.attn.resid_dropout", layer, h, w, r)
    if spec.norms_per_block == 2:
        second = PRE_FEEDFORWARD_NORM if spec.post_norms else names.second_norm
        yield _norm(f"{p}.{second}", layer, h, norm_bias, w, r)
    if spec.is_moe_layer(layer):
        mlp = list(_moe_mlp(spec, f"{p}.mlp", layer, w, r, before_post_norm))
    elif w.tiled_mlp_shards:
        mlp = _tiled_mlp(spec, f"{p}.mlp", layer, spec.intermediate_size, w, r,
                         after=before_post_norm)
    else:
        mlp = list(_dense_mlp(spec, f"{p}.mlp", layer, spec.intermediate_size, w, r,
                              saves_input=spec.norms_per_block != 1, after=before_post_norm))
    mlp[0] = replace(mlp[0], host_syncs=mlp[0].host_syncs + r.syncs_before_mlp)
    yield from mlp
    if spec.post_norms:
        yield _norm(f"{p}.{POST_NORMS[1]}", layer, h, norm_bias, w, r, after=residual)
    if spec.hidden_dropout > 0:
        yield _dropout_mask(f"{p}.mlp.dropout", layer, h, w, r)


def _lookup(name: str, rows: int, w: Workload, r: Recipe, h: int) -> Module:
    """An embedding table: its forward writes one row per token."""
    table = rows * h
    module = Module(name, EMBEDDING_KIND, "embedding", None, table, 0.0, 0.0, 0.0, 0.0,
                    param_numels=(table,), param_shapes=((rows, h),))
    return _with_backward(module, (MemoryPass(w.dtype_bytes * h * w.tokens),), r)


def _embedding(spec: ModelSpec, w: Workload, r: Recipe) -> Iterator[Module]:
    h, width = spec.hidden_size, spec.embedding_width
    yield _lookup("embed_tokens", spec.vocab_size, w, r, width)
    if spec.word_embed_proj_dim:
        yield _linear("project_in", None, width, h, False, w, False, r)
    if spec.position_embedding == "learned":
        rows = spec.max_position_embeddings + spec.position_offset
        yield _lookup("embed_positions", rows, w, r, h)
    if spec.embedding_norm:
        yield _norm("embed_layernorm", None, h, True, w, r)
    if spec.embedding_dropout > 0:
        yield _dropout_mask("embed_dropout", None, h, w, r)


def _head(spec: ModelSpec, w: Workload, r: Recipe) -> Iterator[Module]:
    h, v, t = spec.hidden_size, spec.vocab_size, w.tokens
    if spec.final_norm:
        yield _norm("norm", None, h, spec.norm == "layer", w, r)
    if spec.word_embed_proj_dim:
        yield _linear("project_out", None, h, spec.embedding_width, False, w, True, r)
    head = _linear("lm_head", None, spec.embedding_width, v, spec.lm_head_bias, w, True, r)
    if spec.tie_word_embeddings:
        bias = head.param_numels[1:]
        head = replace(head, params=sum(bias), param_numels=bias,
                       one_dimensional=head.one_dimensional[1:],
                       param_shapes=head.param_shapes[1:])
    logits = v * t
    if spec.logit_softcap:
        head = _with_backward(replace(head, saved_bytes=head.saved_bytes
                                      + _softcap_saved(True, logits, w)),
                              (*head.kernels, *elementwise_pass(r.softcap, logits, w)), r)
    if r.fused_linear_loss:
        yield from _fused_linear_loss(head, spec, w, r)
        return
    if w.tiled_loss_shards:
        yield from _tiled_head(head, spec, w, r)
        return
    # The head's backward reads the logits' gradient, which the loss's backward made.
    yield replace(head, external=r.external_output_weight and head.params > 0,
                  backward_transient_bytes=head.backward_transient_bytes
                  + w.dtype_bytes * logits)
    memory = r.loss_memory
    loss = Module("loss", "loss", "elementwise", None, 0, ELEMENTWISE_FLOPS_PER_ELEMENT * logits,
                  0.0, 0.0, memory.saved_bytes(w.dtype_bytes) * logits,
                  transient_bytes=memory.transient * logits,
                  backward_transient_bytes=memory.backward * logits)
    yield _with_backward(loss, elementwise_pass(r.loss, logits, w, loss.fwd_flops), r)


def auto_loss_shards(tokens: int, vocab_size: int) -> int:
    """The slices Arctic Long Sequence Training's trainer hands DeepSpeed's
    TiledFusedLogitsLoss: about 1 GiB of fp32 logits each, ceil(tokens x vocabulary x 4 B /
    1 GiB)."""
    return -(-tokens * vocab_size * FP32_BYTES // 2**30)


def _tiled_head(head: Module, spec: ModelSpec, w: Workload, r: Recipe) -> Iterator[Module]:
    """The output layer and the loss under DeepSpeed's TiledFusedLogitsLoss
    (runtime/sequence_parallel/ulysses_sp.py, 0.17.4+), as Arctic Long Sequence Training's
    trainer calls it: the hidden states' gradient zeroed, then per slice of the rank's tokens
    the output layer and the loss forward and at once their backward, the slice's input
    gradient added into the whole one's, the output weight's gradient accumulated over the
    slices (`ds_grad_is_ready` holds its reduction back until the last); that input gradient
    is all it keeps for the backward, which scales it by the loss's gradient after comparing
    that with 1.0 (`if grads[0] != 1.0`, a host sync). The output
    layer's module runs each slice's product, keeps its weight gathered through the loss's
    (`tiled_span`) and fires no hook in the backward; the loss's holds the rest."""
    h, v, size = spec.embedding_width, spec.vocab_size, w.dtype_bytes
    rows = chunk_rows(w.tokens, w.tiled_loss_shards)
    products = tuple(Gemm(n, v, h, dtype_bytes=size) for n in rows)
    yield replace(head, kernels=products, backward_kernels=(), saved_bytes=0.0,
                  backward_transient_bytes=0.0,
                  fwd_hbm_bytes=ordered_sum(k.nbytes for k in products),
                  repeated_hooks=(2 * len(rows) - 1, 0), backward_in_forward=True,
                  tiled_span=1)
    memory = r.loss_memory
    work: list[Kernel] = [MemoryPass(size * h * w.tokens)]
    for index, n in enumerate(rows):
        passes = elementwise_pass(r.loss, v * n, w, ELEMENTWISE_FLOPS_PER_ELEMENT * v * n)
        work.extend(passes)
        work.extend(k.backward(r.backward_bytes_factor) for k in passes)
        work.extend(linear_backward(Gemm(n, v, h, dtype_bytes=size)))
        work.append(MemoryPass(GRADIENT_SUM_ELEMENTS * size * h * n))
        if index:
            work.append(MemoryPass(GRADIENT_SUM_ELEMENTS * size * head.params,
                                   len(head.param_numels)))
    per_logit = size + memory.saved_bytes(size) + max(memory.transient, memory.backward)
    logits = v * w.tokens
    loss = Module("loss", "loss", "elementwise", None, 0, ELEMENTWISE_FLOPS_PER_ELEMENT * logits,
                  0.0, 0.0, size * h * w.tokens,
                  transient_bytes=per_logit * v * max(rows) + size * head.params,
                  backward_host_syncs=1)
    scale = MemoryPass(2 * size * h * w.tokens)
    yield replace(loss, kernels=tuple(work), backward_kernels=(scale,),
                  fwd_hbm_bytes=ordered_sum(k.nbytes for k in work))


LOSS_TOKEN_BYTES = 46
"""Per token, what Liger-Kernel's fused loss moves before its chunks: the int64 labels padded
by one and their shifted slice made contiguous (read 8, write 8, twice; LigerForCausalLMLoss),
the fp32 loss per token zero-filled (write 4), the mask of tokens not ignored (a label read,
a bool written) and its sum (read 1)."""
LOSS_TOKEN_KERNELS = 5


def fused_loss_rows(tokens: int, vocab_size: int, hidden_size: int) -> tuple[int, ...]:
    """The chunks of tokens Liger-Kernel's fused linear cross entropy runs (ops/
    fused_linear_cross_entropy.py): as many as the vocabulary holds hidden widths, so a
    chunk's logits are about as large as the hidden states, each rounded up to a power of two
    (`triton.next_power_of_2`), the last one shorter."""
    factor = -(-vocab_size // hidden_size)
    return rows_of_size(tokens, 1 << max(0, (-(-tokens // factor) - 1).bit_length()))


def _fused_linear_loss(head: Module, spec: ModelSpec, w: Workload, r: Recipe
                       ) -> Iterator[Module]:
    """The output layer and the loss as Liger-Kernel's LigerFusedLinearCrossEntropyFunction
    runs them (0.6.2 to 0.8.2, ops/fused_linear_cross_entropy.py, with a 16-bit output weight
    and no `accum_dtype`): the input's and the weight's gradients zero-filled, the tokens that
    are not ignored counted and read back by `.item()` (a host sync), then per chunk of tokens
    (`fused_loss_rows`) the chunk's logits (a GEMM), the cross-entropy kernel turning them
    into their gradient in place (`Recipe.loss`), the chunk's input gradient (a GEMM, copied
    into its rows) and the weight's (a GEMM, cast to fp32 by `.float()` and added into the
    16-bit accumulator; the chunk's losses are written in place, so their copy back into
    the whole is a no-op). Both gradients are kept for the backward, which compares the loss's
    gradient with 1.0 (`torch.equal`, a host sync) and scales them by it (two kernels).
    The output layer's module holds the logits' products and, its forward never called, is
    an external parameter of the top module under ZeRO-3 (`Recipe.fused_linear_loss`)."""
    h, v, size = spec.embedding_width, spec.vocab_size, w.dtype_bytes
    rows = fused_loss_rows(w.tokens, v, h)
    products = tuple(Gemm(n, v, h, dtype_bytes=size) for n in rows)
    weight = v * h
    yield replace(head, kernels=products, backward_kernels=(), saved_bytes=0.0,
                  transient_bytes=0.0, backward_transient_bytes=0.0,
                  fwd_hbm_bytes=ordered_sum(k.nbytes for k in products),
                  external=head.params > 0, backward_in_forward=True)
    gradients = size * (h * w.tokens + weight)
    work: list[Kernel] = [MemoryPass(gradients, 2),
                          MemoryPass(LOSS_TOKEN_BYTES * w.tokens, LOSS_TOKEN_KERNELS)]
    for n in rows:
        work.extend(elementwise_pass(r.loss, v * n, w, ELEMENTWISE_FLOPS_PER_ELEMENT * v * n))
        to_input, to_weight = linear_backward(Gemm(n, v, h, dtype_bytes=size))
        work.extend((to_input, MemoryPass(2 * size * h * n), to_weight,
                     MemoryPass((size + FP32_BYTES) * weight),
                     MemoryPass((2 * size + FP32_BYTES) * weight)))
    work.append(MemoryPass(FP32_BYTES * w.tokens, 2))
    transient = (FP32_BYTES * w.tokens + size * v * max(rows)
                 + (size + FP32_BYTES) * weight)
    loss = Module("loss", "loss", "elementwise", None, 0,
                  ELEMENTWISE_FLOPS_PER_ELEMENT * v * w.tokens, 0.0, 0.0, gradients,
                  transient_bytes=transient, host_syncs=1, backward_host_syncs=1)
    scale = MemoryPass(2 * gradients, 2)
    yield replace(loss, kernels=tuple(work), backward_kernels=(scale,),
                  fwd_hbm_bytes=ordered_sum(k.nbytes for k in work))


def _block(spec: ModelSpec, layer: int, w: Workload, r: Recipe) -> list[Module]:
    modules = list(_block_modules(spec, layer, w, r))
    if not w.activation_checkpointing:
        return modules
    block_input = w.dtype_bytes * spec.hidden_size * w.tokens
    first, rest = modules[0], modules[1:]
    kept = 0.0 if w.checkpoint_in_cpu else block_input
    return [replace(first, saved_bytes=kept, recompute_bytes=first.saved_bytes,
                    checkpoint_bytes=block_input)] + [
        replace(m, saved_bytes=0.0, recompute_bytes=m.saved_bytes) for m in rest]


def build_modules(spec: ModelSpec, workload: Workload, recipe: Recipe = Recipe()
                  ) -> list[Module]:
    """Modules in forward execution order (backward runs them in reverse), cut and given
    kernels as `recipe` says."""
    modules = list(_embedding(spec, workload, recipe))
    for layer in range(spec.num_hidden_layers):
        modules.extend(_block(spec, layer, workload, recipe))
    modules.extend(_head(spec, workload, recipe))
    return modules


def parameter_modules(spec: ModelSpec, recipe: Recipe | None = None) -> list[tuple[str, int]]:
    """(name, directly-owned parameter count) for every module that owns parameters, cut as
    `recipe` (a stack's) cuts the model; without one, as the model's code is read."""
    probe = Workload(sequence_length=1)
    modules = build_modules(spec, probe) if recipe is None else build_modules(spec, probe, recipe)
    return [(m.name, m.params) for m in modules if m.params > 0]


def total_params(spec: ModelSpec) -> int:
    return sum(p for _, p in parameter_modules(spec))


def largest_layer_params(spec: ModelSpec, recipe: Recipe | None = None) -> int:
    """Largest parameter count owned directly by one module (DeepSpeed's `_all_live` rule), as
    `recipe` cuts the model (transformers 5 holds a block's experts in one module)."""
    return max(p for _, p in parameter_modules(spec, recipe))
