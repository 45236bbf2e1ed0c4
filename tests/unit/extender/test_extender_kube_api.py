"""The extender's apiserver adapter: raw answers become the Kubernetes layer's errors; what it tries again."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from webhook.extender import kube
from webhook.kube import errors


class Raw:
    """What ``ApiClient.call_api`` returns: a response it does not raise for, whatever the status."""

    def __init__(
        self, status: int, body: Mapping[str, Any], *, reason: str = "", headers: Mapping[str, str] | None = None
    ) -> None:
        self.status = status
        self.reason = reason
        self.headers = dict(headers or {})
        self._data = json.dumps(body).encode()

    def read(self) -> bytes:
        return self._data


class Client:
    """A stand-in ``ApiClient`` answering each request from a script, recording what was sent."""

    def __init__(self, *answers: Raw) -> None:
        self.answers = list(answers)
        self.sent: list[tuple[str, str]] = []

    def param_serialize(self, *, method: str, resource_path: str, **_: Any) -> tuple[str, str]:
        return method, resource_path

    def call_api(self, method: str, path: str, **_: Any) -> Raw:
        self.sent.append((method, path))
        return self.answers.pop(0)


def status(code: int, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": code}


NOW = {"Retry-After": "0"}  # a 429 to come back at once: the retry happens, nothing sleeps


def test_a_missing_pod_is_not_found_with_the_apiservers_message() -> None:
    client = Client(Raw(404, status(404, 'pods "p" not found'), reason="Not Found"))
    with pytest.raises(errors.NotFound) as raised:
        kube.KubeApi(client).request("GET", "/api/v1/namespaces/a/pods/p")  # type: ignore[arg-type]  # a stand-in client
    assert str(raised.value) == 'GET /api/v1/namespaces/a/pods/p: 404 Not Found: pods "p" not found'
    assert raised.value.status == 404 and isinstance(raised.value, errors.NotFound)


def test_a_throttled_read_is_tried_again() -> None:
    client = Client(Raw(429, status(429, "too many requests"), headers=NOW), Raw(200, {"metadata": {"name": "n"}}))
    assert kube.KubeApi(client).request("GET", "/api/v1/nodes/n") == {"metadata": {"name": "n"}}  # type: ignore[arg-type]  # a stand-in client
    assert client.sent == [("GET", "/api/v1/nodes/n")] * 2


def test_an_eviction_refused_with_429_is_not_tried_again() -> None:
    refused = Raw(429, status(429, "Cannot evict pod as it would violate the pod's disruption budget."), headers=NOW)
    client = Client(refused, Raw(201, {}))
    with pytest.raises(errors.KubeError) as raised:
        kube.KubeApi(client).request("POST", "/api/v1/namespaces/a/pods/p/eviction", body={})  # type: ignore[arg-type]  # a stand-in client
    assert raised.value.status == 429 and len(client.sent) == 1
    assert "disruption budget" in str(raised.value)


async def test_a_binding_is_retried_on_429_and_a_conflict_is_the_binders_to_handle() -> None:
    client = Client(
        Raw(429, status(429, "too many requests"), headers=NOW),
        Raw(409, status(409, "pod p is already assigned to node n1"), reason="Conflict"),
    )
    with pytest.raises(errors.Conflict) as raised:
        await kube.KubeApi(client).bind("a", "p", uid="u", node="n2", annotations={})  # type: ignore[arg-type]  # a stand-in client
    assert len(client.sent) == 2
    assert str(raised.value) == "POST /api/v1/namespaces/a/pods/p/binding: 409 Conflict: pod p is already assigned to node n1"


async def test_a_stale_lease_replace_or_a_lease_that_exists_is_a_conflict_at_once() -> None:
    client = Client(Raw(409, status(409, "the object has been modified"), reason="Conflict"), Raw(200, {}))
    with pytest.raises(errors.Conflict):
        await kube.KubeApi(client).replace_lease("gpu-admission", "gpu-ledger.n", {"metadata": {"resourceVersion": "7"}})  # type: ignore[arg-type]  # a stand-in client
    assert client.sent == [("PUT", "/apis/coordination.k8s.io/v1/namespaces/gpu-admission/leases/gpu-ledger.n")]
    client = Client(
        Raw(409, status(409, 'leases.coordination.k8s.io "gpu-ledger.n" already exists'), reason="Conflict"), Raw(201, {})
    )
    with pytest.raises(errors.Conflict):
        await kube.KubeApi(client).create_lease("gpu-admission", {"metadata": {"name": "gpu-ledger.n"}})  # type: ignore[arg-type]  # a stand-in client
    assert client.sent == [("POST", "/apis/coordination.k8s.io/v1/namespaces/gpu-admission/leases")]


async def test_a_lease_that_is_not_there_is_not_found() -> None:
    client = Client(Raw(404, status(404, 'leases.coordination.k8s.io "gpu-ledger.n" not found'), reason="Not Found"))
    with pytest.raises(errors.NotFound):
        await kube.KubeApi(client).get_lease("gpu-admission", "gpu-ledger.n")  # type: ignore[arg-type]  # a stand-in client
    assert client.sent == [("GET", "/apis/coordination.k8s.io/v1/namespaces/gpu-admission/leases/gpu-ledger.n")]


def test_a_transport_failure_is_unreachable() -> None:
    class Broken(Client):
        def call_api(self, method: str, path: str, **_: Any) -> Raw:
            self.sent.append((method, path))
            raise ConnectionRefusedError(111, "Connection refused")

    client = Broken()
    with pytest.raises(errors.KubeError) as raised:
        kube.KubeApi(client).request("POST", "/api/v1/namespaces/a/pods/p/eviction", body={})  # type: ignore[arg-type]  # a stand-in client
    assert isinstance(raised.value, errors.Unreachable) and raised.value.status == 0
    assert str(raised.value) == "POST /api/v1/namespaces/a/pods/p/eviction: [Errno 111] Connection refused"
    assert len(client.sent) == 1


class Watching:
    """A stand-in for the watch half of `KubeApi`: one scripted event stream."""

    def __init__(self, *events: tuple[str, dict[str, Any]]) -> None:
        self.events = events

    def watch(self, path: str, *, resource_version: str, stopped: Any, label_selector: str = "") -> Any:
        yield from self.events


def watcher(*events: tuple[str, dict[str, Any]]) -> kube.Watcher:
    return kube.Watcher(Watching(*events), None, loop=None)  # type: ignore[arg-type]  # only the watch is exercised


def test_a_watch_error_410_means_list_again_and_any_other_is_a_kube_error() -> None:
    expired = watcher(("ERROR", status(410, "too old resource version: 5 (9)") | {"reason": "Expired"}))
    with pytest.raises(kube._Expired):
        expired._watch_once("Node", "/api/v1/nodes", "5")
    failing = watcher(("ERROR", status(500, "etcd went away")))
    with pytest.raises(errors.ServerError) as raised:
        failing._watch_once("Node", "/api/v1/nodes", "5")
    assert str(raised.value) == "watch /api/v1/nodes: 500 Internal Server Error: etcd went away"
