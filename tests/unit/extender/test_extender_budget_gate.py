"""The budget gate's keeper (`webhook.extender.gates`): pods the device plugin or DRA places wait at
`gpu-admission.io/budget` until their charge is in their namespace's ledger, against a fake keeper
and the in-memory apiserver (which applies the JSON patches, `test` operations included)."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
from collections.abc import Mapping
from typing import Any

import pytest

from policies.gpu import budgets
from policies.settings import budgets as budget_settings
from tests.unit.extender.conftest import FakeApiServer
from webhook.extender import gates, kube
from webhook.kube import errors

Object = dict[str, Any]
GATE = {"name": "gpu-admission.io/budget"}
OTHER = {"name": "example.com/other"}
GIB = 1024
NODE = {"metadata": {"name": "gpu-1", "labels": {"nvidia.com/gpu.memory": str(80 * GIB)}}}  # GFD: MiB per card


def budget(name: str, memory: str, cards: int | None = None) -> budget_settings.Budget:
    entry: dict[str, Any] = {"name": name, "namespaces": [name], "memory": memory}
    if cards is not None:
        entry["cards"] = cards
    [found] = budget_settings.budgets([entry])
    return found


class FakeKeeper:
    """Budgets by namespace and a used total per namespace; a charge is committed where it fits."""

    def __init__(self, budgets_: Mapping[str, budget_settings.Budget], *, used_mib: Mapping[str, int] | None = None) -> None:
        self.budgets = dict(budgets_)
        self.used = dict(used_mib or {})
        self.unreadable: set[str] = set()
        self.charged: list[tuple[str, budgets.Charge, float | None]] = []
        self.failing: set[str] = set()  # pods whose ledger write fails
        self.refused: list[str] = []

    def budget_of(self, namespace: str) -> budget_settings.Budget | None:
        if namespace in self.unreadable:
            raise RuntimeError(f"the budget Lease of {namespace} cannot be read: 503")
        return self.budgets.get(namespace)

    async def charge(self, pod: Mapping[str, Any], charge: budgets.Charge, *, expires: float | None) -> str:
        await asyncio.sleep(0)
        metadata = pod["metadata"]
        if metadata["name"] in self.failing:
            raise RuntimeError("leases.coordination.k8s.io: 503 the server is busy")
        namespace = metadata["namespace"]
        found = self.budgets[namespace]
        used = budgets.Charge(memory_mib=self.used.get(namespace, 0))
        why = budgets.over(found.memory_mib, found.cards, used, charge)
        if why:
            self.refused.append(metadata["name"])
            return f"NAMESPACE_BUDGET: {found.describe()}: {why}"
        self.used[namespace] = used.memory_mib + charge.memory_mib
        self.charged.append((metadata["name"], charge, expires))
        return ""


class Cache:
    """The watch cache as the gatekeeper reads it: here, what the fake apiserver holds (slim enough)."""

    def __init__(self, apiserver: FakeApiServer, nodes: list[Object] | None = None) -> None:
        self.apiserver = apiserver
        self._nodes = [NODE] if nodes is None else nodes
        self.frozen: list[Object] | None = None  # set: the cache lags behind the apiserver
        self.synced = True

    def pods(self) -> list[Object]:
        if self.frozen is not None:
            return copy.deepcopy(self.frozen)
        return [copy.deepcopy(p) for p in self.apiserver.pods.values()]

    def nodes(self) -> list[Object]:
        return self._nodes

    def claims_gate_charge(self, pod: Mapping[str, Any]) -> budgets.Charge:
        return budgets.NOTHING


def gated_pod(
    name: str,
    limits: Mapping[str, Any],
    *,
    namespace: str = "team-a",
    created: str | None = "2026-12-06T10:00:00Z",
    gates_: list[dict[str, str]] | None = None,
) -> Object:
    metadata: Object = {"name": name, "namespace": namespace, "uid": f"uid-{name}", "resourceVersion": "1"}
    if created is not None:
        metadata["creationTimestamp"] = created
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "containers": [{"name": "main", "resources": {"limits": dict(limits)}}],
            "schedulingGates": [dict(g) for g in (gates_ if gates_ is not None else [GATE])],
        },
        "status": {"phase": "Pending"},
    }


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def keeper_of(apiserver: FakeApiServer, keeper: FakeKeeper, **kwargs: Any) -> tuple[gates.Gatekeeper, Cache, Clock]:
    cache, clock = Cache(apiserver), Clock()
    return gates.Gatekeeper(keeper, cache, apiserver, monotonic=clock, wall=lambda: 1_796_550_000.0, **kwargs), cache, clock


def gates_of(apiserver: FakeApiServer, name: str, namespace: str = "team-a") -> list[Object]:
    found: list[Object] = apiserver.pods[(namespace, name)]["spec"]["schedulingGates"]
    return found


# --- lifted ------------------------------------------------------------------------------------------------


async def test_a_pod_whose_charge_is_committed_is_lifted_with_the_exact_patch(apiserver: FakeApiServer) -> None:
    apiserver.add_pod(gated_pod("train", {"nvidia.com/gpu": 1}))
    keeper = FakeKeeper({"team-a": budget("team-a", "160Gi")})
    gatekeeper, _, _ = keeper_of(apiserver, keeper)

    done = await gatekeeper.run_once()

    assert done.lifted == ["team-a/train"] and done.kept == {}
    assert keeper.charged == [("train", budgets.Charge(memory_mib=80 * GIB, cards=1), None)]  # the cluster's largest card
    assert apiserver.pod_patches == [
        (
            "team-a",
            "train",
            [
                {"op": "test", "path": "/metadata/uid", "value": "uid-train"},
                {"op": "test", "path": "/spec/schedulingGates/0", "value": {"name": "gpu-admission.io/budget"}},
                {"op": "remove", "path": "/spec/schedulingGates/0"},
            ],
        )
    ]
    assert gates_of(apiserver, "train") == []
    assert apiserver.recorded_events == []


async def test_a_pod_another_gate_holds_is_charged_only_once_that_gate_is_lifted(apiserver: FakeApiServer) -> None:
    apiserver.add_pod(gated_pod("queued", {"nvidia.com/gpu": 1}, gates_=[OTHER, GATE], created="2026-12-06T09:00:00Z"))
    apiserver.add_pod(gated_pod("ready", {"nvidia.com/mig-1g.10gb": 1}, created="2026-12-06T09:30:00Z"))
    keeper = FakeKeeper({"team-a": budget("team-a", "160Gi")})
    gatekeeper, _, _ = keeper_of(apiserver, keeper)

    done = await gatekeeper.run_once()

    assert done.kept == {"team-a/queued": "waits for its other scheduling gates first (example.com/other)"}
    assert done.lifted == ["team-a/ready"]  # the older pod held elsewhere takes no turn
    assert [name for name, _, _ in keeper.charged] == ["ready"] and apiserver.recorded_events == []
    apiserver.pods[("team-a", "queued")]["spec"]["schedulingGates"] = [GATE]  # Kueue admitted it
    assert (await gatekeeper.run_once()).lifted == ["team-a/queued"]
    assert [name for name, _, _ in keeper.charged] == ["ready", "queued"]


async def test_where_there_is_no_budget_the_gate_is_lifted_at_its_index_beside_others(apiserver: FakeApiServer) -> None:
    apiserver.add_pod(gated_pod("train", {"nvidia.com/gpu": 1}, namespace="team-b", gates_=[OTHER, GATE]))
    gatekeeper, _, _ = keeper_of(apiserver, FakeKeeper({}))

    assert (await gatekeeper.run_once()).lifted == ["team-b/train"]
    [(_, _, operations)] = apiserver.pod_patches
    assert operations == [
        {"op": "test", "path": "/metadata/uid", "value": "uid-train"},
        {"op": "test", "path": "/spec/schedulingGates/1", "value": {"name": "gpu-admission.io/budget"}},
        {"op": "remove", "path": "/spec/schedulingGates/1"},
    ]
    assert gates_of(apiserver, "train", "team-b") == [OTHER]  # the other gate is not ours to lift


@pytest.mark.parametrize(
    ("limits", "charged"),
    [
        ({"nvidia.com/mig-3g.40gb": 1}, budgets.Charge(memory_mib=40 * GIB)),
        ({"nvidia.com/gpu.shared": 1}, budgets.Charge(memory_mib=80 * GIB)),
    ],
    ids=["mig", "time-sliced"],
)
async def test_each_device_plugin_kind_is_charged_before_it_is_lifted(
    apiserver: FakeApiServer, limits: dict[str, Any], charged: budgets.Charge
) -> None:
    apiserver.add_pod(gated_pod("p", limits))
    keeper = FakeKeeper({"team-a": budget("team-a", "160Gi")})
    gatekeeper, _, _ = keeper_of(apiserver, keeper)

    assert (await gatekeeper.run_once()).lifted == ["team-a/p"]
    assert keeper.charged == [("p", charged, None)]
    assert gates_of(apiserver, "p") == []


async def test_a_pod_in_a_namespace_without_a_budget_is_lifted_without_a_charge(apiserver: FakeApiServer) -> None:
    # A budget removed after the pod was gated must not strand it.
    apiserver.add_pod(gated_pod("train", {"nvidia.com/gpu": 8}, namespace="team-b"))
    keeper = FakeKeeper({"team-a": budget("team-a", "16Gi")})
    gatekeeper, _, _ = keeper_of(apiserver, keeper)

    done = await gatekeeper.run_once()

    assert done.lifted == ["team-b/train"]
    assert keeper.charged == [] and keeper.refused == []
    assert gates_of(apiserver, "train", "team-b") == []


async def test_pods_without_the_gate_are_left_alone(apiserver: FakeApiServer) -> None:
    apiserver.add_pod(gated_pod("other", {"nvidia.com/gpu": 1}, gates_=[OTHER]))
    apiserver.add_pod(gated_pod("none", {"nvidia.com/gpu": 1}, gates_=[]))
    finished = gated_pod("done", {"nvidia.com/gpu": 1})
    finished["status"]["phase"] = "Failed"
    apiserver.add_pod(finished)
    keeper = FakeKeeper({"team-a": budget("team-a", "160Gi")})
    gatekeeper, _, _ = keeper_of(apiserver, keeper)

    assert await gatekeeper.run_once() == gates.Pass()
    assert apiserver.pod_patches == [] and keeper.charged == []


# --- kept ----------------------------------------------------------------------------------------------------


async def test_a_refused_pod_stays_gated_with_one_event_a_minute(apiserver: FakeApiServer) -> None:
    apiserver.add_pod(gated_pod("train", {"nvidia.com/gpu": 1}))
    keeper = FakeKeeper({"team-a": budget("team-a", "100Gi")}, used_mib={"team-a": 30 * GIB})
    gatekeeper, _, clock = keeper_of(apiserver, keeper)

    first = await gatekeeper.run_once()
    clock.now += 30
    await gatekeeper.run_once()

    reason = "NAMESPACE_BUDGET: budget 'team-a' (100Gi of GPU memory): 30 GiB used + 80 GiB asked > 100 GiB of GPU memory"
    assert first.kept == {"team-a/train": reason} and first.lifted == []
    assert apiserver.pod_patches == [] and gates_of(apiserver, "train") == [GATE]
    [event] = apiserver.recorded_events
    assert event["reason"] == "NamespaceBudget" and event["type"] == "Warning"
    assert event["message"] == f"waiting at scheduling gate gpu-admission.io/budget: {reason}"
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "team-a",
        "name": "train",
        "uid": "uid-train",
    }
    assert event["metadata"]["namespace"] == "team-a" and event["metadata"]["name"].startswith("train.")

    clock.now += 31  # a minute after the first
    await gatekeeper.run_once()
    assert len(apiserver.recorded_events) == 2


async def test_events_are_bounded_per_pass_and_the_rest_come_in_the_next(apiserver: FakeApiServer) -> None:
    count = gates.EVENTS_PER_PASS + 10
    names = [f"ns{i:03d}" for i in range(count)]
    for namespace in names:
        apiserver.add_pod(gated_pod(f"p-{namespace}", {"nvidia.com/gpu": 1}, namespace=namespace))
    # 30 GiB used of 100 in each: 80 GiB does not fit.
    keeper = FakeKeeper({n: budget(n, "100Gi") for n in names}, used_mib=dict.fromkeys(names, 30 * GIB))
    gatekeeper, _, clock = keeper_of(apiserver, keeper)

    await gatekeeper.run_once()
    assert len(apiserver.recorded_events) == gates.EVENTS_PER_PASS
    clock.now += 1
    await gatekeeper.run_once()
    assert len(apiserver.recorded_events) == count
    assert len({e["involvedObject"]["name"] for e in apiserver.recorded_events}) == count  # each pod once
    clock.now += 1
    await gatekeeper.run_once()
    assert len(apiserver.recorded_events) == count


async def test_a_pod_is_lifted_once_room_frees_up(apiserver: FakeApiServer) -> None:
    apiserver.add_pod(gated_pod("train", {"nvidia.com/gpu": 1}))
    keeper = FakeKeeper({"team-a": budget("team-a", "100Gi")}, used_mib={"team-a": 30 * GIB})
    gatekeeper, _, _ = keeper_of(apiserver, keeper)
    assert (await gatekeeper.run_once()).lifted == []

    keeper.used["team-a"] = 20 * GIB  # a pod of the namespace finished
    gatekeeper.wake()

    assert (await gatekeeper.run_once()).lifted == ["team-a/train"]
    assert gates_of(apiserver, "train") == []


async def test_unreadable_budgets_keep_the_pod_gated_and_say_why(
    apiserver: FakeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    apiserver.add_pod(gated_pod("train", {"nvidia.com/gpu": 1}))
    apiserver.add_pod(gated_pod("infer", {"nvidia.com/mig-1g.10gb": 1}))
    keeper = FakeKeeper({"team-a": budget("team-a", "160Gi")})
    keeper.unreadable.add("team-a")
    gatekeeper, _, _ = keeper_of(apiserver, keeper)

    with caplog.at_level(logging.WARNING, logger="webhook.extender.gates"):
        done = await gatekeeper.run_once()
        await gatekeeper.run_once()

    assert done.lifted == [] and set(done.kept) == {"team-a/train", "team-a/infer"}
    assert apiserver.pod_patches == [] and keeper.charged == []
    [logged] = [r.getMessage() for r in caplog.records]  # once a minute per namespace, not per pod or pass
    assert "namespace team-a" in logged and "cannot be read: 503" in logged


async def test_a_pod_that_can_never_fit_is_kept_with_an_event_and_holds_nobody_up(apiserver: FakeApiServer) -> None:
    apiserver.add_pod(gated_pod("huge", {"nvidia.com/gpu": 4}, created="2026-12-06T09:00:00Z"))
    apiserver.add_pod(gated_pod("small", {"nvidia.com/mig-1g.10gb": 1}, created="2026-12-06T09:30:00Z"))
    keeper = FakeKeeper({"team-a": budget("team-a", "160Gi")})
    gatekeeper, _, _ = keeper_of(apiserver, keeper)

    done = await gatekeeper.run_once()

    assert done.lifted == ["team-a/small"]
    assert "can never run here" in done.kept["team-a/huge"] and "0 GiB used + 320 GiB asked > 160 GiB" in done.kept["team-a/huge"]
    assert [e["involvedObject"]["name"] for e in apiserver.recorded_events] == ["huge"]
    assert keeper.refused == []  # never asked: it cannot fit


async def test_a_charge_that_cannot_be_computed_keeps_the_pod_gated(apiserver: FakeApiServer) -> None:
    apiserver.add_pod(gated_pod("train", {"nvidia.com/gpu": 1}))
    keeper = FakeKeeper({"team-a": budget("team-a", "160Gi")})
    gatekeeper = gates.Gatekeeper(keeper, Cache(apiserver, nodes=[{"metadata": {"name": "bare"}}]), apiserver)

    done = await gatekeeper.run_once()

    assert done.lifted == [] and "cannot be computed" in done.kept["team-a/train"]
    assert keeper.charged == [] and len(apiserver.recorded_events) == 1


# --- order ----------------------------------------------------------------------------------------------------


async def test_an_older_big_pod_is_not_starved_by_younger_small_ones(apiserver: FakeApiServer) -> None:
    # 30 GiB used of 100: the big pod (80) does not fit yet, the small one (10) would; it waits its turn.
    apiserver.add_pod(gated_pod("small", {"nvidia.com/mig-1g.10gb": 1}, created="2026-12-06T10:00:05Z"))
    apiserver.add_pod(gated_pod("big", {"nvidia.com/gpu": 1}, created="2026-12-06T10:00:00Z"))
    apiserver.add_pod(gated_pod("elsewhere", {"nvidia.com/mig-1g.10gb": 1}, namespace="team-b", created="2026-12-06T10:00:09Z"))
    keeper = FakeKeeper({"team-a": budget("team-a", "100Gi"), "team-b": budget("team-b", "100Gi")}, used_mib={"team-a": 30 * GIB})
    gatekeeper, _, _ = keeper_of(apiserver, keeper)

    done = await gatekeeper.run_once()

    assert done.lifted == ["team-b/elsewhere"]  # another namespace's queue is its own
    assert keeper.refused == ["big"]
    assert (
        done.kept["team-a/small"]
        == "asks for 10 GiB and waits for the older pod team-a/big, first in line for budget 'team-a' (100Gi of GPU memory)"
    )

    keeper.used["team-a"] = 10 * GIB
    again = await gatekeeper.run_once()

    assert again.lifted == ["team-a/big", "team-a/small"]  # oldest first
    assert [name for name, _, _ in keeper.charged] == ["elsewhere", "big", "small"]


async def test_a_failed_ledger_write_keeps_the_pod_and_its_younger_neighbours_gated(
    apiserver: FakeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    apiserver.add_pod(gated_pod("first", {"nvidia.com/mig-1g.10gb": 1}, created="2026-12-06T10:00:00Z"))
    apiserver.add_pod(gated_pod("second", {"nvidia.com/mig-1g.10gb": 1}, created="2026-12-06T10:00:01Z"))
    apiserver.add_pod(gated_pod("other", {"nvidia.com/mig-1g.10gb": 1}, namespace="team-b"))
    keeper = FakeKeeper({"team-a": budget("team-a", "100Gi"), "team-b": budget("team-b", "100Gi")})
    keeper.failing.add("first")
    gatekeeper, _, _ = keeper_of(apiserver, keeper)

    with caplog.at_level(logging.WARNING, logger="webhook.extender.gates"):
        done = await gatekeeper.run_once()

    assert done.lifted == ["team-b/other"]  # the pass goes on in other namespaces
    assert done.kept["team-a/first"].startswith("its charge could not be committed: leases.coordination.k8s.io: 503")
    assert "waits for the older pod team-a/first" in done.kept["team-a/second"]
    assert any("cannot commit the charge of team-a/first" in r.getMessage() for r in caplog.records)
    keeper.failing.clear()
    assert (await gatekeeper.run_once()).lifted == ["team-a/first", "team-a/second"]


async def test_pods_without_a_creation_time_come_after_in_the_order_first_seen(apiserver: FakeApiServer) -> None:
    apiserver.add_pod(gated_pod("b", {"nvidia.com/mig-1g.10gb": 1}, created=None))
    apiserver.add_pod(gated_pod("a", {"nvidia.com/mig-1g.10gb": 1}, created=None))
    apiserver.add_pod(gated_pod("c", {"nvidia.com/mig-1g.10gb": 1}))
    keeper = FakeKeeper({"team-a": budget("team-a", "100Gi")})
    gatekeeper, _, _ = keeper_of(apiserver, keeper)

    assert (await gatekeeper.run_once()).lifted == ["team-a/c", "team-a/b", "team-a/a"]


# --- races ------------------------------------------------------------------------------------------------------


async def test_a_lift_whose_test_fails_removes_nothing_and_is_tried_again(apiserver: FakeApiServer) -> None:
    apiserver.add_pod(gated_pod("train", {"nvidia.com/mig-1g.10gb": 1}, namespace="team-b", gates_=[OTHER, GATE]))
    gatekeeper, cache, _ = keeper_of(apiserver, FakeKeeper({}))
    cache.frozen = cache.pods()
    apiserver.pods[("team-b", "train")]["spec"]["schedulingGates"] = [GATE]  # the other gate went, the cache lags

    first = await gatekeeper.run_once()

    assert first.lifted == [] and gates_of(apiserver, "train", "team-b") == [GATE]  # index 1 is no gate now
    cache.frozen = None  # the watch catches up
    assert (await gatekeeper.run_once()).lifted == ["team-b/train"]
    assert gates_of(apiserver, "train", "team-b") == []


async def test_a_gate_another_replica_lifted_first_is_no_error_and_no_second_charge(apiserver: FakeApiServer) -> None:
    apiserver.add_pod(gated_pod("train", {"nvidia.com/mig-1g.10gb": 1}))
    keeper = FakeKeeper({"team-a": budget("team-a", "100Gi")})
    gatekeeper, cache, _ = keeper_of(apiserver, keeper)
    cache.frozen = cache.pods()
    apiserver.pods[("team-a", "train")]["spec"]["schedulingGates"] = []  # the other replica's lift

    assert (await gatekeeper.run_once()).lifted == []  # its test failed: 422, nothing removed
    assert [name for name, _, _ in keeper.charged] == ["train"]  # the same ledger entry, by pod UID, as the other's
    cache.frozen = None
    assert await gatekeeper.run_once() == gates.Pass()


async def test_a_pod_replaced_under_the_same_name_is_not_lifted_on_the_old_ones_charge(apiserver: FakeApiServer) -> None:
    apiserver.add_pod(gated_pod("train", {"nvidia.com/mig-1g.10gb": 1}))
    keeper = FakeKeeper({"team-a": budget("team-a", "100Gi")})
    gatekeeper, cache, _ = keeper_of(apiserver, keeper)
    cache.frozen = cache.pods()
    apiserver.pods[("team-a", "train")]["metadata"]["uid"] = "uid-new"

    assert (await gatekeeper.run_once()).lifted == []
    assert gates_of(apiserver, "train") == [GATE]


async def test_a_lifted_pod_the_cache_still_shows_gated_is_not_patched_again(apiserver: FakeApiServer) -> None:
    apiserver.add_pod(gated_pod("train", {"nvidia.com/mig-1g.10gb": 1}))
    keeper = FakeKeeper({"team-a": budget("team-a", "100Gi")})
    gatekeeper, cache, _ = keeper_of(apiserver, keeper)
    cache.frozen = cache.pods()

    assert (await gatekeeper.run_once()).lifted == ["team-a/train"]
    assert await gatekeeper.run_once() == gates.Pass()
    assert len(apiserver.pod_patches) == 1 and len(keeper.charged) == 1


async def test_nothing_happens_before_the_cache_has_its_first_lists(apiserver: FakeApiServer) -> None:
    apiserver.add_pod(gated_pod("train", {"nvidia.com/gpu": 1}))
    keeper = FakeKeeper({"team-a": budget("team-a", "160Gi")})
    gatekeeper, cache, _ = keeper_of(apiserver, keeper)
    cache.synced = False

    assert await gatekeeper.run_once() == gates.Pass()
    assert apiserver.pod_patches == [] and apiserver.recorded_events == [] and keeper.charged == []
    cache.synced = True
    assert (await gatekeeper.run_once()).lifted == ["team-a/train"]


async def test_a_pod_gone_before_its_lift_is_no_error(apiserver: FakeApiServer) -> None:
    apiserver.add_pod(gated_pod("train", {"nvidia.com/mig-1g.10gb": 1}))
    keeper = FakeKeeper({"team-a": budget("team-a", "100Gi")})
    gatekeeper, cache, _ = keeper_of(apiserver, keeper)
    cache.frozen = cache.pods()
    del apiserver.pods[("team-a", "train")]

    assert (await gatekeeper.run_once()).lifted == []


async def test_the_loop_runs_when_woken_and_survives_a_failing_pass(apiserver: FakeApiServer) -> None:
    keeper = FakeKeeper({"team-a": budget("team-a", "100Gi")})
    gatekeeper = gates.Gatekeeper(keeper, Cache(apiserver), apiserver, interval=3600.0)
    task = asyncio.create_task(gatekeeper.run())
    try:
        await asyncio.sleep(0)
        apiserver.add_pod(gated_pod("train", {"nvidia.com/mig-1g.10gb": 1}))
        gatekeeper.wake()
        for _ in range(100):
            await asyncio.sleep(0)
            if not gates_of(apiserver, "train"):
                break
        assert gates_of(apiserver, "train") == []
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


# --- the adapter ------------------------------------------------------------------------------------------------


class Raw:
    def __init__(self, status: int, body: Any) -> None:
        self.status, self.reason = status, ""
        self.headers: dict[str, str] = {}
        self._data = json.dumps(body).encode()

    def read(self) -> bytes:
        return self._data


class Client:
    """A stand-in ``ApiClient`` recording what `param_serialize` was given."""

    def __init__(self, answer: Raw) -> None:
        self.answer = answer
        self.sent: list[dict[str, Any]] = []

    def param_serialize(self, **kwargs: Any) -> tuple[()]:
        self.sent.append(kwargs)
        return ()

    def call_api(self, *_: Any, **__: Any) -> Raw:
        return self.answer


async def test_the_kube_adapter_sends_the_json_patch_as_one() -> None:
    client = Client(Raw(200, {"metadata": {"name": "train"}}))
    operations = gates.lift_patch(uid="u1", index=0)

    answer = await kube.KubeApi(client).json_patch_pod("team-a", "train", operations)  # type: ignore[arg-type]  # a stand-in client

    assert answer == {"metadata": {"name": "train"}}
    [sent] = client.sent
    assert sent["method"] == "PATCH" and sent["resource_path"] == "/api/v1/namespaces/team-a/pods/train"
    assert sent["header_params"]["Content-Type"] == "application/json-patch+json"
    assert sent["body"] == operations and ("fieldManager", "gpu-admission-extender") in sent["query_params"]


async def test_the_kube_adapter_reports_a_failed_test_as_422() -> None:
    failure = {"kind": "Status", "status": "Failure", "code": 422, "message": "the server rejected our request: test failed"}
    client = Client(Raw(422, failure))

    with pytest.raises(errors.KubeError) as raised:
        await kube.KubeApi(client).json_patch_pod("team-a", "train", gates.lift_patch(uid="u1", index=0))  # type: ignore[arg-type]  # a stand-in client

    assert raised.value.status == 422 and "test failed" in str(raised.value)


def test_the_extender_may_patch_pods_and_create_events() -> None:
    import pathlib

    import yaml

    deploy = pathlib.Path(__file__).resolve().parents[3] / "deploy" / "extender.yaml"
    documents = [d for d in yaml.safe_load_all(deploy.read_text()) if d]
    [role] = [d for d in documents if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "gpu-admission-extender"]
    verbs = {
        (group, resource): rule["verbs"]
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert verbs[("", "pods")] == ["get", "list", "watch", "patch"]  # the gate's lift
    assert verbs[("", "events")] == ["create"]  # NamespaceBudget


async def test_the_real_cache_and_adapter_fit_the_gatekeeper() -> None:
    # Checked by mypy: `store.Store` is a `gates.Cache`, `kube.KubeApi` a `gates.GateApi`.
    from webhook.extender import store

    cache = store.Store()
    gatekeeper = gates.Gatekeeper(FakeKeeper({}), cache, kube.KubeApi(Client(Raw(200, {}))))  # type: ignore[arg-type]  # a stand-in client
    assert not cache.synced
    assert await gatekeeper.run_once() == gates.Pass()


class Election:
    """An elector as the gatekeeper reads it: whether this replica leads now."""

    def __init__(self, leader: bool) -> None:
        self.leader = leader


async def test_only_the_leader_of_the_replicas_lifts_gates(apiserver: FakeApiServer) -> None:
    # Replicas would otherwise each write the same Events; a follower leaves the pod to the leader.
    apiserver.add_pod(gated_pod("train", {"nvidia.com/gpu": 1}, namespace="team-b"))
    keeper = FakeKeeper({"team-a": budget("team-a", "16Gi")})
    election = Election(leader=False)
    gatekeeper, _, _ = keeper_of(apiserver, keeper, elector=election)

    assert (await gatekeeper.run_once()).lifted == []
    assert gates_of(apiserver, "train", "team-b") == [{"name": budgets.GATE}]

    election.leader = True
    assert (await gatekeeper.run_once()).lifted == ["team-b/train"]
    assert gates_of(apiserver, "train", "team-b") == []
