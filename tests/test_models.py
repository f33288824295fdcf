"""The model catalog and the per-module breakdown."""

import warnings
from pathlib import Path

import pytest
from conftest import LLAMA4_SCOUT

from zerosim.errors import ScenarioError
from zerosim.models import (
    CATALOG,
    ModelFieldWarning,
    Workload,
    build_modules,
    largest_layer_params,
    parameter_modules,
    spec_from_hf_fields,
    total_params,
)
from zerosim.models.catalog import catalog_model, require_catalog_model
from zerosim.models.kernels import FusedAttention, Gemm, kernel_count
from zerosim.scenario.loader import load_scenario

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


@pytest.mark.parametrize(("name", "expected"), [
    ("llama2-7b", 6_738_415_616),
    ("llama2-13b", 13_015_864_320),
    ("llama2-70b", 68_976_648_192),
])
def test_llama_parameter_counts_match_the_published_checkpoints(name, expected):
    assert total_params(CATALOG[name]) == expected


@pytest.mark.parametrize(("name", "expected"), [
    ("llama3-8b", 8_030_261_248),
    ("llama3.1-8b", 8_030_261_248),
    ("llama3.1-70b", 70_553_706_496),
    ("llama3.1-405b", 405_853_388_800),
    ("mistral-7b-v0.3", 7_248_023_552),
    ("qwen2.5-3b", 3_085_938_688),
    ("qwen2.5-7b", 7_615_616_512),
    ("qwen2.5-14b", 14_770_033_664),
    ("qwen2.5-32b", 32_763_876_352),
    ("qwen2.5-72b", 72_706_203_648),
    ("llama3-70b", 70_553_706_496),
    ("llama3.2-1b", 1_235_814_400),
    ("llama3.2-3b", 3_212_749_824),
    ("llama3.3-70b", 70_553_706_496),
    ("qwen2.5-0.5b", 494_032_768),
    ("qwen2.5-1.5b", 1_543_714_304),
    ("qwen3-4b", 4_022_468_096),
    ("qwen3-8b", 8_190_735_360),
    ("qwen3-14b", 14_768_307_200),
    ("qwen3-32b", 32_762_123_264),
    ("qwen3-30b-a3b", 30_532_122_624),
    ("tinyllama-1.1b", 1_100_048_384),
    ("mixtral-8x7b", 46_702_792_704),
    ("gemma-7b", 8_537_680_896),
    ("qwen2-7b", 7_615_616_512),
])
def test_hub_models_in_the_catalog_have_their_checkpoints_counts(name, expected):
    """The counts the Hub's safetensors index gives each checkpoint."""
    assert total_params(CATALOG[name]) == expected


@pytest.mark.parametrize(("name", "hidden", "intermediate", "layers", "heads"), [
    ("qwen3-0.6b", 1024, 3072, 28, 16),
    ("qwen3-1.7b", 2048, 6144, 28, 16),
])
def test_small_qwen3_counts_follow_from_their_shape(name, hidden, intermediate, layers, heads):
    """Qwen3's tied models, counted by hand: Q and O of heads x 128, K and V of 8 x 128, the
    per-head Q and K norms, the gated MLP, two norms a block, the embeddings and a final
    norm (0.6B: 596,049,920; its model card's 0.44B without the embeddings)."""
    q, kv = heads * 128, 8 * 128
    per_block = 2 * hidden * q + 2 * hidden * kv + 2 * 128 + 3 * hidden * intermediate + 2 * hidden
    assert total_params(CATALOG[name]) == 151936 * hidden + layers * per_block + hidden


def test_a_catalog_model_is_found_by_its_hub_repository_in_any_case():
    assert catalog_model("Qwen/Qwen2.5-72B") is CATALOG["qwen2.5-72b"]
    assert catalog_model("meta-llama/llama-3.1-70b") is CATALOG["llama3.1-70b"]
    assert catalog_model("LLAMA2-13B") is CATALOG["llama2-13b"]
    assert catalog_model("meta-llama/Llama-2-13b-hf") is CATALOG["llama2-13b"]


@pytest.mark.parametrize(("hub", "name"), [
    ("meta-llama/Llama-2-7b-chat-hf", "llama2-7b"),
    ("meta-llama/Meta-Llama-3-70B-Instruct", "llama3-70b"),
    ("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama3.1-8b"),
    ("meta-llama/Llama-3.3-70B-Instruct", "llama3.3-70b"),
    ("mistralai/Mistral-7B-Instruct-v0.3", "mistral-7b-v0.3"),
    ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"),
    ("Qwen/Qwen3-8B-Base", "qwen3-8b"),
    ("TinyLlama/TinyLlama-1.1B-Chat-v1.0", "tinyllama-1.1b"),
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
    ("google/gemma-7b-it", "gemma-7b"),
])
def test_an_instruction_tuned_repository_finds_its_base_models_entry(hub, name):
    """The tuned checkpoints share their base model's config.json shape."""
    assert catalog_model(hub) is CATALOG[name]


@pytest.mark.parametrize(("scenario", "name"), [
    ("qwen3_4b_ulysses_h100.yaml", "qwen3-4b"),
    ("gh200/qwen3-14b-superoffload.yaml", "qwen3-14b"),
    ("qwen3_moe_dgx_h100.yaml", "qwen3-30b-a3b"),
    ("dgx_a100_offload/qwen2.5-1.5b.yaml", "qwen2.5-1.5b"),
    ("h200_vm/llama3b_opt.yaml", "llama3.2-3b"),
    ("h200_vm/tinyllama_opt.yaml", "tinyllama-1.1b"),
])
def test_catalog_entries_build_the_models_the_scenarios_write_out(scenario, name):
    """Each of these scenarios copies its model's config.json fields by itself: the catalog's
    entry, written apart, builds the same modules."""
    written = load_scenario(SCENARIOS / scenario).model
    assert parameter_modules(CATALOG[name]) == parameter_modules(written)
    assert (CATALOG[name].model_type, CATALOG[name].qk_norm) == (written.model_type,
                                                                 written.qk_norm)


@pytest.mark.parametrize(("name", "folder"), [
    ("llama3-8b", "Meta-Llama-3-8B"), ("llama3.1-70b", "Llama-3.1-70B"),
    ("mixtral-8x7b", "Mixtral-8x7B-v0.1"), ("gemma-7b", "gemma-7b"), ("qwen2-7b", "Qwen2-7B"),
    ("qwen3-8b", "Qwen3-8B"), ("qwen3-30b-a3b", "Qwen3-30B-A3B"),
])
def test_catalog_entries_are_the_models_their_hub_config_files_give(name, folder):
    """The Hub's own config.json of each (tests/data/real_configs, written out unedited), read
    as a user's file is, gives the catalog's entry, field for field."""
    from dataclasses import replace

    from zerosim.models.hf import spec_from_hf_file

    path = Path(__file__).parent / "data" / "real_configs" / "models" / folder / "config.json"
    real = spec_from_hf_file(path, source=str(path), key_path="model")
    assert replace(CATALOG[name], name=real.name) == real


@pytest.mark.parametrize(("given", "offered"), [
    ("llama-2-13b", "'llama2-13b'"),
    ("qwen3-7b", "'qwen3-8b'"),
    ("meta-llama/Llama-3-70B", "'meta-llama/Llama-3.1-70B'"),
    ("Qwen/Qwen3-8B-Instruct", "did you mean 'Qwen/Qwen3-8B' or"),
    ("qwen3-30b", "did you mean 'qwen3-30b-a3b' or"),
])
def test_a_name_the_catalog_lacks_gets_the_nearest_ones_offered(given, offered):
    with pytest.raises(ScenarioError) as raised:
        require_catalog_model(given, source="s.yaml", key_path="model")
    offer, catalog = raised.value.expected.split("the catalog: ")
    assert "did you mean " in offer and offered in offer
    assert catalog.startswith("gemma-7b, gpt3-175b, llama2-7b, llama2-13b, llama2-70b, llama3-8b")


