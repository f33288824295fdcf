#!/usr/bin/env python3
"""Node probe for zerosim's hardware model (DeepSpeed ZeRO with CPU-offloaded optimizer).

Measures, on one Linux box with a CUDA GPU (needs only torch, numpy and the stdlib):

  a. PCIe H2D / D2H bandwidth with pinned and pageable host buffers (16 MiB, 256 MiB,
     1 GiB), and pinned H2D + D2H concurrently on two streams (full-duplex check).
  b. The cross-device, cross-dtype copies DeepSpeed 0.13.x performs for the offloaded
     optimizer (gradient flush fp16 GPU -> fp32 host, copy-back fp32 host -> fp16 GPU),
     plus their components (pageable D2H, CPU casts).
  c. Host memory bandwidth (copy, triad, read) single-threaded and with all threads.
  d. CPU throughput of the optimizer-step kernels (fp32<->fp16 casts, unscale mul_,
     Adam step via torch's fused CPU Adam) vs number of torch threads.
  e. Contention: pinned DMA bandwidth alone vs while the CPU runs those kernels on all
     threads, and the CPU kernels' rate alone vs during DMA.
  f. cudaMalloc: a device block taken fresh right after torch.cuda.empty_cache() against the
     same block from the cache (host wall time per byte: zerosim's gpu.cuda_malloc_GBps).
  g. One Megatron-style Llama block's forward (no DeepSpeed) at micro-batch 1 and 4 for the
     Polaris runs' three widths: per-layer GPU time, host issue time, each GEMM alone, and the
     part that does not grow with the batch, per parameter.
  h. Eager attention's batched GEMMs (Q K^T of a short K, P V) alone, and the host wait of a
     Python scalar made on the GPU behind queued work.
  i. A block stack's forward right after the GPU idled 0.5-8 s (host asleep or busy) against
     the same forward back to back: what a step's first forward costs more than the others.
  j. Section g's memory-bound ops one at a time (the fp32 RMSNorm chain, K/V expand, masked
     fill, softmax, context copy, SwiGLU, residual) against a contiguous copy, in GB/s.

Usage:
  python3 probe_node.py [--quick] [--out FILE.json] [--sections abcdefghij]

Every figure is written to the JSON with value, unit, method (sizes, repetitions,
statistic) and the raw samples. Units: GB = 1e9 bytes, GiB/MiB = 2**30 / 2**20 bytes.
Each measurement is guarded: an exception is recorded in the JSON ("errors") and the
probe continues. Exit status is 0 when no measurement failed, 3 otherwise.
"""

# The lambdas handed to the timers inside loops are called before the loop variable
# changes (time_wall/time_events return before the next iteration), so B023 does not apply.
# ruff: noqa: B023

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import traceback

import numpy as np
import torch

MiB = 1 << 20
GiB = 1 << 30
Mi = 1 << 20  # "Mi elements"

SCHEMA = "zerosim.node_probe/1"


# ----------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------


def _fmt_size(nbytes: int) -> str:
    if nbytes >= GiB and nbytes % GiB == 0:
        return f"{nbytes // GiB}GiB"
    if nbytes >= MiB and nbytes % MiB == 0:
        return f"{nbytes // MiB}MiB"
    return f"{nbytes}B"


def _fmt_elems(n: int) -> str:
    return f"{n // Mi}Mi" if n % Mi == 0 else str(n)


def _stats(xs):
    xs = list(xs)
    return {
        "median": statistics.median(xs),
        "min": min(xs),
        "max": max(xs),
        "n": len(xs),
    }


def _sync():
    torch.cuda.synchronize()


def time_wall(fn, reps: int, warmup: int = 1, cuda_sync: bool = True):
    """Wall-clock seconds per call, synchronizing the device before and after."""
    for _ in range(warmup):
        fn()
        if cuda_sync:
            _sync()
    ts = []
    for _ in range(reps):
        if cuda_sync:
            _sync()
        t0 = time.perf_counter()
        fn()
        if cuda_sync:
            _sync()
        ts.append(time.perf_counter() - t0)
    return ts


def time_events(fn, reps: int, warmup: int = 1, stream=None, calls: int = 1):
    """Device seconds per call, CUDA events recorded around fn on `stream`. With `calls` > 1,
    one untimed call first keeps the GPU busy while the host queues the start event and
    `calls` more, so the time is the kernels' alone: one call between events on an idle GPU
    also holds the host launching it (the start event fires at once, the kernel only once
    PyTorch has dispatched it; about 17 us a matmul on the 2026-11-28 H100 VM)."""
    stream = stream or torch.cuda.current_stream()
    ts = []
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
        stream.synchronize()
        for _ in range(reps):
            s = torch.cuda.Event(enable_timing=True)
            e = torch.cuda.Event(enable_timing=True)
            if calls > 1:
                fn()
            s.record(stream)
            for _ in range(calls):
                fn()
            e.record(stream)
            e.synchronize()
            ts.append(s.elapsed_time(e) / 1e3 / calls)
    return ts


def seconds_per_call(fn, calls: int, lead: int = 1, settle: bool = False) -> float:
    """CUDA-event seconds per call over `calls` calls queued behind `lead` untimed ones, which
    keep the GPU busy while the host queues the timed ones (`settle`: wait for them first, so
    the first timed call's launch is in the time)."""
    for _ in range(lead):
        fn()
    if settle:
        _sync()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / calls


