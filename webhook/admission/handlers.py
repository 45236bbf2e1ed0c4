"""HTTP handlers: /mutate and /validate (AdmissionReview in, AdmissionReview out) and the probes.

Two error channels: a body that is not a review gets an HTTP 4xx with a short reason; a review
always gets HTTP 200 with the verdict in ``response`` (denials carry ``status.code`` 403).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import time
from collections.abc import Collection, Mapping
from typing import Any, Literal

from aiohttp import web

from policies import lookups, model, ordinary, podspec
from policies.builtin import gpu103_off_gpu_nodes
from webhook.admission import decisions, events, jsoncodec, keys, mirror, response, review
from webhook.serving import metrics

log = logging.getLogger(__name__)

Endpoint = Literal["mutate", "validate"]


async def mutate(request: web.Request) -> web.Response:
    return await _admit(request, endpoint="mutate")


async def validate(request: web.Request) -> web.Response:
    return await _admit(request, endpoint="validate")


async def healthz(request: web.Request) -> web.Response:
    """Liveness: the process answers HTTP."""
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.Response:
    """Readiness: settings loaded, the engine evaluated a probe pod at start-up and, with cluster
    access, the namespace labels have been listed (a review is never judged without them)."""
    state = request.app[keys.STATE]
    if not state.ready:
        return web.Response(status=503, text=f"not ready: {state.reason}\n")
    if keys.NAMESPACES in request.app and not request.app[keys.NAMESPACES].labels.synced:
        return web.Response(status=503, text="not ready: namespace labels not listed yet\n")
    return web.Response(text="ok\n")


async def metrics_text(request: web.Request) -> web.Response:
    body = request.app[keys.METRICS].registry.render()
    return web.Response(body=body.encode("utf-8"), headers={"Content-Type": metrics.CONTENT_TYPE})


async def _admit(request: web.Request, *, endpoint: Endpoint) -> web.Response:
    meters = request.app[keys.METRICS]
    started = time.perf_counter()
    meters.in_flight.inc(endpoint=endpoint)
    try:
        return await _answer(request, meters=meters, endpoint=endpoint, started=started)
    finally:
        meters.in_flight.dec(endpoint=endpoint)


async def _answer(request: web.Request, *, meters: metrics.WebhookMetrics, endpoint: Endpoint, started: float) -> web.Response:
    try:
        body = await request.read()  # enforces the app's client_max_size
    except web.HTTPRequestEntityTooLarge:
        meters.admission_reviews.inc(endpoint=endpoint, result="bad_request")
        log.warning("uid=- endpoint=%s body over %d bytes from %s", endpoint, request.client_max_size, request.remote)
        # 400 like every other body that is not a usable review (the contract in DESIGN section 2);
        # the reason line says it was the size.
        return web.Response(status=400, text=f"bad AdmissionReview: body larger than {request.client_max_size} bytes\n")
    try:
        checked = review.parse(body)
    except review.BadReview as error:
        meters.admission_reviews.inc(endpoint=endpoint, result="bad_request")
        log.warning("uid=- endpoint=%s bad review from %s: %s", endpoint, request.remote, error)
        return web.Response(status=400, text=f"bad AdmissionReview: {error}\n")
    request[keys.UID] = checked.uid

    try:
        # A kubelet's mirror pod: allowed, unchanged and unjudged, as the registrations' match
        # condition skipped it before the mutating webhook lost that condition (mirror.py).
        decision = mirror.decision(checked)
        if decision is None:
            namespace_labels, env_lookup, env_sources = await _cluster_context(request, checked)
            node_labels = await _node_labels(request, checked)
            claims = await _claims(request, checked)
            question = decisions.Question(
                object=checked.object,
                namespace=checked.namespace,
                operation=checked.operation,
                old_object=checked.old_object,
                user=checked.user,
                groups=checked.groups,
                subresource=checked.subresource,
                dry_run=checked.dry_run,
                namespace_labels=namespace_labels,
                env_lookup=env_lookup,
                node_labels=node_labels,
                claims=claims,
                now=datetime.datetime.now(datetime.UTC),
            )
            live = request.app[keys.LIVE_SETTINGS].current
            decision = request.app[keys.DECISIONS].decide(
                question, settings=live, env_sources=env_sources, validating=endpoint == "validate"
            )
        if endpoint == "mutate":
            decision = _marked_for_review(request, checked, decision)
            answer = response.for_mutation(request=checked, decision=decision)
        else:
            answer = response.for_validation(request=checked, decision=decision)
    except Exception:  # noqa: BLE001 - a bug must still answer the review, never become a 500
        log.exception("uid=%s endpoint=%s internal error while evaluating", checked.uid, endpoint)
        meters.admission_reviews.inc(endpoint=endpoint, result="error")
        return web.json_response(response.for_internal_error(request=checked, endpoint=endpoint))

    _record(
        meters,
        endpoint=endpoint,
        decision=decision,
        answer=answer,
        operation=checked.operation,
        kind=checked.object_kind,
        started=started,
    )
    log.info(
        "uid=%s endpoint=%s %s %s/%s ns=%s dryRun=%s allowed=%s violations=%s patch_ops=%d%s",
        checked.uid,
        endpoint,
        checked.operation,
        checked.object_kind or "-",
        checked.name or "-",
        checked.namespace or "-",
        checked.dry_run,
        answer["response"]["allowed"],
        ",".join(f"{v.policy}:{v.action}" for v in decision.violations) or "-",
        len(decision.patch) if endpoint == "mutate" else 0,
        f" exempt={decision.exempt_reason!r}" if decision.exempt_reason else "",
    )
    if not answer["response"]["allowed"] and not checked.dry_run and keys.EVENTS in request.app:
        _record_denial(request.app[keys.EVENTS], checked, decision, answer)
    elif endpoint == "validate" and not checked.dry_run and keys.EVENTS in request.app:
        _record_notice(request, checked, decision)
    # The JSON bytes straight into the body: what json_response(dumps=jsoncodec.dumps_text) sent,
    # headers included, without decoding the bytes to text and encoding them back.
    return web.Response(body=jsoncodec.dumps(answer), content_type="application/json", charset="utf-8")


def _marked_for_review(request: web.Request, checked: review.Review, decision: model.Decision) -> model.Decision:
    """The decision with the review mark added to a pod CREATE's patch while settings make the
    validating webhook's ordinary-pod skip unsound (policies.ordinary: user policies, quiet mutators)."""
    if checked.operation != "CREATE" or checked.object_kind != "Pod" or checked.subresource or decision.exempt_reason:
        return decision
    if not ordinary.cached_unsound_reasons(request.app[keys.LIVE_SETTINGS].current):
        return decision
    mark = ordinary.review_mark(checked.object)
    return dataclasses.replace(decision, patch=(*decision.patch, *mark)) if mark else decision


