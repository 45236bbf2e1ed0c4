"""GPU212: cards are not held by pods that are gone.

Two ways: a reservation-ledger entry (the node's ledger Lease's, or its Node annotation's from
earlier versions) of a pod that no longer exists, older than the extender takes
to release it (`reasons.PRUNE_DEADLINE_S`: the extender is down or cannot prune); or a pod
Terminating longer than `reasons.STUCK_TERMINATING_S` past its deletion deadline, which kube-scheduler
still counts until its object is gone (its node is likely lost; force-delete it). Whole-cluster
audits only: the check needs every pod.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies import model, podspec
from policies.gpu import allocation, reasons
from webhook.audit import findings
from webhook.audit.checks import base, facts


class StaleAllocation(base.NodeCheck):
    """Cards held by pods that are gone or stuck terminating."""

    id = "GPU212"
    rule = "stale-allocation"
    summary = "cards are not held by pods that are gone"
    severity = findings.Severity.MEDIUM
    category = "GPU Allocation"
    action = model.Action.WARN

    def check_node(self, node: Mapping[str, Any], context: base.NodeContext) -> findings.Finding | None:
        """None for a node without cards; `context.pods_by_uid` must hold every pod."""
        if not context.state.node.cards:
            return None
        now = context.now
        subject = facts.node_ref(node)
        problems: list[str] = []
        involved: list[findings.ObjectRef] = []
        for uid, entry in sorted(context.ledger(node).items()):
            if (entry.expires or 0.0) <= now or uid in context.pods_by_uid:
                continue
            if (entry.assumed_at or 0.0) + reasons.PRUNE_DEADLINE_S > now:
                continue  # the extender releases it on its own; GPU203 names the entry meanwhile
            problems.append(
                f"{entry.pod_key} (uid {uid}, gone) still holds {entry.memory_gib} GiB on card {facts.card_list(entry)} "
                f"in the reservation ledger{context.where(uid)}"
            )
            involved.append(facts.allocation_ref(entry))
            if context.lease is not None and uid in context.lease_ledger and context.lease not in involved:
                involved.insert(0, context.lease)
        for held in context.state.allocations:
            pod = context.pods_by_uid.get(held.uid)
            deleted = podspec.mapping(pod.get("metadata")).get("deletionTimestamp") if pod is not None else None
            deadline = allocation.parse_time(deleted)
            if deadline is None or deadline + reasons.STUCK_TERMINATING_S > now:
                continue
            problems.append(
                f"{held.pod_key} has been Terminating {int(now - deadline)} s past its deletion deadline and still "
                f"holds card {facts.card_list(held)}: its node is likely lost; force-delete the pod to free the card"
            )
            involved.append(facts.allocation_ref(held))
        return self.verdict(subject, base.shortened(problems), passed="no card is held by a pod that is gone", related=involved)
