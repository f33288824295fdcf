"""`zerosim tune`: the search space, the memory floor that prunes before simulating, free and
fixed knobs, and the ranked table."""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from conftest import q

import zerosim
from zerosim.tune import (
    CHECKPOINTS_IN_HOST,
    KNOBS,
    Config,
    TuneError,
    _simulated,
    as_given,
    candidates,
    filling_threads,
    free_knobs,
    memory_floor,
    prune_reason,
    replayed,
    tune,
    why_best,
)

ROOT = Path(__file__).resolve().parent.parent


def test_the_scenario_as_given_is_a_config(toy):
    scenario = toy.scenario({"deepspeed": {"gradient_accumulation_steps": 2}}, gpus=2)
    assert as_given(scenario) == Config(3, "cpu", 1, 2, 5e8, 50000.0, 1.0, "none", False,
                                        zero_plus_plus="none", mics="none")


def test_mics_is_searched_without_offload_where_whole_nodes_hold_the_ranks(toy):
    """Four toy nodes of two GPUs: shard groups of one and two nodes flat, of two and four
    nodes hierarchical, at ZeRO-3 with nothing offloaded only; not on one node, not where the
    ranks leave a node part-filled, not on a release before MiCS."""
    from zerosim.tune import candidates, free_knobs, mics_choices

    nodes = {"hardware": {"nodes": 4}, "runtime": {"deepspeed_version": "0.19.5"},
             "deepspeed": {"gradient_accumulation_steps": 2}}
    scenario = toy.scenario({**nodes, "data_parallel": 8}, gpus=2)
    assert mics_choices(scenario) == ["mics2", "mics4", "mics4h", "mics8h"]
    found = candidates(as_given(scenario),
                       free_knobs(fix=["micro_batch", "reduce_bucket_size", "sub_group_size",
                                       "ratio", "checkpointing", "zero_plus_plus"]),
                       mics=mics_choices(scenario))
    with_mics = [c for c in found if c.mics != "none"]
    assert {c.mics for c in with_mics} == {"mics2", "mics4", "mics4h", "mics8h"}
    assert {(c.stage, c.offload) for c in with_mics} == {(3, "none")}
    hierarchical = next(c for c in found if c.mics == "mics4h")
    zero = "deepspeed.zero_optimization."
    assert hierarchical.overrides()[zero + "mics_shard_size"] == 4
    assert hierarchical.overrides()[zero + "mics_hierarchical_params_gather"] is True
    assert hierarchical.describe().endswith("MiCS over 4 ranks, hierarchical")
    plain = next(c for c in found if c.mics == "none")
    assert plain.overrides()[zero + "mics_shard_size"] == -1
    assert mics_choices(toy.scenario({**nodes, "data_parallel": 7}, gpus=2)) == []
    assert mics_choices(toy.scenario({"runtime": {"deepspeed_version": "0.19.5"}},
                                     gpus=2)) == []
    assert as_given(toy.scenario({"runtime": {"deepspeed_version": "0.9.1"}},
                                 gpus=2)).mics is None


def test_zero_plus_plus_is_searched_where_the_ranks_span_nodes(toy):
    """Two toy nodes of two GPUs: qwZ, qgZ, hpZ with a group per node, hpZ and qwZ, and all
    three, at ZeRO-3 only; qgZ only where whole nodes hold the ranks; on one node, or on a
    release before ZeRO++, the knob stays where it is."""
    from zerosim.tune import candidates, free_knobs, zero_plus_plus_choices

    two_nodes = {"hardware": {"nodes": 2}, "runtime": {"deepspeed_version": "0.19.5"},
                 "deepspeed": {"gradient_accumulation_steps": 2}}
    scenario = toy.scenario({**two_nodes, "data_parallel": 4}, gpus=2)
    assert zero_plus_plus_choices(scenario) == ["qwz", "qgz", "hpz2", "hpz2+qwz",
                                                "hpz2+qwz+qgz"]
    base = as_given(scenario)
    found = candidates(base, free_knobs(fix=["micro_batch", "reduce_bucket_size",
                                             "sub_group_size", "ratio", "checkpointing"]),
                       zero_plus_plus=zero_plus_plus_choices(scenario))
    stage3 = {(c.offload, c.zero_plus_plus) for c in found if c.stage == 3}
    assert {z for _, z in stage3} == {"none", "qwz", "qgz", "hpz2", "hpz2+qwz",
                                      "hpz2+qwz+qgz"}
    assert {c.zero_plus_plus for c in found if c.stage != 3} == {"none"}
    hpz = next(c for c in found if c.zero_plus_plus == "hpz2+qwz")
    zero = "deepspeed.zero_optimization."
    assert hpz.overrides()[zero + "zero_hpz_partition_size"] == 2
    assert hpz.overrides()[zero + "zero_quantized_weights"] is True
    assert hpz.overrides()[zero + "zero_quantized_gradients"] is False
    assert hpz.describe().endswith("hpZ over 2 ranks, qwZ")
    whole = next(c for c in found if c.zero_plus_plus == "hpz2+qwz+qgz")
    assert whole.overrides()[zero + "zero_quantized_gradients"] is True
    assert whole.describe().endswith("hpZ over 2 ranks, qwZ, qgZ")
    odd = toy.scenario({**two_nodes, "hardware": {"nodes": 3}, "data_parallel": 5}, gpus=2)
    assert zero_plus_plus_choices(odd) == ["qwz"]
    one_node = toy.scenario({"runtime": {"deepspeed_version": "0.19.5"}}, gpus=2)
    assert zero_plus_plus_choices(one_node) == []
    old = toy.scenario({**two_nodes, "data_parallel": 4,
                        "runtime": {"deepspeed_version": "0.13.1"}}, gpus=2)
    assert zero_plus_plus_choices(old) == ["qwz", "qgz"]
    assert as_given(toy.scenario({"runtime": {"deepspeed_version": "0.9.5"}},
                                 gpus=2)).zero_plus_plus is None


