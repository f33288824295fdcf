"""Folding: with every node full, the engine simulates node 0 alone; within a node, one rank of
each class of mirror ranks (ranks that a symmetry of the node maps onto one another). The
folded tables, given for every rank (`RawRun.every_rank`), must equal the full simulation's
rows for node 0's ranks and devices bit for bit, and the summary (which covers every rank:
iteration, phases, peaks, PCIe totals) must equal the full one exactly.

The one difference allowed: a node's host memory and drives are shared by mirror ranks, whose
changes a folded run makes one after the other, so within an instant its rows come in another
order (the level of every category at the end of every instant, the number of rows and the
peak are the same)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

import zerosim
from zerosim.api import simulate_brief
from zerosim.engine.memory import NodePool
from zerosim.engine.simulate import folded_classes, run_engine, simulated_ranks
from zerosim.engine.symmetry import rank_classes
from zerosim.hardware.placement import place_ranks
from zerosim.hardware.profile import load_profile
from zerosim.results import build_result
from zerosim.vocabulary import Category

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
SEED003 = SCENARIOS / "seed003" / "roberta10b_p4d64.yaml"
DP4 = SCENARIOS / "llama13b_dp4.yaml"
POLARIS_DP4 = SCENARIOS / "calibration" / "polaris" / "polaris-11.20b-dp4-mb4-ga1-sg1e08.yaml"
POLARIS_DP2 = SCENARIOS / "calibration" / "polaris" / "polaris-5.90b-dp2-mb4-ga1-sg1e08.yaml"
Z = "deepspeed.zero_optimization."
SMALL = {"model.num_hidden_layers": 2}
OFFLOAD = {Z + "offload_optimizer.device": "cpu", Z + "offload_optimizer.pin_memory": True}
JLSE_CLASSES = {0: (0, 3), 1: (1, 2)}
DGX_A100_CLASSES = ((0, 2, 4, 6), (1, 3, 5, 7))
ONE_CLASS = {0: (0, 1, 2, 3)}


def _node0(full: pd.DataFrame, table: str, ranks: set[int], devices: set[str]) -> pd.DataFrame:
    if table in ("spans", "phases"):
        kept = full["rank"].isin(ranks)
    elif table == "memory":
        kept = full.device.isin(devices)
    else:
        kept = full.resource.str.split(".").str[0].isin(devices)
    return full[kept].reset_index(drop=True)


def _by_rank(phases: pd.DataFrame) -> pd.DataFrame:
    """Phases rank by rank, each rank's in the order they ended (ranks ending at one instant
    are recorded in another order when mirror ranks are folded)."""
    return phases.sort_values("rank", kind="stable").reset_index(drop=True)


def _levels(memory: pd.DataFrame, device: str) -> pd.DataFrame:
    """A device's memory rows; for a node's host memory or drives, the level of each category
    at the end of each instant."""
    rows = memory[memory.device == device].reset_index(drop=True)
    if device.startswith("gpu"):
        return rows
    return rows.groupby(["t_s", "category"], sort=True).last().reset_index()


def assert_folding_exact(scenario: zerosim.Scenario, nodes: int = 1,
                         stands_for: dict[int, tuple[int, ...]] | None = None) -> None:
    folded_raw = run_engine(scenario)
    full_raw = run_engine(scenario, fold=False)
    assert folded_raw.node_copies == (nodes,) and set(full_raw.node_copies) == {1}
    assert folded_raw.stands_for == (stands_for or {}) and full_raw.stands_for == {}
    folded, full = build_result(folded_raw), build_result(full_raw)
    assert folded.summary == full.summary
    per_node = min(scenario.hardware.gpus_per_node, scenario.data_parallel)
    ranks = set(range(per_node))
    assert set(folded.phases["rank"]) == ranks
    assert set(full.phases["rank"]) == set(range(scenario.data_parallel))
    devices = set(folded.capacities)
    drives = {"nvme0"} if scenario.hardware.has_nvme else set()
    assert devices == {f"gpu{g}" for g in range(per_node)} | {"host0"} | drives
    assert {d: full.capacities[d] for d in devices} == folded.capacities
    assert {d: full_raw.peaks[d] for d in devices} == folded_raw.every_rank().peaks
    for table in ("spans", "links"):
        pd.testing.assert_frame_equal(_node0(getattr(full, table), table, ranks, devices),
                                      getattr(folded, table), check_exact=True)
    pd.testing.assert_frame_equal(_by_rank(_node0(full.phases, "phases", ranks, devices)),
                                  _by_rank(folded.phases), check_exact=True)
    for device in devices:
        assert (full.memory.device == device).sum() == (folded.memory.device == device).sum()
        pd.testing.assert_frame_equal(_levels(full.memory, device),
                                      _levels(folded.memory, device), check_exact=True)


@pytest.mark.parametrize(("path", "overrides", "copies"), [
    (SEED003, {**SMALL, **OFFLOAD, "data_parallel": 21, "hardware.nodes": 3}, (2, 1)),
    (SCENARIOS / "polaris_2nodes.yaml", {**SMALL, "data_parallel": 14, "hardware.nodes": 4},
     (3, 1)),
])
def test_full_nodes_fold_beside_a_partly_filled_last_one(path, overrides, copies):
    """Node 0 stands for every full node and the last node, partly filled, for itself: the
    summary is the full simulation's, and so is each simulated rank's timeline, the last
    node's ranks numbered after node 0's."""
    scenario = zerosim.load_scenario(path, overrides)
    folded_raw, full_raw = run_engine(scenario), run_engine(scenario, fold=False)
    assert folded_raw.node_copies == copies and set(full_raw.node_copies) == {1}
    folded, full = build_result(folded_raw), build_result(full_raw)
    assert folded.summary == full.summary
    per_node = scenario.hardware.gpus_per_node
    last = scenario.data_parallel - per_node * copies[0]
    assert set(folded.phases["rank"]) == set(range(per_node + last))
    moved = (copies[0] - 1) * per_node
    relabelled = folded.phases.assign(rank=[r if r < per_node else r + moved
                                            for r in folded.phases["rank"]])
    kept = full.phases[full.phases["rank"].isin(set(relabelled["rank"]))]
    pd.testing.assert_frame_equal(_by_rank(kept), _by_rank(relabelled), check_exact=True)


@pytest.mark.parametrize(("overrides", "nodes"), [
    ({**SMALL, "data_parallel": 16}, 2),                                    # ZeRO-3, no offload
    ({**SMALL, "data_parallel": 24, "runtime.deepspeed_version": "0.5.10"}, 3),  # per tensor
    ({**SMALL, **OFFLOAD, "data_parallel": 16}, 2),                         # CPU optimizer
    ({**SMALL, **OFFLOAD, "data_parallel": 16, Z + "offload_param.device": "cpu",
      Z + "offload_param.pin_memory": True}, 2),                            # + parameters
    ({**SMALL, **OFFLOAD, "data_parallel": 16, Z + "stage": 2,
      Z + "offload_optimizer.pin_memory": False, "deepspeed.gradient_accumulation_steps": 2}, 2),
    ({**SMALL, "data_parallel": 16, Z + "stage": 1, "model.hidden_size": 1024,
      "model.intermediate_size": 4096}, 2),                                 # ZeRO-1 on GPUs
])
def test_identical_nodes_fold_exactly(overrides, nodes):
    """p4d-24xlarge, round robin: each node's ranks in two classes, local and remote pages."""
    assert_folding_exact(zerosim.load_scenario(SEED003, overrides), nodes,
                         {0: (0, 2, 5, 7), 1: (1, 3, 4, 6)})


