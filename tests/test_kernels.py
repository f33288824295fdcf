"""Kernel-level GPU time, software stacks and the host path, with values worked out by hand."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import toy_stack

from zerosim.errors import ScenarioError
from zerosim.hardware import costs
from zerosim.hardware.profile import load_profile
from zerosim.models.breakdown import Recipe, Workload, build_modules, total_params
from zerosim.models.catalog import CATALOG
from zerosim.models.kernels import FusedAttention, Gemm, MemoryPass, kernel_count, linear_backward
from zerosim.scenario import load_scenario
from zerosim.stacks import DEFAULT_STACK, load_stack, parse_stack, stack_names
from zerosim.validation.reference import reference_data

A100 = load_profile("polaris-a100")
LLAMA13 = CATALOG["llama2-13b"]


def test_gemm_counts_flops_and_minimum_traffic():
    g = Gemm(m=2048, n=5120, k=5120)
    assert g.flops == 2 * 2048 * 5120 * 5120
    assert g.nbytes == 2 * (2048 * 5120 + 5120 * 5120 + 2048 * 5120)


def test_linear_backward_is_the_input_and_weight_gradient_gemms():
    dgrad, wgrad = linear_backward(Gemm(m=8, n=16, k=4))
    assert (dgrad.m, dgrad.n, dgrad.k) == (8, 4, 16)  # dY [8x16] x W^T [16x4]
    assert (wgrad.m, wgrad.n, wgrad.k) == (4, 16, 8)  # X^T [4x8] x dY [8x16]
    assert dgrad.flops == wgrad.flops == Gemm(8, 16, 4).flops


def test_wave_quantisation_on_an_a100():
    """256x128 tiles or their halves (128x128, 128x64), whichever fills the 108 SMs best:
    2048x5120 is 8 x 40 = 320 large tiles in three waves (324 slots), and the halves fill
    no better (640 of 648, 1280 of 1296)."""
    assert (A100.sm_count, A100.gemm_tile_m, A100.gemm_tile_n) == (108, 256, 128)
    assert costs.gemm_tiles(A100) == ((256, 128), (128, 128), (128, 64))
    assert costs.wave_quantisation(Gemm(2048, 5120, 5120), A100) == pytest.approx(320 / 324)
    # 108 large tiles fill one wave exactly.
    assert costs.wave_quantisation(Gemm(256, 128 * 108, 64), A100) == 1.0
    # 109 large tiles need a second, nearly empty wave (109/216); as 128x128 tiles they are
    # 218 in three waves (218/324); as 128x64, 436 in five (436/540), the best.
    assert costs.wave_quantisation(Gemm(256, 128 * 109, 64), A100) == pytest.approx(436 / 540)


def test_k_loop_fraction_is_k_over_k_plus_the_tile_overhead():
    k0 = A100.gemm_k_overhead
    assert costs.k_loop_fraction(Gemm(2048, 5120, 5120), A100) == pytest.approx(5120 / (5120 + k0))
    assert costs.k_loop_fraction(Gemm(2048, 2048, 128, batch=64), A100) == pytest.approx(
        128 / (128 + k0))


def test_gemm_time_is_its_roofline_plus_the_kernel_gap():
    g = Gemm(2048, 5120, 5120)
    k_loop = 5120 / (5120 + A100.gemm_k_overhead)
    compute = g.flops / (312e12 * A100.gemm_efficiency * (320 / 324) * k_loop)
    assert costs.kernel_s(g, A100) == pytest.approx(compute + A100.kernel_gap_s, rel=1e-12)
    # a thin projection (1M rows onto 32 columns over a K of 4096): its bytes take longer
    thin = Gemm(1_048_576, 32, 4096)
    memory = thin.nbytes / (1555e9 * A100.gemm_memory_efficiency)
    fill = costs.wave_quantisation(thin, A100)
    assert (thin.flops / (312e12 * A100.gemm_efficiency * fill * 4096 / (4096 + 498))
            < memory)
    assert costs.kernel_s(thin, A100) == pytest.approx(memory + A100.kernel_gap_s, rel=1e-12)


def test_a_lower_sm_clock_slows_what_the_sms_bound_and_not_hbm():
    """At 0.8 of the clock the A100's 2048 x 5120 x 5120 GEMM takes 1/0.8 of its arithmetic
    time, and so do the strided path's and the softmax's bytes; the thin projection, bound by
    its bytes, and a contiguous memory-bound pass do not move."""
    slow = load_profile("polaris-a100", {"gpu": {"sm_clock_fraction": 0.8}})
    assert slow.tensor_flops == pytest.approx(0.8 * 312e12, rel=1e-12)
    g = Gemm(2048, 5120, 5120)
    k_loop = 5120 / (5120 + A100.gemm_k_overhead)
    compute = g.flops / (0.8 * 312e12 * A100.gemm_efficiency * (320 / 324) * k_loop)
    assert costs.kernel_s(g, slow) == pytest.approx(compute + A100.kernel_gap_s, rel=1e-12)
    thin = Gemm(1_048_576, 32, 4096)
    assert costs.kernel_s(thin, slow) == costs.kernel_s(thin, A100)
    norm = MemoryPass(1e9, count=3, flops=1e9)
    assert costs.kernel_s(norm, slow) == costs.kernel_s(norm, A100)
    rotary = MemoryPass(1e9, strided_nbytes=6e8, softmax_nbytes=1e8)
    assert costs.hbm_s(rotary.nbytes, slow, 6e8, 1e8) == pytest.approx(
        3e8 / (1555e9 * A100.memory_efficiency)
        + 6e8 / (1555e9 * A100.strided_memory_efficiency * 0.8)
        + 1e8 / (1555e9 * A100.softmax_memory_efficiency * 0.8), rel=1e-12)
    attention = FusedAttention(flops=4e12, nbytes=1e8, keys=1024, head_dim=128)
    fraction = costs.flash_fraction(attention, A100)
    assert costs.kernel_s(attention, slow) == pytest.approx(
        4e12 / (0.8 * 312e12 * A100.flash_attention_efficiency * fraction)
        + A100.kernel_gap_s, rel=1e-12)


def test_an_sm_clock_above_the_measured_one_is_refused():
    with pytest.raises(ScenarioError, match="sm_clock_fraction"):
        load_profile("polaris-a100", {"gpu": {"sm_clock_fraction": 1.2}})


def test_an_h100_gemm_pays_its_tiles_and_the_kernels_fixed_latency():
    """2048 x 2048 x 256 on 132 SMs: 128 large tiles in one wave (128/132; the halves fill no
    better), a K of 256 against 113 steps of tile cost at PyTorch's 0.810 of peak: 3.98 us
    (its 10.5 MB stream in 3.79 us at 0.826 of 3.35 TB/s), then 4.78 us for the kernel: 8.76
    us, 245 TFLOPS, where XLA measured 219.7."""
    h100 = load_profile("dgx-h100")
    g = Gemm(2048, 2048, 256)
    rate = 989.4e12 * 0.810 * (128 / 132) * (256 / (256 + 113))
    assert g.flops / rate > g.nbytes / (3350e9 * 0.826)
    assert costs.gemm_s(g, h100) == pytest.approx(g.flops / rate + 4.78e-6, rel=1e-12)
    assert g.flops / costs.gemm_s(g, h100) / 1e12 == pytest.approx(245.1, abs=0.05)


def test_a_short_k_product_streams_its_bytes_at_the_gemm_rate():
    """Eager attention's Q K^T on an H100, 40 heads at sequence 2048 and a head dimension of
    64: its 21 MB of operands and 335.5 MB of scores at 0.826 of 3.35 TB/s take 128.8 us,
    longer than its K loop; with the 4.78 us latency 160.7 TFLOPS, and 142.8 with the 16.8 us
    the probe's timing of one call adds (its launch), where PyTorch measured 141.5."""
    h100 = load_profile("h100-jlse")
    g = Gemm(2048, 2048, 64, batch=40)
    streaming = g.nbytes / (3350e9 * 0.826)
    rate = 989.4e12 * 0.810 * costs.wave_quantisation(g, h100) * (64 / (64 + 113))
    assert g.flops / rate < streaming
    assert costs.gemm_s(g, h100) == pytest.approx(streaming + 4.78e-6, rel=1e-12)
    assert g.flops / costs.gemm_s(g, h100) / 1e12 == pytest.approx(160.7, abs=0.05)
    launch_s = reference_data("h100_pytorch_gemms.yaml")["launch_delay_us"]["value"] * 1e-6
    assert g.flops / (costs.gemm_s(g, h100) + launch_s) / 1e12 == pytest.approx(142.8, abs=0.05)


