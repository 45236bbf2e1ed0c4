"""The webhook's cluster context without a cluster: namespace labels from list and watch events,
the ConfigMap/Secret cache for GPU001, readiness before the first list, and the flags."""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from policies import lookups, model, settings
from webhook import cli
from webhook.admission import app as admission_app
from webhook.admission import clustercontext, envsources, keys, namespaces
from webhook.cmdline import errors
from webhook.kube import client as kube_client
from webhook.kube import errors as kube_errors


def ns(name: str, version: str = "1", **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": version, "labels": dict(labels)}}


# --- the pure map -----------------------------------------------------------------------------------


def test_a_list_installs_every_namespace_and_marks_the_cache_synced() -> None:
    labels = namespaces.Labels()
    assert not labels.synced and labels.get("lab") is None
    labels.replace([ns("lab", team="lab"), ns("plain")], resource_version="10")
    assert labels.synced and labels.resource_version == "10"
    assert labels.get("lab") == {"team": "lab"} and labels.get("plain") == {}


def test_watch_events_add_change_and_drop_namespaces_and_move_the_resource_version() -> None:
    labels = namespaces.Labels()
    labels.replace([ns("lab", team="lab")], resource_version="10")
    labels.apply({"type": "ADDED", "object": ns("new", "11", tier="gpu")})
    labels.apply({"type": "MODIFIED", "object": ns("lab", "12", team="ops")})
    labels.apply({"type": "DELETED", "object": ns("new", "13")})
    labels.apply({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "20"}}})
    assert labels.get("lab") == {"team": "ops"} and labels.get("new") is None
    assert labels.resource_version == "20" and len(labels) == 1


def test_a_replace_forgets_namespaces_deleted_while_the_watch_was_down() -> None:
    labels = namespaces.Labels()
    labels.replace([ns("gone"), ns("kept")], resource_version="1")
    labels.replace([ns("kept", team="x")], resource_version="5")
    assert labels.get("gone") is None and labels.get("kept") == {"team": "x"}


def test_an_expired_watch_event_raises_gone_and_other_errors_their_kube_error() -> None:
    labels = namespaces.Labels()
    with pytest.raises(kube_errors.Gone) as gone:
        labels.apply(
            {"type": "ERROR", "object": {"code": 410, "reason": "Expired", "message": "too old resource version: 5 (9)"}}
        )
    assert str(gone.value) == "namespace watch: 410 Expired: too old resource version: 5 (9)" and gone.value.status == 410
    with pytest.raises(kube_errors.ServerError) as failed:
        labels.apply({"type": "ERROR", "object": {"code": 500, "reason": "InternalError"}})
    assert str(failed.value) == "namespace watch: 500 InternalError" and failed.value.status == 500


def _failing_watch_module(failure: Exception) -> Any:
    """A stand-in for ``kubernetes.watch`` whose ``Watch().stream`` fails at once with `failure`."""

    class Watch:
        def stream(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
            raise failure

    return type("watch", (), {"Watch": Watch})


@pytest.mark.parametrize(
    ("failure", "expected", "message"),
    [
        (410, kube_errors.Gone, "namespace watch: 410 Gone: too old resource version: 5 (9)"),
        (500, kube_errors.ServerError, "namespace watch: 500 Internal Server Error: etcd"),
    ],
)
def test_the_apiserver_watch_raises_the_kube_layers_error_for_its_status(
    monkeypatch: pytest.MonkeyPatch, failure: int, expected: type[kube_errors.KubeError], message: str
) -> None:
    from kubernetes.client import exceptions as client_exceptions  # noqa: PLC0415 - the real client's exception type

    raised = client_exceptions.ApiException(status=failure, reason="")
    raised.body = json.dumps({"kind": "Status", "message": message.split(": ", 2)[2]})
    monkeypatch.setattr(clustercontext, "_watch_module", _failing_watch_module(raised))
    source = clustercontext.KubeNamespaces(kube_client.ApiClient())
    with pytest.raises(expected) as caught:
        list(source.watch(resource_version="5", timeout_s=1))
    assert str(caught.value) == message and caught.value.status == failure


def test_the_apiserver_watch_lets_an_unknown_failure_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clustercontext, "_watch_module", _failing_watch_module(KeyError("bug")))
    with pytest.raises(KeyError):
        list(clustercontext.KubeNamespaces(kube_client.ApiClient()).watch(resource_version="5", timeout_s=1))


