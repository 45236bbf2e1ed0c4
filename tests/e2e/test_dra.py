"""Dynamic Resource Allocation beside the extender, with the real kube-scheduler allocating claims
(its DynamicResources plugin) on KWOK nodes: one account of the cards for both.

The test "driver" is a ResourceSlice per node that publishes the node's inventory cards (same UUIDs)
as `gpu.nvidia.com` devices, with the DeviceClass NVIDIA's chart installs; no kubelet plugin is
needed for allocation. The session cluster runs kube-apiserver and kube-scheduler with the
DRADeviceTaints gate (and resource.k8s.io/v1alpha3), so the extender's leader keeps a DeviceTaintRule
on every card that holds shared pods. A second cluster of this module (`plain_cluster`) runs
Kubernetes 1.34 as shipped, without the gate: there the leader keeps an allocated ResourceClaim of
its own per such card. Each test gets its own pool (as in test_extender.py); pods use the cluster's
scheduler and extender (deploy/scheduler-config.yaml), as test_explain.py does.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from policies.gpu import dra, reservations
from tests import dra_objects
from tests.e2e.harness import Cluster, eventually, webhook_settings
from tests.e2e.test_explain import codes, explain, pod, wait_bound, wait_unschedulable
from tests.e2e.test_extender import POOL_LABEL, TAINT_KEY, Pool, allocation, create, make_pool, pools  # noqa: F401 - pools is a fixture
from webhook.cluster import controlplane, install, nodes

pytestmark = pytest.mark.e2e

CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "gpu.nvidia.com"},
    "spec": {
        "selectors": [
            {"cel": {"expression": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}
        ]
    },
}


@contextlib.contextmanager
def granting(cluster: Cluster, directory: Path) -> Iterator[str]:
    """A namespace the settings grant the GPU class (GPU011), and the DeviceClass."""
    namespace = cluster.namespace()
    completed = cluster.kubectl("apply", "-f", "-", stdin=json.dumps(CLASS))
    assert completed.returncode == 0, completed.stderr
    settings = {"dra": {"claims": [{"name": "e2e", "namespaces": [namespace], "classes": ["gpu.nvidia.com"]}]}}
    with webhook_settings(cluster, settings, directory=directory):
        yield namespace


@pytest.fixture(scope="module")
def granted(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with granting(cluster, tmp_path_factory.mktemp("dra-settings")) as namespace:
        yield namespace


@pytest.fixture(scope="module")
def plain_cluster(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A second cluster running Kubernetes 1.34 as shipped: no DRADeviceTaints gate, so no
    DeviceTaintRule API (`cluster up` without `--dra-device-taints`)."""
    directory = tmp_path_factory.mktemp("plain-cluster")
    apiserver_flags, scheduler_flags = controlplane.dra_device_taint_flags(False)
    state = install.bring_up(
        directory,
        bin_dir=bin_dir,
        fake_nodes=nodes.load(None)[:1],
        apiserver_flags=apiserver_flags,
        scheduler_flags=scheduler_flags,
    )
    try:
        yield Cluster(state)
    finally:
        controlplane.down(directory)


def publish(cluster: Cluster, pool: Pool) -> None:
    """The test driver: a ResourceSlice per node with the node's inventory cards as devices."""
    for node in pool.nodes:
        uuids = [f"GPU-{pool.name}-{i}" for i in range(len(pool.card_gib))]
        body = dra_objects.slice_for(node, uuids, gib=min(pool.card_gib))
        completed = cluster.kubectl("create", "-f", "-", stdin=json.dumps(body))
        assert completed.returncode == 0, completed.stderr


def claim(name: str) -> dict[str, Any]:
    return dra_objects.claim(name)


def claiming_pod(name: str, *, pool: Pool, claim_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {POOL_LABEL: pool.name},
            "tolerations": [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "main", "image": "registry.example/trainer:1", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
        },
    }


def claimed_device(cluster: Cluster, name: str, *, namespace: str) -> str:
    """The device the scheduler allocated to the claim ("" while it has none)."""
    results = (
        cluster.get("resourceclaim", name, namespace=namespace)
        .get("status", {})
        .get("allocation", {})
        .get("devices", {})
        .get("results", [])
    )
    return str(results[0]["device"]) if results else ""


def wait_claimed(cluster: Cluster, name: str, *, namespace: str) -> str:
    eventually(lambda: bool(claimed_device(cluster, name, namespace=namespace)), what=f"claim {name} allocated", timeout=120)
    return claimed_device(cluster, name, namespace=namespace)


def inspect_json(cluster: Cluster, node: str) -> dict[str, Any]:
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook.extender.cli",
            "inspect",
            "--kubeconfig",
            str(cluster.state.kubeconfig),
            "-o",
            "json",
            node,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    found: dict[str, Any] = json.loads(completed.stdout)["nodes"][0]
    return found


