"""The bind path's requests on the event loop (`native`, issue 19): the same requests, credentials,
TLS and errors as through the `kubernetes` client, against a local server."""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import pathlib
import ssl
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import test_utils, web

from certs import authority
from webhook.certificates import certfiles
from webhook.extender import kube, native, store
from webhook.kube import client as kube_client
from webhook.kube import errors

NOW = datetime.datetime.now(datetime.UTC)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Recorder:
    """A stand-in apiserver: answers from a script (status, body, headers) per request, records each request."""

    def __init__(self, *answers: tuple[int, dict[str, Any], dict[str, str]]) -> None:
        self.answers = list(answers)
        self.seen: list[dict[str, Any]] = []

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        peer = request.transport.get_extra_info("peercert") if request.transport is not None else None
        self.seen.append(
            {
                "method": request.method,
                "path": request.path,
                "query": list(request.query.items()),
                "headers": dict(request.headers),
                "body": json.loads(body) if body else None,
                "peer": peer,
            }
        )
        status, answer, headers = self.answers.pop(0)
        return web.Response(status=status, body=json.dumps(answer).encode(), content_type="application/json", headers=headers)

    def app(self) -> web.Application:
        application = web.Application()
        application.router.add_route("*", "/{tail:.*}", self.handle)
        return application


def configuration(host: str, **settings: Any) -> Any:
    found = kube_client.Configuration()
    found.host = host
    for key, value in settings.items():
        setattr(found, key, value)
    return found


@pytest.fixture
async def served() -> AsyncIterator[Callable[..., Awaitable[tuple[Recorder, str]]]]:
    servers: list[test_utils.TestServer] = []

    async def start(
        *answers: tuple[int, dict[str, Any], dict[str, str]], context: ssl.SSLContext | None = None
    ) -> tuple[Recorder, str]:
        recorder = Recorder(*answers)
        server = test_utils.TestServer(recorder.app(), host="127.0.0.1", scheme="https" if context else "http")
        await server.start_server(ssl=context)
        servers.append(server)
        return recorder, f"{'https' if context else 'http'}://127.0.0.1:{server.port}"

    yield start
    for server in servers:
        await server.close()


def status(code: int, message: str, *, reason: str = "") -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason, "code": code}


OK_BINDING: tuple[int, dict[str, Any], dict[str, str]] = (
    201,
    {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201},
    {},
)


async def test_a_binding_is_the_same_request_as_through_the_client(served: Any) -> None:
    recorder, host = await served(OK_BINDING)
    api = kube.KubeApi(
        kube_client.ApiClient(), session=native.Session.of(configuration(host, api_key={"authorization": "Bearer tok"}))
    )
    try:
        await api.bind("team-a", "p0", uid="u-1", node="gpu-0", annotations={"ALIYUN_COM_GPU_MEM_IDX": "1"})
    finally:
        await api.close()
    (sent,) = recorder.seen
    assert (sent["method"], sent["path"]) == ("POST", "/api/v1/namespaces/team-a/pods/p0/binding")
    assert sent["headers"]["Authorization"] == "Bearer tok"
    assert sent["headers"]["Content-Type"] == "application/json"
    assert sent["body"] == {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "p0", "namespace": "team-a", "uid": "u-1", "annotations": {"ALIYUN_COM_GPU_MEM_IDX": "1"}},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-0"},
    }


async def test_a_lease_replace_carries_its_field_manager_and_returns_the_stored_object(served: Any) -> None:
    stored = {"metadata": {"name": "gpu-0", "resourceVersion": "8"}}
    recorder, host = await served((200, stored, {}))
    api = kube.KubeApi(kube_client.ApiClient(), session=native.Session.of(configuration(host)))
    try:
        assert await api.replace_lease("ledger", "gpu-0", {"metadata": {"name": "gpu-0", "resourceVersion": "7"}}) == stored
    finally:
        await api.close()
    (sent,) = recorder.seen
    assert (sent["method"], sent["path"], sent["query"]) == (
        "PUT",
        "/apis/coordination.k8s.io/v1/namespaces/ledger/leases/gpu-0",
        [("fieldManager", "gpu-admission-extender")],
    )
    assert "Authorization" not in sent["headers"], "no credentials configured: none sent"