def test_malformed_events_do_not_corrupt_the_map() -> None:
    labels = namespaces.Labels()
    labels.replace([ns("a", team="x")], resource_version="1")
    labels.apply({"type": "ADDED", "object": "not a namespace"})
    labels.apply({"type": "MODIFIED", "object": {"metadata": {"name": "a", "labels": None}}})
    labels.apply({"type": "SURPRISE", "object": ns("b")})
    assert labels.get("a") == {} and labels.get("b") is None and labels.resource_version == "1"


# --- the informer loop over a fake source -----------------------------------------------------------


class FakeSource:
    """Scripted lists and watches; each watch call pops the next script (a list of events, or an exception)."""

    def __init__(self, *, lists: list[Any], watches: list[Any]) -> None:
        self.lists = lists
        self.watches = watches
        self.list_calls = 0
        self.watched_from: list[str] = []
        self.done = threading.Event()
        self.namespaces: dict[str, dict[str, Any]] = {}

    def list(self) -> tuple[list[Mapping[str, Any]], str]:
        self.list_calls += 1
        step = self.lists.pop(0) if self.lists else ([], "0")
        if isinstance(step, Exception):
            raise step
        items, version = step
        return list(items), version

    def watch(self, *, resource_version: str, timeout_s: int) -> Iterator[Mapping[str, Any]]:
        self.watched_from.append(resource_version)
        if not self.watches:
            self.done.set()
            self.done_wait()
            return
        step = self.watches.pop(0)
        if isinstance(step, Exception):
            raise step
        yield from step

    def done_wait(self) -> None:
        # Park the thread until the test stops the informer (the fake's stand-in for a long watch).
        self.stopped.wait(10)

    stopped = threading.Event()

    def read(self, name: str, *, timeout_s: float) -> Mapping[str, Any] | None:
        return self.namespaces.get(name)

    def stop(self) -> None:
        self.stopped.set()


def run_until_idle(source: FakeSource, **kwargs: Any) -> namespaces.Informer:
    source.stopped = threading.Event()
    informer = namespaces.Informer(source, **kwargs)
    informer.start()
    assert source.done.wait(10), "the informer never reached its last watch"
    informer.stop(wait_s=5)
    return informer


def test_the_informer_lists_then_watches_from_the_list_version_and_resumes_where_a_watch_ended() -> None:
    source = FakeSource(
        lists=[([ns("lab", team="lab")], "10")],
        watches=[[{"type": "MODIFIED", "object": ns("lab", "11", team="ops")}], [{"type": "ADDED", "object": ns("b", "12")}]],
    )
    informer = run_until_idle(source)
    assert source.list_calls == 1
    assert source.watched_from == ["10", "11", "12"]
    assert informer.labels.get("lab") == {"team": "ops"} and informer.labels.get("b") == {}


def test_an_expired_watch_lists_again_at_once() -> None:
    source = FakeSource(
        lists=[([ns("old")], "10"), ([ns("new", team="x")], "50")],
        watches=[kube_errors.Gone("namespace watch: 410 Gone: too old", status=410)],
    )
    errors_seen: list[str] = []
    informer = run_until_idle(source, on_error=errors_seen.append)
    assert source.list_calls == 2 and source.watched_from == ["10", "50"]
    assert informer.labels.get("old") is None and informer.labels.get("new") == {"team": "x"}
    assert errors_seen == [], "an expired watch is routine, not an error"


def test_a_failing_list_is_retried_with_backoff_and_the_cache_stays_unsynced_meanwhile() -> None:
    source = FakeSource(lists=[OSError("connection refused"), OSError("connection refused"), ([ns("a")], "7")], watches=[])
    errors_seen: list[str] = []
    started = time.monotonic()
    informer = run_until_idle(source, on_error=errors_seen.append, max_backoff_s=0.5)
    assert errors_seen == ["connection refused", "connection refused"]
    assert source.list_calls == 3 and informer.labels.synced
    assert time.monotonic() - started >= namespaces.INITIAL_BACKOFF_S, "waited before retrying"


def test_a_broken_watch_relists() -> None:
    source = FakeSource(
        lists=[([ns("a")], "1"), ([ns("a", team="t")], "9")],
        watches=[ValueError("watch error: 500")],
    )
    informer = run_until_idle(source, max_backoff_s=0.5)
    assert source.list_calls == 2 and informer.labels.get("a") == {"team": "t"}


async def test_a_namespace_missing_from_the_cache_is_read_once_directly() -> None:
    source = FakeSource(lists=[], watches=[])
    source.namespaces["fresh"] = ns("fresh", team="lab")
    informer = namespaces.Informer(source)
    informer.labels.replace([ns("known", team="a")], resource_version="1")
    assert await informer.labels_for("known") == {"team": "a"}
    assert await informer.labels_for("fresh") == {"team": "lab"}
    assert await informer.labels_for("nowhere") is None