def test_memory_passes_pay_their_bytes_and_one_gap_per_kernel():
    p = MemoryPass(nbytes=1e9, count=7)
    expected = 1e9 / (1555e9 * A100.memory_efficiency) + 7 * A100.kernel_gap_s
    assert costs.kernel_s(p, A100) == pytest.approx(expected, rel=1e-12)



def test_a_fused_attention_pays_its_query_blocks_and_its_softmax():
    """flash-attn's causal kernel at sequence 2048 (each query visits 1024 keys) and head
    dimension 128 on the A100: 0.701 of 312 TFLOPS, times 1024 / (1024 + 246) for each query
    block's fixed cost and 128 / (128 + 16.0) for the softmax's work per score: 0.502 of
    peak, 156.8 TFLOPS; a long loop with a large head tends to the 0.701."""
    f = FusedAttention(flops=1e12, nbytes=1e6, keys=1024, head_dim=128)
    rate = 312e12 * 0.701 * 1024 / (1024 + 246) * 128 / (128 + 16.0)
    assert costs.flash_fraction(f, A100) == pytest.approx(0.7167, abs=1e-4)
    assert costs.kernel_s(f, A100) == pytest.approx(1e12 / rate + A100.kernel_gap_s, rel=1e-12)
    assert rate / 1e12 == pytest.approx(156.8, abs=0.1)
    long = FusedAttention(flops=1e12, nbytes=1e6, keys=1e12, head_dim=1e12)
    assert costs.flash_fraction(long, A100) == pytest.approx(1.0, abs=1e-9)


def test_fused_layout_cuts_a_block_into_fewer_modules_with_the_same_parameters():
    w = Workload(sequence_length=2048)
    separate = build_modules(LLAMA13, w, Recipe())
    fused = build_modules(LLAMA13, w, Recipe(fused_qkv=True, fused_gate_up=True))
    block = [m.name.split(".", 2)[2] for m in fused if m.layer == 0 and m.params]
    assert block == ["input_layernorm", "self_attn.qkv_proj", "self_attn.o_proj",
                     "post_attention_layernorm", "mlp.gate_up_proj", "mlp.down_proj"]
    assert sum(1 for m in separate if m.layer == 0 and m.params) == 9
    assert sum(m.params for m in fused) == sum(m.params for m in separate) == total_params(
        LLAMA13)
    assert sum(m.fwd_flops for m in fused) == sum(m.fwd_flops for m in separate)


def test_eager_attention_is_two_batched_gemms_and_the_stack_s_passes():
    w = Workload(sequence_length=2048, micro_batch_size=2)
    recipe = load_stack("hf-transformers").recipe
    core = next(m for m in build_modules(LLAMA13, w, recipe) if m.kind == "attention")
    gemms = [k for k in core.kernels if isinstance(k, Gemm)]
    assert [(g.m, g.n, g.k, g.batch) for g in gemms] == [(2048, 2048, 128, 80),
                                                         (2048, 128, 2048, 80)]
    scores = 40 * 2048 * 4096  # heads x s x tokens
    passes = [k for k in core.kernels if isinstance(k, MemoryPass)]
    # rotary (Q, then K), Q's and K's copies for matmul, scores, V's copy, context; no GQA
    # repeat
    assert [p.count for p in passes] == [10, 1, 1, 4, 1, 1]
    assert passes[3].nbytes == 21 * scores
    assert len([k for k in core.backward_kernels if isinstance(k, Gemm)]) == 4
    assert kernel_count(core.kernels) == 20


@pytest.mark.parametrize(("model", "forward_copies"), [("llama2-13b", 3), ("llama2-70b", 1)])
def test_hf_eager_attention_copies_q_k_and_v_into_its_products_layout(model, forward_copies):
    """transformers' eager attention hands torch.matmul Q, K and V as views of the
    projections' [b, s, heads, d] output, which it reshapes to [b * heads, s, d]: a strided
    copy (read 2, write 2) of Q, and of K and V unless repeat_kv already copied them
    (grouped-query attention, Llama-2-70B's 8 K/V heads). In the backward each gradient is
    copied again before its projection (view's backward), K's and V's with their own heads,
    grouped or not. Llama-2-13B: 5120 wide, 40 heads; Llama-2-70B: Q 8192, K/V 1024 wide."""
    w = Workload(sequence_length=2048, micro_batch_size=2)
    spec = CATALOG[model]
    core = next(m for m in build_modules(spec, w, load_stack("hf-transformers").recipe)
                if m.kind == "attention")
    t, q, kv = 4096, spec.q_size, spec.kv_hidden_size
    gemms = [i for i, k in enumerate(core.kernels) if isinstance(k, Gemm)]
    before_scores = core.kernels[gemms[0] - 2:gemms[0]]
    before_mix = core.kernels[gemms[1] - 1]
    assert before_scores[0] == MemoryPass(4 * t * q, 1, 0.0, 4 * t * q, 4 * t * q, 4 * t * q,
                                          backward_count=1)
    if forward_copies == 3:
        copy = MemoryPass(4 * t * kv, 1, 0.0, 4 * t * kv, 4 * t * kv, 4 * t * kv,
                          backward_count=1)
    else:
        copy = MemoryPass(0.0, 0, 0.0, 0.0, 4 * t * kv, 4 * t * kv, backward_count=1)
    assert (before_scores[1], before_mix) == (copy, copy)
    copies = (*before_scores, before_mix)
    assert sum(p.count for p in copies) == forward_copies
    assert sum(p.backward(2.0).nbytes for p in copies) == 4 * t * (q + 2 * kv)


def test_hf_softmax_in_bfloat16_casts_apart_and_its_backward_is_read_off_autograd():
    """transformers' eager scores (s = 2048, micro-batch 2, 40 heads): float16 fuses
    softmax's up-cast (4 kernels, 21 B per score forward, 20 B backward), bfloat16 casts
    first and runs softmax on float32 (5 kernels, 29 B forward, 28 B backward); the mask
    add's strided bytes are forward only. Of them, ATen's softmax kernels move 6 and 10 B
    (float16: the fused up-cast's read of 2 and write of 4; backward 4 + 4 read, 2 written),
    8 and 12 B (bfloat16: float32 in and out), at the GPU's softmax rate."""
    recipe = load_stack("hf-transformers").recipe
    scores = 40 * 2048 * 4096
    for bfloat16, count, forward, backward, softmax_bytes in ((False, 4, 21, 20, (6, 10)),
                                                               (True, 5, 29, 28, (8, 12))):
        w = Workload(sequence_length=2048, micro_batch_size=2, bfloat16=bfloat16)
        core = next(m for m in build_modules(LLAMA13, w, recipe) if m.kind == "attention")
        softmax = [k for k in core.kernels if isinstance(k, MemoryPass)][3]
        assert (softmax.count, softmax.nbytes, softmax.strided_nbytes,
                softmax.softmax_nbytes) == (count, forward * scores, 5 * scores,
                                            softmax_bytes[0] * scores)
        assert softmax.backward(2.0) == MemoryPass(
            backward * scores, count, softmax.flops * backward / forward, 0.0,
            softmax_nbytes=softmax_bytes[1] * scores)


def test_a_bf16_variant_is_checked_like_its_entry():
    tree = toy_stack()
    tree["kernels"]["scores"] = {"kernels": 1, "bytes_per_element": 4, "source": "x",
                                 "bf16": {"kernels": 2, "bytes_per_element": -1, "source": "y"}}
    with pytest.raises(ScenarioError, match=r"kernels\.scores\.bf16\.bytes_per_element: "
                                            r"expected a number in \[0, 1000\)"):
        parse_stack(tree, "s.yaml")
    tree["kernels"]["scores"]["bf16"] = {"kernels": 2, "bytes_per_element": 6, "source": "y",
                                         "bf16": {}}
    with pytest.raises(ScenarioError, match=r"kernels\.scores\.bf16: expected \{kernels"):
        parse_stack(tree, "s.yaml")


