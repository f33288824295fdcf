"""What a node's host memory holds besides training's allocations: its OS and services once per
node (`host.os_resident_GiB`), each rank's processes besides their tensors (the stack's
`processes.rank_resident_GiB`), both read off the Polaris runs by `fit_resident`."""

from __future__ import annotations

import pytest

import zerosim
from zerosim.hardware.profile import load_profile
from zerosim.stacks import load_stack
from zerosim.tune import memory_floor
from zerosim.units import GiB
from zerosim.validation.host_memory import fit_resident
from zerosim.vocabulary import Category

DP4 = "scenarios/llama13b_dp4.yaml"
OS_BYTES = 4 * GiB  # h100-jlse's
POLARIS_OS_BYTES = round(16.4 * GiB)
RANK_BYTES = round(3.1 * GiB)


def _host_at_start(result, device: str = "host0") -> dict[str, int]:
    memory = result.memory
    host = memory[(memory.device == device) & (memory.t_s == 0)]
    return host.groupby("category").bytes.last().to_dict()


def test_a_node_holds_its_os_once_and_each_of_its_ranks_its_processes():
    held = _host_at_start(zerosim.simulate(DP4))
    assert held[Category.OS.value] == OS_BYTES
    assert held[Category.RANK_PROCESSES.value] == 4 * RANK_BYTES == 4 * 3_328_599_654


def test_every_node_of_a_folded_run_holds_its_os_once():
    result = zerosim.simulate("scenarios/polaris_2nodes.yaml")
    assert result.summary["nodes"] == 2
    held = _host_at_start(result)
    assert held[Category.OS.value] == POLARIS_OS_BYTES == 17_609_365_914
    assert held[Category.RANK_PROCESSES.value] == 4 * RANK_BYTES


def test_without_them_host_memory_is_what_training_holds():
    full = zerosim.simulate(DP4)
    bare = zerosim.simulate(DP4, {"hardware.host.os_resident_GiB": 0,
                                  "stack.processes.rank_resident_GiB": 0})
    assert Category.OS.value not in _host_at_start(bare)
    added = (full.summary["peak_host_GiB"] - bare.summary["peak_host_GiB"]) * GiB
    assert added == pytest.approx(OS_BYTES + 4 * RANK_BYTES, abs=1)
    assert full.summary["iteration_s"] == bare.summary["iteration_s"]


def test_a_node_too_small_for_its_os_is_a_result_not_a_crash():
    result = zerosim.simulate(DP4, {"hardware.host.memory_GiB": 3})
    assert result.summary["status"] == "oom"
    assert result.summary["oom"]["category"] == Category.OS.value


def test_tunes_memory_floor_counts_them_as_the_engine_does():
    scenario = zerosim.load_scenario(DP4)
    bare = zerosim.load_scenario(DP4, {"hardware.host.os_resident_GiB": 0,
                                       "stack.processes.rank_resident_GiB": 0})
    assert memory_floor(scenario)[1] - memory_floor(bare)[1] == pytest.approx(
        OS_BYTES + 4 * RANK_BYTES, abs=4)


def test_the_shipped_values_are_what_the_polaris_runs_give():
    fit = fit_resident(workers=1)
    node = load_profile("polaris-a100").provenance["host.os_resident_GiB"]
    rank = load_stack("megatron-deepspeed").provenance["processes.rank_resident_GiB"]
    assert (node.basis, rank.basis) == ("fitted", "fitted")
    assert (round(fit.node_GiB, 1), round(fit.rank_GiB, 1)) == (node.value, rank.value)
    assert round(100 * fit.node_stderr_GiB / fit.node_GiB) == round(100 * node.stderr) == 13
    assert round(100 * fit.rank_stderr_GiB / fit.rank_GiB) == round(100 * rank.stderr) == 29
    assert fit.configurations == 29
