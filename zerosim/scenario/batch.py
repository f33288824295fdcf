"""DeepSpeed's batch-size rule: any two of the three sizes give the third.

`runtime/config.py` `_set_batch_related_parameters` then `_batch_assertion` (read at v0.13.3,
unchanged to v0.19.5), with integer division as DeepSpeed does it, so a train_batch_size that
does not divide evenly is refused by the assertion, not rounded silently.
"""

from __future__ import annotations

from dataclasses import dataclass

from zerosim.errors import ScenarioError

TRAIN = "train_batch_size"
MICRO = "train_micro_batch_size_per_gpu"
ACCUM = "gradient_accumulation_steps"


@dataclass(frozen=True)
class BatchSizes:
    train_batch_size: int
    train_micro_batch_size_per_gpu: int
    gradient_accumulation_steps: int


def _derive(train: int | None, micro: int | None, accum: int | None, world: int,
            source: str) -> tuple[int, int, int]:
    if train is not None and micro is not None and accum is not None:
        return train, micro, accum
    if train is not None and micro is not None:
        return train, micro, train // micro // world
    if train is not None and accum is not None:
        return train, train // world // accum, accum
    if micro is not None and accum is not None:
        return micro * accum * world, micro, accum
    if train is not None:
        return train, train // world, 1
    if micro is not None:
        return micro * world, micro, 1
    raise ScenarioError(source, f"deepspeed.{MICRO}",
                        f"{TRAIN} or {MICRO} (DeepSpeed: 'Either train_batch_size or "
                        "train_micro_batch_size_per_gpu needs to be provided')", "neither")


def batch_sizes(train: int | None, micro: int | None, accum: int | None, *, world_size: int,
                source: str) -> BatchSizes:
    """The three sizes as DeepSpeed derives and then asserts them (world size = data_parallel)."""
    train, micro, accum = _derive(train, micro, accum, world_size, source)
    for key, value in ((MICRO, micro), (ACCUM, accum)):
        if value < 1:
            raise ScenarioError(source, f"deepspeed.{key}",
                                f"a derived value > 0 (DeepSpeed derives {key} by integer "
                                f"division from {TRAIN} {train} and data_parallel {world_size}, "
                                "then asserts it is greater than 0)", value)
    if train != micro * accum * world_size:
        raise ScenarioError(
            source, f"deepspeed.{TRAIN}",
            f"{MICRO} x {ACCUM} x data_parallel = {micro} x {accum} x {world_size} = "
            f"{micro * accum * world_size} (DeepSpeed asserts it: 'Check batch related "
            "parameters')", train)
    return BatchSizes(train, micro, accum)
