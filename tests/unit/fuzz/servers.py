"""What the fuzz tests (and ``bench/fuzz_long.py``) run servers and send requests with.

Each app runs in a background thread with its own event loop (``ThreadServer``) so the hypothesis
tests can be plain synchronous functions that send one body at a time over a kept-alive TLS
connection (``Client``), with a deadline on every answer. ``MemoryApi`` is just enough apiserver
for the extender. ``FUZZ`` is the CI settings profile: deterministic, a few seconds per test.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import pathlib
import socket
import ssl
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web
from hypothesis import HealthCheck, settings

from webhook.kube import errors as kube_errors

# Deterministic in CI (the same examples every run, so a failure reproduces); bench/fuzz_long.py
# explores at random for as long as it is given.
settings.register_profile(
    "fuzz",
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
FUZZ = settings.get_profile("fuzz")
ANSWER_DEADLINE_S = 10.0  # "never hangs": every answer within this, or the test fails


class ThreadServer:
    """An aiohttp app served over TLS from a thread of its own, on a free port of 127.0.0.1."""

    def __init__(self, app: web.Application, *, context: ssl.SSLContext) -> None:
        self._loop = asyncio.new_event_loop()
        self._runner = web.AppRunner(app, access_log=None)
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(context,), daemon=True, name="fuzz-server")
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the fuzz server did not start")
        self.port: int = self._port

    def _run(self, context: ssl.SSLContext) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=context)
        self._loop.run_until_complete(site.start())
        self._port = self._runner.addresses[0][1]
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)


class Client:
    """One kept-alive HTTPS connection; reconnects when the server closed it."""

    def __init__(self, port: int, *, context: ssl.SSLContext) -> None:
        self.port = port
        self._context = context
        self._connection: http.client.HTTPSConnection | None = None

    def post(
        self, path: str, body: bytes, *, content_type: str | None = "application/json", method: str = "POST"
    ) -> tuple[int, bytes, float]:
        """(status, body, seconds) of one request; raises when no answer comes in time."""
        headers = {} if content_type is None else {"Content-Type": content_type}
        for attempt in (1, 2):
            if self._connection is None:
                self._connection = http.client.HTTPSConnection(
                    "127.0.0.1", self.port, context=self._context, timeout=ANSWER_DEADLINE_S
                )
            started = time.monotonic()
            try:
                self._connection.request(method, path, body=body, headers=headers)
                answer = self._connection.getresponse()
                data = answer.read()
            except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine, ssl.SSLError):
                # The server may close a connection after refusing a body (aiohttp does after a 413);
                # once on a fresh connection, then it is a failure.
                self.close()
                if attempt == 2:
                    raise
                continue
            if answer.getheader("Connection", "").lower() == "close":
                self.close()
            return answer.status, data, time.monotonic() - started
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def rss_bytes() -> int:
    """This process's resident memory (the in-process servers included)."""
    return int(pathlib.Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def raw_exchange(port: int, data: bytes, *, context: ssl.SSLContext, timeout: float = ANSWER_DEADLINE_S) -> bytes:
    """Send raw bytes over a fresh TLS connection and read until the server closes or answers."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as plain:
        with context.wrap_socket(plain, server_hostname="127.0.0.1") as sock:
            sock.sendall(data)
            chunks = []
            try:
                while True:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    if b"\r\n\r\n" in b"".join(chunks):
                        break
            except (TimeoutError, ssl.SSLError, ConnectionError):
                pass
            return b"".join(chunks)


# --- the extender, on an in-memory apiserver ------------------------------------------------------------


class MemoryApi:
    """Just enough apiserver for the extender's binder: two nodes, no pods, every bind a 404."""

    def __init__(self, nodes: Mapping[str, dict[str, Any]]) -> None:
        self.nodes = dict(nodes)

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        raise kube_errors.NotFound(f"pods {namespace}/{name} not found", status=404)

    async def get_node(self, name: str) -> dict[str, Any]:
        if name not in self.nodes:
            raise kube_errors.NotFound(f"nodes {name} not found", status=404)
        copied: dict[str, Any] = json.loads(json.dumps(self.nodes[name]))
        return copied

    async def list_node_pods(self, node: str, *, at_least: str = "") -> list[dict[str, Any]]:
        return []

    async def list_namespace_pods(self, namespace: str, *, at_least: str = "") -> list[dict[str, Any]]:
        return []

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any]:
        raise kube_errors.NotFound(f"leases {namespace}/{name} not found", status=404)

    async def create_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        raise kube_errors.Conflict("the fuzz apiserver refuses every write", status=409)

    async def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        raise kube_errors.Conflict("the fuzz apiserver refuses every write", status=409)

    async def bind(self, namespace: str, name: str, *, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        raise kube_errors.NotFound(f"pods {namespace}/{name} not found", status=404)

    async def json_patch_pod(self, namespace: str, name: str, operations: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        raise kube_errors.NotFound(f"pods {namespace}/{name} not found", status=404)

    async def create_event(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        raise kube_errors.Conflict("the fuzz apiserver refuses every write", status=409)


def gpu_node(name: str, *, mode: str = "cgpu", count: int = 2, gib: int = 16) -> dict[str, Any]:
    capacity = {"aliyun.com/gpu-mem": str(count * gib), "aliyun.com/gpu-count": str(count)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1", "labels": {"ack.node.gpu.schedule": mode}},
        "status": {"capacity": capacity, "allocatable": capacity},
    }
