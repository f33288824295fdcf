"""PyTorch's own ops on an A100 and an H100 (Liger-Kernel's baselines) against the kernel model,
the strided memory path they measure, and the GPU values they pin."""

from __future__ import annotations

from dataclasses import replace
from importlib import resources
from pathlib import Path

import pytest

from zerosim.errors import ScenarioError
from zerosim.hardware import costs
from zerosim.hardware.profile import load_profile, parse_profile
from zerosim.models.breakdown import Elementwise
from zerosim.models.kernels import Gemm, MemoryPass
from zerosim.stacks import builtin_stack_tree, load_stack, parse_stack
from zerosim.validation.pytorch_ops import (
    a100_mlp_tables,
    azure_a100,
    fit_a100_gemm_rates,
    fit_strided_rate,
    implied_strided_rate,
    modelled_s,
    op_table,
    op_tables,
    row_kernels,
)
from zerosim.validation.validate import pytorch_op_cells
from zerosim.yamlio import read_yaml_file

H100 = load_profile("dgx-h100")
A100 = load_profile("dgx-a100")


def test_a_pass_prices_its_strided_bytes_at_the_strided_rate():
    """10 MB contiguous at 0.87 of 3.35 TB/s and 4 MB strided at 0.523, plus two kernel gaps:
    the H100's numbers written out."""
    kernel = MemoryPass(14e6, count=2, strided_nbytes=4e6)
    expected = 10e6 / (3350e9 * 0.87) + 4e6 / (3350e9 * 0.523) + 2 * H100.kernel_gap_s
    assert costs.kernel_s(kernel, H100) == pytest.approx(expected, rel=1e-12)
    assert costs.kernel_s(MemoryPass(14e6, count=2), H100) == pytest.approx(
        14e6 / (3350e9 * 0.87) + 2 * H100.kernel_gap_s, rel=1e-12)
    assert kernel.backward(2.0) == MemoryPass(28e6, 2, 0.0, 8e6)


def test_a_profile_without_the_key_prices_strided_views_at_stream():
    """Profiles written before the key keep their timings: the default is the STREAM rate,
    recorded as assumed."""
    tree = read_yaml_file(Path(str(resources.files("zerosim.hardware") / "profiles"
                                   / "dgx-h100.yaml")))
    del tree["gpu"]["strided_memory_efficiency"]
    profile = parse_profile(tree, "test")
    assert profile.strided_memory_efficiency == profile.memory_efficiency == 0.87
    assert profile.provenance["gpu.strided_memory_efficiency"].basis == "assumed"


def test_the_stacks_mark_the_kernels_on_strided_views():
    """Megatron-DeepSpeed: rotary (broadcast cos/sin, the head dimension's halves; its add and
    last copy read contiguous tensors, and its backward reads the permuted gradient), the K/V
    expansion, the permuted context copy and swiglu on the chunk's halves are strided; its
    fused norm, softmax, residual and loss are not. HF:
    the weight product of RMSNorm, rotary, repeat_kv, the broadcast mask and the transposed
    context copy."""
    megatron = load_stack("megatron-deepspeed").recipe
    assert megatron.activation == Elementwise(2, 10, 10, 26, 12, 4)
    assert megatron.rotary == Elementwise(20, 24, 14, 26, 20, 14)
    assert (megatron.kv_repeat.strided_bytes_per_element,
            megatron.context.strided_bytes_per_element) == (2, 4)
    assert {op.strided_bytes_per_element for op in (megatron.norm, megatron.scores,
                                                     megatron.residual, megatron.loss)} == {0}
    hf = load_stack("hf-transformers").recipe
    assert [op.strided_bytes_per_element for op in (
        hf.norm, hf.rotary, hf.kv_repeat, hf.scores, hf.context, hf.activation, hf.residual,
        hf.loss)] == [4, 20, 2, 5, 4, 0, 0, 0]


def test_an_fp32_run_prices_its_strided_bytes_as_contiguous():
    """The strided rate is of 16-bit elements: with fp32 activations the same kernels move
    twice the bytes, all of them at STREAM's rate."""
    from zerosim.models.breakdown import Workload, elementwise_pass
    swiglu = load_stack("megatron-deepspeed").recipe.activation
    (bf16,) = elementwise_pass(swiglu, 1000, Workload(sequence_length=1))
    (fp32,) = elementwise_pass(swiglu, 1000, Workload(sequence_length=1, dtype_bytes=4))
    assert (bf16.nbytes, bf16.strided_nbytes) == (10_000, 10_000)
    assert (fp32.nbytes, fp32.strided_nbytes) == (20_000, 0.0)