def _record_denial(
    recorder: events.Recorder, checked: review.Review, decision: model.Decision, answer: review.AdmissionReviewResponse
) -> None:
    """Queue the denied object's Event (rate-limited, never waited for: ``webhook.admission.events``)."""
    status = answer["response"].get("status") or {}
    recorder.record(
        events.Denial.of(
            checked.object if checked.operation != "DELETE" else checked.old_object,
            namespace=checked.namespace,
            kind=checked.object_kind,
            operation=checked.operation,
            policies=[v.policy for v in decision.violations if v.action is model.Action.ENFORCE],
            message=str(status.get("message", "")),
        )
    )


def _record_notice(request: web.Request, checked: review.Review, decision: model.Decision) -> None:
    """Queue GPU103's notice as an Event on an admitted pod it keeps off GPU nodes (rate-limited).

    Only a pod CREATE with a securityContext, host namespaces, host ports or volumes (the cheap
    test first), whose required affinity keeps it off every GPU node and that has node power: the
    mutating webhook's warning reaches `kubectl describe pod` too."""
    obj = checked.object
    if (
        checked.operation != "CREATE"
        or checked.object_kind != "Pod"
        or checked.subresource
        or obj is None
        or decision.exempt_reason
    ):
        return
    spec = podspec.mapping(obj.get("spec"))
    if not podspec.mapping(spec.get("affinity")):
        return
    live = request.app[keys.LIVE_SETTINGS].current
    namespace = checked.namespace or decisions.object_namespace(obj)
    labels = request.app[keys.NAMESPACES].labels.get(namespace) if keys.NAMESPACES in request.app else None
    notice = gpu103_off_gpu_nodes.kept_off(spec, live, namespace=namespace, namespace_labels=labels)
    if notice:
        request.app[keys.EVENTS].record(events.notice_of(obj, namespace=namespace, policy="GPU103", notice=notice))


