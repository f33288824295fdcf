"""`zerosim predict`: tables of measured runs in the Deep Optimizer States artifact format,
read, turned into scenarios and predicted through the same code path as `zerosim run`."""

import csv
import io
import json
import math
import re
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import invoke_for_table

import zerosim
from zerosim.cli import main
from zerosim.errors import ScenarioError, ScenarioWarning
from zerosim.hardware.profile import load_profile
from zerosim.runs import (
    PREDICTION_COLUMNS,
    configurations,
    per_step_seconds,
    predict,
    prediction_row,
    read_runs,
    read_runs_text,
    run_to_run_sd,
)

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "zerosim" / "validation" / "data" / "polaris_zero3_offload_runs.csv"
MEASURED = ("fwd_ms_mean", "bwd_ms_mean", "step_ms_mean", "iter_ms_mean",
            "smu_train_rank0_peak_Max_MA_GB", "cpu_used_GB_peak_during_training")


def _rows(rows: list[int], drop: tuple[str, ...] = (), **changes: str) -> str:
    """Rows of the shipped table (1 = first data row) as a new table, columns dropped, changed
    or added in every row."""
    reader = csv.DictReader(io.StringIO(TABLE.read_text()))
    picked = [r for i, r in enumerate(reader, start=1) if i in rows]
    columns = [c for c in reader.fieldnames if c not in drop] + [
        c for c in changes if c not in reader.fieldnames]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    for r in picked:
        writer.writerow(r | changes)
    return out.getvalue()


def test_the_shipped_table_reads_as_41_runs_of_29_configurations():
    runs = read_runs(TABLE)
    assert len(runs) == 41 and len(configurations(runs)) == 29
    first = runs[0]
    assert (first.row, first.num_layers, first.hidden_size, first.gpus, first.micro_batch_size,
            first.sub_group_size, first.build) == (1, 40, 5120, 1, 1, 100_000_000,
                                                  "0.13.3+8074cd62")
    assert first.deepspeed_version == "0.13.3" and first.name == "11.20b-dp1-mb1-ga1-sg1e08"
    assert first.seconds == pytest.approx({"forward": 0.35538, "backward": 8.66394,
                                           "update": 7.9919, "iteration": 17.44628}, rel=1e-15)
    assert first.peak_gpu_bytes == 26.32 * 2**30 and first.peak_host_bytes == 333.05 * 2**30
    assert (first.bf16, first.checkpoint_activations, first.flash_attention,
            first.untied_embeddings) == (True, True, False, True)


def test_per_step_times_add_every_micro_batch():
    phases = {"forward": 1.0, "backward_non_boundary": 3.0, "backward_boundary": 10.0,
              "update": 4.0}
    assert per_step_seconds(phases, 4) == {"forward": 4.0, "backward": 19.0, "update": 4.0}
    assert per_step_seconds({**phases, "backward_non_boundary": None}, 1) == {
        "forward": 1.0, "backward": 10.0, "update": 4.0}


def test_a_run_predicts_what_zerosim_run_gives_its_scenario_file():
    """Rows 2, 7 and 11 repeat the 11.2B DP=1 micro-batch-4 configuration: one simulation,
    the same numbers as `zerosim run` on the calibration scenario written for it."""
    runs = read_runs_text(_rows([2, 7, 11]), "t.csv")
    outcome = predict(runs, "polaris-a100", workers=1)
    p, = outcome.predictions
    summary = zerosim.simulate(ROOT / "scenarios" / "calibration" / "polaris"
                               / "polaris-11.20b-dp1-mb4-ga1-sg1e08.yaml").summary
    assert p.status == "ok" and len(p.configuration.runs) == 3
    assert p.predicted["iteration"] == summary["iteration_s"]
    assert p.predicted["update"] == summary["phases_s"]["update"]
    assert p.measured("iteration") == pytest.approx((20.57925 + 19.80884 + 23.41351) / 3)
    assert p.rel_error("iteration") == p.predicted["iteration"] / p.measured("iteration") - 1


def test_repeated_runs_report_how_far_they_scatter():
    """Rows 2, 7 and 11 measure the 11.2B DP=1 micro-batch-4 backward at 11,024.02,
    10,241.10 and 14,065.66 ms: they differ by 3,824.56 ms, 32.5% of their mean; their peak
    GPU memory does not differ; a configuration measured once has no spread."""
    runs = read_runs_text(_rows([1, 2, 7, 11]), "t.csv")
    single, triple = configurations(runs)
    assert triple.values("backward") == pytest.approx([11.02402, 10.2411, 14.06566], rel=1e-15)
    assert triple.spread("backward") == pytest.approx(
        (14.06566 - 10.2411) / ((11.02402 + 10.2411 + 14.06566) / 3), rel=1e-12)
    assert triple.spread("peak allocated GPU memory") == 0.0
    assert single.spread("backward") is None
    assert {"spread_backward", "spread_peak_host"} <= set(PREDICTION_COLUMNS)


def test_one_runs_scatter_is_pooled_over_the_repeated_configurations():
    """Rows 2, 7, 11 (11.2B DP=1 micro-batch 4: backward 11,024.02, 10,241.10 and 14,065.66
    ms) and rows 3, 12 (11.2B DP=2: 7,459.76 and 7,031.55 ms): the relative deviations from
    each mean, squared and summed, over 3 + 2 runs less 2 means; row 1, measured once, adds
    nothing."""
    runs = read_runs_text(_rows([1, 2, 3, 7, 11, 12]), "t.csv")
    triple_mean = (11.02402 + 10.2411 + 14.06566) / 3
    pair_mean = (7.45976 + 7.03155) / 2
    squares = (sum((v / triple_mean - 1) ** 2 for v in (11.02402, 10.2411, 14.06566))
               + sum((v / pair_mean - 1) ** 2 for v in (7.45976, 7.03155)))
    assert run_to_run_sd(configurations(runs), "backward") == pytest.approx(
        math.sqrt(squares / 3), rel=1e-12)
    assert run_to_run_sd(configurations(runs), "peak allocated GPU memory") == 0.0
    assert run_to_run_sd(configurations(read_runs_text(_rows([1, 2]), "t.csv")),
                         "backward") is None


def test_a_miss_is_set_against_the_tables_own_scatter():
    """-17.3% for one run of a table whose runs scatter by 7.5%: 2.3 standard errors; the
    same error for the mean of four runs is twice as many."""
    from zerosim.validation.validate import measurement_noise_note

    assert measurement_noise_note(-0.173, 0.075, 1).startswith(
        "2.3 standard errors of a mean of 1 run (one run scatters by 7.5%")
    assert measurement_noise_note(-0.173, 0.075, 4).startswith(
        "4.6 standard errors of a mean of 4 runs")


