"""A SHA-256 per scenario over everything a run produces, to check that a speed change keeps
every simulated result bit-identical.

Run: `python benchmarks/fingerprint.py [--only NAME ...] [--rounds N] > FILE`, before and
after a change, and compare the outputs (`diff`). Each scenario runs twice, every record kept
(`run_engine`) and summary only (`run_engine(full=False)`, what a sweep point runs); each line
hashes that run's status, events processed, every table's rows (spans, phases, memory, links
and peer waits; `repr`, so floats to the last bit, enum members as their values), capacities,
peaks, OOM record, checks, folding and the summary (`results.summary`).
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
POLARIS = SCENARIOS / "calibration" / "polaris"
Z = "deepspeed.zero_optimization."
DP1, DP2, DP4 = (SCENARIOS / f"llama13b_dp{dp}.yaml" for dp in (1, 2, 4))
NVME_PARAMS = {Z + "offload_optimizer.device": "nvme", Z + "offload_optimizer.nvme_path": "/n",
               Z + "offload_param.device": "nvme", Z + "offload_param.nvme_path": "/n",
               Z + "offload_param.pin_memory": True, Z + "offload_param.buffer_size": 5e8,
               "activation_checkpointing": True}

CASES: dict[str, tuple[Path, dict]] = {
    "dp1": (DP1, {}),
    "dp2": (DP2, {}),
    "dp4": (DP4, {}),
    "seed003-10b": (SCENARIOS / "seed003" / "roberta10b_p4d64.yaml", {}),
    "seed003-50b": (SCENARIOS / "seed003" / "roberta50b_p4d64.yaml", {}),
    "polaris-5.90b-dp4": (POLARIS / "polaris-5.90b-dp4-mb4-ga1-sg1e08.yaml", {}),
    "polaris-11.20b-dp1-ga2": (POLARIS / "polaris-11.20b-dp1-mb4-ga2-sg1e08.yaml", {}),
    "polaris-5.95b-dp1-sg1e07": (POLARIS / "polaris-5.95b-dp1-mb1-ga1-sg1e07.yaml", {}),
    "dp4-pageable": (DP4, {Z + "offload_optimizer.pin_memory": False}),
    "dp4-ds0.19.5": (DP4, {"runtime.deepspeed_version": "0.19.5"}),
    "dp4-offload-param": (DP4, {Z + "offload_param.device": "cpu",
                                Z + "offload_param.pin_memory": True}),
    "dp2-no-overlap": (DP2, {Z + "overlap_comm": False}),
    "dp4-no-overlap": (DP4, {Z + "overlap_comm": False}),
    "dp4-stage2": (DP4, {Z + "stage": 2}),
    "dp2-nvme": (DP2, NVME_PARAMS),
    "dp1-oom-forward": (DP1, {"hardware.gpu.hbm_GiB": 40}),
    "dp4-oom-forward": (DP4, {"hardware.gpu.hbm_GiB": 20}),
    "dp2-oom-host": (DP2, {"hardware.host.memory_GiB": 200}),
    "polaris-dos-gap3": (SCENARIOS / "polaris_dos.yaml", {}),
    "polaris-11.20b-dp4-gap2": (POLARIS / "polaris-11.20b-dp4-mb4-ga1-sg1e08.yaml", {
        "runtime.deepspeed_version": "0.13.3+4570a955",
        Z + "offload_optimizer.part_grads_async": True,
        Z + "offload_optimizer.prefetch_optimizer": True,
        Z + "offload_optimizer.prefetch_optimizer_gap": 2}),
    "qwen3-moe-dgx-h100": (SCENARIOS / "qwen3_moe_dgx_h100.yaml", {}),
    "dgx-a100-zenflow": (SCENARIOS / "dgx_a100_offload" / "qwen2.5-3b-zenflow.yaml", {}),
    "gh200-superoffload": (SCENARIOS / "gh200" / "qwen3-14b-superoffload.yaml", {}),
}


ENUM_REPR = re.compile(r"<\w+\.\w+: ('[^']*')>")


def _text(part) -> bytes:
    """`repr`, with every `StrEnum` member written as its value: a field that becomes one of
    the vocabulary's enums, or stops being one, leaves the hash as it was."""
    return ENUM_REPR.sub(r"\1", repr(part)).encode()


def fingerprint(path: Path, overrides: dict, full: bool) -> str:
    from zerosim.engine.simulate import run_engine
    from zerosim.results.summary import summarize
    from zerosim.scenario import load_scenario

    raw = run_engine(load_scenario(path, overrides), count_events=True, full=full)
    digest = hashlib.sha256()
    parts = [raw.status, raw.events, raw.capacities, raw.peaks, raw.oom, raw.checks,
             raw.node_copies, raw.stands_for, raw.gpus_for, summarize(raw)]
    for part in parts:
        digest.update(_text(part))
    for table in (raw.spans, raw.phases, raw.memory, raw.links, raw.peer_waits):
        digest.update(_text(table.names))
        for row in table.rows:
            digest.update(_text(row))
    return f"{raw.status} events={raw.events} rows={len(raw.spans)}/{len(raw.memory)}/" \
           f"{len(raw.links)} {digest.hexdigest()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=sorted(CASES))
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every case this many times in this process, the later rounds "
                             "in reverse order, and fail unless each gives the same hash (what "
                             "a cache kept across runs must not change)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    names = args.only or list(CASES)
    first = {}
    for name in names:
        for mode in ("full", "summary"):
            first[name, mode] = fingerprint(*CASES[name], mode == "full")
            print(f"{name:26} {mode:8} {first[name, mode]}", flush=True)
    for _ in range(args.rounds - 1):
        for name in reversed(names):
            for mode in ("summary", "full"):
                again = fingerprint(*CASES[name], mode == "full")
                if again != first[name, mode]:
                    sys.exit(f"{name} {mode}: {again} in a later round")


if __name__ == "__main__":
    sys.exit(main())
