"""The engine's data: the plain request it evaluates and the decision it returns."""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections.abc import Callable, Mapping
from typing import Any, Literal


class Action(enum.StrEnum):
    """What a failing policy does: deny, warn the user, only record, or nothing at all."""

    ENFORCE = "enforce"
    WARN = "warn"
    AUDIT = "audit"
    OFF = "off"


_SEVERITY: Mapping[Action, int] = {Action.OFF: 0, Action.AUDIT: 1, Action.WARN: 2, Action.ENFORCE: 3}


def milder(first: Action, second: Action) -> Action:
    """The less severe of two actions (off < audit < warn < enforce)."""
    return first if _SEVERITY[first] <= _SEVERITY[second] else second


class PolicyKind(enum.StrEnum):
    """Whether a policy judges the object or adds to it."""

    VALIDATE = "validate"
    MUTATE = "mutate"


class Result(enum.StrEnum):
    """The closed result vocabulary shared with PolicyReports."""

    PASS = "pass"
    FAIL = "fail"
    WARN = "warn"
    ERROR = "error"
    SKIP = "skip"


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvSource:
    """A ConfigMap or Secret that a container's `envFrom` or `valueFrom` reads."""

    kind: Literal["ConfigMap", "Secret"]
    namespace: str
    name: str


# Resolves an EnvSource to its data (Secret values already decoded), or None when it cannot be read.
# The engine stays pure: a caller with cluster access passes one (typically over data it fetched
# before calling evaluate); without one, what envFrom/valueFrom would produce is unknown.
EnvLookup = Callable[[EnvSource], Mapping[str, str] | None]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Request:
    """One admission request reduced to what policies need; built by the webhook, dry-run and audit."""

    operation: str  # CREATE, UPDATE, DELETE, CONNECT
    object: Mapping[str, Any]
    old_object: Mapping[str, Any] | None = None
    namespace: str = "default"
    user: str = ""
    groups: tuple[str, ...] = ()
    subresource: str = ""
    dry_run: bool = False
    env_lookup: EnvLookup | None = None  # see EnvLookup; None means offline
    # The namespace's labels, for namespace overrides and exceptions by selector; None where the
    # caller does not know them (only kubernetes.io/metadata.name is then assumed).
    namespace_labels: Mapping[str, str] | None = None
    # The labels of the Node the pod is bound to (`spec.nodeName`), for GPU009 on the
    # ephemeralcontainers subresource; None where the caller does not know them (offline, lookup
    # failed, or not looked up), and GPU009 then fails closed.
    node_labels: Mapping[str, str] | None = None
    # The DRA ResourceClaims and ResourceClaimTemplates the pod names (`lookups.claims_to_look_up`),
    # by (kind, name) in the request's namespace: the object, an empty mapping for one that does
    # not exist, None (or no key) for one that could not be read. None as a whole: not looked up
    # (offline), and GPU011 can only warn.
    claims: Mapping[tuple[str, str], Mapping[str, Any] | None] | None = None
    # The time the request is judged at, for exception expiry; the engine never reads a clock, so
    # without it an exception with an expiry date does not apply.
    now: datetime.datetime | None = None
    # Monotonic seconds, for the time budget of user policies (Settings.user_policy_budget_s); the
    # engine does not read a clock itself, so without one there is no time budget.
    clock: Callable[[], float] | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Violation:
    """A policy that failed (or crashed) on the object, with the action the settings give it."""

    policy: str
    action: Action
    message: str  # "GPU001: <the policy sentence>: <detail>"


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolicyResult:
    """The outcome of one policy on one object."""

    policy: str
    result: Result
    message: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Decision:
    """What the engine concluded: allowed or not, per-policy results, warnings and one JSONPatch."""

    allowed: bool
    results: tuple[PolicyResult, ...] = ()
    violations: tuple[Violation, ...] = ()
    warnings: tuple[str, ...] = ()
    # What applied mutations tell the user (GPU103: why the pod is kept off GPU nodes). The mutating
    # webhook answers with them: the validating webhook sees the pod after the mutation, when
    # nothing is left to add and so nothing to say.
    notices: tuple[str, ...] = ()
    patch: tuple[Mapping[str, Any], ...] = ()  # RFC 6902 operations against the request object
    exempt_reason: str = ""  # non-empty when the request was short-circuited (exempt namespace, ...)

    @property
    def denial_message(self) -> str:
        """The message for a denied request: every enforced violation, joined."""
        return "; ".join(v.message for v in self.violations if v.action is Action.ENFORCE)
