"""GPU001: no container picks its GPUs through NVIDIA_VISIBLE_DEVICES (seed `003_c28dd89f5a652d9c.txt`).

A container that sets the variable sees cards the scheduler never gave it. Three ways to set it:

- `env[].value`: anything but `void`/`none` (trimmed, any case) fails.
- `env[].valueFrom`: a ConfigMap/Secret key is looked up when the request carries an
  `env_lookup`; otherwise, and for `fieldRef`/`resourceFieldRef`, the value is unknown and it fails.
  Naming the variable explicitly and hiding its value is not something a legitimate pod needs.
- `envFrom`: a ConfigMap/Secret without a prefix, or with a prefix that begins
  `NVIDIA_VISIBLE_DEVICES`, can produce it. With `env_lookup` the data decides. Offline the finding
  is uncertain and is reported as a warning at most: `envFrom` of a ConfigMap is everyday practice,
  and denying all of it would block far more than it protects. `env` takes precedence over
  `envFrom` in Kubernetes, so a container that also sets the variable in `env` (as GPU104 does
  with `void` for containers without GPUs) is judged on `env` alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from policies import gpu, model, podspec, policy

_SOURCE_FIELDS: Mapping[str, Literal["ConfigMap", "Secret"]] = {
    "configMapRef": "ConfigMap",
    "secretRef": "Secret",
    "configMapKeyRef": "ConfigMap",
    "secretKeyRef": "Secret",
}


class VisibleDevices(policy.ContainerValidator):
    """Refuses NVIDIA_VISIBLE_DEVICES set to anything but void/none, however it is set."""

    id = "GPU001"
    summary = "containers must not choose GPUs through NVIDIA_VISIBLE_DEVICES"

    def check_container(
        self, context: policy.Context, container: podspec.ContainerRef
    ) -> Iterable[policy.Finding]:
        """Findings for the container's env and envFrom."""
        entries = [
            e for e in podspec.env_entries(container.container) if e.get("name") == gpu.VISIBLE_DEVICES_ENV
        ]
        if entries:
            return [f for e in entries for f in _check_entry(context, container, e)]
        return [
            f
            for source in podspec.sequence(container.container.get("envFrom"))
            for f in _check_env_from(context, container, podspec.mapping(source))
        ]


def _lookup(
    context: policy.Context, kind: Literal["ConfigMap", "Secret"], name: str
) -> Mapping[str, str] | None:
    lookup = context.request.env_lookup
    if lookup is None:
        return None
    return lookup(model.EnvSource(kind=kind, namespace=context.namespace, name=name))


def _check_entry(
    context: policy.Context, container: podspec.ContainerRef, entry: Mapping[str, Any]
) -> list[policy.Finding]:
    value_from = entry.get("valueFrom")
    if value_from is None or "value" in entry:
        value = entry.get("value")
        value = "" if value is None else value
        if context.settings.is_neutral_visible_devices(value):
            return []
        shown = value if isinstance(value, str) else repr(value)
        return [
            policy.Finding(
                detail=f"{container.label} sets {gpu.VISIBLE_DEVICES_ENV}={shown}; "
                f"request GPUs as resources, or use {gpu.VISIBLE_DEVICES_VOID}"
            )
        ]
    reference = podspec.mapping(value_from)
    for field in ("configMapKeyRef", "secretKeyRef"):
        ref = podspec.mapping(reference.get(field))
        if ref:
            name, key = str(ref.get("name", "")), str(ref.get("key", ""))
            kind = _SOURCE_FIELDS[field]
            data = _lookup(context, kind, name)
            if data is not None:
                value = data.get(key)
                if value is None or context.settings.is_neutral_visible_devices(value):
                    return []
                return [
                    policy.Finding(
                        detail=f"{container.label} sets {gpu.VISIBLE_DEVICES_ENV}={value} "
                        f"from {kind} {name!r} key {key!r}"
                    )
                ]
            return [
                policy.Finding(
                    detail=f"{container.label} sets {gpu.VISIBLE_DEVICES_ENV} from {kind} "
                    f"{name!r} key {key!r}, whose value cannot be checked"
                )
            ]
    return [
        policy.Finding(
            detail=f"{container.label} sets {gpu.VISIBLE_DEVICES_ENV} through valueFrom, "
            "whose value cannot be checked"
        )
    ]


def _check_env_from(
    context: policy.Context, container: podspec.ContainerRef, source: Mapping[str, Any]
) -> list[policy.Finding]:
    prefix = source.get("prefix") or ""
    if not isinstance(prefix, str) or not gpu.VISIBLE_DEVICES_ENV.startswith(prefix):
        return []
    key = gpu.VISIBLE_DEVICES_ENV[len(prefix) :]
    for field in ("configMapRef", "secretRef"):
        ref = podspec.mapping(source.get(field))
        if not ref:
            continue
        kind = _SOURCE_FIELDS[field]
        name = str(ref.get("name", ""))
        data = _lookup(context, kind, name)
        if data is None:
            shown_prefix = f" with prefix {prefix!r}" if prefix else ""
            return [
                policy.Finding(
                    detail=f"{container.label} takes envFrom {kind} {name!r}{shown_prefix}, "
                    f"which may set {gpu.VISIBLE_DEVICES_ENV}; set "
                    f"{gpu.VISIBLE_DEVICES_ENV}={gpu.VISIBLE_DEVICES_VOID} in env to rule it out",
                    certain=False,
                )
            ]
        value = data.get(key)
        if value is not None and not context.settings.is_neutral_visible_devices(value):
            return [
                policy.Finding(
                    detail=f"{container.label} sets {gpu.VISIBLE_DEVICES_ENV}={value} "
                    f"through envFrom {kind} {name!r} key {key!r}"
                )
            ]
    return []


def sources(obj: Mapping[str, Any], *, namespace: str) -> frozenset[model.EnvSource]:
    """The ConfigMaps and Secrets this policy would look up for `obj` (pod or workload template).

    A caller with cluster access fetches these before evaluating (the engine never waits on I/O)
    and hands the data in as `Request.env_lookup`. A superset is harmless: what is not asked for
    is not read.
    """
    found: set[model.EnvSource] = set()
    for container in podspec.containers(obj):
        entries = [e for e in podspec.env_entries(container.container) if e.get("name") == gpu.VISIBLE_DEVICES_ENV]
        for entry in entries:
            reference = podspec.mapping(entry.get("valueFrom"))
            for field in ("configMapKeyRef", "secretKeyRef"):
                ref = podspec.mapping(reference.get(field))
                if ref and "value" not in entry:
                    found.add(model.EnvSource(kind=_SOURCE_FIELDS[field], namespace=namespace, name=str(ref.get("name", ""))))
        if entries:
            continue  # env takes precedence over envFrom
        for source in podspec.sequence(container.container.get("envFrom")):
            source = podspec.mapping(source)
            prefix = source.get("prefix") or ""
            if not isinstance(prefix, str) or not gpu.VISIBLE_DEVICES_ENV.startswith(prefix):
                continue
            for field in ("configMapRef", "secretRef"):
                ref = podspec.mapping(source.get(field))
                if ref:
                    found.add(model.EnvSource(kind=_SOURCE_FIELDS[field], namespace=namespace, name=str(ref.get("name", ""))))
    return frozenset(found)
