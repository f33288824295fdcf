"""Faults around a run: output folders checked before simulating, outputs published whole,
Ctrl-C and SIGTERM ending with one line and 130/143, exit statuses, strict JSON.

The toy scenario of conftest.py (written to a file) keeps every run a fraction of a second.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tests.conftest import toy_tree
from zerosim.cli import main
from zerosim.interrupts import Interrupted

RUN_FILES = {"summary.json", "capacities.json", "scenario.json", "trace.json", "spans.csv",
             "memory.csv", "phases.csv", "links.csv", "peer_waits.csv", "critical_path.csv"}


@pytest.fixture(autouse=True)
def interactive_signals():
    """Each test starts as from a terminal, Ctrl-C not ignored: pytest itself may run under
    nohup or as a script's background job, which start with SIGINT ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture
def toy_file(tmp_path) -> Path:
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(toy_tree()))
    return path


@pytest.fixture
def no_simulation(monkeypatch):
    """Fail the test if anything is simulated."""
    def refuse(*args, **kwargs):
        raise AssertionError("simulated although the output folder was refused")

    monkeypatch.setattr("zerosim.api.simulate", refuse)
    monkeypatch.setattr("zerosim.api.simulate_brief", refuse)   # what --no-files runs


def invoke(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


def result_files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()} - {p.name for p in folder.glob("*.parquet")}


def litter(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".zerosim-"))


def strict_json(text: str):
    def refuse(constant: str):
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


# ------------------------------------------------------------------ --out checked up front


def test_out_below_a_file_is_refused_before_simulating(tmp_path, toy_file, no_simulation):
    (tmp_path / "plain").write_text("x")
    result = invoke("run", toy_file, "--out", tmp_path / "plain" / "out")
    assert result.exit_code == 2
    assert result.output == (f"error: --out {tmp_path / 'plain' / 'out'}: expected a folder "
                             f"path, got {tmp_path / 'plain'} is a file, not a folder\n")


def test_out_that_is_a_file_is_refused_before_simulating(tmp_path, toy_file, no_simulation):
    (tmp_path / "plain").write_text("x")
    result = invoke("run", toy_file, "--out", tmp_path / "plain")
    assert result.exit_code == 2
    assert result.output.endswith(f"Error: Invalid value for '--out': Directory "
                                  f"'{tmp_path / 'plain'}' is a file.\n")


def test_an_out_name_too_long_is_refused_before_simulating(tmp_path, toy_file, no_simulation):
    out = tmp_path / ("n" * 300)
    result = invoke("run", toy_file, "--out", out)
    assert result.exit_code == 2
    assert result.output.endswith(
        "expected folder names of at most 230 bytes (the filesystem allows 255, and zerosim "
        "writes a temporary folder beside it), got one of 300 bytes\n")


def test_a_scenario_name_of_300_characters_is_refused_before_simulating(tmp_path,
                                                                        no_simulation):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**toy_tree(), "name": "n" * 300}))
    result = invoke("run", path)
    assert result.exit_code == 2
    assert result.output.startswith(f"error: {path}: name: expected a text of 1 to 128 "
                                    "characters usable as a folder name")


def test_a_read_only_folder_is_refused_before_simulating(tmp_path, toy_file, no_simulation,
                                                         monkeypatch):
    """As root a chmod does not stop writes, so there the refusal the filesystem would give an
    ordinary user is made by the folder probe's mkdir."""
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    if os.geteuid() == 0:
        real_mkdir = Path.mkdir

        def read_only_mkdir(self, *args, **kwargs):
            if self.parent == locked:
                raise PermissionError(13, "Permission denied", str(self))
            return real_mkdir(self, *args, **kwargs)

        monkeypatch.setattr(Path, "mkdir", read_only_mkdir)
    result = invoke("run", toy_file, "--out", locked / "out")
    locked.chmod(0o755)
    assert result.exit_code == 2
    assert result.output == (f"error: --out {locked / 'out'}: expected a folder zerosim can "
                             f"write in, got {locked}: permission denied\n")


