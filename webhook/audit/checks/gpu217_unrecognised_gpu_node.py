"""GPU217: every node with GPU capacity carries a label that marks it as a GPU node.

The trust zone keeps pods with node power off GPU nodes by their labels (GPU103's affinity fails
every label of `trustzone.DEFAULT_GPU_NODE_LABELS` and `trustZone.gpuNodeLabels`), and `reach`
reads a node's labels the same way. Nodes are the ground truth: a node whose capacity or
allocatable holds a GPU resource of the explicit list (`gpu.is_gpu_resource`, plus
`trustZone.gpuResources`) and that none of those labels marks is a GPU node the rule cannot see. A
privileged pod "kept off GPU nodes" can land there and open every card on it, so this fails
(`enforce`), naming the resource and the label to add.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies import gpu, model, podspec, trustzone
from policies.gpu import quantity
from webhook.audit import findings
from webhook.audit.checks import base, facts

# What the finding asks for: our labeler writes the first; the second needs no card model.
LABEL_TO_ADD = (
    f"run the labeler on it (it writes {gpu.CARD_NAME_LABEL}), or `kubectl label node NAME nvidia.com/gpu.present=true`"
)


def gpu_resources(node: Mapping[str, Any], zone: trustzone.TrustZone) -> dict[str, int]:
    """The node's GPU resources with a non-zero count, from status.capacity and status.allocatable."""
    status = podspec.mapping(node.get("status"))
    found: dict[str, int] = {}
    for section in ("capacity", "allocatable"):
        for key, value in podspec.mapping(status.get(section)).items():
            count = quantity.count(value) or 0
            if count > 0 and zone.is_gpu_resource(key):
                found[str(key)] = max(found.get(str(key), 0), count)
    return found


class UnrecognisedGpuNode(base.NodeCheck):
    """Nodes with GPU capacity that no GPU node label marks."""

    id = "GPU217"
    rule = "unrecognised-gpu-node"
    summary = "every node with GPU capacity carries a GPU node label the trust zone knows"
    severity = findings.Severity.HIGH
    category = "GPU Nodes"
    action = model.Action.ENFORCE

    def check_node(self, node: Mapping[str, Any], context: base.NodeContext) -> findings.Finding | None:
        """None for a node without GPU capacity."""
        resources = gpu_resources(node, context.zone)
        if not resources:
            return None
        subject = facts.node_ref(node)
        label = context.zone.gpu_node_label(facts.labels_of(node))
        if label is not None:
            return self.finding(subject, result=model.Result.PASS, detail=f"recognised by {label.key}")
        shown = ", ".join(f"{name}: {count}" for name, count in sorted(resources.items()))
        return self.finding(
            subject,
            result=model.Result.FAIL,
            detail=f"has GPUs ({shown}) but none of the GPU node labels, so GPU103's affinity does not keep "
            f"pods with node power off it; {LABEL_TO_ADD.replace('NAME', subject.name)}, or add its label to "
            "trustZone.gpuNodeLabels",
        )
