"""Figures the README and docs/engine.md quote from the shipped sweeps, from `zerosim diff` of
the main job and from single runs of the shipped scenarios, held to what the code computes now:
a model change that moves one fails here until the prose is brought up to date. Each sweep runs
once, as `zerosim sweep` runs its points; each figure is written as its sentence words it and
looked for in the page whatever its line breaks; the tables are rebuilt row by row.

Held elsewhere, behind the `figures` marker (`python -m pytest -m figures`, minutes: each needs
a search or a run of every value): which configuration `zerosim tune` finds fastest and how many
it tries (the fastest's own figures are held here), the iteration's stated sigma `zerosim
sensitivity` adds up over every value (the quoted elasticities are held here), and the MoE
scenario's figures with a hooked projection per expert (10 s a run):
`tests/test_search_figures.py`."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
from conftest import LLAMA4_SCOUT

from zerosim.vocabulary import Status

ROOT = Path(__file__).resolve().parent.parent
Z = "deepspeed.zero_optimization."
MICRO_BATCH = "deepspeed.train_micro_batch_size_per_gpu"
SEQUENCE_PARALLEL = "deepspeed.sequence_parallel_size"
ALTERNATIVE = "hardware.alternative"


def _prose(path: str) -> str:
    return " ".join((ROOT / path).read_text(encoding="utf-8").split())


@cache
def _rows(name: str, overrides: tuple[tuple[str, object], ...] = ()
          ) -> tuple[tuple[dict, dict], ...]:
    """Each point of `scenarios/sweeps/<name>.yaml` (with `--set` `overrides`) with its summary
    row."""
    from zerosim.sweep.spec import load_sweep
    from zerosim.sweep.worker import run_point

    spec = load_sweep(ROOT / "scenarios" / "sweeps" / f"{name}.yaml", dict(overrides))
    return tuple((point.values, run_point(str(spec.base), point.overrides, point.point_id))
                 for point in spec.points())


def _by(name: str, *keys: str, overrides: tuple[tuple[str, object], ...] = ()) -> dict:
    """The sweep's rows by their points' values of `keys` (one key: its value; several: the
    tuple of them)."""
    return {(point[keys[0]] if len(keys) == 1 else tuple(point[key] for key in keys)): row
            for point, row in _rows(name, overrides)}


def _row(name: str, **values) -> dict:
    """The one point of the sweep whose values include `values` (dots written as __)."""
    wanted = {key.replace("__", "."): value for key, value in values.items()}
    found = [row for point, row in _rows(name)
             if all(point.get(key) == value for key, value in wanted.items())]
    assert len(found) == 1, (name, wanted, len(found))
    return found[0]


def _variant(name: str, variant: str, **values) -> dict:
    return _row(name, variant=variant, **values)


def _it(row: dict) -> float:
    assert row["status"] == Status.OK, row.get("error") or row.get("oom")
    return row["iteration_s"]


def _oom(row: dict) -> bool:
    return row["status"] == Status.OOM


def _missing(page: str, figures: list[str]) -> list[str]:
    prose = _prose(page)
    return [figure for figure in figures if figure not in prose]


def _readme_sweep_paragraph() -> list[str]:
    """README, "What-if sweeps": what the paragraph on `scenarios/sweeps/` quotes."""
    batch = _by("batch", MICRO_BATCH, "deepspeed.gradient_accumulation_steps")
    assert all(_oom(row) for (mb, _), row in batch.items() if mb == 4)
    alternative = {name: _it(row) for name, row in _by("alternatives", ALTERNATIVE).items()}
    leaf = {key: _it(row) for key, row in
            _by("leaf_modules", MICRO_BATCH, Z + "module_granularity_threshold").items()}
    zpp = _zero_plus_plus()
    assert _oom(_variant("mics", "mics4"))
    sp = _by("sequence_parallel", "sequence_length", SEQUENCE_PARALLEL)
    assert [size for (length, size), row in sp.items()
            if length == 262144 and not _oom(row)] == [8]
    alst = _by("alst", "sequence_length", "variant")
    assert not _oom(alst[131072, "ulysses_only"]) and _oom(alst[524288, "ulysses_only"])
    assert not _oom(alst[4194304, "alst"])
    liger = _by("liger", "sequence_length", "runtime.liger_kernel")
    assert _oom(liger[65536, False]) and not _oom(liger[65536, True])
    packed = _by("packed_documents", "sequence_length", "document_length")
    for length in (131072, 524288):
        assert len({round(row["peak_hbm_GiB"], 6) for (each, _), row in packed.items()
                    if each == length}) == 1
    nodes = _by("nodes", "hardware", Z + "offload_optimizer.device")
    assert all(_oom(nodes[hardware, "none"])
               for hardware in ("polaris-a100", "rtx4090-workstation", "gh200"))

    def tokens(row: dict) -> str:
        assert row["status"] == Status.OK
        return f"{row['tokens_per_s']:,.0f}"

    return [
        f"{tokens(batch[1, 1])} tokens/s at micro-batch 1 without accumulation, "
        f"{tokens(batch[2, 8])} at micro-batch 2 over 8 micro-batches",
        f"{_it(_variant('what_ifs', 'no memory reports')):.2f} s against "
        f"{_it(_variant('what_ifs', 'baseline')):.2f}, `memory_breakdown`",
        f"{alternative[None]:.3f} s, {alternative['stream_host_memory']:.3f} with STREAM's host "
        f"memory, {alternative['power_capped_clock']:.3f} at the power-capped clock, "
        f"{alternative['fresh_flush_pages']:.3f} on fresh flush pages",
        f"{leaf[1, 0]:.3f} -> {leaf[1, 4000000]:.3f} s an iteration at micro-batch 1 with each "
        f"decoder layer a leaf, {leaf[16, 0]:.3f} s without leaves and {leaf[16, 4000000]:.3f} s "
        "with them at 16",
        f"{zpp['none']:.2f} s without, {zpp['hpz']:.2f} s with hpZ, {zpp['qgz']:.2f} s with qgZ, "
        f"{zpp['qwz+qgz']:.2f} s with qwZ and qgZ",
        f"{_it(_variant('mics', 'zero3')):.2f} s as ZeRO-3, "
        f"{_it(_variant('mics', 'mics8-hierarchical')):.2f} s with groups of two nodes gathered "
        "hierarchically, a group per node out of memory",
        f"256K fits only over all eight, {_it(sp[262144, 8]):.1f} s",
        f"{_it(liger[4096, True]) / _it(liger[4096, False]) - 1:.0%} slower at 4K, "
        f"{1 - _it(liger[32768, True]) / _it(liger[32768, False]):.0%} faster at 32K, "
        "64K fits only with it",
        f"128K {_it(packed[131072, None]):.2f} -> {_it(packed[131072, 1024]):.2f} s, 512K "
        f"{_it(packed[524288, None]):.1f} -> {_it(packed[524288, 1024]):.1f} s at 1K",
        f"offloaded, {tokens(nodes['dgx-h100', 'cpu'])} tokens/s on a DGX H100, "
        f"{tokens(nodes['dgx-a100', 'cpu'])} on a DGX A100, "
        f"{tokens(nodes['rtx4090-workstation', 'cpu'])} on four RTX 4090s; on the GPUs, "
        f"{tokens(nodes['dgx-h100', 'none'])} and {tokens(nodes['dgx-a100', 'none'])}",
    ]


def _zero_plus_plus() -> dict[str, float]:
    """Iteration seconds of `zero_plus_plus.yaml`'s eight points, by tune's names for them."""
    names = {}
    for point, row in _rows("zero_plus_plus"):
        parts = [name for name, on in (("hpz", point[Z + "zero_hpz_partition_size"] > 1),
                                       ("qwz", point[Z + "zero_quantized_weights"]),
                                       ("qgz", point[Z + "zero_quantized_gradients"])) if on]
        names["+".join(parts) or "none"] = _it(row)
    return names


def _readme_tune_paragraph() -> list[str]:
    """README, "Tuning": the leaves at 128 tokens and the ZeRO++ choices it quotes."""
    from zerosim.api import simulate_summary

    leaves = [simulate_summary(ROOT / "scenarios" / "h200_vm" / "tinyllama_hooks.yaml",
                               {Z + "module_granularity_threshold": threshold})["iteration_s"]
              for threshold in (0, 2000000, 4000000)]
    zpp = _zero_plus_plus()
    return [
        f"TinyLlama on the H200 VM at 128 tokens, ZeRO-3 with nothing offloaded: "
        f"{leaves[0]:.3f} s, {leaves[1]:.3f} s with each attention a leaf, {leaves[2]:.3f} s "
        "with each decoder layer one",
        f"hpZ {zpp['hpz']:.2f} s, qwZ {zpp['qwz']:.2f} s, hpZ and qwZ {zpp['hpz+qwz']:.2f} s, "
        f"qgZ {zpp['qgz']:.2f} s, all three {zpp['hpz+qwz+qgz']:.2f} s, none {zpp['none']:.2f} s",
    ]


def _engine_page_paragraphs() -> list[str]:
    """docs/engine.md: what the ZeRO++, MiCS and Ulysses paragraphs quote of their sweeps."""
    zpp = {name: row for name in ("none", "hpz", "qgz") for row in [_zpp_row(name)]}
    zero3, mics8 = _variant("mics", "zero3"), _variant("mics", "mics8")
    hierarchical = _variant("mics", "mics8-hierarchical")
    offloaded = _variant("mics", "zero3-optimizer-on-cpu")
    mics4 = json.loads(_variant("mics", "mics4")["oom"])

    def forward(row: dict) -> float:
        """A micro-batch's forward (the summary's phase times are means per micro-batch)."""
        return row["phases_s.forward"]

    sp = _by("sequence_parallel", "sequence_length", SEQUENCE_PARALLEL)
    times = _zero_plus_plus()
    alst = _variant("alst", "alst", sequence_length=1048576)
    ulysses = [_ulysses_128k(overrides) for overrides in (
        {}, {"runtime.tiled_loss_shards": "auto"}, {"runtime.liger_kernel": True})]
    study = _summary("llama13b_dp4.yaml")
    one_node = [_summary("llama13b_dp4.yaml", overrides) for overrides in (
        {Z + "zero_hpz_partition_size": 4}, {Z + "zero_hpz_partition_size": 2},
        {Z + "zero_quantized_weights": True})]
    more = [run["peak_hbm_GiB"] - study["peak_hbm_GiB"] for run in one_node]
    return [
        f"holds {more[0]:.1f} GiB (group of 4) or {more[1]:.1f} GiB (group of 2) more HBM, "
        f"{_time(one_node[0]):.2f} or {_time(one_node[1]):.2f} s an iteration against "
        f"{_time(study):.3f} s, and qwZ adds its kernels and a plain all-gather a call, "
        f"{_time(one_node[2]):.2f} s",
        f"1M-token sequences take {_it(alst):,.0f} s an iteration at "
        f"{alst['tflops_per_gpu']:.0f} TFLOPS a GPU, peak HBM {alst['peak_hbm_GiB']:.1f} GiB, "
        f"{alst['peak_host_GiB']:.0f} GiB of host memory",
        f"peak HBM {ulysses[0]['peak_hbm_GiB']:.1f} -> {ulysses[1]['peak_hbm_GiB']:.1f} GiB, "
        f"{_it(ulysses[0]):.2f} -> {_it(ulysses[1]):.2f} s an iteration",
        f"{_it(ulysses[0]):.2f} -> {_it(ulysses[2]):.2f} s and peak HBM "
        f"{ulysses[0]['peak_hbm_GiB']:.1f} -> {ulysses[2]['peak_hbm_GiB']:.1f} GiB (DeepSpeed's "
        f"tiled loss instead: {_it(ulysses[1]):.2f} s, {ulysses[1]['peak_hbm_GiB']:.1f} GiB)",
        f"gives {times['none']:.2f} s without, {times['hpz']:.2f} s with a group per node (peak "
        f"HBM {zpp['none']['peak_hbm_GiB']:.1f} -> {zpp['hpz']['peak_hbm_GiB']:.1f} GiB), "
        f"{times['qwz']:.2f} s with qwZ and {times['hpz+qwz']:.2f} s with both",
        f"qgZ alone takes it to {times['qgz']:.2f} s",
        f"peak HBM {zpp['qgz']['peak_hbm_GiB']:.1f} GiB, without the coalesced",
        f"{times['hpz+qgz']:.2f} s with hpZ, {times['qwz+qgz']:.2f} s with qwZ (the fastest of "
        f"the eight) and {times['hpz+qwz+qgz']:.2f} s with both",
        f"ZeRO-3 {_it(zero3):.2f} s an iteration (peak HBM {zero3['peak_hbm_GiB']:.1f} GiB; "
        f"{_it(offloaded):.2f} s with the optimizer in host memory), groups of two nodes "
        f"{_it(mics8):.2f} s ({mics8['peak_hbm_GiB']:.1f} GiB: the forward "
        f"{forward(zero3):.2f} -> {forward(mics8):.2f} s a micro-batch, the boundary's backward "
        f"{zero3['phases_s.backward_boundary']:.2f} -> {mics8['phases_s.backward_boundary']:.2f} "
        f"s with the all-reduce across the two groups), the same hierarchically "
        f"{_it(hierarchical):.2f} s (the forward {forward(hierarchical):.2f} s), one group of "
        f"every rank hierarchically {_it(_variant('mics', 'mics16-hierarchical')):.2f} s; a "
        f"group per node does not fit ({mics4['in_use_GiB']:.1f} GiB of 40)",
        f"{_it(sp[32768, 1]):.1f} s an iteration for eight sequences at N = 1 "
        f"({sp[32768, 1]['peak_hbm_GiB']:.1f} GiB) against {_it(sp[32768, 8]):.1f} s for one at "
        f"N = 8 ({sp[32768, 8]['peak_hbm_GiB']:.1f} GiB)",
        f"128K N >= 4 ({_it(sp[131072, 4]):.1f} s at 4, {_it(sp[131072, 8]):.1f} s at 8), 256K "
        f"N = 8 ({_it(sp[262144, 8]):.1f} s, {sp[262144, 8]['peak_hbm_GiB']:.1f} GiB)",
    ]


def _ulysses_128k(overrides: dict) -> dict:
    """The 128K Ulysses scenario's summary, so changed."""
    from zerosim.api import simulate_summary

    return simulate_summary(ROOT / "scenarios" / "llama8b_ulysses_dgx_h100.yaml", overrides)


