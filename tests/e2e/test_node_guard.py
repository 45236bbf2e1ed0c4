"""deploy/node-guard.yaml inside the real kube-apiserver: what the labeler's and the extender's tokens
may still change on Nodes.

The cluster install applies node-guard.yaml from deploy/ (its labelers and extender use the admin
kubeconfig, so the policies never meet them). Here the ServiceAccounts and their RBAC come from
deploy/ too, and every request is made with a real token of theirs: for the labeler, a TokenRequest
bound to a pod that sits on node A (the token then carries node A as its node claim), exactly what
the kubelet mounts into the DaemonSet's pod; for contrast, a token bound to nothing.
"""

from __future__ import annotations

import base64
import functools
import json
import ssl
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies import gpu
from policies.gpu import allocation as allocation_  # `allocation` names a pod's allocation here
from policies.gpu import budgets
from tests.e2e.harness import Cluster, eventually
from webhook.cluster import nodes
from webhook.extender import gates

pytestmark = pytest.mark.e2e

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NAMESPACE = "gpu-admission"
LABELER = "gpu-admission-labeler"
EXTENDER = "gpu-admission-extender"
GUARDS = ("gpu-admission-labeler-node-guard", "gpu-admission-extender-node-guard")
REFUSED = "gpu-admission node guard: "


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


@pytest.fixture(scope="module")
def accounts(cluster: Cluster) -> None:
    """The two ServiceAccounts with their RBAC from deploy/ (not the workloads: KWOK would "run" them)."""
    wanted = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
    items = [d for name in ("namespace.yaml", "labeler.yaml", "extender.yaml") for d in documents(name) if d["kind"] in wanted]
    applied = cluster.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    assert applied.returncode == 0, applied.stderr

    def can(account: str, *args: str) -> bool:
        as_user = f"--as=system:serviceaccount:{NAMESPACE}:{account}"
        return cluster.kubectl("auth", "can-i", *args, as_user).stdout.strip() == "yes"

    eventually(
        lambda: can(LABELER, "patch", "nodes/status") and can(EXTENDER, "create", "pods", "--subresource=binding", "-A"),
        what="the RBAC bindings",
    )


@pytest.fixture(scope="module")
def two_nodes(cluster: Cluster) -> Iterator[tuple[str, str]]:
    """Two fresh KWOK nodes in cgpu mode, A and B."""
    suffix = uuid.uuid4().hex[:6]
    names = (f"guard-a-{suffix}", f"guard-b-{suffix}")
    manifests: list[Mapping[str, Any]] = [
        nodes.FakeNode(
            name=name, labels={gpu.SCHEDULE_LABEL: gpu.Mode.CGPU, "topology.kubernetes.io/zone": "z1"}, capacity={}
        ).manifest()
        for name in names
    ]
    completed = cluster.apply(manifests, namespace="default")
    assert completed.returncode == 0, completed.stderr
    try:
        yield names
    finally:
        cluster.kubectl("delete", "node", *names, "--wait=false")


@pytest.fixture(scope="module")
def labeler_pod(cluster: Cluster, accounts: None, two_nodes: tuple[str, str]) -> Iterator[str]:
    """A pod of the labeler's ServiceAccount bound to node A (restricted, as the namespace enforces)."""
    name = f"labeler-guard-{uuid.uuid4().hex[:6]}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "serviceAccountName": LABELER,
            "nodeName": two_nodes[0],
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
    completed = cluster.apply(pod, namespace=NAMESPACE)
    assert completed.returncode == 0, completed.stderr
    try:
        yield name
    finally:
        cluster.kubectl("delete", "pod", name, "-n", NAMESPACE, "--wait=false")


def token(cluster: Cluster, account: str, *bound: str) -> str:
    completed = cluster.kubectl("create", "token", account, "-n", NAMESPACE, "--duration=10m", *bound)
    assert completed.returncode == 0, completed.stderr
    return completed.stdout.strip()


def claims(jwt: str) -> dict[str, Any]:
    payload = jwt.split(".")[1]
    decoded: dict[str, Any] = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return decoded


