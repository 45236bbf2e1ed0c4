"""GPU206: GPU nodes carry the card-model labels (`aliyun.accelerator/nvidia_name`, `_mem`, `_count`).

Without them pods cannot select the node's card model; the labeler writes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies import gpu, model
from webhook.audit import findings
from webhook.audit.checks import base, facts

CARD_MODEL_LABELS: tuple[str, ...] = (gpu.CARD_NAME_LABEL, gpu.CARD_MEMORY_LABEL, gpu.CARD_COUNT_LABEL)


class CardModelLabels(base.NodeCheck):
    """GPU nodes missing a card-model label."""

    id = "GPU206"
    rule = "card-model-labels"
    summary = "GPU nodes carry the card-model labels"
    severity = findings.Severity.MEDIUM
    category = "GPU Nodes"
    action = model.Action.WARN

    def check_node(self, node: Mapping[str, Any], context: base.NodeContext) -> findings.Finding | None:
        """None for a node without GPUs."""
        if not facts.is_gpu_node(node):
            return None
        subject = facts.node_ref(node)
        present = facts.labels_of(node)
        missing = [key for key in CARD_MODEL_LABELS if not present.get(key)]
        if missing:
            return self.finding(
                subject,
                result=model.Result.FAIL,
                detail=f"missing {', '.join(missing)}; pods cannot select this node's card model (run the labeler on it)",
            )
        return self.finding(subject, result=model.Result.PASS, detail=str(present[gpu.CARD_NAME_LABEL]))
