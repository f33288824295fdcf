"""Rank classes: the ranks of one node that a symmetry of the node maps onto one another, and
so run the same timeline (pure; no SimPy).

A rank's program depends on the rank only through its placement (one plan for every rank:
ZeRO pads each partition to the same size), and a placement touches the node's shared
resources only through its GPU's NUMA domain and the domains of its home and spread pages.
Every NUMA domain of a profile has the same memory bandwidth and every pair the same socket
link, every GPU the same PCIe and NVLink, and the node's CPU threads, NICs and drives serve all
ranks alike. So relabelling the domains (any permutation) and the GPUs with them is a symmetry
of the node whenever it maps every rank's placement onto another rank's: mirror ranks then see
mirror loads at every instant, and their timelines are equal.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from zerosim.hardware.profile import HardwareProfile

if TYPE_CHECKING:
    from zerosim.engine.machine import Placement

MOST_RELABELLED_DOMAINS = 7
"""Beyond 7 NUMA domains (5,040 relabellings) only ranks with the same placement are folded."""

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
    return (domains[gpu_domain], *(frozenset((domains[d], share) for d, share in shares)
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
    ranks_of: dict[Signature, list[int]] = {}
    for rank, signature in signatures.items():
        ranks_of.setdefault(signature, []).append(rank)
    counts = Counter(signatures.values())
    joined = {rank: {rank} for rank in signatures}
    for domains in _relabellings(profile.numa_domains):
        moved = {rank: _relabelled(sig, domains) for rank, sig in signatures.items()}
        if Counter(moved.values()) != counts:
            continue  # some rank would land on a placement no rank has
        for rank, signature in moved.items():
            _join(joined, [rank, *ranks_of[signature]])
    return tuple(sorted({tuple(sorted(members)) for members in joined.values()}))


def _relabellings(domains: int) -> Iterator[tuple[int, ...]]:
    """Every permutation of the domains (the identity alone past `MOST_RELABELLED_DOMAINS`)."""
    if domains > MOST_RELABELLED_DOMAINS:
        return iter([tuple(range(domains))])
    return itertools.permutations(range(domains))


def _join(joined: dict[int, set[int]], ranks: list[int]) -> None:
    """Merge the classes of `ranks` into one (every member then holds the same set)."""
    merged = set().union(*(joined[rank] for rank in ranks))
    for rank in merged:
        joined[rank] = merged
