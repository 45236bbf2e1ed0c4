"""Engine settings: action per policy, exempt namespaces and the GPU-mode parameters.

`Settings()` is the built-in default. `from_mapping` parses the already-loaded YAML document
(loading files is the caller's job; this package does no I/O). The schema, every key optional:

```yaml
policies:                          # per-policy action: enforce | warn | audit | off
  GPU001: {action: enforce}
  GPU104: {action: off}            # YAML 1.1 reads a bare `off` as false; that means off too
exemptNamespaces: [kube-system, kube-node-lease, gpu-admission]
defaultSharedMode: cgpu            # cgpu | share | mps: what GPU101 pins aliyun.com/gpu-mem pods to
gpuSchedulerName: ""               # GPU105 sets this schedulerName when non-empty
keepNonGpuPodsOffGpuNodes: false   # GPU103 for every pod without GPUs, not only privileged ones
errorActions:                      # the most a crashing policy of each kind may do
  validate: enforce                # fail closed: an unchecked pod is not admitted
  mutate: warn                     # a crashing mutator must not block pods; it is reported
```

Actions: `enforce` denies (for a mutator: applies its patch), `warn` adds a warning (a mutator
only says what it would add), `audit` only records the result, `off` skips the policy. A crashing
policy gets the milder of its own action and `errorActions[kind]`, so an audited policy never
denies, not even when it crashes.
"""

# CONTRACT (owned by the policies helper; keep these names and signatures):
#   Settings                       frozen dataclass, Settings() is the built-in default
#   from_mapping(data) -> Settings parses the already-loaded YAML document
#   InvalidSettings(ValueError)    raised with a one-line message naming the field

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import Any

from policies import builtin, gpu, model

DEFAULT_EXEMPT_NAMESPACES: frozenset[str] = frozenset({"kube-system", "kube-node-lease", "gpu-admission"})


class InvalidSettings(ValueError):
    """A settings document that cannot be used; the message is one line naming the field."""


def _default_actions() -> Mapping[str, model.Action]:
    return types.MappingProxyType({p.id: p.default_action for p in builtin.POLICIES})


def _default_error_actions() -> Mapping[model.PolicyKind, model.Action]:
    return types.MappingProxyType(
        {model.PolicyKind.VALIDATE: model.Action.ENFORCE, model.PolicyKind.MUTATE: model.Action.WARN}
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything the engine can be told; the defaults are the documented built-in behaviour."""

    actions: Mapping[str, model.Action] = dataclasses.field(default_factory=_default_actions)
    exempt_namespaces: frozenset[str] = DEFAULT_EXEMPT_NAMESPACES
    default_shared_mode: gpu.Mode = gpu.Mode.CGPU
    gpu_scheduler_name: str = ""
    keep_non_gpu_pods_off_gpu_nodes: bool = False
    error_actions: Mapping[model.PolicyKind, model.Action] = dataclasses.field(
        default_factory=_default_error_actions
    )

    def action(self, policy_id: str) -> model.Action:
        """The configured action of a policy (its default where the settings do not name it)."""
        found = self.actions.get(policy_id)
        if found is not None:
            return found
        for policy in builtin.POLICIES:
            if policy.id == policy_id:
                return policy.default_action
        return model.Action.OFF

    def error_action(self, kind: model.PolicyKind) -> model.Action:
        """The most a crashing policy of this kind may do."""
        return self.error_actions.get(kind, model.Action.ENFORCE)


_KEYS = (
    "policies",
    "exemptNamespaces",
    "defaultSharedMode",
    "gpuSchedulerName",
    "keepNonGpuPodsOffGpuNodes",
    "errorActions",
)
_ACTION_NAMES = ", ".join(model.Action)


def _action(value: object, *, field: str) -> model.Action:
    if value is False:  # YAML 1.1: a bare `off` loads as false
        return model.Action.OFF
    if isinstance(value, str):
        try:
            return model.Action(value.strip().lower())
        except ValueError:
            pass
    raise InvalidSettings(f"{field}: must be one of {_ACTION_NAMES}, got {value!r}")


def _policies(value: object) -> Mapping[str, model.Action]:
    actions = dict(_default_actions())
    if value is None:
        return types.MappingProxyType(actions)
    if not isinstance(value, Mapping):
        raise InvalidSettings(f"policies: must be a mapping of policy ID to {{action: ...}}, got {value!r}")
    known = ", ".join(sorted(actions))
    for policy_id, entry in value.items():
        if policy_id not in actions:
            raise InvalidSettings(f"policies.{policy_id}: unknown policy; known: {known}")
        if not isinstance(entry, Mapping):
            raise InvalidSettings(f"policies.{policy_id}: must be a mapping like {{action: enforce}}, got {entry!r}")
        for key in entry:
            if key != "action":
                raise InvalidSettings(f"policies.{policy_id}.{key}: unknown key; known: action")
        if "action" in entry:
            actions[policy_id] = _action(entry["action"], field=f"policies.{policy_id}.action")
    return types.MappingProxyType(actions)


def _error_actions(value: object) -> Mapping[model.PolicyKind, model.Action]:
    actions = dict(_default_error_actions())
    if value is None:
        return types.MappingProxyType(actions)
    if not isinstance(value, Mapping):
        raise InvalidSettings(f"errorActions: must be a mapping with validate and mutate, got {value!r}")
    for key, entry in value.items():
        try:
            kind = model.PolicyKind(key)
        except ValueError:
            raise InvalidSettings(f"errorActions.{key}: unknown key; known: validate, mutate") from None
        actions[kind] = _action(entry, field=f"errorActions.{key}")
    return types.MappingProxyType(actions)


def _namespaces(value: object) -> frozenset[str]:
    if value is None:
        return DEFAULT_EXEMPT_NAMESPACES
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise InvalidSettings(f"exemptNamespaces: must be a list of namespace names, got {value!r}")
    return frozenset(value)


def _shared_mode(value: object) -> gpu.Mode:
    if value is None:
        return gpu.Mode.CGPU
    choices = ", ".join(gpu.DEFAULT_SHARED_MODE_CHOICES)
    if isinstance(value, str) and value in gpu.DEFAULT_SHARED_MODE_CHOICES:
        return gpu.Mode(value)
    raise InvalidSettings(f"defaultSharedMode: must be one of {choices}, got {value!r}")


def _scheduler_name(value: object) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidSettings(f"gpuSchedulerName: must be a string, got {value!r}")
    return value.strip()


def _flag(value: object, *, field: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidSettings(f"{field}: must be true or false, got {value!r}")
    return value


def from_mapping(data: Mapping[str, Any]) -> Settings:
    """Settings from a loaded YAML document; raises InvalidSettings naming the first bad field.

    An empty document (None, as a YAML loader returns for an empty file) gives the defaults.
    """
    if data is None:
        return Settings()
    if not isinstance(data, Mapping):
        raise InvalidSettings(f"settings: must be a mapping, got {type(data).__name__}")
    for key in data:
        if key not in _KEYS:
            raise InvalidSettings(f"{key}: unknown key; known: {', '.join(_KEYS)}")
    return Settings(
        actions=_policies(data.get("policies")),
        exempt_namespaces=_namespaces(data.get("exemptNamespaces")),
        default_shared_mode=_shared_mode(data.get("defaultSharedMode")),
        gpu_scheduler_name=_scheduler_name(data.get("gpuSchedulerName")),
        keep_non_gpu_pods_off_gpu_nodes=_flag(
            data.get("keepNonGpuPodsOffGpuNodes"), field="keepNonGpuPodsOffGpuNodes"
        ),
        error_actions=_error_actions(data.get("errorActions")),
    )
