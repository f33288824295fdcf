"""DeepSpeed's fp16 overflow check on the host, on any machine with torch: what zerosim's CPU
catalog calls `fp16_overflow_check.cycles_per_element`.

With the optimizer offloaded, DeepSpeed 0.13.3's ZeRO-3 step checks the gradients for inf and
nan over the host's 16-bit gradient buffer (stage3.py `has_overflow`:
`torch.isinf(buf).any()` and `torch.isnan(buf).any()`). PyTorch computes `isinf` as
`buf.abs() == inf` and `isnan` as `buf != buf`, each a pass over half-precision elements
into a fresh temporary, then `any()` over the booleans. This probe times the check whole, and
its parts, over a float16 tensor on the CPU with one thread and with every thread, beside a
fp32 -> fp16 cast and an in-place fp32 multiply (zerosim's elementwise kernels) on the same
elements, and reads the core clock as hf_trainer_probe.py reads it.

    python3 overflow_check_probe.py --out overflow_check_devbox.json   # torch; a minute
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def best_of(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def measure(elements: int, threads: int, repeats: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    half = torch.randn(elements).to(torch.float16)
    single = torch.randn(elements)
    out = torch.empty(elements, dtype=torch.float16)
    check = best_of(lambda: (torch.isinf(half).any(), torch.isnan(half).any()), repeats)
    parts = {
        "abs": best_of(lambda: half.abs(), repeats),
        "isinf_any": best_of(lambda: torch.isinf(half).any(), repeats),
        "isnan_any": best_of(lambda: torch.isnan(half).any(), repeats),
    }
    cast = best_of(lambda: out.copy_(single), repeats)
    scale = best_of(lambda: single.mul_(1.0), repeats)
    return {"threads": threads, "check_s": check, "parts_s": parts,
            "check_elements_per_s_per_thread": elements / check / threads,
            "cast_fp32_to_fp16_s": cast, "mul_fp32_s": scale,
            "cast_GBps_per_thread": 6 * elements / cast / 1e9 / threads,
            "mul_GBps_per_thread": 8 * elements / scale / 1e9 / threads}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--elements", type=int, default=64 * 2**20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    import torch

    sys.path.insert(0, str(HERE))
    from hf_trainer_probe import core_clock_GHz

    counts = sorted({1, torch.get_num_threads()})
    runs = [measure(args.elements, n, args.repeats) for n in counts]
    clock = core_clock_GHz()
    one = runs[0]
    result = {
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "cpu": platform.processor() or platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "core_clock_GHz": clock, "elements": args.elements, "runs": runs,
        "cycles_per_element_one_thread": (clock * 1e9 / one["check_elements_per_s_per_thread"]
                                          if clock else None),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({k: result[k] for k in ("core_clock_GHz", "cpu_capability",
                                             "cycles_per_element_one_thread")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
