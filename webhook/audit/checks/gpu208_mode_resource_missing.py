"""GPU208: a GPU node advertises its mode's GPU resource.

A node of a known mode that advertises none of the resources without which it cannot take a single
pod of its family most likely has no device plugin running (seed `003_c28dd89f5a652d9c.txt`). A
mode that is no mode is GPU205's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies import gpu, model
from webhook.audit import findings
from webhook.audit.checks import base, facts

# The resources without which a node of the mode cannot take a single pod of its family.
MODE_ESSENTIALS: Mapping[gpu.Mode, tuple[str, ...]] = {
    gpu.Mode.DEFAULT: (gpu.Resource.NVIDIA_GPU,),
    gpu.Mode.CGPU: (gpu.Resource.GPU_MEM,),
    gpu.Mode.SHARE: (gpu.Resource.GPU_MEM,),
    gpu.Mode.MPS: (gpu.Resource.GPU_MEM,),
    gpu.Mode.CORE_MEM: (gpu.Resource.GPU_MEM, gpu.Resource.GPU_CORE_PERCENTAGE),
    gpu.Mode.TOPOLOGY: (gpu.Resource.ALIYUN_GPU,),
}


class ModeResourceMissing(base.NodeCheck):
    """GPU nodes advertising none of their own mode's resource."""

    id = "GPU208"
    rule = "mode-resource-missing"
    summary = "a GPU node advertises its mode's GPU resource"
    severity = findings.Severity.MEDIUM
    category = "GPU Nodes"
    action = model.Action.WARN

    def check_node(self, node: Mapping[str, Any], context: base.NodeContext) -> findings.Finding | None:
        """None for a node without GPUs or without a known mode."""
        found = facts.mode(node)
        if found is None or not facts.is_gpu_node(node):
            return None
        subject = facts.node_ref(node)
        advertised = facts.capacity(node)
        missing = [key for key in MODE_ESSENTIALS[found] if advertised.get(key, 0) <= 0]
        if missing:
            return self.finding(
                subject,
                result=model.Result.FAIL,
                detail=f"the node is in mode {found} but advertises no {', '.join(missing)}; is its device plugin running?",
            )
        return self.finding(subject, result=model.Result.PASS, detail=f"mode {found}")
