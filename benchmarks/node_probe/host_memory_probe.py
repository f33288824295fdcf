"""How pinned and pageable host tensors show in a node's used memory (MemTotal - MemAvailable,
what psutil's `total - available` counts). Run: `python host_memory_probe.py OUT.json`
(torch with CUDA; about 30 s). Standalone: nothing from zerosim."""

import gc
import json
import sys
import time

import torch

GB = 1e9
FIELDS = ("MemFree", "Cached", "Shmem", "AnonPages", "Mlocked", "Unevictable", "Buffers")


def meminfo() -> dict[str, int]:
    with open("/proc/meminfo") as f:
        return {k: int(v.split()[0]) * 1024 for k, v in (line.split(":") for line in f)}


def used(m: dict[str, int]) -> int:
    return m["MemTotal"] - m["MemAvailable"]


def step(results: list, label: str, action):
    """Run `action`, then record how used memory and its parts moved."""
    gc.collect()
    time.sleep(0.3)
    before = meminfo()
    out = action()
    gc.collect()
    time.sleep(0.5)
    after = meminfo()
    row = {"step": label, "d_used_GB": (used(after) - used(before)) / GB}
    row.update({f"d_{k}_GB": round((after[k] - before[k]) / GB, 3) for k in FIELDS if k in before})
    results.append(row)
    print(row, flush=True)
    return out


def main(out_path: str) -> None:
    torch.empty(1, device="cuda")
    n = int(4e9 // 4)
    results: list = []
    keep = {}
    keep["a"] = step(results, "torch.zeros 4e9 B fp32 (pageable, touched)", lambda: torch.zeros(n))
    keep["b"] = step(results, "a.pin_memory() (4e9 B; the caching host allocator rounds to 2^32)",
                     lambda: keep["a"].pin_memory())
    step(results, "del a (the pageable original)", lambda: keep.pop("a"))
    keep["c"] = step(results, "torch.empty(4e9 B, pin_memory=True), untouched",
                     lambda: torch.empty(n, pin_memory=True))
    keep["d"] = step(results, "torch.zeros_like(pinned b) (pageable)",
                     lambda: torch.zeros_like(keep["b"]))
    keep["e"] = step(results, "3e9 B pinned via pin_memory of zeros (rounds to 2^32)",
                     lambda: torch.zeros(int(3e9 // 4)).pin_memory())
    step(results, "del b, c, e (pinned blocks go back to the cache, not the OS)",
         lambda: [keep.pop(k) for k in ("b", "c", "e")])
    step(results, "torch._C._host_emptyCache(): the caching host allocator lets them go",
         lambda: torch._C._host_emptyCache() if hasattr(torch._C, "_host_emptyCache") else None)
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
