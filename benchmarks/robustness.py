"""Configurations like the ones zerosim's predictions are judged on, run in bulk: none may crash.

Run: `python benchmarks/robustness.py [--quick]`. The cases are the shapes of the Deep Optimizer
States study's other runs (the H100 node, several Polaris nodes, the fork's asynchronous flush
and interleaved update): every Polaris calibration scenario on both testbeds' profiles, bound
and unbound; the fork's options on three of its builds, gaps 0 to 4 (gap 1 is refused, as the
fork divides by gap - 1), with and without the asynchronous flush, on four models; and three
models on 2 to 16 Polaris nodes at micro-batch 1 and 4; the MLP-Offload runs on the H100 node
(optimizer on NVMe) and four Polaris models with ZeRO-3's gradients reduce-scattered and
all-reduced (`reduce_scatter`); and ZeRO-1/2/3 with and without offload and gradient
accumulation at every release where a DeepSpeed behaviour changes, and ZeRO-3 with the
parameters on the CPU and the optimizer on the CPU or the GPU (PyTorch's AdamW or FusedAdam) at
each of those releases; and ZenFlow at ZeRO-1 and 2, its step overlapped or not, at DP=1 and 4
(its moments offloaded at DP=4), at each release from 0.17.5; and SuperOffload with and without
gradient clipping and Twin-Flow, at DP=1 and 4 (bound, or unbound with the parameters on the
CPU) on the H100 node, at each release from 0.18.9; and bf16 master weights (and moments) at
ZeRO-1/2/3 with the optimizer on the CPU (Twin-Flow too) or the GPU, on both testbeds, at each
release from 0.18.3, and fp16 master weights (and moments) at ZeRO-1/2/3; and ZeRO-3 leaf
modules by granularity (thresholds 1e6 to 1e9) on four
models under both stacks, with and without checkpointing and the parameters on the CPU; and
ZeRO++'s hpZ (groups of 2, 4 and 8 ranks) and qwZ on two Polaris nodes at each release where
they changed, the parameters on the GPU or the CPU; and MiCS's shard groups (1 to 16 ranks,
flat and hierarchical) on four Polaris nodes at three releases, nothing offloaded, micro-batch
1 and 4; and unmanaged gradient accumulation (0.19.5) at ZeRO-3 with the optimizer, the
parameters, both or nothing offloaded and ZeRO-2 with the optimizer or nothing offloaded, GA 1
and 4; and every alternative reading of a shipped profile (`hardware.alternative`) on the
fork's models, bound, with and without the interleaved update; and Ulysses sequence
parallelism (0.19.5) for Llama-3.1-8B on 1 to 4 DGX H100 nodes,
groups of 4 to 16 GPUs (one across two nodes), 16K to 256K tokens, at ZeRO-1/2/3 with the
optimizer, both or nothing offloaded, and under Megatron-DeepSpeed (DistributedAttention) for
three Polaris models on one and two nodes, groups of 2 to 8, at 0.13.3 and 0.14.4; and three
models
with their checkpointed
block inputs in host memory (`runtime.checkpoint_in_cpu`) on both testbeds at micro-batches 1
to 16, synchronizing each layer or not, the parameters on the GPU or the CPU; and
Qwen3-8B, Qwen3-30B-A3B and
Mixtral-8x7B on the hf-transformers stack on Polaris and a DGX H100, parameters on the GPU or
the CPU, and DeepSeek-V2-Lite, Gemma-2-9B, OLMo-2-7B, Llama-4-Scout and GPT-OSS-20B under eager
and flash attention. It prints how many ran, how many did not fit (a result, not a failure)
grouped by the device, kind of allocation and module that did not fit, with how far past the
device's capacity (GiB: a fraction of one is within the memory model's error), every clear
refusal grouped by its message, and every crash or non-finite phase time with its case; the exit
status is 1 if there was any. No figure is asserted here: a crash is a bug to fix, an OOM or a
refusal a result to read.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

import zerosim
from zerosim.api import simulate_summary
from zerosim.behaviours import BEHAVIOURS, format_version
from zerosim.errors import ZerosimError

ROOT = Path(__file__).resolve().parent.parent
POLARIS = ROOT / "scenarios" / "calibration" / "polaris"
H100_NVME = ROOT / "scenarios" / "calibration" / "h100_nvme"
REDUCE_SCATTER = "deepspeed.zero_optimization.reduce_scatter"
OFFLOAD = "deepspeed.zero_optimization.offload_optimizer."
PARAMS = "deepspeed.zero_optimization.offload_param."
FORK_BUILDS = ("0.13.3+4570a955", "0.13.3+d18d6f81", "0.13.3+c7da512a")
FORK_MODELS = ("polaris-5.90b-dp4-mb4-ga1-sg1e08", "polaris-11.20b-dp1-mb4-ga1-sg1e08",
               "polaris-15.58b-dp4-mb1-ga1-sg1e08", "polaris-5.95b-dp1-mb1-ga1-sg1e07")
REAL_MODELS = ROOT / "tests" / "data" / "real_configs" / "models"
HF_MODELS = ("Qwen3-8B", "Qwen3-30B-A3B", "Mixtral-8x7B-v0.1")
"""Hugging Face configs run on the hf-transformers stack (Mixtral's experts as transformers 5
holds them, as transformers 4 did, and as a ZeRO-3 leaf block)."""
INLINE_MODELS = {
    "deepseek-v2-lite": {"model_type": "deepseek_v2", "hidden_size": 2048,
                         "num_hidden_layers": 27, "intermediate_size": 10944,
                         "moe_intermediate_size": 1408, "num_attention_heads": 16,
                         "num_key_value_heads": 16, "vocab_size": 102400,
                         "first_k_dense_replace": 1, "n_routed_experts": 64,
                         "n_shared_experts": 2, "num_experts_per_tok": 6, "q_lora_rank": None},
    "gemma-2-9b": {"model_type": "gemma2", "hidden_size": 3584, "num_hidden_layers": 42,
                   "intermediate_size": 14336, "num_attention_heads": 16,
                   "num_key_value_heads": 8, "head_dim": 256, "vocab_size": 256000},
    "olmo-2-7b": {"model_type": "olmo2", "hidden_size": 4096, "num_hidden_layers": 32,
                  "intermediate_size": 11008, "num_attention_heads": 32,
                  "num_key_value_heads": 32, "vocab_size": 100352},
    "llama-4-scout": {"model_type": "llama4_text", "hidden_size": 5120,
                      "num_hidden_layers": 48, "intermediate_size": 8192,
                      "intermediate_size_mlp": 16384, "num_attention_heads": 40,
                      "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 202048,
                      "num_local_experts": 16, "num_experts_per_tok": 1,
                      "attention_chunk_size": None},
    "gpt-oss-20b": {"model_type": "gpt_oss", "hidden_size": 2880, "num_hidden_layers": 24,
                    "intermediate_size": 2880, "num_attention_heads": 64,
                    "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 201088,
                    "num_local_experts": 32, "num_experts_per_tok": 4, "sliding_window": None},
}
"""Models given inline, of the model types whose blocks differ most from Llama's (latent
attention, post-norms and soft-capping, Q/K norms without pre-norms, attention sinks, experts
that run every token)."""
MULTI_NODE_MODELS = ("polaris-5.90b-dp4-mb4-ga1-sg1e08", "polaris-11.20b-dp4-mb4-ga1-sg1e08",
                     "polaris-9.14b-dp4-mb1-ga1-sg1e08")
LEAF_MODELS = (
    ({"hf_config": str(REAL_MODELS / "Mixtral-8x7B-v0.1" / "config.json")}, "hf-transformers"),
    ({"hf_config": str(REAL_MODELS / "Qwen3-8B" / "config.json")}, "megatron-deepspeed"),
    (INLINE_MODELS["gpt-oss-20b"], "hf-transformers"),
    ({**INLINE_MODELS["olmo-2-7b"], "num_hidden_layers": 4}, "megatron-deepspeed"),
)
"""Models whose ZeRO-3 leaves by granularity (DeepSpeed 0.19.5) reach from each attention to
the whole model: under a billion parameters the 4-layer OLMo-2's model and its encoder qualify."""
LEAF_THRESHOLDS = (10**6, 10**7, 4 * 10**7, 10**8, 10**9)
ZERO_PLUS_PLUS_RELEASES = ((0, 10, 0), (0, 13, 2), (0, 13, 5), (0, 14, 3), (0, 19, 5))
"""Where ZeRO++ came and where hpZ's secondary partitions changed (hpZ before 0.13.2 is
refused)."""


