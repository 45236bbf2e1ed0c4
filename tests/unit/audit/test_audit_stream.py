"""The audit at scale (issue 19): pods judged as a stream, and what stays of each for the checks across pods.

`scan.run` reads the pods once and keeps of each only what the node-level and env-source checks
read (`scan.kept_for_cluster_checks`), so these tests hold the results equal with and without the
parts it drops, and a streamed inventory equal to a whole one.
"""

from __future__ import annotations

import copy
import io
import pathlib
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from policies import model
from policies import settings as settings_
from tests.unit.audit.conftest import NOW, NodeFactory, PodFactory, allocation
from webhook.audit import scan
from webhook.cmdline import manifests

SNAPSHOT = pathlib.Path(__file__).parent / "data" / "cluster.yaml"


def snapshot_objects() -> list[dict[str, Any]]:
    return [dict(d.object) for d in manifests.read([str(SNAPSHOT)], stdin=io.StringIO())]


def as_running(pod: Mapping[str, Any], index: int) -> dict[str, Any]:
    """The pod as the apiserver lists it once a kubelet runs it: managedFields, conditions, IPs."""
    listed = copy.deepcopy(dict(pod))
    listed.setdefault("metadata", {})["managedFields"] = [
        {"manager": "kubectl", "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}
    ]
    status = listed.setdefault("status", {})
    status.setdefault("phase", "Running")
    status.update(
        {
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "main", "ready": True, "restartCount": 3}],
            "podIP": f"10.0.0.{index + 1}",
            "hostIP": "10.240.0.1",
        }
    )
    return listed


def everything(audit: scan.Audit) -> tuple[Any, ...]:
    return (audit.findings, audit.nodes, audit.objects, audit.folded, audit.namespaces)


class Once:
    """An iterable that may be iterated only once, as a stream of list pages is."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self._items: list[dict[str, Any]] | None = items

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self._items is None:
            raise AssertionError("the stream was read twice")
        items, self._items = self._items, None
        return iter(items)


def test_a_streamed_inventory_is_judged_exactly_like_a_whole_one() -> None:
    objects = snapshot_objects()
    pods_last = [o for o in objects if o.get("kind") != "Pod"] + [o for o in objects if o.get("kind") == "Pod"]

    whole = scan.run(scan.Inventory.of(objects), settings=settings_.Settings(), now=NOW)
    streamed = scan.run(scan.Inventory.streamed(Once(pods_last)), settings=settings_.Settings(), now=NOW)

    assert everything(streamed) == everything(whole)
    assert any(f.result is model.Result.FAIL and f.subject.kind == "Node" for f in whole.findings)  # node checks ran


def test_the_stream_must_end_with_its_pods(pod: PodFactory, node: NodeFactory) -> None:
    inventory = scan.Inventory.streamed(iter([node("gpu-0"), pod("a"), node("gpu-1")]))

    with pytest.raises(ValueError, match="a Node after the Pods: the stream must end with its Pods"):
        scan.run(inventory, settings=settings_.Settings(), now=NOW)


def test_a_stream_without_pods_is_an_inventory_without_pods(node: NodeFactory) -> None:
    inventory = scan.Inventory.streamed(iter([node("gpu-0")]))

    assert (len(inventory.nodes), tuple(inventory.pods)) == (1, ())


def test_what_stays_of_a_pod_is_all_but_managed_fields_and_the_status_beyond_its_phase(pod: PodFactory) -> None:
    listed = as_running(pod("trainer", gpu_mem=2, node_name="gpu-0"), 0)

    kept = scan.kept_for_cluster_checks(listed)

    assert kept["status"] == {"phase": "Running"}
    assert "managedFields" not in kept["metadata"]
    assert kept["spec"] == listed["spec"]
    assert {k: v for k, v in kept["metadata"].items()} == {k: v for k, v in listed["metadata"].items() if k != "managedFields"}
    assert "status" not in scan.kept_for_cluster_checks({"kind": "Pod", "metadata": {"name": "new"}})
    assert scan.kept_for_cluster_checks({"kind": "Pod", "status": {"podIP": "10.0.0.1"}})["status"] == {}


def test_managed_fields_and_running_status_change_no_finding() -> None:
    """The node-level checks read the kept pods: the parts dropped from them must not matter."""
    objects = snapshot_objects()
    running = [as_running(o, i) if o.get("kind") == "Pod" else o for i, o in enumerate(objects)]

    plain = scan.run(scan.Inventory.of(objects), settings=settings_.Settings(), now=NOW)
    listed = scan.run(scan.Inventory.of(running), settings=settings_.Settings(), now=NOW)

    assert everything(listed) == everything(plain)


def test_node_checks_see_the_kept_pods_of_their_node_and_every_pod_by_uid(pod: PodFactory, node: NodeFactory) -> None:
    """GPU202 sums the bound pods' requests; GPU203 looks the ledger's pods up by uid."""
    gpu_node = node("gpu-0")  # cgpu, 4 x Tesla-T4 of 15 GiB
    pods = [
        as_running(pod(f"p{i}", gpu_mem=10, node_name="gpu-0", annotations=allocation("gpu-0", [0], mem=10)), i) for i in range(2)
    ]

    audit = scan.run(scan.Inventory.streamed(Once([gpu_node, *pods])), settings=settings_.Settings(), now=NOW)

    (overcommit,) = [f for f in audit.findings if f.policy == "GPU202"]
    assert overcommit.result is model.Result.FAIL
    assert "20 GiB allocated of 15 GiB" in overcommit.message
    assert sorted(r.name for r in overcommit.related) == ["p0", "p1"]


def test_only_objects_taking_a_source_by_env_from_are_its_consumers(pod: PodFactory) -> None:
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "gpu-env", "namespace": "team-a"},
        "data": {"CGPU_DISABLE": "1"},
    }
    taker = as_running(pod("taker", gpu_mem=1), 0)
    taker["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "gpu-env"}}]
    bystander = as_running(pod("bystander", gpu_mem=1), 1)

    audit = scan.run(scan.Inventory.streamed(Once([config_map, taker, bystander])), settings=settings_.Settings(), now=NOW)

    (found,) = [f for f in audit.findings if f.policy == "GPU211"]
    assert found.result is model.Result.FAIL
    assert [r.name for r in found.related] == ["taker"]
