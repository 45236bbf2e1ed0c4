"""The extender's node state: a node's cards and what occupies each of them, from Node and Pod objects.

One pure function (`node_state`, and `cluster_state` over many nodes) turns what the apiserver
holds into "which card of which node carries what". The extender's filter, prioritize and bind,
`gpu-admission inspect`, `explain` and the audit all read state through it, so they can never
disagree. The formats it reads belong to the GPU model: the labeler's inventory and topology
annotations (`policies.gpu.inventory`), the pods' allocation annotations (`policies.gpu.allocation`) and
the node's reservation ledger (`policies.gpu.reservations`); what a pod asks for is `policies.gpu.cardrequest`.

Cards of a node (`node_cards`):
- the labeler's inventory annotation when present, so mixed card sizes on one node work;
- otherwise `aliyun.com/gpu-mem` ÷ `aliyun.com/gpu-count` from the node's allocatable (capacity
  when allocatable lacks it; `aliyun.accelerator/nvidia_count` when gpu-count is absent), as
  gpushare does; topology nodes count `aliyun.com/gpu` whole cards;
- links between cards come from the topology annotation.

What occupies a card (`node_state`):
- what a non-terminal pod holds by its annotations (`allocation.pod_allocation`): a pod bound to the
  node, or one not bound yet whose allocation was assumed less than the reservation TTL ago (a bind
  in flight, or one that failed and will be retried; after the TTL the card is free again);
- an unexpired entry of the node's reservation ledger for a pod not seen bound (the commit record of
  a bind in flight; see `binder` for the protocol).
Terminating pods (deletionTimestamp set) still count: their processes hold the card until they exit.
Succeeded and Failed pods do not.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable, Mapping
from typing import Any

from policies import gpu, podspec
from policies.gpu import allocation, dra, inventory, quantity, reservations

# --- cards of a node ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class NodeCards:
    """A node as the extender sees it: mode, placement, cards and topology."""

    name: str
    mode: gpu.Mode | None  # None: the label holds a value that is no mode
    mode_label: str  # the raw label value ("" when absent)
    placement: gpu.Placement
    cards: tuple[inventory.Card, ...]
    address: str = ""
    links: inventory.Topology = inventory.EMPTY_TOPOLOGY
    source: str = ""  # "inventory" or "capacity": where the card list came from
    problem: str = ""  # why the node offers no cards, for messages
    # The cards DRA claims hold, as (card UUID, the claims' results) pairs (`with_dra`): part of
    # what the node offers, so every what-if built on these cards (`occupy`) keeps them.
    dra: tuple[tuple[str, tuple[dra.Held, ...]], ...] = ()

    def card(self, index: int) -> inventory.Card | None:
        for card in self.cards:
            if card.index == index:
                return card
        return None

    @property
    def memory_gib(self) -> int:
        return sum(card.memory_gib for card in self.cards)

    @property
    def shared(self) -> bool:
        return self.mode in gpu.SHARED_MODES


def node_cards(node: Mapping[str, Any]) -> NodeCards:
    """The card model of a Node object (never raises; a broken node reads as one with no cards)."""
    metadata = podspec.mapping(node.get("metadata"))
    labels = podspec.mapping(metadata.get("labels"))
    annotations = podspec.mapping(metadata.get("annotations"))
    name = str(metadata.get("name", ""))
    raw_mode = labels.get(gpu.SCHEDULE_LABEL)
    mode_label = raw_mode if isinstance(raw_mode, str) else ""
    mode = gpu.mode_of(labels)
    common: dict[str, Any] = {
        "name": name,
        "mode": mode,
        "mode_label": mode_label,
        "placement": gpu.placement_of(labels),
        "address": _address(node),
        "links": inventory.read_topology(_string(annotations.get(gpu.TOPOLOGY_ANNOTATION))),
    }
    if mode is None:
        return NodeCards(**common, cards=(), problem=f'{gpu.SCHEDULE_LABEL}="{mode_label}" is not a GPU mode')
    if mode not in gpu.SHARED_MODES and mode is not gpu.Mode.TOPOLOGY:
        return NodeCards(**common, cards=(), problem=f"the node is in {mode} (exclusive) mode")
    listed = inventory.read_inventory(_string(annotations.get(gpu.INVENTORY_ANNOTATION)))
    if listed:
        return NodeCards(**common, cards=listed, source="inventory")
    if mode is gpu.Mode.TOPOLOGY:
        count = _resource(node, gpu.Resource.ALIYUN_GPU) or podspec.whole_number(labels.get(gpu.CARD_COUNT_LABEL))
        memory_mib = podspec.whole_number(labels.get(gpu.CARD_MEMORY_MIB_LABEL)) or 0  # the labeler's smallest card
        if not count:
            return NodeCards(**common, cards=(), problem=f"the node advertises no {gpu.Resource.ALIYUN_GPU}")
        return NodeCards(**common, cards=_capacity_cards(count, memory_mib=memory_mib), source="capacity")
    total = _resource(node, gpu.Resource.GPU_MEM)
    count = _resource(node, gpu.Resource.GPU_COUNT) or podspec.whole_number(labels.get(gpu.CARD_COUNT_LABEL))
    if not total:
        return NodeCards(**common, cards=(), problem=f"the node advertises no {gpu.Resource.GPU_MEM}")
    if not count:
        return NodeCards(
            **common, cards=(), problem=f"the node advertises no card count ({gpu.Resource.GPU_COUNT} or {gpu.CARD_COUNT_LABEL})"
        )
    return NodeCards(**common, cards=_capacity_cards(count, memory_mib=total // count * gpu.MIB_PER_GIB), source="capacity")


def with_dra(node: NodeCards, holds: dra.NodeHolds) -> NodeCards:
    """`node` with the DRA holds of its cards (`dra.holds(...)[node name]`); the same object when none."""
    pairs = tuple(sorted((uuid, held) for uuid, held in holds.items() if held))
    if pairs == node.dra:
        return node
    return dataclasses.replace(node, dra=pairs)


def _capacity_cards(count: int, *, memory_mib: int) -> tuple[inventory.Card, ...]:
    """Cards counted from the node's capacity or labels: model unknown, memory the same on each."""
    return tuple(inventory.Card(index=i, memory_mib=memory_mib) for i in range(count))


