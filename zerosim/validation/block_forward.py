"""A plain PyTorch block's forward on a GPU against the kernel model, per layer.

The node probe's section g times a Llama block written in plain PyTorch ops, on an H100 SXM
(`zerosim/validation/data/h100_block_forward.yaml`) and on an H200 SXM
(`h200_block_forward.yaml`, and with PyTorch's flash attention in place of the eager one,
`h200_flash_block_forward.yaml`), and its `hf_layer_probe.py` times transformers' own
LlamaDecoderLayer forward and backward on the H200 (`h200_hf_llama_layer.yaml`). Each data file
describes its block as a software stack (the hf-transformers stack, with overrides where the
block is not transformers'). This prices one layer of it the way the engine prices a module
(`engine.plan.module_costs`: each kernel on the profile, GEMMs on their roofline, memory-bound
kernels at `gpu.memory_efficiency`), its forward or its backward, and finds the streaming rate
of the memory-bound kernels that would make the model meet the measured layers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from zerosim.hardware.profile import HardwareProfile
from zerosim.units import ordered_sum
from zerosim.validation.leastsq import StreamingFit, fit_rate
from zerosim.validation.reference import reference_data

DATA_FILES = ("h100_block_forward.yaml", "h200_block_forward.yaml",
              "h200_flash_block_forward.yaml", "h200_hf_llama_layer.yaml")
DATA_FILE = DATA_FILES[0]


@dataclass(frozen=True)
class BlockRow:
    """One measured block: its shape, micro-batch, attention and times per layer."""

    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    micro_batch: int
    layer_s: float
    """The forward's."""
    host_issue_s: float | None
    """The host's time to issue the layer, where the probe measured it."""
    attention: str = "eager"
    label: str = "plain block"
    backward_s: float | None = None
    """The backward's, where the probe timed one."""

    @classmethod
    def from_record(cls, record: dict, attention: str = "eager",
                    label: str = "plain block") -> BlockRow:
        issue_ms, backward_ms = record.get("host_issue_ms"), record.get("backward_ms")
        return cls(record["hidden"], record["ffn"], record["heads"], record["kv_heads"],
                   record["micro_batch"], record["layer_ms"] * 1e-3,
                   None if issue_ms is None else issue_ms * 1e-3, attention, label,
                   None if backward_ms is None else backward_ms * 1e-3)

    @property
    def case(self) -> str:
        return f"{self.label} h{self.hidden} mb{self.micro_batch}"


def block_data(name: str = DATA_FILE) -> dict[str, Any]:
    """One of `DATA_FILES`: the block's stack, its GPU's profile and the measured layers."""
    return reference_data(name)


def block_rows(data: dict[str, Any] | None = None) -> list[BlockRow]:
    data = data or block_data()
    return [BlockRow.from_record(r, data.get("attention", "eager"),
                                 data.get("label", "plain block")) for r in data["rows"]]


def _scenario_tree(row: BlockRow, data: dict[str, Any]) -> dict[str, Any]:
    """A one-layer model of the block's shape with the data file's stack, on its profile."""
    return {
        "name": row.case.replace(" ", "-"),
        "model": {"name": "probe-block", "family": "llama", "hidden_size": row.hidden,
                  "num_hidden_layers": 1, "intermediate_size": row.ffn,
                  "num_attention_heads": row.heads, "num_key_value_heads": row.kv_heads,
                  "vocab_size": 32000, "tie_word_embeddings": False,
                  "max_position_embeddings": data["sequence_length"]},
        "sequence_length": data["sequence_length"],
        "activation_checkpointing": False,
        "attention": row.attention,
        "hardware": data["profile"],
        "data_parallel": 1,
        "deepspeed": {"train_micro_batch_size_per_gpu": row.micro_batch,
                      "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
                      "optimizer": {"type": "Adam"},
                      "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}},
        "runtime": {"deepspeed_version": "0.13.3", "framework": data["stack"]},
    }


def modelled_layer_s(row: BlockRow, data: dict[str, Any] | None = None,
                     profile: HardwareProfile | None = None, backward: bool = False) -> float:
    """The GPU seconds of the block's layer, its forward or its `backward`, as the engine
    prices its modules, on the data file's profile or on `profile`."""
    from zerosim.engine.plan import module_costs, plan_of
    from zerosim.scenario.loader import scenario_from_dict

    data = data or block_data()
    scenario = scenario_from_dict(_scenario_tree(row, data), source=DATA_FILE)
    if profile is not None:
        scenario = replace(scenario, hardware=profile)
    modules = plan_of(scenario).modules
    costs = module_costs(scenario)
    seconds = costs.backward_s if backward else costs.forward_s
    return ordered_sum(s for m, s in zip(modules, seconds, strict=True) if m.layer == 0)


def _fit_rate(rows: list[BlockRow], modelled: Callable[[float], list[float]],
              start: float) -> StreamingFit:
    return fit_rate([r.layer_s for r in rows], modelled, start)


def fit_memory_efficiency(rows: list[BlockRow], profile: HardwareProfile,
                          data: dict[str, Any] | None = None) -> StreamingFit:
    """`gpu.memory_efficiency` for every memory-bound kernel of the block whose operands are
    contiguous, the strided ones at the profile's `gpu.strided_memory_efficiency`."""
    data = data or block_data()
    return _fit_rate(rows, lambda value: [
        modelled_layer_s(r, data, replace(profile, memory_efficiency=value)) for r in rows],
        profile.memory_efficiency)


def fit_softmax_efficiency(rows: list[BlockRow], profile: HardwareProfile,
                           data: dict[str, Any] | None = None) -> StreamingFit:
    """`gpu.softmax_memory_efficiency`: the rate PyTorch's softmax over the s x s scores
    streams at that meets the layers, every other kernel as the profile prices it (the
    strided ones, the mask among them, at `gpu.strided_memory_efficiency`)."""
    data = data or block_data()
    return _fit_rate(rows, lambda value: [
        modelled_layer_s(r, data, replace(profile, softmax_memory_efficiency=value))
        for r in rows], profile.memory_efficiency)
