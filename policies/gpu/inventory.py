"""A node's cards and links as the labeler describes them: the inventory and topology annotations' one codec.

The labeler writes both node annotations through `encode_inventory` and `encode_topology`; the
scheduler extender, `inspect`, `explain` and the audit read them back through `read_*` (lenient:
a missing or broken annotation reads as none) or `decode_*` (strict: `gpu.AnnotationError` says
what is wrong). A card's model name and memory are known here and nowhere else.

`gpu-admission.io/gpu-inventory` is a JSON list, one entry per card, keys sorted, no spaces:

    [{"index":0,"memoryMiB":15360,"name":"Tesla-T4","uuid":"GPU-.."}, ...]

- `index`: NVML's device index (a non-negative integer, unique on the node);
- `memoryMiB`: the card's memory in MiB (a non-negative integer); in GiB it is `memoryMiB // 1024`,
  never rounded up, since a pod must fit in the real card;
- `name`: the card model as `aliyun.accelerator/nvidia_name` spells it (`gpu.card_name_label_value`),
  so it compares equal to the label and to the card models pods ask for (GPU102);
- `uuid`: NVML's UUID. `name` and `uuid` may be left out (read as "").

`gpu-admission.io/gpu-topology` is `{"links": [[0, 1, "NV2"], [0, 2, "PIX"], ...]}`:

- one `[i, j, level]` triple per unordered pair of card indices (`i != j`, indices as in the inventory);
- `level` is what `nvidia-smi topo -m` prints for the pair, best first: `NV<n>` (n NVLinks bond the
  pair, 1 <= n <= 99), `PIX` (at most one PCIe bridge), `PXB` (several PCIe bridges, no host
  bridge), `PHB` (through a PCIe host bridge), `NODE` (across host bridges inside one NUMA node),
  `SYS` (across NUMA nodes); any case on input, upper case when written;
- a pair that is not listed counts as the worst connection, below `SYS`; other keys are ignored, so
  the shape can grow.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import re
from collections.abc import Iterable, Mapping
from typing import TypeGuard

from policies import gpu

# --- the inventory --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Card:
    """One physical card of a node: its index, memory, NVML UUID and model name."""

    index: int
    memory_mib: int
    uuid: str = ""
    name: str = ""  # the label-safe model name; "" where unknown (cards counted from node capacity)

    @property
    def memory_gib(self) -> int:
        """Whole GiB a pod can be given on this card (rounded down)."""
        return self.memory_mib // gpu.MIB_PER_GIB

    @property
    def model(self) -> str:
        """The card model, as `aliyun.accelerator/nvidia_name` spells it ("" where unknown)."""
        return self.name


def encode_inventory(cards: Iterable[Card]) -> str:
    """The inventory annotation value for `cards` (the bytes the labeler writes)."""
    entries = [{"index": card.index, "uuid": card.uuid, "name": card.name, "memoryMiB": card.memory_mib} for card in cards]
    return _compact(entries)


def decode_inventory(text: str) -> tuple[Card, ...]:
    """The cards of an inventory annotation, sorted by index; `gpu.AnnotationError` when it is malformed."""
    document = gpu.load_annotation(text, key=gpu.INVENTORY_ANNOTATION)
    if not isinstance(document, list):
        raise _error(gpu.INVENTORY_ANNOTATION, f"expected a JSON list of cards, got {_kind(document)}")
    cards: dict[int, Card] = {}
    for position, entry in enumerate(document):
        where = f"card [{position}]"
        if not isinstance(entry, Mapping):
            raise _error(gpu.INVENTORY_ANNOTATION, f"{where}: expected an object, got {_kind(entry)}")
        index, memory = entry.get("index"), entry.get("memoryMiB")
        if not _is_count(index):
            raise _error(gpu.INVENTORY_ANNOTATION, f"{where}: index must be a non-negative integer, got {index!r}")
        if not _is_count(memory):
            raise _error(gpu.INVENTORY_ANNOTATION, f"{where}: memoryMiB must be a non-negative integer, got {memory!r}")
        if index in cards:
            raise _error(gpu.INVENTORY_ANNOTATION, f"{where}: index {index} is listed twice")
        uuid, name = entry.get("uuid", ""), entry.get("name", "")
        for field, value in (("uuid", uuid), ("name", name)):
            if not isinstance(value, str):
                raise _error(gpu.INVENTORY_ANNOTATION, f"{where}: {field} must be a string, got {value!r}")
        cards[index] = Card(index=index, memory_mib=memory, uuid=str(uuid), name=str(name))
    return tuple(cards[index] for index in sorted(cards))


@functools.lru_cache(maxsize=4096)  # pure and immutable: nodes share few distinct inventories
def read_inventory(text: str | None) -> tuple[Card, ...]:
    """The cards of an inventory annotation; () when it is missing or malformed (never raises).

    One bad entry makes the whole inventory untrustworthy, so the reader falls back to what the
    node's capacity says rather than to part of the list.
    """
    if not text:
        return ()
    try:
        return decode_inventory(text)
    except gpu.AnnotationError:
        return ()


# --- link levels ----------------------------------------------------------------------------------


class Level(enum.StrEnum):
    """How two cards connect over PCIe or the CPUs, best first (NVLinks are `NV<n>`, better than all)."""

    PIX = "PIX"  # at most one PCIe switch between them (also: two GPUs on one board)
    PXB = "PXB"  # several PCIe switches, no host bridge
    PHB = "PHB"  # through one PCIe host bridge
    NODE = "NODE"  # through the interconnect of one NUMA node
    SYS = "SYS"  # across NUMA nodes / CPU sockets


NVLINK_PREFIX = "NV"
MAX_NVLINKS = 99
_NVLINK = re.compile(rf"^{NVLINK_PREFIX}([1-9][0-9]?)$")
# Scores per level; bigger is better. NVLink grows with its lane count and beats any PCIe path.
_LEVEL_SCORES: Mapping[str, int] = {Level.PIX: 5, Level.PXB: 4, Level.PHB: 3, Level.NODE: 2, Level.SYS: 1}
_NVLINK_SCORE = 10  # per NVLink
UNKNOWN_SCORE = 0


def nvlink_level(nvlinks: int) -> str:
    """The level of a pair bonded by `nvlinks` NVLinks (`NV2`); ValueError outside 1..99."""
    if not 1 <= nvlinks <= MAX_NVLINKS:
        raise ValueError(f"an NVLink level needs 1 to {MAX_NVLINKS} links, got {nvlinks}")
    return f"{NVLINK_PREFIX}{nvlinks}"


def nvlinks_of(level: str) -> int:
    """The NVLinks a normalised level names (`NV2` is 2); 0 for a PCIe or CPU level."""
    match = _NVLINK.match(level)
    return int(match.group(1)) if match else 0


def link_level(code: str) -> str:
    """A link level as written (`nv2`, ` pix `) normalised to `NV2`, `PIX`; ValueError for anything else."""
    normalised = code.strip().upper()
    if _NVLINK.match(normalised) or normalised in _LEVEL_SCORES:
        return normalised
    known = ", ".join([f"{NVLINK_PREFIX}<n>", *Level])
    raise ValueError(f"unknown link level {code!r} (expected one of {known})")


def level_score(level: str | None) -> int:
    """The score of one link level: NV<n> = 10·n, PIX 5, PXB 4, PHB 3, NODE 2, SYS 1, unknown 0."""
    if level is None:
        return UNKNOWN_SCORE
    normalised = level.strip().upper()
    nvlinks = nvlinks_of(normalised)
    if nvlinks:
        return _NVLINK_SCORE * nvlinks
    return _LEVEL_SCORES.get(normalised, UNKNOWN_SCORE)


def is_level(level: object) -> bool:
    """Whether `level` is a link level of the model (any case)."""
    return isinstance(level, str) and level_score(level) > UNKNOWN_SCORE


# --- the topology ---------------------------------------------------------------------------------


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


EMPTY_TOPOLOGY = Topology()


def encode_topology(links: Iterable[tuple[int, int, str]]) -> str:
    """The topology annotation value for `(a, b, level)` links: pairs ordered and sorted, levels upper case."""
    ordered = sorted((min(a, b), max(a, b), level.upper()) for a, b, level in links)
    return _compact({"links": [list(triple) for triple in ordered]})


def decode_topology(text: str) -> Topology:
    """The topology of an annotation value; `gpu.AnnotationError` names the first thing that is wrong."""
    return _topology(text, strict=True)


@functools.lru_cache(maxsize=4096)  # pure; the result is never mutated
def read_topology(text: str | None) -> Topology:
    """The topology of an annotation value; EMPTY_TOPOLOGY when missing or unreadable (never raises).

    Malformed triples are skipped one by one, so one bad entry does not hide the rest.
    """
    if not text:
        return EMPTY_TOPOLOGY
    try:
        return _topology(text, strict=False)
    except gpu.AnnotationError:
        return EMPTY_TOPOLOGY


def _topology(text: str, *, strict: bool) -> Topology:
    document = gpu.load_annotation(text, key=gpu.TOPOLOGY_ANNOTATION)
    if not isinstance(document, Mapping) or not isinstance(document.get("links"), list):
        raise _error(gpu.TOPOLOGY_ANNOTATION, 'expected a JSON object with a "links" list')
    links: dict[frozenset[int], str] = {}
    for position, entry in enumerate(document["links"]):
        problem = _link_problem(entry)
        if problem:
            if strict:
                raise _error(gpu.TOPOLOGY_ANNOTATION, f"link [{position}]: {problem}")
            continue
        a, b, level = entry
        links[frozenset((a, b))] = str(level).strip().upper()
    return Topology(links=links)


def _link_problem(entry: object) -> str:
    if not isinstance(entry, list) or len(entry) != 3:
        return f"expected [a, b, level], got {entry!r}"
    a, b, level = entry
    if not _is_count(a) or not _is_count(b) or a == b:
        return f"expected two different card indices, got {a!r} and {b!r}"
    if not is_level(level):
        return f"unknown link level {level!r}"
    return ""


# --- small helpers --------------------------------------------------------------------------------


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _error(key: str, problem: str) -> gpu.AnnotationError:
    return gpu.AnnotationError(f"{key}: {problem}")


def _kind(value: object) -> str:
    return type(value).__name__


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
