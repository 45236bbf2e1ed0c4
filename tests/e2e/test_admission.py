"""The webhook as kube-apiserver calls it: refusals, mutations, exemptions, dry runs, outages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.harness import Cluster, deployment, eventually
from webhook.cluster import controlplane, install

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def pod(
    name: str, *, env: dict[str, str] | None = None, limits: dict[str, Any] | None = None, privileged: bool = False
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "registry.example/app:1"}
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    if limits:
        container["resources"] = {"limits": limits}
    if privileged:
        container["securityContext"] = {"privileged": True}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {"containers": [container]}}


def seed(kind: str, name: str) -> dict[str, Any]:
    """A seed workload from the shipped examples, found by kind and name."""
    for path in sorted(EXAMPLES.rglob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if isinstance(document, dict) and document.get("kind") == kind and document.get("metadata", {}).get("name") == name:
                document["metadata"].pop("namespace", None)  # each test applies into its own namespace
                return document
    raise AssertionError(f"no example {kind}/{name} under examples/")


def run_admitted(
    cluster: Cluster, workloads: list[dict[str, Any]], *, namespace: str, timeout: float
) -> tuple[list[dict[str, Any]], dict[str, dict[str, str]]]:
    """Apply each workload (each must be admitted) and wait for one running pod each: the pods, and
    the labels of the node each runs on by pod name."""
    for workload in workloads:
        completed = cluster.apply(workload, namespace=namespace)
        assert completed.returncode == 0, f"{workload['kind']}/{workload['metadata']['name']}: {completed.stderr}"
    running = cluster.running_pods(namespace=namespace, count=len(workloads), timeout=timeout)
    return running, {p["metadata"]["name"]: cluster.node_labels(p["spec"]["nodeName"]) for p in running}


def test_a_pod_setting_nvidia_visible_devices_is_refused_with_the_gpu001_message(cluster: Cluster) -> None:
    ns = cluster.namespace()
    completed = cluster.apply(pod("sneaky", env={"NVIDIA_VISIBLE_DEVICES": "all"}), namespace=ns)
    assert completed.returncode != 0
    assert 'admission webhook "validate.gpu-admission.io" denied the request' in completed.stderr
    assert "GPU001" in completed.stderr
    assert cluster.pods(namespace=ns) == []


def test_a_privileged_gpu_pod_is_refused(cluster: Cluster) -> None:
    ns = cluster.namespace()
    completed = cluster.apply(pod("root-gpu", limits={"nvidia.com/gpu": 1}, privileged=True), namespace=ns)
    assert completed.returncode != 0
    assert "GPU002" in completed.stderr


def test_a_deployment_with_a_bypass_in_its_template_is_refused_when_applied(cluster: Cluster) -> None:
    ns = cluster.namespace()
    template = pod("x", env={"NVIDIA_VISIBLE_DEVICES": "0,1"})
    completed = cluster.apply(deployment("bypass", template["spec"], app="bypass"), namespace=ns)
    assert completed.returncode != 0
    assert "GPU001" in completed.stderr
    assert cluster.kubectl("get", "deployment", "bypass", "-n", ns).returncode != 0


def test_a_gpu_mem_pod_gets_the_shared_mode_selector_and_runs_on_a_cgpu_node(cluster: Cluster) -> None:
    ns = cluster.namespace()
    completed = cluster.apply(pod("shared", limits={"aliyun.com/gpu-mem": 3}), namespace=ns)
    assert completed.returncode == 0, completed.stderr
    stored = cluster.get("pod", "shared", namespace=ns)
    assert stored["spec"]["nodeSelector"] == {"ack.node.gpu.schedule": "cgpu"}
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} not in stored["spec"]["containers"][0].get("env", [])
    [running] = cluster.running_pods(namespace=ns)
    assert cluster.node_labels(running["spec"]["nodeName"])["ack.node.gpu.schedule"] == "cgpu"


def test_a_pod_without_gpu_gets_its_visible_devices_neutralised(cluster: Cluster) -> None:
    ns = cluster.namespace()
    assert cluster.apply(pod("plain"), namespace=ns).returncode == 0
    stored = cluster.get("pod", "plain", namespace=ns)
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in stored["spec"]["containers"][0]["env"]


def test_the_seed_workloads_are_admitted_and_run_where_the_seeds_say(cluster: Cluster) -> None:
    ns = cluster.namespace()
    workloads = [
        seed("Deployment", "tf-notebook"),
        seed("Pod", "not-in-gpu-node"),
        seed("StatefulSet", "cgpu-test"),
        seed("StatefulSet", "cgpu-test-no-isolation"),
        seed("Pod", "tensorflow-mnist"),
    ]
    _, where = run_admitted(cluster, workloads, namespace=ns, timeout=90)
    by_prefix = {
        next(n for n in where if n.startswith(prefix)): prefix
        for prefix in ("tf-notebook", "not-in-gpu-node", "cgpu-test-0", "cgpu-test-no-isolation-0", "tensorflow-mnist")
    }
    labels = {prefix: where[name] for name, prefix in by_prefix.items()}
    # 000_2d8695719794de07.txt: tf-notebook asks for a Tesla-M40 by nodeSelector, not-in-gpu-node avoids GPU nodes.
    assert labels["tf-notebook"]["aliyun.accelerator/nvidia_name"] == "Tesla-M40"
    assert "aliyun.accelerator/nvidia_name" not in labels["not-in-gpu-node"]
    # 004_79385826ac27146d.txt: the isolated pool is cgpu, the pool without isolation is share.
    assert labels["cgpu-test-0"]["ack.node.gpu.schedule"] == "cgpu"
    assert labels["cgpu-test-no-isolation-0"]["ack.node.gpu.schedule"] == "share"
    # 003_c28dd89f5a652d9c.txt: whole cards by nvidia.com/gpu land on an exclusive node.
    assert labels["tensorflow-mnist"]["ack.node.gpu.schedule"] == "default"


def test_a_pod_in_kube_system_is_left_untouched(cluster: Cluster) -> None:
    completed = cluster.apply(pod("system-helper", env={"NVIDIA_VISIBLE_DEVICES": "all"}), namespace="kube-system")
    assert completed.returncode == 0, completed.stderr
    try:
        stored = cluster.get("pod", "system-helper", namespace="kube-system")
        assert stored["spec"]["containers"][0]["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
        assert "nodeSelector" not in stored["spec"]
    finally:
        cluster.kubectl("delete", "pod", "system-helper", "-n", "kube-system", "--wait=false")


def test_a_server_side_dry_run_is_answered_and_stores_nothing(cluster: Cluster) -> None:
    ns = cluster.namespace()
    allowed = cluster.kubectl(
        "create",
        "-n",
        ns,
        "--dry-run=server",
        "-o",
        "json",
        "-f",
        "-",
        stdin=json.dumps(pod("dry", limits={"aliyun.com/gpu-mem": 2})),
    )
    assert allowed.returncode == 0, allowed.stderr
    assert json.loads(allowed.stdout)["spec"]["nodeSelector"] == {"ack.node.gpu.schedule": "cgpu"}
    denied = cluster.kubectl(
        "create", "-n", ns, "--dry-run=server", "-f", "-", stdin=json.dumps(pod("dry2", env={"NVIDIA_VISIBLE_DEVICES": "all"}))
    )
    assert denied.returncode != 0 and "GPU001" in denied.stderr
    assert cluster.pods(namespace=ns) == []


def test_with_the_webhook_down_pod_creates_fail_closed_but_kube_system_still_works(cluster: Cluster) -> None:
    ns = cluster.namespace()
    controlplane.stop(cluster.state, ["webhook"])
    try:
        refused = cluster.apply(pod("during-outage"), namespace=ns)
        assert refused.returncode != 0
        assert "failed calling webhook" in refused.stderr
        system = cluster.apply(pod("during-outage"), namespace="kube-system")
        assert system.returncode == 0, system.stderr
        cluster.kubectl("delete", "pod", "during-outage", "-n", "kube-system", "--wait=false")
    finally:
        install.start_webhook(cluster.state)
    eventually(lambda: cluster.apply(pod("after-outage"), namespace=ns).returncode == 0, what="pods admitted again")
