"""Memory pools: every allocation and free, by category, with OOM as a result."""

from __future__ import annotations

from collections.abc import Callable

from zerosim.engine.records import MemorySample, Table
from zerosim.vocabulary import BufferKind, Category, category_label

_LABELS = {(c, b): category_label(c, b) for c in Category for b in BufferKind}
"""Every label `category_label` makes, computed once (an allocation is labelled each time)."""


class OutOfMemory(Exception):
    """An allocation that did not fit: carried to `simulate`, which reports status `oom`."""

    def __init__(self, t_s: float, device: str, category: str, requested: int, in_use: int,
                 capacity: int, what: str):
        # SimPy re-raises a failed process's exception as type(exc)(*exc.args): keep them all.
        super().__init__(t_s, device, category, requested, in_use, capacity, what)
        self.t_s, self.device, self.category, self.what = t_s, device, category, what
        self.requested, self.in_use, self.capacity = requested, in_use, capacity

    def __str__(self) -> str:
        return (f"out of memory on {self.device} at t={self.t_s:.4f} s: {self.what} needs "
                f"{self.requested / 2**30:.2f} GiB ({self.category}) with "
                f"{self.in_use / 2**30:.2f} of {self.capacity / 2**30:.2f} GiB in use")

    def to_dict(self) -> dict:
        return {"t_s": self.t_s, "device": self.device, "category": self.category,
                "allocation": self.what, "requested_GiB": self.requested / 2**30,
                "in_use_GiB": self.in_use / 2**30, "capacity_GiB": self.capacity / 2**30}


class MemoryPool:
    """Byte counts per category on one device; records a sample only when a level changes.

    A category with a buffer kind (pinned or pageable host memory) is its own level, labelled
    as `vocabulary.category_label` says.
    """

    def __init__(self, device: str, capacity: float, clock: Callable[[], float],
                 log: Table[MemorySample] | None):
        self.device = device
        self.capacity = round(capacity)
        """Whole bytes, the nearest to what the profile gives (a GiB value converted to bytes
        need not land on an integer)."""
        self._clock = clock
        self._log = None if log is None else log.add
        self.levels: dict[str, int] = {}
        self.used = 0
        self.peak = 0
        self.window_peak = 0
        """The highest level since `reset_window` (PyTorch's `reset_peak_memory_stats`)."""

    def allocate(self, category: Category, nbytes: float, what: str,
                 buffer: BufferKind = BufferKind.NONE) -> int:
        amount = round(nbytes)
        if amount <= 0:
            return 0
        label = _LABELS[category, buffer]
        used = self.used + amount
        if used > self.capacity:
            raise OutOfMemory(self._clock(), self.device, label, amount, self.used,
                              self.capacity, what)
        level = self.levels[label] = self.levels.get(label, 0) + amount
        self.used = used
        if used > self.peak:
            self.peak = used
        if used > self.window_peak:
            self.window_peak = used
        if self._log is not None:
            self._log((self._clock(), self.device, label, level, buffer._value_))
        return amount

    def reset_window(self) -> None:
        self.window_peak = self.used

    def free(self, category: Category, amount: int, buffer: BufferKind = BufferKind.NONE
             ) -> None:
        """Give back `amount` bytes (the level only falls: the peak stands)."""
        if amount <= 0:
            return
        label = _LABELS[category, buffer]
        level = self.levels.get(label, 0)
        if amount > level:
            raise RuntimeError(f"{self.device}: freeing {amount} B of {label} with only "
                               f"{level} B allocated")
        level = self.levels[label] = level - amount
        self.used -= amount
        if self._log is not None:
            self._log((self._clock(), self.device, label, level, buffer._value_))


