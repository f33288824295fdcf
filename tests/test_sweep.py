"""Sweeps: spec parsing, up-front validation, executors that agree byte for byte, resume."""

from __future__ import annotations

import csv
import json
import shutil
import sys
from concurrent.futures import Executor, Future
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from zerosim.cli import main
from zerosim.errors import ScenarioError
from zerosim.sweep import SweepError, expand_range, load_sweep, run_point, run_sweep
from zerosim.sweep.runner import DaskMissingError, InlineExecutor, open_executor
from zerosim.sweep.spec import validate

# A cheap base: each simulate takes a few tens of milliseconds.
TINY_SCENARIO = {
    "name": "tiny",
    "model": {"family": "llama", "hidden_size": 256, "num_hidden_layers": 2,
              "intermediate_size": 512, "num_attention_heads": 4, "vocab_size": 1000},
    "sequence_length": 128,
    "hardware": "h100-jlse",
    "data_parallel": 1,
    "deepspeed": {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 2,
        "fp16": {"enabled": True},
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
    },
}
BUCKET = "deepspeed.zero_optimization.reduce_bucket_size"
SUB_GROUP = "deepspeed.zero_optimization.sub_group_size"
PIN = "deepspeed.zero_optimization.offload_optimizer.pin_memory"
VERSION = "runtime.deepspeed_version"

# 10 x 5 x 2 x 2 = 200 points
BIG_SWEEP = {
    "base": "tiny.yaml",
    "grid": {
        BUCKET: {"start": 1e4, "stop": 1e6, "num": 10, "scale": "log"},
        SUB_GROUP: [1e4, 3e4, 1e5, 3e5, 1e6],
        PIN: [True, False],
        VERSION: ["0.13.3", "0.19.5"],
    },
}