def test_a_name_nothing_resembles_gets_the_catalog_only():
    with pytest.raises(ScenarioError) as raised:
        require_catalog_model("falcon-40b", source="s.yaml", key_path="model")
    assert "did you mean" not in raised.value.expected
    assert raised.value.expected.startswith("a catalog model or its Hub repository (the catalog:")


def test_qwen2_5_in_the_catalog_keeps_its_qkv_biases():
    spec = CATALOG["qwen2.5-7b"]
    assert spec.qkv_bias and not spec.attention_out_bias and not spec.tie_word_embeddings


def test_gpt3_175b_count_follows_from_its_shape():
    h, layers, vocab, positions = 12288, 96, 50257, 2048
    per_block = 12 * h * h + 13 * h  # qkv, out, fc_in, fc_out weights and biases, two LayerNorms
    assert total_params(CATALOG["gpt3-175b"]) == (vocab * h + positions * h
                                                  + layers * per_block + 2 * h)


def test_llama2_70b_uses_grouped_query_attention():
    spec = CATALOG["llama2-70b"]
    params = dict(parameter_modules(spec))
    assert params["layers.0.self_attn.k_proj"] == 8192 * 1024
    assert params["layers.0.self_attn.q_proj"] == 8192 * 8192


def test_largest_layer_is_the_embedding_for_llama():
    assert largest_layer_params(CATALOG["llama2-13b"]) == 32000 * 5120


def test_forward_modules_of_a_llama_block_in_execution_order():
    modules = build_modules(CATALOG["llama2-7b"], Workload(sequence_length=16))
    names = [m.name for m in modules if m.layer == 0]
    assert names == [
        "layers.0.input_layernorm", "layers.0.self_attn.q_proj", "layers.0.self_attn.k_proj",
        "layers.0.self_attn.v_proj", "layers.0.attn.core", "layers.0.self_attn.o_proj",
        "layers.0.post_attention_layernorm", "layers.0.mlp.gate_proj", "layers.0.mlp.up_proj",
        "layers.0.mlp.act_fn", "layers.0.mlp.down_proj",
    ]
    assert modules[0].name == "embed_tokens" and modules[-1].name == "loss"


def test_activation_bytes_per_llama_layer_follow_the_korthikanti_accounting():
    """Per token and layer with eager attention: 16h + 6i + 2as bytes of 16-bit tensors, plus
    the fp32 reciprocal RMS of the two norms (4 B each)."""
    spec = CATALOG["llama2-13b"]
    s = 2048
    modules = build_modules(spec, Workload(sequence_length=s))
    layer = sum(m.saved_bytes for m in modules if m.layer == 3)
    h, i, a = 5120, 13824, 40
    assert layer == s * (16 * h + 6 * i + 2 * a * s + 2 * 4)


def test_flash_attention_drops_the_quadratic_term():
    spec = CATALOG["llama2-13b"]
    eager = build_modules(spec, Workload(sequence_length=2048, attention="eager"))
    flash = build_modules(spec, Workload(sequence_length=2048, attention="flash"))
    core = {m.name: m for m in eager}["layers.0.attn.core"]
    flash_core = {m.name: m for m in flash}["layers.0.attn.core"]
    assert core.saved_bytes - flash_core.saved_bytes == 2048 * (2 * 40 * 2048 - 4 * 40)
    assert flash_core.fwd_flops == core.fwd_flops / 2
    assert flash_core.model_flops == core.model_flops


def test_checkpointing_keeps_only_block_inputs_and_recomputes_the_rest():
    spec = CATALOG["llama2-7b"]
    plain = build_modules(spec, Workload(sequence_length=512))
    ckpt = build_modules(spec, Workload(sequence_length=512, activation_checkpointing=True))
    block_plain = sum(m.saved_bytes for m in plain if m.layer == 0)
    assert sum(m.saved_bytes for m in ckpt if m.layer == 0) == 2 * 4096 * 512
    assert sum(m.recompute_bytes for m in ckpt if m.layer == 0) == block_plain


def test_hf_fields_with_gpt2_names_and_model_type():
    spec = spec_from_hf_fields({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12,
                                "vocab_size": 50257, "n_positions": 1024}, name="gpt2")
    assert spec.family == "gpt" and spec.intermediate_size == 3072
    assert total_params(spec) == 124_439_808  # GPT-2 small, tied embeddings


@pytest.mark.parametrize(("fields", "key", "expected"), [
    ({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 10},
     "model.family", "'family: llama|gpt'"),
    ({"family": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 3,
      "vocab_size": 10}, "model.num_attention_heads", "a divisor of hidden_size=64"),
    ({"family": "llama", "hidden_size": -1, "num_hidden_layers": 2, "num_attention_heads": 4,
      "vocab_size": 10}, "model.hidden_size", "a positive integer"),
])
def test_bad_hf_fields_name_the_key(fields, key, expected):
    with pytest.raises(ScenarioError) as err:
        spec_from_hf_fields(fields, name="x", source="s.yaml")
    assert err.value.key_path == key
    assert expected in str(err.value)


# ------------------------------------------------------------------ Hugging Face fields


def hf(fields: dict, **more):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec = spec_from_hf_fields({**fields, **more}, name="m", source="c.json")
    return spec, [str(w.message) for w in caught if issubclass(w.category, ModelFieldWarning)]


LLAMA_SMALL = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
               "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 100}


def test_gemma_head_dim_widens_q_and_o():
    """Regression: head_dim was ignored (Gemma-7B's q_proj is 3072 x 4096, not 3072 x 3072)."""
    spec, _ = hf({"model_type": "gemma", "hidden_size": 3072, "num_hidden_layers": 28,
                  "intermediate_size": 24576, "num_attention_heads": 16,
                  "num_key_value_heads": 16, "head_dim": 256, "vocab_size": 256000})
    params = dict(parameter_modules(spec))
    assert params["layers.0.self_attn.q_proj"] == params["layers.0.self_attn.o_proj"] == (
        3072 * 4096)
    assert "lm_head" not in params  # Gemma ties its embeddings by default
    core = {m.name: m for m in build_modules(spec, Workload(sequence_length=8))}
    assert core["layers.0.attn.core"].model_flops == 4.0 * 8 * 8 * 4096


def test_falcon_7b_old_architecture():
    """Multi-query attention (one K/V head), one norm feeding attention and MLP in parallel,
    bias-free linears: 6,921,720,704 parameters, Falcon-7B's published count."""
    spec, unmodelled = hf({"model_type": "falcon", "hidden_size": 4544,
                           "num_hidden_layers": 32, "num_attention_heads": 71,
                           "vocab_size": 65024, "multi_query": True, "parallel_attn": True,
                           "bias": False, "new_decoder_architecture": False})
    assert total_params(spec) == 6_921_720_704 and unmodelled == []
    names = [m.name for m in build_modules(spec, Workload(8)) if m.layer == 0]
    assert names.count("layers.0.ln_1") == 1 and "layers.0.ln_2" not in names
    mlp_in = {m.name: m for m in build_modules(spec, Workload(8))}["layers.0.mlp.fc_in"]
    assert mlp_in.saved_bytes == 0  # it reads the norm output the QKV projection saved


def test_qwen2_biases_on_q_k_v_only():
    spec, _ = hf({**LLAMA_SMALL, "model_type": "qwen2", "num_key_value_heads": 2})
    params = dict(parameter_modules(spec))
    assert params["layers.0.self_attn.q_proj"] == 64 * 64 + 64
    assert params["layers.0.self_attn.k_proj"] == 64 * 32 + 32
    assert params["layers.0.self_attn.o_proj"] == 64 * 64


