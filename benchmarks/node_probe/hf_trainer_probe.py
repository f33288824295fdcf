"""How long the Hugging Face Trainer's own loop takes per micro-batch and per optimizer step,
outside the model's forward, its backward and the optimizer's step: what zerosim's
hf-transformers stack calls `host.micro_batch_ms` and `host.step_ms`.

transformers' `Trainer` trains a tiny LlamaForCausalLM from a config on the CPU (no GPU needed:
the loop's work is Python on the host), once at gradient accumulation 1 and once at 4. Each
optimizer step's period (from one `on_step_end` to the next) is split into what the loop times
itself does not own, the model's forward (the module's `forward`), the backward
(`accelerator.backward`) and the optimizer's step (`on_pre_optimizer_step` to
`on_optimizer_step`), and the rest, the loop's own work: fetching and collating the batches
(`dataloader_num_workers` 0, the default: in the training process), moving them to the
device, the loss bookkeeping, the scheduler, `zero_grad`, the callbacks. Gradient clipping is
off (`max_grad_norm` 0): under DeepSpeed the engine clips inside its own timed step. A least
squares line through the rest at both accumulations gives the time per micro-batch and per
step. The core clock is read the way cpu_adam_probe.cpp reads it (a chain of dependent
multiplies, compiled with the system's C compiler when there is one), so the figures can be
quoted at the stack's reference clock.

    python3 hf_trainer_probe.py --out hf_trainer_devbox.json   # about a minute; torch,
                                                               # transformers, accelerate
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLOCK_C = r"""
#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
                          return t.tv_sec + 1e-9 * t.tv_nsec; }
int main(void) {
    unsigned long x = 3; long n = 50000000; double t0 = now();
    for (long i = 0; i < n; ++i)
        __asm__ volatile("imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0\n\t"
                         "imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0\n\t"
                         : "+r"(x));
    printf("%.3f\n", 24.0 * n / (now() - t0) / 1e9);   /* 8 multiplies of 3 cycles */
    return (int)(x & 0);
}
"""


def core_clock_GHz() -> float | None:
    """The core's clock from a chain of dependent 64-bit multiplies (3 cycles each), or None
    without a C compiler or on a CPU that is not x86."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None or platform.machine() not in ("x86_64", "AMD64"):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        source, binary = Path(tmp, "clock.c"), Path(tmp, "clock")
        source.write_text(CLOCK_C)
        subprocess.run([compiler, "-O2", str(source), "-o", str(binary)], check=True)
        runs = [float(subprocess.run([str(binary)], capture_output=True, text=True,
                                     check=True).stdout) for _ in range(3)]
    return max(runs)


def timed(record: list[float], function):
    """`function`, its calls' durations appended to `record` (its signature kept: the Trainer
    reads the forward's to choose the batch's columns)."""
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            record.append(time.perf_counter() - start)
    return wrapper


def run(accumulation: int, steps: int, skip: int, seq: int) -> dict:
    """One Trainer run: per optimizer step after the first `skip`, its period and the times
    inside it the loop does not own."""
    import torch
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, vocab_size=1000,
                         max_position_embeddings=seq)
    model = LlamaForCausalLM(config)
    tokens = torch.randint(0, 1000, (steps * accumulation, seq))
    data = [{"input_ids": row, "labels": row} for row in tokens]
    forward, backward, optimizer, ends = [], [], [], []

    class Clock(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_optimizer_step(self, args, state, control, **kwargs):
            optimizer.append(time.perf_counter() - self.started)

        def on_step_end(self, args, state, control, **kwargs):
            ends.append((time.perf_counter(), len(forward), len(backward), len(optimizer)))

    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=1,
                                 gradient_accumulation_steps=accumulation, max_steps=steps,
                                 logging_steps=10**9, save_strategy="no", report_to="none",
                                 use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
                                 max_grad_norm=0.0, learning_rate=1e-4)
        trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[Clock()])
        model.forward = timed(forward, model.forward)
        trainer.accelerator.backward = timed(backward, trainer.accelerator.backward)
        trainer.train()
    rest, periods = [], []
    for (t0, f0, b0, o0), (t1, f1, b1, o1) in itertools.pairwise(ends[skip:]):
        inside = sum(forward[f0:f1]) + sum(backward[b0:b1]) + sum(optimizer[o0:o1])
        periods.append(t1 - t0)
        rest.append(t1 - t0 - inside)
    return {"gradient_accumulation": accumulation, "steps_timed": len(rest),
            "period_s": statistics.median(periods), "rest_s": statistics.median(rest),
            "rest_samples_s": [round(r, 6) for r in rest],
            "forward_s": statistics.median(forward), "backward_s": statistics.median(backward),
            "optimizer_step_s": statistics.median(optimizer)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--skip", type=int, default=20, help="first steps left out")
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args()
    import torch
    import transformers

    torch.set_num_threads(1)
    runs = [run(accumulation, args.steps, args.skip, args.seq) for accumulation in (1, 4)]
    (a1, r1), (a4, r4) = ((r["gradient_accumulation"], r["rest_s"]) for r in runs)
    per_micro_batch = (r4 - r1) / (a4 - a1)
    result = {
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                     "transformers": transformers.__version__},
        "cpu": platform.processor() or platform.machine(), "core_clock_GHz": core_clock_GHz(),
        "runs": runs,
        "micro_batch_s": per_micro_batch, "step_s": r1 - per_micro_batch,
        "created_unix_s": time.time(), "pid": os.getpid(),
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("core_clock_GHz", "micro_batch_s", "step_s")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
