"""GPU215: a card's real use stays within the sum of its allocations.

For a shared-mode node with the labeler's usage summary: the memory a card's processes hold (pods'
and out-of-band ones; where NVML gives no per-process figure, the card's memory used) exceeds what
its allocations add up to by more than the tolerance, so pods placed on the card by their
allocations may run out of memory. Cards held whole are not judged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies import gpu, model
from webhook.audit import findings
from webhook.audit.checks import base, facts


class CardUseExceedsAllocations(base.NodeCheck):
    """Shared cards whose real use exceeds their allocations."""

    id = "GPU215"
    rule = "card-use-exceeds-allocations"
    summary = "a card's real use stays within the sum of its allocations"
    severity = findings.Severity.MEDIUM
    category = "GPU Usage"
    action = model.Action.WARN

    def check_node(self, node: Mapping[str, Any], context: base.NodeContext) -> findings.Finding | None:
        """None unless the node is in a shared mode, has cards and a usage summary."""
        state = context.state
        summary = facts.node_usage(node)
        if summary is None or not state.node.shared or not state.node.cards:
            return None
        subject = facts.node_ref(node)
        problems: list[str] = []
        for card_state in state.cards:
            real_card = summary.card(card_state.index)
            if real_card is None or card_state.whole_used:
                continue
            figures = [p.used_mib for p in real_card.pods] + [o.used_mib for o in real_card.out_of_band if o.used_mib is not None]
            real = sum(figures) if figures else real_card.used_mib
            if real is None:
                continue
            allocated = card_state.memory_used * gpu.MIB_PER_GIB
            if real > allocated + facts.usage_tolerance_mib(allocated):
                problems.append(
                    f"card {card_state.index}: processes hold {real} MiB but allocations sum to {card_state.memory_used} GiB "
                    f"({allocated} MiB)"
                    + (f", {real_card.out_of_band_mib} MiB of it out-of-band" if real_card.out_of_band_mib else "")
                )
        if problems:
            return self.finding(
                subject,
                result=model.Result.FAIL,
                detail=f"on node {facts.name_of(node)}: "
                + "; ".join(problems)
                + "; pods placed on this card by its allocations may run out of memory",
            )
        return self.finding(subject, result=model.Result.PASS, detail="every card's real use is within its allocations")
