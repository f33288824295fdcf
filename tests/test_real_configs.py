"""Real files as users have them (tests/data/real_configs, sources in its README): each ds_config
is accepted as DeepSpeed or the Hugging Face Trainer would accept it, or refused with the reason
DeepSpeed would give; each config.json gives the checkpoint's exact parameter count."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from zerosim.cli import main
from zerosim.errors import ScenarioError, UnsupportedConfigError
from zerosim.models import ModelFieldWarning, spec_from_hf_file, total_params
from zerosim.scenario import scenario_from_dict

REAL = Path(__file__).resolve().parent / "data" / "real_configs"
MODELS = REAL / "models"

PUBLISHED = {
    "Meta-Llama-3-8B": 8_030_261_248,
    "Llama-3.1-70B": 70_553_706_496,
    "Mistral-7B-v0.1": 7_241_732_096,
    "Mixtral-8x7B-v0.1": 46_702_792_704,
    "Qwen2-7B": 7_615_616_512,
    "Phi-3-mini-4k-instruct": 3_821_079_552,
    "Qwen3-8B": 8_190_735_360,
    "Qwen3-30B-A3B": 30_532_122_624,
    "gemma-7b": 8_537_680_896,
    # The config's exact count; the commonly cited 41,303,269,376 counts 65,021 embedding rows
    # where the config has 65,024 (3 x 8,192 fewer; see the folder's README).
    "falcon-40b": 41_303_293_952,
    "gpt-neox-20b": 20_554_567_680,
    "opt-13b": 12_853_473_280,
    "gpt2": 124_439_808,
}
TINY = {"family": "llama", "hidden_size": 256, "num_hidden_layers": 2,
        "intermediate_size": 512, "num_attention_heads": 4, "vocab_size": 1000}


def load_model(folder: str):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec = spec_from_hf_file(MODELS / folder / "config.json", source="t", key_path="model")
    return spec, [str(w.message) for w in caught if issubclass(w.category, ModelFieldWarning)]


def test_every_model_file_is_tested():
    assert sorted(p.name for p in MODELS.iterdir()) == sorted(PUBLISHED)


@pytest.mark.parametrize(("folder", "count"), PUBLISHED.items())
def test_parameter_count_is_the_checkpoints(folder, count):
    spec, unmodelled = load_model(folder)
    assert total_params(spec) == count
    # their sliding_window
    expected_warnings = 1 if folder in ("Mistral-7B-v0.1", "Phi-3-mini-4k-instruct") else 0
    assert len(unmodelled) == expected_warnings, unmodelled


def test_mistral_sliding_window_is_named():
    _, unmodelled = load_model("Mistral-7B-v0.1")
    assert "sliding_window: 4096; zerosim replays full causal attention" in unmodelled[0]


# ------------------------------------------------------------------ ds_config files


def scenario(tmp_path: Path, deepspeed: dict, model=None, **extra) -> dict:
    for path in REAL.glob("*.json"):
        (tmp_path / path.name).write_text(path.read_text())
    return {"model": model or TINY, "sequence_length": 128, "hardware": "h100-jlse",
            "data_parallel": 2, "deepspeed": deepspeed, **extra}


def resolve(tmp_path: Path, tree: dict):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = scenario_from_dict(tree, source=str(tmp_path / "s.yaml"), base_dir=tmp_path)
    return loaded, [str(w.message) for w in caught]


NO_BATCH = "Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided"


@pytest.mark.parametrize("name", ["ds_tutorial_zero2.json", "ds_tutorial_zero_infinity.json",
                                  "ds_tutorial_zero_offload.json"])
def test_tutorial_fragments_are_refused_alone_and_run_with_what_they_leave_out(tmp_path, name):
    with pytest.raises(ScenarioError) as err:
        resolve(tmp_path, scenario(tmp_path, {"file": name}))
    assert NO_BATCH in err.value.expected
    completed = {"file": name, "train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True}}
    ds = resolve(tmp_path, scenario(tmp_path, completed))[0].deepspeed
    file_zero = json.loads((REAL / name).read_text()) if name != \
        "ds_tutorial_zero_offload.json" else {"zero_optimization": {"stage": 2}}
    assert ds.stage == file_zero["zero_optimization"]["stage"]
    assert ds.offload_optimizer.device == ("none" if name == "ds_tutorial_zero2.json" else "cpu")


def test_zero_infinity_tutorial_values_are_taken_as_written(tmp_path):
    completed = {"file": "ds_tutorial_zero_infinity.json", "train_micro_batch_size_per_gpu": 1,
                 "fp16": {"enabled": True}}
    ds = resolve(tmp_path, scenario(tmp_path, completed))[0].deepspeed
    assert (ds.stage3_prefetch_bucket_size, ds.reduce_bucket_size, ds.offload_param.device) == (
        10_000_000, 10_000_000, "cpu")


def test_zero_offload_tutorial_needs_hjson_as_deepspeed_0_8_1(tmp_path):
    tree = scenario(tmp_path, {"file": "ds_tutorial_zero_offload.json",
                               "train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True}},
                    runtime={"deepspeed_version": "0.8.0"})
    with pytest.raises(ScenarioError) as err:
        resolve(tmp_path, tree)
    assert "strict JSON (DeepSpeed before 0.8.1)" in err.value.expected


@pytest.mark.parametrize("name", ["hf_ds_config_zero2.json", "hf_ds_config_zero3.json"])
def test_hugging_face_files_fill_auto_from_the_scenario(tmp_path, name):
    tree = scenario(tmp_path, {"file": name}, precision="fp16",
                    trainer={"per_device_train_batch_size": 2, "gradient_accumulation_steps": 3})
    loaded, notes = resolve(tmp_path, tree)
    ds = loaded.deepspeed
    assert (ds.train_micro_batch_size_per_gpu, ds.gradient_accumulation_steps,
            ds.train_batch_size, ds.dtype, ds.gradient_clipping) == (2, 3, 12, "fp16", 1.0)
    assert ds.reduce_bucket_size == (256 * 256 if ds.stage == 3 else 200_000_000)
    if ds.stage == 3:
        assert (ds.stage3_prefetch_bucket_size, ds.stage3_param_persistence_threshold,
                ds.sub_group_size) == (58_982, 2_560, 100_000_000_000_000)
        assert any("stage3_gather_fp16_weights_on_model_save: deprecated" in n for n in notes)
    assert any("gradient_clipping = 1.0" in n for n in notes)  # max_grad_norm's default


def test_autotuning_example_is_accepted(tmp_path):
    tree = scenario(tmp_path, {"file": "dse_autotuning_hf_fp16_z3.json"},
                    trainer={"per_device_train_batch_size": 4})
    ds = resolve(tmp_path, tree)[0].deepspeed
    assert (ds.stage, ds.dtype, ds.train_micro_batch_size_per_gpu) == (3, "fp16", 4)


def test_imagenet_example_trains_in_fp32_and_is_refused_with_that_reason(tmp_path):
    with pytest.raises(UnsupportedConfigError) as err:
        resolve(tmp_path, scenario(tmp_path, {"file": "dse_imagenet.json"}))
    assert "DeepSpeed trains in fp32" in err.value.expected


def test_tensor_parallel_example_by_release(tmp_path):
    tree = scenario(tmp_path, {"file": "dse_tensor_parallel_hf.json"}, precision="bf16")
    loaded, _ = resolve(tmp_path, tree)
    assert loaded.deepspeed.dtype == "bf16" and loaded.deepspeed.stage == 2
    assert loaded.unmodelled_keys == ("deepspeed.tensor_parallel",)
    tree["runtime"] = {"deepspeed_version": "0.16.4"}
    with pytest.raises(UnsupportedConfigError) as err:
        resolve(tmp_path, tree)
    assert err.value.key_path == "deepspeed.tensor_parallel.autotp_size" and err.value.got == 4


def test_check_and_run_agree_on_every_real_ds_config(tmp_path):
    """One validation path: for each file, `check` and `run` accept or refuse alike, with the
    same line."""
    for path in sorted(REAL.glob("*.json")):
        tree = scenario(tmp_path, {"file": path.name}, precision="fp16",
                        trainer={"per_device_train_batch_size": 1})
        tree["sequence_length"] = 16
        scenario_path = tmp_path / f"{path.stem}.yaml"
        scenario_path.write_text(yaml.safe_dump(tree))
        checked = CliRunner().invoke(main, ["check", str(scenario_path)])
        ran = CliRunner().invoke(main, ["run", str(scenario_path), "--no-files"])
        assert checked.exit_code == ran.exit_code, path.name
        if ran.exit_code:
            assert checked.output == ran.output


# ------------------------------------------------------------------ check and estimate


def invoke(*args: str):
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_check_a_config_json_prints_counts_breakdown_and_flops_per_token():
    text = invoke("check", str(MODELS / "Mixtral-8x7B-v0.1" / "config.json"))
    assert text.startswith("Model Mixtral-8x7B-v0.1: 46,702,792,704 parameters "
                           "(12,879,925,248 active per token)")
    assert "FLOPs per token at sequence length 2048" in text
    assert "layers.*.mlp.experts.*.down_proj" in text


def test_flops_per_token_are_two_per_weight_plus_dense_attention():
    """Llama-3-8B at 2,048 tokens: 2 FLOPs per matmul weight (everything but the embedding and
    the norms) and 4 s x hidden per layer of attention."""
    data = json.loads(invoke("check", str(MODELS / "Meta-Llama-3-8B" / "config.json"),
                             "--json"))
    weights = 8_030_261_248 - 128_256 * 4096 - (2 * 32 + 1) * 4096
    assert data["forward_flops_per_token"] == 2 * weights + 4 * 2048 * 4096 * 32
    assert data["training_flops_per_token"] == 3 * data["forward_flops_per_token"]


def test_estimate_takes_a_config_json():
    data = json.loads(invoke("estimate", "--hf-config",
                             str(MODELS / "Llama-3.1-70B" / "config.json"),
                             "--gpus-per-node", "8", "--json"))
    assert data["total_params"] == data["model"]["total_params"] == 70_553_706_496
    assert data["largest_layer_params"] == 128_256 * 8192
    assert (data["stage"], data["num_gpus_per_node"]) == (3, 8)


def test_estimate_and_check_take_a_scenario():
    scenario = str(Path(__file__).resolve().parent.parent / "scenarios" / "llama13b_dp4.yaml")
    data = json.loads(invoke("estimate", "--scenario", scenario, "--json"))
    assert (data["stage"], data["num_gpus_per_node"], data["num_nodes"]) == (3, 4, 1)
    assert data["model"]["total_params"] == 13_015_864_320
    checked = json.loads(invoke("check", scenario, "--json"))
    assert checked["model_summary"]["total_params"] == 13_015_864_320


def test_fields_beside_hf_config_and_overrides_patch_the_file(tmp_path):
    tree = scenario(tmp_path, {"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True}},
                    model={"hf_config": str(MODELS / "Meta-Llama-3-8B" / "config.json"),
                           "num_hidden_layers": 2})
    spec = resolve(tmp_path, tree)[0].model
    assert (spec.num_hidden_layers, spec.vocab_size, spec.num_key_value_heads) == (2, 128256, 8)
    patched = scenario_from_dict(tree, base_dir=tmp_path,
                                 overrides=["model.num_hidden_layers=4"]).model
    assert patched.num_hidden_layers == 4
