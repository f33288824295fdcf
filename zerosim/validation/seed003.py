"""Seed 003 (AWS, RoBERTa on 8 p4d.24xlarge nodes): published TFLOPS/GPU next to simulated ones.

Reported, not judged: the model shapes, the precision and the profile's efficiencies are
assumptions (data/seed003.yaml lists them). "Unoptimized" and "optimized" are two DeepSpeed
releases, before and after the PR that made ZeRO-3's collectives coalesced; each case runs its
scenario once per release through `runtime.deepspeed_version`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zerosim.shipped import shipped_root
from zerosim.validation.reference import reference_data
from zerosim.vocabulary import Status

VERDICT = "reported, not judged"

SimulateTflops = Callable[[Path, Mapping[str, Any]], "float | None"]
"""(scenario path, overrides) -> zerosim's tflops_per_gpu, or None when the run did not finish
(out of memory)."""


@dataclass(frozen=True)
class Seed003Case:
    model: str
    scenario: str
    gpus: int
    published: Mapping[str, float]
    """Published TFLOPS/GPU by variant (`unoptimized`, `optimized`)."""


@dataclass(frozen=True)
class Seed003:
    source: str
    versions: Mapping[str, str]
    """DeepSpeed release by variant."""
    published_over_zerosim: float
    """Factor from zerosim's FLOP count (3 x forward) to the published one (recompute too)."""
    cases: tuple[Seed003Case, ...]


@dataclass(frozen=True)
class Seed003Row:
    model: str
    variant: str
    version: str
    published_tflops: float
    simulated_tflops: float | None
    """In the published convention (zerosim's figure x published_over_zerosim)."""
    ratio: float | None
    """simulated / published."""
    verdict: str = VERDICT


def load_seed003() -> Seed003:
    data = reference_data("seed003.yaml")
    source = f"{data['source']['title']} ({data['source']['publisher']})"
    cases = tuple(Seed003Case(c["model"], c["scenario"], c["gpus"], dict(c["tflops_per_gpu"]))
                  for c in data["cases"])
    return Seed003(source, dict(data["versions"]),
                   float(data["flops_convention"]["published_over_zerosim"]), cases)


def default_simulate(scenario: Path, overrides: Mapping[str, Any]) -> float | None:
    """Run zerosim; None when the configuration does not fit."""
    import zerosim

    result = zerosim.simulate(scenario, overrides=dict(overrides))
    if result.summary.get("status") != Status.OK:
        return None
    return float(result.summary["tflops_per_gpu"])


def seed003_rows(simulate: SimulateTflops = default_simulate, *, root: Path | None = None,
                 data: Seed003 | None = None) -> list[Seed003Row]:
    """One row per case and variant: published TFLOPS/GPU, simulated (in the published
    convention), their ratio, and the verdict "reported, not judged"."""
    data = data or load_seed003()
    root = root or shipped_root()
    rows = []
    for case in data.cases:
        for variant, published in case.published.items():
            version = data.versions[variant]
            tflops = simulate(root / case.scenario, {"runtime.deepspeed_version": version})
            simulated = None if tflops is None else tflops * data.published_over_zerosim
            ratio = None if simulated is None else simulated / published
            rows.append(Seed003Row(case.model, variant, version, float(published), simulated,
                                   ratio))
    return rows


@dataclass(frozen=True)
class Seed003Speedup:
    model: str
    published: float
    """The optimized release's TFLOPS/GPU over the unoptimized one's, as published."""
    simulated: float | None
    """The same ratio of zerosim's figures (None where either run did not fit)."""


def speedups(rows: list[Seed003Row]) -> list[Seed003Speedup]:
    """Per model, what the optimizations gained (optimized over unoptimized): the figure the
    seed states most directly, and the one the assumed shapes and GEMM rates move least, as
    both releases run the same model on the same GPUs."""
    by_model: dict[str, dict[str, Seed003Row]] = {}
    for row in rows:
        by_model.setdefault(row.model, {})[row.variant] = row
    found = []
    for model, variants in by_model.items():
        before, after = variants.get("unoptimized"), variants.get("optimized")
        if before is None or after is None:
            continue
        simulated = (None if before.simulated_tflops is None or after.simulated_tflops is None
                     else after.simulated_tflops / before.simulated_tflops)
        found.append(Seed003Speedup(model, after.published_tflops / before.published_tflops,
                                    simulated))
    return found


def rows_markdown(rows: list[Seed003Row]) -> str:
    """The rows as a Markdown table."""
    lines = ["| model | variant | DeepSpeed | published TFLOPS/GPU | simulated | ratio | |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        simulated = "did not fit" if r.simulated_tflops is None else f"{r.simulated_tflops:.1f}"
        ratio = "" if r.ratio is None else f"{r.ratio:.2f}"
        lines.append(f"| {r.model} | {r.variant} | {r.version} | {r.published_tflops:g} | "
                     f"{simulated} | {ratio} | {r.verdict} |")
    return "\n".join(lines)
