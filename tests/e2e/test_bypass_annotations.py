"""Device injection by pod annotation (GPU010) and the CUDA MPS pipes by hostPath (GPU003), through
the real apiserver with the deployed webhook configuration: device annotations are refused on
create, in a workload template and on a later annotate of a running pod, ordinary annotations pass
and ordinary annotation edits never reach the webhook. A pod that asks for a GPU mounts neither the
MPS pipe directory nor `/tmp` around it; a pod without GPUs keeps its `/tmp` and is kept off GPU
nodes (GPU103).
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from policies.trustzone import DEFAULT_ZONE
from tests.e2e.harness import Cluster, deployment, eventually

pytestmark = pytest.mark.e2e

DENIED = 'admission webhook "validate.gpu-admission.io" denied the request'


def pod(name: str, *, annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "registry.example/app:1"}
    if "volumes" in spec:
        container["volumeMounts"] = [{"name": v["name"], "mountPath": f"/mnt/{v['name']}"} for v in spec["volumes"]]
    metadata: dict[str, Any] = {"name": name, **({"annotations": annotations} if annotations else {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {"containers": [container], **spec}}


def create(cluster: Cluster, obj: dict[str, Any], *, namespace: str) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("create", "-n", namespace, "-f", "-", stdin=json.dumps(obj))


def refused_by(completed: subprocess.CompletedProcess[str], policy_id: str) -> bool:
    return completed.returncode != 0 and DENIED in completed.stderr and f"{policy_id}: " in completed.stderr


def reviews_of(cluster: Cluster, namespace: str, name: str) -> int:
    """How many pod UPDATE reviews of the pod the webhook has logged (one INFO line per review)."""
    log = (cluster.state.directory / "logs" / "webhook.log").read_text(errors="replace")
    return log.count(f" UPDATE Pod/{name} ns={namespace} ")


# --- CDI / NRI device annotations (GPU010) ----------------------------------------------------------


def test_a_cdi_annotation_on_create_is_refused_and_an_ordinary_one_is_admitted(cluster: Cluster) -> None:
    ns = cluster.namespace()

    refused = create(cluster, pod("all-cards", annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=all"}), namespace=ns)
    admitted = create(cluster, pod("plain", annotations={"team": "ml", "CDI.K8S.IO/gpu": "nvidia.com/gpu=all"}), namespace=ns)

    assert refused_by(refused, "GPU010"), refused.stderr
    assert (
        "annotation cdi.k8s.io/gpu asks the node's container runtime for devices (CDI or NRI device injection)" in refused.stderr
    )
    assert "ask for GPUs as resources (nvidia.com/gpu, aliyun.com/gpu-mem)" in refused.stderr
    assert cluster.kubectl("get", "pod", "all-cards", "-n", ns).returncode != 0
    assert admitted.returncode == 0, admitted.stderr


def test_the_toolkits_nri_annotation_in_a_deployment_template_is_refused(cluster: Cluster) -> None:
    ns = cluster.namespace()
    cdi = {"nvidia.cdi.k8s.io/container.main": "runtime.nvidia.com/gpu=all"}

    completed = create(cluster, deployment("nri-cards", pod("x")["spec"], app="n", annotations=cdi), namespace=ns)

    assert refused_by(completed, "GPU010"), completed.stderr
    assert "the pod template: annotation nvidia.cdi.k8s.io/container.main asks" in completed.stderr


def test_a_device_annotation_added_later_is_refused_and_ordinary_edits_are_never_sent(cluster: Cluster) -> None:
    ns, name = cluster.namespace(), "later"
    assert create(cluster, pod(name), namespace=ns).returncode == 0

    added = cluster.kubectl("annotate", "pod", name, "-n", ns, "nvidia.cdi.k8s.io/pod=nvidia.com/gpu=all")
    patched = cluster.kubectl(
        "patch",
        "pod",
        name,
        "-n",
        ns,
        "--type=merge",
        "-p",
        json.dumps({"metadata": {"annotations": {"cdi.k8s.io/x": "nvidia.com/gpu=0"}}}),
    )

    assert refused_by(added, "GPU010"), added.stderr
    assert "the update adds nvidia.cdi.k8s.io/pod, which asks the node's container runtime for devices" in added.stderr
    assert refused_by(patched, "GPU010"), patched.stderr
    assert "the update adds cdi.k8s.io/x" in patched.stderr
    stored = cluster.get("pod", name, namespace=ns)["metadata"].get("annotations", {})
    assert not any(key.startswith(("cdi.k8s.io", "nvidia.cdi.k8s.io")) for key in stored)

    eventually(lambda: reviews_of(cluster, ns, name) >= 2, what="the refused updates in the webhook's log", timeout=10)
    sent_before = reviews_of(cluster, ns, name)
    annotated = cluster.kubectl("annotate", "pod", name, "-n", ns, "note=checkpoint-9000", "example.com/cdi.k8s.io=x")
    labelled = cluster.kubectl("label", "pod", name, "-n", ns, "team=ml")
    assert annotated.returncode == 0, annotated.stderr
    assert labelled.returncode == 0, labelled.stderr
    assert cluster.get("pod", name, namespace=ns)["metadata"]["annotations"]["note"] == "checkpoint-9000"
    # The match condition kept both from the webhook: the apiserver never called it for them.
    assert reviews_of(cluster, ns, name) == sent_before


def test_crios_devices_annotation_with_a_card_is_refused_and_with_fuse_admitted(cluster: Cluster) -> None:
    ns = cluster.namespace()

    refused = create(
        cluster, pod("crio-card", annotations={"io.kubernetes.cri-o.Devices": "/dev/fuse,/dev/nvidia0"}), namespace=ns
    )
    admitted = create(cluster, pod("buildah", annotations={"io.kubernetes.cri-o.Devices": "/dev/fuse"}), namespace=ns)

    assert refused_by(refused, "GPU010"), refused.stderr
    assert "annotation io.kubernetes.cri-o.Devices asks CRI-O for the host device /dev/nvidia0" in refused.stderr
    assert admitted.returncode == 0, admitted.stderr


# --- the CUDA MPS pipes (GPU003) --------------------------------------------------------------------


def test_the_mps_pipe_directory_by_host_path_is_refused_in_a_gpu_pod_and_tmp_admitted_off_gpu_nodes(cluster: Cluster) -> None:
    ns = cluster.namespace()
    pipes = {"name": "mps", "hostPath": {"path": "/tmp/nvidia-mps", "type": "Directory"}}
    tmp = {"name": "scratch", "hostPath": {"path": "/tmp", "type": "Directory"}}
    client = pod("mps-client", volumes=[pipes])
    client["spec"]["containers"][0]["resources"] = {"limits": {"aliyun.com/gpu-mem": 1}}
    # /tmp holds the pipe directory: a GPU pod may not mount it either (no longer an allowed path).
    gpu_scratch = pod("gpu-scratch", volumes=[tmp])
    gpu_scratch["spec"]["containers"][0]["resources"] = {"limits": {"aliyun.com/gpu-mem": 1}}

    refused = create(cluster, client, namespace=ns)
    refused_tmp = create(cluster, gpu_scratch, namespace=ns)
    admitted = create(cluster, pod("scratch", volumes=[tmp]), namespace=ns)

    assert refused_by(refused, "GPU003"), refused.stderr
    assert (
        'volume "mps" mounts hostPath /tmp/nvidia-mps, which is not an allowed host path (lies in /tmp/nvidia-mps: '
        "the CUDA MPS control daemon's pipes"
    ) in refused.stderr
    assert "ask an admin to allow the path for the namespace (trustZone)" in refused.stderr
    assert refused_by(refused_tmp, "GPU003"), refused_tmp.stderr
    assert 'volume "scratch" mounts hostPath /tmp, which is not an allowed host path' in refused_tmp.stderr
    assert admitted.returncode == 0, admitted.stderr
    assert "Warning: GPU103: pods that use no GPU but have node power are kept off GPU nodes" in admitted.stderr
    stored = cluster.pod_once(
        "scratch", namespace=ns, condition=lambda found: bool(found["spec"].get("nodeName")), what="scratch scheduled"
    )
    assert stored["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchExpressions": [dict(e) for e in DEFAULT_ZONE.keep_off]}
    ]
    assert stored["spec"]["nodeName"] == "cpu-0"  # the only node without GPUs
    assert [p["metadata"]["name"] for p in cluster.pods(namespace=ns)] == ["scratch"]
