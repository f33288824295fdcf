"""Cores bound to each rank (`runtime.bind_cores_to_rank`): where a bound rank's threads and
pages sit, its thread count, the scenario key, and the measured runs whose build implies it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from zerosim.behaviours import DEEP_OPTIMIZER_STATES_BUILDS, launched_bound
from zerosim.hardware.costs import default_threads_per_rank
from zerosim.hardware.placement import bound_domains, place_ranks
from zerosim.hardware.profile import load_profile
from zerosim.runs import read_runs_text
from zerosim.scenario import load_scenario, scenario_from_dict
from zerosim.validation.polaris import load_runs

POLARIS = load_profile("polaris-a100")
JLSE = load_profile("h100-jlse")


@pytest.mark.parametrize(("profile", "ranks", "expected"), [
    # Polaris: GPU r on domain 3 - r, the core list in GPU order: 3, 2, 1, 0.
    (POLARIS, 4, [((3, 1.0),), ((2, 1.0),), ((1, 1.0),), ((0, 1.0),)]),
    (POLARIS, 2, [((3, 0.5), (2, 0.5)), ((1, 0.5), (0, 0.5))]),
    (POLARIS, 1, [((3, 0.25), (2, 0.25), (1, 0.25), (0, 0.25))]),
    # The study's node: GPUs 0, 1 on domain 0 and 2, 3 on domain 1; two ranks share a domain.
    (JLSE, 4, [((0, 1.0),), ((0, 1.0),), ((1, 1.0),), ((1, 1.0),)]),
    (JLSE, 2, [((0, 1.0),), ((1, 1.0),)]),
])
def test_a_bound_rank_gets_its_part_of_the_core_list_in_gpu_order(profile, ranks, expected):
    assert [bound_domains(profile, r, ranks) for r in range(ranks)] == expected


def test_a_domain_without_a_gpu_comes_last_in_the_core_list():
    profile = replace(POLARIS, gpu_numa_domain=(1, 1, 1, 1))
    assert [bound_domains(profile, r, 2) for r in range(2)] == [
        ((1, 0.5), (0, 0.5)), ((2, 0.5), (3, 0.5))]


def test_bound_placements_put_threads_and_pages_together():
    bound = place_ranks(POLARIS, 4, bound=True)
    assert [(pl.home, pl.spread, pl.threads) for pl in bound] == [
        (((d, 1.0),),) * 3 for d in (3, 2, 1, 0)]
    unbound = place_ranks(POLARIS, 4)
    every = tuple((d, 0.25) for d in range(4))
    assert {(pl.home, pl.spread, pl.threads) for pl in unbound} == {(every, every, every)}


def test_a_part_of_several_domains_keeps_the_host_threads_buffers_on_one():
    """DeepSpeed passes `numactl -m` only for a part inside one domain: across several, what
    the host thread allocates stays on the part's first domain (round_robin profiles), or
    spreads over the part where the profile's placement is interleaved."""
    dgx = load_profile("dgx-a100")   # NPS4: GPUs 0-1 on domain 3; core list 3, 1, 7, 5, 0, ...
    quarter = 0.25
    assert [(pl.home, pl.spread) for pl in place_ranks(dgx, 2, bound=True)] == [
        (((3, 1.0),), tuple((d, quarter) for d in (3, 1, 7, 5))),
        (((0, 1.0),), tuple((d, quarter) for d in (0, 2, 4, 6)))]
    assert [pl.home for pl in place_ranks(JLSE, 2, bound=True)] == [((0, 1.0),), ((1, 1.0),)]
    (polaris_dp1,) = place_ranks(POLARIS, 1, bound=True)
    assert polaris_dp1.home == polaris_dp1.spread == tuple((d, quarter) for d in (3, 2, 1, 0))


def test_a_bound_rank_runs_its_share_of_the_physical_cores():
    """OMP_NUM_THREADS = cores per rank (DeepSpeed's launcher); unbound, PyTorch's default of
    one thread per physical core whatever the ranks."""
    assert default_threads_per_rank(POLARIS, 4, bound=True) == 8
    assert default_threads_per_rank(POLARIS, 1, bound=True) == 32
    assert default_threads_per_rank(POLARIS, 4) == 32
    assert default_threads_per_rank(replace(POLARIS, cores_per_socket=2), 4, bound=True) == 1


