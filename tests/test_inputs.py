"""The input boundary (zerosim.inputs): every hostile input of issue 15 is refused with one
line naming the file, the key path, what was expected and what was given, in bounded time.

Each test is one case the issue lists; `check` and `run` share the loader, so a refusal here
is a refusal of both (tests/test_faults.py runs the command line).
"""

from __future__ import annotations

import copy
import json
import time
from datetime import date
from pathlib import Path

import pytest
import yaml
from conftest import minimal

from zerosim import load_scenario
from zerosim.errors import ScenarioError, shown
from zerosim.hardware.profile import profile_names
from zerosim.inputs import PLAUSIBLE
from zerosim.inputs.plausible import Plausible, rule_for
from zerosim.scenario import scenario_from_dict
from zerosim.yamlio import copy_tree

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "zerosim" / "hardware" / "profiles" / "h100-jlse.yaml"
HF_CONFIG = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2,
             "intermediate_size": 512, "num_attention_heads": 4, "vocab_size": 1000}
ELEMENTS = "a number of elements in [1, 1e+15]"


def refusal(tree=None, overrides=None) -> str:
    with pytest.raises(ScenarioError) as caught:
        scenario_from_dict(tree or minimal(), source="s.yaml", overrides=overrides)
    return str(caught.value)


def file_refusal(path: Path) -> str:
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    return str(caught.value)


def write_scenario(folder: Path, tree) -> Path:
    path = folder / "s.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


# ------------------------------------------------------------------ numbers: finite, in range


@pytest.mark.parametrize(("override", "message"), [
    ("deepspeed.zero_optimization.reduce_bucket_size=.inf",
     f"deepspeed.zero_optimization.reduce_bucket_size: expected {ELEMENTS} (a finite number), "
     "got inf"),
    ("deepspeed.zero_optimization.sub_group_size=.inf",
     f"deepspeed.zero_optimization.sub_group_size: expected {ELEMENTS} (a finite number), "
     "got inf"),
    ("deepspeed.zero_optimization.stage3_max_reuse_distance=.inf",
     "deepspeed.zero_optimization.stage3_max_reuse_distance: expected a number of elements in "
     "[0, 1e+15] (a finite number), got inf"),
    ("hardware.pcie.h2d_pageable_GBps=.inf",
     "hardware.overrides.pcie.h2d_pageable_GBps: expected a bandwidth in GB/s in [0.001, 1e+09] "
     "(a finite number), got inf"),
    ("hardware.pcie.h2d_pageable_GBps=1e308",
     "hardware.overrides.pcie.h2d_pageable_GBps: expected a bandwidth in GB/s in [0.001, 1e+09], "
     "got 1e+308"),
    ("hardware.nvlink.bus_GBps=1e308",
     "hardware.overrides.nvlink.bus_GBps: expected a bandwidth in GB/s in [0.001, 1e+09], got "
     "1e+308"),
    ("hardware.host.memory_GiB=1e308",
     "hardware.overrides.host.memory_GiB: expected a memory size in GiB in [0.001, 1e+08], got "
     "1e+308"),
    ("hardware.gpu.kernel_gap_us=.inf",
     "hardware.overrides.gpu.kernel_gap_us: expected a time in microseconds in [0, 1e+07] "
     "(a finite number), got inf"),
    ("runtime.framework={stack: megatron-deepspeed, overrides: {host.collective_launch_us: "
     ".inf}}", "runtime.framework.overrides.host.collective_launch_us: expected a finite number "
     ">= 0, got inf"),
    ("runtime.framework={stack: megatron-deepspeed, overrides: {host.kernel_launch_us: 1e30}}",
     "runtime.framework.overrides.host.kernel_launch_us: expected a time in microseconds in "
     "[0, 1e+07], got 1e+30"),
    ("hardware.host.cpu_boost_GHz=1e308",
     "hardware.overrides.host.cpu_boost_GHz: expected a clock in GHz in [0.001, 100], got "
     "1e+308"),
    ("hardware.cpu.cast_threads=.inf",
     "hardware.overrides.cpu.cast_threads: expected an effective thread count in [0.001, "
     "1000000] (a finite number), got inf"),
    ("hardware.gpu.gemm_efficiency=1e-300",
     "hardware.overrides.gpu.gemm_efficiency: expected a fraction in [0.0001, 1], got 1e-300"),
    ("hardware.gpu.gemm_k_overhead=1e9",
     "hardware.overrides.gpu.gemm_k_overhead: expected a number of K elements in [0, 100000], "
     "got 1000000000.0"),
    ("runtime.cpu_threads_per_rank=1e30",
     "runtime.cpu_threads_per_rank: expected a thread count in [1, 16384], got 1e+30"),
    ("runtime.cpu_threads_per_rank=" + "1" + "0" * 30,
     "runtime.cpu_threads_per_rank: expected a thread count in [1, 16384], got 1" + "0" * 30),
    ("model.num_hidden_layers=1e30",
     "model.num_hidden_layers: expected a positive integer, got 1e+30"),
    ("model.num_hidden_layers=" + "1" + "0" * 30,
     "model.num_hidden_layers: expected a layer count in [1, 10000], got 1" + "0" * 30),
    ("deepspeed.gradient_accumulation_steps=1e9",
     "deepspeed.gradient_accumulation_steps: expected a micro-batch count in [1, 65536], got "
     "1000000000.0"),
])
def test_numbers_outside_their_plausible_range_are_refused(override, message):
    assert refusal(overrides=[override]) == f"s.yaml: {message}"