def test_the_predict_summary_names_the_widest_scatter():
    runs = read_runs_text(_rows([1, 2, 7, 11]), "t.csv")
    outcome = predict(runs, "polaris-a100", workers=1)
    spread, widest = outcome.widest_spread("backward")
    assert widest.scenario_name == "11.20b-dp1-mb4-ga1-sg1e08"
    assert spread == widest.configuration.spread("backward")
    from zerosim.report import _repeats_text

    assert "1 configuration measured more than once" in _repeats_text(outcome)
    assert "bwd 32.5% (11.20b-dp1-mb4-ga1-sg1e08)" in _repeats_text(outcome)


def test_runs_off_their_repeats_are_named_with_each_phase_over_the_others():
    """The shipped table's rows 2, 7 and 11 (one configuration; 1, 3 and 4 of this table) and
    3 and 12 (a pair: only the first, over the second); rows 15 and 35 (5.9B, within 1%) are
    not named."""
    from zerosim.report import _off_repeats_text
    from zerosim.runs import configurations, off_repeat_rows, runs_off_their_repeats

    runs = read_runs_text(_rows([2, 3, 7, 11, 12, 15, 35]), "t.csv")
    off = runs_off_their_repeats(configurations(runs))
    assert [(o.run.row, o.others) for o in off] == [(1, (3, 4)), (3, (1, 4)), (4, (1, 3)),
                                                    (2, (5,))]
    row2, pair = off[0], off[3]
    assert row2.deviations["forward"] == pytest.approx(1255.73 / ((1081.34 + 1081.2) / 2) - 1,
                                                       rel=1e-12)
    assert pair.deviations == pytest.approx({"forward": 1314.37 / 1125.13 - 1,
                                             "backward": 7459.76 / 7031.55 - 1,
                                             "update": 6033.21 / 5973.93 - 1}, rel=1e-12)
    text = _off_repeats_text(predict(runs, "polaris-a100", workers=1))
    assert ("11.20b-dp2-mb4-ga1-sg1e08: row 2 over row 5: fwd +16.8%, bwd +6.1%, update +1.0%"
            in text)
    assert "sm_clock_fraction" in text
    pair_row = off_repeat_rows(predict(runs, "polaris-a100", workers=1))[3]
    assert pair_row == {"row": 2, "others": [5], "name": "11.20b-dp2-mb4-ga1-sg1e08",
                        "deviations": pair.deviations}


def test_a_table_without_measurements_is_predicted_and_says_so():
    runs = read_runs_text(_rows([15], drop=MEASURED), "t.csv")
    outcome = predict(runs, "polaris-a100", workers=1)
    p, = outcome.predictions
    assert p.status == "ok" and p.predicted["iteration"] > 0
    assert p.measured("iteration") is None and p.rel_error("iteration") is None
    assert outcome.rms("iteration") is None


def test_more_gpus_than_a_node_holds_spread_over_nodes():
    run, = read_runs_text(_rows([4], drop=MEASURED, num_gpus="8", data_parallel_size="8"),
                          "t.csv")
    tree = run.scenario("polaris-a100", profile=load_profile("polaris-a100"))
    assert tree["hardware"] == {"profile": "polaris-a100", "overrides": {"nodes": 2}}
    p, = predict([run], "polaris-a100", workers=1).predictions
    assert (p.status, p.nodes) == ("ok", 2)


def test_a_node_count_column_spreads_the_gpus_as_the_table_says():
    """8 GPUs over 4 nodes: 2 a node, the first two of each Polaris node (on NUMA domains 3
    and 2); over 2 nodes, the default; over 1 node more GPUs than it holds; over 3 nodes not
    evenly."""
    polaris = load_profile("polaris-a100")
    spread = dict(drop=MEASURED, num_gpus="8", data_parallel_size="8")
    four, = read_runs_text(_rows([4], num_nodes="4", **spread), "t.csv")
    assert four.nodes(4) == 4 and four.name == "11.20b-dp8-4n-mb4-ga1-sg1e08"
    assert four.scenario("polaris-a100", profile=polaris)["hardware"] == {
        "profile": "polaris-a100",
        "overrides": {"nodes": 4, "gpu": {"per_node": 2, "numa_domain": [3, 2]}}}
    two, = read_runs_text(_rows([4], nnodes="2", **spread), "t.csv")
    default, = read_runs_text(_rows([4], **spread), "t.csv")
    assert (two.scenario("polaris-a100", profile=polaris)["hardware"]
            == default.scenario("polaris-a100", profile=polaris)["hardware"])
    one, = read_runs_text(_rows([4], nnodes="1", **spread), "t.csv")
    with pytest.raises(ScenarioError, match=r"t.csv: row 1.nnodes: expected at least 2 nodes "
                                            r"\(polaris-a100 has 4 GPUs a node\)"):
        one.scenario("polaris-a100", profile=polaris, source="t.csv")
    with pytest.raises(ScenarioError, match=r"row 1.num_nodes: expected a divisor of "
                                            r"num_gpus \(8\)"):
        read_runs_text(_rows([4], num_nodes="3", **spread), "t.csv")
    p, = predict([four], "polaris-a100", workers=1).predictions
    q, = predict([two], "polaris-a100", workers=1).predictions
    assert (p.status, p.nodes, q.nodes) == ("ok", 4, 2)
    assert p.predicted["iteration"] != q.predicted["iteration"]


def test_a_profile_file_and_overrides_for_every_row(tmp_path):
    profile = tmp_path / "mine.yaml"
    profile.write_text((ROOT / "zerosim" / "hardware" / "profiles" / "polaris-a100.yaml")
                       .read_text())
    runs = read_runs_text(_rows([15], drop=MEASURED), "t.csv")
    base, = predict(runs, profile, workers=1).predictions
    named, = predict(runs, "polaris-a100", workers=1).predictions
    assert base.predicted == named.predicted
    buffered, = predict(runs, profile, workers=1,
                        overrides={"what_if.buffer_boundary_grads": True}).predictions
    assert buffered.predicted["backward"] < base.predicted["backward"]


