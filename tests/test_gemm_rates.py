"""`zerosim fit-gemm`: the GEMM rates of a profile fitted to a measured table of GEMMs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from zerosim.cli import main
from zerosim.errors import ScenarioError
from zerosim.hardware.profile import load_profile
from zerosim.validation.gemm_rates import (
    RATE_KEYS,
    GemmRow,
    fit_gemm_rates,
    load_gemm_table,
    read_gemm_table,
)
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
def test_azures_table_alone_gives_its_own_efficiency_and_the_shipped_tile_cost(name):
    """All three free: the latency runs to its lower bound (the 1024^3 row leaves no room for
    one), which the profiles hold; the tile cost is the shipped one and the efficiency 0.855,
    6% below the shipped 0.910, which PyTorch's Llama MLPs pull up with Azure's rows at a
    sustained clock of their own (tests/test_pytorch_ops.py)."""
    profile = load_profile(name)
    fit = fit_gemm_rates(AZURE_ROWS, profile)
    assert fit.efficiency == pytest.approx(0.855, abs=0.001)
    assert fit.k_overhead == pytest.approx(profile.gemm_k_overhead, abs=1)
    assert fit.latency_us == pytest.approx(profile.gemm_latency_s * 1e6, abs=0.005) == 0
    assert fit.rate("gemm_latency_us").std == pytest.approx(2.2, abs=0.05)
    held = fit_gemm_rates(AZURE_ROWS, profile, held=("gemm_latency_us",))
    assert held.rate("gemm_efficiency").rel_std == pytest.approx(0.05, abs=0.01)
    assert held.rate("gemm_k_overhead").rel_std == pytest.approx(0.21, abs=0.02)
    assert held.rms(AZURE_ROWS) == pytest.approx(0.07, abs=0.005)


PYTORCH = reference_data("h100_pytorch_gemms.yaml")


@pytest.mark.parametrize("name", ["h100-jlse", "dgx-h100"])
def test_the_shipped_h100_gemm_rates_are_what_the_fit_gives_on_pytorchs_gemms(name):
    """The node probe's 30 GEMMs as PyTorch runs them on an H100 (a Llama block's projections
    at 2048 and 8192 tokens, eager attention's batched products), each one call timed between
    CUDA events on an idle GPU, so each time holds the host's launch of the call: fitted with
    that launch (16.8 us, 13%) and the latency held at XLA's, the efficiency, tile cost and
    streaming rate are pinned (standard errors 1%, 14%, 3%), rms 3.7%, every product within
    9.3%; the data file's launch delay is the fit's."""
    profile = load_profile(name)
    fit = fit_gemm_rates(PYTORCH_ROWS, profile, launch_in_timing=True)
    assert fit.efficiency == pytest.approx(profile.gemm_efficiency, abs=0.001)
    assert fit.k_overhead == pytest.approx(profile.gemm_k_overhead, abs=1)
    memory = fit.rate("gemm_memory_efficiency")
    assert memory.value == pytest.approx(profile.gemm_memory_efficiency, abs=0.001)
    latency = fit.rate("gemm_latency_us")
    assert (latency.held, latency.beside_launch, latency.value) == (True, True, 4.78)
    assert fit.launch_delay.value == pytest.approx(PYTORCH["launch_delay_us"]["value"],
                                                   abs=0.01)
    assert [round(fit.rate(key).rel_std, 2) for key in RATE_KEYS] == [0.01, 0.14, 0.0, 0.03]
    assert round(fit.launch_delay.rel_std, 2) == 0.13
    assert fit.rms(PYTORCH_ROWS) == pytest.approx(0.037, abs=0.001)
    assert max(abs(e) for e in fit.errors(PYTORCH_ROWS)) == pytest.approx(0.093, abs=0.001)


def test_fitted_without_the_launch_the_short_calls_come_out_fast_and_the_long_ones_slow():
    """What the profiles carried before the launch was fitted: the latency held at XLA's and
    nothing added, the launch went into the rates (0.763 of peak, 129 steps, 0.734 of HBM),
    and the residuals kept its shape: the calls of about 150 us (the 3072-wide block's
    micro-batch-1 projections) 18% and 28% fast, the widest micro-batch-4 ones 6-8% slow."""
    fit = fit_gemm_rates(PYTORCH_ROWS, load_profile("dgx-h100"), held=("gemm_latency_us",))
    assert (round(fit.efficiency, 3), round(fit.k_overhead),
            round(fit.rate("gemm_memory_efficiency").value, 3)) == (0.763, 129, 0.734)
    assert fit.rms(PYTORCH_ROWS) == pytest.approx(0.070, abs=0.001)
    assert [round(e, 3) for e in fit.errors(PYTORCH_ROWS) if abs(e) > 0.08] == [0.178, 0.276]
    assert fit.launch_delay is None


def test_a_launch_is_only_told_from_the_latency_with_the_latency_held():
    """The two add up: fitted together they are one constant, so --launch-in-timing holds the
    latency (at XLA's kernel-only 4.78 us) and fits the rest; with the latency free and no
    launch the constant lands in the latency, 21.6 us, with the same rates."""
    profile = load_profile("dgx-h100")
    free = fit_gemm_rates(PYTORCH_ROWS, profile)
    launched = fit_gemm_rates(PYTORCH_ROWS, profile, launch_in_timing=True)
    assert free.latency_us == pytest.approx(4.78 + launched.launch_delay.value, abs=0.01)
    assert free.efficiency == pytest.approx(launched.efficiency, abs=1e-4)
    assert free.modelled_tflops == pytest.approx(launched.modelled_tflops, rel=1e-6)


@pytest.mark.parametrize("name", ["h100-jlse", "dgx-h100"])
def test_xlas_autotuned_kernels_run_faster_than_pytorchs(name):
    """XLA's table of 375 shapes, every value free: its kernels reach 0.924 of peak with 216
    steps of tile cost and stream at 0.87 (rms 9.5%), and its latency is the profiles' (the
    only H100 table with small shapes). With PyTorch's values the model runs XLA's 20 large
    products 2-9% slower than XLA did."""
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
    assert len(large) == 20 and -0.10 < min(large) < max(large) < -0.015


def test_the_gh200_takes_the_h100s_gemm_rates():
    """The same die: the tables are of an H100 SXM, whose HBM the fit uses, so the GH200
    (faster HBM) takes the values rather than a refit on its own profile."""
    h100, gh200 = load_profile("dgx-h100"), load_profile("gh200")
    assert ((gh200.gemm_efficiency, gh200.gemm_k_overhead, gh200.gemm_latency_s,
             gh200.gemm_memory_efficiency)
            == (h100.gemm_efficiency, h100.gemm_k_overhead, h100.gemm_latency_s,
                h100.gemm_memory_efficiency))


H200_PROBE = Path(__file__).parents[1] / "benchmarks" / "node_probe"


def test_the_h200s_tile_cost_and_streaming_rate_are_what_its_probe_gives():
    """The node probe's 30 block GEMMs on an H200 SXM, kernel time of 10 calls behind a lead
    call (no launch in them), the latency held at the H100's: 0.768 of peak, 99 steps of K and
    0.817 of HBM peak, rms 8.5%; dgx-h200 ships the last two. Its efficiency comes from the
    power probe below: these 30 mix products timed at the full clock with products timed
    under the power cap (the long ones 12-21% under the H100's values, the short 4-10% over)."""
    table = load_gemm_table(H200_PROBE / "h200_2026-12-04_ghijc.json")
    assert not table.launch_in_timing
    h200 = replace(load_profile("dgx-h200"), sm_clock_fraction=1.0)
    fit = fit_gemm_rates(table.rows, h200, ("gemm_latency_us",))
    assert (round(fit.efficiency, 3), round(fit.k_overhead),
            round(fit.rate("gemm_memory_efficiency").value, 3)) == (0.768, 99, 0.817)
    assert fit.rms(table.rows) == pytest.approx(0.085, abs=0.001)
    assert (h200.gemm_k_overhead, h200.gemm_memory_efficiency) == (99, 0.817)


def test_the_h200s_gemm_efficiency_is_a_bursts_and_its_clock_fraction_a_long_runs():
    """gemm_power_probe.py on an H200 SXM, random operands: 10 products back to back fit 0.841
    of peak (gpu.gemm_efficiency), 200 back to back, where the SM clock falls to 1455-1500 MHz
    under the 700 W cap, 0.731: their ratio is gpu.sm_clock_fraction. The H100's values at
    the full clock meet the long runs 7-13% fast."""
    held = ("gemm_latency_us", "gemm_k_overhead", "gemm_memory_efficiency")
    h200 = load_profile("dgx-h200")
    full_clock = replace(h200, sm_clock_fraction=1.0)
    burst_rows = read_gemm_table(H200_PROBE / "h200_gemm_power_2026-12-04_burst.csv")
    long_rows = read_gemm_table(H200_PROBE / "h200_gemm_power_2026-12-04_sustained.csv")
    burst = fit_gemm_rates(burst_rows, full_clock, held)
    long_run = fit_gemm_rates(long_rows, full_clock, held)
    assert round(burst.efficiency, 3) == h200.gemm_efficiency == 0.841
    assert round(long_run.efficiency, 3) == 0.731
    assert round(long_run.efficiency / burst.efficiency, 3) == h200.sm_clock_fraction
    assert max(abs(e) for e in burst.errors(burst_rows)) < 0.052
    assert max(abs(e) for e in long_run.errors(long_rows)) < 0.03
    h100_values = fit_gemm_rates(long_rows, replace(full_clock, gemm_efficiency=0.810,
                                                    gemm_k_overhead=113,
                                                    gemm_memory_efficiency=0.826), RATE_KEYS)
    assert [round(e, 3) for e in h100_values.errors(long_rows)] == [0.12, 0.072, 0.125]


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


def test_fit_gemm_fits_the_launch_of_a_table_timed_one_call_at_a_time(tmp_path):
    lines = ["batch,m,n,k,TFLOPS"] + [f"{r.batch},{r.m},{r.n},{r.k},{r.tflops}"
                                      for r in PYTORCH_ROWS]
    path = _table(tmp_path, "\n".join(lines) + "\n")
    result = CliRunner().invoke(main, ["fit-gemm", str(path), "--profile", "dgx-h100",
                                       "--launch-in-timing"])
    assert result.exit_code == 0, result.output
    assert "2048x3072x3072     506.5     528.5   +4.4%" in result.output
    assert "gemm_efficiency / launch_delay_us +0.59" in result.output
    assert ('gemm_latency_us: {value: 4.78, basis: assumed, source: "zerosim fit-gemm '
            'gemms.csv; held at the profile\'s value: the launch in the table\'s times adds to '
            'it"}') in result.output
    assert ("launch of each call in the table's times (a value of the measurement, not of the "
            "GPU): 16.81 us, standard error 2.16 (13%)") in result.output


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
    ("m,n,k,TFLOPS\n" + "1024,1024,1024,100\n" * 5,
     "rows: expected more than 3 distinct shapes (m, n, k, batch; 3 values are fitted, and "
     "repeats of one shape pin down one rate), got 1 in 5 rows"),
    ("m,n,k,TFLOPS\n1,2,3,4,5\n",
     "row 1: expected 4 fields separated by ',', one per column of the header, got 5 fields"),
    ("m,n,k,TFLOPS\n1,2,3,4\r5,6\n", "row 1: expected fields separated by ',', a line break "
     "only inside a quoted field, got a carriage return inside an unquoted field"),
])
def test_a_bad_table_is_refused_with_where_and_what(tmp_path, text, message):
    path = _table(tmp_path, text)
    with pytest.raises(ScenarioError) as error:
        fit_gemm_rates(read_gemm_table(path), load_profile("dgx-a100"), source=str(path))
    assert str(error.value) == f"{path}: {message}"
    result = CliRunner().invoke(main, ["fit-gemm", str(path), "--profile", "dgx-a100"])
    assert result.exit_code == 2


