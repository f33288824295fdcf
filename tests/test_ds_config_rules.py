"""ds_config files with overrides, DeepSpeed's own rules (legacy keys, batch sizes, versions)
and Hugging Face "auto", each through every entry point that loads a scenario."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from zerosim import load_scenario, scenario_from_dict
from zerosim.cli import main
from zerosim.errors import ScenarioError, UnsupportedConfigError
from zerosim.scenario import AutoDefaultWarning, LegacyKeyWarning
from zerosim.scenario.version import VersionWarning
from zerosim.sweep.spec import load_sweep, validate

STAGE3_FILE = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 2,
    "fp16": {"enabled": True},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": 5e8,
                          "offload_optimizer": {"device": "cpu", "pin_memory": True}},
}
TINY_MODEL = {"family": "llama", "hidden_size": 256, "num_hidden_layers": 2,
              "intermediate_size": 512, "num_attention_heads": 4, "vocab_size": 1000}


def scenario_dir(tmp_path: Path, deepspeed: dict, ds_file: dict | str | None = STAGE3_FILE,
                 name: str = "ds.json", **extra) -> Path:
    """A scenario YAML next to a ds_config file; returns the scenario's path."""
    if ds_file is not None:
        text = ds_file if isinstance(ds_file, str) else json.dumps(ds_file)
        (tmp_path / name).write_text(text)
    tree = {"model": TINY_MODEL, "sequence_length": 128, "hardware": "h100-jlse",
            "data_parallel": 1, "deepspeed": deepspeed, **extra}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def quiet_load(path, overrides=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_scenario(path, overrides)


# ------------------------------------------------------------ 1. file + siblings + overrides


def test_keys_beside_file_patch_the_file_instead_of_replacing_it(tmp_path):
    """Regression (silent wrong result): a sibling key used to drop the file, leaving
    stage 0, no offload and GA 1 with only a warning."""
    path = scenario_dir(tmp_path, {"file": "ds.json", "gradient_accumulation_steps": 4,
                                   "zero_optimization": {"sub_group_size": 1e8}})
    ds = quiet_load(path).deepspeed
    assert (ds.stage, ds.offload_optimizer.device, ds.gradient_accumulation_steps) == (3, "cpu", 4)
    assert ds.sub_group_size == 100_000_000 and ds.reduce_bucket_size == 500_000_000
    assert ds.offload_optimizer.pin_memory is True


def test_set_overrides_patch_the_file_in_every_entry_point(tmp_path):
    """Regression: `--set deepspeed.X=...` on a `{file: ...}` scenario used to drop the file."""
    path = scenario_dir(tmp_path, {"file": "ds.json"})
    bucket = "deepspeed.zero_optimization.reduce_bucket_size"
    api = quiet_load(path, [f"{bucket}=2e8"]).deepspeed
    inline = scenario_from_dict(yaml.safe_load(path.read_text()), base_dir=tmp_path,
                                overrides={bucket: 2e8}).deepspeed
    for ds in (api, inline):
        assert (ds.stage, ds.offload_optimizer.device, ds.reduce_bucket_size) == (
            3, "cpu", 200_000_000)
        assert ds.gradient_accumulation_steps == 2
    checked = CliRunner().invoke(main, ["check", str(path), "--json", "--set", f"{bucket}=2e8"])
    assert checked.exit_code == 0, checked.output
    resolved = json.loads(checked.output[checked.output.index("{"):])["deepspeed"]
    assert resolved["zero_optimization"]["stage"] == 3
    assert resolved["zero_optimization"]["reduce_bucket_size"] == 200_000_000


def test_a_sweep_over_a_file_scenario_patches_the_file(tmp_path):
    """Regression: the sweep pre-check refused these points ('it ignores deepspeed.file')."""
    scenario_dir(tmp_path, {"file": "ds.json"})
    spec_path = tmp_path / "sweep.yaml"
    spec_path.write_text(yaml.safe_dump({
        "base": "s.yaml",
        "grid": {"deepspeed.zero_optimization.reduce_bucket_size": [1e6, 2e6]}}))
    spec = load_sweep(spec_path)
    points = spec.points()
    assert validate(spec, points) == []
    resolved = [quiet_load(spec.base, point.overrides).deepspeed for point in points]
    assert [(ds.stage, ds.reduce_bucket_size) for ds in resolved] == [(3, 1_000_000),
                                                                      (3, 2_000_000)]


def test_the_patched_file_is_named_in_errors(tmp_path):
    path = scenario_dir(tmp_path, {"file": "ds.json", "zero_optimization": {"stage": 7}})
    with pytest.raises(ScenarioError) as err:
        quiet_load(path)
    assert err.value.source == f"{tmp_path / 'ds.json'} (patched by {path})"
    assert err.value.key_path == "deepspeed.zero_optimization.stage"


def test_tutorial_file_with_hjson_syntax_reads_as_deepspeed_reads_it(tmp_path):
    """DeepSpeed reads config files with hjson from 0.8.1: the ZeRO-Offload tutorial's
    missing and trailing commas are accepted; strict JSON before."""
    text = ('{\n "train_micro_batch_size_per_gpu": 1,\n "fp16": {"enabled": true},\n'
            ' "zero_optimization": {\n  "stage": 2,\n  "offload_optimizer": {\n'
            '   "device": "cpu",\n  }\n  "overlap_comm": true\n }\n}\n')
    path = scenario_dir(tmp_path, {"file": "ds.json"}, ds_file=text)
    ds = quiet_load(path).deepspeed
    assert (ds.stage, ds.offload_optimizer.device, ds.overlap_comm) == (2, "cpu", True)
    with pytest.raises(ScenarioError) as err:
        quiet_load(path, ["runtime.deepspeed_version=0.8.0"])
    assert "strict JSON (DeepSpeed before 0.8.1)" in err.value.expected


def test_duplicate_keys_are_refused_as_deepspeed_refuses_them(tmp_path):
    text = '{"train_micro_batch_size_per_gpu": 1, "train_micro_batch_size_per_gpu": 2}'
    path = scenario_dir(tmp_path, {"file": "ds.json"}, ds_file=text)
    with pytest.raises(ScenarioError) as err:
        quiet_load(path)
    assert err.value.key_path == "train_micro_batch_size_per_gpu"
    assert "Duplicate keys in DeepSpeed config" in err.value.expected


# ------------------------------------------------------------ 5. legacy keys


def legacy(zero: dict, version: str = "0.13.3", **top):
    tree = {"model": TINY_MODEL, "sequence_length": 128, "hardware": "h100-jlse",
            "data_parallel": 1, "runtime": {"deepspeed_version": version},
            "deepspeed": {"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True},
                          "zero_optimization": zero, **top}}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scenario = scenario_from_dict(tree, source="s.yaml")
    return scenario.deepspeed, [str(w.message) for w in caught
                                if issubclass(w.category, LegacyKeyWarning)]


def test_cpu_offload_maps_to_offload_optimizer_with_a_warning():
    ds, notes = legacy({"stage": 2, "cpu_offload": True})
    assert ds.offload_optimizer.device == "cpu" and ds.offload_optimizer.pin_memory is False
    assert notes == ["s.yaml: deepspeed.zero_optimization.cpu_offload: deprecated, read as "
                     "offload_optimizer: {device: cpu}"]


def test_cpu_offload_param_maps_to_offload_param():
    ds, notes = legacy({"stage": 3, "cpu_offload": True, "cpu_offload_param": True})
    assert ds.offload_param.device == ds.offload_optimizer.device == "cpu"
    assert len(notes) == 2 and "cpu_offload_param" in notes[1]


def test_cpu_offload_use_pin_memory_is_dropped_as_deepspeed_drops_it():
    ds, notes = legacy({"stage": 2, "cpu_offload": True, "cpu_offload_use_pin_memory": True})
    assert ds.offload_optimizer.pin_memory is False
    assert "cpu_offload_use_pin_memory: deprecated; DeepSpeed warns and drops the value" in (
        notes[1])


def test_a_deprecated_key_beside_its_replacement_is_refused():
    with pytest.raises(ScenarioError) as err:
        legacy({"stage": 2, "cpu_offload": False, "offload_optimizer": {"device": "cpu"}})
    assert err.value.key_path == "deepspeed.zero_optimization.cpu_offload"
    assert "Cannot provide deprecated parameter 'cpu_offload'" in err.value.expected


def test_the_pre_0_7_flag_name_is_refused_from_0_7_and_read_before():
    with pytest.raises(ScenarioError) as err:
        legacy({"stage": 3, "cpu_offload": True, "cpu_offload_params": True})
    assert "extra fields not permitted" in err.value.expected
    ds, notes = legacy({"stage": 3, "cpu_offload": True, "cpu_offload_params": True,
                        "offload_param": {"device": "none"}}, version="0.6.7")
    assert ds.offload_param.device == "cpu"
    assert any("offload_param: not read, cpu_offload_params is given" in n for n in notes)


def test_stage3_keys_by_field_name_and_the_fp16_save_key():
    ds, notes = legacy({"stage": 3, "prefetch_bucket_size": 1e6, "max_live_parameters": 2e6,
                        "stage3_gather_fp16_weights_on_model_save": True})
    assert (ds.stage3_prefetch_bucket_size, ds.stage3_max_live_parameters) == (
        1_000_000, 2_000_000)
    assert notes == ["s.yaml: deepspeed.zero_optimization.stage3_gather_fp16_weights_on_model_"
                     "save: deprecated, read as stage3_gather_16bit_weights_on_model_save"]
    with pytest.raises(ScenarioError):
        legacy({"stage": 3, "prefetch_bucket_size": 1, "stage3_prefetch_bucket_size": 2})


def test_boolean_zero_optimization_and_the_bfloat16_block():
    tree = {"model": TINY_MODEL, "sequence_length": 128, "hardware": "h100-jlse",
            "data_parallel": 1, "deepspeed": {"train_micro_batch_size_per_gpu": 1,
                                              "bfloat16": {"enabled": True},
                                              "zero_optimization": True}}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = scenario_from_dict(tree).deepspeed
    assert (ds.stage, ds.dtype) == (1, "bf16")
    assert sum(issubclass(w.category, LegacyKeyWarning) for w in caught) == 2


# ------------------------------------------------------------ 6. batch sizes


def batch(world: int = 2, **sizes):
    tree = {"model": TINY_MODEL, "sequence_length": 128, "hardware": "h100-jlse",
            "data_parallel": world, "deepspeed": {"fp16": {"enabled": True}, **sizes}}
    ds = scenario_from_dict(tree, source="s.yaml").deepspeed
    return ds.train_batch_size, ds.train_micro_batch_size_per_gpu, ds.gradient_accumulation_steps


@pytest.mark.parametrize(("sizes", "expected"), [
    ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, (32, 4, 4)),
    ({"train_batch_size": 32, "gradient_accumulation_steps": 4}, (32, 4, 4)),
    ({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4}, (32, 4, 4)),
    ({"train_batch_size": 32}, (32, 16, 1)),
    ({"train_micro_batch_size_per_gpu": 4}, (8, 4, 1)),
    ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
      "gradient_accumulation_steps": 4}, (32, 4, 4)),
])
def test_any_two_batch_sizes_give_the_third(sizes, expected):
    assert batch(**sizes) == expected