def test_attention_bias_and_mlp_bias():
    spec, _ = hf(LLAMA_SMALL, attention_bias=True, mlp_bias=True)
    params = dict(parameter_modules(spec))
    assert params["layers.0.self_attn.o_proj"] == 64 * 64 + 64
    assert params["layers.0.mlp.down_proj"] == 128 * 64 + 64


def test_gpt_neox_rotary_untied_no_position_table():
    spec, _ = hf({"model_type": "gpt_neox", "hidden_size": 64, "num_hidden_layers": 2,
                  "intermediate_size": 256, "num_attention_heads": 4, "vocab_size": 100,
                  "max_position_embeddings": 2048})
    params = dict(parameter_modules(spec))
    assert "embed_positions" not in params and params["lm_head"] == 64 * 100
    assert spec.position_embedding == "rotary" and not spec.tie_word_embeddings


def test_gpt2_n_inner_null_is_4h():
    spec, _ = hf({"model_type": "gpt2", "n_embd": 64, "n_layer": 1, "n_head": 4,
                  "vocab_size": 100, "n_inner": None})
    assert spec.intermediate_size == 256


def test_opt_350m_projections_position_offset_and_no_final_norm():
    """OPT-350m: 512-wide embeddings with project_in/out, 2,048 + 2 learned positions, no final
    norm (post-norm blocks): 331,196,416 parameters."""
    spec, unmodelled = hf({"model_type": "opt", "hidden_size": 1024, "num_hidden_layers": 24,
                           "ffn_dim": 4096, "num_attention_heads": 16, "vocab_size": 50272,
                           "max_position_embeddings": 2048, "word_embed_proj_dim": 512,
                           "do_layer_norm_before": False, "dropout": 0.1})
    params = dict(parameter_modules(spec))
    assert params["embed_positions"] == 2050 * 1024 and "norm" not in params
    assert params["project_in"] == params["project_out"] == 512 * 1024
    assert total_params(spec) == 331_196_416 and unmodelled == []


def test_bloom_560m_embedding_norm_and_alibi():
    spec, _ = hf({"model_type": "bloom", "hidden_size": 1024, "n_layer": 24, "n_head": 16,
                  "vocab_size": 250880})
    assert total_params(spec) == 559_214_592 and spec.position_embedding == "alibi"


def test_a_field_zerosim_does_not_model_is_warned_about_by_name():
    _, unmodelled = hf(LLAMA_SMALL, num_experts_per_layer=4, rope_theta=1e6)
    assert unmodelled == ["c.json: model: zerosim does not model these fields, which could "
                          "change the model's size, FLOPs or activations: "
                          "num_experts_per_layer=4"]


def test_latent_attention_fields_in_a_deepseek_moe_config_are_refused():
    """DeepSeek-MoE (`deepseek`, its own code) has no latent attention; V2's and V3's are
    their own model types."""
    with pytest.raises(ScenarioError) as err:
        hf({**LLAMA_SMALL, "model_type": "deepseek", "kv_lora_rank": 512})
    assert "model_type deepseek_v2 or deepseek_v3" in err.value.expected


# ------------------------------------------------------------------ mixture of experts

