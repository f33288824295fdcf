"""The critical path of each phase: what every second of a phase waited on.

Streams run at once, so the busy time of each (`plots.activity`) adds up to more than the
phase. The critical path counts each second once: walking back from the phase's end, each step
is the op whose end let the next one start. The engine starts an op at the very instant (the
same float) the last thing it waited for ended, so that op is the one whose recorded end equals
the start; among several, the innermost (shortest) one, since an op that runs others inside it
(a reduce-stream op around its copies and CPU casts) ends with the last of them. The host
thread's work is recorded too (`Stream.HOST`: hooks, launches, `cudaMalloc`, the loop's
bookkeeping), so an op the host issued starts where that work ends, and the work starts where
what the host waited for ended: the walk follows the host thread as it follows the streams.
Where no op ends at a step's start, the time back to the latest earlier end belongs to the op
that encloses the step (a wrapper's own work between its inner ops) or, with none, to the host
(`PathGap.HOST`: what its recorded work does not cover, all of it in a result folder written
before the host thread was recorded).

Pure Python over the span and phase rows; `critical_path` turns a `Result` into a DataFrame,
`engine_path_totals` reads the engine's own record of a run that kept its host spans (a sweep
point with `--explain`) without one.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from zerosim.engine.records import with_copies
from zerosim.results.summary import last_to_finish, phase_time
from zerosim.units import ordered_sum
from zerosim.vocabulary import PHASE_TIMES, PathGap, Phase, span_kind

if TYPE_CHECKING:
    import pandas as pd

    from zerosim.engine.simulate import RawRun
    from zerosim.results.result import Result

SpanRow = tuple[str, str, str, str, float, float]
"""(stream, op_kind, buffer_kind, op, start_s, end_s) of one span."""

COLUMNS = ("rank", "phase", "micro_batch", "phase_time", "start_s", "end_s", "stream",
           "op_kind", "buffer_kind", "op")

WAITS_ON = "waits_on"
"""The summary key of what each phase waited on, where a run was asked (`waits_texts`)."""

KINDS_SHOWN = 4
"""What a phase waited on longest, named one by one (`waits_text`); the rest are counted."""


@dataclass(frozen=True, slots=True)
class PathStep:
    """One stretch of a phase's critical path: the span it waited on (clipped to the phase),
    or a stretch of the host thread (`stream` and `op_kind` both `PathGap.HOST`)."""

    start_s: float
    end_s: float
    stream: str
    op_kind: str
    buffer_kind: str
    op: str


def _host_step(start_s: float, end_s: float) -> PathStep:
    return PathStep(start_s, end_s, PathGap.HOST.value, PathGap.HOST.value, "", "")


def _step(span: SpanRow, start_s: float, end_s: float) -> PathStep:
    stream, op_kind, buffer_kind, op, _, _ = span
    return PathStep(start_s, end_s, stream, op_kind, buffer_kind, op)


class _Index:
    """A rank's spans of nonzero length by their end, and every end in order."""

    def __init__(self, spans: Iterable[SpanRow]):
        self.ending: dict[float, list[SpanRow]] = defaultdict(list)
        for span in spans:
            if span[5] > span[4]:
                self.ending[span[5]].append(span)
        self.ends = sorted(self.ending)

    def latest_end_before(self, t: float) -> float | None:
        i = bisect_left(self.ends, t)
        return self.ends[i - 1] if i else None


def _innermost(candidates: list[SpanRow], previous: PathStep | None) -> SpanRow:
    """The shortest of the spans ending at one instant; among equals, one on the stream of
    the step after it (its in-order predecessor), then by stream name."""
    stream = previous.stream if previous is not None else None
    return min(candidates, key=lambda s: (s[5] - s[4], s[0] != stream, s[0], s[1], s[3]))


def phase_path(spans: Iterable[SpanRow] | _Index, start_s: float, end_s: float
               ) -> list[PathStep]:
    """The critical path of the window [start_s, end_s] through one rank's spans, in time
    order; its steps tile the window exactly."""
    index = spans if isinstance(spans, _Index) else _Index(spans)
    steps: list[PathStep] = []
    enclosing: list[SpanRow] = []   # spans that ended with a chosen one and began before it
    t, previous = end_s, None
    while t > start_s:
        enclosing = [s for s in enclosing if s[4] < t]
        candidates = [s for s in index.ending.get(t, ()) if s[4] < t]
        if candidates:
            span = _innermost(candidates, previous)
            enclosing += [s for s in candidates if s is not span and s[4] < span[4]]
            step = _step(span, max(span[4], start_s), t)
        else:
            earlier = index.latest_end_before(t)
            lower = start_s if earlier is None else max(earlier, start_s)
            if enclosing:
                wrapper = max(enclosing, key=lambda s: s[4])
                step = _step(wrapper, max(lower, wrapper[4]), t)
            else:
                step = _host_step(lower, t)
        steps.append(step)
        t, previous = step.start_s, step
    steps.reverse()
    return steps