LOCO_RELEASES = ((0, 16, 2), (0, 19, 5))
"""Where LoCo came (qgZ's error feedback), and the latest release."""
MICS_RELEASES = ((0, 9, 2), (0, 13, 3), (0, 19, 5))
"""Where MiCS came, the study's release and the latest."""
MICS_GROUPS = ((4, False), (8, False), (8, True), (16, False), (16, True), (1, False),
               (2, False))
"""MiCS's shard size and hierarchical gather on 4 Polaris nodes (16 ranks): a node, two
nodes and every rank, flat and hierarchical, and groups smaller than a node."""
UNMANAGED_LAYOUTS = ((3, "cpu", "none"), (3, "cpu", "cpu"), (3, "none", "cpu"),
                     (3, "none", "none"), (2, "cpu", "none"), (2, "none", "none"))
"""Unmanaged gradient accumulation (0.19.5) where zerosim replays it: ZeRO-3 with the
optimizer, the parameters, both or nothing offloaded, ZeRO-2 with the optimizer or nothing
offloaded."""
ULYSSES_LAYOUTS = ((1, 8, 1), (2, 16, 2), (1, 4, 4), (2, 8, 8), (4, 4, 16))
"""Ulysses (0.19.5) for Llama-3.1-8B on DGX H100 nodes: (nodes, group size, sequence length in
units of 16K tokens): a group a node, one across two nodes (K and V replicated to its 16
ranks), two groups a node."""
ULYSSES_MODES = ((3, "cpu", "none"), (3, "cpu", "cpu"), (3, "none", "none"), (2, "cpu", "none"),
                 (1, "none", "none"))