def test_the_parameters_alone_offloaded_is_a_config_of_its_own(toy):
    """The optimizer on the GPU, the 16-bit params in pinned host memory: `params`."""
    zero = {"offload_optimizer": {"device": "none"},
            "offload_param": {"device": "cpu", "pin_memory": True}}
    config = as_given(toy.scenario({"deepspeed": {"zero_optimization": zero}}))
    assert config.offload == "params" and config.devices() == ("none", "cpu")
    assert config.describe().startswith("ZeRO-3, CPU params, GPU optimizer")
    overrides = config.overrides()
    assert (overrides["deepspeed.zero_optimization.offload_optimizer.device"],
            overrides["deepspeed.zero_optimization.offload_param.device"],
            overrides["deepspeed.zero_optimization.offload_param.pin_memory"]) == (
        "none", "cpu", True)
    assert not replayed(Config(2, "params", 1, 1, 5e8, 1e9, 1.0, "none"))
    assert not replayed(Config(3, "params", 1, 1, 5e8, 1e9, 1.0, "overlap_copy_back"))


def test_only_what_the_engine_replays_is_searched():
    base = Config(3, "cpu", 1, 4, 5e8, 1e9, 1.0, "none")
    found = candidates(base, free_knobs())
    assert found[0] == base and len(set(found)) == len(found)
    assert all(replayed(c) for c in found)
    assert {c.micro_batch * c.gradient_accumulation for c in found} == {4}
    assert {c.micro_batch for c in found} == {1, 2, 4}
    assert {(c.stage, c.offload) for c in found} == {
        (0, "none"), (1, "none"), (2, "none"), (3, "none"), (3, "params"), (1, "cpu"),
        (2, "cpu"), (3, "cpu"), (3, "cpu+params")}
    assert {c.ratio for c in found if c.ratio < 1} == {0.5}
    assert all(c.stage == 3 and c.offload == "cpu" for c in found if c.ratio < 1)
    assert {c.sub_group_size for c in found if c.stage < 3} == {1e9}
    assert {c.what_if for c in found} == {"none"}
    assert {c.checkpointing for c in found} == {False, True, CHECKPOINTS_IN_HOST}
    assert not any("nvme" in c.offload for c in found)


def test_nvme_is_searched_where_the_profile_has_drives_and_run_only_where_host_memory_is_short():
    base = Config(3, "cpu", 1, 4, 5e8, 1e9, 1.0, "none")
    found = candidates(base, free_knobs(fix=["checkpointing"]), nvme=True)
    assert {c.offload for c in found if c.stage == 3} == {"none", "params", "cpu", "cpu+params",
                                                          "nvme", "nvme+params"}
    assert {c.stage for c in found if "nvme" in c.offload} == {3}
    assert all(c.ratio == 1.0 and c.what_if == "none" for c in found if "nvme" in c.offload)
    assert Config(3, "nvme+params", 1, 4, 5e8, 1e9, 1.0, "none").cpu_twin() == Config(
        3, "cpu+params", 1, 4, 5e8, 1e9, 1.0, "none")