def _zpp_row(name: str) -> dict:
    flags = {"none": (1, False, False), "hpz": (4, False, False), "qgz": (1, False, True)}[name]
    return _row("zero_plus_plus", **dict(zip(
        (f"{Z}zero_hpz_partition_size", f"{Z}zero_quantized_weights",
         f"{Z}zero_quantized_gradients"), flags, strict=True)))


def _engine_page_threads_and_tiles() -> list[str]:
    """docs/engine.md: the ranks' thread pools on the study's node, the Deep Optimizer States
    sweep on it, the tiled MLP and packed documents on the Ulysses and ALST scenarios."""
    threads = _summary("llama13b_dp4.yaml", {"runtime.cpu_threads_per_rank": 48})
    study = _summary("llama13b_dp4.yaml")
    h100 = _by("deep_optimizer_states", "variant", overrides=(("hardware", "h100-jlse"),))
    cores = _by("deep_optimizer_states", "variant", overrides=(
        ("hardware", "h100-jlse"), ("runtime.cpu_threads_per_rank", 46)))
    polaris = _by("deep_optimizer_states", "variant")
    gaps = [f"async flush, gap {gap}" for gap in (2, 3, 4)]

    def span(rows: dict, phase: str | None = None) -> str:
        values = [_time(rows[gap], phase) for gap in gaps]
        return f"{min(values):.2f}-{max(values):.2f}"

    def gain(rows: dict) -> list[float]:
        return [_it(rows["DeepSpeed 0.13.3"]) / _it(rows[gap]) for gap in gaps]

    tiled = [_ulysses_128k({"runtime.tiled_mlp_shards": shards}) for shards in ("auto", 4)]
    plain = _ulysses_128k({})
    packed = _summary("llama8b_alst_dgx_h100.yaml",
                      {"sequence_length": 1048576, "document_length": 1024})
    alst = _variant("alst", "alst", sequence_length=1048576)
    plain_dos = h100["DeepSpeed 0.13.3"]
    return [
        f"takes `llama13b_dp4` from {_time(study):.2f} to {_time(threads):.2f} s, the update from "
        f"{_time(study, 'update'):.2f} to {_time(threads, 'update'):.2f} s",
        f"update on `h100-jlse` {_time(plain_dos, 'update'):.2f} -> "
        f"{_time(cores['DeepSpeed 0.13.3'], 'update'):.2f} s, its boundary backward "
        f"{_time(plain_dos, 'backward_boundary'):.2f} -> "
        f"{_time(cores['DeepSpeed 0.13.3'], 'backward_boundary'):.2f} s (the interleaved update, "
        f"at gap 3, {_time(h100[gaps[1]], 'update'):.2f} -> "
        f"{_time(cores[gaps[1]], 'update'):.2f} s)",
        f"the same sweep gives {_it(plain_dos):.2f} s plain, "
        f"{_it(h100['DeepSpeed 0.13.3, unbound']):.2f} s unbound, "
        f"{_it(h100['async flush']):.2f} s with the asynchronous flush (the boundary backward "
        f"{_time(plain_dos, 'backward_boundary'):.2f} to "
        f"{_time(h100['async flush'], 'backward_boundary'):.2f} s) and {span(h100)} s with gaps "
        f"2, 3 and 4 besides (the update {_time(plain_dos, 'update'):.2f} to "
        f"{span(h100, 'update')} s): {min(gain(h100)):.1f}x the plain offload, against "
        f"{min(gain(polaris)):.1f}-{max(gain(polaris)):.1f}x on Polaris",
        f"scenario (`--set runtime.tiled_mlp_shards=auto`: 4 slices of 4,096 tokens a rank): "
        f"{_time(plain):.2f} -> {_time(tiled[0]):.2f} s an iteration, peak HBM "
        f"{plain['peak_hbm_GiB']:.1f} -> {tiled[0]['peak_hbm_GiB']:.1f} GiB",
        f"at a fixed 4 slices (no agreement, no sync) {_time(tiled[1]):.2f} s",
        f"takes {_it(alst):.1f} s an iteration over one document and {_time(packed):.1f} s over "
        f"documents of 1,024 tokens (`--set document_length=1024`, peak HBM "
        f"{packed['peak_hbm_GiB']:.1f} GiB either way)",
    ]


