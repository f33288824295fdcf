"""`zerosim fit-gemm`: the GEMM rates of a profile fitted to a measured table of GEMMs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from zerosim.cli import main
from zerosim.errors import ScenarioError
from zerosim.hardware.profile import load_profile
from zerosim.validation.gemm_rates import RATE_KEYS, GemmRow, fit_gemm_rates, read_gemm_table
from zerosim.validation.reference import reference_data

AZURE_A100 = reference_data("azure_nd_gpu_benchmarks.yaml")["a100_sxm4_80gb"]
XLA_H100 = reference_data("xla_h100_gemm_bf16.yaml")
AZURE_ROWS = [GemmRow.from_record(r) for r in AZURE_A100["gemm_fp16"]]
XLA_ROWS = [GemmRow.from_record(r) for r in XLA_H100["rows"]]
PYTORCH_ROWS = [GemmRow.from_record(r)
                for r in reference_data("h100_pytorch_gemms.yaml")["rows"]]


def _table(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gemms.csv"
    path.write_text(text)
    return path


def _azure_csv(tmp_path: Path) -> Path:
    lines = ["m,n,k,TFLOPS"] + [f"{r['m']},{r['n']},{r['k']},{r['TFLOPS']}"
                                for r in AZURE_A100["gemm_fp16"]]
    return _table(tmp_path, "\n".join(lines) + "\n")


@pytest.mark.parametrize("name", ["polaris-a100", "p4d-24xlarge", "dgx-a100"])
def test_the_shipped_a100_gemm_rates_are_what_the_fit_gives_on_azures_table(name):
    """All three free: the latency runs to its lower bound (the 1024^3 row leaves no room for
    one) and the other two are the two-value fit's."""
    profile = load_profile(name)
    fit = fit_gemm_rates(AZURE_ROWS, profile)
    assert fit.efficiency == pytest.approx(profile.gemm_efficiency, abs=0.001)
    assert fit.k_overhead == pytest.approx(profile.gemm_k_overhead, abs=1)
    assert fit.latency_us == pytest.approx(profile.gemm_latency_s * 1e6, abs=0.005) == 0
    assert fit.rate("gemm_latency_us").std == pytest.approx(2.2, abs=0.05)
    held = fit_gemm_rates(AZURE_ROWS, profile, held=("gemm_latency_us",))
    assert held.rate("gemm_efficiency").rel_std == pytest.approx(0.05, abs=0.01)
    assert held.rate("gemm_k_overhead").rel_std == pytest.approx(0.21, abs=0.02)
    assert held.rms(AZURE_ROWS) == pytest.approx(0.07, abs=0.005)


@pytest.mark.parametrize("name", ["h100-jlse", "dgx-h100"])
def test_the_shipped_h100_gemm_rates_are_what_the_fit_gives_on_pytorchs_gemms(name):
    """The node probe's 30 GEMMs as PyTorch runs them on an H100 (a Llama block's projections
    at 2048 and 8192 tokens, eager attention's batched products), the latency held at XLA's:
    efficiency, tile cost and streaming rate pinned (standard errors 2%, 22%, 4%), rms 7.0%,
    28 of 30 within 8% (the two outside: the micro-batch-1 products of the 3072-wide block,
    which PyTorch runs 18% and 28% below the model's best tile). At the STREAM rate (0.87)
    the two attention products of K = 64 and 128, bound by their bytes, come out 19-20% fast."""
    profile = load_profile(name)
    fit = fit_gemm_rates(PYTORCH_ROWS, profile, held=("gemm_latency_us",))
    assert fit.efficiency == pytest.approx(profile.gemm_efficiency, abs=0.001)
    assert fit.k_overhead == pytest.approx(profile.gemm_k_overhead, abs=1)
    memory = fit.rate("gemm_memory_efficiency")
    assert memory.value == pytest.approx(profile.gemm_memory_efficiency, abs=0.001)
    assert [round(fit.rate(key).rel_std, 2) for key in RATE_KEYS] == [0.02, 0.22, 0.0, 0.04]
    assert fit.rms(PYTORCH_ROWS) == pytest.approx(0.070, abs=0.001)
    assert [round(e, 3) for e in fit.errors(PYTORCH_ROWS) if abs(e) > 0.08] == [0.178, 0.276]
    batched = PYTORCH_ROWS[24:]
    stream = fit_gemm_rates(batched, replace(profile, gemm_memory_efficiency=0.87),
                            held=RATE_KEYS)
    assert [round(e, 2) for e in stream.errors(batched)[:2]] == [0.19, 0.20]


@pytest.mark.parametrize("name", ["h100-jlse", "dgx-h100"])
def test_xlas_autotuned_kernels_run_faster_than_pytorchs(name):
    """XLA's table of 375 shapes, every value free: its kernels reach 0.924 of peak with 216
    steps of tile cost and stream at 0.87 (rms 9.5%), and its latency is the profiles' (the
    only H100 table with small shapes). With PyTorch's values the model runs XLA's 20 large
    products 8-14% slower than XLA did."""
    profile = load_profile(name)
    fit = fit_gemm_rates(XLA_ROWS, profile)
    assert (round(fit.efficiency, 3), round(fit.k_overhead)) == (0.924, 216)
    assert fit.latency_us == pytest.approx(profile.gemm_latency_s * 1e6, abs=0.005)
    assert fit.rate("gemm_memory_efficiency").value == pytest.approx(0.867, abs=0.001)
    assert [round(fit.rate(key).rel_std, 2) for key in RATE_KEYS] == [0.01, 0.07, 0.01, 0.02]
    assert fit.rms(XLA_ROWS) == pytest.approx(0.095, abs=0.001)
    shipped = fit_gemm_rates(XLA_ROWS, profile, held=RATE_KEYS)
    large = [e for e, row in zip(shipped.errors(XLA_ROWS), XLA_ROWS, strict=True)
             if row.batch == 1 and row.gemm.flops >= 16e9]
    assert len(large) == 20 and -0.15 < min(large) < max(large) < -0.07