"""ZeRO stages and what each offloads (optimizer, parameters) under Ulysses."""
ALST_TRICKS = ((1, None, None, False), ("auto", None, None, False), (None, "auto", None, False),
               ("auto", "auto", 3, True), (2, 5, 1, True))
"""Arctic Long Sequence Training's tricks (0.19.5, Llama-3.1-8B over a DGX H100's 8 GPUs):
(tiled MLP slices, tiled loss slices, micro-batch or None for 1, block inputs in host
memory)."""
LIGER_SEQUENCES = (8192, 65536)
"""Liger-Kernel (0.19.5, Llama-3.1-8B over a DGX H100's 8 GPUs, data parallel): sequence
lengths, each in every `ULYSSES_MODES` layout without and with the tiled MLP; and over Ulysses
groups of eight at 128K and 512K tokens, with the tiled MLP and host checkpoints."""
PACKED_DOCUMENTS = (1, 1000, 65536)
"""`document_length` of packed documents (a token each, a conversation's length, the whole
sequence of the 64K run) on the ALST and Ulysses scenarios."""
PEER_TRANSPORTS = ("shm", "pcie_p2p", "nvlink")
"""What carries the ring on the four-RTX-4090 workstation (`intra_node.transport`), each at
micro-batches 1 and 4 and with the parameters offloaded too, and behind PCIe switches of two
and four GPUs (`pcie.gpus_per_switch`)."""
ZERO_PLUS_PLUS_PARTS = tuple((hpz, qwz, qgz) for hpz in (1, 2, 4, 8) for qwz in (False, True)
                             for qgz in (False, True) if hpz > 1 or qwz or qgz)
"""hpZ's group, qwZ and qgZ: every combination with at least one of them."""


