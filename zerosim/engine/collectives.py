"""Collectives: ranks meet, then rings run level by level over NVLink and the nodes' NICs."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

import simpy

from zerosim.engine.flows import FlowNetwork, SharedResource
from zerosim.hardware import costs
from zerosim.hardware.profile import HardwareProfile
from zerosim.vocabulary import Collective


@dataclass
class _Rendezvous:
    done: simpy.Event
    arrived: int = 0


class Collectives:
    """Every collective of a run, keyed by (kind, sequence number): each rank issues the
    collectives of a kind in the same order, so equal keys are the same call."""

    def __init__(self, env: simpy.Environment, flows: FlowNetwork, profile: HardwareProfile,
                 placements: Sequence[Any], nvlink: Sequence[SharedResource],
                 nic: dict[int, SharedResource]):
        self.env = env
        self.flows = flows
        self.profile = profile
        self.placements = placements
        self.nvlink = nvlink
        self.nic = nic
        self._pending: dict[tuple[Any, ...], _Rendezvous] = {}

    def join(self, rank: int, key: tuple[Any, ...], kind: Collective, total_bytes: float,
             ranks: Sequence[int]) -> Generator[simpy.Event, Any, None]:
        """Join collective `key`; it starts when the last of `ranks` arrives."""
        if len(ranks) <= 1:
            return
        meeting = self._pending.get(key)
        if meeting is None:
            meeting = self._pending[key] = _Rendezvous(self.env.event())
        meeting.arrived += 1
        if meeting.arrived == len(ranks):
            del self._pending[key]
            self.env.process(self._run(meeting.done, kind, total_bytes, ranks, key))
        yield meeting.done

    def _run(self, done: simpy.Event, kind: Collective, total_bytes: float,
                        ranks: Sequence[int], key: tuple[Any, ...]):
        """Run the collective's levels (see `costs.hierarchical_collective`) one after the
        other: each waits its latency, then one flow per GPU over its NVLink port or over its
        node's NICs (shared with the node's other GPUs)."""
        p = self.profile
        by_node: dict[int, list[int]] = {}
        for r in ranks:
            by_node.setdefault(self.placements[r].node, []).append(r)
        nodes = sorted(by_node)
        steps = costs.hierarchical_collective(
            kind, total_bytes, [len(by_node[n]) for n in nodes],
            nvlink_latency_s=p.nvlink_latency_s, network_latency_s=p.network_latency_s)
        label = f"{kind} {key}"
        for step in steps:
            yield self.env.timeout(step.latency_s)
            flows = []
            for node, nbytes in zip(nodes, step.bytes_per_gpu, strict=True):
                if nbytes <= 0:
                    continue
                for r in by_node[node]:
                    link = (self.nvlink[self.placements[r].gpu] if step.link == "nvlink"
                            else self.nic[node])
                    flows.append(self.flows.start(nbytes, {link: 1.0}, label=label))
            if flows:
                yield simpy.AllOf(self.env, flows)
        done.succeed()

    def assert_idle(self) -> None:
        if self._pending:
            keys = ", ".join(str(k) for k in self._pending)
            raise RuntimeError(f"collectives still waiting for ranks: {keys}")
