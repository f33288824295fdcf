"""Ranks that did exactly the same thing: one group per distinct timeline (pure: pandas only)."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd


def identical_rank_groups(spans: pd.DataFrame, ranks: Sequence[int]) -> list[list[int]]:
    """`ranks` grouped by identical spans (stream, op kind, start and end to the nanosecond),
    in order of their first rank."""
    groups: dict[tuple, list[int]] = {}
    by_rank = dict(iter(spans.groupby("rank", sort=False)))
    empty = spans.iloc[:0]
    for rank in ranks:
        mine = by_rank.get(rank, empty)
        key = tuple(zip(mine["stream"].tolist(), mine.get("op_kind", mine["op"]).tolist(),
                        mine.start_s.round(9).tolist(), mine.end_s.round(9).tolist(),
                        strict=True))
        groups.setdefault(key, []).append(rank)
    return list(groups.values())