def _engine_page_releases_and_what_ifs() -> list[str]:
    """docs/engine.md: what ZeRO-2's releases and the what-ifs cost the study's runs."""
    versions = {"deepspeed.gradient_accumulation_steps": 2, "activation_checkpointing": True,
                "runtime.empty_cache_each_phase": False, Z + "stage": 2}

    def zero2(release: str, **more) -> dict:
        return _summary("llama13b_dp4.yaml", {**versions, "runtime.deepspeed_version": release,
                                              **{k.replace("__", "."): v
                                                 for k, v in more.items()}})

    no_offload = {"model": "llama2-7b", Z + "offload_optimizer.device": "none"}
    backward = [_time(zero2(release), "backward_non_boundary") for release in ("0.17.4", "0.17.5")]
    bare = [_time(zero2(release, **no_offload), "backward_non_boundary")
            for release in ("0.17.4", "0.17.5")]
    dp1 = [zero2(release, data_parallel=1) for release in ("0.14.0", "0.14.1", "0.17.0")]
    unpinned = zero2("0.17.0", data_parallel=1, **{Z + "offload_optimizer.pin_memory": False})
    update = [_time(_summary("llama13b_dp1.yaml", {} if every is None else
                             {"what_if.gpu_update_every": every}), "update")
              for every in (None, 1, 2)]
    return [
        f"non-boundary backward {backward[0]:.2f} → {backward[1]:.2f} s with the CPU optimizer; "
        f"7B without offload {bare[0]:.2f} → {bare[1]:.2f} s",
        f"peak HBM {dp1[0]['peak_hbm_GiB']:.1f} → {dp1[1]['peak_hbm_GiB']:.1f} GiB, update "
        f"{_time(dp1[0], 'update'):.2f} → {_time(dp1[1], 'update'):.2f} s",
        f"(update {_time(dp1[2], 'update'):.2f} s; {_time(unpinned, 'update'):.2f} s unpinned)",
        f"every sub-group on the GPU takes the update from {update[0]:.2f} s to {update[1]:.2f} s",
        f"and every second one to {update[2]:.2f} s",
    ]


