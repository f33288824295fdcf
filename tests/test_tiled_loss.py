"""DeepSpeed's TiledFusedLogitsLoss (`runtime.tiled_loss_shards`, 0.17.4+), as Arctic Long
Sequence Training's trainer calls it: the output layer and the loss over slices of the tokens,
each slice's backward inside the forward, the hidden states' gradient all that is kept."""

from __future__ import annotations

import pytest

from zerosim.engine.plan import plan_of, workload_of
from zerosim.errors import UnsupportedConfigError
from zerosim.models.breakdown import MemoryPass, Workload, auto_loss_shards, build_modules
from zerosim.models.kernels import Gemm


def _patch(shards, *, version: str = "0.19.5", **rest) -> dict:
    return {"runtime": {"deepspeed_version": version, "tiled_loss_shards": shards}, **rest}


def _head(modules):
    return {m.name: m for m in modules if m.name in ("lm_head", "loss")}


def test_the_automatic_count_is_a_gib_of_fp32_logits_a_slice():
    assert auto_loss_shards(16384, 128256) == 8  # 7.8 GiB of fp32 logits
    assert auto_loss_shards(2048, 128256) == 1
    assert auto_loss_shards(2**30 // (4 * 256), 256) == 1


def test_each_slice_runs_its_product_loss_and_backward_in_the_forward(toy):
    """Toy Llama (hidden 64, vocabulary 256, 8 tokens, fp16) in 2 slices of 4 rows: the
    output layer's two products, no backward of its own; the loss zeroes the hidden states'
    gradient (1,024 B), then per slice its kernels (10 B a logit) and their backward (twice),
    the output layer's two backward products, the slice's input gradient added (3 x 2 x 64 x
    4 B), and after the first slice the weight's gradient accumulated (3 x 2 x 64 x 256 B)."""
    spec = toy.scenario().model
    plain = _head(build_modules(spec, Workload(8)))
    tiled = _head(build_modules(spec, Workload(8, tiled_loss_shards=2)))
    head, loss = tiled["lm_head"], tiled["loss"]
    assert head.kernels == (Gemm(4, 256, 64),) * 2
    assert (head.saved_bytes, head.backward_kernels, head.backward_in_forward) == (0, (), True)
    assert head.repeated_hooks == (3, 0)  # the second slice's forward, both slices' backward
    assert head.model_flops == plain["lm_head"].model_flops
    slice_work = [MemoryPass(10 * 4 * 256, 1, 5 * 4 * 256),
                  MemoryPass(20 * 4 * 256, 1, 10 * 4 * 256),
                  Gemm(4, 64, 256), Gemm(64, 256, 4), MemoryPass(3 * 2 * 64 * 4)]
    assert list(loss.kernels) == [MemoryPass(1024), *slice_work, *slice_work,
                                  MemoryPass(3 * 2 * 64 * 256, 1)]
    # kept for the backward: the hidden states' gradient, not the logits (2 + 6 B a logit)
    assert loss.saved_bytes == 1024 and plain["loss"].saved_bytes == 6 * 256 * 8
    # a slice's logits (2 B), what the loss keeps of them (6 B), and the weight's gradient
    assert loss.transient_bytes == 8 * 256 * 4 + 2 * 64 * 256
    assert loss.backward_kernels == (MemoryPass(2 * 2 * 64 * 8),)
    # `if grads[0] != 1.0` reads the loss's gradient back before scaling by it
    assert (loss.backward_host_syncs, plain["loss"].backward_host_syncs) == (1, 0)


def test_the_output_layer_fires_no_hook_in_the_backward(toy):
    plan = plan_of(toy.scenario(_patch(2)))
    names = [m.name for m in plan.modules]
    head, loss = names.index("lm_head"), names.index("loss")
    assert plan.forward_hooks[head] == head and plan.backward_hooks[head] is None
    assert plan.backward_hooks[loss] is None
    # gathered through the loss's slices, which run its backward products
    assert plan.tiled[head] == 1 and plan.modules[head].keeps_gathered_for == 1
    assert plan_of(toy.scenario()).backward_hooks[head] == head


def test_auto_counts_the_ranks_tokens(toy):
    scenario = toy.scenario(_patch("auto", sequence_length=2**21))
    assert workload_of(scenario).tiled_loss_shards == 2  # 2 Mi tokens x 256 x 4 B = 2 GiB
    assert workload_of(toy.scenario(_patch(3))).tiled_loss_shards == 3
    assert workload_of(toy.scenario()).tiled_loss_shards == 0


def test_hooks_repeat_for_each_slice(toy):
    """Hooks of 100 us, a repeat at half of it, the toy GPU's work next to nothing: 2 slices
    make the output layer's hooks fire 3 times more in the forward (+150 us); the backward
    fires none of its hooks (-100 us). The loss's backward work moves into the forward with
    them: under a microsecond on the toy GPU."""
    import warnings

    from zerosim.vocabulary import Phase

    host = {"host": {"fetch_hook_us": {"value": 100, "basis": "assumed", "source": "test"},
                     "repeat_hook_share": {"value": 0.5, "basis": "assumed",
                                           "source": "test"}}}

    def phases(shards):
        patch = {"runtime": {"framework": host, "deepspeed_version": "0.19.5",
                             "tiled_loss_shards": shards}}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rows = toy.run(patch).phases
        rows = rows[rows["rank"] == 0]
        return {phase: float((rows.end_s - rows.start_s)[rows.phase == phase].sum())
                for phase in (Phase.FORWARD, Phase.BACKWARD)}

    plain, tiled = phases(None), phases(2)
    assert tiled[Phase.FORWARD] - plain[Phase.FORWARD] == pytest.approx(150e-6, abs=1e-6)
    assert tiled[Phase.BACKWARD] - plain[Phase.BACKWARD] == pytest.approx(-100e-6, abs=1e-6)


@pytest.mark.parametrize(("patch", "match"), [
    (_patch(2, version="0.17.3"), r"unset before DeepSpeed 0\.17\.4"),
    (_patch(2, model={"tie_word_embeddings": True}), "tied to the embeddings"),
    (_patch(2, runtime={"deepspeed_version": "0.19.5", "tiled_loss_shards": 2, "framework": {
        "modules": {"output_weight": "external"}}}), "reads the output weight itself"),
])
def test_refused_where_zerosim_does_not_replay_it(toy, patch, match):
    with pytest.raises(UnsupportedConfigError, match=match):
        toy.scenario(patch)


def test_the_shipped_alst_scenario_fits_only_with_its_tricks():
    """`scenarios/llama8b_alst_dgx_h100.yaml`: 1M tokens over a DGX H100's eight GPUs fit with
    the tiled MLP, the tiled loss and the block inputs in host memory, and do not with Ulysses
    alone (the logits of 128K tokens a rank)."""
    import warnings

    from zerosim.api import simulate_summary

    path = "scenarios/llama8b_alst_dgx_h100.yaml"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        alst = simulate_summary(path)
        alone = simulate_summary(path, ["runtime.tiled_mlp_shards=null",
                                        "runtime.tiled_loss_shards=null",
                                        "runtime.checkpoint_in_cpu=false"])
    assert alst["status"] == "ok" and alst["peak_hbm_GiB"] < 40
    assert alone["status"] == "oom"


def test_check_names_the_slices(toy, tmp_path):
    """`zerosim check --json` gives the slices the run uses (`auto` resolved) under `tiling`,
    and the resolved scenario keeps the keys as given."""
    patch = {"runtime": {"deepspeed_version": "0.19.5", "tiled_loss_shards": "auto",
                         "tiled_mlp_shards": 2}}
    shown = toy.check_json(patch, tmp_path)
    assert shown["tiling"] == {"mlp_shards": 2, "mlp_agreed": False, "loss_shards": 1}
    assert shown["runtime"]["tiled_loss_shards"] == "auto"
    assert shown["runtime"]["tiled_mlp_shards"] == 2
    assert "tiling" not in toy.check_json({}, tmp_path)
