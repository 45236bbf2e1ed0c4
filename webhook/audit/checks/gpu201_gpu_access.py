"""GPU201: a pod on a GPU node that requests no GPU must not be able to reach the cards.

It can when it has node power GPU nodes do not allow (`trustzone.node_power` with the built-in
allowances: a privileged container or a capability outside the allowlist, ephemeral debug
containers included, a host namespace, a host path outside the allowlist, a volume type with host
side effects), or sets NVIDIA_VISIBLE_DEVICES to anything but void/none (by value or through
valueFrom): a certain failure, enforced. A container
that does not set NVIDIA_VISIBLE_DEVICES=void at all is an uncertain one (warn): an image that
defaults it to `all` would see every card. Judged only for pods bound to a known GPU node and not
finished.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies import gpu, model, podspec, trustzone
from webhook.audit import findings
from webhook.audit.checks import base, facts


def access_reasons(spec: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(certain, uncertain) ways the pod's containers can reach the node's cards."""
    certain: list[str] = []
    uncertain: list[str] = []
    for ref in podspec.iter_containers(spec, spec_path=""):
        entries = [e for e in podspec.env_entries(ref.container) if e.get("name") == gpu.VISIBLE_DEVICES_ENV]
        if not entries:
            if ref.kind is not podspec.ContainerKind.EPHEMERAL:
                uncertain.append(ref.label)
            continue
        for entry in entries:
            if "valueFrom" in entry and "value" not in entry:
                certain.append(f"{ref.label} sets {gpu.VISIBLE_DEVICES_ENV} through valueFrom")
            elif not gpu.is_safe_visible_devices(entry.get("value", "")):
                certain.append(f"{ref.label} sets {gpu.VISIBLE_DEVICES_ENV}={entry.get('value')}")
    containers = podspec.iter_containers(spec, spec_path="")
    certain[:0] = [power.detail for power in trustzone.node_power(spec, containers, trustzone.DEFAULT_ALLOWANCE)]
    return certain, uncertain


class GpuAccessWithoutRequest(base.PodCheck):
    """Pods on GPU nodes that ask for no GPU yet can reach the cards."""

    id = "GPU201"
    rule = "gpu-access-without-request"
    summary = "pods on GPU nodes that request no GPU must not be able to reach the cards"
    severity = findings.Severity.HIGH
    category = "GPU Security"
    action = model.Action.ENFORCE

    def check_pod(self, pod: Mapping[str, Any], context: base.PodContext) -> findings.Finding | None:
        """None unless the pod runs (or will) on a known GPU node."""
        node = context.node
        spec = podspec.mapping(pod.get("spec"))
        if node is None or not spec.get("nodeName") or not facts.active(pod) or not context.node_has_gpus():
            return None
        subject = findings.ObjectRef.of(pod)
        if gpu.pod_requests_gpu(spec):
            return self.finding(subject, result=model.Result.PASS, detail="the pod requests a GPU")
        certain, uncertain = access_reasons(spec)
        where = f"on GPU node {facts.name_of(node)}"
        if certain:
            return self.finding(
                subject, result=model.Result.FAIL, detail=f"{where}: " + "; ".join(certain), related=[facts.node_ref(node)]
            )
        if uncertain:
            detail = (
                f"{where}: {', '.join(uncertain)} {'does' if len(uncertain) == 1 else 'do'} not set "
                f"{gpu.VISIBLE_DEVICES_ENV}={gpu.VISIBLE_DEVICES_VOID}; an image that defaults it to all "
                "would see every card"
            )
            return self.finding(subject, result=model.Result.WARN, detail=detail, related=[facts.node_ref(node)])
        return self.finding(subject, result=model.Result.PASS, detail=f"{where}, no way to the cards")
