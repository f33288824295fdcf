"""`Result`: the records of a run as DataFrames, plus the summary users read first."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import pandas as pd

from zerosim.engine.records import PeerWait, Table
from zerosim.engine.simulate import RawRun
from zerosim.results.summary import summarize
from zerosim.vocabulary import (
    PHASE_TIMES,
    LinkKind,
    split_resource,
)

PHASE_KEYS = PHASE_TIMES


def _frame(table: Table) -> pd.DataFrame:
    """One row per record, one column per field in declaration order; vocabulary members are
    written as their plain text."""
    if not len(table):
        return pd.DataFrame([], columns=list(table.names))
    return pd.DataFrame(table.columns(), columns=list(table.names))


@dataclass(frozen=True)
class Result:
    """One simulated iteration.

    `spans`: one row per activity (rank, stream, phase, micro_batch, op, start_s, end_s, bytes,
    op_kind, buffer_kind): `op` is display text; select on `stream`, `phase`, `op_kind`
    (`vocabulary.OpKind`) and `buffer_kind` (`vocabulary.BufferKind`).
    `memory`: step curves (t_s, device, category, bytes, buffer_kind) - the level after each
    change; `category` is the label `vocabulary.category_label` makes
    (`vocabulary.base_category` gives its `Category` back).
    `phases`: one row per rank x phase x micro-batch.
    `links`: usage of each shared resource over time (t_s, resource, rate, unit): bytes/s for
    PCIe directions, NVLink and host memory; busy hardware threads for a node's CPU.
    `summary`: iteration and phase times, TFLOPS, peaks, PCIe traffic, status.
    `peer_waits`: one row per rank that joined a collective before the last of its peers
    (rank, collective, op_kind, joined_s, met_s, end_s, last_rank: `records.PeerWait`), where
    the run recorded its host thread; empty where no rank waited for another.
    `critical_path`: what each phase of the rank that finishes last waited on (computed on
    first use from `spans`, `phases` and `peer_waits`).
    """

    scenario_name: str
    spans: pd.DataFrame
    memory: pd.DataFrame
    phases: pd.DataFrame
    links: pd.DataFrame
    summary: dict[str, Any]
    capacities: dict[str, int]
    peer_waits: pd.DataFrame = field(default_factory=lambda: _frame(Table(PeerWait)))

    @property
    def status(self) -> str:
        return self.summary["status"]

    @cached_property
    def critical_path(self) -> pd.DataFrame:
        """What each phase of the rank that finishes last (the one `zerosim run` reports)
        waited on, one row per step of its critical path (`results.critical`); empty when
        the run has no phases. `results.critical.critical_path(result, ranks)` gives other
        ranks'."""
        from zerosim.results.critical import COLUMNS, critical_path, reported_rank

        rank = reported_rank(self)
        if rank is None:
            return pd.DataFrame([], columns=list(COLUMNS))
        return critical_path(self, [rank])


def link_unit(resource: str) -> str:
    """CPU resources carry busy hardware threads; every other resource bytes per second."""
    return "threads" if split_resource(resource)[1] is LinkKind.CPU else "B/s"


def build_result(raw: RawRun) -> Result:
    """The records as DataFrames, for every rank of the simulated node(s): the rows of a
    simulated rank are repeated for each mirror rank it stood for (`RawRun.every_rank`)."""
    raw = raw.every_rank()
    spans = _frame(raw.spans).sort_values(["start_s", "rank", "stream"], kind="stable",
                                          ignore_index=True)
    phases = _frame(raw.phases)
    memory = _frame(raw.memory)
    links = _frame(raw.links)
    links["unit"] = links.resource.map({r: link_unit(r) for r in set(links.resource)})
    return Result(raw.scenario.name, spans, memory, phases, links, summarize(raw),
                  dict(raw.capacities), _frame(raw.peer_waits))
