"""Every speed target of the tracker's issue 14, measured on this machine.

Run: `python benchmarks/bench_targets.py [--repeat N] [--sweep-points K] [--only NAME ...]`.

| figure    | what is timed                                                                   |
|-----------|---------------------------------------------------------------------------------|
| engine    | `run_engine` of `llama13b_dp4` (scenario loaded once), best of N, fresh process |
| run       | the whole `zerosim run scenarios/llama13b_dp4.yaml --no-files` process, best of N |
| files     | the same process writing every table and the trace (README's first command's run), |
|           | best of N; no target                                                            |
| sweep     | K variants of `llama13b_dp4` on 2 worker processes (K = 1000, the default,      |
|           | measures it whole; a smaller K extrapolates at its points/s, the pool's start   |
|           | counted 1000/K times over)                                                      |
| gpt3-1k   | GPT-3 175B, ZeRO-3, optimizer and parameters offloaded to pinned host memory,    |
| gpt3-10k  | 1,024 / 10,240 GPUs (p4d-24xlarge nodes): engine time and peak RSS of the process |
| tune      | `zerosim tune` of a 13 B model on h100-jlse (4 GPUs): wall time of the process   |

Timings on a shared 2-core machine are noisy: each figure is the best of `--repeat` runs
(sweep, GPT-3 and tune: one run each, they are long), given as wall time and, where this
process can see it, CPU time (user + system of the processes concerned; for the sweep, the CPU
time of the same points run in one process, over 2: the wall time of two workers on two
otherwise idle cores; tune's workers are not visible, so wall only). When other work shares
the cores, the CPU figure is the one to compare. No figure is asserted.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DP4 = ROOT / "scenarios" / "llama13b_dp4.yaml"
SEED003 = ROOT / "scenarios" / "seed003" / "roberta10b_p4d64.yaml"
Z = "deepspeed.zero_optimization."
GPT3_OFFLOAD = {"model": "gpt3-175b", "sequence_length": 2048, "activation_checkpointing": True,
                "deepspeed.train_micro_batch_size_per_gpu": 1,
                "deepspeed.gradient_accumulation_steps": 1,
                "runtime.deepspeed_version": "0.13.3", "runtime.framework": "megatron-deepspeed",
                Z + "offload_optimizer.device": "cpu", Z + "offload_optimizer.pin_memory": True,
                Z + "offload_param.device": "cpu", Z + "offload_param.pin_memory": True}
TIMEOUT_S = 600
FIGURES = ["engine", "run", "files", "sweep", "gpt3-1k", "gpt3-10k", "tune"]
ZEROSIM = [sys.executable, "-m", "zerosim.cli"]
"""The `zerosim` command, run by this interpreter (the console script does the same)."""

ENGINE_CHILD = r"""
import json, resource, sys, time, warnings
warnings.simplefilter("ignore")
from zerosim.engine.simulate import run_engine
from zerosim.scenario import load_scenario
scenario = load_scenario(sys.argv[1], json.loads(sys.argv[2]))
times, cpu = [], []
for _ in range(int(sys.argv[3])):
    start, start_cpu = time.perf_counter(), time.process_time()
    raw = run_engine(scenario)
    times.append(time.perf_counter() - start)
    cpu.append(time.process_time() - start_cpu)
