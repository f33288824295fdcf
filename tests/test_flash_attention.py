"""flash-attn's causal kernel, forward and backward, as FlashAttention-2's release timed it on
an A100 and an H100 and as the node probe timed PyTorch's copy of it on an H200, against the
kernel model, and the three GPU values it pins."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from zerosim.hardware import costs
from zerosim.hardware.profile import load_profile
from zerosim.models.kernels import FusedAttention, flash_attention, flash_backward
from zerosim.validation.flash_attention import (
    FITTED,
    fit_flash_rates,
    flash_table,
    flash_tables,
    modelled_tflops,
)
from zerosim.validation.reference import reference_data
from zerosim.validation.validate import flash_attention_cells

ROOT = Path(__file__).resolve().parent.parent
A100_PROFILES = ("dgx-a100", "polaris-a100", "p4d-24xlarge")
H100_PROFILES = ("dgx-h100", "h100-jlse", "gh200")


def test_a_bar_is_three_and_a_half_causal_forwards_over_the_modelled_time():
    """s = 2048, d = 128 on the A100: 16384 tokens, 2048 wide. The causal forward is
    2 x 16384 x 2048 x 2048 = 137.4 GFLOP, its backward 2.5 times that; both run at
    0.701 x 312 TFLOPS x 1024 / (1024 + 246) x 128 / (128 + 16.0), plus a kernel gap each."""
    table = flash_table("A100")
    row = next(r for r in table.rows if (r.seq, r.head_dim) == (2048, 128))
    forward = row.forward(2)
    assert forward == FusedAttention(2.0 * 16384 * 2048 * 2048, 2 * 16384 * 4 * 2048,
                                     keys=1024, head_dim=128)
    assert forward == flash_attention(16384, 2048, 2048, 2048, 128, 2)
    assert flash_backward(forward) == FusedAttention(2.5 * forward.flops, 2 * forward.nbytes,
                                                     1024, 128)
    profile = table.profile
    rate = 312e12 * 0.701 * 1024 / (1024 + 246) * 128 / (128 + 16.0)
    seconds = 3.5 * forward.flops / rate + 2 * profile.kernel_gap_s
    assert modelled_tflops(table, row) == pytest.approx(3.5 * forward.flops / seconds / 1e12,
                                                        rel=1e-12)
    assert modelled_tflops(table, row) == pytest.approx(156.5, abs=0.1)
    assert row.tflops == 155


@pytest.mark.parametrize(("gpu", "profiles", "values", "std_pct"), [
    ("A100", A100_PROFILES, (0.701, 246, 16.0), (1.0, 1.5, 5.6)),
    ("H100", H100_PROFILES, (0.396, 267, 21.9), (1.1, 1.6, 4.9)),
    ("H200", ("dgx-h200",), (0.359, 476, 14.4), (1.3, 1.5, 7.9)),
])
def test_the_profiles_carry_the_fit_to_flashattention_2s_bars(gpu, profiles, values, std_pct):
    """Least squares over the rate a long loop with a large head reaches, each query block's
    fixed cost in keys and the softmax's work per score in head dimensions, on 12 bars per
    GPU (head dimension 64 and 128, sequence 512-16384, causal): identified, every bar then
    within 1.95%; the rate and the softmax's share are correlated (0.89-0.92), the two heads
    telling them apart. The A100 profiles (40 and 80 GB parts alike: the kernel is bound by
    the SMs) and the H100 ones (the GH200 assumed, the same die) carry the values; dgx-h200
    its own, PyTorch's copy of the kernel timed the same way on an H200 (0.89 there)."""
    fit = fit_flash_rates(flash_table(gpu))
    assert fit.values == pytest.approx(values, rel=3e-3)  # the profiles keep 3 digits
    assert [round(100 * s / v, 1) for s, v in zip(fit.std, fit.values, strict=True)] == list(
        std_pct)
    assert max(abs(e) for e in fit.errors) < 0.0195
    assert 0.88 < fit.correlations[0][2] < 0.93
    for name in profiles:
        profile = load_profile(name)
        assert tuple(getattr(profile, f) for f in FITTED) == values


def test_a_single_rate_priced_short_sequences_up_to_twice_too_fast():
    """Before these values each profile priced the kernel at Azure's one bar (A100: 179.5
    TFLOPS at s = 8192, d = 64; H100: 327.9 at d = 128), whatever the shape: 0.576 and 0.331
    of peak. Against the bars that was 5% slow to 103% fast on the A100 and 0% to 130% fast
    on the H100, +16% and +24% at s = 2048 with the head of 128 the Llama models have."""
    for table, single in zip(flash_tables()[:2], (179.5 / 312, 327.9 / 989.4), strict=True):
        flat = replace(table.profile, flash_attention_efficiency=single,
                       flash_attention_block_keys=0.0, flash_attention_softmax_dims=0.0)
        errors = {(r.seq, r.head_dim): modelled_tflops(table, r, flat) / r.tflops - 1
                  for r in table.rows}
        assert max(errors.values()) > 1.0
        assert errors[2048, 128] == pytest.approx(0.16 if "A100" in table.gpu else 0.24,
                                                  abs=0.01)


