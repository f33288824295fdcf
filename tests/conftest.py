"""Shared fixtures: a toy node and a tiny Llama whose every span can be worked out by hand.

Toy numbers (chosen so that the arithmetic in the tests stays readable):

- GPU: 1 TFLOP/s peak (1e12 FLOP/s), 1000 GB/s HBM (1e12 B/s), every efficiency 1.0, no launch
  overhead, no runtime context. A module's time is max(FLOPs, HBM bytes) x 1e-12 s; a device
  copy of B bytes with `passes` p takes p x B x 1e-12 s.
- PCIe: 10 GB/s pinned and 5 GB/s pageable in each direction, no latency.
- Host: one NUMA domain with 1e6 GB/s of memory bandwidth (never binds unless a test lowers it),
  1 socket x 4 cores x 1 thread = 4 hardware threads, no oversubscription penalty.
- CPU: 1 GB/s of elementwise traffic per thread, 1e8 Adam params/s per thread, 1 GB/s of page
  zeroing per thread, 2 threads for a dtype cast, the fp16 overflow check at 2.5e8 elements/s
  per thread (4 threads: 1e9 elements/s).

Tiny model: Llama family, hidden 64, 2 layers, intermediate 128, 4 heads (MHA), vocab 256,
sequence 8, micro-batch 1 (8 tokens), untied embeddings.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import settings

import zerosim
from zerosim.scenario.loader import deep_merge

settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    # CI runs the same examples every time: a property that fails there fails on every run,
    # not on one draw in many; a local run keeps searching new ones.
    settings.load_profile("ci")

TOY_SOURCE = "tests/conftest.py toy profile"


def q(value: Any) -> dict[str, Any]:
    """A profile quantity with its provenance."""
    return {"value": value, "basis": "assumed", "source": TOY_SOURCE}


def toy_profile(gpus: int = 1) -> dict[str, Any]:
    """The toy node as an inline profile mapping (a fresh dict each call, free to patch)."""
    profile = {
        "name": "toy",
        "description": f"toy node: {gpus} GPU(s) with round numbers",
        "nodes": 1,
        "gpu": {
            "name": "toy-gpu",
            "per_node": gpus,
            "numa_domain": [0] * gpus,
            "hbm_GiB": q(16),
            "hbm_GBps": q(1000),
            "peak_16bit_TFLOPS": q(1.0),
            "sm_count": 1,
            "gemm_efficiency": q(1.0),
            "flash_attention_efficiency": q(1.0),
            "memory_efficiency": q(1.0),
            "kernel_gap_us": q(0),
            "runtime_context_GiB": q(0),
        },
        "pcie": {
            "h2d_pinned_GBps": q(10),
            "d2h_pinned_GBps": q(10),
            "h2d_pageable_GBps": q(5),
            "d2h_pageable_GBps": q(5),
            "latency_us": q(0),
        },
        "nvlink": {"bus_GBps": q(100), "latency_us": q(0)},
        "network": {"nic_GBps": q(10), "latency_us": q(0)},
        "host": {
            "cpu_name": "toy-cpu",
            "cpu_boost_GHz": q(3.0),
            "sockets": 1,
            "cores_per_socket": 4,
            "threads_per_core": 1,
            "numa_domains": 1,
            "memory_GiB": q(64),
            "memory_GBps_per_domain": q(1e6),
            "rank_memory_placement": q("round_robin"),
        },
        "cpu": {
            "adam_params_per_s_per_thread": q(1e8),
            "fp16_check_elements_per_s_per_thread": q(2.5e8),
            "elementwise_GBps_per_thread": q(1.0),
            "page_zeroing_GBps": q(1.0),
            "cast_threads": q(2),
            "oversubscription_penalty": q(0),
        },
    }
    profile["host"]["dma_memory_weight"] = q(1.0)  # DMA vs CPU kernel: equal bytes/s
    profile["host"]["socket_link_GBps"] = q(1e6)  # one domain: never crossed
    return profile


def toy_stack() -> dict[str, Any]:
    """A stack with no host time and the bare kernel arithmetic (one-pass norms, activation
    and loss; no rotary, softmax or copy kernels), so a module's GPU time is its roofline."""
    def ops(kernels: int, nbytes: float) -> dict[str, Any]:
        return {"kernels": kernels, "bytes_per_element": nbytes, "source": TOY_SOURCE}

    return {
        "name": "toy-stack",
        "modules": {"qkv": "separate", "gate_up": "separate"},
        "kernels": {"norm": ops(1, 4), "rotary": ops(0, 0), "kv_repeat": ops(0, 0),
                    "scores": ops(0, 0), "context": ops(0, 0), "activation": ops(1, 6),
                    "residual": ops(0, 0), "loss": ops(1, 10),
                    "backward_bytes_factor": q(2.0)},
        "host": {"reference_GHz": q(3.0), "kernel_launch_us": q(0), "fetch_hook_us": q(0),
                 "collective_launch_us": q(0), "micro_batch_ms": q(0), "step_ms": q(0)},
    }


