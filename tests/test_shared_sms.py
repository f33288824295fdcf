"""`SharedSMs`: a side stream's kernel takes SM time from the compute stream's. Timelines in
plain seconds, worked out by hand."""

from __future__ import annotations

import simpy

from zerosim.engine.streams import SharedSMs


def _run(kernels: list[tuple[str, float, float]]) -> dict[str, tuple[float, float]]:
    """Run (name, start, seconds) kernels, a name starting with "side" on a side stream, the
    others on the compute stream; returns each one's (start, end)."""
    env = simpy.Environment()
    sms = SharedSMs(env)
    spans: dict[str, tuple[float, float]] = {}

    def kernel(name: str, start: float, seconds: float):
        yield env.timeout(start)
        work = sms.side(seconds) if name.startswith("side") else sms.compute(seconds)
        yield from work
        spans[name] = (start, env.now)

    for name, start, seconds in kernels:
        env.process(kernel(name, start, seconds))
    env.run()
    return spans


def test_a_compute_kernel_alone_takes_its_time():
    assert _run([("gemm", 2.0, 10.0)]) == {"gemm": (2.0, 12.0)}


def test_a_side_kernel_during_a_compute_kernel_holds_it_back_for_its_time():
    """The side copy (3 s from 4 s) runs as it would alone; the GEMM (10 s from 0) ends 3 s
    later."""
    assert _run([("gemm", 0.0, 10.0), ("side copy", 4.0, 3.0)]) == {
        "side copy": (4.0, 7.0), "gemm": (0.0, 13.0)}


def test_a_compute_kernel_started_during_a_side_kernel_waits_for_its_end():
    """The side copy runs 0-5 s; a 2 s kernel launched at 3 s gets the SMs at 5 s."""
    assert _run([("side copy", 0.0, 5.0), ("norm", 3.0, 2.0)]) == {
        "side copy": (0.0, 5.0), "norm": (3.0, 7.0)}


def test_a_side_kernel_while_the_compute_stream_is_idle_costs_nothing():
    assert _run([("side copy", 0.0, 5.0), ("gemm", 6.0, 4.0)]) == {
        "side copy": (0.0, 5.0), "gemm": (6.0, 10.0)}


def test_side_kernels_during_the_hold_of_another_extend_it_again():
    """A 10 s GEMM from 0: a 1 s side kernel at 1 s, a 2 s one at 3 s, and one of 4 s at 11 s,
    which the first two pushed inside the GEMM's window (it would have ended at 10 s, now at
    13 s): 10 + 1 + 2 + 4 = 17 s."""
    assert _run([("gemm", 0.0, 10.0), ("side a", 1.0, 1.0), ("side b", 3.0, 2.0),
                 ("side c", 11.0, 4.0)])["gemm"] == (0.0, 17.0)


def test_two_side_kernels_at_once_hold_it_back_for_the_union_of_their_times():
    """Side kernels at 2-6 s and 4-9 s overlap: together they take 7 s (2-9 s) from a 10 s
    GEMM, which ends at 17 s."""
    spans = _run([("gemm", 0.0, 10.0), ("side a", 2.0, 4.0), ("side b", 4.0, 5.0)])
    assert spans == {"side a": (2.0, 6.0), "side b": (4.0, 9.0), "gemm": (0.0, 17.0)}


def test_a_side_kernel_straddling_two_compute_kernels_holds_each_once():
    """A side kernel from 8 s to 12 s: the first GEMM (0-10 s alone) is held 4 s, to 14 s; the
    second, launched at 14 s after it, finds the side kernel done and takes its 5 s."""
    env = simpy.Environment()
    sms = SharedSMs(env)
    ends: list[float] = []

    def stream():
        for seconds in (10.0, 5.0):
            yield from sms.compute(seconds)
            ends.append(env.now)

    def side():
        yield env.timeout(8.0)
        yield from sms.side(4.0)

    env.process(stream())
    env.process(side())
    env.run()
    assert ends == [14.0, 19.0]


def test_a_side_kernel_that_starts_as_a_compute_kernel_ends_does_not_hold_it():
    """A 10 s GEMM from 0 and a side copy launched at 10 s (its process scheduled before the
    GEMM's resumes): the GEMM ends at 10 s all the same; the next kernel, launched then, waits
    for the copy (10-13 s) and ends at 15 s."""
    env = simpy.Environment()
    sms = SharedSMs(env)
    ends: list[float] = []

    def side():
        yield env.timeout(10.0)
        yield from sms.side(3.0)

    def stream():
        for seconds in (10.0, 2.0):
            yield from sms.compute(seconds)
            ends.append(env.now)

    env.process(side())
    env.process(stream())
    env.run()
    assert ends == [10.0, 15.0]