def dra_cards(cluster: Cluster, node: str) -> dict[int, list[str]]:
    return {d["id"]: [h["claim"] for h in d["dra"]] for d in inspect_json(cluster, node)["devs"] if d.get("dra")}


def taint_rules(cluster: Cluster) -> list[dict[str, Any]]:
    completed = cluster.kubectl("get", "devicetaintrules.v1alpha3.resource.k8s.io", "-l", f"{dra.RULE_LABEL}=true", "-o", "json")
    assert completed.returncode == 0, completed.stderr
    items: list[dict[str, Any]] = json.loads(completed.stdout)["items"]
    return items


def test_a_claim_allocated_first_keeps_its_card_from_gpu_mem_pods_until_released(
    cluster: Cluster, pools: list[str], granted: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pool = make_pool(cluster, pools, gpus=(15360, 15360))
    (node,) = pool.nodes
    publish(cluster, pool)
    ns = granted
    create(cluster, [claim("train")], namespace=ns)
    create(cluster, [claiming_pod("trainer", pool=pool, claim_name="train")], namespace=ns)
    device = wait_claimed(cluster, "train", namespace=ns)
    held = int(device.removeprefix("gpu-"))
    other = 1 - held
    assert dra_cards(cluster, node) == {held: [f"{ns}/train"]}  # inspect shows the claim on its card
    # A gpu-mem pod goes to the other card: the claimed one is not offered (binpack would pick card 0).
    create(cluster, [pod("shared", pool=pool, mem=10)], namespace=ns)
    wait_bound(cluster, ns, 2)
    assert allocation(cluster.get("pod", "shared", namespace=ns))["cards"] == [other]
    # One that needs a whole free card cannot have one: explain names the claim.
    create(cluster, [pod("want-15", pool=pool, mem=15)], namespace=ns)
    wait_unschedulable(cluster, ns, "want-15")
    report = explain(cluster, capsys, "want-15", namespace=ns)
    assert codes(report, node)[0] == "DRA_ALLOCATED"
    message = [n for n in report["nodes"] if n["node"] == node][0]["reasons"][0]["message"]
    assert f"ResourceClaim {ns}/train" in message and f"GPU-{pool.name}-{held}" in message
    # Released (pod and claim deleted), the card is offered again and the waiting pod gets it.
    assert cluster.kubectl("delete", "pod", "trainer", "-n", ns, "--wait=false").returncode == 0
    assert cluster.kubectl("delete", "resourceclaim", "train", "-n", ns, "--timeout=90s").returncode == 0
    eventually(lambda: dra_cards(cluster, node) == {}, what="the claim gone from inspect", timeout=60)
    eventually(
        lambda: bool(cluster.get("pod", "want-15", namespace=ns)["spec"].get("nodeName")), what="want-15 bound", timeout=120
    )
    assert allocation(cluster.get("pod", "want-15", namespace=ns))["cards"] == [held]


def test_a_card_with_gpu_mem_pods_is_tainted_and_a_claim_gets_the_other_card(
    cluster: Cluster, pools: list[str], granted: str
) -> None:
    pool = make_pool(cluster, pools, gpus=(15360, 15360))
    (node,) = pool.nodes
    publish(cluster, pool)
    ns = granted
    create(cluster, [pod("first", pool=pool, mem=4)], namespace=ns)
    wait_bound(cluster, ns, 1)
    busy = allocation(cluster.get("pod", "first", namespace=ns))["cards"][0]
    uuid_ = f"GPU-{pool.name}-{busy}"

    def tainted() -> bool:
        return any(r["metadata"]["annotations"].get(dra.RULE_CARD_ANNOTATION) == uuid_ for r in taint_rules(cluster))

    eventually(tainted, what=f"a DeviceTaintRule on {uuid_}", timeout=60)
    name = f"c{uuid.uuid4().hex[:6]}"
    create(cluster, [claim(name)], namespace=ns)
    create(cluster, [claiming_pod(f"{name}-pod", pool=pool, claim_name=name)], namespace=ns)
    assert wait_claimed(cluster, name, namespace=ns) == f"gpu-{1 - busy}"
    # A second claim finds no device: the one left holds the shared pod and is tainted.
    create(cluster, [claim(f"{name}-2")], namespace=ns)
    create(cluster, [claiming_pod(f"{name}-2-pod", pool=pool, claim_name=f"{name}-2")], namespace=ns)
    wait_unschedulable(cluster, ns, f"{name}-2-pod")
    assert claimed_device(cluster, f"{name}-2", namespace=ns) == ""
    # The card empty again, its rule goes.
    assert cluster.kubectl("delete", "pod", "first", "-n", ns, "--wait=false").returncode == 0
    eventually(lambda: not tainted(), what=f"the DeviceTaintRule on {uuid_} removed", timeout=60)
    assert node


def test_a_tenant_claim_is_refused_and_a_granted_namespaces_claim_admitted(cluster: Cluster, granted: str) -> None:
    tenant = cluster.namespace()
    refused = cluster.kubectl("create", "-n", tenant, "-f", "-", stdin=json.dumps(claim("mine")))
    assert refused.returncode != 0 and "GPU011" in refused.stderr, refused.stderr
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t"},
        "spec": {"spec": claim("x")["spec"]},
    }
    refused = cluster.kubectl("create", "-n", tenant, "-f", "-", stdin=json.dumps(template))
    assert refused.returncode != 0 and "GPU011" in refused.stderr, refused.stderr
    admitted = cluster.kubectl("create", "-n", granted, "-f", "-", stdin=json.dumps(claim(f"ok-{uuid.uuid4().hex[:6]}")))
    assert admitted.returncode == 0, admitted.stderr


