"""Real DeepSpeed ZeRO-3 offload iterations on one GPU, timed phase by phase.

What zerosim replays, run for real: transformers' LlamaForCausalLM built under
`deepspeed.zero.Init`, trained by `deepspeed.initialize` with ZeRO-3, bf16, the optimizer
(DeepSpeedCPUAdam) offloaded to pinned host memory and, in some runs, the parameters too.
Each iteration is timed as DeepSpeed's own timers would (the GPU synchronised around the
engine's forward, backward and step), and every DeepSpeedCPUAdam.step call (one per
sub-group) is timed on the host. Peak GPU memory per phase, the process's resident host
memory and whether DeepSpeed skipped the step are recorded beside them.

Standalone: Python 3.10+, torch with CUDA, transformers 5, deepspeed (0.19.5 was used),
nothing from zerosim, no network (the model is built from its config, weights random).

    python3 ds_offload_probe.py --runs tinyllama_opt,tinyllama_param --out runs.jsonl

runs each named run in a process of its own (a fresh DeepSpeed, the GPU and the pinned
memory given back in between) and appends one JSON line per run. `--cpu` runs a small model
through DeepSpeed's CPU accelerator instead (a dry run of the script on any machine).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

MODELS = {
    # TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T config.json
    "tinyllama-1.1b": dict(hidden_size=2048, num_hidden_layers=22, intermediate_size=5632,
                           num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
                           max_position_embeddings=2048, tie_word_embeddings=False,
                           rms_norm_eps=1e-5, rope_theta=10000.0),
    # meta-llama/Llama-3.2-3B config.json (tied embeddings, 128256-token vocabulary)
    "llama3.2-3b": dict(hidden_size=3072, num_hidden_layers=28, intermediate_size=8192,
                        num_attention_heads=24, num_key_value_heads=8, vocab_size=128256,
                        max_position_embeddings=8192, tie_word_embeddings=True,
                        rms_norm_eps=1e-5, rope_theta=500000.0),
    # a toy for the CPU dry run
    "toy": dict(hidden_size=256, num_hidden_layers=2, intermediate_size=688,
                num_attention_heads=4, num_key_value_heads=2, vocab_size=1024,
                max_position_embeddings=512, tie_word_embeddings=False,
                rms_norm_eps=1e-5, rope_theta=10000.0),
}
# TinyLlama's module structure (22 layers: 201 parameter tensors) at toy widths: DeepSpeed's host
# path per module and per tensor, with next to no arithmetic (the CPU runs)
MODELS["tinyllama-shape"] = {**MODELS["tinyllama-1.1b"], "hidden_size": 64,
                             "intermediate_size": 176, "num_attention_heads": 4,
                             "num_key_value_heads": 1, "vocab_size": 1024,
                             "max_position_embeddings": 512}

RUNS = {
    "tinyllama_opt": dict(model="tinyllama-1.1b", micro_batch=4, seq=2048, ga=1,
                          offload_param=False),
    "tinyllama_param": dict(model="tinyllama-1.1b", micro_batch=4, seq=2048, ga=1,
                            offload_param=True),
    "tinyllama_opt_ga2": dict(model="tinyllama-1.1b", micro_batch=4, seq=2048, ga=2,
                              offload_param=False),
    "llama3b_opt": dict(model="llama3.2-3b", micro_batch=2, seq=2048, ga=1,
                        offload_param=False),
    "llama3b_param": dict(model="llama3.2-3b", micro_batch=2, seq=2048, ga=1,
                          offload_param=True),
    # The host path alone: GPU work too short to hide the host's hooks and dispatch, the optimizer a
    # client torch.optim.AdamW on the GPU (nothing to compile).
    "tinyllama_hooks": dict(model="tinyllama-1.1b", micro_batch=1, seq=128, ga=1,
                            offload_param=False, offload_optimizer=False),
    "tinyllama_hooks_param": dict(model="tinyllama-1.1b", micro_batch=1, seq=128, ga=1,
                                  offload_param=True, offload_optimizer=False),
    "tinyshape_cpu_hooks": dict(model="tinyllama-shape", micro_batch=1, seq=16, ga=1,
                                offload_param=False, offload_optimizer=False),
    "tinyshape_cpu_hooks_param": dict(model="tinyllama-shape", micro_batch=1, seq=16, ga=1,
                                      offload_param=True, offload_optimizer=False),
    # ZeRO-3 leaves on the CPU accelerator: every tensor gathered and released (no persistent
    # one), none, each attention (granularity 2048 <= 2,048), each decoder layer (3,680 <=
    # 3,700) or the whole model (4,099 <= 4,100) a leaf (module_granularity_threshold); and
    # the same model without ZeRO (stage 0: no hook at all)
    **{f"tinyshape_cpu_leaves_{label}": dict(model="tinyllama-shape", micro_batch=1, seq=16,
                                             ga=1, offload_param=False, offload_optimizer=False,
                                             persistence=0, granularity=threshold)
       for label, threshold in (("none", 0), ("attention", 2048), ("layer", 3700),
                                ("model", 4100))},
    "tinyshape_cpu_leaves_stage0": dict(model="tinyllama-shape", micro_batch=1, seq=16, ga=1,
                                        offload_param=False, offload_optimizer=False, stage=0),
    # DeepSpeed's TiledMLP (0.17.0+, as Arctic Long Sequence Training patches LlamaMLP.forward)
    # at a fixed number of shards on the CPU accelerator, every tensor gathered and released:
    # what the hooks of a module whose parameters are already gathered cost, each shard
    # calling the MLP's modules again (forward, and recompute and backward in its backward);
    # and the same without ZeRO (stage 0), the dispatch alone
    **{f"tinyshape_cpu_tiled_{label}": dict(model="tinyllama-shape", micro_batch=1, seq=64, ga=1,
                                            offload_param=False, offload_optimizer=False,
                                            persistence=0, tiled=shards)
       for label, shards in (("none", 0), ("1", 1), ("4", 4), ("16", 16))},
    **{f"tinyshape_cpu_tiled_stage0_{label}": dict(model="tinyllama-shape", micro_batch=1,
                                                   seq=64, ga=1, offload_param=False,
                                                   offload_optimizer=False, stage=0,
                                                   tiled=shards)
       for label, shards in (("none", 0), ("1", 1), ("16", 16))},
    "toy_cpu": dict(model="toy", micro_batch=2, seq=128, ga=2, offload_param=False),
    "toy_cpu_hooks": dict(model="toy", micro_batch=1, seq=128, ga=1, offload_param=False,
                          offload_optimizer=False),
}


def ds_config(run: dict) -> dict:
    """The DeepSpeed configuration, every ZeRO-3 knob zerosim reads stated at its default."""
    zero = {
        "stage": run.get("stage", 3),
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": 500_000_000,
        "stage3_prefetch_bucket_size": 50_000_000,
        "stage3_param_persistence_threshold": run.get("persistence", 100_000),
        "stage3_max_live_parameters": 1_000_000_000,
        "stage3_max_reuse_distance": 1_000_000_000,
        "sub_group_size": 1_000_000_000,
    }
    if run.get("granularity"):
        zero["module_granularity_threshold"] = run["granularity"]
    if offloads_optimizer(run):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if run["offload_param"]:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    config = {
        "train_micro_batch_size_per_gpu": run["micro_batch"],
        "gradient_accumulation_steps": run["ga"],
        "bf16": {"enabled": True},
        "zero_optimization": zero,
        "steps_per_print": 1_000_000,
        "wall_clock_breakdown": False,
    }
    if offloads_optimizer(run):
        config["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-5, "weight_decay": 0.0}}
    else:
        config["zero_allow_untested_optimizer"] = True
    return config


def offloads_optimizer(run: dict) -> bool:
    """DeepSpeedCPUAdam on the host (the default); else a client torch.optim.AdamW."""
    return run.get("offload_optimizer", True)


def proc_field_bytes(path: str, field: str) -> int:
    """A `kB` field of a /proc file (`VmRSS` of /proc/self/status, `MemAvailable` of
    /proc/meminfo), in bytes."""
    with open(path) as lines:
        for line in lines:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    return 0


def host_rss_bytes() -> int:
    return proc_field_bytes("/proc/self/status", "VmRSS")


def mem_available_bytes() -> int:
    return proc_field_bytes("/proc/meminfo", "MemAvailable")


def one_run(name: str, iterations: int, cpu: bool) -> dict:
    """Build, initialise and train one run in this process; return its record."""
    started = time.perf_counter()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29611")
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}.items():
        os.environ.setdefault(key, value)
    import deepspeed
    import torch
    import transformers
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    from transformers import AutoModelForCausalLM, LlamaConfig
    from transformers.integrations import HfDeepSpeedConfig

    run = RUNS[name]
    config = ds_config(run)
    device = "cpu" if cpu else "cuda"
    sync = (lambda: None) if cpu else torch.cuda.synchronize
    deepspeed.init_distributed(dist_backend="gloo" if cpu else "nccl")
    keep_alive = HfDeepSpeedConfig(config)  # noqa: F841 - transformers reads it through a weakref
    model_config = LlamaConfig(**MODELS[run["model"]], attn_implementation="sdpa")
    adam_calls: list[float] = []
    original_step = DeepSpeedCPUAdam.step

    def timed_step(self, *args, **kwargs):
        begin = time.perf_counter()
        result = original_step(self, *args, **kwargs)
        adam_calls.append(time.perf_counter() - begin)
        return result

    DeepSpeedCPUAdam.step = timed_step
    if run.get("tiled"):
        tile_mlp(run["tiled"])
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_config(model_config, dtype=torch.bfloat16)
    built_s = time.perf_counter() - t0
    parameters = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel()
                     for p in model.parameters())
    zero_init = all(hasattr(p, "ds_id") for p in model.parameters())
    t0 = time.perf_counter()
    client = (None if offloads_optimizer(run)
              else torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0))
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           optimizer=client, config=config)
    init_s = time.perf_counter() - t0
    generator = torch.Generator().manual_seed(0)
    batch = torch.randint(0, model_config.vocab_size, (run["micro_batch"], run["seq"]),
                          generator=generator).to(device)
    rows = []
    for iteration in range(iterations):
        for micro in range(run["ga"]):
            row = {"iteration": iteration, "micro_batch": micro}
            for phase in ("forward", "backward", "step"):
                if not cpu:
                    torch.cuda.reset_peak_memory_stats()
                calls_before = len(adam_calls)
                sync()
                begin = time.perf_counter()
                if phase == "forward":
                    loss = engine(input_ids=batch, labels=batch).loss
                elif phase == "backward":
                    engine.backward(loss)
                else:
                    engine.step()
                sync()
                row[f"{phase}_s"] = time.perf_counter() - begin
                if phase == "step":
                    row["adam_calls_s"] = adam_calls[calls_before:]
                if not cpu:
                    row[f"{phase}_peak_allocated_B"] = torch.cuda.max_memory_allocated()
                    row[f"{phase}_reserved_B"] = torch.cuda.memory_reserved()
                row[f"{phase}_host_rss_B"] = host_rss_bytes()
            row["loss"] = float(loss.detach().float().item())
            row["skipped_steps"] = int(getattr(engine, "skipped_steps", -1))
            row["mem_available_B"] = mem_available_bytes()
            rows.append(row)
            print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v)
                              for k, v in row.items() if k != "adam_calls_s"}), flush=True)
    return {
        "run": name, **run, "model_config": MODELS[run["model"]], "ds_config": config,
        "parameters": parameters, "zero_init": zero_init, "iterations": rows, "build_s": built_s,
        "initialize_s": init_s, "total_s": time.perf_counter() - started,
        "versions": {"torch": torch.__version__, "deepspeed": deepspeed.__version__,
                     "transformers": transformers.__version__,
                     "python": platform.python_version(),
                     "cuda": None if cpu else torch.version.cuda},
        "gpu": None if cpu else torch.cuda.get_device_name(),
        "torch_threads": torch.get_num_threads(), "cpus": os.cpu_count(),
        "attention": "sdpa",
    }


def tile_mlp(shards: int) -> None:
    """LlamaMLP.forward through DeepSpeed's TiledMLP at `shards` shards, as Arctic Long
    Sequence Training's enable_tiled_mlp_compute patches it (there the shards are
    ceil(seqlen / hidden), agreed over the ranks by an all-reduce)."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP
    from transformers.models.llama import modeling_llama

    def mlp_forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

    def tiled_forward(self, x):
        compute_params = [self.down_proj.weight, self.gate_proj.weight, self.up_proj.weight]
        return TiledMLP.apply(mlp_forward, self, x, shards, compute_params)

    modeling_llama.LlamaMLP.forward = tiled_forward


