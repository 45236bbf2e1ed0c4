"""The `kubectl inspect cgpu` views of allocation state: the seed's table, its `-d` details, JSON.

The table is the one in the seed `002_e2b829a309310c51.txt` (and gpushare's `kubectl inspect
gpushare`): one row per shared-mode node, one `GPUi(Allocated/Total)` column per card in GiB, the
node's `GPU Memory(GiB)`, a dashed line, and the cluster's allocated/total with the percentage
(rounded down). Columns are aligned with two spaces, as Go's tabwriter prints them.

Real use beside allocation: given the labeler's usage summaries (`policies.gpu.usage`, one per node
name), the table adds a `GPUi(Used)` column per card after the allocation columns: the memory
the card's processes hold in GiB with one decimal (NVML's memory used where it gives no
per-process figure), followed by `(<GiB> oob)` where out-of-band processes hold part of it; `-`
for a node without a summary. The columns appear only when some shown node has a summary, so the
seed's table is unchanged without the labeler. JSON gains `usedMiB` and `outOfBandMiB` per card.
Per pod, where the node has a summary: `-d` adds a `GPUi(Used)` column per card after the
allocated ones (GiB with one decimal that the pod's processes hold there, `0` where none), and JSON
`usedMiB` per pod on each card, so a pod's use stands next to what it was allocated.

Cards allocated by Dynamic Resource Allocation (`policies.gpu.dra`, matched by UUID) show `DRA/<total>`
in the table and a `DRA` row per claim in `-d`, `-o wide` gains a `DRA` column naming the claims
(only where some shown card has one, so the seed's views are unchanged without DRA), and JSON a
`dra` list per card.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NotRequired, TypedDict

from policies import gpu
from policies.gpu import allocation as allocation_
from policies.gpu import cards
from policies.gpu import usage as usage_

RULE = "-" * 86  # the seed's dashed line
PENDING_HEADER = "PENDING(Allocated)"


class PodJson(TypedDict):
    name: str
    namespace: str
    usedGPU: int
    usedCore: int
    bound: bool
    usedMiB: NotRequired[int]  # what the pod's processes hold on this card (the labeler's summary)


class DraJson(TypedDict):
    claim: str  # namespace/name
    driver: str
    pool: str
    device: str
    shared: bool


class DeviceJson(TypedDict):
    id: int
    totalGPU: int
    usedGPU: int
    usedCore: int
    whole: bool
    pods: list[PodJson]
    dra: NotRequired[list[DraJson]]
    usedMiB: NotRequired[int | None]
    outOfBandMiB: NotRequired[int]


class NodeJson(TypedDict):
    name: str
    address: str
    mode: str
    placement: str
    totalGPU: int
    usedGPU: int
    devs: list[DeviceJson]
    pending: list[PodJson]


class ClusterJson(TypedDict):
    nodes: list[NodeJson]
    totalGPU: int
    usedGPU: int


def table_nodes(states: Iterable[cards.NodeState]) -> list[cards.NodeState]:
    """The nodes the cgpu table shows: shared-mode nodes with cards, by name."""
    return sorted((s for s in states if s.node.shared and s.node.cards), key=lambda s: s.name)


def summary(states: Iterable[cards.NodeState], *, usage: Mapping[str, usage_.NodeUsage] | None = None) -> str:
    """The seed's table (with `GPUi(Used)` columns where `usage` has a summary for a shown node)."""
    shown = table_nodes(states)
    width = max((len(s.cards) for s in shown), default=0)
    pending = any(s.orphans for s in shown)
    real = {s.name: usage[s.name] for s in shown if usage is not None and s.name in usage}
    header = ["NAME", "IPADDRESS", *(f"GPU{i}(Allocated/Total)" for i in range(width))]
    header += [f"GPU{i}(Used)" for i in range(width)] if real else []
    header += [PENDING_HEADER] if pending else []
    rows = [[*header, "GPU Memory(GiB)"]]
    for state in shown:
        by_index = sorted(state.cards, key=lambda c: c.index)
        cells = [f"{'DRA' if c.dra else _used(c)}/{c.card.memory_gib}" for c in by_index] + ["-"] * (width - len(by_index))
        if real:
            node_usage = real.get(state.name)
            cells += [_real(node_usage.card(c.index) if node_usage is not None else None) for c in by_index]
            cells += ["-"] * (width - len(by_index))
        if pending:
            cells.append(str(sum(a.memory_gib for a in state.orphans)))
        rows.append([state.name, state.node.address or "-", *cells, f"{state.memory_used}/{state.memory_total}"])
    used, total = _totals(shown)
    return (
        "\n".join([*_align(rows), RULE, "Allocated/Total GPU Memory In Cluster:", f"{used}/{total} ({_percent(used, total)}%)"])
        + "\n"
    )


