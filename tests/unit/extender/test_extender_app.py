"""The extender app in-process: the extender/v1 wire format, the 400 channel, inspect, probes, metrics."""

from __future__ import annotations

import asyncio
import datetime
import json
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import test_utils, web

from certs import authority
from policies import gpu
from policies.gpu import allocation, reservations
from webhook.extender import app, binder, store, wire
from webhook.serving import metrics

NOW = 1_800_000_000.0
Client = test_utils.TestClient[web.Request, web.Application]
Factory = Any


@pytest.fixture
def cache(apiserver: Any, make_node: Factory) -> store.Store:
    apiserver.add_node(make_node("gpu-0"))
    apiserver.add_node(make_node("small", count=1, gib=2))
    apiserver.add_node(make_node("exclusive", mode="default"))
    filled = store.Store()
    filled.replace_nodes(list(apiserver.nodes.values()))
    filled.replace_leases([])  # no ledger Leases yet
    filled.replace_pods([])
    return filled


@pytest.fixture
async def client(aiohttp_client: Callable[[web.Application], Awaitable[Client]], apiserver: Any, cache: store.Store) -> Client:
    settings = app.Settings(clock=lambda: NOW)
    application = app.make_app(cache=cache, bind=binder.Binder(apiserver, clock=lambda: NOW, cache=cache), settings=settings)
    return await aiohttp_client(application)


async def _post(client: Client, path: str, body: object) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with client.post(path, data=data, headers={"Content-Type": "application/json"}) as answer:
        return answer.status, await answer.json()


def _args(pod: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {"Pod": pod, "Nodes": None, "NodeNames": names}


async def test_filter_answers_extender_filter_result_with_pascal_case_keys(client: Client, make_gpu_pod: Factory) -> None:
    status, answer = await _post(client, "/filter", _args(make_gpu_pod(mem=4), ["gpu-0", "small", "exclusive", "gone"]))
    assert status == 200
    assert set(answer) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert answer["NodeNames"] == ["gpu-0"] and answer["Nodes"] is None and answer["Error"] == ""
    assert set(answer["FailedAndUnresolvableNodes"]) == {"small", "exclusive"}
    assert set(answer["FailedNodes"]) == {"gone"}
    assert "largest card is GPU0 with 2 GiB" in answer["FailedAndUnresolvableNodes"]["small"]


async def test_filter_echoes_full_nodes_when_the_scheduler_sent_them(
    client: Client, make_gpu_pod: Factory, apiserver: Any
) -> None:
    body = {
        "Pod": make_gpu_pod(mem=4),
        "Nodes": {"items": [apiserver.nodes["gpu-0"], apiserver.nodes["small"]]},
        "NodeNames": None,
    }
    status, answer = await _post(client, "/filter", body)
    assert status == 200 and answer["NodeNames"] is None
    assert [n["metadata"]["name"] for n in answer["Nodes"]["items"]] == ["gpu-0"]


async def test_prioritize_answers_a_host_priority_list_within_0_to_10(client: Client, make_gpu_pod: Factory) -> None:
    status, answer = await _post(client, "/prioritize", _args(make_gpu_pod(mem=4), ["gpu-0", "small"]))
    assert status == 200
    assert [set(entry) for entry in answer] == [{"Host", "Score"}, {"Host", "Score"}]
    scores = {entry["Host"]: entry["Score"] for entry in answer}
    assert set(scores) == {"gpu-0", "small"} and scores["small"] == 0 and 0 <= scores["gpu-0"] <= wire.MAX_PRIORITY


async def test_bind_answers_an_empty_error_and_the_pod_is_bound(client: Client, make_gpu_pod: Factory, apiserver: Any) -> None:
    pod = apiserver.add_pod(make_gpu_pod("trainer", mem=4))
    body = {"PodName": "trainer", "PodNamespace": "team-a", "PodUID": pod["metadata"]["uid"], "Node": "gpu-0"}
    status, answer = await _post(client, "/bind", body)
    assert (status, answer) == (200, {"Error": ""})
    assert apiserver.pods[("team-a", "trainer")]["spec"]["nodeName"] == "gpu-0"
    # The app's cache already knows: the next filter sees the card taken.
    status, inspected = await _get_json(client, "/inspect/gpu-0")
    assert inspected["nodes"][0]["devs"][0]["usedGPU"] == 4


async def test_a_failed_bind_is_a_200_with_the_reason(client: Client, make_gpu_pod: Factory, apiserver: Any) -> None:
    pod = apiserver.add_pod(make_gpu_pod("big", mem=40))
    body = {"PodName": "big", "PodNamespace": "team-a", "PodUID": pod["metadata"]["uid"], "Node": "gpu-0"}
    status, answer = await _post(client, "/bind", body)
    assert status == 200 and "no GPU card is large enough" in answer["Error"]


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/filter", b"{not json", "bad filter request: the body is not JSON"),
        ("/filter", b"", "bad filter request: the body is empty"),
        ("/filter", [], "expected a JSON object"),
        ("/filter", {"Pod": "x", "NodeNames": []}, "'Pod' must be a Pod object"),
        ("/filter", {"Pod": {"spec": {}}}, "nodeCacheCapable"),
        ("/filter", {"Pod": {"spec": {}}, "NodeNames": [1]}, "'NodeNames' must be a list of node names"),
        ("/prioritize", b"\xff\xfe", "bad prioritize request"),
        ("/bind", {"PodName": "p", "PodNamespace": "ns", "PodUID": "u"}, "bad bind request: 'Node' must be a non-empty string"),
        ("/bind", b"null", "expected a JSON object (ExtenderBindingArgs)"),
    ],
)
async def test_malformed_bodies_get_400_with_a_clear_error_and_the_server_keeps_serving(
    client: Client, make_gpu_pod: Factory, path: str, body: object, message: str
) -> None:
    status, answer = await _post(client, path, body)
    assert status == 400 and message in answer["Error"]
    status, answer = await _post(client, "/filter", _args(make_gpu_pod(mem=1), ["gpu-0"]))
    assert status == 200 and answer["NodeNames"] == ["gpu-0"]


