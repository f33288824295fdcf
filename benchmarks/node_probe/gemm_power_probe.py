"""Does a long run of GEMMs slow down? Times a few bf16 products cold (after 3 s idle), over
10 and over 200 calls back to back, and 10 again right after, on random and on zero operands,
with wall-clock stamps to align with a clock and power log taken beside it:

    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,\\
        clocks_event_reasons.active --format=csv -lms 50 > clocks.csv &
    python3 gemm_power_probe.py gemm_power.jsonl

Needs torch with CUDA; about 30 s. One JSON object a shape and operand kind, TFLOP/s each."""

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_node import seconds_per_call

SHAPES = ((8192, 27648, 5120), (8192, 5120, 5120), (2048, 3072, 3072), (8192, 8192, 8192))
"""(m, n, k): a 5120-wide Llama's fused gate/up and its output projection at 8192 tokens, a
small projection, and the usual square."""


def main(path):
    with open(path, "w") as out:
        for data in ("randn", "zeros"):
            make = torch.randn if data == "randn" else torch.zeros
            for m, n, k in SHAPES:
                a = make(m, k, device="cuda", dtype=torch.bfloat16)
                b = make(n, k, device="cuda", dtype=torch.bfloat16)
                flops = 2 * m * n * k
                torch.cuda.synchronize()
                time.sleep(3)
                row = {"data": data, "m": m, "n": n, "k": k, "t_wall_start": time.time()}
                for key, calls in (("TFLOPS_1", 1), ("TFLOPS_10", 10), ("TFLOPS_200", 200),
                                   ("TFLOPS_10_after_200", 10)):
                    row[key] = flops / seconds_per_call(lambda a=a, b=b: a @ b.t(), calls) / 1e12
                row["t_wall_end"] = time.time()
                print(json.dumps(row), flush=True)
                out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
