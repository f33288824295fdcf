"""transformers' own LlamaDecoderLayer, forward and backward, on one GPU: per layer, a stack of
four distinct layers in bfloat16 at sequence 2048 for the Polaris runs' three widths at
micro-batch 1 and 4, PyTorch's SDPA attention held to its flash backend, weights' gradients
computed (as ZeRO-3 computes them), then the widest at micro-batch 4 forward and backward back
to back for about 2 s; with wall-clock stamps to align with a clock and power log taken
beside it:

    nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active \\
        --format=csv -lms 50 > clocks.csv &
    python3 hf_layer_probe.py hf_layer.json

Needs torch with CUDA and transformers; about 20 s."""

import json
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_node import run_recorded

SEQUENCE, LAYERS, REPS = 2048, 4, 3
BLOCKS = ((3072, 11008, 32, 4), (4096, 11008, 32, 4), (5120, 13824, 40, 4))
"""(hidden, ffn, heads, kv heads) of the Polaris runs' models (9.14B, 5.95B, 11.32B)."""


def gqa_in_sdpa():
    """Whether transformers hands grouped K and V to SDPA as they are (`enable_gqa`) rather
    than expanding them (`repeat_kv`), for an unmasked call."""
    try:
        from transformers.integrations.sdpa_attention import use_gqa_in_sdpa
    except ImportError:
        return False
    key = torch.empty(1, 4, 8, 64, device="cuda")
    try:
        return bool(use_gqa_in_sdpa(None, key))
    except TypeError:
        return "unknown"


def build(hidden, ffn, heads, kv_heads):
    config = LlamaConfig(hidden_size=hidden, intermediate_size=ffn, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, max_position_embeddings=SEQUENCE,
                         rms_norm_eps=1e-5, attention_dropout=0.0, attn_implementation="sdpa")
    config._attn_implementation = "sdpa"
    layers = [LlamaDecoderLayer(config, layer_idx=i).to("cuda", torch.bfloat16)
              for i in range(LAYERS)]
    rotary = LlamaRotaryEmbedding(config=config).to("cuda")
    return layers, rotary


def stack_of(layers, rotary, mb, hidden):
    x = torch.randn(mb, SEQUENCE, hidden, device="cuda", dtype=torch.bfloat16,
                    requires_grad=True)
    positions = torch.arange(SEQUENCE, device="cuda").unsqueeze(0).expand(mb, -1)
    cos, sin = rotary(x, positions)
    grad = torch.randn(mb, SEQUENCE, hidden, device="cuda", dtype=torch.bfloat16)

    def step():
        """Forward then backward, CUDA-event seconds of each."""
        for layer in layers:
            for p in layer.parameters():
                p.grad = None
        x.grad = None
        start, middle, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            start.record()
            y = x
            for layer in layers:
                out = layer(y, attention_mask=None, position_ids=positions,
                            position_embeddings=(cos, sin))
                y = out[0] if isinstance(out, tuple) else out
            middle.record()
            y.backward(grad)
            end.record()
        end.synchronize()
        return start.elapsed_time(middle) / 1e3, middle.elapsed_time(end) / 1e3

    return step


def measure(out, hidden, ffn, heads, kv_heads):
    """One width's rows (micro-batch 1 and 4) and, for the widest, the long run."""
    layers, rotary = build(hidden, ffn, heads, kv_heads)
    for mb in (1, 4):
        step = stack_of(layers, rotary, mb, hidden)
        step()
        times = [step() for _ in range(REPS)]
        row = {"hidden": hidden, "ffn": ffn, "heads": heads, "kv_heads": kv_heads,
               "micro_batch": mb,
               "forward_ms": statistics.median(t[0] for t in times) / LAYERS * 1e3,
               "backward_ms": statistics.median(t[1] for t in times) / LAYERS * 1e3,
               "samples_s": times, "t_wall": time.time()}
        out["rows"].append(row)
        print(json.dumps(row), flush=True)
    if hidden == BLOCKS[-1][0]:
        step = stack_of(layers, rotary, 4, hidden)
        t_start, runs = time.time(), []
        while time.time() - t_start < 2.0:
            runs.append(step())
        out["long_run"] = {"hidden": hidden, "micro_batch": 4,
                           "forward_ms": [t[0] / LAYERS * 1e3 for t in runs],
                           "backward_ms": [t[1] / LAYERS * 1e3 for t in runs],
                           "t_wall_start": t_start, "t_wall_end": time.time()}
        print(json.dumps({"long_run_forward_ms": out["long_run"]["forward_ms"][-3:],
                          "long_run_backward_ms": out["long_run"]["backward_ms"][-3:]}),
              flush=True)
    layers = rotary = step = None
    torch.cuda.empty_cache()


def main(path):
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "transformers": transformers.__version__, "gqa_in_sdpa": gqa_in_sdpa(),
           "layers": LAYERS, "rows": [], "errors": []}
    for block in BLOCKS:
        run_recorded(out, path, lambda out, block=block: measure(out, *block))


if __name__ == "__main__":
    main(sys.argv[1])
