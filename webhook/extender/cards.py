"""The per-node card model and the per-card allocation state, built from Node and Pod objects.

One pure function (`node_state`, and `cluster_state` over many nodes) turns what the apiserver
holds into "which card of which node carries what". The extender's filter, prioritize and bind,
`gpu-admission inspect` and the audit all read state through it, so they can never disagree.

Cards of a node (`node_cards`):
- the labeler's inventory annotation `gpu-admission.io/gpu-inventory` when present, a JSON list
  `[{"index": 0, "uuid": "GPU-..", "name": "Tesla-T4", "memoryMiB": 15360}, ...]`; a card's
  memory in GiB is `memoryMiB // 1024` (never rounded up: the pod must fit in the real card), so
  mixed card sizes on one node work;
- otherwise `aliyun.com/gpu-mem` ÷ `aliyun.com/gpu-count` from the node's allocatable (capacity
  when allocatable lacks it; `aliyun.accelerator/nvidia_count` when gpu-count is absent), as
  gpushare does; topology nodes count `aliyun.com/gpu` whole cards.
- links between cards come from `gpu-admission.io/gpu-topology` (see `topology`).

What occupies a card (`pod_allocation`, `node_state`):
- a non-terminal pod bound to the node (`spec.nodeName`) carrying our allocation annotation
  `gpu-admission.io/allocation` that names that node; failing that, the gpushare annotations
  `ALIYUN_COM_GPU_MEM_IDX` + `ALIYUN_COM_GPU_MEM_POD` (pods placed by gpushare before us);
- a pod not bound yet whose allocation annotation names the node and was assumed less than the
  reservation TTL ago (a bind in flight, or one that failed and will be retried; after the TTL the
  card is free again);
- an unexpired entry of the node's reservation ledger `gpu-admission.io/reservations` for a pod
  not seen bound (the commit record of a bind in flight; see `binder` for the protocol).
Terminating pods (deletionTimestamp set) still count: their processes hold the card until they exit.
Succeeded and Failed pods do not.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
from collections.abc import Iterable, Mapping
from typing import Any, TypeGuard

from policies import gpu, podrequests, podspec, quantity
from webhook.extender import topology

INVENTORY_ANNOTATION = "gpu-admission.io/gpu-inventory"
ALLOCATION_ANNOTATION = gpu.ALLOCATION_ANNOTATION  # the key is the GPU model's; kept here for callers
RESERVATIONS_ANNOTATION = "gpu-admission.io/reservations"

DEFAULT_RESERVATION_TTL_S = 120.0
# A ledger entry younger than this is a bind in flight: its pod may not show up bound (or even in a
# watch cache) yet. Older entries of pods that are gone or placed elsewhere are dropped early.
IN_FLIGHT_GRACE_S = 10.0
CORE_PER_CARD = gpu.MAX_CORE_PERCENTAGE
MIB_PER_GIB = 1024
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


# --- cards of a node ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Card:
    """One physical card: its index on the node and its memory in GiB."""

    index: int
    memory_gib: int
    uuid: str = ""
    model: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class NodeCards:
    """A node as the extender sees it: mode, placement, cards and topology."""

    name: str
    mode: gpu.Mode | None  # None: the label holds a value that is no mode
    mode_label: str  # the raw label value ("" when absent)
    placement: gpu.Placement
    cards: tuple[Card, ...]
    address: str = ""
    links: topology.Topology = topology.EMPTY
    source: str = ""  # "inventory" or "capacity": where the card list came from
    problem: str = ""  # why the node offers no cards, for messages

    def card(self, index: int) -> Card | None:
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
    mode = _mode(mode_label)
    placement = gpu.Placement.SPREAD if labels.get(gpu.PLACEMENT_LABEL) == gpu.Placement.SPREAD else gpu.Placement.BINPACK
    common: dict[str, Any] = {
        "name": name,
        "mode": mode,
        "mode_label": mode_label,
        "placement": placement,
        "address": _address(node),
        "links": topology.parse(_string(annotations.get(topology.TOPOLOGY_ANNOTATION))),
    }
    if mode is None:
        return NodeCards(**common, cards=(), problem=f'{gpu.SCHEDULE_LABEL}="{mode_label}" is not a GPU mode')
    if mode not in gpu.SHARED_MODES and mode is not gpu.Mode.TOPOLOGY:
        return NodeCards(**common, cards=(), problem=f"the node is in {mode} (exclusive) mode")
    inventory = parse_inventory(_string(annotations.get(INVENTORY_ANNOTATION)))
    if inventory:
        return NodeCards(**common, cards=inventory, source="inventory")
    if mode is gpu.Mode.TOPOLOGY:
        count = _resource(node, gpu.Resource.ALIYUN_GPU) or _int(labels.get(gpu.CARD_COUNT_LABEL))
        memory = (_int(labels.get(gpu.CARD_MEMORY_MIB_LABEL)) or 0) // MIB_PER_GIB
        if not count:
            return NodeCards(**common, cards=(), problem=f"the node advertises no {gpu.Resource.ALIYUN_GPU}")
        return NodeCards(**common, cards=tuple(Card(index=i, memory_gib=memory) for i in range(count)), source="capacity")
    total = _resource(node, gpu.Resource.GPU_MEM)
    count = _resource(node, gpu.Resource.GPU_COUNT) or _int(labels.get(gpu.CARD_COUNT_LABEL))
    if not total:
        return NodeCards(**common, cards=(), problem=f"the node advertises no {gpu.Resource.GPU_MEM}")
    if not count:
        return NodeCards(
            **common, cards=(), problem=f"the node advertises no card count ({gpu.Resource.GPU_COUNT} or {gpu.CARD_COUNT_LABEL})"
        )
    per_card = total // count
    return NodeCards(**common, cards=tuple(Card(index=i, memory_gib=per_card) for i in range(count)), source="capacity")


@functools.lru_cache(maxsize=4096)  # pure and immutable: nodes share few distinct inventories
def parse_inventory(text: str | None) -> tuple[Card, ...]:
    """The cards of an inventory annotation; empty when missing or malformed (never raises)."""
    if not text:
        return ()
    try:
        document = json.loads(text)
    except ValueError:
        return ()
    if not isinstance(document, list):
        return ()
    cards: dict[int, Card] = {}
    for entry in document:
        if not isinstance(entry, Mapping):
            return ()
        index, memory = entry.get("index"), entry.get("memoryMiB")
        if not _is_count(index) or not _is_count(memory) or index in cards:
            return ()  # one bad entry makes the whole inventory untrustworthy: fall back to capacity
        cards[index] = Card(
            index=index,
            memory_gib=memory // MIB_PER_GIB,
            uuid=str(entry.get("uuid", "")),
            model=str(entry.get("name", "")),
        )
    return tuple(cards[i] for i in sorted(cards))


def render_inventory(cards: Iterable[Card | Mapping[str, Any]]) -> str:
    """An inventory annotation value (what the labeler writes; used by tests and tools)."""
    entries: list[dict[str, Any]] = []
    for card in cards:
        if isinstance(card, Card):
            entries.append({"index": card.index, "uuid": card.uuid, "name": card.model, "memoryMiB": card.memory_gib * MIB_PER_GIB})
        else:
            entries.append(dict(card))
    return json.dumps(entries, separators=(",", ":"))


# --- what a pod asks for --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Request:
    """What a pod asks of the extender: GiB and core percent on one card, or whole cards."""

    memory_gib: int = 0
    core_percent: int = 0
    cards: int = 0
    problem: str = ""  # non-empty: the request is malformed and fits nowhere

    @property
    def family(self) -> gpu.Family | None:
        if self.cards:
            return gpu.Family.TOPOLOGY
        if self.core_percent:
            return gpu.Family.SHARED_CORE
        if self.memory_gib:
            return gpu.Family.SHARED
        return None

    @property
    def managed(self) -> bool:
        """Whether the pod asks for anything the extender places."""
        return bool(self.problem) or self.family is not None

    def describe(self) -> str:
        if self.cards:
            return f"{self.cards} whole card{'s' if self.cards != 1 else ''} ({gpu.Resource.ALIYUN_GPU})"
        if self.core_percent:
            return f"{self.memory_gib} GiB ({gpu.Resource.GPU_MEM}) and {self.core_percent}% ({gpu.Resource.GPU_CORE_PERCENTAGE}) on one card"
        return f"{self.memory_gib} GiB ({gpu.Resource.GPU_MEM}) on one card"


_MANAGED = gpu.EXTENDER_MANAGED


def _managed(name: str) -> bool:
    return name in gpu.EXTENDER_RESOURCES


def pod_request(pod: Mapping[str, Any]) -> Request:
    """The effective request of a pod, per resource, counted as kube-scheduler counts it.

    `policies.podrequests` does the counting: regular containers and sidecars (init containers with
    `restartPolicy: Always`) add up, an ordinary init container needs its own amount plus the
    sidecars started before it, and the pod needs the largest of these; values are read as the
    cluster stores them (`2000m` is 2, `1k` is 1000). All containers of a pod share one card, as
    with gpushare: a 4 GiB sidecar beside a 4 GiB main container needs 8 GiB on one card.
    """
    spec = podspec.mapping(pod.get("spec"))
    asked = podrequests.pod_requests(spec, wanted=_managed)
    if asked.malformed:
        bad = asked.malformed[0]
        return Request(problem=f"{bad.container} asks for {bad.resource}: {bad.value!r}, which is not a whole non-negative number")
    memory, core, whole = (asked.get(name) for name in _MANAGED)
    if whole and (memory or core):
        return Request(problem=f"{gpu.Resource.ALIYUN_GPU} (whole cards) cannot be combined with {gpu.Resource.GPU_MEM} or {gpu.Resource.GPU_CORE_PERCENTAGE}")
    if core and not memory:
        return Request(problem=f"{gpu.Resource.GPU_CORE_PERCENTAGE} needs {gpu.Resource.GPU_MEM} beside it")
    if core > CORE_PER_CARD:
        return Request(problem=f"{gpu.Resource.GPU_CORE_PERCENTAGE} is {core}, more than one card ({CORE_PER_CARD})")
    return Request(memory_gib=memory, core_percent=core, cards=whole)


# --- allocations ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Allocation:
    """What one pod holds on one node: cards, and GiB and core percent on each of them."""

    uid: str
    namespace: str
    name: str
    node: str
    cards: tuple[int, ...]
    memory_gib: int = 0  # per card
    core_percent: int = 0  # per card
    whole: bool = False  # whole cards (aliyun.com/gpu): nobody else may use them
    assumed_at: float | None = None  # unix seconds of the bind decision
    expires: float | None = None  # reservations only
    bound: bool = False
    source: str = "allocation"  # "allocation" (our annotation), "gpushare" or "reservation"

    @property
    def pod_key(self) -> str:
        return f"{self.namespace}/{self.name}"


def allocation_annotation(allocation: Allocation) -> str:
    """The value of `gpu-admission.io/allocation` for an allocation."""
    return json.dumps(
        {
            "node": allocation.node,
            "cards": list(allocation.cards),
            "memGiB": allocation.memory_gib,
            "corePercent": allocation.core_percent,
            "whole": allocation.whole,
            "assumedAt": timestamp(allocation.assumed_at or 0.0),
        },
        separators=(",", ":"),
    )


def bind_annotations(allocation: Allocation, *, card_memory_gib: int) -> dict[str, str]:
    """Every annotation bind writes: the gpushare-compatible ones and our JSON allocation.

    `ALIYUN_COM_GPU_MEM_IDX` holds one index for a shared pod, as gpushare's device plugin expects;
    for whole cards it is the comma list of indices. `ALIYUN_COM_GPU_MEM_POD` and `_DEV` are written
    for shared pods only (they are GiB of `aliyun.com/gpu-mem`, which whole-card pods do not ask for).
    """
    assumed = allocation.assumed_at or 0.0
    found = {
        gpu.GPUSHARE_MEM_IDX_ANNOTATION: ",".join(str(card) for card in allocation.cards),
        gpu.GPUSHARE_MEM_ASSIGNED_ANNOTATION: "false",
        gpu.GPUSHARE_MEM_ASSUME_TIME_ANNOTATION: str(int(assumed * 1_000_000_000)),
        ALLOCATION_ANNOTATION: allocation_annotation(allocation),
    }
    if not allocation.whole:
        found[gpu.GPUSHARE_MEM_POD_ANNOTATION] = str(allocation.memory_gib)
        found[gpu.GPUSHARE_MEM_DEV_ANNOTATION] = str(card_memory_gib)
    return found


def pod_allocation(pod: Mapping[str, Any], *, now: float, ttl: float = DEFAULT_RESERVATION_TTL_S) -> Allocation | None:
    """What the pod holds according to its annotations, or None when it holds nothing now."""
    metadata = podspec.mapping(pod.get("metadata"))
    annotations = podspec.mapping(metadata.get("annotations"))
    spec = podspec.mapping(pod.get("spec"))
    status = podspec.mapping(pod.get("status"))
    if status.get("phase") in TERMINAL_PHASES:
        return None
    uid, namespace, name = str(metadata.get("uid", "")), str(metadata.get("namespace", "")), str(metadata.get("name", ""))
    bound_to = spec.get("nodeName") if isinstance(spec.get("nodeName"), str) else ""
    ours = _parse_allocation(_string(annotations.get(ALLOCATION_ANNOTATION)))
    if ours is not None:
        node, cards, memory, core, whole, assumed = ours
        if bound_to and bound_to != node:
            return None  # placed elsewhere by someone else; the annotation is stale
        if not bound_to and (assumed is None or assumed + ttl <= now):
            return None  # an annotated pod that never got bound: the reservation has expired
        return Allocation(
            uid=uid, namespace=namespace, name=name, node=node, cards=cards, memory_gib=memory,
            core_percent=core, whole=whole, assumed_at=assumed, bound=bool(bound_to),
        )
    if not bound_to:
        return None
    index = _int(annotations.get(gpu.GPUSHARE_MEM_IDX_ANNOTATION))
    shared = _int(annotations.get(gpu.GPUSHARE_MEM_POD_ANNOTATION))
    if index is None or shared is None:
        return None
    return Allocation(
        uid=uid, namespace=namespace, name=name, node=bound_to, cards=(index,), memory_gib=shared, bound=True, source="gpushare"
    )


def parse_reservations(text: str | None) -> dict[str, Allocation]:
    """The node's reservation ledger, by pod UID; malformed entries are dropped (never raises)."""
    return dict(_parse_reservations(text))