@pytest.mark.parametrize(("sizes", "key", "words"), [
    ({}, "deepspeed.train_micro_batch_size_per_gpu", "Either train_batch_size or"),
    ({"gradient_accumulation_steps": 2}, "deepspeed.train_micro_batch_size_per_gpu",
     "Either train_batch_size or"),
    ({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4}, "deepspeed.train_batch_size",
     "4 x 3 x 2 = 24"),
    ({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4},
     "deepspeed.gradient_accumulation_steps", "a derived value > 0"),
])
def test_batch_sizes_deepspeed_refuses(sizes, key, words):
    with pytest.raises(ScenarioError) as err:
        batch(**sizes)
    assert err.value.key_path == key and words in err.value.expected


# ------------------------------------------------------------ 7. Hugging Face "auto"

HF_AUTO = {
    "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                          "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                          "stage3_param_persistence_threshold": "auto",
                          "stage3_max_live_parameters": "auto"},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
}


def hf_scenario(deepspeed=None, **extra):
    tree = {"model": "llama2-7b", "sequence_length": 1024, "hardware": "h100-jlse",
            "deepspeed": deepspeed or json.loads(json.dumps(HF_AUTO)), **extra}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scenario = scenario_from_dict(tree, source="s.yaml")
    return scenario, [w for w in caught if issubclass(w.category, AutoDefaultWarning)]


