"""GPU nodes are a trust zone, through the real apiserver and kube-scheduler, from a tenant's side.

A pod that asks for a card gets only what GPU nodes allow: the kubelet's FlexVolume directory (the
kubelet runs a new driver's `init` as root) and `SYS_MODULE` are refused, though no list of
dangerous paths or capabilities ever named them. A CI runner without GPUs keeps the Docker socket
and its privilege, is told why it is kept off GPU nodes, and kube-scheduler places it on the
CPU-only node, and while that node is cordoned it waits Pending rather than land on a free GPU node.
A NIC under `nvidia.com/` is no GPU, and another scheduler's device annotation is refused on any
pod.

The default KWOK node set has GPU nodes (cgpu-binpack-0, ...) and one CPU-only node (cpu-0).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from policies import trustzone
from tests.e2e import harness
from tests.e2e.harness import Cluster
from webhook.cluster import nodes

pytestmark = pytest.mark.e2e

CPU_NODE = "cpu-0"
CARD_LABEL = "aliyun.accelerator/nvidia_name"
FLEXVOLUME = "/usr/libexec/kubernetes/kubelet-plugins/volume/exec"


def pod(name: str, *, limits: dict[str, Any] | None = None, **container: Any) -> dict[str, Any]:
    main: dict[str, Any] = {"name": "main", "image": "registry.example/app:1", **container}
    if limits:
        main["resources"] = {"limits": limits}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {"containers": [main]}}


def create(cluster: Cluster, obj: dict[str, Any], *, namespace: str) -> Any:
    return cluster.kubectl("create", "-n", namespace, "-f", "-", stdin=json.dumps(obj))


def test_a_gpu_pod_mounting_the_kubelets_flexvolume_directory_is_refused(cluster: Cluster) -> None:
    ns = cluster.namespace()
    attack = pod("flex", limits={"aliyun.com/gpu-mem": 1}, volumeMounts=[{"name": "flex", "mountPath": "/flex"}])
    attack["spec"]["volumes"] = [{"name": "flex", "hostPath": {"path": FLEXVOLUME, "type": "DirectoryOrCreate"}}]

    completed = create(cluster, attack, namespace=ns)

    assert completed.returncode != 0
    assert 'admission webhook "validate.gpu-admission.io" denied the request: GPU003: ' in completed.stderr
    assert f'volume "flex" mounts hostPath {FLEXVOLUME}, which is not an allowed host path' in completed.stderr
    assert cluster.pods(namespace=ns) == []


@pytest.mark.parametrize("spelled", ["SYS_MODULE", "cap_dac_read_search"])
def test_a_gpu_pod_adding_a_capability_no_list_named_is_refused(cluster: Cluster, spelled: str) -> None:
    ns = cluster.namespace()

    completed = create(
        cluster,
        pod("module", limits={"aliyun.com/gpu-mem": 1}, securityContext={"capabilities": {"add": [spelled]}}),
        namespace=ns,
    )

    assert completed.returncode != 0
    assert "GPU002: " in completed.stderr and f'container "main" adds capability {spelled}' in completed.stderr
    assert cluster.pods(namespace=ns) == []


def ci_runner(name: str) -> dict[str, Any]:
    """A privileged CI runner with the Docker socket, asking for no GPU."""
    runner = pod(
        name, securityContext={"privileged": True}, volumeMounts=[{"name": "docker", "mountPath": "/var/run/docker.sock"}]
    )
    runner["spec"]["volumes"] = [{"name": "docker", "hostPath": {"path": "/var/run/docker.sock", "type": "Socket"}}]
    return runner


def scheduling_condition(found: dict[str, Any]) -> dict[str, Any]:
    """The pod's PodScheduled condition ({} while there is none)."""
    conditions = found.get("status", {}).get("conditions", [])
    return next((c for c in conditions if c.get("type") == "PodScheduled"), {})


