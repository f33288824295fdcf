"""The Perfetto trace: well-formed events, named tracks, no overlapping slices on a track."""

from __future__ import annotations

import gc
import itertools
import json
import math
from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest

import zerosim
from zerosim.results.export import write_outputs
from zerosim.results.trace import TraceDetail, assign_lanes, build_trace, sample_counters

ROOT = Path(__file__).resolve().parent.parent
DP1 = ROOT / "scenarios" / "llama13b_dp1.yaml"


def strict_json(text: str):
    """json.loads that refuses NaN and Infinity, which Perfetto cannot read."""
    def refuse(constant):
        raise ValueError(f"non-standard JSON constant {constant}")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def dp1_trace(tmp_path_factory) -> list[dict]:
    """The trace.json that writing a simulated llama13b_dp1 run produces."""
    out = tmp_path_factory.mktemp("dp1")
    write_outputs(zerosim.simulate(DP1), out)
    return strict_json((out / "trace.json").read_text())["traceEvents"]


@pytest.fixture(scope="module")
def two_rank_trace() -> list[dict]:
    result = zerosim.simulate(ROOT / "scenarios" / "llama13b_dp2.yaml")
    trace = build_trace(result.spans, result.phases, result.memory, result.links,
                        result.scenario_name, summary=result.summary)
    return strict_json(json.dumps(trace))["traceEvents"]


def to_ns(us: float) -> int:
    """What Perfetto's JSON importer does with a microsecond timestamp."""
    return round(us * 1000)


def check_trace_rules(events: list[dict]) -> None:
    slices = [e for e in events if e["ph"] == "X"]
    assert slices
    for e in slices:
        assert {"name", "pid", "tid", "ts", "dur"} <= set(e), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert e["ts"] >= 0 and e["dur"] >= 0, e
    tracks = defaultdict(list)
    for e in slices:
        tracks[(e["pid"], e["tid"])].append((to_ns(e["ts"]), to_ns(e["ts"]) + to_ns(e["dur"])))
    for track, intervals in tracks.items():
        intervals.sort()
        for (_, end), (start, _) in itertools.pairwise(intervals):
            assert start >= end, f"overlapping slices on track {track}"
    thread_names = {(e["pid"], e["tid"]) for e in events
                    if e["ph"] == "M" and e["name"] == "thread_name"}
    assert set(tracks) <= thread_names
    process_names = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert {e["pid"] for e in events} <= process_names
    for e in events:
        if e["ph"] == "C":
            assert e["args"] and all(isinstance(v, int | float) and math.isfinite(v)
                                     for v in e["args"].values()), e


def counter_tracks(events: list[dict]) -> set[str]:
    """Perfetto names a JSON counter track '<event name> <arg name>'."""
    return {f"{e['name']} {arg}" for e in events if e["ph"] == "C" for arg in e["args"]}


def test_dp1_trace_follows_the_rules(dp1_trace):
    check_trace_rules(dp1_trace)


def test_dp1_trace_has_named_tracks_and_memory_and_pcie_counters(dp1_trace):
    processes = {e["pid"]: e["args"]["name"] for e in dp1_trace
                 if e["ph"] == "M" and e["name"] == "process_name"}
    assert processes[0] == "rank 0 (gpu0)"
    assert "host0 (CPU, memory)" in processes.values()
    threads = {e["args"]["name"] for e in dp1_trace
               if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == 0}
    assert {"phases", "compute", "reduce", "PCIe H2D", "PCIe D2H", "CPU"} <= threads
    tracks = counter_tracks(dp1_trace)
    assert {"gpu0 HBM GiB activations", "gpu0 HBM GiB params 16-bit", "gpu0 HBM GiB total",
            "host0 memory GiB optimizer states", "gpu0 PCIe H2D GB/s",
            "gpu0 PCIe D2H GB/s"} <= tracks
    phases = [e["name"] for e in dp1_trace if e["ph"] == "X" and e["tid"] == 0]
    assert phases == ["fwd 0", "bwd 0", "fwd 1", "bwd 1 (boundary)", "update"]


def test_memory_counter_total_matches_the_peak(dp1_trace):
    result = zerosim.simulate(DP1)
    totals = [e["args"]["total"] for e in dp1_trace
              if e["ph"] == "C" and e["name"] == "gpu0 HBM GiB"]
    assert max(totals) == pytest.approx(result.summary["peak_hbm_GiB"])
    assert totals[-1] == pytest.approx(0.0, abs=1e-9)  # every allocation freed at the end


def test_multi_rank_trace_follows_the_rules(two_rank_trace):
    check_trace_rules(two_rank_trace)
    processes = {e["args"]["name"] for e in two_rank_trace
                 if e["ph"] == "M" and e["name"] == "process_name"}
    assert {"rank 0 (gpu0)", "rank 1 (gpu1)"} <= processes
    threads = {(e["pid"], e["args"]["name"]) for e in two_rank_trace
               if e["ph"] == "M" and e["name"] == "thread_name"}
    assert (1, "all-gather") in threads
    assert "gpu1 NVLink GB/s" in counter_tracks(two_rank_trace)


