"""The audit's data: what a result is about (ObjectRef) and one result of one policy or check (Finding).

A `Finding` is the audit's unit, one per (policy or check, object) that was judged, passes
included. It carries the action its policy or check acts with, so the exit status (1 when an
enforce-level failure exists) and the PolicyReport's `properties.action` come from the same place.
The namespace of `subject` decides which report a finding lands in: "" (a node) means the
ClusterPolicyReport.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from policies import model, podspec

SOURCE = "gpu-admission"


class Severity(enum.StrEnum):
    """How much is at stake when the result fails (the PolicyReport `severity` enum, as we use it)."""

    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


# Most severe first; renderings and reports order findings by this.
SEVERITY_ORDER: Mapping[Severity, int] = {Severity.HIGH: 0, Severity.MEDIUM: 1, Severity.LOW: 2}
RESULT_ORDER: Mapping[model.Result, int] = {
    model.Result.FAIL: 0,
    model.Result.ERROR: 1,
    model.Result.WARN: 2,
    model.Result.SKIP: 3,
    model.Result.PASS: 4,
}


@dataclasses.dataclass(frozen=True, kw_only=True, order=True)
class ObjectRef:
    """A Kubernetes object as a PolicyReport names it (a corev1.ObjectReference subset)."""

    namespace: str  # "" for cluster-scoped objects
    kind: str
    name: str
    api_version: str = ""
    uid: str = ""

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> ObjectRef:
        """The reference to a decoded object (tolerant of missing fields)."""
        metadata = obj.get("metadata")
        if type(metadata) is not dict:
            metadata = podspec.mapping(metadata)
        get = metadata.get
        namespace, kind, name, api_version, uid = (
            get("namespace"),
            obj.get("kind"),
            get("name"),
            obj.get("apiVersion"),
            get("uid"),
        )
        if not isinstance(name, str) or not name:
            name = get("generateName")
        if cls is not ObjectRef:
            return cls(
                namespace=_text(namespace), kind=_text(kind), name=_text(name), api_version=_text(api_version), uid=_text(uid)
            )
        # The dataclass' keyword __init__ costs more than the object; the audit makes one reference
        # per judged object and several per miss of the verdict memo. Set field by field, in field
        # order, as __init__ does: the same instance, with the same compact attribute dict (see
        # `finding`); the text checks inline (`_text`).
        ref: ObjectRef = object.__new__(ObjectRef)
        _set(ref, "namespace", namespace if isinstance(namespace, str) else "")
        _set(ref, "kind", kind if isinstance(kind, str) else "")
        _set(ref, "name", name if isinstance(name, str) else "")
        _set(ref, "api_version", api_version if isinstance(api_version, str) else "")
        _set(ref, "uid", uid if isinstance(uid, str) else "")
        return ref

    def wire(self) -> dict[str, str]:
        """The ObjectReference as JSON (empty fields left out)."""
        fields = {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
        }
        return {key: value for key, value in fields.items() if value}

    @property
    def display(self) -> str:
        """`Kind/name`, the way kubectl names an object."""
        return f"{self.kind}/{self.name}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Finding:
    """One result of one policy or check on one object."""

    policy: str  # GPU001 ... GPU005 (engine), GPU201 ... (audit checks)
    rule: str  # the policy's rule name, e.g. visible-devices
    result: model.Result
    action: model.Action  # what the policy does when it fails (for uncertain results: at most warn)
    severity: Severity
    category: str
    message: str
    subject: ObjectRef  # the object judged; its namespace picks the report
    related: tuple[ObjectRef, ...] = ()  # other objects involved (the pods sharing an over-committed card)

    @property
    def namespace(self) -> str:
        """The namespace whose PolicyReport holds the finding; "" for the ClusterPolicyReport."""
        return self.subject.namespace

    @property
    def enforced(self) -> bool:
        """Whether this is a failure at enforce level (what makes `audit` exit 1)."""
        return is_enforced(self.result, self.action)

    @property
    def resources(self) -> tuple[ObjectRef, ...]:
        """Every object the result names: the subject first."""
        return (self.subject, *self.related)

    def identity(self) -> tuple[str, str, str, str]:
        """What makes a result on a controlled object the same as its controller's."""
        return (self.policy, self.rule, str(self.result), self.message)


def finding(
    policy: str,
    rule: str,
    result: model.Result,
    action: model.Action,
    severity: Severity,
    category: str,
    message: str,
    subject: ObjectRef,
    related: tuple[ObjectRef, ...] = (),
) -> Finding:
    """``Finding(...)`` with every field given, without the dataclass' keyword ``__init__`` (the
    audit makes about ten per judged pod): the same instance in every respect.

    The fields are set one by one in declaration order through ``object.__setattr__``, as a frozen
    dataclass' ``__init__`` sets them. Filling ``__dict__`` at once instead would give each instance
    a dict of its own: 336 bytes a Finding instead of 160 with the class' shared keys, and a run at
    100,000 pods holds a million of them."""
    made: Finding = object.__new__(Finding)
    _set(made, "policy", policy)
    _set(made, "rule", rule)
    _set(made, "result", result)
    _set(made, "action", action)
    _set(made, "severity", severity)
    _set(made, "category", category)
    _set(made, "message", message)
    _set(made, "subject", subject)
    _set(made, "related", related)
    return made


def retargeted(found: Finding, subject: ObjectRef) -> Finding:
    """``dataclasses.replace(found, subject=subject)``, the fast way (see `finding`)."""
    return finding(
        found.policy,
        found.rule,
        found.result,
        found.action,
        found.severity,
        found.category,
        found.message,
        subject,
        found.related,
    )


_set = object.__setattr__


def is_enforced(result: model.Result, action: model.Action) -> bool:
    """`Finding.enforced` of a result with this result and action."""
    return action is model.Action.ENFORCE and result in (model.Result.FAIL, model.Result.ERROR)


def sort_key(finding: Finding) -> tuple[Any, ...]:
    """A total, stable order: by object, then failures before the rest, then policy ID."""
    return (
        finding.subject.namespace,
        finding.subject.kind,
        finding.subject.name,
        RESULT_ORDER[finding.result],
        finding.policy,
        finding.rule,
        finding.message,
    )


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
