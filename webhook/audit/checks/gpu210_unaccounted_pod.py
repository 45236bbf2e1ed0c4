"""GPU210: a bound pod asking for extender-managed GPU resources holds the allocation the extender made for its request.

It fails when the pod holds no card allocation at all (placed with `spec.nodeName` at create, or by
a scheduler without the extender: no card accounts for it), or when its allocation does not match
its request (another size, another card count, or gpushare's annotations and ours naming different
cards). A card index the node lacks is GPU204's, an allocation on another node GPU203's, a
malformed request GPU004's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies import gpu, model, podspec
from webhook.audit import findings
from webhook.audit.checks import base, facts
from webhook.extender import cards


def _mismatch(allocation: cards.Allocation, request: cards.Request) -> str:
    """How the allocation differs from what the pod asks for ("" where it matches)."""
    held = facts.card_list(allocation)
    if request.cards:
        if not allocation.whole or len(allocation.cards) != request.cards:
            return f"it asks for {request.describe()} but its allocation holds card {held}" + (
                "" if allocation.whole else f" with {allocation.memory_gib} GiB"
            )
        return ""
    if allocation.whole or len(allocation.cards) != 1:
        return f"it asks for {request.describe()} but its allocation holds card {held}" + (" whole" if allocation.whole else "")
    if allocation.memory_gib != request.memory_gib:
        return f"it asks for {request.describe()} but its allocation counts {allocation.memory_gib} GiB on card {held}"
    if allocation.source != "gpushare" and allocation.core_percent != request.core_percent:
        return f"it asks for {request.describe()} but its allocation counts {allocation.core_percent}% on card {held}"
    return ""


def _gpushare_disagrees(pod: Mapping[str, Any], allocation: cards.Allocation) -> str:
    """Where gpushare's annotations name other cards or GiB than our allocation ("" where they agree).

    The device plugin hands the container the card `ALIYUN_COM_GPU_MEM_IDX` names while the
    accounting counts our allocation: a difference is a card used but accounted elsewhere.
    """
    if allocation.source != "allocation":
        return ""
    annotations = facts.annotations_of(pod)
    index = annotations.get(gpu.GPUSHARE_MEM_IDX_ANNOTATION)
    held = facts.card_list(allocation)
    if index is not None and index != held:
        return f"{gpu.GPUSHARE_MEM_IDX_ANNOTATION}={index} names another card than its {cards.ALLOCATION_ANNOTATION} (card {held})"
    memory = annotations.get(gpu.GPUSHARE_MEM_POD_ANNOTATION)
    if memory is not None and not allocation.whole and memory != str(allocation.memory_gib):
        return f"{gpu.GPUSHARE_MEM_POD_ANNOTATION}={memory} differs from its {cards.ALLOCATION_ANNOTATION} ({allocation.memory_gib} GiB)"
    return ""


class UnaccountedGpuPod(base.PodCheck):
    """Bound pods whose GPU request no allocation accounts for."""

    id = "GPU210"
    rule = "unaccounted-gpu-pod"
    summary = "a bound pod asking for extender-managed GPU resources holds the allocation the extender made for its request"
    severity = findings.Severity.HIGH
    category = "GPU Allocation"
    action = model.Action.ENFORCE

    def check_pod(self, pod: Mapping[str, Any], context: base.PodContext) -> findings.Finding | None:
        """A running pod bound to a node and asking for an extender-managed resource; None for every other pod."""
        bound = podspec.mapping(pod.get("spec")).get("nodeName")
        if not isinstance(bound, str) or not bound or not facts.active(pod):
            return None
        request = cards.pod_request(pod)
        if request.problem or not request.managed:
            return None
        reserved = facts.annotated_node(pod)
        if reserved and reserved != bound:
            return None
        subject = findings.ObjectRef.of(pod)
        allocation = cards.pod_allocation(pod, now=context.now)
        if allocation is None:
            return self.finding(
                subject,
                result=model.Result.FAIL,
                detail=f"it runs on node {bound} asking for {request.describe()} but holds no card allocation "
                f"({cards.ALLOCATION_ANNOTATION} or {gpu.GPUSHARE_MEM_IDX_ANNOTATION} and {gpu.GPUSHARE_MEM_POD_ANNOTATION}): "
                "the scheduler extender never placed it (spec.nodeName at create, or a scheduler without the "
                "extender), so no card accounts for it; recreate it without nodeName",
            )
        problem = _mismatch(allocation, request) or _gpushare_disagrees(pod, allocation)
        if problem:
            return self.finding(
                subject,
                result=model.Result.FAIL,
                detail=f"on node {bound}: {problem}; the allocation was not made by the extender for this pod",
            )
        return self.finding(
            subject, result=model.Result.PASS, detail=f"card {facts.card_list(allocation)} of node {bound}"
        )