def test_a_launch_is_one_more_value_the_rows_must_outnumber():
    """Three projections bound by their arithmetic: the streaming rate is held (unbound), so
    the efficiency, the tile cost and the launch are fitted, and three rows are too few."""
    with pytest.raises(ScenarioError) as error:
        fit_gemm_rates(PYTORCH_ROWS[:3], load_profile("dgx-h100"), launch_in_timing=True)
    assert "rows: expected more than 3 measured GEMMs (3 values are fitted), got 3" in str(
        error.value)


PROBE_JSON = Path(__file__).parents[1] / "benchmarks" / "node_probe" / "h100_2026-11-28_gh.json"


def _shape(row: GemmRow) -> tuple[int, int, int, int]:
    return row.batch, row.m, row.n, row.k


def test_the_node_probes_json_holds_the_30_gemms_of_the_reference_table():
    """Read off the probe's records (their operands written in the method text, as that run
    wrote them), one call timed at a time: the same shapes and rates as the shipped table."""
    table = load_gemm_table(PROBE_JSON)
    assert table.launch_in_timing
    read, shipped = sorted(table.rows, key=_shape), sorted(PYTORCH_ROWS, key=_shape)
    assert [_shape(r) for r in read] == [_shape(r) for r in shipped]
    assert [r.tflops for r in read] == pytest.approx([r.tflops for r in shipped], abs=0.001)


