"""SuperOffload (`offload_optimizer.super_offload`, DeepSpeed 0.18.9+) on the toy (conftest.py),
by hand.

The toy's two sub-groups hold N0 = 57,472 and N1 = 57,536 elements and its one IPG bucket
holds the whole model, so both complete when the boundary's one bucket has been partitioned,
at T (sub-group 1, the later layers, first). Unbound at DP=1 the optimizer process gets the
toy's 4 CPUs less int((1 - p) x 4): 2 at p = 0.5, 3 at p = 0.75. Host memory never binds.
"""

from __future__ import annotations

import pytest

from zerosim.errors import ScenarioError, UnsupportedConfigError
from zerosim.hardware import costs
from zerosim.hardware.profile import load_profile

N0, N1 = 57_472, 57_536
US = 1e-6


def _so(perc: float = 0.5, clip: float = 0.0, version: str = "0.19.5", **offload) -> dict:
    options = {"super_offload": True, "cpuadam_cores_perc": perc} | offload
    return {"runtime": {"deepspeed_version": version},
            "deepspeed": {"gradient_clipping": clip,
                          "zero_optimization": {"offload_optimizer": options}}}


def _spans(result, stream: str) -> dict[str, tuple[float, float]]:
    spans = result.spans
    rows = spans[spans.stream == stream]
    return {row.op: (row.start_s / US, row.end_s / US) for row in rows.itertuples()}


def _boundary_end(result) -> float:
    """T: when the boundary bucket's partitions have moved (the host then hands over)."""
    spans = result.spans
    partition = spans[spans.op.str.startswith("partition grads")].iloc[-1]
    return partition.end_s / US


def test_each_sub_group_is_stepped_as_the_backward_completes_it(toy):
    """Without clipping, at T the host hands sub-group 1 then 0 to the process (2 threads):
    each gradient copied out of shared memory (8 B x n at 2 x 1 GB/s) and stepped (n at
    2 x 1e8/s): 230.144 + 287.68 us for N1, then 229.888 + 287.36 us for N0, to T +
    1035.072 us. The step's host polls the result queue every millisecond, so it sees the
    last result at T + 2000 us and only then checks for overflow (N at 4 x 2.5e8/s)."""
    result = toy.run(_so())
    t = _boundary_end(result)
    worker = _spans(result, "cpu.superoffload")
    assert worker["copy fp32 grad sub-group 1"] == (pytest.approx(t), pytest.approx(t + 230.144))
    assert worker["cpu adam sub-group 1"][1] == pytest.approx(t + 517.824)
    assert worker["copy fp32 grad sub-group 0"][1] == pytest.approx(t + 747.712)
    assert worker["cpu adam sub-group 0"][1] == pytest.approx(t + 1035.072)
    host = _spans(result, "cpu")
    assert host["overflow check"] == (pytest.approx(t + 2000), pytest.approx(t + 2115.008))


def test_the_step_unscales_and_writes_back_every_cpu_sub_group(toy):
    """After the check, per sub-group: the unscale on the rank's 4 threads (8 B x n at
    1 GB/s each), the cast into a fresh pageable temporary (its pages zeroed, 2 B x n at
    2 threads x 1 GB/s, then 6 B x n at 2 GB/s) and the blocking H2D (2 B x n at 5 GB/s):
    for N0 114.944 + 229.888 + 22.9888 us, for N1 115.072 + 230.144 + 23.0144 us."""
    result = toy.run(_so())
    t = _boundary_end(result) + 2115.008
    host = _spans(result, "cpu")
    assert host["unscale sub-group 0"] == (pytest.approx(t), pytest.approx(t + 114.944))
    end = t + 114.944 + 229.888 + 22.9888 + 115.072 + 230.144 + 23.0144
    assert result.summary["iteration_s"] / US == pytest.approx(end, rel=1e-12)
    assert not any(op.startswith("cpu adam") for op in host)


