"""The labeler as a real process against the real apiserver, on its own KWOK node per test."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies import gpu
from policies.gpu import usage
from tests.e2e.harness import Cluster, eventually
from webhook.cluster import nodes
from webhook.labeler import ownership

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "deploy" / "labeler.yaml"
SERVICE_ACCOUNT = "system:serviceaccount:gpu-admission:gpu-admission-labeler"


def write_inventory(path: Path, *, count: int, name: str = "Tesla T4", memory_mib: int = 15360) -> Path:
    """Write an inventory file atomically, so a running labeler never reads half of it."""
    document = {
        "driverVersion": "550.107.02",
        "gpus": [{"index": i, "uuid": f"GPU-e2e-{i}", "name": name, "memoryMiB": memory_mib} for i in range(count)],
        "topology": {"links": [[i, i + 1, "NV2"] for i in range(count - 1)]},
    }
    scratch = path.with_suffix(".tmp")
    scratch.write_text(yaml.safe_dump(document))
    scratch.replace(path)
    return path


def labeler(cluster: Cluster, node: str, inventory: Path, *extra: str) -> list[str]:
    """The command line of one labeler process (the module entry point: same parser as the console script)."""
    return [
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
        *extra,
    ]


def run_once(command: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*command, "--once"], capture_output=True, text=True, timeout=60, check=False, cwd=REPO)


def node_object(cluster: Cluster, name: str) -> dict[str, Any]:
    return cluster.get("node", name, namespace="default")


def capacity(cluster: Cluster, name: str) -> dict[str, str]:
    result: dict[str, str] = node_object(cluster, name)["status"].get("capacity", {})
    return result


def ready(cluster: Cluster, name: str) -> bool:
    conditions = node_object(cluster, name)["status"].get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


@pytest.fixture
def gpu_node(cluster: Cluster) -> Iterator[str]:
    """A fresh KWOK node in cgpu mode with no card labels and no GPU capacity, Ready before use.

    Waiting for Ready matters: kwok's node-initialize stage writes the whole status from what it
    read, and a capacity patch racing it could be lost; after that kwok only renews conditions
    (its heartbeat stage does not touch capacity), which the tests below also check.
    """
    name = f"labeler-e2e-{uuid.uuid4().hex[:8]}"
    fake = nodes.FakeNode(name=name, labels={gpu.SCHEDULE_LABEL: gpu.Mode.CGPU}, capacity={})
    completed = cluster.apply(fake.manifest(), namespace="default")
    assert completed.returncode == 0, completed.stderr
    try:
        eventually(lambda: ready(cluster, name), what=f"node {name} Ready")
        yield name
    finally:
        cluster.kubectl("delete", "node", name, "--wait=false")


@contextlib.contextmanager
def running(command: Sequence[str], *, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as stream:
        process = subprocess.Popen(command, stdout=stream, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=15)


def test_labels_and_capacity_follow_the_inventory_and_the_mode(cluster: Cluster, gpu_node: str, tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path / "inventory.yaml", count=4)
    log = tmp_path / "labeler.log"
    with running(labeler(cluster, gpu_node, inventory, "--interval", "300ms", "--advertise"), log=log) as process:

        def has(want_labels: dict[str, str], want_capacity: dict[str, str]) -> bool:
            assert process.poll() is None, log.read_text()
            obj = node_object(cluster, gpu_node)
            have_labels = obj["metadata"].get("labels", {})
            status = obj["status"]
            return all(have_labels.get(k) == v for k, v in want_labels.items()) and all(
                status.get("capacity", {}).get(k) == v and status.get("allocatable", {}).get(k) == v
                for k, v in want_capacity.items()
            )

        # Labels and cgpu capacity appear: 4 x 15 GiB.
        eventually(
            lambda: has(
                {
                    gpu.CARD_NAME_LABEL: "Tesla-T4",
                    gpu.CARD_MEMORY_LABEL: "15360MiB",
                    gpu.CARD_COUNT_LABEL: "4",
                    gpu.CARD_MEMORY_MIB_LABEL: "15360",
                },
                {"aliyun.com/gpu-mem": "60", "aliyun.com/gpu-count": "4", "aliyun.com/gpu": "0", "nvidia.com/gpu": "0"},
            ),
            what="labels and cgpu capacity",
            timeout=30,
        )
        annotations = node_object(cluster, gpu_node)["metadata"]["annotations"]
        assert len(json.loads(annotations[gpu.INVENTORY_ANNOTATION])) == 4
        assert json.loads(annotations[gpu.TOPOLOGY_ANNOTATION]) == {"links": [[0, 1, "NV2"], [1, 2, "NV2"], [2, 3, "NV2"]]}

        # A mode switch is re-advertised within an interval.
        assert cluster.kubectl("label", "node", gpu_node, f"{gpu.SCHEDULE_LABEL}=topology", "--overwrite").returncode == 0
        eventually(
            lambda: has({}, {"aliyun.com/gpu": "4", "aliyun.com/gpu-mem": "0", "aliyun.com/gpu-count": "0"}),
            what="topology capacity after the mode switch",
            timeout=30,
        )

        # A card removed from the inventory: count, capacity, inventory and topology follow.
        write_inventory(inventory, count=3)
        eventually(lambda: has({gpu.CARD_COUNT_LABEL: "3"}, {"aliyun.com/gpu": "3"}), what="three cards", timeout=30)
        annotations = node_object(cluster, gpu_node)["metadata"]["annotations"]
        assert [c["index"] for c in json.loads(annotations[gpu.INVENTORY_ANNOTATION])] == [0, 1, 2]
        assert len(json.loads(annotations[gpu.TOPOLOGY_ANNOTATION])["links"]) == 2

        # Every card gone: every key it owned is removed, the record too.
        write_inventory(inventory, count=0)

        def unlabeled() -> bool:
            obj = node_object(cluster, gpu_node)["metadata"]
            return gpu.CARD_COUNT_LABEL not in obj.get("labels", {}) and ownership.OWNED_ANNOTATION not in obj.get(
                "annotations", {}
            )

        eventually(unlabeled, what="owned labels removed", timeout=30)
        eventually(lambda: has({}, {"aliyun.com/gpu": "0"}), what="no cards advertised", timeout=30)
        assert node_object(cluster, gpu_node)["metadata"]["labels"][gpu.SCHEDULE_LABEL] == "topology"  # never its key

        # KWOK kept the node Ready and did not overwrite what was patched into its status.
        assert ready(cluster, gpu_node)
        assert capacity(cluster, gpu_node)["aliyun.com/gpu-mem"] == "0"

        os.killpg(process.pid, signal.SIGTERM)
        assert process.wait(timeout=15) == 0, log.read_text()
    text = log.read_text()
    assert "Traceback" not in text
    assert "stopped" in text


def test_foreign_aliyun_labels_are_left_alone_unless_taken_over(cluster: Cluster, gpu_node: str, tmp_path: Path) -> None:
    foreign = {gpu.CARD_NAME_LABEL: "Tesla-M40", gpu.CARD_MEMORY_LABEL: "12209MiB", gpu.CARD_COUNT_LABEL: "1"}
    assert cluster.kubectl("label", "node", gpu_node, *(f"{k}={v}" for k, v in foreign.items())).returncode == 0
    command = labeler(cluster, gpu_node, write_inventory(tmp_path / "inventory.yaml", count=2))

    completed = run_once(command)
    assert completed.returncode == 0, completed.stderr
    assert "--take-over" in completed.stderr  # says why it left them
    node_labels = cluster.node_labels(gpu_node)
    assert {k: node_labels[k] for k in foreign} == foreign
    assert node_labels[gpu.CARD_MEMORY_MIB_LABEL] == "15360"  # its own keys are written all the same

    completed = run_once([*command, "--take-over"])
    assert completed.returncode == 0, completed.stderr
    node_labels = cluster.node_labels(gpu_node)
    assert node_labels[gpu.CARD_NAME_LABEL] == "Tesla-T4"
    assert node_labels[gpu.CARD_COUNT_LABEL] == "2"
    owned = ownership.owned(node_object(cluster, gpu_node)["metadata"]["annotations"])
    assert gpu.CARD_NAME_LABEL in owned.labels

    completed = run_once(command)  # owned now: no flag needed, nothing to change
    assert completed.returncode == 0, completed.stderr
    assert "--take-over" not in completed.stderr


def test_the_manifest_is_valid_and_its_service_account_can_label_a_node_and_nothing_more(
    cluster: Cluster, gpu_node: str, tmp_path: Path
) -> None:
    # Everything but the DaemonSet for real (KWOK would "run" it on every fake GPU node of the
    # shared cluster); the DaemonSet through the apiserver's validation only.
    namespace = [d for d in yaml.safe_load_all((MANIFEST.parent / "namespace.yaml").read_text()) if d]
    documents = namespace + [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d and d["kind"] != "DaemonSet"]
    created = cluster.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": documents}))
    assert created.returncode == 0, created.stderr
    dry_run = cluster.kubectl("apply", "--dry-run=server", "-f", str(MANIFEST))
    assert dry_run.returncode == 0, dry_run.stderr

    def can(*args: str) -> bool:
        return cluster.kubectl("auth", "can-i", *args, f"--as={SERVICE_ACCOUNT}").stdout.strip() == "yes"

    eventually(lambda: can("patch", "nodes/status"), what="the RBAC binding to take effect")
    assert can("get", "nodes") and can("patch", "nodes")
    assert can("list", "pods", "-A")  # the pods of its node, to attribute GPU processes (fieldSelector)
    for verb, resource in [
        ("list", "nodes"),
        ("watch", "nodes"),
        ("delete", "nodes"),
        ("update", "nodes/status"),
        ("create", "pods"),
        ("get", "secrets"),
    ]:
        assert not can(verb, resource, "-A"), f"{verb} {resource} should be refused"

    # The service account's own token is enough for a full pass with --advertise: the token of a pod
    # on that node, as the kubelet mounts it (deploy/node-guard.yaml refuses a token without the
    # pod's node claim, and any node but that one).
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"labeler-{gpu_node}", "namespace": "gpu-admission"},
        "spec": {
            "serviceAccountName": "gpu-admission-labeler",
            "nodeName": gpu_node,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "labeler",
                    "image": "gpu-admission:0.1.0",
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
        },
    }
    created = cluster.apply(pod, namespace="gpu-admission")
    assert created.returncode == 0, created.stderr
    token = cluster.kubectl(
        "create",
        "token",
        "gpu-admission-labeler",
        "-n",
        "gpu-admission",
        "--duration=10m",
        "--bound-object-kind=Pod",
        f"--bound-object-name=labeler-{gpu_node}",
    )
    assert token.returncode == 0, token.stderr
    kubeconfig = tmp_path / "labeler.kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "local",
                        "cluster": {
                            "server": cluster.state.server,
                            "certificate-authority": str(cluster.state.directory / "pki" / "ca.crt"),
                        },
                    }
                ],
                "users": [{"name": "labeler", "user": {"token": token.stdout.strip()}}],
                "contexts": [{"name": "labeler", "context": {"cluster": "local", "user": "labeler"}}],
                "current-context": "labeler",
            }
        )
    )
    inventory = write_inventory(tmp_path / "inventory.yaml", count=2)
    completed = run_once(
        [
            sys.executable,
            "-m",
            "webhook.labeler.cli",
            "labeler",
            "--node-name",
            gpu_node,
            "--kubeconfig",
            str(kubeconfig),
            "--inventory",
            str(inventory),
            "--advertise",
        ]
    )
    assert completed.returncode == 0, completed.stderr
    assert cluster.node_labels(gpu_node)[gpu.CARD_COUNT_LABEL] == "2"
    assert capacity(cluster, gpu_node)["aliyun.com/gpu-mem"] == "30"
    # Real use with the same token: the pod list and the usage annotation pass RBAC and the node guard.
    document = yaml.safe_load(inventory.read_text())
    document["gpus"][0].update({"usedMiB": 700, "processes": [{"pid": os.getpid(), "usedMiB": 700}]})
    inventory.write_text(yaml.safe_dump(document))
    completed = run_once(
        [
            sys.executable,
            "-m",
            "webhook.labeler.cli",
            "labeler",
            "--node-name",
            gpu_node,
            "--kubeconfig",
            str(kubeconfig),
            "--inventory",
            str(inventory),
            "--advertise",
        ]
    )
    assert completed.returncode == 0, completed.stderr
    written = usage.of_node(node_object(cluster, gpu_node))
    assert written is not None and [o.pid for o in written.cards[0].out_of_band] == [os.getpid()]  # the test runner: no pod
    cluster.kubectl("delete", "pod", f"labeler-{gpu_node}", "-n", "gpu-admission", "--wait=false")


def test_a_missing_node_fails_a_once_pass_with_one_line(cluster: Cluster, tmp_path: Path) -> None:
    completed = run_once(labeler(cluster, "no-such-node", write_inventory(tmp_path / "inventory.yaml", count=1)))
    assert completed.returncode == 1
    assert "no-such-node not found" in completed.stderr
    assert "Traceback" not in completed.stderr