@pytest.mark.parametrize(("change", "message"), [
    ({"num_layers": "0"}, "row 1.num_layers: expected a positive whole number, got '0'"),
    ({"micro_batch_size": "two"}, "row 1.micro_batch_size: expected a positive whole number"),
    ({"bf16": "yes"}, "row 1.bf16: expected True or False, got 'yes'"),
    ({"swiglu": "False"}, "row 1.swiglu: expected True (the megatron-deepspeed stack"),
    ({"zero_stage": "4"}, "row 1.zero_stage: expected 0, 1, 2 or 3, got '4'"),
    ({"fwd_ms_mean": "-3"}, "row 1.fwd_ms_mean: expected a positive measurement"),
    ({"data_parallel_size": "2", "num_gpus": "4"},
     "row 1.data_parallel_size: expected num_gpus (4): zerosim replays data parallelism alone"),
])
def test_a_bad_row_names_its_row_and_column(change, message):
    with pytest.raises(ScenarioError, match=re.escape(message)):
        read_runs_text(_rows([1], **change), "t.csv")


def test_a_measurement_written_as_missing_is_not_measured():
    """An empty cell, or what pandas writes for a missing value (`NaN`, `N/A`, `null`) or a
    dash, is a run that did not measure that quantity, in any case; the row still runs."""
    run, = read_runs_text(_rows([1], fwd_ms_mean="NaN", bwd_ms_mean="n/a", step_ms_mean="null",
                                iter_ms_mean="-", smu_train_rank0_peak_Max_MA_GB="nan",
                                cpu_used_GB_peak_during_training=""), "t.csv")
    assert run.seconds == {} and run.peak_gpu_bytes is None and run.peak_host_bytes is None


def test_an_option_written_as_missing_takes_its_default():
    """An optional column's cell written as missing is an empty cell: `sub_group_size` takes
    DeepSpeed's default (a warning names the row), the fork's keys and the binding theirs."""
    with pytest.warns(ScenarioWarning, match=re.escape("row(s) 1: no sub_group_size")):
        run, = read_runs_text(_rows([1], sub_group_size="NaN", part_grads_async="nan",
                                    prefetch_optimizer_gap="None", bind_cores_to_rank="N/A"),
                              "t.csv")
    assert (run.sub_group_size, run.part_grads_async, run.prefetch_optimizer_gap,
            run.bind_cores_to_rank) == (1_000_000_000, False, 0, False)


def test_a_configuration_column_written_as_missing_is_a_bad_value():
    with pytest.raises(ScenarioError, match=re.escape(
            "row 1.hidden_size: expected a positive whole number, got 'NaN'")):
        read_runs_text(_rows([1], hidden_size="NaN"), "t.csv")


def test_a_table_without_a_configuration_column_is_refused():
    with pytest.raises(ScenarioError, match=r"t.csv: <header>: expected the configuration "
                                            r"columns .*, got no column 'hidden_size'"):
        read_runs_text(_rows([1], drop=("hidden_size",)), "t.csv")


FIELDS = "expected 32 fields separated by ',', one per column of the header"


def _malformed(kind: str) -> str:
    """Row 1 of the shipped table, then a second row, written wrong as `kind` says."""
    header, row = _rows([1]).splitlines()
    return {
        "short": f"{header}\n{row}\n1,1,40\n",
        "long": f"{header}\n{row}\n{row},99\n",
        "quoted": f'{header}\n{row}\n"{row}"\n',
        "semicolon header": f"{header.replace(',', ';')}\n{row}\n",
        "carriage return": f"{header}\n{row}\n{row[:20]}\r{row[20:]}\n",
        "repeated column": f"{header},hidden_size\n{row},6000\n",
    }[kind]


@pytest.mark.parametrize(("kind", "message"), [
    ("short", f"t.csv: row 2: {FIELDS}, got 3 fields"),
    ("long", f"t.csv: row 2: {FIELDS}, got 33 fields"),
    ("quoted", f"t.csv: row 2: {FIELDS}, got 1 field"),
    ("semicolon header", "t.csv: row 1: expected 32 fields separated by ';', one per column "
                         "of the header, got 1 field"),
    ("carriage return", "t.csv: row 2: expected fields separated by ',', a line break only "
                        "inside a quoted field, got a carriage return inside an unquoted field"),
    ("repeated column", "t.csv: <header>: expected each column once, got 'hidden_size' as "
                        "columns 4 and 33"),
])
def test_a_row_that_does_not_match_the_header_is_refused_naming_it(kind, message):
    """A missing or extra separator, a row quoted whole, a table whose header has another
    separator than its rows, a stray carriage return: no field may shift to another column,
    be lost or be read as None; nor may a column named twice take its last value."""
    with pytest.raises(ScenarioError) as refused:
        read_runs_text(_malformed(kind), "t.csv")
    assert str(refused.value) == message


def test_cli_refuses_a_malformed_table_with_one_line_and_writes_nothing(tmp_path):
    table, out = tmp_path / "runs.csv", tmp_path / "out"
    table.write_text(_malformed("short"))
    result = CliRunner().invoke(main, ["predict", str(table), "--hardware", "polaris-a100",
                                       "--workers", "1", "--out", str(out)])
    assert result.exit_code == 2
    assert result.stderr == f"error: {table}: row 2: {FIELDS}, got 3 fields\n"
    assert not out.exists()


def test_a_column_with_a_default_may_be_left_out_and_a_warning_says_so():
    full, = read_runs_text(_rows([15]), "t.csv")
    with pytest.warns(ScenarioWarning, match=r"t.csv: no column sub_group_size, "
                                             r"use_flash_attn; every run takes "
                                             r"sub_group_size=1000000000, use_flash_attn=False"):
        short, = read_runs_text(_rows([15], drop=("use_flash_attn", "sub_group_size")),
                                "t.csv")
    assert short.sub_group_size == 1_000_000_000 and full.sub_group_size == 100_000_000
    assert short.flash_attention is full.flash_attention is False
    with pytest.raises(ScenarioError, match="at least one run"):
        read_runs_text(_rows([]), "t.csv")


def test_the_models_built_from_the_shape_columns_have_the_tables_parameter_counts():
    runs = read_runs(TABLE)
    assert {r.model_params() for r in runs} == {r.params for r in runs} == {
        5_898_506_240, 5_948_837_888, 9_142_717_440, 11_197_895_680, 11_315_860_480,
        15_579_222_016}
    assert all(r.model_params() == r.params for r in runs)


def test_a_parameter_count_other_than_the_built_models_is_a_warning():
    # Tied embeddings drop the output layer: 50,304 x 5,120 = 257,556,480 parameters.
    with pytest.warns(ScenarioWarning, match=re.escape(
            "t.csv: row(s) 1, 2: params_analytic_total is 11,197,895,680, the model zerosim "
            "builds from the shape columns has 10,940,339,200 (-2.30%): the run's model is "
            "not the one replayed")):
        runs = read_runs_text(_rows([1, 2], untie_embeddings_and_output_weights="False"),
                              "t.csv")
    assert [r.model_params() for r in runs] == [10_940_339_200] * 2


