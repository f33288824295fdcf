"""The command line: exit codes, what it prints, what it writes."""

import json
from pathlib import Path

import pytest
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


def test_check_names_the_framework_s_structural_choices():
    """What the stack decides beside its numbers: how a block is cut into modules, the syncs
    before each MLP, whether gathers and reductions share one process group, the parameter
    groups it hands the optimizer, and how many workers each rank's data loader forks."""
    layout = json.loads(invoke("check", DP1, "--json").output)["runtime"]["framework"]["layout"]
    assert layout == {"qkv": "fused", "gate_up": "fused", "output_weight": "external",
                      "syncs_before_mlp": 2, "grouped_qkv": "q_kv",
                      "kv_repeat": "before_rotary", "experts": "per_expert",
                      "moe_block": "hooked", "module_tree": "megatron",
                      "checkpoint_function": "deepspeed", "process_groups": "same",
                      "param_groups": "weight_decay_split", "dataloader_workers": 2,
                      "sequence_parallel": "distributed_attention", "packed_documents": "none"}
    hf = invoke("check", DP1, "--json", "--set", "runtime.framework=hf-transformers")
    assert json.loads(hf.output)["runtime"]["framework"]["layout"] == {
        "qkv": "separate", "gate_up": "separate", "output_weight": "module",
        "syncs_before_mlp": 0, "grouped_qkv": "as_qkv", "kv_repeat": "in_attention",
        "experts": "fused", "moe_block": "hooked", "module_tree": "transformers",
        "checkpoint_function": "torch", "process_groups": "separate",
        "param_groups": "one", "dataloader_workers": 0, "sequence_parallel": "ulysses_hf",
        "packed_documents": "varlen"}
    text = " ".join(invoke("check", DP1).output.split())
    assert "process_groups same" in text and "dataloader_workers 2" in text


def test_check_says_whether_the_ranks_pools_oversubscribe_the_node():
    """The study's DP=4: four unbound ranks of 96 OpenMP threads (one per physical core) on
    192 hardware threads: x2, 192 / (1 + 0.702) threads' worth of throughput, and each
    region waits 1.28 ms x (2 - 1); 48 threads a rank fill the node without oversubscribing."""
    dp4 = str(ROOT / "scenarios" / "llama13b_dp4.yaml")
    pools = json.loads(invoke("check", dp4, "--json").output)["runtime"]["cpu_pools"]
    assert pools == {"ranks_on_node": 4, "threads_per_rank": 96, "hardware_threads": 192,
                     "oversubscription": 2.0, "capacity_threads": 192 / (1 + 0.702 * (2 - 1)),
                     "region_wait_ms": pytest.approx(1.28, rel=1e-12)}
    text = " ".join(invoke("check", dp4).output.split())
    assert ("4 ranks x 96 OpenMP threads on 192 hardware threads: oversubscribed x2.00, 113 "
            "threads' worth of throughput shared, each OpenMP region waits 1.28 ms more "
            "(runtime.cpu_threads_per_rank 48 would not oversubscribe)") in text
    fits = invoke("check", dp4, "--set", "runtime.cpu_threads_per_rank=48").output
    assert "4 ranks x 48 OpenMP threads on 192 hardware threads: not oversubscribed" in " ".join(
        fits.split())


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


def test_run_says_when_its_trace_is_large_and_what_writes_a_smaller_one(tmp_path, monkeypatch):
    """Past `report.LARGE_TRACE_BYTES` the summary names trace.json's size and
    --compact-trace; a compact trace, or a small one, gets no such line."""
    import zerosim.report

    small = invoke("run", DP1, "--out", str(tmp_path / "small"))
    size = (tmp_path / "small" / "trace.json").stat().st_size
    monkeypatch.setattr(zerosim.report, "LARGE_TRACE_BYTES", size - 1)
    large = invoke("run", DP1, "--out", str(tmp_path / "large"))
    compact = invoke("run", DP1, "--out", str(tmp_path / "compact"), "--compact-trace")
    assert "--compact-trace" not in small.stdout and "--compact-trace" not in compact.stdout
    assert f"trace.json is {size / 1e6:,.0f} MB" in large.stdout
    assert "--compact-trace keeps one rank per group" in " ".join(large.stdout.split())


