"""Flat records of what happened in a run; turned into DataFrames by `zerosim.results`.

The engine appends each record as a plain tuple in field order to a `Table` (a frozen dataclass
per record cost more than the simulation itself); the dataclasses below name the fields and
give single records to tests and readers.
"""

from __future__ import annotations

from collections.abc import Iterator
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


class Table(Generic[R]):
    """Records of one type as rows of plain tuples, every field given, in field order.

    `add(row)` appends a row; `columns()` gives one list per field, with vocabulary members
    (`StrEnum`) in text fields turned into plain `str`. The engine adds rows of plain values
    only (text as `str`, a member's `_value_`): the garbage collector stops tracking such a
    tuple, while one holding a member stays tracked and is traversed by every collection
    (measured: half the collector's time in a `llama13b_dp4` run).
    """

    __slots__ = ("add", "names", "record_type", "rows", "text")

    def __init__(self, record_type: type[R]):
        self.record_type = record_type
        self.names = tuple(f.name for f in fields(record_type))
        self.text = frozenset(f.name for f in fields(record_type) if f.type == "str")
        self.rows: list[tuple[Any, ...]] = []
        self.add = self.rows.append

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[R]:
        make = self.record_type
        return (make(*row) for row in self.rows)

    def columns(self) -> dict[str, list[Any]]:
        if not self.rows:
            return {name: [] for name in self.names}
        return {name: list(map(str, values)) if name in self.text else list(values)
                for name, values in zip(self.names, zip(*self.rows, strict=True),
                                        strict=True)}

    @classmethod
    def of_rows(cls, record_type: type[R], rows: list[tuple[Any, ...]]) -> Table[R]:
        """A table holding `rows` (tuples in field order)."""
        table = cls(record_type)
        table.rows.extend(rows)
        return table

    @classmethod
    def of(cls, record_type: type[R], records: list[R]) -> Table[R]:
        """A table holding `records` (dataclass instances of `record_type`)."""
        table = cls(record_type)
        names = table.names
        table.rows.extend(tuple(getattr(r, n) for n in names) for r in records)
        return table


def with_copies(table: Table[R], field: int, copies: dict[Any, tuple[Any, ...]]) -> Table[R]:
    """`table` with each row whose `field` (a rank, a device) stands for others followed by
    one row per other, that field replaced: the rows of a folded run for every rank
    (`simulate.RawRun.stands_for`). `table` itself when nothing stands for another."""
    if not copies:
        return table
    expanded = Table(table.record_type)
    add = expanded.rows.append
    for row in table.rows:
        add(row)
        for other in copies.get(row[field], (row[field],))[1:]:
            add((*row[:field], other, *row[field + 1:]))
    return expanded
