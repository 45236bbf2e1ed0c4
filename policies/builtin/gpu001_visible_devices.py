"""GPU001: no container sets the environment that picks its GPUs or switches off their isolation.

The guarded names are `gpu.GUARDED_ENV`: `NVIDIA_VISIBLE_DEVICES` (seed `003_c28dd89f5a652d9c.txt`;
the NVIDIA container toolkit exposes the cards it lists) and the GPU-sharing isolation variables
(`gpu.ISOLATION_ENV`: what the gpushare device plugin sets in its Allocate response, such as
`ALIYUN_COM_GPU_MEM_CONTAINER`, and what the cGPU layer reads, such as `CGPU_DISABLE`). The kubelet
applies the pod's environment after the device plugin's, so a pod that names one of them overrides
what the scheduler gave it: `NVIDIA_VISIBLE_DEVICES=all` turns one accounted card into all of them,
`CGPU_DISABLE=true` or `ALIYUN_COM_GPU_MEM_CONTAINER=15` turn a 1 GiB share into the whole card.
Every container kind is judged (init, sidecar, regular, ephemeral), in Pods and workload templates.

- `env[].value`: `NVIDIA_VISIBLE_DEVICES` may only be `void`/`none` (trimmed, any case; see
  `Settings.visible_devices_neutral_value`), which expose no card. An isolation variable may not be
  set at all, whatever its value (an empty `ALIYUN_COM_GPU_MEM_CONTAINER` switches isolation off).
- `env[].valueFrom` (configMapKeyRef, secretKeyRef, fieldRef, resourceFieldRef) for a guarded name is
  refused always, even where today's value is `void`: a ConfigMap or Secret can be edited and an
  annotation changed before the container (re)starts, and the kubelet reads them only then.
- `envFrom` with a non-empty `prefix` that begins a guarded name (`NVIDIA_`, `NVIDIA_VISIBLE_`,
  `ALIYUN_COM_GPU_MEM_`, `CGPU_`, `N`, ...) composes it from an ordinary key (`NVIDIA_` +
  `VISIBLE_DEVICES`), which no check on the source's keys can see: refused in every container.
- `envFrom` without a prefix is admitted (it is everyday practice): GPU007 keeps every key equal to
  a guarded name out of ConfigMaps and Secrets, at creation and at every later update, so the source
  cannot deliver one, today or later. Where GPU007 does not hold for the source's namespace (not
  enforced there, or an exception for GPU007 covers it) this falls back to an uncertain finding (a
  warning at most). With cluster access (`Request.env_lookup`) a source that carries a guarded key
  today (made before GPU007 was enforced) is refused, naming the keys, never their values.

`env` beats `envFrom` in Kubernetes: a name the container sets in `env` is not taken from any
`envFrom` source, so a container that sets `NVIDIA_VISIBLE_DEVICES=void` in `env` (GPU104 adds it to
containers that request no GPU) is not judged for what its `envFrom` could compose as that name.
GPU104's `void` covers only `NVIDIA_VISIBLE_DEVICES`, and only in containers without a GPU; the
isolation variables have no neutral value, so prefixes that compose them are refused everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from policies import applicability, envsources, gpu, model, podspec, policy

_VALUE_FROM_FIELDS = ("configMapKeyRef", "secretKeyRef", "fieldRef", "resourceFieldRef")
SOURCE_GUARD = "GPU007"  # the policy that keeps guarded keys out of ConfigMaps and Secrets


class VisibleDevices(policy.ContainerValidator):
    """Refuses every way a container's environment can choose cards or switch off isolation."""

    id = "GPU001"
    summary = "containers must not set the environment that chooses GPUs or switches off their isolation"

    def relevant(self, context: policy.Context, facts: applicability.Facts) -> bool:
        """Only where a container in scope has envFrom or an env entry with a guarded name."""
        del context
        return facts.scope_guarded_env

    def check_container(self, context: policy.Context, container: podspec.ContainerRef) -> Iterable[policy.Finding]:
        """Findings for the container's env and envFrom."""
        found: list[policy.Finding] = []
        env_from = podspec.sequence(container.container.get("envFrom"))
        in_env: set[str] = set()  # only needed (and only filled) where envFrom is there to override
        for entry in podspec.env_entries(container.container):
            name = entry.get("name")
            if not isinstance(name, str):
                continue
            if env_from:
                in_env.add(name)
            if name in gpu.GUARDED_ENV:
                found.extend(_check_entry(context, container, name, entry))
        for source in env_from:
            found.extend(_check_env_from(context, container, podspec.mapping(source), in_env=in_env))
        return found


