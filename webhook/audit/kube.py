"""The audit's kubernetes adapter: list what to audit (ledger Leases included), look up env sources (the webhook too), read and write reports, Leases.

Everything here is synchronous (the official `kubernetes` client is); the background audit calls
it through `asyncio.to_thread`. Every list is paged (`limit`/`continue`, `CHUNK` objects a page),
the next page fetched on a helper thread while this one is decoded and judged, and decoded straight
from JSON (`_preload_content=False`, orjson): the engine wants the camelCase wire shape anyway, and
the client's model deserialisation is the slowest part of listing 10,000 pods. The lists are plain
GETs through the client's configuration and pool (`_Raw`), not its API classes, whose model classes
take most of a second to load. `objects` streams
what the audit judges, Pods last, so that 100,000 pods never need to be held at once.
Every failure surfaces as a `webhook.kube.errors.KubeError` with one line naming what was being
done. Reads (and the resourceVersion-guarded replaces, and deletes) are retried with backoff on
429, 5xx and lost connections (`webhook.kube.retry`); creates only on 429.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import logging
import re
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import orjson

from policies import envsources
from policies.gpu import dra, reservations
from webhook import kube
from webhook.audit import report, scan
from webhook.kube import client, client_exceptions, retry
from webhook.kube import errors as kube_errors

log = logging.getLogger(__name__)

CHUNK = 500
_T = TypeVar("_T")


def api_client(kubeconfig: str | None = None, *, context: str | None = None) -> client.ApiClient:
    """`webhook.kube.api_client`, failing as a `webhook.kube.errors.KubeError` like every other call here."""
    try:
        return kube.api_client(kubeconfig, context=context)
    except kube.ConfigError as error:
        raise kube_errors.KubeError(str(error)) from error


def _call(what: str, function: Callable[[], _T], *, idempotent: bool = True) -> _T:
    try:
        return retry.call(function, what=what, idempotent=idempotent)
    except ValueError as error:  # the client's own argument checks
        raise kube_errors.KubeError(f"{what}: {kube_errors.first_line(error)}") from error


# --- listing --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Listing:
    kind: str
    api_version: str
    all_namespaces: Callable[..., Any]
    namespaced: Callable[..., Any] | None


class _Raw:
    """The audit's list calls as plain GETs through the client: its configuration, authentication
    (``param_serialize`` applies the bearer token and its refresh hook) and connection pool, with
    the keywords of the API classes' ``list_*`` methods (``limit``, ``_continue``,
    ``label_selector``; always ``_preload_content=False``), answering what they answer: the raw
    response, or the client's ``ApiException`` for a failing status. The API classes are not
    imported: CoreV1Api, AppsV1Api and BatchV1Api load the client's model classes, about 0.8 s of
    CPU at the start of every run (issue 19)."""

    def __init__(self, api: client.ApiClient) -> None:
        self._api: Any = api

    def lister(self, path: str) -> Callable[..., Any]:
        """``list_*_for_all_namespaces`` (or a cluster-scoped list) of ``path``."""
        return functools.partial(self.get, path)

    def namespaced(self, kind_path: str, *, prefix: str) -> Callable[..., Any]:
        """``list_namespaced_*``: ``prefix/namespaces/<namespace>/kind_path``."""

        def call(namespace: str, **kwargs: Any) -> Any:
            return self.get(f"{prefix}/namespaces/{urllib.parse.quote(namespace, safe='')}/{kind_path}", **kwargs)

        return call

    def get(self, path: str, **kwargs: Any) -> Any:
        query = [(name, kwargs[key]) for key, name in _QUERY if kwargs.get(key) is not None]
        serialized = self._api.param_serialize(
            method="GET",
            resource_path=path,
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = self._api.call_api(*serialized, _request_timeout=kwargs.get("_request_timeout"))
        if not 200 <= response.status <= 299:  # as the API classes do without preloading
            response.read()
            raise client_exceptions.ApiException.from_response(http_resp=response, body=None, data=None)
        return response.response


_QUERY = (("_continue", "continue"), ("label_selector", "labelSelector"), ("limit", "limit"))


class _RawCore:
    """The four CoreV1Api list methods `env_sources` calls, as raw GETs (`_Raw`)."""

    def __init__(self, raw: _Raw) -> None:
        self.list_config_map_for_all_namespaces = raw.lister("/api/v1/configmaps")
        self.list_namespaced_config_map = raw.namespaced("configmaps", prefix="/api/v1")
        self.list_secret_for_all_namespaces = raw.lister("/api/v1/secrets")
        self.list_namespaced_secret = raw.namespaced("secrets", prefix="/api/v1")


def _listing(raw: _Raw, kind: str, api_version: str, plural: str, *, namespaced: bool = True) -> _Listing:
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return _Listing(
        kind=kind,
        api_version=api_version,
        all_namespaces=raw.lister(f"{prefix}/{plural}"),
        namespaced=raw.namespaced(plural, prefix=prefix) if namespaced else None,
    )


def _listings(api: client.ApiClient) -> list[_Listing]:
    raw = _Raw(api)
    return [
        _listing(raw, "Node", "v1", "nodes", namespaced=False),
        _listing(raw, "Pod", "v1", "pods"),
        _listing(raw, "Deployment", "apps/v1", "deployments"),
        _listing(raw, "StatefulSet", "apps/v1", "statefulsets"),
        _listing(raw, "DaemonSet", "apps/v1", "daemonsets"),
        _listing(raw, "ReplicaSet", "apps/v1", "replicasets"),
        _listing(raw, "ReplicationController", "v1", "replicationcontrollers"),
        _listing(raw, "Job", "batch/v1", "jobs"),
        _listing(raw, "CronJob", "batch/v1", "cronjobs"),
    ]


# The list's own `continue` token, read off the raw page before it is decoded so the next page is
# already on its way while this one is decoded and judged. The apiserver writes the list's
# metadata before its items; only that head is searched, and the decoded token has the last word.
_CONTINUE = re.compile(rb'"continue"\s*:\s*"([^"\\]*)"')


def _pages(
    listing: _Listing, *, namespace: str | None, chunk: int, label_selector: str = "", what: str = ""
) -> Iterator[dict[str, Any]]:
    """Every object of a paged list (`limit`/`continue`): one page decoded at a time, the next one
    fetched meanwhile on a helper thread (waiting on the apiserver holds no lock)."""

    def fetch(token: str) -> bytes:
        kwargs: dict[str, Any] = {"limit": chunk, "_preload_content": False}
        if token:
            kwargs["_continue"] = token
        if label_selector:
            kwargs["label_selector"] = label_selector
        if namespace is None or listing.namespaced is None:
            call = functools.partial(listing.all_namespaces, **kwargs)
        else:
            call = functools.partial(listing.namespaced, namespace, **kwargs)
        where = f"in namespace {namespace}" if namespace is not None and listing.namespaced else "in the cluster"
        return bytes(_call(what or f"cannot list {listing.kind} objects {where}", call).data)

    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit-list") as pool:
        data = fetch("")
        while True:
            items_at = data.find(b'"items"')
            guessed = _CONTINUE.search(data, 0, items_at if items_at >= 0 else min(len(data), 4096))
            token = guessed.group(1).decode() if guessed else ""
            upcoming = pool.submit(fetch, token) if token else None
            page = _decode(listing.kind, data)
            del data
            actual = str((page.get("metadata") or {}).get("continue") or "")
            if actual != token:  # the guess missed: what the page says is what counts
                upcoming = pool.submit(fetch, actual) if actual else None
            items = page.get("items") or ()
            del page
            for item in items:
                # List items carry no kind/apiVersion of their own; the engine and reports need both.
                item.setdefault("kind", listing.kind)
                item.setdefault("apiVersion", listing.api_version)
                # No policy or check reads managedFields (often half a pod's bytes): dropped on arrival.
                metadata = item.get("metadata")
                if type(metadata) is dict:
                    metadata.pop("managedFields", None)
                yield item
            if upcoming is None:
                return
            data = upcoming.result()


def _decode(kind: str, data: bytes) -> dict[str, Any]:
    """A list page; orjson first (it decodes pods several times faster), the standard decoder for
    what orjson refuses, so a page decodes exactly when `json` would decode it."""
    try:
        page = orjson.loads(data)
    except orjson.JSONDecodeError:
        try:
            page = json.loads(data)
        except ValueError as error:
            raise kube_errors.KubeError(f"listing {kind} objects: the apiserver sent invalid JSON") from error
    if not isinstance(page, dict):
        raise kube_errors.KubeError(f"listing {kind} objects: the apiserver sent no list")
    return page


def objects(
    api: client.ApiClient,
    *,
    namespace: str | None = None,
    chunk: int = CHUNK,
    ledger_namespace: str = reservations.LEDGER_NAMESPACE,
) -> Iterator[dict[str, Any]]:
    """What the audit judges, as one stream, Pods last: every Node, the nodes' ledger Leases (of
    `ledger_namespace`; whole-cluster audits only), the Namespaces, the workloads and the
    ConfigMaps/Secrets (keys only) of `namespace` (None: all), then its Pods, page by page.

    Pods come last so a caller can judge each page as it arrives, with everything a pod is judged
    against already known, and hold no more of a pod than it chooses to keep.
    """
    listings = _listings(api)
    pods = [listing for listing in listings if listing.kind == "Pod"]
    for listing in listings:
        if listing.kind == "Node":
            yield from _pages(listing, namespace=namespace, chunk=chunk)
    if namespace is None:
        yield from ledger_leases(api, namespace=ledger_namespace, chunk=chunk)
    yield from _namespaces(api, chunk=chunk)
    for listing in listings:
        if listing.kind not in ("Node", "Pod"):
            yield from _pages(listing, namespace=namespace, chunk=chunk)
    yield from env_sources(_RawCore(_Raw(api)), namespace=namespace, chunk=chunk)
    yield from dra_objects(api, namespace=namespace, chunk=chunk)
    for listing in pods:
        yield from _pages(listing, namespace=namespace, chunk=chunk)


def inventory(
    api: client.ApiClient,
    *,
    namespace: str | None = None,
    chunk: int = CHUNK,
    ledger_namespace: str = reservations.LEDGER_NAMESPACE,
) -> scan.Inventory:
    """Pods, workloads (of `namespace`, or all namespaces), every Node, the ledger Leases, and the Namespaces' labels."""
    return scan.Inventory.of(objects(api, namespace=namespace, chunk=chunk, ledger_namespace=ledger_namespace))


