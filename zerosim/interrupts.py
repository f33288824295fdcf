"""Ctrl-C and SIGTERM: one line and exit status 128 + signal, never a traceback, nothing
half-written.

`handled_interrupts()` (the command line wraps every command in it) turns SIGINT and SIGTERM
into an `Interrupted` exception, so `finally` blocks remove temporary files on the way out. A
second signal while that clean-up runs exits at once. A signal the process was started
ignoring (`nohup`, a background job of a script) stays ignored, as POSIX tools leave it.
`deferred_interrupts()` holds a signal back while a few renames publish an output folder, so a
folder is either published whole or not at all.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
SIGNAL_NAMES = {signal.SIGINT: "SIGINT (Ctrl-C)", signal.SIGTERM: "SIGTERM"}


class Interrupted(KeyboardInterrupt):
    """A SIGINT or SIGTERM arrived; `exit_status` is 128 + the signal number (130, 143)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return 128 + self.signum

    @property
    def signal_name(self) -> str:
        return SIGNAL_NAMES.get(self.signum, f"signal {self.signum}")


class _State:
    received: int | None = None   # the first signal
    raised = False                # Interrupted was raised: the command is unwinding
    deferring = 0                 # depth of deferred_interrupts()
    last_words = "interrupted"    # the line a second signal prints before exiting


def received_signal() -> int | None:
    """The signal that interrupted this command, if one did."""
    return _State.received


def exit_status_for(signum: int) -> int:
    return 128 + signum


def _handle(signum: int, frame: object) -> None:
    if _State.received is None:
        _State.received = signum
    if _State.deferring:
        return
    if _State.raised:
        sys.stderr.write(f"{_State.last_words}\n")
        sys.stderr.flush()
        os._exit(exit_status_for(_State.received))
    _State.raised = True
    raise Interrupted(signum)


def _listened_to() -> dict[int, object]:
    """The handled signals this process does not ignore, with their current handlers (None:
    installed from outside Python, which cannot be restored, so left alone)."""
    current = {s: signal.getsignal(s) for s in HANDLED_SIGNALS}
    return {s: h for s, h in current.items() if h is not None and h != signal.SIG_IGN}


@contextlib.contextmanager
def handled_interrupts(last_words: str = "interrupted") -> Iterator[None]:
    """SIGINT and SIGTERM raise `Interrupted` inside the block (main thread only; elsewhere the
    block runs with the handlers it has)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = _listened_to()
    _State.received, _State.raised, _State.deferring = None, False, 0
    _State.last_words = last_words
    for s in previous:
        signal.signal(s, _handle)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Hold SIGINT/SIGTERM back inside the block; one that arrived acts at its end (raises
    `Interrupted` under `handled_interrupts`, else does what it would have done)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if any(signal.getsignal(s) is _handle for s in HANDLED_SIGNALS):
        with _deferred_by_handler():
            yield
        return
    with _deferred_by_recorder():
        yield


@contextlib.contextmanager
def _deferred_by_handler() -> Iterator[None]:
    _State.deferring += 1
    try:
        yield
    finally:
        _State.deferring -= 1
    if _State.deferring == 0 and _State.received is not None and not _State.raised:
        _State.raised = True
        raise Interrupted(_State.received)


@contextlib.contextmanager
def _deferred_by_recorder() -> Iterator[None]:
    held: list[int] = []
    previous = _listened_to()
    for s in previous:
        signal.signal(s, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if held:
        signal.raise_signal(held[0])


def ignore_interrupts_in_worker() -> None:
    """Pool initializer: workers leave Ctrl-C to the parent, which stops them (no traceback
    from every worker)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
