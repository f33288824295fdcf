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
        if self.tail is None or self.tail.callbacks is None:
            return None
        return self.tail


class SharedSMs:
    """A GPU's streaming multiprocessors, shared by the kernels its streams run at once.

    The compute stream's kernels fill the SMs. A kernel on another stream (the reduction
    stream's bucket copies, concatenations, scalings and adds; the all-gather stream's
    splits; a side optimizer's) takes SM time from them, as the block scheduler hands its
    blocks the SMs that the compute kernel's blocks leave: the GPU's time is conserved. To
    first order, a side kernel runs as it would alone and the compute kernel running meanwhile
    is held back for as long (one started during a side kernel waits for its end); a side
    kernel that runs while the compute stream is idle costs it nothing. Two side kernels at
    once hold it back for the union of their times. Collectives (NCCL's kernels, on a few SMs,
    bound by their links) and DMA copies (the copy engines) do not count.
    """

    __slots__ = ("busy", "env", "held", "instant", "started", "until", "up_to_instant")

    def __init__(self, env: simpy.Environment):
        self.env = env
        self.until = 0.0
        """When the side kernels started so far end."""
        self.busy = 0.0
        """The union of their times."""
        self.started = 0
        """How many have started."""
        self.instant = -1.0
        """When the last of them started."""
        self.up_to_instant = (0.0, 0)
        """(`busy`, `started`) before the side kernels that started at `instant`."""
        self.held = 0.0
        """How long they have held compute kernels back, in all."""

    def side(self, seconds: float) -> tuple[simpy.Event, ...]:
        """A kernel of `seconds` on a stream other than the compute stream, to `yield from`."""
        now = self.env.now
        if now != self.instant:
            self.instant, self.up_to_instant = now, (self.busy, self.started)
        end = now + seconds
        if end > self.until:
            self.busy += end - max(now, self.until)
            self.until = end
        self.started += 1
        return (self.env.timeout(seconds),)

    def _before(self, now: float) -> tuple[float, int]:
        """(`busy`, `started`) of the side kernels that started before `now`."""
        return self.up_to_instant if now == self.instant else (self.busy, self.started)

    def compute(self, seconds: float):
        """A compute-stream kernel of `seconds` alone, to `yield from`: it ends later by the
        side kernels' time from its start to its end (one that starts as it ends does not
        hold it)."""
        env, start = self.env, self.env.now
        busy_at_start, seen = self.busy, self.started
        held_at_start = max(0.0, self.until - start)
        held = held_at_start
        yield env.timeout(seconds + held)
        while True:
            busy, started = self._before(env.now)
            if started == seen:
                break
            seen = started
            extra = held_at_start + busy - busy_at_start - held
            if extra > 0:
                held += extra
                yield env.timeout(extra)
        self.held += held


class NcclTurn:
    """One collective's place in its `NcclQueue`."""

    __slots__ = ("before", "ran")

    def __init__(self, before: simpy.Event | None, ran: simpy.Event):
        self.before = before
        self.ran = ran

    def wait(self) -> tuple[simpy.Event, ...]:
        """What the collective waits for before it may start, to `yield from`."""
        before = self.before
        return (before,) if before is not None and before.callbacks is not None else ()

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