def dra_objects(api: client.ApiClient, *, namespace: str | None = None, chunk: int = CHUNK) -> list[dict[str, Any]]:
    """Dynamic Resource Allocation (`policies.gpu.dra`): the ResourceClaims and ResourceClaimTemplates of
    `namespace` (None: all) for GPU011, and on whole-cluster audits the ResourceSlices for the card
    states (GPU216). A cluster that does not serve `resource.k8s.io/v1` has none of them; one whose
    role may not list them still gets the audit, with a warning."""
    raw = _Raw(api)
    prefix = f"/apis/{dra.GROUP}/{dra.VERSION}"
    listings = [
        _Listing(
            kind=kind,
            api_version=f"{dra.GROUP}/{dra.VERSION}",
            all_namespaces=raw.lister(f"{prefix}/{plural}"),
            namespaced=raw.namespaced(plural, prefix=prefix),
        )
        for kind, plural in (("ResourceClaim", "resourceclaims"), ("ResourceClaimTemplate", "resourceclaimtemplates"))
    ]
    if namespace is None:
        listings.append(
            _Listing(
                kind="ResourceSlice",
                api_version=f"{dra.GROUP}/{dra.VERSION}",
                all_namespaces=raw.lister(f"{prefix}/resourceslices"),
                namespaced=None,
            )
        )
    found: list[dict[str, Any]] = []
    for listing in listings:
        try:
            found.extend(_pages(listing, namespace=namespace, chunk=chunk))
        except kube_errors.NotFound:
            return []  # the API is not served: nothing can be claimed through it
        except kube_errors.KubeError as error:
            log.warning("%s objects not read; DRA claims and the cards they hold are not judged: %s", listing.kind, error)
    return found


