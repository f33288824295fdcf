"""Which host temporaries get fresh pages: what zerosim's stacks call
`allocator.heap_reuse_MiB`.

DeepSpeed 0.13.3's boundary flush copies each gradient partition into the fp32 host buffer with
a cross-dtype `copy_`, which PyTorch does through a 16-bit CPU temporary: allocated, written
by the D2H copy, cast, freed, one per tensor, in the backward's hook thread (the autograd
engine's device thread, not the main one). Whether that temporary gets pages the kernel must
zero on first touch or pages the C allocator kept from the previous one is what zerosim prices
as page zeroing. This probe replays such sequences of sizes with torch on the CPU, each in a
fresh process, in the main thread and in a worker thread, and counts the minor page faults of
each allocation and first write (`getrusage`), as a fraction of its 4 KiB pages: 1 is fresh
pages, 0 reused ones. Transparent huge pages must not be `always` for the count to mean that
(PyTorch does not madvise its CPU tensors).

    python3 heap_reuse_probe.py --out heap_reuse.json   # torch; a minute
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path

PAGE = 4096
ROUNDS = 8
STEADY_FROM = 2
"""Rounds before this one are the allocator's warm-up (its mmap threshold rises as it goes)."""
PATTERNS = {
    "llama2-13b DP=1 (MLP 141 MB, attention 52 MB)": [141.6, 141.6, 141.6, 52.4, 52.4, 52.4, 52.4],
    "llama2-13b DP=2 (70.8 and 26.2 MB)": [70.8, 70.8, 70.8, 26.2, 26.2, 26.2, 26.2],
    "llama2-13b DP=4 (35.4 and 13.1 MB)": [35.4, 35.4, 35.4, 13.1, 13.1, 13.1, 13.1],
    "31 MB alone": [31.0] * 7,
    "35 MB alone": [35.0] * 7,
}

CHILD = r"""
import json, resource, sys, threading, torch
torch.set_num_threads(1)
sizes, where, rounds = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
out = []
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def replay():
    for r in range(rounds):
        for mb in sizes:
            before = faults()
            t = torch.empty(int(mb * 1e6 / 2), dtype=torch.float16)
            t.fill_(1.0)
            del t
            out.append([r, mb, (faults() - before) / (mb * 1e6 / 4096)])
if where == "main":
    replay()
else:
    worker = threading.Thread(target=replay)
    worker.start()
    worker.join()
print(json.dumps(out))
"""


def replay(sizes: list[float], where: str) -> list[list[float]]:
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(sizes), where, str(ROUNDS)],
                          check=True, capture_output=True, text=True)
    return json.loads(done.stdout)


def fresh_by_size(rows: list[list[float]]) -> dict[str, float]:
    """Per size, the mean fresh-page fraction of the steady rounds."""
    by: dict[float, list[float]] = {}
    for r, mb, fresh in rows:
        if r >= STEADY_FROM:
            by.setdefault(mb, []).append(fresh)
    return {f"{mb} MB": round(sum(v) / len(v), 3) for mb, v in by.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    import torch

    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    libc = subprocess.run(["ldd", "--version"], capture_output=True, text=True).stdout
    result = {"versions": {"torch": torch.__version__, "python": platform.python_version(),
                           "libc": libc.splitlines()[0] if libc else "unknown"},
              "transparent_hugepage": thp.read_text().strip() if thp.exists() else "unknown",
              "rounds": ROUNDS, "steady_from_round": STEADY_FROM, "patterns": []}
    for label, sizes in PATTERNS.items():
        for where in ("main", "thread"):
            rows = replay(sizes, where)
            entry = {"pattern": label, "thread": where, "fresh_by_size": fresh_by_size(rows),
                     "rows": rows}
            result["patterns"].append(entry)
            print(f"{label:48} {where:6} {entry['fresh_by_size']}")
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
