"""Megatron-DeepSpeed's `--checkpoint-in-cpu` and `--synchronize-each-layer`
(`runtime.checkpoint_in_cpu`, `runtime.synchronize_each_layer`): `deepspeed.checkpointing`
keeps each checkpointed block's input in host memory, or synchronizes around each block."""

from __future__ import annotations

import warnings

import pytest

from zerosim.errors import ScenarioError
from zerosim.scenario.support import InertWhatIfWarning
from zerosim.vocabulary import BufferKind, Category, OpKind, Phase, category_label

DEEPSPEED_CHECKPOINT = {"modules": {"checkpoint_function": {"value": "deepspeed",
                                                            "source": "test"}}}
BLOCK_INPUT = 2 * 64 * 8
"""The toy's block input: 8 tokens of 64 fp16 values."""


def _patch(**runtime) -> dict:
    return {"activation_checkpointing": True,
            "runtime": {"framework": DEEPSPEED_CHECKPOINT, **runtime}}


def _run(toy, patch):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = toy.run(patch)
    assert result.summary["status"] == "ok"
    return result


def test_each_block_input_goes_to_host_memory_and_back(toy):
    """One pageable D2H per block as its forward starts and one H2D before its recompute,
    each the block's 1,024 B at the toy's 5 GB/s pageable rate."""
    spans = _run(toy, _patch(checkpoint_in_cpu=True)).spans
    out = spans[spans.op_kind == OpKind.CHECKPOINT_TO_HOST]
    back = spans[spans.op_kind == OpKind.CHECKPOINT_FROM_HOST]
    assert list(out.op) == ["checkpoint layers.0.input_layernorm (pageable)",
                            "checkpoint layers.1.input_layernorm (pageable)"]
    assert list(back.op) == ["checkpoint layers.1.input_layernorm (pageable)",
                             "checkpoint layers.0.input_layernorm (pageable)"]
    assert set(out.phase) == {Phase.FORWARD} and set(back.phase) == {Phase.BACKWARD}
    for copies in (out, back):
        assert list(copies.bytes) == [BLOCK_INPUT] * 2
        assert list(copies.end_s - copies.start_s) == pytest.approx([BLOCK_INPUT / 5e9] * 2)
    recompute = spans[(spans.op == "recompute layers.1.input_layernorm")]
    assert recompute.start_s.iloc[0] >= back.end_s.iloc[0]


def test_the_inputs_leave_the_gpu_for_pageable_host_memory(toy):
    """The GPU holds the two block inputs less at the forward's end; host memory holds them,
    pageable, until each block's recompute."""
    def memory(result, device, label):
        m = result.memory
        return m[(m.device == device) & (m.category == label)]

    kept, moved = _run(toy, _patch()), _run(toy, _patch(checkpoint_in_cpu=True))
    activations = Category.ACTIVATIONS.value

    def after_forward(result):
        end = result.phases[result.phases.phase == Phase.FORWARD].end_s.iloc[0]
        levels = memory(result, "gpu0", activations)
        return levels[levels.t_s <= end].bytes.iloc[-1]

    assert after_forward(kept) - after_forward(moved) == 2 * BLOCK_INPUT
    host = memory(moved, "host0", category_label(Category.ACTIVATIONS, BufferKind.PAGEABLE))
    assert host.bytes.max() == 2 * BLOCK_INPUT and host.bytes.iloc[-1] == 0
    assert memory(kept, "host0", category_label(Category.ACTIVATIONS,
                                                BufferKind.PAGEABLE)).empty


def test_synchronizing_each_layer_only_holds_the_host_back(toy):
    """The toy's stack spends no host time, so the GPU's timeline is the same; the flag is
    taken and each block's forward and backward are bracketed by synchronizations."""
    plain, synced = _run(toy, _patch()), _run(toy, _patch(synchronize_each_layer=True))
    assert synced.summary["iteration_s"] >= plain.summary["iteration_s"]


def test_synchronizing_each_layer_needs_deepspeeds_checkpoint(toy):
    """The Hugging Face Trainer's `torch.utils.checkpoint` has no such option."""
    with pytest.raises(ScenarioError, match=r"runtime\.synchronize_each_layer: expected false"):
        toy.scenario({"activation_checkpointing": True,
                      "runtime": {"synchronize_each_layer": True}})


def test_torch_checkpoints_in_host_memory_as_arctic_training_patches_them(toy):
    """Under `torch.utils.checkpoint` (the toy's stack) `checkpoint_in_cpu` is Arctic Long
    Sequence Training's `activation_checkpoint_cpu_offload`: the same copies as DeepSpeed's
    `deepspeed.checkpointing` makes, and the same timeline."""
    torch_stack = _run(toy, {"activation_checkpointing": True,
                             "runtime": {"checkpoint_in_cpu": True}})
    deepspeed = _run(toy, _patch(checkpoint_in_cpu=True))
    assert torch_stack.summary["iteration_s"] == deepspeed.summary["iteration_s"]
    copies = torch_stack.spans[torch_stack.spans.op.str.startswith("checkpoint")]
    assert len(copies) == 2 * 2  # each of the two blocks' inputs out and back


def test_the_flags_without_checkpointing_are_a_warning(toy):
    with pytest.warns(InertWhatIfWarning, match="checkpoint_in_cpu does nothing without"):
        toy.scenario({"runtime": {"framework": DEEPSPEED_CHECKPOINT,
                                  "checkpoint_in_cpu": True}})


def test_the_shipped_stacks_name_their_checkpoint_function():
    from zerosim.stacks import load_stack

    assert load_stack("megatron-deepspeed").recipe.deepspeed_checkpointing
    assert not load_stack("hf-transformers").recipe.deepspeed_checkpointing
