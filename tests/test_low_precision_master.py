"""bf16 master params and gradients (`bf16.bf16_master_weights_and_grads`, DeepSpeed 0.18.3+)
on the toy (conftest.py), by hand: ZeRO-3 and ZeRO-2 with the optimizer offloaded, and on the
GPU with bf16 moments.

The toy trains in bf16 on DeepSpeed 0.19.5 here, its two sub-groups holding N0 = 57,472 and
N1 = 57,536 elements; its 4 threads step bf16 params at 5e7 params/s each with fp32 moments
and 4e7 with bf16 ones (written into the toy profile); host memory never binds.
"""

from __future__ import annotations

import pytest
from conftest import toy_tree

import zerosim
from zerosim.errors import ScenarioError, UnsupportedConfigError
from zerosim.hardware import costs
from zerosim.hardware.profile import load_profile
from zerosim.scenario.loader import deep_merge

N0, N1 = 57_472, 57_536
US = 1e-6
BF16_RATE, BF16_STATES_RATE = 5e7, 4e7


def _bf16(version: str = "0.19.5", *, states: bool | None = None, **deepspeed) -> dict:
    bf16 = {"enabled": True, "bf16_master_weights_and_grads": True}
    if states is not None:
        bf16["bf16_optimizer_states"] = states
    rates = {"adam_bf16_params_per_s_per_thread": {"value": BF16_RATE, "basis": "assumed",
                                                   "source": "test"},
             "adam_bf16_states_params_per_s_per_thread": {
                 "value": BF16_STATES_RATE, "basis": "assumed", "source": "test"}}
    return {"runtime": {"deepspeed_version": version}, "hardware": {"cpu": rates},
            "deepspeed": {"fp16": {"enabled": False}, "bf16": bf16, **deepspeed}}


def _fp32_master(version: str = "0.19.5") -> dict:
    return {"runtime": {"deepspeed_version": version},
            "deepspeed": {"fp16": {"enabled": False}, "bf16": {"enabled": True}}}


def _spans(result, stream: str) -> dict[str, tuple[float, float]]:
    rows = result.spans[result.spans.stream == stream]
    return {row.op: (row.start_s / US, row.end_s / US) for row in rows.itertuples()}


def _host_peak(result) -> dict[str, float]:
    memory = result.memory
    return memory[memory.device == "host0"].groupby("category").bytes.max().to_dict()


def test_each_sub_group_is_unscaled_stepped_and_uploaded_without_a_cast(toy):
    """Per sub-group on the rank's 4 threads: the unscale of its bf16 gradient (4 B x n at
    4 x 1 GB/s), CPU Adam over bf16 params with fp32 moments (n at 4 x 5e7/s), then the
    blocking H2D of the bf16 master partition itself (2 B x n at the pageable 5 GB/s): for N0
    57.472 + 287.36 + 22.9888 us, for N1 57.536 + 287.68 + 23.0144 us. No cast anywhere."""
    result = toy.run(_bf16())
    host = _spans(result, "cpu")
    t = host["unscale sub-group 0"][0]
    assert host["unscale sub-group 0"][1] == pytest.approx(t + 57.472)
    assert host["cpu adam sub-group 0"] == (pytest.approx(t + 57.472),
                                            pytest.approx(t + 344.832))
    h2d = _spans(result, "pcie.h2d")
    assert h2d["params sub-group 0 (pageable)"] == (pytest.approx(t + 344.832),
                                                    pytest.approx(t + 367.8208))
    assert host["unscale sub-group 1"][0] == pytest.approx(t + 367.8208)
    end = t + 367.8208 + 57.536 + 287.68 + 23.0144
    assert result.summary["iteration_s"] / US == pytest.approx(end, rel=1e-12)
    assert not any(op.startswith("cast") for op in host)


def test_bf16_moments_step_at_their_own_rate(toy):
    """bf16_optimizer_states on 0.19.1+: DeepSpeedCPUAdam built with fp32_optimizer_states
    off, its loop over bf16 moments at 4 x 4e7/s: N0 in 359.2 us."""
    host = _spans(toy.run(_bf16(states=True)), "cpu")
    start, end = host["cpu adam sub-group 0"]
    assert end - start == pytest.approx(N0 / 1.6e8 / US)