@pytest.mark.filterwarnings("ignore:.*the fork's step as written raises")
def test_the_interleaved_updates_the_fork_page_quotes_are_what_they_give():
    """docs/deep_optimizer_states.md: the interleaved update's time on `polaris_dos.yaml` at
    gaps 3 and 2 as the sweep runs them, and without the fork's emptied cache."""
    rows = _by("deep_optimizer_states", "variant")
    gap3, gap2 = (_time(rows[f"async flush, gap {gap}"], "update") for gap in (3, 2))
    kept = _time(_summary("polaris_dos.yaml", {"runtime.empty_cache_each_phase": False}),
                 "update")
    figures = [f"(update {kept:.3f} -> {gap3:.3f} s)", f"{gap3:.3f} s now), at gap 2",
               f"({gap2:.3f} s now)"]
    assert _missing("docs/deep_optimizer_states.md", figures) == []


def _scenario_headers() -> list[tuple[str, str]]:
    """What the shipped scenarios' header comments quote of runs: the nodes sweep's like for
    like of the H100 and H200 nodes, the parameter-offload VM run's step."""
    liger = "llama8b_liger_dgx_h100.yaml"
    at_8k = {"runtime.liger_kernel": False, "sequence_length": 8192}
    capped = {"hardware.alternative": "power_capped_clock"}
    h100 = [_summary(liger, {**at_8k, **capped}), _summary(liger, capped)]
    h200 = [_summary(liger, {**at_8k, "hardware": "dgx-h200"}),
            _summary(liger, {"hardware": "dgx-h200"})]
    nodes = {hardware: row for (hardware, device), row in
             _by("nodes", "hardware", Z + "offload_optimizer.device").items() if device == "cpu"}
    step = [_time(_summary(f"h200_vm/{run}.yaml"), "update")
            for run in ("tinyllama_hooks_param", "tinyllama_hooks")]
    sweep = "scenarios/sweeps/nodes.yaml"
    return [
        (sweep, f"the H200 node comes out "
                f"{_it(nodes['dgx-h200']) / _it(nodes['dgx-h100']) - 1:.0%} slower than the H100 "
                "one offloaded"),
        (sweep, f"takes {_time(h100[0]):.2f} s against the H200 node's {_time(h200[0]):.2f}"),
        (sweep, f"node is {_time(h200[1]) / _time(h100[1]) - 1:.1%} slower than the H100 one "
                f"given the same clock, 0.869 ({_time(h200[1]):.2f} s against "
                f"{_time(h100[1]):.2f};"),
        ("scenarios/h200_vm/tinyllama_hooks_param.yaml",
         f"zerosim {step[0]:.2f} and {step[1]:.2f} s)"),
    ]


def _comment(path: str) -> str:
    """A YAML file's comments as one line of prose."""
    return " ".join(line.strip().lstrip("#").strip()
                    for line in (ROOT / path).read_text(encoding="utf-8").splitlines())


def test_the_figures_scenario_headers_quote_are_what_they_give():
    assert [(page, figure) for page, figure in _scenario_headers()
            if figure not in _comment(page)] == []


@pytest.mark.parametrize(("page", "figures"), [
    ("README.md", _readme_sweep_paragraph),
    ("README.md", _readme_tune_paragraph),
    ("docs/engine.md", _engine_page_paragraphs),
    ("docs/engine.md", _engine_page_releases_and_what_ifs),
    ("docs/engine.md", _engine_page_threads_and_tiles),
], ids=["readme-sweeps", "readme-tune", "engine-page", "engine-page-releases",
        "engine-page-threads"])
def test_the_figures_a_page_quotes_are_what_the_sweeps_give(page, figures):
    assert _missing(page, figures()) == []


