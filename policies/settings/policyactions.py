"""`policies`, `namespaceOverrides`, `exceptions` and `errorActions`: what each policy does, where, and on what not.

Policies are known here only by ID: the caller hands in the IDs it knows (the built-ins and the
user policies), so this section needs no policy at import time.
"""

from __future__ import annotations

import dataclasses
import datetime
import types
from collections.abc import Mapping, Sequence
from typing import Any

from policies import model
from policies.settings import selection, shapes


def default_error_actions() -> Mapping[model.PolicyKind, model.Action]:
    return types.MappingProxyType({model.PolicyKind.VALIDATE: model.Action.ENFORCE, model.PolicyKind.MUTATE: model.Action.WARN})


@dataclasses.dataclass(frozen=True, kw_only=True)
class NamespaceOverride:
    """Actions for some policies in the namespaces an override matches."""

    name: str
    match: selection.NamespaceMatch
    actions: Mapping[str, model.Action]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolicyException:
    """Objects some policies do not apply to, until `expires` (when set)."""

    name: str
    policies: frozenset[str]
    namespaces: selection.NamespaceMatch | None = None
    names: tuple[str, ...] = ()  # shell patterns; any of them
    object_selector: selection.LabelSelector | None = None
    expires: datetime.datetime | None = None  # aware, UTC
    reason: str = ""

    def expired(self, now: datetime.datetime) -> bool:
        """Whether the exception has stopped applying at `now`."""
        return self.expires is not None and shapes.aware(now) >= self.expires

    def matches(self, *, namespace: str, namespace_labels: Mapping[str, str], obj: Mapping[str, Any]) -> bool:
        """Whether the object falls under the exception (expiry is not considered here)."""
        if self.namespaces is not None and not self.namespaces.matches(namespace, namespace_labels):
            return False
        metadata = shapes.mapping(obj.get("metadata"))
        if self.names:
            name = metadata.get("name") or ""
            if not name:
                generate = metadata.get("generateName")
                name = f"{generate}*" if isinstance(generate, str) and generate else ""
            if not isinstance(name, str) or not any(shapes.glob(name, p) for p in self.names):
                return False
        if self.object_selector is not None:
            candidates = [shapes.labels(metadata.get("labels"))]
            template = shapes.mapping(shapes.mapping(shapes.mapping(obj.get("spec")).get("template")).get("metadata"))
            jobs = shapes.mapping(
                shapes.mapping(shapes.mapping(shapes.mapping(obj.get("spec")).get("jobTemplate")).get("spec")).get("template")
            )
            for found in (template, shapes.mapping(jobs.get("metadata"))):
                if "labels" in found:
                    candidates.append(shapes.labels(found.get("labels")))
            if not any(self.object_selector.matches(c) for c in candidates):
                return False
        return True


_ACTION_NAMES = ", ".join(model.Action)


def action(value: object, *, field: str) -> model.Action:
    if value is False:  # YAML 1.1: a bare `off` loads as false
        return model.Action.OFF
    if isinstance(value, str):
        try:
            return model.Action(value.strip().lower())
        except ValueError:
            pass
    raise shapes.InvalidSettings(f"{field}: must be one of {_ACTION_NAMES}, got {value!r}")


def policy_actions(value: object, *, field: str, known: Sequence[str]) -> dict[str, model.Action]:
    if not isinstance(value, Mapping):
        raise shapes.InvalidSettings(f"{field}: must be a mapping of policy ID to {{action: ...}}, got {value!r}")
    actions: dict[str, model.Action] = {}
    for policy_id, entry in value.items():
        if policy_id not in known:
            raise shapes.InvalidSettings(f"{field}.{policy_id}: unknown policy; known: {', '.join(known)}")
        if not isinstance(entry, Mapping):
            raise shapes.InvalidSettings(f"{field}.{policy_id}: must be a mapping like {{action: enforce}}, got {entry!r}")
        for key in entry:
            if key != "action":
                raise shapes.InvalidSettings(f"{field}.{policy_id}.{key}: unknown key; known: action")
        if "action" in entry:
            actions[policy_id] = action(entry["action"], field=f"{field}.{policy_id}.action")
    return actions


