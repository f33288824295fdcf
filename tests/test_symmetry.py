"""Node symmetry: with every node full, the engine simulates node 0 alone. Its tables must equal
the full simulation's rows for node 0's ranks and devices, bit for bit, and the summary (which
covers every rank: iteration, phases, peaks, PCIe totals) must equal the full one exactly."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import zerosim
from zerosim.engine.simulate import run_engine, simulated_ranks
from zerosim.results import build_result

SEED003 = Path(__file__).resolve().parents[1] / "scenarios" / "seed003" / "roberta10b_p4d64.yaml"
Z = "deepspeed.zero_optimization."
SMALL = {"model.num_hidden_layers": 2}
OFFLOAD = {Z + "offload_optimizer.device": "cpu", Z + "offload_optimizer.pin_memory": True}


def _node0(full: pd.DataFrame, table: str, ranks: set[int], devices: set[str]) -> pd.DataFrame:
    if table in ("spans", "phases"):
        kept = full["rank"].isin(ranks)
    elif table == "memory":
        kept = full.device.isin(devices)
    else:
        kept = full.resource.str.split(".").str[0].isin(devices)
    return full[kept].reset_index(drop=True)


def assert_folding_exact(scenario: zerosim.Scenario, nodes: int) -> None:
    folded_raw = run_engine(scenario)
    full_raw = run_engine(scenario, fold=False)
    assert folded_raw.copies == nodes and full_raw.copies == 1
    folded, full = build_result(folded_raw), build_result(full_raw)
    assert folded.summary == full.summary
    per_node = scenario.hardware.gpus_per_node
    ranks = set(range(per_node))
    assert set(folded.phases["rank"]) == ranks
    assert set(full.phases["rank"]) == set(range(scenario.data_parallel))
    devices = set(folded.capacities)
    assert devices == {f"gpu{g}" for g in range(per_node)} | {"host0"}
    assert {d: full.capacities[d] for d in devices} == folded.capacities
    assert {d: full_raw.peaks[d] for d in devices} == folded_raw.peaks
    for table in ("spans", "phases", "memory", "links"):
        pd.testing.assert_frame_equal(_node0(getattr(full, table), table, ranks, devices),
                                      getattr(folded, table), check_exact=True)


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
    assert_folding_exact(zerosim.load_scenario(SEED003, overrides), nodes)


@pytest.mark.parametrize("per_node", [1, 2])
def test_toy_nodes_fold_exactly(toy, per_node):
    tree = toy.tree({"hardware": {"nodes": 3, "gpu": {"per_node": per_node,
                                                      "numa_domain": [0] * per_node}},
                     "deepspeed": {"gradient_accumulation_steps": 2}}, gpus=3 * per_node)
    assert_folding_exact(zerosim.scenario_from_dict(tree, source="<toy>"), 3)


def test_a_partly_filled_node_is_simulated_whole():
    scenario = zerosim.load_scenario(SEED003, {**SMALL, "data_parallel": 12})
    assert simulated_ranks(scenario) == 12
    raw = run_engine(scenario)
    assert raw.copies == 1
    assert {row[0] for row in raw.phases.rows} == set(range(12))


def test_one_node_and_unfolded_runs_simulate_every_rank():
    scenario = zerosim.load_scenario(SEED003, {**SMALL, "data_parallel": 8})
    assert simulated_ranks(scenario) == 8
    assert simulated_ranks(zerosim.load_scenario(SEED003, {**SMALL, "data_parallel": 16}),
                           fold=False) == 16
