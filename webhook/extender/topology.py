"""GPU link topology: the node annotation's shape, link levels, and the best-connected set of cards.

The labeler writes, and the extender reads, the node annotation `gpu-admission.io/gpu-topology`:

    {"links": [[0, 1, "NV2"], [0, 2, "PIX"], [1, 2, "SYS"], ...]}

- `links` is a list of `[i, j, level]` triples, one per unordered pair of card indices (`i != j`;
  the order of `i` and `j` does not matter; indices are the `index` of the inventory annotation
  `gpu-admission.io/gpu-inventory`, i.e. NVML's device index).
- `level` is what `nvidia-smi topo -m` prints for the pair, best first:
  `NV<n>` (n NVLink lanes bond the pair, e.g. `NV1`, `NV2`, `NV12`), `PIX` (at most one PCIe
  bridge), `PXB` (several PCIe bridges, no host bridge), `PHB` (through a PCIe host bridge),
  `NODE` (across host bridges inside one NUMA node), `SYS` (across NUMA nodes, SMP interconnect).
  Upper or lower case is accepted; anything else reads as unknown.
- A pair that is not listed (or has an unknown level) is treated as the worst connection, below `SYS`.
- Other keys are ignored, so the shape can grow (`"version": 1` is welcome but not required).

A missing or unreadable annotation means "no topology": every pair counts the same and the lowest
free indices are chosen.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence

TOPOLOGY_ANNOTATION = "gpu-admission.io/gpu-topology"

# Scores per level; bigger is better. NVLink grows with its lane count and beats any PCIe path.
_PCIE_SCORES: Mapping[str, int] = {"PIX": 5, "PXB": 4, "PHB": 3, "NODE": 2, "SYS": 1}
_NVLINK = re.compile(r"^NV(\d{1,2})$")
_NVLINK_BASE = 10
UNKNOWN_SCORE = 0

# Past this many candidate sets the exhaustive search gives way to a greedy one (16 choose 8 is 12870).
MAX_EXHAUSTIVE_SETS = 20_000


@dataclasses.dataclass(frozen=True, kw_only=True)
class Topology:
    """Pairwise link levels between the cards of one node."""

    links: Mapping[frozenset[int], str] = dataclasses.field(default_factory=dict)

    def level(self, a: int, b: int) -> str | None:
        """The link level between two cards, upper case, or None when unknown."""
        return self.links.get(frozenset((a, b)))

    def score(self, a: int, b: int) -> int:
        """How well two cards are connected (bigger is better; 0 when unknown)."""
        return level_score(self.level(a, b))

    @property
    def known(self) -> bool:
        return bool(self.links)


EMPTY = Topology()


def level_score(level: str | None) -> int:
    """The score of one link level: NV<n> = 10·n, PIX 5, PXB 4, PHB 3, NODE 2, SYS 1, unknown 0."""
    if level is None:
        return UNKNOWN_SCORE
    upper = level.strip().upper()
    match = _NVLINK.match(upper)
    if match:
        return _NVLINK_BASE * max(int(match.group(1)), 1)
    return _PCIE_SCORES.get(upper, UNKNOWN_SCORE)


def is_level(level: object) -> bool:
    """Whether `level` is a level this module knows."""
    return isinstance(level, str) and level_score(level) > UNKNOWN_SCORE


@functools.lru_cache(maxsize=4096)  # pure; the result is never mutated
def parse(text: str | None) -> Topology:
    """The topology in an annotation value; EMPTY for a missing or malformed one (never raises).

    Malformed triples are skipped one by one, so one bad entry does not hide the rest.
    """
    if not text:
        return EMPTY
    try:
        document = json.loads(text)
    except ValueError:
        return EMPTY
    if not isinstance(document, Mapping) or not isinstance(document.get("links"), list):
        return EMPTY
    links: dict[frozenset[int], str] = {}
    for entry in document["links"]:
        if not isinstance(entry, list) or len(entry) != 3:
            continue
        a, b, level = entry
        if not _is_index(a) or not _is_index(b) or a == b or not is_level(level):
            continue
        links[frozenset((a, b))] = str(level).strip().upper()
    return Topology(links=links)


def render(links: Iterable[tuple[int, int, str]]) -> str:
    """The annotation value for `links` (what the labeler writes), pairs sorted, compact JSON."""
    ordered = sorted((min(a, b), max(a, b), level.upper()) for a, b, level in links)
    return json.dumps({"links": [list(triple) for triple in ordered]}, separators=(",", ":"))


def set_score(cards: Sequence[int], topology: Topology) -> int:
    """The connectivity of a set of cards: the sum of its pairwise scores."""
    return sum(topology.score(a, b) for a, b in itertools.combinations(cards, 2))


def weakest_link(cards: Sequence[int], topology: Topology) -> int:
    """The worst pairwise score inside a set (a large number for a single card)."""
    if len(cards) < 2:
        return 10**6
    return min(topology.score(a, b) for a, b in itertools.combinations(cards, 2))


def best_set(free: Sequence[int], count: int, topology: Topology) -> tuple[int, ...] | None:
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


def _greedy(free: Sequence[int], count: int, topology: Topology, *, start: int) -> tuple[int, ...]:
    chosen = [start]
    while len(chosen) < count:
        rest = [card for card in free if card not in chosen]
        chosen.append(max(rest, key=lambda card: (sum(topology.score(card, c) for c in chosen), -card)))
    return tuple(sorted(chosen))


def _is_index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
