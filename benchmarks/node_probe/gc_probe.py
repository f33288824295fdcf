"""What DeepSpeed's `memory_breakdown` costs a training loop: rank 0's `gc.collect()`.

With `memory_breakdown` on, DeepSpeed's engine calls `see_memory_usage(..., force=True)` before
and after each forward and backward and before and after each optimizer step (runtime/engine.py,
0.13.3 as later); on rank 0 it begins with `gc.collect()`, a full collection, whose time is
that of a walk over every object the collector tracks. This probe builds the training process a
run has, on the CPU (DeepSpeed's CPU accelerator, gloo, one rank), at toy widths (hidden 64)
with 2, 22, 44 and 72 layers, trains three steps under ZeRO-3 (`--stage 2`: ZeRO-2, the
parameters replicated), then counts the tracked objects (`len(gc.get_objects())`) and times
`gc.collect()` (median of nine). What grows with the layers grows with the parameter tensors
(the modules that own them, their gradients and optimizer state, and under ZeRO-3 DeepSpeed's
attributes and hooks on each), so the objects are stated as a count besides the model and a
count per parameter tensor (least squares over the four processes); the widths change
neither.

* `--stack megatron-deepspeed`: Megatron-DeepSpeed at the revision of the Deep Optimizer
  States runs (a checkout of mauryaavinash95/Megatron-DeepSpeed at 1df5712, `--megatron`),
  with DeepSpeed 0.13.3 and the optimizer offloaded, built by its own
  `setup_model_and_optimizer` with the runs' model flags (`my-llama2-cmd.sh`: SwiGLU,
  RMSNorm, rotary, untied embeddings, no biases, grouped KV heads, `--checkpoint-activations
  --deepspeed-activation-checkpointing`). On a machine
  without CUDA, DeepSpeed 0.13.3 and that revision need stand-ins, set up by `_cpu_shims`
  before anything is imported: empty `intel_extension_for_pytorch` and
  `oneccl_bindings_for_pytorch` modules (0.13.3's CPU accelerator imports them; gloo serves
  one rank), the two names 0.13.3's elastic agent imports from torch, a null CUDA stream for
  the accelerator's `Stream` and `current_stream` (ZeRO-3's fetch and the activation
  checkpointing use them), a flash-attention builder that fails as Megatron expects where
  there is none, apex's `MixedFusedRMSNorm` as a module of one weight (the runs had apex),
  and torchvision's operator registrations (its PyPI wheel cannot load them on a CPU build
  of torch; Megatron imports only its transforms). Megatron compiles its dataset helpers at
  start: pybind11 must be importable by the `python3` on PATH.
* `--stack hf-transformers`: transformers' LlamaForCausalLM with TinyLlama's module structure
  and DeepSpeed as installed (0.19.5 for the measurement shipped), the ds_config of
  ds_offload_probe.py's `tinyshape_cpu_hooks` run (nothing offloaded, a client AdamW).

    python3 gc_probe.py --stack hf-transformers --out gc_hf.json    # --stage 2: ZeRO-2
    PATH=$VENV/bin:$PATH python3 gc_probe.py --stack megatron-deepspeed \\
        --megatron /path/to/Megatron-DeepSpeed --out gc_megatron.json

A minute or two each. The object counts are the code's; the time per object is the machine's
(its memory more than its clock: it is fitted on each testbed's runs, see
scenarios/calibration/README.md).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
LAYERS = (2, 22, 44, 72)
COLLECTIONS = 9
STEPS = 3
MEGATRON_FLAGS = [
    "--hidden-size", "64", "--ffn-hidden-size", "176", "--num-attention-heads", "4",
    "--num-key-value-heads", "2", "--seq-length", "16", "--max-position-embeddings", "16",
    "--micro-batch-size", "1", "--global-batch-size", "1", "--train-iters", "10",
    "--lr", "1e-5", "--swiglu", "--normalization", "rmsnorm",
    "--use-rotary-position-embeddings", "--untie-embeddings-and-output-weights",
    "--disable-bias-linear", "--no-query-key-layer-scaling", "--attention-dropout", "0",
    "--hidden-dropout", "0", "--bf16", "--deepspeed",
    "--tokenizer-type", "NullTokenizer", "--vocab-size", "512",
    "--no-masked-softmax-fusion", "--no-bias-gelu-fusion", "--no-bias-dropout-fusion",
    "--no-gradient-accumulation-fusion", "--checkpoint-activations",
    "--deepspeed-activation-checkpointing", "--no-pipeline-parallel",
    "--distributed-backend", "gloo", "--use-cpu-initialization"]


def megatron_ds_config(stage: int = 3) -> dict:
    """The runs' ds_config at toy scale: ZeRO-3, optimizer on the CPU, bf16; the persistence
    threshold scaled with the widths so that only the norms persist; Megatron's own optimizer
    (torch's Adam on a CPU build) handed to DeepSpeed, as the runs handed it theirs."""
    return {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
            "train_batch_size": 1, "bf16": {"enabled": True}, "steps_per_print": 1000,
            "wall_clock_breakdown": False, "memory_breakdown": False,
            "zero_force_ds_cpu_optimizer": False,
            "zero_optimization": {"stage": stage, "overlap_comm": True,
                                  "reduce_bucket_size": 500000000,
                                  "stage3_prefetch_bucket_size": 50000000,
                                  "sub_group_size": 100000000,
                                  "stage3_param_persistence_threshold": 100,
                                  "offload_optimizer": {"device": "cpu",
                                                        "pin_memory": False}}}


class _NullStream:
    """What a CUDA stream is asked for where ZeRO-3 and activation checkpointing use one."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass


def _rms_norm_module():
    import torch

    class MixedFusedRMSNorm(torch.nn.Module):
        """apex's module as far as the collector sees it: one weight."""

        def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True):
            super().__init__()
            self.normalized_shape = (normalized_shape,)
            self.eps = eps
            self.elementwise_affine = elementwise_affine
            self.weight = torch.nn.Parameter(torch.ones(normalized_shape))

        def forward(self, x):
            variance = x.float().pow(2).mean(-1, keepdim=True)
            return (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype) * self.weight

    return MixedFusedRMSNorm