async def _cluster_context(
    request: web.Request, checked: review.Review
) -> tuple[Mapping[str, str] | None, model.EnvLookup | None, Collection[model.EnvSource]]:
    """The namespace's labels and GPU001's ConfigMap/Secret data (and the sources asked for), where
    the app has cluster access."""
    app = request.app
    if checked.object is None:
        return None, None, ()  # nothing to evaluate (DELETE, CONNECT)
    namespace = checked.namespace or decisions.object_namespace(checked.object) or decisions.DEFAULT_NAMESPACE
    labels = await app[keys.NAMESPACES].labels_for(namespace) if keys.NAMESPACES in app else None
    lookup, wanted = None, frozenset[model.EnvSource]()
    # A pod's own UPDATE is judged only for its annotations (GPU008, GPU010): no env source to read.
    plain_pod_update = checked.operation == "UPDATE" and checked.object_kind == "Pod" and not checked.subresource
    if keys.ENV_SOURCES in app and not plain_pod_update:
        wanted = lookups.env_sources(checked.object, namespace=namespace)
        if wanted:
            lookup = await app[keys.ENV_SOURCES].prefetch(wanted)
    return labels, lookup, wanted


async def _node_labels(request: web.Request, checked: review.Review) -> Mapping[str, str] | None:
    """The labels of the Node the trust zone asks about, where the app can read Nodes; None otherwise.

    Only an ephemeralcontainers update adding a privileged container to a bound pod, or the CREATE
    of a pod with node power that names its node, needs them (`lookups.node_to_look_up`), so every
    other review skips the lookup after one cheap check.
    """
    if keys.NODES not in request.app:
        return None
    node = lookups.node_to_look_up(
        checked.object, old_object=checked.old_object, subresource=checked.subresource, operation=checked.operation
    )
    if not node:
        return None
    return await request.app[keys.NODES].labels_for(node, uid=checked.uid)


async def _claims(request: web.Request, checked: review.Review) -> dict[tuple[str, str], Mapping[str, Any] | None] | None:
    """The DRA claims and claim templates a pod (or workload template) names, for GPU011; None
    where the app cannot read them (GPU011 then only warns) or the object names none."""
    if keys.CLAIMS not in request.app:
        return None
    wanted = lookups.claims_to_look_up(checked.object)
    if not wanted:
        return None
    return await request.app[keys.CLAIMS].fetch(checked.namespace, wanted, uid=checked.uid)


def _record(
    meters: metrics.WebhookMetrics,
    *,
    endpoint: Endpoint,
    decision: model.Decision,
    answer: review.AdmissionReviewResponse,
    operation: str,
    kind: str,
    started: float,
) -> None:
    allowed = answer["response"]["allowed"]
    if decision.exempt_reason:
        result = "exempt"
    else:
        result = "allowed" if allowed else "denied"
    meters.admission_reviews.inc(endpoint=endpoint, result=result)
    count_result, count_decision = meters.policy_results.inc_one, meters.decisions.inc_one
    for outcome in decision.results:
        count_result(endpoint, outcome.policy, str(outcome.result))
    for violation in decision.violations:
        count_decision(endpoint, violation.policy, str(violation.action))
    # A client other than kube-apiserver could send any kind: only the kinds we judge get a series.
    kind_label = kind if kind in podspec.SUPPORTED_KINDS else "other"
    meters.review_duration.observe(
        time.perf_counter() - started,
        endpoint=endpoint,
        operation=operation,
        kind=kind_label,
        allowed="true" if allowed else "false",
    )
