"""ZeRO-3 leaf modules: the module tree rebuilt from zerosim's module paths, DeepSpeed's
granularity and leaf rules on it (`zerosim.models.leaves`), the ds_config keys that set them,
and the engine fetching a leaf whole."""

from __future__ import annotations

import warnings

import pytest

from zerosim.errors import ScenarioError
from zerosim.models.leaves import (
    COARSE,
    LeafRules,
    find_leaves,
    granularity,
    hold_in_first,
    module_tree,
)
from zerosim.vocabulary import OpKind, Phase

TINYLLAMA = {"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 22,
             "intermediate_size": 5632, "num_attention_heads": 32, "num_key_value_heads": 4,
             "vocab_size": 32000, "tie_word_embeddings": False}
Z = "deepspeed.zero_optimization."


def _modules(toy, model=None, stack=None):
    from zerosim.engine.plan import _modules as build
    from zerosim.engine.plan import workload_of

    patch = {"model": model or TINYLLAMA}
    if stack:
        patch["runtime"] = {"framework": stack}
    scenario = toy.scenario(patch)
    return build(scenario.model, workload_of(scenario), scenario.stack.recipe)


def _grain(root):
    grain = granularity(root)
    return {node.name: grain.get(id(node), COARSE) for node in root.walk()}


def test_tinyllamas_granularity_as_deepspeed_counts_it(toy):
    """Parameters under a module over the modules with parameters under it, itself included:
    a decoder layer counts its two norms, its attention (four projections and itself) and
    its MLP (three and itself), 12; containers pass their counts on; a module without
    children, or one above 1e9 parameters, is never fine-grained."""
    grain = _grain(module_tree(_modules(toy), "transformers"))
    layer = 2 * 2048 + 2 * 2048 * 2048 + 2 * 2048 * 256 + 3 * 2048 * 5632
    assert grain["model.layers.0"] == layer // 12 == 3_670_357
    assert grain["model.layers.0.self_attn"] == (2 * 2048 * 2048 + 2 * 2048 * 256) // 5
    assert grain["model.layers.0.mlp"] == 3 * 2048 * 5632 // 4 == 8_650_752
    assert grain["model.layers"] == grain["model.layers.0.mlp.gate_proj"] == COARSE
    assert grain[""] == grain["model"] == COARSE  # 1.10e9 and 1.03e9 parameters


def test_the_threshold_makes_the_outermost_fine_module_a_leaf(toy):
    """`_set_leaf_by_threshold_preorder`: the first module at or below the threshold on each
    path from the top; below every module's granularity, none (DeepSpeed warns with the
    finest)."""
    modules = _modules(toy)

    def leaves(threshold):
        return find_leaves(modules, LeafRules(model_type="llama",
                                              granularity_threshold=threshold))

    none = leaves(1_887_435)
    assert none.spans == () and none.finest == ("model.layers.0.self_attn", 1_887_436)
    attention = leaves(1_887_436)
    assert len(attention.names) == 22 and attention.names[0] == "model.layers.0.self_attn"
    assert attention.spans[0] == (2, 6)  # q, k, v, the attention op, o
    layers = leaves(4_000_000)
    assert layers.names == tuple(f"model.layers.{i}" for i in range(22))
    assert layers.spans[0] == (1, 11) and layers.spans[-1] == (232, 242)


def test_megatrons_encoder_is_one_module_of_the_tree(toy):
    """Megatron-DeepSpeed wraps the layers in `language_model.encoder` (a ParallelTransformer,
    not a container): under 1e9 parameters it has a granularity of its own, and a threshold
    above it makes every layer one leaf."""
    root = module_tree(_modules(toy), "megatron")
    grain = _grain(root)
    encoder = 22 * (2 * 2048 + 2 * 2048 * 2048 + 2 * 2048 * 256 + 3 * 2048 * 5632) + 2048
    assert grain["language_model.encoder"] == encoder // (22 * 12 + 2) == 3_642_768
    assert grain["language_model.encoder.layers.0.self_attention"] == 1_887_436
    found = find_leaves(_modules(toy), LeafRules(kind="megatron", granularity_threshold=4e6))
    assert found.names == ("language_model.encoder",) and found.spans == ((1, 243),)


