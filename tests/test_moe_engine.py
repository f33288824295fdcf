"""Mixture-of-experts models in the engine: ZeRO-3 fetches every expert, and the model states
hold every expert's parameters."""

from __future__ import annotations

from zerosim.models import build_modules, total_params
from zerosim.vocabulary import OpKind, Phase

TINY_MIXTRAL = {"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2,
                "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
                "vocab_size": 256, "num_local_experts": 4, "num_experts_per_tok": 2}


def test_zero3_gathers_every_expert_in_forward_order(toy):
    """transformers runs every expert of the `nn.ModuleList` in turn, so each expert's hooks
    fire and ZeRO-3 all-gathers its projections, in module order, whatever tokens it gets (a
    prefetch gathers several modules in one call, named "all-gather a + b + ...")."""
    scenario = toy.scenario({"model": TINY_MIXTRAL}, gpus=2)
    result = toy.run({"model": TINY_MIXTRAL}, gpus=2)
    gathered = _forward_gathers(result)
    experts = [m.name for m in build_modules(scenario.model, _workload(scenario))
               if ".experts." in m.name and m.params]
    assert len(experts) == 2 * 4 * 3
    assert [name for name in gathered if ".experts." in name] == experts


def test_model_states_hold_every_expert(toy):
    """ZeRO partitions every expert's parameters: the plan's parameters are the model's."""
    from zerosim.engine.plan import plan_of

    scenario = toy.scenario({"model": TINY_MIXTRAL}, gpus=2)
    experts = 2 * 4 * 3 * 64 * 128
    assert sum(p.numel for p in plan_of(scenario).all_params) == total_params(scenario.model)
    assert total_params(scenario.model) == (256 * 64 * 2 + 64 + experts + 2 * (
        2 * 64 * 64 + 2 * 64 * 32 + 2 * 64 + 64 * 4))


def _forward_gathers(result) -> list[str]:
    """The modules rank 0 all-gathers in its first forward, in order (a prefetch gathers
    several modules in one call, named "all-gather a + b + ...")."""
    spans = result.spans
    gathers = spans[(spans["rank"] == 0) & (spans.op_kind == OpKind.ALL_GATHER)
                    & (spans.phase == Phase.FORWARD) & (spans.micro_batch == 0)]
    return [name for op in gathers.sort_values("start_s").op
            for name in op.removeprefix("all-gather ").split(" + ")]


def _workload(scenario):
    from zerosim.engine.plan import workload_of

    return workload_of(scenario)


FUSED_EXPERTS = {"modules": {"experts": {"value": "fused", "source": "transformers 5"}}}


def test_fused_experts_are_gathered_at_once_per_layer(toy):
    """transformers 5 holds a layer's experts in one module: ZeRO-3 all-gathers its two
    weights (every expert's) in one fetch, after the router's, and the model states are the
    same parameters."""
    from zerosim.engine.plan import plan_of

    patch = {"model": TINY_MIXTRAL, "runtime": {"framework": FUSED_EXPERTS}}
    scenario = toy.scenario(patch, gpus=2)
    result = toy.run(patch, gpus=2)
    gathered = _forward_gathers(result)
    assert [name for name in gathered if ".mlp." in name] == [
        "layers.0.mlp.gate", "layers.0.mlp.experts", "layers.1.mlp.gate", "layers.1.mlp.experts"]
    plan = plan_of(scenario)
    names = [plan.modules[p.module].name for p in plan.all_params]
    experts = {}
    for name, param in zip(names, plan.all_params, strict=True):
        if name.endswith(".experts"):
            experts[name] = experts.get(name, 0) + param.numel
    assert experts == {"layers.0.mlp.experts": 4 * 3 * 64 * 128,
                       "layers.1.mlp.experts": 4 * 3 * 64 * 128}
    assert sum(p.numel for p in plan_of(scenario).all_params) == total_params(scenario.model)


def test_transformers_5s_experts_module_spares_the_host_thousands_of_hooks():
    """The shipped Qwen3-30B-A3B scenario (4 of its layers) on DeepSpeed 0.17.6: one fetch of
    a layer's 128 experts (transformers 5) against 384 hooked projections a layer
    (transformers 4); the forward is host-bound in the second, so it takes many times longer.
    From 0.18.0 DeepSpeed makes `Qwen3MoeSparseMoeBlock` a ZeRO-3 leaf by default, which
    gathers the list whole at the block's hook: the experts' own hooks go, the work on each of
    their tensors stays (`host.leaf_hook_share`)."""
    from pathlib import Path

    from zerosim.api import simulate_summary
    from zerosim.scenario import load_scenario

    path = Path(__file__).resolve().parent.parent / "scenarios" / "qwen3_moe_dgx_h100.yaml"
    layers = "model.num_hidden_layers=4"
    listed = "stack.modules.experts.value=per_expert"

    def forward(*overrides):
        summary = simulate_summary(load_scenario(path, [layers, *overrides]))
        assert summary["status"] == "ok"
        return summary["phases_s"]["forward"]

    old = "runtime.deepspeed_version=0.17.6"
    hooked = forward(old, listed)
    assert hooked > 20 * forward(old)
    assert 5 * forward() < forward(listed) < hooked / 2