def ledger_leases(
    api: client.ApiClient, *, namespace: str = reservations.LEDGER_NAMESPACE, chunk: int = CHUNK
) -> list[dict[str, Any]]:
    """The nodes' ledger Leases in the ledger namespace (by their label), paged.

    Only this namespace is listed: a Lease elsewhere is never a ledger. Whoever may not list them (a
    403: a role from before the ledger moved off the Node) still gets the audit, with a warning:
    the ledgers are then the Node annotations' only.
    """
    coordination: Any = client.CoordinationV1Api(api)
    listing = _Listing(
        kind="Lease",
        api_version="coordination.k8s.io/v1",
        all_namespaces=coordination.list_namespaced_lease,
        namespaced=coordination.list_namespaced_lease,
    )
    try:
        return list(
            _pages(
                listing,
                namespace=namespace,
                chunk=chunk,
                label_selector=f"{reservations.LEDGER_LABEL}=true",
                what=f"cannot list the ledger Leases in namespace {namespace}",
            )
        )
    except kube_errors.KubeError as error:
        log.warning("reservation ledger Leases not read, GPU203/GPU212 and card states see the Node annotations only: %s", error)
        return []


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
        except kube_errors.KubeError as error:
            log.warning("%s objects not listed, GPU211 does not cover them: %s", kind, error)
            continue
        found.extend(listed)
    return found