def _table_rows(page: str, rows: list[str]) -> list[str]:
    """The rows not found whole, as lines of `page` (indentation aside)."""
    lines = {line.strip() for line in (ROOT / page).read_text(encoding="utf-8").splitlines()}
    return [row for row in rows if row not in lines]


SEQUENCES = {131072: "128K", 524288: "512K", 1048576: "1M", 2097152: "2M", 4194304: "4M"}
ALST_STEPS = ("ulysses_only", "tiled_loss", "tiled_loss_and_mlp", "alst")


def _alst_cell(row: dict) -> str:
    if _oom(row):
        return "out of HBM"
    seconds = _it(row)
    cell = (f"{seconds:,.0f} s" if seconds >= 100 else f"{seconds:.1f} s") + (
        f", {row['peak_hbm_GiB']:.1f} GiB")
    host = row["peak_host_GiB"]
    return cell + (f", {host:,.0f} GiB host" if host >= 1000 else "")


def test_the_alst_table_is_what_its_sweep_gives():
    """docs/engine.md, "Arctic Long Sequence Training": the tricks one at a time."""
    cells = {key: _alst_cell(row) for key, row in
             _by("alst", "sequence_length", "variant").items()}
    rows = [f"| {label} | " + " | ".join(cells[length, step] for step in ALST_STEPS) + " |"
            for length, label in SEQUENCES.items()]
    assert _table_rows("docs/engine.md", rows) == []


def test_the_liger_table_is_what_its_sweep_gives():
    """docs/engine.md, "Liger-Kernel": transformers' modules against Liger's, 4K to 64K."""
    def cell(row: dict) -> str:
        if _oom(row):
            return "out of HBM"
        seconds = _it(row)
        return f"{seconds:.2f} s" if seconds < 10 else f"{seconds:.1f} s"

    cells = {key: cell(row) if _oom(row) else f"{cell(row)}, {row['peak_hbm_GiB']:.1f} GiB"
             for key, row in _by("liger", "sequence_length", "runtime.liger_kernel").items()}
    rows = [f"| {length // 1024}K | {cells[length, False]} | {cells[length, True]} |"
            for length in (4096, 8192, 32768, 65536)]
    assert _table_rows("docs/engine.md", rows) == []


MASTER_ROWS = {"fp32 master": "fp32", "bf16 master, fp32 moments": "bf16, fp32 moments",
               "bf16 master and moments": "bf16, bf16 moments",
               "bf16 master and moments, optimizer on the GPU":
                   "bf16, bf16 moments, optimizer on the GPU"}
MASTER_NODES = {"h100-jlse": "study's (Sapphire Rapids)",
                "polaris-a100": "Polaris (EPYC 7543P, Zen 3)"}


def test_the_master_precision_table_is_what_its_sweep_gives():
    """docs/engine.md, "bf16 master params and gradients": both nodes, four masters."""
    rows = []
    for point, row in _rows("master_precision"):
        node = MASTER_NODES[point["hardware"]] if point["variant"] == "fp32 master" else ""
        first = f"| {node} | " if node else "| | "
        master = MASTER_ROWS[point["variant"]]
        if _oom(row):
            rows.append(f"{first}{master} | does not fit (40 GB A100) | | | |")
            continue
        rows.append(f"{first}{master} | {_it(row):.2f} s | "
                    f"{row['phases_s.backward_boundary']:.2f} / {row['phases_s.update']:.2f} s | "
                    f"{row['peak_hbm_GiB']:.1f} GiB | {row['peak_host_GiB']:.0f} GiB |")
    assert _table_rows("docs/engine.md", rows) == []


SUPEROFFLOAD_ROWS = {
    "ZeRO-Offload": "ZeRO-Offload (no ratio, the example's `zerooffload` config)",
    "SuperOffload 0.18.0": "SuperOffload, 0.18.0 (the release of the examples' figures)",
    "ZeRO-Offload, Twin-Flow 0.9": "ZeRO-Offload with Twin-Flow 0.9",
    "SuperOffload": "SuperOffload (the scenario, 0.18.9)",
    "SuperOffload, cpuadam_cores_perc 0.5": "SuperOffload, `cpuadam_cores_perc` 0.5",
    "SuperOffload 0.19.5": "SuperOffload, 0.19.5 (`gradient_clipping` 1.0 by default)",
    "SuperOffload 0.19.5, gradient_clipping 0": "SuperOffload, 0.19.5 with `gradient_clipping: 0`",
}
"""docs/engine.md's SuperOffload table's rows, by the sweep variant that runs each."""


def test_the_superoffload_table_is_what_its_sweep_gives():
    """docs/engine.md, "SuperOffload": DeepSpeedExamples' Qwen3-14B example on one GH200, its
    TFLOPS as the example's script counts them."""
    from zerosim.engine.plan import plan_of
    from zerosim.scenario import load_scenario
    from zerosim.validation.superoffload_examples import load_superoffload_claims, script_tflops

    scenario = load_scenario(load_superoffload_claims().scenario)
    params = sum(p.numel for p in plan_of(scenario).all_params)
    model = scenario.model
    step_tflop = script_tflops(params, scenario.sequence_length, model.num_hidden_layers,
                               model.hidden_size, scenario.deepspeed.train_batch_size, 1.0,
                               checkpointed=scenario.activation_checkpointing)
    rows = []
    for point, row in _rows("superoffload"):
        if point["variant"] not in SUPEROFFLOAD_ROWS:
            continue
        phases = " / ".join(f"{row[f'phases_s.{phase}']:.2f}"
                            for phase in ("forward", "backward_boundary", "update"))
        rows.append(f"| {SUPEROFFLOAD_ROWS[point['variant']]} | {_it(row):.2f} s | {phases} s | "
                    f"{row['peak_hbm_GiB']:.1f} GiB | {row['peak_host_GiB']:.0f} GiB | "
                    f"{step_tflop / _it(row):.0f} |")
    assert len(rows) == len(SUPEROFFLOAD_ROWS)
    assert _table_rows("docs/engine.md", rows) == []


def _diff(overrides: dict):
    """`zerosim diff scenarios/llama13b_dp4.yaml --set ...`, as the CLI compares."""
    from zerosim.api import simulate
    from zerosim.results.compare import compare

    main = ROOT / "scenarios" / "llama13b_dp4.yaml"
    return compare(simulate(main), simulate(main, overrides))


