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

from zerosim.engine.params import MAX_ONGOING_FETCH_EVENTS
from zerosim.vocabulary import OpKind, Phase


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
    # No reuse; a 5e7 prefetch bucket takes the rest of the model at the embedding's hook,
    # and the embedding is released before the next module's wait: 2 x 197,248.
    ({"stage3_max_reuse_distance": 0}, 394_496),
    # Within 1e4 live elements: the budget is 1e4 minus what is live, and the module that
    # crosses it is still fetched (DeepSpeed's loop tests before adding). At layer 1's
    # down_proj hook the final norm (64) and the LM head (16,384) are prefetched in one
    # call; down_proj is released before the final norm's wait copies both out of the flat
    # buffer: 2 x 16,448 elements.
    ({"stage3_max_reuse_distance": 0, "stage3_max_live_parameters": 1e4}, 65_792),
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


def test_before_0_6_2_the_host_is_not_bounded(toy):
    slow = {"nvlink": {"bus_GBps": {"value": 0.01, "basis": "assumed", "source": "test"}}}
    result = toy.run({**zero(stage3_prefetch_bucket_size=0, stage3_max_reuse_distance=0),
                      "hardware": slow, "runtime": {"deepspeed_version": "0.6.1"}}, gpus=2)
    levels = gathered_levels(result)
    forward_releases = list(levels[levels.bytes == 0].t_s)[:8]
    assert forward_releases == [0.0] * 8


def test_a_coalesced_gather_is_split_on_the_allgather_stream_after_it_lands(toy):
    """The first wait on a module of a several-tensor gather queues the copies of all its
    tensors (read and write, 2 x 197,248 B through HBM) behind the all-gather; the modules'
    kernels wait for the copies."""
    result = toy.run(zero(stage3_max_reuse_distance=0), gpus=2)
    spans = result.spans
    first = spans[(spans["rank"] == 0) & (spans.phase == Phase.FORWARD)
                  & (spans.micro_batch == 0) & (spans.stream == "allgather")]
    first = first.sort_values("start_s", kind="stable")
    assert list(first.op_kind) == [OpKind.ALL_GATHER, OpKind.ALL_GATHER, OpKind.GATHER_SPLIT]
    gather, split = first.iloc[1], first.iloc[2]
    assert split.bytes == gather.bytes == 197_248
    assert split.start_s == gather.end_s


def test_one_gpu_gathers_nothing_and_holds_nothing_twice(toy):
    """With one rank DeepSpeed's `_no_gather_coalesced` hands back the partitions as they are:
    no collective, no flat buffer, no copies."""
    result = toy.run({}, gpus=1)
    spans = result.spans
    assert not (spans.op_kind == OpKind.GATHER_SPLIT).any()
    assert gathered_levels(result).empty or gathered_levels(result).bytes.max() == 0