@functools.lru_cache(maxsize=4096)  # pure; callers get a fresh dict
def _parse_reservations(text: str | None) -> tuple[tuple[str, Allocation], ...]:
    return tuple(_read_reservations(text).items())


def _read_reservations(text: str | None) -> dict[str, Allocation]:
    if not text:
        return {}
    try:
        document = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(document, Mapping):
        return {}
    found: dict[str, Allocation] = {}
    for uid, entry in document.items():
        if not isinstance(entry, Mapping):
            continue
        parsed = _parse_allocation_fields(entry)
        expires = _parse_time(entry.get("expires"))
        pod = entry.get("pod")
        if parsed is None or expires is None or not isinstance(pod, str):
            continue
        node, cards, memory, core, whole, assumed = parsed
        namespace, _, name = pod.partition("/")
        found[uid] = Allocation(
            uid=uid, namespace=namespace, name=name, node=node, cards=cards, memory_gib=memory, core_percent=core,
            whole=whole, assumed_at=assumed, expires=expires, source="reservation",
        )
    return found


def render_reservations(reservations: Mapping[str, Allocation]) -> str:
    """The ledger annotation value (compact; sorted so equal ledgers are equal strings)."""
    document = {
        uid: {
            "pod": entry.pod_key,
            "node": entry.node,
            "cards": list(entry.cards),
            "memGiB": entry.memory_gib,
            "corePercent": entry.core_percent,
            "whole": entry.whole,
            "assumedAt": timestamp(entry.assumed_at or 0.0),
            "expires": timestamp(entry.expires or 0.0),
        }
        for uid, entry in sorted(reservations.items())
    }
    return json.dumps(document, separators=(",", ":"))