def test_fixed_knobs_keep_the_scenarios_values_and_freed_ones_open():
    base = Config(3, "cpu", 1, 4, 5e8, 1e9, 1.0, "none")
    found = candidates(base, free_knobs(free=["what_if"], fix=["stage", "offload",
                                                                "micro_batch"]))
    assert {(c.stage, c.offload, c.micro_batch) for c in found} == {(3, "cpu", 1)}
    assert {c.what_if for c in found} == {"none", "overlap_copy_back", "buffer_boundary_grads",
                                          "gpu_update_every"}
    with pytest.raises(TuneError) as unknown:
        free_knobs(free=["bucket"])
    assert str(unknown.value) == f"--free bucket: expected one of {', '.join(KNOBS)}, got 'bucket'"
    with pytest.raises(TuneError) as both:
        free_knobs(free=["stage"], fix=["stage"])
    assert str(both.value) == ("--fix stage: expected a knob not also freed, got 'stage', given "
                               "to --free too")


def test_a_pruned_configuration_runs_out_of_memory(toy):
    """The floor is a lower bound of the engine's peak: what it prunes, the engine refuses."""
    patch = {"hardware": {"gpu": {"hbm_GiB": {"value": 0.5, "basis": "assumed",
                                              "source": "test"}}}}
    scenario = toy.scenario(patch, gpus=2)
    gpu, _ = memory_floor(scenario)
    assert gpu > scenario.hardware.hbm_bytes
    assert prune_reason(scenario).startswith("HBM floor")
    assert zerosim.simulate(scenario).status == "oom"
    fits = toy.scenario(gpus=2)
    assert prune_reason(fits) == ""
    assert memory_floor(fits)[0] <= zerosim.simulate(fits).summary["peak_hbm_GiB"] * 2**30


def test_tune_ranks_what_fits_and_writes_the_table(toy_file, tmp_path):
    outcome = tune(toy_file, fix=["reduce_bucket_size", "sub_group_size", "ratio"], workers=1,
                   out_dir=tmp_path / "out")
    ok = [r for r in outcome.rows if r["status"] == "ok"]
    # the toy fits everywhere: only checkpoints in host memory wait for their twin on the GPU
    # (pruned as it fits)
    waited = [r for r in outcome.rows if r["status"] == "pruned"]
    assert len(ok) == outcome.simulated == len(outcome.rows) - len(waited)
    assert {r["checkpointing"] for r in waited} == {CHECKPOINTS_IN_HOST}
    times = [r["iteration_s"] for r in ok]
    assert times == sorted(times) and [r["rank"] for r in ok] == list(range(1, len(ok) + 1))
    best = outcome.best
    assert best["tokens_per_s"] == pytest.approx(4 * 8 / best["iteration_s"], rel=1e-12)
    rows = list(csv.DictReader((tmp_path / "out" / "tune.csv").open()))
    assert [r["rank"] for r in rows] == [str(r["rank"] or "") for r in outcome.rows]
    assert float(rows[0]["iteration_s"]) == best["iteration_s"]
    assert why_best(outcome.rows).startswith(f"fastest: {best['config'].describe()}")


def test_a_tight_configuration_is_marked_and_the_fastest_with_room_named(toy_file):
    """A configuration whose peak comes within `PEAK_ERROR_FRACTION` of a device's memory is
    noted as tight; when it is the fastest, the sentence names the fastest with room."""
    outcome = tune(toy_file, fix=["reduce_bucket_size", "sub_group_size", "ratio"], workers=1)
    best, second = outcome.rows[0], outcome.rows[1]
    _simulated(best, {"status": "ok", "iteration_s": best["iteration_s"],
                      "tokens_per_s": 32 / best["iteration_s"],
                      "peak_hbm_GiB": 15.9, "hbm_capacity_GiB": 16.0,
                      "peak_host_GiB": 1.0, "host_capacity_GiB": 64.0})
    assert best["tight"] == ("HBM",)
    assert best["note"] == ("tight: peak HBM 15.90 of 16.00 GiB, within 4%: a real run may "
                            "not fit")
    assert second["tight"] == ()
    assert (f"its peak HBM within 4% of the device's memory (the fastest with room to spare: "
            f"{second['config'].describe()}, {second['iteration_s']:.2f} s)"
            in why_best(outcome.rows))


def test_the_command_prints_the_ranking_and_why(toy_file, tmp_path):
    from click.testing import CliRunner

    from zerosim.cli import main

    out = tmp_path / "tuned"
    result = CliRunner().invoke(main, ["tune", str(toy_file), "--workers", "1", "--out",
                                       str(out), "--fix", "reduce_bucket_size", "--fix",
                                       "sub_group_size", "--top", "3"])
    assert result.exit_code == 0, result.output
    assert "fastest: ZeRO-" in result.output and "tune.csv" in result.output
    assert (out / "tune.csv").exists()
    # the fastest simulated once more with every record: what each of its phases waits on
    assert "the fastest, critical path of rank 0" in result.output