def run_recorded(out: dict, path, part) -> None:
    """`part(out)`, a failure recorded under `out["errors"]` and printed, then `out` written to
    `path` as JSON either way: a run that breaks keeps what it measured."""
    try:
        part(out)
    except Exception:
        out.setdefault("errors", []).append(traceback.format_exc())
        print(out["errors"][-1], flush=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


BACK_TO_BACK = 10
"""Calls per timing of one GEMM (sections g and h): `time_events(..., calls=BACK_TO_BACK)`."""


def _host_empty_cache():
    gc.collect()
    with contextlib.suppress(Exception):
        torch.cuda.empty_cache()
    fn = getattr(torch._C, "_host_emptyCache", None)
    if fn is not None:
        with contextlib.suppress(Exception):
            fn()


def _read(path, default=None):
    try:
        with open(path) as f:
            return f.read()
    except Exception:
        return default


def _run(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as e:
        return f"unavailable: {e!r}"


def _meminfo():
    out = {}
    txt = _read("/proc/meminfo", "")
    for line in txt.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].rstrip(":") in (
            "MemTotal",
            "MemFree",
            "MemAvailable",
            "HugePages_Total",
            "Hugepagesize",
        ):
            out[parts[0].rstrip(":")] = " ".join(parts[1:])
    return out


def machine_facts():
    f = {}
    f["hostname"] = platform.node()
    f["kernel"] = platform.release()
    f["python"] = sys.version.split()[0]
    f["torch"] = torch.__version__
    f["torch_cuda"] = torch.version.cuda
    f["numpy"] = np.__version__
    try:
        f["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    except Exception as e:
        f["torch_cpu_capability"] = f"unavailable: {e!r}"
    f["torch_default_threads"] = torch.get_num_threads()
    f["torch_interop_threads"] = torch.get_num_interop_threads()
    f["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS")
    with contextlib.suppress(Exception):
        f["torch_parallel_info"] = torch.__config__.parallel_info()
    # GPU
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        f["gpu_name_torch"] = p.name
        f["gpu_total_memory_bytes_torch"] = p.total_memory
        f["gpu_sm_count"] = p.multi_processor_count
        f["gpu_capability"] = f"{p.major}.{p.minor}"
    smi = _run(
        [
            "nvidia-smi",
            "--query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.gen.max,"
            "pcie.link.width.current,pcie.link.width.max",
            "--format=csv,noheader,nounits",
        ]
    )
    f["nvidia_smi_raw"] = smi
    try:
        if smi.startswith("unavailable"):
            raise ValueError(smi)
        first = smi.splitlines()[0]
        parts = [x.strip() for x in first.split(",")]
        f["gpu_name"] = parts[0]
        f["gpu_memory_total_MiB"] = int(float(parts[1]))
        f["gpu_driver"] = parts[2]
        f["pcie_link_gen_current_idle"] = parts[3]
        f["pcie_link_gen_max"] = parts[4]
        f["pcie_link_width_current"] = parts[5]
        f["pcie_link_width_max"] = parts[6]
    except Exception:
        pass
    f["gpu_topology"] = _run(["nvidia-smi", "topo", "-m"])
    # CPU
    cpuinfo = _read("/proc/cpuinfo", "")
    model, flags, sockets, cores = None, "", set(), None
    for line in cpuinfo.splitlines():
        if ":" not in line:
            continue
        k, v = [x.strip() for x in line.split(":", 1)]
        if k == "model name" and model is None:
            model = v
        elif k == "flags" and not flags:
            flags = v
        elif k == "physical id":
            sockets.add(v)
        elif k == "cpu cores" and cores is None:
            cores = v
    f["cpu_model"] = model
    f["cpu_sockets_reported"] = len(sockets) or None
    f["cpu_cores_per_socket_reported"] = cores
    fl = set(flags.split())
    f["cpu_flags_of_interest"] = sorted(
        x
        for x in (
            "avx2",
            "fma",
            "f16c",
            "avx512f",
            "avx512bw",
            "avx512_fp16",
            "avx512_bf16",
            "amx_bf16",
            "amx_tile",
            "hypervisor",
        )
        if x in fl
    )
    f["logical_cpus"] = os.cpu_count()
    with contextlib.suppress(Exception):
        f["cpus_in_affinity"] = len(os.sched_getaffinity(0))
    tpc = _read("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list")
    f["cpu0_thread_siblings"] = tpc.strip() if tpc else None
    nodes = []
    base = "/sys/devices/system/node"
    if os.path.isdir(base):
        for d in sorted(os.listdir(base)):
            if d.startswith("node") and d[4:].isdigit():
                cpus = _read(os.path.join(base, d, "cpulist"), "").strip()
                mem = ""
                for line in (_read(os.path.join(base, d, "meminfo"), "") or "").splitlines():
                    if "MemTotal" in line:
                        mem = " ".join(line.split()[-2:])
                nodes.append({"node": d, "cpulist": cpus, "MemTotal": mem})
    f["numa_nodes"] = nodes if nodes else "no /sys/devices/system/node"
    mi = _meminfo()
    f["meminfo_at_start"] = mi
    with contextlib.suppress(Exception):
        f["ram_total_GiB_at_start"] = round(int(mi["MemTotal"].split()[0]) * 1024 / GiB, 2)
    f["transparent_hugepage"] = (
        _read("/sys/kernel/mm/transparent_hugepage/enabled", "") or ""
    ).strip()
    f["virtualization_hint"] = (
        _run(["systemd-detect-virt"]) if os.path.exists("/usr/bin/systemd-detect-virt") else None
    )
    f["dmi_product"] = (_read("/sys/class/dmi/id/product_name", "") or "").strip() or None
    return f


class Probe:
    def __init__(self, quick: bool):
        self.quick = quick
        self.results: dict = {}
        self.errors: list = []
        self.rows: list = []
        self.default_threads = torch.get_num_threads()

    def record(self, section, key, value, unit, method, note="", **extra):
        d = {"value": value, "unit": unit, "method": method}
        d.update(extra)
        self.results.setdefault(section, {})[key] = d
        self.rows.append((section, key, value, unit, note))
        print(f"  {section:<10} {key:<58} {value:>10.3f} {unit:<8} {note}", flush=True)

    @contextlib.contextmanager
    def attempt(self, section, name):
        t0 = time.perf_counter()
        try:
            yield
        except Exception as e:
            self.errors.append(
                {
                    "section": section,
                    "name": name,
                    "error": repr(e),
                    "traceback": traceback.format_exc(limit=6),
                }
            )
            print(f"  [error] {section}/{name}: {e!r}", flush=True)
        finally:
            torch.set_num_threads(self.default_threads)
            dt = time.perf_counter() - t0
            if dt > 20:
                print(f"  ({section}/{name} took {dt:.1f}s)", flush=True)


def _gbps(nbytes, seconds):
    return nbytes / seconds / 1e9


def record_rate(P: Probe, S, key, samples, nbytes, method, note="", **fields):
    """Record `nbytes` per call at the median of `samples` (seconds) as GB/s. The JSON entry
    holds `fields` (what was counted), then the statistics and the raw samples."""
    st = _stats(samples)
    P.record(
        S,
        key,
        _gbps(nbytes, st["median"]),
        "GB/s",
        method,
        note=note,
        **fields,
        seconds=st,
        samples_s=samples,
    )


# ----------------------------------------------------------------------------------
# a. PCIe bandwidth
# ----------------------------------------------------------------------------------


def section_a(P: Probe):
    S = "a_pcie"
    print("\n[a] PCIe H2D / D2H bandwidth", flush=True)
    sizes = [16 * MiB, 256 * MiB, 1 * GiB]
    reps = {16 * MiB: 30, 256 * MiB: 12, 1 * GiB: 8}
    if P.quick:
        reps = {16 * MiB: 5, 256 * MiB: 3, 1 * GiB: 2}
    big = max(sizes)
    dev = torch.empty(big, dtype=torch.uint8, device="cuda").fill_(3)
    dev2 = torch.empty(big, dtype=torch.uint8, device="cuda").fill_(5)
    pin_src = torch.empty(big, dtype=torch.uint8, pin_memory=True).fill_(7)
    pin_dst = torch.empty(big, dtype=torch.uint8, pin_memory=True).fill_(9)
    pag_src = torch.empty(big, dtype=torch.uint8).fill_(11)
    pag_dst = torch.empty(big, dtype=torch.uint8).fill_(13)
    P.results.setdefault(S, {})["_buffers"] = {
        "pinned_is_pinned": bool(pin_src.is_pinned()),
        "pageable_is_pinned": bool(pag_src.is_pinned()),
    }
    side = torch.cuda.Stream()
    wall = "wall clock between synchronize()s"
    for n in sizes:
        r = reps[n]
        tag = _fmt_size(n)

        def measure(figure, copy, how, stream=None, note=""):
            """Figure `{figure}_{tag}`: n bytes per `copy`, timed after 2 warm-ups with CUDA
            events on `stream`, or by wall clock when there is none."""
            key = f"{figure}_{tag}"
            with P.attempt(S, key):
                if stream is None:
                    ts = time_wall(copy, r, warmup=2)
                else:
                    ts = time_events(copy, r, warmup=2, stream=stream)
                method = f"{how}; median of {r} after 2 warm-ups"
                record_rate(P, S, key, ts, n, method, note, bytes=n)

        measure(
            "h2d_pinned",
            lambda: dev[:n].copy_(pin_src[:n], non_blocking=True),
            "dev.copy_(pinned uint8, non_blocking=True) on a side stream; CUDA events",
            stream=side,
        )
        measure(
            "d2h_pinned",
            lambda: pin_dst[:n].copy_(dev[:n], non_blocking=True),
            "pinned.copy_(dev uint8, non_blocking=True) on a side stream; CUDA events",
            stream=side,
        )
        measure(
            "h2d_pageable",
            lambda: dev[:n].copy_(pag_src[:n]),
            f"dev.copy_(pageable uint8, pre-touched) blocking; {wall}",
        )
        measure(
            "d2h_pageable",
            lambda: pag_dst[:n].copy_(dev[:n]),
            f"pageable(pre-touched).copy_(dev uint8) blocking; {wall}",
        )
        measure(
            "d2h_pageable_fresh",
            lambda: dev[:n].cpu(),
            "dev.cpu(): D2H into a freshly allocated pageable tensor each time "
            "(includes page faults); wall clock",
            note="fresh alloc",
        )
    # full-duplex: H2D on s1 and D2H on s2 at the same time
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    for n in (256 * MiB, 1 * GiB):
        tag = _fmt_size(n)
        r = 3 if P.quick else 10
        with P.attempt(S, f"duplex_{tag}"):
            t_h2d, t_d2h, t_both = [], [], []
            for i in range(r + 2):
                _sync()
                start = torch.cuda.Event(enable_timing=True)
                e1 = torch.cuda.Event(enable_timing=True)
                e2 = torch.cuda.Event(enable_timing=True)
                start.record(torch.cuda.current_stream())
                s1.wait_event(start)
                s2.wait_event(start)
                with torch.cuda.stream(s1):
                    dev[:n].copy_(pin_src[:n], non_blocking=True)
                    e1.record(s1)
                with torch.cuda.stream(s2):
                    pin_dst[:n].copy_(dev2[:n], non_blocking=True)
                    e2.record(s2)
                _sync()
                if i >= 2:
                    a, b = start.elapsed_time(e1) / 1e3, start.elapsed_time(e2) / 1e3
                    t_h2d.append(a)
                    t_d2h.append(b)
                    t_both.append(max(a, b))
            m = "H2D (pinned) on stream 1 and D2H (pinned) on stream 2 released by one event; "
            record_rate(
                P,
                S,
                f"duplex_{tag}_h2d",
                t_h2d,
                n,
                m + f"H2D bytes / (start->H2D end); CUDA events; median of {r}",
                bytes=n,
            )
            record_rate(
                P,
                S,
                f"duplex_{tag}_d2h",
                t_d2h,
                n,
                m + f"D2H bytes / (start->D2H end); CUDA events; median of {r}",
                bytes=n,
            )
            record_rate(
                P,
                S,
                f"duplex_{tag}_aggregate",
                t_both,
                2 * n,
                m + f"(H2D+D2H bytes) / (start->later end); median of {r}",
                note="both directions",
                bytes=2 * n,
            )
    dev = dev2 = pin_src = pin_dst = pag_src = pag_dst = None  # free
    _host_empty_cache()


# ----------------------------------------------------------------------------------
# b. DeepSpeed's cross-device, cross-dtype copies
# ----------------------------------------------------------------------------------


def section_b(P: Probe):
    S = "b_ds_copies"
    print(
        "\n[b] DeepSpeed cross-device cross-dtype copies "
        f"(CPU casts use torch threads={torch.get_num_threads()})",
        flush=True,
    )
    P.results.setdefault(S, {})["_notes"] = (
        "GB/s counts the 16-bit (fp16) bytes of the tensor, 2 bytes/element, even where fp32 "
        "crosses PCIe; elements_per_s = n/t. Blocking variants timed by wall clock between "
        "torch.cuda.synchronize() calls. PyTorch's CPU<->GPU cross-dtype copy "
        "(aten/src/ATen/native/cuda/Copy.cu, copy_kernel_cuda): blocking D2H -> D2H of the fp16 "
        "source into a fresh pageable fp16 CPU temporary, then a CPU cast into the destination; "
        "non_blocking D2H -> cast on the GPU, then DMA of fp32; blocking H2D -> CPU cast into a "
        "fresh pageable fp16 temporary, then H2D from pageable memory; non_blocking H2D -> in "
        "recent torch (conversion_device = non_blocking ? kCUDA : kCPU) fp32 DMA into a GPU "
        "temporary then a GPU cast, in older torch a CPU cast as for blocking. DeepSpeed v0.13.3: "
        "ZeRO-3 (stage3.py partition_grads) flushes boundary gradients with "
        "fp32_partitioned_groups_flat[i].grad.narrow(0, off, n).copy_(gpu_fp16_buffer), blocking "
        "(variants i/ii); ZeRO-1/2 (stage_1_and_2.py "
        "async_inplace_copy_grad_to_fp32_buffer_from_gpu) already does dest.copy_(src.float(), "
        "non_blocking=True) (variant iii, non-blocking); both copy updated weights back with "
        "bit16.data.copy_(fp32.data), blocking (variant iv)."
    )
    P.results[S]["_torch_threads"] = torch.get_num_threads()
    counts = [16 * Mi] if P.quick else [64 * Mi, 256 * Mi]
    for n in counts:
        tag = _fmt_elems(n)
        r = 2 if P.quick else (5 if n <= 64 * Mi else 4)
        b16 = 2 * n
        gpu16 = torch.randn(n, device="cuda", dtype=torch.float16)
        big32 = torch.empty(2 * n, dtype=torch.float32, pin_memory=True)
        big32.fill_(1.0)
        pin32 = big32[:n]
        unpin32 = torch.empty(n, dtype=torch.float32)
        unpin32.fill_(1.0)
        ref = gpu16[:4096].float().cpu()

        def rec(key, ts, method, note=""):
            st = _stats(ts)
            P.record(
                S,
                f"{key}_{tag}",
                _gbps(b16, st["median"]),
                "GB/s",
                method,
                note=note,
                elements=n,
                fp16_bytes=b16,
                elements_per_s=n / st["median"],
                seconds=st,
                samples_s=ts,
                reps=len(ts),
                statistic="median",
            )

        def check_flushed(what):
            got = pin32[:4096].float()
            if not torch.equal(got, ref):
                raise AssertionError(f"{what}: copied values differ from source")

        def check_copyback(what):
            got = gpu16[:4096].float().cpu()
            if not torch.equal(got, ref):
                raise AssertionError(f"{what}: copy-back values differ")

        def measure(name, key, fn, method, note="", cuda_sync=True, setup=None, verify=None):
            """Figure `{key}_{tag}` under attempt `{name}_{tag}`: setup(), time fn by wall clock
            (1 warm-up), verify() the copied values, then record."""
            with P.attempt(S, f"{name}_{tag}"):
                if setup is not None:
                    setup()
                ts = time_wall(fn, r, cuda_sync=cuda_sync)
                if verify is not None:
                    verify()
                rec(key, ts, method, note=note)

        def measure_flush(name, key, fn, method, what, note=""):
            """A copy into pin32, which is reset first and checked against the source after."""
            measure(
                name,
                key,
                fn,
                method,
                note=note,
                setup=lambda: pin32.fill_(0.5),
                verify=lambda: check_flushed(what),
            )

        # (i) DS 0.13.3 boundary gradient flush
        measure_flush(
            "i_flush_blocking",
            "i_flush_fp16gpu_to_fp32pinned_blocking",
            lambda: pin32.copy_(gpu16),
            f"cpu_fp32_pinned.copy_(gpu_fp16) blocking; wall; median of {r} after 1 warm-up",
            "i",
            note="DS0.13.3 flush",
        )
        measure_flush(
            "i_flush_nonblocking",
            "i_flush_fp16gpu_to_fp32pinned_nonblocking",
            lambda: pin32.copy_(gpu16, non_blocking=True),
            "cpu_fp32_pinned.copy_(gpu_fp16, non_blocking=True) + synchronize (torch casts on "
            f"GPU); wall; median of {r} after 1 warm-up",
            "i_nb",
        )
        # (ii) fresh destination slice vs reused
        k = [0]

        def fresh_slice():
            k[0] += 1
            off = (k[0] % 2) * n
            big32.view(-1).narrow(0, off, n).copy_(gpu16)

        measure(
            "ii_fresh_slice",
            "ii_flush_fresh_narrow_slice",
            fresh_slice,
            "big_pinned_fp32.view(-1).narrow(0, off, n).copy_(gpu_fp16), new view each call, "
            f"off alternating 0/n (DeepSpeed's pattern); wall; median of {r}",
        )
        measure(
            "ii_reused",
            "ii_flush_reused_dest",
            lambda: pin32.copy_(gpu16),
            f"same destination tensor object every call (same as i); wall; median of {r}",
        )
        measure(
            "ii_fresh_pinned_alloc",
            "ii_flush_fresh_pinned_alloc",
            lambda: torch.empty(n, dtype=torch.float32, pin_memory=True).copy_(gpu16),
            f"torch.empty(n, fp32, pin_memory=True).copy_(gpu_fp16) each call (caching host "
            f"allocator); wall; median of {r}",
        )
        measure(
            "ii_fresh_pageable_alloc",
            "ii_flush_fresh_pageable_alloc",
            lambda: torch.empty(n, dtype=torch.float32).copy_(gpu16),
            "torch.empty(n, fp32).copy_(gpu_fp16) each call (pageable dest, page faults); "
            f"wall; median of {r}",
        )
        # (iii) newer DeepSpeed: cast on GPU first
        measure_flush(
            "iii_float_then_copy_blocking",
            "iii_gpu_float_then_copy_blocking",
            lambda: pin32.copy_(gpu16.float()),
            f"cpu_fp32_pinned.copy_(gpu_fp16.float()) blocking; wall; median of {r}",
            "iii",
            note="fp32 over PCIe",
        )
        measure_flush(
            "iii_float_then_copy_nonblocking",
            "iii_gpu_float_then_copy_nonblocking",
            lambda: pin32.copy_(gpu16.float(), non_blocking=True),
            f"cpu_fp32_pinned.copy_(gpu_fp16.float(), non_blocking=True) + synchronize; wall; "
            f"median of {r}",
            "iii_nb",
            note="fp32 over PCIe",
        )
        # (iv) optimizer copy-back
        measure(
            "iv_copyback_pinned",
            "iv_copyback_fp32pinned_to_fp16gpu",
            lambda: gpu16.copy_(pin32),
            "gpu_fp16.copy_(cpu_fp32_pinned) blocking (CPU cast to pageable fp16 temp, then "
            f"H2D); wall; median of {r}",
            note="DS0.13.3 copy-back",
            setup=lambda: pin32.copy_(ref.repeat(n // 4096)),
            verify=lambda: check_copyback("iv"),
        )
        measure(
            "iv_copyback_unpinned",
            "iv_copyback_fp32pageable_to_fp16gpu",
            lambda: gpu16.copy_(unpin32),
            f"gpu_fp16.copy_(cpu_fp32_pageable) blocking; wall; median of {r}",
            setup=lambda: unpin32.copy_(pin32),
        )
        measure(
            "iv_copyback_pinned_nonblocking",
            "iv_copyback_fp32pinned_to_fp16gpu_nonblocking",
            lambda: gpu16.copy_(pin32, non_blocking=True),
            "gpu_fp16.copy_(cpu_fp32_pinned, non_blocking=True) + synchronize (recent torch: "
            f"fp32 H2D into a GPU temporary, cast on GPU); wall; median of {r}",
            setup=lambda: gpu16.fill_(0.0),
            verify=lambda: check_copyback("iv_nb"),
        )
        measure(
            "iv_alt_h2d_fp32_then_gpu_cast",
            "iv_alt_h2d_fp32pinned_then_gpu_cast",
            lambda: gpu16.copy_(pin32.to("cuda", non_blocking=True)),
            "gpu_fp16.copy_(cpu_fp32_pinned.to('cuda', non_blocking=True)) + synchronize: fp32 "
            f"over PCIe, cast on GPU; wall; median of {r}",
            note="fp32 over PCIe",
        )
        # components; the two that read a CPU fp16 temporary make it inside their attempt
        measure(
            "comp_d2h_fp16_fresh_pageable",
            "comp_d2h_fp16_into_fresh_pageable",
            lambda: gpu16.cpu(),
            f"gpu_fp16.cpu() (the temporary of variant i); wall; median of {r}",
            note="component",
        )
        with P.attempt(S, f"comp_cpu_cast16to32_{tag}"):
            cpu16 = gpu16.cpu()
            ts = time_wall(lambda: pin32.copy_(cpu16), r, cuda_sync=False)
            rec(
                "comp_cpu_cast_fp16_to_fp32pinned",
                ts,
                f"cpu_fp32_pinned.copy_(cpu_fp16) (CPU cast, all torch threads); wall; median of "
                f"{r}",
                note="component",
            )
        measure(
            "comp_cpu_cast32to16_fresh",
            "comp_cpu_cast_fp32pinned_to_fresh_fp16",
            lambda: pin32.to(torch.float16),
            "cpu_fp32_pinned.to(float16) into fresh pageable tensor (CPU cast); wall; median "
            f"of {r}",
            note="component",
            cuda_sync=False,
        )
        with P.attempt(S, f"comp_h2d_fp16_pageable_{tag}"):
            cpu16 = pin32.to(torch.float16)
            ts = time_wall(lambda: gpu16.copy_(cpu16), r)
            rec(
                "comp_h2d_fp16_from_pageable",
                ts,
                f"gpu_fp16.copy_(cpu_fp16_pageable) blocking; wall; median of {r}",
                note="component",
            )
        gpu16 = big32 = pin32 = unpin32 = None  # free
        cpu16 = None
        _host_empty_cache()


# ----------------------------------------------------------------------------------
# c. host memory bandwidth
# ----------------------------------------------------------------------------------


def section_c(P: Probe):
    S = "c_host_mem"
    print("\n[c] Host memory bandwidth", flush=True)
    n = (64 if P.quick else 256) * Mi
    r = 2 if P.quick else 5
    nt = P.default_threads
    a = torch.rand(n, dtype=torch.float32)
    b = torch.rand(n, dtype=torch.float32)
    c = torch.rand(n, dtype=torch.float32)
    an, bn = a.numpy(), b.numpy()
    size = f"{n // Mi}Mi fp32 ({_fmt_size(4 * n)}) per array"

    def rec(key, nbytes, ts, method, threads):
        record_rate(
            P,
            S,
            key,
            ts,
            nbytes,
            method + f"; {size}; median of {len(ts)} after 1 warm-up",
            note=f"threads={threads}",
            bytes_counted=nbytes,
            threads=threads,
        )

    with P.attempt(S, "numpy_copy_1t"):
        ts = time_wall(lambda: np.copyto(an, bn), r, cuda_sync=False)
        rec(
            "numpy_copyto_1thread", 8 * n, ts, "np.copyto(a, b), bytes = read + write (8 B/elem)", 1
        )
    kernels = [  # (attempt, figure, bytes counted per element, kernel, method)
        ("copy", "copy", 8, lambda: a.copy_(b), "a.copy_(b), bytes = read + write (8 B/elem)"),
        (
            "triad",
            "triad",
            12,
            lambda: torch.add(b, c, alpha=1.5, out=a),
            "torch.add(b, c, alpha=s, out=a), bytes = 2 reads + 1 write (12 B/elem)",
        ),
        ("read", "read_sum", 4, lambda: a.sum(), "a.sum(), bytes = 1 read (4 B/elem)"),
    ]
    for t in sorted({1, nt}):
        for name, figure, bpe, fn, method in kernels:
            with P.attempt(S, f"torch_{name}_{t}t"):
                torch.set_num_threads(t)
                ts = time_wall(fn, r, cuda_sync=False)
                rec(f"torch_{figure}_{t}threads", bpe * n, ts, method, t)
    torch.set_num_threads(nt)
    a = b = c = an = bn = None  # free
    gc.collect()


# ----------------------------------------------------------------------------------
# f. cudaMalloc of fresh device memory (zerosim's gpu.cuda_malloc_GBps)
# ----------------------------------------------------------------------------------


def _time_empty(size: int, emptied: bool) -> float:
    """Host seconds `torch.empty` of `size` bytes takes, after emptying the cache or not."""
    torch.cuda.synchronize()
    if emptied:
        torch.cuda.empty_cache()
    t0 = time.perf_counter()
    x = torch.empty(size, dtype=torch.uint8, device="cuda")
    dt = time.perf_counter() - t0
    del x
    return dt


def section_f(P: Probe):
    """How fast the caching allocator gets fresh device memory once the cache is emptied:
    `torch.empty` of a block after `torch.cuda.empty_cache()`, host wall time (cudaMalloc
    blocks the calling thread), against the same request served from the cache."""
    S = "f_cuda_malloc"
    print("\n[f] cudaMalloc after empty_cache", flush=True)
    sizes = [256 * MiB, 1 * GiB] if P.quick else [64 * MiB, 256 * MiB, 1 * GiB, 4 * GiB]
    r = 3 if P.quick else 7
    for size in sizes:
        for label, emptied, method in (
                ("fresh", True, "torch.empty(size, uint8, cuda) right after "
                 "torch.cuda.empty_cache(), host wall time"),
                ("cached", False, "the same request served from the cache (no empty_cache), "
                 "host wall time")):
            key = f"{label}_{_fmt_size(size)}"
            with P.attempt(S, key):
                _time_empty(size, emptied)
                record_rate(P, S, key, [_time_empty(size, emptied) for _ in range(r)], size,
                            f"{method}, median of {r} after 1 warm-up", bytes_counted=size)
    torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------
# g. One transformer block's forward at micro-batch 1 and 4 (no DeepSpeed)
# ----------------------------------------------------------------------------------

BLOCKS = ((3072, 11008, 32, 4), (4096, 11008, 32, 4), (5120, 13824, 40, 4))
"""(hidden, ffn, heads, kv heads) of the Polaris runs' models at micro-batch 1 (9.14B,
5.95B, 11.32B): their forwards take 1.22-1.43x zerosim's GPU path there and 1.00-1.07x at
micro-batch 4, a part that grows with the layer's parameters and not with the batch (about
10 ps per parameter, results/calibration/hook_per_run/). This section asks whether a plain
PyTorch block shows it, with no ZeRO-3 hook in the way."""
SEQUENCE = 2048


def _block_weights(hidden, ffn, heads, kv_heads):
    d = hidden // heads
    def w(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * 0.02
    return {"n1": torch.ones(hidden, device="cuda", dtype=torch.bfloat16),
            "qkv": w(hidden + 2 * kv_heads * d, hidden), "o": w(hidden, hidden),
            "n2": torch.ones(hidden, device="cuda", dtype=torch.bfloat16),
            "gate_up": w(2 * ffn, hidden), "down": w(hidden, ffn)}


def _rms(t, g):
    return (t.float() * torch.rsqrt(t.float().pow(2).mean(-1, keepdim=True) + 1e-5)).to(t.dtype) * g


def _block_forward(x, w, heads, kv_heads, mask):
    """Megatron-DeepSpeed's Llama block as its forward runs it ([s, b, h]): RMSNorm, fused
    QKV with grouped K/V expanded to every head, eager attention (baddbmm scores, causal mask,
    softmax, bmm), output projection, residual, RMSNorm, fused gate/up, SwiGLU, down, residual.
    Rotary embeddings are left out (elementwise, a few percent)."""
    s, b, h = x.shape
    d, group = h // heads, heads // kv_heads
    q, k, v = (_rms(x, w["n1"]) @ w["qkv"].t()).split([h, kv_heads * d, kv_heads * d], dim=-1)
    q = q.reshape(s, b * heads, d).transpose(0, 1)
    k, v = (t.reshape(s, b, kv_heads, 1, d).expand(s, b, kv_heads, group, d)
            .reshape(s, b * heads, d).transpose(0, 1) for t in (k, v))
    scores = torch.baddbmm(torch.empty(b * heads, s, s, device=x.device, dtype=x.dtype), q,
                           k.transpose(1, 2), beta=0.0, alpha=d ** -0.5)
    probs = torch.softmax(scores.masked_fill_(mask, float("-inf")), dim=-1)
    x = x + torch.bmm(probs, v).transpose(0, 1).reshape(s, b, h) @ w["o"].t()
    gate, up = (_rms(x, w["n2"]) @ w["gate_up"].t()).chunk(2, dim=-1)
    return x + (torch.nn.functional.silu(gate) * up) @ w["down"].t()


def section_g(P: Probe):
    """Per layer, CUDA-event time of a stack of distinct blocks under no_grad, at micro-batch 1
    and 4, with the host time to issue them; and each of the block's four GEMMs alone."""
    S = "g_block_forward"
    print("\n[g] transformer block forward, micro-batch 1 and 4", flush=True)
    layers, r = (2, 3) if P.quick else (6, 5)
    mask = torch.ones(SEQUENCE, SEQUENCE, device="cuda", dtype=torch.bool).triu_(1)
    for hidden, ffn, heads, kv_heads in BLOCKS[:1] if P.quick else BLOCKS:
        d = hidden // heads
        params = hidden * (hidden + 2 * kv_heads * d) + hidden * hidden + 3 * hidden * ffn
        weights = [_block_weights(hidden, ffn, heads, kv_heads) for _ in range(layers)]
        per_layer = {}
        for mb in (1, 4):
            x = torch.randn(SEQUENCE, mb, hidden, device="cuda", dtype=torch.bfloat16)

            def stack(x=x, weights=weights):
                with torch.no_grad():
                    y = x
                    for w in weights:
                        y = _block_forward(y, w, heads, kv_heads, mask)
                return y

            key = f"h{hidden}_mb{mb}"
            with P.attempt(S, key):
                ts = time_events(stack, r)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                stack()
                issue_s = time.perf_counter() - t0
                torch.cuda.synchronize()
                per_layer[mb] = statistics.median(ts) / layers
                P.record(S, key + "_layer_ms", per_layer[mb] * 1e3, "ms",
                         f"CUDA events around {layers} distinct blocks under no_grad, bf16, "
                         f"sequence {SEQUENCE}, median of {r} after 1 warm-up, per block",
                         note=f"host issue {1e3 * issue_s / layers:.2f} ms per block",
                         params_per_layer=params, host_issue_ms=1e3 * issue_s / layers,
                         samples_s=ts)
                M = SEQUENCE * mb
                for name, n_out in (("qkv", hidden + 2 * kv_heads * d), ("o", hidden),
                                    ("gate_up", 2 * ffn), ("down", hidden)):
                    k_in = ffn if name == "down" else hidden
                    a = torch.randn(M, k_in, device="cuda", dtype=torch.bfloat16)
                    b_ = weights[0][name]
                    g_ts = time_events(lambda a=a, b_=b_: a @ b_.t(), r, calls=BACK_TO_BACK)
                    flops = 2 * M * k_in * n_out
                    P.record(S, f"{key}_{name}_TFLOPS", flops / statistics.median(g_ts) / 1e12,
                             "TFLOP/s", f"({M} x {k_in}) @ ({k_in} x {n_out}) alone, CUDA "
                             f"events around {BACK_TO_BACK} calls behind a lead call (kernel "
                             f"time, no launch), median of {r}", m=M, n=n_out, k=k_in, batch=1,
                             calls=BACK_TO_BACK, samples_s=g_ts)
        if 1 in per_layer and 4 in per_layer:
            c = (4 * per_layer[1] - per_layer[4]) / 3
            P.record(S, f"h{hidden}_fixed_ps_per_param", c / params * 1e12, "ps/param",
                     "t(mb) = c + mb x g per layer from micro-batch 1 and 4: c over the "
                     "block's parameters (Polaris's runs: about 10)", c_ms=c * 1e3,
                     g_ms=(per_layer[4] - per_layer[1]) / 3 * 1e3)
        weights = stack = None
        torch.cuda.empty_cache()


ATTENTION_HEADS = 40
"""Section h's batch: the heads of one micro-batch of a 5120-wide block (Polaris's 11.2B)."""


def section_h(P: Probe):
    """Eager attention's batched GEMMs alone, at the head dims that make K small (QK^T's K is
    the head dim), and the host wait of a Python scalar made on the GPU behind queued work
    (Megatron-DeepSpeed's `torch.tensor(0.0, device=...)` before each block's MLP)."""
    S = "h_attention_gemms"
    print("\n[h] batched attention GEMMs and the scalar-copy sync", flush=True)
    r = 3 if P.quick else 10
    b = ATTENTION_HEADS
    for k in (64, 128, 256, 512, 2048):
        for name, (m, n, kk) in (("qk", (SEQUENCE, SEQUENCE, k)), ("pv", (SEQUENCE, k, SEQUENCE))):
            if name == "pv" and k != 128:
                continue
            with P.attempt(S, f"{name}_k{kk}"):
                x = torch.randn(b, m, kk, device="cuda", dtype=torch.bfloat16)
                y = torch.randn(b, kk, n, device="cuda", dtype=torch.bfloat16)
                ts = time_events(lambda x=x, y=y: torch.bmm(x, y), r, calls=BACK_TO_BACK)
                flops = 2 * b * m * n * kk
                tflops = flops / statistics.median(ts) / 1e12
                P.record(S, f"{name}_b{b}_{m}x{n}x{kk}_TFLOPS", tflops, "TFLOP/s",
                         f"torch.bmm ({b} x {m} x {kk}) @ ({b} x {kk} x {n}), bf16, "
                         f"CUDA events around {BACK_TO_BACK} calls behind a lead call (kernel "
                         f"time, no launch), median of {r}", m=m, n=n, k=kk, batch=b,
                         calls=BACK_TO_BACK, samples_s=ts)
    with P.attempt(S, "scalar_sync"):
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        for make in ("tensor", "zeros"):
            waits = []
            for _ in range(r):
                torch.cuda.synchronize()
                for _ in range(20):
                    a @ a
                t0 = time.perf_counter()
                if make == "tensor":
                    torch.tensor(0.0, device="cuda", dtype=torch.bfloat16)
                else:
                    torch.zeros((), device="cuda", dtype=torch.bfloat16)
                waits.append(time.perf_counter() - t0)
            torch.cuda.synchronize()
            P.record(S, f"host_wait_torch_{make}_ms", statistics.median(waits) * 1e3, "ms",
                     f"host time of torch.{make}(0.0 scalar, device='cuda') issued behind 20 "
                     f"queued 8192^3 GEMMs, median of {r}", samples_s=waits)


IDLE_S = (0.5, 2.0, 8.0)
"""Section i's idle gaps: the GPU's idle time before a step's first forward is the optimizer
step's, 2-8 s on the Polaris runs (the CPU updates while the GPU waits)."""


def _busy_host(seconds):
    """Keep every host thread busy for `seconds`, as CPU Adam keeps the node during the step."""
    a = torch.randn(4 * Mi)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a.mul_(1.0001).add_(1e-6)


def section_i(P: Probe):
    """A block stack's forward right after the GPU idled against the same forward back to back:
    the Polaris runs' first forward of an optimizer step costs 20-60 ms more than the others
    (`zerosim predict`'s accumulation series), which zerosim does not replay. Idle with the
    host asleep and with the host's threads busy; CUDA-event time of one forward each."""
    S = "i_forward_after_idle"
    print("\n[i] a forward after the GPU idled", flush=True)
    hidden, ffn, heads, kv_heads = BLOCKS[1]
    layers, mb, r = (2, 1, 2) if P.quick else (8, 4, 3)
    mask = torch.ones(SEQUENCE, SEQUENCE, device="cuda", dtype=torch.bool).triu_(1)
    weights = [_block_weights(hidden, ffn, heads, kv_heads) for _ in range(layers)]
    x = torch.randn(SEQUENCE, mb, hidden, device="cuda", dtype=torch.bfloat16)

    def forward():
        with torch.no_grad():
            y = x
            for w in weights:
                y = _block_forward(y, w, heads, kv_heads, mask)
        return y

    with P.attempt(S, "warm"):
        warm = statistics.median(time_events(forward, 5, warmup=2))
        P.record(S, "warm_forward_ms", warm * 1e3, "ms",
                 f"CUDA events around {layers} blocks of hidden {hidden} at micro-batch {mb}, "
                 "back to back, median of 5 after 2 warm-ups")
    for idle in IDLE_S[:1] if P.quick else IDLE_S:
        for host in ("asleep", "busy"):
            with P.attempt(S, f"idle_{idle}s_host_{host}"):
                extra = []
                for _ in range(r):
                    torch.cuda.synchronize()
                    if host == "busy":
                        _busy_host(idle)
                    else:
                        time.sleep(idle)
                    extra.append(time_events(forward, 1, warmup=0)[0] - warm)
                P.record(S, f"idle_{idle:g}s_host_{host}_extra_ms",
                         statistics.median(extra) * 1e3, "ms",
                         f"one forward's CUDA-event time after {idle:g} s with the GPU idle and "
                         f"the host {host}, minus the warm forward; median of {r}",
                         samples_s=extra)
    weights = None
    torch.cuda.empty_cache()


def _block_memory_ops(hidden, ffn, heads, kv_heads, mb):
    """Each memory-bound op of `_block_forward` on its own, with the bytes zerosim's stack
    description counts for it (`zerosim/validation/data/h100_block_forward.yaml`): (name,
    callable, bytes, what the bytes are)."""
    s, d, group = SEQUENCE, hidden // heads, heads // kv_heads
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    tokens = s * mb
    x = torch.randn(s, mb, hidden, **bf16)
    y = torch.randn(s, mb, hidden, **bf16)
    g = torch.ones(hidden, **bf16)
    qkv = torch.randn(s, mb, hidden + 2 * kv_heads * d, **bf16)
    k = qkv[..., hidden:hidden + kv_heads * d]
    scores = torch.randn(mb * heads, s, s, **bf16)
    mask = torch.ones(s, s, device="cuda", dtype=torch.bool).triu_(1)
    context = torch.randn(mb * heads, s, d, **bf16)
    gate_up = torch.randn(s, mb, 2 * ffn, **bf16)
    gate, up = gate_up.chunk(2, dim=-1)
    out = torch.empty_like(x)
    n_h, n_s, n_f = tokens * hidden, mb * heads * s * s, tokens * ffn
    return (
        ("copy", lambda: out.copy_(x), 4 * n_h, "contiguous bf16 copy, 2 + 2 B per element"),
        ("rms_chain", lambda: _rms(x, g), 42 * n_h, "_rms: 9 kernels, 42 B per element"),
        ("kv_expand", lambda: k.reshape(s, mb, kv_heads, 1, d).expand(s, mb, kv_heads, group, d)
         .reshape(s, mb * heads, d), 2.2 * n_h, "one of K, V to every head: 2.2 B per element"),
        ("masked_fill", lambda: scores.masked_fill_(mask, float("-inf")), 5 * n_s,
         "in place with the broadcast bool mask: 2 + 1 + 2 B per score"),
        ("softmax", lambda: torch.softmax(scores, dim=-1), 4 * n_s, "bf16: 2 + 2 B per score"),
        ("context_copy", lambda: context.transpose(0, 1).reshape(s, mb, hidden), 4 * n_h,
         "(b*heads, s, d) to (s, b, h): 2 + 2 B per element"),
        ("swiglu", lambda: torch.nn.functional.silu(gate) * up, 10 * n_f,
         "silu of the strided half, times the other: 10 B per ffn element"),
        ("residual", lambda: x + y, 6 * n_h, "2 + 2 read, 2 written per element"),
    )


def section_j(P: Probe):
    """The memory-bound ops of section g's block one at a time, at the rate zerosim's byte
    counts give them, beside a contiguous copy: which of them stream below a copy's rate (the
    whole block runs as if they streamed at 0.52 of HBM peak on an H100, where a STREAM copy
    reaches 0.87: `zerosim validate`'s plain-block cells)."""
    S = "j_block_memory_ops"
    print("\n[j] the block's memory-bound ops one at a time", flush=True)
    r = 3 if P.quick else 10
    for hidden, ffn, heads, kv_heads in BLOCKS[-1:] if P.quick else BLOCKS:
        for mb in (1, 4):
            for name, op, nbytes, what in _block_memory_ops(hidden, ffn, heads, kv_heads, mb):
                key = f"h{hidden}_mb{mb}_{name}"
                with P.attempt(S, key):
                    ts = time_events(op, r, calls=BACK_TO_BACK)
                    P.record(S, key + "_GBps", nbytes / statistics.median(ts) / 1e9, "GB/s",
                             f"{what}; CUDA events around {BACK_TO_BACK} calls behind a lead "
                             f"call, median of {r}", bytes=nbytes, samples_s=ts)
            torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------
# d. CPU kernels of the offloaded optimizer step
# ----------------------------------------------------------------------------------


def _make_adam(n, fused_pref=True, adamw=False):
    p = torch.nn.Parameter(torch.randn(n, dtype=torch.float32))
    p.grad = torch.randn(n, dtype=torch.float32).mul_(1e-3)
    cls = torch.optim.AdamW if adamw else torch.optim.Adam
    impl = None
    if fused_pref:
        try:
            opt = cls([p], lr=1e-3, foreach=False, fused=True)
            opt.step()  # creates state; also proves the fused CPU kernel exists
            impl = "fused=True (torch fused CPU kernel)"
        except Exception as e:
            impl = f"foreach=True (fused CPU unavailable: {e!r})"
            opt = cls([p], lr=1e-3, foreach=True)
            opt.step()
    else:
        opt = cls([p], lr=1e-3, foreach=True)
        opt.step()
        impl = "foreach=True"
    return p, opt, impl


def section_d(P: Probe):
    S = "d_cpu_kernels"
    print("\n[d] CPU kernels vs torch threads", flush=True)
    n = (32 if P.quick else 256) * Mi
    ncpu = os.cpu_count() or 1
    threads = sorted({t for t in (1, 2, 4, 8, 16) if t <= ncpu} | {ncpu})
    if P.quick:
        threads = sorted({1, ncpu})
    P.results.setdefault(S, {})["_notes"] = (
        "Elements/s and implied GB/s (bytes/element stated per kernel). DeepSpeed's own "
        "DeepSpeedCPUAdam (AVX512/AVX2 C++ extension, csrc/adam/cpu_adam.cpp) is NOT available "
        "here; torch's fused CPU Adam (torch.optim.Adam(fused=True), _fused_adam kernel) is the "
        "closest stand-in. Adam bytes/element = 28 (reads param, grad, exp_avg, exp_avg_sq; writes "
        "param, "
        "exp_avg, exp_avg_sq; fp32). Tensors: " + f"{n // Mi}Mi elements."
    )
    x = torch.randn(n, dtype=torch.float32)
    x2 = torch.empty(n, dtype=torch.float32).fill_(0.0)
    h = x.to(torch.float16)
    g = torch.randn(n, dtype=torch.float32)
    p, opt, impl = None, None, None
    with P.attempt(S, "adam_setup"):
        p, opt, impl = _make_adam(n)
        P.results[S]["_adam_impl"] = impl
        print(f"  Adam implementation: {impl}", flush=True)

    def rec(key, bpe, ts, method, t):
        st = _stats(ts)
        eps = n / st["median"]
        P.record(
            S,
            key,
            eps / 1e9,
            "Gelem/s",
            method + f"; {n // Mi}Mi elements; median of {len(ts)}",
            note=f"{eps * bpe / 1e9:.1f} GB/s @{bpe}B/el",
            elements=n,
            bytes_per_element=bpe,
            implied_GBps=eps * bpe / 1e9,
            elements_per_s=eps,
            threads=t,
            seconds=st,
            samples_s=ts,
        )

    def measure(name, figure, bpe, fn, method, t, r):
        """Figure `{figure}_{t}t` under attempt `{name}_{t}t`: fn on t torch threads."""
        with P.attempt(S, f"{name}_{t}t"):
            torch.set_num_threads(t)
            ts = time_wall(fn, r, cuda_sync=False)
            rec(f"{figure}_{t}t", bpe, ts, f"{method}, threads={t}", t)

    kernels = [  # (attempt, figure, bytes per element, kernel, method)
        (
            "cast32to16_fresh",
            "cast_fp32_to_fp16_fresh",
            6,
            lambda: x.to(torch.float16),
            "x.to(torch.float16) (fresh output)",
        ),
        (
            "cast32to16_prealloc",
            "cast_fp32_to_fp16_prealloc",
            6,
            lambda: h.copy_(x),
            "h16.copy_(x32) (preallocated)",
        ),
        (
            "cast16to32_fresh",
            "cast_fp16_to_fp32_fresh",
            6,
            lambda: h.to(torch.float32),
            "h.to(torch.float32) (fresh output)",
        ),
        (
            "cast16to32_prealloc",
            "cast_fp16_to_fp32_prealloc",
            6,
            lambda: x2.copy_(h),
            "x32.copy_(h16) (preallocated)",
        ),
        ("unscale_mul", "unscale_mul_inplace", 8, lambda: g.mul_(0.999), "g.mul_(s) in place fp32"),
    ]
    for t in threads:
        r = 2 if (P.quick or t == 1) else 4
        for name, figure, bpe, fn, method in kernels:
            measure(name, figure, bpe, fn, method, t, r)
        # Adam is not in `kernels`: opt.step held there would keep the optimizer's state
        # alive past the `opt = None` below.
        if opt is not None:
            adam = f"torch.optim.Adam {impl} .step() on one fp32 param"
            measure("adam", "adam_step", 28, opt.step, adam, t, r)
    with P.attempt(S, "adamw_all"):
        torch.set_num_threads(ncpu)
        opt = None  # free
        gc.collect()
        pw, optw, implw = _make_adam(n, adamw=True)
        r = 2 if P.quick else 4
        ts = time_wall(optw.step, r, cuda_sync=False)
        rec(
            f"adamw_step_{ncpu}t",
            28,
            ts,
            f"torch.optim.AdamW {implw} .step(), threads={ncpu}",
            ncpu,
        )
        del pw, optw
    x = x2 = h = g = None  # free (closure variables)
    del p
    gc.collect()


# ----------------------------------------------------------------------------------
# e. contention: DMA vs CPU kernels sharing host memory bandwidth
# ----------------------------------------------------------------------------------


class DmaLoop(threading.Thread):
    """Issues pinned copies of `nbytes` back-to-back on a side stream (two in flight), timing
    each with CUDA events; GPU timestamps are mapped to host time through a reference event."""

    def __init__(self, direction, host, dev, nbytes):
        super().__init__(daemon=True)
        self.direction, self.host, self.dev, self.n = direction, host, dev, nbytes
        self.stop = threading.Event()
        self.copies = []  # (gpu_start_s, gpu_end_s) relative to ref
        self.error = None
        self.ref_host = None

    def run(self):
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                ref = torch.cuda.Event(enable_timing=True)
                ref.record(stream)
                ref.synchronize()
                self.ref_host = time.perf_counter()
                inflight = []
                while True:
                    if not self.stop.is_set():
                        e0 = torch.cuda.Event(enable_timing=True)
                        e1 = torch.cuda.Event(enable_timing=True)
                        e0.record(stream)
                        if self.direction == "h2d":
                            self.dev.copy_(self.host, non_blocking=True)
                        else:
                            self.host.copy_(self.dev, non_blocking=True)
                        e1.record(stream)
                        inflight.append((e0, e1))
                    if not inflight:
                        break
                    if len(inflight) >= 2 or self.stop.is_set():
                        e0, e1 = inflight.pop(0)
                        e1.synchronize()
                        self.copies.append((ref.elapsed_time(e0) / 1e3, ref.elapsed_time(e1) / 1e3))
        except Exception as e:
            self.error = e

    def stats(self, t0_host=None, t1_host=None):
        """Copies that lie wholly inside [t0_host, t1_host] (host perf_counter clock)."""
        cs = self.copies
        if t0_host is not None:
            a, b = t0_host - self.ref_host, t1_host - self.ref_host
            cs = [c for c in cs if c[0] >= a and c[1] <= b]
        if not cs:
            return None
        durs = [c[1] - c[0] for c in cs]
        per = [self.n / d / 1e9 for d in durs]
        span = cs[-1][1] - cs[0][0]
        return {
            "copies": len(cs),
            "per_copy_GBps_median": statistics.median(per),
            "per_copy_GBps_min": min(per),
            "per_copy_GBps_max": max(per),
            "span_GBps": self.n * len(cs) / span / 1e9,
            "busy_fraction": sum(durs) / span,
        }


def _cpu_loop(fn, duration, n_elems):
    fn()  # warm
    it = 0
    t0 = time.perf_counter()
    while True:
        fn()
        it += 1
        t1 = time.perf_counter()
        if t1 - t0 >= duration:
            break
    return {
        "iterations": it,
        "seconds": t1 - t0,
        "elements_per_s": it * n_elems / (t1 - t0),
        "t0": t0,
        "t1": t1,
    }


def section_e(P: Probe, duration):
    S = "e_contention"
    print(
        f"\n[e] Contention: pinned 1 GiB DMA vs CPU kernels on all threads (window {duration}s)",
        flush=True,
    )
    ncpu = os.cpu_count() or 1
    nbytes = 1 * GiB
    n = (32 if P.quick else 256) * Mi
    host_src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).fill_(7)
    host_dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).fill_(9)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(3)
    P.results.setdefault(S, {})["_notes"] = (
        "DMA: a Python thread issues 1 GiB pinned copies back-to-back on a side stream (two in "
        "flight) and times each with CUDA events; GPU times are mapped onto the host clock with a "
        "reference event. CPU kernel: runs in the main thread in a loop for the window (torch "
        "kernels and copies release the GIL). 'during' DMA figures use only copies lying wholly "
        "inside the CPU kernel's window. per_copy = bytes / event-timed copy duration (the DMA "
        "rate itself); span = bytes of those copies / time from first start to last end "
        "(includes issue gaps); busy_fraction = copy time / span. "
        f"CPU kernels use torch threads = {ncpu} unless the key says otherwise; {n // Mi}Mi "
        "elements."
    )

    g = torch.randn(n, dtype=torch.float32)
    h = g.to(torch.float16)
    x2 = torch.empty(n, dtype=torch.float32).fill_(0.0)
    ca = torch.empty(n, dtype=torch.float32).fill_(1.0)
    p, opt, _impl = _make_adam(n)
    aggressors = {
        "unscale_mul": (lambda: g.mul_(0.999), 8),
        "adam_step": (opt.step, 28),
        "cast_fp16_to_fp32": (lambda: x2.copy_(h), 6),
        "host_copy": (lambda: ca.copy_(x2), 8),
    }
    plan = [
        ("unscale_mul", "h2d", ncpu),
        ("adam_step", "h2d", ncpu),
        ("cast_fp16_to_fp32", "h2d", ncpu),
        ("host_copy", "h2d", ncpu),
        ("unscale_mul", "d2h", ncpu),
        ("adam_step", "d2h", ncpu),
        ("adam_step", "h2d", max(1, ncpu - 1)),
        ("adam_step", "h2d", max(1, ncpu // 2)),
    ]
    if P.quick:
        plan = plan[:2] + plan[4:5]

    def with_dma(direction, work, lead_in=0.0):
        """Run work() in this thread while a DmaLoop copies in `direction` (started `lead_in`
        seconds before, so that copies are already in flight); return its result and the loop."""
        host = host_src if direction == "h2d" else host_dst
        loop = DmaLoop(direction, host, dev, nbytes)
        loop.start()
        if lead_in:
            time.sleep(lead_in)
        result = work()
        loop.stop.set()
        loop.join()
        if loop.error:
            raise loop.error
        return result, loop

    def dma_alone(direction):
        return with_dma(direction, lambda: time.sleep(duration))[1].stats()

    def record_dma(key, st, method, note, **extra):
        """A DmaLoop.stats() result as a figure: the median per-copy rate, all stats attached."""
        P.record(S, key, st["per_copy_GBps_median"], "GB/s", method, note=note, **extra, **st)

    def record_cpu(key, res, method, note, t, bpe, **extra):
        """A _cpu_loop() result as a figure in Gelem/s."""
        P.record(
            S,
            key,
            res["elements_per_s"] / 1e9,
            "Gelem/s",
            method,
            note=note,
            threads=t,
            bytes_per_element=bpe,
            iterations=res["iterations"],
            seconds=res["seconds"],
            elements_per_s=res["elements_per_s"],
            **extra,
        )

    alone = {}
    for direction in ("h2d", "d2h"):
        with P.attempt(S, f"dma_alone_{direction}"):
            st = dma_alone(direction)
            alone[direction] = st
            record_dma(
                f"dma_{direction}_alone",
                st,
                f"pinned {direction.upper()} 1 GiB copies for {duration}s, no CPU load; median "
                "per-copy event-timed rate",
                f"span {st['span_GBps']:.1f} GB/s, {st['copies']} copies",
            )

    cpu_alone = {}
    for name, direction, t in plan:
        suffix = "" if t == ncpu else f"_{t}t"
        fn, bpe = aggressors[name]
        with P.attempt(S, f"{name}_{direction}{suffix}"):
            torch.set_num_threads(t)
            ck = (name, t)
            if ck not in cpu_alone:
                cpu_alone[ck] = _cpu_loop(fn, duration, n)
                eps = cpu_alone[ck]["elements_per_s"]
                record_cpu(
                    f"cpu_{name}_{t}t_alone",
                    cpu_alone[ck],
                    f"{name} loop for {duration}s alone, threads={t}",
                    f"{eps * bpe / 1e9:.1f} GB/s @{bpe}B/el",
                    t,
                    bpe,
                )
            cr, loop = with_dma(direction, lambda: _cpu_loop(fn, duration, n), lead_in=0.3)
            st = loop.stats(cr["t0"], cr["t1"])
            if st is None:
                raise RuntimeError("no DMA copy completed wholly inside the CPU window")
            base = alone.get(direction, {}).get("per_copy_GBps_median")
            record_dma(
                f"dma_{direction}_during_{name}{suffix}",
                st,
                f"pinned {direction.upper()} 1 GiB copies while the main thread runs {name} "
                f"(threads={t}) for {duration}s; median per-copy event-timed rate of copies inside "
                "the window",
                (f"{100 * st['per_copy_GBps_median'] / base:.0f}% of alone; " if base else "")
                + f"span {st['span_GBps']:.1f}",
                threads=t,
                alone_GBps=base,
            )
            base_c = cpu_alone[ck]["elements_per_s"]
            record_cpu(
                f"cpu_{name}_{t}t_during_{direction}",
                cr,
                f"{name} loop (threads={t}) for {duration}s while {direction.upper()} DMA runs",
                f"{100 * cr['elements_per_s'] / base_c:.0f}% of alone",
                t,
                bpe,
                alone_elements_per_s=base_c,
            )
    torch.set_num_threads(P.default_threads)
    # DMA alone again, to check for drift over the section
    for direction in ("h2d",):
        with P.attempt(S, f"dma_alone_{direction}_again"):
            st = dma_alone(direction)
            record_dma(
                f"dma_{direction}_alone_again",
                st,
                "repeat of the alone measurement at the end of the section (drift check)",
                f"span {st['span_GBps']:.1f} GB/s",
            )
    host_src = host_dst = dev = g = h = x2 = ca = opt = None  # free (closure variables)
    del p
    _host_empty_cache()


# ----------------------------------------------------------------------------------


def print_table(P: Probe):
    print("\n" + "=" * 118)
    print(f"{'section':<14}{'figure':<58}{'value':>11} {'unit':<8} note")
    print("-" * 118)
    for sec, key, val, unit, note in P.rows:
        print(f"{sec:<14}{key:<58}{val:>11.3f} {unit:<8} {note}")
    print("=" * 118)
    if P.errors:
        print(f"{len(P.errors)} measurement(s) failed:")
        for e in P.errors:
            print(f"  {e['section']}/{e['name']}: {e['error']}")


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick", action="store_true", help="small sizes, few repetitions (about a minute)"
    )
    ap.add_argument("--out", default="node_probe.json", help="JSON output path")
    ap.add_argument("--sections", default="abcdefghij",
                    help="subset of sections to run, e.g. 'ae'")
    ap.add_argument(
        "--duration",
        type=float,
        default=None,
        help="contention window seconds (default 2.0, 0.6 with --quick)",
    )
    ap.add_argument(
        "--cpu-only",
        action="store_true",
        help="run only the host sections (c, d); for machines without a GPU",
    )
    ap.add_argument(
        "--max-seconds",
        type=float,
        default=0,
        help="skip sections that would start after this many seconds (0: no limit)",
    )
    args = ap.parse_args(argv)
    if args.cpu_only:
        args.sections = "".join(s for s in args.sections if s in "cd")
    if not torch.cuda.is_available() and not args.cpu_only:
        print(
            "CUDA is not available: sections a, b, e, f, g, h, i need a CUDA GPU; use "
            "--cpu-only to run the host sections (c, d) alone",
            file=sys.stderr,
        )
        return 2
    duration = args.duration or (0.6 if args.quick else 2.0)
    t_start = time.perf_counter()
    torch.manual_seed(0)
    if torch.cuda.is_available():
        torch.cuda.init()
        torch.empty(1, device="cuda")
    P = Probe(args.quick)
    facts = {}
    try:
        facts = machine_facts()
    except Exception as e:
        P.errors.append(
            {
                "section": "machine",
                "name": "facts",
                "error": repr(e),
                "traceback": traceback.format_exc(limit=6),
            }
        )
    print(
        "machine:",
        json.dumps(
            {
                k: facts.get(k)
                for k in (
                    "gpu_name",
                    "gpu_memory_total_MiB",
                    "gpu_driver",
                    "torch",
                    "torch_cuda",
                    "cpu_model",
                    "logical_cpus",
                    "ram_total_GiB_at_start",
                    "torch_cpu_capability",
                    "torch_default_threads",
                    "pcie_link_gen_max",
                    "pcie_link_width_max",
                )
            }
        ),
        flush=True,
    )
    sections = {
        "a": section_a,
        "b": section_b,
        "c": section_c,
        "d": section_d,
        "e": lambda p: section_e(p, duration),
        "f": section_f,
        "g": section_g,
        "h": section_h,
        "i": section_i,
        "j": section_j,
    }
    timings = {}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)

    def write_json(complete):
        doc = {
            "schema": SCHEMA,
            "complete": complete,
            "created_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "args": vars(args),
            "units": {
                "GB/s": "1e9 bytes per second",
                "Gelem/s": "1e9 elements per second",
                "MiB": "2**20 bytes",
                "GiB": "2**30 bytes",
                "Mi elements": "2**20 elements",
            },
            "conventions": (
                "value is the median of the listed samples unless the method says otherwise; "
                "samples_s are per-repetition seconds; wall-clock timings bracket the operation "
                "with torch.cuda.synchronize()"
            ),
            "machine": facts,
            "results": P.results,
            "errors": P.errors,
            "section_seconds": timings,
            "total_seconds": round(time.perf_counter() - t_start, 2),
        }
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1, default=str)
        return doc

    for s in args.sections:
        if s not in sections:
            continue
        if args.max_seconds and time.perf_counter() - t_start > args.max_seconds:
            P.errors.append(
                {"section": s, "name": "<section>", "error": "skipped: --max-seconds reached"}
            )
            print(f"  [skip] section {s}: --max-seconds reached", flush=True)
            continue
        t0 = time.perf_counter()
        try:
            sections[s](P)
        except Exception as e:
            P.errors.append(
                {
                    "section": s,
                    "name": "<section>",
                    "error": repr(e),
                    "traceback": traceback.format_exc(limit=8),
                }
            )
            print(f"  [error] section {s}: {e!r}", flush=True)
        timings[s] = round(time.perf_counter() - t0, 2)
        _host_empty_cache()
        write_json(False)
    facts["meminfo_at_end"] = _meminfo()
    facts["nvidia_smi_at_end"] = _run(
        [
            "nvidia-smi",
            "--query-gpu=pcie.link.gen.current,pcie.link.width.current,clocks.sm,clocks.mem,"
            "temperature.gpu,power.draw",
            "--format=csv,noheader",
        ]
    )
    doc = write_json(True)
    print_table(P)
    print(f"section seconds: {timings}; total {doc['total_seconds']}s; JSON -> {args.out}")
    return 3 if P.errors else 0


if __name__ == "__main__":
    sys.exit(main())
