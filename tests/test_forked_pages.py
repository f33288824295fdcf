"""Data-loader workers forked after the optimizer is built keep, copy-on-write, the pages of the
fp32 master partition that every step rewrites: the node holds that partition twice.

Megatron-DeepSpeed forks its workers (`--num-workers`, default 2) in
`build_train_valid_test_data_iterators`, after `setup_model_and_optimizer`; the HF Trainer
forks none by default. Llama-2-13B has 13,015,864,320 parameters: at DP=4 each rank's
partition is 3,253,966,080 elements, 13,015,864,320 bytes in fp32, and the node's four ranks
52,063,457,280 bytes.
"""

from __future__ import annotations

import pytest

import zerosim
from zerosim.engine.states import Holding, forked_pages
from zerosim.errors import ScenarioError
from zerosim.vocabulary import BufferKind, Category, DeviceKind

DP4 = "scenarios/llama13b_dp4.yaml"
FP32_PARTITIONS = 4 * 13_015_864_320  # the node's four fp32 partitions, bytes
NO_WORKERS = {"stack.processes.dataloader_workers.count": 0}


def _host_at_start(result) -> dict[str, int]:
    memory = result.memory
    host = memory[(memory.device == "host0") & (memory.t_s == 0)]
    return host.groupby("category").bytes.last().to_dict()


@pytest.fixture(scope="module")
def with_and_without_workers():
    return zerosim.simulate(DP4), zerosim.simulate(DP4, NO_WORKERS)


def test_the_workers_keep_the_fp32_partition_as_it_was_before_the_fork(with_and_without_workers):
    forked, alone = with_and_without_workers
    held = _host_at_start(forked)
    assert held[Category.FP32_MASTER.value] == FP32_PARTITIONS == 52_063_457_280
    assert held[Category.FORKED_PAGES.value] == FP32_PARTITIONS
    assert Category.FORKED_PAGES.value not in _host_at_start(alone)
    added = (forked.summary["peak_host_GiB"] - alone.summary["peak_host_GiB"]) * 2**30
    assert added == pytest.approx(FP32_PARTITIONS, rel=1e-12)
    assert forked.summary["iteration_s"] == alone.summary["iteration_s"]


def test_the_hf_trainer_forks_no_workers():
    result = zerosim.simulate(DP4, {"runtime.framework": "hf-transformers"})
    assert Category.FORKED_PAGES.value not in _host_at_start(result)


def _fp32(buffer: BufferKind, device: DeviceKind = DeviceKind.HOST) -> Holding:
    return Holding(device, Category.FP32_MASTER, 1000.0, "fp32 partition", buffer)


def test_only_pageable_host_state_rewritten_after_the_fork_is_kept():
    kept, = forked_pages([_fp32(BufferKind.NONE),
                          Holding(DeviceKind.HOST, Category.OPTIMIZER_STATES, 2000.0, "moments")],
                         workers=2)
    assert (kept.device, kept.category, kept.nbytes) == (DeviceKind.HOST,
                                                         Category.FORKED_PAGES, 1000.0)
    # One old copy however many workers share it; none without workers.
    assert forked_pages([_fp32(BufferKind.NONE)], workers=6)[0].nbytes == 1000.0
    assert forked_pages([_fp32(BufferKind.NONE)], workers=0) == []
    # Pinned memory is mapped shared by the driver, never copied; the GPU's is not the host's.
    assert forked_pages([_fp32(BufferKind.PINNED)], workers=2) == []
    assert forked_pages([_fp32(BufferKind.NONE, DeviceKind.GPU)], workers=2) == []


@pytest.mark.parametrize("value", [-1, 65, 1.5, True])
def test_a_worker_count_out_of_range_is_refused(value):
    with pytest.raises(ScenarioError, match=r"processes\.dataloader_workers\.count: expected "
                                            r"an integer from 0 to 64"):
        zerosim.load_scenario(DP4, {"stack.processes.dataloader_workers.count": value})
