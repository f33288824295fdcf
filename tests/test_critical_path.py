"""The critical path of a phase (`zerosim.results.critical`): hand-built spans with the walk
back from the phase's end written out, then what `zerosim run` shows and writes of it."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import simpy
from click.testing import CliRunner

from zerosim.cli import main
from zerosim.engine.machine import Machine
from zerosim.engine.records import PeerWait, Table
from zerosim.results import load_result
from zerosim.results.critical import (
    COLUMNS,
    PathStep,
    path_totals,
    phase_path,
    rank_paths,
    waits_text,
)
from zerosim.vocabulary import PHASE_TIMES

ROOT = Path(__file__).resolve().parents[1]


def span(stream, op_kind, start, end, op="", buffer_kind=""):
    return (stream, op_kind, buffer_kind, op or op_kind, float(start), float(end))


def steps(path: list[PathStep]) -> list[tuple[str, str, float, float]]:
    return [(s.stream, s.op_kind, s.start_s, s.end_s) for s in path]


def test_a_chain_with_a_host_stretch_is_walked_back_from_the_end():
    """A kernel, a copy that waited for it, then a kernel the host issued 0.5 s after the copy
    ended; a copy on the side that nothing waited for is not on the path."""
    spans = [span("compute", "forward", 0, 1), span("pcie.d2h", "grad_to_host", 1, 3),
             span("compute", "backward", 3.5, 4), span("pcie.h2d", "grad_from_host", 0.5, 2)]
    assert steps(phase_path(spans, 0, 4)) == [
        ("compute", "forward", 0, 1), ("pcie.d2h", "grad_to_host", 1, 3),
        ("host", "host", 3, 3.5), ("compute", "backward", 3.5, 4)]


def test_the_innermost_op_is_taken_and_its_wrapper_holds_the_stretches_between_its_ops():
    """A reduce-stream op [1, 5] runs a copy [2, 3] and then zeroes pages [3.2, 5]: it ends
    with the zeroing, which is on the path; the 0.2 s before the zeroing and the second
    before the copy are the wrapper's own work; the kernel before it is found at its start."""
    spans = [span("compute", "backward", 0, 1), span("reduce", "partition_grads", 1, 5),
             span("pcie.d2h", "grad_to_host", 2, 3), span("cpu", "zero_pages", 3.2, 5)]
    assert steps(phase_path(spans, 0, 5)) == [
        ("compute", "backward", 0, 1), ("reduce", "partition_grads", 1, 2),
        ("pcie.d2h", "grad_to_host", 2, 3), ("reduce", "partition_grads", 3, 3.2),
        ("cpu", "zero_pages", 3.2, 5)]


def test_ties_go_to_the_stream_of_the_next_step_and_zero_length_ops_are_skipped():
    """Two ops of one length end as the next compute op starts: the compute one (its in-order
    predecessor) is taken; an op of no length there changes nothing."""
    spans = [span("reduce", "grad_to_bucket", 0, 1), span("compute", "backward", 0, 1),
             span("reduce", "grad_to_bucket", 1, 1, op="empty"), span("compute", "backward", 1, 2)]
    assert steps(phase_path(spans, 0, 2)) == [("compute", "backward", 0, 1),
                                              ("compute", "backward", 1, 2)]


def test_the_path_is_clipped_to_the_phase_and_a_phase_with_no_ops_is_the_hosts():
    spans = [span("cpu", "cast", 0, 3), span("compute", "forward", 3, 4)]
    assert steps(phase_path(spans, 2, 4)) == [("cpu", "cast", 2, 3),
                                              ("compute", "forward", 3, 4)]
    assert steps(phase_path(spans, 5, 6)) == [("host", "host", 5, 6)]
    assert steps(phase_path([], 0, 1)) == [("host", "host", 0, 1)]


