"""What a pod holds that the built-in policies act on, read in one pass: the engine's pre-checks.

Most pods carry none of what most policies look for: no `securityContext`, no hostPath, no
`NVIDIA_*` variable, no annotation. A policy whose `relevant(context, facts)` says False is
recorded as a PASS without being run, which is what running it would give. That promise is what
makes a pre-check safe, so each one is the negation of the very first thing its policy needs to
find anything, read the way the policy reads it (`podspec.mapping`/`podspec.sequence` tolerance
included), and it only ever errs towards running the policy:

- a fact is "the field is there and not empty" (for mount paths: "names the device-list
  directory", GPU006's own first test), never "the field holds something bad";
- container facts cover exactly the containers the policy sees (`Context.containers`: all of them,
  or the new ephemeral ones on the `ephemeralcontainers` subresource); pod facts every container
  of the spec, as `gpu.pod_requests_gpu` reads them.

The facts describe one context; the engine reads them again after a mutator changes the pod
(GPU104's `NVIDIA_VISIBLE_DEVICES=void` is an env entry GPU001 must then see).
`tests/unit/policies/test_prechecks.py` runs generated pods through the engine with and without the
pre-checks and requires identical decisions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from policies import gpu, podspec, policy, trustzone


@dataclasses.dataclass(frozen=True, kw_only=True)
class Facts:
    """One pass over a pod (template) in a context; True means "a policy may have work here"."""

    # Pod level (every container of the spec, whatever the context's scope).
    requests_gpu: bool  # some container mentions a GPU resource: `gpu.pod_requests_gpu`
    security_context: bool  # some container has a non-empty securityContext
    host_path_volumes: bool  # some volume has a non-empty hostPath
    # Some volume has a source outside trustzone.DEFAULT_VOLUME_TYPES (a hostPath among them).
    unsafe_volumes: bool
    # The pod sets hostNetwork, hostPID or hostIPC (any truthy value), or has a pod securityContext.
    pod_privilege: bool
    host_ports: bool  # some container of the spec has a port with a non-zero hostPort
    annotations: bool  # the template's metadata.annotations is a non-empty mapping
    # The containers in scope (`Context.containers`).
    scope_security_context: bool  # some container in scope has a non-empty securityContext
    scope_host_ports: bool  # some container in scope has a port with a non-zero hostPort
    scope_guarded_env: bool  # envFrom, or an env entry named like one of gpu.GUARDED_ENV
    scope_device_list_mounts: bool  # a volumeMount or volumeDevice path naming DEVICE_LIST_NAME
    scope_without_gpu: bool  # some container in scope mentions no GPU resource


def _privileged_hint(container: Mapping[str, object]) -> bool:
    # trustzone.container_power reads `mapping(container.get("securityContext"))`: any falsy value
    # (absent, None, {}, "", 0, []) reads as {} there, and {} holds nothing privileged.
    return bool(container.get("securityContext"))


def _host_ports(container: Mapping[str, object]) -> bool:
    # trustzone.container_power judges every mapping port whose hostPort is truthy.
    return any(podspec.mapping(port).get("hostPort") for port in podspec.sequence(container.get("ports")))


def _guarded_env(container: Mapping[str, object]) -> bool:
    # GPU001 walks envFrom whenever it is a non-empty list or tuple, and an env entry only when it
    # is a mapping whose name is a string in GUARDED_ENV (exact case: the kernel's names are).
    if podspec.sequence(container.get("envFrom")):
        return True
    for entry in podspec.sequence(container.get("env")):
        if isinstance(entry, Mapping):
            name = entry.get("name")
            if isinstance(name, str) and name in gpu.GUARDED_ENV:
                return True
    return False


# The directory name in the NVIDIA toolkit's device-list path (GPU006): a mount path that does
# not contain it cannot request a device, however it is cleaned.
DEVICE_LIST_NAME = "nvidia-container-devices"


def _device_list_mounts(container: Mapping[str, object]) -> bool:
    # GPU006 reads `mapping(entry).get(key)` of every entry and judges only a string path.
    for field, key in (("volumeMounts", "mountPath"), ("volumeDevices", "devicePath")):
        for entry in podspec.sequence(container.get(field)):
            path = podspec.mapping(entry).get(key)
            if isinstance(path, str) and DEVICE_LIST_NAME in path:
                return True
    return False


def _host_path_volumes(spec: Mapping[str, object]) -> bool:
    # GPU003 judges only mapping volumes whose `mapping(volume.get("hostPath"))` holds a path.
    return any(isinstance(volume, Mapping) and volume.get("hostPath") for volume in podspec.sequence(spec.get("volumes")))


_SAFE_VOLUME_KEYS = trustzone.DEFAULT_VOLUME_TYPES | {"name"}


def _unsafe_volumes(spec: Mapping[str, object]) -> bool:
    # trustzone.pod_power judges every key of a mapping volume but its name; settings only add types.
    return any(
        isinstance(volume, Mapping) and any(key not in _SAFE_VOLUME_KEYS for key in volume)
        for volume in podspec.sequence(spec.get("volumes"))
    )


def _pod_privilege(spec: Mapping[str, object]) -> bool:
    # trustzone.pod_power reads `is True` of each host namespace and mapping(securityContext).
    return any(spec.get(field) for field in trustzone.HOST_NAMESPACES) or bool(spec.get("securityContext"))


def of(context: policy.Context) -> Facts:
    """The facts of the pod in `context`."""
    spec = context.template.spec
    scope = context.containers
    scope_security_context = scope_guarded_env = scope_device_list_mounts = scope_without_gpu = False
    scope_host_ports = False
    scope_gpu = False
    for ref in scope:
        container = ref.container
        scope_security_context = scope_security_context or _privileged_hint(container)
        scope_host_ports = scope_host_ports or _host_ports(container)
        scope_guarded_env = scope_guarded_env or _guarded_env(container)
        scope_device_list_mounts = scope_device_list_mounts or _device_list_mounts(container)
        if gpu.container_gpu_resources(container):
            scope_gpu = True
        else:
            scope_without_gpu = True
    if context.whole_pod:  # the containers in scope are every container of the spec
        requests_gpu, security_context, host_ports = scope_gpu, scope_security_context, scope_host_ports
    else:
        pod = tuple(podspec.iter_containers(spec, spec_path=context.template.spec_path))
        requests_gpu = any(gpu.container_gpu_resources(ref.container) for ref in pod)
        security_context = any(_privileged_hint(ref.container) for ref in pod)
        host_ports = any(_host_ports(ref.container) for ref in pod)
    return Facts(
        requests_gpu=requests_gpu,
        security_context=security_context,
        host_path_volumes=_host_path_volumes(spec),
        unsafe_volumes=_unsafe_volumes(spec),
        pod_privilege=_pod_privilege(spec),
        host_ports=host_ports,
        annotations=bool(context.template.annotations),
        scope_security_context=scope_security_context,
        scope_host_ports=scope_host_ports,
        scope_guarded_env=scope_guarded_env,
        scope_device_list_mounts=scope_device_list_mounts,
        scope_without_gpu=scope_without_gpu,
    )
