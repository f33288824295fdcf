"""Models given as Hugging Face `config.json` fields, inline or from a file.

Each `model_type` in `MODEL_TYPES` is read as its transformers configuration class and modeling
code build the model (defaults included: a field the file leaves out takes the class's
default), so the parameter count is the checkpoint's to the parameter. What departs from the
`llama` / `gpt` layouts is read into `ModelSpec`'s layout fields (`zerosim.models.spec`): Gemma's
`head_dim`, Qwen2's Q/K/V biases, `attention_bias` / `mlp_bias`, Falcon's `num_kv_heads`,
`bias`, `alibi` and norm layout, GPT-NeoX's rotary positions and untied output, GPT-2's
`n_inner: null` (4 h), OPT's `ffn_dim`, position offset and projections, BLOOM's embedding
norm, and mixture-of-experts MLPs (Mixtral, Qwen2-MoE, DeepSeek-MoE). A field that no reader
uses and that is not known to leave size, FLOPs and activations alone is warned about by name
(`ModelFieldWarning`). A config without `model_type` names its layout with `family: llama|gpt`
and may set the layout fields by their `ModelSpec` names.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any, get_args

from zerosim.errors import ScenarioError, ScenarioWarning, clip
from zerosim.inputs import check_plausible, parse_json, read_input_text
from zerosim.models.spec import (
    GPT_LAYOUT,
    MLASpec,
    ModelSpec,
    MoESpec,
    Norm,
    Positions,
    QKNorm,
)


class ModelFieldWarning(ScenarioWarning):
    """A model field zerosim does not model that could change size, FLOPs or activations."""


# Older GPT-style configs name the same fields differently.
MAX_NAME_CHARS = 256
"""A config's `_name_or_path` is a label: longer ones are cut."""
ALIASES = {
    "n_embd": "hidden_size",
    "n_embed": "hidden_size",
    "n_layer": "num_hidden_layers",
    "n_head": "num_attention_heads",
    "n_positions": "max_position_embeddings",
    "n_inner": "intermediate_size",
    "attn_pdrop": "attention_dropout",
    "resid_pdrop": "hidden_dropout",
    "embd_pdrop": "embedding_dropout",
}
REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")

# Fields that change neither parameters, FLOPs nor saved activations (token ids, numerics,
# initialisation, bookkeeping, rotary frequencies; the activation function names, which the
# gpt family's readers take for the ungated MLP and a gated MLP's fused kernel leaves alone).
HARMLESS = {
    "_name_or_path", "architectures", "auto_map", "model_type", "transformers_version",
    "torch_dtype", "dtype", "use_cache", "bos_token_id", "eos_token_id", "pad_token_id",
    "sep_token_id", "decoder_start_token_id", "initializer_range", "init_std",
    "initializer_factor", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "rope_theta",
    "rope_scaling", "rope_parameters", "rotary_emb_base", "rotary_pct", "partial_rotary_factor",
    "hidden_act", "hidden_activation", "activation_function", "pretraining_tp", "max_window_layers",
    "use_sliding_window", "original_max_position_embeddings", "output_router_logits",
    "router_aux_loss_coef", "norm_topk_prob",
    "router_jitter_noise", "apply_residual_connection_post_layernorm", "use_parallel_residual",
    "task_specific_params", "summary_type", "summary_use_proj", "summary_activation",
    "summary_proj_to_labels", "summary_first_dropout", "prefix", "n_ctx", "output_projection",
    "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn",
    "id2label", "label2id", "is_decoder", "tokenizer_class", "classifier_dropout",
    "attention_softmax_in_fp32", "scale_attention_softmax_in_fp32", "slow_but_exact",
    "rope_interleaved", "attn_implementation", "_attn_implementation", "cache_implementation",
    "sliding_window_size",
    "family", "name", "base",
}