def hold_claims(cluster: Cluster) -> dict[str, str]:
    """The extender's hold claims: card UUID -> the device the claim is allocated."""
    completed = cluster.kubectl(
        "get",
        "resourceclaims",
        "-n",
        reservations.LEDGER_NAMESPACE,
        "-l",
        f"{dra.RULE_LABEL}=true",
        "-o",
        "json",
    )
    assert completed.returncode == 0, completed.stderr
    found: dict[str, str] = {}
    for item in json.loads(completed.stdout)["items"]:
        results = item.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
        if results:
            found[item["metadata"]["annotations"][dra.RULE_CARD_ANNOTATION]] = results[0]["device"]
    return found


def rule_cards(cluster: Cluster) -> set[str]:
    return {r["metadata"]["annotations"].get(dra.RULE_CARD_ANNOTATION, "") for r in taint_rules(cluster)}


@pytest.mark.parametrize("gates", ["off", "on"])
def test_shared_cards_are_kept_from_claims_and_an_emptied_one_is_allocatable_within_a_minute(
    gates: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Shared pods on cards 0-2 of four: a claim gets card 3, a second claim stays unallocated; the
    card a shared pod leaves is allocated to the waiting claim within 60 s. Without the gates the
    extender holds the cards with its own ResourceClaims, with them by DeviceTaintRules; inspect
    counts neither as a DRA booking."""
    cluster: Cluster = request.getfixturevalue("cluster" if gates == "on" else "plain_cluster")
    created: list[str] = []
    try:
        with contextlib.ExitStack() as stack:
            # The session cluster's grant is the module's (`granted`); the plain cluster gets its own.
            ns = (
                request.getfixturevalue("granted")
                if gates == "on"
                else stack.enter_context(granting(cluster, tmp_path_factory.mktemp("dra-off")))
            )
            pool = make_pool(cluster, created, gpus=(15360,) * 4)
            (node,) = pool.nodes
            publish(cluster, pool)
            for i in range(3):  # binpack: 10 GiB each leaves 5 GiB, so each goes to the next card
                create(cluster, [pod(f"shared-{i}", pool=pool, mem=10)], namespace=ns)
                wait_bound(cluster, ns, i + 1)
            used = {allocation(cluster.get("pod", f"shared-{i}", namespace=ns))["cards"][0]: f"shared-{i}" for i in range(3)}
            assert sorted(used) == [0, 1, 2]
            busy = {f"GPU-{pool.name}-{i}" for i in range(3)}
            if gates == "off":
                eventually(lambda: busy <= set(hold_claims(cluster)), what="hold claims on cards 0-2", timeout=60)
                assert {hold_claims(cluster)[u] for u in busy} == {"gpu-0", "gpu-1", "gpu-2"}
            else:
                eventually(lambda: busy <= rule_cards(cluster), what="DeviceTaintRules on cards 0-2", timeout=60)
            assert dra_cards(cluster, node) == {}  # the extender's own holds are no DRA booking
            create(cluster, [claim("first")], namespace=ns)
            create(cluster, [claiming_pod("first-pod", pool=pool, claim_name="first")], namespace=ns)
            assert wait_claimed(cluster, "first", namespace=ns) == "gpu-3"
            create(cluster, [claim("second")], namespace=ns)
            create(cluster, [claiming_pod("second-pod", pool=pool, claim_name="second")], namespace=ns)
            wait_unschedulable(cluster, ns, "second-pod")
            assert claimed_device(cluster, "second", namespace=ns) == ""
            # Card 1 emptied of shared pods: the waiting claim gets it within 60 s.
            assert cluster.kubectl("delete", "pod", used[1], "-n", ns, "--wait=false").returncode == 0
            eventually(
                lambda: claimed_device(cluster, "second", namespace=ns) == "gpu-1",
                what="the second claim allocated card 1",
                timeout=60,
            )
            assert dra_cards(cluster, node) == {1: [f"{ns}/second"], 3: [f"{ns}/first"]}
            if gates == "off":
                assert set(hold_claims(cluster)) >= {f"GPU-{pool.name}-0", f"GPU-{pool.name}-2"}
                assert f"GPU-{pool.name}-1" not in hold_claims(cluster)
    finally:
        if created and gates == "on":
            cluster.kubectl("delete", "node", "--wait=false", *created)
