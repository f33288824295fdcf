"""Rank classes: the ranks of one node that a symmetry of the node maps onto one another, and
so run the same timeline (pure; no SimPy).

A rank's program depends on the rank only through its placement (one plan for every rank:
ZeRO pads each partition to the same size), and a placement touches the node's shared
resources only through its GPU's NUMA domain and the domains of its home and spread pages.
Every NUMA domain of a profile has the same memory bandwidth and every pair the same socket
link, every GPU the same PCIe and NVLink, and the node's CPU threads, NICs and drives serve all
ranks alike. So relabelling the domains (any permutation) and the GPUs with them is a symmetry
of the node whenever it maps every rank's placement onto another rank's: mirror ranks then see
mirror loads at every instant, and their timelines are equal. Such relabellings are searched
domain by domain (`_relabelling_maps`), not enumerated: eight domains have 40,320.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from zerosim.hardware.placement import Placement, everywhere
from zerosim.hardware.profile import HardwareProfile

Signature = tuple[int, frozenset[tuple[int, float]], frozenset[tuple[int, float]],
                  frozenset[tuple[int, float]]]
"""What a rank's placement shows the node: its GPU's domain, its home and its spread pages,
where its threads run."""


def _signature(profile: HardwareProfile, placement: Placement) -> Signature:
    return (profile.gpu_domain(placement.gpu), frozenset(placement.home),
            frozenset(placement.spread),
            frozenset(placement.threads))


def _relabelled(signature: Signature, domains: tuple[int, ...]) -> Signature:
    gpu_domain, *pages = signature
    return (domains[gpu_domain], *(shares if everywhere(shares, len(domains))
                                   else frozenset((domains[d], share) for d, share in shares)
                                   for shares in pages))


def rank_classes(profile: HardwareProfile, placements: Sequence[Placement]
                 ) -> tuple[tuple[int, ...], ...]:
    """The ranks of `placements` (one node's, all of it placed) in classes of ranks that
    symmetries of the node map onto one another, each class in rank order, the classes in
    order of their first rank. Singletons when there is no symmetry, or when the ranks span
    several nodes (nodes are folded whole: `simulate.simulated_ranks`)."""
    if len({pl.node for pl in placements}) > 1:
        return tuple((pl.rank,) for pl in placements)
    signatures = {pl.rank: _signature(profile, pl) for pl in placements}
    counts = Counter(signatures.values())
    joined = {rank: {rank} for rank in signatures}
    ranks = sorted(signatures)
    for i, rank in enumerate(ranks):
        for other in ranks[i + 1:]:
            if other in joined[rank]:
                continue
            if signatures[rank] == signatures[other] or _relabelling_maps(
                    counts, signatures[rank], signatures[other], profile.numa_domains):
                _join(joined, [rank, other])
    return tuple(sorted({tuple(sorted(members)) for members in joined.values()}))


def _referenced(signature: Signature, domains: int) -> set[int]:
    """The domains a signature names, but for shares spread evenly over every domain (which
    any relabelling leaves as they are)."""
    gpu_domain, *pages = signature
    named = {gpu_domain}
    for shares in pages:
        if not everywhere(shares, domains):
            named |= {d for d, _ in shares}
    return named


def _relabelling_maps(counts: Counter[Signature], source: Signature, target: Signature,
                      domains: int) -> bool:
    """Whether some relabelling of the domains maps `source` onto `target` and every rank's
    signature onto a signature the node has, as often as it has it: a search over the
    domains the signatures name, each partial relabelling checked against every signature
    whose domains it has all placed (the domains no signature names follow in any order)."""
    kinds = list(counts)
    named = [_referenced(sig, domains) for sig in kinds]
    order = sorted(_referenced(source, domains))
    order += sorted(set().union(*named) - set(order))
    position = {d: i for i, d in enumerate(order)}
    done_at = [max(position[d] for d in n) for n in named]
    source_done = max(position[d] for d in _referenced(source, domains))
    relabel = list(range(domains))
    unnamed = [d for d in range(domains) if d not in position]

    def consistent(depth: int) -> bool:
        domains_now = tuple(relabel)
        if depth == source_done and _relabelled(source, domains_now) != target:
            return False
        return all(_relabelled(sig, domains_now) in counts
                   for sig, at in zip(kinds, done_at, strict=True) if at == depth)

    def extend(depth: int, free: set[int]) -> bool:
        if depth == len(order):
            rest = sorted(free)
            for d, image in zip(unnamed, rest, strict=True):
                relabel[d] = image
            mapping = tuple(relabel)
            return Counter({_relabelled(sig, mapping): n for sig, n in counts.items()}) == counts
        for image in sorted(free):
            relabel[order[depth]] = image
            if consistent(depth) and extend(depth + 1, free - {image}):
                return True
        return False

    return extend(0, set(range(domains)))


def _join(joined: dict[int, set[int]], ranks: list[int]) -> None:
    """Merge the classes of `ranks` into one (every member then holds the same set)."""
    merged = set().union(*(joined[rank] for rank in ranks))
    for rank in merged:
        joined[rank] = merged
