"""GPU216: no card is allocated both by Dynamic Resource Allocation and by the extender.

A card of the node's inventory that an allocated ResourceClaim holds (its device's UUID, or a MIG
device's parentUUID, in the driver's ResourceSlice: `policies.gpu.dra`) and that pods' allocation
annotations or ledger entries also hold is double-booked: two accounts hand out the same memory.
The extender never places a shared pod on a card a claim holds, and its leader keeps a
DeviceTaintRule on every card that holds shared pods, so this happens when the DeviceTaintRule API
is off (Kubernetes 1.34 and 1.35 without the `DRADeviceTaints` gate and runtime-config), when a claim
tolerates the taint, or when both were allocated before either side knew of the other. Admin-access
results hold nothing and are not judged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies import model
from webhook.audit import findings
from webhook.audit.checks import base, facts


class DraDoubleBooking(base.NodeCheck):
    """Cards held both by DRA claims and by the extender's pods."""

    id = "GPU216"
    rule = "dra-double-booking"
    summary = "no card is allocated both by Dynamic Resource Allocation and by the extender"
    severity = findings.Severity.HIGH
    category = "GPU Allocation"
    action = model.Action.ENFORCE

    def check_node(self, node: Mapping[str, Any], context: base.NodeContext) -> findings.Finding | None:
        """None unless the node has cards that DRA claims hold."""
        state = context.state
        held = [c for c in state.cards if c.dra]
        if not held:
            return None
        problems = [
            f"card {c.index} ({c.card.uuid}) is allocated to "
            + ", ".join(h.describe() for h in c.dra)
            + " and to pods "
            + ", ".join(a.pod_key for a in c.allocations[: base.MAX_NAMED])
            for c in held
            if c.allocations
        ]
        related = [
            findings.ObjectRef(
                namespace=h.namespace, kind="ResourceClaim", name=h.claim, api_version="resource.k8s.io/v1", uid=h.uid
            )
            for c in held
            if c.allocations
            for h in c.dra
        ]
        return self.verdict(
            facts.node_ref(node),
            [f"on node {facts.name_of(node)}: {p}" for p in base.shortened(problems)],
            passed="no card held by a DRA claim is also allocated by the extender",
            related=related,
        )
