"""Figures the README quotes from searches: which configuration `zerosim tune` finds fastest
and how many it tries, the iteration's stated sigma `zerosim sensitivity` adds up over every
value, and the MoE scenario's runs with a hooked projection per expert. Each needs a search or
a run of every value (minutes on two cores), so these checks sit behind the `figures` marker:
`python -m pytest -m figures` runs them (the default suite skips them; the figures of single
runs and sweeps are held there, `tests/test_sweep_figures.py`). A model change that moves one
fails here until the prose is brought up to date. Each search runs as `zerosim tune` runs it,
on two workers; each figure is written as its sentence words it and looked for in the page
whatever its line breaks."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from zerosim.tune import KNOBS, tune
from zerosim.vocabulary import Status

pytestmark = pytest.mark.figures

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
STUDY = SCENARIOS / "llama13b_dp4.yaml"
ULYSSES = SCENARIOS / "llama8b_ulysses_dgx_h100.yaml"
WORKERS = 2


def _prose(path: str = "README.md") -> str:
    return " ".join((ROOT / path).read_text(encoding="utf-8").split())


def _missing(figures: list[str], page: str = "README.md") -> list[str]:
    prose = _prose(page)
    return [figure for figure in figures if figure not in prose]


def _all_but(*free: str) -> tuple[str, ...]:
    return tuple(knob for knob in KNOBS if knob not in free)


@cache
def _tune(scenario: Path, overrides: tuple[tuple[str, object], ...] = (),
          free: tuple[str, ...] = (), fix: tuple[str, ...] = ()):
    return tune(scenario, overrides=dict(overrides), free=free, fix=fix, workers=WORKERS)


def _fitting(outcome) -> list[dict]:
    return [row for row in outcome.rows if row["status"] == Status.OK]


def _counts(outcome) -> tuple[str, str]:
    return f"{len(outcome.rows):,}", f"{outcome.simulated:,}"


def test_the_tunes_of_the_study_node_the_readme_quotes_are_what_they_give():
    """README, "Tuning": the whole search of `llama13b_dp4` and the one with the ranks'
    binding and threads fixed."""
    fixed = _tune(STUDY, fix=("binding", "threads"))
    best = fixed.best
    assert (best["stage"], best["offload"], best["micro_batch"], best["gradient_accumulation"],
            best["reduce_bucket_size"], best["checkpointing"]) == (3, "none", 2, 1, 2e8, True)
    whole = _tune(STUDY)
    offloaded = next(row for row in _fitting(whole) if row["offload"] != "none")
    assert offloaded["binding"] is True and offloaded["threads"] == 48
    configurations, simulated = _counts(whole)
    fixed_configurations, fixed_simulated = _counts(fixed)
    figures = [
        "the fastest is ZeRO-3 with nothing offloaded, micro-batch 2 without accumulation, 2e8 "
        f"buckets and checkpointing ({best['iteration_s']:.3f} s, "
        f"{best['tokens_per_s']:,.0f} tokens/s)",
        f"the 13 B model on `h100-jlse` ({configurations} configurations, {simulated} simulated",
        f"with `--fix binding --fix threads`, {fixed_configurations} and {fixed_simulated} in "
        "about",
        "Its fastest offloaded configuration binds the ranks' cores and runs 48 threads a rank.",
    ]
    assert _missing(figures) == []


def _as_given(outcome) -> dict:
    from zerosim.tune import as_given

    given = as_given(outcome.scenario)
    return next(row for row in outcome.rows if row["config"] == given)


def _leaves(scenario: Path, row: dict) -> set[str]:
    """The names of the modules the row's configuration makes ZeRO-3 leaves, with their
    layer indices written `#`."""
    import re

    from zerosim.engine.plan import leaves_of
    from zerosim.scenario import load_scenario

    found = leaves_of(load_scenario(scenario, row["overrides"]))
    return {re.sub(r"\.\d+(\.|$)", r".#\1", name) for name in found.names}


def test_the_tunes_of_the_ulysses_scenario_the_readme_quotes_are_what_they_give():
    """README, "Tuning": `llama8b_ulysses_dgx_h100` searched whole, and at 2M tokens with only
    the tiling and checkpointing knobs free."""
    whole = _tune(ULYSSES)
    best = whole.best
    assert (best["stage"], best["offload"], best["tiling"], best["checkpointing"]) == (
        3, "none", "loss+mlp", False)
    assert _leaves(ULYSSES, best) == {"model.layers.#"}
    untiled = next(row for row in _fitting(whole) if row["tiling"] == "none")
    assert (untiled["stage"], untiled["offload"], untiled["checkpointing"]) == (3, "none", True)
    configurations, simulated = _counts(whole)
    long = _tune(ULYSSES, overrides=(("sequence_length", 2 * 1024 * 1024),),
                 fix=_all_but("tiling", "checkpointing"))
    fits = {(row["tiling"], row["checkpointing"]): row["iteration_s"] for row in _fitting(long)}
    assert set(fits) == {("loss", "cpu"), ("loss+mlp", "cpu")}
    figures = [
        f"{configurations} configurations, {simulated} simulated in",
        "the fastest ZeRO-3 with nothing offloaded, each decoder layer a leaf, both tilings and "
        f"no activation checkpointing, {best['iteration_s']:.2f} s",
        "where without tiling the fastest is ZeRO-3 with nothing offloaded, checkpointed, "
        f"{untiled['iteration_s']:.2f} s, against {_as_given(whole)['iteration_s']:.2f} s for "
        "the scenario as given",
        "only the tiled loss with the checkpoints in host memory fits, "
        f"{fits['loss', 'cpu']:,.0f} s, and {fits['loss+mlp', 'cpu']:,.0f} s with the tiled MLP "
        "too",
    ]
    assert _missing(figures) == []


def test_the_ulysses_group_sizes_tune_compares_are_what_it_gives():
    """README, "Tuning": `--free sequence_parallel` on the Ulysses scenario at eight sequences
    a step, the bucket, sub-group, Twin-Flow, binding, thread, leaf, ZeRO++ and MiCS knobs
    fixed."""
    outcome = _tune(ULYSSES, overrides=(("deepspeed.gradient_accumulation_steps", 8),),
                    free=("sequence_parallel",),
                    fix=("reduce_bucket_size", "sub_group_size", "ratio", "binding", "threads",
                         "leaves", "zero_plus_plus", "mics"))
    fitting = _fitting(outcome)
    best = fitting[0]
    assert (best["sequence_parallel"], best["tiling"], best["checkpointing"], best["stage"],
            best["offload"]) == (8, "loss+mlp", False, 2, "none")
    assert best["tight"]
    with_room = next(row for row in fitting if row["sequence_parallel"] == 8
                     and row["stage"] == 3 and not row["tight"])
    by_size = {size: next(row for row in fitting if row["sequence_parallel"] == size)
               for size in (4, 2, 1)}
    alone = by_size[1]
    assert (alone["stage"], alone["offload"], alone["checkpointing"], alone["tiling"]) == (
        3, "none", True, "loss")
    figures = [
        f"{len(outcome.rows):,} configurations, {len(fitting):,} fit, in",
        f"the fastest, {best['iteration_s']:.1f} s ({best['tokens_per_s']:,.0f} tokens/s), "
        "keeps groups of eight with both tilings and no checkpointing (ZeRO-2 with nothing "
        f"offloaded, within 4% of HBM; ZeRO-3 {with_room['iteration_s']:.1f} s with room)",
        f"the fastest with groups of four takes {by_size[4]['iteration_s']:.1f} s, of two "
        f"{by_size[2]['iteration_s']:.1f} s, and data parallelism alone",
        f"the tiled loss) {alone['iteration_s']:.1f} s",
    ]
    assert _missing(figures) == []


def _same_but(rows: list[dict], row: dict, knob: str) -> dict:
    """The row of `rows` whose configuration differs from `row`'s in `knob` alone."""
    from dataclasses import replace

    return next(other for other in rows if other["config"] != row["config"]
                and replace(other["config"], **{knob: row["config"].__dict__[knob]})
                == row["config"])