def test_a_ci_runner_with_the_docker_socket_is_warned_kept_off_gpu_nodes_and_placed_on_the_cpu_node(cluster: Cluster) -> None:
    ns = cluster.namespace()

    completed = create(cluster, ci_runner("ci-runner"), namespace=ns)

    assert completed.returncode == 0, completed.stderr
    assert (
        "Warning: GPU103: pods that use no GPU but have node power are kept off GPU nodes: kept off GPU nodes" in completed.stderr
    )
    assert "volume \"docker\" mounts hostPath /run/docker.sock (written '/var/run/docker.sock')" in completed.stderr
    stored = cluster.pod_once(
        "ci-runner", namespace=ns, condition=lambda found: bool(found.get("spec", {}).get("nodeName")), what="ci-runner scheduled"
    )
    terms = stored["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [dict(e) for e in trustzone.DEFAULT_ZONE.keep_off]}]
    assert stored["spec"]["nodeName"] == CPU_NODE
    assert CARD_LABEL not in cluster.node_labels(CPU_NODE)


def test_a_ci_runner_waits_pending_while_only_gpu_nodes_are_schedulable_and_then_lands_on_the_cpu_node(cluster: Cluster) -> None:
    ns = cluster.namespace()
    cordoned = cluster.kubectl("cordon", CPU_NODE)
    assert cordoned.returncode == 0, cordoned.stderr
    try:
        completed = create(cluster, ci_runner("waiting-runner"), namespace=ns)
        assert completed.returncode == 0, completed.stderr
        # kube-scheduler tried every node: the cordoned CPU node and GPU nodes the affinity excludes.
        waiting = cluster.pod_once(
            "waiting-runner",
            namespace=ns,
            condition=lambda found: scheduling_condition(found).get("reason") == "Unschedulable",
            what="waiting-runner found unschedulable",
        )
    finally:
        uncordoned = cluster.kubectl("uncordon", CPU_NODE)
    assert uncordoned.returncode == 0, uncordoned.stderr
    assert "nodeName" not in waiting["spec"]
    message = scheduling_condition(waiting)["message"]
    assert "1 node(s) were unschedulable" in message
    assert "node(s) didn't match Pod's node affinity/selector" in message

    placed = cluster.pod_once(
        "waiting-runner",
        namespace=ns,
        condition=lambda found: bool(found["spec"].get("nodeName")),
        what="waiting-runner scheduled",
    )

    assert placed["spec"]["nodeName"] == CPU_NODE


def test_a_container_asking_only_for_a_nic_gets_void_devices(cluster: Cluster) -> None:
    ns = cluster.namespace()

    completed = create(cluster, pod("rdma", limits={"nvidia.com/hostdev": 1}), namespace=ns)

    assert completed.returncode == 0, completed.stderr
    stored = cluster.get("pod", "rdma", namespace=ns)
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in stored["spec"]["containers"][0]["env"]


def test_another_schedulers_device_annotation_is_refused_on_a_pod_without_gpus(cluster: Cluster) -> None:
    ns = cluster.namespace()
    forged = pod("forged")
    forged["metadata"]["annotations"] = {"scheduling.koordinator.sh/device-allocated": '{"gpu":[{"minor":0}]}'}

    completed = create(cluster, forged, namespace=ns)

    assert completed.returncode != 0
    assert "GPU010: " in completed.stderr and "scheduling.koordinator.sh/device-allocated" in completed.stderr
    assert cluster.pods(namespace=ns) == []


# --- GPU clusters as they exist (issue 33) ------------------------------------------------------------

REPO = pathlib.Path(__file__).resolve().parents[2]
KEEP_OFF = [dict(e) for e in trustzone.DEFAULT_ZONE.keep_off]
GPU_CAPACITY = {"nvidia.com/gpu": "8"}
# KWOK GPU nodes labelled each by one stack only (and one by none), as those stacks label them.
FOREIGN_GPU_NODES = {
    "gpu-operator-0": {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.deploy.driver": "true",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        "nvidia.com/gpu.count": "8",
    },
    "nfd-0": {"feature.node.kubernetes.io/pci-10de.present": "true"},
    "gke-0": {"cloud.google.com/gke-accelerator": "nvidia-l4"},
}
BARE_GPU_NODE = "bare-gpu-0"


@pytest.fixture(scope="module")
def foreign_gpu_nodes(cluster: Cluster) -> Iterator[None]:
    """The nodes above, and one with GPU capacity and no GPU label at all, created cordoned: no label
    can keep a pod off it, which is what the audit's GPU217 reports (the test labels it as told)."""
    made = [
        nodes.FakeNode(name=name, labels=labels, capacity=GPU_CAPACITY).manifest() for name, labels in FOREIGN_GPU_NODES.items()
    ]
    bare = nodes.FakeNode(name=BARE_GPU_NODE, labels={}, capacity=GPU_CAPACITY).manifest()
    bare["spec"]["unschedulable"] = True
    for node in (*made, bare):
        created = cluster.kubectl("create", "-f", "-", stdin=json.dumps(node))
        assert created.returncode == 0, created.stderr
    try:
        yield
    finally:
        for node in (*made, bare):
            cluster.kubectl("delete", "node", node["metadata"]["name"], "--ignore-not-found")


def audit(cluster: Cluster) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webhook.audit.cli", "--kubeconfig", str(cluster.state.kubeconfig)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=REPO,
    )