async def test_a_filter_before_the_first_list_fails_the_call_and_healthz_says_loading(
    aiohttp_client: Callable[[web.Application], Awaitable[Client]], apiserver: Any, make_gpu_pod: Factory
) -> None:
    empty = store.Store()
    client = await aiohttp_client(app.make_app(cache=empty, bind=binder.Binder(apiserver)))
    status, answer = await _post(client, "/filter", _args(make_gpu_pod(mem=1), ["gpu-0"]))
    assert status == 200 and "still loading" in answer["Error"]
    async with client.get("/healthz") as probe:
        assert probe.status == 503 and "loading nodes, pods and ledger Leases" in await probe.text()
    empty.replace_nodes([])
    empty.replace_leases([])  # no ledger Leases yet
    empty.replace_pods([])
    async with client.get("/healthz") as probe:
        assert probe.status == 200


async def test_an_exception_inside_bind_is_a_200_with_error_never_a_500(
    aiohttp_client: Callable[[web.Application], Awaitable[Client]], cache: store.Store
) -> None:
    class Broken(binder.Binder):
        async def bind(self, request: wire.BindRequest) -> binder.BindResult:
            raise RuntimeError("boom")

    client = await aiohttp_client(app.make_app(cache=cache, bind=Broken(None)))  # type: ignore[arg-type]  # never called
    status, answer = await _post(client, "/bind", {"PodName": "p", "PodNamespace": "n", "PodUID": "u", "Node": "gpu-0"})
    assert status == 200 and answer == {"Error": "internal error in the GPU extender: boom"}


async def _get_json(client: Client, path: str) -> tuple[int, Any]:
    async with client.get(path) as answer:
        return answer.status, await answer.json()


