"""Where hardware and SimPy meet: shared resources as flows, and the primitive activities.

Every copy and memory-bound CPU kernel is a flow over the resources it crosses (a GPU's PCIe
direction, a NUMA domain's memory bandwidth, a node's CPU threads, NVLink, the NIC); rates are
max-min fair (see `flows.py`). Collectives wait until every participating rank has arrived.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

import simpy

from zerosim.engine.collectives import Collectives
from zerosim.engine.flows import FlowNetwork, Reallocations, SharedResource, Usage
from zerosim.engine.records import PeerWait, Table
from zerosim.engine.software import PYTORCH_GRAIN_SIZE
from zerosim.hardware import costs
from zerosim.hardware.placement import CoreOrder, Placement, Shares, place_ranks
from zerosim.hardware.profile import HardwareProfile
from zerosim.units import ordered_sum
from zerosim.vocabulary import Collective, LinkKind, OpKind, PeerTransport

Direction = Literal["h2d", "d2h"]
NvmeDirection = Literal["read", "write"]


NETWORKS_REMEMBERED = 4
"""Machines whose `NetworkShapes` a process keeps between runs (`network_shapes`)."""


@dataclass(frozen=True, eq=False)
class NetworkShapes:
    """What a machine's flow network works out that depends only on its layout: flow shapes
    by what they carry (`Machine._shape`), the network's remembered reallocations
    (`FlowNetwork._reallocate`) and the collectives' shapes and steps. Runs on the same
    machine layout may share them (`network_shapes`): every value is a pure function of its
    key and of the layout, and reallocations are keyed by the shapes' identities, which
    sharing keeps."""

    usages: dict[tuple[Any, ...], Usage] = field(default_factory=dict)
    reallocations: Reallocations = field(default_factory=Reallocations)
    collective_usages: dict[tuple[Any, ...], Usage] = field(default_factory=dict)
    collective_rings: dict[tuple[Any, ...], costs.RingCollective] = field(default_factory=dict)


@lru_cache(maxsize=NETWORKS_REMEMBERED)
def network_shapes(profile: HardwareProfile, ranks: int, threads_per_rank: int | None,
                   classes: tuple[tuple[int, ...], ...] | None, bound: bool = False,
                   core_order: CoreOrder = "by_gpu") -> NetworkShapes:
    """The `NetworkShapes` of a `Machine(env, profile, ranks, threads_per_rank,
    bound=bound, core_order=core_order, classes=classes)`, the same object for every run of
    that layout in this process (a sweep runs one machine many times; working its shapes out
    again cost about 2% of a run)."""
    return NetworkShapes()


class Machine:
    """The node(s) of a run as SimPy-facing resources.

    Every one of the `ranks` placed ranks has its resources, but only the first rank of each
    of `classes` (by default every rank alone) is simulated: it stands for its whole class
    (`symmetry.rank_classes`), and each of its flows loads the resources as the flows of every
    rank of the class would (`FlowNetwork.usage` with copies).
    """

    def __init__(self, env: simpy.Environment, profile: HardwareProfile, ranks: int,
                 threads_per_rank: int | None, *, bound: bool = False,
                 core_order: CoreOrder = "by_gpu", record_rates: bool = True,
                 classes: Sequence[tuple[int, ...]] | None = None,
                 shapes: NetworkShapes | None = None,
                 run_nodes: Sequence[int] | None = None,
                 peer_waits: Table[PeerWait] | None = None):
        """`bound`: the launcher binds each rank to its part of the node (`bound_domains`,
        `runtime.bind_cores_to_rank`), cut from the core list `core_order` says; `shapes`:
        what earlier runs of this layout worked out (`network_shapes`), by default nothing;
        `run_nodes`: each placed node's index among the run's nodes (by default its own: a
        partly filled last node placed beside node 0 is the run's last); `peer_waits`: where
        collectives record the ranks that waited for a peer (`Collectives`), if anywhere."""
        self.env = env
        self.profile = profile
        self.placements = place_ranks(profile, ranks, bound=bound, core_order=core_order)
        self.stands_for = {members[0]: members
                           for members in (classes or [(r,) for r in range(ranks)])}
        """Each simulated rank, with the ranks it stands for (itself first)."""
        shapes = shapes or NetworkShapes()
        self.flows = FlowNetwork(env, record_rates=record_rates, keep_records=False,
                                 memo=shapes.reallocations)
        ranks_on_node = min(ranks, profile.gpus_per_node)
        self.threads_per_rank = threads_per_rank or costs.default_threads_per_rank(
            profile, ranks_on_node, bound=bound)
        self._usages = shapes.usages
        self._dma_shapes: dict[tuple[Any, ...], tuple[costs.HostBytes, Usage]] = {}
        self._build_resources(ranks)
        self.collectives = Collectives(env, self.flows, profile, self.placements,
                                       self.stands_for, self.nvlink, self.nic,
                                       (self.h2d, self.d2h), self.memory, self.uplinks,
                                       shapes=shapes, run_nodes=run_nodes,
                                       waits=peer_waits)

    @property
    def simulated(self) -> list[Placement]:
        return [self.placements[rank] for rank in self.stands_for]

    @property
    def folds_ranks(self) -> bool:
        """Whether a simulated rank stands for other ranks of its node."""
        return len(self.stands_for) < len(self.placements)

    def _build_resources(self, ranks: int) -> None:
        p = self.profile
        add = self.flows.add_resource
        self.h2d = [add(f"gpu{g}.pcie.h2d", p.h2d_pinned_Bps) for g in range(ranks)]
        self.d2h = [add(f"gpu{g}.pcie.d2h", p.d2h_pinned_Bps) for g in range(ranks)]
        peer = LinkKind.NVLINK if p.intra_node_transport is PeerTransport.NVLINK else LinkKind.PEER
        self.nvlink = [add(f"gpu{g}.{peer}", p.nvlink_Bps) for g in range(ranks)]
        """Each GPU's port into the node's ring: NVLink, or the limit of its peer path over
        PCIe (`intra_node.transport`)."""
        nodes = sorted({pl.node for pl in self.placements})
        self.uplinks = self._build_uplinks()
        self.memory = {(n, d): add(f"host{n}.numa{d}.memory", p.memory_Bps_per_domain)
                       for n in nodes for d in range(p.numa_domains)}
        self.socket_link = {(n, a, b): add(f"host{n}.numa{a}->numa{b}", p.socket_link_Bps)
                            for n in nodes for a in range(p.numa_domains)
                            for b in range(p.numa_domains) if a != b}
        self.socket_link_total = ({n: add(f"host{n}.socket-link", p.socket_link_total_Bps)
                                   for n in nodes} if p.socket_link_total_Bps > 0 else {})
        self.cpu = {}
        self.region_s = {}
        """Per node, what each parallel CPU region of its ranks waits at its join."""
        for n in nodes:
            on_node = sum(1 for pl in self.placements if pl.node == n)
            pools = costs.cpu_pools(p, on_node, self.threads_per_rank)
            self.cpu[n] = add(f"host{n}.cpu", pools.capacity_threads)
            self.region_s[n] = pools.region_wait_s
        # One resource per node for all its NICs: NCCL stripes its channels over every NIC of
        # the node (and a GPU's traffic is not tied to the NIC behind its PCIe switch), so the
        # NICs act as one pipe of nics_per_node x nic_GBps per direction.
        self.nic = {n: add(f"host{n}.nic", p.node_network_Bps) for n in nodes}
        self.nvme = self._build_nvme(nodes)

    def _build_uplinks(self) -> dict[int, tuple[SharedResource, SharedResource]]:
        """Per placed GPU, the uplink of the PCIe switch it sits behind, (host-to-device,
        device-to-host), shared by that switch's GPUs (`pcie.gpus_per_switch`); none where
        each GPU has a link of its own to the CPU."""
        p = self.profile
        if p.gpus_per_switch == 1:
            return {}
        switches: dict[tuple[int, int], tuple[SharedResource, SharedResource]] = {}
        for pl in self.placements:
            node, switch = pl.node, p.switch_of(pl.gpu)
            if (node, switch) not in switches:
                switches[node, switch] = tuple(
                    self.flows.add_resource(f"host{node}.switch{switch}.{kind}",
                                            p.switch_uplink_Bps)
                    for kind in (LinkKind.SWITCH_H2D, LinkKind.SWITCH_D2H))
        return {pl.gpu: switches[pl.node, p.switch_of(pl.gpu)] for pl in self.placements}

    def _uplink(self, pl: Placement, direction: Direction) -> dict[SharedResource, float]:
        """The switch uplink a copy of `pl`'s GPU crosses in `direction` (none without a
        shared switch)."""
        links = self.uplinks.get(pl.gpu)
        if links is None:
            return {}
        return {links[0] if direction == "h2d" else links[1]: 1.0}

    def _build_nvme(self, nodes: list[int]) -> dict[int, SharedResource]:
        """One resource per node for all its drives together, its capacity the drives' time
        (1 s per s): DeepSpeed writes every swap file under one `nvme_path`, so several drives
        serve it only as one striped volume (RAID 0), over which a large transfer spreads
        evenly, and max-min sharing of n drives that every flow crosses in equal parts is
        exactly that of one resource n times as fast. A byte read takes 1 / (read rate) of it
        and a byte written 1 / (write rate): reads and writes share the same flash and
        controllers (the spec sheets give each rate alone), so a read beside a write gets
        less than the read rate, unlike the two directions of a PCIe link. No drives, no
        resource."""
        if not self.profile.has_nvme:
            return {}
        return {n: self.flows.add_resource(f"host{n}.nvme", 1.0) for n in nodes}

    # ------------------------------------------------------------------ copies

    def dma(self, rank: int, direction: Direction, nbytes: float, *, pinned: bool,
            buffer: costs.HostBytes = costs.HOME_PAGES, label: str = ""
            ) -> Generator[simpy.Event, Any, None]:
        """A host<->device copy: PCIe latency, then a flow over the link and host memory.
        A pageable copy is staged through the driver's pinned buffer; `buffer` says where the
        pageable buffer's pages live."""
        if nbytes <= 0:
            return
        if self.profile.pcie_latency_s > 0:
            yield self.env.timeout(self.profile.pcie_latency_s)
        yield self.flows.start_usage(nbytes, self._dma_shape(rank, direction, pinned, buffer),
                                     label=label)

    def _dma_shape(self, rank: int, direction: Direction, pinned: bool,
                   buffer: costs.HostBytes) -> Usage:
        """A copy's shape, found by the identity of `buffer` (hashing the dataclass by value
        costs more than the rest of the look-up; the few buffers live all run)."""
        known = self._dma_shapes.get((rank, direction, pinned, id(buffer)))
        if known is not None and known[0] is buffer:
            return known[1]
        key = ("dma", rank, direction, pinned, buffer)
        usage = self._usages.get(key) or self._dma_usage(key, rank, direction, pinned, buffer)
        self._dma_shapes[(rank, direction, pinned, id(buffer))] = (buffer, usage)
        return usage

    def _shape(self, key: tuple[Any, ...], rank: int,
               resources: Callable[[Placement], dict[SharedResource, float]], *,
               max_rate: float | None = None, weight: float = 1.0) -> Usage:
        """The shape of a flow of `rank` that also stands for the same flow of every other
        rank of its class (`resources(placement)`: what one rank's flow crosses), checked
        once per `key`: flow shapes repeat (a rank copies the same way many times)."""
        usage = self._usages.get(key)
        if usage is None:
            usages = [resources(self.placements[r]) for r in self.stands_for.get(rank, (rank,))]
            usage = self._usages[key] = self.flows.usage(usages[0], max_rate=max_rate,
                                                         weight=weight, copies=usages[1:])
        return usage

    def _dma_usage(self, key: tuple[Any, ...], rank: int, direction: Direction, pinned: bool,
                   buffer: costs.HostBytes) -> Usage:
        p = self.profile
        host = costs.PINNED_DMA_HOST_BYTES if pinned else costs.pageable_dma_host_bytes(buffer)

        def crossed(pl: Placement) -> dict[SharedResource, float]:
            link = self.h2d[pl.gpu] if direction == "h2d" else self.d2h[pl.gpu]
            return ({link: 1.0} | self._uplink(pl, direction)
                    | self._host_memory(pl, host, self._gpu_domain(pl))
                    | self._remote_socket(pl, direction))

        peak = None if pinned else (p.h2d_pageable_Bps if direction == "h2d"
                                    else p.d2h_pageable_Bps)
        return self._shape(key, rank, crossed, max_rate=peak,
                           weight=p.dma_memory_weight / host.total)

    def nvme_read(self, rank: int, nbytes: float, *, label: str = ""
                  ) -> Generator[simpy.Event, Any, None]:
        """An aio read (swap in): `nbytes` from the node's NVMe drives into a pinned swap buffer
        of `rank`, crossing the drives' read capacity and the buffer's NUMA domain."""
        return self._nvme(rank, "read", nbytes, label)

    def nvme_write(self, rank: int, nbytes: float, *, label: str = ""
                   ) -> Generator[simpy.Event, Any, None]:
        """An aio write (swap out): `nbytes` from a pinned swap buffer of `rank` to the node's
        NVMe drives, crossing the drives' write capacity and the buffer's NUMA domain."""
        return self._nvme(rank, "write", nbytes, label)

    def _nvme(self, rank: int, direction: NvmeDirection, nbytes: float, label: str
              ) -> Generator[simpy.Event, Any, None]:
        """The drives' latency, then a flow striped over every drive of the rank's node, taking
        their time at the direction's rate (`_build_nvme`). The
        drives DMA straight into the pinned buffer (one host-memory byte per byte, on its home
        pages) with the same arbitration weight against CPU kernels as a GPU's DMA."""
        if nbytes <= 0:
            return
        pl = self.placements[rank]
        if pl.node not in self.nvme:
            raise ValueError(f"nvme_{direction} on {pl.host_device}: profile "
                             f"{self.profile.name!r} has no NVMe drives (nvme.drives_per_node "
                             "is 0)")
        if self.profile.nvme_latency_s > 0:
            yield self.env.timeout(self.profile.nvme_latency_s)
        host = costs.NVME_AIO_HOST_BYTES
        drive_s_per_byte = 1.0 / costs.nvme_node_Bps(self.profile, direction)
        usage = self._shape(
            ("nvme", rank, direction), rank,
            lambda pl: {self.nvme[pl.node]: drive_s_per_byte} | self._host_memory(pl, host),
            weight=self.profile.dma_memory_weight / host.total)
        yield self.flows.start_usage(nbytes, usage, label=label)

    def _host_memory(self, pl: Placement, host: costs.HostBytes,
                     accessors: Shares | None = None) -> dict[SharedResource, float]:
        """The bytes each of the rank's NUMA domains carries per unit of work. `accessors`:
        where what touches the pages sits (the rank's threads, or its GPU for a DMA); a byte
        touched from another domain costs its domain `host.remote_access_cost` local bytes."""
        usage: dict[SharedResource, float] = {}
        for shares, nbytes in ((pl.home, host.home), (pl.spread, host.spread)):
            for domain, share in shares:
                if nbytes * share > 0:
                    resource = self.memory[(pl.node, domain)]
                    cost = nbytes * share * self._access_cost(domain, accessors)
                    usage[resource] = usage.get(resource, 0.0) + cost
        return usage

    def _access_cost(self, domain: int, accessors: Shares | None) -> float:
        """Local bytes one byte on `domain` costs when `accessors` touch it (1 when remote
        bytes cost no more, as on one-domain nodes and profiles without the key)."""
        remote = self.profile.remote_access_cost
        if accessors is None or remote == 1.0:
            return 1.0
        return ordered_sum(share * (1.0 if where == domain else remote)
                           for where, share in accessors)

    def _gpu_domain(self, pl: Placement) -> Shares:
        return ((self.profile.gpu_domain(pl.gpu), 1.0),)

    def _remote_socket(self, pl: Placement, direction: Direction
                       ) -> dict[SharedResource, float]:
        """The share of a DMA between a GPU attached to one socket and home pages on another
        crosses the inter-socket link (UPI) in the direction the data moves, and, where the
        profile gives one, the limit both directions share (`host.socket_link_total_GBps`)."""
        attached = self.profile.gpu_domain(pl.gpu)
        usage: dict[SharedResource, float] = {}
        for domain, share in pl.home:
            if domain != attached:
                src, dst = ((attached, domain) if direction == "d2h"
                            else (domain, attached))
                usage[self.socket_link[(pl.node, src, dst)]] = share
                if self.socket_link_total:
                    total = self.socket_link_total[pl.node]
                    usage[total] = usage.get(total, 0.0) + share
        return usage

    # ------------------------------------------------------------------ CPU work

    def cpu_kernel(self, rank: int, elements: float, *, host: costs.HostBytes,
                   elements_per_s_per_thread: float, threads: float | None = None,
                   regions: int = 1, label: str = "") -> Generator[simpy.Event, Any, None]:
        """A multi-threaded CPU kernel bounded by its threads and its share of memory bandwidth,
        run as `regions` OpenMP parallel regions, each of which loses the node's
        `region_s` (oversubscription) at its join.

        Fairness is in host-memory bytes: a kernel touching 28 B per element gets the same
        bytes per second as a DMA when both saturate a NUMA domain.
        """
        if elements <= 0:
            return
        # `host` by its fields: hashing the dataclass costs more than the rest of the look-up
        key = ("cpu", rank, host.home, host.spread, elements_per_s_per_thread, threads)
        usage = self._usages.get(key)
        if usage is None:
            threads = min(threads or self.threads_per_rank, self.threads_per_rank)
            usage = self._shape(
                key, rank, lambda pl: ({self.cpu[pl.node]: 1.0 / elements_per_s_per_thread}
                                       | self._host_memory(pl, host, pl.threads)),
                max_rate=threads * elements_per_s_per_thread, weight=1.0 / host.total)
        yield self.flows.start_usage(elements, usage, label=label)
        lost = self.region_s[self.placements[rank].node] * regions
        if lost > 0:
            yield self.env.timeout(lost)

    def elementwise(self, rank: int, elements: float, host: costs.HostBytes, *,
                    threads: float | None = None, label: str = ""
                    ) -> Generator[simpy.Event, Any, None]:
        """A streaming CPU kernel of PyTorch's (unscale, casts): memory-bound per thread; one
        parallel region, or none below PyTorch's grain size, which the calling thread runs
        alone (`PYTORCH_GRAIN_SIZE`)."""
        rate = self.profile.elementwise_Bps_per_thread / host.total
        serial = elements < PYTORCH_GRAIN_SIZE
        yield from self.cpu_kernel(rank, elements, host=host, elements_per_s_per_thread=rate,
                                   threads=1 if serial else threads, regions=0 if serial else 1,
                                   label=label)

    def zero_pages(self, rank: int, nbytes: float, *, threads: float = 1,
                   where: costs.HostBytes = costs.HOME_PAGES, label: str = ""
                   ) -> Generator[simpy.Event, Any, None]:
        """The kernel zeroing the fresh pages of a new host temporary on first touch.

        Page faults are served by the thread that touches the page first: the CUDA driver's
        single staging thread for a pageable D2H (home pages), the cast's threads for a
        CPU-side cast (spread pages); `where` says which, per byte.
        """
        if nbytes <= 0:
            return
        usage = self._shape(
            ("zero", rank, threads, where.home, where.spread), rank,
            lambda pl: self._host_memory(pl, where, pl.threads),
            max_rate=self._zeroing_rate(threads))
        yield self.flows.start_usage(nbytes, usage, label=label)

    def _zeroing_rate(self, threads: float) -> float:
        """`threads` of one rank faulting fresh pages in together: each at the profile's
        rate, slowed by the serialised share of the fault path (`page_zeroing_contention`)."""
        profile = self.profile
        n = min(threads, self.threads_per_rank)
        return n * profile.page_zeroing_Bps / (1 + (n - 1) * profile.page_zeroing_contention)

    # ------------------------------------------------------------------ collectives

    def collective(self, rank: int, key: tuple[Any, ...], kind: Collective, total_bytes: float,
                   ranks: Sequence[int], within: OpKind | None = None
                   ) -> Generator[simpy.Event, Any, None]:
        """Join a collective; it starts when the last of `ranks` arrives. `within`: the kind
        of the op that runs it, where not the collective's own (`records.PeerWait.op_kind`)."""
        return self.collectives.join(rank, key, kind, total_bytes, ranks, within)

    def assert_idle(self) -> None:
        self.flows.assert_idle()
        self.collectives.assert_idle()