TINY_DEEPSEEK_V3 = {"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 2,
                    "intermediate_size": 128, "moe_intermediate_size": 32,
                    "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256,
                    "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
                    "first_k_dense_replace": 1, "kv_lora_rank": 16, "q_lora_rank": 32,
                    "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8}


def test_latent_attention_runs_its_projections_as_zero3_modules(toy):
    """DeepSeek-V3's latent attention in the engine: each projection and latent norm is a
    module ZeRO-3 gathers in forward order, and the run ends (the engine checks that every
    allocation was freed)."""
    patch = {"model": TINY_DEEPSEEK_V3, "runtime": {"framework": FUSED_EXPERTS}}
    result = toy.run(patch, gpus=2)
    assert result.summary["status"] == "ok"
    gathered = _forward_gathers(result)
    attention = [name.removeprefix("layers.1.self_attn.") for name in gathered
                 if name.startswith("layers.1.self_attn.")]
    assert attention == ["q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa",
                         "kv_a_layernorm", "kv_b_proj", "o_proj"]
    assert [name for name in gathered if name.startswith("layers.1.mlp.")][:2] == [
        "layers.1.mlp.gate", "layers.1.mlp.experts"]


def test_gpt_oss_attention_module_fetches_its_sinks_first(toy):
    """GPT-OSS's attention module owns its sinks: ZeRO-3 gathers them when its hooks fire,
    before its projections'; a module without kernels runs none."""
    tiny = {"model_type": "gpt_oss", "hidden_size": 64, "num_hidden_layers": 2,
            "intermediate_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "vocab_size": 256, "num_local_experts": 4,
            "num_experts_per_tok": 2, "sliding_window": None}
    result = toy.run({"model": tiny}, gpus=2)
    assert result.summary["status"] == "ok"
    gathered = _forward_gathers(result)
    layer = [name.removeprefix("layers.1.") for name in gathered if name.startswith("layers.1.")]
    assert layer[:3] == ["input_layernorm", "self_attn", "self_attn.q_proj"]
    assert layer[-2:] == ["mlp.gate", "mlp.experts"]


def test_a_leaf_moe_block_is_gathered_once(toy):
    """DeepSpeed's set_z3_leaf_modules on the MoE block: one gather at the block's hook holds
    the router and every expert; no expert module fires a hook of its own."""
    leaf = {"modules": {"moe_block": {"value": "leaf", "source": "LLaMA-Factory"}}}
    result = toy.run({"model": TINY_MIXTRAL, "runtime": {"framework": leaf}}, gpus=2)
    gathered = _forward_gathers(result)
    assert [name for name in gathered if ".mlp." in name] == ["layers.0.mlp.gate",
                                                             "layers.1.mlp.gate"]


def test_a_leaf_blocks_params_are_released_after_its_last_module():
    """The leaf block's hook releases what it gathered after the block's last child, not after
    the module that holds the params; every other module releases its own after itself."""
    from types import SimpleNamespace

    from zerosim.engine.program import RankProgram

    modules = [SimpleNamespace(keeps_gathered_for=k) for k in (0, 3, 0, 0, 0, 0)]
    program = RankProgram.__new__(RankProgram)
    program.core = SimpleNamespace(plan=SimpleNamespace(modules=modules))
    assert program._released_after_forward() == {0: (0,), 1: (), 2: (2,), 3: (3,),
                                                  4: (1, 4), 5: (5,)}


def test_llama4s_every_token_experts_run_in_the_engine(toy):
    """Llama 4's experts module (every expert on every token) in the engine: gathered once
    per sparse layer; the dense layer's MLP is its own projections."""
    tiny = {"model_type": "llama4_text", "hidden_size": 64, "num_hidden_layers": 2,
            "intermediate_size": 32, "intermediate_size_mlp": 96, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256,
            "num_local_experts": 4, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2,
            "attention_chunk_size": None}
    result = toy.run({"model": tiny}, gpus=2)
    assert result.summary["status"] == "ok"
    gathered = _forward_gathers(result)
    assert "layers.1.mlp.experts" in gathered and "layers.0.mlp.gate_proj" in gathered
    assert not any(name.startswith("layers.0.mlp.experts") for name in gathered)
