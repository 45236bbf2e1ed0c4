"""What ``serve`` reads from the cluster while judging reviews: namespace labels and GPU001's env sources.

With cluster access (``--kubeconfig``, ``--self-managed-certs``, or a pod with a service account
token) the webhook, by default:

- keeps every Namespace's labels in an informer-style cache (``webhook.admission.namespaces``),
  so namespace overrides and exceptions by label selector work as they do in dry-run with
  ``--namespace-labels``; ``/readyz`` is 503 until the first list succeeded;
- reads the ConfigMaps a pod's ``envFrom``/``valueFrom`` names, for GPU001
  (``webhook.admission.envsources``: 10 s cache, 1 s per read, offline judgement on timeout);
- reads the Node a running pod is bound to when a privileged ephemeral container is being added
  to it, for GPU009 (``webhook.admission.nodes``: 10 s cache, 1 s per read; unknown labels fail
  closed);
- records a ``PolicyViolation`` Event in the namespace of each denied object, naming the policies
  (``webhook.admission.events``: one per object and policies a minute, a bounded queue, sent in
  the background with a 2 s timeout; never on a dry-run review; ``--no-events`` turns it off).

Secrets are read only with ``--lookup-secrets``: a webhook that can read every Secret is a prime
target, so by default Secret-fed ``envFrom`` is judged as offline (admitted where GPU007 is
enforced, since no Secret can then carry a guarded key; a warning where it is not). Without cluster access nothing here runs and the webhook judges offline.

This module is the shell: the kubernetes client (through ``webhook.audit.kube``) and the flags.
Every read here is tried once (`webhook.kube.retry.ONCE`): the informer re-lists after its own
backoff and counts each failure, and the per-review reads have a deadline of a second. Failures
come out as `webhook.kube.errors` types, one line each.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import json
import logging
import os
import pathlib
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

from aiohttp import web

from policies import model
from policies.gpu import dra
from webhook import kube as webhook_kube
from webhook.admission import claims as claims_module
from webhook.admission import envsources, events, keys, namespaces, nodes
from webhook.cmdline import errors, flags
from webhook.kube import client, retry
from webhook.kube import envsources as kube_envsources
from webhook.kube import errors as kube_errors
from webhook.kube import watch as kube_watch
from webhook.serving import metrics

log = logging.getLogger(__name__)

WATCH_ERRORS_METRIC = "gpu_admission_namespace_watch_errors_total"

TOKEN = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
LIST_CHUNK = 500
EVENT_TIMEOUT_S = 2.0
_watch_module: Any = kube_watch  # untyped; Any stops at the adapter (STYLE habit 3)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The cluster-context flags of ``serve`` (``--kubeconfig`` is shared with self-managed certificates)."""
    group = parser.add_argument_group(
        "cluster context (with --kubeconfig, --self-managed-certs, or in a pod with a service account token)"
    )
    flags.add_cluster(
        group,
        kubeconfig_help="kubeconfig for the cluster context, the background audit and self-managed certificates "
        "(default: in-cluster config, else ~/.kube/config where --self-managed-certs needs one)",
    )
    group.add_argument(
        "--namespace-labels",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="list and watch Namespaces so that overrides and exceptions can select namespaces by label; "
        "readyz is 503 until the first list (default: on with cluster access)",
    )
    group.add_argument(
        "--lookup-configmaps",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="read the ConfigMaps a pod's envFrom/valueFrom names, for GPU001 (10s cache, 1s per read; "
        "default: on with cluster access)",
    )
    group.add_argument(
        "--lookup-nodes",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="read the Node a pod runs on when a privileged ephemeral container is added to it, for GPU009 "
        "(10s cache, 1s per read; without it GPU009 allows that only for pods kept off GPU nodes; "
        "default: on with cluster access)",
    )
    group.add_argument(
        "--events",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="record a PolicyViolation Event on each denied object, in its namespace (rate-limited, never delays "
        "the answer; needs create on events; default: on with cluster access)",
    )
    group.add_argument(
        "--lookup-secrets",
        action="store_true",
        help="read Secrets too (needs get on secrets cluster-wide, a large privilege; default: off, and "
        "Secret-fed envFrom is judged as offline: admitted where GPU007 is enforced)",
    )


def has_access(args: argparse.Namespace) -> bool:
    """Whether the flags or the environment give this process a way to the apiserver."""
    in_pod = bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and TOKEN.exists()
    return bool(args.kubeconfig) or bool(getattr(args, "context", None)) or bool(args.self_managed_certs) or in_pod


@dataclasses.dataclass(frozen=True, kw_only=True)
class Wanted:
    """Which parts of the cluster context to run."""

    namespace_labels: bool
    configmaps: bool
    secrets: bool
    nodes: bool = False
    events: bool = False
    claims: bool = False

    @property
    def any(self) -> bool:
        return self.namespace_labels or self.configmaps or self.secrets or self.nodes or self.events or self.claims