def cases(quick: bool) -> list[tuple[Path, dict]]:
    """(scenario file, overrides) for every configuration to run."""
    files = sorted(POLARIS.glob("*.yaml"))
    if quick:
        files = files[::4]
    out = [(f, {"hardware": hw, "runtime.bind_cores_to_rank": bound})
           for f in files for hw in ("polaris-a100", "h100-jlse") for bound in (True, False)]
    for name in FORK_MODELS[:2] if quick else FORK_MODELS:
        for hw in ("polaris-a100", "h100-jlse"):
            for build in FORK_BUILDS[:1] if quick else FORK_BUILDS:
                for flush in (True, False):
                    for gap in range(5):
                        overrides = {"hardware": hw, "runtime.deepspeed_version": build,
                                     OFFLOAD + "part_grads_async": flush}
                        if gap:
                            overrides |= {OFFLOAD + "prefetch_optimizer": True,
                                          OFFLOAD + "prefetch_optimizer_gap": gap}
                        out.append((POLARIS / f"{name}.yaml", overrides))
    nvme_runs = sorted(H100_NVME.glob("*.yaml"))
    for path in nvme_runs[:2] if quick else nvme_runs:
        out += [(path, {REDUCE_SCATTER: reduce_scatter}) for reduce_scatter in (True, False)]
    out += [(POLARIS / f"{name}.yaml", {REDUCE_SCATTER: False})
            for name in (FORK_MODELS[:2] if quick else FORK_MODELS)]
    releases = sorted({row.since for row in BEHAVIOURS if row.since >= (0, 13, 3)})
    for since in releases[::3] if quick else releases:
        for stage, device in ((1, "cpu"), (2, "cpu"), (2, "none"), (3, "cpu")):
            for accumulation in (1, 2):
                out.append((POLARIS / f"{MULTI_NODE_MODELS[0]}.yaml", {
                    "runtime.deepspeed_version": format_version(since),
                    "deepspeed.zero_optimization.stage": stage, OFFLOAD + "device": device,
                    "deepspeed.gradient_accumulation_steps": accumulation}))
    for since in releases[::3] if quick else releases:
        for optimizer in ("cpu", "none"):
            for dp in (1, 4):
                out.append((POLARIS / f"{MULTI_NODE_MODELS[0]}.yaml", {
                    "runtime.deepspeed_version": format_version(since), "data_parallel": dp,
                    OFFLOAD + "device": optimizer, PARAMS + "device": "cpu",
                    PARAMS + "pin_memory": True, "deepspeed.optimizer.params.torch_adam":
                    optimizer == "none" and dp == 4}))
    zenflow_releases = [since for since in releases if since >= (0, 17, 5)]
    for since in zenflow_releases[::3] if quick else zenflow_releases:
        for stage in (1, 2):
            for overlap in (True, False):
                for dp in (1, 4):
                    out.append((POLARIS / f"{MULTI_NODE_MODELS[0]}.yaml", {
                        "runtime.deepspeed_version": format_version(since), "data_parallel": dp,
                        "deepspeed.zero_optimization.stage": stage, OFFLOAD + "device": "cpu",
                        "deepspeed.zero_optimization.overlap_comm": True,
                        "deepspeed.zero_optimization.zenflow": {
                            "update_interval": 4, "overlap_step": overlap, "offload": dp == 4}}))
    superoffload_releases = [since for since in releases if since >= (0, 18, 9)]
    for since in superoffload_releases[::3] if quick else superoffload_releases:
        for clip in (0.0, 1.0):
            for ratio in (1.0, 0.9):
                for dp, bound in ((1, False), (4, False), (4, True)):
                    out.append((POLARIS / f"{MULTI_NODE_MODELS[0]}.yaml", {
                        "runtime.deepspeed_version": format_version(since), "data_parallel": dp,
                        "runtime.bind_cores_to_rank": bound, "hardware": "h100-jlse",
                        "deepspeed.gradient_clipping": clip, OFFLOAD + "ratio": ratio,
                        OFFLOAD + "super_offload": True, PARAMS + "device":
                        "cpu" if dp == 4 and not bound else "none"}))
    master_releases = [since for since in releases if since >= (0, 18, 3)]
    for since in master_releases[::3] if quick else master_releases:
        for stage, device, params, ratio in (
                (1, "cpu", "none", 1.0), (2, "cpu", "none", 1.0), (3, "cpu", "none", 1.0),
                (3, "cpu", "none", 0.5), (3, "cpu", "cpu", 1.0), (2, "none", "none", 1.0),
                (3, "none", "none", 1.0)):
            for states in (False, True):
                if device == "none" and not states:
                    continue  # DeepSpeed asks for bf16 moments with the optimizer on the GPU
                for hw in ("polaris-a100", "h100-jlse"):
                    out.append((POLARIS / f"{MULTI_NODE_MODELS[0]}.yaml", {
                        "runtime.deepspeed_version": format_version(since), "hardware": hw,
                        "deepspeed.zero_optimization.stage": stage, OFFLOAD + "device": device,
                        OFFLOAD + "ratio": ratio, PARAMS + "device": params,
                        "deepspeed.gradient_accumulation_steps": 2,
                        "deepspeed.bf16.bf16_master_weights_and_grads": True,
                        "deepspeed.bf16.bf16_optimizer_states": states}))
    for since in master_releases[::3] if quick else master_releases:
        for stage, params in ((1, "none"), (2, "none"), (3, "none"), (3, "cpu")):
            for fp32_states in (True, False):
                out.append((POLARIS / f"{MULTI_NODE_MODELS[0]}.yaml", {
                    "runtime.deepspeed_version": format_version(since), "hardware": "h100-jlse",
                    "deepspeed.bf16.enabled": False, "deepspeed.fp16.enabled": True,
                    "deepspeed.zero_optimization.stage": stage, OFFLOAD + "device": "cpu",
                    PARAMS + "device": params, "deepspeed.gradient_accumulation_steps": 2,
                    "deepspeed.fp16.fp16_master_weights_and_grads": True,
                    "deepspeed.optimizer.params.fp32_optimizer_states": fp32_states}))
    for model in HF_MODELS[::2] if quick else HF_MODELS:
        layouts = ((("fused", "hooked"), ("per_expert", "hooked"), ("per_expert", "leaf"))
                   if model.startswith("Mixtral") else (("fused", "hooked"),))
        for experts, block in layouts:
            for hw in ("polaris-a100", "dgx-h100"):
                for params in (False, True):
                    out.append((POLARIS / f"{MULTI_NODE_MODELS[0]}.yaml", {
                        "model": {"hf_config": str(REAL_MODELS / model / "config.json")},
                        "runtime.framework": "hf-transformers", "hardware": hw,
                        "stack.modules.experts.value": experts,
                        "stack.modules.moe_block.value": block,
                        "deepspeed.train_micro_batch_size_per_gpu": 1,
                        PARAMS + "device": "cpu" if params else "none"}))
    for fields in INLINE_MODELS.values():
        for attention in ("eager", "flash"):
            for experts in ("fused", "per_expert") if "n_routed_experts" in fields else ("fused",):
                out.append((POLARIS / f"{MULTI_NODE_MODELS[0]}.yaml", {
                    "model": fields, "runtime.framework": "hf-transformers",
                    "hardware": "dgx-h100", "attention": attention,
                    "stack.modules.experts.value": experts,
                    "deepspeed.train_micro_batch_size_per_gpu": 1}))
    for model, framework in LEAF_MODELS[::2] if quick else LEAF_MODELS:
        for threshold in LEAF_THRESHOLDS[::2] if quick else LEAF_THRESHOLDS:
            for checkpointing, params in ((False, False), (True, False), (True, True)):
                out.append((POLARIS / f"{MULTI_NODE_MODELS[0]}.yaml", {
                    "model": model, "runtime.framework": framework,
                    "runtime.deepspeed_version": "0.19.5", "hardware": "dgx-h100",
                    "activation_checkpointing": checkpointing,
                    "deepspeed.train_micro_batch_size_per_gpu": 1,
                    "deepspeed.zero_optimization.module_granularity_threshold": threshold,
                    PARAMS + "device": "cpu" if params else "none"}))
    for since in ZERO_PLUS_PLUS_RELEASES[::2] if quick else ZERO_PLUS_PLUS_RELEASES:
        for hpz, qwz, qgz in ZERO_PLUS_PLUS_PARTS:
            for params in (False, True):
                out.append((POLARIS / f"{MULTI_NODE_MODELS[0]}.yaml", {
                    "hardware": {"profile": "polaris-a100", "overrides": {"nodes": 2}},
                    "data_parallel": 8, "runtime.deepspeed_version": format_version(since),
                    "deepspeed.train_micro_batch_size_per_gpu": 1,
                    "deepspeed.gradient_accumulation_steps": 2,
                    "deepspeed.zero_optimization.zero_hpz_partition_size": hpz,
                    "deepspeed.zero_optimization.zero_quantized_weights": qwz,
                    "deepspeed.zero_optimization.zero_quantized_gradients": qgz,
                    PARAMS + "device": "cpu" if params else "none"}))
    for since in LOCO_RELEASES:
        for hpz in (1, 4):
            for params in (False, True):
                out.append((POLARIS / f"{MULTI_NODE_MODELS[0]}.yaml", {
                    "hardware": {"profile": "polaris-a100", "overrides": {"nodes": 2}},
                    "data_parallel": 8, "runtime.deepspeed_version": format_version(since),
                    "deepspeed.train_micro_batch_size_per_gpu": 1,
                    "deepspeed.zero_optimization.zero_hpz_partition_size": hpz,
                    "deepspeed.zero_optimization.zero_quantized_gradients": True,
                    "deepspeed.zero_optimization.zeropp_loco_param": {"err_beta": 0.8,
                                                                      "reset_T": 1024},
                    PARAMS + "device": "cpu" if params else "none"}))
    for since in MICS_RELEASES[::2] if quick else MICS_RELEASES:
        for shard, hierarchical in MICS_GROUPS:
            for micro_batch in (1, 4):
                out.append((POLARIS / f"{MULTI_NODE_MODELS[0]}.yaml", {
                    "hardware": {"profile": "polaris-a100", "overrides": {"nodes": 4}},
                    "data_parallel": 16, "runtime.deepspeed_version": format_version(since),
                    "deepspeed.train_micro_batch_size_per_gpu": micro_batch,
                    "deepspeed.gradient_accumulation_steps": 2,
                    "deepspeed.zero_optimization.offload_optimizer.device": "none",
                    "deepspeed.zero_optimization.mics_shard_size": shard,
                    "deepspeed.zero_optimization.mics_hierarchical_params_gather":
                        hierarchical}))
    for nodes, size, sixteen_k in ULYSSES_LAYOUTS[::2] if quick else ULYSSES_LAYOUTS:
        for stage, optimizer, params in ULYSSES_MODES:
            out.append((ROOT / "scenarios" / "llama8b_ulysses_dgx_h100.yaml", {
                "hardware": {"profile": "dgx-h100", "overrides": {"nodes": nodes}},
                "data_parallel": 8 * nodes, "sequence_length": 16384 * sixteen_k,
                "deepspeed.sequence_parallel_size": size,
                "deepspeed.zero_optimization.stage": stage,
                "deepspeed.zero_optimization.offload_optimizer.device": optimizer,
                PARAMS + "device": params}))
    for mlp, loss, micro_batch, in_host in ALST_TRICKS[::2] if quick else ALST_TRICKS:
        for stage, sixteen_k in ((3, 8), (3, 64), (2, 8)):
            out.append((ROOT / "scenarios" / "llama8b_alst_dgx_h100.yaml", {
                "sequence_length": 16384 * sixteen_k, "deepspeed.zero_optimization.stage": stage,
                "deepspeed.train_micro_batch_size_per_gpu": micro_batch or 1,
                "runtime.tiled_mlp_shards": mlp, "runtime.tiled_loss_shards": loss,
                "runtime.checkpoint_in_cpu": in_host}))
    for length in LIGER_SEQUENCES[:1] if quick else LIGER_SEQUENCES:
        for stage, optimizer, params in ULYSSES_MODES:
            for mlp in (None, "auto"):
                out.append((ROOT / "scenarios" / "llama8b_liger_dgx_h100.yaml", {
                    "sequence_length": length, "deepspeed.zero_optimization.stage": stage,
                    "deepspeed.zero_optimization.offload_optimizer.device": optimizer,
                    PARAMS + "device": params, "runtime.tiled_mlp_shards": mlp}))
    for sixteen_k in (8, 32):
        out.append((ROOT / "scenarios" / "llama8b_liger_dgx_h100.yaml", {
            "sequence_length": 16384 * sixteen_k, "deepspeed.sequence_parallel_size": 8,
            "runtime.tiled_mlp_shards": "auto", "runtime.checkpoint_in_cpu": True}))
    for documents in PACKED_DOCUMENTS:
        out.append((ROOT / "scenarios" / "llama8b_alst_dgx_h100.yaml",
                    {"document_length": documents}))
        out.append((ROOT / "scenarios" / "llama8b_ulysses_dgx_h100.yaml",
                    {"document_length": documents, "deepspeed.sequence_parallel_size": 4,
                     "sequence_length": 65536}))
    for transport in PEER_TRANSPORTS[:1] if quick else PEER_TRANSPORTS:
        for micro_batch, params in ((1, "none"), (4, "none"), (1, "cpu")):
            out.append((ROOT / "scenarios" / "llama8b_rtx4090_workstation.yaml", {
                "hardware.intra_node.transport": transport,
                "deepspeed.train_micro_batch_size_per_gpu": micro_batch,
                PARAMS + "device": params}))
        for per_switch in (2, 4):
            out.append((ROOT / "scenarios" / "llama8b_rtx4090_workstation.yaml", {
                "hardware.intra_node.transport": transport,
                "hardware.pcie.gpus_per_switch": per_switch,
                "deepspeed.train_micro_batch_size_per_gpu": 1, PARAMS + "device": "cpu"}))
    for name in ("qwen2.5-7b-4x4090", "qwen2.5-3b-1x4090-zero2"):
        out.append((ROOT / "scenarios" / "llmq" / f"{name}.yaml", {}))
    for name in MULTI_NODE_MODELS[:1] if quick else MULTI_NODE_MODELS:
        for nodes, size in ((1, 2), (1, 4), (2, 8)):
            for release in ("0.13.3", "0.14.4"):
                out.append((POLARIS / f"{name}.yaml", {
                    "hardware": {"profile": "polaris-a100", "overrides": {"nodes": nodes}},
                    "data_parallel": 4 * nodes, "runtime.deepspeed_version": release,
                    "deepspeed.sequence_parallel_size": size}))
    for stage, optimizer, params in UNMANAGED_LAYOUTS:
        for accumulation in (1, 4):
            out.append((POLARIS / f"{MULTI_NODE_MODELS[1]}.yaml", {
                "runtime.deepspeed_version": "0.19.5",
                "deepspeed.managed_gradient_accumulation": False,
                "deepspeed.gradient_accumulation_steps": accumulation,
                "deepspeed.zero_optimization.stage": stage,
                "deepspeed.zero_optimization.offload_optimizer.device": optimizer,
                PARAMS + "device": params}))
    for name in MULTI_NODE_MODELS[:1] if quick else MULTI_NODE_MODELS:
        for hw in ("polaris-a100", "h100-jlse"):
            for micro_batch, params, synchronize in ((1, False, False), (4, False, True),
                                                     (4, True, False), (16, False, False)):
                out.append((POLARIS / f"{name}.yaml", {
                    "hardware": hw, "activation_checkpointing": True,
                    "runtime.checkpoint_in_cpu": True,
                    "runtime.synchronize_each_layer": synchronize,
                    "deepspeed.train_micro_batch_size_per_gpu": micro_batch,
                    PARAMS + "device": "cpu" if params else "none"}))
    for profile, alternative in shipped_alternatives():
        for name in FORK_MODELS[:1] if quick else FORK_MODELS:
            for gap in (0, 3):
                overrides = {"hardware": profile, "hardware.alternative": alternative,
                             "runtime.deepspeed_version": FORK_BUILDS[0],
                             "runtime.bind_cores_to_rank": True}
                if gap:
                    overrides |= {OFFLOAD + "prefetch_optimizer": True,
                                  OFFLOAD + "prefetch_optimizer_gap": gap}
                out.append((POLARIS / f"{name}.yaml", overrides))
    for name in MULTI_NODE_MODELS:
        for nodes in (2, 4) if quick else (2, 4, 8, 16):
            for micro_batch in (1, 4):
                out.append((POLARIS / f"{name}.yaml", {
                    "hardware": {"profile": "polaris-a100", "overrides": {"nodes": nodes}},
                    "data_parallel": 4 * nodes,
                    "deepspeed.train_micro_batch_size_per_gpu": micro_batch}))
    return out