def test_a_folder_holding_other_files_is_not_replaced(tmp_path, toy_file, no_simulation):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    result = invoke("run", toy_file, "--out", mine)
    assert result.exit_code == 2
    assert result.output.endswith("expected a new or empty folder, or one holding a zerosim "
                                  "result (it is replaced whole), got a folder holding "
                                  "'notes.txt', which zerosim did not write\n")
    assert (mine / "notes.txt").read_text() == "keep me"


def test_the_current_folder_is_not_replaced(tmp_path, toy_file, no_simulation, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("run", toy_file, "--out", ".")
    assert result.exit_code == 2
    assert result.output.endswith("expected a folder other than the current folder and its "
                                  "parents (zerosim replaces the output folder whole), got the "
                                  "current folder\n")


# ------------------------------------------------------------------ publishing whole


def test_a_run_replaces_a_previous_result_whole(tmp_path, toy_file):
    out = tmp_path / "out"
    assert invoke("run", toy_file, "--out", out).exit_code == 0
    (out / "timeline.png").write_bytes(b"an older run's figure")
    assert invoke("run", toy_file, "--out", out).exit_code == 0
    assert result_files(out) == RUN_FILES
    assert litter(tmp_path) == []
    assert oct(out.stat().st_mode & 0o777) == oct(0o777 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_an_interruption_while_writing_leaves_the_previous_output(tmp_path, toy_file,
                                                                  monkeypatch):
    out = tmp_path / "out"
    assert invoke("run", toy_file, "--out", out).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    import zerosim.results.export as export

    real_write = export._write_text

    def interrupted_after_two_files(path, text):
        real_write(path, text)
        if len(list(path.parent.iterdir())) == 2:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)

    monkeypatch.setattr(export, "_write_text", interrupted_after_two_files)
    result = invoke("run", toy_file, "--out", out, "--set", "sequence_length=4")
    assert result.exit_code == 130
    assert result.output == f"interrupted by SIGINT (Ctrl-C): {out} was left as it was\n"
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert litter(tmp_path) == []


def test_a_signal_during_the_publishing_rename_waits_for_it(tmp_path, toy_file, monkeypatch):
    out = tmp_path / "out"
    assert invoke("run", toy_file, "--out", out).exit_code == 0
    real_replace = os.replace
    calls = []

    def replace_then_signal(source, target):
        calls.append(target)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", replace_then_signal)
    result = invoke("run", toy_file, "--out", out, "--set", "sequence_length=4")
    assert result.exit_code == 143
    assert result.output == f"interrupted by SIGTERM: {out} holds this run's result\n"
    assert len(calls) == 2
    assert result_files(out) == RUN_FILES
    assert json.loads((out / "scenario.json").read_text())["sequence_length"] == 4
    assert litter(tmp_path) == []


# ------------------------------------------------------------------ signals and exit status


def _simulation_interrupted_by(signum: int, then=None):
    def simulate(*args, **kwargs):
        try:
            os.kill(os.getpid(), signum)
            time.sleep(5)
        except KeyboardInterrupt:
            if then is not None:
                then()
            raise
        raise AssertionError("the signal did not interrupt the simulation")

    return simulate


@pytest.mark.parametrize(("signum", "status", "name"), [
    (signal.SIGINT, 130, "SIGINT (Ctrl-C)"), (signal.SIGTERM, 143, "SIGTERM")])
def test_a_signal_ends_a_run_with_one_line_and_its_status(tmp_path, toy_file, monkeypatch,
                                                          signum, status, name):
    monkeypatch.setattr("zerosim.api.simulate", _simulation_interrupted_by(signum))
    out = tmp_path / "out"
    result = invoke("run", toy_file, "--out", out)
    assert result.exit_code == status
    assert result.output == f"interrupted by {name}: {out} was left as it was\n"
    assert not out.exists() and litter(tmp_path) == []
    assert signal.getsignal(signum) in (signal.default_int_handler, signal.SIG_DFL)


def test_a_signal_the_process_was_started_ignoring_stays_ignored(tmp_path, toy_file,
                                                                  monkeypatch):
    """Under nohup, or as a script's background job, SIGINT starts ignored: a run leaves it
    so (as POSIX tools do) and still answers SIGTERM."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    during = []

    def simulate(*args, **kwargs):
        during.append(signal.getsignal(signal.SIGINT))
        os.kill(os.getpid(), signal.SIGINT)
        return _simulation_interrupted_by(signal.SIGTERM)()

    monkeypatch.setattr("zerosim.api.simulate", simulate)
    out = tmp_path / "out"
    result = invoke("run", toy_file, "--out", out)
    assert during == [signal.SIG_IGN]
    assert result.exit_code == 143
    assert result.output == f"interrupted by SIGTERM: {out} was left as it was\n"
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN


def test_an_error_raised_while_a_signal_unwinds_still_prints_one_line(toy_file, monkeypatch):
    """The flow solver once answered Ctrl-C with a ZeroDivisionError traceback."""
    def divide_by_zero():
        return 1 / 0

    monkeypatch.setattr("zerosim.api.simulate_brief",   # what --no-files runs
                        _simulation_interrupted_by(signal.SIGINT, then=divide_by_zero))
    result = invoke("run", toy_file, "--no-files")
    assert result.exit_code == 130
    assert result.output == "interrupted by SIGINT (Ctrl-C)\n"


def test_a_second_signal_during_clean_up_exits_at_once(tmp_path):
    script = textwrap.dedent("""
        import os, signal, time
        from zerosim.interrupts import handled_interrupts
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal
        with handled_interrupts(last_words="stopped twice"):
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
            finally:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)
                print("clean-up finished")
    """)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent, timeout=60)
    assert time.perf_counter() - started < 4
    assert (done.returncode, done.stdout, done.stderr) == (143, "", "stopped twice\n")


def test_sweep_interrupted_says_where_the_finished_points_are(tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("zerosim.sweep.run_sweep", interrupted)
    spec = tmp_path / "sweep.yaml"
    spec.write_text("base: toy.yaml\n")
    result = invoke("sweep", spec, "--out", tmp_path / "out")
    assert result.exit_code == 130
    assert result.output == (f"interrupted by SIGINT (Ctrl-C): finished points are in "
                             f"{tmp_path / 'out' / 'results.csv'}; run the same command again "
                             "to resume\n")


def test_sweep_workers_leave_ctrl_c_to_the_parent():
    from zerosim.sweep.runner import open_executor

    with open_executor(2, None, 2) as (pool, _, _):
        assert pool.submit(signal.getsignal, signal.SIGINT).result() == signal.SIG_IGN


def test_a_run_that_does_not_fit_exits_3_with_its_files(tmp_path, toy_file):
    out = tmp_path / "out"
    result = invoke("run", toy_file, "--out", out, "--set", "hardware.gpu.hbm_GiB=0.001")
    assert result.exit_code == 3
    assert json.loads((out / "summary.json").read_text())["status"] == "oom"
    assert result_files(out) == RUN_FILES


def test_a_bug_is_one_line_and_status_70(toy_file, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr("zerosim.api.simulate_brief", broken)   # what --no-files runs
    result = invoke("run", toy_file, "--no-files")
    assert result.exit_code == 70
    assert result.output == ("error: internal error, a bug in zerosim (please report it; "
                             "ZEROSIM_TRACEBACK=1 shows the traceback): RuntimeError: a bug\n")


@pytest.mark.parametrize(("args", "message"), [
    (["--total-params", "inf", "--largest-layer-params", "1"],
     "--total-params: expected the total parameter count as a positive whole number, got inf"),
    (["--total-params", "1e9", "--largest-layer-params", "nan"],
     "--largest-layer-params: expected the largest layer's parameter count as a positive whole "
     "number, got nan"),
    (["--model", "llama2-7b", "--buffer-factor", "inf"],
     "--buffer-factor: expected a finite number > 0, got inf"),
])
def test_estimate_refuses_non_finite_numbers_with_one_line(args, message):
    result = invoke("estimate", *args)
    assert result.exit_code == 2
    assert result.output == f"error: <inline>: {message}\n"


def test_help_documents_the_exit_statuses_and_input_rules():
    text = " ".join(invoke("--help").output.split())
    assert ("Exit status: 0 done; 1 sweep: some points could not be run, predict: some rows "
            "refused or not simulated; 2 bad input") in text
    assert "130 interrupted by Ctrl-C; 143 by SIGTERM." in text
    assert "true/false is never a number" in text


# ------------------------------------------------------------------ strict JSON


def test_summary_json_is_strict_json_even_with_a_non_finite_value(tmp_path, toy):
    from zerosim.results.export import write_outputs

    result = toy.run()
    result.summary["iteration_s"] = math.inf
    result.summary["phases_s"]["update"] = math.nan
    write_outputs(result, tmp_path / "out")
    summary = strict_json((tmp_path / "out" / "summary.json").read_text())
    assert summary["iteration_s"] is None and summary["phases_s"]["update"] is None
    strict_json((tmp_path / "out" / "trace.json").read_text())


def test_run_json_is_strict_json(toy_file):
    result = invoke("run", toy_file, "--no-files", "--json")
    assert result.exit_code == 0
    assert strict_json(result.output)["status"] == "ok"


def test_interrupted_carries_the_exit_status():
    assert Interrupted(signal.SIGINT).exit_status == 130
    assert Interrupted(signal.SIGTERM).exit_status == 143


# ------------------------------------------------------------------ what a person sees


def test_the_phase_table_adds_up_to_the_iteration(tmp_path, toy):
    from zerosim.report import BETWEEN_PHASES, iteration_totals

    patch = {"deepspeed": {"gradient_accumulation_steps": 3}}
    result = toy.run(patch)
    rank, totals, counts = iteration_totals(result.phases, 3)
    assert rank == 0
    assert counts == {"forward": 3, "backward_non_boundary": 2, "backward_boundary": 1,
                      "update": 1}
    assert sum(totals.values()) == pytest.approx(result.summary["iteration_s"], abs=1e-12)
    assert totals[BETWEEN_PHASES] == pytest.approx(0.0, abs=1e-12)
    assert totals["forward"] == pytest.approx(3 * result.summary["phases_s"]["forward"])
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(toy.tree(patch)))
    output = invoke("run", path, "--no-files").output
    header = output.index("per iteration: the phases of rank 0, the last to finish; they add "
                          "up to the iteration\nmean per micro-batch: the slowest rank's\n"
                          "compute held: per micro-batch, how long other streams' kernels "
                          "kept compute off the SMs\nphase times in seconds")
    memory = output.index("rank 0's HBM by phase, GiB")
    rows = {line.split("│")[1].strip(): [cell.strip() for cell in line.split("│")[2:-1]]
            for line in output[header:memory].splitlines() if line.startswith("│")}
    assert rows["forward"] == ["3", f"{totals['forward']:.3f}",
                               f"{result.summary['phases_s']['forward']:.3f}", "0.000"]
    assert rows["iteration"][1] == f"{result.summary['iteration_s']:.3f}"
    rows = {line.split("│")[1].strip(): [cell.strip() for cell in line.split("│")[2:-1]]
            for line in output[memory:].splitlines() if line.startswith("│")}
    summary = result.summary
    assert rows["forward"] == [f"{summary['hbm_phase_peak_GiB']['forward']:.2f}",
                               f"{summary['hbm_after_GiB']['forward']:.2f}"]
    assert rows["optimizer update"] == [f"{summary['hbm_phase_peak_GiB']['update']:.2f}",
                                        f"{summary['hbm_after_GiB']['update']:.2f}"]


def test_progress_says_simulated_time_against_the_expected_end(toy):
    import io

    from zerosim.api import simulate
    from zerosim.progress import RunProgress

    scenario = toy.scenario({"deepspeed": {"gradient_accumulation_steps": 2}})
    progress = RunProgress(io.StringIO(), enabled=False)
    result = simulate(scenario, observer=progress.observe)
    end = result.summary["iteration_s"]
    assert progress.line() == (f"simulating toy: {end:.2f} s of about {end:.2f} s simulated "
                               "(5 of 5 phases), 0 s")


def test_progress_rewrites_one_line_on_stderr_and_erases_it():
    import io
    from types import SimpleNamespace

    from zerosim.progress import RunProgress

    scenario = SimpleNamespace(name="big",
                               deepspeed=SimpleNamespace(gradient_accumulation_steps=1))
    ctx = SimpleNamespace(scenario=scenario, phases=[object()], env=SimpleNamespace(now=2.0),
                          machine=SimpleNamespace(stands_for={0: (0,)}))
    stream = io.StringIO()
    with RunProgress(stream, enabled=True, delay_s=0.0, every_s=0.01) as progress:
        progress.observe(ctx)
        time.sleep(0.1)
    text = stream.getvalue()
    line = "simulating big: 2.00 s of about 6.00 s simulated (1 of 3 phases), 0 s"
    assert text.startswith(f"\r{line}")
    assert text.endswith("\r" + " " * len(line) + "\r")


# ------------------------------------------------------------------ every command's --out


@pytest.mark.parametrize("command", [("tune",), ("sensitivity", "--workers", "1")])
def test_a_table_commands_out_below_a_file_is_refused_before_simulating(
        tmp_path, toy_file, no_simulation, command):
    (tmp_path / "plain").write_text("x")
    out = tmp_path / "plain" / "out"
    result = invoke(*command, toy_file, "--out", out)
    assert (result.exit_code, result.output) == (
        2, f"error: --out {out}: expected a folder path, got {tmp_path / 'plain'} is a file, "
           "not a folder\n")


def test_predicts_out_below_a_file_is_refused_before_simulating(tmp_path, no_simulation):
    (tmp_path / "plain").write_text("x")
    out = tmp_path / "plain" / "out"
    table = (Path(__file__).resolve().parent.parent / "zerosim" / "validation" / "data"
             / "polaris_zero3_offload_runs.csv")
    result = invoke("predict", table, "--hardware", "polaris-a100", "--out", out)
    assert (result.exit_code, result.output.splitlines()[-1]) == (
        2, f"error: --out {out}: expected a folder path, got {tmp_path / 'plain'} is a file, "
           "not a folder")


def test_out_through_a_link_writes_into_the_folder_it_names(tmp_path, toy_file):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    for _ in range(2):   # into the empty folder, then over the result it holds
        result = invoke("run", toy_file, "--out", tmp_path / "link", "--no-progress")
        assert result.exit_code == 0, result.output
    assert (tmp_path / "link").is_symlink() and result_files(tmp_path / "real") == RUN_FILES
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real", "toy.yaml"]


def test_a_file_that_cannot_be_written_whole_leaves_nothing(tmp_path):
    from zerosim.results.folders import WriteFailedError, atomic_write

    (tmp_path / "kept.csv").write_text("before\n")

    def full_disk(handle):
        handle.write("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(WriteFailedError) as caught:
        atomic_write(tmp_path / "kept.csv", full_disk)
    assert str(caught.value) == f"{tmp_path / 'kept.csv'}: could not be written: no space left"
    assert [p.name for p in tmp_path.iterdir()] == ["kept.csv"]
    assert (tmp_path / "kept.csv").read_text() == "before\n"