def test_a_column_zerosim_does_not_read_is_named_in_a_warning():
    table = _rows([1]).replace("num_gpus,", "tensor_model_parallel_size,num_gpus,", 1)
    table = table.replace("\n1,", "\n1,1,", 1)
    with pytest.warns(ScenarioWarning, match=re.escape(
            "t.csv: column(s) tensor_model_parallel_size not read: the predictions do not "
            "depend on them")):
        run, = read_runs_text(table, "t.csv")
    assert run.gpus == 1


def test_cli_prints_each_configuration_and_writes_the_table(tmp_path):
    table = tmp_path / "runs.csv"
    table.write_text(_rows([2, 7, 15]))
    out = tmp_path / "out"
    output, rows = invoke_for_table(["predict", str(table), "--hardware", "polaris-a100",
                                     "--workers", "1", "--out", str(out)],
                                    out / "predictions.csv")
    assert "11.20b-dp1-mb4-ga1-sg1e08 x2" in output
    assert "2 configurations (2 simulated; in process" in output
    assert list(rows[0]) == list(PREDICTION_COLUMNS)
    assert [r["rows"] for r in rows] == ["1 2", "3"]
    assert float(rows[0]["error_iteration"]) == pytest.approx(
        float(rows[0]["predicted_iteration_s"]) / float(rows[0]["measured_iteration_s"]) - 1)
    assert float(rows[0]["measured_peak_host_GiB"]) == pytest.approx((287.51 + 284.9) / 2)
    assert float(rows[0]["error_peak_host"]) == pytest.approx(
        float(rows[0]["predicted_peak_host_GiB"]) / float(rows[0]["measured_peak_host_GiB"]) - 1)


def test_predict_frame_is_the_table_the_command_writes(tmp_path):
    """`zerosim.predict_frame` from Python: predictions.csv as pandas reads it, nothing
    written; a `--set` given as a mapping or as the command's text alike."""
    import pandas as pd

    import zerosim

    table = tmp_path / "runs.csv"
    table.write_text(_rows([2, 7, 14]))
    out = tmp_path / "out"
    invoke_for_table(["predict", str(table), "--hardware", "polaris-a100", "--workers", "1",
                      "--set", "hardware.gpu.hbm_GiB=20", "--out", str(out)],
                     out / "predictions.csv")
    written = pd.read_csv(out / "predictions.csv")
    frame = zerosim.predict_frame(table, "polaris-a100", workers=1,
                                  overrides={"hardware.gpu.hbm_GiB": 20})
    pd.testing.assert_frame_equal(frame, written)
    assert frame.status.tolist() == ["oom", "ok"] and frame.columns.tolist() == list(
        PREDICTION_COLUMNS)
    pd.testing.assert_frame_equal(zerosim.predict_frame(table, "polaris-a100", workers=2,
                                                        overrides=["hardware.gpu.hbm_GiB=20"]),
                                  written)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "runs.csv"]


def test_cli_json_and_refusals(tmp_path):
    table = tmp_path / "runs.csv"
    table.write_text(_rows([15], drop=MEASURED))
    ok = CliRunner().invoke(main, ["predict", str(table), "--hardware", "polaris-a100",
                                   "--workers", "1", "--no-files", "--json"])
    assert ok.exit_code == 0, ok.output
    row, = json.loads(ok.output)["rows"]
    assert row["status"] == "ok" and row["measured_iteration_s"] is None
    assert json.loads(ok.output)["run_to_run_sd"]["backward"] is None
    assert json.loads(ok.output)["off_repeats"] == []
    unknown = CliRunner().invoke(main, ["predict", str(table), "--hardware", "no-such-node",
                                        "--no-files"])
    assert unknown.exit_code == 2 and "no-such-node" in unknown.output
    missing = CliRunner().invoke(main, ["predict", str(tmp_path / "none.csv"),
                                        "--hardware", "polaris-a100", "--no-files"])
    assert missing.exit_code == 2 and "none.csv" in missing.output


def test_a_configuration_that_does_not_fit_is_a_row_not_a_failure(tmp_path):
    table = tmp_path / "runs.csv"
    table.write_text(_rows([14]))
    result = CliRunner().invoke(main, ["predict", str(table), "--hardware", "polaris-a100",
                                       "--workers", "1", "--no-files", "--json",
                                       "--set", "hardware.gpu.hbm_GiB=8"])
    assert result.exit_code == 0, result.output
    row, = json.loads(result.output)["rows"]
    assert row["status"] == "oom" and row["predicted_iteration_s"] is None
    assert row["measured_iteration_s"] == pytest.approx(12.49879)
    assert re.fullmatch(r"out of memory on gpu\d: fp16 partition \(params 16-bit\) needs "
                        r"7\.25 GiB with \d+\.\d\d of 8\.00 GiB in use", row["oom"])
    printed = CliRunner().invoke(main, ["predict", str(table), "--hardware", "polaris-a100",
                                        "--workers", "1", "--no-files",
                                        "--set", "hardware.gpu.hbm_GiB=8"])
    assert f"{row['name']}: {row['oom']}" in " ".join(printed.output.split())


FORK_GAP_3 = {"deepspeed_version": "0.13.3+4570a955", "part_grads_async": "True",
              "prefetch_optimizer": "True", "prefetch_optimizer_gap": "3"}