async def test_inspect_serves_the_per_card_state_as_json(client: Client) -> None:
    status, answer = await _get_json(client, "/inspect")
    assert status == 200
    assert [n["name"] for n in answer["nodes"]] == ["gpu-0", "small"]
    assert answer["totalGPU"] == 62 and answer["usedGPU"] == 0
    assert answer["nodes"][0]["devs"][3] == {"id": 3, "totalGPU": 15, "usedGPU": 0, "usedCore": 0, "whole": False, "pods": []}
    status, answer = await _get_json(client, "/inspect/nowhere")
    assert status == 404


async def test_metrics_count_verbs_and_give_latency_histograms(client: Client, make_gpu_pod: Factory) -> None:
    await _post(client, "/filter", _args(make_gpu_pod(mem=4), ["gpu-0", "small"]))
    await _post(client, "/filter", b"nope")
    async with client.get("/metrics") as answer:
        text = await answer.text()
    assert metrics.sample(text, "gpu_admission_extender_requests_total", verb="filter", result="ok") == 1
    assert metrics.sample(text, "gpu_admission_extender_requests_total", verb="filter", result="bad_request") == 1
    assert metrics.sample(text, "gpu_admission_extender_filtered_nodes_total", outcome="unresolvable") == 1
    assert metrics.sample(text, "gpu_admission_extender_request_duration_seconds_count", verb="filter") == 2
    assert (metrics.sample(text, "gpu_admission_extender_request_duration_seconds_sum", verb="filter") or 0) > 0
    assert "gpu_admission_extender_latency_seconds" not in text  # the capped summary is gone
    assert any(name == metrics.BUILD_INFO for name, _ in metrics.samples(text))


async def test_metrics_carry_the_inspect_table_per_node_and_card(client: Client, make_gpu_pod: Factory, apiserver: Any) -> None:
    pod = apiserver.add_pod(make_gpu_pod("trainer", mem=4))
    body = {"PodName": "trainer", "PodNamespace": "team-a", "PodUID": pod["metadata"]["uid"], "Node": "gpu-0"}
    assert (await _post(client, "/bind", body))[1]["Error"] == ""
    status, table = await _get_json(client, "/inspect")
    assert status == 200 and table["usedGPU"] == 4
    async with client.get("/metrics") as answer:
        found = metrics.samples(await answer.text())
    gib = 1 << 30
    for node in table["nodes"]:
        assert (
            found[
                (
                    "gpu_admission_extender_node_gpu_memory_total_bytes",
                    frozenset({("node", node["name"]), ("mode", node["mode"])}),
                )
            ]
            == node["totalGPU"] * gib
        )
        assert (
            found[
                (
                    "gpu_admission_extender_node_gpu_memory_allocated_bytes",
                    frozenset({("node", node["name"]), ("mode", node["mode"])}),
                )
            ]
            == node["usedGPU"] * gib
        )
        for device in node["devs"]:
            labels = frozenset({("node", node["name"]), ("card", str(device["id"]))})
            assert found[("gpu_admission_extender_card_gpu_memory_total_bytes", labels)] == device["totalGPU"] * gib
            assert found[("gpu_admission_extender_card_gpu_memory_allocated_bytes", labels)] == device["usedGPU"] * gib
    assert (
        sum(1 for name, _ in found if name == "gpu_admission_extender_card_gpu_memory_total_bytes")
        == sum(len(n["devs"]) for n in table["nodes"])
        > 0
    )