@pytest.mark.parametrize(("override", "message"), [
    ("deepspeed.zero_optimization.stage=true",
     "deepspeed.zero_optimization.stage: expected a ZeRO stage in [0, 3] (a number, not "
     "true/false), got true"),
    ("data_parallel=true",
     "data_parallel: expected a rank count in [1, 1000000] (a number, not true/false), got true"),
    ("sequence_length=true",
     "sequence_length: expected a sequence length in tokens in [1, 1e+08] (a number, not "
     "true/false), got true"),
    ("hardware.gpu.per_node=true", "hardware.overrides.gpu.per_node: expected a positive "
     "integer, got true"),
    ("trainer.gradient_accumulation_steps=true", "trainer.gradient_accumulation_steps: expected "
     "a micro-batch count in [1, 65536] (a number, not true/false), got true"),
])
def test_booleans_are_never_numbers(override, message):
    assert refusal(overrides=[override]) == f"s.yaml: {message}"


@pytest.mark.parametrize("key", ["what_if.overlap_copy_back", "what_if.buffer_boundary_grads",
                                 "activation_checkpointing"])
def test_the_scenarios_own_switches_are_never_numbers(key):
    """A switch given as 1 is refused rather than read as true: the neighbouring
    `what_if.gpu_update_every` is a count, and a count in a switch is a mistake to name."""
    assert refusal(overrides=[f"{key}=1"]) == f"s.yaml: {key}: expected true or false, got 1"


def test_every_range_is_wide_enough_for_the_shipped_scenarios_and_profiles():
    """The ranges refuse nothing real: every shipped scenario and profile loads."""
    for path in [*sorted((ROOT / "scenarios").glob("*.yaml")),
                 *sorted((ROOT / "scenarios" / "seed003").glob("*.yaml"))]:
        load_scenario(path)


def test_every_row_of_the_table_is_a_real_range():
    for key, rule in PLAUSIBLE.items():
        if isinstance(rule, Plausible):
            assert rule.low <= rule.high, key
    assert rule_for("hardware.gpu.hbm_GBps").what == "a bandwidth in GB/s"
    assert rule_for("hardware.pcie.latency_us").what == "a time in microseconds"
    assert rule_for("hardware.new_part.some_future_GBps").what == "a bandwidth in GB/s"


# ------------------------------------------------------------------ texts