def test_megatron_expands_k_and_v_before_the_rotary_embedding():
    """Llama-2-70B (64 query heads, 8 K/V heads, head 128) at micro-batch 1, s = 2048, on
    Megatron-DeepSpeed as the Deep Optimizer States runs ran it (1df5712): Q and the fused K
    and V are two projections (two modules), K and V are expanded to every head (2 B written
    per repeated element and 2 B read per element of K or V: 2.25 B per repeated element at 8
    groups, strided; its backward sums the gradient over the repeats, as many bytes, over
    contiguous memory), then the rotary embedding acts on Q and the expanded K (24 B per
    element, 14 of them strided, 2 x 8192 per token, 20 kernels; its backward, read off
    autograd, 26 B, 20 strided, in 14 kernels), before the score product; the causal softmax
    reads half its scores and writes all (3 B each), and its backward moves 4 B per score,
    not twice the forward's. Backward only: the K/V split's concatenation (4 B per element of
    the K/V projection's output, 2 x 1024 per token) and the score product's scaled operand
    gradients (4 B per element of Q and the expanded K, 2 kernels); the context copy's
    backward launches nothing. With flash attention the same come first and the kernel reads
    the expanded K and V. HF rotates K's own 8 heads."""
    spec, t = CATALOG["llama2-70b"], 2048
    q, scores = 8192, 64 * 2048 * 2048
    recipe = load_stack("megatron-deepspeed").recipe
    modules = [m for m in build_modules(spec, Workload(sequence_length=2048), recipe)
               if m.layer == 0]
    assert [m.name.rsplit(".", 1)[1] for m in modules if m.kind == "linear"][:2] == [
        "q_proj", "kv_proj"]
    core = next(m for m in modules if m.kind == "attention")
    split, repeat, rotary, product, operands, softmax, _mix, context = core.kernels
    assert split == MemoryPass(0.0, 0, 0.0, 0.0, 4 * t * 2 * 1024, backward_count=1)
    assert split.backward(2.0) == MemoryPass(4 * t * 2 * 1024, 1)
    assert (repeat.nbytes, repeat.strided_nbytes) == (2.25 * 2 * t * q, 2.25 * 2 * t * q)
    assert repeat.backward(2.0) == MemoryPass(2.25 * 2 * t * q, 2, 0.0, 0.0)
    assert (rotary.nbytes, rotary.strided_nbytes, rotary.count) == (
        24 * t * 2 * q, 14 * t * 2 * q, 20)
    assert isinstance(product, Gemm)
    assert operands.backward(2.0) == MemoryPass(4 * t * 2 * q, 2)
    assert (softmax.nbytes, softmax.backward(2.0).nbytes) == (3 * scores, 4 * scores)
    assert rotary.backward(2.0) == MemoryPass(26 * t * 2 * q, 14, 0.0, 20 * t * 2 * q)
    assert context.backward(2.0) == MemoryPass(0.0, 0)
    assert kernel_count(core.kernels) == 2 + 20 + 1 + 1 + 1 + 1
    assert kernel_count(core.backward_kernels) == 1 + 2 + 14 + 2 + 2 + 1 + 2
    flash = next(m for m in build_modules(spec, Workload(sequence_length=2048,
                                                         attention="flash"), recipe)
                 if m.kind == "attention")
    assert flash.kernels[:3] == core.kernels[:3]
    assert flash.kernels[3].nbytes == 2 * t * 4 * q
    hf = next(m for m in build_modules(spec, Workload(sequence_length=2048),
                                       load_stack("hf-transformers").recipe)
              if m.kind == "attention")
    assert hf.kernels[0].nbytes == 20 * t * (q + 1024)
    assert hf.kernels[0].backward(2.0) == MemoryPass(30 * t * (q + 1024), 18, 0.0,
                                                     14 * t * (q + 1024))


def _attention(stack: str, spec_name: str, attention: str, micro_batch: int):
    return next(m for m in build_modules(
        CATALOG[spec_name], Workload(sequence_length=2048, micro_batch_size=micro_batch,
                                     attention=attention), load_stack(stack).recipe)
        if m.kind == "attention")


def test_megatron_flash_attention_copies_its_layout_only_at_a_micro_batch_above_one():
    """Megatron-DeepSpeed's flash path (1df5712, --use-flash-attn-v2) on Llama-2-70B (64
    heads, 8 K/V heads): K and V expanded, the rotary embedding, then Q, K and V copied from
    [s, b] into [b, s] order and the output back, copies that are views at micro-batch 1.
    At micro-batch 4 (t = 8192 tokens): three copies of 4 B per element of Q, K and V at
    every head (3 x 8192 per token), strided, whose backward passes the gradient through
    (no kernel), and the output's copy (4 B per element of Q) with one copy back (4 B); the
    kernel's own output, saved for its backward, is then held apart from the copy the output
    projection saves."""
    q = 8192
    one = _attention("megatron-deepspeed", "llama2-70b", "flash", 1)
    assert [type(k) for k in one.kernels] == [MemoryPass] * 3 + [FusedAttention]
    four = _attention("megatron-deepspeed", "llama2-70b", "flash", 4)
    t = 4 * 2048
    _split, _repeat, _rotary, inputs, kernel, context = four.kernels
    assert (inputs.nbytes, inputs.strided_nbytes, inputs.count) == (4 * t * 3 * q,
                                                                     4 * t * 3 * q, 3)
    assert inputs.backward(2.0) == MemoryPass(0.0, 0, 0.0, 0.0)
    assert four.saved_bytes - one.saved_bytes * 4 == 2 * t * q  # the kernel's output apart
    assert kernel.nbytes == 2 * t * 4 * q
    assert (context.nbytes, context.strided_nbytes, context.count) == (4 * t * q, 4 * t * q, 1)
    assert context.backward(2.0) == MemoryPass(4 * t * q, 1, 0.0, 4 * t * q)
    eager = _attention("megatron-deepspeed", "llama2-70b", "eager", 1)
    assert eager.kernels[-1] == MemoryPass(4 * 2048 * q, 1, 0.0, 4 * 2048 * q, 0.0,
                                           backward_count=0)


@pytest.mark.parametrize(("attention", "kinds", "kv_width", "output"), [
    ("eager", [MemoryPass, MemoryPass, MemoryPass, MemoryPass, Gemm, MemoryPass, MemoryPass,
               Gemm, MemoryPass], 8192, 0),
    ("sdpa", [MemoryPass, MemoryPass, FusedAttention, MemoryPass], 8192, 2 * 2048 * 8192),
    ("flash", [MemoryPass, FusedAttention], 1024, 0),
])
def test_hf_attention_paths_differ_in_what_they_copy(attention, kinds, kv_width, output):
    """transformers on Llama-2-70B (8 K/V heads of 128): the rotary embedding on Q and K's
    own heads; eager attention and LlamaSdpaAttention expand K and V (repeat_kv, 2 kernels)
    and copy the output out of [b, heads, s, d], and eager attention copies Q, K and V into
    its products' layout (K's and V's only in the backward, repeat_kv having copied them);
    LlamaFlashAttention2 does neither, and its kernel reads and saves K and V with their own
    8 heads: 2 B x 2048 x (8192 + 2 x 1024) saved for Q, K and V, against 2 x 3 x 8192 for
    the others (besides the probabilities eager attention saves, and the fused kernels' fp32
    log-sum-exp per head and token). SDPA also keeps its own output for its backward, apart
    from the copy o_proj saves; flash-attn's output is what o_proj reads."""
    core = _attention("hf-transformers", "llama2-70b", attention, 1)
    assert [type(k) for k in core.kernels] == kinds
    q, t = 8192, 2048
    if attention != "eager":
        kernel = next(k for k in core.kernels if isinstance(k, FusedAttention))
        assert kernel.nbytes == 2 * t * (2 * q + 2 * kv_width)
    per_score = load_stack("hf-transformers").recipe.score_memory.saved
    probabilities = per_score * 64 * 2048 * t if attention == "eager" else 4 * 64 * t
    assert core.saved_bytes == 2 * t * (q + 2 * kv_width) + probabilities + output


def test_a_flash_variant_is_checked_like_its_entry_and_may_hold_a_bf16_one():
    tree = toy_stack()
    tree["kernels"]["context"] = {
        "kernels": 1, "bytes_per_element": 4, "source": "x",
        "flash": {"kernels": 1, "bytes_per_element": 4, "transposes_batch": "yes",
                  "source": "y"}}
    with pytest.raises(ScenarioError, match=r"kernels\.context\.flash\.transposes_batch: "
                                            r"expected true or false, got 'yes'"):
        parse_stack(tree, "s.yaml")
    flash = {"kernels": 1, "bytes_per_element": 4, "transposes_batch": True, "source": "y",
             "bf16": {"kernels": 2, "bytes_per_element": 6, "source": "z"}}
    tree["kernels"]["context"]["flash"] = flash
    context = parse_stack(tree, "s.yaml").recipe.context
    assert (context.flash.transposes_batch, context.flash.bf16.kernels) == (True, 2)
    flash["bf16"]["flash"] = {}
    with pytest.raises(ScenarioError, match=r"kernels\.context\.flash\.bf16: expected "):
        parse_stack(tree, "s.yaml")


