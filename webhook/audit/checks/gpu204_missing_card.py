"""GPU204: a pod's allocated card must exist on its node.

It does not when the node now has fewer cards, or the node is gone. Enforced: the accounting
counts a card nobody can use, and the pod's real card is counted nowhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies import model
from policies.gpu import cards
from webhook.audit import findings
from webhook.audit.checks import base, facts


class MissingCard(base.PodCheck):
    """Allocations naming a card (or node) that does not exist."""

    id = "GPU204"
    rule = "missing-card"
    summary = "a pod's allocated card must exist on its node"
    severity = findings.Severity.HIGH
    category = "GPU Allocation"
    action = model.Action.ENFORCE

    def check_pod(self, pod: Mapping[str, Any], context: base.PodContext) -> findings.Finding | None:
        """None for a pod holding no allocation; `context.models` caches each node's card model."""
        held = context.parses.allocation(pod, now=context.now)
        if held is None:
            return None
        subject = findings.ObjectRef.of(pod)
        node = context.nodes.get(held.node)
        shown = facts.card_list(held)
        if node is None:
            return self.finding(
                subject, result=model.Result.FAIL, detail=f"it holds card {shown} of node {held.node}, which no longer exists"
            )
        node_model = context.models.get(held.node)
        if node_model is None:
            node_model = context.models[held.node] = cards.node_cards(node)
        missing = [index for index in held.cards if node_model.card(index) is None]
        if missing:
            have = ", ".join(str(card.index) for card in node_model.cards) or f"none ({node_model.problem})"
            listed = ",".join(str(index) for index in missing)
            return self.finding(
                subject,
                result=model.Result.FAIL,
                detail=f"it holds card {listed} of node {held.node}, whose cards are {have}",
                related=[facts.node_ref(node)],
            )
        return self.finding(subject, result=model.Result.PASS, detail=f"card {shown} of node {held.node}")