def rank_paths(spans: Sequence[tuple], phases: Sequence[tuple]) -> list[tuple]:
    """Rows of `COLUMNS`: the critical path of every phase of every rank.
    `spans`: (rank, stream, op_kind, buffer_kind, op, start_s, end_s) rows;
    `phases`: (rank, phase, micro_batch, start_s, end_s) rows."""
    by_rank: dict[int, list[SpanRow]] = defaultdict(list)
    for rank, *span in spans:
        by_rank[rank].append(tuple(span))
    boundary: dict[int, int] = {}
    for rank, phase, micro, _, _ in phases:
        if phase == Phase.BACKWARD:
            boundary[rank] = max(boundary.get(rank, micro), micro)
    indexes = {rank: _Index(rows) for rank, rows in by_rank.items()}
    rows = []
    for rank, phase, micro, start_s, end_s in phases:
        key = phase_time(phase, micro, boundary.get(rank, micro))
        label = "" if key is None else key.value
        for step in phase_path(indexes.get(rank) or _Index(()), start_s, end_s):
            rows.append((rank, phase, micro, label, step.start_s, step.end_s, step.stream,
                         step.op_kind, step.buffer_kind, step.op))
    return rows


def critical_path(result: Result, ranks: Iterable[int] | None = None) -> pd.DataFrame:
    """The critical path of every phase of `ranks` (default: every rank) of `result`: one row
    per step (`COLUMNS`; `phase_time` is the summary's phase time it counts in,
    `vocabulary.PhaseTime`, empty for a phase it does not count)."""
    import pandas as pd

    spans, phases = result.spans, result.phases
    if ranks is not None:
        chosen = list(ranks)
        spans, phases = spans[spans["rank"].isin(chosen)], phases[phases["rank"].isin(chosen)]
    span_rows = spans[["rank", "stream", "op_kind", "buffer_kind", "op", "start_s", "end_s"]]
    phase_rows = phases[["rank", "phase", "micro_batch", "start_s", "end_s"]]
    rows = rank_paths(list(span_rows.itertuples(index=False, name=None)),
                      list(phase_rows.itertuples(index=False, name=None)))
    return pd.DataFrame(rows, columns=list(COLUMNS))


def reported_rank(result: Result) -> int | None:
    """The rank whose phases `zerosim run` reports: the last to finish."""
    phases = result.phases[["rank", "phase", "micro_batch", "start_s", "end_s"]]
    return last_to_finish(phases.itertuples(index=False, name=None))


def path_totals(path: pd.DataFrame, rank: int) -> dict[str, list[tuple[str, float]]]:
    """Seconds of `rank`'s critical path per summary phase time over the whole iteration, by
    what it waited on (`vocabulary.span_kind` of the step), longest first."""
    mine = path[path["rank"] == rank]
    return kind_totals(zip(mine.phase_time, mine.op_kind, mine.buffer_kind, mine.op,
                           mine.start_s, mine.end_s, strict=True))


def kind_totals(steps: Iterable[tuple[str, str, str, str, float, float]]
                ) -> dict[str, list[tuple[str, float]]]:
    """Seconds per summary phase time by what was waited on (`vocabulary.span_kind`), longest
    first, from (phase_time, op_kind, buffer_kind, op, start_s, end_s) steps; a step of no
    phase time is left out."""
    totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for key, op_kind, buffer_kind, op, start, end in steps:
        if key:
            totals[key][span_kind(op_kind, buffer_kind, op)] += end - start
    return {key: sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))
            for key, kinds in totals.items()}


def waits_text(kinds: list[tuple[str, float]], shown: int = KINDS_SHOWN) -> str:
    """`kind_totals` of one phase as `zerosim run` prints it: 'cuda_malloc 0.336 (44%), hooks
    0.194 (25%), ..., 2 more 0.001' (seconds per iteration and share of the phase)."""
    total = ordered_sum(seconds for _, seconds in kinds)
    parts = [f"{kind} {seconds:.3f} ({seconds / total:.0%})" for kind, seconds in kinds[:shown]]
    if rest := kinds[shown:]:
        parts.append(f"{len(rest)} more {ordered_sum(s for _, s in rest):.3f}")
    return ", ".join(parts)


def engine_path_totals(raw: RawRun) -> tuple[int, dict[str, list[tuple[str, float]]]]:
    """The reported rank (the last to finish) and what each of its phase times waited on
    (`kind_totals`), from the engine's record of a run that kept its host spans
    (`run_engine(host_spans=True)`): what `path_totals` gives a `Result`, without a
    DataFrame. A mirror rank's path is the rank's it stands for."""
    phases = [row[:5] for row in with_copies(raw.phases, 0, raw.stands_for).rows]
    rank = last_to_finish(phases)
    simulated = next((first for first, members in raw.stands_for.items() if rank in members),
                     rank)
    spans = [(r, stream, op_kind, buffer_kind, op, start, end)
             for r, stream, _, _, op, start, end, _, op_kind, buffer_kind in raw.spans.rows
             if r == simulated]
    steps = rank_paths(spans, [row[:5] for row in raw.phases.rows if row[0] == simulated])
    return rank, kind_totals((row[3], *row[7:], row[4], row[5]) for row in steps)


def waits_texts(totals: dict[str, list[tuple[str, float]]]) -> dict[str, str | None]:
    """`waits_text` of every phase time (None for one the iteration does not have): a
    summary's `waits_on`."""
    return {key: waits_text(totals[key]) if totals.get(key) else None for key in PHASE_TIMES}
