"""The one way an object becomes a decision: shared by the webhook, dry-run and (later) audit.

Everything that reaches the engine goes through ``decide`` so that the same object, namespace and
settings give the same verdict and the same patch wherever it is evaluated.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Callable, Mapping
from typing import Any

from policies import engine, model, settings

DEFAULT_NAMESPACE = "default"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Question:
    """Everything a decision depends on but the settings: what ``decide`` takes, as one value
    (the webhook builds one per review; ``decisioncache.Cache`` keys and answers it).

    ``namespace``: the request's, else the object's ``metadata.namespace``, else ``default``
    (what kubectl would use). ``namespace_labels`` feed namespace overrides and exceptions by
    label selector (unknown: only ``kubernetes.io/metadata.name`` is assumed). ``env_lookup``
    gives GPU001 the ConfigMap/Secret data (already fetched: the engine does no I/O); without it,
    offline judgement. ``node_labels``: the labels of the pod's Node for GPU009 (unknown: it fails
    closed). ``now`` (default: the clock) decides exception expiry. ``stored``: judge a Pod as it
    is, with every mutator off (``as_stored``).
    """

    object: Mapping[str, Any] | None
    namespace: str = ""
    operation: str = "CREATE"
    old_object: Mapping[str, Any] | None = None
    user: str = ""
    groups: tuple[str, ...] = ()
    subresource: str = ""
    dry_run: bool = False
    namespace_labels: Mapping[str, str] | None = None
    env_lookup: model.EnvLookup | None = None
    node_labels: Mapping[str, str] | None = None
    claims: Mapping[tuple[str, str], Mapping[str, Any] | None] | None = None  # GPU011: the DRA claims the pod names
    now: datetime.datetime | None = None
    stored: bool = False

    @property
    def judged_namespace(self) -> str:
        """The namespace the engine judges in (see the class docstring)."""
        if self.namespace:
            return self.namespace
        return (object_namespace(self.object) if self.object is not None else "") or DEFAULT_NAMESPACE


def decide(obj: Mapping[str, Any] | None, *, settings: settings.Settings, **question: Any) -> model.Decision:
    """Evaluate ``obj`` with the engine and return its decision; ``question``: the other fields of
    ``Question`` (each optional, as there)."""
    return answer(Question(object=obj, **question), settings=settings)


def answer(question: Question, *, settings: settings.Settings) -> model.Decision:
    """The engine's decision on ``question`` under ``settings``.

    A request without an object (DELETE, CONNECT) has nothing for the policies to look at and is
    allowed with that reason.
    """
    if question.object is None:
        return model.Decision(allowed=True, exempt_reason=f"{question.operation} request carries no object to evaluate")
    if question.stored:
        settings = settings.without_mutators
    return engine.evaluate(
        model.Request(
            operation=question.operation,
            object=question.object,
            old_object=question.old_object,
            namespace=question.judged_namespace,
            user=question.user,
            groups=question.groups,
            subresource=question.subresource,
            dry_run=question.dry_run,
            namespace_labels=question.namespace_labels,
            env_lookup=question.env_lookup,
            node_labels=question.node_labels,
            claims=question.claims,
            now=question.now if question.now is not None else datetime.datetime.now(datetime.UTC),
            clock=time.monotonic,
        ),
        settings=settings,
    )


def judge(
    question: Question,
    *,
    settings: settings.Settings,
    validating: bool = False,
    ask: Callable[[Question, settings.Settings], model.Decision] | None = None,
) -> model.Decision:
    """``answer``, and for the validating webhook (``validating``) the answer on the Pod as
    stored where ``needs_stored`` says the first one credited the engine's own additions.
    ``ask`` answers each question in ``answer``'s place (the decision cache's memory)."""
    ask = ask or (lambda q, s: answer(q, settings=s))
    decision = ask(question, settings)
    if validating and needs_stored(question, decision):
        decision = ask(dataclasses.replace(question, stored=True), settings)
    return decision


def needs_stored(question: Question, decision: model.Decision) -> bool:
    """Whether the validating webhook must judge this Pod again as stored (``Question.stored``):
    the engine's own additions are not credited.

    /validate sees the pod after every mutating webhook, ours included, so an admitted pod already
    holds what our mutators add, and evaluating it again patches nothing. A patch here means the
    stored pod lacks some of it: a later mutating webhook took it away (GPU103's keep-off
    affinity, say) or ours did not run. The pod is then judged as it is, with every mutator off,
    so a pod with node power and no keep-off affinity is refused (GPU002, GPU003) instead of
    being admitted on the strength of an affinity that only exists in this process's memory.
    A workload's template is still credited: its pods get the additions when they are created.
    The second question goes through the decision cache too (``stored`` is in its key).
    """
    obj = question.object
    return decision.allowed and bool(decision.patch) and obj is not None and obj.get("kind") == "Pod"


def object_namespace(obj: Mapping[str, Any]) -> str:
    """The object's ``metadata.namespace``, or "" when it has none (or a malformed one)."""
    metadata = obj.get("metadata")
    if isinstance(metadata, Mapping):
        namespace = metadata.get("namespace")
        if isinstance(namespace, str):
            return namespace
    return ""