@pytest.mark.parametrize(("sequence", "micro_batch", "heads", "fused"), [
    (4096, 1, 40, True), (8192, 1, 40, False), (2048, 1, 42, False), (2048, 2, 42, True),
    (16, 4, 40, False), (2050, 2, 40, False)])
def test_megatron_s_fused_softmax_serves_its_shapes_and_pytorch_s_the_rest(sequence,
                                                                         micro_batch, heads,
                                                                         fused):
    """FusedScaleMaskSoftmax.is_kernel_available (1df5712): 16 < keys <= 4096, keys and
    micro-batch x heads multiples of 4. Elsewhere masked_fill_ and torch's softmax: 9 B per
    score in 2 kernels (5 strided, the broadcast mask), 13 B backward, and 4 B per score
    held in the backward besides the saved probabilities, where the fused kernel works in
    place (2)."""
    from dataclasses import replace as with_fields

    spec = with_fields(LLAMA13, num_attention_heads=heads, num_key_value_heads=heads,
                       hidden_size=128 * heads, max_position_embeddings=sequence)
    w = Workload(sequence_length=sequence, micro_batch_size=micro_batch)
    core = next(m for m in build_modules(spec, w, load_stack("megatron-deepspeed").recipe)
                if m.kind == "attention")
    scores = heads * sequence * sequence * micro_batch
    _split, _rotary, _product, _operands, softmax = core.kernels[:5]
    if fused:
        assert (softmax.nbytes, softmax.count, softmax.backward(2.0).nbytes) == (
            3 * scores, 1, 4 * scores)
        assert core.backward_transient_bytes == 2 * scores
    else:
        assert softmax == MemoryPass(9 * scores, 2, 0.0, 5 * scores, 13 * scores, 5 * scores,
                                     4 * scores, 8 * scores)
        assert core.backward_transient_bytes == 4 * scores


@pytest.mark.parametrize(("change", "expected"), [
    ({"modules": {"fused_softmax": {"min_keys": 17, "max_keys": 4096, "multiple_of": 4,
                                    "source": "x"}}},
     r"kernels\.scores\.unfused: expected given with modules\.fused_softmax, got 'absent'"),
    ({"kernels": {"scores": {"kernels": 1, "bytes_per_element": 3, "source": "x",
                             "unfused": {"kernels": 2, "bytes_per_element": 9,
                                         "source": "y"}}}},
     r"modules\.fused_softmax: expected given with kernels\.scores\.unfused"),
    ({"attention_memory": {"unfused": {"backward_workspace": {
        "value": 4, "basis": "spec", "source": "x"}}}},
     r"modules\.fused_softmax: expected given with attention_memory\.unfused"),
    ({"modules": {"fused_softmax": {"min_keys": 17, "max_keys": 16, "multiple_of": 4,
                                    "source": "x"}}},
     r"modules\.fused_softmax\.max_keys: expected at least min_keys = 17, got 16"),
    ({"modules": {"fused_softmax": {"min_keys": 17, "max_keys": 4096, "source": "x"}}},
     r"modules\.fused_softmax: expected \{min_keys"),
])
def test_a_fused_softmax_and_its_unfused_path_come_together(change, expected):
    tree = toy_stack()
    for section, entries in change.items():
        tree.setdefault(section, {}).update(entries)
    with pytest.raises(ScenarioError, match=expected):
        parse_stack(tree, "s.yaml")


def test_the_later_megatron_fuses_grouped_qkv_and_copies_q_out():
    """Megatron-DeepSpeed's dist_nvme_opt (the MLP-Offload runs, their data file's
    stack_overrides): one fused QKV projection, Q copied out of it (4 B per element of Q,
    strided), the rotary embedding's 5 kernels a call on cached tables (20 B, 14 strided),
    and a backward without the slice's and the pass-through cat's (20 B in 5 kernels, all
    strided: eager attention's gradient arrives permuted); the Q copy's backward launches
    nothing, the split's concatenates the gradients of the whole fused output (4 B per
    element of Q, K and V: 8192 + 2 x 1024 per token)."""
    from zerosim.stacks import apply_stack_overrides, builtin_stack_tree
    from zerosim.validation.mlp_offload import load_data

    tree = apply_stack_overrides(builtin_stack_tree("megatron-deepspeed"),
                                 load_data()["stack_overrides"], source="t", key_path="o")
    recipe = parse_stack(tree, "t").recipe
    spec, t, q = CATALOG["llama2-70b"], 2048, 8192
    modules = [m for m in build_modules(spec, Workload(sequence_length=2048), recipe)
               if m.layer == 0]
    assert next(m.name.rsplit(".", 1)[1] for m in modules if m.kind == "linear") == "qkv_proj"
    fused, split, _, rotary = next(m for m in modules if m.kind == "attention").kernels[:4]
    assert fused.backward(2.0) == MemoryPass(4 * t * (q + 2 * 1024), 1)
    assert (split.nbytes, split.strided_nbytes, split.count) == (4 * t * q, 4 * t * q, 1)
    assert split.backward(2.0) == MemoryPass(0.0, 0)
    assert (rotary.nbytes, rotary.count) == (20 * t * 2 * q, 10)
    assert rotary.backward(2.0) == MemoryPass(20 * t * 2 * q, 10, 0.0, 20 * t * 2 * q)
    # Llama-2-13B has no grouped heads: Q is a view, the rotary embedding comes after the
    # fused projection's split
    mha = next(m for m in build_modules(LLAMA13, Workload(sequence_length=2048), recipe)
               if m.kind == "attention")
    assert mha.kernels[0].backward(2.0) == MemoryPass(4 * t * 3 * 5120, 1)
    assert (mha.kernels[1].nbytes, mha.kernels[1].count) == (20 * t * 2 * 5120, 10)


@pytest.mark.parametrize(("stack", "bfloat16", "saved", "forward", "backward", "buffer"), [
    # Megatron: the fused softmax's 16-bit output saved; the raw scores a new tensor of
    # baddbmm's (out of place: the global buffer, held all run, is only its ignored input)
    # while the forward runs; the probabilities' gradient in backward, the softmax backward
    # in place.
    ("megatron-deepspeed", False, 2, 2, 2, 2),
    ("megatron-deepspeed", True, 2, 2, 2, 2),
    # HF eager in float16: fp32 softmax output + its 16-bit copy saved; the masked scores
    # while the fused up-casting softmax runs; an fp32 gradient in, a float16 one out.
    ("hf-transformers", False, 6, 2, 4, 0),
    # in bfloat16: the fp32 up-cast of the masked scores is a tensor of its own; fp32
    # gradients in and out of the float32 softmax's backward.
    ("hf-transformers", True, 6, 6, 6, 0),
])
def test_each_stack_holds_its_own_bytes_per_attention_score(stack, bfloat16, saved, forward,
                                                            backward, buffer):
    w = Workload(sequence_length=2048, micro_batch_size=2, bfloat16=bfloat16)
    core = next(m for m in build_modules(LLAMA13, w, load_stack(stack).recipe)
                if m.kind == "attention")
    scores, tokens = 40 * 2048 * 4096, 4096
    qkv = 2 * tokens * 3 * 5120  # Q, K and V saved in 16 bits
    assert (core.saved_bytes, core.transient_bytes, core.backward_transient_bytes,
            core.buffer_bytes) == (qkv + saved * scores, forward * scores, backward * scores,
                                   buffer * scores)


@pytest.mark.parametrize(("stack", "saved", "transient", "backward"), [
    # Megatron: the fp32 softmax saved; the 16-bit logits and the fp32 cast beside it while
    # the loss runs; its backward works in place, then casts the gradient to 16 bits.
    ("megatron-deepspeed", 4, 6, 2),
    # HF: the fp32 log-softmax saved; the fp32 logits and their shifted copy beside it; two
    # fp32 gradients at a time in its backward.
    ("hf-transformers", 4, 8, 8),
    # A stack without `loss_memory` (the toy's): the 16-bit logits and their fp32 copy saved.
    (None, 6, 0, 0),
])
def test_each_stack_holds_its_own_bytes_per_logit(stack, saved, transient, backward):
    """And whatever the stack, the LM head's backward holds the 16-bit gradient of the logits
    (2 B each) besides what its own backward needs."""
    w = Workload(sequence_length=2048, micro_batch_size=2)
    recipe = load_stack(stack).recipe if stack else parse_stack(toy_stack(), "s.yaml").recipe
    modules = build_modules(LLAMA13, w, recipe)
    loss = next(m for m in modules if m.kind == "loss")
    head = next(m for m in modules if m.name == "lm_head")
    logits = 32000 * 4096
    assert (loss.saved_bytes, loss.transient_bytes, loss.backward_transient_bytes) == (
        saved * logits, transient * logits, backward * logits)
    assert head.backward_transient_bytes == 2 * logits


