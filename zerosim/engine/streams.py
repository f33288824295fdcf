"""In-order streams: a CUDA stream, the DMA queue of a copy, or a rank's CPU worker."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import simpy

from zerosim.engine.conditions import AllDone
from zerosim.engine.records import Span, Table
from zerosim.vocabulary import OpKind, Stream

Body = Callable[[], Iterable[simpy.Event]]
"""What an op does on its stream: the events to `yield from` (a generator, or a tuple of
timeouts)."""


class InOrderStream:
    """Runs ops one after another; an op also waits for the events it depends on.

    `launch` returns at once (the host thread goes on, as with an asynchronous CUDA launch);
    the returned event fires when the op has finished on the stream.
    """

    def __init__(self, env: simpy.Environment, rank: int, name: Stream, spans: Table[Span],
                 tag: Callable[[], tuple[str, int]]):
        self.env = env
        self.rank = rank
        self.name = name
        self._text = name._value_
        self._spans = spans
        self._tag = tag
        self.tail: simpy.Event | None = None

    def launch(self, op: str, body: Body, *, kind: OpKind,
               after: Sequence[simpy.Event | None] = (), nbytes: float = 0.0) -> simpy.Event:
        tail = self.tail
        waits = [tail] if tail is not None and tail.callbacks is not None else []
        for event in after:
            if event is not None and event.callbacks is not None:
                waits.append(event)
        phase, micro = self._tag()
        done = self.env.process(self._run(op, kind, body, waits, nbytes, phase, micro))
        self.tail = done
        return done

    def _run(self, op: str, kind: OpKind, body: Body, waits: list[simpy.Event], nbytes: float,
             phase: str, micro: int):
        if len(waits) == 1:
            yield waits[0]
        elif waits:
            yield AllDone(self.env, waits)
        start = self.env.now
        yield from body()
        self._spans.add((self.rank, self._text, phase, micro, op, start, self.env.now, nbytes,
                         kind._value_, ""))

    def idle_event(self) -> simpy.Event | None:
        """The event to wait for before this stream is idle (None when it already is)."""
        if self.tail is None or self.tail.processed:
            return None
        return self.tail


class NcclTurn:
    """One collective's place in its `NcclQueue`."""

    __slots__ = ("before", "ran")

    def __init__(self, before: simpy.Event | None, ran: simpy.Event):
        self.before = before
        self.ran = ran

    def wait(self) -> tuple[simpy.Event, ...]:
        """What the collective waits for before it may start, to `yield from`."""
        before = self.before
        return (before,) if before is not None and not before.processed else ()

    def done(self) -> None:
        self.ran.succeed()


class NcclQueue:
    """The order one process group's collectives run in on a GPU. PyTorch launches every
    collective of a group on the group's NCCL stream, so each starts only once every
    collective the host issued on that group before it has finished, whichever CUDA stream
    the call was made from."""

    def __init__(self, env: simpy.Environment):
        self.env = env
        self.tail: simpy.Event | None = None

    def issue(self) -> NcclTurn:
        """At the host's call: the collective's turn, after the one issued before it."""
        turn = NcclTurn(self.tail, self.env.event())
        self.tail = turn.ran
        return turn
