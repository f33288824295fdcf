"""`zerosim fit-gemm`: the GEMM rates of a profile fitted to a measured table of GEMMs."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from zerosim.cli import main
from zerosim.errors import ScenarioError
from zerosim.hardware.profile import load_profile
from zerosim.validation.gemm_rates import GemmRow, fit_gemm_rates, read_gemm_table
from zerosim.validation.reference import reference_data

AZURE_A100 = reference_data("azure_nd_gpu_benchmarks.yaml")["a100_sxm4_80gb"]


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
    rows = [GemmRow(r["m"], r["n"], r["k"], r["TFLOPS"]) for r in AZURE_A100["gemm_fp16"]]
    profile = load_profile(name)
    fit = fit_gemm_rates(rows, profile)
    assert fit.efficiency == pytest.approx(profile.gemm_efficiency, abs=0.001)
    assert fit.k_overhead == pytest.approx(profile.gemm_k_overhead, abs=1)
    assert fit.efficiency_rel_std == pytest.approx(0.05, abs=0.01)
    assert fit.k_overhead_rel_std == pytest.approx(0.21, abs=0.02)
    assert fit.rms(rows) == pytest.approx(0.07, abs=0.005)


def test_the_fit_does_not_depend_on_where_it_starts():
    rows = [GemmRow(r["m"], r["n"], r["k"], r["TFLOPS"]) for r in AZURE_A100["gemm_fp16"]]
    start = load_profile("dgx-a100", {"gpu": {"gemm_efficiency": 0.5, "gemm_k_overhead": 0}})
    fit = fit_gemm_rates(rows, start)
    assert (round(fit.efficiency, 3), round(fit.k_overhead)) == (0.855, 498)


def test_fit_gemm_prints_the_values_to_put_in_the_profile(tmp_path):
    result = CliRunner().invoke(main, ["fit-gemm", str(_azure_csv(tmp_path)),
                                       "--profile", "dgx-a100"])
    assert result.exit_code == 0, result.output
    assert "8192x8192x8192     253.7     251.1   -1.0%" in result.output
    assert ('gemm_efficiency: {value: 0.855, basis: fitted, source: "zerosim fit-gemm '
            'gemms.csv; standard error 5%"}') in result.output
    assert "gemm_k_overhead: {value: 498, basis: fitted" in result.output


@pytest.mark.parametrize(("text", "message"), [
    ("m,n,k\n1,2,3\n", "header: expected the columns m, n, k, TFLOPS, got 'm, n, k'"),
    ("m,n,k,TFLOPS\n1,2,3,x\n", "row 1.TFLOPS: expected a positive number, got 'x'"),
    ("m,n,k,TFLOPS\n1.5,2,3,4\n", "row 1.m: expected a positive integer, got '1.5'"),
    ("m,n,k,TFLOPS\n1,2,0,4\n", "row 1.k: expected a positive integer, got '0'"),
    ("m,n,k,TFLOPS\n1,2,3,4\n5,6,7,8\n",
     "rows: expected at least 3 measured GEMMs (2 values are fitted), got 2"),
])
def test_a_bad_table_is_refused_with_where_and_what(tmp_path, text, message):
    path = _table(tmp_path, text)
    with pytest.raises(ScenarioError) as error:
        read_gemm_table(path)
    assert str(error.value) == f"{path}: {message}"
    result = CliRunner().invoke(main, ["fit-gemm", str(path), "--profile", "dgx-a100"])
    assert result.exit_code == 2