def test_run_json_prints_the_summary():
    result = invoke("run", DP1, "--no-files", "--json")
    summary = json.loads(result.output)
    assert set(summary["phases_s"]) == {"forward", "backward_non_boundary", "backward_boundary",
                                        "update"}


def _other_readings(*sets: str) -> str:
    """`zerosim run`'s `other readings` line of DP1 with `sets`, joined ('' without one)."""
    result = invoke("run", DP1, "--no-files", "--no-progress",
                    *(arg for key in sets for arg in ("--set", key)))
    lines = result.stdout.splitlines()
    start = [i for i, line in enumerate(lines) if line.startswith("other readings")]
    if not start:
        return ""
    end = next(i for i, line in enumerate(lines) if line.startswith("simulated in"))
    return " ".join(" ".join(lines[start[0]:end]).split())


def test_run_names_the_profiles_other_readings_and_what_runs_them():
    """The study node's three alternatives; with one taken, the other two; a profile with none
    (`rtx4090-workstation`), no line."""
    tail = ("(zerosim sensitivity runs each beside these values, --set "
            "hardware.alternative=NAME one)")
    assert _other_readings() == ("other readings of h100-jlse's data: stream_host_memory, "
                                 "power_capped_clock, fresh_flush_pages " + tail)
    assert _other_readings("hardware.alternative=power_capped_clock") == (
        "other readings of h100-jlse's data: stream_host_memory, fresh_flush_pages " + tail)
    assert _other_readings("hardware=rtx4090-workstation") == ""


REFUSED = [
    # DeepSpeed offloads the optimizer only under ZeRO 1-3
    ("deepspeed.zero_optimization.stage=0", "offload_optimizer.device"),
    # parameter offload is a ZeRO-3 feature
    ("deepspeed.zero_optimization.stage=2", "offload_param.device",
     "deepspeed.zero_optimization.offload_param.device=cpu"),
    # the study's what-ifs change the offloaded ZeRO-3 replay only
    ("deepspeed.zero_optimization.stage=1", "what_if.overlap_copy_back",
     "what_if.overlap_copy_back=true"),
    # NVMe offload of the optimizer is a ZeRO-3 feature
    ("deepspeed.zero_optimization.stage=2", "offload_optimizer.device",
     "deepspeed.zero_optimization.offload_optimizer.device=nvme",
     "deepspeed.zero_optimization.offload_optimizer.nvme_path=/local_nvme"),
    # a node without drives
    ("hardware.nvme.drives_per_node=0", "offload_optimizer.device",
     "deepspeed.zero_optimization.offload_optimizer.device=nvme",
     "deepspeed.zero_optimization.offload_optimizer.nvme_path=/local_nvme"),
    # DeepSpeed runs out of swap buffers at its first step
    ("deepspeed.zero_optimization.offload_optimizer.pipeline_read=true",
     "offload_optimizer.buffer_count",
     "deepspeed.zero_optimization.offload_optimizer.device=nvme",
     "deepspeed.zero_optimization.offload_optimizer.nvme_path=/local_nvme"),
]


def test_check_and_run_refuse_the_same_configurations_with_the_same_line():
    """What is supported is decided when the scenario is resolved: `check` refuses what `run`
    refuses, with the same message (file, key path, expected, got) and exit status 2."""
    for setting, key, *more in REFUSED:
        sets = [arg for s in (setting, *more) for arg in ("--set", s)]
        checked = CliRunner().invoke(main, ["check", DP1, *sets])
        ran = CliRunner().invoke(main, ["run", DP1, "--no-files", *sets])
        assert checked.exit_code == ran.exit_code == 2
        assert checked.output == ran.output
        assert f"deepspeed.zero_optimization.{key}" in ran.output or key in ran.output
        assert ran.output.startswith(f"error: {DP1}")