def node_reservations(node: Mapping[str, Any]) -> dict[str, Allocation]:
    annotations = podspec.mapping(podspec.mapping(node.get("metadata")).get("annotations"))
    return parse_reservations(_string(annotations.get(RESERVATIONS_ANNOTATION)))


def prune_reservations(
    reservations: Mapping[str, Allocation], *, pods: Iterable[Mapping[str, Any]], now: float
) -> dict[str, Allocation]:
    """The ledger without expired entries and without pods already seen bound (or finished).

    A bound pod carries its allocation annotation (bind writes it before creating the Binding), so
    its ledger entry is no longer needed; and a pod never unbinds.
    """
    settled = {uid for uid, pod in ((_uid(p), p) for p in pods) if uid and (_bound_to(pod) or _terminal(pod))}
    return {uid: entry for uid, entry in reservations.items() if (entry.expires or 0.0) > now and uid not in settled}


# --- state ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class CardState:
    """One card and what is on it."""

    card: Card
    memory_used: int = 0
    core_used: int = 0
    whole_used: bool = False
    allocations: tuple[Allocation, ...] = ()

    @property
    def index(self) -> int:
        return self.card.index

    @property
    def memory_free(self) -> int:
        return 0 if self.whole_used else max(0, self.card.memory_gib - self.memory_used)

    @property
    def core_free(self) -> int:
        return 0 if self.whole_used else max(0, CORE_PER_CARD - self.core_used)

    @property
    def idle(self) -> bool:
        return not self.allocations