def test_a_stack_cannot_mark_more_strided_bytes_than_it_moves():
    tree = builtin_stack_tree("megatron-deepspeed")
    tree["kernels"]["activation"]["strided_bytes_per_element"] = 12
    with pytest.raises(ScenarioError, match=r"kernels\.activation\.strided_bytes_per_element"):
        parse_stack(tree, "test")
    tree["kernels"]["activation"]["stride"] = 1
    with pytest.raises(ScenarioError, match=r"kernels\.activation"):
        parse_stack(tree, "test")


def test_the_tables_price_the_stacks_own_entries():
    """Megatron's swiglu on 8192 tokens x 32768 columns: 2.68 GB, all of it strided; HF's
    rotary over Q and K (8192 + 2048 per token); the MLP's three projections around the
    activation."""
    swiglu = op_table("h100_megatron_swiglu")
    assert row_kernels(swiglu, swiglu.rows[-1]) == (
        MemoryPass(10 * 8192 * 32768, 2, 0.0, 10 * 8192 * 32768, 26 * 8192 * 32768,
                   12 * 8192 * 32768, backward_count=4),)
    rotary = op_table("a100_hf_rotary")
    assert row_kernels(rotary, rotary.rows[0]) == (
        MemoryPass(20 * 1024 * 10240, 10, 0.0, 20 * 1024 * 10240, 30 * 1024 * 10240,
                   14 * 1024 * 10240, backward_count=18),)
    mlp = op_table("a100_hf_llama_mlp")
    assert row_kernels(mlp, mlp.rows[0]) == (
        Gemm(4096, 11008, 4096), Gemm(4096, 11008, 4096),
        MemoryPass(10 * 4096 * 11008, 2, backward_nbytes=18 * 4096 * 11008, backward_count=3),
        Gemm(4096, 4096, 11008))


def test_contiguous_kernels_stream_at_stream_on_the_h100():
    """relu then square on a contiguous bf16 tensor: the model at the STREAM copy's 0.87 of HBM
    peak, no value fitted, within -6% to +2% (the smallest row pays a launch the model's gaps
    do not hold)."""
    table = op_table("h100_relu_squared")
    assert table.fits is None
    errors = [modelled_s(table, r) / r.measured_s - 1 for r in table.rows]
    assert [round(e, 3) for e in errors] == [-0.059, -0.018, 0.015]


def test_megatrons_swiglu_backward_read_off_autograd_meets_its_timing():
    """The script times the forward (silu and the product on the chunk's halves, 10 B
    strided, and the sum, 2 B) and the backward together; the backward, read off autograd for
    the gradient the sum hands on (one value expanded: each product's gradient reads only its
    saved operand), moves 22 B in 4 kernels, 14 of them strided, the cat of the two
    half-gradients on dense operands at STREAM's rate. That meets the rows within -5.2% to
    +0.9%, the backward alone (the row less the forward's) 2.00-2.02 times the forward
    against 2.02-2.06 measured; with the cat at the strided rate it came to 2.32."""
    table = op_table("h100_megatron_swiglu_backward")
    forward = op_table("h100_megatron_swiglu")
    elements = 8192 * 32768
    assert row_kernels(table, table.rows[-1]) == (
        MemoryPass(12 * elements, 3, 0.0, 10 * elements, 22 * elements, 14 * elements,
                   backward_count=4),
        MemoryPass(22 * elements, 4, 0.0, 14 * elements))
    errors = [modelled_s(table, r) / r.measured_s - 1 for r in table.rows]
    assert [round(e, 3) for e in errors] == [-0.052, -0.024, -0.005, 0.007, 0.009]
    ratios = [(b.measured_s - f.measured_s) / f.measured_s
              for f, b in zip(forward.rows, table.rows, strict=True)]
    assert (round(min(ratios), 2), round(max(ratios), 2)) == (2.02, 2.06)
    modelled = [(modelled_s(table, b) - modelled_s(forward, f)) / modelled_s(forward, f)
                for f, b in zip(forward.rows, table.rows, strict=True)]
    assert (round(min(modelled), 2), round(max(modelled), 2)) == (2.0, 2.02)


