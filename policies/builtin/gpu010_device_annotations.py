"""GPU010: no pod annotation asks the node's container runtime for devices.

Devices reach a container outside the scheduler's accounting when a pod annotation names them and
something on the node reads pod annotations as device requests. What reads them (from public
source):

- CDI's annotations, `cdi.k8s.io/<name>: vendor/class=device` (cncf-tags/container-device-interface,
  pkg/cdi/annotations.go `ParseAnnotations`). containerd (`WithCDI` in internal/cri/opts, 1.7 and
  2.x, `enable_cdi`, on by default since 2.0) and CRI-O (`SpecInjectCDIDevices`) inject only the
  CDI devices of the CRI *container* config's annotations, which the kubelet fills from the device
  plugins' and DRA's answers, never from the pod (kubernetes, pkg/kubelet/kuberuntime/labels.go
  `newContainerAnnotations`); the pod's annotations go to the sandbox config
  (`newPodAnnotations`). But the NVIDIA container runtime reads the container's OCI spec: with its
  default `annotation-prefixes = ["cdi.k8s.io/"]` it injects the CDI devices such keys name, and
  in its default `auto` mode such a key alone switches it to `cdi` mode
  (NVIDIA/nvidia-container-toolkit, internal/config/image/cuda_image.go
  `cdiDeviceRequestsFromAnnotations`, `OnlyFullyQualifiedCDIDevices`). CRI-O copies every pod
  annotation it does not own into each container's OCI spec (internal/factory/container,
  `SpecAddAnnotations`: "Preserve the sandbox annotations"), and containerd copies those its
  runtime's `pod_annotations` patterns match (`GetPassthroughAnnotations`). So on CRI-O with the
  NVIDIA runtime, or containerd with a `pod_annotations` pattern such as `*`, a pod annotation
  `cdi.k8s.io/x: nvidia.com/gpu=all` (or `runtime.nvidia.com/gpu=all`, which needs no spec file)
  hands the container every card.
- The NVIDIA container toolkit's NRI plugin injects the CDI devices named by the pod annotations
  `nvidia.cdi.k8s.io/container.<name>`, `nvidia.cdi.k8s.io/pod` and `nvidia.cdi.k8s.io`
  (cmd/nvidia-ctk-installer/container/runtime/nri/plugin.go; containerd/nri
  `GetEffectiveAnnotation`), holding back only the management devices; its first version, and
  NRI's device-injector sample, read `cdi-devices.noderesource.dev` and `cdi-devices.nri.io`.
  The device-injector also adds any host device or mount named under `devices.*` and `mounts.*`.
- CRI-O's devices annotation (`devices.crio.io`, formerly `io.kubernetes.cri-o.Devices`), read from
  the pod where the runtime handler's `allowed_annotations` lists it, adds the host devices it
  names that `allowed_devices` holds (default `/dev/fuse` and `/dev/net/tun`: cri-o/cri-o,
  server/container_create_linux.go `specSetDevices`). The two default devices stay usable (rootless
  builds need `/dev/fuse`); any other device named there is refused, so a node whose admin widened
  `allowed_devices` to a card's device node hands it to no pod.

Those domains are `policies.gpu.DEVICE_ANNOTATION_DOMAINS`; a key is one of them when it is the
domain or starts with the domain and `/`. Keys are case-sensitive in Kubernetes and every reader
compares them exactly (`CDI.K8S.IO/x` or `cdi.k8s.io.x` asks nobody for anything), so they are
compared exactly here too.

What it refuses: such an annotation on a pod or a workload's pod template at create (and on any
workload update), and a pod UPDATE that adds one or changes its value (a later sandbox, after a
node restart for instance, is created from the pod's current annotations). Removing one passes.
deploy/webhook-configurations.yaml sends a pod's UPDATE only when such a key or an allocation key
(GPU008) was added or changed. Devices handed out by the kubelet (device plugins, DRA) arrive in
the CRI container config, not through pod annotations, and are untouched. A namespace that runs a
trusted device workload relying on these annotations (an NRI device-injector setup) gets an
exception. The audit reports stored pods that carry one.

In front of another GPU scheduler (the `scheduler` setting, `policies.schedulers`), the device
annotations that scheduler writes on a pod by UPDATE (HAMi's `hami.io/vgpu-devices-to-allocate`,
koordinator's `scheduling.koordinator.sh/device-allocated`, ...) pass when the request's
`userInfo.username` is exactly one of its trusted writers' (`system:serviceaccount:NS:NAME`).
Nobody may create a pod carrying them, and anyone else's update that adds or changes one is
refused as before; so is every other device annotation, from the writers too. The audit and
`explain` judge a stored pod, which carries what its scheduler wrote by design: there those keys
are not findings (as GPU008 is left out for the extender's own annotations).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from policies import applicability, gpu, podspec, policy

_INSTEAD = (
    "ask for GPUs as resources (nvidia.com/gpu, aliyun.com/gpu-mem) so the scheduler and the device "
    "plugin hand them out, or ask an admin for a namespace exception for a trusted device workload"
)


class DeviceAnnotations(policy.Validator):
    """Refuses pod annotations that container runtimes or their plugins read as device requests."""

    id = "GPU010"
    summary = "pod annotations must not ask the container runtime for devices (CDI or NRI device injection)"
    pod_updates = True

    def relevant(self, context: policy.Context, facts: applicability.Facts) -> bool:
        """Only where the pod has annotations."""
        del context
        return facts.annotations

    def validate(self, context: policy.Context) -> Iterable[policy.Finding]:
        """An UPDATE of the pod itself: the keys added or changed; anything else: every such key."""
        request = context.request
        if not context.whole_pod:
            return ()  # the ephemeralcontainers subresource cannot change annotations
        template = context.template
        annotations = template.annotations
        found = _device_keys(annotations)
        scheduler = context.settings.scheduler
        if context.settings.stored_objects:  # a stored pod carries what its scheduler wrote, by design
            found = [key for key in found if not scheduler.writes(key)]
        crio = {key: gpu.crio_extra_devices(annotations[key]) for key in gpu.CRIO_DEVICES_ANNOTATIONS if key in annotations}
        crio = {key: devices for key, devices in crio.items() if devices}
        if not found and not crio:
            return ()
        if request.operation == "UPDATE" and template.is_pod and not request.subresource:
            old = _annotations(request.old_object)
            fresh = [key for key in (*found, *crio) if key not in old or old.get(key) != annotations.get(key)]
            if scheduler.may_write(request.user):
                fresh = [key for key in fresh if not scheduler.writes(key)]
            if not fresh:
                return ()
            described = ", ".join(f"{'changes' if key in old else 'adds'} {key}" for key in fresh)
            return [
                policy.Finding(
                    detail=f"the update {described}, which asks the node's container runtime for devices "
                    f"outside the scheduler's accounting; leave it out: {_INSTEAD}"
                )
            ]
        where = "" if template.is_pod else "the pod template: "
        findings: list[policy.Finding] = []
        if found:
            findings.append(
                policy.Finding(
                    detail=f"{where}annotation {', '.join(found)} asks the node's container runtime for devices "
                    f"(CDI or NRI device injection) outside the scheduler's accounting; remove "
                    f"{'it' if len(found) == 1 else 'them'} and {_INSTEAD}"
                )
            )
        for key, devices in crio.items():
            allowed = ", ".join(sorted(gpu.CRIO_DEFAULT_ALLOWED_DEVICES))
            findings.append(
                policy.Finding(
                    detail=f"{where}annotation {key} asks CRI-O for the host device {', '.join(devices)}, beyond "
                    f"its default allowed devices ({allowed}); name only those, or {_INSTEAD}"
                )
            )
        return findings


def _device_keys(annotations: Mapping[str, Any]) -> list[str]:
    return sorted(key for key in annotations if gpu.is_device_annotation(key))


def _annotations(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    found = podspec.template(obj)
    return found.annotations if found is not None else {}