def test_leaves_by_class_name_and_suffix_the_outermost_counting(toy):
    """`leaf_module`: a class by its name or its module-qualified one, a full name as
    `named_modules()` gives it, a suffix of one; where a flagged module holds another, the
    outer is the leaf; what matches nothing is said."""
    modules = _modules(toy)

    def leaves(**rules):
        return find_leaves(modules, LeafRules(model_type="llama", **rules))

    by_class = leaves(classes=("LlamaDecoderLayer",))
    qualified = leaves(classes=("transformers.models.llama.modeling_llama.LlamaDecoderLayer",))
    assert by_class.names == qualified.names == tuple(f"model.layers.{i}" for i in range(22))
    assert leaves(names=("model.layers.3.mlp",)).spans == ((41, 44),)
    outer = leaves(classes=("LlamaDecoderLayer",), name_suffixes=("self_attn",))
    assert outer.names == by_class.names
    missing = leaves(classes=("MixtralSparseMoeBlock", "LlamaMLP"), names=("model.h.0",),
                     name_suffixes=("c_attn",))
    assert len(missing.names) == 22 and missing.names[0] == "model.layers.0.mlp"
    assert missing.unmatched_classes == ("MixtralSparseMoeBlock",)
    assert missing.unmatched_names == ("model.h.0",)
    assert missing.unmatched_suffixes == ("c_attn",)


def test_a_leaf_holds_its_parameters_in_its_first_module(toy):
    """The whole model under one leaf: module 0 holds every parameter, in order, and keeps
    them gathered to the last module; the others hold none; nothing is external."""
    modules = _modules(toy)
    held = hold_in_first(modules, ((0, len(modules) - 1),))
    assert held[0].param_numels == tuple(n for m in modules for n in m.param_numels)
    assert held[0].keeps_gathered_for == len(modules) - 1
    assert not any(m.params or m.external for m in held[1:])


def test_the_keys_by_release(toy):
    """`module_granularity_threshold` (or its `stage3_` alias) from DeepSpeed 0.16.0,
    `leaf_module` from 0.18.0, whose classes default to transformers' three MoE blocks;
    an earlier release refuses them, as DeepSpeed's config does."""
    import zerosim

    zero = "deepspeed.zero_optimization"

    def resolved(version, **keys):
        tree = toy.tree({"runtime": {"deepspeed_version": version},
                         "deepspeed": {"zero_optimization": keys}})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return zerosim.scenario_from_dict(tree, source="<toy>").deepspeed.leaves

    assert resolved("0.17.6").classes == () and resolved("0.17.6").granularity_threshold == 0
    assert resolved("0.18.0").classes[2].endswith("Qwen3MoeSparseMoeBlock")
    alias = resolved("0.16.3", stage3_module_granularity_threshold=1e6)
    assert alias.granularity_threshold == 1_000_000 and alias.fast_fetch
    assert not resolved("0.16.2", module_granularity_threshold=5).fast_fetch
    own = resolved("0.19.5", leaf_module={"classes": "LlamaMLP", "names": ["a", "a"]})
    assert own.classes == ("LlamaMLP",) and own.names == ("a",)
    for version, keys, path in (
            ("0.15.4", {"module_granularity_threshold": 5}, "module_granularity_threshold"),
            ("0.17.6", {"leaf_module": {"names": ["x"]}}, "leaf_module"),
            ("0.19.5", {"module_granularity_threshold": 5,
                        "stage3_module_granularity_threshold": 5},
             "stage3_module_granularity_threshold"),
            ("0.19.5", {"leaf_module": {"class": ["x"]}}, "leaf_module.class")):
        with pytest.raises(ScenarioError, match=rf"{zero}\.{path}"):
            resolved(version, **keys)


