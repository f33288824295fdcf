"""Lone CPU Adam steps on the engine's machine model (`zerosim.engine.probes`), as `zerosim
check` prints them on its `cpu adam` line: rates written out by hand."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from zerosim.cli import main
from zerosim.engine.probes import cpu_adam_seconds, node_adam_rates, without_adam_ceiling
from zerosim.hardware.profile import load_profile
from zerosim.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent
ON_GH200 = ("--set", "hardware=gh200", "--set", "data_parallel=1")


def test_a_bound_polaris_rank_steps_at_its_own_domains_memory():
    """polaris_dos.yaml: four ranks, each bound to its GPU's domain with 8 threads, every byte
    of Adam's 28 per element on that domain's 41.7 GB/s; the 8 threads of the AVX2 loop could
    do 8 x 2.8 GHz x 8 lanes x 1.81 / 17 (the loop's issue rate measured on an AMD core)."""
    rates = node_adam_rates(load_scenario(ROOT / "scenarios/polaris_dos.yaml"))
    assert rates.ranks == 4
    assert rates.params_per_s == pytest.approx(41.7e9 / 28, rel=1e-12)
    assert rates.memory_params_per_s == pytest.approx(41.7e9 / 28, rel=1e-12)
    assert rates.threads_params_per_s == pytest.approx(8 * 2.8e9 * 8 * 1.81 / 17, rel=1e-12)
    assert rates.binding == "host memory"


def test_grace_steps_at_its_scalar_loop_not_its_memory():
    """gh200: 72 threads x 3.1 GHz / 21.7 cycles = 1.03e10 params/s, under the 353 GB/s / 28 B
    = 1.26e10 its memory allows; a sub-group of 1e9 elements in 8 OpenMP regions of 2^27,
    which lose nothing with one pool on the node."""
    scenario = load_scenario(ROOT / "scenarios/llama13b_dp4.yaml",
                             overrides={"hardware": "gh200", "data_parallel": 1})
    rates = node_adam_rates(scenario)
    assert rates.params_per_s == pytest.approx(72 * 3.1e9 / 21.7, rel=1e-12)
    assert rates.threads_params_per_s == pytest.approx(72 * 3.1e9 / 21.7, rel=1e-12)
    assert rates.memory_params_per_s == pytest.approx(353e9 / 28, rel=1e-12)
    assert rates.binding == "its threads"
    profile = load_profile("gh200")
    assert cpu_adam_seconds(profile, 1e9) == pytest.approx(1e9 * 21.7 / (72 * 3.1e9), rel=1e-12)
    assert cpu_adam_seconds(without_adam_ceiling(profile), 1e9) == pytest.approx(
        1e9 * 28 / 353e9, rel=1e-12)


def test_check_prints_the_cpu_adam_line_only_where_the_optimizer_is_offloaded():
    runner = CliRunner()
    result = runner.invoke(main, ["check", str(ROOT / "scenarios/llama13b_dp4.yaml"),
                                  *ON_GH200], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert ("cpu adam    1.03e10 params/s per rank, 1 rank stepping at once: held by its "
            "threads (the threads' ceiling 1.03e10, host memory's 1.26e10)") in result.output
    result = runner.invoke(main, ["check", str(ROOT / "scenarios/seed003/roberta10b_p4d64.yaml")],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "cpu adam" not in result.output


def test_check_json_carries_the_same_rates():
    import json

    runner = CliRunner()
    result = runner.invoke(main, ["check", str(ROOT / "scenarios/polaris_dos.yaml"), "--json"])
    assert result.exit_code == 0, result.output
    adam = json.loads(result.stdout)["cpu_adam"]
    assert adam["ranks"] == 4 and adam["held_by"] == "host memory"
    assert adam["params_per_s"] == pytest.approx(41.7e9 / 28, rel=1e-12)
    assert set(adam) == {"ranks", "elements", "params_per_s", "threads_params_per_s",
                         "memory_params_per_s", "held_by"}
    result = runner.invoke(main, ["check", str(ROOT / "scenarios/seed003/roberta10b_p4d64.yaml"),
                                  "--json"])
    assert "cpu_adam" not in json.loads(result.output)
