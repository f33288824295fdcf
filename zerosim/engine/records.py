"""Flat, frozen records of what happened in a run; turned into DataFrames by `zerosim.results`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Span:
    """One activity on one stream of one rank."""

    rank: int
    stream: str
    phase: str
    micro_batch: int
    op: str
    start_s: float
    end_s: float
    bytes: float
    op_kind: str = ""
    """What the op does (`vocabulary.OpKind`), whatever `op` says."""
    buffer_kind: str = ""
    """The host side of a copy (`vocabulary.BufferKind`), empty for other ops."""


@dataclass(frozen=True, slots=True)
class MemorySample:
    """The level of one memory category on one device, right after it changed."""

    t_s: float
    device: str
    category: str
    bytes: int
    buffer_kind: str = ""
    """Pinned or pageable for host buffers whose kind matters (`vocabulary.BufferKind`)."""


@dataclass(frozen=True, slots=True)
class PhaseSpan:
    """One phase (forward, backward, update) of one micro-batch on one rank."""

    rank: int
    phase: str
    micro_batch: int
    start_s: float
    end_s: float