async def test_refusals_become_the_kube_layers_errors_and_a_conflict_is_not_retried(served: Any) -> None:
    recorder, host = await served(
        (409, status(409, "the object has been modified"), {}),
        (404, status(404, 'pods "p" not found', reason="NotFound"), {}),
    )
    api = kube.KubeApi(kube_client.ApiClient(), session=native.Session.of(configuration(host)))
    try:
        with pytest.raises(errors.Conflict):
            await api.replace_lease("ledger", "gpu-0", {"metadata": {"resourceVersion": "7"}})
        with pytest.raises(errors.NotFound) as raised:
            await api.get_pod("a", "p")
    finally:
        await api.close()
    assert str(raised.value) == 'GET /api/v1/namespaces/a/pods/p: 404 Not Found: pods "p" not found'
    assert len(recorder.seen) == 2


async def test_a_read_is_tried_again_after_a_5xx_but_a_binding_only_after_a_429(served: Any) -> None:
    again = {"Retry-After": "0"}
    recorder, host = await served(
        (503, status(503, "busy"), again),
        (200, {"metadata": {"name": "p"}}, {}),  # GET: retried
        (429, status(429, "slow down"), again),
        OK_BINDING,  # Binding: a 429 is retried (refused before it ran)
        (503, status(503, "busy"), again),  # Binding: a 5xx is not (it may have been made)
    )
    api = kube.KubeApi(kube_client.ApiClient(), session=native.Session.of(configuration(host)))
    try:
        assert await api.get_pod("a", "p") == {"metadata": {"name": "p"}}
        await api.bind("a", "p", uid="u", node="n", annotations={})
        with pytest.raises(errors.ServerError):
            await api.bind("a", "p", uid="u", node="n", annotations={})
    finally:
        await api.close()
    assert [s["method"] for s in recorder.seen] == ["GET", "GET", "POST", "POST", "POST"]


async def test_no_answer_is_unreachable() -> None:
    with socket_nobody_listens_on() as port:
        api = kube.KubeApi(kube_client.ApiClient(), session=native.Session.of(configuration(f"http://127.0.0.1:{port}")))
        try:
            with pytest.raises(errors.Unreachable) as raised:
                await api.bind("a", "p", uid="u", node="n", annotations={})
        finally:
            await api.close()
    assert str(raised.value).startswith("POST /api/v1/namespaces/a/pods/p/binding: ")


def socket_nobody_listens_on() -> Any:
    import contextlib
    import socket

    @contextlib.contextmanager
    def held() -> Any:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))  # bound, never listening: a connect is refused
        try:
            yield sock.getsockname()[1]
        finally:
            sock.close()

    return held()


async def test_tls_with_the_kubeconfigs_ca_and_client_certificate(served: Any, tmp_path: pathlib.Path) -> None:
    server_ca, client_ca = authority.issue_ca(now=NOW), authority.issue_ca(now=NOW)
    serving = authority.issue_serving(server_ca, hosts=["127.0.0.1"], now=NOW)
    user = authority.issue_client(client_ca, common_name="gpu-admission-extender", now=NOW)
    for name, data in (
        ("ca.crt", server_ca.certificate_pem),
        ("client-ca.crt", client_ca.certificate_pem),
        ("tls.crt", serving.certificate_pem),
        ("tls.key", serving.key_pem),
        ("user.crt", user.certificate_pem),
        ("user.key", user.key_pem),
    ):
        certfiles.write_atomically(tmp_path / name, data, mode=0o600)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(tmp_path / "client-ca.crt"))
    context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    context.verify_mode = ssl.CERT_REQUIRED  # as the apiserver with a client CA: no certificate, no handshake
    recorder, host = await served((200, {"metadata": {"name": "gpu-0"}}, {}), context=context)
    settings = configuration(
        host, ssl_ca_cert=str(tmp_path / "ca.crt"), cert_file=str(tmp_path / "user.crt"), key_file=str(tmp_path / "user.key")
    )
    api = kube.KubeApi(kube_client.ApiClient(), session=native.Session.of(settings))
    try:
        assert await api.get_lease("ledger", "gpu-0") == {"metadata": {"name": "gpu-0"}}
    finally:
        await api.close()
    subject = dict(pair[0] for pair in recorder.seen[0]["peer"]["subject"])
    assert subject["commonName"] == "gpu-admission-extender"

    # A server certificate from another CA is refused, as the client would.
    wrong = configuration(
        host,
        ssl_ca_cert=str(tmp_path / "client-ca.crt"),
        cert_file=str(tmp_path / "user.crt"),
        key_file=str(tmp_path / "user.key"),
    )
    stranger = kube.KubeApi(kube_client.ApiClient(), session=native.Session.of(wrong))
    try:
        with pytest.raises(errors.Unreachable):
            await stranger.get_lease("ledger", "gpu-0")
    finally:
        await stranger.close()