def _cpu_shims() -> None:
    """Stand-ins that let DeepSpeed 0.13.3 and Megatron-DeepSpeed 1df5712 run on a CPU (the
    module docstring lists them); none adds or removes objects of the model's."""
    import logging

    os.environ.setdefault("LOCAL_SIZE", "1")
    for name in ("intel_extension_for_pytorch", "oneccl_bindings_for_pytorch"):
        sys.modules.setdefault(name, types.ModuleType(name))
    import torch.distributed.elastic.agent.server.api as agent_api
    if not hasattr(agent_api, "log"):
        agent_api.log = logging.getLogger(agent_api.__name__)
    if not hasattr(agent_api, "_get_socket_with_port"):
        agent_api._get_socket_with_port = None
    try:
        import torchvision
    except RuntimeError:
        for name in [m for m in sys.modules if m.startswith("torchvision")]:
            del sys.modules[name]
        sys.modules["torchvision._meta_registrations"] = types.ModuleType(
            "torchvision._meta_registrations")
        import torchvision  # noqa: F401
    apex = types.ModuleType("apex")
    normalization = types.ModuleType("apex.normalization")
    normalization.MixedFusedRMSNorm = _rms_norm_module()
    apex.normalization = normalization
    sys.modules.setdefault("apex", apex)
    sys.modules.setdefault("apex.normalization", normalization)
    from deepspeed.accelerator import cpu_accelerator

    cpu_accelerator.CPU_Accelerator.Stream = property(lambda self: _NullStream)
    cpu_accelerator.CPU_Accelerator.current_stream = (
        lambda self, device_index=None: _NullStream())
    from deepspeed.accelerator import get_accelerator

    get_accelerator()._communication_backend_name = "gloo"
    from deepspeed.ops.op_builder.cpu import no_impl

    def no_kernel(self, *args, **kwargs):
        raise TypeError(f"{self.name} has no CPU kernel")

    no_impl.NotImplementedBuilder.load = no_kernel