def wanted(args: argparse.Namespace, *, access: bool) -> Wanted:
    """Resolve the flags: on by default with access; asked for explicitly without access is an error."""
    asked = [
        flag
        for flag, value in (
            ("--namespace-labels", args.namespace_labels),
            ("--lookup-configmaps", args.lookup_configmaps),
            ("--lookup-nodes", args.lookup_nodes),
            ("--lookup-secrets", args.lookup_secrets or None),
            ("--events", getattr(args, "events", None)),
        )
        if value
    ]
    if asked and not access:
        raise errors.InputError(
            f"{', '.join(asked)} need cluster access: give --kubeconfig, or run in a pod with a service account token"
        )
    return Wanted(
        namespace_labels=access and args.namespace_labels is not False,
        configmaps=access and args.lookup_configmaps is not False,
        secrets=access and bool(args.lookup_secrets),
        nodes=access and args.lookup_nodes is not False,
        events=access and getattr(args, "events", None) is not False,
        claims=access,  # GPU011 fails closed on a claim it cannot read: with access, always look
    )


class KubeNamespaces:
    """``namespaces.Source`` over the apiserver (raw JSON, like the audit's lists)."""

    def __init__(self, api: client.ApiClient) -> None:
        self._core: Any = client.CoreV1Api(api)
        self._watch: Any = None  # kubernetes.watch is untyped: Any stops here, at the adapter

    def list(self) -> tuple[list[Mapping[str, Any]], str]:
        items: list[Mapping[str, Any]] = []
        token, version = "", ""
        while True:
            extra: dict[str, Any] = {"limit": LIST_CHUNK, "_preload_content": False, "_request_timeout": 30}
            if token:
                extra["_continue"] = token
            response = retry.call(
                functools.partial(self._core.list_namespace, **extra),
                what="cannot list namespaces",
                idempotent=True,
                backoff=retry.ONCE,
            )
            page = json.loads(response.data)
            items.extend(page.get("items") or ())
            metadata = page.get("metadata") or {}
            version = str(metadata.get("resourceVersion") or version)
            token = str(metadata.get("continue") or "")
            if not token:
                return items, version

    def watch(self, *, resource_version: str, timeout_s: int) -> Iterator[Mapping[str, Any]]:
        self._watch = _watch_module.Watch()
        try:
            yield from self._watch.stream(
                self._core.list_namespace,
                resource_version=resource_version,
                timeout_seconds=timeout_s,
                allow_watch_bookmarks=True,
                deserialize=False,
                _request_timeout=(10, timeout_s + 30),
            )
        except Exception as failure:
            if not kube_errors.recognised(failure):
                raise
            raise kube_errors.translate(failure, what="namespace watch") from failure

    def read(self, name: str, *, timeout_s: float) -> Mapping[str, Any] | None:
        try:
            response = retry.call(
                lambda: self._core.read_namespace(name, _preload_content=False, _request_timeout=timeout_s),
                what=f"cannot read namespace {name}",
                idempotent=True,
                backoff=retry.ONCE,
            )
        except kube_errors.NotFound:
            return None
        found: Mapping[str, Any] = json.loads(response.data)
        return found

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.stop()


@dataclasses.dataclass(kw_only=True)
class Context:
    """The parts in use, and the client they share."""

    api: client.ApiClient
    informer: namespaces.Informer | None
    env: envsources.Cache | None
    node_labels: nodes.Cache | None = None
    recorder: events.Recorder | None = None
    claims: claims_module.Cache | None = None

    def install(self, app: web.Application) -> None:
        """Put the parts where the handlers find them, and run them for the app's lifetime."""
        if self.informer is not None:
            app[keys.NAMESPACES] = self.informer
            if keys.METRICS in app:
                errors_total = app[keys.METRICS].registry.register(
                    metrics.Counter(
                        WATCH_ERRORS_METRIC,
                        "Failed lists or watches of Namespaces (each one re-lists after a backoff; "
                        "meanwhile labels come from the cache, or one read per unknown namespace).",
                        (),
                    )
                )
                errors_total.inc(0)  # a sample from the start, so an alert on increase() sees the first error
                self.informer.on_error = lambda _reason: errors_total.inc()
        if self.env is not None:
            app[keys.ENV_SOURCES] = self.env
        if self.node_labels is not None:
            app[keys.NODES] = self.node_labels
        if self.claims is not None:
            app[keys.CLAIMS] = self.claims
        # The labeler's evictions are judged by the node of the pod (`evictions`); reading it needs
        # `get` on pods, which deploy/components/usage-limits grants.
        api = self.api

        def pod_node(namespace: str, name: str) -> str | None:
            return read_pod_node(api, namespace, name, timeout_s=POD_TIMEOUT_S)

        app[keys.POD_NODES] = pod_node
        if self.recorder is not None:
            app[keys.EVENTS] = self.recorder
            app.cleanup_ctx.append(self.recorder.lifetime)
        app.cleanup_ctx.append(self._lifetime)

    async def _lifetime(self, app: web.Application) -> AsyncIterator[None]:
        if self.informer is not None:
            self.informer.start()
        try:
            yield
        finally:
            if self.informer is not None:
                # The thread is a daemon: a watch blocked in a read does not hold up the exit.
                await asyncio.to_thread(self.informer.stop, wait_s=1.0)
            webhook_kube.close(self.api)


