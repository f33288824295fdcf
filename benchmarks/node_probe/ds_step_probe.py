"""DeepSpeed ZeRO-3's host work per parameter tensor in an optimizer step, on the CPU: what
zerosim's stacks call `host.step_per_tensor_us` and `host.regather_per_tensor_us`.

DeepSpeed's CPU accelerator (`DS_ACCELERATOR=cpu`, gloo) trains transformers' LlamaForCausalLM
with TinyLlama's module structure at toy widths (hidden 64) and 2, 22 and 44 layers (21, 201
and 399 parameter tensors, of which 5, 45 and 89 norms, which persist: the persistence
threshold is scaled with the widths to 100 elements) under ZeRO-3 with nothing offloaded and a
client torch.optim.AdamW, otherwise the ds_config of ds_offload_probe.py. Each part of
`DeepSpeedZeroOptimizer_Stage3.step` is timed (wrapped on the optimizer object); their growth
with the tensor count is the host's work per tensor, as the arithmetic on toy widths is next
to nothing: `_partition_all_parameters` (releasing every parameter the forward and backward
left gathered), `_prepare_sub_group` (the flat fp32 gradient: per tensor `record_stream`,
`zero_grad`'s loop), `_reassign_or_swap_out_partitioned_parameters` (unflattening the updated
partition), and `_post_step`, whose growth is per persistent tensor (re-gathering them).
`_get_norm_groups` and the optimizer's own step are timed too (zerosim prices their kernels
and launches apart). On a GPU the same Python runs, plus CUDA's `record_stream` in each
release, which the CPU accelerator skips. The core clock is read as hf_trainer_probe.py reads
it.

    python3 ds_step_probe.py --out ds_step_devbox.json   # torch, transformers, deepspeed;
                                                         # about a minute
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LAYERS = (2, 22, 44)
PERSISTENCE_THRESHOLD = 100
"""Elements: the toy's norms (64) persist, its matrices (1,024 and more) do not."""
PARTS = ("_partition_all_parameters", "_get_norm_groups", "_prepare_sub_group",
         "unscale_and_clip_grads", "_optimizer_step",
         "_reassign_or_swap_out_partitioned_parameters", "_post_step")
PER_TENSOR = ("_partition_all_parameters", "_prepare_sub_group",
              "_reassign_or_swap_out_partitioned_parameters")


def single_rank() -> None:
    """The environment of a one-rank job, where a launcher has not set it."""
    for key, value in {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "LOCAL_RANK": "0",
                       "WORLD_SIZE": "1"}.items():
        os.environ.setdefault(key, value)


def tiny_llama_engine(layers: int, stage: int = 3):
    """transformers' LlamaForCausalLM with TinyLlama's module structure at toy widths and
    `layers` layers under DeepSpeed ZeRO-3 (ds_offload_probe's `tinyshape_cpu_hooks` config,
    the persistence threshold scaled with the widths so that only the norms persist, as in
    TinyLlama at 1e5), with a client torch.optim.AdamW. Returns the engine, the vocabulary
    size and the HfDeepSpeedConfig, which transformers reads by weakref: keep it. A `stage`
    below 3 replicates the parameters."""
    sys.path.insert(0, str(HERE))
    import deepspeed
    import ds_offload_probe as probe
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig
    from transformers.integrations import HfDeepSpeedConfig

    config = probe.ds_config(probe.RUNS["tinyshape_cpu_hooks"])
    config["zero_optimization"]["stage3_param_persistence_threshold"] = PERSISTENCE_THRESHOLD
    if stage != 3:
        config["zero_optimization"] = {"stage": stage}
    deepspeed.init_distributed(dist_backend="gloo")
    keep_alive = HfDeepSpeedConfig(config)
    shape = {**probe.MODELS["tinyllama-shape"], "num_hidden_layers": layers}
    model = AutoModelForCausalLM.from_config(LlamaConfig(**shape, attn_implementation="sdpa"),
                                             dtype=torch.bfloat16)
    client = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           optimizer=client, config=config)
    return engine, shape["vocab_size"], keep_alive


def one(layers: int, steps: int, skip: int) -> dict:
    """Train `layers` layers for `steps` steps in this process; the medians after `skip`."""
    single_rank()
    import torch

    engine, vocab_size, _keep_alive = tiny_llama_engine(layers)
    model = engine.module
    timed: dict[str, list[float]] = {part: [] for part in PARTS}
    optimizer = engine.optimizer
    for part in PARTS:
        function = getattr(optimizer, part)

        def wrapper(*args, _function=function, _part=part, **kwargs):
            begin = time.perf_counter()
            try:
                return _function(*args, **kwargs)
            finally:
                timed[_part].append(time.perf_counter() - begin)

        setattr(optimizer, part, wrapper)
    batch = torch.randint(0, vocab_size, (1, 16))
    step_s = []
    for step in range(steps):
        if step == skip:
            for values in timed.values():
                values.clear()
        loss = engine(input_ids=batch, labels=batch).loss
        engine.backward(loss)
        begin = time.perf_counter()
        engine.step()
        step_s.append(time.perf_counter() - begin)
    timed_steps = steps - skip
    tensors = list(model.parameters())
    return {"layers": layers, "tensors": len(tensors),
            "persistent_tensors": sum(1 for p in tensors if getattr(p, "ds_persist", False)),
            "step_s": statistics.median(step_s[skip:]),
            "parts_s": {part: sum(values) / timed_steps for part, values in timed.items()}}


def slope(runs: list[dict], field: str, value) -> float:
    """Least-squares growth of `value(run)` per unit of `run[field]` over the runs."""
    xs = [run[field] for run in runs]
    ys = [value(run) for run in runs]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return (sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
            / sum((x - mx) ** 2 for x in xs))


def each_in_a_process(script: str, layers: tuple[int, ...], arguments: list[str], port: int
                      ) -> list[dict]:
    """`script --one L arguments` for each L of `layers`, each in a fresh process on
    DeepSpeed's CPU accelerator (one OpenMP thread); the JSON each prints last."""
    runs = []
    for index, count in enumerate(layers):
        env = dict(os.environ, DS_ACCELERATOR="cpu", MASTER_PORT=str(port + index),
                   OMP_NUM_THREADS="1")
        done = subprocess.run([sys.executable, script, *arguments, "--one", str(count)],
                              env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.stderr.write(done.stderr[-4000:])
            raise SystemExit(done.returncode)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--skip", type=int, default=5)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one(args.one, args.steps, args.skip)))
        return 0
    runs = each_in_a_process(__file__, LAYERS, ["--out", args.out, "--steps", str(args.steps),
                                                "--skip", str(args.skip)], port=29811)
    sys.path.insert(0, str(HERE))
    from hf_trainer_probe import core_clock_GHz

    per_tensor = slope(runs, "tensors",
                       lambda run: sum(run["parts_s"][part] for part in PER_TENSOR))
    per_persistent = slope(runs, "persistent_tensors", lambda run: run["parts_s"]["_post_step"])
    import deepspeed
    import torch
    import transformers

    result = {"versions": {"torch": torch.__version__, "deepspeed": deepspeed.__version__,
                           "transformers": transformers.__version__},
              "core_clock_GHz": core_clock_GHz(), "runs": runs,
              "step_per_tensor_s": per_tensor, "regather_per_tensor_s": per_persistent,
              "parts_per_tensor_s": {part: slope(runs, "tensors",
                                                 lambda run, p=part: run["parts_s"][p])
                                     for part in PARTS}}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("core_clock_GHz", "step_per_tensor_s",
                                             "regather_per_tensor_s")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
