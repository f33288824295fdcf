"""LLaMA-Factory's DeepSpeed ZeRO offload runs on RTX 4090s as IST-DASLab's LLMQ repository
timed them (data/llmq_rtx4090.yaml) against zerosim's replay on rtx4090-workstation: the runs
and their scenarios, the single-card runs met, and what the four-card misses need."""

from __future__ import annotations

import pytest

import zerosim
from zerosim.api import simulate_summary
from zerosim.validation.llmq_runs import load_llmq_runs
from zerosim.validation.validate import LLMQ_STEP_TOLERANCE


@pytest.fixture(scope="module")
def cells(validation_cells):
    """`llmq_cells()` as `zerosim validate` computes them."""
    group = load_llmq_runs().group
    return {c.case: c for c in validation_cells if c.group == group}


def test_the_runs_are_the_pages_with_their_step_from_the_elapsed_stamps():
    llmq = load_llmq_runs()
    assert [(r.gpus, r.model, r.stage, r.micro_batch, r.accumulation, r.step_s)
            for r in llmq.runs] == [
        (4, "qwen2.5-3b", 3, 64, 2, 30.0), (4, "qwen2.5-7b", 3, 32, 4, 79.0),
        (4, "qwen2.5-14b", 3, 21, 6, 200.0), (1, "qwen2.5-3b", 2, 48, 11, 101.0),
        (1, "qwen2.5-7b", 3, 32, 16, 210.0), (1, "qwen2.5-14b", 3, 20, 26, 471.0)]
    assert llmq.runs[1].name == "qwen2.5-7b, 4x RTX 4090, ZeRO-3, 32x4"


@pytest.mark.parametrize("index", range(6))
def test_each_run_is_its_stages_scenario_with_the_runs_model_gpus_and_batch(index):
    """The LLaMA-Factory DeepSpeed files verbatim, their "auto" filled as the Trainer fills
    them: 512-528 sequences of 1024 tokens a step, bf16 master weights, the HF stack."""
    llmq = load_llmq_runs()
    run = llmq.runs[index]
    scenario = zerosim.load_scenario(llmq.scenarios[run.stage], run.overrides())
    ds = scenario.deepspeed
    assert (scenario.data_parallel, ds.stage, ds.train_micro_batch_size_per_gpu,
            ds.gradient_accumulation_steps) == (run.gpus, run.stage, run.micro_batch,
                                                run.accumulation)
    assert ds.train_batch_size * scenario.sequence_length in (512 * 1024, 504 * 1024,
                                                             520 * 1024, 528 * 1024)
    assert ds.offload_optimizer.device == "cpu" and ds.offload_optimizer.pin_memory
    assert ds.offload_param.device == ("cpu" if run.stage == 3 else "none")
    assert scenario.hardware.name == "rtx4090-workstation" and scenario.runtime.liger_kernel
    if run.stage == 3:
        hidden = scenario.model.hidden_size
        assert (ds.reduce_bucket_size, ds.stage3_prefetch_bucket_size) == (
            hidden * hidden, int(0.9 * hidden * hidden))


def test_the_single_card_runs_are_met(cells):
    """Nothing fitted on them: the ZeRO-2 3B run +3.5%, ZeRO-3 7B +1.5%, 14B -9.0%."""
    single = [c for case, c in cells.items() if ", 1x RTX 4090," in case]
    assert len(single) == 3 and {c.status for c in single} == {"pass"}
    assert all(c.tolerance == LLMQ_STEP_TOLERANCE for c in single)
    assert [round(c.rel_error * 100, 1) for c in single] == [3.5, 1.5, -9.0]


def test_a_ring_of_about_2_GBps_puts_the_four_card_runs_near_their_times():
    """The four-card misses (known misses in test_validation.py) are what a slow ring gives:
    at 2 GB/s the 7B and 14B runs come within 8%, the 3B within 12%, at the profile's 18
    GB/s they are 16-47% fast (the gathers hide behind the GPUs' work)."""
    llmq = load_llmq_runs()
    errors = []
    for run in llmq.runs[:3]:
        summary = simulate_summary(llmq.scenarios[run.stage],
                                   run.overrides() | {"hardware.nvlink.bus_GBps": 2})
        errors.append(summary["iteration_s"] / run.step_s - 1)
    assert [round(e * 100) for e in errors] == [-12, -8, 0]
