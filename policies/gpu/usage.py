"""Real GPU use on a node: the usage summary the labeler publishes, its codec, and when it changed.

Pure. The labeler reads each card's memory and compute processes from NVML (or the inventory
file), maps every process to its pod through its cgroup, and writes the result on the Node in the
annotation `gpu-admission.io/gpu-usage`; the extender (`--honour-out-of-band-usage`), the audit
(GPU213-GPU215) and `inspect` read it back through `parse`, so writer and readers share one codec.

The annotation is compact JSON (keys sorted, no spaces):

```json
{"at": "2026-11-26T12:00:00Z",
 "cards": [{"index": 0, "totalMiB": 16384, "usedMiB": 9300,
            "pods": [{"uid": "6f0c..", "namespace": "ml", "name": "train-0", "usedMiB": 4100, "pids": 2}],
            "outOfBand": [{"pid": 41233, "usedMiB": 5200, "containerID": "3f1e..", "podUID": ".."}],
            "unknown": [{"pid": 41250}]}]}
```

- `pods`: processes attributed to a pod the apiserver knows on this node, summed per pod (`pids`
  processes); the container IDs are not kept, the pod is what the accounting knows.
- `outOfBand`: processes that belong to no such pod: started on the node by the container runtime
  directly (`docker run --gpus`, `ctr run`), by a user outside any container, by a static pod
  without a mirror pod, or left behind by a pod that is gone. `containerID` where the cgroup names
  one, `podUID` where the cgroup names a pod the apiserver does not know.
- `unknown`: processes whose cgroup could not be read (the process exited between NVML's list and
  the read, or the labeler cannot see the host's `/proc`): neither blamed nor counted to a pod.
- `usedMiB` is absent where NVML reports no figure for a process (`usedGpuMemory` None).

Each list keeps at most `MAX_ENTRIES` entries (largest first) and says how many it left out in
`<list>Truncated`, so one node cannot push its Node object towards the 256 KiB annotation limit.

A new summary is worth writing (`significant`) when a card appears, goes or changes size, the set
of pods or out-of-band processes on a card changes, or a card's, a pod's or an out-of-band
process's memory moves by at least `max(SIGNIFICANT_MIB, SIGNIFICANT_FRACTION × card)` against
the summary last written. Comparing with what was written, not with the last reading, means slow
drift is published once it adds up.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any, TypeGuard

USAGE_ANNOTATION = "gpu-admission.io/gpu-usage"

MAX_ENTRIES = 32  # per list per card
SIGNIFICANT_MIB = 256
SIGNIFICANT_FRACTION = 0.05

# A CUDA context and allocator rounding put a process somewhat above what it computes with; beyond
# this much is no rounding. `share` does not isolate, so there any excess counts (GPU214, GPU215,
# and the labeler's per-pod figures and limits).
TOLERANCE_MIB = 512
TOLERANCE_FRACTION = 0.10


@dataclasses.dataclass(frozen=True, kw_only=True)
class PodUse:
    """The processes of one pod on one card."""

    uid: str
    namespace: str
    name: str
    used_mib: int
    pids: int = 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class OutOfBand:
    """A process on a card that belongs to no pod the apiserver knows on this node."""

    pid: int
    used_mib: int | None = None
    container_id: str = ""
    pod_uid: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class CardUse:
    """One card's real use: memory NVML counts as used (all processes and the driver's own) and who holds it."""

    index: int
    total_mib: int
    used_mib: int | None = None
    pods: tuple[PodUse, ...] = ()
    out_of_band: tuple[OutOfBand, ...] = ()
    unknown: tuple[int, ...] = ()  # PIDs whose cgroup could not be read
    truncated: int = 0  # entries left out of the lists

    @property
    def out_of_band_mib(self) -> int:
        """Memory held by out-of-band processes (processes without a figure count 0)."""
        return sum(entry.used_mib or 0 for entry in self.out_of_band)

    @property
    def pods_mib(self) -> int:
        return sum(entry.used_mib for entry in self.pods)


@dataclasses.dataclass(frozen=True, kw_only=True)
class NodeUsage:
    """Every card of a node with its real use; `at` is when it was read (RFC 3339, UTC)."""

    cards: tuple[CardUse, ...]
    at: str = ""

    def card(self, index: int) -> CardUse | None:
        for card in self.cards:
            if card.index == index:
                return card
        return None

    def pod_mib(self, uid: str) -> dict[int, int]:
        """The memory a pod's processes hold, per card index (empty when it has none)."""
        found: dict[int, int] = {}
        for card in self.cards:
            for entry in card.pods:
                if entry.uid == uid:
                    found[card.index] = found.get(card.index, 0) + entry.used_mib
        return found


