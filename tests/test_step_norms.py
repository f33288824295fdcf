"""The offloaded step's global gradient norm, worked out by hand on the toy node (conftest.py).

DeepSpeed combines the norms the boundary backward left on the GPU one norm group at a time
(ZeRO-3: each sub-group, stage3.py `_get_norm_groups`; ZeRO-1/2: each parameter group,
stage_1_and_2.py `scaled_global_norm`), waits for each sum and all-reduces it, so the host pays
every group's ops and all-reduce in turn between the overflow check and the first unscale.

The toy model's 21 tensors: the embedding, 9 a layer (two norms, q/k/v/o, gate/up/down) for two
layers, the final norm and the head. At DP=1 sub_group_size 50000 closes the first sub-group at
layer 0's last tensor (16384 + 41088 elements: 10 tensors), the second holds the other 11.
"""

from __future__ import annotations

import pytest

from zerosim.engine.software import ZERO3_OFFLOAD_NORM, ZERO12_OFFLOAD_NORM

US = 1e-6


def _gap_before_first_unscale(result) -> float:
    """Seconds from the overflow check's end to the first sub-group's unscale, rank 0."""
    cpu = result.spans[(result.spans["rank"] == 0) & (result.spans.stream == "cpu")
                       & (result.spans.phase == "update")].sort_values("start_s")
    check = cpu[cpu.op == "overflow check"].iloc[0]
    unscale = cpu[cpu.op.str.startswith("unscale")].iloc[0]
    return unscale.start_s - check.end_s


def _with_launch_us(launch_us: float) -> dict:
    return {"runtime": {"framework": {"host": {"kernel_launch_us": {
        "value": launch_us, "basis": "assumed", "source": "test"}}}}}


def test_the_dispatch_counts_are_deepspeeds_ops():
    # 0.13.3 stage3.py: per tensor `param_norm**2`, `total_norm +=`; per sub-group float(),
    # FloatTensor, all_reduce, **0.5, isinf, isnan, logical_or, torch.tensor(-1.0), two
    # products, logical_not, a sum, and get_global_norm's `**2.0`, `+=`; sqrt's float() once
    assert (ZERO3_OFFLOAD_NORM.per_tensor, ZERO3_OFFLOAD_NORM.per_group,
            ZERO3_OFFLOAD_NORM.per_step) == (2, 14, 1)
    # stage_1_and_2.py: per tensor .item(); per group FloatTensor, all_reduce, .item(),
    # torch.tensor(norm); per step stack, norm and `clip > 1`
    assert (ZERO12_OFFLOAD_NORM.per_tensor, ZERO12_OFFLOAD_NORM.per_group,
            ZERO12_OFFLOAD_NORM.per_step) == (1, 4, 3)


def test_zero3_pays_each_sub_groups_ops_in_turn(toy):
    result = toy.run(_with_launch_us(1.0))
    # (2 x 10 + 14) + (2 x 11 + 14) + 1 = 71 dispatches of 1 us (the toy core runs at the
    # stack's 3.0 GHz reference); at DP=1 the all-reduces cost nothing
    assert _gap_before_first_unscale(result) == pytest.approx(71 * US, rel=1e-9)


def test_zero2_pays_one_item_per_tensor_and_one_group(toy):
    """ZeRO-2 checked each gradient for inf and nan on the GPU in the boundary backward, so
    its step runs no host check: from the update's start, one parameter group of all 21
    tensors, 21 x 1 + 4 + 3 = 28 dispatches, then the first unscale."""
    result = toy.run({**_with_launch_us(1.0), "deepspeed": {"zero_optimization": {"stage": 2}}})
    spans = result.spans
    update = spans[(spans.phase == "update") & (spans.stream == "cpu")].sort_values("start_s")
    assert "overflow check" not in set(update.op)
    start = result.phases[result.phases.phase == "update"].iloc[0].start_s
    assert update.iloc[0].op.startswith("unscale")
    assert update.iloc[0].start_s - start == pytest.approx(28 * US, rel=1e-9)


@pytest.mark.parametrize("sub_group_size, all_reduces", [(50000, 2), (25000, 3)])
def test_each_norm_group_all_reduces_its_sum(toy, sub_group_size, all_reduces):
    """DP=2 halves every partition: 25000 closes the first sub-group at layer 0's last tensor
    (8192 + 20544 = 28736 elements) and the rest make a second; 50000 takes all 57504 in one.
    The overflow flag's all-reduce comes first. Each all-reduce of the 8 B scalar over two
    GPUs: 2 ring steps of NVLink's 1 us, then 2 x 1/2 x 8 B at 100 GB/s (80 ps)."""
    hardware = toy.profile(2)
    hardware["nvlink"]["latency_us"] = {"value": 1, "basis": "assumed", "source": "test"}
    result = toy.run({"hardware": hardware, "deepspeed": {"zero_optimization": {
        "sub_group_size": sub_group_size}}}, gpus=2)
    assert _gap_before_first_unscale(result) == pytest.approx(
        all_reduces * (2 * US + 80e-12), rel=1e-9)
