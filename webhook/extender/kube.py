"""The kubernetes client adapter: `api.Api` over the sync `kubernetes` client, and a list+watch
feeding the `store.Store`.

Requests go through `ApiClient.param_serialize`/`call_api`, so authentication (client
certificates, bearer tokens with refresh, exec plugins) is the client's, but bodies stay plain
JSON: no model classes on the way in or out, which is both faster and keeps `Any` inside this
module. Where `native.Session.of` reproduces the client's configuration (the usual case), the
bind path's requests and the three watches (Nodes, Pods, the ledger Leases) run on the event loop
over that aiohttp session instead (issue 19); lists still page through the client in a worker
thread. Otherwise blocking calls run in threads (`asyncio.to_thread`) and each watch owns a thread.

Failures are `webhook.kube.errors` types (`KubeError`, `Conflict`, `NotFound`, ...), made by
`errors.translate` from the raw answer. Reads and the guarded ledger writes (a Lease's create,
its replace at a resourceVersion) are
retried briefly on 429, 5xx and lost connections (`READS`: the scheduler waits on a bind); the
Binding's create only on 429. `KubeApi.request` retries GETs only unless told otherwise: a 429 to
an eviction is a PodDisruptionBudget's refusal, not a busy apiserver.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import threading
import urllib.parse
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping, Sequence
from typing import Any

import orjson

from policies import gpu
from policies.gpu import dra, reservations
from webhook import kube
from webhook.extender import native
from webhook.extender import store as store_module
from webhook.kube import client as kube_client
from webhook.kube import errors as kube_errors
from webhook.kube import retry

log = logging.getLogger(__name__)

Object = dict[str, Any]
REQUEST_TIMEOUT_S = 15.0
WATCH_TIMEOUT_S = 290  # the apiserver closes watches at --min-request-timeout (1800 s) anyway
LIST_PAGE = 500
# Apiserver requests at once per lane (`native`). In a 1,000-pod backlog on a loaded machine
# (bench/extender_throughput.py) binds waited up to 0.66 s for one of 64 shared connections, ledger
# writes among them. With 200 per lane none waited, but in two of three runs the apiserver's own
# latency of the same writes rose and the binding p99 did not fall (the queue moved into the
# apiserver). So 64, with the ledger writes on a lane of their own: they no longer wait behind
# Bindings, and the apiserver sees at most 64 more at once.
POOL_SIZE = 64
FIELD_MANAGER = "gpu-admission-extender"
_MERGE_PATCH = "application/merge-patch+json"
READS = retry.Backoff(attempts=3, base_s=0.1, cap_s=1.0, max_wait_s=2.0)


def load_client(kubeconfig: str | None, *, context: str | None = None) -> kube_client.ApiClient:
    """An ApiClient for `kubeconfig` (and its `context`); without one, in-cluster config, else the default kubeconfig."""
    return kube.api_client(kubeconfig, pool_size=POOL_SIZE, context=context)


class KubeApi:
    """`api.Api` against a real apiserver, plus the blocking list/watch calls the watcher uses."""

    def __init__(
        self, client: kube_client.ApiClient, *, timeout: float = REQUEST_TIMEOUT_S, session: native.Session | None = None
    ) -> None:
        self._client = client
        self._timeout = timeout
        # With a session, the bind path's requests (`api.Api`) run on the event loop (`native`);
        # lists and watches stay on the client's blocking path, in threads.
        self._session = session

    async def close(self) -> None:
        """Close the event-loop session, if any (the blocking client's pool stays the caller's)."""
        if self._session is not None:
            await self._session.close()

    # --- api.Api ---

    async def get_pod(self, namespace: str, name: str) -> Object:
        return await self._request_async("GET", _pod_path(namespace, name), idempotent=True)

    async def get_node(self, name: str) -> Object:
        return await self._request_async("GET", f"/api/v1/nodes/{_quote(name)}", idempotent=True)

    async def list_node_pods(self, node: str, *, at_least: str = "") -> list[Object]:
        items, _ = await asyncio.to_thread(self.list, "/api/v1/pods", field_selector=f"spec.nodeName={node}", at_least=at_least)
        return items

    async def list_namespace_pods(self, namespace: str, *, at_least: str = "") -> list[Object]:
        """Every pod of a namespace (a GPU budget's), as of `at_least` or later (quorum without)."""
        items, _ = await asyncio.to_thread(self.list, f"/api/v1/namespaces/{_quote(namespace)}/pods", at_least=at_least)
        return items

    async def list_budgets(self) -> list[Object]:
        """Every PodDisruptionBudget (the preempt verb's tie-break; preemption is rare, so no watch)."""
        items, _ = await asyncio.to_thread(self.list, "/apis/policy/v1/poddisruptionbudgets")
        return items

    async def get_lease(self, namespace: str, name: str) -> Object:
        return await self._request_async("GET", _lease_path(namespace, name), idempotent=True, lane=native.LEDGER)

    async def create_lease(self, namespace: str, body: Mapping[str, Any]) -> Object:
        # A create is its own precondition: a repeat whose first answer was lost is a 409 AlreadyExists,
        # which the binder treats as any lost race (read again).
        return await self._request_async(
            "POST",
            _lease_path(namespace, ""),
            body=body,
            query=[("fieldManager", FIELD_MANAGER)],
            idempotent=True,
            lane=native.LEDGER,
        )

    async def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> Object:
        return await self._request_async(  # guarded by the body's resourceVersion: a repeat that lost is a 409
            "PUT",
            _lease_path(namespace, name),
            body=body,
            query=[("fieldManager", FIELD_MANAGER)],
            idempotent=True,
            lane=native.LEDGER,
        )

    async def stamp_node(self, node: str, stamp: str) -> None:
        """Set the Node's `gpu-admission.io/ledger-freed` annotation (`nudge`): a merge patch of that
        one key, the only Node write the extender makes."""
        body = {"metadata": {"annotations": {gpu.LEDGER_FREED_ANNOTATION: stamp}}}
        await self._request_async(  # the same stamp twice is harmless
            "PATCH",
            f"/api/v1/nodes/{_quote(node)}",
            body=body,
            content_type="application/merge-patch+json",
            query=[("fieldManager", FIELD_MANAGER)],
            idempotent=True,
        )

    async def bind(self, namespace: str, name: str, *, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "annotations": dict(annotations)},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        # A create: retried on 429 only (a Binding whose answer was lost may have been made).
        await self._request_async("POST", _pod_path(namespace, name) + "/binding", body=body, idempotent=False)

    async def _request_async(
        self,
        method: str,
        path: str,
        *,
        idempotent: bool,
        query: Sequence[tuple[str, str]] = (),
        body: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        lane: str = native.REQUESTS,
    ) -> Object:
        if self._session is None:
            return await retry.call_async(
                lambda: self._request_once(method, path, query=query, body=body, content_type=content_type),
                what=f"{method} {path}",
                idempotent=idempotent,
                backoff=READS,
            )
        # `retry.call_async`'s rule, each try on the event loop.
        what = f"{method} {path}"
        encoded = orjson.dumps(body) if body is not None else None
        tries = 0
        while True:
            tries += 1
            try:
                return await self._native_once(
                    method, path, query=query, body=encoded, content_type=content_type, what=what, lane=lane
                )
            except kube_errors.KubeError as error:
                wait = (
                    READS.wait_s(tries, error, jitter=random.random())
                    if tries < READS.attempts and retry.retryable(error, idempotent=idempotent)
                    else None
                )  # noqa: S311 - jitter
                if wait is None:
                    raise
                log.info("uid=- %s; try %d of %d in %.2f s", error, tries + 1, READS.attempts, wait)
            await asyncio.sleep(wait)

    async def _native_once(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]],
        body: bytes | None,
        content_type: str,
        what: str,
        lane: str,
    ) -> Object:
        assert self._session is not None
        answer = await self._session.request(
            method,
            path,
            query=query,
            body=body,
            content_type=content_type,
            timeout=self._timeout,
            what=what,
            lane=lane,
        )
        if not 200 <= answer.status < 300:
            raise kube_errors.translate(
                kube_errors.Answer(status=answer.status, body=answer.body, reason=answer.reason, headers=answer.headers),
                what=what,
            )
        try:
            decoded = _loads(answer.body)
        except ValueError as error:
            raise kube_errors.KubeError(
                f"{what}: the apiserver answered something that is not JSON", status=answer.status
            ) from error
        if not isinstance(decoded, dict):
            raise kube_errors.KubeError(f"{what}: unexpected answer", status=answer.status)
        return decoded

    # --- blocking calls ---

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        idempotent: bool | None = None,
        backoff: retry.Backoff | None = None,
    ) -> Object:
        """The decoded JSON answer, or ApiError/Conflict/NotFound. A GET is tried again as
        `webhook.kube.retry` allows (`READS`); any other method once, unless ``idempotent`` and
        ``backoff`` say otherwise."""
        return retry.call(
            lambda: self._request_once(method, path, query=query, body=body, content_type=content_type),
            what=f"{method} {path}",
            idempotent=method == "GET" if idempotent is None else idempotent,
            backoff=backoff or (READS if method == "GET" else retry.ONCE),
        )

    def _request_once(
        self, method: str, path: str, *, query: Sequence[tuple[str, str]], body: Mapping[str, Any] | None, content_type: str
    ) -> Object:
        response = self._send(method, path, query=query, body=body, content_type=content_type, timeout=self._timeout)
        data = response.read()
        if not 200 <= response.status < 300:
            raise _error(response, data, f"{method} {path}")
        try:
            decoded = _loads(data)
        except ValueError as error:
            raise kube_errors.KubeError(
                f"{method} {path}: the apiserver answered something that is not JSON", status=response.status
            ) from error
        if not isinstance(decoded, dict):
            raise kube_errors.KubeError(f"{method} {path}: unexpected answer", status=response.status)
        return decoded

    def list(
        self, path: str, *, field_selector: str = "", label_selector: str = "", at_least: str = ""
    ) -> tuple[list[Object], str]:
        """Every item of a collection (paged), and the list's resourceVersion to watch from. With
        `at_least`, as of that resourceVersion or later, in one page (the apiserver's watch cache
        answers it without reading etcd; meant for small selections)."""
        items: list[Object] = []
        token = ""
        while True:
            query = (
                [("resourceVersion", at_least), ("resourceVersionMatch", "NotOlderThan")]
                if at_least
                else [("limit", str(LIST_PAGE))]
            )
            if field_selector:
                query.append(("fieldSelector", field_selector))
            if label_selector:
                query.append(("labelSelector", label_selector))
            if token:
                query.append(("continue", token))
            page = self.request("GET", path, query=query)  # each page retried on its own
            items.extend(i for i in page.get("items") or [] if isinstance(i, dict))
            metadata = page.get("metadata") or {}
            token = str(metadata.get("continue") or "")
            if not token:
                return items, str(metadata.get("resourceVersion", ""))

    def watch(
        self, path: str, *, resource_version: str, stopped: threading.Event, label_selector: str = ""
    ) -> Iterator[tuple[str, Object]]:
        """Watch events from `resource_version` until the server ends the watch or `stopped` is set."""
        query = _watch_query(resource_version, label_selector)
        response = self._send(
            "GET", path, query=query, body=None, content_type="application/json", timeout=(10.0, WATCH_TIMEOUT_S + 30.0)
        )
        if not 200 <= response.status < 300:
            raise _error(response, response.read(), f"watch {path}")
        raw = response.response
        try:
            pending = b""
            for chunk in raw.stream(amt=None, decode_content=False):
                if stopped.is_set():
                    return
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        event = _loads(line)
                        yield str(event.get("type", "")), event.get("object") or {}
        finally:
            with contextlib.suppress(Exception):
                raw.release_conn()

    @property
    def streams_on_the_loop(self) -> bool:
        """Whether `watch_async` is available (the event-loop session exists)."""
        return self._session is not None

    async def watch_async(
        self, path: str, *, resource_version: str, label_selector: str = ""
    ) -> AsyncGenerator[tuple[str, Object], None]:
        """`watch` on the event loop (needs the session): each event decoded as it comes, no thread."""
        assert self._session is not None
        query = _watch_query(resource_version, label_selector)
        lines = self._session.lines(path, query=query, read_timeout=WATCH_TIMEOUT_S + 30.0, what=f"watch {path}")
        async with contextlib.aclosing(lines):
            async for line in lines:
                event = _loads(line)
                yield str(event.get("type", "")), event.get("object") or {}

    def _send(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]],
        body: Mapping[str, Any] | None,
        content_type: str,
        timeout: float | tuple[float, float],
    ) -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        try:
            serialized = self._client.param_serialize(
                method=method,
                resource_path=path,
                query_params=list(query),
                header_params=headers,
                body=dict(body) if body is not None else None,
                auth_settings=["BearerToken"],
            )
            return self._client.call_api(*serialized, _request_timeout=timeout)
        except Exception as error:  # the client's TLS failures (status 0), urllib3 connection and timeout errors
            raise kube_errors.translate(error, what=f"{method} {path}") from error

    # --- the budget gate (`gates`) ---

    async def json_patch_pod(self, namespace: str, name: str, operations: Sequence[Mapping[str, Any]]) -> Object:
        """`api.Api.json_patch_pod`, tried once: a repeat whose first answer was lost fails its
        `test` (the gate is gone) and changes nothing, and the gatekeeper's next pass looks again."""
        path = _pod_path(namespace, name)
        body = [dict(operation) for operation in operations]
        query = [("fieldManager", FIELD_MANAGER)]
        what = f"PATCH {path}"
        if self._session is not None:
            return await self._native_once(
                "PATCH", path, query=query, body=orjson.dumps(body), content_type=_JSON_PATCH, what=what, lane=native.REQUESTS
            )
        return await asyncio.to_thread(self._json_patch_once, path, body, query)

    def _json_patch_once(self, path: str, body: Sequence[Mapping[str, Any]], query: Sequence[tuple[str, str]]) -> Object:
        """A JSON patch on the client's blocking path (`_send` takes mapping bodies only)."""
        what = f"PATCH {path}"
        try:
            serialized = self._client.param_serialize(
                method="PATCH",
                resource_path=path,
                query_params=list(query),
                header_params={"Accept": "application/json", "Content-Type": _JSON_PATCH},
                body=[dict(operation) for operation in body],
                auth_settings=["BearerToken"],
            )
            response: Any = self._client.call_api(*serialized, _request_timeout=self._timeout)
        except Exception as error:  # as `_send`
            raise kube_errors.translate(error, what=what) from error
        data = response.read()
        if not 200 <= response.status < 300:
            raise _error(response, data, what)
        decoded = _loads(data)
        if not isinstance(decoded, dict):
            raise kube_errors.KubeError(f"{what}: unexpected answer", status=response.status)
        return decoded

    async def create_event(self, namespace: str, body: Mapping[str, Any]) -> Object:
        # A create, not repeated on an error: a lost Event only costs an explanation.
        path = f"/api/v1/namespaces/{_quote(namespace)}/events"
        return await self._request_async("POST", path, body=body, idempotent=False)


