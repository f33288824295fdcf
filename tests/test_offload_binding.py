"""DeepSpeed's ZeRO-2 Offload timings on a DGX A100 (its core-binding study): the data, the
timed span and the reported cells."""

from __future__ import annotations

from statistics import fmean

import pytest

from zerosim.api import load_scenario, simulate_summary
from zerosim.models.breakdown import total_params
from zerosim.shipped import CHECKOUT
from zerosim.validation.offload_binding import load_offload_study, timed_step_s
from zerosim.validation.validate import offload_binding_cells

STUDY = load_offload_study()


def test_the_published_means_are_the_means_of_their_runs():
    """The blog's 'Average' column is the mean of its three runs (to the millisecond)."""
    for run in STUDY.runs:
        if run.runs_s:
            assert fmean(run.runs_s) == pytest.approx(run.step_s, abs=5e-4)


def test_every_ratio_names_two_runs():
    names = {run.name for run in STUDY.runs}
    assert all({r.over, r.under} <= names for r in STUDY.ratios)


@pytest.mark.parametrize(("stem", "params"), [("qwen2.5-3b", 3_085_938_688),
                                              ("qwen2.5-1.5b", 1_543_714_304)])
def test_the_scenarios_build_the_published_models(stem, params):
    """Qwen2.5-3B and -1.5B as their config.json builds them (tied embeddings, Q/K/V biases)."""
    scenario = load_scenario(CHECKOUT / "scenarios" / "dgx_a100_offload" / f"{stem}.yaml")
    assert total_params(scenario.model) == params
    assert scenario.hardware.hbm_Bps == 1555e9


def test_the_timed_span_is_the_phases_without_the_work_between_them():
    summary = {"status": "ok", "iteration_s": 9.0,
               "phases_s": {"forward": 0.5, "backward_non_boundary": None,
                            "backward_boundary": 1.25, "update": 2.0}}
    assert timed_step_s(summary) == 3.75
    assert timed_step_s(summary | {"status": "oom"}) is None


def test_the_cells_are_reported_and_computed_as_a_run_is():
    cells = offload_binding_cells()
    assert {cell.status for cell in cells} == {"reported"}
    assert len(cells) == len(STUDY.runs) + len(STUDY.ratios)
    run = STUDY.runs[0]
    expected = timed_step_s(simulate_summary(run.scenario, run.overrides))
    (cell,) = [c for c in cells if c.case == run.name]
    assert cell.simulated == expected
    assert cell.measured == run.step_s
