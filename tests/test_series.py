"""Gradient-accumulation series (`zerosim.series`): each time of runs that differ only in
accumulation split into a per-micro-batch and a per-step cost, measured against predicted."""

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from zerosim.cli import main
from zerosim.runs import Prediction, configurations, read_runs_text
from zerosim.series import SERIES_COLUMNS, accumulation_series, fit_line

TABLE = (Path(__file__).resolve().parent.parent / "zerosim" / "validation" / "data"
         / "polaris_zero3_offload_runs.csv")


def _table(rows: list[tuple[int, dict[str, str]]]) -> str:
    """A table of the shipped table's rows (1 = first data row), each with its changes."""
    reader = csv.DictReader(io.StringIO(TABLE.read_text()))
    shipped = dict(enumerate(reader, start=1))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=reader.fieldnames)
    writer.writeheader()
    for row, changes in rows:
        writer.writerow(shipped[row] | changes)
    return out.getvalue()


def _run(ga: int, backward_ms: float, **changes: str) -> tuple[int, dict[str, str]]:
    """Row 15 (5.9B, DP=1, micro-batch 4) at accumulation `ga`, measuring `backward_ms`."""
    return 15, {"grad_accum_steps": str(ga), "bwd_ms_mean": str(backward_ms), **changes}


def _predicted(table: str, backward) -> list[Prediction]:
    """Each configuration of `table` with a backward of `backward(accumulation)` seconds."""
    return [Prediction(c, c.first.name, 1, "ok",
                       {"backward": backward(c.first.grad_accum_steps)})
            for c in configurations(read_runs_text(table, "t.csv"))]


def test_a_least_squares_line_through_points_on_it_is_that_line():
    line = fit_line([1, 2, 4, 8], [7.0, 9.0, 13.0, 21.0])
    assert (line.per_micro_batch_s, line.per_step_s) == pytest.approx((2.0, 5.0), rel=1e-12)


def test_a_series_splits_each_time_into_per_micro_batch_and_per_step():
    """Measured backward 5 s per step + 2 s per micro-batch (the two accumulation-1 runs,
    6.9 and 7.1 s, straddle the line's 7 s and leave it where it is); predicted 4 + 2.5 x
    accumulation: 25% too much per micro-batch, 1 s too little per step."""
    table = _table([_run(1, 6900), _run(1, 7100), _run(2, 9000), _run(4, 13000)])
    series, = accumulation_series(_predicted(table, lambda ga: 4.0 + 2.5 * ga))
    assert series.name == "5.90b-dp1-mb4-ga1..4-sg1e08"
    assert (series.steps, series.runs) == ((1, 2, 4), 4)
    split, = series.splits
    assert split.quantity == "backward"
    assert (split.measured.per_micro_batch_s, split.measured.per_step_s) == pytest.approx(
        (2.0, 5.0), rel=1e-12)
    assert (split.predicted.per_micro_batch_s, split.predicted.per_step_s) == pytest.approx(
        (2.5, 4.0), rel=1e-12)
    assert split.error_per_micro_batch == pytest.approx(0.25, rel=1e-12)
    assert split.difference_per_step_s == pytest.approx(-1.0, rel=1e-12)


def test_two_accumulation_counts_or_another_setting_make_no_series():
    """Two counts fix a line and test nothing; a run of another sub_group_size belongs to
    another series."""
    two = _table([_run(1, 7000), _run(2, 9000), _run(4, 13000, sub_group_size="1000000000")])
    assert accumulation_series(_predicted(two, lambda ga: 2.0 * ga)) == []


def test_a_time_some_run_did_not_measure_is_not_split():
    table = _table([_run(1, 7000), _run(2, 9000), _run(4, 13000, bwd_ms_mean="")])
    assert accumulation_series(_predicted(table, lambda ga: 2.0 * ga)) == []


def test_predict_prints_and_writes_the_series_of_a_table(tmp_path):
    """Rows 34, 30 and 31 of the shipped table are the 5.9B DP=1 runs at accumulation 2, 4
    and 8: `zerosim predict` simulates them and splits each time, measured and predicted,
    as numpy's least squares does, and the time between the phases (the iteration less the
    three timed ones) alike."""
    table = tmp_path / "runs.csv"
    table.write_text(_table([(34, {}), (30, {}), (31, {})]))
    picked = list(csv.DictReader(io.StringIO(table.read_text())))
    result = CliRunner().invoke(main, ["predict", str(table), "--hardware", "polaris-a100",
                                       "--workers", "1", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "gradient-accumulation series" in result.output
    assert "5.90b-dp1-mb4-ga2..8-sg1e08" in result.output
    with open(tmp_path / "out" / "series.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == list(SERIES_COLUMNS)
    assert [r["quantity"] for r in rows] == ["forward", "backward", "iteration",
                                             "between phases"]
    ga = [int(r["grad_accum_steps"]) for r in picked]

    def seconds(run: dict[str, str], column: str) -> float:
        return float(run[column]) / 1000

    times = [[seconds(r, c) for r in picked] for c in ("fwd_ms_mean", "bwd_ms_mean",
                                                        "iter_ms_mean")]
    between = [seconds(r, "iter_ms_mean") - seconds(r, "fwd_ms_mean")
               - seconds(r, "bwd_ms_mean") - seconds(r, "step_ms_mean") for r in picked]
    for row, measured in zip(rows, (*times, between), strict=True):
        slope, intercept = np.polyfit(ga, measured, 1)
        assert float(row["measured_per_micro_batch_s"]) == pytest.approx(slope, rel=1e-9)
        assert float(row["measured_per_step_s"]) == pytest.approx(intercept, rel=1e-9)
        assert row["grad_accum_steps"] == "2 4 8" and row["runs"] == "3"
    as_json = CliRunner().invoke(main, ["predict", str(table), "--hardware", "polaris-a100",
                                        "--workers", "1", "--no-files", "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert [s["quantity"] for s in json.loads(as_json.output)["series"]] == [
        "forward", "backward", "iteration", "between phases"]


def test_times_proportional_to_the_accumulation_cost_nothing_per_step():
    """A subtraction's rounding is not a per-step cost: exactly 0.661 s a micro-batch gives a
    per-step cost of exactly zero."""
    line = fit_line([1, 1, 2, 4, 8, 16], [0.661 * ga for ga in (1, 1, 2, 4, 8, 16)])
    assert line.per_step_s == 0.0
    assert line.per_micro_batch_s == pytest.approx(0.661, rel=1e-12)
