"""GPU205: a GPU node advertises only the resources of its `ack.node.gpu.schedule` mode.

Fails for a mode label that is no mode, and for a non-zero resource of another mode (`gpu.MODE_RESOURCES`,
DESIGN section 1): enabling a mode must set the other modes' resources to
0, or pods of another family land on the node. Enforced.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies import gpu, model
from webhook.audit import findings
from webhook.audit.checks import base, facts


class ModeResourceMismatch(base.NodeCheck):
    """GPU nodes advertising another mode's resources, or in no known mode."""

    id = "GPU205"
    rule = "mode-resource-mismatch"
    summary = "a GPU node advertises only the resources of its ack.node.gpu.schedule mode"
    severity = findings.Severity.HIGH
    category = "GPU Nodes"
    action = model.Action.ENFORCE

    def check_node(self, node: Mapping[str, Any], context: base.NodeContext) -> findings.Finding | None:
        """None for a node without GPUs."""
        if not facts.is_gpu_node(node):
            return None
        subject = facts.node_ref(node)
        found = facts.mode(node)
        if found is None:
            known = ", ".join(gpu.Mode)
            return self.finding(
                subject,
                result=model.Result.FAIL,
                detail=f"{gpu.SCHEDULE_LABEL}={facts.mode_label(node)} is no mode (known: {known})",
            )
        allowed = gpu.MODE_RESOURCES[found]
        foreign = {key: count for key, count in facts.capacity(node).items() if key not in allowed and count > 0}
        if foreign:
            listed = ", ".join(f"{key}={count}" for key, count in sorted(foreign.items()))
            return self.finding(
                subject,
                result=model.Result.FAIL,
                detail=f"the node is in mode {found} but advertises {listed}; enabling a mode must set "
                "the other modes' resources to 0",
            )
        return self.finding(subject, result=model.Result.PASS, detail=f"mode {found}")