def test_the_store_indexes_bound_and_reserved_pods_by_node(make_node: Factory, make_gpu_pod: Factory) -> None:
    cache = store.Store()
    cache.replace_nodes([make_node("n")])
    note = allocation.bind_annotations(
        allocation.Allocation(uid="r", namespace="a", name="r", node="n", cards=(1,), memory_gib=2, assumed_at=NOW),
        card_memory_gib=15,
    )
    reserved = make_gpu_pod("r", uid="r", mem=2, annotations=note)
    cache.replace_leases([])  # no ledger Leases yet
    cache.replace_pods([reserved, make_gpu_pod("other", uid="o", mem=1)])
    assert [p["metadata"]["name"] for p in cache.pods_on("n")] == ["r"]
    bound = json.loads(json.dumps(reserved))
    bound["spec"]["nodeName"] = "n"
    bound["metadata"]["resourceVersion"] = "5"
    cache.apply("Pod", "MODIFIED", bound)
    stale = json.loads(json.dumps(reserved))
    stale["metadata"]["resourceVersion"] = "3"
    cache.put_pod(stale)  # an older version arriving late changes nothing
    assert cache.pods_on("n")[0]["spec"]["nodeName"] == "n"
    state = cache.state("n", now=NOW, ttl=60)
    assert state is not None and [c.memory_used for c in state.cards] == [0, 2, 0, 0]
    cache.apply("Pod", "DELETED", bound)
    assert cache.pods_on("n") == []
    assert "managedFields" not in store.slim_pod({**bound, "metadata": {**bound["metadata"], "managedFields": [{}]}})["metadata"]


async def test_with_client_certificates_required_the_verbs_refuse_anonymous_callers_but_probes_answer(
    tmp_path: Any, apiserver: Any, cache: store.Store, make_gpu_pod: Factory
) -> None:
    now = datetime.datetime.now(datetime.UTC)
    ca = authority.issue_ca(now=now)
    serving = authority.issue_serving(ca, hosts=["127.0.0.1"], now=now)
    scheduler = authority.issue_client(ca, common_name="kube-scheduler", now=now)
    for name, data in {
        "ca.crt": ca.certificate_pem,
        "tls.crt": serving.certificate_pem,
        "tls.key": serving.key_pem,
        "client.crt": scheduler.certificate_pem,
        "client.key": scheduler.key_pem,
    }.items():
        (tmp_path / name).write_bytes(data)
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    server_context.load_verify_locations(cafile=str(tmp_path / "ca.crt"))
    server_context.verify_mode = ssl.CERT_OPTIONAL
    application = app.make_app(cache=cache, bind=binder.Binder(apiserver), settings=app.Settings(require_client_certificate=True))
    server = test_utils.TestServer(application, host="127.0.0.1")
    await server.start_server(ssl=server_context)
    anonymous = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    trusted = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    trusted.load_cert_chain(tmp_path / "client.crt", tmp_path / "client.key")
    body = json.dumps(_args(make_gpu_pod(mem=1), ["gpu-0"]))
    try:
        async with aiohttp.ClientSession() as session:
            url = f"https://127.0.0.1:{server.port}"
            async with session.post(url + "/filter", data=body, ssl=anonymous) as answer:
                assert answer.status == 401 and (await answer.json())["Error"] == "a client certificate is required"
            async with session.get(url + "/healthz", ssl=anonymous) as answer:
                assert answer.status == 200
            async with session.post(url + "/filter", data=body, ssl=trusted) as answer:
                assert answer.status == 200 and (await answer.json())["NodeNames"] == ["gpu-0"]
    finally:
        await server.close()


async def test_filter_leaves_out_the_pods_own_interrupted_reservation(
    client: Client, cache: store.Store, make_gpu_pod: Factory
) -> None:
    retried = make_gpu_pod("retried", uid="retry-uid", mem=2)
    note = allocation.bind_annotations(
        allocation.Allocation(
            uid="retry-uid", namespace="team-a", name="retried", node="small", cards=(0,), memory_gib=2, assumed_at=NOW
        ),
        card_memory_gib=2,
    )
    cache.put_pod({**retried, "metadata": {**retried["metadata"], "annotations": note}})
    status, answer = await _post(client, "/filter", _args(retried, ["small"]))
    assert answer["NodeNames"] == ["small"], answer
    status, answer = await _post(client, "/filter", _args(make_gpu_pod("other", mem=2), ["small"]))
    assert answer["NodeNames"] == [] and "GPU0 with 0 GiB free" in answer["FailedNodes"]["small"]