def test_the_command_shows_the_scenarios_warnings_once(toy, tmp_path, recwarn):
    """A key zerosim does not model: `warning: ...` as the scenario loads, nothing after (each
    configuration tried would repeat it)."""
    from click.testing import CliRunner

    from zerosim.cli import main
    from zerosim.errors import ScenarioWarning

    path = tmp_path / "toy.yaml"
    zero = {"zero_quantized_nontrainable_weights": True}
    path.write_text(yaml.safe_dump(toy.tree({"deepspeed": {
        "gradient_accumulation_steps": 2, "zero_optimization": zero}}, gpus=2)))
    result = CliRunner().invoke(main, ["tune", str(path), "--workers", "1", "--out",
                                       str(tmp_path / "tuned"), "--fix", "reduce_bucket_size",
                                       "--fix", "sub_group_size", "--top", "1"])
    assert result.exit_code == 0, result.output
    assert result.output.count("zero_quantized_nontrainable_weights") == 1
    assert [w for w in recwarn if issubclass(w.category, ScenarioWarning)] == []


def test_an_nvme_offload_runs_only_when_its_host_memory_twin_does_not_fit(toy, tmp_path):
    """The toy node with two NVMe drives: the NVMe offloads wait for their host-memory twins.
    With 64 GiB of host memory the CPU offloads fit, so their NVMe twins are pruned; with a
    host too small for the fp32 states they do not, and the NVMe offloads are simulated. On
    0.14.3, whose CPU Adam pins no 1 GiB of tile buffers, so that the toy's few MiB decide."""
    drives = {"drives_per_node": 2, "read_GBps_per_drive": q(1.0),
              "write_GBps_per_drive": q(0.5), "latency_us": q(0), "capacity_GiB_per_drive": q(100)}

    def tuned(host_GiB: float, name: str) -> dict[str, dict]:
        tree = toy.tree({"deepspeed": {"gradient_accumulation_steps": 2},
                         "runtime": {"deepspeed_version": "0.14.3"}, "hardware": {
            "host": {"memory_GiB": q(host_GiB)}, "nvme": drives}}, gpus=2)
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(tree))
        outcome = tune(path, free=["offload"], fix=["stage", "micro_batch", "reduce_bucket_size",
                                                    "sub_group_size", "ratio", "checkpointing"],
                       workers=1)
        return {r["offload"]: r for r in outcome.rows}

    roomy = tuned(64, "roomy")
    assert roomy["nvme"]["status"] == "pruned"
    assert roomy["nvme"]["note"].startswith("slower than cpu offload, which fits")
    assert roomy["cpu"]["status"] == "ok"
    short = tuned(1.5e-3, "short")
    assert short["cpu"]["status"] in {"pruned", "oom"}
    assert short["nvme"]["status"] in {"ok", "oom"}


def test_the_interleaved_update_gap_is_searched_on_a_fork_build_only():
    """Gaps 2-4 of the Deep Optimizer States fork, where the fork replays them: ZeRO-3 with
    the optimizer (not the params) on the CPU, no Twin-Flow; a release keeps gap 0."""
    base = Config(3, "cpu", 1, 4, 5e8, 1e9, 1.0, "none")
    assert {c.gap for c in candidates(base, free_knobs())} == {0}
    found = candidates(base, free_knobs(), fork=True)
    assert {c.gap for c in found} == {0, 2, 3, 4}
    assert all(c.stage == 3 and c.offload == "cpu" and c.ratio == 1 for c in found if c.gap)
    assert {c.gap for c in candidates(base, free_knobs(fix=["gap"]), fork=True)} == {0}
    interleaved = Config(3, "cpu", 1, 4, 5e8, 1e8, 1.0, "none", gap=3)
    assert interleaved.overrides()[
        "deepspeed.zero_optimization.offload_optimizer.prefetch_optimizer_gap"] == 3
    assert interleaved.describe().endswith("interleaved update, gap 3")


def test_tune_on_a_fork_build_ranks_the_gaps(toy, tmp_path):
    """The toy's two sub-groups: gap 2 steps the second on the GPU."""
    path = tmp_path / "fork.yaml"
    path.write_text(yaml.safe_dump(toy.tree({"runtime": {"deepspeed_version": "0.13.3+4570a955"}})))
    outcome = tune(path, free=["gap"], fix=["stage", "offload", "micro_batch",
                                           "reduce_bucket_size", "sub_group_size", "ratio",
                                           "checkpointing"], workers=1)
    gaps = {r["gap"]: r["status"] for r in outcome.rows}
    assert gaps == {0: "ok", 2: "ok", 3: "ok", 4: "ok"}