@dataclasses.dataclass(frozen=True, kw_only=True)
class NodeState:
    """A node's cards with their occupation."""

    node: NodeCards
    cards: tuple[CardState, ...]
    allocations: tuple[Allocation, ...] = ()
    orphans: tuple[Allocation, ...] = ()  # allocations naming a card the node does not have (any more)

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
    bound = _bound_to(pod)
    if bound:
        return bound
    annotations = podspec.mapping(podspec.mapping(pod.get("metadata")).get("annotations"))
    parsed = _parse_allocation(_string(annotations.get(ALLOCATION_ANNOTATION)))
    return parsed[0] if parsed is not None else ""


def node_state(
    node: Mapping[str, Any] | NodeCards,
    pods: Iterable[Mapping[str, Any]],
    *,
    now: float,
    ttl: float = DEFAULT_RESERVATION_TTL_S,
    reservations: Mapping[str, Allocation] | None = None,
    exclude_uid: str = "",
) -> NodeState:
    """The occupation of one node's cards.

    `pods` may contain pods of other nodes (they are skipped). `reservations` defaults to the
    node's own ledger (pass it when `node` is a NodeCards). `exclude_uid` leaves one pod out: the
    pod being placed, whose own earlier attempt must not stand in its way.
    """
    if isinstance(node, NodeCards):
        cards, ledger = node, dict(reservations or {})
    else:
        cards = node_cards(node)
        ledger = dict(reservations) if reservations is not None else node_reservations(node)
    counted: dict[str, Allocation] = {}
    finished: set[str] = set()
    for pod in pods:
        uid = _uid(pod)
        if _terminal(pod):
            finished.add(uid)
            continue
        allocation = pod_allocation(pod, now=now, ttl=ttl)
        if allocation is not None and allocation.node == cards.name and allocation.uid != exclude_uid:
            counted[allocation.uid or f"{allocation.pod_key}"] = allocation
    for uid, entry in ledger.items():
        if uid in counted or uid in finished or uid == exclude_uid or (entry.expires or 0.0) <= now or entry.node != cards.name:
            continue
        counted[uid] = entry
    return _occupy(cards, counted.values())