def test_a_measured_run_the_model_does_not_fit_is_timed_with_the_memory_it_needs(tmp_path):
    """Row 2 (11.20B, DP=1, micro-batch 4) with the fork's interleaved update at gap 3: the
    model holds one more GiB or so of HBM than a 40 GB A100 has (the GPU sub-groups' 16-bit
    gradients, the last one's fp32 state). The table measured it, so it fitted: its times
    are simulated with the HBM raised until every allocation fits, the same times as a run
    given that HBM, and its row says both."""
    table = tmp_path / "runs.csv"
    table.write_text(_rows([2], **FORK_GAP_3))
    result = CliRunner().invoke(main, ["predict", str(table), "--hardware", "polaris-a100",
                                       "--workers", "1", "--no-files", "--json"])
    assert result.exit_code == 0, result.output
    row, = json.loads(result.output)["rows"]
    assert row["status"] == "oom"
    assert row["oom"].startswith("out of memory on gpu0: fp64 norm ")
    key, _, value = row["timed_with"].partition("=")
    assert key == "hardware.gpu.hbm_GiB" and 39.59 < float(value) < 42
    again = CliRunner().invoke(main, ["run", "scenarios/calibration/polaris/"
                                      "polaris-11.20b-dp1-mb4-ga1-sg1e08.yaml", "--no-files",
                                      "--json", "--set", row["timed_with"],
                                      *(f"--set=deepspeed.zero_optimization.offload_optimizer."
                                        f"{k}={v}" for k, v in FORK_GAP_3.items()
                                        if k != "deepspeed_version"),
                                      "--set", "runtime.deepspeed_version=0.13.3+4570a955",
                                      "--set", "runtime.bind_cores_to_rank=true"])
    assert again.exit_code == 0, again.output
    assert row["predicted_iteration_s"] == json.loads(again.output)["iteration_s"]
    assert float(row["predicted_peak_allocated_GiB"]) > 39.59 - 0.8
    printed = CliRunner().invoke(main, ["predict", str(table), "--hardware", "polaris-a100",
                                        "--workers", "1", "--no-files"])
    text = " ".join(printed.output.split())
    assert f"timed with {row['timed_with']}, as the measured runs fitted" in text
    assert "1 do not fit (1 of them timed with more memory)" in text
    assert row["tight"] == "" and "tight" not in text


def test_a_run_without_measurements_that_does_not_fit_stays_untimed(tmp_path):
    """Without measurements nothing says the configuration ever fitted: `oom` is the
    prediction, and `zerosim run` names the memory under which that allocation would fit."""
    table = tmp_path / "runs.csv"
    table.write_text(_rows([2], drop=MEASURED, **FORK_GAP_3))
    result = CliRunner().invoke(main, ["predict", str(table), "--hardware", "polaris-a100",
                                       "--workers", "1", "--no-files", "--json"])
    row, = json.loads(result.output)["rows"]
    assert (row["status"], row["timed_with"], row["predicted_iteration_s"]) == ("oom", "", None)


def test_a_prediction_that_fits_within_the_memory_models_error_is_named_tight(tmp_path):
    """Row 15 fits a 40 GB A100 with room to spare; given an HBM 2% above its peak (CUDA
    context included) it still fits, but within the 4% zerosim's peaks sit from measured
    ones: the row says so, in the CSV's `tight` column and under the table."""
    table = tmp_path / "runs.csv"
    table.write_text(_rows([15], drop=MEASURED))

    def predicted(*extra: str) -> tuple[dict, str]:
        args = ["predict", str(table), "--hardware", "polaris-a100", "--workers", "1",
                "--no-files", *extra]
        data = CliRunner().invoke(main, [*args, "--json"])
        assert data.exit_code == 0, data.output
        row, = json.loads(data.output)["rows"]
        return row, " ".join(CliRunner().invoke(main, args).output.split())

    roomy, text = predicted()
    assert roomy["tight"] == "" and "tight" not in text
    peak = float(roomy["predicted_peak_allocated_GiB"]) + 0.8
    row, text = predicted("--set", f"hardware.gpu.hbm_GiB={1.02 * peak:.2f}")
    assert row["status"] == "ok"
    assert row["tight"] == f"peak HBM {peak:.2f} of {1.02 * peak:.2f} GiB"
    assert (f"{row['name']}: tight: {row['tight']}, within 4% (the memory model's error): "
            "a real run may not fit") in text
    assert "(1 simulated, 1 tight;" in text


KNOWN_KEYS = ("activation_checkpointing, attention, data_parallel, deepspeed, description, "
              "document_length, hardware, model, name, precision, runtime, sequence_length, "
              "trainer, what_if")


REFUSED_ROWS = [
    ({"deepspeed_version": "banana"},
     "row 2.deepspeed_version: runtime.deepspeed_version: expected a DeepSpeed version like "
     "\"0.13.3\" (quote it), got 'banana'"),
    ({"num_attention_heads": "7"},
     "row 2.num_attention_heads: model.num_attention_heads: expected a divisor of "
     "hidden_size=5120, got 7"),
    ({"zero_stage": "0"},
     "row 2.zero_stage: deepspeed.zero_optimization.offload_optimizer.device: expected 'none' "
     "at stage 0 (DeepSpeed offloads the optimizer only under ZeRO 1-3), got 'cpu'"),
    ({"data_parallel_size": "2"},
     "row 2.data_parallel_size: expected num_gpus (1): zerosim replays data parallelism alone, "
     "not tensor or pipeline parallelism, got '2'"),
    ({"num_layers": "forty"}, "row 2.num_layers: expected a positive whole number, got 'forty'"),
]
UNCHECKED = ("params_analytic_total",)  # 7 heads would warn of another model first


def _good_and_bad(tmp_path, change: dict) -> Path:
    """Row 1 of the shipped table, then row 2 with `change`."""
    header, good = _rows([1], drop=UNCHECKED).splitlines()
    bad = _rows([2], drop=UNCHECKED, **change).splitlines()[1]
    table = tmp_path / "runs.csv"
    table.write_text(f"{header}\n{good}\n{bad}\n")
    return table


@pytest.mark.parametrize(("change", "message"), REFUSED_ROWS)
def test_a_row_zerosim_refuses_is_a_refused_row_naming_its_column_and_the_rest_run(
        tmp_path, monkeypatch, change, message):
    """A bad value, or a configuration zerosim does not replay (DeepSpeed refuses ZeRO stage 0
    with an offloaded optimizer, so zerosim does; another parallelism), is refused as `zerosim
    check` refuses a file, naming the row and the column, and is not simulated; the table's
    other rows are predicted, every row written, exit 1."""
    import zerosim.api

    simulated = []
    real = zerosim.api.simulate_summary

    def counted(*args, **kwargs):
        simulated.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(zerosim.api, "simulate_summary", counted)
    table, out = _good_and_bad(tmp_path, change), tmp_path / "out"
    result = CliRunner().invoke(main, ["predict", str(table), "--hardware", "polaris-a100",
                                       "--workers", "1", "--out", str(out)])
    assert result.exit_code == 1 and len(simulated) == 1
    assert f"{table}: {message}" in " ".join(result.stdout.split())
    rows = {row["rows"]: row for row in csv.DictReader((out / "predictions.csv").open())}
    assert rows["1"]["status"] == "ok" and rows["1"]["predicted_iteration_s"]
    assert rows["2"]["status"] == "refused" and rows["2"]["predicted_iteration_s"] == ""
    assert rows["2"]["error"] == f"{table}: {message}"