def test_binding_is_searched_on_a_node_of_several_numa_domains_for_offloaded_runs_only():
    base = Config(3, "cpu", 1, 4, 5e8, 1e9, 1.0, "none")
    assert {c.binding for c in candidates(base, free_knobs())} == {False}
    found = candidates(base, free_knobs(), numa=True)
    assert {c.binding for c in found} == {False, True}
    assert all(c.offload != "none" for c in found if c.binding)
    assert {c.binding for c in candidates(base, free_knobs(fix=["binding"]), numa=True)} == {False}
    bound = Config(3, "cpu", 1, 4, 5e8, 1e8, 1.0, "none", binding=True)
    assert bound.overrides()["runtime.bind_cores_to_rank"] is True
    assert bound.describe().endswith("cores bound")


def test_threads_are_searched_where_the_default_pools_oversubscribe_for_offloaded_runs_only():
    base = Config(3, "cpu", 1, 4, 5e8, 1e9, 1.0, "none")
    assert {c.threads for c in candidates(base, free_knobs())} == {0}
    found = candidates(base, free_knobs(), filling_threads=48)
    assert {c.threads for c in found} == {0, 48}
    assert all(c.offload != "none" for c in found if c.threads)
    assert {c.threads for c in candidates(base, free_knobs(fix=["threads"]),
                                          filling_threads=48)} == {0}
    default = Config(3, "cpu", 1, 4, 5e8, 1e8, 1.0, "none")
    assert default.overrides()["runtime.cpu_threads_per_rank"] is None
    filled = Config(3, "cpu", 1, 4, 5e8, 1e8, 1.0, "none", threads=48)
    assert filled.overrides()["runtime.cpu_threads_per_rank"] == 48
    assert filled.describe().endswith("48 threads per rank")


@pytest.mark.parametrize(("dp", "threads"), [(4, 48), (2, 0), (1, 0)])
def test_filling_threads_fill_the_node_where_the_default_pools_oversubscribe_it(dp, threads):
    """The study's node: 192 hardware threads; one per physical core (96) a rank by default,
    so only four ranks oversubscribe it, and 48 each fill it."""
    scenario = zerosim.load_scenario(ROOT / "scenarios" / f"llama13b_dp{dp}.yaml")
    assert filling_threads(scenario) == threads


def _bf16_toy(toy, **bf16):
    return toy.scenario({"runtime": {"deepspeed_version": "0.19.5"},
                         "deepspeed": {"fp16": {"enabled": False},
                                       "bf16": {"enabled": True, **bf16}}})


def test_the_master_precision_is_a_knob_under_bf16_training_from_0_18_3(toy):
    """fp32, bf16 or bf16 master params and moments where the release reads the keys and the
    run trains in bf16; None (nothing set) elsewhere: the study's fp16 0.13.3 toy."""
    assert as_given(toy.scenario()).master is None
    assert as_given(_bf16_toy(toy)).master == "fp32"
    assert as_given(_bf16_toy(toy, bf16_master_weights_and_grads=True)).master == "bf16"
    both = _bf16_toy(toy, bf16_master_weights_and_grads=True, bf16_optimizer_states=True)
    assert as_given(both).master == "bf16+moments"
    assert "master" not in free_knobs() and "master" in free_knobs(free=["master"])


def test_the_master_precision_is_searched_where_the_engine_replays_it(toy):
    """Freed, each offloaded or GPU configuration is tried at the three precisions, but bf16
    master params with fp32 moments on the GPU (DeepSpeed wants the optimizer offloaded for
    them) and bf16 ones with the params alone offloaded; it sets DeepSpeedCPUAdam's own flag
    only with the optimizer on the CPU."""
    base = as_given(_bf16_toy(toy))
    found = candidates(base, free_knobs(free=["master"], fix=[
        "micro_batch", "reduce_bucket_size", "sub_group_size", "ratio", "checkpointing",
        "binding", "threads"]))
    by_offload = {}
    for config in found:
        if config.stage == 3:
            by_offload.setdefault(config.offload, set()).add(config.master)
    assert by_offload == {"cpu": {"fp32", "bf16", "bf16+moments"},
                          "cpu+params": {"fp32", "bf16", "bf16+moments"},
                          "none": {"fp32", "bf16+moments"}, "params": {"fp32"}}
    gpu = next(c for c in found if c.stage == 3 and c.offload == "none"
               and c.master == "bf16+moments")
    overrides = gpu.overrides()
    assert overrides["deepspeed.bf16.bf16_master_weights_and_grads"] is True
    assert overrides["deepspeed.bf16.bf16_optimizer_states"] is True
    assert "deepspeed.optimizer.params.fp32_optimizer_states" not in overrides
    cpu = replace(base, master="bf16")
    assert cpu.overrides()["deepspeed.optimizer.params.fp32_optimizer_states"] is True
    assert cpu.describe().endswith("bf16 master")
    assert not candidates(as_given(toy.scenario()), free_knobs(free=["master"]))[0].master



