"""Ulysses sequence parallelism (`sequence_parallel_size`, DeepSpeed's UlyssesSPAttentionHF,
0.17.0+): each rank of a group holds a slice of every sequence, and all-to-alls around each
attention hand it every token of its share of the heads, as DeepSpeed resolves, refuses and
runs it."""

from __future__ import annotations

import warnings

import pytest

from zerosim.engine.plan import plan_of, process_groups, workload_of
from zerosim.engine.simulate import run_engine
from zerosim.errors import ScenarioError, UnsupportedConfigError
from zerosim.models.breakdown import build_modules, exchanged_kv_width, ulysses_exchanges
from zerosim.results import build_result
from zerosim.scenario.deepspeed import SequenceParallelWarning
from zerosim.vocabulary import Collective, Phase

CORE = "layers.0.attn.core"


def _patch(size: int = 2, *, gpus: int = 2, stage: int = 2, sequence: int = 64,
           **deepspeed) -> dict:
    """Toy nodes of `gpus` GPUs, every GPU a rank, flash attention, DeepSpeed 0.19.5, ZeRO
    `stage` (2: nothing but Ulysses communicates going forward), the toy stack running
    DeepSpeed's UlyssesSPAttentionHF."""
    return {"runtime": {"deepspeed_version": "0.19.5", "framework": {"modules": {
                "sequence_parallel": {"value": "ulysses_hf", "source": "test"}}}},
            "attention": "flash",
            "sequence_length": sequence, "data_parallel": gpus,
            "deepspeed": {"sequence_parallel_size": size,
                          "zero_optimization": {"stage": stage}, **deepspeed}}


def _ulysses(result, phase: Phase, module: str = CORE):
    spans = result.spans
    return spans[(spans["rank"] == 0) & (spans.phase == phase)
                 & spans.op.str.startswith("ulysses") & spans.op.str.endswith(module)]


def test_the_groups_are_consecutive_ranks_sharing_one_tuple():
    world = tuple(range(8))
    groups = process_groups(world, 8, 4, hierarchical=False, sequence=4)
    assert groups.sequence[5] == (4, 5, 6, 7) and groups.sequence[5] is groups.sequence[7]
    assert groups.partition[5] is world
    assert process_groups(world, 8, 4, hierarchical=False).sequence == ()


def test_batch_sizes_count_the_groups_and_gradients_reduce_in_fp32(toy):
    """Four ranks in groups of two train two sequences a micro-batch: DeepSpeed's batch
    arithmetic divides the world by the size; ZeRO reduces in seq_parallel_communication_
    data_type, fp32 unless given."""
    ds = toy.scenario(_patch(2, gpus=4), gpus=4).deepspeed
    assert ds.sequence_parallel_size == 2 and ds.sequence_groups(4) == 2
    assert ds.train_batch_size == 2 and ds.communication_dtype == "fp32"
    assert toy.scenario(_patch(2, gpus=4), gpus=4).tokens_per_iteration == 2 * 64
    written = ds.to_dict()
    assert written["sequence_parallel_size"] == 2
    assert written["seq_parallel_communication_data_type"] == "fp32"
    fp16 = toy.scenario(_patch(2, gpus=4, seq_parallel_communication_data_type="fp16"),
                        gpus=4).deepspeed
    assert fp16.communication_dtype == "fp16"
    plain = toy.scenario(_patch(1, gpus=4), gpus=4).deepspeed
    assert plain.train_batch_size == 4 and plain.communication_dtype == "fp16"
    assert "sequence_parallel_size" not in plain.to_dict()
    with pytest.raises(ScenarioError, match=r"train_batch_size.*1 x 1 x 2 = 2"):
        toy.scenario(_patch(2, gpus=4, train_batch_size=4), gpus=4)


def test_communication_data_type_is_overridden_with_a_warning(toy):
    with pytest.warns(SequenceParallelWarning, match="communication_data_type fp16 does "
                      r"nothing with sequence_parallel_size 2.*\(fp32, its default\)"):
        ds = toy.scenario(_patch(2, communication_data_type="fp16"), gpus=2).deepspeed
    assert ds.communication_dtype == "fp32"