def details(states: Iterable[cards.NodeState], *, usage: Mapping[str, usage_.NodeUsage] | None = None) -> str:
    """The `-d` view: per node, one row per pod with its GiB on each card (and, where `usage` has
    the node's summary, the GiB its processes hold on each card)."""
    shown = table_nodes(states)
    lines: list[str] = []
    for state in shown:
        by_index = sorted(state.cards, key=lambda c: c.index)
        pending = bool(state.orphans)
        node_usage = usage.get(state.name) if usage is not None else None
        header = ["NAME", "NAMESPACE", *(f"GPU{c.index}(Allocated)" for c in by_index)]
        header += [f"GPU{c.index}(Used)" for c in by_index] if node_usage is not None else []
        header += [PENDING_HEADER] if pending else []
        rows = [header]
        for allocation in sorted((*state.allocations, *state.orphans), key=lambda a: (a.namespace, a.name)):
            cells = [str(allocation.memory_gib if c.index in allocation.cards else 0) for c in by_index]
            if node_usage is not None:
                pod_held = node_usage.pod_mib(allocation.uid)
                cells += [_gib(pod_held[c.index]) if c.index in pod_held else "0" for c in by_index]
            if pending:
                cells.append(str(allocation.memory_gib if allocation in state.orphans else 0))
            rows.append([allocation.name, allocation.namespace, *cells])
        claims = sorted({h.claim_key: h for c in by_index for h in c.dra}.values(), key=lambda h: h.claim_key)
        for held in claims:
            cells = ["DRA" if any(h.claim_key == held.claim_key for h in c.dra) else "0" for c in by_index]
            rows.append(
                [
                    held.claim,
                    held.namespace,
                    *cells,
                    *(["-"] * len(by_index) if node_usage is not None else []),
                    *(["0"] if pending else []),
                ]
            )
        lines += [f"NAME:       {state.name}", f"IPADDRESS:  {state.node.address or '-'}", ""]
        lines += _align(rows)
        lines += [
            f"Allocated :  {state.memory_used} ({_percent(state.memory_used, state.memory_total)}%)",
            f"Total :      {state.memory_total}",
            RULE,
        ]
    used, total = _totals(shown)
    lines += ["", "Allocated/Total GPU Memory In Cluster:", f"{used}/{total} ({_percent(used, total)}%)"]
    return "\n".join(lines) + "\n"


def as_json(states: Iterable[cards.NodeState], *, usage: Mapping[str, usage_.NodeUsage] | None = None) -> ClusterJson:
    """Every managed node (shared and topology), gpushare's inspect keys plus cores and placement
    (and `usedMiB`/`outOfBandMiB` per card where `usage` has the node's summary)."""
    managed = sorted((s for s in states if s.node.cards), key=lambda s: s.name)
    nodes: list[NodeJson] = []
    for state in managed:
        node_usage = usage.get(state.name) if usage is not None else None
        devices: list[DeviceJson] = [
            {
                "id": c.index,
                "totalGPU": c.card.memory_gib,
                "usedGPU": _used(c),
                "usedCore": min(c.core_used, gpu.MAX_CORE_PERCENTAGE),
                "whole": c.whole_used,
                "pods": [_pod_json(a) for a in c.allocations],
            }
            for c in sorted(state.cards, key=lambda c: c.index)
        ]
        for device, card in zip(devices, sorted(state.cards, key=lambda c: c.index), strict=True):
            if card.dra:
                device["dra"] = [
                    {"claim": h.claim_key, "driver": h.driver, "pool": h.pool, "device": h.device, "shared": h.shared}
                    for h in card.dra
                ]
        if node_usage is not None:
            for device in devices:
                real_card = node_usage.card(device["id"])
                device["usedMiB"] = real_mib(real_card)
                device["outOfBandMiB"] = real_card.out_of_band_mib if real_card is not None else 0
            _pods_used(devices, state, node_usage)
        nodes.append(
            {
                "name": state.name,
                "address": state.node.address,
                "mode": state.node.mode_label or str(gpu.Mode.DEFAULT),
                "placement": str(state.node.placement),
                "totalGPU": state.memory_total,
                "usedGPU": state.memory_used,
                "devs": devices,
                "pending": [_pod_json(a) for a in state.orphans],
            }
        )
    used, total = _totals(table_nodes(managed))
    return {"nodes": nodes, "totalGPU": total, "usedGPU": used}


