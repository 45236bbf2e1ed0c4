"""`gpu-admission audit --write-reports` against the real control plane: existing violators, reports, fixes.

Violating objects can only exist if they were created while the webhook was not there, so the test
unregisters the webhook configurations for the moment it creates them (and registers them again
with `install.register`, which waits until the apiserver calls the webhook again). This is the
cheapest honest way: the objects are real, stored by the real apiserver, and a Deployment's
ReplicaSet and pods are made by the real controller-manager.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import ssl
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from policies import gpu
from policies.gpu import allocation as allocation_  # `allocation` names a pod's allocation elsewhere
from policies.gpu import reservations
from tests.e2e.harness import Cluster, deployment, eventually
from webhook.cluster import install, nodes

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "deploy" / "crds"
REPORT = "gpu-admission"
OVERCOMMIT_NODE = "cgpu-binpack-1"


def pod(name: str, **spec_fields: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "registry.example/app:1"}
    for key in ("env", "resources", "securityContext", "volumeMounts"):
        if key in spec_fields:
            container[key] = spec_fields.pop(key)
    metadata: dict[str, Any] = {"name": name}
    if "annotations" in spec_fields:
        metadata["annotations"] = spec_fields.pop("annotations")
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {"containers": [container], **spec_fields}}


BYPASS_ENV = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]


def violators() -> list[Mapping[str, Any]]:
    return [
        pod("sneaky", env=BYPASS_ENV),
        pod("root-gpu", resources={"limits": {"nvidia.com/gpu": 1}}, securityContext={"privileged": True}),
        pod("dev-mount", volumes=[{"name": "card", "hostPath": {"path": "/dev/nvidia0"}}]),
        # Placed by hand past the scheduler and the extender, with a gpushare annotation claiming
        # 40 GiB of a 15 GiB card.
        pod(
            "overcommit",
            nodeName=OVERCOMMIT_NODE,
            nodeSelector={"ack.node.gpu.schedule": "cgpu"},
            resources={"limits": {"aliyun.com/gpu-mem": 3}},
            env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}],
            annotations={"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_POD": "40"},
        ),
        deployment("bypass", pod("x", env=BYPASS_ENV)["spec"], app="bypass", replicas=2),
    ]


@pytest.fixture(scope="module")
def crds(cluster: Cluster) -> None:
    applied = cluster.kubectl("apply", "-k", str(CRDS))  # their own kustomization, as users apply them
    assert applied.returncode == 0, applied.stderr
    for name in ("policyreports.wgpolicyk8s.io", "clusterpolicyreports.wgpolicyk8s.io"):
        waited = cluster.kubectl("wait", "--for", "condition=established", f"crd/{name}", "--timeout=60s")
        assert waited.returncode == 0, waited.stderr


@contextlib.contextmanager
def webhook_unregistered(cluster: Cluster) -> Iterator[None]:
    """No admission webhook while inside; registered again (and effective) on the way out."""
    for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
        cluster.kubectl("delete", kind, "gpu-admission", "--ignore-not-found")
    probe = json.dumps(pod("audit-probe", env=BYPASS_ENV))
    eventually(
        lambda: cluster.kubectl("create", "-n", "default", "--dry-run=server", "-f", "-", stdin=probe).returncode == 0,
        what="the apiserver to stop calling the webhook",
    )
    try:
        yield
    finally:
        install.register(cluster.state)


def audit(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webhook.audit.cli", "--kubeconfig", str(cluster.state.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=REPO,
    )


def report(cluster: Cluster, namespace: str | None) -> dict[str, Any] | None:
    args = (
        ("get", "policyreport", REPORT, "-n", namespace, "-o", "json")
        if namespace
        else ("get", "clusterpolicyreport", REPORT, "-o", "json")
    )
    completed = cluster.kubectl(*args)
    if completed.returncode != 0:
        assert "NotFound" in completed.stderr, completed.stderr
        return None
    found: dict[str, Any] = json.loads(completed.stdout)
    return found


def failing(found: dict[str, Any] | None) -> set[tuple[str, str, str]]:
    return {
        (r["resources"][0]["kind"], r["resources"][0]["name"], r["policy"])
        for r in (found or {}).get("results", [])
        if r["result"] in ("fail", "error", "warn")
    }


def test_existing_violators_are_reported_and_disappear_once_fixed(cluster: Cluster, crds: None) -> None:
    ns = cluster.namespace()
    with webhook_unregistered(cluster):
        created = cluster.apply(violators(), namespace=ns)
        assert created.returncode == 0, created.stderr
        # The ReplicaSet's pods must exist before the webhook is back, or it refuses them.
        eventually(lambda: len(cluster.pods(namespace=ns, selector="app=bypass")) == 2, what="the Deployment's pods")

    first = audit(cluster, "--write-reports", "-o", "json")
    assert first.returncode == 1, first.stderr  # enforce-level failures exist
    assert "reports: " in first.stderr

    namespaced = report(cluster, ns)
    assert namespaced is not None
    found = failing(namespaced)
    assert {
        ("Pod", "sneaky", "GPU001"),
        ("Pod", "root-gpu", "GPU002"),
        ("Pod", "dev-mount", "GPU003"),
        ("Deployment", "bypass", "GPU001"),
    } <= found
    # The template's finding is reported once, on the Deployment, not on its ReplicaSet and pods.
    assert not {
        item for item in found if item[0] in ("ReplicaSet", "Pod") and item[1].startswith("bypass-") and item[2] == "GPU001"
    }
    by_pod = {(r["resources"][0]["name"], r["policy"]): r for r in namespaced["results"]}
    sneaky = by_pod[("sneaky", "GPU001")]
    assert sneaky["message"] == (
        "GPU001: containers must not set the environment that chooses GPUs or switches off their isolation: "
        'container "main" sets NVIDIA_VISIBLE_DEVICES=all; request GPUs as resources, or use void'
    )
    assert (sneaky["result"], sneaky["severity"], sneaky["source"], sneaky["properties"]) == (
        "fail",
        "high",
        "gpu-admission",
        {"action": "enforce"},
    )
    assert set(sneaky["timestamp"]) == {"seconds", "nanos"}
    counted = {
        name: sum(1 for r in namespaced["results"] if r["result"] == name) for name in ("pass", "fail", "warn", "error", "skip")
    }
    assert namespaced["summary"] == counted

    cluster_report = report(cluster, None)
    assert cluster_report is not None
    (overcommitted,) = [
        r for r in cluster_report["results"] if r["policy"] == "GPU202" and r["resources"][0]["name"] == OVERCOMMIT_NODE
    ]
    assert overcommitted["result"] == "fail"
    assert "card 0: " in overcommitted["message"] and "Pod/overcommit" in overcommitted["message"]
    assert {"apiVersion": "v1", "kind": "Pod", "namespace": ns, "name": "overcommit"}.items() <= next(
        ref for ref in overcommitted["resources"] if ref.get("name") == "overcommit"
    ).items()

    # Nothing changed: nothing is written.
    version = namespaced["metadata"]["resourceVersion"]
    again = audit(cluster, "--write-reports", "-o", "json")
    assert again.returncode == 1
    assert "0 created, 0 replaced, 0 deleted" in again.stderr, again.stderr
    assert report(cluster, ns)["metadata"]["resourceVersion"] == version  # type: ignore[index]

    # Fix: remove the violators, recreate one of them the right way (through the webhook again).
    deleted = cluster.kubectl("delete", "deployment", "bypass", "-n", ns, "--cascade=foreground", "--wait=true", "--timeout=120s")
    assert deleted.returncode == 0, deleted.stderr
    deleted = cluster.kubectl("delete", "pods", "--all", "-n", ns, "--wait=true", "--timeout=120s")
    assert deleted.returncode == 0, deleted.stderr
    eventually(lambda: cluster.pods(namespace=ns) == [], what=f"no pods left in {ns}", timeout=120)
    fixed = cluster.apply(pod("sneaky", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]), namespace=ns)
    assert fixed.returncode == 0, fixed.stderr

    after = audit(cluster, "--write-reports")
    assert "reports: " in after.stderr
    assert report(cluster, ns) is None  # a namespace without findings has no report
    cluster_after = report(cluster, None)
    assert not [
        r
        for r in (cluster_after or {}).get("results", [])
        if any(ref.get("name") == "overcommit" and ref.get("namespace") == ns for ref in r["resources"])
    ]


def test_a_namespace_audit_writes_only_that_namespaces_report(cluster: Cluster, crds: None) -> None:
    mine, other = cluster.namespace(), cluster.namespace()
    with webhook_unregistered(cluster):
        for ns in (mine, other):
            created = cluster.apply(pod("sneaky", env=BYPASS_ENV), namespace=ns)
            assert created.returncode == 0, created.stderr
    try:
        completed = audit(cluster, "-n", mine, "--write-reports", "-o", "yaml")
        assert completed.returncode == 1, completed.stderr
        assert ("Pod", "sneaky", "GPU001") in failing(report(cluster, mine))
        assert report(cluster, other) is None
    finally:
        for ns in (mine, other):
            cluster.kubectl("delete", "namespace", ns, "--wait=false")


def test_a_namespace_override_selected_by_label_applies_in_the_live_audit(cluster: Cluster, crds: None, tmp_path: Path) -> None:
    lab, plain = cluster.namespace(), cluster.namespace()
    labelled = cluster.kubectl("label", "namespace", lab, "team=lab")
    assert labelled.returncode == 0, labelled.stderr
    config = tmp_path / "config.yaml"
    config.write_text(
        json.dumps(
            {
                "namespaceOverrides": [
                    {
                        "name": "lab",
                        "namespaceSelector": {"matchLabels": {"team": "lab"}},
                        "policies": {"GPU001": {"action": "warn"}},
                    }
                ]
            }
        )
    )
    with webhook_unregistered(cluster):
        for ns in (lab, plain):
            created = cluster.apply(pod("sneaky", env=BYPASS_ENV), namespace=ns)
            assert created.returncode == 0, created.stderr
    try:
        actions = {}
        for ns in (lab, plain):
            completed = audit(cluster, "-n", ns, "--config", str(config), "-o", "json")
            results = [r for item in json.loads(completed.stdout)["items"] for r in item.get("results", [])]
            # The exit status follows the enforce-level failures: GPU001 in the plain namespace, and
            # GPU201 in both when the scheduler put the pod on a GPU node (it may or may not have).
            enforced = any(r["result"] in ("fail", "error") and r["properties"]["action"] == "enforce" for r in results)
            assert completed.returncode == (1 if enforced else 0), completed.stderr
            (found,) = [r for r in results if r["policy"] == "GPU001" and r["resources"][0]["name"] == "sneaky"]
            actions[ns] = (found["result"], found["properties"]["action"])
        assert actions == {lab: ("warn", "warn"), plain: ("fail", "enforce")}  # a warn-level failure is an unscored warn
    finally:
        for ns in (lab, plain):
            cluster.kubectl("delete", "namespace", ns, "--wait=false")


def _metric(url: str, context: ssl.SSLContext, name: str) -> float | None:
    with urllib.request.urlopen(url, context=context, timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return None


class _Replica:
    """One `serve` process on a port of its own choosing (``--port 0``), read from its log."""

    def __init__(self, cluster: Cluster, log: Path) -> None:
        certs = cluster.state.directory / "webhook"
        self.context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        self.log = log
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [
                    install.executable(),
                    "serve",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    "0",
                    "--tls-cert-file",
                    str(certs / "tls.crt"),
                    "--tls-private-key-file",
                    str(certs / "tls.key"),
                    "--audit-interval",
                    "1s",
                    "--kubeconfig",
                    str(cluster.state.kubeconfig),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "POD_NAMESPACE": "default"},
            )
        self.port = 0

    def listening(self) -> bool:
        """True once the process has said where it listens; a process that died says why."""
        text = self.log.read_text(errors="replace")
        found = re.search(r"listening on https://127\.0\.0\.1:(\d+)", text)
        assert found or self.process.poll() is None, f"serve exited with {self.process.returncode}:\n{text}"
        self.port = int(found.group(1)) if found else 0
        return found is not None

    def metric(self, name: str) -> float | None:
        try:
            return _metric(f"https://127.0.0.1:{self.port}/metrics", self.context, name)
        except OSError:
            assert self.process.poll() is None, (
                f"serve exited with {self.process.returncode}:\n{self.log.read_text(errors='replace')}"
            )
            raise

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)


def test_serve_replicas_audit_in_the_background_with_one_leader(cluster: Cluster, crds: None, tmp_path: Path) -> None:
    ns = cluster.namespace()
    with webhook_unregistered(cluster):
        created = cluster.apply(pod("sneaky", env=BYPASS_ENV), namespace=ns)
        assert created.returncode == 0, created.stderr
    replicas: list[_Replica] = []
    try:
        replicas.extend(_Replica(cluster, tmp_path / f"serve-{index}.log") for index in range(2))
        # Both must be serving before their metrics are read: under load one can write the report
        # while the other is still starting.
        eventually(lambda: all([replica.listening() for replica in replicas]), what="both replicas listening", timeout=60)
        eventually(
            lambda: ("Pod", "sneaky", "GPU001") in failing(report(cluster, ns)), what="a background-written report", timeout=60
        )

        def leaders() -> list[float | None]:
            return [replica.metric("gpu_admission_audit_leader") for replica in replicas]

        eventually(lambda: sorted(value or 0.0 for value in leaders()) == [0.0, 1.0], what="exactly one leader", timeout=30)
        holder = json.loads(cluster.kubectl("get", "lease", "gpu-admission-audit", "-n", "default", "-o", "json").stdout)["spec"][
            "holderIdentity"
        ]
        assert holder
        # Under load a Lease renewal can miss and leadership move; judge the replica that leads now,
        # once it has finished a run of its own.
        current: list[_Replica] = []

        def leader_has_run() -> bool:
            current[:] = [r for r, value in zip(replicas, leaders(), strict=True) if value == 1.0]
            if len(current) != 1:
                return False
            runs = current[0].metric('gpu_admission_audit_runs_total{result="ok"}')
            return runs is not None and runs >= 1

        eventually(leader_has_run, what="the leader to finish a run", timeout=30)
        (leader,) = current
        assert (leader.metric("gpu_admission_audit_last_run_timestamp_seconds") or 0) > 0

        # The leader stops (releasing the Lease); the other replica takes over and keeps the report current.
        leader.stop()
        (follower,) = [r for r in replicas if r is not leader]
        eventually(
            lambda: follower.metric("gpu_admission_audit_leader") == 1.0, what="the other replica to take over", timeout=30
        )
        cluster.kubectl("delete", "pod", "sneaky", "-n", ns, "--wait=true", "--timeout=60s")
        eventually(lambda: report(cluster, ns) is None, what="the fixed namespace's report to go", timeout=60)
    finally:
        for replica in replicas:
            replica.stop()
        cluster.kubectl("delete", "namespace", ns, "--wait=false")


def test_the_audit_reads_the_ledger_lease_in_the_ledger_namespace_and_never_a_tenants(cluster: Cluster) -> None:
    """GPU203 on a real apiserver: an orphaned entry in node A's ledger Lease (in the ledger namespace
    the audit is told) is named with its Lease; the same entry in a Lease a tenant forged for node B
    in its own namespace is no ledger at all. The ledger namespace is this test's own: the local
    cluster's extender watches gpu-admission and would prune the orphan within seconds (its tidy
    pass), racing the audit."""
    suffix = uuid.uuid4().hex[:6]
    node_a, node_b = f"ledger-a-{suffix}", f"ledger-b-{suffix}"
    fake: list[Mapping[str, Any]] = [
        nodes.FakeNode(name=name, labels={gpu.SCHEDULE_LABEL: gpu.Mode.CGPU}, capacity={}).manifest() for name in (node_a, node_b)
    ]
    assert cluster.apply(fake, namespace="default").returncode == 0
    tenant = cluster.namespace()
    ledger_namespace = cluster.namespace()
    now = time.time()

    def orphan(node: str) -> allocation_.Allocation:
        return allocation_.Allocation(
            uid=str(uuid.uuid4()),
            namespace=tenant,
            name=f"gone-{node}",
            node=node,
            cards=(0,),
            memory_gib=4,
            assumed_at=now - 60,
            expires=now + 600,
            source="reservation",
        )

    leases = [(node_a, ledger_namespace), (node_b, tenant)]
    try:
        for node, namespace in leases:
            uid = cluster.get("node", node, namespace="default")["metadata"]["uid"]
            entry = orphan(node)
            body = reservations.lease_body(node, uid, {entry.uid: entry}, "e2e", namespace=namespace)
            assert cluster.apply(body, namespace=namespace).returncode == 0
        completed = audit(cluster, "-o", "json", "--ledger-namespace", ledger_namespace)
        assert completed.returncode in (0, 1), completed.stderr
        results = [
            r for item in json.loads(completed.stdout)["items"] if item["kind"] == "ClusterPolicyReport" for r in item["results"]
        ]
        found = {r["resources"][0]["name"]: r for r in results if r["policy"] == "GPU203"}
        assert found[node_a]["result"] == "warn", found[node_a]  # GPU203 fails at warn level
        assert f"gone-{node_a}" in found[node_a]["message"]
        assert f"(ledger Lease {ledger_namespace}/{reservations.lease_name(node_a)})" in found[node_a]["message"]
        assert node_b not in found  # no ledger: not judged
        assert f"gone-{node_b}" not in completed.stdout
    finally:
        cluster.kubectl("delete", "lease", reservations.lease_name(node_a), "-n", ledger_namespace, "--ignore-not-found")
        cluster.kubectl("delete", "node", node_a, node_b, "--ignore-not-found")
