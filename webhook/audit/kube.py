"""The audit's kubernetes adapter: list what to audit, look up env sources (the webhook too), read and write reports, Leases.

Everything here is synchronous (the official `kubernetes` client is); the background audit calls
it through `asyncio.to_thread`. Lists are paged (`limit`/`continue`, `CHUNK` objects a page) and
decoded straight from JSON (`_preload_content=False`): the engine wants the camelCase wire shape
anyway, and the client's model deserialisation is the slowest part of listing 10,000 pods.
Every failure surfaces as `KubeError` with one line naming what was being done.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from policies import envsources, model
from webhook import kube
from webhook.audit import report, scan
from webhook.kube import client, client_exceptions, urllib3

log = logging.getLogger(__name__)

CHUNK = 500
LEASE_TIMEOUT_S = 5  # a hung Lease call must not outlive the claim it renews
_T = TypeVar("_T")


class KubeError(Exception):
    """A cluster call failed; the message is one line saying what and why."""


def api_client(kubeconfig: str | None = None, *, context: str | None = None) -> client.ApiClient:
    """`webhook.kube.api_client`, failing as this adapter's `KubeError`."""
    try:
        return kube.api_client(kubeconfig, context=context)
    except kube.ConfigError as error:
        raise KubeError(str(error)) from error