def test_a_million_character_name_is_refused_at_once(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: " + "n" * 1_000_000 + "\n" + yaml.safe_dump(minimal()))
    started = time.perf_counter()
    message = file_refusal(path)
    assert time.perf_counter() - started < 5
    assert message == (f"{path}: line 1: expected a text of at most 65536 characters, got one "
                       "of 1000000")


@pytest.mark.parametrize(("name", "got"), [
    ("n" * 300, "a text of 300 characters"),
    ("../../etc", "'../../etc'"),
    ("a/b", "'a/b'"),
    ("\u00e9" * 128, "a text of 256 bytes in UTF-8"),   # 128 characters, more than run takes
])
def test_a_scenario_name_must_be_a_short_folder_name(name, got):
    assert refusal(minimal(name=name)) == (
        "s.yaml: name: expected a text of 1 to 128 characters usable as a folder name (at most "
        "230 bytes in UTF-8, no '/', '\\' or control characters, not starting with '.'), got "
        f"{got}")


def test_the_longest_name_is_the_longest_output_folder_name():
    from zerosim.inputs.plausible import FOLDER_NAME_MAX_BYTES
    from zerosim.results.folders import NAME_MAX_BYTES, STAGING_PREFIX

    assert NAME_MAX_BYTES - len(STAGING_PREFIX) - len("0123abcd") == FOLDER_NAME_MAX_BYTES


# ------------------------------------------------------------------ YAML and JSON documents


def test_duplicate_yaml_keys_are_refused_naming_both_lines(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("model: llama2-7b\nsequence_length: 1024\nmodel: llama2-13b\n")
    assert file_refusal(path) == (f"{path}: line 3: expected each key once in a mapping, got "
                                  "'model' again (first on line 1)")


def test_duplicate_keys_on_one_line_and_merge_keys(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("deepspeed: {fp16: {enabled: true, enabled: false}}\n")
    assert file_refusal(path) == (f"{path}: line 1: expected each key once in a mapping, got "
                                  "'enabled' again (first on line 1)")
    base = yaml.safe_dump(minimal())
    path.write_text("defaults: &d {fp16: {enabled: true}}\n" + base.replace(
        "deepspeed:\n", "deepspeed:\n  <<: *d\n"))
    with pytest.raises(ScenarioError, match="defaults: expected one of the known keys"):
        load_scenario(path)


def test_duplicate_json_keys_are_refused(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 256, "hidden_size": 512}')
    path = write_scenario(tmp_path, minimal(model={"hf_config": "config.json"}))
    assert file_refusal(path) == (f"{tmp_path / 'config.json'}: hidden_size: expected each key "
                                  "once in an object, got 'hidden_size' twice")


def test_numbers_of_5000_digits_are_refused(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(minimal()) + "data_parallel: " + "9" * 5000 + "\n")
    assert file_refusal(path).endswith("expected a number of at most 100 characters, got one "
                                       "of 5000")
    (tmp_path / "config.json").write_text(json.dumps(HF_CONFIG)[:-1] + ', "x": '
                                          + "9" * 5000 + "}")
    path = write_scenario(tmp_path, minimal(model={"hf_config": "config.json"}))
    assert file_refusal(path) == (f"{tmp_path / 'config.json'}: <root>: expected numbers of at "
                                  "most 100 characters, got one of 5000")


def test_a_5000_digit_version_is_refused():
    assert refusal(overrides=[f"runtime.deepspeed_version='0.13.{'3' * 5000}'"]) == (
        "s.yaml: runtime.deepspeed_version: expected a DeepSpeed version like \"0.13.3\" (quote "
        f"it), got '0.13.{'3' * 71}...")


def test_json_nan_and_infinity_are_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**HF_CONFIG, "hidden_dropout": math_nan()}))
    path = write_scenario(tmp_path, minimal(model={"hf_config": "config.json"}))
    assert file_refusal(path) == (f"{tmp_path / 'config.json'}: <root>: expected standard JSON "
                                  "(no NaN or Infinity), got NaN")


def math_nan() -> float:
    return float("nan")