def test_the_key_shows_in_the_resolved_scenario_and_loads_again(tmp_path):
    path = "scenarios/calibration/polaris/polaris-5.95b-dp4-mb1-ga1-sg1e08.yaml"
    scenario = load_scenario(path)
    assert scenario.runtime.bind_cores_to_rank
    resolved = scenario.to_dict()
    assert resolved["runtime"]["bind_cores_to_rank"] is True
    unbound = load_scenario(path, ["runtime.bind_cores_to_rank=false"])
    assert "bind_cores_to_rank" not in unbound.to_dict()["runtime"]


def test_a_non_boolean_binding_is_refused():
    tree = load_scenario("scenarios/llama13b_dp4.yaml").to_dict()
    with pytest.raises(Exception, match="bind_cores_to_rank"):
        scenario_from_dict({"model": tree["model"], "sequence_length": 2048,
                            "hardware": "h100-jlse", "data_parallel": 4,
                            "deepspeed": {"train_micro_batch_size_per_gpu": 1,
                                          "zero_optimization": {"stage": 3}},
                            "runtime": {"bind_cores_to_rank": "yes"}}, source="<t>")


def test_the_fork_builds_from_c7da512a_on_are_taken_as_bound():
    assert [b.commit for b in DEEP_OPTIMIZER_STATES_BUILDS if b.binds_cores] == [
        "c7da512a", "d8048a5e", "5c3f1413", "f4b9a296", "6132c06b", "4570a955", "d18d6f81"]
    assert launched_bound("0.13.3+c7da512a") and launched_bound("0.13.3+4570a955")
    assert not launched_bound("0.13.3+8074cd62") and not launched_bound("0.13.3")
    assert not launched_bound("0.13.3+0123456789")
    bound = {run.build for run in load_runs() if run.bind_cores_to_rank}
    assert bound == {"0.13.3+c7da512a", "0.13.3+4570a955"}


@pytest.mark.parametrize(("runtime", "warns"), [
    ({"deepspeed_version": "0.13.3+5c3f1413"}, True),
    ({"deepspeed_version": "0.13.3+5c3f1413", "bind_cores_to_rank": False}, False),
    ({"deepspeed_version": "0.13.3+5c3f1413", "bind_cores_to_rank": True}, False),
    ({"deepspeed_version": "0.13.3+8074cd62"}, False),
    ({"deepspeed_version": "0.13.3"}, False),
])
def test_a_scenario_of_a_bound_build_is_told_when_it_does_not_say_how_it_ran(runtime, warns):
    """A build whose runs `zerosim predict` replays bound, in a scenario that leaves its
    launch unsaid on a node of several NUMA domains: its ranks run unbound, and it says so."""
    import warnings

    tree = {"model": "llama2-7b", "sequence_length": 512, "hardware": "polaris-a100",
            "data_parallel": 4, "deepspeed": {"train_micro_batch_size_per_gpu": 1,
                                              "bf16": {"enabled": True},
                                              "zero_optimization": {"stage": 3}},
            "runtime": runtime}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scenario = scenario_from_dict(tree, source="<test>")
    said = [str(w.message) for w in caught if "bind_cores_to_rank" in str(w.message)]
    assert len(said) == warns
    assert scenario.runtime.bind_cores_to_rank == runtime.get("bind_cores_to_rank", False)
    if warns:
        assert said[0].startswith("<test>: runtime.deepspeed_version: the Deep Optimizer "
                                  "States study launched the runs of build 5c3f1413 with "
                                  "--bind_cores_to_rank")


HEADER = ("num_gpus,num_layers,hidden_size,ffn_hidden_size,num_attention_heads,"
          "num_key_value_heads,seq_length,padded_vocab_size,micro_batch_size,grad_accum_steps,"
          "deepspeed_version")
ROW = "4,2,512,1024,8,8,256,1024,1,1,"


