"""GPU-memory budgets per namespace: what a pod is charged, in one unit, and the namespace's ledger.

A namespace's budget (`gpuBudgets` in the settings, `policies.settings.budgets`) is GPU memory in
MiB, and optionally whole cards. Everything a namespace holds is charged in that one unit
(`Charge`), however it asks:

| what the pod holds | memory charged | cards charged |
|---|---|---|
| a share (`aliyun.com/gpu-mem`, with or without core percentage) | its GiB | 0 |
| whole cards placed by the extender (`aliyun.com/gpu`) | the memory of each card it was given | their number |
| whole cards of the device plugin (`nvidia.com/gpu`) | number x the node's card memory | their number |
| a time-sliced card (`nvidia.com/gpu.shared`) | the node's card memory (it may use all of it) | 0 |
| a MIG slice (`nvidia.com/mig-<g>g.<N>gb`) | N GiB per slice (the profile's memory) | 0 |
| a DRA claim, once allocated | each device's `memory` capacity in its ResourceSlice | 0 |

A node's card memory is the largest card of its inventory (`gpu.INVENTORY_ANNOTATION`), else the
labeler's `gpu.CARD_MEMORY_MIB_LABEL`, else GPU Feature Discovery's `nvidia.com/gpu.memory`. The
labels name one card (the labeler's its smallest; GFD assumes a node of one model), so they are
exact only on nodes of one card model; the labeler writes the inventory beside its label, so only
nodes labelled by others rely on them. Pods
bound to a node and not finished count (Terminating ones too: their processes hold the memory until
they exit); a pod still Pending counts only through its namespace's ledger (below). A DRA claim is
charged once, to the namespace it lives in, however many pods share it.

Before a pod is placed, its charge may depend on the node: `asked` is the most it could be charged
there (whole cards: the node's largest cards), so that the extender's filter never passes a node
where the bind would go over budget.

The ledger. Each budgeted namespace has one Lease in the ledger namespace (`lease_body`), holding
the pods charged there that are not seen bound yet: a bind in flight (entry `expires` after the
reservation TTL), or a pod let through the budget gate (no expiry: it holds its charge until it is
seen bound, finished or gone). The extender writes it by compare-and-swap before it commits a pod on
its node, so no two writers can spend the same room (the argument is the node ledger's, in
`webhook.extender.binder`): `used` is the bound pods' charges plus the unexpired entries, by pod UID
taking the larger where both count.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import Any, TypeGuard

from policies import gpu, podspec
from policies.gpu import allocation, cardrequest, cards, dra, inventory, podrequests, quantity, reservations

LEASE_PREFIX = "gpu-budget."
NAMESPACE_ANNOTATION = "gpu-admission.io/budget-namespace"  # the namespace whose ledger a Lease is
LEDGER_ANNOTATION = "gpu-admission.io/budget-ledger"  # its entries, JSON by pod UID
GFD_MEMORY_LABEL = "nvidia.com/gpu.memory"  # GPU Feature Discovery: MiB per card
# The scheduling gate the admission webhook gives pods the device plugin or DRA places in a
# budgeted namespace; the extender lifts it once the pod's charge is in the ledger.
GATE = "gpu-admission.io/budget"
MIB_PER_GIB = gpu.MIB_PER_GIB
# `nvidia.com/mig-<profile>`; the device plugin turns a profile's "+" into "." (`1g.10gb+me` is served
# as `mig-1g.10gb.me`), newer profiles end in `-me`, a time-sliced slice in `.shared`.
_MIG = re.compile(r"^nvidia\.com/mig-\d+g\.(\d+)gb([.+-][a-z0-9.+-]*)?$")
_MAX_NAME = 253


@dataclasses.dataclass(frozen=True, kw_only=True)
class Charge:
    """What a pod (or a claim) holds against its namespace's budget."""

    memory_mib: int = 0
    cards: int = 0
    problem: str = ""  # non-empty: the charge cannot be computed (what is known is still charged)

    def __add__(self, other: Charge) -> Charge:
        return Charge(
            memory_mib=self.memory_mib + other.memory_mib,
            cards=self.cards + other.cards,
            problem=self.problem or other.problem,
        )

    def at_least(self, other: Charge) -> Charge:
        """The larger of two charges of one pod, field by field."""
        return Charge(
            memory_mib=max(self.memory_mib, other.memory_mib),
            cards=max(self.cards, other.cards),
            problem=self.problem if self.memory_mib >= other.memory_mib else other.problem,
        )

    @property
    def charged(self) -> bool:
        return bool(self.memory_mib or self.cards)

    def describe(self) -> str:
        cards_ = f" and {self.cards} whole card{'s' if self.cards != 1 else ''}" if self.cards else ""
        return f"{gib(self.memory_mib)} GiB{cards_}"


