"""Scenario loading, overrides, DeepSpeed defaults by version, and error messages."""

import json
import warnings
from pathlib import Path

import pytest
import yaml
from conftest import minimal

from zerosim import load_scenario
from zerosim.errors import ScenarioError
from zerosim.scenario import UnmodelledKeysWarning, scenario_from_dict
from zerosim.scenario.support import InertWhatIfWarning

STUDY = Path(__file__).resolve().parent.parent / "scenarios" / "llama13b_dp4.yaml"


def test_study_scenario_resolves():
    s = load_scenario(STUDY)
    assert s.name == "llama2-13b-dp4" and s.data_parallel == 4
    assert s.model.hidden_size == 5120 and s.hardware.name == "h100-jlse"
    assert s.deepspeed.gradient_accumulation_steps == 2
    assert s.deepspeed.reduce_bucket_size == 500_000_000
    assert s.deepspeed.offload_optimizer.pin_memory is True
    assert s.runtime.deepspeed_version == (0, 13, 3)


def test_deepspeed_code_defaults_are_filled_in():
    ds = scenario_from_dict(minimal()).deepspeed
    assert (ds.reduce_bucket_size, ds.allgather_bucket_size, ds.sub_group_size) == (
        500_000_000, 500_000_000, 1_000_000_000)
    assert (ds.stage3_prefetch_bucket_size, ds.stage3_max_live_parameters,
            ds.stage3_max_reuse_distance, ds.stage3_param_persistence_threshold) == (
        50_000_000, 1_000_000_000, 1_000_000_000, 100_000)
    assert ds.overlap_comm is True and ds.contiguous_gradients and ds.reduce_scatter
    assert ds.offload_optimizer.ratio == 1.0
    assert ds.grad_accum_dtype == ds.communication_dtype == "fp16"


def test_overlap_comm_defaults_false_below_stage_3():
    tree = minimal()
    tree["deepspeed"]["zero_optimization"]["stage"] = 2
    assert scenario_from_dict(tree).deepspeed.overlap_comm is False


@pytest.mark.parametrize(("version", "pin", "clip"), [
    ("0.13.3", False, 0.0), ("0.19.2", False, 0.0), ("0.19.3", False, 1.0),
    ("0.19.5", True, 1.0),
])
def test_version_dependent_defaults(version, pin, clip):
    ds = scenario_from_dict(minimal(runtime={"deepspeed_version": version})).deepspeed
    assert ds.offload_optimizer.pin_memory is pin
    assert ds.gradient_clipping == clip


def test_default_data_parallel_is_every_gpu_of_the_profile():
    assert scenario_from_dict(minimal()).data_parallel == 4


def test_overrides_by_dotted_path_on_every_section():
    s = load_scenario(STUDY, [
        "deepspeed.zero_optimization.reduce_bucket_size=2e8",
        "data_parallel=2",
        "hardware.pcie.h2d_pageable_GBps=12",
        "model.num_hidden_layers=20",
        "runtime.deepspeed_version=0.19.5",
    ])
    assert s.deepspeed.reduce_bucket_size == 200_000_000
    assert s.data_parallel == 2
    assert s.hardware.h2d_pageable_Bps == 12e9
    assert s.hardware.provenance["pcie.h2d_pageable_GBps"].basis == "override"
    assert s.model.num_hidden_layers == 20 and s.model.hidden_size == 5120
    assert s.runtime.deepspeed_version == (0, 19, 5)


def test_overrides_as_mapping():
    s = load_scenario(STUDY, {"deepspeed.zero_optimization.sub_group_size": 5e8})
    assert s.deepspeed.sub_group_size == 500_000_000


def test_deepspeed_and_hardware_from_files(tmp_path):
    (tmp_path / "ds.json").write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}))
    profile = yaml.safe_load((Path(__file__).resolve().parent.parent / "zerosim" / "hardware"
                              / "profiles" / "h100-jlse.yaml").read_text())
    profile["name"] = "my-node"
    (tmp_path / "node.yaml").write_text(yaml.safe_dump(profile))
    (tmp_path / "hf.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2,
        "intermediate_size": 512, "num_attention_heads": 4, "vocab_size": 1000}))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({
        "model": {"hf_config": "hf.json"}, "sequence_length": 128,
        "hardware": {"file": "node.yaml"}, "deepspeed": {"file": "ds.json"}}))
    s = load_scenario(tmp_path / "s.yaml")
    assert s.deepspeed.dtype == "bf16" and s.deepspeed.train_micro_batch_size_per_gpu == 2
    assert s.hardware.name == "my-node" and s.model.hidden_size == 256