def test_rank_paths_names_each_phase_time_and_path_totals_sum_them_per_kind():
    """Micro-batch 1's backward is the boundary (the last backward of the rank); the totals
    add the two forwards' steps together, longest first."""
    spans = [(0, *span("compute", "forward", 0, 1)), (0, *span("compute", "backward", 1, 3)),
             (0, *span("compute", "forward", 3, 4.5)),
             (0, *span("pcie.d2h", "grad_flush", 5, 8, buffer_kind="pageable"))]
    phases = [(0, "forward", 0, 0.0, 1.0), (0, "backward", 0, 1.0, 3.0),
              (0, "forward", 1, 3.0, 4.5), (0, "backward", 1, 4.5, 8.0)]
    rows = rank_paths(spans, phases)
    assert [(r[1], r[2], r[3], r[6], r[4], r[5]) for r in rows] == [
        ("forward", 0, "forward", "compute", 0, 1),
        ("backward", 0, "backward_non_boundary", "compute", 1, 3),
        ("forward", 1, "forward", "compute", 3, 4.5),
        ("backward", 1, "backward_boundary", "host", 4.5, 5),
        ("backward", 1, "backward_boundary", "pcie.d2h", 5, 8)]
    assert {r[10] for r in rows} == {0}
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    assert path_totals(frame, 0) == {
        "forward": [("forward", 2.5)], "backward_non_boundary": [("backward", 2.0)],
        "backward_boundary": [("grad_flush (pageable)", 3.0), ("host", 0.5)]}


def wait(rank, kind, joined, met, end, last_rank, op_kind=None):
    return (rank, kind, op_kind or kind, float(joined), float(met), float(end), last_rank)


def test_a_collective_joined_early_is_followed_to_the_rank_that_joined_last():
    """Rank 0 joins an all-gather at 1 s; rank 1, its fetch over a slower link ending at 3 s,
    joins then; the ring runs to 4 s. Rank 0's path: the ring [3, 4] on its own op, then rank
    1's fetch and forward: its own all-gather's [1, 3] is not a cause, the fetch is."""
    spans = [(0, *span("compute", "forward", 0, 1)), (0, *span("allgather", "all_gather", 1, 4)),
             (1, *span("compute", "forward", 0, 1)), (1, *span("pcie.h2d", "param_fetch", 1, 3)),
             (1, *span("allgather", "all_gather", 3, 4))]
    rows = rank_paths(spans, [(0, "forward", 0, 0.0, 4.0)],
                      [wait(0, "all_gather", 1, 3, 4, 1)])
    assert [(r[10], r[7], r[4], r[5]) for r in rows] == [
        (1, "forward", 0, 1), (1, "param_fetch", 1, 3), (0, "all_gather", 3, 4)]
    assert {r[0] for r in rows} == {0}   # rank 0's phase, whatever rank its steps are on


def test_the_last_ranks_op_holds_the_walk_where_nothing_of_it_ends_as_it_joins():
    """Rank 1's all-gather op began at 2.5 s (a kernel of its own first) and joined at 3 s:
    [2.5, 3] is that op's own work, found by the rank's op of the collective's kind that was
    running then; a same-kind op that ended before the ring is not it."""
    spans = [(0, *span("allgather", "all_gather", 1, 4)),
             (1, *span("allgather", "all_gather", 0.5, 1, op="earlier")),
             (1, *span("pcie.h2d", "param_fetch", 1, 2.5)),
             (1, *span("allgather", "all_gather", 2.5, 4, op="this"))]
    rows = rank_paths(spans, [(0, "forward", 0, 1.0, 4.0)],
                      [wait(0, "all_gather", 1, 3, 4, 1)])
    assert [(r[10], r[9], r[4], r[5]) for r in rows] == [
        (1, "param_fetch", 1, 2.5), (1, "this", 2.5, 3), (0, "all_gather", 3, 4)]


def test_a_wait_applies_only_to_an_op_of_its_kind_that_holds_it():
    """A reduce-scatter rank 0 joined early ran on another stream while its compute kernel was
    the op that ended at the phase's end: the kernel is the path, the wait is not followed.
    An all-gather run by an op of another kind (ZenFlow's selection) is followed from that
    op, as its record says."""
    spans = [(0, *span("compute", "backward", 0, 4)), (0, *span("reduce", "reduce_scatter", 1, 3)),
             (1, *span("compute", "backward", 0, 2))]
    rows = rank_paths(spans, [(0, "backward", 0, 0.0, 4.0)],
                      [wait(0, "reduce_scatter", 1, 2, 3, 1)])
    assert [(r[10], r[7], r[4], r[5]) for r in rows] == [(0, "backward", 0, 4)]
    spans = [(0, *span("reduce", "selective_update", 1, 4)),
             (1, *span("compute", "backward", 0, 3))]
    rows = rank_paths(spans, [(0, "backward", 0, 0.0, 4.0)],
                      [wait(0, "all_gather", 1.5, 3, 3.5, 1, op_kind="selective_update")])
    assert [(r[10], r[7], r[4], r[5]) for r in rows] == [(1, "backward", 0, 3),
                                                          (0, "selective_update", 3, 4)]