@pytest.mark.parametrize(("stack", "norm", "gated"), [
    # Megatron: apex's fused RMSNorm keeps its 16-bit input; swiglu keeps the fused
    # projection's output whole (views of it, 2 + 2) and silu's own output (2).
    ("megatron-deepspeed", 2, 6),
    # HF: LlamaRMSNorm keeps its fp32 up-cast (4) and the normed result in 16 bits (2);
    # LlamaMLP keeps the gate's and the up projection's outputs and SiLU's (2 + 2 + 2).
    ("hf-transformers", 6, 6),
    # A stack without `activation_memory` (the toy's): a fused norm, the two inputs alone.
    (None, 2, 4),
])
def test_each_stack_holds_its_own_bytes_per_norm_and_activation_element(stack, norm, gated):
    """Both keep an fp32 statistic per row of a norm (4 B a token)."""
    w = Workload(sequence_length=2048, micro_batch_size=2)
    recipe = load_stack(stack).recipe if stack else parse_stack(toy_stack(), "s.yaml").recipe
    modules = build_modules(LLAMA13, w, recipe)
    first_norm = next(m for m in modules if m.kind == "norm")
    activation = next(m for m in modules if m.kind == "activation")
    tokens = 4096
    assert first_norm.saved_bytes == norm * 5120 * tokens + 4 * tokens
    assert activation.saved_bytes == gated * 13824 * tokens


def test_bad_activation_memory_is_a_clear_error():
    tree = toy_stack()
    tree["activation_memory"] = {"mlp_saved": {"value": 4, "basis": "spec", "source": "x"}}
    with pytest.raises(ScenarioError, match=r"activation_memory\.mlp_saved: expected one of n"):
        parse_stack(tree, "s.yaml")


def test_bad_loss_memory_is_a_clear_error():
    tree = toy_stack()
    tree["loss_memory"] = {"held": {"value": 4, "basis": "spec", "source": "x"}}
    with pytest.raises(ScenarioError, match=r"loss_memory\.held: expected one of saved, trans"):
        parse_stack(tree, "s.yaml")
    tree["loss_memory"] = {"saved": {"value": -4, "basis": "spec", "source": "x"}}
    with pytest.raises(ScenarioError, match=r"loss_memory\.saved\.value: expected a finite"):
        parse_stack(tree, "s.yaml")


def test_the_run_holds_the_framework_buffer_once_for_the_whole_iteration(toy):
    """Every layer reuses Megatron's scores buffer: the run holds one layer's worth (the toy:
    4 heads x 8 x 8 scores in 16 bits) from start to end."""
    result = toy.run({"runtime": {"framework": "megatron-deepspeed"}})
    buffers = result.memory[result.memory.category == "framework buffers"]
    assert list(buffers.bytes) == [2 * 4 * 8 * 8, 0]
    assert list(buffers.t_s)[-1] == result.summary["iteration_s"]


def test_stacks_ship_and_the_default_is_the_study_s():
    assert {"megatron-deepspeed", "hf-transformers"} <= set(stack_names())
    assert DEFAULT_STACK == "megatron-deepspeed"
    stack = load_stack(DEFAULT_STACK)
    assert stack.recipe.fused_qkv and stack.recipe.fused_gate_up
    assert stack.recipe.external_output_weight
    assert not load_stack("hf-transformers").recipe.external_output_weight
    assert not parse_stack(toy_stack(), "s.yaml").recipe.external_output_weight
    assert stack.on_core(1e-3, 3.0e9) == pytest.approx(1e-3)
    assert stack.on_core(1e-3, 1.5e9) == pytest.approx(2e-3)


BACKWARD_TOO_STRIDED = {"kernels": 1, "bytes_per_element": 3, "backward_bytes_per_element": 4,
                        "backward_strided_bytes_per_element": 5, "source": "x"}
STRIDED_WITHOUT_BACKWARD_STRIDED = {"kernels": 1, "bytes_per_element": 3,
                                    "strided_bytes_per_element": 1,
                                    "backward_bytes_per_element": 4, "source": "x"}
BACKWARD_STRIDED_ALONE = {"kernels": 1, "bytes_per_element": 3,
                          "backward_strided_bytes_per_element": 0, "source": "x"}
BACKWARD_KERNELS_ALONE = {"kernels": 1, "bytes_per_element": 3, "backward_kernels": 2,
                          "source": "x"}
NO_BACKWARD_KERNEL_FOR_BYTES = {"kernels": 1, "bytes_per_element": 3,
                                "backward_bytes_per_element": 4, "backward_kernels": 0,
                                "source": "x"}


@pytest.mark.parametrize(("section", "key", "value", "expected"), [
    ("modules", "qkv", "merged", r"modules\.qkv: expected one of fused, separate"),
    ("modules", "output_weight", "tied", r"modules\.output_weight: expected one of module, ext"),
    ("modules", "lm_head", "external", r"modules\.lm_head: expected qkv, gate_up, grouped_q"),
    ("modules", "grouped_qkv", {"value": "kv_q", "source": "x"},
     r"modules\.grouped_qkv\.value: expected as_qkv or fused or q_kv or separate, got 'kv_q'"),
    ("modules", "kv_repeat", "before_rotary",
     r"modules\.kv_repeat: expected \{value: in_attention"),
    ("modules", "experts", {"value": "grouped", "source": "x"},
     r"modules\.experts\.value: expected per_expert or fused, got 'grouped'"),
    ("modules", "moe_block", {"value": "glued", "source": "x"},
     r"modules\.moe_block\.value: expected hooked or leaf, got 'glued'"),
    ("kernels", "scores", BACKWARD_TOO_STRIDED,
     r"kernels\.scores\.backward_strided_bytes_per_element: expected a number in \[0, "
     r"backward_bytes_per_element = 4\], got 5"),
    ("kernels", "scores", STRIDED_WITHOUT_BACKWARD_STRIDED,
     r"kernels\.scores\.backward_strided_bytes_per_element: expected given, as the forward "
     r"moves strided"),
    ("kernels", "scores", BACKWARD_STRIDED_ALONE,
     r"kernels\.scores\.backward_bytes_per_element: expected given with backward_strided"),
    ("kernels", "scores", BACKWARD_KERNELS_ALONE,
     r"kernels\.scores\.backward_bytes_per_element: expected given with backward_kernels"),
    ("kernels", "scores", NO_BACKWARD_KERNEL_FOR_BYTES,
     r"kernels\.scores\.backward_kernels: expected an integer >= 1, as "
     r"backward_bytes_per_element is 4, got 0"),
    ("kernels", "scores", {"kernels": 0, "bytes_per_element": 0,
                           "backward_bytes_per_element": 4, "source": "x"},
     r"kernels\.scores\.backward_kernels: expected an integer >= 1, as "
     r"backward_bytes_per_element is 4, got 'absent'"),
    ("kernels", "scores", {**NO_BACKWARD_KERNEL_FOR_BYTES, "backward_kernels": 1.5},
     r"kernels\.scores\.backward_kernels: expected an integer >= 0, got 1\.5"),
    ("kernels", "softmax", {"kernels": 1, "bytes_per_element": 4, "source": "x"},
     r"kernels\.softmax"),
    ("attention_memory", "scratch", {"value": 2, "basis": "assumed", "source": "x"},
     r"attention_memory\.scratch: expected one of saved"),
    ("attention_memory", "bf16", {"scratch": {"value": 2, "basis": "assumed", "source": "x"}},
     r"attention_memory\.bf16\.scratch: expected one of saved"),
    ("host", "fetch_hook_us", {"value": float("inf"), "basis": "fitted", "source": "x"},
     r"host\.fetch_hook_us\.value: expected a finite"),
])
def test_bad_stacks_are_clear_errors(section, key, value, expected):
    tree = toy_stack()
    tree.setdefault(section, {})[key] = value
    with pytest.raises(ScenarioError, match=expected):
        parse_stack(tree, "s.yaml")