def test_leaf_modules_are_a_knob_where_the_release_reads_the_threshold(toy):
    """`module_granularity_threshold` from DeepSpeed 0.16.0: the toy (granularity 3,276 its
    attentions, 3,424 its decoder layers, 3,652 `model`, 3,965 the whole model) makes four sets
    of leaves besides none; searched at stage 3 only, and nothing set on 0.13.3."""
    from zerosim.engine.plan import granularity_thresholds

    old = as_given(toy.scenario())
    assert old.leaves is None and "leaves" in free_knobs()
    assert "module_granularity_threshold" not in str(old.overrides())
    scenario = toy.scenario({"runtime": {"deepspeed_version": "0.19.5"}})
    base = as_given(scenario)
    thresholds = granularity_thresholds(scenario)
    assert base.leaves == 0 and thresholds == (3276, 3424, 3652, 3965)
    found = candidates(base, free_knobs(fix=["micro_batch", "reduce_bucket_size",
                                             "sub_group_size", "ratio", "checkpointing"]),
                       thresholds=thresholds)
    by_stage = {}
    for config in found:
        by_stage.setdefault(config.stage, set()).add(config.leaves)
    assert by_stage == {0: {0}, 1: {0}, 2: {0}, 3: {0, *thresholds}}
    layers = next(c for c in found if c.leaves == 3424)
    assert layers.overrides()["deepspeed.zero_optimization.module_granularity_threshold"] == 3424
    assert "leaf modules at granularity 3.4e3" in layers.describe()


def test_checkpoints_in_host_memory_are_searched_on_either_checkpoint_function(toy):
    """The checkpointing knob tries the checkpoints in host memory too
    (`runtime.checkpoint_in_cpu`), through DeepSpeed's checkpoint (Megatron-DeepSpeed's) or
    torch's as Arctic Long Sequence Training patches it; a scenario that keeps them there is
    given as `cpu`."""
    from conftest import toy_stack

    from zerosim.tune import candidates, free_knobs

    stack = toy_stack()
    stack["modules"]["checkpoint_function"] = {"value": "deepspeed", "source": "test"}
    fixed = free_knobs(fix=["stage", "offload", "micro_batch", "reduce_bucket_size",
                            "sub_group_size", "ratio"])
    for framework in (stack, toy_stack()):
        scenario = toy.scenario({"runtime": {"framework": framework},
                                 "deepspeed": {"gradient_accumulation_steps": 2}}, gpus=1)
        found = candidates(as_given(scenario), fixed)
        assert [c.checkpointing for c in found] == [False, True, CHECKPOINTS_IN_HOST]
    in_host = found[-1]
    assert in_host.overrides()["activation_checkpointing"] is True
    assert in_host.overrides()["runtime.checkpoint_in_cpu"] is True
    assert found[1].overrides()["runtime.checkpoint_in_cpu"] is False
    assert in_host.describe().endswith("checkpointing, checkpoints in host memory")
    kept = toy.scenario({"runtime": {"framework": stack, "checkpoint_in_cpu": True},
                         "activation_checkpointing": True}, gpus=1)
    assert as_given(kept).checkpointing == CHECKPOINTS_IN_HOST