def cluster_state(
    nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]], *, now: float, ttl: float = DEFAULT_RESERVATION_TTL_S
) -> dict[str, NodeState]:
    """`node_state` for every node, grouping the pods once."""
    grouped = pods_by_node(pods)
    result: dict[str, NodeState] = {}
    for node in nodes:
        name = str(podspec.mapping(node.get("metadata")).get("name", ""))
        result[name] = node_state(node, grouped.get(name, ()), now=now, ttl=ttl)
    return result


def occupy(node: NodeCards, allocations: Iterable[Allocation]) -> NodeState:
    """The state of `node` holding exactly `allocations` (what-ifs: explain, simulate)."""
    return _occupy(node, allocations)


def _occupy(node: NodeCards, allocations: Iterable[Allocation]) -> NodeState:
    memory: dict[int, int] = {card.index: 0 for card in node.cards}
    core: dict[int, int] = {card.index: 0 for card in node.cards}
    whole: dict[int, bool] = {card.index: False for card in node.cards}
    on_card: dict[int, list[Allocation]] = {card.index: [] for card in node.cards}
    placed: list[Allocation] = []
    orphans: list[Allocation] = []
    for allocation in sorted(allocations, key=lambda a: (a.assumed_at or 0.0, a.pod_key)):
        if not allocation.cards or any(index not in memory for index in allocation.cards):
            orphans.append(allocation)
            continue
        placed.append(allocation)
        for index in allocation.cards:
            memory[index] += allocation.memory_gib
            core[index] += allocation.core_percent
            whole[index] = whole[index] or allocation.whole
            on_card[index].append(allocation)
    states = tuple(
        CardState(card=card, memory_used=memory[card.index], core_used=core[card.index], whole_used=whole[card.index],
                  allocations=tuple(on_card[card.index]))
        for card in node.cards
    )
    return NodeState(node=node, cards=states, allocations=tuple(placed), orphans=tuple(orphans))