def test_azures_bars_sit_a_few_percent_above_the_causal_model():
    """Azure's benchmark guide (its mode not stated) times FlashAttention-2 at 179.5 TFLOPS on
    the A100 (s = 8192, d = 64) and 327.9 on the H100 (d = 128): 9% and 4% above the model's
    causal rate there, 6% and 1% above its rate without the mask (each query visiting every
    key), as FlashAttention-2's bars without the mask sit 2-8% above its causal ones."""
    azure = reference_data("azure_nd_gpu_benchmarks.yaml")
    for key, profile_name, head in (("a100_sxm4_80gb", "dgx-a100", 64),
                                    ("h100_sxm_80gb", "dgx-h100", 128)):
        profile = load_profile(profile_name)
        measured = azure[key]["flash_attention_2_TFLOPS"]["value"]
        causal = flash_attention(16384, 8192, 2048, 2048, head, 2)
        full = FusedAttention(2 * causal.flops, causal.nbytes, keys=8192, head_dim=head)
        rate = {name: k.flops / (costs.kernel_s(k, profile) - profile.kernel_gap_s) / 1e12
                for name, k in (("causal", causal), ("full", full))}
        assert measured / rate["causal"] - 1 == pytest.approx(
            0.088 if head == 64 else 0.045, abs=0.005)
        assert measured / rate["full"] - 1 == pytest.approx(
            0.056 if head == 64 else 0.012, abs=0.005)


def test_validate_judges_every_bar_within_5_percent():
    cells = flash_attention_cells()
    assert len(cells) == 36
    assert {(c.status, c.tolerance, c.unit) for c in cells} == {("pass", 0.05, "TFLOPS")}
    assert [c.group for c in cells] == (["GPU kernels (A100)"] * 12 + ["GPU kernels (H100)"] * 12
                                        + ["GPU kernels (H200)"] * 12)
    assert cells[0].case == "FlashAttention-2 causal s512 d64"
    assert cells[-1].case == "PyTorch SDPA flash causal s16384 d128"


def test_the_h200s_bars_are_priced_at_the_full_clock_they_ran_at():
    """The log beside the H200's bars holds 1920-1980 MHz: the table states the clock
    (`sm_clock_fraction: 1.0`), where dgx-h200 prices a long phase at 0.869 of it. The H100's
    values (FlashAttention-2's release kernel) price PyTorch's copy 2-46% fast, most at short
    sequences."""
    table = flash_table("H200")
    assert table.sm_clock_fraction == 1.0 and table.profile.sm_clock_fraction == 1.0
    assert load_profile("dgx-h200").sm_clock_fraction == 0.869
    h100_values = replace(table.profile, **{f: getattr(load_profile("dgx-h100"), f)
                                            for f in FITTED})
    errors = [modelled_tflops(table, r, h100_values) / r.tflops - 1 for r in table.rows]
    assert round(min(errors), 2) == 0.02 and round(max(errors), 2) == 0.46


def test_flash_backward_holds_an_fp32_query_accumulator_and_grouped_kv_gradients():
    """flash-attn 2's `mha_bwd` allocates, besides the gradients it returns, `dq_accum` (fp32,
    every query head at the head dimension rounded up to 32, or to 256 above 192) and
    `softmax_d` (fp32 a row and head), and with K and V grouped their gradients at every query
    head (`dk_expanded`, `dv_expanded`, 16-bit). Llama-3.1-8B's 32 heads of 128 over 4,096
    bf16 tokens: 131,072 rows, 4 x 131,072 x 129 B, and 2 x 2 x 131,072 x 128 B grouped."""
    from zerosim.models.breakdown import Workload, build_modules, flash_backward_workspace
    from zerosim.scenario import load_scenario
    from zerosim.stacks import load_stack

    w = Workload(sequence_length=4096, attention="flash", bfloat16=True)
    rows = 32 * 4096
    assert flash_backward_workspace(32, 128, w, grouped_kv=False) == 4 * rows * 129
    assert flash_backward_workspace(32, 128, w, grouped_kv=True) == (4 * rows * 129
                                                                      + 4 * rows * 128)
    assert flash_backward_workspace(32, 80, w, grouped_kv=False) == 4 * rows * 97
    assert flash_backward_workspace(32, 224, w, grouped_kv=False) == 4 * rows * 257
    spec = load_scenario(ROOT / "scenarios" / "llama8b_liger_dgx_h100.yaml").model
    core = {name: next(m for m in build_modules(spec, replace(w, attention=attention),
                                                load_stack(stack).recipe)
                       if m.kind == "attention")
            for name, stack, attention in (("hf", "hf-transformers", "flash"),
                                           ("megatron", "megatron-deepspeed", "flash"),
                                           ("eager", "hf-transformers", "eager"))}
    # flash-attn takes transformers' grouped K and V; Megatron expands them before
    assert core["hf"].backward_transient_bytes == 4 * rows * 129 + 4 * rows * 128
    assert core["megatron"].backward_transient_bytes == 4 * rows * 129
    assert core["eager"].backward_transient_bytes != core["hf"].backward_transient_bytes
