"""`document_length`: documents packed into each sequence, which transformers' flash attention
takes apart (its variable-length path): each query attends within its document, so the
attention's work follows the document, not the sequence, and its memory does not change."""

from __future__ import annotations

from pathlib import Path

import pytest

import zerosim
from zerosim.api import simulate_summary
from zerosim.engine.plan import plan_of
from zerosim.errors import ScenarioError
from zerosim.models.breakdown import Workload
from zerosim.models.kernels import FusedAttention

ROOT = Path(__file__).resolve().parent.parent
ALST = ROOT / "scenarios" / "llama8b_alst_dgx_h100.yaml"
ULYSSES = ROOT / "scenarios" / "llama8b_ulysses_dgx_h100.yaml"


def _core(scenario):
    return next(m for m in plan_of(scenario).modules if m.name == "layers.0.attn.core")


def test_a_query_attends_within_its_document():
    """Llama-3.1-8B at 128K tokens over a Ulysses group of 8 (16,384 tokens a rank, every
    token of 4 of the 32 heads, 512 wide, around the attention): with documents of 4,096
    tokens the fused kernel's causal products are 2 x 131,072 x 4,096 x 512 FLOPs, a query
    reading 2,048 keys on average; over the whole sequence, 32 times that."""
    packed = zerosim.load_scenario(ULYSSES, {"document_length": 4096})
    whole = zerosim.load_scenario(ULYSSES)
    (kernel,) = [k for k in _core(packed).kernels if isinstance(k, FusedAttention)]
    (full,) = [k for k in _core(whole).kernels if isinstance(k, FusedAttention)]
    assert kernel.flops == 2 * 131072 * 4096 * 512
    assert (kernel.keys, full.keys) == (2048, 65536)
    assert full.flops == 32 * kernel.flops
    assert _core(packed).model_flops == 4 * 131072 * 4096 * 512
    assert kernel.nbytes == full.nbytes


def test_packing_changes_the_time_not_the_memory():
    whole = simulate_summary(ULYSSES)
    packed = simulate_summary(ULYSSES, {"document_length": 2048})
    assert packed["peak_hbm_GiB"] == whole["peak_hbm_GiB"]
    assert packed["iteration_s"] < 0.5 * whole["iteration_s"]


def test_only_flash_attention_takes_the_documents_apart():
    assert Workload(131072, attention="flash", document_length=1024).attention_span == 1024
    for attention in ("eager", "sdpa"):
        workload = Workload(131072, attention=attention, document_length=1024)
        assert workload.attention_span == 131072
    assert Workload(4096, attention="flash", document_length=8192).attention_span == 4096


@pytest.mark.parametrize(("overrides", "key", "expected"), [
    ({"document_length": 2_000_000}, "document_length", "at most sequence_length 1048576"),
    ({"attention": "sdpa"}, "attention", "flash with document_length"),
    ({"deepspeed.train_micro_batch_size_per_gpu": 2}, "train_micro_batch_size_per_gpu",
     "in a batch of one sequence"),
])
def test_what_packing_needs_is_refused_by_key(overrides, key, expected):
    with pytest.raises(ScenarioError) as raised:
        zerosim.load_scenario(ALST, {"document_length": 1024, **overrides})
    assert key in str(raised.value) and expected in str(raised.value)


def test_megatron_deepspeeds_flash_path_attends_over_the_whole_sequence():
    with pytest.raises(ScenarioError, match=r"modules\.packed_documents none"):
        zerosim.load_scenario(ROOT / "scenarios" / "llama13b_dp4.yaml",
                              {"document_length": 1024, "attention": "flash"})


def test_check_names_the_documents():
    from click.testing import CliRunner

    from zerosim.cli import main

    result = CliRunner().invoke(main, ["check", str(ALST), "--set", "document_length=1024"])
    assert result.exit_code == 0
    assert "packing documents of 1024 tokens" in " ".join(result.stdout.split())
    assert zerosim.load_scenario(ALST, {"document_length": 1024}).to_dict()[
        "document_length"] == 1024