@pytest.mark.parametrize("per_node", [1, 2])
def test_toy_nodes_fold_exactly(toy, per_node):
    tree = toy.tree({"hardware": {"nodes": 3, "gpu": {"per_node": per_node,
                                                      "numa_domain": [0] * per_node}},
                     "deepspeed": {"gradient_accumulation_steps": 2}}, gpus=3 * per_node)
    stands_for = {0: (0, 1)} if per_node == 2 else None
    assert_folding_exact(zerosim.scenario_from_dict(tree, source="<toy>"), 3, stands_for)


@pytest.mark.parametrize(("path", "overrides", "stands_for"), [
    (DP4, {}, JLSE_CLASSES),                      # the study's dp4: local and remote ranks
    (DP4, {"hardware.host.rank_memory_placement": "gpu_local"}, ONE_CLASS),
    (DP4, {"hardware.host.rank_memory_placement": "interleaved"}, ONE_CLASS),
    (DP4, {"hardware.gpu.numa_domain": [0, 1, 1, 1]}, {0: (0,), 1: (1, 3), 2: (2,)}),
    (POLARIS_DP4, {}, ONE_CLASS),                 # four domains, pages interleaved
    (POLARIS_DP2, {}, {0: (0, 1)}),               # two of the node's four GPUs
    (DP4, {"runtime.bind_cores_to_rank": True}, ONE_CLASS),   # each rank on its GPU's domain
    (POLARIS_DP4, {"runtime.bind_cores_to_rank": True}, ONE_CLASS),
    # two domains each, the list's halves: rank 0 on GPU 0's and GPU 1's, rank 1 on GPU 2's
    # and GPU 3's, away from its own GPU's domain: no mirror
    (POLARIS_DP2, {"runtime.bind_cores_to_rank": True}, None),
    (DP4, {Z + "offload_param.device": "cpu", Z + "offload_param.pin_memory": True},
     JLSE_CLASSES),
    (DP4, {Z + "offload_optimizer.pin_memory": False, "deepspeed.gradient_accumulation_steps": 3},
     JLSE_CLASSES),
    (DP4, {Z + "offload_optimizer.device": "nvme", Z + "offload_optimizer.nvme_path": "/nvme",
           Z + "offload_param.device": "nvme", Z + "offload_param.nvme_path": "/nvme"},
     JLSE_CLASSES),
    # Twin-Flow and the GPU update on four sub-groups (the 2-layer model's rank holds 240M)
    (DP4, {Z + "offload_optimizer.ratio": 0.5, Z + "sub_group_size": 5e7}, JLSE_CLASSES),
    (DP4, {Z + "stage": 2}, JLSE_CLASSES),
    (DP4, {"what_if.gpu_update_every": 2, Z + "sub_group_size": 5e7}, JLSE_CLASSES),
    # the copy-back's helper thread, the parameters in one optimizer group (with Megatron's
    # norms apart, the node's host peak depends on the order of the mirror ranks' changes
    # at one instant, so the run is simulated again unfolded: `simulate._exact`)
    (DP4, {"what_if.overlap_copy_back": True, "runtime.deepspeed_version": "0.19.5",
           "activation_checkpointing": True, "stack.optimizer.param_groups.value": "one"},
     JLSE_CLASSES),
])
def test_mirror_ranks_fold_exactly(path, overrides, stands_for):
    assert_folding_exact(zerosim.load_scenario(path, {**SMALL, **overrides}), 1, stands_for)


