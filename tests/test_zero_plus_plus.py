"""ZeRO++'s parameter side: hpZ's secondary partitions (`zero_hpz_partition_size`) and qwZ's
int8 all-gathers (`zero_quantized_weights`), as each DeepSpeed release resolves and runs them."""

from __future__ import annotations

import math
import warnings

import pytest

from zerosim.engine.params import quantization_groups
from zerosim.errors import ScenarioError, UnsupportedConfigError
from zerosim.scenario.support import ZeroPlusPlusWarning
from zerosim.vocabulary import Category, DeviceKind, OpKind, Phase, Stream, device_name

Z = "deepspeed.zero_optimization"


def _patch(version: str = "0.19.5", *, ga: int = 2, **zero) -> dict:
    """GA 2; no prefetch and nothing kept for the backward (each module gathered on its own,
    at its own hook, forward and backward)."""
    zero = {"stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0, **zero}
    return {"runtime": {"deepspeed_version": version},
            "deepspeed": {"gradient_accumulation_steps": ga, "zero_optimization": zero}}


def _run(toy, patch, gpus=4):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = toy.run(patch, gpus=gpus)
    assert result.summary["status"] == "ok"
    return result


def _deepspeed_groups(numel: int) -> int:
    """partition_parameters.py `CUDAQuantizer.quantize`'s group count, as its code reads."""
    groups = math.ceil(numel / 8000)
    while groups < numel:
        if numel % (8 * groups) == 0:
            break
        groups += 1
    while numel % (8 * groups * 2) == 0 and numel / groups > 8000:
        groups *= 2
    return groups


@pytest.mark.parametrize("numel", [5120, 1280, 6_553_600, 13824 * 5120 // 4, 8 * 1_234_567,
                                   8 * 97 * 101 * 7, 16 * 1_000_003, 40_961_280])
def test_quantization_groups_as_the_quantizer_cuts_them(numel):
    assert quantization_groups(numel) == _deepspeed_groups(numel)


def test_quantization_groups_of_an_odd_size_keep_the_target():
    """A size that is not a multiple of 8 fails DeepSpeed's assertion; zerosim keeps
    ceil(numel / 8000) groups for its scales."""
    assert quantization_groups(8001) == 2
    assert quantization_groups(6_553_600) == 1024  # 6,400 elements a group


def test_the_keys_resolve_and_write_back(toy):
    ds = toy.scenario(_patch(zero_hpz_partition_size=2, zero_quantized_weights=True),
                      gpus=4).deepspeed
    assert ds.zero_plus_plus.hpz_partition_size == 2 and ds.zero_plus_plus.quantized_weights
    zero = ds.to_dict()["zero_optimization"]
    assert zero["zero_hpz_partition_size"] == 2 and zero["zero_quantized_weights"] is True
    plain = toy.scenario(_patch(), gpus=4).deepspeed.to_dict()["zero_optimization"]
    assert "zero_hpz_partition_size" not in plain and "zero_quantized_weights" not in plain


@pytest.mark.parametrize(("version", "zero", "gpus", "match"), [
    ("0.9.5", {"zero_hpz_partition_size": 2}, 4, "absent before DeepSpeed 0.10.0"),
    ("0.9.5", {"zero_quantized_weights": True}, 4, "absent before DeepSpeed 0.10.0"),
    ("0.19.5", {"zero_hpz_partition_size": 3}, 4, "4 is not divisible by 3"),
    ("0.19.5", {"zero_hpz_partition_size": 2,
                "offload_param": {"device": "nvme", "nvme_path": "/local"}}, 4, "'nvme'"),
])
def test_what_deepspeed_refuses_is_an_error(toy, version, zero, gpus, match):
    with pytest.raises(ScenarioError, match=match):
        toy.scenario(_patch(version, **zero), gpus=gpus)


def test_a_group_larger_than_the_world_is_the_world(toy):
    """`_create_zero_param_parallel_group` takes min(size, world)."""
    ds = toy.scenario(_patch(zero_hpz_partition_size=8), gpus=4).deepspeed
    assert ds.zero_plus_plus.hpz_group(4) == 4 and ds.zero_plus_plus.hpz_group(1) == 1


def test_hpz_before_secondary_presence_decides_is_not_replayed(toy):
    """Before 0.13.2 the coordinator's forward flag picked the group; zerosim refuses."""
    with pytest.raises(UnsupportedConfigError, match=r"before DeepSpeed 0\.13\.2"):
        toy.scenario(_patch("0.13.1", zero_hpz_partition_size=2), gpus=4)
    toy.scenario(_patch("0.13.1", zero_quantized_weights=True), gpus=4)


@pytest.mark.parametrize(("stage", "gpus", "zero", "said"), [
    (2, 4, {"zero_hpz_partition_size": 2}, "does nothing at ZeRO-2"),
    (2, 4, {"zero_quantized_gradients": True}, "does nothing at ZeRO-2"),
    (3, 1, {"zero_quantized_weights": True}, "does nothing on one rank"),
])
def test_zero_plus_plus_that_does_nothing_is_a_warning(toy, stage, gpus, zero, said):
    patch = _patch(stage=stage, **zero)
    with pytest.warns(ZeroPlusPlusWarning, match=said):
        toy.scenario(patch, gpus=gpus)


def _gathers(result, rank=0):
    spans = result.spans
    return spans[(spans["rank"] == rank) & (spans.op_kind == OpKind.ALL_GATHER)]


def test_hpz_gathers_the_first_forward_over_every_rank_and_the_rest_over_the_group(toy):
    """After the step every secondary partition is gone: the first micro-batch's forward
    gathers over all four ranks and makes them as it releases; the second micro-batch's
    forward and both backwards gather over the rank's group of two."""
    gathers = _gathers(_run(toy, _patch(zero_hpz_partition_size=2)))
    grouped = gathers.op.str.endswith("over its hpZ group of 2")
    first = (gathers.phase == Phase.FORWARD) & (gathers.micro_batch == 0)
    assert first.any() and not grouped[first].any()
    assert grouped[~first].all() and len(gathers[~first]) > 0


def _secondary_bytes(toy, gpus=4, hpz=2):
    from zerosim.engine.plan import plan_of

    plan = plan_of(toy.scenario(_patch(zero_hpz_partition_size=hpz), gpus=gpus))
    return sum(2 * p.partition_numel * (gpus // hpz) for params in plan.params
               for p in params if not p.persistent)


def test_hpz_holds_a_secondary_partition_of_every_parameter_until_the_step(toy):
    """Each tensor's share over its group of two, 16-bit, on the GPU: all of them once the
    first forward has released every module (the external ones in the step's release), none
    after the step."""
    result = _run(toy, _patch(zero_hpz_partition_size=2))
    memory = result.memory
    secondary = memory[(memory.device == "gpu0")
                       & (memory.category == Category.PARAMS_SECONDARY.value)]
    assert secondary.bytes.max() == _secondary_bytes(toy)
    assert secondary.bytes.iloc[-1] == 0
    phases = result.phases
    update_end = phases[(phases["rank"] == 0) & (phases.phase == Phase.UPDATE)].end_s.iloc[0]
    assert secondary[secondary.t_s <= update_end].bytes.iloc[-1] == 0


@pytest.mark.parametrize(("version", "once"), [("0.13.3", False), ("0.14.2", False),
                                               ("0.14.3", True), ("0.19.5", True)])
def test_the_secondary_copies_by_release(toy, version, once):
    """From 0.14.3 a tensor's secondary partition is copied once between steps; 0.13.2 to
    0.14.2 copy it again at every release."""
    result = _run(toy, _patch(version, zero_hpz_partition_size=2))
    spans = result.spans
    copies = spans[(spans["rank"] == 0) & (spans.op_kind == OpKind.SECONDARY_PARTITION)]
    from zerosim.engine.plan import plan_of

    plan = plan_of(toy.scenario(_patch(version, zero_hpz_partition_size=2), gpus=4))
    tensors = sum(1 for params in plan.params for p in params if not p.persistent)
    assert (len(copies) == tensors) == once
    assert len(copies) >= tensors


def test_the_secondary_copy_is_zeroed_first_from_0_19_5(toy):
    """0.19.5's `zero_()` before the copy: three passes over the share instead of two."""
    def durations(version):
        spans = _run(toy, _patch(version, zero_hpz_partition_size=2)).spans
        copies = spans[(spans["rank"] == 0) & (spans.op_kind == OpKind.SECONDARY_PARTITION)]
        return sorted(copies.end_s - copies.start_s)

    before, after = durations("0.19.4"), durations("0.19.5")
    assert len(before) == len(after)
    for two, three in zip(before, after, strict=True):
        assert three == pytest.approx(1.5 * two)
    # lm_head, 256 x 64: a 4,096-element partition on each of 4 ranks, a share of 8,192 over
    # a group of two, 16,384 B read and written at the toy's 1e12 B/s (zeroed: written twice)
    assert max(before) == pytest.approx(2 * 16_384e-12)
    assert max(after) == pytest.approx(3 * 16_384e-12)


def test_hpz_with_params_in_host_memory_keeps_the_secondaries_there(toy):
    """`offload_param: cpu`: the secondary partitions are pinned host blocks (held for the
    run, as PyTorch's host cache keeps them) and each share goes there by a D2H."""
    patch = _patch(zero_hpz_partition_size=2, offload_param={"device": "cpu",
                                                             "pin_memory": True})
    result = _run(toy, patch)
    memory = result.memory
    host = memory[memory.category.str.startswith(Category.PARAMS_SECONDARY.value)]
    assert not host.empty and set(host.device) == {device_name(DeviceKind.HOST, 0)}
    assert not (memory.category == Category.PARAMS_SECONDARY.value).any()
    spans = result.spans
    d2h = spans[(spans.op_kind == OpKind.SECONDARY_PARTITION) & (spans["rank"] == 0)
                & (spans.stream == Stream.PCIE_D2H)]
    assert len(d2h) > 0 and d2h.bytes.sum() > 0


def test_qwz_gathers_int8_with_fp32_scales(toy):
    """Each all-gather call moves one byte an element and a fp32 scale per quantization group
    of every rank's share, quantized before and dequantized at the first wait on DeepSpeed's
    all-gather stream."""
    plain = _gathers(_run(toy, _patch()))
    quantized = _run(toy, _patch(zero_quantized_weights=True))
    gathers = _gathers(quantized)
    assert list(gathers.op) == list(plain.op)
    for sixteen_bit, int8 in zip(plain.bytes, gathers.bytes, strict=True):
        numel = sixteen_bit / 2
        assert int8 == numel + 4 * quantization_groups(int(numel // 4)) * 4
    # lm_head, 16,384 elements: 4,096 a rank, one group each, 4 B of scale from each of 4
    assert gathers[gathers.op == "all-gather lm_head"].bytes.tolist() == [16_384 + 16] * 4
    spans = quantized.spans
    rank0 = spans[spans["rank"] == 0]
    assert (rank0.op_kind == OpKind.QUANTIZE).sum() == len(gathers)
    assert (rank0.op_kind == OpKind.DEQUANTIZE).sum() == len(gathers)
    memory = quantized.memory
    buffers = memory[(memory.device == "gpu0")
                     & (memory.category == Category.QUANTIZED_GATHER.value)]
    assert buffers.bytes.max() > 0 and buffers.bytes.iloc[-1] == 0


def test_check_says_zero_plus_plus(toy):
    from zerosim.report import _mode

    scenario = toy.scenario(_patch(zero_hpz_partition_size=2, zero_quantized_weights=True),
                            gpus=4)
    secondary = _secondary_bytes(toy) / 2**30
    assert _mode(scenario).endswith(
        "ZeRO++ hpZ (secondary partitions over groups of 2 ranks, in HBM, "
        f"{secondary:.1f} GiB a rank from the first forward to the step) and qwZ (int8 "
        "all-gathers of the parameters)")


def test_hpz_gathers_over_nvlink_what_crossed_the_nics(toy):
    """Two toy nodes of two GPUs (NVLink 100 GB/s a GPU, 10 GB/s of NIC a node, no latency),
    a group per node. lm_head, 32,768 B gathered: over all four ranks each GPU sends 3/4 of
    it, half of that out of its node, and the node's NIC carries both GPUs' halves, so a GPU's
    ring runs at 10 GB/s: 24,576 B / 10 GB/s; over its group of two, 16,384 B over NVLink at
    100 GB/s."""
    patch = _patch(zero_hpz_partition_size=2)
    patch["hardware"] = {"nodes": 2}
    patch["data_parallel"] = 4
    gathers = _gathers(_run(toy, patch, gpus=2))
    forward = gathers[gathers.phase == Phase.FORWARD]
    first = forward[(forward.micro_batch == 0) & (forward.op == "all-gather lm_head")]
    second = forward[(forward.micro_batch == 1)
                     & (forward.op == "all-gather lm_head over its hpZ group of 2")]
    assert list(first.end_s - first.start_s) == pytest.approx([24_576 / 10e9])
    assert list(second.end_s - second.start_s) == pytest.approx([16_384 / 100e9])


def test_check_json_says_zero_plus_plus(toy, tmp_path):
    import json

    import yaml
    from click.testing import CliRunner

    from zerosim.cli import main

    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(toy.tree(_patch(zero_hpz_partition_size=2,
                                                   zero_quantized_weights=True), gpus=4)))
    result = CliRunner().invoke(main, ["check", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["zero_plus_plus"] == {
        "hpz_group": 2, "secondary_bytes_per_rank": _secondary_bytes(toy),
        "secondary_on": "gpu", "quantized_weights": True, "quantized_gradients": False,
        "loco_error_feedback_bytes": 0}
    path.write_text(yaml.safe_dump(toy.tree(_patch(), gpus=4)))
    plain = CliRunner().invoke(main, ["check", str(path), "--json"])
    assert "zero_plus_plus" not in json.loads(plain.output)


def _two_nodes(version: str = "0.19.5", nodes: int = 2, **zero) -> dict:
    """qgZ on `nodes` toy nodes of two GPUs, GA 1."""
    patch = _patch(version, ga=1, zero_quantized_gradients=True, **zero)
    patch["hardware"] = {"nodes": nodes}
    patch["data_parallel"] = 2 * nodes
    return patch


def test_qgz_changes_nothing_on_one_node(toy):
    """DeepSpeed's `__avg_scatter_grads` takes qgZ's all-to-alls only when the ranks over a
    node's GPUs make more than one node: on one node the key is read, zerosim warns that it
    does nothing, and the gradients are reduce-scattered as without it. A release before
    ZeRO++ refuses the key."""
    with pytest.warns(ZeroPlusPlusWarning, match="does nothing on one node"):
        one = toy.scenario(_patch(zero_quantized_gradients=True), gpus=4)
    assert one.deepspeed.zero_plus_plus.quantized_gradients
    assert one.deepspeed.to_dict()["zero_optimization"]["zero_quantized_gradients"] is True
    assert one.unmodelled_keys == ()
    spans = _run(toy, _patch(zero_quantized_gradients=True)).spans
    assert not (spans.op_kind == OpKind.ALL_TO_ALL).any()
    with pytest.raises(ScenarioError, match=r"absent before DeepSpeed 0\.10\.0"):
        toy.scenario(_patch("0.9.5", zero_quantized_gradients=True), gpus=4)


def _reductions(result):
    spans = result.spans
    return spans[(spans["rank"] == 0) & spans.op_kind.isin([OpKind.ALL_TO_ALL,
                                                             OpKind.REDUCE_SCATTER])]


def test_qgz_reduces_each_matrix_by_all_to_alls_and_each_vector_by_a_reduce_scatter(toy):
    """Across two nodes the bucket is reduced tensor by tensor in parameter order: each of
    the 16 weight matrices by qgZ's all-to-alls, each of the 5 norm weights by a
    reduce-scatter of its own."""
    reductions = _reductions(_run(toy, _two_nodes(), gpus=2))
    layer = ["input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
             "self_attn.o_proj", "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj",
             "mlp.down_proj"]
    names = ["embed_tokens", *[f"layers.{i}.{n}" for i in (0, 1) for n in layer], "norm",
             "lm_head"]
    kinds = [OpKind.REDUCE_SCATTER if n.endswith("norm") else OpKind.ALL_TO_ALL
             for n in names]
    assert list(reductions.op_kind) == kinds
    assert [op.split(" ", 2)[-1] if op.startswith("qgZ") else op.split(" ", 1)[1]
            for op in reductions.op] == names


def test_qgz_times_a_matrix_as_its_kernels_and_all_to_alls_take(toy):
    """lm_head, 256 x 64 = 16,384 fp16 gradients, world 4 on two nodes of two GPUs (HBM
    1e12 B/s, NVLink 100 GB/s a GPU, 10 GB/s of NIC a node, no latency, the compute stream
    idle): G = max(256, 64, 4) = 256 groups.
    quantize: read 32,768 B, write 8,192 B of int4 and 1,024 B of scales: 41.984 ns;
    all-to-all over the node: half of 8,192 B, then of 1,024 B, over NVLink: 40.96 + 5.12 ns;
    reduction: read 8,192 + 1,024 B, write 4,096 + 512 B: 13.824 ns;
    all-to-all across the nodes: half of 4,096 B, then of 512 B, from each GPU, both GPUs of
    the node through its NIC: 409.6 + 51.2 ns;
    dequantize: read 4,096 + 512 B, write 8,192 fp16 elements: 20.992 ns;
    the chunks' sum and the division: 4,096 elements of 2 B, (2 + 3 + 2) passes: 57.344 ns.
    Its buffers, 44,032 B, are held until the next tensor's are made, the last down_proj's
    (22,016 B) until lm_head's: the peak, 66,048 B; while the sum runs its running sum, one
    partition of 4,096 fp16 elements (8,192 B), comes on top of lm_head's buffers."""
    result = _run(toy, _two_nodes(), gpus=2)
    reductions = _reductions(result)
    head = reductions[reductions.op == "qgZ all-to-all lm_head"]
    expected_ns = 41.984 + 40.96 + 5.12 + 13.824 + 409.6 + 51.2 + 20.992 + 57.344
    assert list(head.end_s - head.start_s) == pytest.approx([expected_ns * 1e-9], rel=1e-9)
    memory = result.memory
    buffers = memory[(memory.device == "gpu0")
                     & (memory.category == Category.QUANTIZED_REDUCE.value)]
    assert buffers.bytes.max() == 66_048 and buffers.bytes.iloc[-1] == 0
    assert list(buffers.bytes.iloc[-4:]) == [44_032, 44_032 + 8_192, 44_032, 0]


def test_qgz_pays_each_all_to_all_as_a_plain_call(toy):
    """qgZ's four `all_to_all_single` calls a matrix are plain `deepspeed.comm` calls: the
    host pays the stack's `plain_collective_us` for each, not ZeRO's `collective_launch_us`
    (held at 0 here). The 16 matrices at 100 us a call hold the host 6.4 ms more in the
    backward, on a GPU a thousand times the toy's, where the backward is the host's path
    but for the few microseconds the all-to-alls take across the toy's NICs, which the
    host's time then hides."""
    def backward_s(plain_us: float) -> float:
        patch = _two_nodes()
        patch["runtime"]["framework"] = {"host": {"plain_collective_us": {
            "value": plain_us, "basis": "assumed", "source": "test"}}}
        patch["hardware"]["gpu"] = {"peak_16bit_TFLOPS": {"value": 1000, "source": "test"},
                                    "hbm_GBps": {"value": 1e6, "source": "test"}}
        phases = _run(toy, patch, gpus=2).phases
        phases = phases[(phases["rank"] == 0) & (phases.phase == Phase.BACKWARD)]
        return float((phases.end_s - phases.start_s).sum())

    assert backward_s(100) - backward_s(0) == pytest.approx(16 * 4 * 100e-6, abs=1e-5)


@pytest.mark.parametrize(("version", "falls_back"), [("0.13.1", None), ("0.13.2", True)])
def test_qgz_on_a_matrix_that_does_not_split_in_two_world_sizes(toy, version, falls_back):
    """World 6 on three nodes: the 64 x 64 projections (4,096 elements) are not a multiple of
    12. Before 0.13.2 DeepSpeed's all-to-all fails on them; from it they are reduce-scattered
    (the 8,192- and 16,384-element ones are not multiples of 12 either)."""
    patch = _two_nodes(version, nodes=3)
    if falls_back is None:
        with pytest.raises(UnsupportedConfigError, match="not a multiple of twice the 6"):
            toy.scenario(patch, gpus=2)
        return
    reductions = _reductions(_run(toy, patch, gpus=2))
    assert (reductions.op_kind == OpKind.REDUCE_SCATTER).all() and len(reductions) == 21


@pytest.mark.parametrize(("patch", "gpus", "match"), [
    ({"hardware": {"nodes": 2}, "data_parallel": 3}, 2, "must be a multiple of 2"),
    ({"hardware": {"nodes": 3}, "data_parallel": 5}, 2, "must be a multiple of 2"),
    ({"deepspeed": {"zero_optimization": {"reduce_scatter": False}}}, 4,
     "reduce_scatter should also be enabled"),
])
def test_what_deepspeed_fails_on_with_qgz_is_refused(toy, patch, gpus, match):
    """qgZ's all-to-all groups take whole nodes (three ranks on nodes of two: the group
    builder asserts; five: rank 4 has no group), and ZeRO-3 asserts `reduce_scatter` with
    them."""
    from zerosim.scenario.loader import deep_merge

    with pytest.raises(UnsupportedConfigError, match=match):
        toy.scenario(deep_merge(_patch(zero_quantized_gradients=True), patch), gpus=gpus)


def test_qgz_at_zero_2_on_odd_ranks_is_only_a_warning_where_groups_are_built(toy):
    """Below ZeRO-3 nothing looks the groups up: five ranks on nodes of two build them and
    run (a warning says qgZ does nothing); three, under two nodes' worth, fail the builder's
    assertion."""
    from zerosim.scenario.loader import deep_merge

    five = deep_merge(_patch(stage=2, zero_quantized_gradients=True),
                      {"hardware": {"nodes": 3}, "data_parallel": 5})
    with pytest.warns(ZeroPlusPlusWarning, match="does nothing at ZeRO-2"):
        toy.scenario(five, gpus=2)
    three = deep_merge(_patch(stage=2, zero_quantized_gradients=True),
                       {"hardware": {"nodes": 2}, "data_parallel": 3})
    with pytest.raises(UnsupportedConfigError, match="must be a multiple of 2"):
        toy.scenario(three, gpus=2)


def test_check_says_qgz_across_nodes(toy):
    from zerosim.report import _mode

    scenario = toy.scenario(_two_nodes(), gpus=2)
    assert _mode(scenario).endswith("ZeRO++ qgZ (int4 all-to-all reductions of the gradients, "
                                    "within then across nodes)")


@pytest.mark.parametrize("zero", [{"zero_hpz_partition_size": 2},
                                  {"zero_quantized_gradients": True},
                                  {"zero_hpz_partition_size": 2, "zero_quantized_weights": True,
                                   "zero_quantized_gradients": True}])
def test_zero_plus_plus_groups_replay_alike_with_every_rank_simulated(toy, zero):
    """Two toy nodes of two GPUs: simulating node 0 alone and every rank give the same
    timeline; a group of ranks on node 1 alone (hpZ's, qgZ's within the node) is sized as
    the one node it spans."""
    patch = _patch(ga=2, **zero)
    patch["hardware"] = {"nodes": 2}
    patch["data_parallel"] = 4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        folded = toy.run(patch, gpus=2)
        every = toy.run(patch, gpus=2, fold_nodes=False)
    assert every.summary["iteration_s"] == folded.summary["iteration_s"]
    assert every.summary["phases_s"] == folded.summary["phases_s"]


LOCO = {"zeropp_loco_param": {"err_beta": 0.8, "reset_T": 1024}}


def test_loco_times_a_matrix_with_its_error_feedback(toy):
    """lm_head as in the qgZ test, with LoCo: its errors within the node (16,384 int8 B and
    1,024 B of scales) and across nodes (8,192 B and 512 B) dequantized to fp16 first, 75.264
    ns; the quantization reads and writes the fp16 errors too, 41.984 + 65.536 ns; the node's
    all-to-alls as before; the errors within the node quantized back, 50.176 ns; the
    reduction with the fp16 errors across nodes, 13.824 + 32.768 ns; the all-to-alls across
    nodes as before; those errors quantized back, 25.088 ns; dequantize and sums as before.
    Every matrix's int8 errors are held for the run: n + n/2 bytes and G + G/2 scales each,
    182,784 B for the toy's 16."""
    result = _run(toy, _two_nodes(**LOCO), gpus=2)
    reductions = _reductions(result)
    head = reductions[reductions.op == "qgZ all-to-all lm_head"]
    expected_ns = (75.264 + 107.52 + 40.96 + 5.12 + 50.176 + 46.592 + 409.6 + 51.2 + 25.088
                   + 20.992 + 57.344)
    assert list(head.end_s - head.start_s) == pytest.approx([expected_ns * 1e-9], rel=1e-9)
    memory = result.memory
    gpu0 = memory[memory.device == "gpu0"]
    kept = gpu0[gpu0.category == Category.QGZ_ERROR_FEEDBACK.value]
    assert kept.bytes.max() == 182_784
    buffers = gpu0[gpu0.category == Category.QUANTIZED_REDUCE.value]
    assert buffers.bytes.max() == 119_296 + 59_648 and buffers.bytes.iloc[-1] == 0


def test_loco_is_said_by_check_and_refused_where_deepspeed_fails(toy):
    from zerosim.report import _mode

    assert _mode(toy.scenario(_two_nodes(**LOCO), gpus=2)).endswith(
        "with LoCo's error feedback, 0.0 GiB a rank kept between steps)")
    with pytest.raises(ScenarioError, match=r"absent before DeepSpeed 0\.16\.2"):
        toy.scenario(_two_nodes("0.16.1", **LOCO), gpus=2)
    with pytest.raises(ScenarioError, match=r"reset_T: expected a value"):
        toy.scenario(_two_nodes(zeropp_loco_param={"err_beta": 0.8}), gpus=2)
    with pytest.raises(ScenarioError, match="err_beta or reset_T"):
        toy.scenario(_two_nodes(zeropp_loco_param={"err_beta": 0.8, "reset_T": 1,
                                                   "beta": 1}), gpus=2)
    with pytest.raises(ScenarioError, match="err_beta"):
        toy.scenario(_two_nodes(zeropp_loco_param={"err_beta": 2.0, "reset_T": 1}), gpus=2)
    one_node = _patch(zero_quantized_gradients=True, **LOCO)
    with pytest.warns(ZeroPlusPlusWarning) as said:
        toy.scenario(one_node, gpus=4)
    assert [str(w.message).split(" ", 2)[1] for w in said] == [
        "deepspeed.zero_optimization.zero_quantized_gradients",
        "deepspeed.zero_optimization.zeropp_loco_param"]
    written = toy.scenario(_two_nodes(**LOCO), gpus=2).deepspeed.to_dict()
    assert written["zero_optimization"]["zeropp_loco_param"] == {"err_beta": 0.8,
                                                                  "reset_T": 1024}
