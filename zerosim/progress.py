"""A progress line on stderr while a run takes longer than a couple of seconds: simulated
time against the end it points to, extrapolated from the phases finished so far.

The engine hands its run context to `RunProgress.observe` before it starts; a background
thread reads the simulated clock and the finished phases (plain reads, no locking needed
under the GIL) and rewrites one line on a terminal until the run ends, then erases it.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import IO, Any

DELAY_S = 2.0      # no line for runs shorter than this
EVERY_S = 0.5      # how often the line is rewritten


class RunProgress:
    """`with RunProgress() as progress: simulate(scenario, observer=progress.observe)`."""

    def __init__(self, stream: IO[str] | None = None, *, enabled: bool | None = None,
                 delay_s: float = DELAY_S, every_s: float = EVERY_S):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.delay_s, self.every_s = delay_s, every_s
        self.ctx: Any = None
        self.started = time.perf_counter()
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.width = 0

    def observe(self, ctx: Any) -> None:
        """Called by the engine with its run context, just before the simulation starts."""
        self.ctx = ctx
        self.started = time.perf_counter()
        if self.enabled and self.thread is None:
            self.thread = threading.Thread(target=self._loop, name="zerosim-progress",
                                           daemon=True)
            self.thread.start()

    def line(self) -> str:
        """'simulating NAME: 4.21 s of about 7.47 s simulated (3 of 5 phases), 12 s'."""
        ctx = self.ctx
        scenario = ctx.scenario
        ranks = len(ctx.machine.stands_for)  # the simulated ranks (see `simulated_ranks`)
        expected = ranks * (2 * scenario.deepspeed.gradient_accumulation_steps + 1)
        done = min(len(ctx.phases), expected)
        now = float(ctx.env.now)
        end = f"about {now * expected / done:.2f} s" if done else "?"
        elapsed = time.perf_counter() - self.started
        return (f"simulating {scenario.name}: {now:.2f} s of {end} simulated ({done} of "
                f"{expected} phases), {elapsed:.0f} s")

    def _loop(self) -> None:
        if self.stop.wait(self.delay_s):
            return
        while not self.stop.is_set():
            self._write(self.line())
            self.stop.wait(self.every_s)

    def _write(self, text: str) -> None:
        padding = " " * max(0, self.width - len(text))
        self.stream.write(f"\r{text}{padding}")
        self.stream.flush()
        self.width = len(text)

    def __enter__(self) -> RunProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()
            if self.width:
                self.stream.write("\r" + " " * self.width + "\r")
                self.stream.flush()