def test_the_study_dp4_folds_exactly():
    assert_folding_exact(zerosim.load_scenario(DP4), 1, JLSE_CLASSES)


def test_a_summary_only_run_gives_the_phases_of_every_rank():
    scenario = zerosim.load_scenario(DP4, SMALL)
    brief = simulate_brief(scenario)
    assert {row[0] for row in brief.phases.rows} == {0, 1, 2, 3}
    assert brief.summary == zerosim.simulate(scenario, fold=False).summary


def test_the_classes_come_from_the_profile_symmetries():
    def classes(name: str, ranks: int | None = None, **changes) -> tuple[tuple[int, ...], ...]:
        profile = replace(load_profile(name), **changes)
        return rank_classes(profile, place_ranks(profile, ranks or profile.gpus_per_node))

    assert classes("h100-jlse") == ((0, 3), (1, 2))
    assert classes("h100-jlse", 2) == ((0,), (1,))   # rank 0 local, rank 1 remote: no mirror
    assert classes("h100-jlse", rank_memory_placement="gpu_local") == ((0, 1, 2, 3),)
    two_sockets = {"numa_domains": 2, "gpu_numa_domain": (0, 0, 0, 0, 1, 1, 1, 1)}
    assert classes("dgx-a100", **two_sockets) == ((0, 2, 5, 7), (1, 3, 4, 6))
    # NPS4: GPUs 0-1 on domain 3, 2-3 on 1, 4-5 on 7, 6-7 on 5, rank r's home on domain r.
    # Ranks 0, 2, 4, 6 keep their home on a domain without a GPU, 1, 3, 5, 7 on a GPU's.
    assert classes("dgx-a100") == DGX_A100_CLASSES
    assert classes("polaris-a100") == ((0, 1, 2, 3),)
    assert classes("gh200", 2) == ((0,), (1,))       # two nodes: nodes fold whole, if at all
    assert classes("h100-jlse", gpu_numa_domain=(0, 0, 0, 1)) == ((0, 2), (1,), (3,))
    # Eight domains, four of them named: relabelling 0 and 4 maps one GPU pair onto the other.
    assert classes("h100-jlse", numa_domains=8, gpu_numa_domain=(0, 0, 4, 4),
                   rank_memory_placement="gpu_local") == ((0, 1, 2, 3),)
    assert classes("h100-jlse", numa_domains=8, gpu_numa_domain=(0, 0, 4, 5),
                   rank_memory_placement="gpu_local") == ((0, 1), (2, 3))


