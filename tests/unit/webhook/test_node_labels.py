"""GPU009's Node labels in the live webhook: looked up only for the requests that need them, cached, fail closed."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from policies import settings
from tests.conftest import ReviewFactory
from webhook import cli
from webhook.admission import app as admission_app
from webhook.admission import clustercontext, keys, nodes

GPU_NODE = {"ack.node.gpu.schedule": "cgpu", "aliyun.accelerator/nvidia_name": "Tesla-T4"}
CPU_NODE = {"kubernetes.io/os": "linux"}


def running(node: str, *ephemeral: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeName": node, "containers": [{"name": "main", "image": "app:1"}]}
    if ephemeral:
        spec["ephemeralContainers"] = list(ephemeral)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "app", "namespace": "team-a"}, "spec": spec}


def debugger(**security: Any) -> dict[str, Any]:
    return {"name": "debugger", "image": "busybox:1", "targetContainerName": "main", "securityContext": security}


class Reader:
    """A fake Node reader that counts its reads."""

    def __init__(self, labels: Mapping[str, Mapping[str, str]], *, fail: bool = False) -> None:
        self.labels = labels
        self.fail = fail
        self.reads: list[str] = []

    def __call__(self, name: str) -> Mapping[str, str] | None:
        self.reads.append(name)
        if self.fail:
            raise OSError("connection refused")
        return self.labels.get(name)


def app_with(cache: nodes.Cache | None) -> Any:
    app = admission_app.make_app(settings.Settings())
    if cache is not None:
        app[keys.NODES] = cache
    return app


async def attach(client: Any, make_review: ReviewFactory, node: str, added: dict[str, Any]) -> dict[str, Any]:
    old = running(node)
    body = make_review(running(node, added), operation="UPDATE", old_object=old, subresource="ephemeralcontainers")
    answered: dict[str, dict[str, Any]] = await (await client.post("/validate", json=body)).json()
    return answered["response"]


async def test_a_sysadmin_debug_container_is_refused_on_a_gpu_node_and_allowed_on_a_cpu_node(
    aiohttp_client: Callable[..., Any], make_review: ReviewFactory
) -> None:
    reader = Reader({"gpu-0": GPU_NODE, "cpu-0": CPU_NODE})
    client = await aiohttp_client(app_with(nodes.Cache(reader)))

    on_gpu = await attach(client, make_review, "gpu-0", debugger(privileged=True))
    on_cpu = await attach(client, make_review, "cpu-0", debugger(privileged=True))

    assert on_gpu["allowed"] is False
    assert on_gpu["status"]["message"].startswith("GPU009: ")
    assert 'ephemeral container "debugger" is privileged; the pod runs on the GPU node gpu-0' in on_gpu["status"]["message"]
    assert on_cpu["allowed"] is True
    assert reader.reads == ["gpu-0", "cpu-0"]


async def test_ordinary_reviews_never_read_a_node(aiohttp_client: Callable[..., Any], make_review: ReviewFactory) -> None:
    reader = Reader({"gpu-0": GPU_NODE})
    client = await aiohttp_client(app_with(nodes.Cache(reader)))

    # kubectl debug --profile=general adds SYS_PTRACE, which GPU nodes allow (without hostPID).
    general = await attach(client, make_review, "gpu-0", debugger(capabilities={"add": ["SYS_PTRACE"]}))
    created = await (await client.post("/validate", json=make_review(running("gpu-0")))).json()

    assert general["allowed"] is True and created["response"]["allowed"] is True
    assert reader.reads == []


async def test_a_failed_read_fails_closed(aiohttp_client: Callable[..., Any], make_review: ReviewFactory) -> None:
    client = await aiohttp_client(app_with(nodes.Cache(Reader({}, fail=True))))

    answer = await attach(client, make_review, "cpu-0", debugger(privileged=True))

    assert answer["allowed"] is False
    assert "nothing keeps the pod off GPU nodes" in answer["status"]["message"]


async def test_without_node_lookups_the_webhook_fails_closed_too(
    aiohttp_client: Callable[..., Any], make_review: ReviewFactory
) -> None:
    client = await aiohttp_client(app_with(None))

    answer = await attach(client, make_review, "cpu-0", debugger(capabilities={"add": ["SYS_ADMIN"]}))

    assert answer["allowed"] is False and "GPU009" in answer["status"]["message"]


async def test_a_pod_created_onto_a_named_gpu_node_with_node_power_is_refused_and_onto_a_cpu_node_admitted(
    aiohttp_client: Callable[..., Any], make_review: ReviewFactory
) -> None:
    # What `kubectl debug node/<name> --profile=sysadmin` creates: nodeName, hostPID, privileged, /.
    def node_debugger(node: str) -> dict[str, Any]:
        pod = running(node)
        pod["spec"].update(hostPID=True, volumes=[{"name": "root", "hostPath": {"path": "/"}}])
        pod["spec"]["containers"][0]["securityContext"] = {"privileged": True}
        return pod

    reader = Reader({"gpu-0": GPU_NODE, "cpu-0": CPU_NODE})
    client = await aiohttp_client(app_with(nodes.Cache(reader)))

    on_gpu = (await (await client.post("/validate", json=make_review(node_debugger("gpu-0")))).json())["response"]
    on_cpu = (await (await client.post("/validate", json=make_review(node_debugger("cpu-0")))).json())["response"]
    plain = (await (await client.post("/validate", json=make_review(running("gpu-0")))).json())["response"]

    assert on_gpu["allowed"] is False
    assert "GPU002" in on_gpu["status"]["message"] and "GPU003" in on_gpu["status"]["message"]
    assert "the pod runs on the GPU node gpu-0 (label ack.node.gpu.schedule)" in on_gpu["status"]["message"]
    assert on_cpu["allowed"] is True and plain["allowed"] is True
    assert reader.reads == ["gpu-0", "cpu-0"]  # the pod without node power needed no read


async def test_labels_are_cached_for_the_ttl_and_read_again_after() -> None:
    now = [100.0]
    reader = Reader({"gpu-0": GPU_NODE})
    cache = nodes.Cache(reader, ttl_s=10.0, clock=lambda: now[0])

    assert await cache.labels_for("gpu-0") == GPU_NODE
    now[0] += 9.0
    assert await cache.labels_for("gpu-0") == GPU_NODE
    assert reader.reads == ["gpu-0"]
    now[0] += 2.0
    assert await cache.labels_for("gpu-0") == GPU_NODE
    assert reader.reads == ["gpu-0", "gpu-0"]


async def test_a_missing_node_or_a_slow_read_is_unknown_and_not_cached() -> None:
    release = threading.Event()

    def slow(name: str) -> Mapping[str, str] | None:
        release.wait(5)
        return GPU_NODE

    reader = Reader({})
    missing = nodes.Cache(reader)
    assert await missing.labels_for("gone") is None
    assert await missing.labels_for("gone") is None
    assert reader.reads == ["gone", "gone"]

    try:
        assert await nodes.Cache(slow, timeout_s=0.05).labels_for("gpu-0") is None
    finally:
        release.set()


def serve_args(*extra: str) -> Any:
    return cli.make_parser().parse_args(["serve", "--tls-cert-file", "c", "--tls-private-key-file", "k", *extra])


@pytest.mark.parametrize(("flags", "on"), [((), True), (("--no-lookup-nodes",), False), (("--lookup-nodes",), True)])
def test_node_lookups_are_on_with_access_unless_turned_off(flags: tuple[str, ...], on: bool) -> None:
    assert clustercontext.wanted(serve_args("--kubeconfig", "kc", *flags), access=True).nodes is on


def test_asking_for_node_lookups_without_access_is_an_error() -> None:
    assert clustercontext.wanted(serve_args(), access=False).nodes is False
    with pytest.raises(Exception, match="--lookup-nodes need cluster access"):
        clustercontext.wanted(serve_args("--lookup-nodes"), access=False)
