"""Limits that act, end to end: a labeler process with `--usage-limits` on a KWOK share node whose
inventory lists real processes in real kubelet-shaped cgroups, pods bound by the extender, and the
real apiserver's Eviction API (PodDisruptionBudgets included).

- observe: a pod above its request gets a Warning Event, and a Normal one when it is back under;
  it is never evicted, and a pod within its request gets nothing;
- evict: a pod above its request is evicted after the grace period and not before, with an Event
  saying why and by how much; its neighbour within its request is untouched;
- a PodDisruptionBudget that forbids the eviction is respected: the pod stays, the refusal is an
  Event and a counted metric.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from policies import gpu
from tests import cgroup_processes
from tests.e2e.extenders import extender, process
from tests.e2e.harness import Cluster, eventually

# share_node is the shared-mode KWOK node fixture of the usage tests, used here by name.
from tests.e2e.test_usage import http_json, share_node, write_inventory  # noqa: F401 - share_node is a fixture
from webhook.labeler import limits

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not cgroup_processes.hierarchies(),
        reason="needs root and a writable cgroup filesystem to run processes in kubelet-shaped cgroups",
    ),
]

GRACE_S = 8


def bound_pod(
    cluster: Cluster, base: str, *, namespace: str, name: str, node: str, gib: int, labels: dict[str, str] | None = None
) -> tuple[str, int]:
    """A gpu-mem pod bound to `node` by the extender; its UID and card."""
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "nodeSelector": {gpu.SCHEDULE_LABEL: "share", "gpu-admission.io/e2e-hold": "true"},
            "containers": [
                {"name": "main", "image": "registry.example/train:1", "resources": {"limits": {"aliyun.com/gpu-mem": str(gib)}}}
            ],
        },
    }
    completed = cluster.apply(manifest, namespace=namespace)
    assert completed.returncode == 0, completed.stderr
    uid = cluster.get("pod", name, namespace=namespace)["metadata"]["uid"]

    def cached() -> bool:  # the extender's cache has the pod and the node
        answer = http_json(f"{base}/bind", {"PodName": name, "PodNamespace": namespace, "PodUID": uid, "Node": node})
        return bool(answer == {"Error": ""})

    eventually(cached, what=f"the extender binding {name}")
    annotations = cluster.get("pod", name, namespace=namespace)["metadata"]["annotations"]
    [card] = json.loads(annotations[gpu.ALLOCATION_ANNOTATION])["cards"]
    return uid, card


def events(cluster: Cluster, namespace: str, name: str) -> list[tuple[str, str, str]]:
    completed = cluster.kubectl("get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}", "-o", "json")
    assert completed.returncode == 0, completed.stderr
    items = sorted(json.loads(completed.stdout)["items"], key=lambda e: e["metadata"]["creationTimestamp"])
    return [(e["reason"], e["type"], e["message"]) for e in items if e["reason"].startswith("GPUMemory")]


def reasons(cluster: Cluster, namespace: str, name: str) -> list[str]:
    return [reason for reason, _, _ in events(cluster, namespace, name)]


def gone(cluster: Cluster, namespace: str, name: str) -> bool:
    completed = cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json", "--ignore-not-found")
    return not completed.stdout.strip() or "deletionTimestamp" in json.loads(completed.stdout)["metadata"]


@contextlib.contextmanager
def labeler(cluster: Cluster, node: str, inventory: Path, settings: dict[str, Any], directory: Path) -> Iterator[None]:
    """The node's labeler with --usage-limits on `settings`; returns once the node is advertised (the
    extender binds only to a node with capacity and an inventory)."""
    config = directory / "config.yaml"
    config.write_text(json.dumps(settings))  # the webhook's settings file shape; JSON is YAML
    command = [
        sys.executable,
        "-m",
        "webhook.labeler.cli",
        "labeler",
        "--node-name",
        node,
        "--kubeconfig",
        str(cluster.state.kubeconfig),
        "--inventory",
        str(inventory),
        "--interval",
        "300ms",
        "--usage-interval",
        "1s",
        "--usage-limits",
        str(config),
        "--advertise",
    ]
    with process(cluster, f"labeler-{node}", command):

        def advertised() -> bool:
            found = cluster.get("node", node, namespace="default")
            annotations = found["metadata"].get("annotations", {})
            return (
                bool(found["status"].get("allocatable", {}).get("aliyun.com/gpu-mem")) and gpu.INVENTORY_ANNOTATION in annotations
            )

        eventually(advertised, what=f"node {node} labelled and advertised")
        yield


@contextlib.contextmanager
def workloads(
    cluster: Cluster, node: str, *, namespace: str, wanted: list[tuple[str, int, dict[str, str]]]
) -> Iterator[dict[str, tuple[int, int]]]:
    """Pods bound by the extender, each with a process in its own kubelet-shaped cgroup: name -> (PID, card)."""
    _, mount = cgroup_processes.hierarchies()[0]
    tag = uuid.uuid4().hex[:8]
    placed: dict[str, tuple[str, int]] = {}
    with extender(cluster, "extender-limits") as base:
        for name, gib, labels in wanted:
            placed[name] = bound_pod(cluster, base, namespace=namespace, name=name, node=node, gib=gib, labels=labels)
    with contextlib.ExitStack() as stack:
        found: dict[str, tuple[int, int]] = {}
        for name, (uid, card) in placed.items():
            path = cgroup_processes.systemd_pod_path(uid, uuid.uuid4().hex * 2, tag=tag)
            found[name] = (stack.enter_context(cgroup_processes.process_in(mount, path)), card)
        yield found


def use(inventory: Path, pods: dict[str, tuple[int, int]], mib: dict[str, int]) -> None:
    """The inventory with each pod's process holding `mib[name]` on its card."""
    processes: dict[int, list[dict[str, int]]] = {}
    for name, (pid, card) in pods.items():
        processes.setdefault(card, []).append({"pid": pid, "usedMiB": mib[name]})
    write_inventory(inventory, processes=processes)


