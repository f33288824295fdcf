"""Runs that empty the CUDA cache at every phase (the Deep Optimizer States fork's engine, the
study's instrumented runs) reserve each phase's device memory anew through `cudaMalloc`."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from conftest import minimal

import zerosim
from zerosim.engine.memory import AllocatorReserve
from zerosim.engine.plan import plan_of
from zerosim.scenario import load_scenario, scenario_from_dict
from zerosim.scenario.deepspeed import ForkBuildWarning
from zerosim.units import GiB

ROOT = Path(__file__).resolve().parent.parent
STUDY_DP1 = ROOT / "scenarios" / "llama13b_dp1.yaml"
STUDY_DP2 = ROOT / "scenarios" / "llama13b_dp2.yaml"
POLARIS_RUN = (ROOT / "scenarios" / "calibration" / "polaris"
               / "polaris-5.90b-dp1-mb4-ga1-sg1e08.yaml")


def test_the_reserve_grows_only_past_the_highest_level_since_the_emptying():
    reserve = AllocatorReserve()
    assert reserve.allocate(10) == 10
    reserve.free(4)
    assert reserve.allocate(3) == 0  # 9 in use, 10 reserved
    assert reserve.allocate(5) == 4  # 14 in use
    reserve.free(14)
    assert reserve.allocate(14) == 0
    assert (reserve.in_use, reserve.reserved) == (14, 14)


@pytest.mark.parametrize(("version", "stated", "empties"), [
    ("0.13.3+4570a955", None, True), ("0.13.3+c7da512", None, True), ("0.13.3", None, False),
    ("0.13.3+0123abcd", None, True), ("0.13.3+4570a955", False, False),
    ("0.13.3", True, True)])
def test_a_fork_build_empties_the_cache_at_every_phase_and_a_release_does_not(
        version, stated, empties):
    runtime = {"deepspeed_version": version, "bind_cores_to_rank": False} | (
        {} if stated is None else {"empty_cache_each_phase": stated})
    unknown = version == "0.13.3+0123abcd"  # not a commit of the fork: told what it runs as
    with pytest.warns(ForkBuildWarning) if unknown else contextlib.nullcontext():
        scenario = scenario_from_dict(minimal(runtime=runtime))
    assert scenario.runtime.empty_cache_each_phase is empties
    assert scenario.to_dict()["runtime"].get("empty_cache_each_phase", False) is empties


def test_the_polaris_runs_and_the_study_empty_the_cache():
    """Every Polaris run comes from a fork build (written into its scenario, replayed on the
    release); the study says it emptied the cache at each phase."""
    assert load_scenario(POLARIS_RUN).runtime.empty_cache_each_phase
    assert load_scenario(STUDY_DP1).runtime.empty_cache_each_phase


def _first_s(phase: str, path: Path, overrides: list[str]) -> float:
    """How long micro-batch 0's `phase` takes on rank 0."""
    phases = zerosim.simulate(path, overrides).phases
    phases = phases[phases["rank"] == 0].set_index(["phase", "micro_batch"])
    start, end = phases.loc[(phase, 0), ["start_s", "end_s"]]
    return end - start


def _forward_high_water_bytes(path: Path = STUDY_DP1) -> float:
    """What one forward holds at its highest beyond what it started with: each module's
    saved activations stay, its workspace only while it runs."""
    saved, highest = 0.0, 0.0
    for module in plan_of(load_scenario(path)).modules:
        saved += module.saved_bytes
        highest = max(highest, saved + module.transient_bytes)
    return highest


def test_an_emptied_cache_makes_the_host_wait_for_the_forwards_high_water_growth():
    """At rates slow enough that every `cudaMalloc` outlasts the GPU's queue, the forward's
    host path, and so the forward, grows by the bytes it reserves over the rate: halving the
    rate adds that time once more, exactly."""
    fast, slow = (_first_s("forward", STUDY_DP1, [f"hardware.gpu.cuda_malloc_GBps={rate}"])
                  for rate in (0.002, 0.001))
    fresh = _forward_high_water_bytes()
    assert fresh / GiB == pytest.approx(27.0, rel=0.05)  # the study: "27 GB additional"
    assert slow - fast == pytest.approx(fresh / 0.001e9 - fresh / 0.002e9, rel=1e-9)


