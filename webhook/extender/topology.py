"""The best-connected set of cards: which whole cards a topology pod gets on a node.

The link levels and the node annotation `gpu-admission.io/gpu-topology` they come from belong to
the GPU model (`policies.gpu.inventory`: `read_topology`, `Topology`, `level_score`); this module only
chooses cards by them. A node without topology scores every pair the same, so the lowest free
indices are chosen.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence

from policies.gpu import inventory

# Past this many candidate sets the exhaustive search gives way to a greedy one (16 choose 8 is 12870).
MAX_EXHAUSTIVE_SETS = 20_000


def set_score(cards: Sequence[int], topology: inventory.Topology) -> int:
    """The connectivity of a set of cards: the sum of its pairwise scores."""
    return sum(topology.score(a, b) for a, b in itertools.combinations(cards, 2))


def weakest_link(cards: Sequence[int], topology: inventory.Topology) -> int:
    """The worst pairwise score inside a set (a large number for a single card)."""
    if len(cards) < 2:
        return 10**6
    return min(topology.score(a, b) for a, b in itertools.combinations(cards, 2))


def best_set(free: Sequence[int], count: int, topology: inventory.Topology) -> tuple[int, ...] | None:
    """The best-connected `count` cards among `free`, or None when there are too few.

    For two or more cards: the set with the greatest sum of pairwise scores, then the best weakest
    link, then the lowest indices. For one card: the card least connected to the other free cards,
    which keeps the well-connected groups whole for later multi-card pods (HAMi does the same).
    Without topology every set scores the same, so the lowest free indices win.
    """
    ordered = sorted(set(free))
    if count <= 0 or count > len(ordered):
        return None
    if count == len(ordered) or not topology.known:
        return tuple(ordered[:count])
    if count == 1:
        return (min(ordered, key=lambda card: (sum(topology.score(card, o) for o in ordered if o != card), card)),)
    if math.comb(len(ordered), count) <= MAX_EXHAUSTIVE_SETS:
        candidates: Iterable[tuple[int, ...]] = itertools.combinations(ordered, count)
    else:
        candidates = (_greedy(ordered, count, topology, start=card) for card in ordered)
    return min(candidates, key=lambda cards: (-set_score(cards, topology), -weakest_link(cards, topology), cards))


def _greedy(free: Sequence[int], count: int, topology: inventory.Topology, *, start: int) -> tuple[int, ...]:
    chosen = [start]
    while len(chosen) < count:
        rest = [card for card in free if card not in chosen]
        chosen.append(max(rest, key=lambda card: (sum(topology.score(card, c) for c in chosen), -card)))
    return tuple(sorted(chosen))