def test_observe_sends_events_and_never_evicts(cluster: Cluster, share_node: str, tmp_path: Path) -> None:
    namespace = cluster.namespace()
    inventory = tmp_path / "inventory.yaml"
    write_inventory(inventory, processes={})
    with (
        labeler(cluster, share_node, inventory, {}, tmp_path),  # no usageLimits: observe everywhere
        workloads(cluster, share_node, namespace=namespace, wanted=[("hog", 2, {}), ("calm", 4, {})]) as pods,
    ):
        use(inventory, pods, {"hog": 1000, "calm": 3000})
        time.sleep(3)
        assert reasons(cluster, namespace, "hog") == [] and reasons(cluster, namespace, "calm") == []
        # hog takes 5000 MiB of its 2048: above on share, whatever the tolerance.
        use(inventory, pods, {"hog": 5000, "calm": 3000})
        eventually(lambda: reasons(cluster, namespace, "hog") == [limits.ABOVE_REASON], what="the Event above the request")
        [(_, kind, message)] = events(cluster, namespace, "hog")
        assert kind == "Warning" and f"card {pods['hog'][1]} holds 5000 MiB of its 2048 MiB, 2952 MiB above" in message
        time.sleep(GRACE_S + 2)
        assert not gone(cluster, namespace, "hog")  # observe never evicts
        use(inventory, pods, {"hog": 1000, "calm": 3000})
        eventually(
            lambda: reasons(cluster, namespace, "hog") == [limits.ABOVE_REASON, limits.UNDER_REASON], what="the Event back under"
        )
        assert events(cluster, namespace, "hog")[1][1] == "Normal"
        assert reasons(cluster, namespace, "calm") == [] and not gone(cluster, namespace, "calm")


def test_evict_after_the_grace_period_only_the_pod_above_and_a_budget_is_respected(
    cluster: Cluster, share_node: str, tmp_path: Path
) -> None:
    namespace = cluster.namespace()
    inventory = tmp_path / "inventory.yaml"
    write_inventory(inventory, processes={})
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "kept"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "kept"}}},
    }
    completed = cluster.apply(budget, namespace=namespace)
    assert completed.returncode == 0, completed.stderr
    settings = {"usageLimits": [{"name": "e2e", "namespaces": [namespace], "mode": "evict", "gracePeriodSeconds": GRACE_S}]}
    wanted = [("hog", 2, {}), ("calm", 4, {}), ("kept", 2, {"app": "kept"})]
    with (
        labeler(cluster, share_node, inventory, settings, tmp_path),
        workloads(cluster, share_node, namespace=namespace, wanted=wanted) as pods,
    ):
        use(inventory, pods, {"hog": 6000, "calm": 3000, "kept": 6000})
        eventually(lambda: reasons(cluster, namespace, "hog")[:1] == [limits.ABOVE_REASON], what="the Event above the request")
        seen_above = time.monotonic()
        # Not before the grace period.
        while time.monotonic() - seen_above < GRACE_S - 3:
            assert not gone(cluster, namespace, "hog"), "evicted before the grace period"
            time.sleep(0.5)
        eventually(lambda: gone(cluster, namespace, "hog"), what="the eviction after the grace period", timeout=30)
        evicted = [message for reason, _, message in events(cluster, namespace, "hog") if reason == limits.EVICTED_REASON]
        assert len(evicted) == 1 and "3952 MiB above" in evicted[0] and "usageLimits entry 'e2e'" in evicted[0], evicted
        # The pod the budget protects is above too: refused, reported, still there.
        eventually(
            lambda: limits.REFUSED_REASON in reasons(cluster, namespace, "kept"), what="the refused eviction reported", timeout=30
        )
        [(_, _, refusal)] = [e for e in events(cluster, namespace, "kept") if e[0] == limits.REFUSED_REASON]
        assert "disruption budget" in refusal and "not forced" in refusal, refusal
        time.sleep(2)
        assert not gone(cluster, namespace, "kept")
        # Within its request: never touched.
        assert reasons(cluster, namespace, "calm") == [] and not gone(cluster, namespace, "calm")
