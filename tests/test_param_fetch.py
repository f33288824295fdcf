"""ZeRO-3 parameter fetching as DeepSpeed 0.13.3 bounds it: `stage3_max_live_parameters`,
`stage3_max_reuse_distance` and `stage3_prefetch_bucket_size` move the gathered parameters'
peak, and the host waits once more than two fetch events are unfinished.

The toy Llama (conftest.py) has, in trace order, the embedding (16,384 elements), per layer
input norm 64, q/k/v/o 4,096 each, post-attention norm 64, gate/up/down 8,192 each, then the
final norm 64 and the LM head 16,384: 115,008 elements, 230,016 bytes in 16 bits. Gathered
parameters count as allocated from the host's fetch to its release (PyTorch's
`memory_allocated`); a call that gathers several tensors holds them twice from the first wait
on any of them to the wait on the last (`AllGatherCoalescedHandle`: a flat buffer, then one
copy per tensor)."""

from __future__ import annotations

import pytest
from conftest import toy_stack

from zerosim.engine.params import MAX_ONGOING_FETCH_EVENTS
from zerosim.engine.plan import plan_of
from zerosim.vocabulary import OpKind, Phase, Stream


def gathered_levels(result):
    memory = result.memory
    rows = memory[(memory.device == "gpu0")
                  & (memory.category.astype(str) == "params gathered")]
    return rows.sort_values("t_s", kind="stable")


def zero(**knobs):
    return {"deepspeed": {"zero_optimization": knobs}}