def _gathered_high_water_bytes(path: Path) -> float:
    """How far rank 0's gathered parameters (and coalesced all-gathers' flat buffers) rise
    during micro-batch 0's forward above their level when it starts."""
    result = zerosim.simulate(path)
    phases = result.phases[result.phases["rank"] == 0]
    start, end = phases.set_index(["phase", "micro_batch"]).loc[
        ("forward", 0), ["start_s", "end_s"]]
    memory = result.memory
    gathered = memory[(memory.device == "gpu0")
                      & (memory.category.astype(str) == "params gathered")].sort_values(
        "t_s", kind="stable")
    before = gathered[gathered.t_s < start].bytes
    level = before.iloc[-1] if len(before) else 0
    return float(gathered[(gathered.t_s >= start) & (gathered.t_s <= end)].bytes.max() - level)


def test_the_all_gather_stream_reserves_blocks_of_its_own():
    """With data parallelism the gathered parameters come from DeepSpeed's all-gather stream,
    whose freed blocks PyTorch's caching allocator keeps for that stream: an emptied cache
    makes the host wait for both streams' high water, the activations' and the gathered
    parameters', over the rate."""
    fast, slow = (_first_s("forward", STUDY_DP2, [f"hardware.gpu.cuda_malloc_GBps={rate}"])
                  for rate in (0.002, 0.001))
    gathered = _gathered_high_water_bytes(STUDY_DP2)
    fresh = _forward_high_water_bytes(STUDY_DP2) + gathered
    assert gathered > 0
    assert slow - fast == pytest.approx(fresh / 0.001e9 - fresh / 0.002e9, rel=1e-9)


def test_a_cache_kept_across_phases_costs_nothing():
    rates = [["runtime.empty_cache_each_phase=false", f"hardware.gpu.cuda_malloc_GBps={r}"]
             for r in (0.001, 1000)]
    assert _first_s("forward", STUDY_DP1, rates[0]) == _first_s("forward", STUDY_DP1, rates[1])


def test_with_recomputation_only_the_first_recomputed_block_reserves_anew():
    """A checkpointed backward recomputes the last block first; its activations go back to
    the cache before the next block is recomputed, so the blocks after it, all alike, need
    nothing new: the backward grows by that one block's high-water bytes over the rate."""
    modules = plan_of(load_scenario(POLARIS_RUN)).modules
    last_layer = max(m.layer for m in modules if m.layer is not None)
    saved, highest = 0.0, 0.0
    for module in (m for m in modules if m.layer == last_layer):
        saved += module.recompute_bytes
        highest = max(highest, saved + module.transient_bytes)
    fast, slow = (_first_s("backward", POLARIS_RUN, [f"hardware.gpu.cuda_malloc_GBps={rate}"])
                  for rate in (0.002, 0.001))
    assert highest > 0
    assert slow - fast == pytest.approx(highest / 0.001e9 - highest / 0.002e9, rel=1e-9)


@pytest.mark.parametrize(("torch_adam", "delay_us"),
                         [(False, 10.0), (True, 10.0 + 10.0 / 3 - 0.57472)])
def test_a_gpu_step_after_an_emptied_cache_reserves_its_first_sub_groups_buffers(
        toy, torch_adam, delay_us):
    """The optimizer on the GPU (toy, sub-groups of N0 = 57,472 and N1 = 57,536 elements),
    `cudaMalloc` at 0.6 B x N0 a microsecond (given here): the first sub-group's flat 16-bit
    gradient (2 B) and its fp32 copy (4 B) are live together, 6 B x N0 reserved before the
    cast's kernel is launched (10 us); the flat one is then dropped, and PyTorch's AdamW
    takes its 4 B temporary, 2 B x N0 more (3.333 us), while the GPU runs the cast (10 B x N0
    at 1e12 B/s: 0.57472 us), so its Adam starts that much later; FusedAdam takes none. Every
    later allocation finds what the earlier sub-group dropped, or reserves its 64 elements
    more while the GPU still runs the first one's kernels: the update is longer than with
    the cache kept by the first sub-group's wait alone."""
    n0 = 57_472
    rate_GBps = 0.6 * n0 / 1e3  # 0.6 x N0 bytes a microsecond, in GB/s

    def update_s(empties: bool) -> float:
        result = toy.run({
            "hardware": {"gpu": {"cuda_malloc_GBps": {"value": rate_GBps, "basis": "assumed",
                                                      "source": "test"}}},
            "runtime": {"empty_cache_each_phase": empties},
            "deepspeed": {"optimizer": {"params": {"torch_adam": torch_adam}},
                          "zero_optimization": {"offload_optimizer": {"device": "none"}}}})
        row = result.phases[result.phases.phase == "update"].iloc[0]
        return row.end_s - row.start_s

    assert update_s(True) - update_s(False) == pytest.approx(delay_us * 1e-6, rel=1e-9)