def test_the_master_precision_tune_the_readme_quotes_is_what_it_gives():
    """README, "Tuning": `--free master` on the study's node in bf16 at 0.19.5."""
    outcome = _tune(STUDY, overrides=(("deepspeed.fp16.enabled", False),
                                      ("deepspeed.bf16.enabled", True),
                                      ("runtime.deepspeed_version", "0.19.5")),
                    free=("master",), fix=("binding", "threads"))
    fitting = _fitting(outcome)
    best = fitting[0]
    assert (best["stage"], best["offload"], best["checkpointing"], best["master"]) == (
        3, "none", True, "bf16+moments")
    fp32 = next(row for row in fitting if row["master"] == "fp32")
    assert fp32 is _same_but(fitting, best, "master")
    figures = [
        "ZeRO-3 on the GPU with checkpointing, leaf modules at granularity "
        f"{best['leaves']:.2g} and bf16 master params and moments, {best['iteration_s']:.2f} s, "
        f"against {fp32['iteration_s']:.2f} s for the fastest fp32 one, the same configuration "
        "in fp32",
    ]
    assert _missing([figure.replace("e+07", "e7") for figure in figures]) == []


def test_the_liger_tune_the_readme_quotes_is_what_it_gives():
    """README, "Tuning": `--free liger` on the 128K Ulysses scenario, the knobs that do not
    touch Liger's kernels fixed."""
    outcome = _tune(ULYSSES, free=("liger",),
                    fix=_all_but("liger", "tiling", "checkpointing"))
    fitting = _fitting(outcome)
    best = fitting[0]
    assert (best["liger"], best["checkpointing"], best["tiling"]) == (True, False, "none")
    assert best["tight"]
    with_room = next(row for row in fitting if not row["tight"])
    assert (with_room["liger"], with_room["tiling"]) == (False, "mlp")
    figures = [
        f"Liger without checkpointing is fastest, {best['iteration_s']:.2f} s, within 4% of "
        f"HBM, and the tiled MLP without it the fastest with room, "
        f"{with_room['iteration_s']:.2f} s",
    ]
    assert _missing(figures) == []


