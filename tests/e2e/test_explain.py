"""`explain` and `simulate` against the real apiserver, kube-scheduler (deploy/scheduler-config.yaml),
the extender and the webhook: each reason built for real, and simulate's placements compared with
where the scheduler and extender then put the same pods.

Every test gets its own KWOK pool (a unique label and a NoSchedule taint only its pods tolerate), as
in test_extender.py, so other nodes refuse the pods by selector and the pictures stay undisturbed.
"""

from __future__ import annotations

import json
import pathlib
import time
import uuid
from typing import Any

import pytest
import yaml

from policies import gpu
from policies.gpu import allocation as allocation_  # `allocation` reads a pod's annotation here
from policies.gpu import reservations
from tests.e2e.harness import Cluster, deployment, eventually
from tests.e2e.test_extender import POOL_LABEL, TAINT_KEY, Pool, allocation, bound, create, make_pool, pools  # noqa: F401 - pools is a fixture
from webhook import cli
from webhook.cluster import controlplane, install

pytestmark = pytest.mark.e2e

GIB16 = 16 * 1024
DEFRAG_LABEL = "gpu-admission.io/e2e-defrag"


def pod(
    name: str, *, pool: Pool, mem: int | None = None, whole: int | None = None, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    limits = {"aliyun.com/gpu-mem": str(mem)} if mem is not None else {"aliyun.com/gpu": str(whole)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": dict(annotations or {})},
        "spec": {
            "nodeSelector": {POOL_LABEL: pool.name},
            "tolerations": [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "main", "image": "registry.example/trainer:1", "resources": {"limits": limits}}],
        },
    }


def explain(cluster: Cluster, capsys: pytest.CaptureFixture[str], name: str, *, namespace: str, output: str = "json") -> Any:
    capsys.readouterr()
    status = cli.main(["explain", "pod", name, "-n", namespace, "--kubeconfig", str(cluster.state.kubeconfig), "-o", output])
    out, err = capsys.readouterr()
    assert status == 0, err
    return json.loads(out) if output == "json" else out


def codes(report: dict[str, Any], node: str) -> list[str]:
    (entry,) = [n for n in report["nodes"] if n["node"] == node]
    return [r["code"] for r in entry["reasons"]]


def wait_bound(cluster: Cluster, namespace: str, count: int) -> None:
    eventually(lambda: len(bound(cluster, namespace)) >= count, what=f"{count} pods bound in {namespace}", timeout=120)


def wait_unschedulable(cluster: Cluster, namespace: str, name: str) -> None:
    def judged() -> bool:
        conditions = cluster.get("pod", name, namespace=namespace).get("status", {}).get("conditions", [])
        return any(c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions)

    eventually(judged, what=f"{name} judged unschedulable", timeout=120)