def _pods_used(devices: list[DeviceJson], state: cards.NodeState, node_usage: usage_.NodeUsage) -> None:
    """Each device's pods get `usedMiB`: what the pod's processes hold on that card."""
    for device, card in zip(devices, sorted(state.cards, key=lambda c: c.index), strict=True):
        for pod, held in zip(device["pods"], card.allocations, strict=True):
            pod["usedMiB"] = node_usage.pod_mib(held.uid).get(card.index, 0)


def _gib(mib: int) -> str:
    return f"{mib / 1024:.1f}"


def _pod_json(allocation: allocation_.Allocation) -> PodJson:
    return {
        "name": allocation.name,
        "namespace": allocation.namespace,
        "usedGPU": allocation.memory_gib,
        "usedCore": allocation.core_percent,
        "bound": allocation.bound,
    }


def real_mib(card: usage_.CardUse | None) -> int | None:
    """What a card's processes hold (MiB); NVML's memory used where no process has a figure."""
    if card is None:
        return None
    figures = [p.used_mib for p in card.pods] + [o.used_mib for o in card.out_of_band if o.used_mib is not None]
    return sum(figures) if figures else card.used_mib


def _real(card: usage_.CardUse | None) -> str:
    mib = real_mib(card)
    if card is None or mib is None:
        return "-"
    text = f"{mib / 1024:.1f}"
    return f"{text}({card.out_of_band_mib / 1024:.1f} oob)" if card.out_of_band_mib else text


def node_usages(nodes: Iterable[Mapping[str, object]]) -> dict[str, usage_.NodeUsage]:
    """The usage summaries of the Node objects that carry one, by node name."""
    found: dict[str, usage_.NodeUsage] = {}
    for node in nodes:
        metadata = node.get("metadata")
        name = metadata.get("name") if isinstance(metadata, Mapping) else None
        summary = usage_.of_node(node)
        if isinstance(name, str) and summary is not None:
            found[name] = summary
    return found


def _used(card: cards.CardState) -> int:
    return card.card.memory_gib if card.whole_used else card.memory_used


def _totals(states: Sequence[cards.NodeState]) -> tuple[int, int]:
    return sum(s.memory_used for s in states), sum(s.memory_total for s in states)


def _percent(used: int, total: int) -> int:
    return used * 100 // total if total else 0


def _align(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows if i < len(row)) for i in range(max(len(r) for r in rows))]
    return ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]


def names(states: Iterable[cards.NodeState]) -> str:
    """``-o name``: the table's nodes as ``node/NAME`` lines, as ``kubectl get -o name`` prints them."""
    return "".join(f"node/{state.name}\n" for state in table_nodes(states))


def wide(states: Iterable[cards.NodeState], *, usage: Mapping[str, usage_.NodeUsage] | None = None) -> str:
    """``-o wide``: the table's nodes one row per card, with the card's model and UUID (from the
    labeler's inventory; ``-`` where the node advertises capacity only), its cores and pods, and
    the GiB its processes use where the labeler's usage summary has the card."""
    shown = table_nodes(states)
    with_dra = any(c.dra for s in shown for c in s.cards)
    header = ["NAME", "IPADDRESS", "MODE", "GPU", "MODEL", "UUID", "ALLOCATED/TOTAL(GiB)", "CORE(%)", "USED(GiB)", "PODS"]
    rows = [header + (["DRA"] if with_dra else [])]
    for state in shown:
        node_usage = usage.get(state.name) if usage is not None else None
        for card in sorted(state.cards, key=lambda c: c.index):
            rows.append(
                [
                    state.name,
                    state.node.address or "-",
                    state.node.mode_label or "-",
                    str(card.index),
                    card.card.model or "-",
                    card.card.uuid or "-",
                    f"{_used(card)}/{card.card.memory_gib}",
                    str(gpu.MAX_CORE_PERCENTAGE if card.whole_used else min(card.core_used, gpu.MAX_CORE_PERCENTAGE)),
                    _real(node_usage.card(card.index)) if node_usage is not None else "-",
                    str(len(card.allocations)),
                    *([",".join(h.claim_key for h in card.dra) or "-"] if with_dra else []),
                ]
            )
    used, total = _totals(shown)
    return (
        "\n".join([*_align(rows), RULE, "Allocated/Total GPU Memory In Cluster:", f"{used}/{total} ({_percent(used, total)}%)"])
        + "\n"
    )
