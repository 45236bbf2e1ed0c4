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

from policies import envsources, podspec, policy


class EnvSourceKeys(policy.Validator):
    """Refuses ConfigMaps and Secrets whose keys include a guarded GPU environment name."""

    id = "GPU007"
    summary = "ConfigMaps and Secrets must not carry a key named like a GPU environment variable"
    kinds = envsources.SOURCE_KINDS

    def validate(self, context: policy.Context) -> Iterable[policy.Finding]:
        """One finding naming the guarded keys (never their values), or none."""
        obj = context.object or context.request.object
        keys = envsources.guarded_keys(obj)
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


def _name(obj: Mapping[str, Any]) -> str:
    metadata = podspec.mapping(obj.get("metadata"))
    for field in ("name", "generateName"):
        value = metadata.get(field)
        if isinstance(value, str) and value:
            return value
    return ""
