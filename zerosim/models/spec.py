"""Transformer architecture description, in Hugging Face `config.json` field names."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Family = Literal["llama", "gpt"]
Norm = Literal["rms", "layer"]
Positions = Literal["rotary", "learned", "alibi"]
QKNorm = Literal["", "per_head", "per_head_after_qkv", "full_width"]
ExpertsLayout = Literal["stack", "list", "fused"]
Routing = Literal["top_k", "every_token"]


@dataclass(frozen=True)
class MoESpec:
    """Mixture-of-experts MLPs: in each block of `layers`, a router (a bias-free linear from
    the hidden state to one logit per expert) sends every token to `num_experts_per_tok` of
    `num_experts` gated MLPs of width `expert_intermediate_size`; a shared expert of width
    `shared_expert_intermediate_size` (0: none) sees every token, scaled by a one-output
    sigmoid gate when `shared_expert_gate`. Blocks not in `layers` have a dense MLP of the
    model's `intermediate_size`. Every expert's parameters exist (and ZeRO partitions them);
    each token's FLOPs and activations are those of the experts it is routed to."""

    num_experts: int
    num_experts_per_tok: int
    expert_intermediate_size: int
    layers: tuple[int, ...]
    shared_expert_intermediate_size: int = 0
    shared_expert_gate: bool = False
    shared_expert_first: bool = False
    """Transformers 5's Qwen2-MoE block runs its shared expert before the router (its 4.x code
    after the experts; DeepSeek's after them in both): the order of a fused experts module."""
    experts_layout: ExpertsLayout = "stack"
    """How the model's code holds its experts: as the stack says (`stack`: transformers' own
    Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3 classes, a module list in transformers 4 and
    one module in 5, `Recipe.fused_experts`), always a module list (`list`: DeepSeek-MoE's
    `trust_remote_code` code) or always one module (`fused`: GPT-OSS's, in every release)."""
    router_bias: bool = False
    """The router's linear has a bias (GPT-OSS)."""
    routing: Routing = "top_k"
    """Which tokens an expert computes: the `num_experts_per_tok` it is routed (`top_k`), or
    every token, scaled by its router score, zero where not routed (`every_token`:
    transformers' Llama 4, `hidden_states.repeat(num_experts, 1) * router_scores`)."""
    expert_bias: bool = False
    """Each expert's gate-up and down products add a bias (GPT-OSS's `gate_up_proj_bias`,
    `down_proj_bias`)."""

    def tokens_per_expert(self, tokens: float) -> float:
        """Tokens each expert computes when routing is even (its expectation under any router
        that balances load, which the auxiliary loss trains it towards); every token where
        each expert computes them all (`routing`)."""
        if self.routing == "every_token":
            return tokens
        return tokens * self.num_experts_per_tok / self.num_experts

    @property
    def routed_share(self) -> float:
        """The share of the tokens a token-routed expert needs to compute (the conventional
        count of a token's FLOPs: its top-k experts'), whatever the code computes."""
        return self.num_experts_per_tok / self.num_experts