def write_sweep(folder: Path, spec: dict, name: str = "sweep.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    base = folder / "tiny.yaml"
    if not base.exists():
        base.write_text(yaml.safe_dump(TINY_SCENARIO))
    path = folder / name
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> tuple[Path, Path]:
    """The 200-point sweep run once in process: (spec, output folder), the reference."""
    folder = tmp_path_factory.mktemp("big")
    spec = write_sweep(folder, BIG_SWEEP)
    out = folder / "serial"
    outcome = run_sweep(spec, out_dir=out, workers=1)
    assert outcome.ran == 200 and outcome.counts["ok"] == 200
    return spec, out


# ------------------------------------------------------------------ spec parsing


def test_grid_is_a_cartesian_product_first_axis_slowest(tmp_path):
    spec = load_sweep(write_sweep(tmp_path, {
        "base": "tiny.yaml", "grid": {"data_parallel": [1, 2, 4], PIN: [True, False]}}))
    points = spec.points()
    assert len(points) == 6
    assert [(p.values["data_parallel"], p.values[PIN]) for p in points] == [
        (1, True), (1, False), (2, True), (2, False), (4, True), (4, False)]
    assert [p.index for p in points] == list(range(6))
    assert len({p.point_id for p in points}) == 6
    again = load_sweep(spec.path).points()
    assert [p.point_id for p in again] == [p.point_id for p in points]


def test_zip_advances_together_and_multiplies_the_grid(tmp_path):
    spec = load_sweep(write_sweep(tmp_path, {
        "base": "tiny.yaml",
        "set": {"sequence_length": 64},
        "grid": {PIN: [True, False]},
        "zip": {"data_parallel": [1, 2, 4], BUCKET: [1e5, 2e5, 4e5]}}))
    points = spec.points()
    assert len(points) == 6
    assert {(p.values["data_parallel"], p.values[BUCKET]) for p in points} == {
        (1, 1e5), (2, 2e5), (4, 4e5)}
    assert all(p.overrides["sequence_length"] == 64 for p in points)
    assert spec.axis_columns == [PIN, "data_parallel", BUCKET]


def test_ranges_give_exact_values():
    def rng(**kw):
        return expand_range(kw, "s.yaml", "grid.x")

    assert rng(start=0.0, stop=1.0, num=5) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert rng(start=0.1, stop=0.3, num=3) == [0.1, 0.2, 0.3]
    assert rng(start=1, stop=4, num=4) == [1, 2, 3, 4]
    assert all(type(v) is int for v in rng(start=1, stop=4, num=4))
    assert rng(start=1, stop=1000, num=4, scale="log") == [1, 10, 100, 1000]
    assert rng(start=1e8, stop=1e9, num=3, scale="log") == [1e8, 316227766.017, 1e9]
    assert rng(start=2.0, stop=32.0, num=5, scale="log") == [2.0, 4.0, 8.0, 16.0, 32.0]
    assert rng(start=5e8, stop=9e8, num=1) == [5e8]


def test_variants_alone_and_with_a_grid(tmp_path):
    alone = load_sweep(write_sweep(tmp_path, {
        "base": "tiny.yaml", "set": {PIN: True},
        "variants": [{"name": "pinned"}, {"set": {PIN: False}},
                     {"name": "big bucket", "set": {BUCKET: 1e6}}]})).points()
    assert [p.values["variant"] for p in alone] == ["pinned", "pin_memory=false", "big bucket"]
    # variants may override `set`; their paths become columns, filled from `set` or empty
    assert [p.overrides[PIN] for p in alone] == [True, False, True]
    assert [p.values[PIN] for p in alone] == [True, False, True]
    assert [p.values[BUCKET] for p in alone] == [None, None, 1e6]

    both = load_sweep(write_sweep(tmp_path, {
        "base": "tiny.yaml", "grid": {"data_parallel": [1, 2]},
        "variants": [{"name": "a", "set": {PIN: True}}, {"name": "b", "set": {PIN: False}}]},
        name="both.yaml")).points()
    assert [(p.values["data_parallel"], p.values["variant"]) for p in both] == [
        (1, "a"), (1, "b"), (2, "a"), (2, "b")]


@pytest.mark.parametrize(("spec", "key", "words"), [
    ({"base": "tiny.yaml", "grdi": {}}, "grdi", "one of the known keys"),
    ({"grid": {"data_parallel": [1]}}, "base", "scenario YAML"),
    ({"base": "nothere.yaml"}, "base", "an existing scenario file"),
    ({"base": "tiny.yaml", "grid": {BUCKET: {"start": 1, "stop": 2, "num": 0}}},
     f"grid.{BUCKET}.num", "an integer >= 1"),
    ({"base": "tiny.yaml", "grid": {BUCKET: {"start": 1e4, "stop": 1e5}}},
     f"grid.{BUCKET}.num", "a range needs"),
    ({"base": "tiny.yaml", "grid": {BUCKET: {"start": -1.0, "stop": 1e5, "num": 3,
                                             "scale": "log"}}},
     f"grid.{BUCKET}.start", "> 0 for scale: log"),
    ({"base": "tiny.yaml", "grid": {BUCKET: {"start": 1, "stop": 9, "num": 3, "scale": "ln"}}},
     f"grid.{BUCKET}.scale", "linear or log"),
    ({"base": "tiny.yaml", "grid": {BUCKET: 5e8}}, f"grid.{BUCKET}", "a non-empty list"),
    ({"base": "tiny.yaml", "grid": {BUCKET: []}}, f"grid.{BUCKET}", "a non-empty list"),
    ({"base": "tiny.yaml", "zip": {"data_parallel": [1, 2], BUCKET: [1e5, 2e5, 3e5]}},
     f"zip.{BUCKET}", "as long as zip.data_parallel (2 values)"),
    ({"base": "tiny.yaml", "grid": {"data_parallel": [1]}, "zip": {"data_parallel": [2]}},
     "zip.data_parallel", "not already swept by grid"),
    ({"base": "tiny.yaml", "variants": [{"name": "a"}, {"name": "a", "set": {PIN: True}}]},
     "variants[1].name", "a name different from variants[0]"),
    ({"base": "tiny.yaml", "variants": [{"name": "a", "sett": {}}]},
     "variants[0].sett", "one of the variant keys"),
    ({"base": "tiny.yaml", "grid": {"data_parallel": [1, 1]}}, "point 1 (data_parallel=1)",
     "a point different from point 0"),
])
def test_bad_structure_names_the_key(tmp_path, spec, key, words):
    path = write_sweep(tmp_path, spec)
    with pytest.raises(ScenarioError) as caught:
        load_sweep(path).points()
    assert caught.value.source == str(path)
    assert caught.value.key_path == key
    assert words in str(caught.value)


PATH_EXPECTED = ("a dotted key path like deepspeed.zero_optimization.stage (names between "
                 "single dots, none empty; no space or '=')")


@pytest.mark.parametrize(("spec", "key", "path"), [
    ({"grid": {"deepspeed..zero_optimization.stage": [1, 2]}},
     "grid.deepspeed..zero_optimization.stage", "deepspeed..zero_optimization.stage"),
    ({"zip": {".data_parallel": [1, 2]}}, "zip..data_parallel", ".data_parallel"),
    ({"set": {"sequence_length.": 64}, "grid": {"data_parallel": [1, 2]}},
     "set.sequence_length.", "sequence_length."),
    ({"variants": [{"set": {"model..num_hidden_layers": 1}}, {"name": "base"}]},
     "variants[0].set.model..num_hidden_layers", "model..num_hidden_layers"),
])
def test_a_path_with_an_empty_segment_is_refused_as_set_refuses_it(tmp_path, spec, key, path):
    """The same rule as `--set` (`scenario.check_override_path`): the path would otherwise
    land on a key named '' and be dropped, giving identical points."""
    spec_path = write_sweep(tmp_path, {"base": "tiny.yaml", **spec})
    with pytest.raises(ScenarioError) as caught:
        load_sweep(spec_path)
    assert str(caught.value) == f"{spec_path}: {key}: expected {PATH_EXPECTED}, got '{path}'"
    with pytest.raises(ScenarioError, match=r"^--set: deepspeed\.\.stage: expected a dotted"):
        load_sweep(write_sweep(tmp_path, {"base": "tiny.yaml", "grid": {PIN: [True, False]}},
                               name="ok.yaml"), ["deepspeed..stage=1"])


def test_command_line_set_may_not_fix_a_swept_path(tmp_path):
    path = write_sweep(tmp_path, {"base": "tiny.yaml", "grid": {"data_parallel": [1, 2]}})
    with pytest.raises(ScenarioError, match="grid sweeps it"):
        load_sweep(path, ["data_parallel=4"])
    assert load_sweep(path, ["sequence_length=64"]).fixed == {"sequence_length": 64}


def test_a_bad_fixed_value_names_set_or_the_command_line(tmp_path):
    path = write_sweep(tmp_path, {"base": "tiny.yaml", "set": {"attention": "fast"},
                                  "grid": {"data_parallel": [1, 2]}})
    with pytest.raises(SweepError, match=r"sweep.yaml: set.attention: expected .*got 'fast'"):
        run_sweep(path, out_dir=tmp_path / "out", workers=1)
    path = write_sweep(tmp_path, {"base": "tiny.yaml", "grid": {"data_parallel": [1, 2]}})
    with pytest.raises(SweepError) as caught:
        run_sweep(path, out_dir=tmp_path / "out", workers=1, overrides=["sequence_length=-1"])
    assert str(caught.value) == f"{path}: --set sequence_length: expected a number >= 1, got -1"
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ validation


def test_a_bad_value_names_axis_index_and_value_and_nothing_is_written(tmp_path):
    path = write_sweep(tmp_path, {"base": "tiny.yaml",
                                  "grid": {BUCKET: [1e5, 2e5, -1], PIN: [True, False]}})
    out = tmp_path / "out"
    with pytest.raises(SweepError) as caught:
        run_sweep(path, out_dir=out, workers=1)
    assert str(caught.value) == (f"{path}: grid.{BUCKET}[2]: expected a number > 0, got -1")
    assert caught.value.invalid_points == 2
    assert not out.exists()


def test_every_bad_value_is_reported_together(tmp_path):
    path = write_sweep(tmp_path, {
        "base": "tiny.yaml",
        "grid": {BUCKET: [-1, 1e5], "data_parallel": [1, 8]},
        "variants": [{"name": "ok"}, {"name": "bad hbm", "set": {"hardware.gpu.hbm_GiB": -2}},
                     {"name": "ignored", "set": {"deepspeed.zero_optimization.foo": 1}},
                     {"name": "typo", "set": {"deepspeed.zero_optimization.reduce_bucket_sise": 3}}
                     ]})
    result = CliRunner().invoke(main, ["sweep", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    text = result.output
    assert "15 invalid point(s), 5 problems; nothing was run" in text
    assert f"grid.{BUCKET}[0]: expected a number > 0, got -1" in text
    assert ("grid.data_parallel[1]: expected at most the 4 GPUs of h100-jlse (1 node(s) x 4; "
            "hardware.nodes adds nodes), got 8") in text
    assert ("variants[3].set.deepspeed.zero_optimization.reduce_bucket_sise: expected a known "
            "key (did you mean 'reduce_bucket_size'?)") in text
    assert "variants[1].set.hardware.gpu.hbm_GiB: expected a positive number of GiB, got -2" in (
        text)
    assert "variants[2].set.deepspeed.zero_optimization.foo: expected a key zerosim models" in (
        text)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("spec", "line"), [
    ({"grid": {"sequence_length": [64, 64.0]}},
     "point 1 (sequence_length=64.0): expected a point different from point 0 "
     "(sequence_length=64) once resolved, got {'sequence_length': 64.0}"),
    ({"grid": {BUCKET: [5e8, 500000000]}},
     f"point 1 ({BUCKET}=500000000): expected a point different from point 0 "
     f"({BUCKET}=500000000.0) once resolved, got {{'{BUCKET}': 500000000}}"),
    ({"variants": [{"name": "base"}, {"name": "stage 3", "set": {
        "deepspeed.zero_optimization.stage": 3}}]},
     "point 1 (variant=stage 3, deepspeed.zero_optimization.stage=3): expected a point "
     "different from point 0 (variant=base, deepspeed.zero_optimization.stage=null) once "
     "resolved, got {'deepspeed.zero_optimization.stage': 3}"),
])
def test_points_that_resolve_alike_are_refused_before_anything_runs(tmp_path, spec, line):
    """Overrides that differ as written but resolve to one scenario (a number written two
    ways, a variant setting the base's own value) would simulate the same row twice."""
    path = write_sweep(tmp_path, {"base": "tiny.yaml", **spec})
    with pytest.raises(SweepError) as caught:
        run_sweep(path, out_dir=tmp_path / "out", workers=1)
    assert str(caught.value) == f"{path}: {line}"
    assert caught.value.invalid_points == 1
    assert not (tmp_path / "out").exists()


def test_a_default_written_out_is_a_duplicate_only_where_it_is_the_default(tmp_path):
    """`overlap_comm: true` is DeepSpeed's default at stage 3 but not at stage 2: beside a
    variant that leaves it out, only the stage-3 point repeats one."""
    overlap = "deepspeed.zero_optimization.overlap_comm"
    path = write_sweep(tmp_path, {"base": "tiny.yaml",
                                  "grid": {"deepspeed.zero_optimization.stage": [2, 3]},
                                  "variants": [{"name": "default"},
                                               {"name": "overlap", "set": {overlap: True}}]})
    with pytest.raises(SweepError) as caught:
        run_sweep(path, out_dir=tmp_path / "out", workers=1)
    assert str(caught.value) == (
        f"{path}: point 3 (deepspeed.zero_optimization.stage=3, variant=overlap, "
        f"{overlap}=true): expected a point different from point 2 "
        f"(deepspeed.zero_optimization.stage=3, variant=default, {overlap}=null) once "
        "resolved, got {'deepspeed.zero_optimization.stage': 3, "
        "'deepspeed.zero_optimization.overlap...")  # a value is shown in 80 characters


@pytest.mark.parametrize(("spec", "origin", "path", "got"), [
    ({"grid": {"deepspeed.wall_clock_breakdown": [True, False]}},
     "grid.deepspeed.wall_clock_breakdown[0]", "deepspeed.wall_clock_breakdown", "true"),
    ({"grid": {"deepspeed.steps_per_print": [10, 100]}},
     "grid.deepspeed.steps_per_print[0]", "deepspeed.steps_per_print", "10"),
    ({"zip": {"deepspeed.zero_optimization.round_robin_gradients": [True, False]}},
     "zip.deepspeed.zero_optimization.round_robin_gradients[0]",
     "deepspeed.zero_optimization.round_robin_gradients", "true"),
    ({"variants": [{"name": "a"}, {"name": "b", "set": {
        "deepspeed.zero_optimization.stage": 2, "deepspeed.fp16.loss_scale_window": 500}}]},
     "variants[1].set.deepspeed.fp16.loss_scale_window", "deepspeed.fp16.loss_scale_window",
     "500"),
    ({"set": {"deepspeed.optimizer.params.lr": 0.1}, "grid": {"data_parallel": [1, 2]}},
     "set.deepspeed.optimizer.params.lr", "deepspeed.optimizer.params.lr", "0.1"),
])
def test_a_key_zerosim_accepts_as_changing_nothing_is_not_swept(tmp_path, spec, origin, path,
                                                                got):
    """Logging, scheduler and loss-scale keys are accepted silently in a scenario
    (`scenario.deepspeed.NO_EFFECT_KEYS`): no stage reads them, so every row would be the
    same; refused as a key zerosim ignores is."""
    spec_path = write_sweep(tmp_path, {"base": "tiny.yaml", **spec})
    with pytest.raises(SweepError) as caught:
        run_sweep(spec_path, out_dir=tmp_path / "out", workers=1)
    assert str(caught.value.problems[0]) == (
        f"{spec_path}: {origin}: expected a key zerosim models (it takes {path} to change "
        f"neither time nor memory, so setting it changes nothing), got {got}")
    assert not (tmp_path / "out").exists()


def test_a_key_zerosim_reads_beneath_an_inert_section_is_swept(tmp_path):
    """`optimizer.params` changes nothing but `torch_adam`, which picks PyTorch's Adam."""
    from zerosim.scenario.deepspeed import changes_nothing

    assert changes_nothing("optimizer.params.lr") and changes_nothing("scheduler.params")
    assert not changes_nothing("optimizer.params.torch_adam")
    assert not changes_nothing("optimizer.params") and not changes_nothing("optimizer")
    assert not changes_nothing("zero_optimization.stage") and not changes_nothing("fp16")
    path = write_sweep(tmp_path, {
        "base": "tiny.yaml", "set": {"deepspeed.zero_optimization.offload_optimizer.device":
                                     "none"},
        "grid": {"deepspeed.optimizer.params.torch_adam": [True, False]}})
    spec = load_sweep(path)
    assert validate(spec, spec.points()) == []


# ------------------------------------------------------------------ running


def test_the_worker_returns_a_plain_flat_row(tmp_path):
    base = write_sweep(tmp_path, {"base": "tiny.yaml"}).parent / "tiny.yaml"
    row = run_point(str(base), {PIN: True}, "abc")
    assert row["point_id"] == "abc" and row["status"] == "ok" and row["error"] == ""
    assert {"phases_s.update", "pcie_GB.h2d", "pcie_mean_GBps.d2h", "oom"} <= set(row)
    assert "checks" not in row and row["oom"] is None
    assert all(isinstance(v, str | int | float | type(None)) for v in row.values())
    assert row["wall_s"] > 0


def test_errors_and_oom_are_rows_and_the_sweep_goes_on(tmp_path, monkeypatch):
    import zerosim.api

    real_simulate = zerosim.api.simulate_summary

    def flaky(base, overrides, **options):
        if overrides.get("sequence_length") == 96:
            raise RuntimeError("boom\nsecond line")
        return real_simulate(base, overrides, **options)

    monkeypatch.setattr(zerosim.api, "simulate_summary", flaky)   # workers=1: in this process
    path = write_sweep(tmp_path, {"base": "tiny.yaml", "variants": [
        {"name": "raises", "set": {"sequence_length": 96}},
        {"name": "tiny hbm", "set": {"hardware.gpu.hbm_GiB": 0.001}},
        {"name": "fine"}]})
    outcome = run_sweep(path, out_dir=tmp_path / "out", workers=1)
    rows = {r["variant"]: r for r in read_csv(outcome.results_csv)}
    assert [r["status"] for r in rows.values()] == ["error", "oom", "ok"]
    assert rows["raises"]["error"] == "RuntimeError: boom / second line"
    assert rows["raises"]["iteration_s"] == ""
    oom = json.loads(rows["tiny hbm"]["oom"])
    assert oom["device"] == "gpu0" and rows["tiny hbm"]["error"] == ""
    assert float(rows["fine"]["iteration_s"]) > 0
    assert outcome.counts == {"ok": 1, "oom": 1, "error": 1}


def test_a_point_run_would_refuse_fails_the_pre_check(tmp_path):
    """The sweep's pre-check refuses what `zerosim run` refuses (one place decides), naming
    the variant, before anything runs."""
    path = write_sweep(tmp_path, {"base": "tiny.yaml", "variants": [
        {"name": "params on host at stage 2",
         "set": {"deepspeed.zero_optimization.stage": 2,
                 "deepspeed.zero_optimization.offload_param.device": "cpu"}},
        {"name": "fine"}]})
    with pytest.raises(SweepError) as caught:
        run_sweep(path, out_dir=tmp_path / "out", workers=1)
    assert "parameter offload is a ZeRO-3 feature" in str(caught.value)
    assert not (tmp_path / "out" / "results.csv").exists()


def test_outputs_of_a_sweep(big):
    spec, out = big
    names = {p.name for p in out.iterdir()}
    assert {"results.csv", "timings.csv", "points.json", "sweep.yaml"} <= names
    assert (out / "sweep.yaml").read_text() == spec.read_text()
    rows = read_csv(out / "results.csv")
    assert [int(r["index"]) for r in rows] == list(range(200))
    header = list(rows[0])
    assert header[:6] == ["index", "point_id", BUCKET, SUB_GROUP, PIN, VERSION]
    assert header[6] == "status" and header[-1] == "error"
    assert {"iteration_s", "phases_s.update", "pcie_GB.h2d", "tflops_per_gpu"} <= set(header)
    assert "wall_s" not in header
    assert rows[20][BUCKET] == "16681.005372" and rows[0][PIN] == "true"
    assert rows[1][VERSION] == "0.19.5" and rows[2][PIN] == "false"
    timings = read_csv(out / "timings.csv")
    assert [t["point_id"] for t in timings] == [r["point_id"] for r in rows]
    points = json.loads((out / "points.json").read_text())["points"]
    assert [p["point_id"] for p in points] == [r["point_id"] for r in rows]


def test_two_processes_give_the_same_bytes(big, tmp_path):
    spec, reference = big
    outcome = run_sweep(spec, out_dir=tmp_path / "two", workers=2)
    assert outcome.executor == "on 2 processes"
    assert outcome.results_csv.read_bytes() == (reference / "results.csv").read_bytes()
    assert (tmp_path / "two" / "points.json").read_bytes() == (
        reference / "points.json").read_bytes()


def test_resume_runs_only_the_missing_points_once(big, tmp_path):
    spec, reference = big
    out = tmp_path / "resumed"
    shutil.copytree(reference, out)
    lines = (out / "results.csv").read_text().splitlines(keepends=True)
    removed = {7, 50, 51, 123}
    kept = [line for i, line in enumerate(lines) if i - 1 not in removed]
    # a kill mid-write leaves half a line at the end
    body = "".join(kept[:-1]) + kept[-1][: len(kept[-1]) // 2]
    (out / "results.csv").write_text(body)
    ran: list[str] = []

    class Counting(InlineExecutor):
        def submit(self, fn, /, *args, **kwargs):
            ran.append(args[2])
            return super().submit(fn, *args, **kwargs)

    outcome = run_sweep(spec, out_dir=out, workers=1, executor=Counting())
    assert outcome.ran == len(removed) + 1 == len(ran) == len(set(ran))
    assert outcome.resumed.repaired == 1 and outcome.resumed.kept == 200 - len(removed) - 1
    assert (out / "results.csv").read_bytes() == (reference / "results.csv").read_bytes()
    assert len(read_csv(out / "timings.csv")) == 200
    again = run_sweep(spec, out_dir=out, workers=1, executor=Counting())
    assert again.ran == 0 and len(ran) == len(removed) + 1
    assert (out / "results.csv").read_bytes() == (reference / "results.csv").read_bytes()


class StopAfter(Executor):
    """Runs points in process, then interrupts the sweep like a Ctrl-C at the n-th point."""

    def __init__(self, n: int):
        self.n = n

    def submit(self, fn, /, *args, **kwargs) -> Future:
        self.n -= 1
        if self.n < 0:
            raise KeyboardInterrupt
        future: Future = Future()
        future.set_result(fn(*args, **kwargs))
        return future


def test_an_interrupted_sweep_keeps_its_rows_and_resumes(tmp_path):
    path = write_sweep(tmp_path, {"base": "tiny.yaml", "grid": {BUCKET: [1e4, 1e5, 1e6],
                                                                 PIN: [True, False]}})
    clean = run_sweep(path, out_dir=tmp_path / "clean", workers=1)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run_sweep(path, out_dir=out, workers=1, executor=StopAfter(4))
    assert [r["index"] for r in read_csv(out / "results.csv")] == ["0", "1", "2", "3"]
    outcome = run_sweep(path, out_dir=out, workers=1)
    assert outcome.ran == 2
    assert (out / "results.csv").read_bytes() == clean.results_csv.read_bytes()


def test_rows_of_points_no_longer_in_the_sweep_move_aside(tmp_path):
    path = write_sweep(tmp_path, {"base": "tiny.yaml", "grid": {BUCKET: [1e4, 1e5, 1e6]}})
    run_sweep(path, out_dir=tmp_path / "out", workers=1)
    write_sweep(tmp_path, {"base": "tiny.yaml", "grid": {BUCKET: [1e5, 1e6, 1e7]}})
    outcome = run_sweep(path, out_dir=tmp_path / "out", workers=1)
    assert outcome.ran == 1 and outcome.resumed.stale == 1 and outcome.resumed.kept == 2
    assert [r[BUCKET] for r in read_csv(outcome.results_csv)] == [
        "100000.0", "1000000.0", "10000000.0"]
    assert [r[BUCKET] for r in read_csv(tmp_path / "out" / "results.stale.csv")] == ["10000.0"]


def _a_finished_sweep(tmp_path: Path) -> tuple[Path, Path]:
    path = write_sweep(tmp_path, {"base": "tiny.yaml", "grid": {BUCKET: [1e4, 1e5]}})
    out = tmp_path / "out"
    run_sweep(path, out_dir=out, workers=1)
    return path, out


@pytest.mark.parametrize("damage, got", [
    (lambda f: f.write_bytes(f.read_bytes() + b"\xff\xfe\n"),
     "expected the UTF-8 CSV a zerosim sweep writes, got bytes that are not UTF-8"),
    (lambda f: f.write_text(f.read_text().replace(",status,", ",STATUS,")),
     "is not a zerosim sweep's results file (no 'status' column)"),
    (lambda f: (f.unlink(), f.mkdir()),
     "expected the CSV a zerosim sweep writes, got a folder"),
])
def test_a_damaged_results_file_is_refused_and_nothing_is_rewritten(tmp_path, damage, got):
    path, out = _a_finished_sweep(tmp_path)
    damage(out / "results.csv")
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name != ".sweep.lock"}
    result = CliRunner().invoke(main, ["sweep", str(path), "--out", str(out), "--workers", "1"])
    assert result.exit_code == 2
    separator = ": " if got.startswith("expected") else " "
    assert result.output == (f"error: {out / 'results.csv'}{separator}{got}; choose another "
                             "--out\n")
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()
            if p.name != ".sweep.lock"} == before


def test_a_dask_address_that_cannot_be_used_is_refused_before_anything_is_written(tmp_path):
    pytest.importorskip("distributed")
    path = write_sweep(tmp_path, {"base": "tiny.yaml", "grid": {BUCKET: [1e4, 1e5]}})
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["sweep", str(path), "--out", str(out), "--dask",
                                       "nonsense"])
    assert result.exit_code == 2
    assert result.output == ("error: --dask nonsense: expected 'local' or the address of a "
                             "running Dask scheduler (tcp://HOST:PORT), got missing port number "
                             "in address 'nonsense'\n")
    assert not out.exists()