def test_checkpoints_in_host_memory_run_only_when_their_twin_on_the_gpu_does_not_fit(
        toy, tmp_path):
    """On the toy node with a stack that checkpoints through DeepSpeed, checkpoints in host
    memory wait for their twin with the checkpoints on the GPU: where that fits they are
    pruned (they only add copies); with an NVMe offload beside them they wait for its
    host-memory twin, which waits for its own."""
    from conftest import toy_stack

    stack = toy_stack()
    stack["modules"]["checkpoint_function"] = {"value": "deepspeed", "source": "test"}
    drives = {"drives_per_node": 2, "read_GBps_per_drive": q(1.0),
              "write_GBps_per_drive": q(0.5), "latency_us": q(0), "capacity_GiB_per_drive": q(100)}
    tree = toy.tree({"deepspeed": {"gradient_accumulation_steps": 2},
                     "runtime": {"deepspeed_version": "0.14.3", "framework": stack},
                     "hardware": {"nvme": drives}}, gpus=2)
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(tree))
    outcome = tune(path, free=["offload", "checkpointing"],
                   fix=["stage", "micro_batch", "reduce_bucket_size", "sub_group_size", "ratio"],
                   workers=1)
    rows = {(r["offload"], r["checkpointing"]): r for r in outcome.rows}
    assert rows[("cpu", True)]["status"] == "ok"
    assert rows[("cpu", "cpu")]["status"] == "pruned"
    assert rows[("cpu", "cpu")]["note"].startswith("slower than the checkpoints on the GPU")
    assert rows[("nvme", "cpu")]["status"] == "pruned"
    assert rows[("nvme", "cpu")]["note"].startswith(
        "slower than ZeRO-3, CPU optimizer, micro-batch 1x2, buckets 5e8, sub-groups 5e4, "
        "checkpointing, 2 threads per rank, which fits: NVMe, checkpoints in host memory")
    assert outcome.simulated == sum(r["status"] in {"ok", "oom"} for r in outcome.rows)


def test_the_tiling_knob_offers_what_the_release_and_the_model_take(toy):
    """Arctic Long Sequence Training's tiled loss (0.17.4+, an untied output layer) and tiled
    MLP (0.17.0+, gate and up apart), each and both, at `auto` slices; none before 0.17.0."""
    from zerosim.tune import tiling_choices

    def choices(version, **patch):
        return tiling_choices(toy.scenario({"runtime": {"deepspeed_version": version},
                                            **patch}))

    assert choices("0.19.5") == ["loss", "mlp", "loss+mlp"]
    assert choices("0.17.0") == ["mlp"]
    assert choices("0.13.3") == []
    assert as_given(toy.scenario()).tiling is None
    assert choices("0.19.5", model={"tie_word_embeddings": True}) == ["mlp"]


def test_a_tiling_as_given_keeps_its_counts_and_waits_for_its_untiled_twin(toy):
    from zerosim.tune import NO_TILING

    scenario = toy.scenario({"runtime": {"deepspeed_version": "0.19.5",
                                         "tiled_loss_shards": 3, "tiled_mlp_shards": "auto"}})
    base = as_given(scenario)
    assert base.tiling == "loss3+mlp"
    assert (base.tiled("loss"), base.tiled("mlp")) == (3, "auto")
    assert base.overrides()["runtime.tiled_loss_shards"] == 3
    assert base.overrides()["runtime.tiled_mlp_shards"] == "auto"
    assert base.describe().endswith("tiled loss (3 slices), tiled MLP")
    assert base.twin().tiling == "loss3" and base.twin().twin().tiling == NO_TILING
    assert base.twin().twin().twin() is None
    plain = as_given(toy.scenario({"runtime": {"deepspeed_version": "0.19.5"}}))
    assert plain.tiling == NO_TILING
    assert plain.overrides()["runtime.tiled_loss_shards"] is None
    found = candidates(plain, free_knobs(fix=["stage", "offload", "micro_batch",
                                              "reduce_bucket_size", "sub_group_size", "ratio",
                                              "checkpointing"]),
                       tilings=["loss", "mlp", "loss+mlp"])
    assert [c.tiling for c in found] == [NO_TILING, "loss", "mlp", "loss+mlp"]


def test_tune_finds_the_alst_tricks_where_ulysses_alone_does_not_fit():
    """2M tokens over a DGX H100 (the ALST scenario stripped of its tricks): with the
    checkpointing and tiling knobs free, only the tiled loss with the checkpoints in host
    memory fits, with the tiled MLP or without it, which is faster (the tiled MLP runs its
    forward again)."""
    path = "scenarios/llama8b_alst_dgx_h100.yaml"
    outcome = tune(path, overrides={"runtime.tiled_loss_shards": None,
                                    "runtime.tiled_mlp_shards": None,
                                    "runtime.checkpoint_in_cpu": False,
                                    "sequence_length": 2097152},
                   free=["tiling", "checkpointing"],
                   fix=[k for k in KNOBS if k not in ("tiling", "checkpointing")], workers=1)
    fitting = [(r["tiling"], r["checkpointing"]) for r in outcome.rows if r["status"] == "ok"]
    assert fitting == [("loss", CHECKPOINTS_IN_HOST), ("loss+mlp", CHECKPOINTS_IN_HOST)]


ULYSSES = ROOT / "scenarios" / "llama8b_ulysses_dgx_h100.yaml"
EIGHT_SEQUENCES = {"deepspeed.gradient_accumulation_steps": 8}
"""The Ulysses scenario (128K tokens, groups of all 8 GPUs) at 8 sequences a step."""