def test_cached_node_states_follow_changes_and_reservation_expiry(make_node: Factory, make_gpu_pod: Factory) -> None:
    cache = store.Store()
    cache.replace_nodes([make_node("n")])
    cache.replace_leases([])  # no ledger Leases yet
    cache.replace_pods([])
    first = cache.state("n", now=NOW, ttl=60)
    assert first is not None and cache.state("n", now=NOW + 1, ttl=60) is first, "unchanged node: cached"
    entry = allocation.Allocation(
        uid="r", namespace="a", name="r", node="n", cards=(0,), memory_gib=5, assumed_at=NOW, expires=NOW + 30
    )
    reserved = make_node("n", annotations={gpu.RESERVATIONS_ANNOTATION: reservations.encode({"r": entry})})
    reserved["metadata"]["resourceVersion"] = "2"
    cache.put_node(reserved)
    held = cache.state("n", now=NOW + 1, ttl=60)
    assert held is not None and held.cards[0].memory_used == 5
    after = cache.state("n", now=NOW + 31, ttl=60)
    assert after is not None and after.cards[0].memory_used == 0, "the cache must not outlive the reservation"
    own = cache.state("n", now=NOW + 1, ttl=60, exclude_uid="r")
    assert own is not None and own.cards[0].memory_used == 0
    note = allocation.bind_annotations(
        allocation.Allocation(uid="b", namespace="a", name="b", node="n", cards=(2,), memory_gib=7, assumed_at=NOW),
        card_memory_gib=15,
    )
    cache.put_pod(make_gpu_pod("b", uid="b", mem=7, node_name="n", annotations=note))
    latest = cache.state("n", now=NOW + 31, ttl=60)
    assert latest is not None and [c.memory_used for c in latest.cards] == [0, 0, 7, 0]


def _ledger_lease(entries: dict[str, allocation.Allocation]) -> dict[str, Any]:
    """Node n's ledger Lease holding `entries`."""
    lease = reservations.lease_body("n", "uid-n", entries, "another-replica")
    lease["metadata"]["resourceVersion"] = "7"
    return lease


def _entry(uid: str, *, card: int, assumed: float = NOW) -> allocation.Allocation:
    return allocation.Allocation(
        uid=uid, namespace="a", name=uid, node="n", cards=(card,), memory_gib=5, assumed_at=assumed, expires=assumed + 60
    )


def test_the_cache_ignores_ledger_entries_of_pods_bound_elsewhere_finished_or_long_gone(
    make_node: Factory, make_gpu_pod: Factory
) -> None:
    cache = store.Store()
    entries = {
        "elsewhere": _entry("elsewhere", card=0),
        "done": _entry("done", card=1),
        "unseen": _entry("unseen", card=2),
        "waiting": _entry("waiting", card=3),
    }
    cache.replace_nodes([make_node("n")])
    cache.replace_leases([_ledger_lease(entries)])
    cache.replace_pods(
        [
            make_gpu_pod("elsewhere", uid="elsewhere", mem=5, node_name="other"),
            make_gpu_pod("done", uid="done", mem=5, phase="Succeeded"),
            make_gpu_pod("waiting", uid="waiting", mem=5),
        ]
    )
    early = cache.state("n", now=NOW + 1, ttl=60)
    assert early is not None and [c.memory_used for c in early.cards] == [0, 0, 5, 5], "an unseen pod may just be lagging"
    late = cache.state("n", now=NOW + reservations.IN_FLIGHT_GRACE_S + 1, ttl=60)
    assert late is not None and [c.memory_used for c in late.cards] == [0, 0, 0, 5]
    assert cache.stale_ledgers(now=NOW + 1) == ["n"]


def test_a_ledger_entry_of_a_pod_seen_deleted_frees_its_card_at_once(make_node: Factory, make_gpu_pod: Factory) -> None:
    """Inside the in-flight grace an unknown pod's entry still counts (it may be lagging), but a pod
    the watch saw deleted holds nothing: a preemption's victim deleted a second after its bind must
    not keep its card through its entry (issue 27)."""
    cache = store.Store()
    cache.replace_nodes([make_node("n")])
    cache.replace_leases([_ledger_lease({"victim": _entry("victim", card=0)})])
    victim = make_gpu_pod("victim", uid="victim", mem=5, node_name="n", phase="Running")
    cache.replace_pods([victim])
    before = cache.state("n", now=NOW + 1, ttl=60)
    assert before is not None and [c.memory_used for c in before.cards][0] == 5
    cache.apply("Pod", "DELETED", victim)
    after = cache.state("n", now=NOW + 1, ttl=60)
    assert after is not None and [c.memory_used for c in after.cards][0] == 0