def test_auto_is_filled_as_the_trainer_fills_it():
    scenario, defaulted = hf_scenario(precision="bf16", trainer={
        "per_device_train_batch_size": 2, "gradient_accumulation_steps": 4,
        "max_grad_norm": 0.5})
    ds = scenario.deepspeed
    h = 4096
    assert (ds.reduce_bucket_size, ds.stage3_prefetch_bucket_size,
            ds.stage3_param_persistence_threshold) == (h * h, 15_099_494, 10 * h)
    assert ds.stage3_max_live_parameters == 1_000_000_000  # DeepSpeed drops "auto": default
    assert (ds.train_micro_batch_size_per_gpu, ds.gradient_accumulation_steps,
            ds.train_batch_size, ds.gradient_clipping, ds.dtype) == (2, 4, 32, 0.5, "bf16")
    assert defaulted == []
    listed = scenario.to_dict()["auto_filled"]
    assert "deepspeed.zero_optimization.stage3_prefetch_bucket_size = 15099494 " \
           "(int(0.9 x hidden_size^2), hidden_size 4096)" in listed
    assert "deepspeed.train_batch_size = 32 (data_parallel x per_device_train_batch_size x " \
           "gradient_accumulation_steps = 4 x 2 x 4)" in listed


def test_auto_without_trainer_arguments_takes_the_trainer_defaults_and_says_so():
    scenario, defaulted = hf_scenario(precision="fp16")
    ds = scenario.deepspeed
    assert (ds.train_micro_batch_size_per_gpu, ds.gradient_accumulation_steps,
            ds.gradient_clipping) == (8, 1, 1.0)
    assert len(defaulted) == 1
    assert "deepspeed.train_micro_batch_size_per_gpu = 8" in str(defaulted[0].message)


