"""`managed_gradient_accumulation: false` (DeepSpeed 0.19.4+, offload from 0.19.5): step() is
the accumulation boundary, and ZeRO-3's offloaded step opens with the flush the boundary
backward would have done."""

from __future__ import annotations

import warnings

import pytest

from zerosim.errors import UnsupportedConfigError
from zerosim.scenario.deepspeed import IgnoredKeyWarning
from zerosim.scenario.support import MicsWarning
from zerosim.vocabulary import OpKind, Phase

UNMANAGED = {"managed_gradient_accumulation": False}


def _patch(version: str = "0.19.5", *, ga: int = 2, **deepspeed) -> dict:
    return {"runtime": {"deepspeed_version": version},
            "deepspeed": {"gradient_accumulation_steps": ga, **deepspeed}}


def _rank0(result, kind: OpKind):
    spans = result.spans
    return spans[(spans["rank"] == 0) & (spans.op_kind == kind)]


def test_the_key_resolves_and_writes_back(toy):
    ds = toy.scenario(_patch(**UNMANAGED)).deepspeed
    assert not ds.managed_accumulation
    assert ds.to_dict()["managed_gradient_accumulation"] is False
    assert "managed_gradient_accumulation" not in toy.scenario(_patch()).deepspeed.to_dict()


def test_before_0_19_4_the_key_does_nothing(toy):
    """DeepSpeed's top-level config ignores a key it does not know: a warning, and the last
    backward stays the boundary."""
    with pytest.warns(IgnoredKeyWarning, match="does nothing before DeepSpeed 0.19.4"):
        scenario = toy.scenario(_patch("0.19.3", **UNMANAGED))
    assert scenario.deepspeed.managed_accumulation


@pytest.mark.parametrize(("version", "deepspeed", "match"), [
    ("0.19.4", {}, "the engine asserts 'managed_gradient_accumulation=False is not supported "
                   "with ZeRO optimizer state offload'"),
    ("0.19.4", {"zero_optimization": {"offload_optimizer": {"device": "none"},
                                      "offload_param": {"device": "cpu"}}},
     "not supported with ZeRO parameter offload"),
    ("0.19.5", {"zero_optimization": {"stage": 1, "overlap_comm": True,
                                      "offload_optimizer": {"device": "none"}}},
     "supports ZeRO overlap_comm only with ZeRO stage 2"),
    ("0.19.5", {"zero_optimization": {"stage": 1, "overlap_comm": False,
                                      "offload_optimizer": {"device": "none"}}},
     "moves from the last backward into step"),
    ("0.19.5", {"zero_optimization": {"stage": 2, "overlap_comm": False,
                                      "zenflow": {"topk_ratio": 0.1, "update_interval": 2}}},
     "with ZenFlow"),
])
def test_what_deepspeed_asserts_or_zerosim_does_not_replay_is_refused(toy, version, deepspeed,
                                                                      match):
    with pytest.raises(UnsupportedConfigError, match=match):
        toy.scenario(_patch(version, **UNMANAGED, **deepspeed))


def test_the_offloaded_step_opens_with_the_boundary_flush(toy):
    """GA 2 on one toy GPU, fp16, the optimizer offloaded to pinned memory: managed, the
    second backward flushes each fp32 gradient to the host; unmanaged, no backward does, and
    the update opens with one op per tensor on the default stream, in the optimizer's order.
    lm_head's: its 16,384 accumulated fp16 elements back H2D (32,768 B at 10 GB/s: 3.2768
    us), the fp64 norm (2 + 8 + 8 B an element through HBM at 1,000 GB/s: 294.912 ns), the
    cast to fp32 (65,536 B, 1.5 passes: 98.304 ns) and its D2H (65,536 B at 10 GB/s: 6.5536
    us)."""
    managed = toy.run_ok(_patch())
    flushes = _rank0(managed, OpKind.GRAD_FLUSH)
    assert len(flushes) > 0 and set(flushes.phase) == {Phase.BACKWARD}
    unmanaged = toy.run_ok(_patch(**UNMANAGED))
    assert (_rank0(unmanaged, OpKind.GRAD_FLUSH).phase == Phase.UPDATE).all()
    finalize = _rank0(unmanaged, OpKind.PARTITION_GRADS)
    finalize = finalize[finalize.op.str.startswith("finalize grad ")]
    assert len(finalize) == 21 and set(finalize.phase) == {Phase.UPDATE}
    head = finalize[finalize.op == "finalize grad lm_head"]
    assert list(head.end_s - head.start_s) == pytest.approx(
        [3.2768e-6 + 294.912e-9 + 98.304e-9 + 6.5536e-6], rel=1e-9)
    assert unmanaged.summary["phases_s"]["update"] > managed.summary["phases_s"]["update"]