@pytest.mark.parametrize(("column", "build", "bound", "name_ends"), [
    ("", "0.13.3+c7da512a", True, "sg1e+09-s256"),     # the build's own: no suffix
    ("", "0.13.3", False, "sg1e+09-s256"),
    ("True", "0.13.3", True, "-bound"),
    ("False", "0.13.3+4570a955", False, "-unbound"),
])
def test_a_table_column_says_where_the_build_does_not(column, build, bound, name_ends):
    text = f"{HEADER},bind_cores_to_rank\n{ROW}{build},{column}\n"
    with pytest.warns(Warning):
        (run,) = read_runs_text(text, "<t>")
    assert run.bind_cores_to_rank is bound
    assert run.name.replace("+", "").endswith(name_ends.replace("+", ""))
    scenario = run.scenario("polaris-a100", profile=load_profile("polaris-a100"))
    assert scenario["runtime"].get("bind_cores_to_rank", False) is bound


def test_a_bad_binding_cell_names_row_and_column():
    text = f"{HEADER},bind_cores_to_rank\n{ROW}0.13.3,maybe\n"
    with pytest.warns(Warning), pytest.raises(Exception, match=r"row 1\.bind_cores_to_rank"):
        read_runs_text(text, "<t>")


def test_a_cost_factor_is_never_stepped_or_fitted_below_one():
    from zerosim.sensitivity import steps
    from zerosim.validation.calibrate import base_trees, parse_parameter

    assert steps("hardware.host.remote_access_cost", 1.0, 0.1) == (None, pytest.approx(1.1), "")
    assert steps("hardware.host.remote_access_cost", 1.9, 0.1) == (
        pytest.approx(1.71), pytest.approx(2.09), "")
    assert steps("hardware.host.remote_access_cost", 1.05, 0.1) == (1.0, pytest.approx(1.155), "")
    from pathlib import Path

    from zerosim.validation.calibrate import Measurement

    scenario = Path("scenarios/calibration/polaris/polaris-5.95b-dp4-mb1-ga1-sg1e08.yaml")
    bases = base_trees([Measurement(scenario, (), "update", 1.0, 2)])
    parameter = parse_parameter("polaris-a100:host.remote_access_cost", bases)
    assert (parameter.low, parameter.high) == (1.0, pytest.approx(19.0))


def test_check_prints_where_each_ranks_pages_sit():
    """`zerosim check` names each rank's GPU domain, the domain of the buffers its host thread
    allocates and its pool's domains: the study's node (round robin) and a DGX A100 rank bound
    to four of NPS4's domains, its own buffers on the first."""
    from click.testing import CliRunner

    from zerosim.cli import main
    from zerosim.shipped import CHECKOUT

    study = CliRunner().invoke(main, ["check", str(CHECKOUT / "scenarios" / "llama13b_dp4.yaml")])
    assert "rank 1: GPU on 0, own buffers on 1, pool on every domain" in " ".join(
        study.output.split())
    dgx = CliRunner().invoke(main, [
        "check", str(CHECKOUT / "scenarios" / "dgx_a100_offload" / "qwen2.5-3b.yaml"),
        "--set", "runtime.bind_cores_to_rank=true"])
    assert "rank 1: GPU on 3, own buffers on 4, pool on 4, 5, 6, 7" in " ".join(
        dgx.output.split())


def test_without_a_core_list_the_parts_follow_the_cores_numbering():
    """`--bind_cores_to_rank` alone cuts the physical cores in their numbering: on a DGX A100
    two ranks get a socket each, whatever domain their GPUs hang off."""
    dgx = load_profile("dgx-a100")
    quarter = 0.25
    assert [bound_domains(dgx, r, 2, "numbered") for r in range(2)] == [
        tuple((d, quarter) for d in range(4)), tuple((d, quarter) for d in range(4, 8))]
    assert [bound_domains(POLARIS, r, 4, "numbered") for r in range(4)] == [
        ((d, 1.0),) for d in range(4)]
    assert [pl.home for pl in place_ranks(dgx, 2, bound=True, core_order="numbered")] == [
        ((0, 1.0),), ((4, 1.0),)]