def test_touching_slices_stay_apart_and_overlapping_ones_get_lanes():
    # 0.1 + 0.2 != 0.3 in floating point; in whole nanoseconds they touch exactly
    spans = pd.DataFrame({
        "rank": [0, 0, 0, 0], "stream": ["cpu"] * 4, "phase": ["update"] * 4,
        "micro_batch": [0] * 4, "op": ["a", "b", "c", "d"],
        "start_s": [0.1, 0.1 + 0.2, 0.35, 0.6], "end_s": [0.3, 0.7, 0.5, 0.8],
        "bytes": [0.0, float("nan"), 1.0, 2.0]})
    empty = pd.DataFrame(columns=["rank", "phase", "micro_batch", "start_s", "end_s"])
    memory = pd.DataFrame(columns=["t_s", "device", "category", "bytes"])
    links = pd.DataFrame(columns=["t_s", "resource", "rate", "unit"])
    events = strict_json(json.dumps(build_trace(spans, empty, memory, links, "t")))["traceEvents"]
    check_trace_rules(events)
    lanes = {e["name"]: e["tid"] for e in events if e["ph"] == "X"}
    assert lanes["a"] == lanes["b"] != lanes["c"] == lanes["d"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names[lanes["c"]] == "CPU (2)"
    assert assign_lanes([0, 5, 5, 10], [5, 10, 12, 11]) == [0, 0, 1, 0]


def test_oom_run_has_an_instant_event():
    result = zerosim.simulate(DP1, overrides={"hardware.gpu.hbm_GiB": 30})
    trace = build_trace(result.spans, result.phases, result.memory, result.links,
                        result.scenario_name, summary=result.summary)
    events = strict_json(json.dumps(trace))["traceEvents"]
    check_trace_rules(events)
    instants = [e for e in events if e["ph"] == "i"]
    assert len(instants) == 1 and instants[0]["pid"] == 0
    assert instants[0]["ts"] == pytest.approx(result.summary["oom"]["t_s"] * 1e6, abs=1e-3)


def test_counters_are_sampled_to_their_interval_maximum_and_end_level():
    """Ten changes of one track cut to four samples: two intervals ([0, 4.5) and [4.5, 9] us),
    each giving its maximum at its first change and its level at its last. A value not
    changed in an event keeps its level (Perfetto's step)."""
    levels = [1, 5, 2, 2, 0, 3, 9, 1, 1, 4]
    events = [{"name": "gpu0 HBM GiB", "ph": "C", "pid": 0, "ts": float(t),
               "args": {"a": float(v), **({"total": 10.0} if t == 0 else {})}}
              for t, v in enumerate(levels)]
    sampled = sample_counters(events, 4)
    assert [(e["ts"], e["args"]) for e in sampled] == [
        (0.0, {"a": 5.0, "total": 10.0}),
        (4.0, {"a": 0.0, "total": 10.0}),
        (5.0, {"a": 9.0, "total": 10.0}),
        (9.0, {"a": 4.0, "total": 10.0}),
    ]
    assert all(e["name"] == "gpu0 HBM GiB" and e["ph"] == "C" for e in sampled)
    assert sample_counters(events, 10) == events


def test_a_compact_trace_keeps_one_rank_per_identical_group_and_the_peaks():
    """llama13b_dp4 on h100-jlse: ranks 0 and 3 (memory on their GPU's socket) and 1 and 2
    (memory across the socket link) run identical timelines."""
    result = zerosim.simulate(ROOT / "scenarios" / "llama13b_dp4.yaml")
    detail = TraceDetail.compact(result.spans)
    assert detail.rank_groups == {0: (0, 3), 1: (1, 2)}
    full = build_trace(result.spans, result.phases, result.memory, result.links,
                       result.scenario_name, summary=result.summary)
    trace = build_trace(result.spans, result.phases, result.memory, result.links,
                        result.scenario_name, summary=result.summary, detail=detail)
    events = strict_json(json.dumps(trace))["traceEvents"]
    check_trace_rules(events)
    processes = {e["pid"]: e["args"]["name"] for e in events
                 if e["ph"] == "M" and e["name"] == "process_name"}
    assert processes == {0: "rank 0 (gpu0) = ranks 0, 3 (x2)",
                         1: "rank 1 (gpu1) = ranks 1, 2 (x2)", 1000: "host0 (CPU, memory)"}
    per_track = defaultdict(int)
    for e in events:
        if e["ph"] == "C":
            per_track[(e["name"], e["pid"])] += 1
    assert max(per_track.values()) <= 2000
    totals = {gpu: [e["args"]["total"] for e in events
                    if e["ph"] == "C" and e["name"] == f"{gpu} HBM GiB"]
              for gpu in ("gpu0", "gpu1")}
    assert max(max(t) for t in totals.values()) == pytest.approx(result.summary["peak_hbm_GiB"])
    assert [t[-1] for t in totals.values()] == pytest.approx([0.0, 0.0], abs=1e-9)
    assert trace["otherData"]["ranks"] == {"0": [0, 3], "1": [1, 2]}
    assert len(events) < len(full["traceEvents"]) / 2


def test_a_value_first_set_late_is_absent_from_the_samples_before_it():
    """A memory category that appears at 6 us has no level before: the first interval's
    samples leave it out (Perfetto draws nothing there), the second's carry it."""
    events = [{"name": "host0 memory GiB", "ph": "C", "pid": 1000, "ts": float(t),
               "args": {"a": float(t), **({"b": 2.0} if t == 6 else {})}} for t in range(10)]
    assert [(e["ts"], e["args"]) for e in sample_counters(events, 4)] == [
        (0.0, {"a": 4.0}), (4.0, {"a": 4.0}),
        (5.0, {"a": 9.0, "b": 2.0}), (9.0, {"a": 9.0, "b": 2.0}),
    ]


@pytest.mark.parametrize("enabled", [True, False])
def test_building_a_trace_leaves_the_garbage_collector_as_it_found_it(enabled):
    """The collector is paused while the events pile up, and put back as it was."""
    result = zerosim.simulate(DP1, overrides={"hardware.gpu.hbm_GiB": 30})
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        build_trace(result.spans, result.phases, result.memory, result.links,
                    result.scenario_name, summary=result.summary)
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
