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

A collective begins when the last of its ranks joins it. Where the step's op ran one that this
rank joined early (`PeerWait`), the step goes back only to the moment the last rank joined,
and the walk goes on from there on that rank: what held it back (a fetch over a slower link, a
longer backward) is on the path, not the wait, and the step names its rank (`op_rank`).

Pure Python over the span, phase and peer-wait rows; `critical_path` turns a `Result` into a
DataFrame,
`engine_path_totals` reads the engine's own record of a run that kept its host spans (a sweep
point with `--explain`) without one.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, NamedTuple

from zerosim.engine.records import PeerWait, with_copies
from zerosim.results.summary import last_to_finish, phase_time
from zerosim.units import ordered_sum
from zerosim.vocabulary import PHASE_TIMES, PathGap, Phase, span_kind

if TYPE_CHECKING:
    import pandas as pd

    from zerosim.engine.simulate import RawRun
    from zerosim.results.result import Result

SpanRow = tuple[str, str, str, str, float, float]
"""(stream, op_kind, buffer_kind, op, start_s, end_s) of one span."""
PEER_WAIT_COLUMNS = tuple(f.name for f in fields(PeerWait))
"""`Result.peer_waits`' columns, in `records.PeerWait`'s order."""


class WaitRow(NamedTuple):
    """One `records.PeerWait`: `rank` joined a collective (run by an op of `op_kind`) at
    `joined_s` and waited for `last_rank`, which joined at `met_s`; it ended at `end_s`."""

    rank: int
    collective: str
    op_kind: str
    joined_s: float
    met_s: float
    end_s: float
    last_rank: int

COLUMNS = ("rank", "phase", "micro_batch", "phase_time", "start_s", "end_s", "stream",
           "op_kind", "buffer_kind", "op", "op_rank")
"""`rank`: the rank whose phase it is; `op_rank`: the rank whose op (or host thread) the step
is, another where the phase's rank waited for it in a collective."""

WAITS_ON = "waits_on"
"""The summary key of what each phase waited on, where a run was asked (`waits_texts`)."""
OTHER_RANKS = "other_ranks"
"""`waits_on`'s key, beside the phase times, of the path's seconds on other ranks' ops."""
WAITS_ON_KEYS = (*PHASE_TIMES, OTHER_RANKS)
"""`waits_on`'s keys, in order."""

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
    rank: int = 0
    """The rank whose op or host thread it is."""


def _host_step(start_s: float, end_s: float, rank: int) -> PathStep:
    return PathStep(start_s, end_s, PathGap.HOST.value, PathGap.HOST.value, "", "", rank)


def _step(span: SpanRow, start_s: float, end_s: float, rank: int) -> PathStep:
    stream, op_kind, buffer_kind, op, _, _ = span
    return PathStep(start_s, end_s, stream, op_kind, buffer_kind, op, rank)


