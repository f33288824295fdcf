"""DeepSpeed's TiledMLP (`runtime.tiled_mlp_shards`, 0.17.0+), as Arctic Long Sequence
Training patches a gated MLP: the forward over slices of the sequence saving only the MLP's
input, the backward running each slice's forward again, the ZeRO-3 hooks firing on every
slice, and the weights' gradients reduced after the last."""

from __future__ import annotations

import warnings

import pytest

from zerosim.engine.plan import plan_of, workload_of
from zerosim.errors import ScenarioError, UnsupportedConfigError
from zerosim.models.breakdown import (
    MemoryPass,
    Workload,
    auto_tiled_shards,
    build_modules,
    chunk_rows,
)
from zerosim.models.kernels import Gemm
from zerosim.vocabulary import Phase

MLP = "layers.0.mlp"


def _patch(shards, *, version: str = "0.19.5", sequence: int = 8, **runtime) -> dict:
    return {"runtime": {"deepspeed_version": version, "tiled_mlp_shards": shards, **runtime},
            "sequence_length": sequence}


def _mlp(modules, layer: int = 0):
    return {m.name.rsplit(".", 1)[1]: m for m in modules
            if m.name.startswith(f"layers.{layer}.mlp.")}


def test_torch_chunk_pieces_and_the_automatic_count():
    assert chunk_rows(8, 2) == (4, 4)
    assert chunk_rows(10, 4) == (3, 3, 3, 1)
    assert chunk_rows(6, 4) == (2, 2, 2)  # torch.chunk gives fewer pieces here
    assert chunk_rows(3, 8) == (1, 1, 1)
    assert auto_tiled_shards(16384, 4096) == 4
    assert auto_tiled_shards(16385, 4096) == 5
    assert auto_tiled_shards(100, 4096) == 1


def test_the_forward_runs_each_slice_and_saves_only_the_input(toy):
    """Toy Llama (hidden 64, intermediate 128), 8 tokens in 2 slices, fp16: each projection
    runs twice over 4 rows; only the MLP's input is kept (2 x 64 x 8 = 1,024 B against
    1,024 + 4,096 + 2,048 B untiled); the slices' outputs are concatenated (read and write
    2 x 64 x 8 x 2 B); the last module holds the forward's slice intermediates and outputs
    (2 x (3 x 128 x 4 + 64 x 8) = 4,096 B)."""
    spec = toy.scenario().model
    plain = _mlp(build_modules(spec, Workload(8)))
    tiled = _mlp(build_modules(spec, Workload(8, tiled_mlp_shards=2)))
    assert tiled["gate_proj"].kernels == (Gemm(4, 128, 64),) * 2
    assert tiled["up_proj"].kernels == (Gemm(4, 128, 64),) * 2
    assert tiled["down_proj"].kernels == (Gemm(4, 64, 128),) * 2 + (MemoryPass(2048),)
    assert [m.saved_bytes for m in plain.values()] == [1024, 0, 4096, 2048]
    assert [m.saved_bytes for m in tiled.values()] == [1024, 0, 0, 0]
    assert tiled["down_proj"].transient_bytes == 4096
    for name in plain:
        assert tiled[name].model_flops == plain[name].model_flops
        assert tiled[name].params == plain[name].params
    assert tiled["gate_proj"].tiled_span == 3 and plain["gate_proj"].tiled_span == 0
    # one slice more calls the three projections' hooks again going forward; the backward
    # calls them for each slice's forward and for each slice's backward but the first
    assert tiled["gate_proj"].repeated_hooks == (3, 9)
    assert tiled["gate_proj"].host_syncs == 0