def _train_megatron(layers: int, megatron: Path, stage: int):
    """Megatron-DeepSpeed's model, optimizer and engine for `layers` layers, three steps
    trained; returns the engine's module."""
    _cpu_shims()
    sys.path.insert(0, str(megatron))
    config_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"zerosim_gc_probe_{os.getpid()}.json"
    config_path.write_text(json.dumps(megatron_ds_config(stage)))
    sys.argv = ["pretrain_gpt.py", "--num-layers", str(layers), *MEGATRON_FLAGS,
                "--zero-stage", str(stage),
                "--deepspeed_config", str(config_path)]
    import torch
    from megatron.initialize import initialize_megatron

    initialize_megatron(allow_no_cuda=True)
    import pretrain_gpt
    from megatron.core.enums import ModelType
    from megatron.training import setup_model_and_optimizer
    from megatron.utils import get_ltor_masks_and_position_ids

    models, _, _ = setup_model_and_optimizer(pretrain_gpt.model_provider,
                                             ModelType.encoder_or_decoder)
    engine = models[0]
    tokens = torch.randint(0, 512, (1, 16))
    mask, _, positions = get_ltor_masks_and_position_ids(tokens, 0, False, False, False)
    for _ in range(STEPS):
        output = engine(tokens, positions, mask, labels=tokens)
        loss = (output[0] if isinstance(output, tuple) else output).float().mean()
        engine.backward(loss)
        engine.step()
    config_path.unlink()
    return engine.module


def _train_hf(layers: int, stage: int):
    """transformers' Llama with TinyLlama's structure, as ds_step_probe.py builds it."""
    sys.path.insert(0, str(HERE))
    import torch
    from ds_step_probe import tiny_llama_engine

    engine, vocab_size, _train_hf.keep_alive = tiny_llama_engine(layers, stage)
    batch = torch.randint(0, vocab_size, (1, 16))
    for _ in range(STEPS):
        engine.backward(engine(input_ids=batch, labels=batch).loss)
        engine.step()
    return engine.module


def one(stack: str, layers: int, megatron: Path | None, stage: int) -> dict:
    """One process's count and collection time, `layers` layers of `stack` at ZeRO `stage`."""
    sys.path.insert(0, str(HERE))
    from ds_step_probe import single_rank

    single_rank()
    module = (_train_megatron(layers, megatron, stage) if stack == "megatron-deepspeed"
              else _train_hf(layers, stage))
    gc.collect()
    objects = len(gc.get_objects())
    times = []
    for _ in range(COLLECTIONS):
        begin = time.perf_counter()
        gc.collect()
        times.append(time.perf_counter() - begin)
    return {"layers": layers, "tensors": sum(1 for _ in module.parameters()),
            "modules": sum(1 for _ in module.modules()), "objects": objects,
            "collect_s": statistics.median(times)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", required=True,
                        choices=("megatron-deepspeed", "hf-transformers"))
    parser.add_argument("--megatron", type=Path,
                        help="a Megatron-DeepSpeed checkout (megatron-deepspeed)")
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--stage", type=int, choices=(1, 2, 3), default=3,
                        help="the ZeRO stage (below 3 the parameters are replicated)")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stack == "megatron-deepspeed" and args.megatron is None:
        parser.error("--stack megatron-deepspeed needs --megatron")
    if args.one is not None:
        print(json.dumps(one(args.stack, args.one, args.megatron, args.stage)))
        return 0
    sys.path.insert(0, str(HERE))
    from importlib.metadata import version

    from ds_step_probe import each_in_a_process, slope
    from hf_trainer_probe import core_clock_GHz

    arguments = ["--stack", args.stack, "--out", args.out, "--stage", str(args.stage)]
    if args.megatron is not None:
        arguments += ["--megatron", str(args.megatron.resolve())]
    runs = each_in_a_process(__file__, LAYERS, arguments, port=29831)
    per_tensor = slope(runs, "tensors", lambda run: run["objects"])
    base = (statistics.fmean(run["objects"] for run in runs)
            - per_tensor * statistics.fmean(run["tensors"] for run in runs))
    per_object = [run["collect_s"] / run["objects"] for run in runs]
    result = {"stack": args.stack, "stage": args.stage, "python": sys.version.split()[0],
              "versions": {name: version(name) for name in ("torch", "deepspeed")},
              "core_clock_GHz": core_clock_GHz(), "runs": runs,
              "objects_besides_tensors": base, "objects_per_tensor": per_tensor,
              "collect_s_per_object": statistics.median(per_object)}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("objects_besides_tensors", "objects_per_tensor",
                                             "collect_s_per_object", "core_clock_GHz")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
