"""How fast the kernel hands a process fresh pages: what zerosim's profiles call
`cpu.page_zeroing_GBps` (per faulting thread).

A host temporary larger than the C allocator's mmap threshold gets pages no one has touched;
the first write to each faults, and the kernel zeroes the page before the write lands. zerosim
prices that as page zeroing, per thread that faults, and fits its rate on each testbed's
boundary flush (3.00 GB/s on the study's Sapphire Rapids node, 5.19 on Polaris's EPYC). This
probe measures the same thing directly: it fills a fresh 1 GiB tensor (`torch.empty`, so
glibc maps it anew) and then the same tensor again, warm, with one thread and with every
thread, and takes the faulting and zeroing alone as the difference. It counts the minor faults
of the fresh fill (`getrusage`) to say which page size the kernel used, and repeats the fill
on memory advised for transparent huge pages (`madvise(MADV_HUGEPAGE)` on an anonymous map),
where one fault zeroes 2 MiB. Each case runs in a fresh process.

    python3 page_fault_probe.py --out page_faults.json   # torch; half a minute
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

GIB = 1 << 30
ROUNDS = 6
"""Fills per case; the first is dropped (the allocator's and the kernel's warm-up)."""

CHILD = r"""
import json, mmap, resource, sys, time, torch
threads, huge = int(sys.argv[1]), sys.argv[2] == "huge"
size, rounds = int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def fresh():
    if not huge:
        return None, torch.empty(size, dtype=torch.uint8)
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(mmap.MADV_HUGEPAGE)
    return region, torch.frombuffer(region, dtype=torch.uint8)
out = []
for _ in range(rounds):
    region, t = fresh()
    before, start = faults(), time.perf_counter()
    t.fill_(1)
    middle = time.perf_counter()
    t.fill_(2)
    end = time.perf_counter()
    out.append({"fresh_s": middle - start, "warm_s": end - middle, "faults": faults() - before})
    del t
    if region is not None:
        region.close()
print(json.dumps(out))
"""


def case(threads: int, huge: bool, size: int) -> dict:
    result = subprocess.run([sys.executable, "-c", CHILD, str(threads),
                             "huge" if huge else "plain", str(size), str(ROUNDS)],
                            check=True, capture_output=True, text=True)
    fills = json.loads(result.stdout)[1:]
    fresh = min(f["fresh_s"] for f in fills)
    warm = min(f["warm_s"] for f in fills)
    faults = min(f["faults"] for f in fills)
    return {"threads": threads, "pages": "madvise(MADV_HUGEPAGE)" if huge else "default",
            "bytes": size, "fills": fills, "fresh_fill_GBps": size / fresh / 1e9,
            "warm_fill_GBps": size / warm / 1e9,
            "zeroing_GBps": size / (fresh - warm) / 1e9,
            "zeroing_GBps_per_thread": size / (fresh - warm) / 1e9 / threads,
            "bytes_per_fault": size / faults if faults else None}


def read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return "unreadable"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--gib", type=float, default=1.0, help="bytes of each fill, GiB")
    args = parser.parse_args()
    import torch

    size = int(args.gib * GIB)
    threads = sorted({1, os.cpu_count() or 1})
    runs = [case(t, huge, size) for huge in (False, True) for t in threads]
    record = {"versions": {"torch": torch.__version__, "python": platform.python_version()},
              "kernel": platform.release(), "cpu": platform.processor() or platform.machine(),
              "transparent_hugepage": read("/sys/kernel/mm/transparent_hugepage/enabled"),
              "runs": runs}
    Path(args.out).write_text(json.dumps(record, indent=1))
    for run in runs:
        per_fault = run["bytes_per_fault"]
        print(f"{run['pages']:>24} x{run['threads']}: fresh fill {run['fresh_fill_GBps']:.2f} "
              f"GB/s, warm {run['warm_fill_GBps']:.1f} GB/s, faulting and zeroing alone "
              f"{run['zeroing_GBps']:.2f} GB/s ({run['zeroing_GBps_per_thread']:.2f} a thread), "
              f"{per_fault / 1024 if per_fault else float('nan'):.0f} KiB a fault")


if __name__ == "__main__":
    main()