def test_the_tune_of_two_polaris_nodes_the_readme_quotes_is_what_it_gives():
    """README, "Tuning": `scenarios/polaris_2nodes.yaml` searched whole, MiCS among the
    rest."""
    outcome = _tune(SCENARIOS / "polaris_2nodes.yaml")
    fitting = _fitting(outcome)
    best = fitting[0]
    assert best["zero_plus_plus"] == "qgz" and best["mics"] == "none"
    rank, mics = next((rank, row) for rank, row in enumerate(fitting, 1)
                      if row["mics"] != "none")
    assert rank == 5 and mics["mics"] == "mics8h"
    assert all(row["status"] == Status.OOM
               or (row["status"] == Status.PRUNED and row["note"].startswith("HBM floor"))
               for row in outcome.rows if row["mics"] == "mics4")
    figures = [
        f"{len(outcome.rows):,} configurations, its fastest {best['iteration_s']:.2f} s with "
        f"qgZ, the fastest MiCS one fifth, {mics['iteration_s']:.2f} s, one group of both "
        "nodes gathered hierarchically, groups of a node out of HBM",
    ]
    assert _missing(figures) == []


def test_the_tune_of_the_workstation_the_readme_quotes_is_what_it_gives():
    """README, "Hardware profiles": `scenarios/llama8b_rtx4090_workstation.yaml` searched
    whole."""
    outcome = _tune(SCENARIOS / "llama8b_rtx4090_workstation.yaml")
    fitting = _fitting(outcome)
    best = fitting[0]
    assert (best["offload"], best["micro_batch"], best["gradient_accumulation"]) == (
        "cpu+params", 8, 1)
    figures = [
        f"`zerosim tune` on it tries {len(outcome.rows):,} configurations ({len(fitting):,} "
        f"fit; ",
        f"and finds {best['iteration_s']:.2f} s ({best['tokens_per_s']:,.0f} tokens/s) with the "
        "parameters offloaded too, which frees the cards for micro-batches of 8 without "
        "accumulation",
    ]
    assert _missing(figures) == []


def test_the_stated_sigmas_the_readme_quotes_are_what_sensitivity_gives():
    """README, "Sensitivity": the iteration's 1-sigma error from every value's stated standard
    error, on the study's DP=4 and DP=1 runs, a Polaris node and two."""
    from zerosim.sensitivity import sensitivity

    def run(path: Path):
        return sensitivity(path, workers=WORKERS)

    polaris = SCENARIOS / "calibration" / "polaris" / "polaris-11.20b-dp4-mb4-ga1-sg1e08.yaml"
    sigmas = {name: run(path).stated_sigma()[0] for name, path in (
        ("dp4", STUDY), ("dp1", SCENARIOS / "llama13b_dp1.yaml"), ("polaris", polaris))}
    nodes = run(SCENARIOS / "polaris_2nodes.yaml")
    shares = sorted((row for row in nodes.rows if row.iteration_sigma is not None),
                    key=lambda row: -row.iteration_sigma)[:2]
    assert [row.key for row in shares] == ["hardware.host.remote_access_cost",
                                           "hardware.host.memory_GBps_per_domain"]
    figures = [
        f"give the iteration ±{sigmas['dp4']:.1%} (1 sigma) on `llama13b_dp4`, "
        f"±{sigmas['dp1']:.1%} on `llama13b_dp1`, ±{sigmas['polaris']:.1%} on the Polaris node "
        f"and ±{nodes.stated_sigma()[0]:.1%} over two nodes (the remote-access cost's "
        f"{shares[0].stderr:.0%} and the host-memory bandwidth's {shares[1].stderr:.0%} the "
        "largest shares)",
    ]
    assert _missing(figures) == []


def test_the_moe_runs_the_readme_quotes_are_what_they_give():
    """README, "Models": Qwen3-30B-A3B on a DGX H100 at DeepSpeed 0.17.6, the experts one
    module, a module per projection, and that with each MoE block a ZeRO-3 leaf."""
    from zerosim.api import simulate_summary

    scenario = SCENARIOS / "qwen3_moe_dgx_h100.yaml"
    release = {"runtime.deepspeed_version": "0.17.6"}
    per_expert = release | {"stack.modules.experts.value": "per_expert"}
    fused, hooked, leaf = (simulate_summary(scenario, overrides) for overrides in (
        release, per_expert, per_expert | {"stack.modules.moe_block.value": "leaf"}))
    figures = [
        f"runs its forward in {fused['phases_s']['forward']:.2f} s with the fused module and "
        f"in {hooked['phases_s']['forward']:.1f} s with 128 x 3 hooked projections a layer",
        f"takes that forward to {leaf['phases_s']['forward']:.1f} s and the iteration from "
        f"{hooked['iteration_s']:.1f} s to {leaf['iteration_s']:.1f} s",
    ]
    assert _missing(figures) == []