async def test_a_refreshing_credential_is_asked_off_the_event_loop_and_not_on_every_request(served: Any) -> None:
    recorder, host = await served((200, {}, {}), (200, {}, {}))
    calls: list[str] = []

    def refresh(config: Any) -> None:
        calls.append(threading.current_thread().name)
        config.api_key = {"authorization": f"Bearer t{len(calls)}"}

    settings = configuration(host, api_key={"authorization": "Bearer old"}, refresh_api_key_hook=refresh)
    api = kube.KubeApi(kube_client.ApiClient(), session=native.Session.of(settings))
    try:
        await api.get_pod("a", "p")
        await api.get_pod("a", "q")
    finally:
        await api.close()
    assert [s["headers"]["Authorization"] for s in recorder.seen] == ["Bearer t1", "Bearer t1"]
    assert len(calls) == 1 and calls[0] != threading.current_thread().name


@pytest.mark.parametrize(
    ("settings", "supported"),
    [
        ({}, True),
        ({"verify_ssl": False}, True),
        ({"proxy": "http://proxy.example:3128"}, False),
        ({"assert_hostname": "apiserver.example"}, False),
    ],
    ids=["plain", "insecure-skip-tls-verify", "proxy", "asserted-hostname"],
)
def test_configurations_it_does_not_reproduce_keep_the_clients_path(settings: dict[str, Any], supported: bool) -> None:
    assert (native.Session.of(configuration("https://127.0.0.1:6443", **settings)) is not None) == supported


# --- watches on the event loop ----------------------------------------------------------------------


class Streaming:
    """A stand-in apiserver for list + watch: each list answers the next of `lists` (the last one
    again and again); each watch streams the next of `streams` (one chunk per event) and ends."""

    def __init__(self, lists: dict[str, list[list[dict[str, Any]]]], streams: dict[str, list[list[dict[str, Any]]]]) -> None:
        self.lists, self.streams = lists, streams
        self.calls: list[tuple[str, str]] = []  # (path, "list" or the watch's resourceVersion)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            self.calls.append((request.path, "list"))
            answers = self.lists.get(request.path, [[]])
            items = answers.pop(0) if len(answers) > 1 else answers[0]
            return web.json_response({"metadata": {"resourceVersion": "10"}, "items": items})
        self.calls.append((request.path, request.query["resourceVersion"]))
        response = web.StreamResponse()
        response.content_type = "application/json"
        response.enable_chunked_encoding()
        await response.prepare(request)
        streams = self.streams.get(request.path, [])
        for event in streams.pop(0) if streams else []:
            await response.write(json.dumps(event).encode() + b"\n")
        if not streams:
            await asyncio.sleep(5)  # nothing more: an idle watch
        await response.write_eof()
        return response

    def app(self) -> web.Application:
        application = web.Application()
        application.router.add_route("*", "/{tail:.*}", self.handle)
        return application