def test_with_gradient_clipping_nothing_is_stepped_early(toy):
    """gradient_clipping set: the backward hands nothing over; the step unscales each CPU
    sub-group, hands it over and waits (3 threads: N0 in 153.2587 + 191.5733 us), the host
    waking at its next millisecond poll, then writes it back."""
    result = toy.run(_so(perc=0.75, clip=1.0))
    host, worker = _spans(result, "cpu"), _spans(result, "cpu.superoffload")
    unscaled = host["unscale sub-group 0"][1]
    assert worker["copy fp32 grad sub-group 0"][0] == pytest.approx(unscaled)
    assert worker["cpu adam sub-group 0"][1] == pytest.approx(
        unscaled + 8 * N0 / 3e9 / US + N0 / 3e8 / US)
    assert host["cast fp32→16-bit sub-group 0"][0] == pytest.approx(unscaled + 1000)
    assert worker["copy fp32 grad sub-group 1"][0] == pytest.approx(host["unscale sub-group 1"][1])
    assert min(start for start, _ in worker.values()) > _boundary_end(result)


def test_stepping_early_is_what_clipping_costs(toy):
    """At p = 0.75 the process steps both sub-groups in 690.32 us after T, under one poll;
    with clipping each waits a poll of its own after its unscale: one millisecond more."""
    early = toy.run(_so(perc=0.75)).summary["iteration_s"]
    clipped = toy.run(_so(perc=0.75, clip=1.0)).summary["iteration_s"]
    assert (clipped - early) / US == pytest.approx(1000, rel=1e-9)


def test_the_boundary_flush_goes_to_shared_memory_at_the_pageable_rate(toy):
    """Each fp32 gradient partition is cast on the GPU and copied into its sub-group's shared,
    pageable buffer at 5 GB/s, 4 B per element; the 16-bit accumulation stays pinned."""
    spans = toy.run(_so()).spans
    flush = spans[spans.op.str.startswith("fp32 grad") & (spans.stream == "pcie.d2h")]
    assert set(flush.buffer_kind) == {"pageable"}
    assert flush.bytes.sum() == 4 * (N0 + N1)
    row = flush.iloc[0]
    assert (row.end_s - row.start_s) / US == pytest.approx(row.bytes / 5e9 / US)
    accum = spans[spans.op.str.startswith("grad → accum")]
    assert set(accum.buffer_kind) == {"pinned"}


def test_twin_flow_sub_groups_step_on_the_gpu(toy):
    """ratio 0.5 on 0.19.5: sub-group 0 is the GPU's (`twin_flow_gpu_subgroups_first`), its
    gradient never reaches the process, and the step runs its AdamW on the GPU; the process
    steps sub-group 1 only."""
    result = toy.run(_so(ratio=0.5))
    worker = _spans(result, "cpu.superoffload")
    assert set(worker) == {"copy fp32 grad sub-group 1", "cpu adam sub-group 1"}
    compute = _spans(result, "compute")
    assert compute["gpu adam sub-group 0"][1] - compute["gpu adam sub-group 0"][0] == (
        pytest.approx(94 * N0 / 1e12 / US))


def test_host_memory_in_the_steady_state(toy):
    """The fp32 params and gradients in shared, pageable memory (4 B x N each), the pinned
    gradient buffers PyTorch's host allocator keeps after share_memory_ (2^18 B each,
    rounded up) and the process's pinned buffer for the largest sub-group (2^18 B)."""
    memory = toy.run(_so()).memory
    host = memory[memory.device == "host0"].groupby("category").bytes.max()
    assert host["fp32 master params (pageable)"] == 4 * (N0 + N1)
    assert host["fp32 grads (pageable)"] == 4 * (N0 + N1)
    assert host["fp32 grads (pinned)"] == 3 * 2**18


@pytest.mark.parametrize(("profile", "ranks", "bound", "perc", "threads"), [
    ("gh200", 1, False, 0.9, 65), ("gh200", 1, False, 0.8, 58), ("gh200", 1, False, 1.0, 72),
    ("gh200", 1, False, 0.0, 72), ("h100-jlse", 4, True, 0.8, 20),
    ("h100-jlse", 4, False, 0.8, 38)])
def test_the_process_cpus(profile, ranks, bound, perc, threads):
    """gh200's 72 cores: the training process keeps int(0.1 x 72) = 7 at p = 0.9, int(0.2 x
    72) = 14 at 0.8 (psutil reads an empty list as every CPU: all 72 at 1.0 and 0.0); the
    study's node (96 cores, 192 logical CPUs), four ranks: bound, 24 cores each less
    int(0.2 x 24) = 4; unbound, every rank's process on the node's last 192 - 38 CPUs, a
    quarter each."""
    assert costs.superoffload_worker_threads(
        load_profile(profile), ranks, bound=bound, cores_perc=perc) == threads


