"""GPU207: workloads asking for `aliyun.com/gpu-mem` select one `ack.node.gpu.schedule` mode.

Without a nodeSelector or required affinity that pins one mode, a pod needing memory isolation can
land in the pool without it (seed `004_79385826ac27146d.txt`). Judged on Pods and workload
templates alike; a constraint that allows no serving mode at all is GPU005's refusal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies import gpu, model, nodeaffinity, podspec
from webhook.audit import findings
from webhook.audit.checks import base


class ModeSelector(base.TemplateCheck):
    """Shared-memory GPU workloads that do not pin one GPU mode."""

    id = "GPU207"
    rule = "mode-selector"
    summary = "workloads asking for aliyun.com/gpu-mem select one ack.node.gpu.schedule mode"
    severity = findings.Severity.MEDIUM
    category = "GPU Scheduling"
    action = model.Action.WARN

    def check_template(self, obj: Mapping[str, Any]) -> findings.Finding | None:
        """None for anything but a Pod or workload asking for `aliyun.com/gpu-mem` alone."""
        found = podspec.template(obj)
        if found is None:
            return None
        family = gpu.pod_family(found.spec)
        if family is not gpu.Family.SHARED:
            return None
        subject = findings.ObjectRef.of(obj)
        serving = frozenset(gpu.modes_for(family))
        constraint = nodeaffinity.mode_constraint(found.spec)
        if constraint is None:
            return self.finding(
                subject,
                result=model.Result.FAIL,
                detail=f"no nodeSelector {gpu.SCHEDULE_LABEL}; the pods can land on any of "
                f"{', '.join(gpu.modes_for(family))} nodes, with or without memory isolation",
            )
        allowed = sorted(constraint.allowed & serving)
        if not allowed:
            return None  # no serving mode at all: GPU005 refuses that
        if len(allowed) > 1:
            return self.finding(
                subject,
                result=model.Result.FAIL,
                detail=f"its {constraint.source} allows {', '.join(allowed)}; pick one",
            )
        return self.finding(subject, result=model.Result.PASS, detail=constraint.source)
