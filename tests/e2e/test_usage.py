"""Real use against the accounting, end to end: a labeler process on a KWOK node whose inventory lists
real processes in real cgroups (one in a pod's kubelet-shaped cgroup, one in a `docker run`-shaped
one), the usage annotation on the Node, the audit's GPU213, an extender with
`--honour-out-of-band-usage` binding around the card that is full in reality, and `inspect`."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies import gpu
from policies.gpu import usage
from tests import cgroup_processes
from tests.e2e import extenders
from tests.e2e.harness import Cluster, eventually
from webhook.cluster import nodes

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
HIERARCHIES = cgroup_processes.hierarchies()
CARD_MIB = 15360


def write_inventory(path: Path, *, processes: dict[int, list[dict[str, int]]]) -> None:
    """Two 15 GiB cards; `processes` per card index. Written atomically for the running labeler."""
    document = {
        "gpus": [
            {
                "index": index,
                "uuid": f"GPU-usage-{index}",
                "name": "Tesla T4",
                "memoryMiB": CARD_MIB,
                "usedMiB": sum(p["usedMiB"] for p in processes.get(index, [])),
                "processes": processes.get(index, []),
            }
            for index in (0, 1)
        ],
    }
    scratch = path.with_suffix(".tmp")
    scratch.write_text(yaml.safe_dump(document))
    scratch.replace(path)


def node_usage(cluster: Cluster, name: str) -> usage.NodeUsage | None:
    return usage.of_node(cluster.get("node", name, namespace="default"))


def http_json(url: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})  # noqa: S310 - a local URL
    with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 - a local URL
        return json.loads(answer.read())


def inspect(cluster: Cluster, node: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webhook.cli", "inspect", "--kubeconfig", str(cluster.state.kubeconfig), node],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=REPO,
    )


@pytest.fixture
def share_node(cluster: Cluster) -> Iterator[str]:
    name = f"usage-e2e-{uuid.uuid4().hex[:8]}"
    fake = nodes.FakeNode(name=name, labels={gpu.SCHEDULE_LABEL: gpu.Mode.SHARE, gpu.PLACEMENT_LABEL: "binpack"}, capacity={})
    completed = cluster.apply(fake.manifest(), namespace="default")
    assert completed.returncode == 0, completed.stderr

    def ready() -> bool:
        conditions = cluster.get("node", name, namespace="default")["status"].get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    try:
        eventually(ready, what=f"node {name} Ready")
        yield name
    finally:
        cluster.kubectl("delete", "node", name, "--wait=false")


@pytest.mark.skipif(
    not HIERARCHIES, reason="needs root and a writable cgroup filesystem to run processes in kubelet-shaped cgroups"
)
def test_an_out_of_band_process_is_published_audited_avoided_and_inspected(
    cluster: Cluster, share_node: str, tmp_path: Path
) -> None:
    _, mount = HIERARCHIES[0]
    namespace = cluster.namespace()
    tag = uuid.uuid4().hex[:8]
    # A pod the default scheduler cannot place (a selector no node matches): the test binds it itself.
    pod_name = "usage-trainer"
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name},
        "spec": {
            "nodeSelector": {gpu.SCHEDULE_LABEL: "share", "gpu-admission.io/e2e-hold": "true"},
            "containers": [
                {"name": "main", "image": "registry.example/train:1", "resources": {"limits": {"aliyun.com/gpu-mem": "10"}}}
            ],
        },
    }
    completed = cluster.apply(manifest, namespace=namespace)
    assert completed.returncode == 0, completed.stderr
    pod_uid = cluster.get("pod", pod_name, namespace=namespace)["metadata"]["uid"]

    inventory = tmp_path / "inventory.yaml"
    write_inventory(inventory, processes={})
    labeler = [
        sys.executable,
        "-m",
        "webhook.labeler.cli",
        "labeler",
        "--node-name",
        share_node,
        "--kubeconfig",
        str(cluster.state.kubeconfig),
        "--inventory",
        str(inventory),
        "--interval",
        "300ms",
        "--usage-interval",
        "1s",
        "--advertise",
    ]
    rogue_container = uuid.uuid4().hex + uuid.uuid4().hex
    pod_container = uuid.uuid4().hex + uuid.uuid4().hex
    with (
        extenders.process(cluster, f"labeler-{share_node}", labeler),
        cgroup_processes.process_in(mount, cgroup_processes.docker_run_path(rogue_container, tag=tag)) as rogue,
        cgroup_processes.process_in(mount, cgroup_processes.systemd_pod_path(pod_uid, pod_container, tag=tag)) as trainer,
    ):
        eventually(
            lambda: (found := node_usage(cluster, share_node)) is not None and not found.cards[0].out_of_band,
            what="the first usage summary",
        )

        # 1. `docker run --gpus` beside the kubelet: 6000 MiB on card 0 that no pod accounts for.
        write_inventory(inventory, processes={0: [{"pid": rogue, "usedMiB": 6000}]})

        def rogue_published() -> bool:
            found = node_usage(cluster, share_node)
            return found is not None and [(o.pid, o.used_mib, o.container_id) for o in found.cards[0].out_of_band] == [
                (rogue, 6000, rogue_container)
            ]

        eventually(rogue_published, what="the out-of-band process in the node's usage summary")

        # 2. The audit reports it, naming node, card, PID, memory and container.
        audited = subprocess.run(
            [sys.executable, "-m", "webhook.audit.cli", "--kubeconfig", str(cluster.state.kubeconfig), "-o", "json"],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            cwd=REPO,
        )
        results = [r for item in json.loads(audited.stdout)["items"] for r in item.get("results", [])]
        gpu213 = [r for r in results if r["policy"] == "GPU213" and share_node in r["message"]]
        assert len(gpu213) == 1 and gpu213[0]["result"] == "fail", gpu213
        assert f"card 0: pid {rogue} holds 6000 MiB in container {rogue_container[:12]}" in gpu213[0]["message"]

        # 3. An extender honouring out-of-band use binds the 10 GiB pod to card 1: card 0 has 9 GiB left in reality.
        with extenders.extender(cluster, f"extender-usage-{tag}", ("--honour-out-of-band-usage",)) as base:

            def sees_the_rogue() -> bool:
                devices = http_json(f"{base}/inspect/{share_node}")["nodes"][0]["devs"]
                return bool(devices[0].get("outOfBandMiB") == 6000 and devices[0]["totalGPU"] == 9)

            eventually(sees_the_rogue, what="the extender's cache with the usage summary")
            answer = http_json(
                f"{base}/bind", {"PodName": pod_name, "PodNamespace": namespace, "PodUID": pod_uid, "Node": share_node}
            )
            assert answer == {"Error": ""}
        bound = cluster.get("pod", pod_name, namespace=namespace)
        assert bound["spec"]["nodeName"] == share_node
        assert json.loads(bound["metadata"]["annotations"][gpu.ALLOCATION_ANNOTATION])["cards"] == [1]

        # 4. The pod's own process on its card is attributed to it, not out-of-band.
        write_inventory(inventory, processes={0: [{"pid": rogue, "usedMiB": 6000}], 1: [{"pid": trainer, "usedMiB": 2048}]})

        def trainer_attributed() -> bool:
            found = node_usage(cluster, share_node)
            card = found.card(1) if found is not None else None
            return card is not None and [(p.uid, p.namespace, p.name, p.used_mib) for p in card.pods] == [
                (pod_uid, namespace, pod_name, 2048)
            ]

        eventually(trainer_attributed, what="the pod's process attributed to its pod")
        found = node_usage(cluster, share_node)
        assert found is not None and not found.cards[1].out_of_band

        # 5. inspect shows real use beside allocation.
        shown = inspect(cluster, share_node)
        assert shown.returncode == 0, shown.stderr
        header, row = shown.stdout.splitlines()[:2]
        assert "GPU0(Used)" in header and "GPU1(Used)" in header
        assert row.split()[2:4] == ["0/15", "10/15"]
        assert "5.9(5.9 oob)" in row and " 2.0 " in f" {row} "

        # 6. The labeler's dry-run names each process's pod, or says outOfBand.
        dry = subprocess.run(
            [*labeler[: labeler.index("--interval")], "--dry-run", "--list-pods", "-o", "json"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=REPO,
        )
        assert dry.returncode == 0, dry.stderr
        processes = {p["pid"]: p for card in json.loads(dry.stdout)["usage"] for p in card["processes"]}
        assert processes[rogue]["outOfBand"] is True and processes[rogue]["containerID"] == rogue_container
        assert processes[trainer]["pod"] == {"namespace": namespace, "name": pod_name, "uid": pod_uid}
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