class _Index:
    """A rank's spans of nonzero length by their end, and every end in order; the collectives
    it joined before a peer (`WaitRow`) by when they met."""

    def __init__(self, spans: Iterable[SpanRow], waits: Iterable[WaitRow] = ()):
        self.ending: dict[float, list[SpanRow]] = defaultdict(list)
        for span in spans:
            if span[5] > span[4]:
                self.ending[span[5]].append(span)
        self.ends = sorted(self.ending)
        self.waits = sorted(waits, key=lambda w: w.met_s)
        self.met = [w.met_s for w in self.waits]
        self._by_kind: dict[str, tuple[list[SpanRow], list[float], float]] | None = None

    def latest_end_before(self, t: float) -> float | None:
        i = bisect_left(self.ends, t)
        return self.ends[i - 1] if i else None

    def wait_in(self, span: SpanRow, after_s: float, t: float) -> WaitRow | None:
        """The collective run by `span` (of its kind, within it) that this rank joined before
        a peer and that met latest in (after_s, t]; None if none."""
        waits = self.waits
        for i in range(bisect_right(self.met, t) - 1, -1, -1):
            wait = waits[i]
            if wait.met_s <= after_s:
                return None
            if wait.op_kind == span[1] and span[4] <= wait.joined_s and wait.end_s <= span[5]:
                return wait
        return None

    def joining(self, wait: WaitRow) -> SpanRow | None:
        """This rank's op that ran the collective of `wait` (a peer's) and began before the
        moment it met: what holds the walk where nothing of the rank ends then."""
        met, end = wait.met_s, wait.end_s
        known = self._spans_by_kind().get(wait.op_kind)
        if known is None:
            return None
        rows, starts, longest = known
        i = bisect_left(starts, met) - 1
        while i >= 0 and starts[i] >= end - 2 * longest:   # twice: clear of rounding
            if rows[i][5] >= end:
                return rows[i]
            i -= 1
        return None

    def _spans_by_kind(self) -> dict[str, tuple[list[SpanRow], list[float], float]]:
        """The spans of each op kind by their start, the starts, and the longest span's
        length: a span that began more than that before a given end cannot reach it (made
        on first use)."""
        if self._by_kind is None:
            by_kind: dict[str, list[SpanRow]] = defaultdict(list)
            for ending in self.ending.values():
                for span in ending:
                    by_kind[span[1]].append(span)
            self._by_kind = {}
            for kind, rows in by_kind.items():
                rows.sort(key=lambda s: (s[4], s[5]))
                self._by_kind[kind] = (rows, [s[4] for s in rows],
                                       max(s[5] - s[4] for s in rows))
        return self._by_kind


class _Ranks:
    """Every rank's `_Index`, made on first use from `spans_of(rank)` and its peer waits."""

    def __init__(self, spans_of: Callable[[int], Iterable[SpanRow]],
                 waits: Iterable[tuple] = ()):
        self.spans_of = spans_of
        self.waits: dict[int, list[WaitRow]] = defaultdict(list)
        for row in waits:
            wait = WaitRow(*row)
            self.waits[wait.rank].append(wait)
        self._known: dict[int, _Index] = {}

    def __getitem__(self, rank: int) -> _Index:
        index = self._known.get(rank)
        if index is None:
            index = self._known[rank] = _Index(self.spans_of(rank), self.waits.get(rank, ()))
        return index


def _innermost(candidates: list[SpanRow], previous: PathStep | None) -> SpanRow:
    """The shortest of the spans ending at one instant; among equals, one on the stream of
    the step after it (its in-order predecessor), then by stream name."""
    stream = previous.stream if previous is not None else None
    return min(candidates, key=lambda s: (s[5] - s[4], s[0] != stream, s[0], s[1], s[3]))


def phase_path(spans: Iterable[SpanRow] | _Ranks, start_s: float, end_s: float, *,
               rank: int = 0) -> list[PathStep]:
    """The critical path of the window [start_s, end_s] of `rank`, in time order; its steps
    tile the window exactly. `spans`: the rank's spans, or every rank's spans and peer waits
    (`_Ranks`), which the walk follows from rank to rank."""
    ranks = spans if isinstance(spans, _Ranks) else _Ranks({rank: spans}.__getitem__)
    index = ranks[rank]
    steps: list[PathStep] = []
    enclosing: list[SpanRow] = []   # spans that ended with a chosen one and began before it
    t, previous, jumped_at = end_s, None, None
    while t > start_s:
        enclosing = [s for s in enclosing if s[4] < t]
        span, step = _step_ending(index, t, start_s, enclosing, previous, rank)
        wait = None if span is None else index.wait_in(span, step.start_s, t)
        if wait is not None and not (wait.met_s == t and jumped_at == t):
            if wait.met_s < t:
                steps.append(_step(span, wait.met_s, t, rank))
            rank, t, jumped_at = wait.last_rank, wait.met_s, wait.met_s
            index = ranks[rank]
            joining = index.joining(wait)
            enclosing = [] if joining is None else [joining]
            previous = None if joining is None else _step(joining, t, t, rank)
            continue
        steps.append(step)
        t, previous = step.start_s, step
    steps.reverse()
    return steps