def error_of(tree=None, overrides=None) -> ScenarioError:
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict(tree or minimal(), source="s.yaml", overrides=overrides)
    return err.value


def test_typo_in_a_key_names_file_key_and_the_known_keys():
    err = error_of(overrides=["sequence_lenght=5"])
    assert err.source == "s.yaml" and err.key_path == "sequence_lenght"
    assert "sequence_length" in err.expected


def test_negative_bandwidth_names_the_override_key():
    err = error_of(overrides=["hardware.pcie.h2d_pinned_GBps=-3"])
    assert err.key_path == "hardware.overrides.pcie.h2d_pinned_GBps"
    assert str(err) == ("s.yaml: hardware.overrides.pcie.h2d_pinned_GBps: expected a positive "
                        "bandwidth in GB/s, got -3")


@pytest.mark.parametrize(("override", "key", "expected"), [
    ("deepspeed.zero_optimization.reduce_bucket_size=-5",
     "deepspeed.zero_optimization.reduce_bucket_size", "a number > 0"),
    ("deepspeed.aio.block_size=auto", "deepspeed.aio.block_size", "an integer"),
    ("deepspeed.zero_optimization.stage=5", "deepspeed.zero_optimization.stage", "one of 0, 1, 2"),
    ("deepspeed.zero_optimization.offload_optimizer.devic=cpu",
     "deepspeed.zero_optimization.offload_optimizer.devic", "did you mean 'device'?"),
    ("attention=fast", "attention", "'eager', 'flash', 'sdpa' or 'flash_attention_2'"),
    ("runtime.deepspeed_version=latest", "runtime.deepspeed_version", "a DeepSpeed version"),
    ("model=llama3", "model", "a catalog model"),
    ("data_parallel=8", "data_parallel", "at most the 4 GPUs"),
    ("deepspeed.train_batch_size=7", "deepspeed.train_batch_size", "= 1 x 1 x 4 = 4"),
    ("hardware.pcie.bogus=1", "hardware.overrides.pcie.bogus", "an existing profile key"),
    ("hardware.profile=h200", "hardware.profile", "a profile file is given as {file: path"),
    ("deepspeed.optimizer.type=SGD", "deepspeed.optimizer.type", "Adam, AdamW or CPUAdam"),
    ("deepspeed.fp16.enabled=false", "deepspeed.fp16.enabled", "fp16 or bf16 enabled"),
])
def test_bad_values_name_the_key_and_what_was_expected(override, key, expected):
    err = error_of(overrides=[override])
    assert err.key_path == key
    assert expected in err.expected


PATH_EXPECTED = ("a dotted key path like deepspeed.zero_optimization.stage (names between "
                 "single dots, none empty; no space or '=')")


@pytest.mark.parametrize("path", [
    "deepspeed..stage", "model..num_hidden_layers", ".data_parallel", "data_parallel.",
    "deepspeed.zero_optimization.", "deepspeed. .stage", "hardware..gpu.hbm_GiB",
])
def test_a_path_with_an_empty_segment_is_refused_not_dropped(path):
    """`deepspeed..stage` would set a ds_config key named '' (ignored with a warning): the
    override would be lost, so the path is refused whether given as --set or as a mapping."""
    for overrides in ([f"{path}=1"], {path: 1}):
        assert str(error_of(overrides=overrides)) == (
            f"--set: {path}: expected {PATH_EXPECTED}, got '{path}'")


def test_the_command_line_refuses_an_empty_segment_with_status_2():
    from click.testing import CliRunner

    from zerosim.cli import main

    result = CliRunner().invoke(main, ["check", str(STUDY), "--set", "deepspeed..stage=1"])
    assert result.exit_code == 2
    assert result.output == (f"error: --set: deepspeed..stage: expected {PATH_EXPECTED}, "
                             "got 'deepspeed..stage'\n")


def test_unmodelled_deepspeed_keys_warn_once_and_go_on():
    tree = minimal()
    tree["deepspeed"]["zero_optimization"]["zero_quantized_nontrainable_weights"] = True
    tree["deepspeed"]["steps_per_print"] = 10
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = scenario_from_dict(tree)
    assert s.unmodelled_keys == ("deepspeed.zero_optimization.zero_quantized_nontrainable_weights",)
    assert [w.category for w in caught] == [UnmodelledKeysWarning]


