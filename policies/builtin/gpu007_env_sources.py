"""GPU007: no ConfigMap or Secret carries a key named like a guarded GPU environment variable.

A container's `envFrom` without a prefix turns every key of a ConfigMap or Secret into a variable
of the same name, and the kubelet reads the source when the container starts, not when the pod is
admitted. A source that does not exist yet (the kubelet waits for it), or one edited after the pod
was admitted, would otherwise deliver `NVIDIA_VISIBLE_DEVICES=all` or `CGPU_DISABLE=true` past
GPU001. This policy judges the sources themselves, on every CREATE and UPDATE: a key equal to a
name of `gpu.GUARDED_ENV` is refused in `data`, `binaryData` and, for a Secret, `stringData`,
whatever its value (`void` included: a value can change later, a key that is refused cannot
appear). Together with GPU001 (which refuses prefixes that compose a guarded name and every
`valueFrom` for one) no source can hand a guarded name to a container, at admission or later.

Only keys are read. A Secret's values are never logged, echoed, or put in a message, warning,
audit annotation or report. In the webhook the apiserver sends only ConfigMaps and Secrets whose
keys include a guarded name (`matchConditions` in `deploy/webhook-configurations.yaml`), so
ordinary writes cost nothing and ordinary Secret values never reach the webhook.

Sources a GPU component of the admins needs (say, a ConfigMap holding the isolation variables for
a device plugin) belong in an exempt namespace, or under an exception for GPU007 anchored to their
namespace.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from policies import gpu, podspec, policy

SOURCE_KINDS: frozenset[str] = frozenset({"ConfigMap", "Secret"})
# Where each kind keeps its keys (`stringData` is write-only: the apiserver folds it into `data`,
# but a manifest given to dry-run still has it).
_KEY_FIELDS: Mapping[str, tuple[str, ...]] = {
    "ConfigMap": ("data", "binaryData"),
    "Secret": ("data", "stringData"),
}


class EnvSourceKeys(policy.Validator):
    """Refuses ConfigMaps and Secrets whose keys include a guarded GPU environment name."""

    id = "GPU007"
    summary = "ConfigMaps and Secrets must not carry a key named like a GPU environment variable"
    kinds = SOURCE_KINDS

    def validate(self, context: policy.Context) -> Iterable[policy.Finding]:
        """One finding naming the guarded keys (never their values), or none."""
        obj = context.object or context.request.object
        keys = guarded_keys(obj)
        if not keys:
            return ()
        kind = str(obj.get("kind"))
        plural = len(keys) > 1
        return [
            policy.Finding(
                detail=f"{kind} {_name(obj)!r} has the key{'s' if plural else ''} {', '.join(keys)}; envFrom would "
                f"make {'them' if plural else 'it'} a container's variable{'s' if plural else ''}, over what the "
                f"scheduler allocated: rename or remove {'them' if plural else 'it'} (values are not read)"
            )
        ]


def keys(obj: Mapping[str, Any]) -> frozenset[str]:
    """Every key of a ConfigMap or Secret (never a value); empty for any other object."""
    fields = _KEY_FIELDS.get(str(obj.get("kind")), ())
    return frozenset(key for field in fields for key in podspec.mapping(obj.get(field)) if isinstance(key, str))


def guarded_keys(obj: Mapping[str, Any]) -> tuple[str, ...]:
    """The keys of a ConfigMap or Secret that are guarded names, sorted; () for any other object."""
    return tuple(sorted(keys(obj) & gpu.GUARDED_ENV))


def keys_only(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A ConfigMap or Secret with every value dropped (each key maps to ""), for holding many of them
    (the audit) without holding a single Secret value."""
    shown: dict[str, Any] = {field: obj[field] for field in ("apiVersion", "kind") if field in obj}
    # Only naming metadata: annotations can hold the whole object again (kubectl's
    # last-applied-configuration carries a Secret's values), managedFields its field names.
    metadata = podspec.mapping(obj.get("metadata"))
    shown["metadata"] = {f: metadata[f] for f in ("name", "generateName", "namespace", "uid") if f in metadata}
    for field in _KEY_FIELDS.get(str(obj.get("kind")), ()):
        values = obj.get(field)
        if isinstance(values, Mapping):
            shown[field] = dict.fromkeys((k for k in values if isinstance(k, str)), "")
    return shown


def _name(obj: Mapping[str, Any]) -> str:
    metadata = podspec.mapping(obj.get("metadata"))
    for field in ("name", "generateName"):
        value = metadata.get(field)
        if isinstance(value, str) and value:
            return value
    return ""
