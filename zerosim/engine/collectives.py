"""Collectives: ranks meet, then NCCL's ring runs over NVLink (or PCIe, or host memory, as the
profile's `intra_node.transport` says) and, across nodes, the NICs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import simpy

from zerosim.engine.flows import FlowNetwork, SharedResource, Usage
from zerosim.engine.records import PeerWait, Table
from zerosim.hardware import costs
from zerosim.hardware.profile import HardwareProfile
from zerosim.vocabulary import Collective, OpKind, PeerTransport

if TYPE_CHECKING:
    from zerosim.engine.machine import NetworkShapes


SHM_HOST_BYTES_PER_RING_BYTE = 2.0
"""NCCL's SHM transport writes each byte a GPU sends into host memory and its peer reads it
back: per byte of a GPU's ring traffic (as much sent as received), a write and a read in the
host memory of its NUMA domain."""


def _add(over: dict[SharedResource, float], resource: SharedResource, share: float) -> None:
    over[resource] = over.get(resource, 0.0) + share


@dataclass
class _Rendezvous:
    done: simpy.Event
    arrived: int = 0
    joined: list[tuple[int, float, str]] = field(default_factory=list)
    """Each rank that has joined, when, and the kind of the op it joined from (kept where
    waits are recorded)."""


@dataclass(frozen=True)
class _Layout:
    """Who takes part in collectives over a set of ranks: how many ranks each of the nodes it
    spans has (every such node, simulated or not: the collective's size) and the simulated
    ranks by node, each node given as its place among those (a group of ranks on node 3
    alone, hpZ's or qgZ's, spans one node: place 0)."""

    per_node: tuple[int, ...]
    simulated: tuple[tuple[int, tuple[int, ...]], ...]
    arrivals: int
    switches: tuple[int, ...]
    """How many PCIe switches the ranks on each node sit behind (`pcie.gpus_per_switch`)."""

    def crossing(self, node: int) -> float:
        """The share of a node's ring steps that go from one PCIe switch to another: a ring
        through s switches leaves each once, s of its g steps on the node."""
        switches = self.switches[node]
        return switches / self.per_node[node] if switches > 1 else 0.0


class Collectives:
    """Every collective of a run, keyed by (kind, sequence number): each rank issues the
    collectives of a kind in the same order, so equal keys are the same call.

    Only the simulated ranks take part (every rank, or node 0's alone when
    `simulate.simulated_ranks` folds identical nodes, or one rank per class of mirror ranks:
    `stands_for`); a collective meets when they have all arrived and is sized for every rank
    it spans, on every node. Its one flow crosses the links of the simulated ranks and of
    those they stand for (the other nodes' NICs and links are not loaded: they mirror node 0's
    or the partly filled last node's).
    """

    def __init__(self, env: simpy.Environment, flows: FlowNetwork, profile: HardwareProfile,
                 placements: Sequence[Any], stands_for: dict[int, tuple[int, ...]],
                 nvlink: Sequence[SharedResource], nic: dict[int, SharedResource],
                 pcie: tuple[Sequence[SharedResource], Sequence[SharedResource]],
                 host_memory: dict[tuple[int, int], SharedResource],
                 uplinks: dict[int, tuple[SharedResource, SharedResource]], *,
                 shapes: NetworkShapes | None = None, run_nodes: Sequence[int] | None = None,
                 waits: Table[PeerWait] | None = None):
        """`nvlink`: each GPU's port into its node's ring (`Machine.nvlink`); `pcie`: each
        GPU's PCIe link, (host-to-device, device-to-host): GPUDirect RDMA between a GPU and a
        NIC crosses it, and so does the ring within a node that has no NVLink; `host_memory`:
        each (node, NUMA domain)'s memory bandwidth, which NCCL's SHM transport crosses;
        `uplinks`: per GPU behind a shared PCIe switch, the switch's uplink to the CPU
        (host-to-device, device-to-host; `Machine.uplinks`). `shapes`: the machine's `NetworkShapes`
        (collective shapes and rings kept there). `run_nodes`: each placed node's index among
        the run's nodes, whose share of the ring its ranks take (`Machine`). `waits`: where
        to record each rank that waited for a peer (`PeerWait`), if anywhere."""
        self.run_nodes = run_nodes
        self.waits = waits
        self.env = env
        self.flows = flows
        self.profile = profile
        self.placements = placements
        self.stands_for = stands_for
        self.nvlink = nvlink
        self.nic = nic
        self.pcie_in, self.pcie_out = pcie
        self.host_memory = host_memory
        self.uplinks = uplinks
        self.transport = profile.intra_node_transport
        self.weight = (1.0 if self.transport is PeerTransport.NVLINK
                       else profile.dma_memory_weight)
        """A flow's weight: over PCIe a pinned copy's (`Machine._dma_usage`), so the ring and
        a host copy split a GPU's link evenly. Over NVLink 1, as before the transports (the
        NICs' GPUDirect share of PCIe takes it too)."""
        self._pending: dict[tuple[Any, ...], _Rendezvous] = {}
        self._layouts: dict[int, tuple[Sequence[int], _Layout]] = {}
        self._rings: dict[tuple[Any, ...], costs.RingCollective] = (
            {} if shapes is None else shapes.collective_rings)
        self._over: dict[tuple[Any, ...], Usage] = (
            {} if shapes is None else shapes.collective_usages)
        """Per set of simulated ranks and their (NVLink, network) shares, the ring's flow
        shape (checked once)."""

    def _layout(self, ranks: Sequence[int]) -> _Layout:
        """The layout of `ranks`, computed once per sequence object (ranks share one)."""
        known = self._layouts.get(id(ranks))
        if known is not None and known[0] is ranks:
            return known[1]
        per_node = self.profile.gpus_per_node
        counts = Counter(r // per_node for r in ranks)
        by_node: dict[int, list[int]] = {}
        for r in ranks:
            if r in self.stands_for:
                node = self.placements[r].node
                by_node.setdefault(node if self.run_nodes is None else self.run_nodes[node],
                                   []).append(r)
        nodes = sorted(counts)
        switches = Counter(node for node, _ in {(r // per_node, self.profile.switch_of(r))
                                                for r in ranks})
        layout = _Layout(tuple(counts[n] for n in nodes),
                         tuple((nodes.index(n), tuple(by_node[n])) for n in sorted(by_node)),
                         sum(len(rs) for rs in by_node.values()),
                         tuple(switches[n] for n in nodes))
        self._layouts[id(ranks)] = (ranks, layout)
        return layout

    def join(self, rank: int, key: tuple[Any, ...], kind: Collective, total_bytes: float,
             ranks: Sequence[int], within: OpKind | None = None
             ) -> Generator[simpy.Event, Any, None]:
        """Join collective `key`; it starts when the last simulated rank of `ranks` arrives.
        `within`: the kind of the op that runs it, where not the collective's own."""
        if len(ranks) <= 1:
            return
        meeting = self._pending.get(key)
        if meeting is None:
            meeting = self._pending[key] = _Rendezvous(self.env.event())
        meeting.arrived += 1
        layout = self._layout(ranks)
        if self.waits is not None and layout.arrivals > 1:
            meeting.joined.append((rank, self.env.now, str(within or kind)))
        if meeting.arrived == layout.arrivals:
            del self._pending[key]
            self.env.process(self._run(meeting, kind, total_bytes, layout, key))
        yield meeting.done

    def _ring(self, kind: Collective, total_bytes: float, layout: _Layout
              ) -> costs.RingCollective:
        cache_key = (kind, total_bytes, layout.per_node)
        ring = self._rings.get(cache_key)
        if ring is None:
            p = self.profile
            shape = costs.all_to_all if kind == Collective.ALL_TO_ALL else partial(
                costs.ring_collective, kind)
            ring = self._rings[cache_key] = shape(
                total_bytes, layout.per_node, nvlink_latency_s=p.nvlink_latency_s,
                network_latency_s=p.network_latency_s)
        return ring

    def _run(self, meeting: _Rendezvous, kind: Collective, total_bytes: float,
             layout: _Layout, key: tuple[Any, ...]):
        """Run the collective's ring (see `costs.ring_collective`): its latency, then one flow
        over every GPU's way into the ring (`_ring_usage`)."""
        met_s = self.env.now
        ring = self._ring(kind, total_bytes, layout)
        yield self.env.timeout(ring.latency_s)
        if layout.simulated:
            yield self.flows.start_usage(ring.bytes_per_gpu, self._ring_usage(layout, ring),
                                         label=f"{kind} {key}")
        if meeting.joined:
            self._record_waits(meeting.joined, kind, met_s)
        meeting.done.succeed()

    def _record_waits(self, joined: list[tuple[int, float, str]], kind: Collective,
                      met_s: float) -> None:
        """A `PeerWait` for each rank that joined before the last one (in the order they
        joined), the collective ending now."""
        last_rank = joined[-1][0]
        add = self.waits.add
        for rank, joined_s, op_kind in joined:
            if joined_s < met_s:
                add((rank, str(kind), op_kind, joined_s, met_s, self.env.now, last_rank))

    def _ring_usage(self, layout: _Layout, ring: costs.RingCollective) -> Usage:
        """The ring as one flow of each GPU's bytes over every rank's links (`_links`: the
        simulated ranks and those they stand for): a ring moves its chunks in step, so it
        runs at the rate of its most loaded link, and a copy slowing one GPU's link slows
        the whole collective."""
        shares = tuple((ring.nvlink_share[node], ring.network_share[node],
                        layout.crossing(node)) for node, _ in layout.simulated)
        known = self._over.get((layout.simulated, shares))
        if known is not None:
            return known
        links = [self._links(member, share)
                 for (_, ranks), share in zip(layout.simulated, shares, strict=True)
                 for rank in ranks for member in self.stands_for[rank]]
        usage = self._over[(layout.simulated, shares)] = self.flows.usage(
            links[0], copies=links[1:], weight=self.weight)
        return usage

    def _links(self, rank: int, shares: tuple[float, float, float]
               ) -> dict[SharedResource, float]:
        """What `rank`'s part of a ring crosses per byte it sends: its NVLink port and its
        node's NICs by `shares` (a share of 0 leaves that link out; the third, the share of
        the node's steps between PCIe switches, `_Layout.crossing`). What goes through the
        NICs also crosses the GPU's own PCIe link both ways (GPUDirect RDMA: the ring sends
        out of the node and receives into it at one rate), where it shares the link with the
        rank's host copies. Within a node without NVLink the ring's bytes take the same way
        out of and into each GPU (`_peer_path`)."""
        nvlink_share, network_share, crossing = shares
        placement = self.placements[rank]
        over: dict[SharedResource, float] = {}
        if nvlink_share > 0:
            over[self.nvlink[placement.gpu]] = nvlink_share
            self._peer_path(over, placement, nvlink_share, crossing)
        if network_share > 0:
            over[self.nic[placement.node]] = network_share
            _add(over, self.pcie_out[placement.gpu], network_share)
            _add(over, self.pcie_in[placement.gpu], network_share)
        return over

    def _peer_path(self, over: dict[SharedResource, float], placement: Any, share: float,
                   crossing: float) -> None:
        """What a GPU's ring traffic within its node crosses besides its port (`nvlink`):
        without NVLink, each byte it sends leaves over its PCIe link's device-to-host
        direction and each byte it receives arrives over host-to-device, as many of each;
        through host memory (SHM) each also crosses its PCIe switch's uplink both ways, where
        it has one, and is written and read once in the host memory of its GPU's NUMA
        domain; peer-to-peer, the ring's steps from one switch to another (`crossing` of
        them) cross both switches' uplinks."""
        if self.transport is PeerTransport.NVLINK:
            return
        _add(over, self.pcie_out[placement.gpu], share)
        _add(over, self.pcie_in[placement.gpu], share)
        uplink = self.uplinks.get(placement.gpu)
        through_host = self.transport is PeerTransport.SHM
        if uplink is not None and (through_host or crossing > 0):
            up_share = share if through_host else share * crossing
            _add(over, uplink[0], up_share)
            _add(over, uplink[1], up_share)
        if through_host:
            domain = self.profile.gpu_domain(placement.gpu)
            _add(over, self.host_memory[(placement.node, domain)],
                 SHM_HOST_BYTES_PER_RING_BYTE * share)

    def assert_idle(self) -> None:
        if self._pending:
            keys = ", ".join(str(k) for k in self._pending)
            raise RuntimeError(f"collectives still waiting for ranks: {keys}")