NOTHING = Charge()


def gib(mib: int) -> str:
    """MiB as GiB for messages: whole where whole, else one decimal."""
    return str(mib // MIB_PER_GIB) if mib % MIB_PER_GIB == 0 else f"{mib / MIB_PER_GIB:.1f}"


# --- what one pod is charged ------------------------------------------------------------------------


def mig_memory_mib(resource: str) -> int | None:
    """The memory of one MIG slice by its resource name (`nvidia.com/mig-3g.40gb` is 40 GiB); None
    where the name is no MIG profile this can read."""
    found = _MIG.match(resource)
    return int(found.group(1)) * MIB_PER_GIB if found else None


def card_memory_mib(node: Mapping[str, Any] | None) -> int:
    """The memory of the node's largest card, in MiB; 0 where nothing says (see the module docstring)."""
    if node is None:
        return 0
    metadata = podspec.mapping(node.get("metadata"))
    annotations, labels = podspec.mapping(metadata.get("annotations")), podspec.mapping(metadata.get("labels"))
    text = annotations.get(gpu.INVENTORY_ANNOTATION)
    listed = inventory.read_inventory(text if isinstance(text, str) else None)
    if listed:
        return max(card.memory_mib for card in listed)
    for key in (gpu.CARD_MEMORY_MIB_LABEL, GFD_MEMORY_LABEL):
        value = podspec.whole_number(labels.get(key))
        if value:
            return value
    found = cards.node_cards(node)
    return max((card.memory_mib for card in found.cards), default=0)


def _native(name: str) -> bool:
    return name in gpu.NVIDIA_GPU_RESOURCES or name.startswith(gpu.NVIDIA_MIG_PREFIX)


def native_asks(pod: Mapping[str, Any]) -> dict[str, int]:
    """What the pod asks of the device plugin's GPU resources (`nvidia.com/gpu`, `.shared`, MIG)."""
    asked = podrequests.pod_requests(podspec.mapping(pod.get("spec")), wanted=_native)
    return {name: amount for name, amount in asked.amounts.items() if amount}


def _native_charge(asks: Mapping[str, int], card_mib: int, *, node: str) -> Charge:
    total = NOTHING
    for name, count in sorted(asks.items()):
        mig = mig_memory_mib(name)
        if mig is not None:
            total += Charge(memory_mib=mig * count)
        elif not card_mib:
            total += Charge(
                cards=count if name == gpu.Resource.NVIDIA_GPU else 0,
                problem=f"{name}: the card memory of node {node or '(not bound)'} is unknown (no inventory, "
                f"{gpu.CARD_MEMORY_MIB_LABEL} or {GFD_MEMORY_LABEL})",
            )
        elif name == gpu.Resource.NVIDIA_GPU:
            total += Charge(memory_mib=card_mib * count, cards=count)
        else:  # nvidia.com/gpu.shared: a replica of a time-sliced card may use all its memory
            total += Charge(memory_mib=card_mib * count)
    return total


def held_charge(pod: Mapping[str, Any], node: Mapping[str, Any] | None, *, now: float) -> Charge:
    """What a pod bound to `node` (its Node object, None where unknown) is charged now; NOTHING for
    a pod that holds nothing (finished, not bound). DRA claims are charged by `claim_charge`."""
    bound = allocation.bound_node(pod)
    if not bound or allocation.is_terminal(pod):
        return NOTHING
    total = NOTHING
    held = allocation.pod_allocation(pod, now=now)
    if held is not None:
        total += allocation_charge(held, node)
    else:
        asked = cardrequest.pod_request(pod)
        if asked.family is not None and not asked.problem:  # bound without our annotations: its ask, as kube-scheduler counts it
            total += Charge(
                memory_mib=asked.memory_gib * MIB_PER_GIB if not asked.cards else asked.cards * card_memory_mib(node),
                cards=asked.cards,
                problem="" if not asked.cards or card_memory_mib(node) else f"the card memory of node {bound} is unknown",
            )
    asks = native_asks(pod)
    if asks:
        total += _native_charge(asks, card_memory_mib(node), node=bound)
    return total


def allocation_charge(held: allocation.Allocation, node: Mapping[str, Any] | None) -> Charge:
    """The charge of the cards the extender gave a pod: its GiB on one card, or each whole card's memory."""
    if not held.whole:
        return Charge(memory_mib=held.memory_gib * MIB_PER_GIB * len(held.cards))
    model = cards.node_cards(node) if node is not None else None
    memory, unknown = 0, []
    for index in held.cards:
        card = model.card(index) if model is not None else None
        if card is None or not card.memory_mib:
            unknown.append(index)
        else:
            memory += card.memory_mib
    if unknown:  # the node (or its inventory) is gone: charge its largest card, as filter did
        largest = card_memory_mib(node)
        memory += largest * len(unknown)
        if not largest:
            return Charge(
                memory_mib=memory, cards=len(held.cards), problem=f"the memory of card(s) {unknown} on {held.node} is unknown"
            )
    return Charge(memory_mib=memory, cards=len(held.cards))


def asked(wanted: cardrequest.Request, node: cards.NodeCards | None) -> Charge:
    """The most a pod the extender places would be charged on this node (filter's bound); a share's
    charge needs no node (None)."""
    if not wanted.cards:
        return Charge(memory_mib=wanted.memory_gib * MIB_PER_GIB)
    if node is None:
        return Charge(cards=wanted.cards, problem="whole cards are charged by the node's cards; the node is not known")
    largest = sorted((card.memory_mib for card in node.cards), reverse=True)[: wanted.cards]
    return Charge(memory_mib=sum(largest), cards=wanted.cards)


def least_asked(pod: Mapping[str, Any]) -> Charge:
    """The least the pod could be charged on any node, from its spec alone (admission's check):
    shares and MIG slices exactly, whole cards only as cards (their memory depends on the node)."""
    wanted = cardrequest.pod_request(pod)
    total = Charge(memory_mib=wanted.memory_gib * MIB_PER_GIB if not wanted.cards else 0, cards=wanted.cards)
    for name, count in native_asks(pod).items():
        mig = mig_memory_mib(name)
        if mig is not None:
            total += Charge(memory_mib=mig * count)
        elif name == gpu.Resource.NVIDIA_GPU:
            total += Charge(cards=count)
    return total


def gate_charge(pod: Mapping[str, Any], nodes: Iterable[Mapping[str, Any]]) -> Charge:
    """What a pod the device plugin places is charged before it is placed: the most any node could
    charge it (whole cards: the largest card of the cluster)."""
    largest = max((card_memory_mib(node) for node in nodes), default=0)
    asks = native_asks(pod)
    return _native_charge(asks, largest, node="") if asks else NOTHING


# --- DRA claims --------------------------------------------------------------------------------------


def claims_gate_charge(
    pod: Mapping[str, Any],
    *,
    allocated: Mapping[str, tuple[dra.Held, ...]],
    pending: Mapping[str, Mapping[str, Any]],
    memory: Mapping[tuple[str, str, str], int],
) -> Charge:
    """What a pod's DRA claims are charged before it is placed: a claim allocated already, its
    devices (`claim_charge`); a claim not allocated yet, each request's device count times the
    largest device memory any ResourceSlice publishes (the most it could be given: a class's CEL
    selectors are not evaluated here); a claim not made yet (from a template), a problem: the gate
    waits for it. `allocated` and `pending` are the namespace's claims by name (`pending`: their
    specs)."""
    total = NOTHING
    largest = max(memory.values(), default=0)
    for name in sorted(pod_claim_names(pod)):
        if name in allocated:
            total += claim_charge(allocated[name], memory)
        elif name in pending:
            total += _requests_charge(pending[name], largest, claim=name)
        else:
            total += Charge(problem=f"ResourceClaim {name} is not there yet; its charge is known once it is made")
    return total


def _requests_charge(spec: Mapping[str, Any], largest: int, *, claim: str) -> Charge:
    count = 0
    for item in map(podspec.mapping, podspec.sequence(podspec.mapping(spec.get("devices")).get("requests"))):
        exact = podspec.mapping(item.get("exactly")) or (item if "deviceClassName" in item else {})
        bodies = [exact] if exact else [podspec.mapping(a) for a in podspec.sequence(item.get("firstAvailable"))]
        most = 0
        for body in bodies:
            if body.get("adminAccess") is True:
                continue  # monitoring access allocates nothing
            if body.get("allocationMode") == "All":
                return Charge(problem=f"ResourceClaim {claim} asks for all matching devices; its charge is known once allocated")
            asked = body.get("count", 1)
            most = max(most, asked if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0 else 1)
        count += most
    if count and not largest:
        return Charge(problem=f"ResourceClaim {claim}: no ResourceSlice publishes a device memory capacity to charge by")
    return Charge(memory_mib=count * largest)


def device_memory(slices: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str], int]:
    """Each published device's `memory` capacity in MiB, by (driver, pool, name) (v1, v1beta2, v1beta1)."""
    found: dict[tuple[str, str, str], int] = {}
    for obj in slices:
        spec = podspec.mapping(obj.get("spec"))
        driver, pool = spec.get("driver"), podspec.mapping(spec.get("pool")).get("name")
        if not isinstance(driver, str) or not isinstance(pool, str):
            continue
        for item in podspec.sequence(spec.get("devices")):
            item = podspec.mapping(item)
            body = podspec.mapping(item.get("basic")) or item
            name = item.get("name")
            capacity = podspec.mapping(body.get("capacity"))
            memory = capacity.get("memory", capacity.get(f"{driver}/memory"))
            value = podspec.mapping(memory).get("value") if isinstance(memory, Mapping) else memory
            parsed = quantity.decoded(value) if value is not None else None
            if isinstance(name, str) and parsed is not None and parsed.sign > 0:
                found[(driver, pool, name)] = int(parsed.fraction()) // (1024 * 1024)
    return found


