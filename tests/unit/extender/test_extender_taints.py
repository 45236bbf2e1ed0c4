"""The leader's DeviceTaintRules: one per device of a card that holds shared pods, removed when the
card is empty again; the API version found by listing; nothing where no version is served, and
nothing on a replica that does not lead."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from policies.gpu import dra
from tests import dra_objects
from tests.unit.extender.conftest import node as make_node
from tests.unit.extender.conftest import pod as make_pod
from webhook.extender import store, taints
from webhook.kube import errors as kube_errors

NOW = 1_800_000_000.0
NODE = make_node("gpu-0", count=2, gib=15, inventory=[15360, 15360])
SLICE = dra_objects.slice_for("gpu-0", ["GPU-0000", "GPU-0001"], parents=[("gpu-0-mig-9-0-4", "MIG-a", "GPU-0000")])
ALLOCATED = '{"node":"gpu-0","cards":[0],"memGiB":4,"corePercent":0,"whole":false,"assumedAt":"2027-01-15T08:00:00.000Z"}'


class FakeApi:
    """Serves the DeviceTaintRule versions in `served`, keeping the rules written."""

    def __init__(self, served: Sequence[str]) -> None:
        self.served = set(served)
        self.rules: dict[str, dict[str, Any]] = {}

    def _version(self, path: str) -> str:
        version = path.split("/")[3]
        if version not in self.served:
            raise kube_errors.NotFound(f"GET {path}", status=404)
        return version

    def list(self, path: str, *, label_selector: str = "") -> tuple[list[Any], str]:
        self._version(path)
        return [r for r in self.rules.values() if r["metadata"]["labels"].get(dra.RULE_LABEL) == "true"], "1"

    def request(self, method: str, path: str, *, query: Any = (), body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        self._version(path)
        if method == "POST" and body is not None:
            self.rules[body["metadata"]["name"]] = dict(body)
        elif method == "DELETE":
            self.rules.pop(path.rsplit("/", 1)[1])
        return {}


def cache_with(pods: list[dict[str, Any]]) -> store.Store:
    cache = store.Store()
    cache.replace_nodes([NODE])
    cache.replace_pods(pods)
    cache.replace_leases([])
    cache.replace_slices([SLICE])
    cache.replace_claims([])
    return cache


def sharing_pod() -> dict[str, Any]:
    return make_pod("sharing", mem=4, node_name="gpu-0", phase="Running", annotations={"gpu-admission.io/allocation": ALLOCATED})


async def test_a_card_with_shared_pods_gets_a_rule_per_device_and_loses_them_when_empty() -> None:
    api = FakeApi(["v1alpha3"])
    pod = sharing_pod()
    cache = cache_with([pod])
    keeper = taints.Keeper(api, cache, elector=None, ttl=60.0, clock=lambda: NOW)  # type: ignore[arg-type]
    assert await keeper.reconcile() == (2, 0)
    assert keeper.version == "v1alpha3"
    selectors = sorted(r["spec"]["deviceSelector"]["device"] for r in api.rules.values())
    assert selectors == ["gpu-0", "gpu-0-mig-9-0-4"]  # the whole GPU and its MIG device; not gpu-1
    assert all(r["apiVersion"] == "resource.k8s.io/v1alpha3" for r in api.rules.values())
    assert await keeper.reconcile() == (0, 0)  # in step: nothing to do
    cache.apply("Pod", "DELETED", pod)
    assert await keeper.reconcile() == (0, 2)
    assert api.rules == {}


async def test_the_newest_served_version_is_used() -> None:
    api = FakeApi(["v1beta2", "v1alpha3"])
    keeper = taints.Keeper(api, cache_with([sharing_pod()]), elector=None, ttl=60.0, clock=lambda: NOW)  # type: ignore[arg-type]
    await keeper.reconcile()
    assert keeper.version == "v1beta2"


async def test_without_the_api_nothing_is_written() -> None:
    api = FakeApi([])
    keeper = taints.Keeper(api, cache_with([sharing_pod()]), elector=None, ttl=60.0, clock=lambda: NOW)  # type: ignore[arg-type]
    assert await keeper.reconcile() == (0, 0)
    assert keeper.version is None


async def test_a_replica_that_does_not_lead_writes_nothing() -> None:
    class NotLeading:
        leader = False

    api = FakeApi(["v1alpha3"])
    keeper = taints.Keeper(api, cache_with([sharing_pod()]), elector=NotLeading(), ttl=60.0, clock=lambda: NOW)  # type: ignore[arg-type]
    assert await keeper.reconcile() == (0, 0)
    assert api.rules == {}