def test_one_fused_kernel_on_the_same_halves_streams_at_the_strided_rate_too():
    """megatron-core's bias_swiglu_impl, one kernel reading the chunk's halves and writing the
    product (6 bytes per element, all strided), not fitted: the H100's 0.523 prices it within
    -1.6% to +7.3% (its rows would want 0.515-0.561): the path, not the kernel count, sets the
    rate."""
    table = op_table("h100_megatron_swiglu_fused")
    errors = [modelled_s(table, r) / r.measured_s - 1 for r in table.rows]
    assert [round(e, 3) for e in errors] == [-0.016, 0.028, 0.053, 0.066, 0.073]


def test_32_bit_kernels_with_a_broadcast_operand_stream_near_stream():
    """HF's add and RMSNorm in float32 (two of its kernels broadcast the rsqrt and the weight):
    priced all at STREAM's rate, -13.4% to -4.9%, the smaller rows paying seven launches: the
    strided rate is of 16-bit elements, which the stacks mark alone."""
    table = op_table("h100_hf_add_rms_norm_fp32")
    assert table.elementwise == Elementwise(7, 40, 0.0)
    errors = [modelled_s(table, r) / r.measured_s - 1 for r in table.rows]
    assert [round(e, 3) for e in errors] == [-0.134, -0.099, -0.068, -0.049]


def test_the_h100_strided_rate_is_what_megatrons_swiglu_gives():
    """Megatron's swiglu on the H100 at the sizes that move 100 MB or more: the strided rate
    that meets them is the H100 profiles' 0.523 (1.5%, 1.75 TB/s), every row within 5.3%;
    per row, the rate each would need rises with its size (a call's fixed cost beyond the
    kernels' gaps). The GH200, the same die, takes the same 1.75 TB/s."""
    table = op_table("h100_megatron_swiglu")
    fit = fit_strided_rate(table)
    assert fit.value == pytest.approx(0.523, abs=0.0005)
    assert fit.std / fit.value == pytest.approx(0.015, abs=0.001)
    assert [round(e, 3) for e in fit.errors] == [-0.053, -0.011, 0.01, 0.026, 0.027]
    rates = [implied_strided_rate(table, r) for r in table.rows]
    assert (round(rates[0], 3), round(rates[-1], 3)) == (0.494, 0.537)
    for name in ("dgx-h100", "h100-jlse", "gh200"):
        profile = load_profile(name)
        assert profile.strided_memory_efficiency * profile.hbm_Bps == pytest.approx(
            0.523 * 3350e9, rel=0.001)


def test_the_a100_rotary_embedding_runs_a_quarter_below_the_a100s_strided_rate():
    """The A100's strided rate is fitted on the Polaris runs (0.791 of 1555 GB/s, 1.23 TB/s,
    taken for the 80 GB part too: 0.603 of 2039); transformers' rotary embedding on an
    A100-SXM4-80GB runs 28-32% below it (alone it would give 0.419, 0.85 TB/s), as the same
    code on an H100 NVL (1.31 TB/s) runs below Megatron's swiglu on an SXM (1.75 TB/s): the
    table is reported, not judged."""
    table = op_table("a100_hf_rotary")
    assert table.reported and table.fits is None
    errors = [modelled_s(table, r) / r.measured_s - 1 for r in table.rows]
    assert [round(e, 3) for e in errors] == [-0.321, -0.300, -0.294, -0.284, -0.280]
    assert fit_strided_rate(table).value == pytest.approx(0.419, abs=0.0005)
    polaris, dgx = load_profile("polaris-a100"), load_profile("dgx-a100")
    assert polaris.strided_memory_efficiency == 0.791
    assert dgx.strided_memory_efficiency * dgx.hbm_Bps == pytest.approx(
        polaris.strided_memory_efficiency * polaris.hbm_Bps, rel=0.002)


