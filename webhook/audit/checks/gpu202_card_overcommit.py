"""GPU202: no card may be allocated beyond its capacity, and no node beyond what it advertises.

Per card (from the allocation annotations): more GiB than the card has, more than 100 % of its
cores, or a card held whole by one pod and shared by others. Per node: the GPU resources of the
pods bound to it add up to more than it advertises (pods placed with `spec.nodeName`, past the
scheduler). Enforced: cards are double-booked right now.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies import gpu, model, podspec
from webhook.audit import findings
from webhook.audit.checks import base, facts


def _requested(pod: Mapping[str, Any]) -> dict[str, int]:
    """The GPU resources a pod holds on its node, counted as Kubernetes counts them (sidecars add up)."""
    return dict(gpu.pod_gpu_requests(podspec.mapping(pod.get("spec"))).amounts)


def _named(refs: list[findings.ObjectRef]) -> str:
    shown = ", ".join(ref.display for ref in refs[: base.MAX_NAMED])
    return shown + (f" and {len(refs) - base.MAX_NAMED} more" if len(refs) > base.MAX_NAMED else "")


class CardOvercommitted(base.NodeCheck):
    """Cards and nodes allocated beyond their capacity."""

    id = "GPU202"
    rule = "card-overcommitted"
    summary = "no card may be allocated beyond its capacity"
    severity = findings.Severity.HIGH
    category = "GPU Allocation"
    action = model.Action.ENFORCE

    def check_node(self, node: Mapping[str, Any], context: base.NodeContext) -> findings.Finding | None:
        """None for a node without GPUs."""
        if not facts.is_gpu_node(node):
            return None
        state = context.state
        subject = facts.node_ref(node)
        problems: list[str] = []
        involved: dict[findings.ObjectRef, None] = {}
        for card in state.cards:
            holders = [facts.allocation_ref(a) for a in card.allocations]
            reasons = []
            if card.memory_used > card.card.memory_gib:
                reasons.append(f"{card.memory_used} GiB allocated of {card.card.memory_gib} GiB")
            if card.core_used > gpu.MAX_CORE_PERCENTAGE:
                reasons.append(f"{card.core_used}% of the cores")
            if card.whole_used and len(card.allocations) > 1:
                reasons.append(f"held whole by one pod but shared by {len(card.allocations)}")
            if reasons:
                problems.append(f"card {card.index}: {', '.join(reasons)} ({_named(holders)})")
                involved.update(dict.fromkeys(holders))
        advertised = facts.capacity(node)
        used: dict[str, int] = {}
        requested = [(pod, _requested(pod)) for pod in context.pods if facts.active(pod)]
        for _, asked in requested:
            for key, amount in asked.items():
                used[key] = used.get(key, 0) + amount
        for key in sorted(used):
            if used[key] > advertised.get(key, 0):
                problems.append(f"pods bound to the node ask for {key}={used[key]}, the node has {advertised.get(key, 0)}")
                involved.update(dict.fromkeys(findings.ObjectRef.of(p) for p, asked in requested if asked.get(key)))
        allocated = sum(card.memory_used for card in state.cards)
        passed = f"{allocated} of {state.memory_total} GiB allocated" if state.cards else "within capacity"
        return self.verdict(subject, problems, passed=passed, related=list(involved))