async def test_a_slow_direct_read_gives_unknown_labels_within_the_bound() -> None:
    release = threading.Event()

    class Slow(FakeSource):
        def read(self, name: str, *, timeout_s: float) -> Mapping[str, Any] | None:
            release.wait(5)
            return ns(name, team="late")

    informer = namespaces.Informer(Slow(lists=[], watches=[]), miss_timeout_s=0.05)
    started = time.monotonic()
    try:
        assert await informer.labels_for("x") is None
        assert time.monotonic() - started < 2
    finally:
        release.set()


# --- GPU001's sources and the TTL cache --------------------------------------------------------------


GPU = {"resources": {"limits": {"nvidia.com/gpu": 1}}}  # without one, GPU104's void would decide GPU001


def pod(container: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "i", **container}]},
    }


def test_gpu001_names_the_sources_that_can_set_visible_devices() -> None:
    obj = pod(
        {
            "envFrom": [
                {"configMapRef": {"name": "plain"}},
                {"secretRef": {"name": "creds"}},
                {"configMapRef": {"name": "prefixed"}, "prefix": "APP_"},  # cannot produce the variable
                # A prefix that composes a guarded name is refused from the spec alone: nothing to read.
                {"configMapRef": {"name": "nvidia"}, "prefix": "NVIDIA_"},
            ]
        }
    )
    found = lookups.env_sources(obj, namespace="lab")
    assert {(s.kind, s.name) for s in found} == {("ConfigMap", "plain"), ("Secret", "creds")}
    assert {s.namespace for s in found} == {"lab"}


def test_gpu001_sources_follow_env_precedence_and_value_from() -> None:
    # valueFrom for a guarded name is refused whatever the source holds, so it is never read; an
    # envFrom source is still read, because env sets only NVIDIA_VISIBLE_DEVICES and the source could
    # carry an isolation variable.
    by_value_from = pod(
        {
            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}],
            "envFrom": [{"configMapRef": {"name": "read"}}],
        }
    )
    assert {s.name for s in lookups.env_sources(by_value_from, namespace="n")} == {"read"}
    by_value = pod(
        {"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}], "envFrom": [{"configMapRef": {"name": "read"}}]}
    )
    assert {s.name for s in lookups.env_sources(by_value, namespace="n")} == {"read"}
    prefixed = pod({"envFrom": [{"prefix": "CGPU_", "configMapRef": {"name": "prefixed"}}]})
    assert lookups.env_sources(prefixed, namespace="n") == frozenset()  # refused from the spec


def source(kind: str = "ConfigMap", name: str = "cm") -> model.EnvSource:
    return model.EnvSource(kind=kind, namespace="lab", name=name)  # type: ignore[arg-type]  # kind is a Literal; tests pass both


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_the_cache_reads_a_source_once_within_its_ttl_and_again_after() -> None:
    reads: list[model.EnvSource] = []

    def reader(wanted: model.EnvSource) -> Mapping[str, str] | None:
        reads.append(wanted)
        return {"NVIDIA_VISIBLE_DEVICES": "all"}

    clock = Clock()
    cache = envsources.Cache(reader, ttl_s=10, clock=clock)
    lookup = await cache.prefetch([source()])
    assert lookup(source()) == {"NVIDIA_VISIBLE_DEVICES": "all"}
    clock.now = 9.9
    await cache.prefetch([source()])
    assert len(reads) == 1
    clock.now = 10.0
    await cache.prefetch([source()])
    assert len(reads) == 2


async def test_secrets_are_not_read_unless_enabled() -> None:
    reads: list[str] = []

    def reader(wanted: model.EnvSource) -> Mapping[str, str] | None:
        reads.append(wanted.kind)
        return {"A": "b"}

    lookup = await envsources.Cache(reader).prefetch([source("Secret", "s")])
    assert lookup(source("Secret", "s")) is None and reads == []
    lookup = await envsources.Cache(reader, kinds=frozenset({"ConfigMap", "Secret"})).prefetch([source("Secret", "s")])
    assert lookup(source("Secret", "s")) == {"A": "b"} and reads == ["Secret"]


async def test_a_read_that_takes_too_long_is_unknown_and_not_cached() -> None:
    release = threading.Event()
    calls = 0

    def slow(wanted: model.EnvSource) -> Mapping[str, str] | None:
        nonlocal calls
        calls += 1
        release.wait(5)
        return {"NVIDIA_VISIBLE_DEVICES": "all"}

    cache = envsources.Cache(slow, timeout_s=0.05)
    try:
        started = time.monotonic()
        lookup = await cache.prefetch([source()])
        assert lookup(source()) is None and time.monotonic() - started < 2
        assert cache.cached(source()) == (False, None)
    finally:
        release.set()


async def test_a_failing_read_is_unknown() -> None:
    def broken(wanted: model.EnvSource) -> Mapping[str, str] | None:
        raise OSError("boom")

    lookup = await envsources.Cache(broken).prefetch([source()])
    assert lookup(source()) is None


# --- the handlers with a cluster context -------------------------------------------------------------


def review(obj: dict[str, Any], *, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": obj,
        },
    }


