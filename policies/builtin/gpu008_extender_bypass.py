"""GPU008: a pod gets a card only through the scheduler extender: never by naming its node, by
writing the allocation annotations itself, or by a scheduler that does not call the extender.

What it refuses, on Pods and on workload templates (Deployment, Job, CronJob, ...):

- `spec.nodeName` on a pod asking for an extender-managed resource (`aliyun.com/gpu-mem`,
  `aliyun.com/gpu-core.percentage`, `aliyun.com/gpu`; `policies.gpu.EXTENDER_RESOURCES`). Such a pod
  skips kube-scheduler and with it the extender: no card is chosen and nothing is accounted (a
  25 GiB pod ran on a node of 2 x 15 GiB cards that way). A pod asking for none of them may set
  nodeName; so may one asking for `nvidia.com/gpu`: whole cards are handed out by the kubelet's
  device manager when the pod is admitted on the node, which refuses the pod when the node has no
  free device (kubernetes, pkg/kubelet/cm/devicemanager: UnexpectedAdmissionError "requested number
  of devices unavailable for nvidia.com/gpu", as in kubernetes/kubernetes issues 96519 and 130145),
  so nodeName cannot take a card twice.
- any allocation annotation at create (`policies.gpu.ALLOCATION_ANNOTATIONS`: gpushare's
  `ALIYUN_COM_GPU_MEM_IDX`, `_POD`, `_DEV`, `_ASSIGNED`, `_ASSUME_TIME` and our
  `gpu-admission.io/allocation`), on every pod, GPU or not. The extender's accounting
  (`policies.gpu.allocation.pod_allocation`) reads them from every pod without looking at what the
  pod asks for, and the gpushare device plugin gives a container the card `ALIYUN_COM_GPU_MEM_IDX`
  names (AliyunContainerService/gpushare-device-plugin, pkg/gpu/nvidia/allocate.go): a forged
  annotation picks the card, shrinks what is counted, or holds cards away from everyone else.
  The extender writes them only on a Binding: the apiserver copies a Binding's annotations onto
  the pod in the same write that sets nodeName, and that request is a CREATE of `pods/binding`,
  which no rule of this webhook names, so the extender's own writes never reach this policy.
- a pod UPDATE that adds, changes or removes one of them, except the one transition the gpushare
  device plugin makes on the node once the kubelet allocated the card: `ALIYUN_COM_GPU_MEM_ASSIGNED`
  from `false` to `true`, with `ALIYUN_COM_GPU_MEM_ASSUME_TIME` set to the time in nanoseconds
  (`patchPodAnnotationSpecAssigned` in pkg/gpu/nvidia/podutils.go patches exactly these two keys).
  Nothing reads a card from either of them. This is the only policy that judges plain pod
  UPDATEs (`pod_updates`); deploy/webhook-configurations.yaml has the apiserver send only the
  updates whose allocation annotations differ, so ordinary updates cost nothing.
- a `spec.schedulerName` that is not one of the schedulers calling the extender
  (`extenderSchedulers`, default `default-scheduler`, plus `gpuSchedulerName`) on a pod asking
  for an extender-managed resource: a second scheduler without the extender places the pod on a
  node, never on a card. Absent or empty means `default-scheduler`, as the apiserver defaults it.

Annotation keys are compared exactly: Kubernetes keys are case-sensitive, and every reader (the
device plugin's Go map lookups, `cards`) looks them up exactly, so another spelling is read by
nobody. The audit leaves this policy out (`stored_objects`): a stored, bound pod carries nodeName
and the extender's annotations by design; GPU210 judges stored pods (bound without an allocation,
or with one that does not match the request).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from policies import gpu, podspec, policy
from policies.builtin import gpu105_scheduler_name

ASSIGNED_BEFORE = "false"
ASSIGNED_AFTER = "true"


class ExtenderBypass(policy.Validator):
    """Refuses the ways around the extender's card accounting: nodeName, forged annotations, schedulers."""

    id = "GPU008"
    summary = "GPU cards are placed and accounted by the scheduler extender, never chosen by the pod"
    pod_updates = True
    stored_objects = False

    def validate(self, context: policy.Context) -> Iterable[policy.Finding]:
        """An UPDATE of the pod itself: the annotation changes; anything else: the pod as created."""
        request = context.request
        if request.operation == "UPDATE" and context.template.is_pod and not request.subresource:
            return _update_findings(context)
        if not context.whole_pod:
            return ()  # the ephemeralcontainers subresource changes nothing judged here
        return _create_findings(context)


