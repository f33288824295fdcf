"""The parameter groups a framework hands the optimizer, and what DeepSpeed builds from them:
Megatron-DeepSpeed's `get_param_groups` puts the one-dimensional tensors (norms, biases) in a
group after the others; ZeRO-3 cuts its sub-groups one group at a time, ZeRO-1/2 flatten and
step each group apart. The HF Trainer with a ds_config optimizer hands over one group."""

from __future__ import annotations

import warnings

import pytest

import zerosim
from zerosim.engine.plan import plan_of, update_groups, workload_of
from zerosim.models import CATALOG, build_modules, spec_from_hf_fields
from zerosim.models.breakdown import vector_flags
from zerosim.models.leaves import LeafRules, find_leaves, hold_in_first
from zerosim.scenario.support import ForkStepFailsWarning

STUDY = "scenarios/llama13b_dp4.yaml"
DOS = "scenarios/polaris_dos.yaml"
Z = "deepspeed.zero_optimization."
LLAMA2_7B = {"model": "llama2-7b", Z + "sub_group_size": 1e9}
# Llama-2-7B on 4 ranks: 65 RMSNorm weights of 4,096 (two a block, 32 blocks, and the final
# one), a quarter of each per rank
NORMS_PER_RANK = 65 * 4096 // 4
PARTITION = 6_738_415_616 // 4


def _plan(overrides: dict):
    return plan_of(zerosim.load_scenario(STUDY, {**LLAMA2_7B, **overrides}))


def test_megatron_hands_the_norms_to_the_optimizer_as_a_group_of_their_own():
    plan = _plan({})
    assert plan.subgroups[-1] == NORMS_PER_RANK
    assert plan.subgroup_param_group == (0, 0, 1)
    assert sum(plan.subgroups[:-1]) == PARTITION - NORMS_PER_RANK
    assert plan.param_group_partitions == (PARTITION - NORMS_PER_RANK, NORMS_PER_RANK)


def test_one_group_has_no_sub_group_of_norms():
    plan = _plan({"stack.optimizer.param_groups.value": "one"})
    assert plan.subgroup_param_group == (0, 0)
    assert sum(plan.subgroups) == PARTITION
    assert plan.param_group_partitions == (PARTITION,)
    hf = _plan({"runtime.framework": "hf-transformers"})
    assert set(hf.subgroup_param_group) == {0}


def test_zero2_steps_each_parameter_group_apart():
    plan = _plan({Z + "stage": 2})
    assert update_groups(plan, 2) == (PARTITION - NORMS_PER_RANK, NORMS_PER_RANK)


def test_biases_and_norms_are_the_one_dimensional_tensors():
    """A Qwen2-shaped block (biases on Q, K and V) cut as Megatron-DeepSpeed cuts it: the
    second group holds the three biases and two norms of each block and the final norm."""
    spec = spec_from_hf_fields({
        "model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 256, "tie_word_embeddings": False}, name="tiny-qwen2")
    scenario = zerosim.load_scenario(STUDY, {"data_parallel": 1})
    modules = build_modules(spec, workload_of(scenario), scenario.stack.recipe)
    vectors = sum(n for m in modules for n, flag in zip(m.param_numels, vector_flags(m),
                                                       strict=True) if flag)
    q_bias, kv_bias, norm = 64, 2 * 32, 64  # K's and V's biases: two heads of 16 each
    assert vectors == 2 * (q_bias + kv_bias + 2 * norm) + norm
    assert all(m.one_dimensional[0] is False for m in modules if m.kind == "linear")




def test_gpt3s_vectors_are_its_layer_norms_and_biases():
    """GPT-3 175B: per block two LayerNorms (weight and bias, 2 h each) and the biases of
    QKV (3 h), the attention's output (h), fc_in (4 h) and fc_out (h): 13 h; then the final
    LayerNorm (2 h). Its tied head adds no tensor."""
    h, layers = 12288, 96
    scenario = zerosim.load_scenario(STUDY)
    modules = build_modules(CATALOG["gpt3-175b"], workload_of(scenario),
                            scenario.stack.recipe)
    vectors = sum(n for m in modules for n, flag in zip(m.param_numels, vector_flags(m),
                                                       strict=True) if flag)
    assert vectors == layers * 13 * h + 2 * h


def test_a_zero3_leaf_block_keeps_each_tensors_flag():
    """A mixture-of-experts block made a ZeRO-3 leaf holds every tensor of its children in
    its first module; the flags follow them (here the router's weight only: no vector)."""
    spec = spec_from_hf_fields({
        "model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 4,
        "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 256}, name="tiny-moe")
    scenario = zerosim.load_scenario(STUDY, {"stack.modules.moe_block.value": "leaf"})
    modules = build_modules(spec, workload_of(scenario), scenario.stack.recipe)
    spans = find_leaves(modules, LeafRules(moe_blocks=True)).spans
    leaf = next(m for m in hold_in_first(modules, spans) if m.keeps_gathered_for)
    assert len(leaf.one_dimensional) == len(leaf.param_numels) > 2
    assert not any(leaf.one_dimensional)


@pytest.mark.parametrize(("gap", "warned"), [(2, False), (3, True), (4, False)])
def test_the_fork_stops_on_a_gpu_sub_group_of_the_second_group(gap, warned):
    """polaris_dos.yaml's rank has 15 sub-groups, the last its norms: at gap 3 that one
    (x = 14, (x + 1) % 3 == 0) is stepped on the GPU, where the fork's step deletes from a
    parameter list its setup emptied."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scenario = zerosim.load_scenario(DOS, {
            Z + "offload_optimizer.prefetch_optimizer_gap": gap})
    messages = [str(w.message) for w in caught if issubclass(w.category, ForkStepFailsWarning)]
    plan = plan_of(scenario)
    assert len(plan.subgroups) == 15 and plan.subgroup_param_group[-1] == 1
    assert bool(messages) == warned
    if warned:
        assert "puts sub-group 14 of 15, of the optimizer's parameter group 1" in messages[0]
        assert "raises IndexError" in messages[0]