def test_yaml_nested_thousands_deep_is_refused(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("model: " + "[" * 5000 + "]" * 5000 + "\n")
    assert file_refusal(path) == (f"{path}: line 1: expected at most 32 levels of nesting, got "
                                  "deeper nesting")
    (tmp_path / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    path = write_scenario(tmp_path, minimal(model={"hf_config": "config.json"}))
    assert file_refusal(path) == (f"{tmp_path / 'config.json'}: <root>: expected at most 32 "
                                  "levels of nesting, got deeper nesting")


def billion_laughs(key: str) -> str:
    lines = ['l0: &l0 "lol"\n']
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10)]
    return "".join(lines) + f"{key}: *l9\n"


@pytest.mark.parametrize("where", ["description", "hardware"])
def test_an_alias_bomb_is_refused_at_once(tmp_path, where):
    path = tmp_path / "s.yaml"
    tree = minimal()
    del tree["hardware" if where == "hardware" else "model"]
    bomb = billion_laughs(where)
    if where == "hardware":
        bomb = bomb.replace("hardware: *l9", "hardware: {name: x, nodes: 1, gpu: *l9}")
    else:
        bomb += "model: llama2-7b\n"
    path.write_text(yaml.safe_dump(tree) + bomb)
    started = time.perf_counter()
    message = file_refusal(path)
    assert time.perf_counter() - started < 5
    assert message == (f"{path}: line 1: expected at most 100000 values with aliases expanded, "
                       "got more (an alias bomb?)")


def test_a_tree_is_copied_as_deepcopy_copies_it():
    """`copy_tree` (every reader's own copy of a parsed text) gives what `copy.deepcopy`
    gives: an aliased mapping or list stays one object, scalars are shared, anything else is
    deep-copied, and the copy shares no mapping or list with the original."""
    tree = yaml.safe_load("a: &x {b: [1, 2.5, true, null, {c: d}]}\nalias: *x\n"
                          "list: &l [1, [2]]\nagain: *l\n")
    tree["when"] = date(2024, 1, 2)
    tree[(1, 2)] = {"set": {3, 4}}
    copied = copy_tree(tree)
    assert copied == copy.deepcopy(tree)
    assert copied["a"] is copied["alias"] and copied["list"] is copied["again"]
    assert copied["a"] is not tree["a"] and copied["a"]["b"][4] is not tree["a"]["b"][4]
    assert copied["list"][1] is not tree["list"][1]
    assert copied[(1, 2)]["set"] is not tree[(1, 2)]["set"]


