"""GPU201: a pod on a GPU node that requests no GPU must not be able to reach the cards.

It can when a container is privileged (or adds SYS_ADMIN/ALL; ephemeral debug containers
included), mounts a hostPath on the node's devices or sockets, or sets NVIDIA_VISIBLE_DEVICES to
anything but void/none (by value or through valueFrom): a certain failure, enforced. A container
that does not set NVIDIA_VISIBLE_DEVICES=void at all is an uncertain one (warn): an image that
defaults it to `all` would see every card. Judged only for pods bound to a known GPU node and not
finished.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies import gpu, hostpaths, model, podspec
from webhook.audit import findings
from webhook.audit.checks import base, facts


def access_reasons(spec: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(certain, uncertain) ways the pod's containers can reach the node's cards."""
    certain: list[str] = []
    uncertain: list[str] = []
    for ref in podspec.iter_containers(spec, spec_path=""):
        privilege = podspec.gpu_privilege(ref.container)  # privileged, or SYS_ADMIN/ALL added
        if privilege:
            certain.append(f"{ref.label} {privilege}")
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
    for index, volume in podspec.volumes(spec):
        path = podspec.mapping(volume.get("hostPath")).get("path")
        if isinstance(path, str):
            protected = hostpaths.exposes_gpu(path)
            if protected is not None:
                volume_name = volume.get("name") if isinstance(volume.get("name"), str) else f"volumes[{index}]"
                certain.append(f'volume "{volume_name}" mounts hostPath {path}, covering {protected}')
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