def test_the_boundary_flush_copies_the_bf16_partition_as_it_is(toy):
    """The boundary's gradient partitions accumulate in bf16, the master gradients' dtype:
    DeepSpeed's `.to(bf16)` is no cast, and each goes D2H into the pinned bf16 gradient
    buffer at 10 GB/s, 2 B per element."""
    spans = toy.run(_bf16()).spans
    flush = spans[spans.op.str.startswith("bf16 flush")]
    assert flush.bytes.sum() == 2 * (N0 + N1)
    assert set(flush.buffer_kind) == {"pinned"}
    row = flush.iloc[0]
    assert (row.end_s - row.start_s) / US == pytest.approx(row.bytes / 10e9 / US)
    assert not spans.op.str.startswith("fp32 cast").any()


def test_host_memory_holds_bf16_master_params_and_gradients(toy):
    """2 B x N of master params (pageable) and of gradients (pinned, one buffer a sub-group,
    each rounded up to a power of two: 2^17 B), and the moments at 8 B x N in fp32, 4 B x N
    in bf16."""
    n = N0 + N1
    fp32_moments = _host_peak(toy.run(_bf16()))
    assert fp32_moments["fp32 master params"] == 2 * n
    assert fp32_moments["fp32 grads (pinned)"] == 2 * 2**17
    assert fp32_moments["optimizer states"] == 8 * n
    assert _host_peak(toy.run(_bf16(states=True)))["optimizer states"] == 4 * n
    fp32 = _host_peak(toy.run(_fp32_master()))
    assert fp32["fp32 master params"] == 4 * n and fp32["optimizer states"] == 8 * n


