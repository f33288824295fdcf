"""Hugging Face's blog's Ulysses runs of Qwen3-4B on H100s (data/hf_ulysses_blog.yaml) against
zerosim's replay: the published peaks per rank, the configuration they identify, and the run
that did not fit."""

from __future__ import annotations

import pytest

import zerosim
from zerosim.validation.ulysses_blog import load_blog_runs
from zerosim.validation.validate import MEMORY_TOLERANCE


@pytest.fixture(scope="module")
def cells(validation_cells):
    """`ulysses_blog_cells()` as `zerosim validate` computes them."""
    group = load_blog_runs().group
    return [c for c in validation_cells if c.group == group]


def _by(cells, quantity):
    return [c for c in cells if c.quantity == quantity]


def test_the_runs_are_the_posts_table_on_the_scenario():
    blog = load_blog_runs()
    assert [(r.gpus, r.sequence_parallel, r.sequence_length) for r in blog.runs] == [
        (1, 1, 8192), (4, 4, 8192), (4, 4, 32768), (4, 4, 65536), (4, 4, 98304),
        (4, 4, 131072)]
    assert [r.name for r in blog.runs][:2] == ["1 GPU, no SP, 8K tokens",
                                               "4 GPUs, SP=4, 8K tokens"]
    scenario = zerosim.load_scenario(blog.scenario, blog.runs[1].overrides())
    assert scenario.model.num_hidden_layers == 36 and scenario.deepspeed.train_batch_size == 8
    assert scenario.deepspeed.offload_optimizer.device == "none"
    stated = zerosim.load_scenario(blog.scenario, blog.stated_overrides)
    assert stated.deepspeed.offload_optimizer.device == "cpu"


def test_the_peaks_per_rank_are_met_with_the_optimizer_on_the_gpus(cells):
    """Every published peak within 3% (judged at 10%), as allocated memory: the activations'
    growth with the sequence under Ulysses, ZeRO-3's partitions over the four ranks and the one
    GPU's whole model states."""
    judged = _by(cells, "peak GPU memory per rank")
    assert [c.status for c in judged] == ["pass"] * 5
    assert {c.tolerance for c in judged} == {MEMORY_TOLERANCE}
    assert [round(100 * c.rel_error, 1) for c in judged] == [-0.1, -2.4, -2.8, -2.0, -1.6]


def test_with_the_optimizer_offloaded_as_the_post_states_every_peak_is_low_by_its_states(cells):
    """The post's stated configuration, reported: each measured peak 52.5 GiB (one GPU) and
    13.6-14.1 GiB (four) above it, about what the optimizer's states on the GPUs add, 14 B for
    each of Qwen3-4B's 4,022,468,096 parameters over the GPUs (52.4 and 13.1 GiB)."""
    on_gpus = _by(cells, "peak GPU memory per rank")
    offloaded = _by(cells, "peak GPU memory per rank, the optimizer offloaded")
    assert {c.status for c in offloaded} == {"reported"}
    assert [round(c.measured - c.simulated, 1) for c in offloaded] == [
        52.5, 13.6, 14.1, 14.1, 14.1]
    states = [round(g.simulated - o.simulated, 1) for g, o in zip(on_gpus, offloaded,
                                                                  strict=True)]
    assert states == [round(14 * 4022468096 / gpus / 2**30, 1) for gpus in (1, 4, 4, 4, 4)]


def test_128k_tokens_does_not_fit_and_needs_what_the_post_says(cells):
    (needed,) = _by(cells, "GPU memory per rank the run needs (out of memory)")
    assert needed.status == "reported" and "status oom" in needed.note
    assert needed.measured == pytest.approx(81.0)
    assert round(needed.simulated, 1) == 80.4


def test_tokens_per_second_are_reported_not_judged(cells):
    throughput = _by(cells, "tokens per second")
    assert len(throughput) == 4 and {c.status for c in throughput} == {"reported"}
    assert [c.measured for c in throughput] == [3633, 3933, 7733, 13396]
