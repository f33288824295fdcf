"""A plain PyTorch block's forward on an H100 (the node probe, section g) against the kernel
model: the same pricing the engine gives a module, on `dgx-h100`."""

from __future__ import annotations

from dataclasses import replace

import pytest

from zerosim.hardware.profile import load_profile
from zerosim.validation.block_forward import (
    block_rows,
    fit_memory_efficiency,
    fit_scores_efficiency,
    modelled_layer_s,
)
from zerosim.validation.validate import block_cells

ROWS = block_rows()


def test_the_model_runs_the_plain_block_20_to_24_percent_fast():
    """GEMMs priced as fitted to PyTorch's own products alone (0.810 of peak), the memory-bound
    kernels at a STREAM copy's 0.87 of HBM peak: every layer comes out fast by about a fifth,
    at micro-batch 1 and 4 alike, so what is missing grows with the work, not per kernel."""
    errors = [modelled_layer_s(r) / r.layer_s - 1 for r in ROWS]
    assert [round(e, 3) for e in errors] == [-0.238, -0.226, -0.202, -0.205, -0.204, -0.199]


def test_one_streaming_rate_of_the_memory_bound_kernels_meets_all_six_layers():
    """With the GEMMs as priced, the memory-bound kernels (the fp32 RMSNorm chain, masked_fill
    and softmax over the scores, the K/V and context copies, SwiGLU, the residuals) would
    stream at 0.519 of HBM peak (standard error 1%): every layer then within 2%."""
    fit = fit_memory_efficiency(ROWS, load_profile("dgx-h100"))
    assert fit.value == pytest.approx(0.519, abs=0.001)
    assert fit.std / fit.value == pytest.approx(0.01, abs=0.005)
    assert max(abs(e) for e in fit.errors) < 0.02


def test_the_mask_and_softmax_alone_at_a_lower_rate_meet_them_as_well():
    """The other reading of the same layers: every kernel at the profile's rates but the two
    over the s x s scores (masked_fill and softmax), which would stream at 0.388 of HBM peak
    (standard error 1.5%): every layer within 2.3%. The score bytes per layer grow with the
    heads and the rest with the width, which differ between the rows (32 heads at 3072 and
    4096 wide), yet both readings fit: section j of the node probe, which times each op
    alone, tells them apart."""
    fit = fit_scores_efficiency(ROWS, load_profile("dgx-h100"))
    assert fit.value == pytest.approx(0.388, abs=0.001)
    assert fit.std / fit.value == pytest.approx(0.015, abs=0.005)
    assert max(abs(e) for e in fit.errors) < 0.023


def test_a_layer_is_what_its_modules_cost_on_the_profile():
    """The profile a layer is priced on moves it: a faster HBM, only the memory-bound part."""
    row = ROWS[-1]
    h100 = load_profile("dgx-h100")
    faster = replace(h100, memory_efficiency=1.0)
    assert modelled_layer_s(row, profile=h100) == pytest.approx(modelled_layer_s(row), rel=1e-12)
    assert modelled_layer_s(row, profile=faster) < modelled_layer_s(row)


def test_validate_reports_the_six_layers_without_judging_them():
    cells = block_cells()
    assert [c.case for c in cells] == [r.case for r in ROWS]
    assert {c.status for c in cells} == {"reported"}
    assert cells[-1].measured == pytest.approx(13.479) and cells[-1].unit == "ms"