def _step_ending(index: _Index, t: float, start_s: float, enclosing: list[SpanRow],
                 previous: PathStep | None, rank: int) -> tuple[SpanRow | None, PathStep]:
    """The step of the path that ends at `t` on `index`'s rank, and the span it is of (None
    for the host's): the innermost op ending then (the others that began before it join
    `enclosing`), else back to the latest earlier end, the enclosing op's or the host's."""
    candidates = [s for s in index.ending.get(t, ()) if s[4] < t]
    if candidates:
        span = _innermost(candidates, previous)
        enclosing += [s for s in candidates if s is not span and s[4] < span[4]]
        return span, _step(span, max(span[4], start_s), t, rank)
    earlier = index.latest_end_before(t)
    lower = start_s if earlier is None else max(earlier, start_s)
    if not enclosing:
        return None, _host_step(lower, t, rank)
    wrapper = max(enclosing, key=lambda s: s[4])
    return wrapper, _step(wrapper, max(lower, wrapper[4]), t, rank)


def rank_paths(spans: Sequence[tuple], phases: Sequence[tuple],
               waits: Iterable[tuple] = ()) -> list[tuple]:
    """Rows of `COLUMNS`: the critical path of every phase of every rank.
    `spans`: (rank, stream, op_kind, buffer_kind, op, start_s, end_s) rows;
    `phases`: (rank, phase, micro_batch, start_s, end_s) rows; `waits`: `records.PeerWait`
    rows (`WaitRow`'s fields)."""
    by_rank: dict[int, list[SpanRow]] = defaultdict(list)
    for rank, *span in spans:
        by_rank[rank].append(tuple(span))
    return _paths(_Ranks(lambda rank: by_rank.get(rank, ()), waits), phases)


def _paths(ranks: _Ranks, phases: Sequence[tuple]) -> list[tuple]:
    boundary: dict[int, int] = {}
    for rank, phase, micro, _, _ in phases:
        if phase == Phase.BACKWARD:
            boundary[rank] = max(boundary.get(rank, micro), micro)
    rows = []
    for rank, phase, micro, start_s, end_s in phases:
        key = phase_time(phase, micro, boundary.get(rank, micro))
        label = "" if key is None else key.value
        for step in phase_path(ranks, start_s, end_s, rank=rank):
            rows.append((rank, phase, micro, label, step.start_s, step.end_s, step.stream,
                         step.op_kind, step.buffer_kind, step.op, step.rank))
    return rows


def critical_path(result: Result, ranks: Iterable[int] | None = None) -> pd.DataFrame:
    """The critical path of every phase of `ranks` (default: every rank) of `result`: one row
    per step (`COLUMNS`; `phase_time` is the summary's phase time it counts in,
    `vocabulary.PhaseTime`, empty for a phase it does not count). The other ranks' spans are
    read where a phase waited for them (`Result.peer_waits`)."""
    import pandas as pd

    spans, phases = result.spans, result.phases
    if ranks is not None:
        phases = phases[phases["rank"].isin(list(ranks))]
    span_columns = ["stream", "op_kind", "buffer_kind", "op", "start_s", "end_s"]
    by_rank = spans.groupby("rank", sort=False)

    def spans_of(rank: int) -> list[SpanRow]:
        if rank not in by_rank.groups:
            return []
        rows = by_rank.get_group(rank)[span_columns]
        return list(rows.itertuples(index=False, name=None))

    waits = result.peer_waits[list(PEER_WAIT_COLUMNS)]
    phase_rows = phases[["rank", "phase", "micro_batch", "start_s", "end_s"]]
    rows = _paths(_Ranks(spans_of, waits.itertuples(index=False, name=None)),
                  list(phase_rows.itertuples(index=False, name=None)))
    return pd.DataFrame(rows, columns=list(COLUMNS))