def test_the_offloaded_zero_2_step_opens_with_the_boundary_work(toy):
    """ZeRO-2 with the optimizer offloaded, GA 2, unmanaged: every backward accumulates on the
    host and the update opens with one op per parameter on the default stream, the host
    waiting at each (the overflow tracker's result). lm_head's: its accumulated gradient
    back H2D (32,768 B at 10 GB/s: 3.2768 us) and cloned (65,536 B through HBM: 65.536 ns),
    its fp64 norm (18 B an element: 294.912 ns), the overflow check (2 + 26 B an element:
    458.752 ns), the cast (98.304 ns) and the fp32 D2H (6.5536 us)."""
    zero2 = {"zero_optimization": {"stage": 2}}
    managed = toy.run_ok(_patch(**zero2))
    unmanaged = toy.run_ok(_patch(**zero2, **UNMANAGED))
    assert set(_rank0(managed, OpKind.GRAD_FLUSH).phase) == {Phase.BACKWARD}
    assert set(_rank0(unmanaged, OpKind.GRAD_FLUSH).phase) == {Phase.UPDATE}
    finalize = _rank0(unmanaged, OpKind.PARTITION_GRADS)
    head = finalize[finalize.op == "finalize grad lm_head"]
    assert list(head.end_s - head.start_s) == pytest.approx(
        [3.2768e-6 + 65.536e-9 + 294.912e-9 + 458.752e-9 + 98.304e-9 + 6.5536e-6], rel=1e-9)


def test_a_lone_backward_still_accumulates_on_the_host_at_zero_2(toy):
    """GA 1: managed, the one backward is the boundary and skips the host accumulator;
    unmanaged, it is not, so it sends its gradients to the accumulator first (0.19.5:
    `micro_step_id > 0 or not is_gradient_accumulation_boundary()`)."""
    zero2 = {"zero_optimization": {"stage": 2}}
    to_host = [len(_rank0(toy.run_ok(_patch(ga=1, **zero2, **extra)), OpKind.GRAD_TO_HOST))
               for extra in ({}, UNMANAGED)]
    assert to_host[0] == 0 and to_host[1] > 0


def test_without_offload_nothing_moves(toy):
    """ZeRO-3 with nothing offloaded: the gradients accumulate on the GPU either way and
    step() has nothing to finalize: the same timeline."""
    plain = {"zero_optimization": {"offload_optimizer": {"device": "none"}}}
    managed = toy.run_ok(_patch(**plain))
    unmanaged = toy.run_ok(_patch(**plain, **UNMANAGED))
    assert unmanaged.summary["iteration_s"] == managed.summary["iteration_s"]


def test_mics_never_reduces_across_replicas_unmanaged(toy):
    """MiCS's all-reduce across the replicas reads the boundary flag in the backward, which
    unmanaged accumulation never sets: a warning, and no all-reduce."""
    patch = _patch(**UNMANAGED, zero_optimization={"mics_shard_size": 2,
                                                   "offload_optimizer": {"device": "none"}})
    patch["hardware"] = {"nodes": 2}
    patch["data_parallel"] = 4
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        toy.scenario(patch, gpus=2)
    assert any(issubclass(w.category, MicsWarning) and "never all-reduces" in str(w.message)
               for w in caught)
    spans = toy.run_ok(patch, gpus=2).spans
    assert not spans.op.str.endswith("replicas").any()


def test_check_says_unmanaged_accumulation(toy):
    from zerosim.report import _mode

    assert _mode(toy.scenario(_patch(**UNMANAGED))).endswith(
        "unmanaged gradient accumulation (step() is the boundary)")
    assert "unmanaged" not in _mode(toy.scenario(_patch()))