def test_a_walk_that_would_hand_back_at_the_same_instant_goes_on_instead():
    """Contrived records where rank 1's op at 3 s holds a wait for rank 0 that met at 3 s, as
    rank 0's did for rank 1: the walk crosses once at 3 s, then takes rank 1's op, and ends."""
    spans = [(0, *span("allgather", "all_gather", 1, 4)),
             (1, *span("allgather", "all_gather", 2, 4)), (1, *span("compute", "forward", 0, 2))]
    rows = rank_paths(spans, [(0, "forward", 0, 0.0, 4.0)],
                      [wait(0, "all_gather", 1, 3, 4, 1), wait(1, "all_gather", 2, 3, 3.5, 0)])
    assert [(r[10], r[7], r[4], r[5]) for r in rows] == [
        (1, "forward", 0, 2), (1, "all_gather", 2, 3), (0, "all_gather", 3, 4)]


def test_collectives_record_who_waited_for_whom(toy):
    """Three ranks join an all-gather of 30000 B at 0, 1 and 3 us: the ring starts at 3 us
    and each GPU sends 2/3 of it, 20000 B, over its 100 GB/s NVLink port (no latency in the
    toy): 0.2 us, to 3.2 us. Ranks 0 and 1 waited for rank 2; rank 2 did not wait."""
    waits = Table(PeerWait)
    env = simpy.Environment()
    machine = Machine(env, toy.scenario(gpus=3).hardware, 3, None, peer_waits=waits)
    ends = {}

    def rank_program(rank: int, at: float):
        yield env.timeout(at)
        yield from machine.collective(rank, ("k",), "all_gather", 30000, [0, 1, 2])
        ends[rank] = env.now

    for rank, at in enumerate((0.0, 1e-6, 3e-6)):
        env.process(rank_program(rank, at))
    env.run()
    assert ends == pytest.approx({0: 3.2e-6, 1: 3.2e-6, 2: 3.2e-6}, rel=1e-9)
    assert [(*row[:3], row[6]) for row in waits.rows] == [(0, "all_gather", "all_gather", 2),
                                                          (1, "all_gather", "all_gather", 2)]
    assert [t for row in waits.rows for t in row[3:6]] == pytest.approx(
        [0.0, 3e-6, 3.2e-6, 1e-6, 3e-6, 3.2e-6], rel=1e-9)


def test_the_study_dp4_path_goes_through_the_rank_across_the_socket():
    """On the study's DP=4 node rank 1 (its GPU's buffers across the socket) joins the
    reduce-scatters last: rank 0's backward waits on its copies, and the engine's path
    totals (`simulate_brief(explain=True)`) are the Result's, ranks and all."""
    from zerosim.api import simulate, simulate_brief
    from zerosim.results.critical import rank_path

    result = simulate("scenarios/llama13b_dp4.yaml")
    waits = result.peer_waits
    assert len(waits) and set(waits.last_rank) == {1} and 1 not in set(waits["rank"])
    assert (waits.joined_s < waits.met_s).all() and (waits.met_s < waits.end_s).all()
    path = result.critical_path
    assert set(path.op_rank) == {0, 1}
    assert "host" not in set(path.op_kind)
    from_result = rank_path(path, 0)
    brief = simulate_brief("scenarios/llama13b_dp4.yaml", explain=True).critical
    assert brief.rank == from_result.rank == 0
    assert brief.through.keys() == from_result.through.keys() == {1}
    assert brief.through[1] == pytest.approx(from_result.through[1], rel=1e-9)
    assert {key: [k for k, _ in kinds] for key, kinds in brief.kinds.items()} == {
        key: [k for k, _ in kinds] for key, kinds in from_result.kinds.items()}


@pytest.fixture(scope="module")
def dp4_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("critical") / "dp4"
    result = CliRunner().invoke(main, ["run", "scenarios/llama13b_dp4.yaml", "--out",
                                       str(folder), "--no-progress"])
    assert result.exit_code == 0, result.output
    return folder, result.stdout