class As:
    """Requests with nothing but a bearer token, straight to the apiserver (kubectl would add the
    admin kubeconfig's client certificate, which the apiserver authenticates first, and `kubectl
    patch --subresource=status` first GETs nodes/status, which the labeler may not)."""

    def __init__(self, cluster: Cluster, jwt: str) -> None:
        self.server = cluster.state.server
        self.jwt = jwt
        self.context = ssl.create_default_context(cafile=str(cluster.state.directory / "pki" / "ca.crt"))

    def call(
        self, method: str, path: str, body: Mapping[str, Any] | list[dict[str, Any]], *, content_type: str = "application/json"
    ) -> tuple[int, str]:
        """The HTTP status and the apiserver's message (a Status' message, or the object's kind)."""
        request = urllib.request.Request(
            self.server + path,
            method=method,
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.jwt}", "Content-Type": content_type, "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, context=self.context, timeout=30) as response:
                return response.status, json.loads(response.read()).get("kind", "")
        except urllib.error.HTTPError as error:
            answer = json.loads(error.read() or b"{}")
            return error.code, str(answer.get("message", ""))

    def patch(self, node: str, body: Mapping[str, Any], *, status: bool = False) -> tuple[int, str]:
        path = f"/api/v1/nodes/{node}" + ("/status" if status else "")
        return self.call("PATCH", path, body, content_type="application/merge-patch+json")


def node(cluster: Cluster, name: str) -> dict[str, Any]:
    return cluster.get("node", name, namespace="default")


def labels_patch(values: dict[str, str | None]) -> dict[str, Any]:
    return {"metadata": {"labels": values}}


def test_the_install_applied_the_guard_from_deploy_and_the_apiserver_type_checks_it_clean(cluster: Cluster) -> None:
    shipped = {d["metadata"]["name"]: d for d in documents("node-guard.yaml") if d["kind"] == "ValidatingAdmissionPolicy"}
    assert set(shipped) == set(GUARDS)

    def checked(name: str) -> bool:
        found = cluster.get("validatingadmissionpolicy", name, namespace="default")
        return bool(found.get("status", {}).get("observedGeneration") == found["metadata"]["generation"])

    for name in GUARDS:
        eventually(functools.partial(checked, name), what=f"the apiserver to type-check {name}")
        found = cluster.get("validatingadmissionpolicy", name, namespace="default")
        assert found["spec"]["validations"] == shipped[name]["spec"]["validations"]
        assert found["spec"]["variables"] == shipped[name]["spec"]["variables"]
        assert found["status"].get("typeChecking", {}).get("expressionWarnings") in (None, []), found["status"]


def test_a_pod_bound_token_names_the_pods_node(cluster: Cluster, labeler_pod: str, two_nodes: tuple[str, str]) -> None:
    jwt = token(cluster, LABELER, "--bound-object-kind=Pod", f"--bound-object-name={labeler_pod}")
    assert claims(jwt)["kubernetes.io"]["node"]["name"] == two_nodes[0]
    assert "node" not in claims(token(cluster, LABELER))["kubernetes.io"]


