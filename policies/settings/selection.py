"""Which namespaces a settings entry selects: label selectors, namespace matches, anchoring.

`namespaceOverrides`, `exceptions`, `trustZone.namespaces`, `dra.claims` and `usageLimits` name
namespaces the same way (names and/or a `namespaceSelector`); an entry that widens what pods may do
must be anchored to namespaces tenants cannot label (`anchored`).
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Iterable, Mapping
from typing import Any

from policies.settings import shapes

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set by the apiserver on every namespace


@dataclasses.dataclass(frozen=True, kw_only=True)
class Requirement:
    """One `matchExpressions` entry of a label selector."""

    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether `labels` satisfy the requirement (Kubernetes semantics: NotIn holds when absent)."""
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        if self.operator == "In":
            return self.key in labels and labels[self.key] in self.values
        return self.key not in labels or labels[self.key] not in self.values


@dataclasses.dataclass(frozen=True, kw_only=True)
class LabelSelector:
    """A metav1.LabelSelector: every matchLabels pair and every requirement must hold."""

    match_labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    match_expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether `labels` are selected; an empty selector selects everything."""
        return all(labels.get(k) == v for k, v in self.match_labels.items()) and all(
            r.matches(labels) for r in self.match_expressions
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class NamespaceMatch:
    """Namespaces by name (any of) and/or by labels; both given means both must hold."""

    names: frozenset[str] = frozenset()
    selector: LabelSelector | None = None

    def matches(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """Whether the namespace is matched."""
        if self.names and namespace not in self.names:
            return False
        return self.selector is None or self.selector.matches(labels)


def labels_of_namespace(namespace: str, labels: Mapping[str, str] | None) -> Mapping[str, str]:
    """The namespace's labels, with the name label the apiserver always sets."""
    if labels is not None and labels.get(NAMESPACE_NAME_LABEL) == namespace:
        return labels
    return {**(labels or {}), NAMESPACE_NAME_LABEL: namespace}


def labels_by_namespace(objects: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """The labels of every Namespace object among `objects`, by name (others are ignored)."""
    found: dict[str, dict[str, str]] = {}
    for obj in objects:
        metadata = obj.get("metadata")
        if obj.get("kind") != "Namespace" or not isinstance(metadata, Mapping) or not isinstance(metadata.get("name"), str):
            continue
        labels = metadata.get("labels")
        found[metadata["name"]] = {str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else {}
    return found


_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


def label_selector(value: object, *, field: str) -> LabelSelector:
    """A metav1.LabelSelector from its YAML form; raises shapes.InvalidSettings naming the field."""
    if not isinstance(value, Mapping):
        raise shapes.InvalidSettings(f"{field}: must be a mapping with matchLabels and/or matchExpressions, got {value!r}")
    shapes.keys(value, field=field, known=("matchLabels", "matchExpressions"))
    labels = value.get("matchLabels") or {}
    if not isinstance(labels, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise shapes.InvalidSettings(f"{field}.matchLabels: must map label keys to string values, got {labels!r}")
    requirements = []
    for where, entry in shapes.entries(
        value.get("matchExpressions") or [],
        field=f"{field}.matchExpressions",
        known=("key", "operator", "values"),
        shape="a mapping with key, operator and values",
    ):
        key, operator, values = entry.get("key"), entry.get("operator"), entry.get("values") or []
        if not isinstance(key, str) or not key:
            raise shapes.InvalidSettings(f"{where}.key: must be a label key, got {key!r}")
        if operator not in _OPERATORS:
            raise shapes.InvalidSettings(f"{where}.operator: must be one of {', '.join(_OPERATORS)}, got {operator!r}")
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise shapes.InvalidSettings(f"{where}.values: must be a list of strings, got {values!r}")
        if operator in ("In", "NotIn") and not values:
            raise shapes.InvalidSettings(f"{where}.values: must not be empty for {operator}")
        if operator in ("Exists", "DoesNotExist") and values:
            raise shapes.InvalidSettings(f"{where}.values: must be empty for {operator}")
        requirements.append(Requirement(key=key, operator=operator, values=frozenset(values)))
    return LabelSelector(match_labels=types.MappingProxyType(dict(labels)), match_expressions=tuple(requirements))


def namespace_match(value: Mapping[str, Any], *, field: str) -> NamespaceMatch | None:
    names = value.get("namespaces")
    selector = value.get("namespaceSelector")
    if names is None and selector is None:
        return None
    return NamespaceMatch(
        names=frozenset() if names is None else shapes.namespace_names(names, field=f"{field}.namespaces"),
        selector=None if selector is None else label_selector(selector, field=f"{field}.namespaceSelector"),
    )


def anchored(namespaces: NamespaceMatch | None, *, field: str, name: str, what: str = "exception") -> None:
    """Refuse an exception a pod's author could match: one not tied to namespaces tenants cannot label.

    `names` and `objectSelector` are written by whoever writes the pod, so on their own they let a
    tenant label a pod into the exception. Namespace names, or a namespaceSelector with at least one
    positive requirement (a matchLabels pair, In or Exists), anchor it; NotIn and DoesNotExist alone
    select every namespace that lacks a label, new tenant namespaces included, and Exists on
    `kubernetes.io/metadata.name` (which every namespace has) selects them all.
    """
    selector = None if namespaces is None else namespaces.selector
    positive = selector is not None and (
        bool(selector.match_labels)
        or any(
            r.operator == "In" or (r.operator == "Exists" and r.key != NAMESPACE_NAME_LABEL) for r in selector.match_expressions
        )
    )
    if namespaces is not None and (namespaces.names or positive):
        return
    where = "match." if what == "exception" else ""
    raise shapes.InvalidSettings(
        f"{field}: {what} {name!r} is not anchored to namespaces: give {where}namespaces, or a "
        f"{where}namespaceSelector with matchLabels, In or Exists (names and objectSelector are set by the "
        "pod's author, so they may only narrow an exception within its namespaces)"
    )


def anchored_entry(entry: Mapping[str, Any], *, field: str) -> tuple[str, NamespaceMatch]:
    """An entry's name and the namespaces it is anchored to (trustZone.namespaces, dra.claims)."""
    name = entry.get("name", field)
    if not isinstance(name, str) or not name:
        raise shapes.InvalidSettings(f"{field}.name: must be a non-empty string, got {name!r}")
    match = namespace_match(entry, field=field)
    anchored(match, field=field, name=name, what="entry")
    assert match is not None  # anchored refuses None
    return name, match