PRIVILEGED_GPU_POD = pod({"securityContext": {"privileged": True}, "resources": {"limits": {"nvidia.com/gpu": 1}}})
LAB_WARNS = settings.from_mapping(
    {
        "namespaceOverrides": [
            {"name": "lab", "namespaceSelector": {"matchLabels": {"team": "lab"}}, "policies": {"GPU002": {"action": "warn"}}}
        ]
    }
)


def app_with(
    config: settings.Settings, *, informer: namespaces.Informer | None = None, env: envsources.Cache | None = None
) -> Any:
    app = admission_app.make_app(config)
    if informer is not None:
        app[keys.NAMESPACES] = informer
    if env is not None:
        app[keys.ENV_SOURCES] = env
    return app


async def test_the_namespace_labels_select_the_override(aiohttp_client: Callable[..., Any]) -> None:
    informer = namespaces.Informer(FakeSource(lists=[], watches=[]))
    informer.labels.replace([ns("lab", team="lab"), ns("plain")], resource_version="1")
    client = await aiohttp_client(app_with(LAB_WARNS, informer=informer))
    answered = await (await client.post("/validate", json=review(PRIVILEGED_GPU_POD, namespace="lab"))).json()
    assert answered["response"]["allowed"] is True and any("GPU002" in w for w in answered["response"]["warnings"])
    answered = await (await client.post("/validate", json=review(PRIVILEGED_GPU_POD, namespace="plain"))).json()
    assert answered["response"]["allowed"] is False and "GPU002" in answered["response"]["status"]["message"]


async def test_readyz_is_503_until_the_namespaces_are_listed(aiohttp_client: Callable[..., Any]) -> None:
    informer = namespaces.Informer(FakeSource(lists=[], watches=[]))
    client = await aiohttp_client(app_with(settings.Settings(), informer=informer))
    answer = await client.get("/readyz")
    assert answer.status == 503 and "namespace labels" in await answer.text()
    informer.labels.replace([], resource_version="1")
    assert (await client.get("/readyz")).status == 200


async def test_gpu001_judges_an_env_from_config_map_by_its_data(aiohttp_client: Callable[..., Any]) -> None:
    data = {"devices": {"NVIDIA_VISIBLE_DEVICES": "all"}, "other": {"LOG_LEVEL": "debug"}}
    env = envsources.Cache(lambda s: data.get(s.name))
    client = await aiohttp_client(app_with(settings.Settings(), env=env))
    answered = await (
        await client.post(
            "/validate", json=review(pod({**GPU, "envFrom": [{"configMapRef": {"name": "devices"}}]}), namespace="lab")
        )
    ).json()
    assert answered["response"]["allowed"] is False
    assert "GPU001" in answered["response"]["status"]["message"] and "'devices'" in answered["response"]["status"]["message"]
    answered = await (
        await client.post(
            "/validate", json=review(pod({**GPU, "envFrom": [{"configMapRef": {"name": "other"}}]}), namespace="lab")
        )
    ).json()
    assert answered["response"]["allowed"] is True and not answered["response"].get("warnings")


async def test_without_a_cluster_context_env_from_is_admitted_while_gpu007_guards_the_sources(
    aiohttp_client: Callable[..., Any],
) -> None:
    body = review(pod({**GPU, "envFrom": [{"configMapRef": {"name": "devices"}}]}), namespace="lab")
    client = await aiohttp_client(app_with(settings.Settings()))
    answered = await (await client.post("/validate", json=body)).json()
    assert answered["response"]["allowed"] is True
    assert not any("GPU001" in w for w in answered["response"].get("warnings", []))
    # Where GPU007 does not keep guarded keys out of the sources, it is an uncertain warning again.
    unguarded = settings.from_mapping({"policies": {"GPU007": {"action": "warn"}}})
    client = await aiohttp_client(app_with(unguarded))
    answered = await (await client.post("/validate", json=body)).json()
    assert answered["response"]["allowed"] is True and any("GPU001" in w for w in answered["response"]["warnings"])


