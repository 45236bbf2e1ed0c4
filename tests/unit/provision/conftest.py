"""In-memory stand-ins for the Secret, the webhook configurations and the Lease (same conflict rules), and an in-memory TLS handshake."""

from __future__ import annotations

import copy
import ssl
from collections.abc import Mapping
from typing import Any

import pytest
from cryptography import x509

from webhook.certificates import provision
from webhook.kube import errors as kube_errors


class MemoryStore:
    """A `provision.Store` with resourceVersion semantics: a write based on a stale read is a Conflict."""

    def __init__(self) -> None:
        self.stored: provision.Stored | None = None
        self.writes = 0

    def describe(self) -> str:
        return "memory secret"

    def read(self) -> provision.Stored | None:
        return self.stored

    def write(self, entries: Mapping[str, bytes], *, previous: provision.Stored | None) -> None:
        current = self.stored.version if self.stored is not None else None
        if (previous.version if previous is not None else None) != current:
            raise kube_errors.Conflict("memory secret changed under us")
        self.writes += 1
        self.stored = provision.Stored(entries=dict(entries), version=str(self.writes))


class MemoryClients:
    """Webhook entries' caBundles (a `provision.Clients`)."""

    def __init__(self, entries: int = 2) -> None:
        self.values = [b""] * entries
        self.injections = 0

    def describe(self) -> str:
        return "memory webhooks"

    def bundles(self) -> list[bytes]:
        return list(self.values)

    def inject(self, bundle: bytes) -> int:
        changed = sum(1 for value in self.values if value != bundle)
        if changed:
            self.injections += 1
        self.values = [bundle] * len(self.values)
        return changed


class MemoryLeases:
    """One Lease (a `webhook.kube.leader.LeaseStore`); writes carry the resourceVersion they were based on."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.fail = False

    def read(self) -> Mapping[str, Any] | None:
        if self.fail:
            raise kube_errors.Unreachable("apiserver unreachable")
        return copy.deepcopy(self.lease)

    def write(self, body: Mapping[str, Any], *, create: bool) -> Mapping[str, Any]:
        if self.fail:
            raise kube_errors.Unreachable("apiserver unreachable")
        if create and self.lease is not None:
            raise kube_errors.Conflict("exists")
        if not create:
            based_on = (body.get("metadata") or {}).get("resourceVersion")
            if self.lease is None or based_on != self.lease["metadata"]["resourceVersion"]:
                raise kube_errors.Conflict("stale")
        self.version += 1
        written = copy.deepcopy(dict(body))
        written["metadata"] = {**written.get("metadata", {}), "resourceVersion": str(self.version)}
        self.lease = written
        return copy.deepcopy(written)


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def clients() -> MemoryClients:
    return MemoryClients()


@pytest.fixture
def leases() -> MemoryLeases:
    return MemoryLeases()


def presented_certificate(context: ssl.SSLContext, *, server_hostname: str = "localhost") -> x509.Certificate:
    """The certificate a server with ``context`` presents, by an in-memory handshake (no sockets, no
    ports; not verified: a test clock may run ahead of the real one)."""
    client = ssl.create_default_context()
    client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
    pipes = [ssl.MemoryBIO() for _ in range(4)]
    client_side = client.wrap_bio(pipes[0], pipes[1], server_hostname=server_hostname)
    server_side = context.wrap_bio(pipes[2], pipes[3], server_side=True)
    for _ in range(10):
        for side in (client_side, server_side):
            try:
                side.do_handshake()
            except ssl.SSLWantReadError:
                pass
        pipes[2].write(pipes[1].read())
        pipes[0].write(pipes[3].read())
    der = client_side.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)
