"""Does every hardware and stack value move the prediction the way its physics allows?

Run: `python benchmarks/physics.py [--quick] [--step 0.1] [--workers 2]`. For configurations
shaped like the ones zerosim's predictions are judged on (the study's three, Polaris runs at
DP=1 and DP=4 on both testbeds, bound and unbound, the Deep Optimizer States fork's
asynchronous flush and interleaved update, two and eight Polaris nodes, the MLP-Offload NVMe
run, ZeRO-2 Offload on a DGX A100 and ZenFlow there, SuperOffload on a GH200 as 0.18.9 and
0.18.0 run it, bf16 master weights (and moments) on bound Polaris ranks and on the DGX A100,
the parameters offloaded on the H200 VM, the seed's 64 p4d nodes, a mixture of experts on a DGX
H100, TinyLlama's decoder layers as ZeRO-3 leaves on the H200 VM, fp16 master weights and
moments on the study's node, ZeRO++'s hpZ and qwZ on four Polaris nodes, checkpointed block
inputs in host memory on the study's node, Ulysses on the HF blog's Qwen3-4B and over packed
documents, four RTX 4090s whose ring goes through host memory, alone on their links and
behind one PCIe switch), it runs `zerosim sensitivity`
(each value of the profile and the stack moved by --step both ways, one at a time) and checks
the sign of the iteration's elasticity against `zerosim.sensitivity.expected_sign`: a larger
bandwidth, rate, clock, efficiency or thread count may only shorten the iteration; a larger
latency, fixed cost, host time or contention may only lengthen it. A value that moves it the
other way by `SHOWN_ELASTICITY` (0.005% per 1%) or more is listed with its case; contention can
make that real (a copy that ends sooner runs into a kernel it missed before), but rarely by
much, so a large one is where to look for a fault in the engine. The exit status is 1 if any is
listed. No time is asserted here: the figures are the elasticities, and the tests hold the
exact ones.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

from zerosim.sensitivity import SHOWN_ELASTICITY, expected_sign, sensitivity

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
POLARIS = SCENARIOS / "calibration" / "polaris"
OFFLOAD = "deepspeed.zero_optimization.offload_optimizer."
FORK = {"runtime.deepspeed_version": "0.13.3+4570a955"}
BF16_MASTER = {"runtime.deepspeed_version": "0.19.5",
               "deepspeed.bf16.bf16_master_weights_and_grads": True}
POLARIS_NODES = {"hardware": {"profile": "polaris-a100", "overrides": {"nodes": 8}},
                 "data_parallel": 32}
ZERO = "deepspeed.zero_optimization."
ZERO_PLUS_PLUS_NODES = {"hardware.overrides.nodes": 4, "data_parallel": 16,
                        "runtime.deepspeed_version": "0.19.5",
                        "deepspeed.train_micro_batch_size_per_gpu": 1,
                        "deepspeed.gradient_accumulation_steps": 4}
CASES: tuple[tuple[str, Path, dict], ...] = (
    ("study DP=1", SCENARIOS / "llama13b_dp1.yaml", {}),
    ("study DP=4", SCENARIOS / "llama13b_dp4.yaml", {}),
    ("Polaris 11.20B DP=1 mb 4", POLARIS / "polaris-11.20b-dp1-mb4-ga1-sg1e08.yaml", {}),
    ("Polaris 5.95B DP=4 mb 1, bound", POLARIS / "polaris-5.95b-dp4-mb1-ga1-sg1e08.yaml", {}),
    ("H100 node 5.90B DP=4, bound", POLARIS / "polaris-5.90b-dp4-mb4-ga1-sg1e08.yaml",
     {"hardware": "h100-jlse", "runtime.bind_cores_to_rank": True}),
    ("fork, interleaved gap 3", SCENARIOS / "polaris_dos.yaml", {}),
    ("study DP=2", SCENARIOS / "llama13b_dp2.yaml", {}),
    ("Polaris 5.90B DP=4 mb 4", POLARIS / "polaris-5.90b-dp4-mb4-ga1-sg1e08.yaml", {}),
    ("Polaris 11.20B DP=1 mb 4, GA 4", POLARIS / "polaris-11.20b-dp1-mb4-ga4-sg1e08.yaml", {}),
    ("H100 node 11.20B DP=1", POLARIS / "polaris-11.20b-dp1-mb4-ga1-sg1e08.yaml",
     {"hardware": "h100-jlse"}),
    ("H100 node 5.90B DP=4, unbound", POLARIS / "polaris-5.90b-dp4-mb4-ga1-sg1e08.yaml",
     {"hardware": "h100-jlse"}),
    ("fork, asynchronous flush", POLARIS / "polaris-5.95b-dp4-mb1-ga1-sg1e08.yaml",
     FORK | {OFFLOAD + "part_grads_async": True}),
    ("fork, async flush + gap 2", POLARIS / "polaris-5.90b-dp4-mb4-ga1-sg1e08.yaml",
     FORK | {OFFLOAD + "part_grads_async": True, OFFLOAD + "prefetch_optimizer": True,
             OFFLOAD + "prefetch_optimizer_gap": 2}),
    ("2 Polaris nodes", SCENARIOS / "polaris_2nodes.yaml", {}),
    ("8 Polaris nodes, mb 1", POLARIS / "polaris-9.14b-dp4-mb1-ga1-sg1e08.yaml", POLARIS_NODES),
    ("H100 node, optimizer on NVMe",
     SCENARIOS / "calibration" / "h100_nvme" / "mlp-offload-44.28b-dp4-mb1-ga1-sg1e08-bound.yaml",
     {}),
    ("ZeRO-2 Offload, DGX A100", SCENARIOS / "dgx_a100_offload" / "qwen2.5-3b.yaml", {}),
    ("ZenFlow, DGX A100", SCENARIOS / "dgx_a100_offload" / "qwen2.5-3b-zenflow.yaml", {}),
    ("SuperOffload, GH200", SCENARIOS / "gh200" / "qwen3-14b-superoffload.yaml", {}),
    ("SuperOffload 0.18.0, GH200", SCENARIOS / "gh200" / "qwen3-14b-superoffload.yaml",
     {"runtime.deepspeed_version": "0.18.0"}),
    ("bf16 master and moments, Polaris bound",
     POLARIS / "polaris-5.95b-dp4-mb1-ga1-sg1e08.yaml", BF16_MASTER | {
         "runtime.bind_cores_to_rank": True, "deepspeed.bf16.bf16_optimizer_states": True}),
    ("bf16 master, ZeRO-2 Offload, DGX A100",
     SCENARIOS / "dgx_a100_offload" / "qwen2.5-3b.yaml", BF16_MASTER),
    ("parameters offloaded, H200", SCENARIOS / "h200_vm" / "llama3b_param.yaml", {}),
    ("64 p4d nodes", SCENARIOS / "seed003" / "roberta10b_p4d64.yaml", {}),
    ("MoE on a DGX H100", SCENARIOS / "qwen3_moe_dgx_h100.yaml", {}),
    ("decoder layers as ZeRO-3 leaves, H200", SCENARIOS / "h200_vm" / "tinyllama_hooks.yaml",
     {"deepspeed.zero_optimization.module_granularity_threshold": 4 * 10**6}),
    ("fp16 master and moments, study DP=4", SCENARIOS / "llama13b_dp4.yaml",
     {"runtime.deepspeed_version": "0.19.5", "deepspeed.fp16.fp16_master_weights_and_grads": True,
      "deepspeed.optimizer.params.fp32_optimizer_states": False}),
    ("hpZ per node, 4 Polaris nodes, mb 1", SCENARIOS / "polaris_2nodes.yaml",
     ZERO_PLUS_PLUS_NODES | {ZERO + "zero_hpz_partition_size": 4}),
    ("qwZ, 4 Polaris nodes, mb 1", SCENARIOS / "polaris_2nodes.yaml",
     ZERO_PLUS_PLUS_NODES | {ZERO + "zero_quantized_weights": True}),
    ("qgZ, 4 Polaris nodes, mb 1", SCENARIOS / "polaris_2nodes.yaml",
     ZERO_PLUS_PLUS_NODES | {ZERO + "zero_quantized_gradients": True}),
    ("qgZ with LoCo, 4 Polaris nodes, mb 1", SCENARIOS / "polaris_2nodes.yaml",
     ZERO_PLUS_PLUS_NODES | {ZERO + "zero_quantized_gradients": True,
                             ZERO + "zeropp_loco_param": {"err_beta": 0.8, "reset_T": 1024}}),
    ("MiCS, groups of two nodes, hierarchical, 4 Polaris nodes, mb 1",
     SCENARIOS / "polaris_2nodes.yaml",
     ZERO_PLUS_PLUS_NODES | {ZERO + "offload_optimizer.device": "none",
                             ZERO + "mics_shard_size": 8,
                             ZERO + "mics_hierarchical_params_gather": True}),
    ("unmanaged accumulation, study DP=4, 0.19.5", SCENARIOS / "llama13b_dp4.yaml",
     {"runtime.deepspeed_version": "0.19.5", "deepspeed.managed_gradient_accumulation": False}),
    ("Ulysses over 8 H100s, 128K tokens", SCENARIOS / "llama8b_ulysses_dgx_h100.yaml", {}),
    ("ALST over 8 H100s, 256K tokens", SCENARIOS / "llama8b_alst_dgx_h100.yaml",
     {"sequence_length": 262144}),
    ("DistributedAttention over a Polaris node", POLARIS / "polaris-5.90b-dp4-mb4-ga1-sg1e08.yaml",
     {"deepspeed.sequence_parallel_size": 4}),
    ("Liger-Kernel over 8 H100s, 32K tokens", SCENARIOS / "llama8b_liger_dgx_h100.yaml", {}),
    ("Qwen3-4B, Ulysses over 4 H100s, 96K tokens (the HF blog's)",
     SCENARIOS / "qwen3_4b_ulysses_h100.yaml", {}),
    ("Ulysses over 8 H100s, 128K tokens of packed 4K documents",
     SCENARIOS / "llama8b_ulysses_dgx_h100.yaml", {"document_length": 4096}),
    ("4x RTX 4090 workstation, ring through host memory, mb 1 at 512 tokens",
     SCENARIOS / "llama8b_rtx4090_workstation.yaml",
     {"sequence_length": 512, "deepspeed.train_micro_batch_size_per_gpu": 1,
      "deepspeed.gradient_accumulation_steps": 1}),
    ("4x RTX 4090 behind one PCIe switch, parameters offloaded, mb 1 at 512 tokens",
     SCENARIOS / "llama8b_rtx4090_workstation.yaml",
     {"sequence_length": 512, "deepspeed.train_micro_batch_size_per_gpu": 1,
      "deepspeed.gradient_accumulation_steps": 1, "hardware.pcie.gpus_per_switch": 4,
      "deepspeed.zero_optimization.offload_param.device": "cpu"}),
    ("checkpoints in host memory, study DP=4", SCENARIOS / "llama13b_dp4.yaml",
     {"activation_checkpointing": True, "deepspeed.train_micro_batch_size_per_gpu": 8,
      "runtime.checkpoint_in_cpu": True, "runtime.synchronize_each_layer": True}),
)
QUICK = 6
"""`--quick` runs the first cases only."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"the first {QUICK} cases only")
    parser.add_argument("--step", type=float, default=0.1, help="relative step (default 0.1)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    cases = CASES[:QUICK] if args.quick else CASES
    started = time.perf_counter()
    checked = runs = 0
    flagged: list[tuple[str, str, float]] = []
    closest: dict[str, tuple[float, str]] = {}
    """Per value, the elasticity nearest to the wrong side over every case, and its case."""
    print(f"{'case':34s} {'values':>6s} {'signed':>6s} {'runs':>5s} {'s':>5s}  against physics")
    for label, path, overrides in cases:
        case_started = time.perf_counter()
        outcome = sensitivity(path, overrides=overrides, step=args.step, workers=args.workers)
        signed = [r for r in outcome.rows
                  if expected_sign(r.key) and r.iteration is not None]
        for row in signed:
            drift = row.iteration * expected_sign(row.key)
            if row.key not in closest or drift < closest[row.key][0]:
                closest[row.key] = (drift, label)
        against = outcome.against_physics()
        flagged += [(label, row.key, row.iteration) for row in against]
        checked += len(signed)
        runs += outcome.runs
        listed = ", ".join(f"{row.key} {row.iteration:+.4f}" for row in against) or "none"
        print(f"{label:34s} {len(outcome.rows):6d} {len(signed):6d} {outcome.runs:5d} "
              f"{time.perf_counter() - case_started:5.1f}  {listed}", flush=True)
    print(f"{len(cases)} cases, {runs} runs in {time.perf_counter() - started:.0f} s: "
          f"{checked} signed elasticities of the iteration, {len(flagged)} against physics "
          f"by {SHOWN_ELASTICITY} per 1% or more")
    wrong_way = sorted(((drift, key, label) for key, (drift, label) in closest.items()
                        if drift < 0), reverse=False)
    if wrong_way:
        print("values that ever moved the iteration the wrong way, however little "
              "(elasticity x expected sign; negative is the wrong way):")
        for drift, key, label in wrong_way:
            print(f"  {key:48s} {drift:+.6f}  {label}")
    return 1 if flagged else 0


if __name__ == "__main__":
    sys.exit(main())