@pytest.mark.parametrize(("patch", "model", "match"), [
    ({"runtime": {"deepspeed_version": "0.16.9"}}, {}, r"1 before DeepSpeed 0\.17\.0"),
    ({"attention": "eager"}, {}, "eager attn_implementation isn't currently supported"),
    ({"data_parallel": 8, "deepspeed": {"sequence_parallel_size": 8}}, {},
     r"a divisor of the 4 attention heads"),
    ({"data_parallel": 4, "deepspeed": {"sequence_parallel_size": 4}},
     {"hidden_size": 96, "num_attention_heads": 12, "num_key_value_heads": 6},
     "a divisor or a multiple of the 6 key-value heads"),
    ({"sequence_length": 66, "data_parallel": 4, "deepspeed": {"sequence_parallel_size": 4}},
     {}, "a divisor of sequence_length 66"),
    ({"deepspeed": {"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2}}}, {},
     "off with sequence_parallel_size 2"),
    ({"deepspeed": {"zero_optimization": {"stage": 3, "mics_shard_size": 2,
                                          "offload_optimizer": {"device": "none"}}}}, {},
     "off with sequence_parallel_size 2"),
])
def test_what_deepspeed_or_zerosim_refuses(toy, patch, model, match):
    import zerosim
    from zerosim.scenario.loader import deep_merge

    tree = toy.tree(_patch(2, gpus=8), gpus=8)
    tree["model"].update(model)
    with warnings.catch_warnings(), pytest.raises(UnsupportedConfigError, match=match):
        warnings.simplefilter("ignore")
        zerosim.scenario_from_dict(deep_merge(tree, patch), source="<toy>")


def test_the_ranks_must_make_whole_groups(toy):
    with pytest.raises(ScenarioError, match=r"sequence_parallel_size: expected a divisor of "
                       r"the 4 ranks"):
        toy.scenario(_patch(3, gpus=4), gpus=4)


def test_a_stack_must_say_how_it_runs_ulysses(toy):
    patch = _patch(2)
    del patch["runtime"]["framework"]
    with pytest.raises(UnsupportedConfigError, match=r"modules\.sequence_parallel"):
        toy.scenario(patch, gpus=2)


def test_a_rank_runs_its_slice_and_its_heads_over_every_token(toy):
    """Every module but the attention core is a plain run's over half the sequence; the core
    keeps what that one keeps (its heads' share of every token is as much) but attends over
    twice the keys, and it carries the exchanges."""
    ulysses = toy.scenario(_patch(2, sequence=64), gpus=2)
    half = toy.scenario(_patch(1, sequence=32), gpus=2)
    recipe = ulysses.stack.recipe
    split = build_modules(ulysses.model, workload_of(ulysses), recipe)
    plain = build_modules(half.model, workload_of(half), recipe)
    assert workload_of(ulysses).tokens == 32
    for a, b in zip(split, plain, strict=True):
        if a.kind == "attention":
            assert a.saved_bytes == b.saved_bytes and a.fwd_flops == 2 * b.fwd_flops
            assert [e.tensor for e in a.exchanges] == ["position_ids", "q", "k", "v", "output"]
        else:
            assert a == b


def test_what_each_exchange_carries(toy):
    """Toy model, fp16, 64 tokens over 4 ranks: 16 a rank. Q and the output 16 x 64 x 2 B;
    K and V with 2 heads of 16 replicated to the 4 ranks' one each, 16 x 4 x 16 x 2 B; the
    position ids every token's int64."""
    from zerosim.models.breakdown import Recipe, Workload
    from zerosim.models.hf import spec_from_hf_fields

    hf = Recipe(sequence_parallel="ulysses_hf")
    spec = spec_from_hf_fields({**toy.model, "num_key_value_heads": 2}, name="toy")
    w = Workload(sequence_length=64, attention="flash", sequence_parallel=4)
    assert exchanged_kv_width(spec, w, hf) == 64 and spec.kv_hidden_size == 32
    exchanges = ulysses_exchanges(spec, w, hf)
    assert [(e.kind, e.nbytes, e.after, e.backward) for e in exchanges] == [
        (Collective.ALL_GATHER, 512, False, False), (Collective.ALL_TO_ALL, 2048, False, True),
        (Collective.ALL_TO_ALL, 2048, False, True), (Collective.ALL_TO_ALL, 2048, False, True),
        (Collective.ALL_TO_ALL, 2048, True, True)]
    assert ulysses_exchanges(spec, Workload(sequence_length=64), hf) == ()


def test_the_exchanges_run_in_line_on_the_compute_stream(toy):
    """Two ranks, 32 tokens each: the position ids' all-gather sends half of 512 B over the
    100 GB/s NVLink port (2.56 ns), each all-to-all half of 4,096 B (20.48 ns); Q, K and V's
    right before the core's kernels, the output's right after; the backward runs the output
    gradient's first, then V's, K's and Q's."""
    result = toy.run_ok(_patch(2), gpus=2)
    forward = _ulysses(result, Phase.FORWARD)
    assert list(forward.op) == [f"ulysses {kind} {CORE}" for kind in (
        "all_gather position_ids", "all_to_all q", "all_to_all k", "all_to_all v",
        "all_to_all output")]
    assert set(forward.stream) == {"compute"}
    assert list(forward.op_kind) == ["all_gather"] + ["all_to_all"] * 4
    assert list(forward.end_s - forward.start_s) == pytest.approx(
        [2.56e-9] + [20.48e-9] * 4, rel=1e-9)
    starts, ends = list(forward.start_s), list(forward.end_s)
    assert starts[1:4] == pytest.approx(ends[:3], abs=1e-15)
    spans = result.spans
    core = spans[(spans["rank"] == 0) & (spans.op == f"forward {CORE}")].iloc[0]
    assert core.start_s == pytest.approx(ends[3], abs=1e-15)
    assert starts[4] == pytest.approx(core.end_s, abs=1e-15)
    backward = _ulysses(result, Phase.BACKWARD)
    assert [op.split()[2] for op in backward.op] == ["output", "v", "k", "q"]
    assert list(backward.end_s - backward.start_s) == pytest.approx([20.48e-9] * 4, rel=1e-9)


def test_the_host_pays_each_call(toy):
    """With the stack's `plain_collective_us` at 30 us, each layer's forward has the host
    issue five calls more (150 us), its backward four (120 us), two layers each; on a GPU
    a thousand times the toy's, the phases are the host's path."""
    def forward_and_backward(launch_us: float) -> tuple[float, float]:
        patch = _patch(2)
        patch["runtime"]["framework"]["host"] = {"plain_collective_us": {
            "value": launch_us, "basis": "assumed", "source": "test"}}
        patch["hardware"] = {"gpu": {"peak_16bit_TFLOPS": {"value": 1000, "source": "test"},
                                     "hbm_GBps": {"value": 1e6, "source": "test"}}}
        result = toy.run_ok(patch, gpus=2)
        phases = result.phases[result.phases["rank"] == 0]
        duration = phases.end_s - phases.start_s
        return (float(duration[phases.phase == Phase.FORWARD].sum()),
                float(duration[phases.phase == Phase.BACKWARD].sum()))

    (f0, b0), (f1, b1) = forward_and_backward(0), forward_and_backward(30)
    gpu = 1e-7  # what the kernels take on that GPU, hidden once the host trails
    assert f1 - f0 == pytest.approx(2 * 5 * 30e-6, abs=gpu)
    assert b1 - b0 == pytest.approx(2 * 4 * 30e-6, abs=gpu)


def test_activations_shrink_with_the_group(toy):
    """256 tokens on four ranks: each rank's activations at their peak, 1,389,568 B, halve
    with each doubling of the group (the toy's flash attention keeps nothing per score)."""
    def peak(size: int) -> float:
        memory = toy.run_ok(_patch(size, gpus=4, sequence=256), gpus=4).memory
        gpu0 = memory[(memory.device == "gpu0") & (memory.category == "activations")]
        return float(gpu0.bytes.max())

    assert [peak(size) for size in (1, 2, 4)] == [1_389_568, 694_784, 347_392]


@pytest.mark.parametrize(("gpus", "nodes", "stage"), [(4, 1, 3), (2, 2, 3), (2, 2, 2)])
def test_folded_runs_are_the_full_simulation(toy, gpus, nodes, stage):
    """Groups of two on a node of four (mirror ranks folded), and a group of four across
    two nodes of two (node 0 standing for node 1): every rank simulated gives the same."""
    patch = _patch(2 if nodes == 1 else 4, gpus=gpus * nodes, stage=stage)
    patch["hardware"] = {"nodes": nodes}
    scenario = toy.scenario(patch, gpus=gpus)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        folded, full = run_engine(scenario), run_engine(scenario, fold=False)
    assert build_result(folded).summary == build_result(full).summary
    assert folded.status == "ok"


def test_check_says_so(toy, tmp_path):
    """ZeRO partitions over every rank, whatever the groups; `check` names them."""
    from zerosim.report import _mode

    patch = _patch(2, gpus=4)
    scenario = toy.scenario(patch, gpus=4)
    assert plan_of(scenario).ranks == 4
    assert _mode(scenario).endswith(
        "Ulysses sequence parallelism (groups of 2 ranks, each holding 1/2 of every sequence; "
        "gradients reduced in fp32)")
    assert toy.check_json(patch, tmp_path, gpus=4)["sequence_parallel"] == {
        "size": 2, "groups": 2, "tokens_per_rank": 32, "communication_dtype": "fp32"}


def test_the_size_is_a_whole_number(toy):
    """2.0 is 2 (JSON's numbers); a text is refused, as DeepSpeed's batch arithmetic would
    fail dividing the world size by it, and it is read before the section is validated."""
    assert toy.scenario(_patch(2.0, gpus=4), gpus=4).deepspeed.train_batch_size == 2
    with pytest.raises(ScenarioError, match="sequence_parallel_size: expected an integer, "
                       "got '2'"):
        toy.scenario(_patch("2", gpus=4), gpus=4)


def _megatron(size: int = 2, *, version: str = "0.13.3", gpus: int = 2, **patch) -> dict:
    """The toy stack running its attention in DeepSpeed's DistributedAttention, as
    Megatron-DeepSpeed does, eager, ZeRO-3."""
    tree = _patch(size, gpus=gpus, stage=3)
    tree["runtime"] = {"deepspeed_version": version, "framework": {"modules": {
        "sequence_parallel": {"value": "distributed_attention", "source": "test"}}}}
    return {**tree, "attention": "eager", **patch}


def test_distributed_attention_exchanges_q_k_v_and_the_output(toy):
    """DistributedAttention gathers no position ids: Q, K and V, the attention, the output;
    the gradients' exchanges in reverse. 32 tokens a rank of 64 wide, fp16: half of 4,096 B
    over the 100 GB/s NVLink port each (20.48 ns)."""
    result = toy.run_ok(_megatron(2), gpus=2)
    forward = _ulysses(result, Phase.FORWARD)
    assert [op.split()[2] for op in forward.op] == ["q", "k", "v", "output"]
    assert list(forward.end_s - forward.start_s) == pytest.approx([20.48e-9] * 4, rel=1e-9)
    backward = _ulysses(result, Phase.BACKWARD)
    assert [op.split()[2] for op in backward.op] == ["output", "v", "k", "q"]
    assert toy.scenario(_megatron(2), gpus=2).deepspeed.communication_dtype == "fp32"


@pytest.mark.parametrize(("version", "attention", "match"), [
    ("0.10.1", "eager", r"1 before DeepSpeed 0\.10\.2"),
    ("0.12.3", "eager", r"1 before DeepSpeed 0\.12\.4 \(zerosim replays"),
    ("0.14.5", "eager", r"0\.14\.5 or later"),
    ("0.13.3", "flash", "gathers along the batch"),
])
def test_distributed_attention_where_it_is_not_replayed(toy, version, attention, match):
    with warnings.catch_warnings(), pytest.raises(UnsupportedConfigError, match=match):
        warnings.simplefilter("ignore")
        toy.scenario(_megatron(2, version=version, attention=attention), gpus=2)


def test_megatron_deepspeed_runs_ulysses_on_a_polaris_node():
    """The 5.9B Polaris model at DP=4, micro-batch 4, in one group of four: each rank takes a
    quarter of every sequence where it took whole sequences of its own, so its activations
    and its forward shrink (the group trains four sequences a step, not sixteen)."""
    from pathlib import Path

    from zerosim.api import simulate_summary

    path = (Path(__file__).resolve().parents[1] / "scenarios" / "calibration" / "polaris"
            / "polaris-5.90b-dp4-mb4-ga1-sg1e08.yaml")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = simulate_summary(path, {"deepspeed.sequence_parallel_size": 1})
        ulysses = simulate_summary(path, {"deepspeed.sequence_parallel_size": 4})
    assert plain["status"] == ulysses["status"] == "ok"
    assert ulysses["peak_hbm_GiB"] < plain["peak_hbm_GiB"]
    assert ulysses["phases_s"]["forward"] < plain["phases_s"]["forward"]