def test_the_backward_runs_each_slice_forward_again_in_the_last_module(toy):
    """Everything the tiled backward does sits in `down_proj`'s backward, the first the
    backward reaches: the input gradient zeroed (1,024 B), then per slice its three GEMMs
    again and their six, the activation's passes, the sum of the gate's and up's input
    gradients, the slice's gradient added into the input's (3 x 2 x 64 x 4 B), and after the
    first slice the three weights' gradients accumulated (3 x 2 x 24,576 B in 3 kernels)."""
    spec = toy.scenario().model
    tiled = _mlp(build_modules(spec, Workload(8, tiled_mlp_shards=2)))
    plain = _mlp(build_modules(spec, Workload(8)))
    backward = tiled["down_proj"].backward_kernels
    assert [tiled[n].backward_kernels for n in ("gate_proj", "up_proj", "act_fn")] == [()] * 3
    gemm_flops = sum(k.flops for k in backward if isinstance(k, Gemm))
    forward_flops = sum(plain[n].model_flops for n in ("gate_proj", "up_proj", "down_proj"))
    assert gemm_flops == 3 * forward_flops
    assert backward[0] == MemoryPass(1024)
    assert backward.count(MemoryPass(3 * 2 * 64 * 4)) == 2
    assert backward[-1] == MemoryPass(3 * 2 * 3 * 64 * 128, 3)
    assert backward.count(MemoryPass(3 * 2 * 3 * 64 * 128, 3)) == 1
    # the input gradient, the three weights' gradients, a slice's two GEMM gradients' room
    # and what its forward keeps for its backward (4 + 2 B per intermediate element)
    assert tiled["down_proj"].backward_transient_bytes == (
        2 * (64 * 8 + 3 * 64 * 128 + 2 * 128 * 4) + 6 * 128 * 4)


def test_checkpointed_blocks_recompute_only_the_input(toy):
    spec = toy.scenario().model
    w = Workload(8, activation_checkpointing=True, tiled_mlp_shards=2)
    tiled = _mlp(build_modules(spec, w))
    assert [m.recompute_bytes for m in tiled.values()] == [1024, 0, 0, 0]
    assert all(m.saved_bytes == 0 for m in tiled.values())


def test_auto_counts_slices_per_rank_and_agrees_on_them(toy):
    """`auto`: ceil(the rank's sequence / hidden): 200 tokens over 64 -> 4 slices of 50, and
    the count's all-reduce read back by `.item()` blocks the host before each MLP."""
    scenario = toy.scenario(_patch("auto", sequence=200))
    w = workload_of(scenario)
    assert (w.tiled_mlp_shards, w.tiled_mlp_agreed) == (4, True)
    gate = _mlp(build_modules(scenario.model, w))["gate_proj"]
    assert gate.host_syncs == 1 and gate.kernels == (Gemm(50, 128, 64),) * 4
    fixed = workload_of(toy.scenario(_patch(3, sequence=200)))
    assert (fixed.tiled_mlp_shards, fixed.tiled_mlp_agreed) == (3, False)
    assert workload_of(toy.scenario()).tiled_mlp_shards == 0


def test_zero3_gathers_the_mlp_at_once_where_no_leaf_holds_it(toy):
    """Under ZeRO-3 the three weights are fetched before the first slice and kept until the
    call ends: held by `gate_proj`, hooked before it going forward and before `down_proj`
    going back; inside a leaf (each decoder layer), the leaf's hooks are the only ones."""
    plan = plan_of(toy.scenario(_patch(2)))
    names = [m.name for m in plan.modules]
    gate, down = names.index(f"{MLP}.gate_proj"), names.index(f"{MLP}.down_proj")
    assert plan.tiled[gate] == 3 and len(plan.params[gate]) == 3
    assert plan.forward_hooks[gate] == gate and plan.forward_hooks[down] is None
    assert plan.backward_hooks[down] == gate and plan.backward_hooks[gate] is None
    layered = plan_of(toy.scenario(deep_patch(_patch(2), {"deepspeed": {"zero_optimization": {
        "module_granularity_threshold": 10**9}}})))
    assert layered.tiled == {} and layered.leaves
    stage2 = plan_of(toy.scenario(deep_patch(_patch(2), {"deepspeed": {
        "zero_optimization": {"stage": 2}}})))
    assert stage2.tiled == {}