def test_a_ledger_pod_moving_elsewhere_refreshes_the_cached_state(make_node: Factory, make_gpu_pod: Factory) -> None:
    cache = store.Store()
    cache.replace_nodes([make_node("n")])
    waiting = make_gpu_pod("w", uid="w", mem=5)
    cache.replace_leases([_ledger_lease({"w": _entry("w", card=0)})])
    cache.replace_pods([waiting])
    held = cache.state("n", now=NOW + 1, ttl=60)
    assert held is not None and held.cards[0].memory_used == 5
    assert cache.stale_ledgers(now=NOW + 1) == []
    moved = {
        **waiting,
        "metadata": {**waiting["metadata"], "resourceVersion": "9"},
        "spec": {**waiting["spec"], "nodeName": "other"},
    }
    cache.put_pod(moved)
    freed = cache.state("n", now=NOW + 1, ttl=60)
    assert freed is not None and freed.cards[0].memory_used == 0


async def test_the_app_prunes_stale_ledgers_in_the_background(
    aiohttp_client: Callable[[web.Application], Awaitable[Client]], apiserver: Any, make_node: Factory
) -> None:
    apiserver.add_node(make_node("n"))
    lease = await apiserver.create_lease(
        reservations.LEDGER_NAMESPACE, _ledger_lease({"gone": _entry("gone", card=0, assumed=NOW - 100)})
    )
    cache = store.Store()
    cache.replace_nodes(list(apiserver.nodes.values()))
    cache.replace_leases([lease])
    cache.replace_pods([])
    settings = app.Settings(clock=lambda: NOW)
    application = app.make_app(
        cache=cache, bind=binder.Binder(apiserver, clock=lambda: NOW, cache=cache), settings=settings, tidy_every=0.01
    )
    await aiohttp_client(application)
    deadline = asyncio.get_running_loop().time() + 5
    key = (reservations.LEDGER_NAMESPACE, "gpu-ledger.n")
    while reservations.lease_reservations(apiserver.leases[key]) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    assert reservations.lease_reservations(apiserver.leases[key]) == {}
    assert cache.stale_ledgers(now=NOW) == []
    assert (
        "annotations" not in apiserver.nodes["n"]["metadata"]
        or gpu.RESERVATIONS_ANNOTATION not in apiserver.nodes["n"]["metadata"]["annotations"]
    )


def test_the_cache_counts_an_earlier_versions_node_ledger_with_the_lease_but_never_tidies_it(
    make_node: Factory, make_gpu_pod: Factory
) -> None:
    """Upgrade: entries on the Node annotation (written before the Lease) hold their cards next to
    the Lease's until they expire; the Lease's entry wins for a pod in both; only Leases get pruned."""
    old = {"old": _entry("old", card=0, assumed=NOW - 100), "both": _entry("both", card=1)}
    node = make_node("n", annotations={gpu.RESERVATIONS_ANNOTATION: reservations.encode(old)})
    cache = store.Store()
    cache.replace_nodes([node])
    cache.replace_leases([_ledger_lease({"both": _entry("both", card=2), "new": _entry("new", card=3)})])
    cache.replace_pods([make_gpu_pod(uid, uid=uid, mem=5) for uid in ("old", "both", "new")])  # waiting to be bound
    state = cache.state("n", now=NOW - 50, ttl=60)
    assert state is not None and [c.memory_used for c in state.cards] == [5, 0, 5, 5]
    assert cache.stale_ledgers(now=NOW - 50) == []
    expired = cache.state("n", now=NOW - 39, ttl=60)  # the old entry expired (60 s after it was made)
    assert expired is not None and [c.memory_used for c in expired.cards] == [0, 0, 5, 5]
    assert cache.stale_ledgers(now=NOW - 39) == [], "the Node annotation is never written: nothing to prune"
    elsewhere = store.Store(namespace="tenant")  # a Lease outside the ledger namespace is no ledger
    elsewhere.replace_nodes([make_node("n")])
    elsewhere.replace_leases([_ledger_lease({"new": _entry("new", card=3)})])
    elsewhere.replace_pods([])
    ignored = elsewhere.state("n", now=NOW, ttl=60)
    assert ignored is not None and [c.memory_used for c in ignored.cards] == [0, 0, 0, 0]


