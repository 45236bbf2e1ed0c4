"""Shared fixtures: TLS material from our own certs module, review/pod factories, a TLS webhook client."""

from __future__ import annotations

import copy
import datetime
import pathlib
import ssl
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import test_utils

from policies import settings as engine_settings
from webhook.admission import app as admission_app
from webhook.certificates import certfiles
from webhook.serving import tls

DATA = pathlib.Path(__file__).parent / "data"

PodFactory = Callable[..., dict[str, Any]]
ReviewFactory = Callable[..., dict[str, Any]]


@pytest.fixture(scope="session")
def data_dir() -> pathlib.Path:
    """``tests/data``: recorded reviews and manifests."""
    return DATA


@pytest.fixture(scope="session")
def tls_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """ca.crt, ca.key, tls.crt, tls.key for localhost and 127.0.0.1, issued by ``certs``."""
    out = tmp_path_factory.mktemp("tls")
    certfiles.generate(out_dir=out, hosts=("localhost", "127.0.0.1"), now=datetime.datetime.now(datetime.UTC))
    return out


@pytest.fixture(scope="session")
def server_ssl(tls_dir: pathlib.Path) -> ssl.SSLContext:
    return tls.server_context(cert_file=str(tls_dir / "tls.crt"), key_file=str(tls_dir / "tls.key"))


@pytest.fixture(scope="session")
def client_ssl(tls_dir: pathlib.Path) -> ssl.SSLContext:
    return tls.client_context(ca_file=str(tls_dir / "ca.crt"))


@pytest.fixture
def make_pod() -> PodFactory:
    """A Pod manifest; keyword arguments adjust the first container or the pod spec."""

    def factory(
        *,
        name: str = "trainer",
        namespace: str | None = "team-a",
        limits: dict[str, Any] | None = None,
        env: list[dict[str, Any]] | None = None,
        privileged: bool | None = None,
        node_selector: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        volumes: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        container: dict[str, Any] = {"name": "main", "image": "registry.example/trainer:1"}
        if limits is not None:
            container["resources"] = {"limits": copy.deepcopy(limits)}
        if env is not None:
            container["env"] = copy.deepcopy(env)
        if privileged is not None:
            container["securityContext"] = {"privileged": privileged}
        metadata: dict[str, Any] = {"name": name}
        if namespace is not None:
            metadata["namespace"] = namespace
        if annotations:
            metadata["annotations"] = dict(annotations)
        spec: dict[str, Any] = {"containers": [container]}
        if node_selector:
            spec["nodeSelector"] = dict(node_selector)
        if volumes:
            spec["volumes"] = copy.deepcopy(volumes)
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}

    return factory


@pytest.fixture
def make_review() -> ReviewFactory:
    """An AdmissionReview v1 request as kube-apiserver sends it for ``obj``."""

    def factory(
        obj: dict[str, Any] | None,
        *,
        uid: str | None = None,
        operation: str = "CREATE",
        namespace: str | None = None,
        old_object: dict[str, Any] | None = None,
        dry_run: bool = False,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        source = obj if obj is not None else old_object or {}
        kind = str(source.get("kind", "Pod"))
        group, _, version = str(source.get("apiVersion", "v1")).rpartition("/")
        metadata = source.get("metadata") or {}
        request: dict[str, Any] = {
            "uid": uid or str(uuid.uuid4()),
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": kind.lower() + "s"},
            "requestKind": {"group": group, "version": version, "kind": kind},
            "name": metadata.get("name", ""),
            "namespace": namespace if namespace is not None else metadata.get("namespace", "default"),
            "operation": operation,
            "userInfo": {"username": "alice", "uid": "u-1", "groups": ["system:authenticated"]},
            "object": obj,
            "oldObject": old_object,
            "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        }
        if subresource:
            request["subResource"] = subresource
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}

    return factory


WebhookClient = test_utils.TestClient[aiohttp.web.Request, aiohttp.web.Application]
ClientFactory = Callable[..., Awaitable[WebhookClient]]


@pytest_asyncio.fixture
async def webhook_client(server_ssl: ssl.SSLContext, client_ssl: ssl.SSLContext) -> AsyncIterator[ClientFactory]:
    """Start ``make_app(settings)`` on a free port over real TLS; return a client that trusts our CA."""
    clients: list[WebhookClient] = []

    async def factory(config: Any = None, **app_kwargs: Any) -> WebhookClient:
        app = admission_app.make_app(config if config is not None else engine_settings.Settings(), **app_kwargs)
        server = test_utils.TestServer(app, host="127.0.0.1")
        await server.start_server(ssl=server_ssl)
        client: WebhookClient = test_utils.TestClient(server, connector=aiohttp.TCPConnector(ssl=client_ssl))
        await client.start_server()
        clients.append(client)
        return client

    yield factory
    for client in clients:
        await client.close()


@pytest_asyncio.fixture
async def webhook(webhook_client: ClientFactory) -> WebhookClient:
    """A TLS client for the webhook with the built-in default settings."""
    return await webhook_client()
