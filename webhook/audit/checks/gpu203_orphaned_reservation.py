"""GPU203: a card reservation must belong to a pod bound to that node.

On a pod: our allocation annotation names another node than the one it is bound to. On a node
(whole-cluster audits, which see every pod): an unexpired entry of its reservation ledger belongs
to a pod that no longer exists, has finished, or is bound elsewhere. The ledger is the node's
ledger Lease and, from earlier versions, its Node annotation (`policies.gpu.reservations`); an entry
of the Lease is named with the Lease, which is also related to the finding. A lapsed entry holds
nothing (the extender ignores it) and is not judged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies import gpu, model, podspec
from webhook.audit import findings
from webhook.audit.checks import base, facts


class OrphanedReservation(base.PodCheck, base.NodeCheck):
    """Card reservations held for pods that are not on that node."""

    id = "GPU203"
    rule = "orphaned-reservation"
    summary = "a card reservation must belong to a pod bound to that node"
    severity = findings.Severity.MEDIUM
    category = "GPU Allocation"
    action = model.Action.WARN

    def check_pod(self, pod: Mapping[str, Any], context: base.PodContext) -> findings.Finding | None:
        """A running pod with our allocation annotation: it must name the node the pod is bound to."""
        reserved = facts.annotated_node(pod)
        bound = podspec.mapping(pod.get("spec")).get("nodeName")
        if not reserved or not isinstance(bound, str) or not bound or not facts.active(pod):
            return None
        subject = findings.ObjectRef.of(pod)
        if reserved != bound:
            return self.finding(
                subject,
                result=model.Result.FAIL,
                detail=f"its {gpu.ALLOCATION_ANNOTATION} reserves cards on node {reserved}, but it is bound to {bound}",
            )
        return self.finding(subject, result=model.Result.PASS, detail=f"bound to {bound}")

    def check_node(self, node: Mapping[str, Any], context: base.NodeContext) -> findings.Finding | None:
        """A node's reservation ledger: unexpired entries must belong to a live pod of this node.

        `context.pods_by_uid` must hold every pod of the cluster. None for a node without a ledger.
        """
        ledger = context.ledger(node)
        if not ledger:
            return None
        subject = facts.node_ref(node)
        node_name = facts.name_of(node)
        problems: list[str] = []
        involved: list[findings.ObjectRef] = []
        for uid, entry in sorted(ledger.items()):
            if (entry.expires or 0.0) <= context.now:
                continue  # lapsed: the extender ignores it, nothing is held
            pod = context.pods_by_uid.get(uid)
            held = facts.card_list(entry)
            where = context.where(uid)
            if pod is None:
                problems.append(f"{entry.pod_key} (uid {uid}) holds card {held}{where} but no longer exists")
            elif not facts.active(pod):
                problems.append(f"{entry.pod_key} holds card {held}{where} but has finished")
            else:
                bound = podspec.mapping(pod.get("spec")).get("nodeName")
                if bound and bound != node_name:
                    problems.append(f"{entry.pod_key} holds card {held}{where} but is bound to {bound}")
                else:
                    continue
            involved.append(facts.allocation_ref(entry))
            if where and context.lease is not None and context.lease not in involved:
                involved.insert(0, context.lease)  # first: `verdict` keeps only the first MAX_RELATED
        return self.verdict(
            subject, base.shortened(problems), passed="every reservation belongs to a pod of this node", related=involved
        )