def test_a_leaf_is_fetched_once_going_forward_and_before_its_last_module_going_back(toy):
    """Decoder layers as leaves (the toy's granularity 3,424 <= 3,500): with no prefetch and
    nothing kept for the backward (reuse distance 0), the forward gathers each layer at its
    first module and the backward gathers it again before the backward of its last module,
    the first the backward runs."""
    patch = {"runtime": {"deepspeed_version": "0.19.5"},
             "deepspeed": {"zero_optimization": {"module_granularity_threshold": 3500,
                                                 "stage3_max_reuse_distance": 0,
                                                 "stage3_prefetch_bucket_size": 0}}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = toy.run(patch, gpus=2)
    assert result.summary["status"] == "ok"
    spans = result.spans
    rank0 = spans[(spans["rank"] == 0) & (spans.micro_batch == 0)]
    gathers = rank0[rank0.op_kind == OpKind.ALL_GATHER]
    forward = [name for op in gathers[gathers.phase == Phase.FORWARD].sort_values("start_s").op
               for name in op.removeprefix("all-gather ").split(" + ")]
    assert forward == ["embed_tokens", "layers.0.input_layernorm",
                       "layers.1.input_layernorm", "norm", "lm_head"]
    backward = gathers[(gathers.phase == Phase.BACKWARD)
                       & gathers.op.str.contains("layers.1.input_layernorm")]
    last = rank0[rank0.op == "backward layers.1.mlp.down_proj"]
    assert len(backward) == 1 and len(last) == 1
    assert backward.end_s.iloc[0] <= last.start_s.iloc[0]


def test_the_plans_hooks_fire_at_a_leafs_ends():
    """`Plan.forward_hooks` and `backward_hooks`: outside leaves each module's own; in a leaf
    of modules 1-4 the holder's, before module 1 going forward and module 4 going back."""
    from types import SimpleNamespace

    from zerosim.engine.plan import Plan

    plan = Plan.__new__(Plan)
    object.__setattr__(plan, "modules", tuple(SimpleNamespace(keeps_gathered_for=k,
                                                              backward_in_forward=False)
                                              for k in (0, 3, 0, 0, 0, 0)))
    object.__setattr__(plan, "leaves", {1: 4})
    object.__setattr__(plan, "tiled", {})
    assert plan.forward_hooks == (0, 1, None, None, None, 5)
    assert plan.backward_hooks == (0, None, None, None, 1, 5)
    tiled = Plan.__new__(Plan)
    for key, value in (("modules", plan.modules), ("leaves", {}), ("tiled", {1: 3})):
        object.__setattr__(tiled, key, value)
    assert tiled.forward_hooks == plan.forward_hooks  # a tiled MLP's span is hooked alike
    assert tiled.backward_hooks == plan.backward_hooks


def test_megatrons_leaf_hook_share_is_the_one_measured_with_transformers():
    """Megatron-DeepSpeed's `host.leaf_hook_share` is assumed at the hf-transformers stack's
    measured value (written out, not `carried_from`, so that loading one stack does not parse
    the other)."""
    from zerosim.stacks import LEAF_HOOK_KEY, load_stack

    hf, megatron = load_stack("hf-transformers"), load_stack("megatron-deepspeed")
    assert hf.provenance[LEAF_HOOK_KEY].basis == "measured"
    assert megatron.provenance[LEAF_HOOK_KEY].basis == "assumed"
    assert megatron.leaf_hook_share == hf.leaf_hook_share == 0.42


@pytest.mark.parametrize(("zero", "said"), [
    ({"module_granularity_threshold": 5},
     "module_granularity_threshold 5 makes no module a leaf: the finest, "
     "'model.layers.0.self_attn', has a granularity of 3276"),
    ({"leaf_module": {"classes": ["GPT2Block"], "names": ["model.h.0"]}},
     "leaf_module class GPT2Block, name model.h.0 match no module"),
    ({"stage": 2, "module_granularity_threshold": 3500},
     "module_granularity_threshold does nothing at ZeRO-2"),
    ({"module_granularity_threshold": 3500}, None),
])
def test_leaf_rules_that_flag_nothing_are_a_warning(toy, zero, said):
    """As DeepSpeed logs a threshold under every module's granularity, zerosim warns, and of
    a class, name or suffix it cannot place, or of the keys below ZeRO-3; a rule that flags
    leaves says nothing."""
    from zerosim.scenario.support import LeafModuleWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        toy.scenario({"runtime": {"deepspeed_version": "0.19.5"},
                      "deepspeed": {"zero_optimization": zero}})
    told = [str(w.message) for w in caught if issubclass(w.category, LeafModuleWarning)]
    assert (told == []) if said is None else (len(told) == 1 and said in told[0])


def test_check_names_the_leaves(tmp_path):
    """`zerosim check` prints the leaves by pattern; `--json` lists each with its modules."""
    import json

    from click.testing import CliRunner

    from zerosim.cli import main

    args = ["check", "scenarios/h200_vm/tinyllama_hooks.yaml", "--set",
            "deepspeed.zero_optimization.module_granularity_threshold=4e6"]
    text = CliRunner().invoke(main, args, catch_exceptions=False).output
    assert "leaves      model.layers.* (22): each fetched whole by one hook" in text
    listed = json.loads(CliRunner().invoke(main, [*args, "--json"]).output)["leaves"]
    assert len(listed) == 22 and listed[0] == {
        "name": "model.layers.0", "first_module": "layers.0.input_layernorm",
        "last_module": "layers.0.mlp.down_proj", "modules": 11}
    plain = json.loads(CliRunner().invoke(main, [*args[:2], "--json"]).output)
    assert "leaves" not in plain