def test_dask_without_dask_installed_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)
    with pytest.raises(DaskMissingError, match=r"pip install 'zerosim\[dask\]'"), \
            open_executor(2, "local", 10):
        pass


def test_cli_sweep_prints_and_writes_with_a_progress_bar_off_a_terminal(tmp_path):
    path = write_sweep(tmp_path, {"base": "tiny.yaml", "grid": {"data_parallel": [1, 2]},
                                  "variants": [{"name": "pinned", "set": {PIN: True}},
                                               {"name": "pageable", "set": {PIN: False}}]})
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["sweep", str(path), "--out", str(out), "--workers", "1",
                                       "--set", "sequence_length=64"])
    assert result.exit_code == 0, result.output
    assert "4 of 4 points (4 ok); ran 4 in process" in result.output
    assert f"results: {out / 'results.csv'}" in result.output
    assert json.loads((out / "points.json").read_text())["set"] == {"sequence_length": 64}
    again = CliRunner().invoke(main, ["sweep", str(path), "--out", str(out), "--no-progress",
                                      "--set", "sequence_length=64"])
    assert again.exit_code == 0 and "ran 0" in again.output and "4 already" in again.output


def test_cli_plots(tmp_path):
    from zerosim import plots

    path = write_sweep(tmp_path, {"base": "tiny.yaml",
                                  "grid": {"data_parallel": [1, 2], PIN: [True, False]}})
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["sweep", str(path), "--out", str(out), "--workers", "1",
                                       "--no-progress", "--plots"])
    assert result.exit_code == 0, result.output
    if hasattr(plots, "sweep_metric"):
        pngs = {p.name for p in out.glob("*.png")}
        assert "iteration_s_vs_data_parallel.png" in pngs, result.output
    else:
        assert "plots are not available" in result.output