# --- codec ----------------------------------------------------------------------------------------


def render(usage: NodeUsage) -> str:
    """The annotation value for `usage` (lists cut to MAX_ENTRIES, largest first)."""
    return json.dumps(_document(usage), separators=(",", ":"), sort_keys=True)


def _document(usage: NodeUsage) -> dict[str, Any]:
    cards: list[dict[str, Any]] = []
    for card in sorted(usage.cards, key=lambda c: c.index):
        entry: dict[str, Any] = {"index": card.index, "totalMiB": card.total_mib}
        if card.used_mib is not None:
            entry["usedMiB"] = card.used_mib
        pods = sorted(card.pods, key=lambda p: (-p.used_mib, p.uid))
        oob = sorted(card.out_of_band, key=lambda o: (-(o.used_mib or 0), o.pid))
        unknown = sorted(card.unknown)
        left_out = card.truncated
        if pods:
            entry["pods"] = [
                {"uid": p.uid, "namespace": p.namespace, "name": p.name, "usedMiB": p.used_mib, "pids": p.pids}
                for p in pods[:MAX_ENTRIES]
            ]
        if oob:
            entry["outOfBand"] = [_oob_entry(o) for o in oob[:MAX_ENTRIES]]
        if unknown:
            entry["unknown"] = [{"pid": pid} for pid in unknown[:MAX_ENTRIES]]
        left_out += sum(max(0, len(items) - MAX_ENTRIES) for items in (pods, oob, unknown))
        if left_out:
            entry["truncated"] = left_out
        cards.append(entry)
    document: dict[str, Any] = {"cards": cards}
    if usage.at:
        document["at"] = usage.at
    return document


def _oob_entry(entry: OutOfBand) -> dict[str, Any]:
    out: dict[str, Any] = {"pid": entry.pid}
    if entry.used_mib is not None:
        out["usedMiB"] = entry.used_mib
    if entry.container_id:
        out["containerID"] = entry.container_id
    if entry.pod_uid:
        out["podUID"] = entry.pod_uid
    return out


def parse(text: object) -> NodeUsage | None:
    """The summary in an annotation value; None when absent or malformed (never raises).

    Malformed entries inside a card are skipped; a malformed card drops the whole summary, since a
    reader cannot tell which card the rest describes.
    """
    if not isinstance(text, str) or not text:
        return None
    try:
        document = json.loads(text)
    except ValueError:
        return None
    if not isinstance(document, Mapping) or not isinstance(document.get("cards"), list):
        return None
    cards: list[CardUse] = []
    seen: set[int] = set()
    for entry in document["cards"]:
        card = _card(entry)
        if card is None or card.index in seen:
            return None
        seen.add(card.index)
        cards.append(card)
    at = document.get("at")
    return NodeUsage(cards=tuple(sorted(cards, key=lambda c: c.index)), at=at if isinstance(at, str) else "")


