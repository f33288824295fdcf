"""How long the host spends launching one collective: what zerosim's stacks call
`host.collective_launch_us`.

zerosim charges every collective a rank launches the stack's `collective_launch_us` of host
time. On the Polaris runs that value (529 us, fitted with the hook time and not identified
apart from it) covers DeepSpeed's bookkeeping around its coalesced all-gathers and
reduce-scatters as well as the launch itself, and zerosim charges it for each of qwZ's scale
all-gathers and qgZ's four `all_to_all_single` calls a weight matrix too, where the bookkeeping
is lighter. Whether qgZ helps beside hpZ turns on that cost (README, ZeRO++). This probe times,
on the host, calls issued back to back without waiting for the GPU:

- `torch.distributed`: `all_to_all_single`, `all_gather_into_tensor`, `reduce_scatter_tensor`;
- with DeepSpeed importable: `deepspeed.comm.all_to_all_single` (what qgZ calls) and
  `reduce_scatter_coalesced` of one and of eight tensors (what ZeRO-3's bucket reduction
  calls), with `deepspeed.comm` initialised on the same backend;

each at 4 KiB, 1 MiB and 64 MiB a rank (bf16), `--calls` calls after a warm-up, and reports
the host's microseconds per call (`host_us`) and, after a synchronize, the wall time per call
(`wall_us`: where the GPU is slower than the host, the collective's own time). NCCL on a GPU
is what it is for; without CUDA it runs on gloo, which does the work on the host, as a check
of the script only.

    python3 collective_host_probe.py --out collective_host.json              # one rank
    torchrun --nproc_per_node 2 collective_host_probe.py --out two.json     # two GPUs
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from typing import Any

SIZES_BYTES = (4 * 1024, 1024 * 1024, 64 * 1024 * 1024)
WARMUP = 5


def _tensors(torch: Any, device: str, nbytes: int, world: int) -> tuple[Any, Any, Any]:
    """A rank's input, an output of the same size, and one world times larger (bf16)."""
    numel = max(world, nbytes // 2 // world * world)
    same = torch.ones(numel, dtype=torch.bfloat16, device=device)
    return same, torch.empty_like(same), torch.empty(numel * world, dtype=torch.bfloat16,
                                                     device=device)


def _time(torch: Any, cuda: bool, call, calls: int) -> dict[str, float]:
    for _ in range(WARMUP):
        call()
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    issued = time.perf_counter()
    if cuda:
        torch.cuda.synchronize()
    done = time.perf_counter()
    return {"host_us": (issued - start) / calls * 1e6, "wall_us": (done - start) / calls * 1e6}


def _calls(torch: Any, dist: Any, device: str, nbytes: int, world: int) -> dict[str, Any]:
    """The probed calls at one size, by name."""
    inp, out, big = _tensors(torch, device, nbytes, world)
    small = big.narrow(0, 0, inp.numel() // world)
    calls = {
        "torch all_to_all_single": lambda: dist.all_to_all_single(out, inp),
        "torch all_gather_into_tensor": lambda: dist.all_gather_into_tensor(big, inp),
        "torch reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(small, inp),
    }
    try:
        import deepspeed.comm as ds_comm
        from deepspeed.runtime.comm.coalesced_collectives import reduce_scatter_coalesced
    except ImportError:
        return calls
    pieces = list(inp.chunk(8))
    calls.update({
        "deepspeed all_to_all_single": lambda: ds_comm.all_to_all_single(out, inp),
        "deepspeed reduce_scatter_coalesced, 1 tensor": lambda: reduce_scatter_coalesced([inp]),
        "deepspeed reduce_scatter_coalesced, 8 tensors": lambda: reduce_scatter_coalesced(pieces),
    })
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(device)
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend)
    try:
        import deepspeed

        deepspeed.init_distributed(dist_backend=backend)
        versions = {"deepspeed": deepspeed.__version__}
    except ImportError:
        versions = {}
    results: list[dict[str, Any]] = []
    for nbytes in SIZES_BYTES:
        for name, call in _calls(torch, dist, device, nbytes, world).items():
            row: dict[str, Any] = {"call": name, "bytes_per_rank": nbytes}
            try:
                row.update(_time(torch, cuda, call, args.calls))
            except Exception as error:  # a backend without the call (gloo): recorded, go on
                row["error"] = f"{type(error).__name__}: {error}"
            results.append(row)
            if rank == 0:
                timed = (f"host {row['host_us']:9.1f} us  wall {row['wall_us']:9.1f} us"
                         if "host_us" in row else row["error"][:60])
                print(f"{name:48} {nbytes:>10} B  {timed}", flush=True)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"backend": backend, "world": world, "calls": args.calls,
                       "torch": torch.__version__, **versions,
                       "gpu": torch.cuda.get_device_name() if cuda else None,
                       "cpu": platform.processor() or platform.machine(),
                       "results": results}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