def _check_entry(
    context: policy.Context, container: podspec.ContainerRef, name: str, entry: Mapping[str, Any]
) -> list[policy.Finding]:
    if "valueFrom" in entry and "value" not in entry:
        reference = podspec.mapping(entry.get("valueFrom"))
        field = next((f for f in _VALUE_FROM_FIELDS if f in reference), "")
        if field in ("configMapKeyRef", "secretKeyRef"):
            ref = podspec.mapping(reference.get(field))
            where = f"{envsources.REFERENCE_FIELDS[field]} {str(ref.get('name', ''))!r} key {str(ref.get('key', ''))!r}"
        else:
            where = field or "valueFrom"
        advice = (
            f"set it by value to {context.settings.visible_devices_neutral_value or '(empty)'} or drop it"
            if name == gpu.VISIBLE_DEVICES_ENV
            else "drop it"
        )
        return [policy.Finding(detail=f"{container.label} sets {name} from {where}, which can change after admission; {advice}")]
    value = entry.get("value")
    value = "" if value is None else value
    shown = value if isinstance(value, str) else repr(value)
    if name == gpu.VISIBLE_DEVICES_ENV:
        if context.settings.is_neutral_visible_devices(value):
            return []
        return [
            policy.Finding(
                detail=f"{container.label} sets {gpu.VISIBLE_DEVICES_ENV}={shown}; "
                f"request GPUs as resources, or use {gpu.VISIBLE_DEVICES_VOID}"
            )
        ]
    return [
        policy.Finding(
            detail=f"{container.label} sets {name}={shown}, which the GPU-sharing device plugin sets to "
            "what the scheduler allocated; remove it and request aliyun.com/gpu-mem instead"
        )
    ]


def _check_env_from(
    context: policy.Context, container: podspec.ContainerRef, source: Mapping[str, Any], *, in_env: set[str]
) -> list[policy.Finding]:
    found = envsources.referenced(source)
    if found is None:
        return []
    kind, name = found
    prefix = source.get("prefix")
    prefix = prefix if isinstance(prefix, str) else ""
    composed = (gpu.GUARDED_ENV if not prefix else gpu.composed_guarded_env(prefix)) - in_env
    if not composed:
        return []
    if prefix:
        example = min(composed)
        return [
            policy.Finding(
                detail=f"{container.label} takes envFrom {kind} {name!r} with prefix {prefix!r}, which composes "
                f"{', '.join(sorted(composed))} from a key such as {example[len(prefix) :]!r}; use a prefix that "
                "begins no GPU variable (e.g. APP_)"
            )
        ]
    data = _lookup(context, kind, name)
    if data is not None:
        keys = sorted(k for k in data if k in composed)  # keys only: a Secret's values are never shown
        if keys:
            return [
                policy.Finding(
                    detail=f"{container.label} takes envFrom {kind} {name!r}, whose key"
                    f"{'s' if len(keys) > 1 else ''} {', '.join(keys)} would set the GPU environment; "
                    f"remove {'them' if len(keys) > 1 else 'it'} from the {kind}"
                )
            ]
        return []
    if sources_guarded(context):
        return []
    return [
        policy.Finding(
            detail=f"{container.label} takes envFrom {kind} {name!r}, which may set "
            f"{', '.join(sorted(composed))} ({SOURCE_GUARD} does not guard its keys in namespace "
            f"{context.namespace}); set {gpu.VISIBLE_DEVICES_ENV}={gpu.VISIBLE_DEVICES_VOID} in env or enforce "
            f"{SOURCE_GUARD}",
            certain=False,
        )
    ]


def sources_guarded(context: policy.Context) -> bool:
    """Whether GPU007 keeps guarded keys out of every ConfigMap and Secret of the namespace.

    It does where it is enforced there and no unexpired exception for it matches the namespace
    (an exception may narrow by name or label, which a reference does not tell: any counts).
    """
    namespace, labels = context.namespace, context.request.namespace_labels
    if context.settings.action(SOURCE_GUARD, namespace=namespace, namespace_labels=labels) is not model.Action.ENFORCE:
        return False
    now = context.request.now
    for exception in context.settings.exceptions:
        if SOURCE_GUARD not in exception.policies:
            continue
        if exception.expires is not None and (now is None or exception.expired(now)):
            continue
        if exception.namespaces is None or exception.namespaces.matches(namespace, _namespace_labels(namespace, labels)):
            return False
    return True


def _namespace_labels(namespace: str, labels: Mapping[str, str] | None) -> Mapping[str, str]:
    known = dict(labels or {})
    known.setdefault("kubernetes.io/metadata.name", namespace)
    return known


def _lookup(context: policy.Context, kind: envsources.SourceKind, name: str) -> Mapping[str, str] | None:
    lookup = context.request.env_lookup
    if lookup is None:
        return None
    return lookup(model.EnvSource(kind=kind, namespace=context.namespace, name=name))