# --- state ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class CardState:
    """One card and what is on it."""

    card: inventory.Card
    memory_used: int = 0
    core_used: int = 0
    whole_used: bool = False
    allocations: tuple[allocation.Allocation, ...] = ()
    # DRA claims allocated this card (matched by its UUID, `policies.gpu.dra`): it offers nothing to
    # our pods while any does, whatever they hold of it.
    dra: tuple[dra.Held, ...] = ()

    @property
    def index(self) -> int:
        return self.card.index

    @property
    def memory_free(self) -> int:
        return 0 if self.whole_used or self.dra else max(0, self.card.memory_gib - self.memory_used)

    @property
    def core_free(self) -> int:
        return 0 if self.whole_used or self.dra else max(0, gpu.MAX_CORE_PERCENTAGE - self.core_used)

    @property
    def idle(self) -> bool:
        return not self.allocations and not self.dra


@dataclasses.dataclass(frozen=True, kw_only=True)
class NodeState:
    """A node's cards with their occupation."""

    node: NodeCards
    cards: tuple[CardState, ...]
    allocations: tuple[allocation.Allocation, ...] = ()
    orphans: tuple[allocation.Allocation, ...] = ()  # allocations naming a card the node does not have (any more)

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def memory_total(self) -> int:
        return self.node.memory_gib

    # Computed once per state (states are cached and judged for every pod; frozen dataclasses
    # still have an instance __dict__, which is where cached_property keeps its value).

    @functools.cached_property
    def memory_used(self) -> int:
        return sum(min(c.memory_used, c.card.memory_gib) if not c.whole_used else c.card.memory_gib for c in self.cards)

    @functools.cached_property
    def largest_card_gib(self) -> int:
        return max((c.card.memory_gib for c in self.cards), default=0)

    @functools.cached_property
    def free(self) -> tuple[tuple[int, int], ...]:
        """(free GiB, free core percent) of each card."""
        return tuple((c.memory_free, c.core_free) for c in self.cards)

    @functools.cached_property
    def idle_cards(self) -> int:
        return sum(1 for c in self.cards if c.idle)

    def card(self, index: int) -> CardState | None:
        for card in self.cards:
            if card.index == index:
                return card
        return None