class Watcher:
    """Keeps a Store in step with the apiserver: list, then watch, relisting after any failure.
    Three watches: Nodes, Pods, and the ledger Leases in `namespace` (label
    `gpu-admission.io/ledger=true`). With the event-loop session (`KubeApi.streams_on_the_loop`)
    each watch is a task on the loop, which applies its events as they are decoded (issue 19: no
    hand-over between threads per event, and aiohttp's C parser for the chunked stream); the lists
    still run in a worker thread, a page at a time. Without it, each watch owns a thread."""

    def __init__(
        self,
        kube: KubeApi,
        cache: store_module.Store,
        *,
        loop: asyncio.AbstractEventLoop,
        namespace: str = reservations.LEDGER_NAMESPACE,
    ) -> None:
        self._kube = kube
        self._store = cache
        self._loop = loop
        self._namespace = namespace
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._store.expect_dra()
        for kind, path, replace, selector in (
            ("Node", "/api/v1/nodes", self._store.replace_nodes, ""),
            ("Pod", "/api/v1/pods", self._store.replace_pods, ""),
            ("Lease", _lease_path(self._namespace, ""), self._store.replace_leases, LEDGER_SELECTOR),
            # Dynamic Resource Allocation: where the API is off these fail and retry at the back-off's
            # pace; the store counts no DRA holds meanwhile (`Store.synced` does not wait for them,
            # filter does: `Store.dra_synced`).
            ("ResourceSlice", dra.SLICES_PATH, self._store.replace_slices, ""),
            ("ResourceClaim", dra.CLAIMS_PATH, self._store.replace_claims, ""),
            # The namespaces' labels, for GPU budgets chosen by a namespaceSelector (`budgeting`).
            ("Namespace", "/api/v1/namespaces", self._store.replace_namespaces, ""),
        ):
            if self._kube.streams_on_the_loop:
                self._tasks.append(
                    self._loop.create_task(self._run_async(kind, path, replace, selector), name=f"watch {kind.lower()}s")
                )
                continue
            thread = threading.Thread(
                target=self._run, args=(kind, path, replace, selector), name=f"watch-{kind.lower()}s", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stopped.set()
        for task in self._tasks:
            task.cancel()

    async def _run_async(self, kind: str, path: str, replace: Callable[[list[Object]], None], selector: str) -> None:
        """`_run` as a task on the loop: the store is written directly, in the same order."""
        delay = 0.2
        while not self._stopped.is_set():
            try:
                items, version = await asyncio.to_thread(self._kube.list, path, label_selector=selector)
                replace(items)
                self._store.seen(kind, version)
                log.info("listed %d %ss", len(items), kind.lower())
                delay = 0.2
                while not self._stopped.is_set():
                    version = await self._watch_once_async(kind, path, version, selector)
            except _Expired:
                log.info("%s watch expired; relisting", kind.lower())
            except kube_errors.NotFound as error:
                if kind not in _OPTIONAL_KINDS:
                    raise
                self._store.not_served(kind)  # nothing to wait for: filter need not hold GPU pods back
                log.info("%s: %s is not served (%s); looking again in %.0f s", kind, path, error, OPTIONAL_RETRY_S)
                await asyncio.sleep(OPTIONAL_RETRY_S)
            except Exception as error:  # noqa: BLE001 - any failure means: back off, relist
                log.warning("%s watch failed (%s); relisting in %.1f s", kind.lower(), error, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    async def _watch_once_async(self, kind: str, path: str, version: str, selector: str = "") -> str:
        store = self._store
        events = self._kube.watch_async(path, resource_version=version, label_selector=selector)
        async with contextlib.aclosing(events):
            async for event, obj in events:
                if event == "ERROR":
                    failed = _error_event(obj, f"watch {path}")
                    if isinstance(failed, kube_errors.Gone):
                        raise _Expired
                    raise failed
                version = str((obj.get("metadata") or {}).get("resourceVersion", version))
                if event == "BOOKMARK":
                    store.seen(kind, version)  # how far the store is complete
                    continue
                store.apply(kind, event, obj)
        return version

    def _run(self, kind: str, path: str, replace: Callable[[list[Object]], None], selector: str) -> None:
        delay = 0.2
        while not self._stopped.is_set():
            try:
                items, version = self._kube.list(path, label_selector=selector)
                if not self._post(replace, items) or not self._post(self._store.seen, kind, version):
                    return
                log.info("listed %d %ss", len(items), kind.lower())
                delay = 0.2
                while not self._stopped.is_set():
                    version = self._watch_once(kind, path, version, selector)
            except _Expired:
                log.info("%s watch expired; relisting", kind.lower())
            except kube_errors.NotFound as error:
                if kind not in _OPTIONAL_KINDS:
                    raise
                self._store.not_served(kind)  # nothing to wait for: filter need not hold GPU pods back
                log.info("%s: %s is not served (%s); looking again in %.0f s", kind, path, error, OPTIONAL_RETRY_S)
                self._stopped.wait(OPTIONAL_RETRY_S)
            except Exception as error:  # noqa: BLE001 - any failure means: back off, relist
                log.warning("%s watch failed (%s); relisting in %.1f s", kind.lower(), error, delay)
                self._stopped.wait(delay)
                delay = min(delay * 2, 10.0)

    def _watch_once(self, kind: str, path: str, version: str, selector: str = "") -> str:
        for event, obj in self._kube.watch(path, resource_version=version, stopped=self._stopped, label_selector=selector):
            if event == "ERROR":
                failed = _error_event(obj, f"watch {path}")
                if isinstance(failed, kube_errors.Gone):
                    raise _Expired
                raise failed
            version = str((obj.get("metadata") or {}).get("resourceVersion", version))
            if event == "BOOKMARK":
                if not self._post(self._store.seen, kind, version):  # how far the store is complete
                    self._stopped.set()
                    break
                continue
            if not self._post(self._store.apply, kind, event, obj):
                self._stopped.set()
                break
        return version

    def _post(self, function: Callable[..., None], *args: Any) -> bool:
        try:
            self._loop.call_soon_threadsafe(function, *args)
        except RuntimeError:  # the loop is closed: the process is shutting down
            return False
        return True


# Watches of APIs a cluster may not serve (resource.k8s.io/v1 before Kubernetes 1.34, or switched
# off): a 404 is no failure, the watch looks again now and then and the store counts no DRA holds.
_OPTIONAL_KINDS = frozenset({"ResourceSlice", "ResourceClaim"})
OPTIONAL_RETRY_S = 300.0


class _Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): relist."""


def _loads(data: bytes) -> Any:
    """JSON from the apiserver. orjson decodes a pod's watch event in about 40% of json's time
    (32 vs 80 us for a 3.3 kB event here), and the watches decode every event of every pod and node
    (issue 19). What the apiserver writes is within what orjson reads exactly: UTF-8, and integers
    of Kubernetes' int32/int64 fields (orjson reads past 64 bits as a float; none are)."""
    return orjson.loads(data)


def _error(response: Any, data: bytes, what: str) -> kube_errors.KubeError:
    """The error of a raw answer with a failing status (``ApiClient.call_api`` does not raise)."""
    answer = kube_errors.Answer(
        status=int(response.status), body=data, reason=str(response.reason or ""), headers=response.headers or {}
    )
    return kube_errors.translate(answer, what=what)


def _error_event(obj: Mapping[str, Any], what: str) -> kube_errors.KubeError:
    """The error of a watch's ERROR event (its object is a metav1.Status)."""
    code = obj.get("code")
    answer = kube_errors.Answer(
        status=code if isinstance(code, int) else 0, body=json.dumps(obj), reason=str(obj.get("reason") or "")
    )
    return kube_errors.translate(answer, what=what)


LEDGER_SELECTOR = f"{reservations.LEDGER_LABEL}=true"


def list_dra(client: KubeApi) -> tuple[list[Object], list[Object], str]:
    """The ResourceSlices and the allocated ResourceClaims (`policies.gpu.dra`), and "" or why they could
    not be read: a cluster without the `resource.k8s.io/v1` API (before 1.34, or switched off) has
    none, and every card reads as not allocated by DRA."""
    try:
        slices, _ = client.list(dra.SLICES_PATH)
        claims, _ = client.list(dra.CLAIMS_PATH)
    except kube_errors.NotFound:
        return [], [], ""  # the API is not served: nothing can be allocated through it
    except kube_errors.KubeError as error:
        return [], [], f"cannot read ResourceSlices and ResourceClaims ({error}); cards allocated by DRA are not shown"
    return slices, [c for c in claims if dra.claim_results(c)], ""


def list_ledger_leases(client: KubeApi, namespace: str) -> list[Object]:
    """The ledger Leases in `namespace` (by their label; `reservations.lease_node` says which to trust)."""
    items, _ = client.list(_lease_path(namespace, ""), label_selector=LEDGER_SELECTOR)
    return items


def _lease_path(namespace: str, name: str) -> str:
    """A Lease's path; with an empty `name`, the namespace's Lease collection."""
    collection = f"/apis/coordination.k8s.io/v1/namespaces/{_quote(namespace)}/leases"
    return f"{collection}/{_quote(name)}" if name else collection


def _pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{_quote(namespace)}/pods/{_quote(name)}"


def _quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


def _watch_query(resource_version: str, label_selector: str) -> list[tuple[str, str]]:
    """A watch's query from `resource_version` (bookmarks on, the server's timeout), the same for
    the threaded and the event-loop watch."""
    query = [
        ("watch", "true"),
        ("resourceVersion", resource_version),
        ("allowWatchBookmarks", "true"),
        ("timeoutSeconds", str(WATCH_TIMEOUT_S)),
    ]
    if label_selector:
        query.append(("labelSelector", label_selector))
    return query


_JSON_PATCH = "application/json-patch+json"  # `KubeApi.json_patch_pod`