def test_the_a100_gemm_values_are_the_joint_fit_of_pytorchs_mlps_and_azures_table():
    """Eight Llama MLP forwards (three projections at 4096-65536 tokens) and Azure's eight
    cuBLASLt shapes, Azure's at a clock of their own: 0.910 (2.4%), 498 steps (14%) and a
    clock of 0.940 (3.2%); the MLPs within 1.3%, Azure's rows within 12.2% (its 1024^3 and
    1024x2145x1024 shapes at the extremes); the shipped A100 profiles and the data file's
    clock are the fit's."""
    fit = fit_a100_gemm_rates()
    assert (round(fit.efficiency, 3), round(fit.k_overhead), round(fit.clock_ratio, 3)) == (
        0.910, 498, 0.940)
    values = (fit.efficiency, fit.k_overhead, fit.clock_ratio)
    assert [round(s / v, 3) for s, v in zip(fit.std, values, strict=True)] == [0.024, 0.142,
                                                                              0.032]
    assert max(abs(e) for e in fit.errors[:8]) == pytest.approx(0.013, abs=0.0005)
    assert max(abs(e) for e in fit.errors[8:]) == pytest.approx(0.122, abs=0.0005)
    for name in ("dgx-a100", "polaris-a100", "p4d-24xlarge"):
        profile = load_profile(name)
        assert (profile.gemm_efficiency, profile.gemm_k_overhead) == (0.910, 498)
    assert azure_a100()["gemm_sustained_clock_ratio"]["value"] == round(fit.clock_ratio, 3)


def test_pytorchs_mlps_alone_run_faster_than_the_cublaslt_table_says():
    """With Azure's values (0.855 and 498, what its table alone gives) the MLP forwards come
    out 5-7% slow: PyTorch's calls in do_bench's bursts run faster than the table's
    minutes-long runs of each shape."""
    azure_only = replace(A100, gemm_efficiency=0.855)
    errors = [modelled_s(t, r, azure_only) / r.measured_s - 1
              for t in a100_mlp_tables() for r in t.rows]
    assert min(errors) == pytest.approx(0.046, abs=0.001)
    assert max(errors) == pytest.approx(0.070, abs=0.001)


def test_validate_judges_every_row_but_transformers_rotary_and_rmsnorm_and_ligers_mlp():
    cells = pytorch_op_cells()
    assert len(cells) == sum(len(t.rows) for t in op_tables()) == 70
    reported = ("a100_hf_rotary", "a100_hf_rms_norm", "a100_liger_swiglu_mlp",
                "a100_hf_lm_head_ce")
    assert [c.status for c in cells if c.case.startswith(reported)] == ["reported"] * 29
    assert {c.status for c in cells if not c.case.startswith(reported)} == {"pass"}
    assert {c.quantity for c in cells if "backward" in c.case} == {
        "backward", "forward and backward"}
    assert {c.tolerance for c in cells if "mlp" in c.case
            and not c.case.startswith(reported)} == {0.05}
    assert {c.group for c in cells} == {"GPU kernels (A100)", "GPU kernels (H100)"}


def test_hf_rmsnorm_backward_read_off_autograd_keeps_its_measured_ratio_to_the_forward():
    """transformers' LlamaRMSNorm on an A100 80GB, as Liger-Kernel timed its forward and its
    backward apart: the backward takes 2.50-2.66 times the forward. Read off autograd (92 B
    in 16 kernels against the forward's 36 B in 8) the model gives 2.39-2.50, within 9% of
    every row; twice the forward's bytes would give 1.99, 20-25% short."""
    forward, backward = op_table("a100_hf_rms_norm"), op_table("a100_hf_rms_norm_backward")
    assert backward.timed == "backward"
    for f, b in zip(forward.rows, backward.rows, strict=True):
        assert f.sizes == b.sizes
        measured = b.measured_s / f.measured_s
        modelled = modelled_s(backward, b) / modelled_s(forward, f)
        assert 2.50 <= measured <= 2.66
        assert abs(modelled / measured - 1) < 0.09, (f.sizes, measured, modelled)



def test_an_mlp_backward_is_its_projections_gradients_the_activations_and_the_input_sum():
    """transformers' GeGLU MLP on 8192 tokens (hidden 4096, intermediate 11008), backward alone:
    the gate's and up's input gradients (8192 x 4096, K 11008) and weight gradients
    (4096 x 11008, K 8192), the activation's backward read off autograd (18 B per intermediate
    element in 3 kernels), the down projection's two gradients, the sum of x's two gradients
    (6 B per element of x) and the benchmark's AccumulateGrad into the three weights' kept
    gradients (6 B per weight)."""
    table = op_table("a100_hf_geglu_mlp_backward")
    t, h, f = 8192, 4096, 11008
    assert table.rows[0].sizes == {"tokens": t, "hidden": h, "ffn": f}
    assert row_kernels(table, table.rows[0]) == (
        Gemm(t, h, f), Gemm(h, f, t), Gemm(t, h, f), Gemm(h, f, t),
        MemoryPass(18 * t * f, 3),
        Gemm(t, f, h), Gemm(f, h, t),
        MemoryPass(6 * t * h, 1, t * h),
        MemoryPass(6 * 3 * h * f, 3))