def _waits(phase, top: int = 3) -> str:
    return ", ".join(f"{w.kind} {w.change_s:+.3f}" for w in phase.waits[:top])


def test_the_figures_the_diff_paragraph_quotes_are_what_diff_gives():
    """README, "Two runs side by side": pageable buffers against pinned, 0.19.5 in place of
    0.13.3 and micro-batch 2 in place of 1 on the study's DP=4 node."""
    pageable = {p.key: p for p in _diff({Z + "offload_optimizer.pin_memory": False}).phases}
    release = {p.key: p for p in _diff({"runtime.deepspeed_version": "0.19.5"}).phases}
    batch = _diff({MICRO_BATCH: 2})
    iteration = {p.key: p for p in batch.phases}["iteration"]
    tokens = batch.figures["tokens_per_s"]
    boundary = pageable["backward_boundary"]
    figures = [
        f"the boundary backward grows by {boundary.change_s:.2f} s, `{_waits(boundary)}`",
        f"and the iteration by {pageable['iteration'].change_s:.2f} s",
        f"DeepSpeed 0.19.5 in place of 0.13.3 takes {-release['backward_boundary'].change_s:.2f} s "
        f"off the boundary backward (`{_waits(release['backward_boundary'])}`",
        f"`tokens_per_s: {tokens[0]:.0f} -> {tokens[1]:.0f}` for micro-batch 2 in place of 1 on "
        f"the DP=4 node, its iteration {iteration.b_s / iteration.a_s - 1:+.0%}",
    ]
    assert _missing("README.md", figures) == []


def _time(row: dict, phase: str | None = None) -> float:
    """The iteration, or a phase's time, of a run's summary or of a sweep's (flattened) row."""
    if phase is None:
        return row["iteration_s"]
    return row["phases_s"][phase] if "phases_s" in row else row[f"phases_s.{phase}"]


def _summary(scenario: str, overrides: dict | None = None) -> dict:
    from zerosim.api import simulate_summary

    return simulate_summary(ROOT / "scenarios" / scenario, overrides or {})


@pytest.mark.filterwarnings("ignore:.*the fork's step as written raises")
def test_the_figures_of_single_runs_the_readme_quotes_are_what_they_give():
    """README: the ranks' placement what-if, the study node's alternatives on its DP=4 run and
    on a Deep Optimizer States run, the fused softmax's reach, the RTX 4090 workstation, the
    MoE scenario, the Polaris node and two nodes."""
    placement = {p.key: p for p in _diff({"hardware.host.rank_memory_placement": "gpu_local"})
                 .phases}
    saved = -placement["iteration"].change_s
    study = _summary("llama13b_dp4.yaml")
    readings = {name: _summary("llama13b_dp4.yaml", {"hardware.alternative": name})
                for name in ("stream_host_memory", "power_capped_clock", "fresh_flush_pages")}

    def change(row: dict, base: dict, phase: str | None = None) -> str:
        return f"{_time(row, phase) / _time(base, phase) - 1:+.1%}"

    dos = _by("alternatives", ALTERNATIVE)
    long = _summary("polaris_dos.yaml", {"sequence_length": 8192, MICRO_BATCH: 1})
    fused = _summary("polaris_dos.yaml", {"sequence_length": 8192, MICRO_BATCH: 1,
                                          "stack.modules.fused_softmax.max_keys": 8192})
    rtx = _summary("llama8b_rtx4090_workstation.yaml")
    moe = _summary("qwen3_moe_dgx_h100.yaml")
    scout = _summary("qwen3_moe_dgx_h100.yaml", {"model": LLAMA4_SCOUT, "data_parallel": 16,
                                                 "hardware.nodes": 2})
    figures = [
        f"{saved:.3f} s ({saved / placement['iteration'].a_s:.0%}) off the iteration, "
        f"{-placement['backward_non_boundary'].change_s:.3f} s of it in the non-boundary "
        f"backward and {-placement['backward_boundary'].change_s:.3f} s in the boundary one",
        f"(`stream_host_memory` {change(readings['stream_host_memory'], study)}, "
        f"`power_capped_clock` {change(readings['power_capped_clock'], study)}, "
        f"`fresh_flush_pages` {change(readings['fresh_flush_pages'], study)}: the boundary "
        f"backward {change(readings['fresh_flush_pages'], study, 'backward_boundary')}",
        f"gap 3; {dos[None]['iteration_s']:.3f} s) they are "
        f"{change(dos['stream_host_memory'], dos[None])} (the update "
        f"{dos[None]['phases_s.update']:.3f} -> {dos['stream_host_memory']['phases_s.update']:.3f}"
        f" s, its CPU Adam alone on a socket's memory) and "
        f"{change(dos['power_capped_clock'], dos[None])} (the forward",
        f"a bound Deep Optimizer States update, {dos[None]['phases_s.update']:.2f} -> "
        f"{dos['stream_host_memory']['phases_s.update']:.2f} s",
        f"takes {_time(long, 'forward'):.2f} s a forward, not the "
        f"{_time(fused, 'forward'):.2f} s the fused kernel would",
        f"and peaks at {long['peak_hbm_GiB']:.1f} GiB, not {fused['peak_hbm_GiB']:.1f}",
        f"{rtx['iteration_s']:.2f} s an iteration ({rtx['tokens_per_s']:,.0f} tokens/s), "
        f"{rtx['tflops_per_gpu']:.0f} TFLOPS per GPU, {rtx['peak_hbm_GiB']:.1f} of "
        f"{rtx['hbm_capacity_GiB']:.0f} GiB",
        f"{moe['iteration_s']:.2f} s an iteration, {moe['phases_s']['update']:.2f} s of it the "
        "optimizer update",
        "(on two DGX H100 nodes at 4,096 tokens, the settings of "
        f"`scenarios/qwen3_moe_dgx_h100.yaml`, the forward takes {_time(scout, 'forward'):.2f} s)",
        f"(`polaris-11.20b-dp4-mb4-ga1-sg1e08`, "
        f"{_summary('calibration/polaris/polaris-11.20b-dp4-mb4-ga1-sg1e08.yaml')['iteration_s']:.1f}"
        " s)",
        f"takes {_summary('polaris_2nodes.yaml')['iteration_s']:.2f} s an iteration",
    ]
    assert _missing("README.md", figures) == []