def test_deepspeeds_activation_checkpointing_section_changes_nothing_and_says_so():
    """Megatron-DeepSpeed's flags override the section and the HF Trainer never reads it:
    one warning saying so, no 'does not model' one, the run the same as without it."""
    from zerosim.scenario.loader import FrameworkOverriddenWarning

    tree = minimal()
    plain = scenario_from_dict(minimal())
    tree["deepspeed"]["activation_checkpointing"] = {"cpu_checkpointing": True,
                                                     "partition_activations": True}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = scenario_from_dict(tree)
    assert [w.category for w in caught] == [FrameworkOverriddenWarning]
    assert "deepspeed.activation_checkpointing changes nothing here" in str(caught[0].message)
    assert s.unmodelled_keys == () and s.deepspeed == plain.deepspeed


def test_yaml_syntax_error_names_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("model: llama2-7b\nsequence_length: [\n")
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert err.value.source == str(path) and "line" in err.value.key_path


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ScenarioError) as err:
        load_scenario(tmp_path / "nope.yaml")
    assert "an existing file" in str(err.value)


def test_resolved_scenario_round_trips_to_json():
    data = load_scenario(STUDY).to_dict()
    assert json.loads(json.dumps(data))["deepspeed"]["zero_optimization"]["sub_group_size"] == (
        1_000_000_000)
    assert data["hardware"]["values"]["pcie.h2d_pinned_GBps"]["basis"] == "measured"


@pytest.mark.parametrize("order", [
    ["hardware=h100-jlse", "hardware.pcie.h2d_pinned_GBps=60"],
    ["hardware.pcie.h2d_pinned_GBps=60", "hardware=h100-jlse"],
])
def test_a_profile_choice_and_a_patch_beneath_it_apply_in_either_order(order):
    s = scenario_from_dict(minimal(hardware="polaris-a100"), source="s.yaml", overrides=order)
    assert s.hardware.name == "h100-jlse" and s.hardware.h2d_pinned_Bps == 60e9


@pytest.mark.parametrize("order", [
    ["model=llama2-7b", "model.num_hidden_layers=3"],
    ["model.num_hidden_layers=3", "model=llama2-7b"],
])
def test_a_model_choice_and_a_field_patch_apply_in_either_order(order):
    s = scenario_from_dict(minimal(), source="s.yaml", overrides=order)
    assert (s.model.hidden_size, s.model.num_hidden_layers) == (4096, 3)


def test_a_framework_choice_and_a_stack_patch_apply_in_either_order():
    for order in (["runtime.framework=megatron-deepspeed", "stack.host.fetch_hook_us=500"],
                  ["stack.host.fetch_hook_us=500", "runtime.framework=megatron-deepspeed"]):
        s = scenario_from_dict(minimal(), source="s.yaml", overrides=order)
        assert s.stack.name == "megatron-deepspeed" and s.stack.fetch_hook_s == 500e-6


def test_a_gpu_update_interval_longer_than_the_sub_groups_warns():
    """The study's DP=4 rank holds 3.25e9 elements: sub-groups of 1e9 make four of the
    tensors Megatron decays and one of its norms (its second parameter group), five, so
    every 5th moves one to the GPU and every 6th none (a warning, not a refusal: sweeps
    cross it)."""
    def caught_with(every: int) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            load_scenario(STUDY, [f"what_if.gpu_update_every={every}"])
        return [str(w.message) for w in caught if issubclass(w.category, InertWhatIfWarning)]

    assert caught_with(5) == []
    assert caught_with(6) == [
        f"{STUDY}: what_if.gpu_update_every: 6 updates no sub-group on the GPU: each rank has 5 "
        "optimizer sub-group(s) (sub_group_size 1e+09), so none is moved to the GPU"]


def test_a_number_where_a_text_goes_says_to_quote_it():
    with pytest.raises(ScenarioError) as caught:
        load_scenario(STUDY, ["runtime.deepspeed_version=0.20"])
    assert caught.value.expected == ("a text (quote it: YAML reads unquoted digits as a number, "
                                     "0.20 as 0.2)")
    assert caught.value.got == 0.2


def test_a_model_is_named_by_its_catalog_name_or_hub_repository():
    by_hub = scenario_from_dict(minimal(model="meta-llama/Llama-3.1-8B")).model
    assert by_hub.name == "llama3.1-8b"
    patched = scenario_from_dict(minimal(model="qwen2.5-7b"), source="s.yaml",
                                 overrides=["model.num_hidden_layers=2"]).model
    assert (patched.num_hidden_layers, patched.hidden_size, patched.qkv_bias) == (2, 3584, True)
