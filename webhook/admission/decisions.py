"""The one way an object becomes a decision: shared by the webhook, dry-run and (later) audit.

Everything that reaches the engine goes through ``decide`` so that the same object, namespace and
settings give the same verdict and the same patch wherever it is evaluated.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Mapping
from typing import Any

from policies import engine, model, settings

DEFAULT_NAMESPACE = "default"


def decide(
    obj: Mapping[str, Any] | None,
    *,
    settings: settings.Settings,
    namespace: str = "",
    operation: str = "CREATE",
    old_object: Mapping[str, Any] | None = None,
    user: str = "",
    groups: tuple[str, ...] = (),
    subresource: str = "",
    dry_run: bool = False,
    namespace_labels: Mapping[str, str] | None = None,
    env_lookup: model.EnvLookup | None = None,
    now: datetime.datetime | None = None,
    node_labels: Mapping[str, str] | None = None,
) -> model.Decision:
    """Evaluate ``obj`` with the engine and return its decision.

    The namespace is ``namespace`` when given (the webhook passes the request's), else the object's
    ``metadata.namespace``, else ``default`` (what kubectl would use). A request without an object
    (DELETE, CONNECT) has nothing for the policies to look at and is allowed with that reason.
    ``namespace_labels`` feed namespace overrides and exceptions by label selector (unknown: only
    ``kubernetes.io/metadata.name`` is assumed); ``now`` (default: the clock) decides exception expiry. ``env_lookup`` gives GPU001 the
    ConfigMap/Secret data (already fetched: the engine does no I/O); without it, offline judgement.
    ``node_labels`` are the labels of the pod's Node for GPU009 (unknown: it fails closed).
    """
    if obj is None:
        return model.Decision(allowed=True, exempt_reason=f"{operation} request carries no object to evaluate")
    return engine.evaluate(
        model.Request(
            operation=operation,
            object=obj,
            old_object=old_object,
            namespace=namespace or object_namespace(obj) or DEFAULT_NAMESPACE,
            user=user,
            groups=groups,
            subresource=subresource,
            dry_run=dry_run,
            namespace_labels=namespace_labels,
            env_lookup=env_lookup,
            node_labels=node_labels,
            now=now if now is not None else datetime.datetime.now(datetime.timezone.utc),
            clock=time.monotonic,
        ),
        settings=settings,
    )


def object_namespace(obj: Mapping[str, Any]) -> str:
    """The object's ``metadata.namespace``, or "" when it has none (or a malformed one)."""
    metadata = obj.get("metadata")
    if isinstance(metadata, Mapping):
        namespace = metadata.get("namespace")
        if isinstance(namespace, str):
            return namespace
    return ""