MIXTRAL = {"model_type": "mixtral", "hidden_size": 4096, "num_hidden_layers": 32,
           "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
           "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2}


def test_mixtral_holds_every_expert():
    """Regression: Mixtral ran as a dense 7.2 B model. Every expert's parameters count."""
    spec, _ = hf(MIXTRAL)
    params = dict(parameter_modules(spec))
    assert total_params(spec) == 46_702_792_704
    assert params["layers.0.mlp.gate"] == 4096 * 8
    assert params["layers.31.mlp.experts.7.down_proj"] == 14336 * 4096


def test_moe_computes_top_k_experts_per_token():
    """Routed FLOPs: each expert computes k/E of the tokens, so the experts' FLOPs are k times
    one dense MLP's; the router is a linear to E logits."""
    spec, _ = hf(MIXTRAL)
    t = 2048
    modules = build_modules(spec, Workload(sequence_length=t))
    experts = sum(m.model_flops for m in modules
                  if m.layer == 0 and ".experts." in m.name and m.kind == "linear")
    assert experts == 2 * (2.0 * 3 * 4096 * 14336 * t)
    router = {m.name: m for m in modules}["layers.0.mlp.gate"]
    assert router.model_flops == 2.0 * 4096 * 8 * t


def test_moe_activations_follow_the_routed_tokens():
    """Per layer: the router's input and fp32 probabilities, then each expert its gathered
    input, two gated inputs, the down projection's input and its scaled output, for k/E of
    the tokens."""
    spec, _ = hf(MIXTRAL)
    t, h, i, e, k = 1024, 4096, 14336, 8, 2
    modules = build_modules(spec, Workload(sequence_length=t))
    mlp = sum(m.saved_bytes for m in modules if m.layer == 0 and ".mlp." in m.name)
    routed = t * k / e
    assert mlp == 2 * t * h + 4 * t * e + e * routed * 2 * (h + 2 * i + i + h)


def test_qwen2_moe_a2_7b_with_shared_expert():
    """Qwen1.5-MoE-A2.7B: 60 experts of 1,408, top 4, a shared expert of 5,632 with a gate,
    Q/K/V biases: 14,315,784,192 parameters ("14.3B")."""
    spec, _ = hf({"model_type": "qwen2_moe", "hidden_size": 2048, "num_hidden_layers": 24,
                  "num_attention_heads": 16, "num_key_value_heads": 16,
                  "intermediate_size": 5632, "moe_intermediate_size": 1408,
                  "shared_expert_intermediate_size": 5632, "num_experts": 60,
                  "num_experts_per_tok": 4, "vocab_size": 151936, "decoder_sparse_step": 1})
    assert total_params(spec) == 14_315_784_192
    assert dict(parameter_modules(spec))["layers.0.mlp.shared_expert_gate"] == 2048


def test_deepseek_moe_dense_first_layer_and_shared_experts():
    """DeepSeek-MoE 16B: layer 0 dense (10,944), then 64 routed experts of 1,408 and 2 shared
    experts fused into one MLP of 2,816, per the config's arithmetic."""
    spec, _ = hf({"model_type": "deepseek", "hidden_size": 2048, "num_hidden_layers": 28,
                  "num_attention_heads": 16, "intermediate_size": 10944,
                  "moe_intermediate_size": 1408, "n_routed_experts": 64,
                  "n_shared_experts": 2, "num_experts_per_tok": 6,
                  "first_k_dense_replace": 1, "moe_layer_freq": 1, "vocab_size": 102400})
    attention, norms = 4 * 2048 * 2048, 2 * 2048
    dense = attention + norms + 3 * 2048 * 10944
    moe = attention + norms + 64 * 3 * 2048 * 1408 + 3 * 2048 * 2816 + 2048 * 64
    assert total_params(spec) == dense + 27 * moe + 2 * 102400 * 2048 + 2048
    assert not spec.is_moe_layer(0) and spec.is_moe_layer(1)


GPT2_SMALL = {"model_type": "gpt2", "n_embd": 768, "n_layer": 2, "n_head": 12,
              "vocab_size": 50257, "n_positions": 1024}


def _activation(fields: dict, stack: str, tokens: int = 8):
    """The first block's MLP activation as `stack` builds it, in 16-bit training."""
    from zerosim.stacks import load_stack

    spec = spec_from_hf_fields(fields, name="m")
    modules = build_modules(spec, Workload(sequence_length=tokens), load_stack(stack).recipe)
    (act,) = [m for m in modules if m.layer == 0 and m.kind == "activation"]
    return spec, act


@pytest.mark.parametrize(("fields", "function", "kernels", "forward_bytes", "backward",
                          "saved"), [
    (GPT2_SMALL, "gelu_new", 8, 36, (11, 56), 8),
    ({**GPT2_SMALL, "model_type": "gptj"}, "gelu_new", 8, 36, (11, 56), 8),
    ({**GPT2_SMALL, "activation_function": "gelu"}, "gelu", 1, 4, (1, 6), 2),
    ({**GPT2_SMALL, "model_type": "opt", "word_embed_proj_dim": 768, "ffn_dim": 3072},
     "relu", 1, 4, (1, 6), 2),
    ({**GPT2_SMALL, "model_type": "bloom"}, "bloom_gelu", 9, 42, (18, 88), 2),
    ({**GPT2_SMALL, "activation_function": "quick_gelu"}, "quick_gelu", 1, 4, (1, 6), 2),
])
def test_hf_stack_prices_an_ungated_activation_as_transformers_runs_it(
        fields, function, kernels, forward_bytes, backward, saved):
    """The config's function, read off transformers' activations.py: GPT-2's and GPT-J's
    `gelu_new` is eight Python ops keeping four tensors, BLOOM's own an autograd Function
    keeping its input; a name the stack does not list is priced as a fused GELU."""
    spec, act = _activation(fields, "hf-transformers")
    elements = spec.intermediate_size * 8
    assert spec.activation == function
    assert [(p.count, p.nbytes) for p in act.kernels] == [(kernels, forward_bytes * elements)]
    assert [(p.backward_count, p.backward_nbytes) for p in act.kernels] == [
        (backward[0], backward[1] * elements)]
    assert act.saved_bytes == saved * elements


def test_megatron_runs_its_fused_bias_gelu_whatever_the_config_names():
    _, act = _activation(GPT2_SMALL, "megatron-deepspeed")
    elements = 3072 * 8
    assert [(p.count, p.nbytes, p.backward_count, p.backward_nbytes) for p in act.kernels] == [
        (1, 4 * elements, 2, 8 * elements)]
    assert act.saved_bytes == 2 * elements


def test_a_gated_mlp_keeps_the_stacks_gated_activation():
    """Llama's `hidden_act` names the function inside the gated kernel; the table is not read."""
    spec, act = _activation({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1,
                             "num_attention_heads": 4, "vocab_size": 100,
                             "intermediate_size": 128, "hidden_act": "gelu_new"},
                            "hf-transformers")
    assert spec.activation == ""
    assert [(p.count, p.nbytes) for p in act.kernels] == [(2, 10 * 128 * 8)]


QWEN3_TINY = {"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 1,
              "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "vocab_size": 100}


def _hf_recipe():
    from zerosim.stacks import load_stack

    return load_stack("hf-transformers").recipe


def test_qwen3_norms_each_head_of_q_and_k_after_its_projection():
    """Qwen3Attention: q_norm(q_proj(x).view(..., head_dim)), k_norm likewise, then v_proj:
    two RMSNorm modules of head_dim weights, each over one row per head and token (the hf
    stack's RMSNorm keeps 6 B per element and 4 B per row)."""
    spec, unmodelled = hf(QWEN3_TINY)
    assert spec.qk_norm and not unmodelled
    modules = build_modules(spec, Workload(sequence_length=8), _hf_recipe())
    block = [m.name.removeprefix("layers.0.") for m in modules if m.layer == 0]
    assert block[:8] == ["input_layernorm", "self_attn.q_proj", "self_attn.q_norm",
                         "self_attn.k_proj", "self_attn.k_norm", "self_attn.v_proj",
                         "attn.core", "self_attn.o_proj"]
    by_name = {m.name: m for m in modules}
    q_norm, k_norm = by_name["layers.0.self_attn.q_norm"], by_name["layers.0.self_attn.k_norm"]
    assert (q_norm.params, k_norm.params) == (16, 16)
    assert q_norm.saved_bytes == 6 * (16 * 4 * 8) + 4 * (4 * 8)
    assert k_norm.saved_bytes == 6 * (16 * 2 * 8) + 4 * (2 * 8)
    assert [p.nbytes for p in k_norm.kernels] == [36 * 16 * 2 * 8]
    assert total_params(spec) == (2 * 100 * 64 + 64 + 2 * 64 + 2 * 16 + 64 * 64 * 2
                                  + 2 * 64 * 32 + 3 * 64 * 128)


def test_qwen3_takes_its_configuration_defaults():
    """Qwen3Config's head_dim is 128 whatever the width; its sliding window is off unless
    `use_sliding_window` says so."""
    spec, unmodelled = hf({k: v for k, v in QWEN3_TINY.items() if k != "head_dim"},
                          sliding_window=4096)
    assert spec.head_dim == 128 and spec.q_size == 512 and not unmodelled
    _, unmodelled = hf(QWEN3_TINY, sliding_window=4096, use_sliding_window=True)
    assert len(unmodelled) == 1 and "sliding_window: 4096" in unmodelled[0]


def test_transformers_5_layer_types_name_the_sliding_layers():
    """A config saved by transformers 5 lists each layer's attention (`layer_types`)."""
    _, unmodelled = hf(QWEN3_TINY, num_hidden_layers=2, sliding_window=4096,
                       layer_types=["full_attention", "sliding_attention"],
                       rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    assert len(unmodelled) == 1 and "layers [1] use a sliding window of 4096" in unmodelled[0]
    _, unmodelled = hf(QWEN3_TINY, layer_types=["full_attention"], sliding_window=None)
    assert not unmodelled
    with pytest.raises(ScenarioError, match=r"c\.json: model\.layer_types: expected a list"):
        hf(QWEN3_TINY, layer_types="full_attention")


QWEN3_MOE_TINY = {"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2,
                  "intermediate_size": 96, "moe_intermediate_size": 32, "num_experts": 4,
                  "num_experts_per_tok": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                  "head_dim": 16, "vocab_size": 100, "mlp_only_layers": [0]}


def test_qwen3_moe_sparse_layers_and_no_shared_expert():
    spec, unmodelled = hf(QWEN3_MOE_TINY)
    assert not unmodelled and spec.moe.layers == (1,) and spec.qk_norm
    attention = 64 * 64 * 2 + 2 * 64 * 32 + 2 * 16 + 2 * 64
    dense, sparse = 3 * 64 * 96, 64 * 4 + 4 * 3 * 64 * 32
    assert total_params(spec) == 2 * 100 * 64 + 64 + 2 * attention + dense + sparse


def test_fused_experts_are_one_module_doing_the_expert_lists_work():
    """transformers 5 (the hf stack's `modules.experts: fused`): the router, then one module
    of every expert's gate-up and down weights, whose grouped products run each expert's share
    of the rows as one batched product; FLOPs and saved activations as the module list's."""
    from dataclasses import replace

    spec, _ = hf(QWEN3_MOE_TINY)
    fused_recipe = _hf_recipe()
    assert fused_recipe.fused_experts
    w = Workload(sequence_length=8)
    fused = [m for m in build_modules(spec, w, fused_recipe) if m.layer == 1 and ".mlp." in m.name]
    listed = [m for m in build_modules(spec, w, replace(fused_recipe, fused_experts=False))
              if m.layer == 1 and ".mlp." in m.name]
    assert [m.name for m in fused] == ["layers.1.mlp.gate", "layers.1.mlp.experts"]
    assert len(listed) == 1 + 4 * 4
    experts = fused[1]
    assert experts.param_numels == (4 * 2 * 32 * 64, 4 * 64 * 32)
    assert experts.model_flops == sum(m.model_flops for m in listed[1:])
    assert experts.saved_bytes == sum(m.saved_bytes for m in listed[1:])
    gemms = [k for k in experts.kernels if isinstance(k, Gemm)]
    assert [(g.m, g.n, g.k, g.batch) for g in gemms] == [(4.0, 64, 64, 4), (4.0, 64, 32, 4)]
    launches = kernel_count(experts.kernels)
    assert launches == 7 + 2 + 1 + 1 + 2 + 1 + 3 + 1 + 1  # the block's residual add last
    assert launches < sum(kernel_count(m.kernels) for m in listed[1:])


def test_fused_experts_run_qwen2_moes_shared_expert_first():
    """Qwen2MoeSparseMoeBlock in transformers 5: shared expert, router, experts, gate."""
    spec, _ = hf({**QWEN3_MOE_TINY, "model_type": "qwen2_moe",
                  "shared_expert_intermediate_size": 48})
    names = [m.name.removeprefix("layers.1.mlp.")
             for m in build_modules(spec, Workload(sequence_length=8), _hf_recipe())
             if m.layer == 1 and ".mlp." in m.name]
    assert names == ["shared_expert.gate_proj", "shared_expert.up_proj", "shared_expert.act_fn",
                     "shared_expert.down_proj", "gate", "experts", "shared_expert_gate"]


def test_deepseek_moes_own_code_keeps_its_expert_list():
    spec, _ = hf({"model_type": "deepseek", "hidden_size": 64, "num_hidden_layers": 1,
                  "num_attention_heads": 4, "intermediate_size": 96,
                  "moe_intermediate_size": 32, "n_routed_experts": 4, "n_shared_experts": 1,
                  "num_experts_per_tok": 2, "vocab_size": 100})
    names = {m.name for m in build_modules(spec, Workload(sequence_length=8), _hf_recipe())}
    assert "layers.0.mlp.experts.3.down_proj" in names
    assert "layers.0.mlp.experts" not in names


PHI4_MINI = {"model_type": "phi3", "hidden_size": 3072, "num_hidden_layers": 32,
             "intermediate_size": 8192, "num_attention_heads": 24, "num_key_value_heads": 8,
             "vocab_size": 200064, "tie_word_embeddings": True, "partial_rotary_factor": 0.75,
             "full_attn_mod": 1, "interpolate_factor": 1, "lm_head_bias": False,
             "mlp_bias": False, "attention_bias": False, "embd_pdrop": 0.0}


def test_phi3_fuses_qkv_and_gate_up_in_its_own_code():
    """Phi3Attention's `qkv_proj` and Phi3MLP's `gate_up_proj`, whatever the stack cuts:
    Phi-4-mini (a `phi3` config: grouped-query attention, tied) has 3,836,021,760 parameters
    as transformers 5.17 builds it; its leftover fields are not warned about."""
    spec, unmodelled = hf(PHI4_MINI)
    assert not unmodelled and total_params(spec) == 3_836_021_760
    block = [m.name.removeprefix("layers.0.")
             for m in build_modules(spec, Workload(sequence_length=8), _hf_recipe())
             if m.layer == 0 and m.params]
    assert block == ["input_layernorm", "self_attn.qkv_proj", "self_attn.o_proj",
                     "post_attention_layernorm", "mlp.gate_up_proj", "mlp.down_proj"]
    params = dict(parameter_modules(spec))
    assert params["layers.0.self_attn.qkv_proj"] == 3072 * (3072 + 2 * 8 * 128)
    assert params["layers.0.mlp.gate_up_proj"] == 3072 * 2 * 8192


GEMMA2_9B = {"model_type": "gemma2", "hidden_size": 3584, "num_hidden_layers": 42,
             "intermediate_size": 14336, "num_attention_heads": 16, "num_key_value_heads": 8,
             "head_dim": 256, "vocab_size": 256000, "query_pre_attn_scalar": 256,
             "cache_implementation": "hybrid", "hidden_activation": "gelu_pytorch_tanh"}
GEMMA3_1B = {"model_type": "gemma3_text", "hidden_size": 1152, "num_hidden_layers": 26,
             "intermediate_size": 6912, "num_attention_heads": 4, "num_key_value_heads": 1,
             "head_dim": 256, "vocab_size": 262144, "attn_logit_softcapping": None,
             "final_logit_softcapping": None, "rope_local_base_freq": 10000,
             "sliding_window_pattern": 6, "query_pre_attn_scalar": 256}


def test_gemma2_norms_the_attention_and_mlp_outputs_before_each_residual_add():
    """Gemma2DecoderLayer: four norms a block; the residual adds follow the post-norms.
    Gemma-2-9B: 9,241,705,984 parameters as transformers 5.17 builds it (tied)."""
    spec, unmodelled = hf(GEMMA2_9B)
    assert not unmodelled and total_params(spec) == 9_241_705_984
    assert spec.post_norms and spec.attention_softcap and spec.logit_softcap
    recipe = _hf_recipe()
    modules = {m.name.removeprefix("layers.0."): m
               for m in build_modules(spec, Workload(sequence_length=8), recipe)
               if m.layer == 0}
    assert list(modules) == [
        "input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
        "attn.core", "self_attn.o_proj", "post_attention_layernorm",
        "pre_feedforward_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.act_fn",
        "mlp.down_proj", "post_feedforward_layernorm"]
    residual = 6 * 3584 * 8
    assert [k.nbytes for k in modules["self_attn.o_proj"].kernels[1:]] == []
    assert [k.nbytes for k in modules["mlp.down_proj"].kernels[1:]] == []
    for post in ("post_attention_layernorm", "post_feedforward_layernorm"):
        assert [k.nbytes for k in modules[post].kernels] == [36 * 3584 * 8, residual]


def test_gemma2_soft_caps_eager_scores_and_the_logits():
    """cap * tanh(x / cap): three kernels of 12 B per element forward, 14 B backward, tanh's
    16-bit output kept; on the scores under eager attention only, and on the logits."""
    recipe, t = _hf_recipe(), 8
    capped, _ = hf(GEMMA2_9B, num_hidden_layers=1)
    plain, _ = hf(GEMMA2_9B, num_hidden_layers=1, attn_logit_softcapping=None,
                  final_logit_softcapping=None)
    scores, logits = 16 * t * t, 256000 * t
    for attention, capped_scores in (("eager", scores), ("flash", 0)):
        w = Workload(sequence_length=t, attention=attention)
        a = {m.name: m for m in build_modules(capped, w, recipe)}
        b = {m.name: m for m in build_modules(plain, w, recipe)}
        core_a, core_b = a["layers.0.attn.core"], b["layers.0.attn.core"]
        assert core_a.saved_bytes - core_b.saved_bytes == 2 * capped_scores
        extra = [k for k in core_a.kernels if k not in core_b.kernels]
        assert [(k.count, k.nbytes, k.backward_nbytes) for k in extra] == (
            [(3, 12 * scores, 14 * scores)] if capped_scores else [])
        head_a, head_b = a["lm_head"], b["lm_head"]
        assert head_a.saved_bytes - head_b.saved_bytes == 2 * logits
        assert [(k.count, k.nbytes) for k in head_a.kernels[1:]] == [(3, 12 * logits)]


def test_gemma3_norms_q_and_k_after_the_three_projections():
    """Gemma3Attention: q_proj, k_proj, v_proj, then q_norm and k_norm; no soft-capping.
    Gemma-3-1B: 999,885,952 parameters as transformers 5.17 builds it."""
    spec, unmodelled = hf(GEMMA3_1B)
    assert not unmodelled and total_params(spec) == 999_885_952
    assert not (spec.attention_softcap or spec.logit_softcap)
    names = [m.name.removeprefix("layers.0.self_attn.")
             for m in build_modules(spec, Workload(sequence_length=8), _hf_recipe())
             if m.layer == 0 and ".self_attn." in m.name]
    assert names == ["q_proj", "k_proj", "v_proj", "q_norm", "k_norm", "o_proj"]


def test_gemma3s_multimodal_config_and_a_bad_cap_are_refused():
    with pytest.raises(ScenarioError, match=r"model\.model_type: expected a text model's config"):
        hf({**GEMMA3_1B, "model_type": "gemma3"})
    with pytest.raises(ScenarioError, match=r"model\.final_logit_softcapping: expected a "
                                            r"positive number or null, got -30"):
        hf(GEMMA2_9B, final_logit_softcapping=-30)


def test_an_expert_list_waits_for_the_gpu_before_each_expert():
    """transformers 4's `torch.where(expert_mask[expert_idx])` (and DeepSeek-MoE's boolean
    index) copies the expert's row count to the host: one synchronisation before each expert;
    transformers 5's grouped path makes none."""
    spec, _ = hf(QWEN3_MOE_TINY)
    from dataclasses import replace

    listed = [m for m in build_modules(spec, Workload(sequence_length=8),
                                       replace(_hf_recipe(), fused_experts=False))
              if m.layer == 1 and ".mlp." in m.name]
    assert [(m.name.removeprefix("layers.1.mlp."), m.host_syncs) for m in listed
            if m.host_syncs] == [(f"experts.{e}.gate_proj", 1) for e in range(4)]
    fused = [m for m in build_modules(spec, Workload(sequence_length=8), _hf_recipe())
             if m.layer == 1]
    assert not any(m.host_syncs for m in fused)


OLMO2_7B = {"model_type": "olmo2", "hidden_size": 4096, "num_hidden_layers": 32,
            "intermediate_size": 11008, "num_attention_heads": 32, "num_key_value_heads": 32,
            "vocab_size": 100352, "rope_theta": 500000}


def test_olmo2_norms_outputs_only_and_q_and_k_over_their_whole_width():
    """Olmo2DecoderLayer: no norm before the attention or the MLP, one on each's output before
    its residual add; q_norm(q_proj(x)) over the projection's whole output (one row per
    token). OLMo-2-7B: 7,298,617,344 parameters as transformers 5.17 builds it."""
    spec, unmodelled = hf(OLMO2_7B)
    assert not unmodelled and total_params(spec) == 7_298_617_344
    modules = {m.name.removeprefix("layers.0."): m
               for m in build_modules(spec, Workload(sequence_length=8), _hf_recipe())
               if m.layer == 0}
    assert list(modules) == [
        "self_attn.q_proj", "self_attn.q_norm", "self_attn.k_proj", "self_attn.k_norm",
        "self_attn.v_proj", "attn.core", "self_attn.o_proj", "post_attention_layernorm",
        "mlp.gate_proj", "mlp.up_proj", "mlp.act_fn", "mlp.down_proj",
        "post_feedforward_layernorm"]
    assert modules["self_attn.q_norm"].params == 4096
    assert modules["self_attn.q_norm"].saved_bytes == 6 * 4096 * 8 + 4 * 8
    assert modules["mlp.gate_proj"].saved_bytes == 2 * 4096 * 8
    _, unmodelled = hf({**OLMO2_7B, "model_type": "olmo3"}, num_hidden_layers=2,
                       sliding_window=4096, layer_types=["sliding_attention", "full_attention"])
    assert len(unmodelled) == 1 and "layers [0] use a sliding window" in unmodelled[0]


DEEPSEEK_V3 = {"model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61,
               "num_attention_heads": 128, "num_key_value_heads": 128, "vocab_size": 129280,
               "n_group": 8, "topk_group": 4, "topk_method": "noaux_tc",
               "scoring_func": "sigmoid", "routed_scaling_factor": 2.5, "moe_layer_freq": 1,
               "num_nextn_predict_layers": 1, "ep_size": 1}
DEEPSEEK_V2_LITE = {"model_type": "deepseek_v2", "hidden_size": 2048, "num_hidden_layers": 27,
                    "intermediate_size": 10944, "moe_intermediate_size": 1408,
                    "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 102400,
                    "first_k_dense_replace": 1, "n_routed_experts": 64, "n_shared_experts": 2,
                    "num_experts_per_tok": 6, "q_lora_rank": None, "topk_method": "greedy"}


def test_deepseek_v3_latent_attention_and_experts_as_transformers_5_builds_them():
    """DeepSeek-V3 from DeepseekV3Config's defaults: 671,026,404,352 parameters (the Hub's
    685B adds the multi-token-prediction layer, which DeepseekV3ForCausalLM does not build);
    V2-Lite, Q made without a latent (`q_lora_rank: null`): 15,706,484,224."""
    v3, unmodelled = hf(DEEPSEEK_V3)
    assert not unmodelled and total_params(v3) == 671_026_404_352
    lite, unmodelled = hf(DEEPSEEK_V2_LITE)
    assert not unmodelled and total_params(lite) == 15_706_484_224
    assert (v3.mla.q_lora_rank, lite.mla.q_lora_rank, v3.mla.qk_head_dim) == (1536, 0, 192)
    modules = [m for m in build_modules(v3, Workload(sequence_length=8), _hf_recipe())
               if m.layer == 3]
    assert [m.name.removeprefix("layers.3.") for m in modules] == [
        "input_layernorm", "self_attn.q_a_proj", "self_attn.q_a_layernorm",
        "self_attn.q_b_proj", "self_attn.kv_a_proj_with_mqa", "self_attn.kv_a_layernorm",
        "self_attn.kv_b_proj", "attn.core", "self_attn.o_proj", "post_attention_layernorm",
        "mlp.gate", "mlp.experts", "mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj",
        "mlp.shared_expert.act_fn", "mlp.shared_expert.down_proj"]
    params = {m.name.removeprefix("layers.3."): m.params for m in modules}
    assert params["self_attn.kv_b_proj"] == 512 * 128 * (128 + 128)
    assert params["self_attn.o_proj"] == 128 * 128 * 7168
    assert params["mlp.experts"] == 256 * 3 * 7168 * 2048


@pytest.mark.parametrize("attention", ["eager", "flash"])
def test_latent_attention_core_works_on_heads_of_its_own_widths(attention):
    """Scores over heads of qk_nope + qk_rope (192), values of v_head_dim (128): eager's two
    batched products of those widths, a fused kernel's half of their FLOPs; Q, K and V saved
    at those widths."""
    spec, _ = hf(DEEPSEEK_V2_LITE)
    s = 16
    w = Workload(sequence_length=s, attention=attention)
    core = {m.name: m for m in build_modules(spec, w, _hf_recipe())}["layers.0.attn.core"]
    q, v = 16 * 192, 16 * 128
    assert core.model_flops == 2.0 * s * s * (q + v)
    if attention == "eager":
        gemms = [(k.m, k.n, k.k, k.batch) for k in core.kernels if isinstance(k, Gemm)]
        assert gemms == [(s, s, 192, 16), (s, 128, s, 16)]
        assert core.fwd_flops == core.model_flops
    else:
        (fused,) = [k for k in core.kernels if isinstance(k, FusedAttention)]
        assert (fused.flops, fused.head_dim) == (s * s * (q + v), 192)
        assert core.saved_bytes == 2 * s * (2 * q + v) + 4 * 16 * s


GPT_OSS_20B = {"model_type": "gpt_oss", "hidden_size": 2880, "num_hidden_layers": 24,
               "intermediate_size": 2880, "num_attention_heads": 64, "num_key_value_heads": 8,
               "head_dim": 64, "vocab_size": 201088, "num_local_experts": 32,
               "num_experts_per_tok": 4, "experts_per_token": 4, "swiglu_limit": 7.0,
               "initial_context_length": 4096}


def test_gpt_oss_sinks_biased_router_and_experts_module():
    """GPT-OSS-20B: 20,914,757,184 parameters as transformers 5.17 builds it; the attention
    module owns a sink per head (hooked before its projections), the router and the experts
    carry biases, and the experts are one module under either release's stack."""
    from dataclasses import replace

    spec, unmodelled = hf(GPT_OSS_20B)
    assert not unmodelled and total_params(spec) == 20_914_757_184
    for recipe in (_hf_recipe(), replace(_hf_recipe(), fused_experts=False)):
        modules = {m.name.removeprefix("layers.0."): m
                   for m in build_modules(spec, Workload(sequence_length=8), recipe)
                   if m.layer == 0}
        assert list(modules)[:4] == ["input_layernorm", "self_attn", "self_attn.q_proj",
                                     "self_attn.k_proj"]
        assert list(modules)[-2:] == ["mlp.gate", "mlp.experts"]
    assert modules["self_attn"].param_numels == (64,) and not modules["self_attn"].kernels
    assert modules["mlp.gate"].param_numels == (2880 * 32, 32)
    assert modules["mlp.experts"].param_numels == (32 * 2 * 2880 * 2880, 32 * 2 * 2880,
                                                    32 * 2880 * 2880, 32 * 2880)


def test_gpt_oss_eager_scores_join_the_sinks():
    """Eager attention joins the sinks to the scores (the `scores` entry's `sinks` variant,
    read off GPT-OSS's code): scaling, mask, concatenation, row maximum, subtraction and a
    16-bit softmax, 22 B a score in 6 kernels, keeping the 16-bit probabilities (2 B), where
    Llama's path keeps their fp32 output and its 16-bit copy (6 B)."""
    spec, _ = hf(GPT_OSS_20B, num_hidden_layers=1)
    plain, _ = hf(GPT_OSS_20B, num_hidden_layers=1, attention_sinks=False)
    w, scores, qkv = Workload(sequence_length=8), 64 * 8 * 8, 2 * 8 * (4096 + 2 * 4096)
    core = {m.name: m for m in build_modules(spec, w, _hf_recipe())}["layers.0.attn.core"]
    bare = {m.name: m for m in build_modules(plain, w, _hf_recipe())}["layers.0.attn.core"]
    joined = [k for k in core.kernels if k not in bare.kernels]
    assert [(k.count, k.nbytes, k.softmax_nbytes) for k in joined] == [
        (6, 22 * scores, 4 * scores)]
    assert core.saved_bytes == qkv + 2 * scores and bare.saved_bytes == qkv + 6 * scores
    assert (core.transient_bytes, core.backward_transient_bytes) == (4 * scores, 6 * scores)


def test_a_zero3_leaf_moe_block_holds_its_parameters_in_its_first_module():
    """`modules.moe_block: leaf` (DeepSpeed's set_z3_leaf_modules on the block): the router's
    module holds every parameter of the block, so its hook gathers them all; the experts'
    modules hold none, and the model's count is unchanged."""
    from dataclasses import replace

    from zerosim.models.leaves import LeafRules, find_leaves, hold_in_first

    spec, _ = hf(QWEN3_MOE_TINY)
    recipe = replace(_hf_recipe(), fused_experts=False)
    modules = build_modules(spec, Workload(sequence_length=8), recipe)
    leaves = find_leaves(modules, LeafRules(moe_blocks=True))
    assert leaves.names == ("model.layers.1.mlp",)
    held = hold_in_first(modules, leaves.spans)
    hooked = [m for m in modules if m.layer == 1 and ".mlp." in m.name]
    leaf = [m for m in held if m.layer == 1 and ".mlp." in m.name]
    assert [m.name for m in leaf] == [m.name for m in hooked]
    assert leaf[0].params == sum(m.params for m in hooked) == 64 * 4 + 4 * 3 * 64 * 32
    assert leaf[0].param_numels == tuple(n for m in hooked for n in m.param_numels)
    assert leaf[0].keeps_gathered_for == len(leaf) - 1
    assert not any(m.params for m in leaf[1:])
    assert [m.host_syncs for m in leaf] == [m.host_syncs for m in hooked]
    assert sum(m.params for m in held) == sum(m.params for m in modules)


GLM45_AIR = {"model_type": "glm4_moe", "hidden_size": 4096, "num_hidden_layers": 46,
             "intermediate_size": 10944, "moe_intermediate_size": 1408,
             "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128,
             "vocab_size": 151552, "attention_bias": True, "n_routed_experts": 128,
             "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 1,
             "partial_rotary_factor": 0.5, "num_nextn_predict_layers": 1, "n_group": 1,
             "topk_group": 1, "routed_scaling_factor": 1.0, "use_qk_norm": False}


def test_glm45_biased_qkv_and_deepseek_style_experts():
    """GLM-4.5-Air: 106,852,245,504 parameters as transformers 5.17 builds it; Q/K/V biased,
    o_proj not; with `use_qk_norm` (GLM-4.5) Q and K normed per head after the projections."""
    spec, unmodelled = hf(GLM45_AIR)
    assert not unmodelled and total_params(spec) == 106_852_245_504
    params = dict(parameter_modules(spec))
    assert params["layers.0.self_attn.q_proj"] == 4096 * 96 * 128 + 96 * 128
    assert params["layers.0.self_attn.o_proj"] == 96 * 128 * 4096
    assert spec.moe.layers == tuple(range(1, 46))
    assert spec.moe.shared_expert_intermediate_size == 1408
    normed, _ = hf(GLM45_AIR, use_qk_norm=True, num_hidden_layers=1)
    names = [m.name.removeprefix("layers.0.self_attn.")
             for m in build_modules(normed, Workload(sequence_length=8), _hf_recipe())
             if ".self_attn." in m.name]
    assert names == ["q_proj", "k_proj", "v_proj", "q_norm", "k_norm", "o_proj"]


def test_llama4_runs_every_expert_on_every_token():
    """Llama 4 Scout's text model: 107,769,861,120 parameters as transformers 5.17 builds it.
    Its experts module repeats every token for every expert (scaled by the router score, zero
    where not routed), so it executes 16 MLPs' work a token where the conventional count, its
    model FLOPs, is the top-1 share; a shared expert follows."""
    spec, unmodelled = hf(LLAMA4_SCOUT)
    assert not unmodelled and total_params(spec) == 107_769_861_120
    t = 8
    modules = [m for m in build_modules(spec, Workload(sequence_length=t), _hf_recipe())
               if m.layer == 0 and ".mlp." in m.name]
    assert [m.name.removeprefix("layers.0.mlp.") for m in modules] == [
        "gate", "experts", "shared_expert.gate_proj", "shared_expert.up_proj",
        "shared_expert.act_fn", "shared_expert.down_proj"]
    experts = modules[1]
    executed = 16 * 2.0 * t * 3 * 5120 * 8192
    assert (experts.fwd_flops, experts.model_flops) == (executed, executed / 16)
    gemms = [(k.m, k.n, k.k, k.batch) for k in experts.kernels if isinstance(k, Gemm)]
    assert gemms == [(t, 2 * 8192, 5120, 16), (t, 5120, 8192, 16)]


def test_llama4_interleaves_moe_and_dense_layers_and_refuses_the_multimodal_config():
    """`interleave_moe_layer_step: 2` (Maverick): every second layer sparse, the others a
    dense MLP of `intermediate_size_mlp`; `moe_layers` lists them instead."""
    spec, _ = hf(LLAMA4_SCOUT, num_hidden_layers=4, interleave_moe_layer_step=2)
    assert spec.moe.layers == (1, 3) and spec.intermediate_size == 16384
    listed, _ = hf(LLAMA4_SCOUT, num_hidden_layers=4, moe_layers=[0])
    assert listed.moe.layers == (0,)
    with pytest.raises(ScenarioError, match=r"model\.moe_layers: expected a list of layer"):
        hf(LLAMA4_SCOUT, moe_layers="odd")
    with pytest.raises(ScenarioError, match=r"model_type llama4_text"):
        hf({**LLAMA4_SCOUT, "model_type": "llama4"})
    _, unmodelled = hf(LLAMA4_SCOUT, attention_chunk_size=8192)
    assert len(unmodelled) == 1 and "attention_chunk_size: 8192" in unmodelled[0]


# ------------------------------------------------------------------ MoE fields out of range

DEEPSEEK_MOE_TINY = {**LLAMA_SMALL, "model_type": "deepseek", "moe_intermediate_size": 32,
                     "n_routed_experts": 4, "num_experts_per_tok": 2}
FAMILY_MOE = {**LLAMA_SMALL, "family": "llama",
              "moe": {"num_experts": 4, "num_experts_per_tok": 2, "expert_intermediate_size": 32,
                      "layers": [0, 1]}}


def top_k_line(key: str, experts_key: str, experts: int, got: int) -> str:
    return (f"c.json: {key}: expected an integer from 1 to {experts_key} ({experts}), the "
            "experts each token is routed to (transformers' router, torch.topk, fails on "
            f"more), got {got}")


@pytest.mark.parametrize(("fields", "experts_key", "experts", "top_k"), [
    ({**MIXTRAL, "num_local_experts": 2, "num_experts_per_tok": 5}, "num_local_experts", 2, 5),
    ({**MIXTRAL, "num_experts_per_tok": 0}, "num_local_experts", 8, 0),
    ({**QWEN3_MOE_TINY, "num_experts_per_tok": 5}, "num_experts", 4, 5),
    ({**QWEN3_MOE_TINY, "model_type": "qwen2_moe", "num_experts_per_tok": 5}, "num_experts", 4,
     5),
    ({**DEEPSEEK_MOE_TINY, "num_experts_per_tok": 5}, "n_routed_experts", 4, 5),
    ({**DEEPSEEK_V2_LITE, "num_experts_per_tok": 65}, "n_routed_experts", 64, 65),
    ({**GLM45_AIR, "num_experts_per_tok": 129}, "n_routed_experts", 128, 129),
    ({**GPT_OSS_20B, "num_experts_per_tok": 33}, "num_local_experts", 32, 33),
    ({**LLAMA4_SCOUT, "num_experts_per_tok": 17}, "num_local_experts", 16, 17),
])
def test_a_top_k_outside_1_to_the_experts_is_refused_naming_the_key(fields, experts_key,
                                                                     experts, top_k):
    """Transformers' configs take any top k, but its routers' torch.topk over the experts'
    scores fails on the first forward when k is larger than the expert count."""
    with pytest.raises(ScenarioError) as err:
        hf(fields)
    assert str(err.value) == top_k_line("model.num_experts_per_tok", experts_key, experts,
                                        top_k)


def test_a_moe_mapping_is_checked_as_a_model_types_fields_are():
    with pytest.raises(ScenarioError) as err:
        hf({**FAMILY_MOE, "moe": {**FAMILY_MOE["moe"], "num_experts_per_tok": 5}})
    assert str(err.value) == top_k_line("model.moe.num_experts_per_tok", "num_experts", 4, 5)
    with pytest.raises(ScenarioError) as err:
        hf({**FAMILY_MOE, "moe": {**FAMILY_MOE["moe"], "layers": [0, 2]}})
    assert str(err.value) == ("c.json: model.moe.layers[1]: expected a layer index from 0 to 1 "
                              "(num_hidden_layers 2), each listed once, got 2")
    spec, _ = hf(FAMILY_MOE)
    assert spec.moe.layers == (0, 1) and spec.moe.num_experts_per_tok == 2


@pytest.mark.parametrize(("key", "listed", "at", "got"), [
    ("mlp_only_layers", [5, -1, 0, 0], "[0]", 5),
    ("mlp_only_layers", [-1], "[0]", -1),
    ("mlp_only_layers", [1, 0, 1], "[2]", 1),
    ("moe_layers", [0, 2], "[1]", 2),
    ("moe_layers", [0, 0], "[1]", 0),
])
def test_layer_lists_hold_each_layer_index_once(key, listed, at, got):
    """`mlp_only_layers` (Qwen-MoE) and `moe_layers` (Llama 4) are layer indices from 0 to
    num_hidden_layers - 1 (Qwen3MoeConfig's docstring); transformers only asks whether a
    layer's index is listed, so an index past the model, a negative one or a repeat would
    change nothing: a mistake, refused."""
    fields = QWEN3_MOE_TINY if key == "mlp_only_layers" else LLAMA4_SCOUT
    with pytest.raises(ScenarioError) as err:
        hf(fields, num_hidden_layers=2, **{key: listed})
    assert str(err.value) == (f"c.json: model.{key}{at}: expected a layer index from 0 to 1 "
                              f"(num_hidden_layers 2), each listed once, got {got}")
    with pytest.raises(ScenarioError) as err:
        hf(fields, num_hidden_layers=2, **{key: [True]})
    assert str(err.value) == (f"c.json: model.{key}: expected a list of layer indices from 0 "
                              "to 1, got [true]")


def _first_norm(fields: dict, stack: str, tokens: int = 8):
    from zerosim.stacks import load_stack

    spec = spec_from_hf_fields(fields, name="m")
    modules = build_modules(spec, Workload(sequence_length=tokens), load_stack(stack).recipe)
    return next(m for m in modules if m.layer == 0 and m.kind == "norm")


@pytest.mark.parametrize(("fields", "kernels", "forward_bytes", "backward", "saved",
                          "saved_per_row"), [
    # GPT-2's ln_1, an nn.LayerNorm: one ATen kernel reading and writing 16 bits; its backward
    # the input's gradient (6 B) and the weight's and bias's (4 B) in two kernels; it keeps its
    # input and an fp32 mean and inverse deviation per row
    (GPT2_SMALL, 1, 4, (2, 10), 2, 8),
    # Llama's input_layernorm, LlamaRMSNorm's Python ops: eight kernels keeping 6 B a element
    ({"model_type": "llama", "hidden_size": 768, "num_hidden_layers": 2,
      "num_attention_heads": 12, "intermediate_size": 2048, "vocab_size": 100}, 8, 36,
     (16, 92), 6, 4),
])
def test_hf_stack_prices_a_layer_norm_as_one_aten_kernel_and_an_rms_norm_as_llamas_ops(
        fields, kernels, forward_bytes, backward, saved, saved_per_row):
    norm = _first_norm(fields, "hf-transformers")
    elements, rows = 768 * 8, 8
    (kernel_pass,) = norm.kernels
    assert (kernel_pass.count, kernel_pass.nbytes) == (kernels, forward_bytes * elements)
    assert (kernel_pass.backward_count, kernel_pass.backward_nbytes) == (
        backward[0], backward[1] * elements)
    assert norm.saved_bytes == saved * elements + saved_per_row * rows


def test_megatrons_fused_norm_prices_a_layer_norm_as_its_rms_norm():
    """A stack without a `layer_norm` entry (Megatron-DeepSpeed's apex kernels) prices both
    kinds of norm alike."""
    norm = _first_norm(GPT2_SMALL, "megatron-deepspeed")
    (kernel_pass,) = norm.kernels
    assert (kernel_pass.count, kernel_pass.nbytes) == (1, 4 * 768 * 8)