def test_fit_gemm_fits_a_node_probe_json_with_its_launch(tmp_path):
    result = CliRunner().invoke(main, ["fit-gemm", str(PROBE_JSON), "--profile", "dgx-h100"])
    assert result.exit_code == 0, result.output
    assert ("the probe timed these GEMMs one call at a time: fitting the launch each time "
            "holds (as --launch-in-timing)") in result.output
    assert "gemm_efficiency: {value: 0.810, basis: fitted, stderr_pct: 1.2" in result.output
    assert "gemm_memory_efficiency: {value: 0.826, basis: fitted" in result.output
    assert "16.81 us, standard error 2.16 (13%)" in result.output


def _probe_json(tmp_path: Path, records: dict) -> Path:
    path = tmp_path / "node.json"
    path.write_text(json.dumps({"results": {"g_block_forward": records}}))
    return path


def test_a_probe_that_timed_its_gemms_back_to_back_holds_no_launch(tmp_path):
    """Records that carry their operands and their calls per timing, as the probe now writes
    them; other results (a layer in ms) are not GEMMs."""
    records = {f"g{i}_TFLOPS": {"value": 700.0 + i, "unit": "TFLOP/s", "method": "alone",
                                "m": 2048 * (1 + i), "n": 4096, "k": 4096, "batch": 1,
                                "calls": 10} for i in range(5)}
    records["layer_ms"] = {"value": 3.5, "unit": "ms", "method": "a block"}
    table = load_gemm_table(_probe_json(tmp_path, records))
    assert not table.launch_in_timing
    assert [(r.m, r.tflops) for r in table.rows] == [(2048 * (1 + i), 700.0 + i)
                                                     for i in range(5)]


@pytest.mark.parametrize(("records", "message"), [
    ({"a_TFLOPS": {"value": 500, "unit": "TFLOP/s", "method": "alone", "m": "big", "n": 4,
                   "k": 5}},
     "results.g_block_forward.a_TFLOPS.m: expected a positive integer, got 'big'"),
    ({"a_TFLOPS": {"value": -1, "unit": "TFLOP/s", "method": "(8 x 4) @ (4 x 2) alone"}},
     "results.g_block_forward.a_TFLOPS.value: expected a positive number, got '-1'"),
    ({"layer_ms": {"value": 3.5, "unit": "ms", "method": "a block"}},
     "results: expected the node probe's GEMM results (sections g and h: TFLOP/s with their "
     "operands), got 'none'"),
])
def test_a_bad_probe_json_is_refused_with_where_and_what(tmp_path, records, message):
    path = _probe_json(tmp_path, records)
    with pytest.raises(ScenarioError) as error:
        load_gemm_table(path)
    assert str(error.value) == f"{path}: {message}"
    result = CliRunner().invoke(main, ["fit-gemm", str(path), "--profile", "dgx-h100"])
    assert result.exit_code == 2
