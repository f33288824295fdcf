"""A wait on several events, as the engine uses SimPy's `AllOf`."""

from __future__ import annotations

from collections.abc import Sequence

import simpy
from simpy.events import PENDING


class AllDone(simpy.Event):
    """SimPy's `AllOf(env, events)`, minus the value nobody reads: it succeeds (with None)
    once every one of `events` has been processed, or fails as soon as one of them fails,
    at the same points of the event order as `AllOf`. `AllOf` also keeps a callback that
    builds a `ConditionValue` of the events and strips its checks off those not yet
    processed when it is processed; neither schedules anything, so leaving them out changes
    no event's place, and saves most of a condition's cost (the engine waits on about a
    thousand per run)."""

    def __init__(self, env: simpy.Environment, events: Sequence[simpy.Event]):
        self.env = env
        self.callbacks: list | None = []
        self._value = PENDING
        self._left = len(events)
        if not events:
            self.succeed()
            return
        for event in events:
            if event.env is not env:
                raise ValueError("It is not allowed to mix events from different environments")
        check = self._check
        for event in events:
            if event.callbacks is None:
                check(event)
            else:
                event.callbacks.append(check)

    def _check(self, event: simpy.Event) -> None:
        if self._value is not PENDING:
            return
        self._left -= 1
        if not event._ok:
            event._defused = True
            self.fail(event._value)
        elif not self._left:
            self.succeed()