@pytest.mark.parametrize(("knobs", "peak_bytes"), [
    # Every module's backward comes back within 1e9 elements: all stay gathered. The
    # embedding's hook gathers it alone (32,768 B) and prefetches the other 98,624 elements
    # in one coalesced call (197,248 B); the wait on the first of them copies every tensor
    # out of the flat buffer, which lives until the LM head's wait: 32,768 + 2 x 197,248.
    ({}, 427_264),
    # No reuse, no prefetch: one module at a time, the largest the embedding.
    ({"stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0}, 32_768),
    # No reuse; a 5e7 prefetch bucket takes the rest of the model at the embedding's hook.
    # The embedding is released after its forward, and the next hook, with the rest of the
    # forward on its way, goes on into the backward's trace and fetches the embedding again
    # for the backward's end: 32,768 + 2 x 197,248.
    ({"stage3_max_reuse_distance": 0}, 427_264),
    # Within 1e4 live elements, plus the embedding's 16,384 that DeepSpeed's count leaves out
    # (a post-backward hook never releases it; the step does, after `reset_step` zeroed the
    # count): the budget is 26,384 minus what is live, and the module that crosses it is
    # still fetched (DeepSpeed's loop tests before adding). The peak comes at layer 1's
    # post-attention-norm hook: with 24,640 elements live (that norm and the three MLP
    # projections) the final norm and the LM head (16,448) come in one call, and the
    # flat buffer of the call before (o_proj, the norm and gate_proj: 24,704 B) still waits
    # for its last wait: 2 x (24,640 + 16,448) + 24,704.
    ({"stage3_max_reuse_distance": 0, "stage3_max_live_parameters": 1e4}, 106_880),
])
def test_the_knobs_move_the_gathered_peak_as_in_deepspeed(toy, knobs, peak_bytes):
    result = toy.run(zero(**knobs), gpus=2)
    assert gathered_levels(result).bytes.max() == peak_bytes


def test_the_host_waits_when_more_than_two_fetch_events_are_unfinished(toy):
    """Slow all-gathers (10 MB/s NVLink) and a host with no cost: without DeepSpeed's bound
    the host would release every module at once; with it, the release of the module at
    trace position p waits for the all-gather of position p - 3 (one event per gathered
    tensor; the toy Llama's modules each have one)."""
    slow = {"nvlink": {"bus_GBps": {"value": 0.01, "basis": "assumed", "source": "test"}}}
    result = toy.run({**zero(stage3_prefetch_bucket_size=0, stage3_max_reuse_distance=0),
                      "hardware": slow}, gpus=2)
    spans = result.spans
    gathers = spans[(spans["rank"] == 0) & (spans.op_kind == OpKind.ALL_GATHER)
                    & (spans.phase == Phase.FORWARD) & (spans.micro_batch == 0)]
    ends = list(gathers.sort_values("start_s").end_s)
    levels = gathered_levels(result)
    releases = list(levels[levels.bytes == 0].t_s)[:len(ends)]
    lag = MAX_ONGOING_FETCH_EVENTS + 1
    assert releases[:lag] == [0.0] * lag
    assert releases[lag:] == ends[:len(ends) - lag]


def test_from_0_6_0_the_host_is_bounded_by_fetch_events(toy):
    """PR #1453 brought the bound with the new coordinator (stage3.py at v0.6.0; PR #1901 only
    moved it, in 0.6.2): at 0.6.1 the releases wait for the gathers as at 0.13.3."""
    slow = {"nvlink": {"bus_GBps": {"value": 0.01, "basis": "assumed", "source": "test"}}}
    patch = {**zero(stage3_prefetch_bucket_size=0, stage3_max_reuse_distance=0),
             "hardware": slow}
    levels = [gathered_levels(toy.run({**patch, "runtime": {"deepspeed_version": version}},
                                      gpus=2))
              for version in ("0.6.1", "0.13.3")]
    releases = [list(level[level.bytes == 0].t_s)[:8] for level in levels]
    assert releases[0] == releases[1]
    assert releases[0][MAX_ONGOING_FETCH_EVENTS + 1] > 0.0


def _before_0_6_0(toy, version: str = "0.5.10", **knobs):
    slow = {"nvlink": {"bus_GBps": {"value": 0.01, "basis": "assumed", "source": "test"}}}
    knobs = knobs or {"stage3_prefetch_bucket_size": 0, "stage3_max_reuse_distance": 0}
    result = toy.run({**zero(**knobs), "hardware": slow,
                      "runtime": {"deepspeed_version": version}}, gpus=2)
    spans = result.spans
    return spans[(spans["rank"] == 0) & (spans.micro_batch == 0)]


@pytest.mark.parametrize("phase", [Phase.FORWARD, Phase.BACKWARD])
def test_before_0_6_0_every_hooked_module_takes_each_parameters_norm(toy, phase):
    """`fetch_sub_module` formats each of the module's parameters' norm into a debug message
    (v0.4.0-v0.5.10), going forward and back: one norm per tensor of the toy Llama, the
    embedding, 9 per layer (two norms, q/k/v/o, gate/up/down), the final norm and the LM head,
    1 + 2 x 9 + 1 + 1 = 21 in each phase; none from 0.6.0."""
    spans = _before_0_6_0(toy)
    norms = spans[(spans.phase == phase) & (spans.op_kind == OpKind.PARAM_NORM)]
    assert len(norms) == 21
    assert set(norms.stream) == {Stream.COMPUTE}
    assert not (_before_0_6_0(toy, "0.6.0").op_kind == OpKind.PARAM_NORM).any()


def test_before_0_6_0_a_fetch_drains_the_device(toy):
    """Slow all-gathers, each module gathering its own parameters at its hook: the host waits
    for every all-gather issued and for every stream (`_synchronize_communication`), then
    for each norm's `.item()`, so each norm starts once everything issued before it on the
    rank's GPU has ended, and the module's kernels start after its norms."""
    spans = _before_0_6_0(toy)
    forward = spans[spans.phase == Phase.FORWARD]
    device = forward[forward.stream != Stream.HOST]
    norms = forward[forward.op_kind == OpKind.PARAM_NORM].sort_values("start_s")
    for norm in norms.itertuples():
        before = device[device.start_s < norm.start_s]
        assert (before.end_s <= norm.start_s).all(), norm.op
    for module in ("layers.0.self_attn.q_proj", "layers.1.mlp.down_proj", "lm_head"):
        norm = norms[norms.op == f"norm {module}"].iloc[0]
        kernel = forward[forward.op == f"forward {module}"].iloc[0]
        gather = forward[(forward.op_kind == OpKind.ALL_GATHER)
                         & (forward.op == f"all-gather {module}")].iloc[0]
        assert gather.end_s <= norm.start_s < norm.end_s <= kernel.start_s


def test_a_coalesced_gather_is_split_on_the_fetch_stream_after_it_lands(toy):
    """The first wait on a module of a several-tensor gather queues the copies of all its
    tensors (read and write, 2 x 197,248 B through HBM) on DeepSpeed's all-gather stream,
    behind the all-gather; the modules' kernels wait for the copies. (The gathers after it
    fetch, for the backward, what the forward releases.)"""
    result = toy.run(zero(stage3_max_reuse_distance=0), gpus=2)
    spans = result.spans
    first = spans[(spans["rank"] == 0) & (spans.phase == Phase.FORWARD)
                  & (spans.micro_batch == 0)
                  & spans.stream.isin([Stream.ALLGATHER, Stream.FETCH_COPIES])]
    first = first.sort_values("start_s", kind="stable")
    assert list(first.op_kind[:3]) == [OpKind.ALL_GATHER, OpKind.ALL_GATHER, OpKind.GATHER_SPLIT]
    gather, split = first.iloc[1], first.iloc[2]
    assert (gather.stream, split.stream) == (Stream.ALLGATHER, Stream.FETCH_COPIES)
    assert split.bytes == gather.bytes == 197_248
    assert split.start_s == gather.end_s


def test_a_split_waits_for_its_own_gather_not_for_prefetches_issued_after_it(toy):
    """PyTorch runs every all-gather on the process group's NCCL stream, and a wait on one
    (`AllGatherCoalescedHandle.wait`, on DeepSpeed's all-gather stream) waits for that call
    alone: the copies out of its flat buffer do not queue behind the prefetches the hooks
    issued since. Prefetch bucket 8,256 elements, slow NVLink (10 MB/s): input_layernorm's
    hook gathers v_proj + o_proj + post_attention_layernorm in one call; the hooks of q_proj
    and k_proj then prefetch gate_proj + up_proj and down_proj + the next input_layernorm.
    v_proj's hook splits its call the moment it lands, while gate_proj + up_proj is still
    on the wire, and v_proj's forward starts with the copies (of no duration on this GPU)."""
    slow = {"nvlink": {"bus_GBps": {"value": 0.01, "basis": "assumed", "source": "test"}}}
    result = toy.run({**zero(stage3_prefetch_bucket_size=8256, stage3_max_reuse_distance=0),
                      "hardware": slow}, gpus=2)
    spans = result.spans
    forward = spans[(spans["rank"] == 0) & (spans.phase == Phase.FORWARD)
                    & (spans.micro_batch == 0)]
    gathers = forward[forward.stream == Stream.ALLGATHER].set_index("op")
    splits = forward[forward.stream == Stream.FETCH_COPIES].sort_values("start_s")
    attention = gathers.loc["all-gather layers.0.self_attn.v_proj + layers.0.self_attn.o_proj"
                            " + layers.0.post_attention_layernorm"]
    mlp = gathers.loc["all-gather layers.0.mlp.gate_proj + layers.0.mlp.up_proj"]
    split = splits.iloc[1]
    assert split.bytes == attention.bytes == 2 * (4096 + 4096 + 64)
    assert split.start_s == attention.end_s == mlp.start_s
    assert split.end_s < mlp.end_s
    v_proj = forward[forward.op == "forward layers.0.self_attn.v_proj"].iloc[0]
    assert v_proj.start_s == split.end_s


def test_one_gpu_gathers_nothing_and_holds_nothing_twice(toy):
    """With one rank DeepSpeed's `_no_gather_coalesced` hands back the partitions as they are:
    no collective, no flat buffer, no copies."""
    result = toy.run({}, gpus=1)
    spans = result.spans
    assert not (spans.op_kind == OpKind.GATHER_SPLIT).any()
    assert gathered_levels(result).empty or gathered_levels(result).bytes.max() == 0


def external_head(**knobs):
    """The toy with Megatron's use of the output layer: the model's forward reads its weight."""
    stack = toy_stack()
    stack["modules"]["output_weight"] = "external"
    return {**zero(**knobs), "runtime": {"framework": stack}}


def test_an_external_output_weight_is_gathered_first_and_held_until_the_step(toy):
    """The top module's pre-forward hook gathers its external parameter before the embedding
    (the LM head, 16,384 elements: 32,768 B), and no module hook releases it: it stays for the
    whole forward and backward (here with no reuse and no prefetch, where every other module
    is released after use)."""
    result = toy.run(external_head(stage3_max_reuse_distance=0, stage3_prefetch_bucket_size=0),
                     gpus=2)
    levels = gathered_levels(result)
    assert list(levels.bytes[:2]) == [32_768, 65_536]
    phases = result.phases[result.phases["rank"] == 0]
    end_of_backward = phases[phases.phase == Phase.BACKWARD].end_s.max()
    held = levels[levels.t_s < end_of_backward]
    assert held.bytes.min() == 32_768
    assert levels.bytes.iloc[-1] == 0


def forward_gathers(result):
    spans = result.spans
    gathers = spans[(spans["rank"] == 0) & (spans.op_kind == OpKind.ALL_GATHER)
                    & (spans.phase == Phase.FORWARD)]
    return list(gathers.sort_values("start_s", kind="stable").bytes)


def test_the_unreleased_params_raise_the_live_bound_by_their_size(toy):
    """DeepSpeed's live count leaves out what no module hook releases: the embedding, and the
    external LM head. With `stage3_max_live_parameters` 0 the prefetch budget is that size
    minus what is live: 16,384 elements for the embedding alone, 32,768 with the external
    head. The head, gathered first and held, takes exactly the extra budget, so through the
    forward every later call gathers the same modules as without it: the embedding (32,768
    B), layer 0's input norm (128 B), then q/k/v/o in one call (32,768 B) and so on, until
    the end of layer 1, where the run without it fetches the head."""
    knobs = {"stage3_max_reuse_distance": 0, "stage3_max_live_parameters": 0}
    plain = forward_gathers(toy.run(zero(**knobs), gpus=2))
    external = forward_gathers(toy.run(external_head(**knobs), gpus=2))
    assert plain[:3] == [32_768, 128, 32_768]
    assert external[0] == 32_768
    assert external[1:12] == plain[:11]


def test_the_plan_names_what_no_module_hook_releases(toy):
    """The embedding always (its input is token ids), the LM head when the stack's forward
    reads its weight; neither on replicated (stage 2) parameters, which nothing gathers."""
    plain = plan_of(toy.scenario(zero(), gpus=2))
    external = plan_of(toy.scenario(external_head(), gpus=2))
    head = len(plain.modules) - 2
    assert plain.modules[head].name == "lm_head"
    assert (plain.external, plain.unreleased_numel) == (frozenset(), 16_384)
    assert (external.external, external.unreleased_numel) == (frozenset({head}), 32_768)
    stage2 = plan_of(toy.scenario({**external_head(), "deepspeed": {
        "zero_optimization": {"stage": 2}}}, gpus=2))
    assert (stage2.external, stage2.unreleased_numel) == (frozenset(), 0)


def test_between_micro_batches_the_external_head_stays_gathered(toy):
    """Only the step releases what no hook does: with two micro-batches the head is gathered
    once, first of the first forward, and both backwards run with it."""
    patch = external_head(stage3_max_reuse_distance=0, stage3_prefetch_bucket_size=0)
    patch["deepspeed"]["gradient_accumulation_steps"] = 2
    spans = toy.run(patch, gpus=2).spans
    gathers = spans[(spans["rank"] == 0) & (spans.op_kind == OpKind.ALL_GATHER)]
    with_head = gathers[gathers.op.str.contains("lm_head")]
    assert list(with_head.op) == ["all-gather lm_head"]
    assert (with_head.phase.iloc[0], with_head.micro_batch.iloc[0]) == (Phase.FORWARD, 0)


def test_what_no_hook_releases_is_held_from_the_backward_to_the_step(toy):
    """A phase's record carries what its rank holds allocated when it ends. The embedding's
    post-backward hook never fires (token ids need no gradient), so the backward ends with it
    gathered (32,768 B) and the step's `_partition_all_parameters` frees it; an external
    head (32,768 B more) is held from the first hook of the forward to the same step."""
    knobs = {"stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0}

    def ends(patch):
        phases = toy.run(patch, gpus=2).phases
        rows = phases[phases["rank"] == 0].set_index("phase")
        return rows.allocated_end_bytes

    plain, external = ends(zero(**knobs)), ends(external_head(**knobs))
    assert plain[Phase.BACKWARD] - plain[Phase.UPDATE] == 32_768
    assert external[Phase.BACKWARD] - external[Phase.UPDATE] == 65_536
    assert external[Phase.FORWARD] - plain[Phase.FORWARD] == 32_768
    assert external[Phase.UPDATE] == plain[Phase.UPDATE]


def _peaks_by_micro_batch(toy, version: str, patch_of) -> list[int]:
    """Rank 0's gathered peak in each forward and backward of two micro-batches."""
    patch = patch_of(stage3_max_reuse_distance=0, stage3_max_live_parameters=1e4)
    patch["deepspeed"]["gradient_accumulation_steps"] = 2
    patch["runtime"] = {**patch.get("runtime", {}), "deepspeed_version": version}
    result = toy.run(patch, gpus=2)
    levels = gathered_levels(result)
    peaks = []
    for row in result.phases[result.phases["rank"] == 0].itertuples():
        if row.phase in (Phase.FORWARD, Phase.BACKWARD):
            inside = levels[(levels.t_s >= row.start_s) & (levels.t_s < row.end_s)]
            peaks.append(int(inside.bytes.max()))
    return peaks


@pytest.mark.parametrize(("version", "drifts"), [
    ("0.15.3", [True, True]),  # zeroed at each backward's end: every forward starts below
    ("0.15.4", [False, True]),  # PR #6662, zeroed at each forward's start
    ("0.16.0", [False, False]),  # PR #6726, zeroed by the step only: exact
    ("0.16.8", [False, True]),  # PR #7258 rolls #6726 back
])
def test_where_the_live_count_is_zeroed_by_release(toy, version, drifts):
    """The knobs of the last case above, two micro-batches: a micro-batch whose forward starts
    with DeepSpeed's live count below what is gathered (by the embedding's 16,384 elements)
    peaks as 0.15.3's does in both its phases; one whose count is exact peaks lower, as
    0.16.0's do."""
    peaks = _peaks_by_micro_batch(toy, version, zero)
    drifting = _peaks_by_micro_batch(toy, "0.15.3", zero)
    exact = _peaks_by_micro_batch(toy, "0.16.0", zero)
    assert all(d > e for d, e in zip(drifting, exact, strict=True))
    for micro, drifts_here in enumerate(drifts):
        expected = drifting if drifts_here else exact
        assert peaks[2 * micro:2 * micro + 2] == expected[2 * micro:2 * micro + 2]


def test_from_0_19_3_the_backward_releases_the_embedding_not_an_external_head(toy):
    """PR #8148: the end of each backward releases what a module whose post-backward hook
    never fired holds (the embedding), not external params. With no reuse and no prefetch
    each backward gathers it again; on 0.19.2 the second forward finds it gathered from the
    first backward and does not fetch it; on 0.19.3 it gathers it again, and
    the second micro-batch's count drifts by the external head alone, as an exact count
    would with the head held: its peaks are 0.19.2's less the embedding's budget."""
    def embedding_gathers(version: str) -> list[tuple[str, int]]:
        patch = external_head(stage3_max_reuse_distance=0, stage3_prefetch_bucket_size=0)
        patch["deepspeed"]["gradient_accumulation_steps"] = 2
        patch["runtime"] = {**patch.get("runtime", {}), "deepspeed_version": version}
        spans = toy.run(patch, gpus=2).spans
        gathers = spans[(spans["rank"] == 0) & (spans.op_kind == OpKind.ALL_GATHER)
                        & spans.op.str.contains("embed_tokens")]
        return list(zip(gathers.phase, gathers.micro_batch, strict=True))

    backwards = [(Phase.BACKWARD, 0), (Phase.BACKWARD, 1)]
    assert embedding_gathers("0.19.2") == [(Phase.FORWARD, 0), *backwards]
    assert embedding_gathers("0.19.3") == [(Phase.FORWARD, 0), backwards[0], (Phase.FORWARD, 1),
                                           backwards[1]]
    before = _peaks_by_micro_batch(toy, "0.19.2", external_head)
    after = _peaks_by_micro_batch(toy, "0.19.3", external_head)
    assert after[:2] == before[:2]
    assert after[2] < before[2]


@pytest.mark.parametrize("groups", ["separate", "same"])
def test_one_process_group_runs_gathers_and_reductions_in_issue_order(toy, groups):
    """Two GPUs, NVLink 10 MB/s, no latency. In the backward, layer 1's down_proj is gathered
    (16,384 B: 8,192 B per GPU) and the first gradient bucket's reduce-scatter (32,896 B:
    16,448 B per GPU) is issued a few nanoseconds later (`lead`: the bucket's last gradient
    copy), on the reduce stream. On two process groups the two run at once, sharing the
    link: the gather takes 2 x 819.2 us, less the sub-microsecond lead it had alone (the
    bucket's copy and pre-divide). On one
    (Megatron-DeepSpeed's), NCCL's stream runs them in issue order: the gather alone at the
    full rate, 819.2 us, then the reduce-scatter, 1644.8 us. Either way the link is busy from
    the gather's start until it has carried both: 2464 us."""
    slow = {"nvlink": {"bus_GBps": {"value": 0.01, "basis": "assumed", "source": "test"}}}
    stack = toy_stack()
    stack["process_groups"] = {"params_and_gradients": {"value": groups, "source": "test"}}
    result = toy.run({**zero(reduce_bucket_size=20000, stage3_max_reuse_distance=0,
                             stage3_prefetch_bucket_size=0),
                      "hardware": slow, "runtime": {"framework": stack}}, gpus=2)
    spans = result.spans
    backward = spans[(spans["rank"] == 0) & (spans.phase == Phase.BACKWARD)
                     & (spans.micro_batch == 0)]
    gather = backward[backward.op == "all-gather layers.1.mlp.down_proj"].iloc[0]
    reduction = backward[backward.op_kind == OpKind.REDUCE_SCATTER].sort_values("start_s").iloc[0]
    lead = reduction.start_s - gather.start_s
    assert reduction.bytes == 32_896 and 0 < lead < 1e-8
    gathered = gather.end_s - gather.start_s
    if groups == "same":
        assert gathered == pytest.approx(819.2e-6, rel=1e-9)
        assert reduction.end_s - gather.end_s == pytest.approx(1644.8e-6, rel=1e-9)
    else:
        assert 1638.4e-6 - 1e-6 < gathered < 1638.4e-6
    assert reduction.end_s - gather.start_s == pytest.approx(2464e-6, rel=1e-9)


def test_offloaded_partitions_are_copied_in_while_an_earlier_all_gather_runs(toy):
    """`offload_param: cpu`: `all_gather_coalesced` copies a partition to the GPU on
    DeepSpeed's all-gather stream before the all-gather, which NCCL's stream then runs. Two
    GPUs, PCIe 10 GB/s, NVLink 10 MB/s, no prefetch: the embedding's partition (8,192 of its
    16,384 elements, 16,384 B) comes in 1.6384 us, its all-gather carries 16,384 B per GPU in
    1638.4 us; input_layernorm's partition (32 elements, 64 B) is copied in meanwhile, right
    after the embedding's (6.4 ns), not after that all-gather."""
    slow = {"nvlink": {"bus_GBps": {"value": 0.01, "basis": "assumed", "source": "test"}}}
    result = toy.run({**zero(offload_param={"device": "cpu", "pin_memory": True},
                             stage3_prefetch_bucket_size=0, stage3_max_reuse_distance=0),
                      "hardware": slow}, gpus=2)
    spans = result.spans
    forward = spans[(spans["rank"] == 0) & (spans.phase == Phase.FORWARD)
                    & (spans.micro_batch == 0)].set_index("op")
    us = 1e-6
    for op, start, end in (("fetch embed_tokens (pinned)", 0.0, 1.6384),
                           ("all-gather embed_tokens", 1.6384, 1.6384 + 1638.4),
                           ("fetch layers.0.input_layernorm (pinned)", 1.6384, 1.6448)):
        assert forward.loc[op, "start_s"] == pytest.approx(start * us, rel=1e-9, abs=1e-15)
        assert forward.loc[op, "end_s"] == pytest.approx(end * us, rel=1e-9)
    assert forward.loc["fetch layers.0.input_layernorm", "stream"] == Stream.FETCH_COPIES


def test_a_module_waits_for_the_copies_in_queued_before_its_hook(toy):
    """`fetch_sub_module` makes the compute stream wait for DeepSpeed's whole all-gather
    stream, where `offload_param` copies the partitions in. PCIe 1 MB/s (NVLink fast),
    prefetch bucket 4,096 elements: the embedding's hook fetches its partition (16,384 B,
    16.384 ms), then prefetches input_layernorm + q_proj (4,160 B, to 20.544 ms);
    input_layernorm's hook prefetches k_proj (4,096 B, to 24.640 ms). q_proj's parameters are
    gathered and split out nanoseconds after 20.544 ms, but its hook's wait puts its kernels
    behind k_proj's copy."""
    slow = {"pcie": {key: {"value": 0.001, "basis": "assumed", "source": "test"}
                     for key in ("h2d_pinned_GBps", "h2d_pageable_GBps")}}
    result = toy.run({**zero(offload_param={"device": "cpu", "pin_memory": True},
                             stage3_prefetch_bucket_size=4096, stage3_max_reuse_distance=0),
                      "hardware": slow}, gpus=2)
    spans = result.spans
    forward = spans[(spans["rank"] == 0) & (spans.phase == Phase.FORWARD)
                    & (spans.micro_batch == 0)]
    ms = 1e-3
    split = forward[forward.op_kind == OpKind.GATHER_SPLIT].iloc[0]
    k_fetch = forward[forward.op == "fetch layers.0.self_attn.k_proj"].iloc[0]
    q_proj = forward[forward.op == "forward layers.0.self_attn.q_proj"].iloc[0]
    gathered = (16.384 + 4.160) * ms + 4160 / 100e9  # its all-gather: 4,160 B per GPU, 100 GB/s
    assert split.start_s == pytest.approx(gathered, rel=1e-9)
    split_s = 2 * 8320 / 1e12  # read and write the bundle's 8,320 B through HBM
    assert split.end_s == pytest.approx(gathered + split_s, rel=1e-9)
    # k_proj's copy queues behind the split on DeepSpeed's stream
    assert k_fetch.end_s == pytest.approx(gathered + split_s + 4.096 * ms, rel=1e-9)
    assert q_proj.start_s == k_fetch.end_s


def test_the_forward_is_timed_on_the_compute_stream_and_its_last_prefetches_fall_in_the_backward(
        toy):
    """DeepSpeed's `fwd` timer is a CUDA event pair on the compute stream: it stops when the
    forward's kernels have run, not when the prefetches the forward issued for the backward
    (slow all-gathers: 10 MB/s NVLink) have landed. The backward's timer starts there, and its
    first kernels wait for those all-gathers."""
    slow = {"nvlink": {"bus_GBps": {"value": 0.01, "basis": "assumed", "source": "test"}}}
    result = toy.run({**zero(stage3_max_reuse_distance=0), "hardware": slow}, gpus=2)
    spans = result.spans[(result.spans["rank"] == 0) & (result.spans.micro_batch == 0)]
    phases = result.phases[result.phases["rank"] == 0].set_index("phase")
    forward, backward = phases.loc[Phase.FORWARD], phases.loc[Phase.BACKWARD]
    compute = spans[spans.stream == Stream.COMPUTE]
    assert forward.end_s == compute[compute.phase == Phase.FORWARD].end_s.max()
    in_flight = spans[(spans.phase == Phase.FORWARD) & (spans.op_kind == OpKind.ALL_GATHER)
                      & (spans.end_s > forward.end_s)]
    assert len(in_flight) > 0
    assert backward.start_s == forward.end_s
    first_backward = compute[compute.phase == Phase.BACKWARD].start_s.min()
    assert first_backward >= in_flight.end_s.max() > forward.end_s


def test_before_0_6_0_each_prefetched_module_is_gathered_once_the_device_has_drained(toy):
    """`_allgather_param` (v0.5.10) makes each prefetched parameter's buffer with
    `torch.zeros` and calls `torch.cuda.synchronize()` before its all-gather: with the whole
    model in one prefetch bucket, the embedding's hook gathers it and then the rest of the
    model one module at a time, each call starting once everything the rank's GPU was given
    before it has ended: 21 calls in the forward (the embedding, 9 a layer, the final norm
    and the LM head), where 0.6.0 takes the rest of the model in one call."""
    spans = {version: _before_0_6_0(toy, version, stage3_max_reuse_distance=1e9).pipe(
        lambda s: s[s.phase == Phase.FORWARD]) for version in ("0.5.10", "0.6.0")}
    slow = spans["0.5.10"]
    device = slow[slow.stream != Stream.HOST]
    gathers = slow[slow.op_kind == OpKind.ALL_GATHER].sort_values("start_s")
    assert len(gathers) == 21
    assert gathers.op.iloc[-1] == "all-gather lm_head"
    for gather in gathers.itertuples():
        assert (device[device.start_s < gather.start_s].end_s <= gather.start_s).all()
    assert (spans["0.6.0"].op_kind == OpKind.ALL_GATHER).sum() == 2