def deep_patch(tree: dict, patch: dict) -> dict:
    from zerosim.scenario.loader import deep_merge

    return deep_merge(tree, patch)


def _host_stack(share: float) -> dict:
    return {"host": {"fetch_hook_us": {"value": 100, "basis": "assumed", "source": "test"},
                     "repeat_hook_share": {"value": share, "basis": "assumed",
                                           "source": "test"}}}


def test_every_slice_pays_the_hooks_again(toy):
    """Hooks of 100 us, a repeat at half of it, the toy GPU's work next to nothing: with 2
    slices each MLP's forward pays 3 repeats more (2 layers: +300 us) and its backward 9
    (+900 us) than the untiled forward's and backward's."""
    def phases(shards):
        patch = deep_patch({"runtime": {"framework": _host_stack(0.5)}}, _patch(shards))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = toy.run(patch)
        spans = result.phases
        rows = spans[spans["rank"] == 0]
        return {phase: float((rows.end_s - rows.start_s)[rows.phase == phase].sum())
                for phase in (Phase.FORWARD, Phase.BACKWARD)}

    plain, tiled = phases(None), phases(2)
    assert tiled[Phase.FORWARD] - plain[Phase.FORWARD] == pytest.approx(300e-6, abs=1e-7)
    assert tiled[Phase.BACKWARD] - plain[Phase.BACKWARD] == pytest.approx(900e-6, abs=1e-7)


@pytest.mark.parametrize(("patch", "match"), [
    (_patch(2, version="0.16.9"), r"unset before DeepSpeed 0\.17\.0"),
    (deep_patch(_patch(2), {"runtime": {"framework": {"modules": {"gate_up": "fused"}}}}),
     "gate and up projections are one module"),
    (deep_patch(_patch(2), {"model": {"model_type": "gpt2", "hidden_act": "gelu_new"}}),
     "without a gated MLP"),
])
def test_refused_where_the_tiled_forward_cannot_run(toy, patch, match):
    with pytest.raises(UnsupportedConfigError, match=match):
        toy.scenario(patch)


@pytest.mark.parametrize("shards", [0, -1, "many", 2.0, True, 4097])
def test_the_count_is_a_whole_number_or_auto(toy, shards):
    with pytest.raises(ScenarioError, match="tiled_mlp_shards"):
        toy.scenario(_patch(shards))


def test_sensitivity_offers_the_repeat_share_where_hooks_repeat():
    """`host.repeat_hook_share` is a value of a run that tiles its MLP under ZeRO-3, and
    nothing else reads it."""
    from zerosim.scenario import load_scenario
    from zerosim.sensitivity import candidates

    path = "scenarios/llama8b_ulysses_dgx_h100.yaml"
    key = "stack.host.repeat_hook_share"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tiled = load_scenario(path, ["runtime.tiled_mlp_shards=auto"])
        plain = load_scenario(path)
    offered = {c.key: c for c in candidates(tiled, 0.1)}
    assert offered[key].value == 0.8 and offered[key].basis == "measured"
    assert key not in {c.key for c in candidates(plain, 0.1)}


def test_a_short_reuse_distance_is_a_warning(toy):
    """Between two slices a projection waits for the other two (2 x 64 x 128 parameters):
    with `stage3_max_reuse_distance` at or below that, DeepSpeed gathers it again every
    slice, which zerosim does not replay."""
    from zerosim.scenario.support import TilingWarning

    short = deep_patch(_patch(2), {"deepspeed": {"zero_optimization": {
        "stage3_max_reuse_distance": 2 * 64 * 128}}})
    with pytest.warns(TilingWarning, match="gathers each projection again every slice"):
        toy.scenario(short)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TilingWarning)
        toy.scenario(deep_patch(short, {"deepspeed": {"zero_optimization": {
            "stage3_max_reuse_distance": 2 * 64 * 128 + 1}}}))
