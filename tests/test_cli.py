"""The command line: exit codes, what it prints, what it writes."""

import json
from pathlib import Path

from click.testing import CliRunner

from zerosim.cli import main

ROOT = Path(__file__).resolve().parent.parent
DP1 = str(ROOT / "scenarios" / "llama13b_dp1.yaml")


def invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_check_prints_the_resolved_scenario():
    result = invoke("check", DP1)
    assert result.exit_code == 0
    assert "sub_group_size" in result.output and "1000000000" in result.output
    assert "study section 3.1" in result.output


def test_check_json_has_defaults_filled_in():
    result = invoke("check", DP1, "--json", "--set", "runtime.deepspeed_version=0.19.5")
    data = json.loads(result.output)
    assert data["deepspeed"]["gradient_clipping"] == 1.0
    assert data["runtime"]["deepspeed_version"] == "0.19.5"


def test_check_with_a_typo_fails_naming_file_and_key(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "scenarios" / "llama13b_dp1.yaml").read_text()
                   .replace("sequence_length", "sequence_lenght"))
    result = CliRunner().invoke(main, ["check", str(bad)])
    assert result.exit_code == 2
    assert f"{bad}: sequence_lenght: expected one of the known keys" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


def test_negative_bandwidth_fails_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["run", DP1, "--out", str(out),
                                       "--set", "hardware.pcie.d2h_pinned_GBps=-1"])
    assert result.exit_code == 2
    assert "hardware.overrides.pcie.d2h_pinned_GBps: expected a positive bandwidth" in (
        result.output)
    assert not out.exists()


def test_run_writes_every_output_file(tmp_path):
    out = tmp_path / "dp1"
    result = invoke("run", DP1, "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "backward (boundary)" in result.output
    names = {p.name for p in out.iterdir()}
    assert {"summary.json", "spans.csv", "memory.csv", "phases.csv", "links.csv", "trace.json",
            "scenario.json"} <= names
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["iteration_s"] > 0
    trace = json.loads((out / "trace.json").read_text())
    assert {e["ph"] for e in trace["traceEvents"]} == {"M", "X", "C"}


def test_run_json_prints_the_summary():
    result = invoke("run", DP1, "--no-files", "--json")
    summary = json.loads(result.output)
    assert set(summary["phases_s"]) == {"forward", "backward_non_boundary", "backward_boundary",
                                        "update"}


def test_run_of_an_unsupported_config_is_refused_clearly():
    nvme = "deepspeed.zero_optimization.offload_param.device=nvme"
    path = "deepspeed.zero_optimization.offload_param.nvme_path=/local_nvme"
    result = CliRunner().invoke(main, ["run", DP1, "--no-files", "--set", nvme, "--set", path])
    assert result.exit_code == 2
    assert "offload_param.device='nvme' is not modelled" in result.output
