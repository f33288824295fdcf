"""The GIL as far as it times anything: DeepSpeedCPUAdam's `adam_update` holds it, so the
Deep Optimizer States fork's helper thread starts no statement while CPU Adam runs."""

from __future__ import annotations

from pathlib import Path

import simpy

import zerosim
from zerosim.engine.rank import Gil

ROOT = Path(__file__).resolve().parent.parent


def test_a_statement_waits_for_the_call_holding_the_gil_and_no_longer():
    """The main thread holds the lock from 2 to 7 s; the helper's statements at 3 s and at
    8 s start at 7 s and at 8 s."""
    env = simpy.Environment()
    gil = Gil(env)
    starts: list[float] = []

    def main():
        yield env.timeout(2.0)
        gil.hold()
        yield env.timeout(5.0)
        gil.release()

    def helper(at: float):
        yield env.timeout(at)
        yield from gil.acquire()
        starts.append(env.now)

    env.process(main())
    for at in (3.0, 8.0):
        env.process(helper(at))
    env.run()
    assert starts == [7.0, 8.0]


def test_the_interleaved_helper_queues_no_16_bit_copy_while_cpu_adam_runs():
    """Queueing each 16-bit H2D is a Python statement of the helper (`copier.copy`): none
    starts strictly inside one of the rank's CPU Adam calls."""
    spans = zerosim.simulate(ROOT / "scenarios" / "polaris_dos.yaml").spans
    spans = spans[spans["rank"] == 0]
    adam = spans[(spans.stream == "cpu") & spans.op.str.startswith("cpu adam")]
    copies = spans[spans.stream == "copier.fp16"]
    assert len(copies) > 0 and len(adam) > 0
    for start in copies.start_s:
        assert not ((adam.start_s < start) & (start < adam.end_s)).any()
