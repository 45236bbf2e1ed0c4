"""Scheduling around the extender, through the real apiserver: nodeName, forged allocation
annotations on create and on a later UPDATE, schedulers without the extender (GPU008), and the
audit's GPU210 for a pod that got a node without an allocation.

The module restarts the session webhook with one namespace override (GPU008 off in namespaces
labelled `gpu-admission.io/e2e-hand-placed=true`, the documented way for an admin to place pods
by hand) and restores the defaults afterwards. The pod placed by hand there is what the audit must
report; every other namespace keeps GPU008 at enforce.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import Cluster, deployment, eventually, webhook_settings
from webhook.cluster import nodes

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
HAND_PLACED = "gpu-admission.io/e2e-hand-placed"
POOL = "gpu-admission.io/e2e-pool"
TAINT = "gpu-admission.io/e2e-bypass"
CARD_MIB = 15360
SETTINGS = {
    "namespaceOverrides": [
        {
            "name": "hand-placed",
            "namespaceSelector": {"matchLabels": {HAND_PLACED: "true"}},
            "policies": {"GPU008": {"action": "off"}},
        }
    ]
}


@pytest.fixture(scope="module")
def bypass_cluster(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with webhook_settings(cluster, SETTINGS, directory=tmp_path_factory.mktemp("bypass")):
        yield cluster


@pytest.fixture(scope="module")
def gpu_node(bypass_cluster: Cluster) -> Iterator[str]:
    """A KWOK cgpu node with 2 x 15 GiB cards (the labeler's inventory), tainted for this module only."""
    name = f"bypass-{uuid.uuid4().hex[:6]}"
    inventory = [{"index": i, "uuid": f"GPU-{name}-{i}", "name": "Tesla-T4", "memoryMiB": CARD_MIB} for i in range(2)]
    manifest = nodes.FakeNode(
        name=name,
        labels={"ack.node.gpu.schedule": "cgpu", "ack.node.gpu.placement": "binpack", POOL: name},
        capacity={"aliyun.com/gpu-mem": "30", "aliyun.com/gpu-count": "2"},
        annotations={"gpu-admission.io/gpu-inventory": json.dumps(inventory)},
    ).manifest()
    manifest["spec"]["taints"] = [{"key": TAINT, "value": name, "effect": "NoSchedule"}]
    completed = bypass_cluster.kubectl("create", "-f", "-", stdin=json.dumps(manifest))
    assert completed.returncode == 0, completed.stderr

    def ready() -> bool:
        node = bypass_cluster.get("node", name, namespace="default")
        return any(c["type"] == "Ready" and c["status"] == "True" for c in node.get("status", {}).get("conditions", []))

    eventually(ready, what=f"node {name} Ready")
    yield name
    bypass_cluster.kubectl("delete", "node", name, "--wait=false")


def pod(name: str, *, mem: int | None = None, annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "registry.example/trainer:1"}
    if mem is not None:
        container["resources"] = {"limits": {"aliyun.com/gpu-mem": str(mem)}}
    metadata: dict[str, Any] = {"name": name, **({"annotations": annotations} if annotations else {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {"containers": [container], **spec}}


def on_pool(node: str) -> dict[str, Any]:
    """Spec fields that let the scheduler (with the extender) put a pod on this module's node only."""
    return {"nodeSelector": {POOL: node}, "tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}]}


def create(cluster: Cluster, obj: dict[str, Any], *, namespace: str) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("create", "-n", namespace, "-f", "-", stdin=json.dumps(obj))


def refused_by_gpu008(completed: subprocess.CompletedProcess[str]) -> bool:
    return completed.returncode != 0 and "admission webhook" in completed.stderr and "GPU008: " in completed.stderr


@pytest.fixture(scope="module")
def placed(bypass_cluster: Cluster, gpu_node: str) -> tuple[str, str]:
    """A gpu-mem pod the default scheduler placed through the extender: (namespace, name), Running."""
    ns = bypass_cluster.namespace()
    completed = create(bypass_cluster, pod("placed", mem=4, **on_pool(gpu_node)), namespace=ns)
    assert completed.returncode == 0, completed.stderr
    bypass_cluster.running_pods(namespace=ns, count=1, timeout=120)
    return ns, "placed"


def annotations_of(cluster: Cluster, namespace: str, name: str) -> dict[str, str]:
    found: dict[str, str] = cluster.get("pod", name, namespace=namespace)["metadata"].get("annotations", {})
    return found


# --- create -------------------------------------------------------------------------------------


def test_a_gpu_mem_pod_with_node_name_is_refused(bypass_cluster: Cluster, gpu_node: str) -> None:
    ns = bypass_cluster.namespace()
    completed = create(bypass_cluster, pod("pinned", mem=25, nodeName=gpu_node), namespace=ns)
    assert refused_by_gpu008(completed), completed.stderr
    assert f"spec.nodeName is '{gpu_node}' while container \"main\" asks for aliyun.com/gpu-mem" in completed.stderr
    assert bypass_cluster.kubectl("get", "pod", "pinned", "-n", ns).returncode != 0


def test_a_cpu_pod_with_node_name_is_admitted(bypass_cluster: Cluster, gpu_node: str) -> None:
    ns = bypass_cluster.namespace()
    completed = create(bypass_cluster, pod("cpu-pinned", nodeName=gpu_node), namespace=ns)
    assert completed.returncode == 0, completed.stderr
    assert bypass_cluster.get("pod", "cpu-pinned", namespace=ns)["spec"]["nodeName"] == gpu_node


@pytest.mark.parametrize(
    ("mem", "annotations"),
    [
        (4, {"ALIYUN_COM_GPU_MEM_IDX": "1", "ALIYUN_COM_GPU_MEM_POD": "1"}),
        (None, {"gpu-admission.io/allocation": '{"node":"x","cards":[0],"memGiB":15}'}),
    ],
    ids=["gpushare-keys-on-a-gpu-pod", "our-allocation-on-a-cpu-pod"],
)
def test_forged_allocation_annotations_on_create_are_refused(
    bypass_cluster: Cluster, mem: int | None, annotations: dict[str, str]
) -> None:
    ns = bypass_cluster.namespace()
    completed = create(bypass_cluster, pod("forged", mem=mem, annotations=annotations), namespace=ns)
    assert refused_by_gpu008(completed), completed.stderr
    assert "is set by the pod; only the scheduler extender writes the allocation annotations" in completed.stderr


def test_a_scheduler_that_does_not_call_the_extender_is_refused_for_gpu_pods_only(bypass_cluster: Cluster) -> None:
    ns = bypass_cluster.namespace()
    refused = create(bypass_cluster, pod("elsewhere", mem=2, schedulerName="tenant-scheduler"), namespace=ns)
    assert refused_by_gpu008(refused), refused.stderr
    assert "spec.schedulerName is 'tenant-scheduler'" in refused.stderr
    admitted = create(bypass_cluster, pod("cpu-elsewhere", schedulerName="tenant-scheduler"), namespace=ns)
    assert admitted.returncode == 0, admitted.stderr


def test_a_deployment_template_with_node_name_is_refused_when_applied(bypass_cluster: Cluster, gpu_node: str) -> None:
    ns = bypass_cluster.namespace()
    template = pod("x", mem=2, nodeName=gpu_node)
    completed = create(bypass_cluster, deployment("pinned", template["spec"], app="p"), namespace=ns)
    assert refused_by_gpu008(completed), completed.stderr
    assert "the pod template: spec.nodeName" in completed.stderr


# --- the extender's own writes, and UPDATEs of a running pod ---------------------------------------


def test_the_extender_still_places_and_binds_a_gpu_mem_pod(
    bypass_cluster: Cluster, gpu_node: str, placed: tuple[str, str]
) -> None:
    # The Binding carries the annotations; with the pod UPDATE rule registered it still goes through.
    ns, name = placed
    found = bypass_cluster.get("pod", name, namespace=ns)
    assert found["spec"]["nodeName"] == gpu_node
    allocation = json.loads(found["metadata"]["annotations"]["gpu-admission.io/allocation"])
    assert (allocation["node"], allocation["memGiB"]) == (gpu_node, 4)
    assert found["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_ASSIGNED"] == "false"


@pytest.mark.parametrize(
    "command",
    [
        ("annotate", "--overwrite", "ALIYUN_COM_GPU_MEM_IDX=1"),
        ("annotate", "gpu-admission.io/allocation-"),
        ("annotate", "ALIYUN_COM_GPU_MEM_POD=1", "--overwrite"),
        ("patch", "--type=merge", "-p", json.dumps({"metadata": {"annotations": {"ALIYUN_COM_GPU_MEM_DEV": "99"}}})),
        ("patch", "--type=json", "-p", json.dumps([{"op": "remove", "path": "/metadata/annotations/ALIYUN_COM_GPU_MEM_IDX"}])),
    ],
    ids=["move-card", "drop-allocation", "shrink", "merge-patch", "json-patch-remove"],
)
def test_changing_a_running_pods_allocation_is_refused(
    bypass_cluster: Cluster, placed: tuple[str, str], command: tuple[str, ...]
) -> None:
    ns, name = placed
    before = annotations_of(bypass_cluster, ns, name)
    verb, *rest = command
    completed = bypass_cluster.kubectl(verb, "pod", name, "-n", ns, *rest)
    assert refused_by_gpu008(completed), completed.stderr
    assert "a running pod's allocation annotations are written only by the scheduler extender's Binding" in completed.stderr
    after = annotations_of(bypass_cluster, ns, name)
    assert {k: after.get(k) for k in before} == before


def test_a_forged_allocation_added_later_to_a_cpu_pod_is_refused(bypass_cluster: Cluster) -> None:
    ns = bypass_cluster.namespace()
    assert create(bypass_cluster, pod("plain"), namespace=ns).returncode == 0
    completed = bypass_cluster.kubectl("annotate", "pod", "plain", "-n", ns, 'gpu-admission.io/allocation={"cards":[0]}')
    assert refused_by_gpu008(completed), completed.stderr
    assert "the update adds gpu-admission.io/allocation" in completed.stderr


def reviews_of(cluster: Cluster, namespace: str, name: str) -> int:
    """How many pod UPDATE reviews of the pod the webhook has logged (one INFO line per review)."""
    log = (cluster.state.directory / "logs" / "webhook.log").read_text(errors="replace")
    return log.count(f" UPDATE Pod/{name} ns={namespace} ")


def test_ordinary_updates_of_the_running_gpu_pod_are_allowed_and_never_sent(
    bypass_cluster: Cluster, placed: tuple[str, str]
) -> None:
    ns, name = placed
    forged = bypass_cluster.kubectl("annotate", "pod", name, "-n", ns, "ALIYUN_COM_GPU_MEM_IDX=7", "--overwrite")
    assert refused_by_gpu008(forged), forged.stderr
    eventually(lambda: reviews_of(bypass_cluster, ns, name) > 0, what="the refused update in the webhook's log", timeout=10)
    sent_before = reviews_of(bypass_cluster, ns, name)

    labelled = bypass_cluster.kubectl("label", "pod", name, "-n", ns, "team=ml", "--overwrite")
    assert labelled.returncode == 0, labelled.stderr
    annotated = bypass_cluster.kubectl("annotate", "pod", name, "-n", ns, "note=checkpoint-9000", "--overwrite")
    assert annotated.returncode == 0, annotated.stderr

    assert bypass_cluster.get("pod", name, namespace=ns)["metadata"]["labels"]["team"] == "ml"
    # The match condition kept both from the webhook: the apiserver never called it for them.
    assert reviews_of(bypass_cluster, ns, name) == sent_before


def test_the_device_plugins_assignment_is_allowed(bypass_cluster: Cluster, gpu_node: str) -> None:
    # What gpushare-device-plugin patches once the kubelet allocated the card (a pod of its own:
    # the flag only goes one way).
    ns, name = bypass_cluster.namespace(), "assigned"
    created = create(bypass_cluster, pod(name, mem=2, **on_pool(gpu_node)), namespace=ns)
    assert created.returncode == 0, created.stderr
    bypass_cluster.running_pods(namespace=ns, count=1, timeout=120)
    assert annotations_of(bypass_cluster, ns, name)["ALIYUN_COM_GPU_MEM_ASSIGNED"] == "false"
    patch = {
        "metadata": {
            "annotations": {"ALIYUN_COM_GPU_MEM_ASSIGNED": "true", "ALIYUN_COM_GPU_MEM_ASSUME_TIME": str(time.time_ns())}
        }
    }
    completed = bypass_cluster.kubectl("patch", "pod", name, "-n", ns, "--type=strategic", "-p", json.dumps(patch))
    assert completed.returncode == 0, completed.stderr
    assert annotations_of(bypass_cluster, ns, name)["ALIYUN_COM_GPU_MEM_ASSIGNED"] == "true"
    back = bypass_cluster.kubectl("annotate", "pod", name, "-n", ns, "ALIYUN_COM_GPU_MEM_ASSIGNED=false", "--overwrite")
    assert refused_by_gpu008(back), back.stderr


# --- the audit ----------------------------------------------------------------------------------


def audit(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webhook.audit.cli", "--kubeconfig", str(cluster.state.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=REPO,
    )


def test_the_audit_reports_a_pod_placed_by_hand_without_allocation(
    bypass_cluster: Cluster, gpu_node: str, placed: tuple[str, str]
) -> None:
    # An admin's namespace with GPU008 off: a 25 GiB pod pinned to a node of 2 x 15 GiB cards is
    # admitted and runs with no card allocation; the node-level sum (25 <= 30) sees nothing wrong.
    ns = f"e2e-hand-{uuid.uuid4().hex[:6]}"
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {HAND_PLACED: "true"}}}
    assert bypass_cluster.kubectl("create", "-f", "-", stdin=json.dumps(body)).returncode == 0
    eventually(
        lambda: bypass_cluster.kubectl("get", "serviceaccount", "default", "-n", ns).returncode == 0,
        what=f"ServiceAccount in {ns}",
    )
    completed = create(bypass_cluster, pod("by-hand", mem=25, nodeName=gpu_node), namespace=ns)
    assert completed.returncode == 0, completed.stderr
    bypass_cluster.running_pods(namespace=ns, count=1, timeout=120)

    results: list[dict[str, Any]] = []
    for namespace in (ns, placed[0]):
        done = audit(bypass_cluster, "-n", namespace, "-o", "json", "--all-results")
        assert done.returncode in (0, 1), done.stderr
        results += [r for item in json.loads(done.stdout)["items"] for r in item.get("results", [])]
    verdicts = {r["resources"][0]["name"]: (r["result"], r["properties"]["action"]) for r in results if r["policy"] == "GPU210"}
    assert verdicts == {"by-hand": ("fail", "enforce"), "placed": ("pass", "enforce")}
    [message] = [r["message"] for r in results if r["policy"] == "GPU210" and r["result"] == "fail"]
    assert (
        f"it runs on node {gpu_node} asking for 25 GiB (aliyun.com/gpu-mem) on one card but holds no card allocation" in message
    )
    assert not [r for r in results if r["policy"] == "GPU008"]