# --- small readers --------------------------------------------------------------------------------

_Parsed = tuple[str, tuple[int, ...], int, int, bool, float | None]


@functools.lru_cache(maxsize=65536)  # pure and immutable: one entry per allocated pod
def _parse_allocation(text: str | None) -> _Parsed | None:
    if not text:
        return None
    try:
        document = json.loads(text)
    except ValueError:
        return None
    return _parse_allocation_fields(document) if isinstance(document, Mapping) else None


def _parse_allocation_fields(document: Mapping[str, Any]) -> _Parsed | None:
    node, cards = document.get("node"), document.get("cards")
    memory, core = document.get("memGiB", 0), document.get("corePercent", 0)
    whole = document.get("whole", False)
    if not isinstance(node, str) or not node or not isinstance(cards, list) or not cards:
        return None
    if not all(_is_count(c) for c in cards) or not _is_count(memory) or not _is_count(core) or not isinstance(whole, bool):
        return None
    return node, tuple(cards), memory, core, whole, _parse_time(document.get("assumedAt"))


def timestamp(unix: float) -> str:
    """RFC 3339 UTC with milliseconds, as the annotations hold times."""
    moment = datetime.datetime.fromtimestamp(unix, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _parse_time(value: object) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


def _mode(value: str) -> gpu.Mode | None:
    if not value:
        return gpu.Mode.DEFAULT
    try:
        return gpu.Mode(value)
    except ValueError:
        return None


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


def _int(value: object) -> int | None:
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        number = int(value.strip())
        return number if number >= 0 else None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _string(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _uid(pod: Mapping[str, Any]) -> str:
    return str(podspec.mapping(pod.get("metadata")).get("uid", ""))


def _bound_to(pod: Mapping[str, Any]) -> str:
    node = podspec.mapping(pod.get("spec")).get("nodeName")
    return node if isinstance(node, str) else ""


def _terminal(pod: Mapping[str, Any]) -> bool:
    return podspec.mapping(pod.get("status")).get("phase") in TERMINAL_PHASES