class NodePool(MemoryPool):
    """A node's host memory or drives in a run that folds mirror ranks, where a simulated
    rank's change stands for one per rank of its class, made one after the other
    (`SharedPool`).

    Within an instant the changes then come in another order than in the full simulation,
    but the level at the end of every instant is the same, and so is the peak unless the
    level both rose and fell within some instant and, in some order, could have passed the
    highest end-of-instant level. `order_free` says that it could not: then the peak is that
    level in every order, and no order ran out of memory.
    """

    def __init__(self, device: str, capacity: float, clock: Callable[[], float],
                 log: Table[MemorySample] | None):
        super().__init__(device, capacity, clock, log)
        self._instant: float | None = None
        self._start = self._rise = self._highest_end = self._highest_mixed = 0
        self._fell = False

    def allocate(self, category: Category, nbytes: float, what: str,
                 buffer: BufferKind = BufferKind.NONE) -> int:
        amount = super().allocate(category, nbytes, what, buffer)
        if amount:
            self._changed(amount)
        return amount

    def free(self, category: Category, amount: int, buffer: BufferKind = BufferKind.NONE
             ) -> None:
        super().free(category, amount, buffer)
        if amount > 0:
            self._changed(-amount)

    def _changed(self, delta: int) -> None:
        """Follow the instant's changes, once the level has moved by `delta`."""
        now = self._clock()
        if now != self._instant:
            before = self.used - delta
            self._close_instant(before)
            self._instant, self._start, self._rise, self._fell = now, before, 0, False
        if delta > 0:
            self._rise += delta
        else:
            self._fell = True

    def _close_instant(self, level: int) -> None:
        """End the current instant at `level`."""
        self._highest_end = max(self._highest_end, level)
        if self._fell and self._rise:
            self._highest_mixed = max(self._highest_mixed, self._start + self._rise)

    @property
    def order_free(self) -> bool:
        self._close_instant(self.used)
        return self._highest_mixed <= self._highest_end


class SharedPool:
    """A simulated rank's view of a pool (its node's host memory or drives) that it shares
    with the ranks it stands for (`Machine.stands_for`): each allocation and free is made
    once per rank of the class, one after the other, as those ranks make it at the same
    instant in the full simulation. The node's level at the end of every instant is then the
    full run's, and so is its peak when `NodePool.order_free`."""

    def __init__(self, pool: MemoryPool, ranks: int):
        self.pool = pool
        self.ranks = ranks

    def allocate(self, category: Category, nbytes: float, what: str,
                 buffer: BufferKind = BufferKind.NONE) -> int:
        amount = 0
        for _ in range(self.ranks):
            amount = self.pool.allocate(category, nbytes, what, buffer)
        return amount

    def free(self, category: Category, amount: int, buffer: BufferKind = BufferKind.NONE
             ) -> None:
        for _ in range(self.ranks):
            self.pool.free(category, amount, buffer)


def shared(pool: MemoryPool | None, ranks: int) -> MemoryPool | SharedPool | None:
    """`pool` as seen by a simulated rank standing for `ranks` ranks."""
    return pool if pool is None or ranks == 1 else SharedPool(pool, ranks)


class AllocatorReserve:
    """What PyTorch's CUDA caching allocator must newly reserve (`cudaMalloc`) for one rank's
    host thread since the cache was last emptied (`torch.cuda.empty_cache()`).

    Freed blocks stay cached and serve later requests, so only growth of the bytes in use
    beyond the highest level since the emptying calls `cudaMalloc`: a first-order model that
    takes any cached block to fit any request (no fragmentation). Levels count from the
    emptying: what was in use then stays reserved and is not counted."""

    def __init__(self) -> None:
        self.in_use = 0.0
        self.reserved = 0.0

    def allocate(self, nbytes: float) -> float:
        """Bytes the allocator must newly reserve for a request of `nbytes`."""
        self.in_use += nbytes
        fresh = max(0.0, self.in_use - self.reserved)
        self.reserved += fresh
        return fresh

    def free(self, nbytes: float) -> None:
        """`nbytes` go back to the cache (they stay reserved)."""
        self.in_use -= nbytes