async def test_lookups_do_not_block_the_event_loop(aiohttp_client: Callable[..., Any]) -> None:
    release = threading.Event()

    def slow(wanted: model.EnvSource) -> Mapping[str, str] | None:
        release.wait(5)
        return None

    client = await aiohttp_client(app_with(settings.Settings(), env=envsources.Cache(slow, timeout_s=2)))
    pending = asyncio.ensure_future(
        client.post("/validate", json=review(pod({**GPU, "envFrom": [{"configMapRef": {"name": "x"}}]}), namespace="lab"))
    )
    try:
        assert (await client.get("/healthz")).status == 200, "the loop answers while the read waits"
        assert not pending.done()
    finally:
        release.set()
    assert (await pending).status == 200


# --- the flags --------------------------------------------------------------------------------------


def serve_args(*extra: str) -> argparse.Namespace:
    return cli.make_parser().parse_args(["serve", "--tls-cert-file", "c", "--tls-private-key-file", "k", *extra])


def test_with_access_labels_and_config_maps_are_on_and_secrets_off() -> None:
    parts = clustercontext.wanted(serve_args("--kubeconfig", "kc"), access=True)
    assert parts == clustercontext.Wanted(
        namespace_labels=True, configmaps=True, secrets=False, nodes=True, events=True, claims=True
    )
    parts = clustercontext.wanted(serve_args("--no-namespace-labels", "--lookup-secrets", "--no-events"), access=True)
    assert parts == clustercontext.Wanted(
        namespace_labels=False, configmaps=True, secrets=True, nodes=True, events=False, claims=True
    )


def test_without_access_everything_is_off_and_asking_for_a_part_is_an_error() -> None:
    assert not clustercontext.wanted(serve_args(), access=False).any
    with pytest.raises(errors.InputError, match="--lookup-secrets need cluster access"):
        clustercontext.wanted(serve_args("--lookup-secrets"), access=False)
    with pytest.raises(errors.InputError, match="--events need cluster access"):
        clustercontext.wanted(serve_args("--events"), access=False)


def test_access_comes_from_a_kubeconfig_self_managed_certificates_or_a_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert not clustercontext.has_access(serve_args())
    assert clustercontext.has_access(serve_args("--kubeconfig", "kc"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setattr(clustercontext, "TOKEN", pathlib.Path("/nonexistent/token"))
    assert not clustercontext.has_access(serve_args()), "no token mounted: no access"


class _ClosingApi(kube_client.ApiClient):
    """A client that never sends a request and records the one call the context makes on its own:
    close, at the app's end."""

    closed = False

    def close(self) -> None:
        self.closed = True


async def test_failed_namespace_lists_are_counted_on_metrics(aiohttp_client: Callable[..., Any]) -> None:
    source = FakeSource(lists=[OSError("connection refused"), OSError("connection refused"), ([ns("a")], "7")], watches=[])
    source.stopped = threading.Event()
    informer = namespaces.Informer(source, max_backoff_s=0.2)
    api = _ClosingApi()
    app = admission_app.make_app(settings.Settings())
    clustercontext.Context(api=api, informer=informer, env=None).install(app)
    client = await aiohttp_client(app)  # starts the informer (the context's lifetime)
    assert await asyncio.to_thread(source.done.wait, 10), "the informer never reached its watch"
    assert _watch_errors(await (await client.get("/metrics")).text()) == 2
    await client.close()
    assert api.closed


async def test_the_watch_error_counter_is_there_at_zero_before_any_error(aiohttp_client: Callable[..., Any]) -> None:
    source = FakeSource(lists=[([ns("a")], "1")], watches=[])
    source.stopped = threading.Event()
    app = admission_app.make_app(settings.Settings())
    clustercontext.Context(api=_ClosingApi(), informer=namespaces.Informer(source), env=None).install(app)
    client = await aiohttp_client(app)
    assert await asyncio.to_thread(source.done.wait, 10)
    assert _watch_errors(await (await client.get("/metrics")).text()) == 0


def _watch_errors(exposition: str) -> float:
    (value,) = [
        float(line.split()[1]) for line in exposition.splitlines() if line.startswith(clustercontext.WATCH_ERRORS_METRIC + " ")
    ]
    return value