TOY_MODEL = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 256,
}


def minimal(**changes: Any) -> dict[str, Any]:
    """The smallest valid scenario on a catalog model and profile, with `changes` on top."""
    tree = {
        "model": "llama2-7b", "sequence_length": 1024, "hardware": "h100-jlse",
        "deepspeed": {"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True},
                      "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}},
    }
    tree.update(changes)
    return tree


def toy_tree(gpus: int = 1) -> dict[str, Any]:
    """The toy scenario: DP = GPUs, GA 1, fp16, ZeRO-3, optimizer offloaded to pinned memory,
    one IPG bucket for the whole model, no persistent params, 2 optimizer sub-groups."""
    return {
        "name": "toy",
        "model": dict(TOY_MODEL),
        "sequence_length": 8,
        "activation_checkpointing": False,
        "attention": "eager",
        "hardware": toy_profile(gpus),
        "data_parallel": gpus,
        "deepspeed": {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "fp16": {"enabled": True},
            "optimizer": {"type": "Adam"},
            "zero_optimization": {
                "stage": 3,
                "overlap_comm": True,
                "reduce_bucket_size": 5e8,
                "sub_group_size": 50000,
                "stage3_param_persistence_threshold": 0,
                "offload_optimizer": {"device": "cpu", "pin_memory": True},
            },
        },
        "runtime": {"deepspeed_version": "0.13.3", "framework": toy_stack()},
    }


class Toy:
    """Builds and runs variants of the toy scenario: `toy.run({"deepspeed": {...}})`."""

    profile = staticmethod(toy_profile)
    model = TOY_MODEL

    @staticmethod
    def tree(patch: Mapping[str, Any] | None = None, *, gpus: int = 1) -> dict[str, Any]:
        return deep_merge(toy_tree(gpus), patch or {})

    def scenario(self, patch: Mapping[str, Any] | None = None, *, gpus: int = 1
                 ) -> zerosim.Scenario:
        return zerosim.scenario_from_dict(self.tree(patch, gpus=gpus), source="<toy>")

    def run(self, patch: Mapping[str, Any] | None = None, *, gpus: int = 1,
            fold_nodes: bool = True) -> zerosim.Result:
        return zerosim.simulate(self.scenario(patch, gpus=gpus), fold_nodes=fold_nodes)

    def check_json(self, patch: Mapping[str, Any] | None, folder: Path, *, gpus: int = 1
                   ) -> dict[str, Any]:
        """What `zerosim check --json` prints for the scenario, written to `folder` first."""
        import json

        import yaml
        from click.testing import CliRunner

        from zerosim.cli import main

        path = folder / "toy.yaml"
        path.write_text(yaml.safe_dump(self.tree(patch, gpus=gpus)))
        result = CliRunner().invoke(main, ["check", str(path), "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    def run_ok(self, patch: Mapping[str, Any] | None = None, *, gpus: int = 1,
               fold_nodes: bool = True) -> zerosim.Result:
        """`run`, its scenario's warnings quiet, checked to have fitted."""
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = self.run(patch, gpus=gpus, fold_nodes=fold_nodes)
        assert result.summary["status"] == "ok"
        return result


@pytest.fixture(scope="session")
def toy() -> Toy:
    return Toy()


@pytest.fixture()
def toy_file(toy, tmp_path):
    """The toy on 2 GPUs, global batch 4 (micro-batch 1 x 2 accumulation steps x 2 ranks)."""
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(toy.tree({"deepspeed": {"gradient_accumulation_steps": 2}},
                                            gpus=2)))
    return path


@pytest.fixture(scope="session")
def validation_cells() -> list:
    """Every cell `zerosim validate` judges or reports, computed once for the session."""
    from zerosim.validation.validate import validate

    found, _ = validate()
    return found


LLAMA4_SCOUT = {"model_type": "llama4_text", "hidden_size": 5120, "num_hidden_layers": 48,
                "intermediate_size": 8192, "intermediate_size_mlp": 16384,
                "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
                "vocab_size": 202048, "num_local_experts": 16, "num_experts_per_tok": 1,
                "interleave_moe_layer_step": 1, "use_qk_norm": True,
                "attn_temperature_tuning": True, "attention_chunk_size": None}
"""Llama 4 Scout's text config (transformers' `Llama4TextConfig` fields of
meta-llama/Llama-4-Scout-17B-16E), shared by the model and the figure tests."""


def invoke_for_table(args: list[str], table: Path) -> tuple[str, list[dict[str, str]]]:
    """Run a zerosim command that writes one CSV table; its output (it must succeed) and the
    table's rows."""
    import csv

    from click.testing import CliRunner

    from zerosim.cli import main

    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    with table.open() as handle:
        return result.output, list(csv.DictReader(handle))