def test_run_prints_what_each_phase_waited_on_and_writes_it(dp4_run):
    """Every phase of the reported rank is tiled by its path; the table's times are the phase
    table's per-iteration ones; the CSV is what a loaded result computes again."""
    folder, stdout = dp4_run
    assert "critical path of rank 0: what each phase waited on" in stdout
    assert "zero_pages" in stdout and "optimizer_step" in stdout
    written = pd.read_csv(folder / "critical_path.csv", keep_default_na=False)
    loaded = load_result(folder)
    again = loaded.critical_path
    assert list(written.columns) == list(again.columns)
    assert written.end_s.tolist() == pytest.approx(again.end_s.tolist(), rel=1e-12)
    assert written.op.tolist() == again.op.tolist()
    phases = loaded.phases[loaded.phases["rank"] == 0]
    for row in phases.itertuples():
        mine = written[(written.phase == row.phase) & (written.micro_batch == row.micro_batch)]
        assert mine.start_s.iloc[0] == pytest.approx(row.start_s, rel=1e-12)
        assert mine.end_s.iloc[-1] == pytest.approx(row.end_s, rel=1e-12)
        assert mine.start_s.iloc[1:].tolist() == pytest.approx(mine.end_s.iloc[:-1].tolist(),
                                                                rel=1e-12)
    # the host thread's work and waits are recorded (hooks, launches, cudaMalloc, the small
    # all-reduces it waits in): no stretch of any phase is left to unrecorded host time
    assert "host" not in set(written.op_kind)
    assert {"hooks", "cuda_malloc", "collective_launch", "all_reduce"} <= set(
        written[written.stream == "host"].op_kind)
    update = path_totals(again, 0)["update"]
    assert sum(s for _, s in update) == pytest.approx(loaded.summary["phases_s"]["update"],
                                                      rel=1e-9)
    events = json.loads((folder / "trace.json").read_text())["traceEvents"]
    track = {(e["pid"], e["tid"]) for e in events
             if e["name"] == "thread_name" and e["args"]["name"] == "critical path"}
    assert len(track) == 1 and next(iter(track))[0] == 0
    steps_ = [e for e in events if e["ph"] == "X" and (e["pid"], e["tid"]) in track]
    assert [e["name"] for e in steps_] == [
        (op or "host") + ("" if op_rank == 0 else f" (rank {op_rank})")
        for op, op_rank in zip(written.op, written.op_rank, strict=True)]


def test_a_folder_written_before_peer_waits_loads_with_each_rank_walked_alone(dp4_run,
                                                                             tmp_path):
    """The run's peer_waits.csv holds rank 0's waits for rank 1; without the file (a folder
    an earlier zerosim wrote) the result loads, no rank waited, and the path stays on rank 0
    (the waits then count as the collectives' own time)."""
    import shutil

    folder, _ = dp4_run
    written = pd.read_csv(folder / "peer_waits.csv")
    assert list(written.columns) == ["rank", "collective", "op_kind", "joined_s", "met_s",
                                     "end_s", "last_rank"]
    assert set(written.last_rank) == {1}
    older = tmp_path / "older"
    shutil.copytree(folder, older)
    (older / "peer_waits.csv").unlink()
    loaded = load_result(older)
    assert loaded.peer_waits.empty
    assert set(loaded.critical_path.op_rank) == {0}
    assert set(load_result(folder).critical_path.op_rank) == {0, 1}


def test_run_without_files_keeps_no_records_and_shows_no_path():
    result = CliRunner().invoke(main, ["run", "scenarios/llama13b_dp1.yaml", "--no-files"])
    assert result.exit_code == 0, result.output
    assert "phase times in seconds" in result.stdout
    assert "critical path" not in result.stdout


