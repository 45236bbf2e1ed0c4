"""`helm install` into a bare local cluster, the seed workloads admitted and placed, then
`helm uninstall` leaves nothing of ours but the CRDs it was asked to keep.

The cluster's nodes are KWOK's: the chart's Deployments and DaemonSet are stored and scheduled but
run no containers. So, as the kustomize path does (webhook.cluster.install), our components run as
local processes: the extender (which kube-scheduler calls), the labelers, and the webhook, to which
the chart's own webhook configurations are pointed (clientConfig only; rules, matchConditions,
failure policy as the chart installed them). Everything else the chart installs is real: RBAC, the
node guard's ValidatingAdmissionPolicies, ConfigMaps, the namespace, the CRDs.
"""

from __future__ import annotations

import functools
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from policies import gpu
from tests import ecosystem
from tests.e2e.harness import Cluster, eventually
from tests.e2e.test_admission import pod, run_admitted, seed
from webhook.cluster import controlplane, install, nodes

pytestmark = pytest.mark.e2e

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "gpu-admission"
RELEASE = "gpu-admission"
PART_OF = "app.kubernetes.io/part-of=gpu-admission"
CLUSTER_KINDS = (
    "clusterroles",
    "clusterrolebindings",
    "mutatingwebhookconfigurations",
    "validatingwebhookconfigurations",
    "validatingadmissionpolicies",
    "validatingadmissionpolicybindings",
)


@pytest.fixture(scope="module")
def bare(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A local cluster with no gpu-admission objects: only the extender (before kube-scheduler,
    which calls it) and the labelers run, as local processes. Not even the extender's ledger
    namespace: the chart creates and owns it (Helm adopts no namespace it did not make)."""
    directory = tmp_path_factory.mktemp("helm-cluster")
    fake = nodes.load(None)
    state = controlplane.up(
        directory,
        bin_dir=bin_dir,
        fake_nodes=fake,
        before_scheduler=functools.partial(install.start_extender, create_ledger_namespace=False),
    )
    try:
        install.start_labelers(state, fake)
        yield Cluster(state)
    finally:
        install.tear_down(directory)


def helm(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ecosystem.tool("helm")), "--kubeconfig", str(cluster.state.kubeconfig), *args],
        capture_output=True,
        text=True,
        check=False,
    )


def _ours(cluster: Cluster, kind: str) -> list[str]:
    completed = cluster.kubectl("get", kind, "-l", PART_OF, "-o", "name")
    assert completed.returncode == 0, completed.stderr
    return completed.stdout.split()


def _point_at_local_webhook(cluster: Cluster) -> None:
    """The chart's webhook configurations, with clientConfig pointed at the local webhook."""
    install.start_webhook(cluster.state)
    documents = [
        json.loads(cluster.kubectl("get", kind, "gpu-admission", "-o", "json").stdout)
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")
    ]
    ca_bundle = (cluster.state.directory / "webhook" / "ca.crt").read_bytes()
    items = install.local_registrations(
        documents, base_url=f"https://127.0.0.1:{cluster.state.ports['webhook']}", ca_bundle=ca_bundle
    )
    completed = cluster.kubectl("replace", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    assert completed.returncode == 0, completed.stderr

    def refuses() -> bool:
        probe = pod("helm-probe", env={"NVIDIA_VISIBLE_DEVICES": "all"})
        attempt = cluster.kubectl("create", "-n", "default", "--dry-run=server", "-f", "-", stdin=json.dumps(probe))
        return attempt.returncode != 0 and "GPU001" in attempt.stderr

    eventually(refuses, what="the apiserver to call the webhook through the chart's configurations", timeout=60)


def test_helm_install_admits_and_places_the_seeds_and_uninstall_leaves_nothing(bare: Cluster) -> None:
    cluster = bare
    installed = helm(
        cluster, "install", RELEASE, str(CHART), "--namespace", "default", "--set", "crds.install=true", "--timeout", "2m"
    )
    assert installed.returncode == 0, installed.stderr
    # What the chart installed is real in the apiserver.
    assert _ours(cluster, "validatingadmissionpolicies") == [
        "validatingadmissionpolicy.admissionregistration.k8s.io/gpu-admission-extender-node-guard",
        "validatingadmissionpolicy.admissionregistration.k8s.io/gpu-admission-labeler-node-guard",
    ]
    assert cluster.kubectl("get", "crd", "policyreports.wgpolicyk8s.io").returncode == 0
    assert (
        cluster.kubectl(
            "auth", "can-i", "patch", "nodes", "--as=system:serviceaccount:gpu-admission:gpu-admission-extender"
        ).stdout.strip()
        == "yes"
    )
    assert (
        cluster.kubectl(
            "auth", "can-i", "delete", "pods", "--as=system:serviceaccount:gpu-admission:gpu-admission-extender"
        ).stdout.strip()
        == "no"
    )

    _point_at_local_webhook(cluster)
    ns = cluster.namespace()
    refused = cluster.apply(pod("leaky", env={"NVIDIA_VISIBLE_DEVICES": "all"}), namespace=ns)
    assert refused.returncode != 0 and "GPU001" in refused.stderr
    workloads: list[dict[str, Any]] = [
        seed("Deployment", "tf-notebook"),
        seed("Pod", "not-in-gpu-node"),
        seed("StatefulSet", "cgpu-test"),
        seed("Pod", "tensorflow-mnist"),
    ]
    running, where = run_admitted(cluster, workloads, namespace=ns, timeout=120)
    cgpu = next(labels for name, labels in where.items() if name.startswith("cgpu-test-0"))
    assert cgpu["ack.node.gpu.schedule"] == "cgpu"  # the webhook's nodeSelector and the extender's card
    notebook = next(labels for name, labels in where.items() if name.startswith("tf-notebook"))
    assert notebook["aliyun.accelerator/nvidia_name"] == "Tesla-M40"
    placed = next(p for p in running if p["metadata"]["name"].startswith("cgpu-test-0"))
    annotations = placed["metadata"].get("annotations", {})
    assert gpu.ALLOCATION_ANNOTATION in annotations and gpu.GPUSHARE_MEM_IDX_ANNOTATION in annotations  # bound by the extender

    uninstalled = helm(cluster, "uninstall", RELEASE, "--namespace", "default", "--wait", "--timeout", "2m")
    assert uninstalled.returncode == 0, uninstalled.stderr
    for kind in CLUSTER_KINDS:
        assert _ours(cluster, kind) == [], kind
    eventually(
        lambda: cluster.kubectl("get", "namespace", "gpu-admission").returncode != 0,
        what="the namespace gpu-admission to go",
        timeout=180,
    )
    assert helm(cluster, "list", "--all-namespaces", "-q").stdout.strip() == ""
    # Kept, as asked: other engines' reports live in them.
    kept = cluster.kubectl("get", "crd", "policyreports.wgpolicyk8s.io", "clusterpolicyreports.wgpolicyk8s.io", "-o", "name")
    assert kept.returncode == 0 and len(kept.stdout.split()) == 2