def test_a_release_before_0_18_refuses_the_keys(toy):
    with pytest.raises(ScenarioError, match=r"absent before DeepSpeed 0\.18\.0"):
        toy.scenario(_so(version="0.17.6"))
    with pytest.raises(ScenarioError, match="cpuadam_cores_perc"):
        toy.scenario({"runtime": {"deepspeed_version": "0.17.6"}, "deepspeed": {
            "zero_optimization": {"offload_optimizer": {"cpuadam_cores_perc": 0.5}}}})


def test_up_to_0_18_8_each_sub_group_is_a_bucket_of_its_own(toy):
    """The toy's one bucket is cut at the sub-groups' edge: sub-group 1 (the later layers) is
    reduced and partitioned as soon as its last gradient is in, then sub-group 0. Each
    partition concatenates and casts its sub-group on the GPU and copies it, pinned, into its
    fp32 gradient; the process gets the GPU tensor and copies it out itself once that
    partition is done (no host synchronisation), then steps it (2 threads: N1 in
    287.68 us), one sub-group after the other."""
    result = toy.run(_so(version="0.18.8"))
    spans = result.spans
    assert (spans.op_kind == "reduce_scatter").sum() == 2
    partitions = spans[spans.op.str.startswith("partition grads")]
    d2h = _spans(result, "pcie.d2h")
    for group, elements in ((1, N1), (0, N0)):
        flush = spans[spans.op == f"fp32 grad sub-group {group} (pinned)"]
        assert list(flush.bytes) == [4 * elements]
    first = d2h["fp32 grad sub-group 1 (optimizer process) (pinned)"]
    assert first[0] == pytest.approx(partitions.iloc[0].end_s / US)
    adam = _spans(result, "cpu.superoffload")["cpu adam sub-group 1"]
    assert adam == (pytest.approx(first[1]), pytest.approx(first[1] + 287.68))
    second = d2h["fp32 grad sub-group 0 (optimizer process) (pinned)"]
    assert second[0] == pytest.approx(adam[1])
    assert partitions.iloc[1].end_s / US < adam[1]


def test_up_to_0_18_8_the_step_writes_no_cpu_sub_group_back(toy):
    """`_reassign_or_swap_out_partitioned_parameters` only re-views a CPU sub-group's 16-bit
    partition: after the wait and the overflow check the step unscales each sub-group and
    ends (no cast, no H2D), the host having noticed the process's last result at the first
    millisecond poll after the backward."""
    result = toy.run(_so(version="0.18.8"))
    spans = result.spans
    update = spans[spans.phase == "update"]
    assert not (update.op_kind == "param_copy_back").any()
    assert not (update.op_kind == "cast").any()
    host = _spans(result, "cpu")
    backward = result.phases[result.phases.phase == "backward"].end_s.max() / US
    assert host["overflow check"][0] == pytest.approx(backward + 1000)
    assert result.summary["iteration_s"] / US == pytest.approx(
        host["unscale sub-group 1"][1], rel=1e-12)


def test_up_to_0_18_8_clipping_still_steps_early_and_is_warned(toy):
    from zerosim.scenario.support import UnreplayedRollbackWarning

    with pytest.warns(UnreplayedRollbackWarning, match="does not clip"):
        result = toy.run(_so(version="0.18.8", clip=1.0))
    worker = _spans(result, "cpu.superoffload")
    assert worker["cpu adam sub-group 0"][1] < _spans(result, "cpu")["overflow check"][0]


@pytest.mark.parametrize(("patch", "key"), [
    ({"deepspeed": {"zero_optimization": {"stage": 2}}}, "super_offload"),
    ({"deepspeed": {"zero_optimization": {"offload_optimizer": {"device": "none"}}}},
     "offload_optimizer.device")])
def test_what_deepspeed_cannot_run_is_refused(toy, patch, key):
    from zerosim.scenario.loader import deep_merge

    with pytest.raises(ScenarioError, match=key):
        toy.scenario(deep_merge(_so(), patch))


