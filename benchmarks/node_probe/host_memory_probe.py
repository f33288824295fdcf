"""How pinned and pageable host tensors show in a node's 'used' memory (MemTotal - MemAvailable)."""
import gc, json, sys, time
import torch

def used():
    m = {}
    for line in open("/proc/meminfo"):
        k, v = line.split(":")
        m[k] = int(v.split()[0]) * 1024
    return m["MemTotal"] - m["MemAvailable"], m

GB = 1e9
res = []
def step(label, fn):
    gc.collect(); time.sleep(0.3)
    u0, m0 = used()
    out = fn()
    gc.collect(); time.sleep(0.5)
    u1, m1 = used()
    d = {k: (m1[k] - m0[k]) / GB for k in ("MemFree", "Cached", "Shmem", "AnonPages", "Mlocked", "Unevictable", "Buffers") if k in m0}
    res.append({"step": label, "d_used_GB": (u1 - u0) / GB, **{f"d_{k}_GB": round(v, 3) for k, v in d.items()}})
    print(res[-1], flush=True)
    return out

torch.empty(1, device="cuda")
n = int(4e9 // 4)  # 4e9 bytes of fp32
keep = {}
keep["a"] = step("torch.zeros 4e9 B fp32 (pageable, touched)", lambda: torch.zeros(n))
keep["b"] = step("a.pin_memory() (4e9 B; caching host allocator rounds to 2^32)", lambda: keep["a"].pin_memory())
step("del a (the pageable original)", lambda: keep.pop("a"))
keep["c"] = step("torch.empty(4e9 B, pin_memory=True), untouched", lambda: torch.empty(n, pin_memory=True))
keep["d"] = step("torch.zeros_like(pinned b) (pageable)", lambda: torch.zeros_like(keep["b"]))
keep["e"] = step("3e9 B pinned via pin_memory of zeros (rounds to 2^32)", lambda: torch.zeros(int(3e9 // 4)).pin_memory())
step("del b, c, e (pinned blocks go back to the cache, not the OS)", lambda: [keep.pop(k) for k in ("b", "c", "e")])
step("torch.cuda.empty_cache() does not free pinned; CachingHostAllocator emptyCache", lambda: torch._C._host_emptyCache() if hasattr(torch._C, "_host_emptyCache") else None)
json.dump(res, open(sys.argv[1], "w"), indent=1)
