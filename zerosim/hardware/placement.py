"""Where a rank's GPU, host pages and CPU threads sit on its node (pure; no SimPy): the
profile's placement rule for unbound ranks, DeepSpeed's `--bind_cores_to_rank` for bound ones.
`zerosim check` prints it; the engine (`engine.machine`) loads each domain as it says."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from zerosim.hardware.profile import HardwareProfile

CoreOrder = Literal["by_gpu", "numbered"]
"""The core list a bound launch cuts into one part per rank (`runtime.bind_core_list`):
`by_gpu`, a `--bind_core_list` naming each GPU's domain's cores in GPU order (what the Deep
Optimizer States and MLP-Offload runs passed); `numbered`, no list, so DeepSpeed takes the
physical cores in their numbering (`deepspeed.utils.numa.get_numactl_cmd`), each domain's
cores numbered together."""

Shares = tuple[tuple[int, float], ...]
"""How a set of pages spreads over a node's NUMA domains: (domain, share of the pages) pairs."""


def everywhere(shares: Shares | frozenset[tuple[int, float]], domains: int) -> bool:
    """Whether the shares spread evenly over every one of `domains` domains."""
    return len(shares) == domains and len({share for _, share in shares}) == 1


@dataclass(frozen=True)
class Placement:
    """Where a rank lives: its node, its GPU, where its host pages sit (`home` for the buffers
    its host thread allocates, `spread` for tensors its CPU pool first touches, see
    `costs.HostBytes`), and where its CPU threads run (`threads`)."""

    rank: int
    node: int
    gpu: int
    home: Shares
    spread: Shares
    threads: Shares

    @property
    def device(self) -> str:
        return f"gpu{self.gpu}"

    @property
    def host_device(self) -> str:
        return f"host{self.node}"


def host_shares(profile: HardwareProfile, local_rank: int, ranks_on_node: int, *,
                bound: bool = False, core_order: CoreOrder = "by_gpu"
                ) -> tuple[Shares, Shares, Shares]:
    """Where a rank's home and spread pages live, and where its threads run.

    Bound ranks (`runtime.bind_cores_to_rank`) run on their share of the node's cores
    (`bound_domains`) and first touch their pages there (`bound_home`). Otherwise the
    threads run anywhere on the node and the pages follow the profile's rule: `round_robin`:
    Linux spreads the processes over the sockets, so home is domain r mod domains (first
    touch keeps pages local), while the OpenMP pool spans every socket and spreads what it
    first touches evenly; `gpu_local`: the node's own launcher binds each rank's threads and
    pages to its GPU's domain; `interleaved`: every page evenly on every domain (`numactl
    --interleave=all`, or threads that wander over the domains of one socket while they first
    touch the pages).
    """
    every = tuple((d, 1.0 / profile.numa_domains) for d in range(profile.numa_domains))
    if bound:
        domains = bound_domains(profile, local_rank, ranks_on_node, core_order)
        return bound_home(profile, domains), domains, domains
    if profile.rank_memory_placement == "gpu_local":
        local = ((profile.gpu_domain(local_rank), 1.0),)
        return local, local, local
    if profile.rank_memory_placement == "interleaved":
        return every, every, every
    return ((local_rank % profile.numa_domains, 1.0),), every, every


def bound_home(profile: HardwareProfile, part: Shares) -> Shares:
    """Where a bound rank's host thread first touches its own buffers. DeepSpeed's launcher
    binds memory (`numactl -m`) only when the rank's cores lie in one domain; a part that
    spans several gets `numactl -C` alone, so those pages land where the host thread runs as
    it allocates them, by the profile's rule within the part: one domain (`round_robin`,
    `gpu_local`: the thread is taken to stay where it starts, the part's first domain, while
    it allocates them), or every domain of the part (`interleaved`: a thread that wanders
    over them)."""
    if len(part) == 1 or profile.rank_memory_placement == "interleaved":
        return part
    return ((part[0][0], 1.0),)


def bound_domains(profile: HardwareProfile, local_rank: int, ranks_on_node: int,
                  core_order: CoreOrder = "by_gpu") -> Shares:
    """The domains of a bound rank's cores, by share of its cores, as DeepSpeed's launcher
    binds (`deepspeed.utils.numa.get_numactl_cmd`): it cuts the core list into equal
    consecutive parts, one per local rank, and binds memory too (`numactl -m`) when a part
    lies in one domain. zerosim's list holds every domain's cores, domains in the order of the
    GPUs attached to them (the first GPU's domain first; domains without a GPU last): so with
    one rank per GPU and a domain per GPU, each rank gets its GPU's domain; with one rank,
    every domain, as unbound. `numbered`: the domains in their own order (no list given)."""
    order = list(dict.fromkeys(profile.gpu_numa_domain)) if core_order == "by_gpu" else []
    order += [d for d in range(profile.numa_domains) if d not in order]
    width = len(order) / ranks_on_node
    start, end = local_rank * width, (local_rank + 1) * width
    shares = []
    for position, domain in enumerate(order):
        overlap = min(end, position + 1) - max(start, position)
        if overlap > 0:
            shares.append((domain, overlap / width))
    return tuple(shares)


def folded_nodes(ranks: int, gpus_per_node: int) -> tuple[int, ...]:
    """How many of the run's nodes each simulated node stands for. Full nodes run the same
    timeline (nodes share nothing but collectives, which are sized for every rank), so node 0
    stands for all of them; a partly filled last node runs another and is simulated beside
    it, standing for itself: (4,) for 16 ranks on nodes of 4, (3, 1) for 15, (1,) for 3."""
    full, rest = divmod(ranks, gpus_per_node)
    if full == 0:
        return (1,)
    return (full, 1) if rest else (full,)


def simulated_rank_count(ranks: int, gpus_per_node: int) -> int:
    """The ranks the engine places for `folded_nodes`: a full node's, and the partly filled
    last node's after them."""
    return min(ranks, gpus_per_node) + (ranks % gpus_per_node if ranks > gpus_per_node else 0)


def place_ranks(profile: HardwareProfile, ranks: int, *, bound: bool = False,
                core_order: CoreOrder = "by_gpu") -> list[Placement]:
    """Rank r drives GPU r; its host buffers and threads follow the profile's placement rule,
    or its share of the node's cores when `bound`."""
    per_node = min(ranks, profile.gpus_per_node)
    placements = []
    for rank in range(ranks):
        node, local = divmod(rank, profile.gpus_per_node)
        on_node = min(per_node, ranks - node * profile.gpus_per_node)
        placements.append(Placement(rank, node, rank,
                                    *host_shares(profile, local, on_node, bound=bound,
                                                core_order=core_order)))
    return placements