def test_prefetch_and_persistence_are_filled_only_under_zero3():
    deepspeed = json.loads(json.dumps(HF_AUTO))
    deepspeed["zero_optimization"]["stage"] = 2
    ds = hf_scenario(deepspeed, precision="fp16")[0].deepspeed
    assert ds.reduce_bucket_size == 4096 * 4096
    assert (ds.stage3_prefetch_bucket_size, ds.stage3_param_persistence_threshold) == (
        50_000_000, 100_000)


def test_a_concrete_value_that_mismatches_the_trainer_is_refused():
    deepspeed = json.loads(json.dumps(HF_AUTO))
    deepspeed["train_micro_batch_size_per_gpu"] = 4
    with pytest.raises(ScenarioError) as err:
        hf_scenario(deepspeed, precision="fp16", trainer={"per_device_train_batch_size": 2})
    assert err.value.key_path == "deepspeed.train_micro_batch_size_per_gpu"
    assert err.value.got == 4 and "mismatches its TrainingArguments" in err.value.expected


def test_check_lists_each_auto_value():
    result = CliRunner().invoke(main, ["check", "scenarios/llama13b_dp1.yaml",
                                       "--set", "deepspeed.zero_optimization.reduce_bucket_size"
                                       "=auto"])
    assert result.exit_code == 0, result.output
    assert "'auto' values" in result.output and "26214400" in result.output