def privileged_runners(name: str, *, replicas: int) -> dict[str, Any]:
    runner = ci_runner(name)
    return harness.deployment(name, runner["spec"], app=name, replicas=replicas)


def test_a_privileged_cpu_pod_lands_on_no_gpu_node_whoever_labelled_it(cluster: Cluster, foreign_gpu_nodes: None) -> None:
    ns = cluster.namespace()

    applied = cluster.apply(privileged_runners("dind", replicas=4), namespace=ns)

    assert applied.returncode == 0, applied.stderr
    running = cluster.running_pods(namespace=ns, selector="app=dind", count=4, timeout=120)
    # The empty foreign GPU nodes would score best; the affinity leaves only the CPU node.
    assert sorted(p["spec"]["nodeName"] for p in running) == [CPU_NODE] * 4
    terms = running[0]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": KEEP_OFF}]

    # GPU103's notice is an Event on each pod, with its uid: what `kubectl describe pod` lists.
    first = running[0]
    selector = f"reason=KeptOffGpuNodes,involvedObject.name={first['metadata']['name']}"

    def notices() -> list[dict[str, Any]]:
        listed = cluster.kubectl("get", "events", "-n", ns, "--field-selector", selector, "-o", "json")
        assert listed.returncode == 0, listed.stderr
        items: list[dict[str, Any]] = json.loads(listed.stdout)["items"]
        return items

    harness.eventually(lambda: len(notices()) == 1, what="the KeptOffGpuNodes event", timeout=30)
    (event,) = notices()
    assert event["involvedObject"]["uid"] == first["metadata"]["uid"] and event["type"] == "Normal"
    assert event["message"].startswith("GPU103: kept off GPU nodes (required node affinity against every GPU node label): ")
    described = cluster.kubectl("describe", "pod", "-n", ns, first["metadata"]["name"])
    assert described.returncode == 0 and "KeptOffGpuNodes" in described.stdout


def test_the_audit_names_the_gpu_node_no_label_marks_and_its_label_closes_the_hole(
    cluster: Cluster, foreign_gpu_nodes: None
) -> None:
    found = audit(cluster)

    rows = [line for line in found.stdout.splitlines() if "GPU217" in line]
    assert [row for row in rows if BARE_GPU_NODE in row], found.stdout + found.stderr
    assert not [row for row in rows if any(name in row for name in FOREIGN_GPU_NODES)]
    assert "nvidia.com/gpu.present=true" in found.stdout

    labelled = cluster.kubectl("label", "node", BARE_GPU_NODE, "nvidia.com/gpu.present=true")
    assert labelled.returncode == 0, labelled.stderr
    uncordoned = cluster.kubectl("uncordon", BARE_GPU_NODE)
    assert uncordoned.returncode == 0, uncordoned.stderr
    ns = cluster.namespace()
    applied = cluster.apply(privileged_runners("after-label", replicas=2), namespace=ns)
    assert applied.returncode == 0, applied.stderr
    running = cluster.running_pods(namespace=ns, selector="app=after-label", count=2, timeout=120)
    assert sorted(p["spec"]["nodeName"] for p in running) == [CPU_NODE] * 2
    again = audit(cluster)
    assert not [line for line in again.stdout.splitlines() if "GPU217" in line and BARE_GPU_NODE in line]


def test_host_ports_in_the_trust_zone(cluster: Cluster) -> None:
    ns = cluster.namespace()
    kubelet = pod("kubelet-port", limits={"nvidia.com/gpu": 1}, ports=[{"containerPort": 8080, "hostPort": 10250}])

    refused = create(cluster, kubelet, namespace=ns)

    assert refused.returncode != 0
    assert "GPU002: " in refused.stderr and 'container "main" asks for hostPort 10250' in refused.stderr

    notebook = yaml.safe_load((REPO / "examples" / "workloads" / "tf-notebook.yaml").read_text())
    admitted = cluster.apply(notebook, namespace=ns)
    assert admitted.returncode == 0, admitted.stderr

    cpu = harness.deployment(
        "kubelet-squatter",
        {
            "containers": [
                {"name": "main", "image": "registry.example/app:1", "ports": [{"containerPort": 80, "hostPort": 10250}]}
            ]
        },
        app="squatter",
    )
    applied = cluster.apply(cpu, namespace=ns)
    assert applied.returncode == 0, applied.stderr
    (running,) = cluster.running_pods(namespace=ns, selector="app=squatter", timeout=120)
    assert running["spec"]["nodeName"] == CPU_NODE
    terms = running["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": KEEP_OFF}]