def _card(entry: object) -> CardUse | None:
    if not isinstance(entry, Mapping):
        return None
    index, total, used = entry.get("index"), entry.get("totalMiB"), entry.get("usedMiB")
    if not _count(index) or not _count(total) or (used is not None and not _count(used)):
        return None
    pods = tuple(p for p in (_pod(item) for item in _list(entry.get("pods"))) if p is not None)
    oob = tuple(o for o in (_oob(item) for item in _list(entry.get("outOfBand"))) if o is not None)
    unknown = tuple(item["pid"] for item in _list(entry.get("unknown")) if isinstance(item, Mapping) and _count(item.get("pid")))
    truncated = entry.get("truncated")
    return CardUse(
        index=index,
        total_mib=total,
        used_mib=used,
        pods=pods,
        out_of_band=oob,
        unknown=unknown,
        truncated=truncated if _count(truncated) else 0,
    )


def _pod(item: object) -> PodUse | None:
    if not isinstance(item, Mapping):
        return None
    uid, namespace, name = item.get("uid"), item.get("namespace"), item.get("name")
    used, pids = item.get("usedMiB"), item.get("pids", 1)
    if not all(isinstance(v, str) and v for v in (uid, namespace, name)) or not _count(used) or not _count(pids):
        return None
    return PodUse(uid=str(uid), namespace=str(namespace), name=str(name), used_mib=used, pids=pids)


def _oob(item: object) -> OutOfBand | None:
    if not isinstance(item, Mapping) or not _count(item.get("pid")):
        return None
    used = item.get("usedMiB")
    container, pod_uid = item.get("containerID", ""), item.get("podUID", "")
    return OutOfBand(
        pid=item["pid"],
        used_mib=used if _count(used) else None,
        container_id=container if isinstance(container, str) else "",
        pod_uid=pod_uid if isinstance(pod_uid, str) else "",
    )


def of_node(node: Mapping[str, Any]) -> NodeUsage | None:
    """The summary on a Node object (None when it carries none or a malformed one)."""
    metadata = node.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    return parse(annotations.get(USAGE_ANNOTATION)) if isinstance(annotations, Mapping) else None


# --- when a new summary is worth a write ----------------------------------------------------------


def tolerance_mib(allowed_mib: int) -> int:
    """How far above `allowed_mib` real use may go before it counts as above the request."""
    return max(TOLERANCE_MIB, int(allowed_mib * TOLERANCE_FRACTION))


def threshold_mib(total_mib: int) -> int:
    """The smallest memory change on a card of `total_mib` that is worth a write."""
    return max(SIGNIFICANT_MIB, int(total_mib * SIGNIFICANT_FRACTION))


def significant(before: NodeUsage | None, after: NodeUsage) -> str:
    """Why `after` differs enough from the summary last written (`before`) to write it; "" if not."""
    if before is None:
        return "first summary"
    old = {card.index: card for card in before.cards}
    new = {card.index: card for card in after.cards}
    if old.keys() != new.keys():
        return "the cards changed"
    for index in sorted(new):
        a, b = old[index], new[index]
        if a.total_mib != b.total_mib:
            return f"card {index} changed size"
        step = threshold_mib(b.total_mib)
        if (a.used_mib is None) != (b.used_mib is None) or abs((a.used_mib or 0) - (b.used_mib or 0)) >= step:
            return f"card {index} memory used moved by at least {step} MiB"
        old_pods = {p.uid: p.used_mib for p in a.pods}
        new_pods = {p.uid: p.used_mib for p in b.pods}
        if old_pods.keys() != new_pods.keys():
            return f"the pods on card {index} changed"
        if any(abs(old_pods[uid] - new_pods[uid]) >= step for uid in new_pods):
            return f"a pod's memory on card {index} moved by at least {step} MiB"
        old_oob = {o.pid: o.used_mib or 0 for o in a.out_of_band}
        new_oob = {o.pid: o.used_mib or 0 for o in b.out_of_band}
        if old_oob.keys() != new_oob.keys():
            return f"the out-of-band processes on card {index} changed"
        if any(abs(old_oob[pid] - new_oob[pid]) >= step for pid in new_oob):
            return f"an out-of-band process on card {index} moved by at least {step} MiB"
    return ""


def _list(value: object) -> Iterable[Any]:
    return value if isinstance(value, list) else ()


def _count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
