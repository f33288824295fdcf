"""The MLP-Offload baselines on the study's H100 node: read as logged, replayed with the optimizer
on NVMe, and shipped as calibration files that match what the module writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from zerosim.scenario import scenario_from_dict
from zerosim.units import GiB
from zerosim.validation.mlp_offload import load_runs, write_calibration_files

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "scenarios" / "calibration"


def test_four_runs_smallest_first_with_steady_state_means():
    runs = load_runs()
    assert [r.run.params for r in runs] == [44278226944, 48163722240, 68605452288,
                                            105885147136]
    narrow = runs[1]
    assert (narrow.run.num_layers, narrow.run.hidden_size) == (128, 5120)
    # the warm-up iteration (867.31 ms) is left out: (735.59 + 627.22 + 627.62 + 625.18) / 4
    assert narrow.seconds["forward"] == pytest.approx(0.6539025, rel=1e-12)
    assert narrow.peak_allocated_bytes == 31.27 * GiB
    assert [r.buffer_count for r in runs] == [56, 64, 50, 36]
    # each iteration less its forward, backward and step: 242891.8 - 735.59 - 28143.29 -
    # 213447.88 = 565.04 ms, then 525.75, 541.94 and 540.45
    assert narrow.between_phases_s == pytest.approx((565.04 + 525.75 + 541.94 + 540.45) / 4000,
                                                    rel=1e-9)
    # one memory report, backward marker to "Engine before backward", warm-up left out
    assert narrow.memory_report_s == pytest.approx((69.7 + 70.4 + 70.6 + 70.7) / 4000, rel=1e-9)


def test_each_run_is_a_valid_nvme_scenario_on_the_study_node():
    for run in load_runs():
        scenario = scenario_from_dict(run.scenario(), source=run.log)
        offload = scenario.deepspeed.offload_optimizer
        assert scenario.hardware.name == "h100-jlse"
        assert (offload.device, offload.buffer_count) == ("nvme", run.buffer_count)
        assert offload.pipeline_read and offload.pipeline_write
        assert scenario.deepspeed.aio.thread_count == 4
        assert scenario.runtime.bind_cores_to_rank
        assert scenario.data_parallel == 4


def test_the_shipped_calibration_files_are_what_the_module_writes(tmp_path):
    table = write_calibration_files(tmp_path)
    assert table.read_text() == (SHIPPED / "h100_nvme_runs.csv").read_text()
    for written in (tmp_path / "h100_nvme").iterdir():
        assert written.read_text() == (SHIPPED / "h100_nvme" / written.name).read_text()