def test_the_what_ifs_are_refused_with_it(toy):
    with pytest.raises(UnsupportedConfigError, match=r"what_if\.overlap_copy_back"):
        toy.scenario({**_so(), "what_if": {"overlap_copy_back": True}})


def test_check_names_the_mode_and_the_process(toy, capsys):
    from zerosim.report import render_scenario

    render_scenario(toy.scenario(_so()))
    out = capsys.readouterr().out
    assert "SuperOffload (sub-groups stepped by an optimizer process as" in out
    assert "the optimizer process of each rank on 2 threads (cpuadam_cores_perc 0.5)" in out
    assert toy.scenario(_so()).deepspeed.to_dict()["zero_optimization"]["offload_optimizer"][
        "cpuadam_cores_perc"] == 0.5


def test_check_prices_cpu_adam_on_the_process_threads(toy):
    """`zerosim check`'s CPU Adam line: the process's 2 threads at 1e8 params/s each, not the
    rank's pool of 4."""
    from zerosim.engine.probes import node_adam_rates

    assert node_adam_rates(toy.scenario(_so())).threads_params_per_s == pytest.approx(2e8)
    assert node_adam_rates(toy.scenario()).threads_params_per_s == pytest.approx(4e8)


SCENARIO = "scenarios/gh200/qwen3-14b-superoffload.yaml"


def test_tune_refuses_a_superoffload_scenario():
    """SuperOffload fixes the stage and the offload that tune moves."""
    from zerosim.tune import TuneError, tune

    with pytest.raises(TuneError, match=r"offload_optimizer\.super_offload"):
        tune(SCENARIO)


def test_the_shipped_example_steps_early_until_clipping_defaults_to_one():
    """DeepSpeedExamples' Qwen3-14B config sets no gradient_clipping: 0 on 0.18.9, where the
    process steps the sub-groups during the backward; 1.0 from 0.19.3, where they wait for
    the step and the iteration is longer than ZeRO-Offload's. Every CPU sub-group is stepped
once by the process."""
    import zerosim
    from zerosim.api import simulate_summary
    from zerosim.engine.plan import plan_of
    from zerosim.scenario import load_scenario

    so = "deepspeed.zero_optimization.offload_optimizer.super_offload=false"
    result = zerosim.simulate(SCENARIO)
    plan = plan_of(load_scenario(SCENARIO))
    stepped = result.spans[result.spans.stream == "cpu.superoffload"]
    assert sorted(stepped[stepped.op.str.startswith("cpu adam")].op) == sorted(
        f"cpu adam sub-group {g}" for g in range(len(plan.subgroups))
        if g not in plan.gpu_subgroups)
    early = result.summary["iteration_s"]
    plain = simulate_summary(load_scenario(SCENARIO, [so]))["iteration_s"]
    late = simulate_summary(load_scenario(SCENARIO, ["runtime.deepspeed_version=0.19.5"]))
    assert early < plain < late["iteration_s"]


def test_the_example_script_counts_four_passes_with_checkpointing():
    """finetune_zero3.py: batch x (2 x 4 x params x seq + 2 x 2 x 4 x layers x hidden x seq^2):
    4 x (8 x 14,768,307,200 x 4096 + 16 x 40 x 5120 x 4096^2) = 2.1556e15 FLOPs a step."""
    from zerosim.validation.superoffload_examples import script_tflops

    flops = 4 * (8 * 14_768_307_200 * 4096 + 16 * 40 * 5120 * 4096**2)
    assert script_tflops(14_768_307_200, 4096, 40, 5120, 4, 2.0) == pytest.approx(
        flops / 2e12, rel=1e-12)
    assert script_tflops(1, 1, 0, 0, 1, 1.0, checkpointed=False) == pytest.approx(6e-12)


def test_the_examples_figures_are_reported_beside_the_replay():
    """Round figures, reported: the replay of the Qwen3-14B example on DeepSpeed 0.18.0."""
    import warnings

    from zerosim.validation.validate import superoffload_example_cells

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cells = superoffload_example_cells()
    assert [(c.quantity, c.measured, c.status) for c in cells] == [
        ("SuperOffload TFLOPS (the script's count)", 500, "reported"),
        ("SuperOffload over ZeRO-Offload", 1.5, "reported")]
    assert 300 < cells[0].simulated < 700