def test_json_lists_a_refused_row_after_the_configurations(tmp_path):
    """`--json` rows as predictions.csv's: the configurations, then each row the table could
    not give as a run, with status `refused` and why."""
    table = _good_and_bad(tmp_path, {"num_layers": "forty"})
    result = CliRunner().invoke(main, ["predict", str(table), "--hardware", "polaris-a100",
                                       "--workers", "1", "--no-files", "--json"])
    assert result.exit_code == 1
    first, refused = json.loads(result.stdout)["rows"]
    assert (first["rows"], first["status"]) == ("1", "ok")
    assert refused == {"rows": "2", "status": "refused", "error": (
        f"{table}: row 2.num_layers: expected a positive whole number, got 'forty'")}


def test_a_table_whose_every_row_is_refused_is_bad_input(tmp_path):
    """Nothing to predict: the first refusal, exit 2, nothing written."""
    header, *_ = _rows([1]).splitlines()
    bad = [_rows([r], zero_stage="0").splitlines()[1] for r in (1, 2)]
    table, out = tmp_path / "runs.csv", tmp_path / "out"
    table.write_text("\n".join([header, *bad]) + "\n")
    result = CliRunner().invoke(main, ["predict", str(table), "--hardware", "polaris-a100",
                                       "--workers", "1", "--out", str(out)])
    assert result.exit_code == 2 and "row 1.zero_stage" in result.stderr
    assert result.stdout == "" and not out.exists()


@pytest.mark.parametrize(("settings", "message"), [
    (("foo=1",), f"row 1: --set foo: expected one of the known keys ({KNOWN_KEYS}), got 'foo'"),
    (("deepspeed.zero_optimization.stage=0",),
     "row 1: --set deepspeed.zero_optimization.stage: expected 'none' at stage 0 (DeepSpeed "
     "offloads the optimizer only under ZeRO 1-3), got 'cpu'"),
])
def test_a_set_zerosim_refuses_is_refused_naming_it_before_anything_runs(
        tmp_path, monkeypatch, settings, message):
    """A refused `--set` is a bad option, not a row: it is named with the first row it
    refuses, exits 2 and writes nothing, before anything is simulated."""
    import zerosim.api

    def never(*_):
        raise AssertionError("simulated before every row was checked")

    monkeypatch.setattr(zerosim.api, "simulate_summary", never)
    table, out = _good_and_bad(tmp_path, {}), tmp_path / "out"
    result = CliRunner().invoke(main, [
        "predict", str(table), "--hardware", "polaris-a100", "--workers", "1", "--out",
        str(out), *(arg for setting in settings for arg in ("--set", setting))])
    assert result.exit_code == 2
    assert result.stderr == f"error: {table}: {message}\n"
    assert result.stdout == "" and not out.exists()


def test_a_configuration_that_fails_to_simulate_is_an_error_row_and_exit_1(tmp_path,
                                                                          monkeypatch):
    """Status `error` (exit 1) is left to a failure of the simulation itself."""
    import zerosim.api

    def broken(*_, **__):
        raise RuntimeError("engine stopped")

    monkeypatch.setattr(zerosim.api, "simulate_summary", broken)
    table = tmp_path / "runs.csv"
    table.write_text(_rows([15]))
    result = CliRunner().invoke(main, ["predict", str(table), "--hardware", "polaris-a100",
                                       "--workers", "1", "--no-files"])
    assert result.exit_code == 1
    assert "ERROR" in result.output and "RuntimeError: engine stopped" in result.output