def test_the_a100_mlp_backward_is_met_without_fitting_to_it():
    """The A100's GEMM values are fitted to the MLP forwards and Azure's table only; the GeGLU
    MLP's backward, timed apart (Liger-Kernel), comes out within 1.1-3.6% under it: the input
    and weight gradients' GEMMs run at the forward's rates, the weight gradient's K (the
    tokens) making it a little faster in the model as the tokens grow. Its measured backward
    is 1.98-2.00 times the forward; modelled 1.91-2.01."""
    forward, backward = op_table("a100_hf_geglu_mlp"), op_table("a100_hf_geglu_mlp_backward")
    assert backward.fits is None and backward.accumulates_weight_gradients
    errors = [modelled_s(backward, r) / r.measured_s - 1 for r in backward.rows]
    assert [round(e, 3) for e in errors] == [-0.011, -0.011, -0.036, -0.033]
    ratios = [(b.measured_s / f.measured_s, modelled_s(backward, b) / modelled_s(forward, f))
              for f, b in zip(forward.rows, backward.rows, strict=True)]
    assert [round(m, 2) for m, _ in ratios] == [2.0, 1.99, 2.0, 1.98]
    assert [round(r, 2) for _, r in ratios] == [2.01, 1.95, 1.92, 1.91]


def test_an_output_layer_and_its_loss_are_the_head_gemm_the_loss_kernels_and_their_backward():
    """Llama 3's head (4096 -> 128,256) on 4096 tokens and PyTorch's cross entropy on its
    16-bit logits, forward then backward (Liger-Kernel's TorchLMHeadCE, 'full'): the logits
    GEMM, log_softmax and nll_loss (4 B a logit in 2 kernels), their backward (8 B a logit in
    3), the input gradient (K the vocabulary) and the weight gradient (K the tokens), and
    AccumulateGrad into the weight's and the input's kept gradients (6 B an element)."""
    table = op_table("a100_hf_lm_head_ce_full")
    t, h, v = 4096, 4096, 128256
    assert table.rows[0].sizes == {"tokens": t, "hidden": h, "vocab": v}
    assert row_kernels(table, table.rows[0]) == (
        Gemm(t, v, h), MemoryPass(4 * t * v, 2, backward_nbytes=8 * t * v, backward_count=3),
        Gemm(t, h, v), Gemm(h, v, t), MemoryPass(8 * t * v, 3),
        MemoryPass(6 * v * h, 1), MemoryPass(6 * t * h, 1))


def test_the_output_layer_runs_between_the_a100s_burst_and_sustained_gemm_rates():
    """What the tables' reason says: the full pass at the GEMM values' burst rates comes out
    further below its measurement as its call grows (56 to 452 ms), and at the clock of
    Azure's minutes-long table within -2.9..+4.3%; the H100's cheaper tile would make every
    row faster still."""
    from zerosim.validation.reference import reference_data

    clock = reference_data("azure_nd_gpu_benchmarks.yaml")["a100_sxm4_80gb"][
        "gemm_sustained_clock_ratio"]["value"]
    sustained = replace(A100, sm_clock_fraction=A100.sm_clock_fraction * clock)
    cheap_tile = replace(A100, gemm_k_overhead=H100.gemm_k_overhead)
    forward, full = op_table("a100_hf_lm_head_ce"), op_table("a100_hf_lm_head_ce_full")

    def errors(table, profile):
        return [round(100 * (modelled_s(table, r, profile) / r.measured_s - 1), 1)
                for r in table.rows]

    assert errors(full, A100) == [-1.3, -4.4, -5.2, -8.3]
    assert errors(full, sustained) == [4.3, 1.2, 0.4, -2.9]
    assert errors(forward, A100) == [-12.4, -3.5, -4.1, -3.6]
    assert errors(forward, sustained) == [-7.2, 2.2, 1.6, 2.1]
    assert max(errors(forward, cheap_tile) + errors(full, cheap_tile)) == -6.5
    assert min(errors(forward, cheap_tile) + errors(full, cheap_tile)) == -19.2