def test_a_recursive_alias_is_refused(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("description: &a [*a]\n")
    assert file_refusal(path) == (f"{path}: line 1: expected no alias inside its own anchor, "
                                  "got a recursive alias")


def test_an_invalid_date_is_a_yaml_error_not_a_crash(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("description: 2020-13-45\n")
    assert file_refusal(path) == (f"{path}: line 1: expected a valid date (or quote the text), "
                                  "got '2020-13-45'")


# ------------------------------------------------------------------ files: encoding and kind


ENCODED = {
    "latin-1": ("# caf\u00e9\n".encode("latin-1"), "byte 0xe9 at offset 5 is not UTF-8"),
    "utf-16": ("model: x\n".encode("utf-16"), "UTF-16 text"),
    "random bytes": (bytes(range(128, 160)), "byte 0x80 at offset 0 is not UTF-8"),
}


@pytest.mark.parametrize("encoding", sorted(ENCODED))
@pytest.mark.parametrize("document", ["scenario", "profile", "ds_config", "hf_config"])
def test_files_that_are_not_utf8_are_refused_naming_the_reference(tmp_path, encoding,
                                                                  document):
    data, reason = ENCODED[encoding]
    bad = tmp_path / "bad.bin"
    bad.write_bytes(data)
    if document == "scenario":
        assert file_refusal(bad) == f"{bad}: <root>: expected UTF-8 text, got {bad} ({reason})"
        return
    key, tree = {
        "profile": ("hardware.file", minimal(hardware={"file": "bad.bin"})),
        "ds_config": ("deepspeed.file", minimal(deepspeed={"file": "bad.bin"})),
        "hf_config": ("model.hf_config", minimal(model={"hf_config": "bad.bin"})),
    }[document]
    path = write_scenario(tmp_path, tree)
    assert file_refusal(path) == f"{path}: {key}: expected UTF-8 text, got {bad} ({reason})"


def test_a_utf8_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_bytes(yaml.safe_dump(minimal()).encode("utf-8-sig"))
    assert load_scenario(path).model.name == "llama2-7b"


@pytest.mark.parametrize(("key", "tree", "what"), [
    ("hardware.file", minimal(hardware={"file": "folder"}), "file"),
    ("deepspeed.file", minimal(deepspeed={"file": "folder"}), "file"),
    ("model.hf_config", minimal(model={"hf_config": "folder"}), "config.json file"),
])
def test_a_folder_where_a_file_belongs_is_refused(tmp_path, key, tree, what):
    (tmp_path / "folder").mkdir()
    path = write_scenario(tmp_path, tree)
    assert file_refusal(path) == (f"{path}: {key}: expected a {what}, not a folder, got "
                                  f"{tmp_path / 'folder'} (a folder)")


@pytest.mark.parametrize(("key", "tree", "what"), [
    ("hardware.file", minimal(hardware={"file": ""}), "a hardware profile"),
    ("deepspeed.file", minimal(deepspeed={"file": ""}), "a ds_config"),
    ("model.hf_config", minimal(model={"hf_config": ""}), "a Hugging Face config.json"),
])
def test_an_empty_path_is_refused(key, tree, what):
    assert refusal(tree) == (f"s.yaml: {key}: expected the path of {what}, relative to the "
                             "scenario's folder, got an empty path")


def test_a_symlink_loop_is_named_as_one(tmp_path):
    (tmp_path / "a.yaml").symlink_to(tmp_path / "b.yaml")
    (tmp_path / "b.yaml").symlink_to(tmp_path / "a.yaml")
    assert file_refusal(tmp_path / "a.yaml") == (
        f"{tmp_path / 'a.yaml'}: <root>: expected an existing file, got {tmp_path / 'a.yaml'} "
        "(a symlink loop)")
    path = write_scenario(tmp_path, minimal(deepspeed={"file": "a.yaml"}))
    assert file_refusal(path) == (f"{path}: deepspeed.file: expected an existing file, got "
                                  f"{tmp_path / 'a.yaml'} (a symlink loop)")


def test_a_fifo_is_refused_without_blocking(tmp_path):
    import os

    os.mkfifo(tmp_path / "pipe")
    path = write_scenario(tmp_path, minimal(deepspeed={"file": "pipe"}))
    assert file_refusal(path) == (f"{path}: deepspeed.file: expected a regular file, got "
                                  f"{tmp_path / 'pipe'} (a FIFO)")


def test_a_file_over_one_mebibyte_is_refused(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("#" * (1 << 20) + "\n")
    assert file_refusal(path) == (f"{path}: <root>: expected a file of at most 1048576 bytes, "
                                  f"got {path} (1048577 bytes)")


# ------------------------------------------------------------------ hardware references


def test_a_provenance_source_is_a_bounded_text():
    override = {"gpu.hbm_GiB": {"value": 80, "basis": "spec", "source": "s" * 5000}}
    assert refusal(minimal(hardware={"profile": "h100-jlse", "overrides": override})) == (
        "s.yaml: hardware.overrides.gpu.hbm_GiB.source: expected a text of 1 to 4000 "
        "characters, got a text of 5000 characters")


def test_profile_and_file_together_are_refused():
    assert refusal(minimal(hardware={"file": "x.yaml", "profile": "h100-jlse"})) == (
        "s.yaml: hardware.file: expected either a catalog profile or a profile file, not both "
        "(hardware.profile is 'h100-jlse'), got 'x.yaml'")


def test_a_profile_name_that_is_a_path_is_refused():
    assert refusal(overrides=["hardware.profile=../profiles/h100-jlse"]) == (
        f"s.yaml: hardware.profile: expected a profile name ({', '.join(profile_names())}; a "
        "profile file is given as {file: path/to/profile.yaml}), got '../profiles/h100-jlse'")


def test_a_nested_override_patches_one_key_and_keeps_the_section():
    nested = scenario_from_dict(minimal(hardware={
        "profile": "h100-jlse", "overrides": {"pcie": {"h2d_pageable_GBps": 12}}}),
        source="s.yaml")
    dotted = scenario_from_dict(minimal(hardware={
        "profile": "h100-jlse", "overrides": {"pcie.h2d_pageable_GBps": 12}}), source="s.yaml")
    assert nested.hardware == dotted.hardware
    assert nested.hardware.h2d_pageable_Bps == 12e9
    assert nested.hardware.h2d_pinned_Bps == 55e9
    assert nested.hardware.provenance["pcie.h2d_pageable_GBps"].basis == "override"


def test_an_error_in_a_nested_override_names_the_scenario_file_and_key():
    assert refusal(minimal(hardware={
        "profile": "h100-jlse", "overrides": {"pcie": {"h2d_pageable_GBps": -2}}})) == (
        "s.yaml: hardware.overrides.pcie.h2d_pageable_GBps: expected a positive bandwidth in "
        "GB/s, got -2")


def test_an_override_that_breaks_another_profile_key_names_the_override():
    """Four GPUs' NUMA map no longer fits eight GPUs per node: the error is about a key the
    user never touched, so it names the profile, the scenario and the override that did it."""
    assert refusal(overrides=["hardware.gpu.per_node=8"]) == (
        "profile h100-jlse as patched by s.yaml (hardware.overrides: gpu.per_node): "
        "gpu.numa_domain: expected a list of 8 NUMA domain indices in [0, 2), got [0, 0, 1, 1]")


# ------------------------------------------------------------------ the optimizer section


def test_a_misspelt_optimizer_key_is_an_error_not_adam():
    assert refusal(overrides=["deepspeed.optimizer.tpye=SGD"]) == (
        "s.yaml: deepspeed.optimizer.tpye: expected one of the keys DeepSpeed reads in "
        "optimizer (type, params, legacy_fusion); did you mean 'type'?, got 'tpye'")


def test_a_misspelt_scheduler_key_is_an_error():
    assert refusal(overrides=["deepspeed.scheduler.parms={warmup_num_steps: 10}"]) == (
        "s.yaml: deepspeed.scheduler.parms: expected one of the keys DeepSpeed reads in "
        "scheduler (type, params); did you mean 'params'?, got 'parms'")


@pytest.mark.parametrize("optimizer", ["SGD", "Lamb", "OneBitAdam"])
def test_an_optimizer_zerosim_does_not_simulate_is_refused_by_name(optimizer):
    assert refusal(overrides=[f"deepspeed.optimizer.type={optimizer}"]) == (
        "s.yaml: deepspeed.optimizer.type: expected Adam, AdamW or CPUAdam (the optimizers "
        f"zerosim models), got '{optimizer}'")


# ------------------------------------------------------------------ bounded error text


def test_error_text_bounds_what_it_quotes():
    assert shown("x" * 1_000_000) == "'" + "x" * 76 + "..."
    assert shown(10 ** 4999) == "an integer of about 5000 digits"
    laughs: list = ["lol"]
    for _ in range(30):
        laughs = [laughs] * 9
    started = time.perf_counter()
    assert len(shown(laughs)) <= 80
    assert time.perf_counter() - started < 1
    assert shown({"a": True, "b": None}) == "{'a': true, 'b': null}"
    long_key = "k" * 10_000
    message = refusal(overrides=[f"{long_key}=1"])
    assert len(message) < 500 and message.startswith("s.yaml: " + "k" * 197 + "...: expected")