def _call(what: str, function: Callable[[], _T]) -> _T:
    try:
        return function()
    except (client_exceptions.ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as error:
        raise KubeError(f"{what}: {kube.reason(error)}") from error


# --- listing --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Listing:
    kind: str
    api_version: str
    all_namespaces: Callable[..., Any]
    namespaced: Callable[..., Any] | None


def _listings(api: client.ApiClient) -> list[_Listing]:
    core: Any = client.CoreV1Api(api)
    apps: Any = client.AppsV1Api(api)
    batch: Any = client.BatchV1Api(api)
    return [
        _Listing(kind="Node", api_version="v1", all_namespaces=core.list_node, namespaced=None),
        _Listing(kind="Pod", api_version="v1", all_namespaces=core.list_pod_for_all_namespaces, namespaced=core.list_namespaced_pod),
        _Listing(kind="Deployment", api_version="apps/v1", all_namespaces=apps.list_deployment_for_all_namespaces, namespaced=apps.list_namespaced_deployment),
        _Listing(kind="StatefulSet", api_version="apps/v1", all_namespaces=apps.list_stateful_set_for_all_namespaces, namespaced=apps.list_namespaced_stateful_set),
        _Listing(kind="DaemonSet", api_version="apps/v1", all_namespaces=apps.list_daemon_set_for_all_namespaces, namespaced=apps.list_namespaced_daemon_set),
        _Listing(kind="ReplicaSet", api_version="apps/v1", all_namespaces=apps.list_replica_set_for_all_namespaces, namespaced=apps.list_namespaced_replica_set),
        _Listing(
            kind="ReplicationController",
            api_version="v1",
            all_namespaces=core.list_replication_controller_for_all_namespaces,
            namespaced=core.list_namespaced_replication_controller,
        ),
        _Listing(kind="Job", api_version="batch/v1", all_namespaces=batch.list_job_for_all_namespaces, namespaced=batch.list_namespaced_job),
        _Listing(kind="CronJob", api_version="batch/v1", all_namespaces=batch.list_cron_job_for_all_namespaces, namespaced=batch.list_namespaced_cron_job),
    ]


def _pages(listing: _Listing, *, namespace: str | None, chunk: int) -> Iterator[dict[str, Any]]:
    token = ""
    while True:
        kwargs: dict[str, Any] = {"limit": chunk, "_preload_content": False}
        if token:
            kwargs["_continue"] = token
        if namespace is None or listing.namespaced is None:
            call = functools.partial(listing.all_namespaces, **kwargs)
        else:
            call = functools.partial(listing.namespaced, namespace, **kwargs)
        where = f"in namespace {namespace}" if namespace is not None and listing.namespaced else "in the cluster"
        response = _call(f"cannot list {listing.kind} objects {where}", call)
        try:
            page = json.loads(response.data)
        except ValueError as error:
            raise KubeError(f"listing {listing.kind} objects: the apiserver sent invalid JSON") from error
        for item in page.get("items") or ():
            # List items carry no kind/apiVersion of their own; the engine and reports need both.
            item.setdefault("kind", listing.kind)
            item.setdefault("apiVersion", listing.api_version)
            yield item
        token = str((page.get("metadata") or {}).get("continue") or "")
        if not token:
            return


def inventory(api: client.ApiClient, *, namespace: str | None = None, chunk: int = CHUNK) -> scan.Inventory:
    """Pods, workloads (of `namespace`, or all namespaces), every Node, and the Namespaces' labels."""
    objects: list[dict[str, Any]] = []
    for listing in _listings(api):
        objects.extend(_pages(listing, namespace=namespace, chunk=chunk))
    objects.extend(_namespaces(api, chunk=chunk))
    objects.extend(env_sources(client.CoreV1Api(api), namespace=namespace, chunk=chunk))
    return scan.Inventory.of(objects)


def env_sources(core: Any, *, namespace: str | None, chunk: int = CHUNK) -> list[dict[str, Any]]:
    """ConfigMaps and Secrets (of `namespace`, or all), keys only, for GPU211.

    Each page is reduced to keys as it arrives (`envsources.keys_only`), so no Secret value
    outlives its page. Whoever may not list one kind (a 403: the background audit's role lists no
    Secrets unless an admin opts in) still gets the audit, with a warning that GPU211 leaves that
    kind out.
    """
    found: list[dict[str, Any]] = []
    for kind, everywhere, namespaced in (
        ("ConfigMap", core.list_config_map_for_all_namespaces, core.list_namespaced_config_map),
        ("Secret", core.list_secret_for_all_namespaces, core.list_namespaced_secret),
    ):
        listing = _Listing(kind=kind, api_version="v1", all_namespaces=everywhere, namespaced=namespaced)
        try:
            listed = [envsources.keys_only(item) for item in _pages(listing, namespace=namespace, chunk=chunk)]
        except KubeError as error:
            log.warning("%s objects not listed, GPU211 does not cover them: %s", kind, error)
            continue
        found.extend(listed)
    return found


def _namespaces(api: client.ApiClient, *, chunk: int) -> list[dict[str, Any]]:
    """Every Namespace, for the labels namespace overrides select on (as the webhook sees them).

    Whoever may list pods but not Namespaces still gets the audit, with a warning: each namespace
    then has only its name label, as in the webhook without its cluster context.
    """
    core: Any = client.CoreV1Api(api)
    listing = _Listing(kind="Namespace", api_version="v1", all_namespaces=core.list_namespace, namespaced=None)
    try:
        return list(_pages(listing, namespace=None, chunk=chunk))
    except KubeError as error:
        log.warning("namespace labels unknown, overrides that select on them will not match: %s", error)
        return []


def read_env_source(api: client.ApiClient, source: model.EnvSource, *, timeout_s: float | None = None) -> Mapping[str, str] | None:
    """A ConfigMap's data or a Secret's decoded data, for GPU001; None when it is missing,
    forbidden or odd (the engine then treats the value as unknown). Shared by the audit and the
    webhook (``webhook.admission.clustercontext``), which bounds each read with `timeout_s`."""
    core: Any = client.CoreV1Api(api)
    extra: dict[str, Any] = {"_preload_content": False}
    if timeout_s is not None:
        extra["_request_timeout"] = timeout_s
    try:
        if source.kind == "ConfigMap":
            response = core.read_namespaced_config_map(source.name, source.namespace, **extra)
            return {str(k): str(v) for k, v in (json.loads(response.data).get("data") or {}).items()}
        response = core.read_namespaced_secret(source.name, source.namespace, **extra)
        data = json.loads(response.data).get("data") or {}
        return {str(k): base64.b64decode(str(v)).decode("utf-8", "replace") for k, v in data.items()}
    except (client_exceptions.ApiException, urllib3.exceptions.HTTPError, OSError, ValueError, binascii.Error):
        return None


def env_lookup(api: client.ApiClient) -> model.EnvLookup:
    """A cached ConfigMap/Secret reader for GPU001's envFrom/valueFrom (one audit run); unreadable sources give None."""
    cache: dict[model.EnvSource, Mapping[str, str] | None] = {}

    def lookup(source: model.EnvSource) -> Mapping[str, str] | None:
        if source not in cache:
            cache[source] = read_env_source(api, source)
        return cache[source]

    return lookup


# --- reports --------------------------------------------------------------------------------------

_PLURAL = {"PolicyReport": "policyreports", "ClusterPolicyReport": "clusterpolicyreports"}


def existing_reports(
    api: client.ApiClient, *, namespace: str | None, cluster: bool, scope: str = "namespace"
) -> dict[report.Key, Mapping[str, Any]]:
    """Our reports as they are now, by namespace (report.CLUSTER for the cluster report); with
    ``scope="resource"`` the per-resource reports, by (namespace, name).

    Only objects named `report.NAME` (or, per resource, labelled with that scope) are ours;
    another engine's reports are never touched.
    """
    custom: Any = client.CustomObjectsApi(api)
    found: dict[report.Key, Mapping[str, Any]] = {}
    per_resource = scope == report.RESOURCE_SCOPE
    selector = f"{report.MANAGED_BY_LABEL}={report.MANAGED_BY}"
    if per_resource:
        selector += f",{report.SCOPE_LABEL}={report.RESOURCE_SCOPE}"
    what = "cannot list PolicyReports (are the CRDs of deploy/crds/ applied?)"
    if namespace is None:
        listed = _call(what, lambda: custom.list_cluster_custom_object(report.GROUP, report.VERSION, "policyreports", label_selector=selector))
    else:
        listed = _call(
            what,
            lambda: custom.list_namespaced_custom_object(report.GROUP, report.VERSION, namespace, "policyreports", label_selector=selector),
        )
    for item in listed.get("items") or ():
        metadata = item.get("metadata") or {}
        if per_resource:
            found[(str(metadata.get("namespace", "")), str(metadata.get("name", "")))] = item
        elif metadata.get("name") == report.NAME:
            found[str(metadata.get("namespace", ""))] = item
    if cluster:
        listed = _call(
            "cannot list ClusterPolicyReports (are the CRDs of deploy/crds/ applied?)",
            lambda: custom.list_cluster_custom_object(report.GROUP, report.VERSION, "clusterpolicyreports", label_selector=selector),
        )
        for item in listed.get("items") or ():
            name = (item.get("metadata") or {}).get("name")
            if per_resource:
                found[(report.CLUSTER, str(name))] = item
            elif name == report.NAME:
                found[report.CLUSTER] = item
    return found


def _write(custom: Any, step: report.Step) -> None:
    plural = "policyreports" if step.namespace else "clusterpolicyreports"
    name = step.name
    where = f"{plural}/{name}" + (f" in {step.namespace}" if step.namespace else "")
    if step.verb is report.Verb.DELETE:
        try:
            if step.namespace:
                custom.delete_namespaced_custom_object(report.GROUP, report.VERSION, step.namespace, plural, name)
            else:
                custom.delete_cluster_custom_object(report.GROUP, report.VERSION, plural, name)
        except client_exceptions.ApiException as error:
            if error.status != 404:  # already gone is what we wanted
                raise KubeError(f"cannot delete {where}: {kube.reason(error)}") from error
        return
    body: dict[str, Any] = json.loads(json.dumps(step.body))
    if step.verb is report.Verb.CREATE:
        if step.namespace:
            _call(f"cannot create {where}", lambda: custom.create_namespaced_custom_object(report.GROUP, report.VERSION, step.namespace, plural, body))
        else:
            _call(f"cannot create {where}", lambda: custom.create_cluster_custom_object(report.GROUP, report.VERSION, plural, body))
        return
    body["metadata"]["resourceVersion"] = step.resource_version
    if step.namespace:
        _call(
            f"cannot replace {where}",
            lambda: custom.replace_namespaced_custom_object(report.GROUP, report.VERSION, step.namespace, plural, name, body),
        )
    else:
        _call(f"cannot replace {where}", lambda: custom.replace_cluster_custom_object(report.GROUP, report.VERSION, plural, name, body))


def apply(api: client.ApiClient, steps: list[report.Step]) -> int:
    """Carry out a write plan; returns the number of writes. A replace that lost a race is retried once
    against the newer version (and dropped if that one already says the same)."""
    custom: Any = client.CustomObjectsApi(api)
    for step in steps:
        try:
            _write(custom, step)
        except KubeError as error:
            cause = error.__cause__
            if not (isinstance(cause, client_exceptions.ApiException) and cause.status == 409 and step.body is not None):
                raise
            current = _read(custom, step.namespace, step.name)
            key = (step.namespace, step.name)
            retry = report.plan({key: step.body}, {key: current} if current else {})
            for again in retry:
                _write(custom, again)
    return len(steps)


def _read(custom: Any, namespace: str, name: str = report.NAME) -> Mapping[str, Any] | None:
    try:
        if namespace:
            found = custom.get_namespaced_custom_object(report.GROUP, report.VERSION, namespace, "policyreports", name)
        else:
            found = custom.get_cluster_custom_object(report.GROUP, report.VERSION, "clusterpolicyreports", name)
    except client_exceptions.ApiException as error:
        if error.status == 404:
            return None
        raise KubeError(f"cannot read {name}: {kube.reason(error)}") from error
    return found if isinstance(found, Mapping) else None


# --- leases ---------------------------------------------------------------------------------------


def read_lease(api: client.ApiClient, *, namespace: str, name: str) -> dict[str, Any] | None:
    """The Lease as JSON, or None when it does not exist."""
    coordination: Any = client.CoordinationV1Api(api)
    try:
        response = coordination.read_namespaced_lease(name, namespace, _preload_content=False, _request_timeout=LEASE_TIMEOUT_S)
    except client_exceptions.ApiException as error:
        if error.status == 404:
            return None
        raise KubeError(f"cannot read lease {namespace}/{name}: {kube.reason(error)}") from error
    except (urllib3.exceptions.HTTPError, OSError) as error:
        raise KubeError(f"cannot read lease {namespace}/{name}: {kube.reason(error)}") from error
    found: dict[str, Any] = json.loads(response.data)
    return found


class Conflict(KubeError):
    """Someone else wrote the object first (HTTP 409)."""


def write_lease(api: client.ApiClient, lease: Mapping[str, Any], *, create: bool) -> dict[str, Any]:
    """Create or replace (with its resourceVersion) a Lease; `Conflict` when another writer won."""
    coordination: Any = client.CoordinationV1Api(api)
    metadata = lease.get("metadata") or {}
    namespace, name = str(metadata.get("namespace")), str(metadata.get("name"))
    try:
        if create:
            response = coordination.create_namespaced_lease(
                namespace, dict(lease), _preload_content=False, _request_timeout=LEASE_TIMEOUT_S
            )
        else:
            response = coordination.replace_namespaced_lease(
                name, namespace, dict(lease), _preload_content=False, _request_timeout=LEASE_TIMEOUT_S
            )
    except client_exceptions.ApiException as error:
        if error.status == 409:
            raise Conflict(f"lease {namespace}/{name} changed under us") from error
        raise KubeError(f"cannot write lease {namespace}/{name}: {kube.reason(error)}") from error
    except (urllib3.exceptions.HTTPError, OSError) as error:
        raise KubeError(f"cannot write lease {namespace}/{name}: {kube.reason(error)}") from error
    written: dict[str, Any] = json.loads(response.data)
    return written