def test_the_labelers_pod_token_may_write_its_own_nodes_gpu_labels_and_capacity_and_nothing_else(
    cluster: Cluster, labeler_pod: str, two_nodes: tuple[str, str]
) -> None:
    node_a, node_b = two_nodes
    labeler = As(cluster, token(cluster, LABELER, "--bound-object-kind=Pod", f"--bound-object-name={labeler_pod}"))

    # Allowed: its own labels and annotations on node A, added and removed again, and GPU capacity.
    changes: list[dict[str, str | None]] = [
        {gpu.CARD_MEMORY_MIB_LABEL: "15360", gpu.CARD_COUNT_LABEL: "2"},
        {gpu.CARD_MEMORY_MIB_LABEL: None},
    ]
    for change in changes:
        code, output = labeler.patch(node_a, labels_patch(change))
        assert code == 200, output
    code, output = labeler.patch(node_a, {"metadata": {"annotations": {gpu.INVENTORY_ANNOTATION: "[]"}}})
    assert code == 200, output
    code, output = labeler.patch(
        node_a,
        {"status": {"capacity": {str(gpu.Resource.GPU_MEM): "30"}, "allocatable": {str(gpu.Resource.GPU_MEM): "30"}}},
        status=True,
    )
    assert code == 200, output
    found = node(cluster, node_a)
    assert (
        found["metadata"]["labels"][gpu.CARD_COUNT_LABEL] == "2" and gpu.CARD_MEMORY_MIB_LABEL not in found["metadata"]["labels"]
    )
    assert found["status"]["capacity"][str(gpu.Resource.GPU_MEM)] == "30"

    # Refused: node B; other labels, the mode, taints and cpu capacity on node A; the extender's ledger.
    refusals = [
        (
            labeler.patch(node_b, labels_patch({gpu.CARD_COUNT_LABEL: "8"})),
            f"the labeler running on node {node_a} may not change node {node_b}",
        ),
        (labeler.patch(node_a, labels_patch({"topology.kubernetes.io/zone": "z2"})), "not topology.kubernetes.io/zone"),
        (labeler.patch(node_a, labels_patch({gpu.SCHEDULE_LABEL: gpu.Mode.SHARE})), f"not {gpu.SCHEDULE_LABEL}"),
        (labeler.patch(node_a, {"spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}}), "may not change the Node spec"),
        (
            labeler.patch(node_a, {"metadata": {"annotations": {gpu.RESERVATIONS_ANNOTATION: "{}"}}}),
            f"not {gpu.RESERVATIONS_ANNOTATION}",
        ),
        (labeler.patch(node_a, {"status": {"capacity": {"cpu": "999"}}}, status=True), "the GPU capacity"),
    ]
    for (code, output), expected in refusals:
        assert code == 403 and REFUSED in output and expected in output, output
    found = node(cluster, node_a)
    assert (
        found["metadata"]["labels"]["topology.kubernetes.io/zone"] == "z1"
        and found["metadata"]["labels"][gpu.SCHEDULE_LABEL] == "cgpu"
    )
    assert found["status"]["capacity"]["cpu"] != "999" and "taints" not in found["spec"]
    assert gpu.CARD_COUNT_LABEL not in node(cluster, node_b)["metadata"].get("labels", {})


def test_a_token_without_a_node_claim_is_refused_everything(cluster: Cluster, accounts: None, two_nodes: tuple[str, str]) -> None:
    plain = As(cluster, token(cluster, LABELER))
    for code, output in (
        plain.patch(two_nodes[0], labels_patch({gpu.CARD_COUNT_LABEL: "4"})),
        plain.patch(two_nodes[0], {"status": {"capacity": {str(gpu.Resource.GPU_MEM): "60"}}}, status=True),
    ):
        assert code == 403 and "carries no node claim" in output, output
    assert plain.call("GET", f"/api/v1/nodes/{two_nodes[0]}", {}) == (200, "Node"), "reading is RBAC's, still allowed"


def test_the_extender_may_stamp_a_node_and_change_nothing_else_not_even_the_old_ledger(
    cluster: Cluster, accounts: None, two_nodes: tuple[str, str]
) -> None:
    """The ledger is a Lease per node now. deploy's RBAC lets the extender patch Nodes for its
    ledger-freed stamp (the Node update that makes kube-scheduler retry turned-away pods), and the
    guard narrows that to the one key: not the old ledger annotation (an old replica beside a new
    one must not commit there), not labels, other annotations, spec or status."""
    extender = As(cluster, token(cluster, EXTENDER))
    code, output = extender.patch(
        two_nodes[1], {"metadata": {"annotations": {gpu.LEDGER_FREED_ANNOTATION: "2026-11-26T18:00:00.000Z"}}}
    )
    assert code == 200, output
    assert node(cluster, two_nodes[1])["metadata"]["annotations"][gpu.LEDGER_FREED_ANNOTATION] == "2026-11-26T18:00:00.000Z"
    current = node(cluster, two_nodes[1])["metadata"]["resourceVersion"]
    old_commit = {"metadata": {"resourceVersion": current, "annotations": {gpu.RESERVATIONS_ANNOTATION: "{}"}}}
    for body, expected in (
        (old_commit, f"not {gpu.RESERVATIONS_ANNOTATION}"),
        (labels_patch({gpu.CARD_COUNT_LABEL: "8"}), "may not change Node labels"),
        ({"metadata": {"annotations": {gpu.INVENTORY_ANNOTATION: "[]"}}}, f"not {gpu.INVENTORY_ANNOTATION}"),
        ({"spec": {"unschedulable": True}}, "spec or status"),
    ):
        code, output = extender.patch(two_nodes[1], body)
        assert code == 403 and REFUSED in output and expected in output, output
    assert gpu.RESERVATIONS_ANNOTATION not in node(cluster, two_nodes[1])["metadata"].get("annotations", {})


def test_the_extenders_binding_carries_only_the_allocation_annotations(
    cluster: Cluster, accounts: None, two_nodes: tuple[str, str]
) -> None:
    namespace = cluster.namespace()
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "waits"},
        "spec": {"schedulerName": "nobody-schedules-this", "containers": [{"name": "app", "image": "app"}]},
    }
    created = cluster.apply(pod, namespace=namespace)
    assert created.returncode == 0, created.stderr
    uid = cluster.get("pod", "waits", namespace=namespace)["metadata"]["uid"]
    allocation = allocation_.Allocation(
        uid=uid, namespace=namespace, name="waits", node=two_nodes[1], cards=(0,), memory_gib=1, assumed_at=1.0
    )
    written = allocation_.bind_annotations(allocation, card_memory_gib=15)
    extender = As(cluster, token(cluster, EXTENDER))

    def bind(annotations: dict[str, str]) -> tuple[int, str]:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": "waits", "namespace": namespace, "uid": uid, "annotations": annotations},
            "target": {"apiVersion": "v1", "kind": "Node", "name": two_nodes[1]},
        }
        return extender.call("POST", f"/api/v1/namespaces/{namespace}/pods/waits/binding", body)

    code, output = bind({**written, gpu.OWN_PREFIX + "gpu-model": "A100"})
    assert code == 403 and REFUSED in output and f"not {gpu.OWN_PREFIX}gpu-model" in output, output
    assert "nodeName" not in cluster.get("pod", "waits", namespace=namespace)["spec"]
    code, output = bind(written)
    assert code == 201, output
    assert cluster.get("pod", "waits", namespace=namespace)["spec"]["nodeName"] == two_nodes[1]
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")