class Recording(store.Store):
    """A Store that records what the watcher did to it, and on which thread."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[tuple[str, str, object]] = []
        self.threads: set[str] = set()

    def replace_pods(self, items: Any) -> None:
        items = list(items)
        self.steps.append(("Pod", "replace", len(items)))
        self.threads.add(threading.current_thread().name)
        super().replace_pods(items)

    def seen(self, kind: str, version: str) -> None:
        self.steps.append((kind, "seen", version))
        super().seen(kind, version)

    def apply(self, kind: str, event: str, obj: Any) -> None:
        self.steps.append((kind, event, obj["metadata"]["resourceVersion"]))
        self.threads.add(threading.current_thread().name)
        super().apply(kind, event, obj)


def watched_pod(name: str, version: str, *, node: str = "") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "a", "uid": f"uid-{name}", "resourceVersion": version},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": {"aliyun.com/gpu-mem": "1"}}}]},
    }


async def test_the_watches_run_on_the_event_loop_and_fill_the_store(make_node: Any) -> None:
    big = make_node("gpu-0", count=2, annotations={"example.com/large": "x" * 200_000})  # one line far past 64 KiB
    source = Streaming(
        lists={"/api/v1/pods": [[watched_pod("p0", "9")], [watched_pod("p0", "12", node="gpu-0"), watched_pod("p1", "16")]]},
        streams={
            "/api/v1/nodes": [[{"type": "ADDED", "object": {**big, "metadata": {**big["metadata"], "resourceVersion": "11"}}}]],
            "/api/v1/pods": [
                [
                    {"type": "MODIFIED", "object": watched_pod("p0", "12", node="gpu-0")},
                    {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}},
                ],
                [
                    {
                        "type": "ERROR",
                        "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version"},
                    }
                ],
            ],
        },
    )
    server = test_utils.TestServer(source.app(), host="127.0.0.1")
    await server.start_server()
    settings = configuration(f"http://127.0.0.1:{server.port}")
    api = kube.KubeApi(kube_client.ApiClient(settings), session=native.Session.of(settings))
    cache = Recording()
    watcher = kube.Watcher(api, cache, loop=asyncio.get_running_loop())
    try:
        assert api.streams_on_the_loop
        watcher.start()
        assert not watcher._threads, "no watch thread"
        for _ in range(1000):
            if cache.pod("uid-p1") is not None and cache.node("gpu-0") is not None:
                break
            await asyncio.sleep(0.005)
    finally:
        watcher.stop()
        await api.close()
        await server.close()
    assert cache.synced
    assert cache.node("gpu-0") is not None, "the 200 kB Node event arrived whole"
    assert [step for step in cache.steps if step[0] == "Pod"][:4] == [
        ("Pod", "replace", 1),
        ("Pod", "seen", "10"),
        ("Pod", "MODIFIED", "12"),
        ("Pod", "seen", "15"),
    ], "listed, then the watch's event and its bookmark, in order, on the loop"
    assert ("Pod", "replace", 2) in cache.steps, "the 410 relisted"
    assert threading.current_thread().name in cache.threads and len(cache.threads) == 1, "every store write on the loop's thread"
    pods = [call for path, call in source.calls if path == "/api/v1/pods"]
    # listed at 10, watched from 10; resumed from the bookmark's 15 when that stream ended; the 410 relisted
    assert pods[:4] == ["list", "10", "15", "list"]
    assert cache.pod("uid-p1") is not None, "the relist's pods are in"


async def test_a_ledger_write_never_waits_for_a_connection_behind_binds() -> None:
    """The lanes: with every bind connection busy (a limit of one, held by a Binding the apiserver
    has not answered), a ledger Lease write still goes out and comes back at once."""
    release = asyncio.Event()
    seen: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append(f"{request.method} {request.path}")
        if request.path.endswith("/binding"):
            await release.wait()
            return web.json_response({"kind": "Status", "status": "Success", "code": 201}, status=201)
        return web.json_response({"metadata": {"name": "gpu-0", "resourceVersion": "8"}})

    application = web.Application()
    application.router.add_route("*", "/{tail:.*}", handle)
    server = test_utils.TestServer(application, host="127.0.0.1")
    await server.start_server()
    api = kube.KubeApi(
        kube_client.ApiClient(), session=native.Session.of(configuration(f"http://127.0.0.1:{server.port}"), limit=1)
    )
    try:
        bind = asyncio.create_task(api.bind("team-a", "p0", uid="u-1", node="gpu-0", annotations={}))
        while not seen:
            await asyncio.sleep(0.01)
        stored = await asyncio.wait_for(
            api.replace_lease("ledger", "gpu-0", {"metadata": {"name": "gpu-0", "resourceVersion": "7"}}), timeout=5
        )
        assert stored["metadata"]["resourceVersion"] == "8"
        assert not bind.done(), "the Binding is still unanswered: the write did not wait for its connection"
        release.set()
        await asyncio.wait_for(bind, timeout=5)
    finally:
        release.set()
        await api.close()
        await server.close()
    assert seen == [
        "POST /api/v1/namespaces/team-a/pods/p0/binding",
        "PUT /apis/coordination.k8s.io/v1/namespaces/ledger/leases/gpu-0",
    ]


async def test_at_debug_level_a_wait_for_a_connection_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=native.log.name)

    async def handle(request: web.Request) -> web.Response:
        await asyncio.sleep(0.1)
        return web.json_response({"kind": "Status", "status": "Success", "code": 201}, status=201)

    application = web.Application()
    application.router.add_route("*", "/{tail:.*}", handle)
    server = test_utils.TestServer(application, host="127.0.0.1")
    await server.start_server()
    api = kube.KubeApi(
        kube_client.ApiClient(), session=native.Session.of(configuration(f"http://127.0.0.1:{server.port}"), limit=1)
    )
    try:
        await asyncio.gather(*(api.bind("team-a", f"p{i}", uid=f"u-{i}", node="gpu-0", annotations={}) for i in range(2)))
    finally:
        await api.close()
        await server.close()
    waits = [r.getMessage() for r in caplog.records if "for a connection" in r.getMessage()]
    assert len(waits) == 1 and int(waits[0].split()[1]) >= 50, waits