def summary(record: dict) -> dict:
    """Medians over the iterations after the first."""
    later = [row for row in record["iterations"] if row["iteration"] > 0]
    out = {"run": record["run"], "parameters": record["parameters"]}
    for phase in ("forward", "backward", "step"):
        values = [row[f"{phase}_s"] for row in later if row["micro_batch"] == record["ga"] - 1]
        out[f"{phase}_median_s"] = statistics.median(values) if values else None
    adam = [sum(row["adam_calls_s"]) for row in later if row["adam_calls_s"]]
    out["adam_median_s"] = statistics.median(adam) if adam else None
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="tinyllama_opt")
    parser.add_argument("--out", required=True, help="JSONL file the records are appended to")
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--timeout-s", type=float, default=150.0, help="per run")
    parser.add_argument("--budget-s", type=float, default=1e9,
                        help="start no run once this much time has passed")
    parser.add_argument("--cpu", action="store_true", help="DeepSpeed's CPU accelerator")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        record = one_run(args.one, args.iterations, args.cpu)
        with open(args.out, "a") as out:
            out.write(json.dumps(record) + "\n")
        print("SUMMARY", json.dumps(summary(record)), flush=True)
        return 0
    started = time.perf_counter()
    failed = 0
    for index, name in enumerate(args.runs.split(",")):
        if time.perf_counter() - started > args.budget_s:
            print(f"skipped {name}: budget spent", flush=True)
            continue
        env = dict(os.environ, MASTER_PORT=str(29611 + index))
        if args.cpu:
            env["DS_ACCELERATOR"] = "cpu"
        command = [sys.executable, __file__, "--one", name, "--out", args.out,
                   "--iterations", str(args.iterations)] + (["--cpu"] if args.cpu else [])
        begin = time.perf_counter()
        try:
            code = subprocess.run(command, env=env, timeout=args.timeout_s).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
        print(f"run {name}: exit {code} after {time.perf_counter() - begin:.1f} s", flush=True)
        failed += code != 0
    return 3 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