def policies(value: object, *, defaults: Mapping[str, model.Action]) -> Mapping[str, model.Action]:
    actions = dict(defaults)
    if value is not None:
        actions.update(policy_actions(value, field="policies", known=sorted(defaults)))
    return types.MappingProxyType(actions)


def error_actions(value: object) -> Mapping[model.PolicyKind, model.Action]:
    actions = dict(default_error_actions())
    if value is None:
        return types.MappingProxyType(actions)
    if not isinstance(value, Mapping):
        raise shapes.InvalidSettings(f"errorActions: must be a mapping with validate and mutate, got {value!r}")
    for key, entry in value.items():
        try:
            kind = model.PolicyKind(key)
        except ValueError:
            raise shapes.InvalidSettings(f"errorActions.{key}: unknown key; known: validate, mutate") from None
        actions[kind] = action(entry, field=f"errorActions.{key}")
    return types.MappingProxyType(actions)


def override_list(value: object, *, known: Sequence[str]) -> tuple[NamespaceOverride, ...]:
    if value is None:
        return ()
    overrides = []
    for field, entry in shapes.entries(
        value, field="namespaceOverrides", known=("name", "namespaces", "namespaceSelector", "policies")
    ):
        name = entry.get("name", field)
        if not isinstance(name, str) or not name:
            raise shapes.InvalidSettings(f"{field}.name: must be a non-empty string, got {name!r}")
        match = selection.namespace_match(entry, field=field)
        if match is None:
            raise shapes.InvalidSettings(f"{field}: needs namespaces and/or namespaceSelector")
        if "policies" not in entry:
            raise shapes.InvalidSettings(f"{field}.policies: is required")
        actions = policy_actions(entry["policies"], field=f"{field}.policies", known=known)
        overrides.append(NamespaceOverride(name=name, match=match, actions=types.MappingProxyType(actions)))
    return tuple(overrides)


def exception_list(value: object, *, known: Sequence[str]) -> tuple[PolicyException, ...]:
    if value is None:
        return ()
    exceptions: list[PolicyException] = []
    for field, entry in shapes.entries(value, field="exceptions", known=("name", "policies", "match", "expires", "reason")):
        name = entry.get("name")
        if not isinstance(name, str) or not name.strip():
            raise shapes.InvalidSettings(f"{field}.name: is required (a non-empty string), got {name!r}")
        if any(e.name == name for e in exceptions):
            raise shapes.InvalidSettings(f"{field}.name: {name!r} is used by an earlier exception")
        ids = shapes.strings(entry.get("policies"), field=f"{field}.policies")
        for position, policy_id in enumerate(ids):
            if policy_id not in known:
                raise shapes.InvalidSettings(
                    f"{field}.policies[{position}]: unknown policy {policy_id!r}; known: {', '.join(known)}"
                )
        match = entry.get("match")
        if not isinstance(match, Mapping) or not match:
            raise shapes.InvalidSettings(
                f"{field}.match: is required: namespaces, namespaceSelector, names and/or objectSelector"
            )
        shapes.keys(match, field=f"{field}.match", known=("namespaces", "namespaceSelector", "names", "objectSelector"))
        names = () if match.get("names") is None else shapes.strings(match["names"], field=f"{field}.match.names")
        selector = match.get("objectSelector")
        namespaces = selection.namespace_match(match, field=f"{field}.match")
        selection.anchored(namespaces, field=f"{field}.match", name=name.strip())
        reason = entry.get("reason", "")
        if not isinstance(reason, str):
            raise shapes.InvalidSettings(f"{field}.reason: must be a string, got {reason!r}")
        expires = entry.get("expires")
        exceptions.append(
            PolicyException(
                name=name.strip(),
                policies=frozenset(ids),
                namespaces=namespaces,
                names=names,
                object_selector=None
                if selector is None
                else selection.label_selector(selector, field=f"{field}.match.objectSelector"),
                expires=None if expires is None else shapes.timestamp(expires, field=f"{field}.expires"),
                reason=reason,
            )
        )
    return tuple(exceptions)