# ------------------------------------------------------------------ Dask (last: it starts threads)


def test_dask_local_cluster_gives_the_same_bytes(big, tmp_path):
    pytest.importorskip("distributed")
    spec, reference = big
    outcome = run_sweep(spec, out_dir=tmp_path / "dask", workers=2, dask="local")
    assert outcome.executor == "on dask LocalCluster (2 workers)"
    assert outcome.results_csv.read_bytes() == (reference / "results.csv").read_bytes()


def test_a_fixed_hardware_patch_applies_to_every_swept_profile(tmp_path):
    from zerosim import load_scenario

    path = write_sweep(tmp_path, {
        "base": "tiny.yaml", "set": {"hardware.pcie.h2d_pinned_GBps": 20},
        "grid": {"hardware": ["h100-jlse", "polaris-a100"]}})
    scenarios = [load_scenario(tmp_path / "tiny.yaml", p.overrides)
                 for p in load_sweep(path).points()]
    assert [(s.hardware.name, s.hardware.h2d_pinned_Bps) for s in scenarios] == [
        ("h100-jlse", 20e9), ("polaris-a100", 20e9)]


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[1] / "scenarios"
                                         / "sweeps").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_sweep_resolves_every_point(path):
    """Each sweep under scenarios/sweeps loads and each of its points resolves as `zerosim
    run` would resolve it (the sweep's pre-check, nothing simulated)."""
    from zerosim.sweep.spec import load_sweep, validate

    spec = load_sweep(path)
    assert spec.points()
    validate(spec, spec.points())