@pytest.mark.parametrize("path", ["/filter", "/prioritize", "/bind"])
async def test_an_unknown_charset_or_a_body_nested_too_deep_is_a_400(client: Client, path: str) -> None:
    async with client.post(path, data=b"{}", headers={"Content-Type": "application/json; charset=no-such-codec"}) as answer:
        assert answer.status == 400 and "unknown charset 'no-such-codec'" in (await answer.json())["Error"]
    async with client.post(path, data=b"[" * 100_000 + b"]" * 100_000, headers={"Content-Type": "application/json"}) as answer:
        assert answer.status == 400 and "nested too deeply" in (await answer.json())["Error"]


def test_the_cache_follows_the_ledger_lease_watch(make_node: Factory, make_gpu_pod: Factory) -> None:
    """Lease events: a newer version replaces the held one, an older one arriving late changes
    nothing, a deletion frees the node's entries, and the watch's progress is recorded."""
    cache = store.Store()
    cache.replace_nodes([make_node("n")])
    cache.replace_leases([])
    cache.replace_pods([make_gpu_pod(uid, uid=uid, mem=5) for uid in ("a", "b")])
    cache.seen("Lease", "6")
    assert cache.lease("n") is None and cache.leases_version == 6
    first = _ledger_lease({"a": _entry("a", card=0)})  # resourceVersion 7
    cache.apply("Lease", "ADDED", first)
    newer = _ledger_lease({"a": _entry("a", card=0), "b": _entry("b", card=1)})
    newer["metadata"]["resourceVersion"] = "9"
    cache.apply("Lease", "MODIFIED", newer)
    cache.put_lease(first)  # our own write's answer, older than the event already here
    state = cache.state("n", now=NOW + 1, ttl=60)
    assert state is not None and [c.memory_used for c in state.cards] == [5, 5, 0, 0]
    assert cache.leases_version == 9 and cache.lease("n") == store.slim_lease(newer)
    gone = {**newer, "metadata": {**newer["metadata"], "resourceVersion": "11"}}
    cache.apply("Lease", "DELETED", gone)
    freed = cache.state("n", now=NOW + 1, ttl=60)
    assert cache.lease("n") is None and freed is not None and [c.memory_used for c in freed.cards] == [0, 0, 0, 0]
    assert cache.leases_version == 11


def test_a_node_without_a_lease_needs_the_pod_cache_only_up_to_the_lease_list_or_its_leases_deletion(make_node: Factory) -> None:
    cache = store.Store()
    cache.replace_nodes([make_node("n"), make_node("m")])
    cache.replace_leases([])
    assert cache.lease_floor("n") == -1, "not listed yet: nothing is provable"
    cache.seen("Lease", "5")
    cache.apply("Lease", "ADDED", _ledger_lease({"a": _entry("a", card=0)}))  # n's Lease at 7
    cache.seen("Lease", "20")  # other nodes' Lease writes move the watch on ...
    assert cache.lease_floor("m") == 5, "... but a node that never had a Lease needs only the list's revision"
    cache.apply("Lease", "DELETED", {**_ledger_lease({}), "metadata": {**_ledger_lease({})["metadata"], "resourceVersion": "23"}})
    assert cache.lease("n") is None and cache.lease_floor("n") == 23, "its entries were pruned at or before the deletion"
    cache.replace_leases([])  # a relist
    cache.seen("Lease", "30")
    assert cache.lease_floor("n") == 30
