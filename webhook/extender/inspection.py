"""The `kubectl inspect cgpu` views of allocation state: the seed's table, its `-d` details, JSON.

The table is the one in the seed `002_e2b829a309310c51.txt` (and gpushare's `kubectl inspect
gpushare`): one row per shared-mode node, one `GPUi(Allocated/Total)` column per card in GiB, the
node's `GPU Memory(GiB)`, a dashed line, and the cluster's allocated/total with the percentage
(rounded down). Columns are aligned with two spaces, as Go's tabwriter prints them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypedDict

from webhook.extender import cards

RULE = "-" * 86  # the seed's dashed line
PENDING_HEADER = "PENDING(Allocated)"


class PodJson(TypedDict):
    name: str
    namespace: str
    usedGPU: int
    usedCore: int
    bound: bool


class DeviceJson(TypedDict):
    id: int
    totalGPU: int
    usedGPU: int
    usedCore: int
    whole: bool
    pods: list[PodJson]


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


def summary(states: Iterable[cards.NodeState]) -> str:
    """The seed's table."""
    shown = table_nodes(states)
    width = max((len(s.cards) for s in shown), default=0)
    pending = any(s.orphans for s in shown)
    header = ["NAME", "IPADDRESS", *(f"GPU{i}(Allocated/Total)" for i in range(width))]
    header += [PENDING_HEADER] if pending else []
    rows = [[*header, "GPU Memory(GiB)"]]
    for state in shown:
        by_index = sorted(state.cards, key=lambda c: c.index)
        cells = [f"{_used(c)}/{c.card.memory_gib}" for c in by_index] + ["-"] * (width - len(by_index))
        if pending:
            cells.append(str(sum(a.memory_gib for a in state.orphans)))
        rows.append([state.name, state.node.address or "-", *cells, f"{state.memory_used}/{state.memory_total}"])
    used, total = _totals(shown)
    return "\n".join([*_align(rows), RULE, "Allocated/Total GPU Memory In Cluster:", f"{used}/{total} ({_percent(used, total)}%)"]) + "\n"


def details(states: Iterable[cards.NodeState]) -> str:
    """The `-d` view: per node, one row per pod with its GiB on each card."""
    shown = table_nodes(states)
    lines: list[str] = []
    for state in shown:
        by_index = sorted(state.cards, key=lambda c: c.index)
        pending = bool(state.orphans)
        header = ["NAME", "NAMESPACE", *(f"GPU{c.index}(Allocated)" for c in by_index)] + ([PENDING_HEADER] if pending else [])
        rows = [header]
        for allocation in sorted((*state.allocations, *state.orphans), key=lambda a: (a.namespace, a.name)):
            cells = [str(allocation.memory_gib if c.index in allocation.cards else 0) for c in by_index]
            if pending:
                cells.append(str(allocation.memory_gib if allocation in state.orphans else 0))
            rows.append([allocation.name, allocation.namespace, *cells])
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


def as_json(states: Iterable[cards.NodeState]) -> ClusterJson:
    """Every managed node (shared and topology), gpushare's inspect keys plus cores and placement."""
    managed = sorted((s for s in states if s.node.cards), key=lambda s: s.name)
    nodes: list[NodeJson] = []
    for state in managed:
        devices: list[DeviceJson] = [
            {
                "id": c.index,
                "totalGPU": c.card.memory_gib,
                "usedGPU": _used(c),
                "usedCore": min(c.core_used, cards.CORE_PER_CARD),
                "whole": c.whole_used,
                "pods": [_pod_json(a) for a in c.allocations],
            }
            for c in sorted(state.cards, key=lambda c: c.index)
        ]
        nodes.append(
            {
                "name": state.name,
                "address": state.node.address,
                "mode": state.node.mode_label or "default",
                "placement": str(state.node.placement),
                "totalGPU": state.memory_total,
                "usedGPU": state.memory_used,
                "devs": devices,
                "pending": [_pod_json(a) for a in state.orphans],
            }
        )
    used, total = _totals(table_nodes(managed))
    return {"nodes": nodes, "totalGPU": total, "usedGPU": used}


def _pod_json(allocation: cards.Allocation) -> PodJson:
    return {
        "name": allocation.name,
        "namespace": allocation.namespace,
        "usedGPU": allocation.memory_gib,
        "usedCore": allocation.core_percent,
        "bound": allocation.bound,
    }


def _used(card: cards.CardState) -> int:
    return card.card.memory_gib if card.whole_used else card.memory_used


def _totals(states: Sequence[cards.NodeState]) -> tuple[int, int]:
    return sum(s.memory_used for s in states), sum(s.memory_total for s in states)


def _percent(used: int, total: int) -> int:
    return used * 100 // total if total else 0


def _align(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows if i < len(row)) for i in range(max(len(r) for r in rows))]
    return ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
