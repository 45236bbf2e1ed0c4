"""Per pod and card: the GPU memory a pod's processes hold beside what its allocation gives it.

Pure. From one node's usage summary (`policies.gpu.usage`, what `attribution.summarise` made of the
cards' processes) and the node's pods as listed (with their allocation annotations, `spec.nodeName`
and `status.phase`; `policies.gpu.allocation` reads them), one `PodCard` per pod and card:

- every card of a pod's shared allocation on this node, with what the pod's processes hold on it
  (0 where they hold nothing yet) and what it was given (`memGiB` × 1024 MiB);
- every other card where a pod's processes hold memory, with `requested_mib` 0 (a card it was not
  given), or None where the pod holds no allocation through gpu-admission at all (whole cards
  asked for through `nvidia.com/gpu`, or a pod placed outside the extender): nothing to compare.

`over_mib` is how far a pod is above its request on a card, beyond `usage.tolerance_mib` except
on `share` nodes (the audit's GPU214 judges with the same figure). Pods given whole cards
(`whole`) are never over: the card is theirs. The labeler's `/metrics` publishes these figures
(`health`) and its limits act on them (`limits`). A pod that is gone has no `PodCard`: the series
go with it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from policies import gpu, podspec
from policies.gpu import allocation, usage


@dataclasses.dataclass(frozen=True, kw_only=True)
class PodCard:
    """One pod on one card: what its processes hold and what it was given (MiB)."""

    uid: str
    namespace: str
    name: str
    card: int
    used_mib: int
    requested_mib: int | None  # None: no allocation through gpu-admission, nothing to compare
    whole: bool = False  # whole cards (aliyun.com/gpu): the card is the pod's
    tolerance_mib: int = 0  # excess that is no excess (CUDA context, allocator rounding)

    @property
    def over_mib(self) -> int:
        """MiB above the request beyond the tolerance; 0 when within, for whole cards, or unknown."""
        if self.whole or self.requested_mib is None:
            return 0
        return max(0, self.used_mib - self.requested_mib - self.tolerance_mib)


def figures(
    summary: usage.NodeUsage, pods: Iterable[Mapping[str, Any]], *, node: str, mode: gpu.Mode | None, now: float
) -> tuple[PodCard, ...]:
    """Every pod's figures on the cards of `summary`, sorted by (namespace, name, card)."""
    found: dict[tuple[str, int], PodCard] = {}
    names: dict[str, tuple[str, str]] = {}
    allocations: dict[str, allocation.Allocation] = {}
    for pod in pods:
        metadata = podspec.mapping(pod.get("metadata"))
        uid = str(metadata.get("uid") or "")
        if not uid:
            continue
        names[uid] = (str(metadata.get("namespace") or ""), str(metadata.get("name") or ""))
        held = allocation.pod_allocation(pod, now=now)
        if held is not None and held.node == node:
            allocations[uid] = held
    cards = {card.index: card for card in summary.cards}
    for uid, held in allocations.items():
        namespace, name = names[uid]
        for index in held.cards:
            if index not in cards:
                continue
            used = summary.pod_mib(uid).get(index, 0)
            found[(uid, index)] = _card(
                uid, namespace, name, index, used=used, held=held, mode=mode, total=cards[index].total_mib
            )
    for card in summary.cards:
        for entry in card.pods:
            if (entry.uid, card.index) in found:
                continue
            namespace, name = names.get(entry.uid, (entry.namespace, entry.name))
            held_or_none = allocations.get(entry.uid)
            found[(entry.uid, card.index)] = PodCard(
                uid=entry.uid,
                namespace=namespace,
                name=name,
                card=card.index,
                used_mib=entry.used_mib,
                requested_mib=None if held_or_none is None else 0,
                whole=held_or_none is not None and held_or_none.whole,
            )
    return tuple(sorted(found.values(), key=lambda f: (f.namespace, f.name, f.card)))


def _card(
    uid: str, namespace: str, name: str, index: int, *, used: int, held: allocation.Allocation, mode: gpu.Mode | None, total: int
) -> PodCard:
    if held.whole:
        return PodCard(uid=uid, namespace=namespace, name=name, card=index, used_mib=used, requested_mib=total, whole=True)
    requested = held.memory_gib * gpu.MIB_PER_GIB
    tolerance = 0 if mode is gpu.Mode.SHARE else usage.tolerance_mib(requested)
    return PodCard(
        uid=uid, namespace=namespace, name=name, card=index, used_mib=used, requested_mib=requested, tolerance_mib=tolerance
    )