def test_the_extender_lifts_the_budget_gate_and_nothing_else_and_nobody_else_does(cluster: Cluster, accounts: None) -> None:
    """The extender's token may remove gpu-admission.io/budget by its test-guarded JSON patch (the node
    guard and GPU013 let it through); the same patch changing the image is refused by the guard, and
    anyone else's removal (the admin's here) by GPU013 through the validating webhook."""
    namespace = cluster.namespace()
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gated"},
        "spec": {
            "schedulingGates": [{"name": "example.com/other"}, {"name": budgets.GATE}],
            "containers": [{"name": "app", "image": "app"}],
        },
    }
    created = cluster.apply(pod, namespace=namespace)
    assert created.returncode == 0, created.stderr
    uid = cluster.get("pod", "gated", namespace=namespace)["metadata"]["uid"]
    extender = As(cluster, token(cluster, EXTENDER))
    path = f"/api/v1/namespaces/{namespace}/pods/gated"

    def patch(operations: list[dict[str, Any]]) -> tuple[int, str]:
        return extender.call("PATCH", path, operations, content_type="application/json-patch+json")

    lift = gates.lift_patch(uid=uid, index=1)
    code, output = patch([*lift, {"op": "replace", "path": "/spec/containers/0/image", "value": "other"}])
    assert code == 403 and REFUSED in output and "spec fields containers" in output, output
    admin = cluster.kubectl("patch", "pod", "gated", "-n", namespace, "--type=json", "-p", json.dumps(lift[1:]))
    assert admin.returncode != 0 and "GPU013" in admin.stderr, admin.stderr
    assert cluster.get("pod", "gated", namespace=namespace)["spec"]["schedulingGates"][1] == {"name": budgets.GATE}
    assert patch(gates.lift_patch(uid="another-uid", index=1))[0] == 422  # the test guards the pod's identity
    code, output = patch(lift)
    assert code == 200, output
    assert cluster.get("pod", "gated", namespace=namespace)["spec"]["schedulingGates"] == [{"name": "example.com/other"}]
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")


def test_the_admin_and_other_accounts_are_not_matched(cluster: Cluster, two_nodes: tuple[str, str]) -> None:
    completed = cluster.kubectl("label", "node", two_nodes[1], "topology.kubernetes.io/zone=z3", "--overwrite")
    assert completed.returncode == 0, completed.stderr
    assert node(cluster, two_nodes[1])["metadata"]["labels"]["topology.kubernetes.io/zone"] == "z3"