def test_cli_draws_predicted_against_measured(tmp_path):
    table = tmp_path / "runs.csv"
    table.write_text(_rows([2, 15, 41]))
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["predict", str(table), "--hardware", "polaris-a100",
                                       "--workers", "1", "--out", str(out), "--plots"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["predictions.csv", "predictions.png",
                                                     "series.csv"]
    refused = CliRunner().invoke(main, ["predict", str(table), "--hardware", "polaris-a100",
                                        "--no-files", "--plots"])
    assert refused.exit_code == 2 and "--plots writes files" in refused.output


def test_the_fork_columns_replay_the_build_the_row_names():
    """Row 39 (5.95B, DP=4, build c7da512a) with the fork's options filled in: prefetch needs
    a build that replays it (4570a955), the async flush alone runs on c7da512a; empty or
    absent columns leave the plain ZeRO-3 offload."""
    text = _rows([39], drop=MEASURED)
    header, row = text.splitlines()
    table = (f"{header},part_grads_async,prefetch_optimizer,prefetch_optimizer_gap\n"
             f"{row},,,\n{row},True,,\n"
             f"{row.replace('c7da512a', '4570a955')},True,True,3\n")
    plain, flush, both = read_runs_text(table, "t.csv")
    assert (plain.deepspeed_version, plain.name) == ("0.13.3", "5.95b-dp4-mb1-ga1-sg1e08")
    assert (flush.deepspeed_version, flush.name) == ("0.13.3+c7da512a",
                                                      "5.95b-dp4-mb1-ga1-sg1e08-async")
    assert both.name == "5.95b-dp4-mb1-ga1-sg1e08-async-gap3"
    offload = both.scenario("polaris-a100", profile=load_profile("polaris-a100"))["deepspeed"][
        "zero_optimization"]["offload_optimizer"]
    assert (offload["prefetch_optimizer"], offload["prefetch_optimizer_gap"]) == (True, 3)
    p_plain, p_flush, p_both = predict([plain, flush, both], "polaris-a100",
                                       workers=1).predictions
    assert p_flush.predicted["backward"] < p_plain.predicted["backward"]
    assert p_flush.predicted["update"] == pytest.approx(p_plain.predicted["update"], rel=1e-12)
    assert p_both.predicted["update"] < p_plain.predicted["update"]


def test_a_bad_fork_column_names_its_row():
    header, row = _rows([39], drop=MEASURED).splitlines()
    with pytest.raises(ScenarioError, match=r"row 1\.prefetch_optimizer_gap"):
        read_runs_text(f"{header},prefetch_optimizer_gap\n{row},three\n", "t.csv")


def test_the_forks_options_on_the_plain_release_label_are_the_studys_build():
    """A release refuses the fork's keys, so a measured run that sets one on `0.13.3` (a
    build installed without its git metadata reports no label) ran the fork: it is replayed
    on the study's build, bound, its cache emptied at every phase; rows without the options
    keep the release, and another release keeps its label (and is refused, not simulated)."""
    header, row = _rows([13], drop=MEASURED).splitlines()
    row = row.replace("0.13.3+8074cd62", "0.13.3")
    table = (f"{header},part_grads_async,prefetch_optimizer_gap\n{row},True,\n{row},,\n"
             f"{row.replace('0.13.3', '0.14.0')},True,\n")
    with pytest.warns(ScenarioWarning, match=re.escape(
            "t.csv: row(s) 1: the fork's options on release 0.13.3, which refuses them: the "
            "runs were the fork's, replayed on the study's build 0.13.3+5c3f1413")):
        fork, plain, later = read_runs_text(table, "t.csv")
    assert (fork.build, fork.deepspeed_version, fork.bind_cores_to_rank, fork.empties_cache) == (
        "0.13.3+5c3f1413", "0.13.3+5c3f1413", True, True)
    assert fork.name == "11.20b-dp4-mb4-ga1-sg1e08-async"
    assert (plain.build, plain.bind_cores_to_rank, plain.empties_cache) == ("0.13.3", False,
                                                                          False)
    assert later.build == "0.14.0"
    p_fork, = predict([fork], "polaris-a100", workers=1).predictions
    assert p_fork.status == "ok"
    _, p_later = predict([fork, later], "polaris-a100", workers=1).predictions
    assert (p_later.status, p_later.predicted) == ("refused", {})
    assert p_later.error == (
        "<runs>: row 3.part_grads_async: deepspeed.zero_optimization.offload_optimizer."
        "part_grads_async: expected absent unless runtime.deepspeed_version names a build of "
        "the Deep Optimizer States fork (DataStates/DeepSpeed, branch deep-optimizer-states) "
        "by its local label, like \"0.13.3+4570a955\" (a DeepSpeed release refuses the key), "
        "got true")


def test_a_build_the_fork_does_not_know_says_what_it_is_replayed_as():
    """A source build that is not a known commit of the fork is replayed as the fork (its
    cache emptied at every phase) launched unbound, as the builds before c7da512a were, and
    the table hears it once per build; a bind_cores_to_rank column takes the launch off the
    warning, and known builds warn nothing."""
    header, row = _rows([13], drop=MEASURED).splitlines()
    table = f"{header}\n{row.replace('8074cd62', 'deadbeef')}\n{row}\n"
    with pytest.warns(ScenarioWarning) as caught:
        unknown, known = read_runs_text(table, "t.csv")
    assert [str(w.message) for w in caught] == [
        "t.csv: row(s) 1: build 0.13.3+deadbeef is not a commit of the Deep Optimizer States "
        "fork zerosim knows: replayed as the fork, its CUDA cache emptied at every phase, its "
        "options as d8048a5e and later read them; launched unbound, as the builds before "
        "c7da512a were (a bind_cores_to_rank column says otherwise) "
        "(docs/deep_optimizer_states.md)"]
    assert (unknown.bind_cores_to_rank, unknown.empties_cache) == (False, True)
    assert (known.bind_cores_to_rank, known.empties_cache) == (False, True)
    with pytest.warns(ScenarioWarning) as caught:
        read_runs_text(f"{header},bind_cores_to_rank\n{row.replace('8074cd62', 'deadbeef')},"
                       "True\n", "t.csv")
    assert [str(w.message).split(" (docs")[0][-28:] for w in caught] == [
        "d8048a5e and later read them"]


def test_each_prediction_row_says_how_its_run_was_replayed():
    """predictions.csv says what the table left to zerosim: the launch (a c7da512a build is
    taken as bound, fa8c1df2 and a release as unbound) and whether the CUDA cache is emptied
    at every phase (every fork build, not a release)."""
    header, fa8c, c7da = _rows([15, 39], drop=MEASURED).splitlines()
    table = f"{header}\n{c7da}\n{fa8c}\n{fa8c.replace('0.13.3+fa8c1df2', '0.13.3')}\n"
    rows = [prediction_row(p) for p in predict(read_runs_text(table, "t.csv"), "polaris-a100",
                                               workers=1).predictions]
    assert [(r["build"], r["bind_cores_to_rank"], r["empty_cache_each_phase"]) for r in rows] == [
        ("0.13.3+c7da512a", True, True), ("0.13.3+fa8c1df2", False, True), ("0.13.3", False, False)]


def test_a_table_saved_with_tabs_or_semicolons_or_padded_names_reads_as_its_csv():
    """A spreadsheet's export (tabs or semicolons, names padded with spaces) reads as the
    comma-separated table it holds."""
    table = _rows([13, 39])
    expected = read_runs_text(table, "t.csv")
    for separator in ("\t", ";", " , "):
        assert read_runs_text(table.replace(",", separator), "t.txt") == expected


def test_a_table_written_by_pandas_reads_as_it_was_meant():
    """pandas writes a column with an empty cell as floats (3.0, 1.0): a gap of 3.0 is 3, a
    flag of 1.0 or 0 is True or False; 3.5 and 2 are not."""
    header, row = _rows([39], drop=MEASURED).splitlines()
    row = row.replace("c7da512a", "4570a955")
    run, = read_runs_text(f"{header},prefetch_optimizer,prefetch_optimizer_gap\n"
                          f"{row},1.0,3.0\n", "t.csv")
    assert (run.prefetch_optimizer, run.prefetch_optimizer_gap) == (True, 3)
    off, = read_runs_text(f"{header},part_grads_async\n{row},0\n", "t.csv")
    assert off.part_grads_async is False
    staged, = read_runs_text(_rows([39], drop=MEASURED, zero_stage="3.0"), "t.csv")
    assert staged.zero_stage == 3
    with pytest.raises(ScenarioError, match=re.escape(
            "row 1.prefetch_optimizer_gap: expected a whole number >= 0, got '3.5'")):
        read_runs_text(f"{header},prefetch_optimizer_gap\n{row},3.5\n", "t.csv")
    with pytest.raises(ScenarioError, match=re.escape(
            "row 1.part_grads_async: expected True or False, got '2'")):
        read_runs_text(f"{header},part_grads_async\n{row},2\n", "t.csv")


def test_a_name_says_what_a_run_sets_otherwise_than_the_artifacts():
    """Two configurations of one table never share a name; the shipped runs' names carry no
    such suffix."""
    assert {r.setup_suffix for r in read_runs(TABLE)} == {""}
    run, = read_runs_text(_rows([15], zero_stage="2", bf16="False", seq_length="4096",
                                reduce_bucket_size="5e7"), "t.csv")
    assert run.name == "5.90b-dp1-mb4-ga1-sg1e08-z2-fp16-s4096-rb5e07"
    changes = [{"zero_stage": "1"}, {"bf16": "False"}, {"use_flash_attn": "True"},
               {"checkpoint_activations": "False"}, {"offload_optimizer_pin_memory": "False"},
               {"overlap_comm": "False"}, {"untie_embeddings_and_output_weights": "False"},
               {"seq_length": "4096"}, {"reduce_bucket_size": "2e8"},
               {"prefetch_bucket_size": "1e8"}, {}]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScenarioWarning)
        names = [read_runs_text(_rows([15], **c), "t.csv")[0].name for c in changes]
    assert len(set(names)) == len(changes)