class Fields:
    """A config's fields, checked as they are read; remembers which ones were read."""

    def __init__(self, data: Mapping[str, Any], source: str, key_path: str) -> None:
        self.data = {ALIASES.get(k, k): v for k, v in data.items()}
        self.source, self.key_path = source, key_path
        self.read: set[str] = set()

    def error(self, key: str, expected: str, got: Any) -> ScenarioError:
        return ScenarioError(self.source, f"{self.key_path}.{key}", expected, got)

    def raw(self, key: str, default: Any = None) -> Any:
        """The value, or `default` when absent or null (transformers' `None` means default)."""
        self.read.add(key)
        value = self.data.get(key)
        return default if value is None else value

    def count(self, key: str, default: int | None = None, *, minimum: int = 1) -> int:
        value = self.raw(key, default)
        if value is None:
            raise self.error(key, "a positive integer", "nothing")
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            expected = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise self.error(key, expected, value)
        check_plausible(f"model.{key}", value, source=self.source,
                        key_path=f"{self.key_path}.{key}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise self.error(key, "true or false", value)
        return value

    def fraction(self, key: str) -> float:
        value = self.raw(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
            raise self.error(key, "a number in [0, 1)", value)
        return float(value)

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.raw(key, default)
        if value not in choices:
            raise self.error(key, f"one of {', '.join(choices)}", value)
        return value

    def text(self, key: str, default: str) -> str:
        value = self.raw(key, default)
        if not isinstance(value, str) or not value:
            raise self.error(key, "a name", value)
        return value

    def unread(self) -> list[str]:
        return [k for k, v in self.data.items()
                if k not in self.read and k not in HARMLESS and v is not None]


Layout = dict[str, Any]


# ------------------------------------------------------------------ llama-like readers


def _llama(f: Fields) -> Layout:
    """LlamaConfig: `attention_bias` on q/k/v/o, `mlp_bias` on gate/up/down (both default
    false); also Mistral, Yi, and InternLM2 (its `bias` on wqkv and wo)."""
    bias = f.flag("attention_bias", f.flag("bias", False))
    return {"qkv_bias": bias, "attention_out_bias": bias, "mlp_bias": f.flag("mlp_bias", False)}


def _mistral(f: Fields) -> Layout:
    _sliding_window(f)
    return _llama(f)


def _qwen2(f: Fields) -> Layout:
    """Qwen2Attention: q_proj, k_proj and v_proj with bias, o_proj without."""
    _sliding_window(f)
    return {"qkv_bias": True, "attention_out_bias": False, "mlp_bias": False}


PHI3_IGNORED = ("embedding_dropout", "attention_bias", "mlp_bias", "lm_head_bias",
                "full_attn_mod", "interpolate_factor")
"""Fields of Phi-3 and Phi-4 configs that transformers' Phi3 code does not read (its
projections are bias-free whatever they say; the last two are left from the models' own
code)."""


def _phi3(f: Fields) -> Layout:
    """Phi3Attention's one bias-free `qkv_proj` (sliced into Q, K and V) and `o_proj`;
    Phi3MLP's one `gate_up_proj`, chunked into gate and up, and `down_proj`; `resid_pdrop`
    after attention and MLP; `embd_pdrop`, which the 5.x model does not apply. Also Phi-4
    (`phi3` configs)."""
    _defaults(f, intermediate_size=8192)
    _sliding_window(f)
    f.read.update(PHI3_IGNORED)
    return {"qkv_bias": False, "attention_out_bias": False, "mlp_bias": False,
            "fused_qkv": True, "fused_gate_up": True}


def _gemma2(f: Fields) -> Layout:
    """Gemma2DecoderLayer: input_layernorm, the attention (q/k/v/o biased iff
    `attention_bias`), post_attention_layernorm on its output, the residual add,
    pre_feedforward_layernorm, the gated MLP, post_feedforward_layernorm, the residual add;
    eager attention's scores capped (`attn_logit_softcapping`, default 50) and the logits
    (`final_logit_softcapping`, default 30). Defaults: head_dim 256, tied; every other layer
    attends within a sliding window."""
    _defaults(f, head_dim=256, intermediate_size=9216, max_position_embeddings=8192)
    return _gemma_layout(f, attention_cap=50.0, logit_cap=30.0)


def _gemma3_text(f: Fields) -> Layout:
    """Gemma3TextModel (Gemma-3 1B, and the text model of the larger ones): Gemma-2's block
    with a per-head RMSNorm of Q and of K after the three projections (`q_norm`, `k_norm`),
    no soft-capping unless the config sets it; five of every six layers slide."""
    _defaults(f, head_dim=256, intermediate_size=9216, max_position_embeddings=131072)
    f.read.update({"rope_local_base_freq", "sliding_window_pattern"})
    return {**_gemma_layout(f, attention_cap=None, logit_cap=None),
            "qk_norm": "per_head_after_qkv"}


def _gemma3(f: Fields) -> Layout:
    """Gemma-3's multimodal configuration (a vision tower beside `text_config`): refused."""
    raise f.error("model_type", "a text model's config: zerosim does not model Gemma-3's vision "
                  "tower; give its text_config's fields with model_type gemma3_text", "gemma3")


def _gemma_layout(f: Fields, *, attention_cap: float | None, logit_cap: float | None
                  ) -> Layout:
    _sliding_window(f)
    f.read.add("query_pre_attn_scalar")
    if not f.data.get("use_bidirectional_attention"):
        f.read.add("use_bidirectional_attention")
    bias = f.flag("attention_bias", False)
    return {"qkv_bias": bias, "attention_out_bias": bias, "mlp_bias": False, "post_norms": True,
            "attention_softcap": _softcap(f, "attn_logit_softcapping", attention_cap),
            "logit_softcap": _softcap(f, "final_logit_softcapping", logit_cap)}


def _softcap(f: Fields, key: str, default: float | None) -> bool:
    """Whether a soft-capping value is set: an absent key takes the configuration class's
    default, null turns it off."""
    f.read.add(key)
    value = f.data.get(key, default)
    if value is None:
        return False
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise f.error(key, "a positive number or null", value)
    return True


def _olmo2(f: Fields) -> Layout:
    """Olmo2DecoderLayer: no norm before the attention or the MLP; the attention (q/k/v/o
    biased iff `attention_bias`), post_attention_layernorm on its output, the residual add,
    the MLP, post_feedforward_layernorm, the residual add; an RMSNorm over Q's and over K's
    whole projection output (`q_norm`, `k_norm`). OLMo-3 (`olmo3`) adds sliding layers."""
    _defaults(f, intermediate_size=11008, max_position_embeddings=2048)
    _sliding_window(f)
    bias = f.flag("attention_bias", False)
    return {"qkv_bias": bias, "attention_out_bias": bias, "mlp_bias": False,
            "norms_per_block": 0, "post_norms": True, "qk_norm": "full_width"}


def _qwen3(f: Fields) -> Layout:
    """Qwen3Attention: q/k/v/o_proj biased iff `attention_bias` (default false), then an
    RMSNorm over each head of Q (`q_norm`) and of K (`k_norm`); LlamaMLP's bias-free MLP.
    Configuration defaults: `head_dim` 128, `intermediate_size` 22016, no sliding window."""
    _defaults(f, head_dim=128, intermediate_size=22016, max_position_embeddings=32768)
    _sliding_window(f, enabled_by_default=False)
    bias = f.flag("attention_bias", False)
    return {"qkv_bias": bias, "attention_out_bias": bias, "mlp_bias": False,
            "qk_norm": "per_head"}


def _qwen3_moe(f: Fields) -> Layout:
    """Qwen3MoeDecoderLayer: Qwen3's attention; a sparse block where `(layer + 1) %
    decoder_sparse_step == 0` and the layer is not in `mlp_only_layers` (`num_experts` experts
    of `moe_intermediate_size`, top `num_experts_per_tok`, no shared expert), else a dense
    MLP of `intermediate_size` (default 6144)."""
    _defaults(f, head_dim=128, intermediate_size=6144, max_position_embeddings=32768)
    _sliding_window(f, enabled_by_default=False)
    bias = f.flag("attention_bias", False)
    experts, sparse = _qwen_sparse_layers(f, 128)
    layout = {"qkv_bias": bias, "attention_out_bias": bias, "mlp_bias": False,
              "qk_norm": "per_head"}
    if sparse:
        layout["moe"] = MoESpec(experts, _top_k(f, "num_experts", experts, 8),
                                f.count("moe_intermediate_size", 768), sparse)
    return layout


def _defaults(f: Fields, **values: Any) -> None:
    """The configuration class's defaults for fields the file leaves out."""
    for key, value in values.items():
        if f.data.get(key) is None:
            f.data[key] = value


def _sliding_window(f: Fields, *, enabled_by_default: bool = True) -> None:
    """Full causal attention is replayed; a window shorter than the sequence would skip work
    only in kernels that honour it. Transformers 5 configs also list each layer's type
    (`layer_types`), where sliding layers say so."""
    window, kinds = f.raw("sliding_window"), f.raw("layer_types")
    if kinds is not None and not (isinstance(kinds, list)
                                  and all(isinstance(kind, str) for kind in kinds)):
        raise f.error("layer_types", "a list of attention kinds ('full_attention', ...)", kinds)
    if kinds is not None:
        sliding = [i for i, kind in enumerate(kinds) if kind != "full_attention"]
        if sliding and window is not None:
            warnings.warn(f"{f.source}: {f.key_path}.layer_types: layers {sliding} use a "
                          f"sliding window of {window}; zerosim replays full causal attention "
                          f"(the same for sequences up to {window})", ModelFieldWarning,
                          stacklevel=6)
    elif window is not None and f.raw("use_sliding_window", enabled_by_default):
        warnings.warn(f"{f.source}: {f.key_path}.sliding_window: {window}; zerosim replays full "
                      f"causal attention (the same for sequences up to {window})",
                      ModelFieldWarning, stacklevel=6)


def _mixtral(f: Fields) -> Layout:
    """MixtralSparseMoeBlock in every layer: `num_local_experts` experts of
    `intermediate_size`, top `num_experts_per_tok`."""
    _sliding_window(f)
    layers = f.count("num_hidden_layers")
    experts = f.count("num_local_experts", 8)
    moe = MoESpec(experts, _top_k(f, "num_local_experts", experts, 2),
                  f.count("intermediate_size", 14336), tuple(range(layers)))
    return {**_llama(f), "moe": moe}


def _qwen2_moe(f: Fields) -> Layout:
    """Qwen2MoeDecoderLayer: a sparse block where `num_experts > 0` and `(layer + 1) %
    decoder_sparse_step == 0` and the layer is not in `mlp_only_layers`; experts of
    `moe_intermediate_size`, one shared expert of `shared_expert_intermediate_size` with a
    one-output sigmoid gate."""
    experts, sparse = _qwen_sparse_layers(f, 60)
    layout = _qwen2(f)
    if sparse:
        layout["moe"] = MoESpec(experts, _top_k(f, "num_experts", experts, 4),
                                f.count("moe_intermediate_size", 1408), sparse,
                                f.count("shared_expert_intermediate_size", 5632, minimum=0),
                                shared_expert_gate=True, shared_expert_first=True)
    return layout


def _qwen_sparse_layers(f: Fields, default_experts: int) -> tuple[int, tuple[int, ...]]:
    """Qwen's MoE configs: `num_experts`, and the layers with a sparse block, where
    `(layer + 1) % decoder_sparse_step == 0` and the layer is not in `mlp_only_layers`."""
    layers = f.count("num_hidden_layers")
    step = f.count("decoder_sparse_step", 1)
    dense = set(_layer_indices(f, "mlp_only_layers", layers) or ())
    experts = f.count("num_experts", default_experts, minimum=0)
    return experts, tuple(i for i in range(layers)
                          if experts > 0 and (i + 1) % step == 0 and i not in dense)


def _top_k(f: Fields, experts_key: str, experts: int, default: int | None = None) -> int:
    """`num_experts_per_tok`, from 1 to the `experts` there are. Transformers' config classes
    take any integer, but every router picks each token's experts with `torch.topk` over one
    score per expert, which fails on the first forward when k is larger ("selected index k
    out of range"); here it would route each token to more experts than exist."""
    top_k = f.raw("num_experts_per_tok", default)
    if isinstance(top_k, int) and not isinstance(top_k, bool) and not 1 <= top_k <= experts:
        raise f.error("num_experts_per_tok", f"an integer from 1 to {experts_key} ({experts}), "
                      "the experts each token is routed to (transformers' router, torch.topk, "
                      "fails on more)", top_k)
    return f.count("num_experts_per_tok", default)


def _layer_indices(f: Fields, key: str, layers: int) -> list[int] | None:
    """A list of layer indices (`mlp_only_layers`, `moe_layers`), each from 0 to
    `num_hidden_layers - 1` and listed once, or None when absent. Transformers' config takes
    any integers and each layer asks whether its index is listed, so an index past the last
    layer, a negative one (not counted from the end) or a repeat changes nothing there: a
    mistake in the config, refused rather than replayed as if it were not written."""
    value = f.raw(key)
    if value is None:
        return None
    if not isinstance(value, list | tuple) or any(
            isinstance(index, bool) or not isinstance(index, int) for index in value):
        raise f.error(key, f"a list of layer indices from 0 to {layers - 1}", value)
    for position, index in enumerate(value):
        if not 0 <= index < layers or index in value[:position]:
            raise f.error(f"{key}[{position}]", f"a layer index from 0 to {layers - 1} "
                          f"(num_hidden_layers {layers}), each listed once", index)
    return list(value)


def _deepseek(f: Fields) -> Layout:
    """DeepSeek-MoE (`deepseek`, trust_remote_code): MoE blocks from `first_k_dense_replace`
    every `moe_layer_freq`, `n_routed_experts` of `moe_intermediate_size`, and
    `n_shared_experts` fused into one shared MLP of n x `moe_intermediate_size`, no gate.
    Latent attention's fields belong to `deepseek_v2` and `deepseek_v3` configs."""
    if f.raw("kv_lora_rank") is not None or f.raw("q_lora_rank") is not None:
        raise f.error("kv_lora_rank", "no multi-head latent attention in a `deepseek` config "
                      "(DeepSeek-V2/V3's are model_type deepseek_v2 or deepseek_v3)",
                      f.raw("kv_lora_rank"))
    layers = f.count("num_hidden_layers")
    first, freq = f.count("first_k_dense_replace", 0, minimum=0), f.count("moe_layer_freq", 1)
    experts = f.raw("n_routed_experts")
    layout = _llama(f)
    if experts is not None:
        width = f.count("moe_intermediate_size", 1407)
        sparse = tuple(i for i in range(layers) if i >= first and i % freq == 0)
        routed = f.count("n_routed_experts")
        layout["moe"] = MoESpec(routed, _top_k(f, "n_routed_experts", routed), width, sparse,
                                width * f.count("n_shared_experts", 0, minimum=0),
                                experts_layout="list")
    return layout


# ------------------------------------------------------------------ gpt-like readers


DEEPSEEK_DEFAULTS = {
    "deepseek_v2": {"intermediate_size": 11008, "moe_intermediate_size": 1407,
                    "n_shared_experts": 2, "n_routed_experts": 64, "first_k_dense_replace": 0,
                    "max_position_embeddings": 2048},
    "deepseek_v3": {"intermediate_size": 18432, "moe_intermediate_size": 2048,
                    "n_shared_experts": 1, "n_routed_experts": 256, "first_k_dense_replace": 3,
                    "num_experts_per_tok": 8, "max_position_embeddings": 4096},
}
"""DeepseekV2Config's and DeepseekV3Config's defaults where they differ (transformers 5.17)."""
MLA_DEFAULTS = {"kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                "v_head_dim": 128}
DEEPSEEK_ROUTING = ("n_group", "topk_group", "topk_method", "routed_scaling_factor",
                    "scoring_func", "aux_loss_alpha", "seq_aux", "ep_size", "rope_interleave",
                    "num_nextn_predict_layers", "num_mtp_layers")
"""Fields of DeepSeek-V2/V3 configs that choose experts or rotary frequencies, or name the
multi-token-prediction layers a checkpoint carries beside the model, which transformers'
DeepseekV3ForCausalLM does not build."""


def _deepseek_mla(f: Fields) -> Layout:
    """transformers 5's DeepseekV2ForCausalLM and DeepseekV3ForCausalLM (DeepSeek-V2, V3,
    Kimi-K2, Moonlight): multi-head latent attention (`q_lora_rank`, null for Q made
    directly, `kv_lora_rank`, `qk_nope_head_dim`, `qk_rope_head_dim`, `v_head_dim`;
    `attention_bias` on q_a_proj, kv_a_proj_with_mqa and o_proj) and, from layer
    `first_k_dense_replace` on, `n_routed_experts` experts of `moe_intermediate_size` as
    transformers' own experts module, then `n_shared_experts` shared ones fused into one MLP,
    no gate; dense layers of `intermediate_size` before. The router is priced as a 16-bit
    linear (transformers runs it in fp32)."""
    model_type = f.raw("model_type")
    _defaults(f, **DEEPSEEK_DEFAULTS[model_type], **MLA_DEFAULTS)
    direct_q = "q_lora_rank" in f.data and f.data["q_lora_rank"] is None
    mla = MLASpec(f.count("kv_lora_rank"), f.count("qk_nope_head_dim"),
                  f.count("qk_rope_head_dim"), f.count("v_head_dim"),
                  0 if direct_q else f.count("q_lora_rank", 1536))
    f.read.add("q_lora_rank")
    bias = f.flag("attention_bias", False)
    return {"qkv_bias": bias, "attention_out_bias": bias, "mlp_bias": False, "mla": mla,
            **_deepseek_style_moe(f)}


def _deepseek_style_moe(f: Fields) -> Layout:
    """DeepSeek-V3's MoE layout, which GLM-4.5 shares: every layer from
    `first_k_dense_replace` on sparse, `n_routed_experts` experts of `moe_intermediate_size`
    (transformers' own experts module), then `n_shared_experts` shared ones fused into one
    MLP, no gate; dense layers of `intermediate_size` before."""
    f.read.update(DEEPSEEK_ROUTING)
    if f.raw("moe_layer_freq", 1) != 1:
        raise f.error("moe_layer_freq", "1 (transformers' code makes every layer from "
                      "first_k_dense_replace on sparse)", f.raw("moe_layer_freq"))
    layers, first = f.count("num_hidden_layers"), f.count("first_k_dense_replace", minimum=0)
    width = f.count("moe_intermediate_size")
    sparse = tuple(range(first, layers))
    if not sparse:
        return {}
    routed = f.count("n_routed_experts")
    return {"moe": MoESpec(routed, _top_k(f, "n_routed_experts", routed), width, sparse,
                           width * f.count("n_shared_experts", minimum=0))}


def _glm4_moe(f: Fields) -> Layout:
    """Glm4MoeForCausalLM (GLM-4.5, GLM-4.5-Air): Q/K/V biased iff `attention_bias`, a
    bias-free `o_proj`, per-head Q/K norms after the three projections with `use_qk_norm`;
    DeepSeek-V3's MoE layout (its router's correction bias is a buffer, not a parameter)."""
    _defaults(f, intermediate_size=10944, moe_intermediate_size=1408, n_shared_experts=1,
              n_routed_experts=128, num_experts_per_tok=8, first_k_dense_replace=1,
              max_position_embeddings=131072)
    layout = {"qkv_bias": f.flag("attention_bias", False), "attention_out_bias": False,
              "mlp_bias": False, **_deepseek_style_moe(f)}
    if f.flag("use_qk_norm", False):
        layout["qk_norm"] = "per_head_after_qkv"
    return layout


def _gpt_oss(f: Fields) -> Layout:
    """GptOssForCausalLM: q/k/v/o biased (`attention_bias`, default true) and a sink logit per
    head on the attention module itself; every layer an MoE block: a biased router and
    `num_local_experts` experts of `intermediate_size`, top `num_experts_per_tok`, held as one
    module with biases in every release (GptOssExperts), no shared expert; alternate layers
    attend within a sliding window. Its clamped GLU (interleaved halves) is priced as the
    stack's gated activation."""
    _defaults(f, head_dim=64, intermediate_size=2880, max_position_embeddings=131072)
    _sliding_window(f)
    f.read.update({"swiglu_limit", "initial_context_length", "experts_per_token"})
    bias = f.flag("attention_bias", True)
    experts = f.count("num_local_experts", 128)
    moe = MoESpec(experts, _top_k(f, "num_local_experts", experts, 4),
                  f.count("intermediate_size"), tuple(range(f.count("num_hidden_layers"))),
                  experts_layout="fused", router_bias=True, expert_bias=True)
    return {"qkv_bias": bias, "attention_out_bias": bias, "mlp_bias": False,
            "attention_sinks": True, "moe": moe}


LLAMA4_NOT_PRICED = ("use_qk_norm", "no_rope_layers", "no_rope_layer_interval",
                     "attn_temperature_tuning", "floor_scale", "attn_scale",
                     "for_llm_compressor")
"""Llama 4 fields whose kernels zerosim does not price: the parameter-free L2 norm of Q and K,
the layers without rotary embedding and the query scaling there; a few elementwise kernels."""


def _llama4_text(f: Fields) -> Layout:
    """Llama4ForCausalLM's text model (Llama 4 Scout, Maverick): Llama's attention (q/k/v/o
    biased iff `attention_bias`); an MoE block every `interleave_moe_layer_step` layers (or
    at `moe_layers`): a router, `num_local_experts` experts of `intermediate_size` as one
    module that runs every token (`MoESpec.routing: every_token`), then a shared expert of
    `intermediate_size`; the other layers a dense MLP of `intermediate_size_mlp`. Rotary
    layers attend within chunks of `attention_chunk_size`."""
    _defaults(f, head_dim=128, intermediate_size=8192, intermediate_size_mlp=16384,
              max_position_embeddings=131072)
    f.read.update(LLAMA4_NOT_PRICED)
    chunk = f.data.get("attention_chunk_size", 8192)
    f.read.add("attention_chunk_size")
    if chunk is not None:
        warnings.warn(f"{f.source}: {f.key_path}.attention_chunk_size: {chunk}; zerosim replays "
                      f"full causal attention (the same for sequences up to {chunk})",
                      ModelFieldWarning, stacklevel=5)
    layers, step = f.count("num_hidden_layers"), f.count("interleave_moe_layer_step", 1)
    listed = _layer_indices(f, "moe_layers", layers)
    sparse = tuple(listed) if listed is not None else tuple(range(step - 1, layers, step))
    width = f.count("intermediate_size")
    bias = f.flag("attention_bias", False)
    layout = {"qkv_bias": bias, "attention_out_bias": bias, "mlp_bias": False,
              "intermediate_size": f.count("intermediate_size_mlp")}
    if sparse:
        experts = f.count("num_local_experts", 16)
        layout["moe"] = MoESpec(experts, _top_k(f, "num_local_experts", experts, 1), width,
                                sparse, width, experts_layout="fused", routing="every_token")
    return layout


def _llama4(f: Fields) -> Layout:
    """Llama 4's multimodal configuration (a vision model beside `text_config`): refused."""
    raise f.error("model_type", "a text model's config: zerosim does not model Llama 4's vision "
                  "model; give its text_config's fields with model_type llama4_text", "llama4")


def _gpt2(f: Fields) -> Layout:
    """GPT2Model: LayerNorm, fused c_attn with bias, learned positions (`n_positions`),
    `n_inner` (null: 4 h), `embd_pdrop`; GPTBigCode adds `multi_query` (one K/V head)."""
    layout = {**GPT_LAYOUT, "embedding_dropout": f.fraction("embedding_dropout"),
              "activation": f.text("activation_function", "gelu_new")}
    if f.flag("multi_query", False):
        layout["num_key_value_heads"] = 1
    return layout


def _gpt_bigcode(f: Fields) -> Layout:
    f.data.setdefault("multi_query", True)
    f.data.setdefault("activation_function", "gelu_pytorch_tanh")
    return _gpt2(f)


def _gptj(f: Fields) -> Layout:
    """GPTJBlock: one ln_1 feeding attention and MLP in parallel, bias-free q/k/v/out_proj,
    fc_in/fc_out with bias, rotary positions, an LM head with bias, untied."""
    return {**GPT_LAYOUT, "norms_per_block": 1, "qkv_bias": False, "attention_out_bias": False,
            "fused_qkv": False, "position_embedding": "rotary", "lm_head_bias": True,
            "embedding_dropout": f.fraction("embedding_dropout"),
            "activation": f.text("activation_function", "gelu_new")}


def _gpt_neox(f: Fields) -> Layout:
    """GPTNeoXLayer: input and post-attention LayerNorms, query_key_value and dense with
    `attention_bias` (default true), MLP with bias, rotary positions, untied embed_out."""
    bias = f.flag("attention_bias", True)
    return {**GPT_LAYOUT, "qkv_bias": bias, "attention_out_bias": bias,
            "position_embedding": "rotary", "activation": f.text("hidden_act", "gelu")}


def _falcon(f: Fields) -> Layout:
    """FalconDecoderLayer: every linear biased iff `bias` (default false). The new decoder
    architecture (40B, 180B) has `num_kv_heads` K/V heads and two norms (ln_attn, ln_mlp)
    unless `num_ln_in_parallel_attn` is 1; the old one (7B) one K/V head with `multi_query`
    and, with `parallel_attn`, one input norm. MLP `ffn_hidden_size` (default 4 h). `alibi`
    replaces rotary positions."""
    bias = f.flag("bias", False)
    heads = f.count("num_attention_heads")
    if f.flag("new_decoder_architecture", False):
        kv = f.count("num_kv_heads", heads)
        norms = 1 if f.raw("num_ln_in_parallel_attn") == 1 else 2
    else:
        kv = 1 if f.flag("multi_query", True) else heads
        norms = 1 if f.flag("parallel_attn", True) else 2
    f.read.update({"num_kv_heads", "num_ln_in_parallel_attn", "parallel_attn"})
    h = f.count("hidden_size")
    return {**GPT_LAYOUT, "qkv_bias": bias, "attention_out_bias": bias, "mlp_bias": bias,
            "num_key_value_heads": kv, "norms_per_block": norms,
            "intermediate_size": f.count("ffn_hidden_size", 4 * h),
            "position_embedding": "alibi" if f.flag("alibi", False) else "rotary",
            "activation": f.text("activation", "gelu")}


def _opt(f: Fields) -> Layout:
    """OPTDecoder: q/k/v/out_proj and fc1/fc2 biased iff `enable_bias` (default true), MLP
    `ffn_dim`, `max_position_embeddings + 2` learned positions, `dropout` after attention and
    MLP, project_in/out when `word_embed_proj_dim` differs from hidden_size, a final norm
    only with `do_layer_norm_before` and not `_remove_final_layer_norm`."""
    bias = f.flag("enable_bias", True)
    h = f.count("hidden_size")
    for key in ("layerdrop", "activation_dropout"):
        if f.fraction(key) > 0:
            warnings.warn(f"{f.source}: {f.key_path}.{key}: {f.raw(key)}; zerosim does not model "
                          "it (it changes the work or the saved activations)",
                          ModelFieldWarning, stacklevel=5)
    return {**GPT_LAYOUT, "qkv_bias": bias, "attention_out_bias": bias, "mlp_bias": bias,
            "fused_qkv": False, "position_offset": 2, "hidden_dropout": f.fraction("dropout"),
            "intermediate_size": f.count("ffn_dim", 4 * h),
            "word_embed_proj_dim": f.count("word_embed_proj_dim", h),
            "final_norm": f.flag("do_layer_norm_before", True)
            and not f.flag("_remove_final_layer_norm", False),
            "activation": f.text("activation_function", "relu")}


def _bloom(f: Fields) -> Layout:
    """BloomModel: word_embeddings_layernorm after the embedding, ALiBi, fused
    query_key_value and MLP (4 h) with bias, tied."""
    return {**GPT_LAYOUT, "position_embedding": "alibi", "embedding_norm": True,
            "activation": "bloom_gelu"}


# model_type -> (family, reader, tie_word_embeddings default of its configuration class)
MODEL_TYPES: dict[str, tuple[str, Callable[[Fields], Layout], bool]] = {
    "llama": ("llama", _llama, False),
    "mistral": ("llama", _mistral, False),
    "yi": ("llama", _llama, False),
    "internlm2": ("llama", _llama, False),
    "qwen2": ("llama", _qwen2, False),
    "gemma": ("llama", _llama, True),
    "gemma2": ("llama", _gemma2, True),
    "gemma3_text": ("llama", _gemma3_text, True),
    "gemma3": ("llama", _gemma3, True),
    "mixtral": ("llama", _mixtral, False),
    "qwen2_moe": ("llama", _qwen2_moe, False),
    "qwen3": ("llama", _qwen3, False),
    "phi3": ("llama", _phi3, False),
    "olmo2": ("llama", _olmo2, False),
    "olmo3": ("llama", _olmo2, False),
    "qwen3_moe": ("llama", _qwen3_moe, False),
    "deepseek": ("llama", _deepseek, False),
    "gpt_oss": ("llama", _gpt_oss, False),
    "glm4_moe": ("llama", _glm4_moe, False),
    "llama4_text": ("llama", _llama4_text, False),
    "llama4": ("llama", _llama4, False),
    "deepseek_v2": ("llama", _deepseek_mla, False),
    "deepseek_v3": ("llama", _deepseek_mla, False),
    "gpt2": ("gpt", _gpt2, True),
    "gpt3": ("gpt", _gpt2, True),
    "gpt_bigcode": ("gpt", _gpt_bigcode, True),
    "gptj": ("gpt", _gptj, False),
    "gpt_neox": ("gpt", _gpt_neox, False),
    "falcon": ("gpt", _falcon, True),
    "opt": ("gpt", _opt, True),
    "bloom": ("gpt", _bloom, True),
}
FAMILY_READERS = {"llama": (_llama, False), "gpt": (_gpt2, True)}

# ModelSpec layout fields a config may also set by name (inline models with `family:`).
_BOOL_FIELDS = ("qkv_bias", "attention_out_bias", "mlp_bias", "gated_mlp", "fused_qkv",
                "lm_head_bias", "embedding_norm", "final_norm", "fused_gate_up", "post_norms",
                "attention_softcap", "logit_softcap", "attention_sinks")
_COUNT_FIELDS = ("norms_per_block", "position_offset", "word_embed_proj_dim")


def _family(f: Fields) -> tuple[str, Callable[[Fields], Layout], bool]:
    if "family" in f.data:
        family = f.data["family"]
        if not isinstance(family, str) or family not in FAMILY_READERS:
            raise f.error("family", "'llama' or 'gpt'", family)
        return (family, *FAMILY_READERS[family])
    model_type = f.raw("model_type")
    if isinstance(model_type, str) and model_type in MODEL_TYPES:
        return MODEL_TYPES[model_type]
    raise f.error("family", "'family: llama|gpt', or a model_type zerosim knows "
                  f"({', '.join(sorted(MODEL_TYPES))})", model_type)


def _native(f: Fields) -> Layout:
    """Layout fields given by their ModelSpec names."""
    layout: Layout = {}
    for key in _BOOL_FIELDS:
        if f.data.get(key) is not None:
            layout[key] = f.flag(key, False)
    for key in _COUNT_FIELDS:
        if f.data.get(key) is not None:
            layout[key] = f.count(key, minimum=0)
    if f.data.get("embedding_dropout") is not None:
        layout["embedding_dropout"] = f.fraction("embedding_dropout")
    if f.data.get("norm") is not None:
        layout["norm"] = f.choice("norm", "rms", get_args(Norm))
    if f.data.get("qk_norm") is not None:
        layout["qk_norm"] = f.choice("qk_norm", "", get_args(QKNorm))
    if f.data.get("position_embedding") is not None:
        layout["position_embedding"] = f.choice("position_embedding", "rotary",
                                                get_args(Positions))
    if f.data.get("moe") is not None:
        layout["moe"] = _moe_mapping(f)
    if f.data.get("activation") is not None:
        value = f.raw("activation")
        if not isinstance(value, str):
            raise f.error("activation", "an activation function's name", value)
        layout["activation"] = value
    return layout


def _moe_mapping(f: Fields) -> MoESpec:
    """A `moe:` mapping of MoESpec's fields, its counts, top k and layers checked as a
    model_type's are (`_top_k`, `_layer_indices`)."""
    value = f.raw("moe")
    if isinstance(value, MoESpec):
        return value
    try:
        spec = MoESpec(**{**value, "layers": tuple(value["layers"])})
    except (TypeError, KeyError) as err:
        raise f.error("moe", "{num_experts, num_experts_per_tok, expert_intermediate_size, "
                      "layers, [shared_expert_intermediate_size, shared_expert_gate]}",
                      value) from err
    moe = Fields(value, f.source, f"{f.key_path}.moe")
    experts = moe.count("num_experts")
    _top_k(moe, "num_experts", experts)
    moe.count("expert_intermediate_size")
    moe.count("shared_expert_intermediate_size", 0, minimum=0)
    _layer_indices(moe, "layers", f.count("num_hidden_layers"))
    return spec


def _shape(f: Fields, layout: Layout, tie_default: bool) -> dict[str, Any]:
    for key in REQUIRED:
        f.count(key)
    h, heads = f.count("hidden_size"), f.count("num_attention_heads")
    values = {
        "hidden_size": h, "num_hidden_layers": f.count("num_hidden_layers"),
        "num_attention_heads": heads, "vocab_size": f.count("vocab_size"),
        "intermediate_size": layout.pop("intermediate_size", None)
        or f.count("intermediate_size", 4 * h),
        "num_key_value_heads": layout.pop("num_key_value_heads", None)
        or f.count("num_key_value_heads", heads),
        "max_position_embeddings": f.count("max_position_embeddings", 4096),
        "head_dim": f.count("head_dim", 0, minimum=0),
        "tie_word_embeddings": f.flag("tie_word_embeddings", tie_default),
        "attention_dropout": f.fraction("attention_dropout"),
        "hidden_dropout": f.fraction("hidden_dropout"),
    }
    if not values["head_dim"] and h % heads:
        raise f.error("num_attention_heads", f"a divisor of hidden_size={h}", heads)
    if heads % values["num_key_value_heads"]:
        raise f.error("num_key_value_heads", f"a divisor of num_attention_heads={heads}",
                      values["num_key_value_heads"])
    return values


def _warn_unread(f: Fields) -> None:
    unread = f.unread()
    if unread:
        listed = ", ".join(f"{key}={f.data[key]!r}" for key in unread)
        warnings.warn(f"{f.source}: {f.key_path}: zerosim does not model these fields, which "
                      f"could change the model's size, FLOPs or activations: {listed}",
                      ModelFieldWarning, stacklevel=4)


def fields_of(spec: ModelSpec) -> dict[str, Any]:
    """A spec as fields `spec_from_hf_fields` reads back (a catalog model as the base of an
    inline one): `head_dim` only where it is not hidden_size / heads, so a changed hidden
    size keeps the derived width."""
    fields = asdict(spec)
    fields.pop("name")
    if spec.head_dim * spec.num_attention_heads == spec.hidden_size:
        fields.pop("head_dim")
    return fields


def spec_from_hf_fields(fields: Mapping[str, Any], *, name: str, source: str = "<inline>",
                        key_path: str = "model") -> ModelSpec:
    """Build a ModelSpec from `config.json`-style fields, read as its model_type reads them."""
    f = Fields(fields, source, key_path)
    family, reader, tie_default = _family(f)
    layout = {**reader(f), **_native(f)}
    values = _shape(f, layout, tie_default)
    values.update({k: layout.pop(k) for k in ("attention_dropout", "hidden_dropout")
                   if k in layout})
    _warn_unread(f)
    model_type = f.data.get("model_type")
    return ModelSpec(name=name, family=family, **values, **layout,
                     model_type=model_type if model_type in MODEL_TYPES else "")


def looks_like_hf_config(path: Path) -> bool:
    """A `config.json` of a Hugging Face model (a JSON object with `model_type` or
    `architectures`), not a scenario."""
    if path.suffix.lower() != ".json":
        return False
    try:
        tree = parse_json(read_input_text(path), str(path))
    except ScenarioError:
        return False
    return isinstance(tree, dict) and "model" not in tree and bool(
        {"model_type", "architectures"} & set(tree))


def spec_from_hf_file(path: Path, *, source: str, key_path: str,
                      patch: Mapping[str, Any] | None = None) -> ModelSpec:
    """A model from its config.json; `patch` (fields beside `hf_config:` in a scenario, or
    `--set model.X` overrides) replaces the file's fields of the same name."""
    text = read_input_text(path, referenced_from=source, key_path=key_path,
                           what="config.json file")
    fields = parse_json(text, str(path))
    if not isinstance(fields, dict):
        raise ScenarioError(str(path), "<root>", "a JSON object", type(fields).__name__)
    name = fields.get("_name_or_path") or path.parent.name or path.stem
    origin = f"{path} (patched by {source})" if patch else str(path)
    return spec_from_hf_fields({**fields, **(patch or {})}, name=clip(str(name), MAX_NAME_CHARS),
                               source=origin,
                               key_path="<root>")