@pytest.mark.parametrize(("setting", "key"), [
    ("deepspeed.zero_optimization.reduce_bucket_size=-5",
     "deepspeed.zero_optimization.reduce_bucket_size: expected a number > 0, got -5"),
    ("hardware.pcie.h2d_pinned_GBps=-1",
     "hardware.overrides.pcie.h2d_pinned_GBps: expected a positive bandwidth in GB/s, got -1"),
])
def test_a_refused_set_is_named_beside_the_file(setting, key):
    result = CliRunner().invoke(main, ["check", DP1, "--set", "sequence_length=512", "--set",
                                       setting])
    assert (result.exit_code, result.output) == (2, f"error: {DP1} with --set {setting}: {key}\n")


def test_check_cuts_the_model_as_the_scenarios_stack_does():
    """Qwen3-30B-A3B under the hf stack: transformers 5 holds each layer's 128 experts in one
    module, so the breakdown lists one experts module a layer, not 6,144 expert MLPs."""
    config = ROOT / "tests" / "data" / "real_configs" / "models" / "Qwen3-30B-A3B" / "config.json"
    hf = ("--set", f"model.hf_config={config}", "--set", "runtime.framework=hf-transformers")
    text = invoke("check", DP1, *hf).output
    assert "q/k norms, 128 experts of 768 (top 8) in 48 layers" in " ".join(text.split())
    rows = [line.split() for line in text.splitlines() if line.startswith("layers.*.mlp.")]
    assert [row[:3] for row in rows] == [["layers.*.mlp.gate", "linear", "48"],
                                         ["layers.*.mlp.experts", "experts", "48"]]
    per_expert = invoke("check", DP1, *hf, "--set", "stack.modules.experts.value=per_expert")
    assert "layers.*.mlp.experts.*.down_proj" in per_expert.output


def test_an_unknown_key_of_an_optional_section_lists_that_sections_keys():
    result = CliRunner().invoke(main, ["check", DP1, "--set", "trainer.learning_rate=1"])
    assert (result.exit_code, result.output) == (
        2, f"error: {DP1} with --set trainer.learning_rate=1: trainer.learning_rate: expected "
           "one of the known keys "
           "(gradient_accumulation_steps, max_grad_norm, per_device_train_batch_size), got "
           "'learning_rate'\n")


def test_estimates_version_warning_and_error_are_one_line_each():
    newer = invoke("estimate", "--model", "llama2-7b", "--deepspeed-version", "0.99.0")
    assert newer.output.startswith("warning: zerosim estimate: --deepspeed-version: 0.99.0 is "
                                   "newer than the newest DeepSpeed release zerosim knows")
    assert "Warning:" not in newer.output and "return callback" not in newer.output
    bad = CliRunner().invoke(main, ["estimate", "--model", "llama2-7b", "--deepspeed-version",
                                    "banana"])
    assert (bad.exit_code, bad.output) == (
        2, "error: zerosim estimate: --deepspeed-version: expected a DeepSpeed version like "
           "\"0.13.3\" (quote it), got 'banana'\n")


def test_estimate_takes_the_largest_module_as_the_framework_cuts_it():
    """DeepSpeed's `_all_live` estimate reads the largest module of the model as built: under
    transformers 5 a Qwen3-30B-A3B block's 128 experts are one module of 603,979,776
    parameters; as a module list its largest is the embedding (311,164,928)."""
    config = str(ROOT / "tests" / "data" / "real_configs" / "models" / "Qwen3-30B-A3B"
                 / "config.json")
    listed = json.loads(invoke("estimate", "--hf-config", config, "--json").output)
    fused = json.loads(invoke("estimate", "--hf-config", config, "--json",
                              "--framework", "hf-transformers").output)
    assert listed["largest_layer_params"] == 311_164_928
    assert fused["largest_layer_params"] == 603_979_776
    assert fused["model"]["largest_module_params"] == 603_979_776
    refused = invoke("estimate", "--hf-config", config, "--framework", "keras")
    assert refused.exit_code == 2 and "--framework: expected one of hf-transformers" in (
        refused.output)
    checked = json.loads(invoke("check", config, "--json", "--framework",
                                "hf-transformers").output)
    assert checked["largest_module_params"] == 603_979_776
    assert invoke("check", DP1, "--framework", "hf-transformers").exit_code == 2