def test_syncs_before_the_mlp_mark_each_block_s_first_mlp_module():
    """Megatron-DeepSpeed's two scalars made on the GPU between attention and MLP sit
    before `dense_h_to_4h` (the fused gate/up projection) of every block; a stack that names
    none (Hugging Face's Llama makes none) has none."""
    w = Workload(sequence_length=2048)
    stack = load_stack(DEFAULT_STACK)
    assert stack.recipe.syncs_before_mlp == 2
    synced = [m.name for m in build_modules(LLAMA13, w, stack.recipe) if m.host_syncs]
    assert synced == [f"layers.{i}.mlp.gate_up_proj" for i in range(LLAMA13.num_hidden_layers)]
    assert {m.host_syncs for m in build_modules(LLAMA13, w, stack.recipe)} == {0, 2}
    assert load_stack("hf-transformers").recipe.syncs_before_mlp == 0
    assert parse_stack(toy_stack(), "s.yaml").recipe.syncs_before_mlp == 0
    for bad, expected in (({"count": -1, "source": "x"}, r"syncs_before_mlp\.count: expected an"),
                          ({"count": 2}, r"syncs_before_mlp: expected \{count: N, source")):
        tree = toy_stack()
        tree["modules"]["syncs_before_mlp"] = bad
        with pytest.raises(ScenarioError, match=expected):
            parse_stack(tree, "s.yaml")


def test_the_heap_reuse_size_is_read_in_mib_and_absent_means_every_temporary_is_fresh():
    assert load_stack(DEFAULT_STACK).heap_reuse_bytes == 32 * 2**20
    assert load_stack("hf-transformers").heap_reuse_bytes == 32 * 2**20
    assert parse_stack(toy_stack(), "s.yaml").heap_reuse_bytes == 0.0
    tree = toy_stack()
    tree["allocator"] = {"heap_reuse_MiB": {"value": 0.5, "basis": "spec", "source": "x"}}
    stack = parse_stack(tree, "s.yaml")
    assert stack.heap_reuse_bytes == 2**19
    assert stack.provenance["allocator.heap_reuse_MiB"].basis == "spec"
    tree["allocator"]["arena_MiB"] = tree["allocator"]["heap_reuse_MiB"]
    with pytest.raises(ScenarioError, match=r"allocator\.arena_MiB: expected heap_reuse_MiB"):
        parse_stack(tree, "s.yaml")
    tree = toy_stack()
    tree["allocator"] = {"heap_reuse_MiB": {"value": -1, "basis": "spec", "source": "x"}}
    with pytest.raises(ScenarioError, match=r"allocator\.heap_reuse_MiB\.value: expected a fin"):
        parse_stack(tree, "s.yaml")


@pytest.mark.parametrize(("attribute", "section", "refused"), [
    # Megatron-DeepSpeed hands ZeRO-3 one data-parallel group for both gathers and reductions
    # (one NCCL stream); the HF stack's are two (the world group and DeepSpeed's clone of
    # it); absent means two.
    ("one_process_group", "process_groups", (
        ({"params_and_gradients": {"value": "both", "source": "x"}},
         r"params_and_gradients\.value: expected separate or same, got 'both'"),
        ({"params_and_gradients": "same"},
         r"process_groups\.params_and_gradients: expected \{value: separate or same"),
        ({"grads": {"value": "same", "source": "x"}},
         r"process_groups: expected \{params_and_gradients: "))),
    # Megatron-DeepSpeed hands its norms and biases over as a second parameter group; the HF
    # Trainer with a ds_config optimizer one group; absent means one.
    ("vector_param_group", "optimizer", (
        ({"param_groups": {"value": "two", "source": "x"}},
         r"param_groups\.value: expected one or weight_decay_split, got 'two'"),
        ({"groups": {"value": "one", "source": "x"}},
         r"optimizer: expected \{param_groups: \{value: one or weight_decay_split"))),
])
def test_the_stacks_one_choice_sections(attribute, section, refused):
    assert getattr(load_stack(DEFAULT_STACK), attribute)
    assert not getattr(load_stack("hf-transformers"), attribute)
    assert not getattr(parse_stack(toy_stack(), "s.yaml"), attribute)
    for bad, expected in refused:
        tree = toy_stack()
        tree[section] = bad
        with pytest.raises(ScenarioError, match=expected):
            parse_stack(tree, "s.yaml")


def test_stack_values_are_overridden_like_profile_values():
    scenario = load_scenario("scenarios/llama13b_dp1.yaml", ["stack.host.fetch_hook_us=250"])
    assert scenario.stack.fetch_hook_s == pytest.approx(250e-6)
    assert scenario.stack.provenance["host.fetch_hook_us"].basis == "override"
    hf = load_scenario("scenarios/llama13b_dp1.yaml", ["runtime.framework=hf-transformers"])
    assert not hf.stack.recipe.fused_qkv
    with pytest.raises(ScenarioError, match=r"runtime\.framework"):
        load_scenario("scenarios/llama13b_dp1.yaml", ["runtime.framework=pytorch-lightning"])


def test_nested_stack_overrides_patch_the_keys_they_name():
    """`runtime.framework.overrides` written nested, as in a scenario file, patches the keys it
    names, like a profile's overrides: a section key by key, a kernel entry field by field, an
    entry with its own `source` whole; without `stack:` or `file:` it patches the default
    stack, and `--set runtime.framework.overrides.<key>` is `--set stack.<key>`."""
    base = load_stack(DEFAULT_STACK)
    nested = load_scenario("scenarios/llama13b_dp1.yaml", [
        "runtime.framework={overrides: {host: {fetch_hook_us: 250}, kernels: {rotary: "
        "{kernels: 10}}, allocator: {heap_reuse_MiB: {value: 8, basis: measured, "
        "source: a probe}}}}"]).stack
    assert nested.name == DEFAULT_STACK
    assert nested.fetch_hook_s == pytest.approx(250e-6)
    assert nested.collective_launch_s == base.collective_launch_s
    assert nested.recipe.rotary == replace(base.recipe.rotary, kernels=10)
    assert nested.heap_reuse_bytes == 8 * 2**20
    assert nested.provenance["allocator.heap_reuse_MiB"].basis == "measured"
    routed = load_scenario("scenarios/llama13b_dp1.yaml",
                           ["runtime.framework.overrides.host.fetch_hook_us=250"]).stack
    assert routed.fetch_hook_s == pytest.approx(250e-6)
    assert routed.provenance["host.fetch_hook_us"].basis == "override"
    whole = load_scenario("scenarios/llama13b_dp1.yaml", [
        "runtime.framework={stack: megatron-deepspeed, overrides: {kernels: {query_split: "
        "{kernels: 1, bytes_per_element: 4, source: copied out}}}}"]).stack
    assert (whole.recipe.query_split.kernels, whole.recipe.query_split.bytes_per_element) == (1, 4)
    with pytest.raises(ScenarioError, match=r"runtime\.framework\.overrides\.host\.no_such_us"):
        load_scenario("scenarios/llama13b_dp1.yaml",
                      ["runtime.framework={overrides: {host: {no_such_us: 1}}}"])
    with pytest.raises(ScenarioError, match=r"runtime\.framework: expected at most one of stack"):
        load_scenario("scenarios/llama13b_dp1.yaml",
                      ["runtime.framework={stack: megatron-deepspeed, file: x.yaml}"])


# The toy (conftest.py) at DP=1: 21 modules own parameters (embed, 9 per layer x 2, the final
# norm, lm_head) and the forward launches 28 kernels (12 per layer: norms, four projections,
# two attention GEMMs, gate/up/down, the activation; plus embed, norm, lm_head and loss).
TOY_PARAM_MODULES = 21
TOY_FORWARD_KERNELS = 28
TOY_LOSS_PS = 20480


def _forward_end(toy, host: dict) -> float:
    stack = toy_stack()
    for key, value in host.items():
        stack["host"][key]["value"] = value
    result = toy.run({"runtime": {"framework": stack}})
    phases = result.phases
    return float(phases[phases.phase == "forward"].end_s.max())


def test_a_host_bound_forward_takes_the_host_path(toy):
    """With 1 ms of ZeRO-3 hooks per module (the GPU needs ~1.7 us in all), the forward ends
    when the host has run every hook, then the GPU runs what was queued after the last one:
    lm_head (262144 ps) and the loss (20480 ps)."""
    end = _forward_end(toy, {"fetch_hook_us": 1000})
    assert end == pytest.approx(TOY_PARAM_MODULES * 1e-3 + (262144 + TOY_LOSS_PS) * 1e-12,
                                rel=1e-9)