def valid_until(state: NodeState, *, ttl: float) -> float:
    """When the first time-limited allocation counted in `state` stops counting (a ledger entry's
    expiry, or an unbound allocation's assumed time plus the reservation TTL); inf if none."""
    ends = [
        a.expires if a.expires is not None else (a.assumed_at or 0.0) + ttl
        for a in (*state.allocations, *state.orphans)
        if a.expires is not None or not a.bound
    ]
    return min(ends, default=math.inf)


def pods_by_node(pods: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Pods grouped by the node they occupy or reserve (bound node, else the annotation's node)."""
    grouped: dict[str, list[Mapping[str, Any]]] = {}
    for pod in pods:
        node = pod_node(pod)
        if node:
            grouped.setdefault(node, []).append(pod)
    return grouped


def pod_node(pod: Mapping[str, Any]) -> str:
    """The node a pod occupies (`spec.nodeName`) or reserves (its allocation annotation); "" if none."""
    return allocation.bound_node(pod) or allocation.annotated_node(pod)


def node_state(
    node: Mapping[str, Any] | NodeCards,
    pods: Iterable[Mapping[str, Any]],
    *,
    now: float,
    ttl: float = allocation.DEFAULT_RESERVATION_TTL_S,
    reservations: Mapping[str, allocation.Allocation] | None = None,
    exclude_uid: str = "",
    dra_holds: dra.NodeHolds = dra.NO_HOLDS,
) -> NodeState:
    """The occupation of one node's cards.

    `pods` may contain pods of other nodes (they are skipped). `reservations` defaults to the
    node's own ledger (pass it when `node` is a NodeCards). `exclude_uid` leaves one pod out: the
    pod being placed, whose own earlier attempt must not stand in its way. `dra_holds` are the
    node's cards DRA claims hold (`dra.holds(...)[node]`).
    """
    if isinstance(node, NodeCards):
        cards, ledger = node, dict(reservations or {})
    else:
        cards = node_cards(node)
        ledger = dict(reservations) if reservations is not None else _ledger(node)
    return count(
        cards,
        (holding(pod, now=now, ttl=ttl) for pod in pods),
        ledger=ledger,
        now=now,
        exclude_uid=exclude_uid,
        dra_holds=dra_holds,
    )


Holding = tuple[str, bool, allocation.Allocation | None]
"""What one pod means for its node's cards: its uid, whether it has finished, and what it holds
(`allocation.pod_allocation`; None where nothing)."""


def holding(pod: Mapping[str, Any], *, now: float, ttl: float = allocation.DEFAULT_RESERVATION_TTL_S) -> Holding:
    """One pod's `Holding`."""
    return _uid(pod), allocation.is_terminal(pod), allocation.pod_allocation(pod, now=now, ttl=ttl)


def count(
    node: NodeCards,
    holdings: Iterable[Holding],
    *,
    ledger: Mapping[str, allocation.Allocation],
    now: float,
    exclude_uid: str = "",
    dra_holds: dra.NodeHolds = dra.NO_HOLDS,
) -> NodeState:
    """The occupation of `node`'s cards from its pods' `Holding`s and its ledger: what `node_state`
    counts. A pod that holds something here counts once; a ledger entry counts while it has not
    expired, unless its pod is counted already, has finished, or is `exclude_uid`. Callers that
    keep holdings between calls (the extender's cache) count through here too."""
    counted: dict[str, allocation.Allocation] = {}
    finished: set[str] = set()
    for uid, terminal, held in holdings:
        if terminal:
            finished.add(uid)
            continue
        if held is not None and held.node == node.name and held.uid != exclude_uid:
            counted[held.uid or f"{held.pod_key}"] = held
    for uid, entry in ledger.items():
        if uid in counted or uid in finished or uid == exclude_uid or (entry.expires or 0.0) <= now or entry.node != node.name:
            continue
        counted[uid] = entry
    return _occupy(with_dra(node, dra_holds) if dra_holds else node, counted.values())


def _ledger(node: Mapping[str, Any]) -> dict[str, allocation.Allocation]:
    return reservations.node_reservations(node)  # module level: node_state's `reservations` argument hides the module


def cluster_state(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    *,
    now: float,
    ttl: float = allocation.DEFAULT_RESERVATION_TTL_S,
    dra_holds: Mapping[str, dra.NodeHolds] | None = None,
) -> dict[str, NodeState]:
    """`node_state` for every node, grouping the pods once; `dra_holds` by node (`dra.holds`)."""
    grouped = pods_by_node(pods)
    result: dict[str, NodeState] = {}
    for node in nodes:
        name = str(podspec.mapping(node.get("metadata")).get("name", ""))
        held = (dra_holds or {}).get(name, dra.NO_HOLDS)
        result[name] = node_state(node, grouped.get(name, ()), now=now, ttl=ttl, dra_holds=held)
    return result


def occupy(node: NodeCards, allocations: Iterable[allocation.Allocation]) -> NodeState:
    """The state of `node` holding exactly `allocations` (what-ifs: explain, simulate); the
    node's DRA holds (`NodeCards.dra`) stay."""
    return _occupy(node, allocations)


def _occupy(node: NodeCards, allocations: Iterable[allocation.Allocation]) -> NodeState:
    memory: dict[int, int] = {card.index: 0 for card in node.cards}
    core: dict[int, int] = {card.index: 0 for card in node.cards}
    whole: dict[int, bool] = {card.index: False for card in node.cards}
    on_card: dict[int, list[allocation.Allocation]] = {card.index: [] for card in node.cards}
    placed: list[allocation.Allocation] = []
    orphans: list[allocation.Allocation] = []
    by_uuid = dict(node.dra)
    for held in sorted(allocations, key=lambda a: (a.assumed_at or 0.0, a.pod_key)):
        if not held.cards or any(index not in memory for index in held.cards):
            orphans.append(held)
            continue
        placed.append(held)
        for index in held.cards:
            memory[index] += held.memory_gib
            core[index] += held.core_percent
            whole[index] = whole[index] or held.whole
            on_card[index].append(held)
    states = tuple(
        CardState(
            card=card,
            memory_used=memory[card.index],
            core_used=core[card.index],
            whole_used=whole[card.index],
            allocations=tuple(on_card[card.index]),
            dra=by_uuid.get(card.uuid, ()) if card.uuid else (),
        )
        for card in node.cards
    )
    return NodeState(node=node, cards=states, allocations=tuple(placed), orphans=tuple(orphans))


# --- small readers --------------------------------------------------------------------------------


def _address(node: Mapping[str, Any]) -> str:
    addresses = podspec.sequence(podspec.mapping(node.get("status")).get("addresses"))
    by_type = {a.get("type"): a.get("address") for a in addresses if isinstance(a, Mapping)}
    for kind in ("InternalIP", "ExternalIP", "Hostname"):
        value = by_type.get(kind)
        if isinstance(value, str) and value:
            return value
    return ""


def _resource(node: Mapping[str, Any], name: str) -> int:
    status = podspec.mapping(node.get("status"))
    for section in ("allocatable", "capacity"):
        value = podspec.mapping(status.get(section)).get(name)
        if value is not None:
            return quantity.count(value) or 0
    return 0


def _string(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _uid(pod: Mapping[str, Any]) -> str:
    return str(podspec.mapping(pod.get("metadata")).get("uid", ""))