def test_diff_lists_the_changed_setting_and_what_moved_each_phase(dp4_run, tmp_path):
    """Pageable buffers against pinned on the study's DP=4 node: the one setting named, the
    iteration's change the sum of the phases' and the time between them, and each phase's
    change the sum of what moved on its critical path (the path tiles the phase)."""
    from zerosim.results.compare import compare_folders

    pinned, _ = dp4_run
    pageable = tmp_path / "pageable"
    ran = CliRunner().invoke(main, [
        "run", "scenarios/llama13b_dp4.yaml", "--out", str(pageable), "--no-progress",
        "--set", "deepspeed.zero_optimization.offload_optimizer.pin_memory=false"])
    assert ran.exit_code == 0, ran.output
    comparison = compare_folders(pinned, pageable)
    assert comparison.settings == (
        ("deepspeed.zero_optimization.offload_optimizer.pin_memory", True, False),)
    phases = {p.key: p for p in comparison.phases}
    assert list(phases) == ["forward", "backward_non_boundary", "backward_boundary", "update",
                            "between_phases", "iteration"]
    assert sum(p.change_s for k, p in phases.items() if k != "iteration") == pytest.approx(
        phases["iteration"].change_s, abs=1e-9)
    for key in ("forward", "backward_non_boundary", "backward_boundary", "update"):
        assert sum(w.change_s for w in phases[key].waits) == pytest.approx(
            phases[key].change_s, abs=1e-9)
    boundary = phases["backward_boundary"]
    assert boundary.change_s > 0.1
    assert "(pageable)" in boundary.waits[0].kind and boundary.waits[0].change_s > 0
    shown = CliRunner().invoke(main, ["diff", str(pinned), str(pageable)])
    assert shown.exit_code == 0, shown.output
    assert "offload_optimizer.pin_memory: True -> False" in shown.stdout
    assert "backward (boundary)" in shown.stdout
    as_json = json.loads(CliRunner().invoke(main, ["diff", str(pinned), str(pageable),
                                                   "--json"]).stdout)
    assert as_json["settings"] == [{"key": comparison.settings[0][0], "a": True, "b": False}]
    assert as_json["phases"][-1]["change_s"] == pytest.approx(phases["iteration"].change_s)


def test_diff_of_a_folder_that_is_no_result_fails_clearly(tmp_path):
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(main, ["diff", str(tmp_path / "empty"), str(tmp_path / "empty")])
    assert result.exit_code == 2
    assert "not a zerosim result folder" in result.output


def test_diff_of_a_scenario_and_a_what_if_simulates_both_and_writes_nothing(tmp_path,
                                                                            monkeypatch):
    """`zerosim diff SCENARIO --set K=V`: B is A's scenario so changed, both simulated with
    every record in memory; without B or --set, or --set on a result folder, a usage error."""
    monkeypatch.chdir(tmp_path)
    scenario = str(ROOT / "scenarios/llama13b_dp1.yaml")
    shown = CliRunner().invoke(main, ["diff", scenario, "--json", "--set",
                                      "deepspeed.zero_optimization.offload_optimizer"
                                      ".pin_memory=false"])
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.stdout)
    assert data["settings"] == [{"key": "deepspeed.zero_optimization.offload_optimizer"
                                        ".pin_memory", "a": True, "b": False}]
    iteration = data["phases"][-1]
    assert iteration["phase"] == "iteration" and iteration["change_s"] > 0
    assert list(tmp_path.iterdir()) == []
    assert CliRunner().invoke(main, ["diff", scenario]).exit_code == 2
    folder = tmp_path / "folder"
    folder.mkdir()
    refused = CliRunner().invoke(main, ["diff", str(folder), "--set", "data_parallel=2"])
    assert refused.exit_code == 2 and "is a result folder" in refused.output


def test_settings_are_compared_by_value_and_the_implied_behaviours_come_last():
    from zerosim.results.compare import setting_changes

    a = {"runtime": {"deepspeed_version": "0.13.3"}, "description": "A",
         "hardware": {"values": {"gpu.hbm_GiB": {"value": 80, "basis": "spec", "source": "x"}}},
         "deepspeed_behaviours": {"coalesced_collectives": False}}
    b = {"runtime": {"deepspeed_version": "0.19.5"}, "description": "B",
         "hardware": {"values": {"gpu.hbm_GiB": {"value": 80, "basis": "spec", "source": "y"}}},
         "deepspeed_behaviours": {"coalesced_collectives": True}}
    assert setting_changes(a, b) == (
        ("runtime.deepspeed_version", "0.13.3", "0.19.5"),
        ("deepspeed_behaviours.coalesced_collectives", False, True))
    assert setting_changes(a, None) == ()


def test_waits_text_names_the_longest_and_counts_the_rest():
    kinds = [("zero_pages", 2.0), ("cast", 1.0), ("hooks", 0.5), ("launch", 0.25),
             ("loop", 0.15), ("host", 0.1)]
    assert waits_text(kinds) == ("zero_pages 2.000 (50%), cast 1.000 (25%), hooks 0.500 "
                                 "(12%), launch 0.250 (6%), 2 more 0.250")
    assert waits_text(kinds[:1]) == "zero_pages 2.000 (100%)"


@pytest.mark.parametrize("scenario", ["scenarios/llama13b_dp4.yaml",
                                      "scenarios/polaris_2nodes.yaml"])
