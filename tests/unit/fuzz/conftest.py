"""Hostile-input fuzzing of the webhook and extender apps, in-process over real TLS.

Fixtures: each app served from a thread of its own (module scope) and a client for it. The
helpers are in ``servers``, the strategies in ``hostile``; the long, random run is
``bench/fuzz_long.py``.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator

import pytest

from policies import settings as engine_settings
from tests.unit.fuzz.servers import Client, MemoryApi, ThreadServer, gpu_node
from webhook.admission import app as admission_app
from webhook.extender import app as extender_app
from webhook.extender import binder, store

# --- fixtures -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def webhook_server(server_ssl: ssl.SSLContext) -> Iterator[ThreadServer]:
    server = ThreadServer(admission_app.make_app(engine_settings.Settings()), context=server_ssl)
    yield server
    server.close()


@pytest.fixture(scope="module")
def extender_server(server_ssl: ssl.SSLContext) -> Iterator[ThreadServer]:
    nodes = {name: gpu_node(name) for name in ("gpu-0", "gpu-1")}
    cache = store.Store()
    cache.replace_nodes(list(nodes.values()))
    cache.replace_leases([])  # no ledger Leases yet
    cache.replace_pods([])
    application = extender_app.make_app(cache=cache, bind=binder.Binder(MemoryApi(nodes), max_attempts=3))
    server = ThreadServer(application, context=server_ssl)
    yield server
    server.close()


@pytest.fixture
def webhook(webhook_server: ThreadServer, client_ssl: ssl.SSLContext) -> Iterator[Client]:
    client = Client(webhook_server.port, context=client_ssl)
    yield client
    client.close()


@pytest.fixture
def extender(extender_server: ThreadServer, client_ssl: ssl.SSLContext) -> Iterator[Client]:
    client = Client(extender_server.port, context=client_ssl)
    yield client
    client.close()