def test_the_nodes_sweep_puts_the_h200_node_ahead_of_the_h100_one_at_one_clock():
    """`scenarios/sweeps/nodes.yaml`: the H200 is the H100's die with faster HBM, so at the
    same SM clock its node is the faster; as shipped, dgx-h200 is priced at the clock a long
    run held under the power cap and the H100 profiles at a burst's, which the sweep's header
    states (the H200 node 3% slower offloaded)."""
    from zerosim.api import simulate_summary
    from zerosim.scenario import load_scenario
    from zerosim.sweep.spec import load_sweep

    spec = load_sweep(Path(__file__).resolve().parents[1] / "scenarios" / "sweeps" / "nodes.yaml")
    offload = "deepspeed.zero_optimization.offload_optimizer.device"
    offloaded = {point.overrides["hardware"]: point.overrides for point in spec.points()
                 if point.overrides[offload] == "cpu"}

    def iteration_s(hardware: str, **changes) -> float:
        scenario = load_scenario(spec.base, {**offloaded[hardware], **changes})
        return simulate_summary(scenario)["iteration_s"]

    h200 = iteration_s("dgx-h200")
    clock = load_scenario(spec.base, offloaded["dgx-h200"]).hardware.sm_clock_fraction
    assert iteration_s("dgx-h100", **{"hardware.gpu.sm_clock_fraction": clock}) > h200
    assert 1.0 < h200 / iteration_s("dgx-h100") < 1.05