def test_the_gh200_takes_the_h100s_gemm_rates():
    """The same die: the tables are of an H100 SXM, whose HBM the fit uses, so the GH200
    (faster HBM) takes the values rather than a refit on its own profile."""
    h100, gh200 = load_profile("dgx-h100"), load_profile("gh200")
    assert ((gh200.gemm_efficiency, gh200.gemm_k_overhead, gh200.gemm_latency_s,
             gh200.gemm_memory_efficiency)
            == (h100.gemm_efficiency, h100.gemm_k_overhead, h100.gemm_latency_s,
                h100.gemm_memory_efficiency))


def test_a_table_no_shape_of_which_is_bound_by_its_bytes_holds_the_streaming_rate():
    """Azure's A100 table has no memory-bound shape: the streaming rate is held at the
    profile's (no standard error to report), the three others fitted as before."""
    fit = fit_gemm_rates(AZURE_ROWS, load_profile("dgx-a100"))
    memory = fit.rate("gemm_memory_efficiency")
    assert (memory.held, memory.unbound, memory.std) == (True, True, 0.0)
    assert not fit.rate("gemm_efficiency").held


def test_holding_an_unknown_value_is_refused_with_what_it_could_be(tmp_path):
    result = CliRunner().invoke(main, ["fit-gemm", str(_azure_csv(tmp_path)), "--profile",
                                       "dgx-a100", "--hold", "gemm_tile_m"])
    assert result.exit_code == 2
    assert ("--hold: expected one of gemm_efficiency, gemm_k_overhead, gemm_latency_us, "
            "gemm_memory_efficiency, got 'gemm_tile_m'") in result.output


def test_the_fit_does_not_depend_on_where_it_starts():
    start = load_profile("dgx-a100", {"gpu": {"gemm_efficiency": 0.5, "gemm_k_overhead": 0}})
    fit = fit_gemm_rates(AZURE_ROWS, start, held=("gemm_latency_us",))
    assert (round(fit.efficiency, 3), round(fit.k_overhead)) == (0.855, 498)


def test_fit_gemm_prints_the_values_to_put_in_the_profile(tmp_path):
    result = CliRunner().invoke(main, ["fit-gemm", str(_azure_csv(tmp_path)),
                                       "--profile", "dgx-a100"])
    assert result.exit_code == 0, result.output
    assert "8192x8192x8192     253.7     251.1   -1.0%" in result.output
    assert ('gemm_efficiency: {value: 0.855, basis: fitted, stderr_pct: 5.3, source: '
            '"zerosim fit-gemm gemms.csv; standard error 0.045 (5%)"}') in result.output
    assert "gemm_k_overhead: {value: 498, basis: fitted" in result.output
    assert ('gemm_latency_us: {value: 0.00, basis: fitted, source: "zerosim fit-gemm '
            'gemms.csv; standard error 2.22"}') in result.output
    assert ('gemm_memory_efficiency: {value: 0.790, basis: assumed, source: "zerosim fit-gemm '
            'gemms.csv; held at the profile\'s value: no shape of the table is bound by it"}'
            ) in result.output


def test_fit_gemm_reads_a_batch_column_and_holds_what_it_is_told(tmp_path):
    lines = ["batch,m,n,k,TFLOPS"] + [f"{r.batch},{r.m},{r.n},{r.k},{r.tflops}"
                                      for r in XLA_ROWS]
    path = _table(tmp_path, "\n".join(lines) + "\n")
    assert read_gemm_table(path) == XLA_ROWS
    result = CliRunner().invoke(main, ["fit-gemm", str(path), "--profile", "dgx-h100",
                                       "--hold", "gemm_latency_us"])
    assert result.exit_code == 0, result.output
    assert "4x4096x4096x4096     788.7" in result.output
    assert ('gemm_latency_us: {value: 4.78, basis: assumed, source: "zerosim fit-gemm '
            'gemms.csv; held at the profile\'s value"}') in result.output


@pytest.mark.parametrize(("text", "message"), [
    ("m,n,k\n1,2,3\n", "header: expected the columns m, n, k, TFLOPS, got 'm, n, k'"),
    ("m,n,k,TFLOPS\n1,2,3,x\n", "row 1.TFLOPS: expected a positive number, got 'x'"),
    ("m,n,k,TFLOPS\n1.5,2,3,4\n", "row 1.m: expected a positive integer, got '1.5'"),
    ("m,n,k,TFLOPS\n1,2,0,4\n", "row 1.k: expected a positive integer, got '0'"),
    ("batch,m,n,k,TFLOPS\n0,1,2,3,4\n", "row 1.batch: expected a positive integer, got '0'"),
    ("m,n,k,TFLOPS\n1,2,3,4\n5,6,7,8\n9,10,11,12\n",
     "rows: expected more than 3 measured GEMMs (3 values are fitted), got 3"),
])
def test_a_bad_table_is_refused_with_where_and_what(tmp_path, text, message):
    path = _table(tmp_path, text)
    with pytest.raises(ScenarioError) as error:
        fit_gemm_rates(read_gemm_table(path), load_profile("dgx-a100"), source=str(path))
    assert str(error.value) == f"{path}: {message}"
    result = CliRunner().invoke(main, ["fit-gemm", str(path), "--profile", "dgx-a100"])
    assert result.exit_code == 2