def test_the_peer_transport_figures_are_what_its_sweep_gives():
    """README, "Hardware profiles": the RTX 4090 workstation's transports and its switch."""
    rows = _by("peer_transport", "sequence_length", MICRO_BATCH, "variant")
    order = ("SHM (stock driver)", "SHM rate off the PCIe links", "peer-to-peer (patched driver)")
    small = [_it(rows[512, 1, variant]) for variant in order]
    large = [_it(rows[2048, 4, variant]) for variant in order]
    switch = [_it(row) for key, row in rows.items() if key[2] == "SHM behind one PCIe switch"]
    ring, one = rows[2048, 4, order[0]], rows[2048, 4, "SHM behind one PCIe switch"]
    figures = [
        f"{small[0]:.2f} s through host memory, {small[1]:.2f} s with the same rate off the "
        f"PCIe links and {small[2]:.2f} s with a driver patched for peer-to-peer",
        f"where the GPUs' work hides the ring, {large[0]:.2f}, {large[1]:.2f} and "
        f"{large[2]:.2f} s",
        f"{min(switch):.2f}-{max(switch):.2f} s either way",
        f"(the forward's gathers {ring['phases_s.forward']:.2f} -> "
        f"{one['phases_s.forward']:.2f} s, the boundary backward "
        f"{ring['phases_s.backward_boundary']:.2f} -> {one['phases_s.backward_boundary']:.2f} s "
        "at micro-batch 4)",
    ]
    assert _missing("README.md", figures) == []


def _release_cell(row: dict) -> str:
    """A cell of the README's release table: iteration (non-boundary backward + boundary
    backward + update), peak HBM / host memory."""
    phases = "phases_s.backward_non_boundary", "phases_s.backward_boundary", "phases_s.update"
    parts = " + ".join(f"{row[key]:.2f}" for key in phases)
    return (f"{row['iteration_s']:.2f} s ({parts}), "
            f"{row['peak_hbm_GiB']:.0f} / {row['peak_host_GiB']:.0f} GiB")


def test_the_release_table_is_what_the_versions_sweep_gives():
    """README, "What each DeepSpeed release costs the same run": every cell as
    `zerosim sweep scenarios/sweeps/versions.yaml` computes it now."""
    cells: dict[str, dict[str, str]] = {}
    for values, row in _rows("versions"):
        assert row["status"] == "ok", row["error"]
        cells.setdefault(values["runtime.deepspeed_version"], {})[values["variant"]] = (
            _release_cell(row))
    header = "| release | ZeRO-2, CPU optimizer | ZeRO-3, CPU optimizer |"
    expected = [f"| {release} | {modes['ZeRO-2, CPU optimizer']} | "
                f"{modes['ZeRO-3, CPU optimizer']} |" for release, modes in cells.items()]
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    start = lines.index(header) + 2
    assert lines[start:start + len(expected)] == expected


OOM_WHERE = {"gpu": "HBM", "host": "host"}


def _mode_cell(row: dict) -> str:
    """A cell of the README's offload-modes table: iteration, peak HBM / host memory, or the
    memory and the allocation that did not fit."""
    if row["status"] == "oom":
        oom = json.loads(row["oom"])
        where = next(label for prefix, label in OOM_WHERE.items()
                     if oom["device"].startswith(prefix))
        return f"oom ({where}: {oom['category']})"
    assert row["status"] == "ok", row["error"]
    return (f"{row['iteration_s']:.2f} s, "
            f"{row['peak_hbm_GiB']:.0f} / {row['peak_host_GiB']:.0f} GiB")


def test_the_offload_modes_table_is_what_its_sweep_gives():
    """README, "What the engine replays": every cell as `zerosim sweep
    scenarios/sweeps/offload_modes.yaml` computes it now."""
    table: dict[tuple[str, str], dict[int, str]] = {}
    for values, row in _rows("offload_modes"):
        table.setdefault((values["model"], values["variant"]), {})[values["data_parallel"]] = (
            _mode_cell(row))
    expected = [f"| {model} | {mode} | " + " | ".join(cells[dp] for dp in (1, 2, 4)) + " |"
                for (model, mode), cells in table.items()]
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    start = lines.index("| model | mode | DP=1 | DP=2 | DP=4 |") + 2
    assert lines[start:start + len(expected)] == expected



OFFLOAD = "deepspeed.zero_optimization.offload_optimizer."
DOS_ROWS = {"DeepSpeed 0.13.3": "DeepSpeed 0.13.3",
            "DeepSpeed 0.13.3, unbound": "DeepSpeed 0.13.3, unbound",
            "`part_grads_async`": "async flush", "both": "async flush, gap 3"}
"""docs/engine.md's Deep Optimizer States table's rows, by the sweep variant that runs each."""


def _dos_cell_row(row: dict) -> str:
    return (f"{row['phases_s.backward_boundary']:.2f} s | {row['phases_s.update']:.2f} s | "
            f"{row['iteration_s']:.2f} s | {row['peak_hbm_GiB']:.1f} GiB | "
            f"{row['peak_host_GiB']:.0f} GiB")


def test_the_deep_optimizer_states_table_is_what_its_sweep_gives():
    """docs/engine.md, "Deep Optimizer States builds": the table on `polaris-a100` and the gaps
    after it, as `zerosim sweep scenarios/sweeps/deep_optimizer_states.yaml` computes them; the
    interleaved update without the asynchronous flush is the base scenario's with it off."""
    from zerosim.sweep.worker import run_point

    rows = {values["variant"]: row for values, row in _rows("deep_optimizer_states")}
    interleaved = run_point(str(ROOT / "scenarios" / "polaris_dos.yaml"),
                            {OFFLOAD + "part_grads_async": False}, "interleaved")
    cells = {name: _dos_cell_row(rows[variant]) for name, variant in DOS_ROWS.items()}
    cells["`prefetch_optimizer`, gap 3"] = _dos_cell_row(interleaved)
    page = (ROOT / "docs" / "engine.md").read_text(encoding="utf-8")
    missing = [f"| {name} | {cell} |" for name, cell in cells.items()
               if f"| {name} | {cell} |" not in page]
    gaps = (f"with the asynchronous flush: {rows['async flush, gap 2']['iteration_s']:.2f} s and "
            f"{rows['async flush, gap 4']['iteration_s']:.2f} s an iteration (gap 3: "
            f"{rows['async flush, gap 3']['iteration_s']:.2f} s)")
    assert missing == [] and gaps in " ".join(page.split())