def test_axes_are_headed_by_the_shortest_tail_no_other_axis_shares(tmp_path):
    """Two axes ending in `device` are told apart by the key before it; an axis whose last
    key is its own keeps that alone; the variant column is `variant`."""
    optimizer = "deepspeed.zero_optimization.offload_optimizer.device"
    param = "deepspeed.zero_optimization.offload_param.device"
    spec = load_sweep(write_sweep(tmp_path, {
        "base": "tiny.yaml", "grid": {optimizer: ["cpu", "none"], BUCKET: [1e4, 1e5]},
        "variants": [{"name": "on the host", "set": {param: "cpu"}}, {"name": "plain"}]}))
    assert spec.axis_labels == {optimizer: "offload_optimizer.device",
                                BUCKET: "reduce_bucket_size", "variant": "variant",
                                param: "offload_param.device"}
    from rich.console import Console

    from zerosim.sweep.report import render_outcome

    console = Console(width=400, record=True)
    render_outcome(run_sweep(spec.path, out_dir=tmp_path / "out", workers=1), console)
    header = next(line for line in console.export_text().splitlines() if "status" in line)
    assert [cell.strip() for cell in header.strip("┃ ").split("┃")][:4] == [
        "offload_optimizer.device", "reduce_bucket_size", "variant", "offload_param.device"]