def test_kernel_launches_are_paid_by_the_host_before_the_gpu_runs_them(toy):
    """1 us per launch: the host issues the loss's kernel at 28 us, the GPU runs it at once."""
    end = _forward_end(toy, {"kernel_launch_us": 1})
    assert end == pytest.approx(TOY_FORWARD_KERNELS * 1e-6 + TOY_LOSS_PS * 1e-12, rel=1e-9)


def test_host_times_scale_with_the_cpu_clock(toy):
    """The toy stack quotes host times at 3 GHz; a 1.5 GHz core takes twice as long."""
    stack = toy_stack()
    stack["host"]["fetch_hook_us"]["value"] = 1000
    profile = toy.profile()
    profile["host"]["cpu_boost_GHz"]["value"] = 1.5
    result = toy.run({"runtime": {"framework": stack}, "hardware": profile})
    end = float(result.phases[result.phases.phase == "forward"].end_s.max())
    assert end == pytest.approx(2 * TOY_PARAM_MODULES * 1e-3 + (262144 + TOY_LOSS_PS) * 1e-12,
                                rel=1e-9)


AZURE = reference_data("azure_nd_gpu_benchmarks.yaml")


@pytest.mark.parametrize("row", AZURE["a100_sxm4_80gb"]["gemm_fp16"],
                         ids=lambda r: f"{r['m']}x{r['n']}x{r['k']}")
def test_gemm_model_against_published_cublaslt_on_an_a100(row):
    """The GEMM roofline (best-filling tile, per-tile K overhead) with the A100 profiles'
    values, at the sustained clock of Azure's runs (0.940 of a burst's), against the published
    cuBLASLt table of an A100-SXM4-80GB (Azure ND A100 v4): every shape within 15%, the large
    ones (every side >= 4096) within 5%. With one 256x128 tile and no per-tile cost (the model
    before) the 1024^3 shape came out 38% slow and the thin 802816x192x768 one 56% fast."""
    clock = AZURE["a100_sxm4_80gb"]["gemm_sustained_clock_ratio"]["value"]
    profile = load_profile("dgx-a100", {"gpu": {"sm_clock_fraction": clock}})
    gemm = Gemm(row["m"], row["n"], row["k"])
    tflops = gemm.flops / costs.gemm_s(gemm, profile) / 1e12
    large = min(row["m"], row["n"], row["k"]) >= 4096
    assert tflops == pytest.approx(row["TFLOPS"], rel=0.05 if large else 0.15)


def test_a100_gpu_rates_are_the_published_microbenchmarks():
    a100 = AZURE["a100_sxm4_80gb"]
    for name in ("polaris-a100", "p4d-24xlarge", "dgx-a100"):
        profile = load_profile(name)
        assert profile.memory_efficiency == pytest.approx(
            a100["hbm_TBps"]["copy"] * 1e3 / a100["hbm_GBps"], abs=0.005)
    assert load_profile("dgx-a100").h2d_pinned_Bps / 1e9 == pytest.approx(
        a100["nvbandwidth_GBps"]["host_to_device"], abs=0.05)
    h100 = AZURE["h100_sxm_80gb"]
    dgx_h100 = load_profile("dgx-h100")
    assert (dgx_h100.h2d_pinned_Bps / 1e9, dgx_h100.d2h_pinned_Bps / 1e9) == (
        h100["nvbandwidth_GBps"]["host_to_device"], h100["nvbandwidth_GBps"]["device_to_host"])
    for name in ("h100-jlse", "dgx-h100"):
        profile = load_profile(name)
        assert profile.memory_efficiency == pytest.approx(
            h100["hbm_TBps"]["copy"] * 1e3 / h100["hbm_GBps"], abs=0.005)


def test_dgx_h200s_memory_bound_rates_are_its_probes_ops_one_at_a_time():
    """Section j of the node probe on an H200 SXM (benchmarks/node_probe): the contiguous
    copies and residual adds at micro-batch 4 (past the 60 MB L2), PyTorch's bf16 softmax over
    the scores, and Megatron's SwiGLU on a chunk's halves (strided), each a mean over the
    three widths, over the H200's 4.8 TB/s."""
    probe = Path(__file__).parents[1] / "benchmarks" / "node_probe" / "h200_2026-12-04_ghijc.json"
    ops = json.loads(probe.read_text())["results"]["j_block_memory_ops"]

    def mean_TBps(names, batches=(1, 4)):
        rates = [ops[f"h{h}_mb{mb}_{name}_GBps"]["value"] / 1e3 for name in names
                 for h in (3072, 4096, 5120) for mb in batches]
        return sum(rates) / len(rates)

    h200 = load_profile("dgx-h200")
    hbm_TBps = h200.hbm_Bps / 1e12
    assert round(mean_TBps(("copy", "residual"), (4,)) / hbm_TBps, 3) == h200.memory_efficiency
    assert round(mean_TBps(("softmax",)) / hbm_TBps, 3) == h200.softmax_memory_efficiency
    assert round(mean_TBps(("swiglu",)) / hbm_TBps, 3) == h200.strided_memory_efficiency


MAMF = reference_data("mamf_bf16.yaml")


@pytest.mark.parametrize("name, accelerator, error", [
    ("dgx-a100", "NVIDIA A100 SXM", -0.058),
    ("h100-jlse", "NVIDIA H100 SXM", -0.061),
    ("dgx-h100", "NVIDIA H100 SXM", -0.061),
    ("dgx-h200", "NVIDIA H100 SXM", -0.149),
    ("gh200", "NVIDIA GH200 SXM", -0.112)])
def test_the_gemm_model_against_pytorchs_best_matmul_on_each_gpu(name, accelerator, error):
    """The GEMM values come from PyTorch's own GEMMs: a Llama MLP's with a cuBLASLt table at
    its sustained clock (A100) and those of the replayed transformers (H100); PyTorch's best
    matmul of a shape search (mamf-finder) checks them: the A100 5.8% and the H100 6.1% below
    it (a search's best is biased upward: the luckiest kernel of many shapes; the A100 was
    11.5% below while its values came from the cuBLASLt table alone), the GH200 (the H100's
    die, at 900 W and higher clocks than the 700 W H100 the values come from) 11.2% below.
    The H200 (the table: "H200 is the same" as the H100) 14.9% below: it is priced at the SM
    clock a long run of products holds under its power cap, where a shape search times
    bursts (at the full clock, 2.5% below)."""
    row = next(r for r in MAMF["rows"] if r["accelerator"] == accelerator)
    gemm = Gemm(row["m"], row["n"], row["k"])
    modelled = gemm.flops / costs.gemm_s(gemm, load_profile(name)) / 1e12
    assert modelled / row["TFLOPS"] - 1 == pytest.approx(error, abs=0.001)


def test_gh200_copy_and_memory_rates_are_the_published_microbenchmarks():
    data = reference_data("gh200_microbenchmarks.yaml")
    gh200 = load_profile("gh200")
    copies = data["bandwidth_test_pinned_GBps"]
    assert gh200.h2d_pinned_Bps / 1e9 == pytest.approx(copies["host_to_device"], abs=0.5)
    assert gh200.d2h_pinned_Bps / 1e9 == pytest.approx(copies["device_to_host"], abs=0.5)
    assert gh200.memory_Bps_per_domain / 1e6 == pytest.approx(data["stream_MBps"]["copy"],
                                                              rel=0.002)


def test_norm_and_residual_backwards_are_read_off_their_code():
    """Megatron-DeepSpeed's block on Llama-2-13B (5120 wide, 2048 tokens): apex's RMSNorm
    backward reads the gradient and the input twice (the weight's partial sums, then the
    input's gradient) and writes the input's gradient: 10 B per element in 3 kernels, against
    its forward's 4 B in 1; a residual add hands its gradient on as it is, and the tensor it
    forks from sums its two gradients once: 6 B in 1 kernel, as its forward. The HF stack's
    residual is the same; its RMSNorm of plain ops moves 92 B in 16 kernels backward."""
    t, h = 2048, 5120
    recipe = load_stack("megatron-deepspeed").recipe
    layer = [m for m in build_modules(LLAMA13, Workload(sequence_length=t), recipe)
             if m.layer == 0]
    norm = next(m for m in layer if m.kind == "norm")
    assert norm.kernels == (MemoryPass(4 * t * h, 1, 5 * t * h, 0.0, 10 * t * h, 0.0,
                                       backward_count=3),)
    assert norm.backward_kernels == (MemoryPass(10 * t * h, 3, 12.5 * t * h),)
    out_proj = next(m for m in layer if m.name.endswith("o_proj"))
    assert out_proj.backward_kernels[2:] == (MemoryPass(6 * t * h, 1),)
    hf = load_stack("hf-transformers").recipe
    assert (hf.residual.backward_bytes_per_element, hf.residual.backward_kernels) == (6, 1)
    assert (hf.norm.backward_bytes_per_element, hf.norm.backward_kernels) == (92, 16)