def shipped_alternatives() -> list[tuple[str, str]]:
    """(profile, alternative) for every alternative reading a shipped profile declares."""
    from zerosim.hardware.profile import load_profile, profile_names

    return [(name, alternative.name) for name in profile_names()
            for alternative in load_profile(name).alternatives]


def _misfit(oom: dict) -> str:
    """Where a configuration ran out of memory, whatever the layer: the device, the kind of
    allocation and the module that did not fit."""
    allocation = re.sub(r"layers\.\d+\.", "", oom["allocation"])
    return f"{oom['device']} {oom['category']} ({allocation})"


def _short_GiB(oom: dict) -> float:
    """How far the allocation that did not fit takes its device past its capacity: a
    configuration a fraction of a GiB over sits within the memory model's error."""
    return oom["in_use_GiB"] + oom["requested_GiB"] - oom["capacity_GiB"]


def _path_fault(result) -> str | None:
    """What is wrong with the critical path of the reported rank's phases, if anything: each
    phase's steps must run from its start to its end without a gap or an overlap."""
    path = result.critical_path
    phases = result.phases[result.phases["rank"] == path["rank"].iloc[0]] if len(path) else []
    for row in getattr(phases, "itertuples", lambda: ())():
        steps = path[(path.phase == row.phase) & (path.micro_batch == row.micro_batch)]
        starts, ends = steps.start_s.tolist(), steps.end_s.tolist()
        if not steps.empty and (starts[0] != row.start_s or ends[-1] != row.end_s
                                or starts[1:] != ends[:-1]):
            return f"the critical path of {row.phase} {row.micro_batch} does not tile it"
        if steps.empty and row.end_s > row.start_s:
            return f"{row.phase} {row.micro_batch} has no critical path"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="about a quarter of the cases")
    parser.add_argument("--full", action="store_true",
                        help="keep every record (zerosim.simulate, as `zerosim run` with its "
                             "files) and check that each phase's critical path tiles it")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    todo = cases(args.quick)
    statuses: Counter[str] = Counter()
    refusals: Counter[str] = Counter()
    misfits: dict[str, list[str]] = {}
    short: dict[str, list[float]] = {}
    crashes: list[str] = []
    started = time.perf_counter()
    for path, overrides in todo:
        label = f"{path.stem} {overrides}"
        try:
            if args.full:
                result = zerosim.simulate(path, overrides=overrides)
                summary = result.summary
                if summary["status"] == "ok" and (fault := _path_fault(result)):
                    crashes.append(f"{label}\n{fault}")
            else:
                summary = simulate_summary(path, overrides)
        except ZerosimError as error:
            refusals[str(error).splitlines()[0].split(": ", 1)[-1]] += 1
            continue
        except Exception:  # a crash is what this script looks for
            crashes.append(f"{label}\n{traceback.format_exc(limit=4)}")
            continue
        statuses[summary["status"]] += 1
        if summary["status"] == "oom":
            misfits.setdefault(_misfit(summary["oom"]), []).append(label)
            short.setdefault(_misfit(summary["oom"]), []).append(_short_GiB(summary["oom"]))
        times = [v for v in summary["phases_s"].values() if v is not None]
        if summary["status"] == "ok" and not all(math.isfinite(v) and v >= 0 for v in times):
            crashes.append(f"{label}\nnon-finite or negative phase time: {summary['phases_s']}")
    print(f"{len(todo)} cases in {time.perf_counter() - started:.0f} s: "
          + ", ".join(f"{n} {status}" for status, n in sorted(statuses.items()))
          + f", {sum(refusals.values())} refused, {len(crashes)} crashed")
    for message, n in refusals.most_common():
        print(f"  refused x{n}: {message}")
    for where, labels in sorted(misfits.items(), key=lambda item: -len(item[1])):
        over = short[where]
        print(f"  did not fit x{len(labels)}: {where}, {min(over):.2f}-{max(over):.2f} GiB "
              f"over; first: {labels[0]}")
    for crash in crashes:
        print(f"CRASH {crash}")
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