print(json.dumps({"best_s": min(times), "best_cpu_s": min(cpu), "status": raw.status,
                  "peak_rss_MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def engine(scenario: Path, overrides: dict, repeat: int, timeout_s: float = TIMEOUT_S) -> dict:
    out = subprocess.run([sys.executable, "-c", ENGINE_CHILD, str(scenario),
                          json.dumps(overrides), str(repeat)], cwd=ROOT, check=True,
                         capture_output=True, text=True, timeout=timeout_s)
    return json.loads(out.stdout)


def gpt3(gpus: int, timeout_s: float) -> dict | None:
    """None when it has not finished within `timeout_s`."""
    overrides = GPT3_OFFLOAD | {"data_parallel": gpus, "hardware.nodes": gpus // 8}
    try:
        return engine(SEED003, overrides, 1, timeout_s)
    except subprocess.TimeoutExpired:
        return None


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def whole_run(repeat: int, files: bool = False) -> tuple[float, float]:
    """Best wall and best CPU seconds of the whole process: with `files`, writing every table
    and the trace into a fresh folder (README's first command), else `--no-files`."""
    best, best_cpu = float("inf"), float("inf")
    with tempfile.TemporaryDirectory() as tmp:
        for attempt in range(repeat):
            where = ["--out", str(Path(tmp) / str(attempt))] if files else ["--no-files"]
            started, cpu = time.perf_counter(), children_cpu_s()
            subprocess.run([*ZEROSIM, "run", str(DP4), *where], cwd=ROOT, check=True,
                           capture_output=True, timeout=TIMEOUT_S)
            best = min(best, time.perf_counter() - started)
            best_cpu = min(best_cpu, children_cpu_s() - cpu)
    return best, best_cpu


def sweep_spec(points: int) -> dict:
    """Variants of llama13b_dp4: bucket sizes x sub-group sizes x pinned/pageable x two
    DeepSpeed versions, the grid cut to `points`."""
    buckets = max(1, points // 20)
    return {"base": str(DP4), "grid": {
        Z + "reduce_bucket_size": {"start": 5e7, "stop": 2e9, "num": buckets, "scale": "log"},
        Z + "sub_group_size": [1e8, 2e8, 5e8, 1e9, 4e9],
        Z + "offload_optimizer.pin_memory": [True, False],
        "runtime.deepspeed_version": ["0.13.3", "0.19.5"]}}


def sweep(points: int, workers: int = 2) -> tuple[int, float, float]:
    """(points run, wall seconds on `workers` processes, CPU seconds of the same points run
    again in this process: the workers' own CPU time is not visible from here)."""
    import yaml

    from zerosim.sweep import run_sweep

    with tempfile.TemporaryDirectory() as tmp:
        spec_path = Path(tmp) / "bench.yaml"
        spec_path.write_text(yaml.safe_dump(sweep_spec(points), sort_keys=False))
        started = time.perf_counter()
        outcome = run_sweep(spec_path, out_dir=Path(tmp) / "pool", workers=workers)
        wall = time.perf_counter() - started
        cpu = time.process_time()
        run_sweep(spec_path, out_dir=Path(tmp) / "inline", workers=1)
        return outcome.ran, wall, time.process_time() - cpu


def tune() -> float:
    """Wall seconds of the whole command."""
    command = [*ZEROSIM, "tune", str(DP4), "--workers", "2", "--out", "OUT"]
    with tempfile.TemporaryDirectory() as tmp:
        command[-1] = str(Path(tmp) / "tune")
        started = time.perf_counter()
        subprocess.run(command, cwd=ROOT, check=True, capture_output=True, timeout=TIMEOUT_S)
        return time.perf_counter() - started


def row(label: str, measured: str, target: str, cpu: str = "") -> None:
    print(f"{label:48} {measured:>12} {cpu:>12} {target:>12}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--sweep-points", type=int, default=1000)
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S,
                        help="give up on a GPT-3 run after this many seconds")
    parser.add_argument("--only", nargs="+",
                        choices=FIGURES)
    args = parser.parse_args()
    chosen = set(args.only or FIGURES)
    row("figure", "wall", "target", "CPU")
    if "engine" in chosen:
        m = engine(DP4, {}, args.repeat)
        row(f"llama13b_dp4 engine (best of {args.repeat})", f"{m['best_s']:.3f} s",
            "<= 0.15 s", f"{m['best_cpu_s']:.3f} s")
    if "run" in chosen:
        wall, cpu = whole_run(args.repeat)
        row(f"zerosim run --no-files process (best of {args.repeat})", f"{wall:.2f} s",
            "<= 1.5 s", f"{cpu:.2f} s")
    if "files" in chosen:
        wall, cpu = whole_run(args.repeat, files=True)
        row(f"zerosim run writing every file (best of {args.repeat})", f"{wall:.2f} s", "-",
            f"{cpu:.2f} s")
    if "sweep" in chosen:
        ran, wall, cpu = sweep(args.sweep_points)
        row(f"1,000-point sweep, 2 workers (from {ran})", f"{wall / ran * 1000:.0f} s",
            "<= 60 s", f"{cpu / 2 / ran * 1000:.0f} s")
    for name, gpus in (("gpt3-1k", 1024), ("gpt3-10k", 10240)):
        if name not in chosen:
            continue
        m = gpt3(gpus, args.timeout)
        if m is None:
            row(f"GPT-3 175B, {gpus} GPUs, offload", f"> {args.timeout:.0f} s", "<= 5 s")
            continue
        row(f"GPT-3 175B, {gpus} GPUs, offload ({m['status']})", f"{m['best_s']:.2f} s",
            "<= 5 s", f"{m['best_cpu_s']:.2f} s")
        row("  peak RSS of that process", f"{m['peak_rss_MiB']:.0f} MiB", "<= 500 MiB")
    if "tune" in chosen:
        row("zerosim tune llama13b_dp4 (2 workers)", f"{tune():.0f} s", "<= 120 s")


if __name__ == "__main__":
    main()
