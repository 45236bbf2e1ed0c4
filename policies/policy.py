"""The shapes of a built-in policy: what it sees (Context), what it returns, and the base classes.

A policy is a stateless object with four class attributes (`id`, `kind`, `summary`,
`default_action`) and one method. The base classes below do the walking so that each check is a
few lines:

- `ContainerValidator.check_container` sees one container at a time (init, regular, ephemeral).
- `PodValidator.check_pod` sees the whole pod spec.
- `ContainerMutator.mutate_container` / `PodMutator.mutate_pod` return `add` operations.

`summary` is one sentence without a final full stop; the engine prefixes every message with
`"<id>: <summary>: "`, so details say only what is specific to the object.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from policies import model, patching, podspec

if TYPE_CHECKING:
    # The policies read `base.Settings`, which imports no policy. Only for types: importing any
    # module of the settings package runs its __init__, which joins the built-in registry, which
    # imports this module.
    from policies.settings import base as settings


@dataclasses.dataclass(frozen=True, kw_only=True)
class Context:
    """What a policy sees: the request, the settings and the (possibly already mutated) pod."""

    request: model.Request
    settings: settings.Settings
    # The pod template; for a kind without one (a ConfigMap, a Secret) an empty template whose
    # metadata is the object's, and `containers` is empty: judge `object` there.
    template: podspec.Template
    # The containers in scope: all of them, or only the new ephemeral containers when the request
    # is the `ephemeralcontainers` subresource (nothing else of the pod can change there).
    containers: tuple[podspec.ContainerRef, ...]
    whole_pod: bool  # False for the ephemeralcontainers subresource: pod-level policies stand by
    # The whole object as validators see it (after the mutators' additions), for policies that
    # judge more than the pod template (the CEL user policies).
    object: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def namespace(self) -> str:
        """The namespace the pod runs in."""
        return self.request.namespace


@dataclasses.dataclass(frozen=True, kw_only=True)
class Finding:
    """One thing a policy objects to, in words that name the container, volume or value."""

    detail: str
    # False when the policy cannot tell offline (e.g. envFrom of a ConfigMap it cannot read): such
    # a finding is reported as a warning at most, never a denial.
    certain: bool = True


@dataclasses.dataclass(frozen=True, kw_only=True)
class Mutation:
    """What a mutator wants to add, described for people, and input it could not honour."""

    operations: tuple[patching.Operation, ...] = ()
    changes: tuple[str, ...] = ()  # "added nodeSelector ack.node.gpu.schedule=cgpu"
    problems: tuple[Finding, ...] = ()  # e.g. an annotation that is not a number
    # Said to the user as an admission warning when the additions are applied (GPU103: why the pod
    # is kept off GPU nodes), so nobody wonders why it never lands on one.
    notices: tuple[str, ...] = ()


class Policy(abc.ABC):
    """A built-in policy: a stable ID, a one-sentence summary and a default action."""

    id: ClassVar[str]
    kind: ClassVar[model.PolicyKind]
    summary: ClassVar[str]
    default_action: ClassVar[model.Action] = model.Action.ENFORCE
    # The object kinds the policy judges: Pods and the workloads holding a pod template, unless a
    # policy says otherwise (GPU007 judges ConfigMaps and Secrets); the engine runs a policy only
    # on its kinds, so a pod policy never sees a ConfigMap.
    kinds: ClassVar[frozenset[str]] = podspec.SUPPORTED_KINDS
    # Whether the policy also judges a plain pod UPDATE (the pod itself, not a subresource), with
    # the stored pod in `request.old_object`. Only GPU008 (the allocation annotations), GPU010
    # (the device-injection annotations) and GPU013 (the budget gate) do: every other policy
    # judges what a pod is created with, and must neither refuse nor patch a running pod's
    # unrelated update.
    pod_updates: ClassVar[bool] = False
    # Whether the policy can judge an object as stored (the audit). False for a policy that judges
    # what a request writes and the stored object legitimately carries afterwards (GPU008: a bound
    # pod has spec.nodeName and the extender's annotations); the audit leaves such a policy out.
    stored_objects: ClassVar[bool] = True

    def enabled(self, context: Context) -> bool:
        """Whether the settings switch the policy on at all; a disabled policy is skipped."""
        del context
        return True


class Validator(Policy):
    """A policy that judges the pod and returns findings (none means pass)."""

    kind = model.PolicyKind.VALIDATE

    @abc.abstractmethod
    def validate(self, context: Context) -> Iterable[Finding]:
        """Every finding on the pod in `context`."""


def judges(item: Policy, kind: object) -> bool:
    """Whether `item` judges objects of `kind` (a policy without `kinds` judges pod-bearing kinds)."""
    kinds = getattr(item, "kinds", podspec.SUPPORTED_KINDS)
    return isinstance(kind, str) and kind in kinds


def judges_pod_updates(item: Policy) -> bool:
    """Whether `item` judges a plain pod UPDATE (see `Policy.pod_updates`)."""
    return bool(getattr(item, "pod_updates", False))


class PodValidator(Validator):
    """A validator of pod-level fields; stands by where only ephemeral containers can change."""

    def validate(self, context: Context) -> Iterable[Finding]:
        """The pod-level findings, or none for the ephemeralcontainers subresource."""
        if not context.whole_pod:
            return ()
        return self.check_pod(context)

    @abc.abstractmethod
    def check_pod(self, context: Context) -> Iterable[Finding]:
        """Every finding on the pod spec."""


class ContainerValidator(Validator):
    """A validator that looks at each container in scope."""

    def validate(self, context: Context) -> Iterable[Finding]:
        """The findings of every container in scope, where the pod-level precondition holds."""
        if not self.applies(context):
            return ()
        return [finding for container in context.containers for finding in self.check_container(context, container)]

    def applies(self, context: Context) -> bool:
        """A pod-level precondition; by default every pod."""
        del context
        return True

    @abc.abstractmethod
    def check_container(self, context: Context, container: podspec.ContainerRef) -> Iterable[Finding]:
        """Every finding on one container."""


class Mutator(Policy):
    """A policy that adds what is missing; only ever `add` operations, never removals."""

    kind = model.PolicyKind.MUTATE

    @abc.abstractmethod
    def mutate(self, context: Context) -> Mutation:
        """What to add to the pod in `context` (paths from the request object's root)."""


class PodMutator(Mutator):
    """A mutator of pod-level fields; stands by for the ephemeralcontainers subresource."""

    def mutate(self, context: Context) -> Mutation:
        """The pod-level mutation, or nothing where the pod spec cannot change."""
        if not context.whole_pod:
            return Mutation()
        return self.mutate_pod(context)

    @abc.abstractmethod
    def mutate_pod(self, context: Context) -> Mutation:
        """What to add to the pod spec."""


class ContainerMutator(Mutator):
    """A mutator that looks at each container in scope."""

    def mutate(self, context: Context) -> Mutation:
        """The containers' mutations joined."""
        parts = [self.mutate_container(context, c) for c in context.containers]
        return join(parts)

    @abc.abstractmethod
    def mutate_container(self, context: Context, container: podspec.ContainerRef) -> Mutation:
        """What to add to one container."""


def join(parts: Sequence[Mutation]) -> Mutation:
    """Several mutations as one, in order."""
    return Mutation(
        operations=tuple(op for part in parts for op in part.operations),
        changes=tuple(change for part in parts for change in part.changes),
        problems=tuple(problem for part in parts for problem in part.problems),
        notices=tuple(notice for part in parts for notice in part.notices),
    )