def _namespaces(api: client.ApiClient, *, chunk: int) -> list[dict[str, Any]]:
    """Every Namespace, for the labels namespace overrides select on (as the webhook sees them).

    Whoever may list pods but not Namespaces still gets the audit, with a warning: each namespace
    then has only its name label, as in the webhook without its cluster context.
    """
    listing = _listing(_Raw(api), "Namespace", "v1", "namespaces", namespaced=False)
    try:
        return list(_pages(listing, namespace=None, chunk=chunk))
    except kube_errors.KubeError as error:
        log.warning("namespace labels unknown, overrides that select on them will not match: %s", error)
        return []


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
        reports = _Listing(
            kind="PolicyReport",
            api_version=report.API_VERSION,
            all_namespaces=functools.partial(custom.list_cluster_custom_object, report.GROUP, report.VERSION, "policyreports"),
            namespaced=None,
        )
    else:
        reports = _Listing(
            kind="PolicyReport",
            api_version=report.API_VERSION,
            all_namespaces=functools.partial(
                custom.list_namespaced_custom_object, report.GROUP, report.VERSION, namespace, "policyreports"
            ),
            namespaced=None,
        )
    for item in _pages(reports, namespace=None, chunk=CHUNK, label_selector=selector, what=what):
        metadata = item.get("metadata") or {}
        if per_resource:
            found[(str(metadata.get("namespace", "")), str(metadata.get("name", "")))] = item
        elif metadata.get("name") == report.NAME:
            found[str(metadata.get("namespace", ""))] = item
    if cluster:
        cluster_reports = _Listing(
            kind="ClusterPolicyReport",
            api_version=report.API_VERSION,
            all_namespaces=functools.partial(
                custom.list_cluster_custom_object, report.GROUP, report.VERSION, "clusterpolicyreports"
            ),
            namespaced=None,
        )
        what = "cannot list ClusterPolicyReports (are the CRDs of deploy/crds/ applied?)"
        for item in _pages(cluster_reports, namespace=None, chunk=CHUNK, label_selector=selector, what=what):
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
                _call(
                    f"cannot delete {where}",
                    lambda: custom.delete_namespaced_custom_object(report.GROUP, report.VERSION, step.namespace, plural, name),
                )
            else:
                _call(
                    f"cannot delete {where}",
                    lambda: custom.delete_cluster_custom_object(report.GROUP, report.VERSION, plural, name),
                )
        except kube_errors.NotFound:
            pass  # already gone is what we wanted
        return
    body: dict[str, Any] = json.loads(json.dumps(step.body))
    if step.verb is report.Verb.CREATE:
        if step.namespace:
            try:
                _call(
                    f"cannot create {where}",
                    lambda: custom.create_namespaced_custom_object(report.GROUP, report.VERSION, step.namespace, plural, body),
                    idempotent=False,
                )
            except kube_errors.KubeError as error:
                if not _terminating(error):
                    raise
                # A namespace being deleted takes no new objects; its pods (and our report) go with it.
                log.warning("not writing %s: the namespace is being deleted", where)
        else:
            _call(
                f"cannot create {where}",
                lambda: custom.create_cluster_custom_object(report.GROUP, report.VERSION, plural, body),
                idempotent=False,
            )
        return
    body["metadata"]["resourceVersion"] = step.resource_version  # guards the replace: a repeat that lost is a 409
    if step.namespace:
        _call(
            f"cannot replace {where}",
            lambda: custom.replace_namespaced_custom_object(report.GROUP, report.VERSION, step.namespace, plural, name, body),
        )
    else:
        _call(
            f"cannot replace {where}",
            lambda: custom.replace_cluster_custom_object(report.GROUP, report.VERSION, plural, name, body),
        )


def _terminating(error: kube_errors.KubeError) -> bool:
    """Whether the apiserver refused a create because the namespace is being deleted (403,
    NamespaceTerminating), which a cluster-wide audit meets whenever a namespace goes away."""
    return error.status == 403 and "because it is being terminated" in str(error)


def apply(api: client.ApiClient, steps: list[report.Step]) -> int:
    """Carry out a write plan; returns the number of writes. A replace that lost a race is retried once
    against the newer version (and dropped if that one already says the same)."""
    custom: Any = client.CustomObjectsApi(api)
    for step in steps:
        try:
            _write(custom, step)
        except kube_errors.Conflict:
            if step.body is None:
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
            found = _call(
                f"cannot read {name}",
                lambda: custom.get_namespaced_custom_object(report.GROUP, report.VERSION, namespace, "policyreports", name),
            )
        else:
            found = _call(
                f"cannot read {name}",
                lambda: custom.get_cluster_custom_object(report.GROUP, report.VERSION, "clusterpolicyreports", name),
            )
    except kube_errors.NotFound:
        return None
    return found if isinstance(found, Mapping) else None
