"""A configuration as the files a user runs (`zerosim.export`, what `zerosim tune` writes):
only the overrides that change what zerosim resolves, applied to the user's own scenario tree,
its file references valid from the output folder, and its ds_config as DeepSpeed reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from zerosim.api import simulate_summary
from zerosim.export import _named, minimal_overrides, scenario_tree, write_configuration
from zerosim.scenario import load_scenario, scenario_from_dict
from zerosim.tune import _simulated, chosen, configuration_header, tune

ROOT = Path(__file__).resolve().parent.parent
Z = "deepspeed.zero_optimization."


def test_only_the_overrides_that_change_the_scenario_are_kept():
    """On the study's DP=4 node: its own stage, Twin-Flow's default ratio, the fork's
    interleaved update off and a what-if off change nothing; another bucket size and bound
    cores (two NUMA domains) do."""
    overrides = {Z + "stage": 3, Z + "reduce_bucket_size": 2e8, Z + "offload_optimizer.ratio": 1.0,
                 Z + "offload_optimizer.prefetch_optimizer": False,
                 "what_if.overlap_copy_back": False, "runtime.bind_cores_to_rank": True}
    kept = minimal_overrides(ROOT / "scenarios" / "llama13b_dp4.yaml", overrides)
    assert kept == {Z + "reduce_bucket_size": 2e8, "runtime.bind_cores_to_rank": True}


def test_an_auto_value_the_trainer_fills_alike_stays_auto():
    """The Trainer fills the ds_config's `auto` micro-batch from its own batch size (32): the
    same value given explicitly resolves the same and is dropped."""
    path = ROOT / "scenarios" / "llmq" / "qwen2.5-7b-4x4090.yaml"
    kept = minimal_overrides(path, {"deepspeed.train_micro_batch_size_per_gpu": 32,
                                    Z + "reduce_bucket_size": 2e8})
    assert kept == {Z + "reduce_bucket_size": 2e8}


@pytest.fixture()
def referencing(toy, tmp_path):
    """The toy with its hardware, its stack and its ds_config in files beside it, the
    ds_config patched in the scenario."""
    folder = tmp_path / "scenarios"
    folder.mkdir()
    tree = toy.tree()
    (folder / "node.yaml").write_text(yaml.safe_dump(tree["hardware"]))
    (folder / "stack.yaml").write_text(yaml.safe_dump(tree["runtime"]["framework"]))
    (folder / "ds.json").write_text(json.dumps(tree["deepspeed"]))
    tree["hardware"] = {"file": "node.yaml"}
    tree["runtime"]["framework"] = {"file": "stack.yaml"}
    tree["deepspeed"] = {"file": "ds.json", "gradient_accumulation_steps": 2}
    path = folder / "toy.yaml"
    path.write_text(yaml.safe_dump(tree, sort_keys=False))
    return path


def test_file_references_are_valid_from_the_output_folder(referencing, tmp_path):
    tree = scenario_tree(referencing, {Z + "reduce_bucket_size": 2e8},
                         folder=tmp_path / "results" / "tuned", name="toy-fastest")
    assert tree["name"] == "toy-fastest"
    assert tree["hardware"] == {"file": "../../scenarios/node.yaml"}
    assert tree["runtime"]["framework"] == {"file": "../../scenarios/stack.yaml"}
    assert tree["deepspeed"] == {"file": "../../scenarios/ds.json",
                                 "gradient_accumulation_steps": 2,
                                 "zero_optimization": {"reduce_bucket_size": 200000000}}


def test_the_files_replay_the_configuration(toy, referencing, tmp_path):
    """The scenario file simulates to the summary of the scenario with the overrides; the
    ds_config is the file's content with the patch and the overrides merged in, whole
    numbers as integers."""
    folder = tmp_path / "results" / "tuned"
    folder.mkdir(parents=True)
    overrides = {Z + "reduce_bucket_size": 2e8, Z + "stage": 3,
                 "deepspeed.train_micro_batch_size_per_gpu": 2}
    files = write_configuration(referencing, overrides, folder, "fastest",
                                header="first line\nsecond line")
    assert files == [folder / "fastest.yaml", folder / "fastest_ds_config.json"]
    text = files[0].read_text()
    assert text.startswith("# first line\n# second line\nname: toy-fastest\n")
    written = simulate_summary(files[0])
    assert written["scenario"] == "toy-fastest"
    assert written == simulate_summary(load_scenario(referencing, overrides)) | {
        "scenario": "toy-fastest"}
    expected = toy.tree()["deepspeed"]
    expected["train_micro_batch_size_per_gpu"] = 2
    expected["gradient_accumulation_steps"] = 2
    expected["zero_optimization"]["reduce_bucket_size"] = 200000000
    assert json.loads(files[1].read_text()) == expected


def test_tune_writes_the_fastest_configuration_as_files(toy_file, tmp_path):
    out = tmp_path / "out"
    outcome = tune(toy_file, fix=["reduce_bucket_size", "sub_group_size", "ratio"], workers=1,
                   out_dir=out)
    best = outcome.best
    assert outcome.files == [out / "tune.csv", out / "fastest.yaml",
                             out / "fastest_ds_config.json"]
    assert simulate_summary(out / "fastest.yaml")["iteration_s"] == best["iteration_s"]
    header = configuration_header(best, "fastest", toy_file, out)
    assert (out / "fastest.yaml").read_text().startswith(
        "".join(f"# {line}\n" for line in header.splitlines()))
    assert header.splitlines()[:3] == [
        f"zerosim tune's fastest configuration: {best['config'].describe()}",
        f"{best['iteration_s']:.3f} s per iteration, {best['tokens_per_s']:,.0f} tokens/s, "
        f"peak HBM {best['peak_hbm_GiB']:.1f} GiB, peak host memory "
        f"{best['peak_host_GiB']:.1f} GiB",
        f"zerosim diff {toy_file} {out / 'fastest.yaml'} lists what it changes and what moved"]


def test_a_tight_fastest_is_written_beside_the_fastest_with_room(toy_file):
    outcome = tune(toy_file, fix=["reduce_bucket_size", "sub_group_size", "ratio"], workers=1)
    best, second = outcome.rows[0], outcome.rows[1]
    assert chosen(outcome.rows) == [("fastest", best)]
    _simulated(best, {"status": "ok", "iteration_s": best["iteration_s"],
                      "tokens_per_s": 32 / best["iteration_s"],
                      "peak_hbm_GiB": 15.9, "hbm_capacity_GiB": 16.0,
                      "peak_host_GiB": 1.0, "host_capacity_GiB": 64.0})
    assert chosen(outcome.rows) == [("fastest", best), ("fastest_with_room", second)]


def test_a_long_name_is_cut_to_keep_the_files_suffix(toy):
    """A scenario takes a name of 128 characters at most: the base's is cut short so that
    `-fastest_with_room` still fits, and the named scenario loads."""
    name = _named("n" * 128, "fastest_with_room")
    assert name == "n" * 110 + "-fastest_with_room"
    assert scenario_from_dict(toy.tree({"name": name})).name == name