def test_a_summary_with_explain_says_what_the_run_table_says(scenario):
    """`simulate_summary(explain=True)` reads the engine's record of a run that kept only its
    host spans beside the summary's: the same texts as the critical-path table of a run with
    every record (the reported rank's, folded mirror ranks and nodes included), and the rest
    of the summary unchanged."""
    import warnings

    from zerosim.api import simulate, simulate_summary
    from zerosim.results.critical import WAITS_ON, rank_path, reported_rank, through_text

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        explained = simulate_summary(scenario, explain=True)
        plain = simulate_summary(scenario)
        result = simulate(scenario)
    waits = explained.pop(WAITS_ON)
    assert explained == plain
    walked = rank_path(result.critical_path, reported_rank(result))
    totals = walked.kinds
    assert waits == {**{key: waits_text(totals[key]) if key in totals else None
                        for key in PHASE_TIMES}, "other_ranks": through_text(walked.through)}
    assert waits["backward_boundary"] is not None
    # the study's rank 0 waits for rank 1 (its buffers across the socket); Polaris's ranks
    # keep in step
    assert waits["other_ranks"] == ("rank 1 4.921" if "dp4" in scenario else None)


def test_sweep_explain_adds_what_each_phase_waited_on_and_runs_unexplained_points_again(
        tmp_path):
    """A first run without `--explain`; the second, with it, runs every point again and
    rewrites results.csv (one line a point); a third without it keeps the explained rows."""
    import csv

    spec = tmp_path / "sweep.yaml"
    spec.write_text(f"base: {ROOT / 'scenarios' / 'llama13b_dp1.yaml'}\n"
                    "grid:\n  deepspeed.zero_optimization.offload_optimizer.pin_memory: "
                    "[true, false]\n")
    out = tmp_path / "out"

    def rows(*extra):
        result = CliRunner().invoke(main, ["sweep", str(spec), "--out", str(out),
                                           "--workers", "1", "--no-progress", *extra])
        assert result.exit_code == 0, result.output
        with open(out / "results.csv", newline="") as handle:
            return list(csv.DictReader(handle))

    first = rows()
    assert len(first) == 2 and not any(k.startswith("waits_on.") for k in first[0])
    second = rows("--explain")
    assert len(second) == 2
    assert all(r["waits_on.backward_boundary"].startswith("zero_pages") for r in second)
    assert [r["iteration_s"] for r in second] == [r["iteration_s"] for r in first]
    assert rows() == second


def test_predict_explain_fills_the_waits_on_columns(tmp_path):
    table = ROOT / "zerosim" / "validation" / "data" / "polaris_zero3_offload_runs.csv"
    lines = table.read_text().splitlines()
    small = tmp_path / "runs.csv"
    small.write_text("\n".join(lines[:2]) + "\n")
    result = CliRunner().invoke(main, ["predict", str(small), "--hardware", "polaris-a100",
                                       "--workers", "1", "--json", "--no-files", "--explain"])
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)["rows"][0]
    assert row["waits_on_forward"].startswith("forward ")
    assert row["waits_on_backward_non_boundary"] is None
    assert "waits_on_other_ranks" in row and row["waits_on_other_ranks"] is None   # one rank
    plain = CliRunner().invoke(main, ["predict", str(small), "--hardware", "polaris-a100",
                                      "--workers", "1", "--json", "--no-files"])
    assert json.loads(plain.stdout)["rows"][0]["waits_on_forward"] is None


def test_run_explain_shows_the_path_without_files_and_adds_it_to_the_json(tmp_path):
    """`--explain` beside `--no-files` records the host thread and prints the same table a run
    with files prints; `--json` then holds `waits_on`, equal either way."""
    base = ["run", "scenarios/llama13b_dp1.yaml", "--no-progress", "--explain"]
    lean = CliRunner().invoke(main, [*base, "--no-files"])
    assert lean.exit_code == 0, lean.output
    assert "critical path of rank 0: what each phase waited on" in lean.stdout
    assert "zero_pages 8.677 (73%)" in lean.stdout
    as_json = [json.loads(CliRunner().invoke(main, [*base, *extra, "--json"]).stdout)
               for extra in (["--no-files"], ["--out", str(tmp_path / "dp1")])]
    assert as_json[0]["waits_on"] == as_json[1]["waits_on"]
    assert as_json[0]["waits_on"]["update"].startswith("param_copy_back 2.225 (49%)")