def claim_charge(held: Iterable[dra.Held], memory: Mapping[tuple[str, str, str], int]) -> Charge:
    """An allocated claim's charge: each device's memory (a share: the memory it consumed)."""
    total = NOTHING
    for result in held:
        if result.admin_access:
            continue  # monitoring access to a device in use: it allocates nothing
        shares = dict(result.consumed)  # a capacity name without a domain is in the driver's
        consumed = shares.get("memory", shares.get(f"{result.driver}/memory"))
        parsed = quantity.decoded(consumed) if consumed is not None else None
        if parsed is not None and parsed.sign >= 0:
            total += Charge(memory_mib=int(parsed.fraction()) // (1024 * 1024))
        elif result.key in memory:
            total += Charge(memory_mib=memory[result.key])
        else:
            total += Charge(problem=f"{result.describe()}: its ResourceSlice publishes no memory capacity")
    return total


# --- the namespace's ledger ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Entry:
    """A pod charged to its namespace before it is seen bound."""

    uid: str
    pod: str  # namespace/name
    charge: Charge
    assumed_at: float
    expires: float | None = None  # None: until the pod is seen bound, finished or gone (the gate's)

    def counts(self, now: float) -> bool:
        return self.expires is None or self.expires > now


def lease_name(namespace: str) -> str:
    name = LEASE_PREFIX + namespace
    return name if len(name) <= _MAX_NAME else LEASE_PREFIX + hashlib.sha256(namespace.encode()).hexdigest()[:40]


def encode(ledger: Mapping[str, Entry]) -> str:
    """The ledger annotation value (compact, sorted by UID)."""
    document = {
        uid: {
            "pod": entry.pod,
            "memMiB": entry.charge.memory_mib,
            "cards": entry.charge.cards,
            "assumedAt": allocation.timestamp(entry.assumed_at),
            **({"expires": allocation.timestamp(entry.expires)} if entry.expires is not None else {}),
        }
        for uid, entry in sorted(ledger.items())
    }
    return json.dumps(document, separators=(",", ":"))


def read(text: object) -> dict[str, Entry]:
    """The ledger by pod UID; malformed entries are dropped, an unreadable ledger is empty."""
    if not isinstance(text, str) or not text:
        return {}
    return dict(_read(text))


@functools.lru_cache(maxsize=1024)  # pure; each filter of a budgeted namespace reads its Lease's ledger
def _read(text: str) -> tuple[tuple[str, Entry], ...]:
    return tuple(_parse(text).items())


def _parse(text: str) -> dict[str, Entry]:
    try:
        document = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(document, dict):
        return {}
    found: dict[str, Entry] = {}
    for uid, item in document.items():
        if not isinstance(item, dict):
            continue
        memory, count, pod = item.get("memMiB"), item.get("cards", 0), item.get("pod")
        assumed = allocation.parse_time(item.get("assumedAt"))
        expires = allocation.parse_time(item.get("expires")) if "expires" in item else None
        if not _count(memory) or not _count(count) or not isinstance(pod, str) or assumed is None:
            continue
        if "expires" in item and expires is None:
            continue
        found[uid] = Entry(uid=uid, pod=pod, charge=Charge(memory_mib=memory, cards=count), assumed_at=assumed, expires=expires)
    return found


def _count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def lease_body(
    namespace: str, ledger: Mapping[str, Entry], holder: str, *, home: str = reservations.LEDGER_NAMESPACE
) -> dict[str, Any]:
    """A namespace's complete budget Lease in the ledger namespace `home` (add a resourceVersion to replace one)."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": lease_name(namespace),
            "namespace": home,
            "labels": {gpu.LEDGER_LABEL: "true"},
            "annotations": {NAMESPACE_ANNOTATION: namespace, LEDGER_ANNOTATION: encode(ledger)},
        },
        "spec": {"holderIdentity": holder},
    }


def lease_namespace(lease: Mapping[str, Any], *, home: str = reservations.LEDGER_NAMESPACE) -> str | None:
    """The namespace whose budget ledger a Lease is; None for any Lease not to trust (see `reservations.lease_node`)."""
    metadata = podspec.mapping(lease.get("metadata"))
    if metadata.get("namespace") != home:
        return None
    namespace = podspec.mapping(metadata.get("annotations")).get(NAMESPACE_ANNOTATION)
    if not isinstance(namespace, str) or not namespace or metadata.get("name") != lease_name(namespace):
        return None
    return namespace


def lease_ledger(lease: Mapping[str, Any] | None, *, home: str = reservations.LEDGER_NAMESPACE) -> dict[str, Entry]:
    if lease is None or lease_namespace(lease, home=home) is None:
        return {}
    return read(podspec.mapping(podspec.mapping(lease.get("metadata")).get("annotations")).get(LEDGER_ANNOTATION))


# --- used ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Usage:
    """What a namespace holds: in total, and per pod (UID) or claim (`claim:<uid>`)."""

    total: Charge
    by_holder: Mapping[str, Charge]
    problems: Mapping[str, str]  # holder -> why its charge is not fully known
    # Pods that count through themselves: finished, or bound with a known charge and every claim
    # they name seen allocated. Their ledger entries are no longer needed (`prune`).
    settled: AbstractSet[str] = frozenset()

    def total_without(self, uids: Iterable[str]) -> Charge:
        """`without(uids).total`, without copying the holders (filter and bind ask it per call)."""
        memory, cards = self.total.memory_mib, self.total.cards
        for uid in set(uids):
            held = self.by_holder.get(uid)
            if held is not None:
                memory, cards = memory - held.memory_mib, cards - held.cards
        return Charge(memory_mib=memory, cards=cards)

    def without(self, uids: Iterable[str]) -> Usage:
        """The usage less some holders' charges (a pod's own earlier entry, preemption's victims)."""
        dropped = set(uids)
        kept = {uid: charge for uid, charge in self.by_holder.items() if uid not in dropped}
        total = NOTHING
        for charge in kept.values():
            total += Charge(memory_mib=charge.memory_mib, cards=charge.cards)
        return Usage(
            total=total,
            by_holder=kept,
            problems={k: v for k, v in self.problems.items() if k not in dropped},
            settled=self.settled,
        )


def usage(
    pods: Iterable[Mapping[str, Any]],
    ledger: Mapping[str, Entry],
    *,
    nodes: Mapping[str, Mapping[str, Any]],
    claims: Iterable[tuple[str, tuple[dra.Held, ...]]] = (),
    device_mib: Mapping[tuple[str, str, str], int] | None = None,
    gone: frozenset[str] | set[str] = frozenset(),
    now: float,
) -> Usage:
    """One namespace's usage: its bound pods (`pods`: every pod of the namespace the caller knows),
    its allocated claims (claim UID, results), and the ledger's entries that still count. A pod both
    bound and in the ledger counts once, at the larger charge; an entry counts while unexpired and
    its pod is not finished, not gone (`gone`: UIDs known deleted) and not bound with a charge known."""
    by_holder: dict[str, Charge] = {}
    problems: dict[str, str] = {}
    settled: set[str] = set()
    claims = list(claims)
    allocated = {result.claim for _, held in claims for result in held}
    for pod in pods:
        metadata = podspec.mapping(pod.get("metadata"))
        uid = str(metadata.get("uid", ""))
        if allocation.is_terminal(pod):
            settled.add(uid)
            continue
        node = allocation.bound_node(pod)
        if not node:
            continue
        charge = held_charge(pod, nodes.get(node), now=now)
        if charge.problem:
            problems[uid] = charge.problem
        elif pod_claim_names(pod) <= allocated:
            # A pod with claims counts through them once they are seen allocated (kube-scheduler
            # allocates before it binds, but the claims' watch may be behind the pods'): until
            # then its entry keeps counting.
            settled.add(uid)
        if charge.charged or charge.problem:
            by_holder[uid] = charge
    for uid, entry in ledger.items():
        if uid in settled or uid in gone or not entry.counts(now):
            continue
        by_holder[uid] = by_holder[uid].at_least(entry.charge) if uid in by_holder else entry.charge
    memory = device_mib or {}
    for claim_uid, held in claims:
        charge = claim_charge(held, memory)
        key = f"claim:{claim_uid}"
        if charge.problem:
            problems[key] = charge.problem
        if charge.charged or charge.problem:
            by_holder[key] = charge
    total = NOTHING
    for charge in by_holder.values():
        total += Charge(memory_mib=charge.memory_mib, cards=charge.cards)
    return Usage(total=total, by_holder=by_holder, problems=problems, settled=frozenset(settled))


def pod_claim_names(pod: Mapping[str, Any]) -> frozenset[str]:
    """The names of the ResourceClaims a pod uses: `resourceClaimName`, or for a claim made from a
    template the name its status records (absent until the claim is made)."""
    spec, status = podspec.mapping(pod.get("spec")), podspec.mapping(pod.get("status"))
    made = {
        str(item.get("name")): item.get("resourceClaimName")
        for item in map(podspec.mapping, podspec.sequence(status.get("resourceClaimStatuses")))
    }
    names: set[str] = set()
    for claim in dra.pod_claims(spec):
        name = claim.claim_name or made.get(claim.name)
        names.add(name if isinstance(name, str) and name else f"(not made yet: {claim.name})")
    return frozenset(names)


def over(budget_memory_mib: int, budget_cards: int | None, used: Charge, charge: Charge) -> str:
    """Why `charge` on top of `used` does not fit the budget ("" where it fits)."""
    # Only what the charge adds is checked (as ResourceQuota does): a namespace over a lowered card
    # budget may still take shares while its memory has room.
    if charge.memory_mib and used.memory_mib + charge.memory_mib > budget_memory_mib:
        return (
            f"{gib(used.memory_mib)} GiB used + {gib(charge.memory_mib)} GiB asked > {gib(budget_memory_mib)} GiB of GPU memory"
        )
    if budget_cards is not None and charge.cards and used.cards + charge.cards > budget_cards:
        return f"{used.cards} whole cards used + {charge.cards} asked > {budget_cards} whole cards"
    return ""


def prune(
    ledger: Mapping[str, Entry],
    usage_: Usage,
    *,
    pods: Mapping[str, Mapping[str, Any]],
    gone: frozenset[str] | set[str],
    now: float,
) -> dict[str, Entry]:
    """The entries still needed: unexpired, of pods not gone or finished, and not settled in
    `usage_` (bound with a charge of their own known, every claim they name seen allocated: those
    count through the pod)."""
    kept: dict[str, Entry] = {}
    for uid, entry in ledger.items():
        pod = pods.get(uid)
        if not entry.counts(now) or uid in gone or uid in usage_.settled:
            continue
        if pod is not None and allocation.is_terminal(pod):
            continue
        kept[uid] = entry
    return kept


# --- the budget gate -----------------------------------------------------------------------------------


def gate_index(spec: Mapping[str, Any]) -> int | None:
    """The index of `GATE` in a pod spec's `schedulingGates`; None where the spec carries none."""
    for index, entry in enumerate(podspec.sequence(spec.get("schedulingGates"))):
        if isinstance(entry, Mapping) and entry.get("name") == GATE:
            return index
    return None


# --- kept up to date one pod at a time --------------------------------------------------------------------


@dataclasses.dataclass(kw_only=True)
class _Part:
    """One namespace's share of a `Book`: its bound pods' charges and its claims'."""

    holders: dict[str, Charge] = dataclasses.field(default_factory=dict)
    problems: dict[str, str] = dataclasses.field(default_factory=dict)
    settled: set[str] = dataclasses.field(default_factory=set)
    memory_mib: int = 0
    cards: int = 0
    claim_holders: dict[str, Charge] = dataclasses.field(default_factory=dict)
    claim_problems: dict[str, str] = dataclasses.field(default_factory=dict)
    claim_memory_mib: int = 0
    allocated: frozenset[str] = frozenset()  # names of the namespace's allocated claims
    with_claims: set[str] = dataclasses.field(default_factory=set)  # pods that name claims

    members: int = 0  # pods put here

    def empty(self) -> bool:
        return not (self.members or self.claim_holders or self.claim_problems or self.allocated)


class Book:
    """`usage` kept up to date one pod (and one namespace's claims) at a time, for the extender's
    store: a burst of binds in one namespace changes one pod per event, and recounting every pod of
    the namespace on each filter took the extender from 110 to 4.5 pods/s (bench/README.md). The
    answers are `usage`'s (a unit test compares them)."""

    def __init__(self) -> None:
        self._parts: dict[str, _Part] = {}
        self._of: dict[str, tuple[str, Charge | None, bool]] = {}  # uid -> (namespace, charge counted, settled)

    def put(self, uid: str, pod: Mapping[str, Any], node: Mapping[str, Any] | None) -> None:
        """The pod as it is now (`node`: the Node it is bound to, None where unknown)."""
        self.drop(uid)
        namespace = str(podspec.mapping(pod.get("metadata")).get("namespace", ""))
        part = self._parts.setdefault(namespace, _Part())
        part.members += 1
        names = pod_claim_names(pod)
        if names:
            part.with_claims.add(uid)
        if allocation.is_terminal(pod):
            part.settled.add(uid)
            self._of[uid] = (namespace, None, True)
            return
        if not allocation.bound_node(pod):
            self._of[uid] = (namespace, None, False)
            return
        charge = held_charge(pod, node, now=0.0)  # bound: what it holds depends on no time
        settled = not charge.problem and names <= part.allocated
        if charge.problem:
            part.problems[uid] = charge.problem
        if settled:
            part.settled.add(uid)
        counted = charge if charge.charged or charge.problem else None
        if counted is not None:
            part.holders[uid] = counted
            part.memory_mib += counted.memory_mib
            part.cards += counted.cards
        self._of[uid] = (namespace, counted, settled)

    def charged(self, uid: str) -> bool:
        """Whether the pod counts here now with a charge (bound, unfinished, holding GPUs)."""
        found = self._of.get(uid)
        return found is not None and found[1] is not None

    def drop(self, uid: str) -> None:
        found = self._of.pop(uid, None)
        if found is None:
            return
        namespace, counted, _ = found
        part = self._parts[namespace]
        part.members -= 1
        part.settled.discard(uid)
        part.problems.pop(uid, None)
        part.with_claims.discard(uid)
        if counted is not None:
            del part.holders[uid]
            part.memory_mib -= counted.memory_mib
            part.cards -= counted.cards
        if part.empty():
            del self._parts[namespace]

    def claims(
        self, namespace: str, held: Iterable[tuple[str, tuple[dra.Held, ...]]], memory: Mapping[tuple[str, str, str], int]
    ) -> list[str]:
        """The namespace's allocated claims now (claim UID, results); returns the UIDs of its pods
        that name claims, whose settling may have changed (the caller puts them again)."""
        part = self._parts.setdefault(namespace, _Part())
        part.claim_holders, part.claim_problems, part.claim_memory_mib = {}, {}, 0
        names: set[str] = set()
        for claim_uid, results in held:
            names.update(result.claim for result in results)
            charge = claim_charge(results, memory)
            key = f"claim:{claim_uid}"
            if charge.problem:
                part.claim_problems[key] = charge.problem
            if charge.charged or charge.problem:
                part.claim_holders[key] = charge
                part.claim_memory_mib += charge.memory_mib
        part.allocated = frozenset(names)
        again = sorted(part.with_claims)
        if part.empty():
            del self._parts[namespace]
        return again

    def claim_namespaces(self) -> list[str]:
        return [
            namespace for namespace, part in self._parts.items() if part.claim_holders or part.claim_problems or part.allocated
        ]

    def usage(self, namespace: str, ledger: Mapping[str, Entry], *, gone: Callable[[str], bool], now: float) -> Usage:
        """`usage` of the namespace with `ledger`'s entries; `gone(uid)`: the pod is known deleted.
        The answer's mappings are views of this book, good until it next changes."""
        part = self._parts.get(namespace) or _Part()
        memory, cards = part.memory_mib + part.claim_memory_mib, part.cards
        extra: dict[str, Charge] = {}
        for uid, entry in ledger.items():
            if uid in part.settled or not entry.counts(now) or gone(uid):
                continue
            held = part.holders.get(uid)
            charge = held.at_least(entry.charge) if held is not None else entry.charge
            extra[uid] = charge
            memory += charge.memory_mib - (held.memory_mib if held is not None else 0)
            cards += charge.cards - (held.cards if held is not None else 0)
        return Usage(
            total=Charge(memory_mib=memory, cards=cards),
            by_holder=collections.ChainMap(extra, part.holders, part.claim_holders),
            problems=collections.ChainMap(part.problems, part.claim_problems),
            settled=part.settled,
        )