def reported_rank(result: Result) -> int | None:
    """The rank whose phases `zerosim run` reports: the last to finish."""
    phases = result.phases[["rank", "phase", "micro_batch", "start_s", "end_s"]]
    return last_to_finish(phases.itertuples(index=False, name=None))


@dataclass(frozen=True)
class RankPath:
    """What one rank's phases waited on over the iteration: what `zerosim run` tabulates."""

    rank: int
    kinds: dict[str, list[tuple[str, float]]]
    """Seconds per summary phase time by what was waited on, longest first (`kind_totals`)."""
    through: dict[int, float]
    """Seconds of the path on each other rank's ops, where `rank` waited for it in a
    collective (the rank that joined last), by rank."""


def path_totals(path: pd.DataFrame, rank: int) -> dict[str, list[tuple[str, float]]]:
    """Seconds of `rank`'s critical path per summary phase time over the whole iteration, by
    what it waited on (`vocabulary.span_kind` of the step), longest first."""
    mine = path[path["rank"] == rank]
    return kind_totals(zip(mine.phase_time, mine.op_kind, mine.buffer_kind, mine.op,
                           mine.start_s, mine.end_s, strict=True))


def rank_path(path: pd.DataFrame, rank: int) -> RankPath:
    """`rank`'s `RankPath` from a critical-path table (`critical_path`)."""
    mine = path[path["rank"] == rank]
    return RankPath(rank, path_totals(mine, rank),
                    through_ranks(zip(mine.phase_time, mine.op_rank, mine.start_s, mine.end_s,
                                      strict=True), rank))


def through_ranks(steps: Iterable[tuple[str, int, float, float]], rank: int
                  ) -> dict[int, float]:
    """Seconds of (phase_time, op_rank, start_s, end_s) steps of a phase time on ranks other
    than `rank`, by rank in order (`RankPath.through`)."""
    seconds: dict[int, float] = defaultdict(float)
    for key, op_rank, start, end in steps:
        if key and op_rank != rank:
            seconds[int(op_rank)] += end - start
    return dict(sorted(seconds.items()))


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


def engine_path_totals(raw: RawRun) -> RankPath:
    """The reported rank's (the last to finish) `RankPath`, from the engine's record of a run
    that kept its host spans (`run_engine(host_spans=True)`): what `rank_path` gives a
    `Result`, without a DataFrame. A mirror rank's path is the rank's it stands for."""
    phases = [row[:5] for row in with_copies(raw.phases, 0, raw.stands_for).rows]
    rank = last_to_finish(phases)
    simulated = next((first for first, members in raw.stands_for.items() if rank in members),
                     rank)
    spans = [(r, stream, op_kind, buffer_kind, op, start, end)
             for r, stream, _, _, op, start, end, _, op_kind, buffer_kind in raw.spans.rows]
    steps = rank_paths(spans, [row[:5] for row in raw.phases.rows if row[0] == simulated],
                       raw.peer_waits.rows)
    return RankPath(rank, kind_totals((row[3], *row[7:10], row[4], row[5]) for row in steps),
                    through_ranks(((row[3], row[10], row[4], row[5]) for row in steps),
                                  simulated))


def through_text(through: dict[int, float]) -> str | None:
    """`RankPath.through` as text, 'rank 1 4.921, rank 3 0.210' (seconds per iteration);
    None where the path stayed on its rank."""
    return ", ".join(f"rank {rank} {seconds:.3f}" for rank, seconds in through.items()) or None


def waits_texts(path: RankPath) -> dict[str, str | None]:
    """A summary's `waits_on`: `waits_text` of every phase time (None for one the iteration
    does not have), and under `OTHER_RANKS` the path's seconds on other ranks' ops
    (`through_text`)."""
    totals = path.kinds
    return {**{key: waits_text(totals[key]) if totals.get(key) else None for key in PHASE_TIMES},
            OTHER_RANKS: through_text(path.through)}
