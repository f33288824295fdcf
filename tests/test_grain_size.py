"""PyTorch's CPU ops below its grain size run in the calling thread, with no OpenMP parallel
region (`at::parallel_for`), so they wait at no join however oversubscribed the node is."""

from __future__ import annotations

import pytest

import zerosim

STUDY = "scenarios/llama13b_dp4.yaml"


def test_a_cast_below_pytorchs_grain_size_runs_in_the_calling_thread():
    """The study's DP=4 (four unbound pools oversubscribe the node, each parallel region
    waiting at its join): a norm's partition, 1,280 elements, is below PyTorch's grain size,
    so its boundary cast runs in the calling thread with no region: 1,280 x 6 B at one
    thread's elementwise rate, to the picosecond; the projections' casts pay the join."""
    from zerosim.engine.software import PYTORCH_GRAIN_SIZE

    result = zerosim.simulate(STUDY, {"model.num_hidden_layers": 2})
    spans = result.spans
    casts = spans[(spans["rank"] == 0) & (spans.op_kind == "cast")
                  & (spans.phase == "backward")]
    norm = casts[casts.op == "cast fp16→fp32 layers.0.input_layernorm"].iloc[0]
    elements = 5120 // 4
    assert elements < PYTORCH_GRAIN_SIZE
    rate = zerosim.load_scenario(STUDY).hardware.elementwise_Bps_per_thread
    assert norm.end_s - norm.start_s == pytest.approx(elements * 6 / rate, rel=1e-9)
    region = 1.28e-3
    down = casts[casts.op == "cast fp16→fp32 layers.0.mlp.down_proj"].iloc[0]
    assert down.end_s - down.start_s > region
