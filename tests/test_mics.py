"""MiCS (`mics_shard_size`, `mics_hierarchical_params_gather`): ZeRO-3 partitioned over shard
groups of consecutive ranks, the gradient partitions all-reduced across the groups at the
boundary, as DeepSpeed resolves, refuses and runs it."""

from __future__ import annotations

import json
import warnings

import pytest

from zerosim.engine.plan import plan_of, process_groups
from zerosim.errors import ScenarioError, UnsupportedConfigError
from zerosim.scenario.support import MicsWarning
from zerosim.vocabulary import OpKind, Phase

NO_OFFLOAD = {"offload_optimizer": {"device": "none"}}


def _patch(version: str = "0.19.5", *, ga: int = 2, nodes: int = 2, **zero) -> dict:
    """`nodes` toy nodes of two GPUs, every GPU a rank; no prefetch and nothing kept for the
    backward (each module gathered on its own, at its own hook)."""
    zero = {"stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0, **zero}
    return {"runtime": {"deepspeed_version": version}, "hardware": {"nodes": nodes},
            "data_parallel": 2 * nodes,
            "deepspeed": {"gradient_accumulation_steps": ga, "zero_optimization": zero}}


def _run(toy, patch, *, fold_nodes: bool = True):
    return toy.run_ok(patch, gpus=2, fold_nodes=fold_nodes)


def _scenario(toy, patch):
    """The scenario of `patch` on toy nodes of two GPUs, MiCS's `MiCS_Init` warning quiet."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MicsWarning)
        return toy.scenario(patch, gpus=2)


def _rank0(result, kind: OpKind):
    spans = result.spans
    return spans[(spans["rank"] == 0) & (spans.op_kind == kind)]


def test_groups_as_create_mics_comm_groups_builds_them():
    """16 ranks in shard groups of 8 on nodes of 4: rank 9 partitions over ranks 8-15, holds
    replicas with rank 1, and gathers hierarchically across (9, 13) and within (8-11)."""
    world = tuple(range(16))
    groups = process_groups(world, 8, 4, hierarchical=True)
    assert groups.partition[9] == tuple(range(8, 16))
    assert groups.replicas[9] == (1, 9)
    assert groups.intra_node[9] == (8, 9, 10, 11)
    assert groups.inter_node[9] == (9, 13) and groups.inter_node[14] == (10, 14)
    assert groups.partition[9] is groups.partition[15]
    plain = process_groups(world, 16, 4, hierarchical=False)
    assert plain.partition[3] is world and plain.replicas[3] == (3,)
    assert plain.intra_node == () and plain.inter_node == ()


def test_the_keys_resolve_and_write_back(toy):
    ds = _scenario(toy, _patch(mics_shard_size=2, **NO_OFFLOAD)).deepspeed
    assert ds.mics.shard_size == 2 and not ds.mics.hierarchical
    assert ds.mics.partition_ranks(3, 4) == 2 and ds.mics.replicas(3, 4) == 2
    assert ds.to_dict()["zero_optimization"]["mics_shard_size"] == 2
    plain = toy.scenario(_patch(), gpus=2).deepspeed
    assert plain.mics.partition_ranks(3, 4) == 4
    assert "mics_shard_size" not in plain.to_dict()["zero_optimization"]


def test_the_plan_partitions_over_the_shard_group(toy):
    """Every tensor of the toy model has an even element count: over a shard group of two
    each rank holds half the model's 115,008 elements, over every rank a quarter."""
    mics = plan_of(_scenario(toy, _patch(mics_shard_size=2, **NO_OFFLOAD)))
    plain = plan_of(toy.scenario(_patch(**NO_OFFLOAD), gpus=2))
    assert mics.ranks == 2 and mics.partition_numel == 115_008 // 2
    assert plain.ranks == 4 and plain.partition_numel == 115_008 // 4


@pytest.mark.parametrize(("version", "zero", "match"), [
    ("0.9.1", {"mics_shard_size": 2}, r"absent before DeepSpeed 0\.9\.2"),
    ("0.9.1", {"mics_hierarchical_params_gather": True}, r"absent before DeepSpeed 0\.9\.2"),
    ("0.19.5", {"mics_shard_size": 3, **NO_OFFLOAD}, "not dividable by dp_shard_size"),
])
def test_what_deepspeed_refuses_on_reading_is_an_error(toy, version, zero, match):
    with pytest.raises(ScenarioError, match=match):
        toy.scenario(_patch(version, **zero), gpus=2)


@pytest.mark.parametrize(("value", "match"), [
    (True, r"not true/false"), (-5, r"in \[-1, 1000000\]"), (2e6, r"in \[-1, 1000000\]"),
    (2.5, "a whole number"), ([2], "an integer")])
def test_an_implausible_shard_size_is_an_error(toy, value, match):
    with pytest.raises(ScenarioError, match=match):
        toy.scenario(_patch(mics_shard_size=value, **NO_OFFLOAD), gpus=2)


@pytest.mark.parametrize(("zero", "key", "match"), [
    ({"mics_shard_size": 2}, "offload_optimizer.device",
     "Local sharding has no support for CPU offloading"),
    ({"mics_shard_size": 4, "offload_param": {"device": "cpu"}}, "offload_param.device",
     "NCCL rejects"),
    ({"mics_shard_size": 2, "mics_hierarchical_params_gather": True, **NO_OFFLOAD},
     "mics_hierarchical_params_gather", "no need for hierarchy allgather"),
    ({"mics_shard_size": 2, "zero_hpz_partition_size": 2, **NO_OFFLOAD},
     "zero_hpz_partition_size", "off with mics_shard_size"),
    ({"mics_shard_size": 2, "zero_quantized_gradients": True, **NO_OFFLOAD},
     "zero_quantized_gradients", "off with mics_shard_size"),
])
def test_what_deepspeed_fails_on_or_zerosim_does_not_replay_is_refused(toy, zero, key, match):
    with pytest.raises(UnsupportedConfigError, match=match) as refused:
        toy.scenario(_patch(**zero), gpus=2)
    assert refused.value.key_path == f"deepspeed.zero_optimization.{key}"


def test_a_shard_group_of_every_rank_keeps_an_offloaded_optimizer(toy):
    """One shard group: nothing to all-reduce across replicas, so the optimizer may stay in
    host memory (ZeRO-3's partitions, MiCS's all-gather)."""
    scenario = _scenario(toy, _patch(mics_shard_size=4))
    assert scenario.deepspeed.mics.replicas(3, 4) == 1


def test_a_hierarchy_that_does_not_split_over_its_nodes_is_refused(toy):
    """Nine ranks on nodes of four: a shard group of nine spans two nodes' worth (9 // 4),
    and nine does not split in two (`create_mics_comm_groups` asserts it)."""
    patch = _patch(mics_shard_size=9, mics_hierarchical_params_gather=True, nodes=3,
                   **NO_OFFLOAD)
    patch["data_parallel"] = 9
    with pytest.raises(UnsupportedConfigError, match="does not split evenly over the 2"):
        toy.scenario(patch, gpus=4)


@pytest.mark.parametrize(("zero", "said"), [
    ({"stage": 2, "mics_shard_size": 2}, "does nothing at ZeRO-2"),
    ({"mics_hierarchical_params_gather": True}, "does nothing without a mics_shard_size"),
])
def test_mics_that_does_nothing_is_a_warning(toy, zero, said):
    with pytest.warns(MicsWarning, match=said):
        toy.scenario(_patch(**zero), gpus=2)


def test_mics_says_the_model_must_be_built_under_mics_init(toy):
    """Both shipped stacks build the model under `deepspeed.zero.Init`, on which DeepSpeed's
    MiCS optimizer asserts: a warning says the run is replayed as built under `MiCS_Init`."""
    with pytest.warns(MicsWarning, match=r"replays the run as built under "
                                         r"deepspeed\.zero\.MiCS_Init"):
        toy.scenario(_patch(mics_shard_size=2, **NO_OFFLOAD), gpus=2)


def test_mics_reduces_on_the_nccl_stream_it_gathers_on(toy):
    """The toy stack gathers and reduces on separate process groups (transformers' way); with
    MiCS both run on the shard group, one NCCL stream, but for the hierarchical gather's
    all-gathers, on its groups across and within the nodes."""
    from types import SimpleNamespace

    from zerosim.engine.compose import _one_nccl_stream

    def shared(zero) -> bool:
        scenario = _scenario(toy, _patch(**zero, **NO_OFFLOAD))
        return _one_nccl_stream(SimpleNamespace(ds=scenario.deepspeed,
                                                ctx=SimpleNamespace(scenario=scenario)))

    assert not shared({})
    assert shared({"mics_shard_size": 2})
    assert not shared({"mics_shard_size": 4, "mics_hierarchical_params_gather": True})


def test_a_shard_group_gathers_over_nvlink(toy):
    """Two toy nodes of two GPUs (NVLink 100 GB/s a GPU, 10 GB/s of NIC a node, no latency).
    lm_head, 32,768 B gathered: over every rank each GPU sends 3/4 of it, half of that out of
    its node, both GPUs' halves through the node's NIC: 24,576 B at 10 GB/s; over its shard
    group of the node's two GPUs, 16,384 B over NVLink at 100 GB/s."""
    def lm_head_gathers(zero):
        gathers = _rank0(_run(toy, _patch(**zero, **NO_OFFLOAD)), OpKind.ALL_GATHER)
        forward = gathers[(gathers.phase == Phase.FORWARD) & (gathers.op == "all-gather lm_head")]
        return list(forward.end_s - forward.start_s)

    assert lm_head_gathers({}) == pytest.approx([24_576 / 10e9] * 2)
    assert lm_head_gathers({"mics_shard_size": 2}) == pytest.approx([16_384 / 100e9] * 2)


def test_the_replicas_all_reduce_the_gradient_partitions_at_the_boundary(toy):
    """GA 2, one bucket for the whole model: at the boundary only, after the partitions are
    moved, the rank's half of the model's gradients (57,504 fp16 elements, 115,008 B) divided
    by the two replicas (a read and a write at 1,000 GB/s: 230.016 ns) and all-reduced with
    its replica on the other node: the ring's two halves, 115,008 B, through the node's NIC,
    which carries both GPUs' replica groups, 5 GB/s each: 23.0016 us."""
    result = _run(toy, _patch(mics_shard_size=2, **NO_OFFLOAD))
    spans = _rank0(result, OpKind.ALL_REDUCE)
    across = spans[spans.op.str.endswith("over 2 replicas")]
    assert list(across.micro_batch) == [1]
    assert list(across.phase) == [Phase.BACKWARD]
    assert list(across.bytes) == [115_008]
    assert list(across.end_s - across.start_s) == pytest.approx([230.016e-9 + 115_008 / 5e9])
    partitions = _rank0(result, OpKind.PARTITION_GRADS)
    assert across.start_s.iloc[0] >= partitions.end_s.max()


def test_the_hierarchical_gather_crosses_the_nodes_once(toy):
    """A shard group of all four ranks, gathered hierarchically: lm_head's quarter (8,192 B)
    all-gathered with the rank's peer on the other node (8,192 B out through the node's NIC,
    which carries both GPUs' groups: 5 GB/s each, 1.6384 us), the 16,384 B it makes cloned
    and copied into place (65.536 ns), then all-gathered within the node (16,384 B over
    NVLink, 163.84 ns)."""
    result = _run(toy, _patch(mics_shard_size=4, mics_hierarchical_params_gather=True,
                              **NO_OFFLOAD))
    gathers = _rank0(result, OpKind.ALL_GATHER)
    forward = gathers[(gathers.phase == Phase.FORWARD) & (gathers.op == "all-gather lm_head")]
    assert list(forward.end_s - forward.start_s) == pytest.approx(
        [8_192 / 5e9 + 65.536e-9 + 16_384 / 100e9] * 2)


@pytest.mark.parametrize("zero", [{"mics_shard_size": 2},
                                  {"mics_shard_size": 4, "mics_hierarchical_params_gather": True},
                                  {"mics_shard_size": 1}])
def test_mics_replays_alike_with_every_rank_simulated(toy, zero):
    """Two toy nodes of two GPUs: simulating node 0 alone and every rank give the same
    timeline and memory."""
    patch = _patch(**zero, **NO_OFFLOAD)
    folded, every = _run(toy, patch), _run(toy, patch, fold_nodes=False)
    assert every.summary["iteration_s"] == folded.summary["iteration_s"]
    assert every.summary["phases_s"] == folded.summary["phases_s"]
    assert every.summary["peak_hbm_GiB"] == folded.summary["peak_hbm_GiB"]


def test_check_says_mics(toy, tmp_path):
    from zerosim.report import _mode

    patch = _patch(mics_shard_size=2, **NO_OFFLOAD)
    assert _mode(_scenario(toy, patch)).endswith(
        "MiCS (partitioned over groups of 2 ranks, gradients all-reduced across the 2 groups "
        "at the boundary)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MicsWarning)
        printed = toy.check_json(patch, tmp_path, gpus=2)
    assert printed["mics"] == {"shard_size": 2, "replicas": 2, "hierarchical_gather": False}


def test_estimate_says_what_deepspeeds_estimator_does_not_know(toy, tmp_path):
    """DeepSpeed's estimator partitions over every GPU it is given: for a MiCS scenario
    `estimate` says which cluster gives a rank's share, and says nothing once given it."""
    import yaml
    from click.testing import CliRunner

    from zerosim.cli import main

    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(toy.tree(_patch(mics_shard_size=2, **NO_OFFLOAD), gpus=2)))
    said = CliRunner().invoke(main, ["estimate", "--scenario", str(path)])
    assert said.exit_code == 0, said.output
    assert said.stdout.splitlines()[-1] == (
        "MiCS: each rank partitions its model states over its shard group of 2 ranks, not the "
        "4 above (DeepSpeed's estimator knows nothing of MiCS): its GPU holds what the "
        "estimator gives for 2 GPUs (--gpus-per-node 2 --nodes 1)")
    given = CliRunner().invoke(main, ["estimate", "--scenario", str(path), "--nodes", "1",
                                      "--json"])
    assert given.exit_code == 0, given.output
    assert "note" not in json.loads(given.stdout)