def _where(template: podspec.Template) -> str:
    return "" if template.is_pod else "the pod template: "


def _create_findings(context: policy.Context) -> list[policy.Finding]:
    template = context.template
    where = _where(template)
    findings: list[policy.Finding] = []
    present = [key for key in gpu.ALLOCATION_ANNOTATIONS if key in template.annotations]
    if present:
        findings.append(
            policy.Finding(
                detail=f"{where}annotation {', '.join(present)} is set by the pod; only the scheduler "
                "extender writes the allocation annotations, when it binds the pod to a card: remove "
                f"{'it' if len(present) == 1 else 'them'}"
            )
        )
    node = template.spec.get("nodeName")
    scheduler = template.spec.get("schedulerName")
    name = gpu105_scheduler_name.DEFAULT_SCHEDULER if scheduler in (None, "") else scheduler
    allowed = context.settings.extender_schedulers
    wrong_node = node not in (None, "")
    wrong_scheduler = not isinstance(name, str) or name not in allowed
    if not (wrong_node or wrong_scheduler):
        return findings  # the common pod: no container needs a look
    asked = _askers(template)
    if not asked:
        return findings
    if wrong_node:
        findings.append(
            policy.Finding(
                detail=f"{where}spec.nodeName is {node!r} while {asked}: the pod would skip "
                "kube-scheduler and the extender, so no card would be chosen or accounted; remove "
                "nodeName and pick the node with a nodeSelector (kubernetes.io/hostname) instead"
            )
        )
    if wrong_scheduler:
        known = ", ".join(sorted(allowed)) or "none configured"
        findings.append(
            policy.Finding(
                detail=f"{where}spec.schedulerName is {name!r} while {asked}, and that is not a scheduler "
                f"that calls the extender ({known}); leave schedulerName out or name one of those, or "
                "have an admin add the scheduler to extenderSchedulers once it calls the extender"
            )
        )
    return findings


def _askers(template: podspec.Template) -> str:
    """Which containers ask for which extender-managed resources, in words ("" for none)."""
    parts = []
    for ref in podspec.iter_containers(template.spec, spec_path=template.spec_path):
        names = gpu.container_gpu_resources(ref.container) & gpu.EXTENDER_RESOURCES
        if names:
            parts.append(f"{ref.label} asks for {', '.join(sorted(names))}")
    return "; ".join(parts)


def _annotations(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    found = podspec.template(obj)
    return found.annotations if found is not None else {}


def _change(key: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    if key not in old:
        return f"adds {key}"
    if key not in new:
        return f"removes {key}"
    return f"changes {key}"


def _device_plugin_assignment(changed: list[str], old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether the change is the gpushare device plugin's: ASSIGNED false -> true, ASSUME_TIME now."""
    allowed = {gpu.GPUSHARE_MEM_ASSIGNED_ANNOTATION, gpu.GPUSHARE_MEM_ASSUME_TIME_ANNOTATION}
    if not set(changed) <= allowed or gpu.GPUSHARE_MEM_ASSIGNED_ANNOTATION not in changed:
        return False
    if old.get(gpu.GPUSHARE_MEM_ASSIGNED_ANNOTATION) != ASSIGNED_BEFORE:
        return False
    if new.get(gpu.GPUSHARE_MEM_ASSIGNED_ANNOTATION) != ASSIGNED_AFTER:
        return False
    if gpu.GPUSHARE_MEM_ASSUME_TIME_ANNOTATION in changed:
        stamp = new.get(gpu.GPUSHARE_MEM_ASSUME_TIME_ANNOTATION)
        return isinstance(stamp, str) and stamp.isascii() and stamp.isdigit()
    return True


def _update_findings(context: policy.Context) -> list[policy.Finding]:
    old = _annotations(context.request.old_object)
    new = context.template.annotations
    changed = [key for key in gpu.ALLOCATION_ANNOTATIONS if (key in old) != (key in new) or old.get(key) != new.get(key)]
    if not changed or _device_plugin_assignment(changed, old, new):
        return []
    described = ", ".join(_change(key, old, new) for key in changed)
    return [
        policy.Finding(
            detail=f"the update {described}; a running pod's allocation annotations are written only by "
            f"the scheduler extender's Binding (and {gpu.GPUSHARE_MEM_ASSIGNED_ANNOTATION} false -> true "
            "by the device plugin): leave them as they are"
        )
    ]