def test_configurations_of_one_table_never_share_a_name():
    """Runs of one shape on several builds: 0.13.3 and 0.14.0 replay apart, so do an unbound
    (8074cd62) and a bound (d18d6f81) launch; each gets its build in its name, where the
    names would be shared, and the scenario takes it."""
    header, row = _rows([13], drop=MEASURED).splitlines()
    builds = ["0.13.3+8074cd62", "0.14.0", "0.13.3+d18d6f81", "0.13.3+fa8c1df2"]
    table = "\n".join([header] + [row.replace("0.13.3+8074cd62", b) for b in builds]) + "\n"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        groups = configurations(read_runs_text(table, "t.csv"))
    assert [(c.name, [r.row for r in c.runs]) for c in groups] == [
        ("11.20b-dp4-mb4-ga1-sg1e08-ds0.13.3-8074cd62", [1, 4]),
        ("11.20b-dp4-mb4-ga1-sg1e08-ds0.14.0", [2]),
        ("11.20b-dp4-mb4-ga1-sg1e08-ds0.13.3-d18d6f81", [3])]
    assert [c.name for c in configurations(read_runs(TABLE))] == [
        c.first.name for c in configurations(read_runs(TABLE))]


def test_an_empty_cell_of_a_column_with_a_default_takes_the_default_and_a_warning_says_so():
    """A table joining runs that recorded different settings leaves cells empty; a required
    column's empty cell stays an error."""
    full, = read_runs_text(_rows([15]), "t.csv")
    with pytest.warns(ScenarioWarning, match=re.escape(
            "t.csv: row(s) 1: no sub_group_size; they take sub_group_size=1000000000")):
        blank, = read_runs_text(_rows([15], sub_group_size=""), "t.csv")
    assert (blank.sub_group_size, full.sub_group_size) == (1_000_000_000, 100_000_000)
    assert replace(blank, sub_group_size=full.sub_group_size) == full
    with pytest.raises(ScenarioError, match=re.escape(
            "row 1.hidden_size: expected a positive whole number, got ''")):
        read_runs_text(_rows([15], hidden_size=""), "t.csv")


def test_the_fork_columns_may_carry_the_offload_optimizer_prefix():
    """As the table spells `offload_optimizer_pin_memory`; both spellings must agree."""
    header, row = _rows([39], drop=MEASURED).splitlines()
    row = row.replace("c7da512a", "4570a955")
    run, = read_runs_text(f"{header},offload_optimizer_prefetch_optimizer,"
                          f"offload_optimizer_prefetch_optimizer_gap\n{row},True,3\n", "t.csv")
    assert (run.prefetch_optimizer, run.prefetch_optimizer_gap) == (True, 3)
    with pytest.raises(ScenarioError, match=r"row 1\.offload_optimizer_prefetch_optimizer_gap"):
        read_runs_text(f"{header},prefetch_optimizer_gap,offload_optimizer_prefetch_optimizer_gap"
                       f"\n{row},3,4\n", "t.csv")


def test_set_switches_a_fork_option_on_for_every_row_of_its_builds():
    """A table of fork builds without the option columns, priced with `--set`: the rows keep
    their build label, so the key is read (a release would refuse it)."""
    runs = read_runs_text(_rows([15], drop=MEASURED), "t.csv")
    plain, = predict(runs, "polaris-a100", workers=1).predictions
    key = "deepspeed.zero_optimization.offload_optimizer.part_grads_async"
    flushed, = predict(runs, "polaris-a100", overrides={key: True}, workers=1).predictions
    assert flushed.status == "ok" and flushed.predicted["backward"] < plain.predicted["backward"]


@pytest.mark.parametrize(("setting", "instead"), [
    ("hardware=dgx-a100", "--hardware NAME|FILE (hardware.<key> patches its values)"),
    ("data_parallel=2", "the table's num_gpus"),
    ("model=llama2-7b", "the table's model columns (model.<field> patches them)"),
])
def test_a_set_of_what_the_table_or_hardware_gives_is_refused(tmp_path, setting, instead):
    key, _, value = setting.partition("=")
    result = CliRunner().invoke(main, ["predict", str(TABLE), "--hardware", "polaris-a100",
                                       "--out", str(tmp_path / "out"), "--set", setting])
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == (
        f"error: --set: {key}: expected a value the rows do not give: the rows take it from "
        f"{instead}, got {value if key == 'data_parallel' else repr(value)}")
    assert not (tmp_path / "out").exists()


def test_the_table_compares_the_time_between_the_phases(tmp_path):
    """Row 1 (11.2B DP=1 micro-batch 1): 17,446.28 - 355.38 - 8,663.94 - 7,991.90 = 435.06 ms
    outside DeepSpeed's timers; rows 2 and 7 repeat one configuration (20,579.25 - 1,255.73 -
    11,024.02 - 7,913.62 = 385.88 ms and 19,808.84 - 1,081.34 - 10,241.10 - 8,093.94 =
    392.46 ms). Predicted: the run's iteration less its three phases per step, of which the
    memory reports are the summary's."""
    table = tmp_path / "runs.csv"
    table.write_text(_rows([1, 2, 7]))
    out = tmp_path / "out"
    _, rows = invoke_for_table(["predict", str(table), "--hardware", "polaris-a100",
                                "--workers", "1", "--out", str(out)], out / "predictions.csv")
    single, pair = rows
    assert float(single["measured_between_phases_s"]) == pytest.approx(0.43506, rel=1e-9)
    assert float(pair["measured_between_phases_s"]) == pytest.approx(
        (0.38588 + 0.39246) / 2, rel=1e-9)
    assert float(pair["spread_between_phases"]) == pytest.approx(
        (0.39246 - 0.38588) / ((0.38588 + 0.39246) / 2), rel=1e-9)
    assert single["spread_between_phases"] == ""
    for row in rows:
        between = (float(row["predicted_iteration_s"]) - float(row["predicted_forward_s"])
                   - float(row["predicted_backward_s"]) - float(row["predicted_update_s"]))
        assert float(row["predicted_between_phases_s"]) == pytest.approx(between, rel=1e-9)
        assert 0 < float(row["predicted_memory_reports_s"]) < between
        assert float(row["error_between_phases"]) == pytest.approx(
            between / float(row["measured_between_phases_s"]) - 1, rel=1e-9)