def test_zero2_steps_and_copies_back_its_bf16_partition(toy):
    """ZeRO-2 at DP=1 (one partition of all N = 115,008 elements, GA 2): each gradient goes
    D2H as it is (2 B x N in all) into the pinned bf16 master gradient; the step unscales it
    (4 B x N at 4 GB/s: 115.008 us), steps it (N at 2e8/s: 575.04 us), copies the bf16
    partition into the 16-bit host buffer (2 B read, 2 B written, at 2 threads x 1 GB/s:
    230.016 us: a copy, no cast) and queues its pinned H2D (2 B x N at 10 GB/s: 23.0016 us).
    Host memory: master params, gradients and the 16-bit buffer 2 B x N each, pinned (2^18 B
    rounded), the moments 8 B x N, and no accumulator: with bf16 master gradients the
    micro-batches accumulate into them."""
    n = N0 + N1
    result = toy.run(deep_merge(_bf16(), {"deepspeed": {
        "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 2}}}))
    spans = result.spans
    assert spans[spans.op.str.startswith("bf16 flush")].bytes.sum() == 2 * n
    host = _spans(result, "cpu")
    t = host["unscale sub-group 0"][0]
    assert host["cpu adam sub-group 0"] == (pytest.approx(t + 115.008),
                                            pytest.approx(t + 690.048))
    assert host["copy bf16 sub-group 0"][1] == pytest.approx(t + 920.064)
    assert result.summary["iteration_s"] / US == pytest.approx(t + 943.0656, rel=1e-12)
    assert _host_peak(result) == {"fp32 master params (pinned)": 2**18,
                                  "fp32 grads (pinned)": 2**18, "params 16-bit (pinned)": 2**18,
                                  "optimizer states": 8 * n}


def test_twin_flow_steps_its_gpu_sub_group_over_bf16(toy):
    """ratio 0.5 on 0.19.5: sub-group 0 is the GPU's; its torch.optim.AdamW over bf16 params
    makes bf16 moments and runs 44 B per element with the unscale (half the fp32 88 B), then
    the bf16 master is copied into the params (4 B): 48 B x N0 through HBM, `exp_avg_sq_sqrt`
    (2 B x N0) held meanwhile. HBM holds its master, moments and gradient at 2, 4 and 2 B x N0;
    the host sub-group 1's master at 2 B x N1 and moments at 8 B x N1."""
    result = toy.run(deep_merge(_bf16(), {"deepspeed": {"zero_optimization": {
        "offload_optimizer": {"ratio": 0.5}}}}))
    spans = result.spans
    adam = spans[spans.op == "gpu adam sub-group 0"].iloc[0]
    assert adam.bytes == 48 * N0
    assert (adam.end_s - adam.start_s) / US == pytest.approx(48 * N0 / 1e12 / US)
    memory = result.memory
    peaks = memory.groupby(["device", "category"]).bytes.max()
    assert peaks["gpu0", "workspace"] == 2 * N0
    assert peaks["gpu0", "fp32 master params (GPU)"] == 2 * N0
    assert peaks["gpu0", "optimizer states (GPU)"] == 4 * N0
    assert peaks["gpu0", "fp32 grads (GPU)"] == 2 * N0
    assert peaks["host0", "fp32 master params"] == 2 * N1
    assert peaks["host0", "optimizer states"] == 8 * N1


def _on_gpu(stage: int) -> dict:
    return deep_merge(_bf16(states=True), {"deepspeed": {"zero_optimization": {
        "stage": stage, "offload_optimizer": {"device": "none"}}}})


def test_zero3_on_the_gpu_steps_the_bf16_partition_in_place(toy):
    """No offload, bf16 moments: per sub-group the flat gradient is the master gradient
    (flattening reads and writes 2 B: 4 B x n through HBM, no cast), FusedAdam reads and writes
    18 B (4 B of unscale, 14 B of Adam over bf16) and nothing is written back: the master is
    the 16-bit partition itself. HBM holds 4 B x N of moments and no master copy."""
    result = toy.run(_on_gpu(3))
    spans = result.spans
    compute = spans[(spans.phase == "update") & (spans.stream == "compute")]
    by_op = {row.op: row for row in compute.itertuples()}
    flat, adam = by_op["bf16 gradient sub-group 0"], by_op["gpu adam sub-group 0"]
    assert (flat.end_s - flat.start_s) / US == pytest.approx(4 * N0 / 1e12 / US)
    assert adam.bytes == 18 * N0
    assert (adam.end_s - adam.start_s) / US == pytest.approx(18 * N0 / 1e12 / US)
    memory = result.memory
    gpu = memory[memory.device == "gpu0"].groupby("category").bytes.max()
    assert gpu["optimizer states"] == 4 * (N0 + N1)
    assert "fp32 master params" not in gpu


def test_zero2_on_the_gpu_copies_its_bf16_master_into_the_params(toy):
    """ZeRO-2 keeps a bf16 clone of its partition as master (2 B x N in HBM) and copies it
    into the 16-bit params after FusedAdam: 18 + 4 B per element."""
    result = toy.run(_on_gpu(2))
    spans = result.spans
    adam = spans[spans.op == "gpu adam sub-group 0"].iloc[0]
    assert adam.bytes == 22 * (N0 + N1)
    memory = result.memory
    gpu = memory[memory.device == "gpu0"].groupby("category").bytes.max()
    assert gpu["fp32 master params"] == 2 * (N0 + N1)
    assert gpu["optimizer states"] == 4 * (N0 + N1)


@pytest.mark.parametrize(("version", "states", "fp32_states", "expected"), [
    ("0.18.3", None, None, "fp32"),
    ("0.18.3", True, None, "fp32"),
    ("0.18.3", True, False, "bf16"),
    ("0.19.0", True, True, "fp32"),
    ("0.19.1", True, None, "bf16"),
    ("0.19.5", True, True, "bf16"),
    ("0.19.5", None, False, "bf16"),
    ("0.19.5", False, None, "fp32"),
])
def test_the_moments_dtype_by_release(version, states, fp32_states, expected):
    """Up to 0.19.0 DeepSpeedCPUAdam keeps fp32 moments unless `optimizer.params` turns
    `fp32_optimizer_states` off, whatever bf16_optimizer_states says; from 0.19.1 (PR #8010)
    the engine turns it off whenever bf16_optimizer_states is on."""
    bf16 = {"enabled": True, "bf16_master_weights_and_grads": True}
    if states is not None:
        bf16["bf16_optimizer_states"] = states
    optimizer = {"type": "AdamW"}
    if fp32_states is not None:
        optimizer["params"] = {"fp32_optimizer_states": fp32_states}
    ds = _resolve({"bf16": bf16, "optimizer": optimizer}, version)
    assert (ds.master_dtype, ds.optimizer_state_dtype) == ("bf16", expected)


def _resolve(deepspeed: dict, version: str):
    """The toy's ds_config, bf16 and Adam moments as `deepspeed` says, resolved."""
    tree = toy_tree()
    tree["runtime"]["deepspeed_version"] = version
    tree["deepspeed"]["fp16"] = {"enabled": False}
    return zerosim.scenario_from_dict(deep_merge(tree, {"deepspeed": deepspeed}),
                                      source="<toy>").deepspeed


@pytest.mark.parametrize(("version", "bf16", "stage", "device", "key"), [
    ("0.18.2", {"enabled": True, "bf16_master_weights_and_grads": True}, 3, "cpu",
     "deepspeed.bf16.bf16_master_weights_and_grads"),
    ("0.18.2", {"enabled": True, "bf16_optimizer_states": False}, 3, "cpu",
     "deepspeed.bf16.bf16_optimizer_states"),
    ("0.19.5", {"enabled": True, "bf16_optimizer_states": True}, 3, "cpu",
     "deepspeed.bf16.bf16_optimizer_states"),
    ("0.19.5", {"enabled": False, "bf16_master_weights_and_grads": True}, 3, "cpu",
     "deepspeed.bf16.bf16_master_weights_and_grads"),
    ("0.19.5", {"enabled": True, "bf16_master_weights_and_grads": True}, 0, "none",
     "deepspeed.bf16.bf16_master_weights_and_grads"),
    ("0.19.5", {"enabled": True, "bf16_master_weights_and_grads": True}, 3, "none",
     "deepspeed.zero_optimization.offload_optimizer.device"),
])
def test_what_deepspeed_refuses_is_refused(version, bf16, stage, device, key):
    data = {"bf16": bf16, "fp16": {"enabled": not bf16["enabled"]},
            "zero_optimization": {"stage": stage, "offload_optimizer": {"device": device}}}
    with pytest.raises(ScenarioError) as caught:
        _resolve(data, version)
    assert caught.value.key_path == key


def test_fp32_optimizer_states_must_be_true_or_false():
    with pytest.raises(ScenarioError) as caught:
        _resolve({"bf16": {"enabled": True, "bf16_master_weights_and_grads": True},
                  "optimizer": {"type": "AdamW", "params": {"fp32_optimizer_states": "no"}}},
                 "0.19.5")
    assert caught.value.key_path == "deepspeed.optimizer.params.fp32_optimizer_states"


@pytest.mark.parametrize(("patch", "key"), [
    ({"deepspeed": {"zero_optimization": {"stage": 2, "zenflow": {"update_interval": 4}}}},
     "deepspeed.zero_optimization.zenflow"),
    ({"deepspeed": {"bf16": {"bf16_optimizer_states": True},
                    "optimizer": {"type": "AdamW", "params": {"torch_adam": True}},
                    "zero_optimization": {"offload_optimizer": {"device": "none"}}}},
     "deepspeed.optimizer.params.torch_adam"),
    ({"deepspeed": {"bf16": {"bf16_optimizer_states": True},
                    "zero_optimization": {"offload_optimizer": {"device": "none"},
                                          "offload_param": {"device": "cpu"}}}},
     "deepspeed.zero_optimization.offload_param.device"),
    ({"deepspeed": {"zero_optimization": {"offload_optimizer": {"super_offload": True}}}},
     "deepspeed.zero_optimization.offload_optimizer.super_offload"),
    ({"deepspeed": {"data_types": {"grad_accum_dtype": "fp32"}}},
     "deepspeed.data_types.grad_accum_dtype"),
    ({"what_if": {"overlap_copy_back": True}}, "what_if.overlap_copy_back"),
])
def test_what_zerosim_does_not_replay_is_refused(toy, patch, key):
    tree = toy.tree(_bf16())
    with pytest.raises(UnsupportedConfigError) as caught:
        zerosim.scenario_from_dict(deep_merge(tree, patch), source="<toy>")
    assert caught.value.key_path == key


def test_the_resolved_config_says_what_it_replays(toy):
    ds = toy.scenario(_bf16(states=True)).deepspeed.to_dict()
    assert ds["bf16"]["bf16_master_weights_and_grads"] is True
    assert ds["bf16"]["bf16_optimizer_states"] is True
    assert ds["optimizer"]["params"] == {"fp32_optimizer_states": False}


@pytest.mark.parametrize(("profile", "bf16", "bf16_states"), [
    ("h100-jlse", 1.50, 1.83), ("dgx-h100", 1.50, 1.83), ("polaris-a100", 7.3, 10.1),
    ("dgx-a100", 7.3, 10.1), ("gh200", 1.18, 1.60), ("h200-vm", 1.50, 1.83)])
def test_the_bf16_ceilings_are_the_fp32_one_over_the_builds_measured_cost(profile, bf16,
                                                                        bf16_states):
    """An AVX-512 build converts bf16 in its vector loop; an AVX2 build (AMD Zen 2 and 3) has
    none and steps every element in the scalar loop; Arm's scalar build converts in its
    scalar loop (zerosim/hardware/cpus.yaml, bf16_cpu_adam). h200-vm names no CPU model: the
    AVX-512 build is assumed."""
    p = load_profile(profile)
    assert p.adam_bf16_params_per_s_per_thread == pytest.approx(
        p.adam_params_per_s_per_thread / bf16, rel=1e-12)
    assert p.adam_bf16_states_params_per_s_per_thread == pytest.approx(
        p.adam_params_per_s_per_thread / bf16_states, rel=1e-12)
    basis = p.provenance["cpu.adam_bf16_params_per_s_per_thread"].basis
    assert basis == ("assumed" if profile == "h200-vm" else "derived")


def test_a_profile_may_write_its_own_bf16_ceiling():
    p = load_profile("polaris-a100", {"cpu": {"adam_bf16_params_per_s_per_thread": 1e9}})
    assert p.adam_bf16_params_per_s_per_thread == 1e9
    assert p.adam_bf16_states_params_per_s_per_thread == pytest.approx(
        p.adam_params_per_s_per_thread / 10.1)


def test_the_precision_prices_bytes_and_rate():
    precision = costs.AdamPrecision("bf16", "fp32")
    assert precision.host_bytes == costs.HostBytes(home=6, spread=16)
    assert precision.unscale_bytes == costs.HostBytes(home=4)
    assert costs.AdamPrecision("bf16", "bf16").host_bytes.total == 14
    assert costs.FP32_ADAM.host_bytes == costs.ADAM_HOST_BYTES


def test_check_names_the_dtypes_of_cpu_adam(toy):
    from zerosim.report import _adam_text, _mode

    text = _adam_text(toy.scenario(_bf16()))
    assert "over bf16 params with fp32 moments" in text
    assert text.startswith("2e8 params/s per rank")
    assert _mode(toy.scenario(_bf16(states=True))) == (
        "ZeRO-3, optimizer on cpu, bf16 master params and gradients, bf16 Adam moments")


FP16_RATE, FP16_STATES_RATE = 5e7, 4e7


def _fp16(version: str = "0.19.5", *, fp32_states: bool = True, **zero) -> dict:
    """The toy's own fp16 training with fp16 master params (`fp16.fp16_master_weights_and_grads`)
    and the fp16 CPU Adam ceilings written into its profile."""
    rates = {"adam_fp16_params_per_s_per_thread": {"value": FP16_RATE, "basis": "assumed",
                                                   "source": "test"},
             "adam_fp16_states_params_per_s_per_thread": {
                 "value": FP16_STATES_RATE, "basis": "assumed", "source": "test"}}
    deepspeed = {"fp16": {"enabled": True, "fp16_master_weights_and_grads": True},
                 "zero_optimization": zero}
    if not fp32_states:
        deepspeed["optimizer"] = {"type": "Adam", "params": {"fp32_optimizer_states": False}}
    return {"runtime": {"deepspeed_version": version}, "hardware": {"cpu": rates},
            "deepspeed": deepspeed}


def test_fp16_master_params_step_at_their_own_rate_and_upload_without_a_cast(toy):
    """fp16 master params (0.18.3+, through bf16's path): CPU Adam over fp16 params with fp32
    moments at 4 x 5e7/s (N0 in 287.36 us), or over fp16 moments at 4 x 4e7/s (359.2 us),
    then the blocking H2D of the fp16 master partition itself, 2 B per element; no cast."""
    result = toy.run(_fp16())
    host = _spans(result, "cpu")
    start, end = host["cpu adam sub-group 0"]
    assert end - start == pytest.approx(N0 / 2e8 / US)
    h2d = result.spans[result.spans.op == "params sub-group 0 (pageable)"]
    assert list(h2d.bytes) == [2 * N0] and h2d.start_s.iloc[0] / US == pytest.approx(end)
    assert not any(op.startswith("cast") for op in host)
    start, end = _spans(toy.run(_fp16(fp32_states=False)), "cpu")["cpu adam sub-group 0"]
    assert end - start == pytest.approx(N0 / 1.6e8 / US)


def test_host_memory_holds_fp16_master_params_and_their_moments(toy):
    """2 B x N of master params, the moments 8 B x N in fp32 and 4 B x N in fp16."""
    n = N0 + N1
    peak = _host_peak(toy.run(_fp16()))
    assert peak["fp32 master params"] == 2 * n and peak["optimizer states"] == 8 * n
    assert _host_peak(toy.run(_fp16(fp32_states=False)))["optimizer states"] == 4 * n
    ds = toy.scenario(_fp16(fp32_states=False)).deepspeed
    assert (ds.master_dtype, ds.optimizer_state_dtype) == ("fp16", "fp16")
    assert ds.to_dict()["fp16"]["fp16_master_weights_and_grads"] is True
    assert ds.to_dict()["optimizer"]["params"] == {"fp32_optimizer_states": False}


@pytest.mark.parametrize(("version", "zero", "error", "key"), [
    ("0.18.2", {}, ScenarioError, "fp16.fp16_master_weights_and_grads"),
    ("0.18.2", {"stage": 2}, UnsupportedConfigError, "fp16.fp16_master_weights_and_grads"),
    ("0.19.5", {"stage": 0, "offload_optimizer": {"device": "none"}}, ScenarioError,
     "fp16.fp16_master_weights_and_grads"),
    ("0.19.5", {"offload_optimizer": {"device": "none"}}, ScenarioError,
     "zero_optimization.offload_optimizer.device"),
])
def test_what_deepspeed_refuses_or_zerosim_does_not_replay_of_fp16_master(toy, version, zero,
                                                                          error, key):
    """Up to 0.18.2 DeepSpeed reads the key for ZeRO-2 alone, a path of its own zerosim does
    not replay; from 0.18.3 for ZeRO-1/2/3, always with the optimizer offloaded."""
    with pytest.raises(error, match=rf"deepspeed\.{key}"):
        toy.scenario(_fp16(version, **zero))


def test_fp16_master_belongs_to_fp16_training(toy):
    patch = deep_merge(_fp16(), {"deepspeed": {"fp16": {"enabled": False},
                                               "bf16": {"enabled": True}}})
    with pytest.raises(ScenarioError, match=r"unless fp16\.enabled is true"):
        toy.scenario(patch)


@pytest.mark.parametrize(("profile", "fp16", "fp16_states"), [
    ("h100-jlse", 0.98, 1.11), ("polaris-a100", 0.99, 1.16), ("gh200", 1.21, 1.49)])
def test_the_fp16_ceilings_are_the_fp32_one_over_the_builds_measured_cost(profile, fp16,
                                                                        fp16_states):
    """fp16 has a vector path in both x86 builds (F16C), so neither slows as bf16 does on AVX2
    (zerosim/hardware/cpus.yaml, fp16_cpu_adam)."""
    p = load_profile(profile)
    assert p.adam_fp16_params_per_s_per_thread == pytest.approx(
        p.adam_params_per_s_per_thread / fp16, rel=1e-12)
    assert p.adam_fp16_states_params_per_s_per_thread == pytest.approx(
        p.adam_params_per_s_per_thread / fp16_states, rel=1e-12)
    assert costs.AdamPrecision("fp16", "fp16").params_per_s_per_thread(p) == (
        p.adam_fp16_states_params_per_s_per_thread)


def test_tune_searches_the_training_dtypes_master_precisions(toy):
    """`--free master` under fp16 training: fp32, fp16 and fp16 with fp16 moments, each with
    the optimizer offloaded (DeepSpeed wants it so for fp16 master weights)."""
    from zerosim.tune import as_given, candidates, free_knobs, masters

    base = as_given(toy.scenario({"runtime": {"deepspeed_version": "0.19.5"}}))
    assert base.master == "fp32" and masters(base, "fp16") == ["fp32", "fp16", "fp16+moments"]
    found = candidates(base, free_knobs(free=["master"]), training="fp16")
    on_gpu = {c.master for c in found if c.offload in ("none", "params")}
    assert on_gpu == {"fp32"}
    moments = next(c for c in found if c.master == "fp16+moments")
    overrides = moments.overrides()
    assert overrides["deepspeed.fp16.fp16_master_weights_and_grads"] is True
    assert overrides["deepspeed.bf16.bf16_master_weights_and_grads"] is False
    assert overrides["deepspeed.optimizer.params.fp32_optimizer_states"] is False
    assert moments.describe().endswith("fp16 master and moments")