def test_a_fragmented_node_is_named_with_its_largest_free_block(
    cluster: Cluster, pools: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    pool = make_pool(cluster, pools, gpus=(GIB16,) * 3)
    ns = cluster.namespace()
    for index, size in enumerate((10, 12, 12)):  # binpack: one per card, leaving 6 + 4 + 4
        create(cluster, [pod(f"busy-{index}", pool=pool, mem=size)], namespace=ns)
        wait_bound(cluster, ns, index + 1)
    create(cluster, [pod("want-10", pool=pool, mem=10)], namespace=ns)
    wait_unschedulable(cluster, ns, "want-10")
    report = explain(cluster, capsys, "want-10", namespace=ns)
    # "budget" (issue 36): without --config the namespace budgets are not known, and it says so.
    assert set(report) == {"pod", "admission", "request", "bound", "nodes", "suggestion", "budget"}
    assert report["budget"]["state"] == "unknown" and "no settings file given" in report["budget"]["why"]
    assert report["admission"]["allowed"] is True and report["request"]["memoryGiB"] == 10
    (node,) = pool.nodes
    assert codes(report, node) == ["FRAGMENTED"]
    message = [n for n in report["nodes"] if n["node"] == node][0]["reasons"][0]["message"]
    assert "14 GiB free in total" in message and "largest free block is 6 GiB" in message
    assert report["suggestion"]["node"] == node and len(report["suggestion"]["moves"]) == 1
    table = explain(cluster, capsys, "want-10", namespace=ns, output="table")
    assert f"  FRAGMENTED (1 node): {node}" in table.splitlines()
    bound_report = explain(cluster, capsys, "busy-0", namespace=ns)
    assert bound_report["bound"] == {"node": node, "cards": [0], "memoryGiB": 10, "corePercent": 0}


def test_mode_mismatch_card_model_and_topology_are_told_apart(
    cluster: Cluster, pools: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    topo = make_pool(cluster, pools, mode="topology", gpus=(GIB16,) * 4)
    t4 = make_pool(cluster, pools)
    (t4_node,) = t4.nodes
    (topo_node,) = topo.nodes
    labelled = cluster.kubectl("label", "node", t4_node, "aliyun.accelerator/nvidia_name=Tesla-T4")
    assert labelled.returncode == 0, labelled.stderr
    ns = cluster.namespace()
    create(
        cluster,
        [
            pod("shared-on-topology", pool=topo, mem=4),
            pod("no-t4", pool=t4, mem=4, annotations={"gpu-admission.io/exclude-gpu-model": "Tesla-T4"}),
            pod("pair", pool=topo, whole=2),
        ],
        namespace=ns,
    )
    wait_bound(cluster, ns, 1)
    create(cluster, [pod("three", pool=topo, whole=3)], namespace=ns)
    for name in ("shared-on-topology", "no-t4", "three"):
        wait_unschedulable(cluster, ns, name)
    assert "MODE_MISMATCH" in codes(explain(cluster, capsys, "shared-on-topology", namespace=ns), topo_node)
    no_t4 = explain(cluster, capsys, "no-t4", namespace=ns)
    assert codes(no_t4, t4_node) == ["CARD_MODEL"]  # the webhook's GPU102 affinity, judged on the node's label
    assert codes(explain(cluster, capsys, "three", namespace=ns), topo_node) == ["NO_TOPOLOGY_SET"]


def test_a_cordoned_node_is_unschedulable(cluster: Cluster, pools: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    pool = make_pool(cluster, pools)
    (node,) = pool.nodes
    assert cluster.kubectl("cordon", node).returncode == 0
    ns = cluster.namespace()
    create(cluster, [pod("waits", pool=pool, mem=4)], namespace=ns)
    wait_unschedulable(cluster, ns, "waits")
    report = explain(cluster, capsys, "waits", namespace=ns)
    assert codes(report, node) == ["UNSCHEDULABLE"]
    assert report["suggestion"]["node"] == node and "uncordon" in report["suggestion"]["change"]


def write_ledger_lease(
    cluster: Cluster, node: str, entry: allocation_.Allocation, *, namespace: str = reservations.LEDGER_NAMESPACE
) -> None:
    """The node's ledger Lease holding `entry`, as the extender writes it (in `namespace`)."""
    uid = cluster.get("node", node, namespace="default")["metadata"]["uid"]
    body = reservations.lease_body(node, uid, {entry.uid: entry}, "e2e", namespace=namespace)
    applied = cluster.apply(body, namespace=namespace)
    assert applied.returncode == 0, applied.stderr


def lease_ledger(cluster: Cluster, node: str) -> dict[str, allocation_.Allocation]:
    found = cluster.kubectl("get", "lease", reservations.lease_name(node), "-n", reservations.LEDGER_NAMESPACE, "-o", "json")
    return reservations.lease_reservations(json.loads(found.stdout)) if found.returncode == 0 else {}


def test_a_stale_reservation_is_reported_then_released_by_the_extender(
    cluster: Cluster, pools: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    pool = make_pool(cluster, pools, gpus=(GIB16,))
    (node,) = pool.nodes
    # A bind that committed its ledger entry (in the node's ledger Lease) and whose pod was deleted before the Binding.
    now = time.time()
    entry = allocation_.Allocation(
        uid=str(uuid.uuid4()),
        namespace="gone",
        name="deleted-mid-bind",
        node=node,
        cards=(0,),
        memory_gib=16,
        assumed_at=now + 15,
        expires=now + 60,
        source="reservation",  # in flight a while: time to explain
    )
    write_ledger_lease(cluster, node, entry)
    ns = cluster.namespace()
    create(cluster, [pod("blocked", pool=pool, mem=8)], namespace=ns)
    report = explain(cluster, capsys, "blocked", namespace=ns)
    assert report["bound"] is None
    assert codes(report, node) == ["STALE_ALLOCATION", "INSUFFICIENT_MEMORY"]
    assert "gone/deleted-mid-bind" in [n for n in report["nodes"] if n["node"] == node][0]["reasons"][0]["message"]
    # the extender stops counting it, prunes the ledger, and the pod lands
    wait_bound(cluster, ns, 1)
    eventually(lambda: entry.uid not in lease_ledger(cluster, node), what="the stale ledger entry pruned", timeout=90)


def test_a_tenants_forged_ledger_lease_holds_no_card(
    cluster: Cluster, pools: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A tenant may create Leases in its own namespace: one dressed as the node's ledger (label, node
    annotation, the ledger's name) holding the only card must block neither explain nor the extender."""
    pool = make_pool(cluster, pools, gpus=(GIB16,))
    (node,) = pool.nodes
    ns = cluster.namespace()
    now = time.time()
    entry = allocation_.Allocation(
        uid=str(uuid.uuid4()),
        namespace=ns,
        name="squatter",
        node=node,
        cards=(0,),
        memory_gib=16,
        assumed_at=now + 300,
        expires=now + 600,
        source="reservation",  # would hold the card for minutes
    )
    write_ledger_lease(cluster, node, entry, namespace=ns)
    create(cluster, [pod("wanted", pool=pool, mem=8)], namespace=ns)
    wait_bound(cluster, ns, 1)
    report = explain(cluster, capsys, "wanted", namespace=ns)
    assert report["bound"]["node"] == node and report["bound"]["cards"] == [0]


def test_simulate_agrees_with_the_scheduler_and_extender(
    cluster: Cluster, pools: list[str], capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    pool = make_pool(cluster, pools, count=2)
    ns = cluster.namespace()
    create(cluster, [pod("first", pool=pool, mem=3)], namespace=ns)  # whichever node: from now on binpack prefers it
    wait_bound(cluster, ns, 1)
    batch = [pod(f"b{i}", pool=pool, mem=size) for i, size in enumerate((8, 6, 12, 4, 10, 14, 7))]
    for item in batch:
        item["metadata"]["namespace"] = ns
    manifests = tmp_path / "batch.yaml"
    manifests.write_text(yaml.safe_dump_all(batch))
    capsys.readouterr()
    status = cli.main(["simulate", "-f", str(manifests), "--kubeconfig", str(cluster.state.kubeconfig), "-o", "json"])
    simulated = json.loads(capsys.readouterr().out)
    assert status == 0
    planned = {p["pod"].split("/")[1]: (p["node"], p["cards"]) for p in simulated["placements"]}
    assert all(not p["ties"] for p in simulated["placements"]), simulated["placements"]  # the picture is deterministic
    assert len(bound(cluster, ns)) == 1  # simulate wrote nothing
    for position, item in enumerate(batch):
        create(cluster, [item], namespace=ns)
        wait_bound(cluster, ns, position + 2)
    actual = {p["metadata"]["name"]: (p["spec"]["nodeName"], allocation(p)["cards"]) for p in bound(cluster, ns)}
    assert {name: actual[name] for name in planned} == planned


def test_defrag_apply_frees_the_planned_card_within_the_budget_and_the_pending_pod_schedules(
    cluster: Cluster, pools: list[str], capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    group = f"d{uuid.uuid4().hex[:6]}"
    ns = cluster.namespace()
    first = make_pool(cluster, pools, gpus=(GIB16,) * 2)
    (node_a,) = first.nodes
    assert cluster.kubectl("label", "node", node_a, f"{DEFRAG_LABEL}={group}").returncode == 0
    create(cluster, [pod("fixed-a", pool=first, mem=14)], namespace=ns)
    wait_bound(cluster, ns, 1)
    mover = deployment(
        "mover",
        {
            "nodeSelector": {DEFRAG_LABEL: group},
            "tolerations": [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {"name": "main", "image": "registry.example/app:1", "resources": {"limits": {"aliyun.com/gpu-mem": "4"}}}
            ],
        },
        app="mover",
    )
    assert cluster.apply(mover, namespace=ns).returncode == 0
    wait_bound(cluster, ns, 2)  # on A GPU1: GPU0 has 2 GiB left
    second = make_pool(cluster, pools, gpus=(GIB16,))
    (node_b,) = second.nodes
    assert cluster.kubectl("label", "node", node_b, f"{DEFRAG_LABEL}={group}").returncode == 0
    create(cluster, [pod("fixed-b", pool=second, mem=12)], namespace=ns)
    wait_bound(cluster, ns, 3)
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "mover"},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "mover"}}},
    }
    assert cluster.apply(budget, namespace=ns).returncode == 0
    eventually(
        lambda: cluster.get("pdb", "mover", namespace=ns).get("status", {}).get("disruptionsAllowed") == 1,
        what="the budget allows one disruption",
        timeout=90,
    )
    target = pod("want-14", pool=first, mem=14)
    create(cluster, [target], namespace=ns)
    wait_unschedulable(cluster, ns, "want-14")
    (moving,) = [p for p in bound(cluster, ns) if p["metadata"]["name"].startswith("mover-")]
    assert moving["spec"]["nodeName"] == node_a and allocation(moving)["cards"] == [1]
    manifest = tmp_path / "want.yaml"
    manifest.write_text(yaml.safe_dump({**target, "metadata": {**target["metadata"], "namespace": ns}}))
    kubeconfig = str(cluster.state.kubeconfig)
    capsys.readouterr()
    assert cli.main(["defrag", "plan", "--for", str(manifest), "--kubeconfig", kubeconfig, "-o", "json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert [(m["pod"], m["from"], m["to"]) for m in planned["moves"]] == [
        (f"{ns}/{moving['metadata']['name']}", {"node": node_a, "cards": [1]}, {"node": node_b, "cards": [0]})
    ]
    assert planned["freed"] == [{"node": node_a, "cards": [1]}] and planned["targetNode"] == node_a
    assert cli.main(["defrag", "apply", "--for", str(manifest), "--kubeconfig", kubeconfig, "--yes", "--timeout", "120"]) == 0
    eventually(
        lambda: cluster.get("pod", "want-14", namespace=ns)["spec"].get("nodeName") == node_a, what="want-14 bound", timeout=120
    )
    assert allocation(cluster.get("pod", "want-14", namespace=ns))["cards"] == [1]
    movers = [
        p for p in bound(cluster, ns) if p["metadata"]["name"].startswith("mover-") and not p["metadata"].get("deletionTimestamp")
    ]
    assert [(p["spec"]["nodeName"], allocation(p)["cards"]) for p in movers] == [(node_b, [0])]


def test_a_stale_reservation_does_not_survive_an_extender_restart(
    cluster: Cluster, pools: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    pool = make_pool(cluster, pools, gpus=(GIB16,))
    (node,) = pool.nodes
    # The extender dies with a bind committed and its pod then deleted. The entry is in the Node
    # annotation, where versions before the ledger Lease kept it: an upgrade, too.
    controlplane.stop(cluster.state, ["extender"])
    try:
        now = time.time()
        entry = allocation_.Allocation(
            uid=str(uuid.uuid4()),
            namespace="gone",
            name="deleted-while-down",
            node=node,
            cards=(0,),
            memory_gib=16,
            assumed_at=now + 10,
            expires=now + 90,
            source="reservation",
        )
        patch = {"metadata": {"annotations": {gpu.RESERVATIONS_ANNOTATION: reservations.encode({entry.uid: entry})}}}
        assert cluster.kubectl("patch", "node", node, "--type", "merge", "-p", json.dumps(patch)).returncode == 0
        ns = cluster.namespace()
        create(cluster, [pod("after-restart", pool=pool, mem=8)], namespace=ns)
        report = explain(cluster, capsys, "after-restart", namespace=ns)
        assert codes(report, node) == ["STALE_ALLOCATION", "INSUFFICIENT_MEMORY"]
    finally:
        install.start_extender(cluster.state)  # same port: the scheduler configuration still points at it
    # The restarted extender counts the entry only for the in-flight grace, then the pod lands on its card.
    # (It no longer writes the Node annotation: the entry stays there, holding nothing, until it expires.)
    wait_bound(cluster, ns, 1)
    (placed,) = bound(cluster, ns)
    assert allocation(placed)["cards"] == [0]
