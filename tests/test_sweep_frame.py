"""`zerosim.sweep_frame`: a sweep straight into a DataFrame, the same table `zerosim sweep`
writes, refused as `zerosim sweep` refuses it."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml
from test_sweep import BUCKET, PIN, TINY_SCENARIO, VERSION, write_sweep

import zerosim
from zerosim.errors import ScenarioError, ScenarioWarning
from zerosim.sweep import SweepError, run_sweep

SPEC = {"base": "tiny.yaml",
        "set": {"deepspeed.zero_optimization.sub_group_size": 3e4},
        "grid": {BUCKET: {"start": 1e4, "stop": 1e6, "num": 3, "scale": "log"}},
        "zip": {VERSION: ["0.13.3", "0.19.5"], "sequence_length": [128, 256]},
        "variants": [{"name": "pinned", "set": {PIN: True}},
                     {"name": "pageable", "set": {PIN: False}}]}


@pytest.fixture()
def folder(tmp_path, monkeypatch):
    """A folder holding the tiny scenario and SPEC, made the working folder."""
    write_sweep(tmp_path, SPEC)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("explain", [False, True])
def test_a_spec_file_gives_the_table_zerosim_sweep_writes(folder, explain):
    frame = zerosim.sweep_frame(spec="sweep.yaml", explain=explain)
    written = pd.read_csv(run_sweep(folder / "sweep.yaml", out_dir=folder / "out", workers=1,
                                    explain=explain).results_csv)
    pd.testing.assert_frame_equal(frame, written)
    assert len(frame) == 12 and set(frame.status) == {"ok"}
    assert frame.columns[:6].tolist() == ["index", "point_id", BUCKET, VERSION,
                                          "sequence_length", "variant"]
    assert frame["index"].tolist() == list(range(12))
    assert ("waits_on.update" in frame.columns) == explain


def test_the_same_sections_given_as_python_values_give_the_same_frame(folder):
    inline = zerosim.sweep_frame("tiny.yaml", overrides=SPEC["set"], grid=SPEC["grid"],
                                 zip=SPEC["zip"], variants=SPEC["variants"])
    pd.testing.assert_frame_equal(inline, zerosim.sweep_frame(spec="sweep.yaml"))


def test_an_axis_may_be_any_sequence_as_python_writes_one(folder):
    """A tuple, a range or a NumPy array is the list a file would give (NumPy's scalars
    become Python's, so an integer key takes them); text is a value, not a sequence."""
    import numpy as np

    listed = zerosim.sweep_frame("tiny.yaml", grid={BUCKET: [1e4, 1e5, 1e6],
                                                    "sequence_length": [128, 256]})
    for buckets, lengths in (((1e4, 1e5, 1e6), range(128, 257, 128)),
                             (np.logspace(4, 6, 3), np.array([128, 256]))):
        pd.testing.assert_frame_equal(zerosim.sweep_frame(
            "tiny.yaml", grid={BUCKET: buckets, "sequence_length": lengths}), listed)
    with pytest.raises(ScenarioError, match=f"sweep of tiny.yaml: grid.{VERSION}: expected a "
                       "non-empty list of values or a range"):
        zerosim.sweep_frame("tiny.yaml", grid={VERSION: "0.19.5"})


def test_two_processes_give_the_frame_one_gives(folder):
    pd.testing.assert_frame_equal(zerosim.sweep_frame(spec="sweep.yaml", workers=2),
                                  zerosim.sweep_frame(spec="sweep.yaml"))


def test_each_row_is_the_run_of_its_point(folder):
    """Row by row, what `simulate` gives the point's overrides."""
    frame = zerosim.sweep_frame("tiny.yaml", grid={PIN: [True, False],
                                                   VERSION: ["0.13.3", "0.19.5"]})
    for row in frame.to_dict("records"):
        summary = zerosim.simulate("tiny.yaml", overrides={PIN: row[PIN],
                                                          VERSION: row[VERSION]}).summary
        assert row["iteration_s"] == summary["iteration_s"]
        assert row["phases_s.backward_boundary"] == summary["phases_s"]["backward_boundary"]
    assert frame.iteration_s.nunique() == 4


def test_overrides_apply_on_top_of_a_spec_as_the_commands_set_does(folder):
    frame = zerosim.sweep_frame(spec="sweep.yaml", overrides=["data_parallel=1",
                                                              "activation_checkpointing=true"])
    written = pd.read_csv(run_sweep(folder / "sweep.yaml", out_dir=folder / "out", workers=1,
                                    overrides=["data_parallel=1",
                                               "activation_checkpointing=true"]).results_csv)
    pd.testing.assert_frame_equal(frame, written)
    with pytest.raises(ScenarioError, match=f"--set: {BUCKET}: expected a path that "):
        zerosim.sweep_frame(spec="sweep.yaml", overrides={BUCKET: 1e5})


def test_bad_axis_values_are_refused_before_anything_runs_as_the_command_refuses_them(
        folder, monkeypatch):
    ran = []
    monkeypatch.setattr("zerosim.sweep.frame.drive", lambda *a, **k: ran.append(a))
    with pytest.raises(SweepError) as refused:
        zerosim.sweep_frame("tiny.yaml", grid={BUCKET: [1e5, -1, 2e5],
                                               "deepspeed.train_micro_batch_size_per_gpu": [1, 0]})
    text = str(refused.value)
    assert f"sweep of tiny.yaml: grid.{BUCKET}[1]: expected " in text
    assert "grid.deepspeed.train_micro_batch_size_per_gpu[1]: expected " in text
    assert ran == []


@pytest.mark.parametrize(("arguments", "message"), [
    ({}, "either base"),
    ({"base": "tiny.yaml", "spec": "sweep.yaml"}, "either base"),
    ({"spec": "sweep.yaml", "grid": {BUCKET: [1e5]}}, "takes its axes from the file"),
])
def test_a_call_that_names_no_sweep_or_two_is_a_type_error(folder, arguments, message):
    with pytest.raises(TypeError, match=message):
        zerosim.sweep_frame(**arguments)


def test_a_base_that_is_not_there_is_named_relative_to_the_working_folder(folder):
    with pytest.raises(ScenarioError, match="sweep of missing.yaml: base: expected an existing "
                       r"scenario file \(relative to the working folder\)"):
        zerosim.sweep_frame("missing.yaml", grid={BUCKET: [1e5]})


def test_a_point_that_does_not_fit_is_a_row_and_the_bases_warnings_are_told_once(folder):
    tree = {**TINY_SCENARIO, "deepspeed": {**TINY_SCENARIO["deepspeed"],
                                           "amp": {"enabled": False}}}
    (folder / "warns.yaml").write_text(yaml.safe_dump(tree))
    with pytest.warns(ScenarioWarning) as told:
        frame = zerosim.sweep_frame("warns.yaml", grid={"model.hidden_size": [256, 65536]})
    assert frame.status.tolist() == ["ok", "oom"]
    assert frame.iteration_s.isna().tolist() == [False, True]
    assert [str(w.message) for w in told] == [
        f"{(folder / 'warns.yaml').resolve()}: zerosim does not model these keys and ignores "
        "them: deepspeed.amp"]
