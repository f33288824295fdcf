"""The engine's event loop (`simulate.Environment` and `run_until`) processes the same events
in the same order as SimPy's own `Environment.run`: a log of every step of a tangle of
processes (zero and tiny delays, events succeeded by others, conditions, processes starting
processes, a failure caught) is the same under both; so it is with the engine's `AllDone` in
place of SimPy's `AllOf`."""

from __future__ import annotations

import random

import pytest
import simpy

from zerosim.engine.conditions import AllDone
from zerosim.engine.simulate import Environment, run_until


def _tangle(env: simpy.Environment, seed: int, log: list, all_of=simpy.AllOf) -> simpy.Event:
    rng = random.Random(seed)
    gates = [env.event() for _ in range(6)]

    def worker(name: str, depth: int):
        for step in range(rng.randint(2, 6)):
            log.append((env.now, name, step))
            choice = rng.random()
            if choice < 0.3:
                yield env.timeout(rng.choice([0, 0, 1e-20, 0.5, 1.0, 2.0]))
            elif choice < 0.45:
                gate = rng.choice(gates)
                if not gate.triggered:
                    gate.succeed(name)
                yield env.timeout(0)
            elif choice < 0.6 and depth < 3:
                yield env.process(worker(f"{name}.{step}", depth + 1))
            elif choice < 0.75 and depth < 3:
                yield all_of(env, [env.timeout(rng.choice([0, 1.0])),
                                   env.process(worker(f"{name}+{step}", depth + 1))])
            elif choice < 0.8:
                failing = env.event()
                waits = [env.timeout(rng.choice([0, 0.5])), failing, rng.choice(gates)]
                failing.fail(ValueError(name))
                try:
                    yield all_of(env, waits)
                except ValueError:
                    log.append((env.now, name, "caught in a wait on several"))
            elif choice < 0.85:
                failing = env.event()
                failing.fail(ValueError(name))
                try:
                    yield failing
                except ValueError:
                    log.append((env.now, name, "caught"))
            else:
                yield rng.choice(gates) if rng.random() < 0.3 else env.timeout(0.25)
        return name

    def opener():
        yield env.timeout(3.0)
        for gate in gates:
            if not gate.triggered:
                gate.succeed("opener")

    workers = [env.process(worker(f"w{i}", 0)) for i in range(5)]
    env.process(opener())
    return all_of(env, workers)


@pytest.mark.parametrize("all_of", [simpy.AllOf, AllDone], ids=["AllOf", "AllDone"])
@pytest.mark.parametrize("seed", range(12))
def test_the_engine_loop_keeps_simpys_order(seed, all_of):
    simpy_log: list = []
    reference = simpy.Environment()
    reference.run(_tangle(reference, seed, simpy_log))
    engine_log: list = []
    env = Environment()
    run_until(env, _tangle(env, seed, engine_log, all_of))
    assert engine_log == simpy_log
    assert env.now == reference.now
