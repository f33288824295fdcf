"""PyTorch's flash attention (scaled_dot_product_attention, flash backend) on one GPU, two ways:

* as FlashAttention-2's release benchmarked its kernel (causal, float16, batch x sequence =
  16384 tokens, hidden 2048, head dimension 64 and 128, sequence 512-16384; forward timed over
  30 calls after 30 warm-ups, then backward the same; TFLOPS = 3.5 x 4 b s^2 h d / 2 over the
  two times), so `zerosim.validation.flash_attention` can fit a GPU's three flash values;
* inside probe_node.py's plain Llama block (section g) with the eager attention replaced by the
  flash kernel (GQA by `enable_gqa`, else K and V expanded), per layer at micro-batch 1 and 4,
  then the widest block back to back for about 2 s, with wall-clock stamps to align with a clock
  and power log taken beside it:

    nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active \\
        --format=csv -lms 50 > clocks.csv &
    python3 flash_probe.py flash.json

Needs torch with CUDA; about 30 s."""

# The lambdas handed to the timers inside loops are called before the loop variables change
# (the timers return first), so B023 does not apply.
# ruff: noqa: B023
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_node import BLOCKS, SEQUENCE, _block_weights, _rms, run_recorded, seconds_per_call

TOKENS, HIDDEN = 16384, 2048


def fa2_benchmark(out):
    rows = []
    for head_dim in (64, 128):
        for seq in (512, 1024, 2048, 4096, 8192, 16384):
            batch, heads = TOKENS // seq, HIDDEN // head_dim
            q, k, v = (torch.randn(batch, heads, seq, head_dim, device="cuda",
                                   dtype=torch.float16, requires_grad=True) for _ in range(3))
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                forward_s = seconds_per_call(lambda: F.scaled_dot_product_attention(
                    q, k, v, is_causal=True), 30, lead=30, settle=True)
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                grad = torch.randn_like(y)
                backward_s = seconds_per_call(lambda: y.backward(grad, retain_graph=True), 30,
                                              lead=30, settle=True)
            flops = 4 * batch * seq * seq * heads * head_dim / 2
            rows.append({"head_dim": head_dim, "seq": seq, "forward_ms": forward_s * 1e3,
                         "backward_ms": backward_s * 1e3,
                         "TFLOPS": 3.5 * flops / (forward_s + backward_s) / 1e12,
                         "t_wall": time.time()})
            print(json.dumps(rows[-1]), flush=True)
            q = k = v = y = grad = None
    out["fa2_benchmark"] = rows


def attention(q, k, v, out, heads, kv_heads):
    """Flash attention of [s, b, h]-laid q, k, v; GQA natively where the kernel takes it."""
    s, b = q.shape[:2]
    d = q.shape[-1] // heads
    qh = q.reshape(s, b, heads, d).permute(1, 2, 0, 3)
    kh, vh = (t.reshape(s, b, kv_heads, d).permute(1, 2, 0, 3) for t in (k, v))
    if out.setdefault("gqa", "enable_gqa") == "enable_gqa":
        try:
            y = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=True)
            return y.permute(2, 0, 1, 3).reshape(s, b, heads * d)
        except Exception:
            out["gqa"] = "expanded: " + traceback.format_exc(limit=1).strip().splitlines()[-1]
    group = heads // kv_heads
    kh, vh = (t.repeat_interleave(group, dim=1) for t in (kh, vh))
    y = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
    return y.permute(2, 0, 1, 3).reshape(s, b, heads * d)


def block_forward(x, w, heads, kv_heads, out):
    h = x.shape[-1]
    d = h // heads
    q, k, v = (_rms(x, w["n1"]) @ w["qkv"].t()).split([h, kv_heads * d, kv_heads * d], dim=-1)
    x = x + attention(q, k, v, out, heads, kv_heads) @ w["o"].t()
    gate, up = (_rms(x, w["n2"]) @ w["gate_up"].t()).chunk(2, dim=-1)
    return x + (F.silu(gate) * up) @ w["down"].t()


def flash_block(out):
    rows = []
    layers, reps = 6, 5
    for hidden, ffn, heads, kv_heads in BLOCKS:
        weights = [_block_weights(hidden, ffn, heads, kv_heads) for _ in range(layers)]
        for mb in (1, 4):
            x = torch.randn(SEQUENCE, mb, hidden, device="cuda", dtype=torch.bfloat16)

            def stack(x=x, weights=weights):
                with torch.no_grad(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    y = x
                    for w in weights:
                        y = block_forward(y, w, heads, kv_heads, out)
                return y

            stack()
            torch.cuda.synchronize()
            times = []
            for _ in range(reps):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                stack()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3 / layers)
            rows.append({"hidden": hidden, "ffn": ffn, "heads": heads, "kv_heads": kv_heads,
                         "micro_batch": mb, "layer_ms": statistics.median(times) * 1e3,
                         "samples_ms": [t * 1e3 for t in times], "t_wall": time.time()})
            print(json.dumps(rows[-1]), flush=True)
        if hidden == BLOCKS[-1][0]:
            x = torch.randn(SEQUENCE, 4, hidden, device="cuda", dtype=torch.bfloat16)
            long_run = []
            t_start = time.time()
            while time.time() - t_start < 2.0:
                long_run.append(seconds_per_call(lambda x=x, weights=weights: stack(x, weights),
                                                 1, settle=True) / layers * 1e3)
            out["long_run"] = {"hidden": hidden, "micro_batch": 4, "layer_ms": long_run,
                               "t_wall_start": t_start, "t_wall_end": time.time()}
            print(json.dumps({"long_run_first": long_run[:3], "long_run_last": long_run[-3:]}),
                  flush=True)
        weights = None
        torch.cuda.empty_cache()
    out["flash_block"] = rows


def main(path):
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "errors": []}
    for part in (fa2_benchmark, flash_block):
        run_recorded(out, path, part)


if __name__ == "__main__":
    main(sys.argv[1])