@pytest.mark.parametrize(("bound", "stands_for"), [
    (False, {0: DGX_A100_CLASSES[0], 1: DGX_A100_CLASSES[1]}),
    # Bound in GPU order, rank r's home is domain 3, 1, 7, 5, 0, 2, 4, 6: ranks 4-7 keep
    # theirs on a domain without a GPU, 2 and 3 on the other pair's GPU domain.
    (True, {0: (0,), 1: (1,), 2: (2, 3), 4: (4, 5, 6, 7)}),
])
def test_a_dgx_a100_node_folds_exactly(bound, stands_for):
    """Eight NUMA domains: the relabelling search finds the node's symmetries where trying
    every permutation (40,320) would cost more than the run."""
    scenario = zerosim.load_scenario(DP4, {**SMALL, "hardware": "dgx-a100", "data_parallel": 8,
                                           "runtime.bind_cores_to_rank": bound})
    assert_folding_exact(scenario, 1, stands_for)


def test_uneven_ranks_and_unfolded_runs_simulate_every_rank():
    partly_filled = zerosim.load_scenario(SEED003, {**SMALL, "data_parallel": 12})
    assert folded_classes(partly_filled) == tuple((r,) for r in range(12))
    dp4 = zerosim.load_scenario(DP4, SMALL)
    assert folded_classes(dp4, fold=False) == ((0,), (1,), (2,), (3,))
    assert run_engine(dp4, fold=False).stands_for == {}
    result = zerosim.simulate(dp4, fold_nodes=False)
    assert set(result.phases["rank"]) == {0, 1, 2, 3}


def test_a_folded_run_that_runs_out_of_host_memory_is_simulated_again_whole():
    """Which allocation fails first depends on the order of mirror ranks' allocations within
    an instant, which a folded run does not keep: the full simulation reports it."""
    scenario = zerosim.load_scenario(DP4, {**SMALL, "hardware.host.memory_GiB": 10})
    raw = run_engine(scenario)
    assert raw.status == "oom" and raw.oom["device"] == "host0"
    assert raw.stands_for == {}
    assert build_result(raw).summary == build_result(run_engine(scenario, fold=False)).summary


def test_a_node_pool_knows_when_its_peak_depends_on_the_order_within_an_instant():
    now = [0.0]
    pool = NodePool("host0", 100, lambda: now[0], None)
    temp = Category.PAGEABLE_TEMPORARIES

    def at(t_s: float, *changes: int) -> None:
        now[0] = t_s
        for change in changes:
            if change > 0:
                pool.allocate(temp, change, "a")
            else:
                pool.free(temp, -change)

    at(0.0, 30)
    at(1.0, -20)
    at(2.0, 10, -10)     # from 10: at most 20 in any order, below the 30 of t=0
    assert pool.order_free and pool.peak == 30
    at(3.0, 25, -10)     # from 10: 35 if the allocation comes first, 25 if the free does
    assert not pool.order_free


def test_one_node_and_unfolded_runs_place_every_rank():
    scenario = zerosim.load_scenario(SEED003, {**SMALL, "data_parallel": 8})
    assert simulated_ranks(scenario) == 8
    assert simulated_ranks(zerosim.load_scenario(SEED003, {**SMALL, "data_parallel": 16}),
                           fold=False) == 16