def from_args(args: argparse.Namespace) -> Context | None:
    """The cluster context the flags ask for, or None (offline) without access or with every part off."""
    parts = wanted(args, access=has_access(args))
    if not parts.any:
        log.info("uid=- no cluster context: namespace labels unknown, GPU001 judges envFrom offline")
        return None
    try:
        api = webhook_kube.api_client(args.kubeconfig, context=getattr(args, "context", None))
    except webhook_kube.ConfigError as error:
        raise errors.InputError(f"cluster context: {error}") from error
    informer = namespaces.Informer(KubeNamespaces(api)) if parts.namespace_labels else None
    env = None
    kinds = frozenset(kind for kind, on in (("ConfigMap", parts.configmaps), ("Secret", parts.secrets)) if on)
    if kinds:

        def reader(source: model.EnvSource) -> Mapping[str, str] | None:
            # The read's own timeout ends the thread; the cache stops waiting at the same bound.
            return kube_envsources.read_env_source(api, source, timeout_s=envsources.DEFAULT_TIMEOUT_S)

        env = envsources.Cache(reader, kinds=kinds)
    node_cache = nodes.Cache(functools.partial(read_node_labels, api, timeout_s=nodes.DEFAULT_TIMEOUT_S)) if parts.nodes else None
    recorder = events.Recorder(functools.partial(create_event, api, timeout_s=EVENT_TIMEOUT_S)) if parts.events else None
    log.info(
        "uid=- cluster context: namespace labels %s, ConfigMap lookups %s, Secret lookups %s, Node lookups %s, events %s",
        *("on" if on else "off" for on in (parts.namespace_labels, parts.configmaps, parts.secrets, parts.nodes, parts.events)),
    )
    claim_cache = (
        claims_module.Cache(functools.partial(read_claim, api, timeout_s=claims_module.DEFAULT_TIMEOUT_S))
        if parts.claims
        else None
    )
    return Context(api=api, informer=informer, env=env, node_labels=node_cache, recorder=recorder, claims=claim_cache)


def create_event(api: client.ApiClient, body: Mapping[str, Any], *, timeout_s: float) -> None:
    """Write one core/v1 Event (the webhook's ClusterRole allows create on events, nothing more)."""
    core: Any = client.CoreV1Api(api)
    namespace = body["metadata"]["namespace"]
    retry.call(
        lambda: core.create_namespaced_event(namespace, dict(body), _preload_content=False, _request_timeout=timeout_s),
        what=f"cannot record an event in {namespace}",
        idempotent=False,
        backoff=retry.ONCE,
    )


def read_claim(api: client.ApiClient, key: tuple[str, str, str], *, timeout_s: float) -> Mapping[str, Any]:
    """One ResourceClaim or ResourceClaimTemplate (a ``get``; the webhook's ClusterRole allows that
    on both); {} when it does not exist. Other errors propagate: the cache logs them and GPU011
    fails closed. `key`: (namespace, kind, name)."""
    namespace, kind, name = key
    plural = {"ResourceClaim": "resourceclaims", "ResourceClaimTemplate": "resourceclaimtemplates"}[kind]
    custom: Any = client.CustomObjectsApi(api)
    try:
        response = retry.call(
            lambda: custom.get_namespaced_custom_object(
                dra.GROUP, dra.VERSION, namespace, plural, name, _preload_content=False, _request_timeout=timeout_s
            ),
            what=f"cannot read {kind} {namespace}/{name}",
            idempotent=True,
            backoff=retry.ONCE,
        )
    except kube_errors.NotFound:
        return {}
    data = json.loads(response.data)
    return {**data, "kind": kind} if isinstance(data, dict) else {}


POD_TIMEOUT_S = 5.0


def read_pod_node(api: client.ApiClient, namespace: str, name: str, *, timeout_s: float) -> str | None:
    """A pod's `spec.nodeName` ("" when unbound), None when it does not exist (a `get`)."""
    core: Any = client.CoreV1Api(api)
    try:
        answer = retry.call(
            lambda: core.read_namespaced_pod(name, namespace, _preload_content=False, _request_timeout=timeout_s),
            what=f"cannot read pod {namespace}/{name}",
            idempotent=True,
            backoff=retry.ONCE,
        )
    except kube_errors.NotFound:
        return None
    node = (json.loads(answer.data).get("spec") or {}).get("nodeName")
    return node if isinstance(node, str) else ""


def read_node_labels(api: client.ApiClient, name: str, *, timeout_s: float) -> Mapping[str, str] | None:
    """One Node's labels (a ``get``; the webhook's ClusterRole allows nothing more on Nodes); None
    when it does not exist. Other errors propagate: the cache logs them and GPU009 fails closed."""
    core: Any = client.CoreV1Api(api)
    try:
        response = retry.call(
            lambda: core.read_node(name, _preload_content=False, _request_timeout=timeout_s),
            what=f"cannot read node {name}",
            idempotent=True,
            backoff=retry.ONCE,
        )
    except kube_errors.NotFound:
        return None
    labels = (json.loads(response.data).get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}