def test_the_figures_of_tunes_fastest_on_the_study_node_are_what_it_gives():
    """README, "Tuning": the fastest configuration `zerosim tune scenarios/llama13b_dp4.yaml
    --fix binding --fix threads` finds (ZeRO-3 with nothing offloaded, micro-batch 2 without
    accumulation, 2e8 buckets, checkpointing), simulated directly (the search itself, 11 s on
    two workers, is tests/test_tune.py's), and what `zerosim diff` says it moved."""
    fastest = _diff({MICRO_BATCH: 2, "deepspeed.gradient_accumulation_steps": 1,
                     Z + "reduce_bucket_size": 2e8, Z + "offload_optimizer.device": "none",
                     "activation_checkpointing": True})
    phases = {p.key: p for p in fastest.phases}
    iteration, boundary, update = (phases[key] for key in ("iteration", "backward_boundary",
                                                           "update"))
    tokens = fastest.figures["tokens_per_s"][1]
    figures = [
        f"checkpointing ({iteration.b_s:.3f} s, {tokens:,.0f} tokens/s)",
        f"the iteration {iteration.a_s:.3f} -> {iteration.b_s:.3f} s, the boundary backward "
        f"{boundary.change_s:.3f} s (`{_waits(boundary)}`), the update {update.change_s:.3f} s "
        f"(`{_waits(update)}`)",
    ]
    assert _missing("README.md", figures) == []


SENSITIVITY_QUOTED = {
    # key: (what the README calls it and how it qualifies it, the phases it quotes beside)
    "hardware.cpu.page_zeroing_GBps": ("page zeroing (fitted, {iteration}; the boundary "
                                       "backward {backward_boundary})"),
    "hardware.host.cpu_boost_GHz": "the CPU clock ({iteration}; the forward {forward}:",
    "hardware.host.socket_link_total_GBps": "the socket-link total (fitted, {iteration})",
    "hardware.host.memory_GBps_per_domain": ("the host-memory bandwidth (`assumed` at the DDR5 "
                                             "peak, {iteration}; the update {update}:"),
    "hardware.cpu.fp16_check_elements_per_s_per_thread": (
        "the fp16 overflow check's rate (derived from its measured cycles, {iteration}; the "
        "update {update})"),
    "hardware.cpu.elementwise_GBps_per_thread": ("the elementwise rate (fitted, {iteration}; "
                                                 "the update {update})"),
    "hardware.pcie.h2d_pageable_GBps": ("the pageable H2D of the copy-back (fitted, "
                                        "{iteration}; the update {update})"),
    "stack.host.gc_per_object_ns": "the collector's time per object (fitted, {iteration}:",
    "hardware.cpu.oversubscription_penalty": ("the oversubscription penalty (fitted, "
                                              "{iteration}; the update {update})"),
    "hardware.pcie.d2h_pageable_GBps": ("the pageable D2H of the flush (measured, {iteration}; "
                                        "the boundary backward {backward_boundary})"),
    "hardware.host.remote_access_cost": ("the remote-access cost (`assumed`, {iteration}; the "
                                         "update {update})"),
    "hardware.gpu.cuda_malloc_GBps": "rate (fitted, the forward {forward})",
    "stack.host.fetch_hook_us": "the ZeRO-3 hook time (fitted, {iteration}; the forward {forward})",
    "stack.host.collective_launch_us": ("the per-collective time (`assumed`, {iteration}; the "
                                        "forward {forward})"),
    "hardware.cpu.oversubscribed_region_ms": ("the oversubscribed region's wait (`assumed`, "
                                              "{iteration}; the boundary backward "
                                              "{backward_boundary})"),
    "hardware.nvlink.bus_GBps": "and NVLink ({backward_non_boundary})",
}
"""README, "Sensitivity": what it says the study's DP=4 iteration and its phases hang on."""


def test_the_elasticities_the_readme_quotes_are_what_sensitivity_gives():
    from zerosim.sensitivity import sensitivity

    outcome = sensitivity(ROOT / "scenarios" / "llama13b_dp4.yaml", workers=1,
                          keys=list(SENSITIVITY_QUOTED))
    rows = {row.key: row for row in outcome.rows}
    figures = [template.format(**{
        quantity: f"{rows[key].elasticity(quantity):+.2f}"
        for quantity in ("iteration", "forward", "backward_non_boundary", "backward_boundary",
                         "update")}) for key, template in SENSITIVITY_QUOTED.items()]
    figures.append("its non-boundary backward hangs on the socket-link total (fitted, "
                   f"{rows['hardware.host.socket_link_total_GBps'].backward_non_boundary:+.2f})")
    polaris = {row.key: row for row in sensitivity(
        ROOT / "scenarios" / "calibration" / "polaris" / "polaris-11.20b-dp4-mb4-ga1-sg1e08.yaml",
        workers=1, keys=["hardware.host.memory_GBps_per_domain",
                         "hardware.gpu.gemm_efficiency"]).rows}
    memory = polaris["hardware.host.memory_GBps_per_domain"]
    network, = sensitivity(ROOT / "scenarios" / "polaris_2nodes.yaml", workers=1,
                           keys=["hardware.network.nic_GBps"]).rows
    figures += [
        f"the update is the host-memory bandwidth alone (fitted, {memory.update:+.2f} of the "
        f"update, {memory.iteration:+.2f} of the iteration) and the forward the GPU's GEMM rate "
        f"({polaris['hardware.gpu.gemm_efficiency'].forward:+.2f})",
        f"the network moves the iteration by only {network.iteration:+.2f} per 1%",
    ]
    assert _missing("README.md", figures) == []
