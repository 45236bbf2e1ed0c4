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
from policies.gpu import allocation, cardrequest
from webhook.audit import findings
from webhook.audit.checks import base, facts


def _mismatch(found: allocation.Allocation, request: cardrequest.Request) -> str:
    """How the allocation differs from what the pod asks for ("" where it matches)."""
    held = facts.card_list(found)
    if request.cards:
        if not found.whole or len(found.cards) != request.cards:
            return f"it asks for {request.describe()} but its allocation holds card {held}" + (
                "" if found.whole else f" with {found.memory_gib} GiB"
            )
        return ""
    if found.whole or len(found.cards) != 1:
        return f"it asks for {request.describe()} but its allocation holds card {held}" + (" whole" if found.whole else "")
    if found.memory_gib != request.memory_gib:
        return f"it asks for {request.describe()} but its allocation counts {found.memory_gib} GiB on card {held}"
    if found.source != "gpushare" and found.core_percent != request.core_percent:
        return f"it asks for {request.describe()} but its allocation counts {found.core_percent}% on card {held}"
    return ""


def _gpushare_disagrees(pod: Mapping[str, Any], found: allocation.Allocation) -> str:
    """Where gpushare's annotations name other cards or GiB than our allocation ("" where they agree).

    The device plugin hands the container the card `ALIYUN_COM_GPU_MEM_IDX` names while the
    accounting counts our allocation: a difference is a card used but accounted elsewhere.
    """
    if found.source != "allocation":
        return ""
    annotations = facts.annotations_of(pod)
    index = annotations.get(gpu.GPUSHARE_MEM_IDX_ANNOTATION)
    held = facts.card_list(found)
    if index is not None and index != held:
        return f"{gpu.GPUSHARE_MEM_IDX_ANNOTATION}={index} names another card than its {gpu.ALLOCATION_ANNOTATION} (card {held})"
    memory = annotations.get(gpu.GPUSHARE_MEM_POD_ANNOTATION)
    if memory is not None and not found.whole and memory != str(found.memory_gib):
        return f"{gpu.GPUSHARE_MEM_POD_ANNOTATION}={memory} differs from its {gpu.ALLOCATION_ANNOTATION} ({found.memory_gib} GiB)"
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
        request = context.parses.request(pod)
        if request.problem or not request.managed:
            return None
        reserved = facts.annotated_node(pod)
        if reserved and reserved != bound:
            return None
        subject = findings.ObjectRef.of(pod)
        found = context.parses.allocation(pod, now=context.now)
        if found is None:
            return self.finding(
                subject,
                result=model.Result.FAIL,
                detail=f"it runs on node {bound} asking for {request.describe()} but holds no card allocation "
                f"({gpu.ALLOCATION_ANNOTATION} or {gpu.GPUSHARE_MEM_IDX_ANNOTATION} and {gpu.GPUSHARE_MEM_POD_ANNOTATION}): "
                "the scheduler extender never placed it (spec.nodeName at create, or a scheduler without the "
                "extender), so no card accounts for it; recreate it without nodeName",
            )
        problem = _mismatch(found, request) or _gpushare_disagrees(pod, found)
        if problem:
            return self.finding(
                subject,
                result=model.Result.FAIL,
                detail=f"on node {bound}: {problem}; the allocation was not made by the extender for this pod",
            )
        return self.finding(subject, result=model.Result.PASS, detail=f"card {facts.card_list(found)} of node {bound}")
