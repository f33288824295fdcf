"""Flat records of what happened in a run; turned into DataFrames by `zerosim.results`.

The engine appends each record as a plain tuple in field order to a `Table` (a frozen dataclass
per record cost more than the simulation itself); the dataclasses below name the fields and
give single records to tests and readers.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from typing import Any, Generic, TypeVar

R = TypeVar("R")


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
    """As DeepSpeed's phase timers measure them, on the compute stream (`RankCore.end`)."""
    allocated_end_bytes: int
    """What the rank's GPU holds allocated when the phase ends, its CUDA context included:
    the level DeepSpeed's `see_memory_usage` prints after each phase (`MA`), less the
    context."""
    allocated_peak_bytes: int
    """The most the rank's GPU held allocated during the phase, its CUDA context included
    (`Max_MA` after the phase, the peak statistics reset at its start)."""
    compute_held_s: float
    """How long kernels on other streams held the phase's compute kernels back on the SMs
    (`streams.SharedSMs`)."""


@dataclass(frozen=True, slots=True)
class PeerWait:
    """A rank that reached a collective before the last of its peers did, and waited."""

    rank: int
    collective: str
    """The collective's kind (`vocabulary.Collective`)."""
    op_kind: str
    """The kind of the rank's op that ran it (`vocabulary.OpKind`): the collective's own,
    or that of an op it is a step of (ZenFlow's selection all-gathers its columns)."""
    joined_s: float
    """When the rank joined it."""
    met_s: float
    """When the last simulated rank joined it and its ring began."""
    end_s: float
    """When it ended, on every rank alike."""
    last_rank: int
    """The (simulated) rank whose arrival it waited for."""


class Table(Generic[R]):
    """Records of one type, every field given, in field order.

    `add(row)` appends a row (a tuple); `rows` gives them back as tuples; `columns()` gives
    one list per field, with vocabulary members (`StrEnum`) in text fields turned into plain
    `str`. The table keeps its rows' values in one flat list, not the tuples themselves: a
    run adds tens of thousands of rows, and every live tuple counts towards the garbage
    collector's next collection (the tuples the engine adds, of plain values, only stop being
    tracked once a collection has looked at them), which made a `llama13b_dp4` run with every
    record trigger a full collection (30-40 ms) almost every run. The engine adds rows of
    plain values only (text as `str`, a member's `_value_`).
    """

    __slots__ = ("_flat", "add", "names", "record_type", "text", "width")

    def __init__(self, record_type: type[R]):
        self.record_type = record_type
        self.names = tuple(f.name for f in fields(record_type))
        self.text = frozenset(f.name for f in fields(record_type) if f.type == "str")
        self.width = len(self.names)
        self._flat: list[Any] = []
        self.add = self._flat.extend

    def __len__(self) -> int:
        return len(self._flat) // self.width

    def __iter__(self) -> Iterator[R]:
        make = self.record_type
        return (make(*row) for row in self.rows)

    @property
    def rows(self) -> list[tuple[Any, ...]]:
        """The rows as tuples in field order (a new list at each call)."""
        return list(zip(*[iter(self._checked())] * self.width, strict=True))

    def column(self, field: int) -> list[Any]:
        """Every row's `field` (its position), in order, as stored."""
        return self._checked()[field::self.width]

    def columns(self) -> dict[str, list[Any]]:
        flat, width = self._checked(), self.width
        return {name: list(map(str, flat[i::width])) if name in self.text else flat[i::width]
                for i, name in enumerate(self.names)}

    def _checked(self) -> list[Any]:
        """The flat values, once checked to make whole rows."""
        if len(self._flat) % self.width:
            raise ValueError(f"a {self.record_type.__name__} row of other than {self.width} "
                             "fields was added")
        return self._flat

    @classmethod
    def of_rows(cls, record_type: type[R], rows: Iterable[tuple[Any, ...]]) -> Table[R]:
        """A table holding `rows` (tuples in field order)."""
        table = cls(record_type)
        for row in rows:
            table.add(row)
        return table

    @classmethod
    def of(cls, record_type: type[R], records: list[R]) -> Table[R]:
        """A table holding `records` (dataclass instances of `record_type`)."""
        table = cls(record_type)
        names = table.names
        for r in records:
            table.add(tuple(getattr(r, n) for n in names))
        return table


def with_copies(table: Table[R], field: int, copies: dict[Any, tuple[Any, ...]]) -> Table[R]:
    """`table` with each row whose `field` (a rank, a device) stands for others followed by
    one row per other, that field replaced: the rows of a folded run for every rank
    (`simulate.RawRun.stands_for`). `table` itself when nothing stands for another."""
    if not copies:
        return table
    expanded = Table(table.record_type)
    add = expanded.add
    for row in table.rows:
        add(row)
        for other in copies.get(row[field], (row[field],))[1:]:
            add((*row[:field], other, *row[field + 1:]))
    return expanded