# ------------------------------------------------------------ 8. fp32


def test_no_16bit_block_is_fp32_and_refused_with_the_reason_by_check_and_run():
    """Regression: the refusal used to read 'got False'."""
    deepspeed = json.loads(json.dumps(HF_AUTO))
    with pytest.raises(UnsupportedConfigError) as err:
        hf_scenario(deepspeed)
    assert "DeepSpeed trains in fp32" in err.value.expected
    assert err.value.got == "neither fp16.enabled nor bf16.enabled true (fp32 training)"
    sets = ["--set", "deepspeed.fp16.enabled=false"]
    checked = CliRunner().invoke(main, ["check", "scenarios/llama13b_dp1.yaml", *sets])
    ran = CliRunner().invoke(main, ["run", "scenarios/llama13b_dp1.yaml", "--no-files", *sets])
    assert checked.exit_code == ran.exit_code == 2 and checked.output == ran.output


# ------------------------------------------------------------ 9. versions, attention names


def test_a_version_that_is_not_a_release_is_an_error():
    with pytest.raises(ScenarioError) as err:
        hf_scenario(precision="fp16", runtime={"deepspeed_version": "0.13.9"})
    assert err.value.expected == "a DeepSpeed release (0.1.0 to 0.19.5; 0.13.x ends at 0.13.5)"
    with pytest.raises(ScenarioError):
        hf_scenario(precision="fp16", runtime={"deepspeed_version": "0.13.3rc1"})


def test_a_local_build_of_a_release_is_that_release():
    scenario, _ = hf_scenario(precision="fp16", runtime={"deepspeed_version": "0.13.3+5ab4b4bd"})
    assert scenario.runtime.deepspeed_version == (0, 13, 3)


def test_a_release_newer_than_zerosim_knows_warns_naming_the_behaviours_used():
    tree = {"model": "llama2-7b", "sequence_length": 1024, "hardware": "h100-jlse",
            "runtime": {"deepspeed_version": "0.20.1"},
            "deepspeed": {"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True}}}
    with pytest.warns(VersionWarning) as caught:
        scenario = scenario_from_dict(tree, source="s.yaml")
    message = str(caught[0].message)
    assert message.startswith("s.yaml: runtime.deepspeed_version: 0.20.1 is newer than the "
                              "newest DeepSpeed release zerosim knows (0.19.5)")
    assert "boundary_flush_non_blocking" in message
    assert scenario.behaviours.boundary_flush_non_blocking


@pytest.mark.parametrize(("name", "replayed"), [
    ("sdpa", "sdpa"), ("flash_attention_2", "flash"), ("eager", "eager")])
def test_hugging_face_attention_names(name, replayed):
    scenario, _ = hf_scenario(precision="fp16", attention=name)
    assert scenario.attention == replayed


def test_tensor_parallel_training_is_refused_from_0_16_4_and_ignored_before():
    deepspeed = {"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True},
                 "tensor_parallel": {"autotp_size": 4}}
    with pytest.raises(UnsupportedConfigError) as err:
        hf_scenario(deepspeed, runtime={"deepspeed_version": "0.16.4"})
    assert err.value.key_path == "deepspeed.tensor_parallel.autotp_size"
    scenario, _ = hf_scenario(deepspeed, runtime={"deepspeed_version": "0.16.3"})
    assert scenario.unmodelled_keys == ("deepspeed.tensor_parallel",)