@dataclass(frozen=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2, V3): Q made from the hidden state directly or
    through a latent of `q_lora_rank` (0: directly), K and V expanded from one latent of
    `kv_lora_rank` per token, every head's K a no-rope part of `qk_nope_head_dim` and a rotary
    part of `qk_rope_head_dim` shared by the heads, every head's V of `v_head_dim`."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int = 0

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True)
class ModelSpec:
    """The architecture fields zerosim needs, named as in a Hugging Face `config.json`.

    `family` names the layout the fields started from: `llama` (RMSNorm, bias-free
    projections, rotary positions, a gated MLP: gate, up, down) or `gpt` (LayerNorm, biases
    everywhere, learned positions, a GELU MLP: fc_in, fc_out, one fused QKV projection). The
    fields after `hidden_dropout` say where a model departs from that (`zerosim.models.hf`
    reads them from each `model_type`'s config): `head_dim` when it is not
    hidden_size / heads (Gemma), the biases, how many norms a block has (one when attention and
    MLP read the same normalised input: GPT-J, Falcon-7B), whether the model's own code fuses
    Q, K and V into one projection (and the gated MLP's gate and up: Phi-3), the position
    scheme and OPT's two extra position rows, a bias on the LM head (GPT-J), dropout after
    the embedding, a norm after the embedding
    (BLOOM), no final norm, OPT's embedding width, norms after attention and MLP and capped
    scores and logits (Gemma-2), per-head norms of Q and K (Qwen3, Gemma-3), and
    mixture-of-experts MLPs.
    """

    name: str
    family: Family
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0
    head_dim: int = 0
    """Width of one attention head; 0 means hidden_size // num_attention_heads."""
    norm: Norm = "rms"
    norms_per_block: int = 2
    """Norms before the attention and the MLP: 2, one each; 1, one both read (GPT-J,
    Falcon-7B); 0, none (OLMo-2, whose norms are on their outputs: `post_norms`)."""
    qkv_bias: bool = False
    attention_out_bias: bool = False
    mlp_bias: bool = False
    gated_mlp: bool = True
    fused_qkv: bool = False
    fused_gate_up: bool = False
    """The model's own code makes the gated MLP's gate and up halves with one projection
    (Phi-3's `gate_up_proj`), as a stack may fuse them (`Recipe.fused_gate_up`)."""
    position_embedding: Positions = "rotary"
    position_offset: int = 0
    lm_head_bias: bool = False
    embedding_dropout: float = 0.0
    embedding_norm: bool = False
    final_norm: bool = True
    word_embed_proj_dim: int = 0
    """OPT's embedding width when it differs from hidden_size (0: the same, no projections)."""
    activation: str = ""
    """The ungated MLP's activation function as the model's config names it (transformers'
    `ACT2FN` keys: `gelu`, `gelu_new`, `relu`, ...; `bloom_gelu` for BLOOM's own); "" when
    the config does not say. The stack prices it (`Recipe.ungated_activations`)."""
    post_norms: bool = False
    """A norm on the attention's output and one on the MLP's, each before its residual add,
    besides the norms before them (Gemma-2's `post_attention_layernorm` and
    `post_feedforward_layernorm`; its norm before the MLP is `pre_feedforward_layernorm`)."""
    attention_softcap: bool = False
    """Eager attention's scores capped as `cap * tanh(scores / cap)` before the mask (Gemma-2's
    `attn_logit_softcapping`)."""
    logit_softcap: bool = False
    """The LM head's logits capped the same way before the loss (`final_logit_softcapping`)."""
    attention_sinks: bool = False
    """A learned sink logit per head, a parameter of the attention module itself, joined to
    eager attention's scores before the softmax (GPT-OSS's `sinks`)."""
    qk_norm: QKNorm = ""
    """An RMSNorm of Q and one of K in every block (`q_norm`, `k_norm`): over each head, with
    `head_dim` weights, right after each one's projection (`per_head`, Qwen3) or after the Q,
    K and V projections all (`per_head_after_qkv`, Gemma-3); over the projection's whole
    output, with as many weights, right after it (`full_width`, OLMo-2); "" none."""
    moe: MoESpec | None = field(default=None)
    mla: MLASpec | None = field(default=None)
    """Multi-head latent attention in place of Q/K/V projections (DeepSeek-V2, V3)."""
    model_type: str = ""
    """The transformers `model_type` the fields were read as ("" where none was given): it
    names the model's module classes (`zerosim.models.leaves`)."""

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.word_embed_proj_dim == self.hidden_size:
            object.__setattr__(self, "word_embed_proj_dim", 0)

    @property
    def q_size(self) -> int:
        """Width of the Q projection and of the attention output (hidden_size unless head_dim
        says otherwise)."""
        return self.head_dim * self.num_attention_heads

    @property
    def kv_hidden_size(self) -> int:
        """Width of the K and V projections (smaller than hidden_size under GQA/MQA)."""
        return self.head_dim * self.num_key_value_heads

    @property
    def embedding_width(self) -> int:
        return self.word_embed_proj_dim or self.hidden_size

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and layer in self.moe.layers


GPT_LAYOUT: dict[str, Any] = {
    "norm": "layer", "qkv_bias": True, "attention_out_bias": True, "mlp_bias": True,
    "gated_mlp": False, "fused_qkv": True, "position_embedding": "learned",
}
"""The `gpt` family's departures from the ModelSpec defaults (GPT-2's layout)."""
