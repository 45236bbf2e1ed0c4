"""The leader's hold claims, where no DeviceTaintRule API is served (Kubernetes as shipped): one
allocated ResourceClaim in the ledger namespace per device of a card that holds shared pods,
deallocated and deleted when the card is empty; released once a rule API appears; and never counted
by the extender, inspect or the audit as a DRA booking. A claim with the same label in a tenant's
namespace is a tenant's claim."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from policies.gpu import dra
from tests.unit.extender.test_extender_taints import NOW, SLICE, FakeApi, cache_with, sharing_pod
from webhook.extender import store, taints
from webhook.kube import errors as kube_errors

LEDGER = "gpu-admission"


class ClaimsApi(FakeApi):
    """FakeApi that also serves `resource.k8s.io/v1` ResourceClaims, with the apiserver's rules that
    matter here: `status` is written only through its subresource, and a set allocation is immutable
    (it may only be cleared)."""

    def __init__(self, served: Sequence[str]) -> None:
        super().__init__([*served, "v1"])
        self.claims: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []

    def list(self, path: str, *, label_selector: str = "") -> tuple[list[Any], str]:
        if "/resourceclaims" not in path:
            return super().list(path, label_selector=label_selector)
        assert label_selector == f"{dra.RULE_LABEL}=true"
        return [copy.deepcopy(c) for c in self.claims.values()], "1"

    def request(self, method: str, path: str, *, query: Any = (), body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        if "/resourceclaims" not in path:
            return super().request(method, path, query=query, body=body)
        self.calls.append((method, path))
        assert path.startswith(f"/apis/resource.k8s.io/v1/namespaces/{LEDGER}/resourceclaims")
        parts = path.split("/")
        if method == "POST" and body is not None:
            name = body["metadata"]["name"]
            if name in self.claims:
                raise kube_errors.Conflict(f"POST {path}", status=409)
            self.claims[name] = {**copy.deepcopy(dict(body)), "status": {}}  # status is not written on create
            return copy.deepcopy(self.claims[name])
        name = parts[7]
        if name not in self.claims:
            raise kube_errors.NotFound(f"{method} {path}", status=404)
        if method == "PUT" and parts[-1] == "status" and body is not None:
            old, new = self.claims[name]["status"].get("allocation"), body["status"].get("allocation")
            if old is not None and new is not None and old != new:
                raise kube_errors.KubeError(f"PUT {path}: field is immutable", status=422)
            self.claims[name]["status"] = copy.deepcopy(dict(body["status"]))
            return copy.deepcopy(self.claims[name])
        if method == "DELETE":
            return self.claims.pop(name)
        raise AssertionError(f"unexpected {method} {path}")


def keeper_for(api: FakeApi, cache: store.Store) -> taints.Keeper:
    return taints.Keeper(api, cache, elector=None, ttl=60.0, clock=lambda: NOW, namespace=LEDGER)  # type: ignore[arg-type]


async def test_without_the_rule_api_each_device_of_a_shared_card_is_held_by_an_allocated_claim() -> None:
    api = ClaimsApi([])
    pod = sharing_pod()
    cache = cache_with([pod])
    keeper = keeper_for(api, cache)
    assert await keeper.reconcile() == (2, 0)
    assert keeper.version is None and api.rules == {}
    allocated = sorted(r["device"] for c in api.claims.values() for r in c["status"]["allocation"]["devices"]["results"])
    assert allocated == ["gpu-0", "gpu-0-mig-9-0-4"]  # the whole GPU and its MIG device; not gpu-1
    for claim in api.claims.values():
        assert claim["metadata"]["namespace"] == LEDGER
        assert claim["metadata"]["labels"] == {dra.RULE_LABEL: "true"}
        assert "reservedFor" not in claim["status"]  # reserved for no one: the controller never deallocates it
        [request] = claim["spec"]["devices"]["requests"]
        assert request["name"] == dra.HOLD_REQUEST == claim["status"]["allocation"]["devices"]["results"][0]["request"]
        assert request["exactly"]["deviceClassName"] == dra.HOLD_CLASS
    assert await keeper.reconcile() == (0, 0)  # in step: nothing to do
    # The extender's own view: the hold claims hold nothing for DRA, the card stays the pods'.
    cache.replace_claims(list(api.claims.values()))
    assert cache.dra_holds("gpu-0") == {}
    # The card empties: each claim is deallocated (kube-scheduler requeues on that), then deleted.
    cache.apply("Pod", "DELETED", pod)
    api.calls.clear()
    assert await keeper.reconcile() == (0, 2)
    assert api.claims == {}
    assert [m for m, _ in api.calls] == ["PUT", "DELETE", "PUT", "DELETE"]
    assert all(p.endswith("/status") for m, p in api.calls if m == "PUT")


async def test_a_claim_created_but_not_allocated_is_allocated_on_the_next_pass() -> None:
    api = ClaimsApi([])
    device = dra.devices([SLICE])[("gpu.nvidia.com", "gpu-0", "gpu-0")]
    api.claims[dra.rule_name(device)] = {**dra.hold_claim(device, namespace=LEDGER), "status": {}}
    keeper = keeper_for(api, cache_with([sharing_pod()]))
    assert await keeper.reconcile() == (2, 0)  # the unallocated one allocated, the MIG device's created
    assert all(c["status"].get("allocation") for c in api.claims.values())


async def test_once_the_rule_api_is_served_the_hold_claims_are_released() -> None:
    api = ClaimsApi([])
    cache = cache_with([sharing_pod()])
    keeper = keeper_for(api, cache)
    assert await keeper.reconcile() == (2, 0)
    api.served.add("v1alpha3")
    keeper = keeper_for(api, cache)  # looks for the API again (a restart, or `rediscover_s` later)
    assert await keeper.reconcile() == (2, 2)
    assert api.claims == {} and len(api.rules) == 2


async def test_a_replica_that_does_not_lead_writes_no_claim() -> None:
    class NotLeading:
        leader = False

    api = ClaimsApi([])
    keeper = taints.Keeper(api, cache_with([sharing_pod()]), elector=NotLeading(), ttl=60.0, clock=lambda: NOW, namespace=LEDGER)  # type: ignore[arg-type]
    assert await keeper.reconcile() == (0, 0)
    assert api.claims == {}


def hold(device: dra.Device, namespace: str) -> dict[str, Any]:
    claim = dra.hold_claim(device, namespace=namespace)
    return {
        **claim,
        "metadata": {**claim["metadata"], "uid": f"uid-{namespace}"},
        "status": {"allocation": dra.hold_allocation(device)},
    }


def test_only_the_ledger_namespace_makes_a_claim_a_hold_claim() -> None:
    device = dra.devices([SLICE])[("gpu.nvidia.com", "gpu-0", "gpu-0")]
    ours, tenants = hold(device, LEDGER), hold(device, "team-a")  # the same label, in a tenant's namespace
    assert dra.is_hold_claim(ours, namespace=LEDGER)
    assert not dra.is_hold_claim(tenants, namespace=LEDGER)
    assert not dra.is_hold_claim(ours, namespace="elsewhere")  # another ledger namespace: not ours
    held = dra.holds([SLICE], [ours, tenants], namespace=LEDGER)
    assert [h.claim_key for h in held["gpu-0"]["GPU-0000"]] == [f"team-a/{dra.rule_name(device)}"]
    assert dra.unmatched([], [ours, tenants], namespace=LEDGER) == tuple(dra.claim_results(tenants))
    # What the extender keeps of a claim still shows whose it is.
    assert dra.is_hold_claim(dra.slim_claim(ours), namespace=LEDGER)


def test_plan_holds_creates_keeps_and_releases() -> None:
    published = dra.devices([SLICE])
    gpu0, gpu1 = published[("gpu.nvidia.com", "gpu-0", "gpu-0")], published[("gpu.nvidia.com", "gpu-0", "gpu-1")]
    kept, stale = hold(gpu0, LEDGER), hold(gpu1, LEDGER)
    not_ours = {"metadata": {"name": "other", "labels": {}}, "status": {}}
    assert dra.plan_holds([gpu0], [kept, stale, not_ours]) == ((), (), (dra.rule_name(gpu1),))
    assert dra.plan_holds([gpu0, gpu1], []) == ((gpu0, gpu1), (), ())
    assert dra.plan_holds([], []) == ((), (), ())