@pytest.mark.parametrize(("stack", "forward", "backward", "kernels"), [
    # Megatron: the saved softmax is the gradient, scaled in place by the loss's gradient
    # (8 B), then the fp32 cast's backward (6 B); 8 kernels with the per-token ones.
    ("megatron-deepspeed", 38, 14, 8),
    # HF: nll_loss's zero fill, log_softmax's backward, the shifted slice's zero fill and
    # copy, the cast's backward.
    ("hf-transformers", 22, 34, 6),
])
def test_the_loss_backward_is_read_off_its_code(stack, forward, backward, kernels):
    logits = 2048 * LLAMA13.vocab_size
    modules = build_modules(LLAMA13, Workload(sequence_length=2048), load_stack(stack).recipe)
    (loss,) = next(m for m in modules if m.kind == "loss").kernels
    assert (loss.nbytes, loss.backward(2.0).nbytes, loss.backward(2.0).count) == (
        forward * logits, backward * logits, kernels)


def _input_gradient_sums(spec, recipe: Recipe, t: int = 2048) -> dict[str, float]:
    """Layer 0's projections whose backward ends with an input-gradient sum, and its bytes."""
    layer = [m for m in build_modules(spec, Workload(sequence_length=t), recipe)
             if m.layer == 0 and m.kind == "linear"]
    return {m.name.split(".", 2)[2]: m.backward_kernels[-1].nbytes for m in layer
            if m.backward_kernels[-1] == MemoryPass(m.backward_kernels[-1].nbytes, 1,
                                                    m.backward_kernels[-1].nbytes / 6)}


def test_projections_sharing_an_input_sum_their_input_gradients():
    """Autograd adds each later gradient of a tensor that feeds several ops into the first
    (`InputBuffer::add`: read 2, write 1): Q, K and V read the normalised input, and so do the
    gate and up projections. The backward runs the later projection first, so the sums come
    after K's and Q's backward (V's gradient arrives first) and after the gate's: 6 B per
    element of the 2048 x 5120 input each. A fused QKV or gate/up projection sums nothing;
    Megatron-DeepSpeed's grouped-query Q and K/V (1df5712) sum once."""
    t, h = 2048, 5120
    six = 6 * t * h
    assert _input_gradient_sums(LLAMA13, Recipe()) == {
        "self_attn.q_proj": six, "self_attn.k_proj": six, "mlp.gate_proj": six}
    assert _input_gradient_sums(LLAMA13, Recipe(fused_qkv=True, fused_gate_up=True)) == {}
    megatron = load_stack("megatron-deepspeed").recipe
    assert _input_gradient_sums(CATALOG["llama2-70b"], megatron) == {
        "self_attn.q_proj": 6 * t * 8192}


def test_one_normalised_input_for_attention_and_mlp_sums_once_more():
    """GPT-J's block feeds attention and MLP one normalised input: the fused QKV projection,
    whose backward runs after the MLP's, sums its input gradient into the MLP's."""
    spec = replace(LLAMA13, norms_per_block=1)
    sums = _input_gradient_sums(spec, Recipe(fused_qkv=True, fused_gate_up=True))
    assert sums == {"self_attn.qkv_proj": 6 * 2048 * 5120}


def test_a_memory_bound_kernel_class_faster_than_stream_is_told():
    """No memory-bound kernel streams faster than a STREAM copy: a class priced faster than
    `gpu.memory_efficiency` beyond its standard error (2% without one) is a warning naming
    the key; within it, or in a shipped profile, nothing is said."""
    import warnings

    from zerosim.errors import ScenarioWarning
    from zerosim.hardware.profile import profile_names

    with warnings.catch_warnings():
        warnings.simplefilter("error", ScenarioWarning)
        for name in profile_names():
            load_profile(name)
        load_profile("polaris-a100", {"gpu.softmax_memory_efficiency": 0.80})
    with pytest.warns(ScenarioWarning, match=r"gpu\.softmax_memory_efficiency: 0\.838 of HBM "
                      r"peak is faster than gpu\.memory_efficiency \(0\.79\)"):
        load_profile("polaris-a100", {"gpu.softmax_memory_efficiency": 0.838})
    fitted = {"value": 0.84, "basis": "fitted", "stderr_pct": 8, "source": "a fit"}
    with warnings.catch_warnings():
        warnings.simplefilter("error", ScenarioWarning)
        load_profile("polaris-a100", {"gpu.strided_memory_efficiency": fitted})


def test_a_pageable_copy_faster_than_a_pinned_one_is_told():
    """A pageable copy is staged through pinned memory: a profile that prices it faster than
    the pinned copy of the same direction (beyond its standard error) gets a warning naming
    the key; level with it, nothing is said."""
    import warnings

    from zerosim.errors import ScenarioWarning

    with pytest.warns(ScenarioWarning, match=r"pcie\.d2h_pageable_GBps: 30 GB/s is faster than "
                      r"pcie\.d2h_pinned_GBps \(25\)"):
        load_profile("polaris-a100", {"pcie.d2h_pageable_GBps": 30})
    with warnings.catch_warnings():
        warnings.simplefilter("error", ScenarioWarning)
        load_profile("polaris-a100", {"pcie.d2h_pageable_GBps": 25, "pcie.h2d_pageable_GBps": 25})


def test_a_copy_faster_than_the_named_pcie_link_signals_is_told():
    """`pcie.generation` "PCIe Gen4 x16" signals 16 x 1.969 = 31.504 GB/s a direction: a
    pinned rate above it is a warning that names the link; the same rate on a Gen5 x16 link
    (63.008 GB/s) or on a link that is not PCIe (GH200's NVLink-C2C) is not."""
    import warnings

    from zerosim.errors import ScenarioWarning

    with pytest.warns(ScenarioWarning, match=r"pcie\.h2d_pinned_GBps: 50 GB/s is more than the "
                      r"PCIe Gen4 x16 link named by pcie\.generation signals in one direction "
                      r"\(31\.504 GB/s\)"):
        load_profile("polaris-a100", {"pcie.h2d_pinned_GBps": 50})
    with warnings.catch_warnings():
        warnings.simplefilter("error", ScenarioWarning)
        load_profile("polaris-a100", {"pcie.h2d_pinned_GBps": 50,
                                      "pcie.generation": "PCIe Gen5 x16"})
        load_profile("gh200")


@pytest.mark.parametrize(("entry", "message"), [
    ({"kernels": 1, "bytes_per_element": 4, "source": "x"},
     r"ungated_activations\.gelu\.saved: expected the bytes per intermediate element"),
    ({"kernels": 1, "bytes_per_element": 4, "saved": -2, "source": "x"},
     r"ungated_activations\.gelu\.saved: expected a number in \[0, 1000\)"),
    ({"kernels": 1, "bytes_per_element": 4, "saved": 2},
     r"ungated_activations\.gelu: expected \{kernels"),
])
def test_an_ungated_activation_entry_is_checked_like_a_kernel_entry(entry, message):
    tree = toy_stack()
    tree["ungated_activations"] = {"gelu": entry}
    with pytest.raises(ScenarioError, match=message):
        parse_stack(tree, "s.yaml")


def test_an_ungated_activation_table_falls_back_to_its_any_entry():
    tree = toy_stack()
    tree["ungated_activations"] = {
        "relu": {"kernels": 1, "bytes_per_element": 4, "saved": 2, "source": "x"},
        "*": {"kernels": 3, "bytes_per_element": 12, "saved": 6, "source": "y"}}
    recipe = parse_stack(tree, "s.yaml").recipe
    assert recipe.ungated_activation("relu").kernels.kernels == 1
    assert recipe.ungated_activation("gelu_new").saved == 6
    assert parse_stack(toy_stack(), "s.yaml").recipe.ungated_activation("relu") is None
