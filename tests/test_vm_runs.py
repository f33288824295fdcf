"""Real DeepSpeed 0.19.5 ZeRO-3 offload runs on the lent H200 VM: the data as the probe recorded
it, the scenarios that replay them, and the cells computed as `zerosim run` computes a run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from zerosim.api import load_scenario, simulate
from zerosim.models.breakdown import total_params
from zerosim.shipped import CHECKOUT
from zerosim.units import GiB
from zerosim.validation.validate import h200_vm_run_cells
from zerosim.validation.vm_runs import load_vm_runs
from zerosim.vocabulary import Phase

RUNS = load_vm_runs()
RECORDS = [CHECKOUT / "benchmarks" / "node_probe" / f"h200_ds_offload{suffix}_2026-12-04.jsonl"
           for suffix in ("", "_hooks")]


def probe_records() -> dict[str, dict]:
    return {record["run"]: record for path in RECORDS
            for record in map(json.loads, path.read_text().splitlines())}


def test_the_data_file_holds_the_probe_records_after_the_first_two_iterations():
    records = probe_records()
    for run in RUNS.runs:
        timed = [row for row in records[run.name]["iterations"] if row["iteration"] >= 2]
        assert run.phase_samples_s[Phase.FORWARD] == tuple(round(r["forward_s"], 3)
                                                           for r in timed)
        if Phase.UPDATE in run.phase_samples_s:
            assert run.phase_samples_s[Phase.UPDATE] == tuple(round(r["step_s"], 3)
                                                              for r in timed)
        assert run.cpu_adam_samples_s == tuple(round(sum(r["adam_calls_s"]), 3) for r in timed
                                               if r["adam_calls_s"])
        assert run.forward_peak_allocated_bytes / GiB == pytest.approx(
            timed[-1]["forward_peak_allocated_B"] / GiB, abs=0.005)


def test_each_scenario_builds_the_model_and_config_the_probe_ran():
    records = probe_records()
    for run in RUNS.runs:
        scenario = load_scenario(run.scenario)
        record = records[run.name]
        assert total_params(scenario.model) == record["parameters"]
        assert scenario.hardware.name == "h200-vm"
        assert scenario.deepspeed.train_micro_batch_size_per_gpu == record["micro_batch"]
        assert scenario.sequence_length == record["seq"]


def test_the_phase_is_the_median_of_the_timed_iterations():
    run = RUNS.runs[0]
    samples = sorted(run.phase_samples_s[Phase.FORWARD])
    assert run.phase_s(Phase.FORWARD) == pytest.approx((samples[1] + samples[2]) / 2)


def test_the_cells_are_computed_as_a_run_is():
    cells = h200_vm_run_cells()
    run = RUNS.runs[0]
    summary = simulate(load_scenario(run.scenario)).summary
    (update,) = [c for c in cells if c.case == run.name and c.quantity.startswith("update")]
    assert update.simulated == summary["phases_s"]["update"]
    assert update.measured == run.phase_s(Phase.UPDATE)
    assert update.status in {"pass", "fail"}
    assert {c.case for c in cells} == {r.name for r in RUNS.runs}


def test_the_host_cell_is_the_nodes_level_as_the_step_ends():
    """The 128-token run offloads nothing: as its step ends the node holds the VM's OS (0.58 GiB,
    h200-vm) and the rank's process (2.1 GiB, the hf stack), nothing else."""
    (cell,) = [c for c in h200_vm_run_cells() if c.case == "tinyllama_hooks"
               and c.quantity == "node host memory in use after the step"]
    assert cell.simulated == pytest.approx(0.58 + 2.1, abs=1e-9)
    assert cell.measured == 2.2


@pytest.mark.parametrize("run", [r.name for r in RUNS.runs])
def test_the_probe_scenario_script_rebuilds_each_committed_scenario(run):
    """benchmarks/node_probe/ds_offload_scenario.py turns a record into the scenario a user
    runs on their own node: for these records it gives the committed scenarios, key by key."""
    records = next(path for path in RECORDS
                   if any(json.loads(line)["run"] == run for line in path.read_text().splitlines()))
    script = CHECKOUT / "benchmarks" / "node_probe" / "ds_offload_scenario.py"
    made = subprocess.run([sys.executable, str(script), str(records), run, "--hardware",
                           "h200-vm"], capture_output=True, text=True, check=True).stdout
    committed = yaml.safe_load((CHECKOUT / "scenarios" / "h200_vm" / f"{run}.yaml").read_text())
    assert yaml.safe_load(made) == committed