def test_the_sequence_parallel_knob_holds_the_global_batch_of_sequences():
    """`--free sequence_parallel`: every group size the model and the release take, each
    data-parallel group training size / 8 of the scenario's 8 sequences per group, split
    into micro-batches as the micro_batch knob says; the scenario's own size first."""
    from zerosim.tune import sequence_parallel_choices

    scenario = zerosim.load_scenario(ULYSSES, EIGHT_SEQUENCES)
    assert sequence_parallel_choices(scenario) == [1, 2, 4, 8]
    base = as_given(scenario)
    assert base.sequence_parallel == 8
    sizes = sequence_parallel_choices(scenario)
    found = candidates(base, frozenset({"sequence_parallel", "micro_batch"}),
                       sequence_parallel=sizes)
    assert [(c.sequence_parallel, c.micro_batch, c.gradient_accumulation) for c in found] == [
        (8, 1, 8), (8, 2, 4), (8, 4, 2), (8, 8, 1), (1, 1, 1), (2, 1, 2), (2, 2, 1),
        (4, 1, 4), (4, 2, 2), (4, 4, 1)]
    assert {c.micro_batch * c.gradient_accumulation * 8 // c.sequence_parallel
            for c in found} == {8}
    fixed_micro = candidates(base, frozenset({"sequence_parallel"}), sequence_parallel=sizes)
    assert [(c.sequence_parallel, c.gradient_accumulation) for c in fixed_micro] == [
        (8, 8), (1, 1), (2, 2), (4, 4)]
    one_sequence = as_given(zerosim.load_scenario(ULYSSES))
    assert [c.sequence_parallel for c in candidates(
        one_sequence, frozenset({"sequence_parallel"}), sequence_parallel=sizes)] == [8]


def test_the_sequence_parallel_knob_is_freed_only_when_asked_and_sets_the_group_size():
    from zerosim.tune import sequence_parallel_choices

    assert "sequence_parallel" in KNOBS and "sequence_parallel" not in free_knobs()
    base = as_given(zerosim.load_scenario(ULYSSES, EIGHT_SEQUENCES))
    assert [c.sequence_parallel for c in candidates(base, frozenset(),
                                                    sequence_parallel=[1, 2, 4, 8])] == [8]
    four = replace(base, sequence_parallel=4, gradient_accumulation=4)
    assert four.overrides()["deepspeed.sequence_parallel_size"] == 4
    assert four.describe().endswith("checkpointing, Ulysses over 4 ranks")
    assert "Ulysses" not in replace(base, sequence_parallel=1).describe()
    for other in ({"gap": 2}, {"mics": "mics4", "offload": "none"},
                  {"zero_plus_plus": "qwz"}):
        assert replayed(replace(base, **other, sequence_parallel=1))
        assert not replayed(replace(base, **other))
    study = zerosim.load_scenario(ROOT / "scenarios" / "llama13b_dp4.yaml")
    assert sequence_parallel_choices(study) == [1, 2, 4]  # 40 heads, eager attention
    before = zerosim.load_scenario(ROOT / "scenarios" / "llama8b_liger_dgx_h100.yaml",
                                   {"runtime.deepspeed_version": "0.16.9"})
    assert sequence_parallel_choices(before) == [1]  # UlyssesSPAttentionHF is new in 0.17.0
    assert as_given(before).sequence_parallel is None
    assert "deepspeed.sequence_parallel_size" not in as_given(before).overrides()


def test_tune_compares_ulysses_group_sizes_on_the_same_sequences(tmp_path):
    """At 8 sequences of 128K tokens a step on a DGX H100, checkpointed, ZeRO-3 with the
    optimizer on the CPU: a whole sequence on one GPU does not fit, and every fitting row
    trains the same tokens, with its group size in tune.csv."""
    outcome = tune(ULYSSES, overrides=EIGHT_SEQUENCES, free=["sequence_parallel"],
                   fix=[k for k in KNOBS if k not in ("sequence_parallel", "micro_batch")],
                   workers=1, out_dir=tmp_path)
    fitting = [r for r in outcome.rows if r["status"] == "ok"]
    assert fitting and {r["sequence_parallel"] for r in fitting} <= {4, 8}
    for row in fitting:
        assert row["tokens_per_s"] * row["iteration_s"] == pytest.approx(8 * 131072)
    assert all(r["status"] != "ok" for r in outcome.rows if r["sequence_parallel"] == 1)
    with open(tmp_path / "tune.csv") as table:
        assert {r["sequence_parallel"] for r in csv.DictReader(table)} == {"1", "2", "4", "8"}
