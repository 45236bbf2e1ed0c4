"""deploy/components/usage-limits inside the real kube-apiserver: the labeler's token may evict the
pods of its own node and no other.

The component's RBAC (create on pods/eviction for the labeler) and its webhook entry
(validate-labeler-evictions.gpu-admission.io, matched on the labeler's ServiceAccount) are applied
as they are in deploy/, the entry pointed at the session cluster's webhook; the evictions are made
with real TokenRequest tokens of the labeler's ServiceAccount, bound to a pod on node A (the token's
node claim is then A) or to nothing.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.harness import Cluster, eventually
from tests.e2e.test_node_guard import LABELER, As, accounts, labeler_pod, token, two_nodes  # noqa: F401 - fixtures
from webhook.cluster import install

pytestmark = pytest.mark.e2e

COMPONENT = Path(__file__).resolve().parents[2] / "deploy" / "components" / "usage-limits"
REGISTRATION = "gpu-admission-labeler-evictions-e2e"


@pytest.fixture(scope="module")
def guarded(cluster: Cluster, accounts: None) -> Iterator[None]:  # noqa: F811 - the imported fixture
    """The component's RBAC and its webhook entry, the entry under a name of its own (the session's
    gpu-admission configuration stays as it is)."""
    rbac = [d for d in yaml.safe_load_all((COMPONENT / "rbac.yaml").read_text()) if d]
    applied = cluster.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": rbac}))
    assert applied.returncode == 0, applied.stderr
    component = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    [entry] = [
        op["value"]
        for p in component["patches"]
        if p["target"]["kind"] == "ValidatingWebhookConfiguration"
        for op in yaml.safe_load(p["patch"])
    ]
    document = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": REGISTRATION},
        "webhooks": [entry],
    }
    ca_bundle = (cluster.state.directory / "webhook" / "ca.crt").read_bytes()
    [local] = install.local_registrations(
        [document], base_url=f"https://127.0.0.1:{cluster.state.ports['webhook']}", ca_bundle=ca_bundle
    )
    assert base64.b64decode(local["webhooks"][0]["clientConfig"]["caBundle"]) == ca_bundle
    applied = cluster.kubectl("apply", "-f", "-", stdin=json.dumps(local))
    assert applied.returncode == 0, applied.stderr
    try:
        yield
    finally:
        cluster.kubectl("delete", "validatingwebhookconfiguration", REGISTRATION, "--ignore-not-found")


def victim(cluster: Cluster, namespace: str, name: str, node: str) -> dict[str, Any]:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "registry.example/app:1"}]},
    }
    completed = cluster.apply(pod, namespace=namespace)
    assert completed.returncode == 0, completed.stderr
    return cluster.get("pod", name, namespace=namespace)


def evict(caller: As, namespace: str, name: str) -> tuple[int, str]:
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
    return caller.call("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", body)


def test_the_labeler_evicts_pods_of_its_own_node_only(
    cluster: Cluster,
    guarded: None,
    labeler_pod: str,
    two_nodes: tuple[str, str],  # noqa: F811 - the imported fixtures
) -> None:
    node_a, node_b = two_nodes
    namespace = cluster.namespace()
    victim(cluster, namespace, "on-a", node_a)
    victim(cluster, namespace, "on-b", node_b)
    labeler = As(cluster, token(cluster, LABELER, "--bound-object-kind=Pod", f"--bound-object-name={labeler_pod}"))

    # Another node's pod: refused by the webhook, naming both nodes (retried until the apiserver
    # calls the new registration).
    answers: list[tuple[int, str]] = []

    def refused() -> bool:
        answers.append(evict(labeler, namespace, "on-b"))
        return answers[-1][0] == 403 and "validate-labeler-evictions.gpu-admission.io" in answers[-1][1]

    eventually(refused, what="the labeler's eviction of another node's pod refused", timeout=60)
    assert f"runs on node {node_b}, not on {node_a}" in answers[-1][1]
    assert "deletionTimestamp" not in cluster.get("pod", "on-b", namespace=namespace)["metadata"]

    # A token bound to nothing has no node claim: refused too.
    status, message = evict(As(cluster, token(cluster, LABELER)), namespace, "on-a")
    assert status == 403 and "node-name claim" in message, (status, message)

    # Its own node's pod: evicted.
    status, kind = evict(labeler, namespace, "on-a")
    assert status == 201, (status, kind)

    def evicted() -> bool:
        completed = cluster.kubectl("get", "pod", "on-a", "-n", namespace, "-o", "json", "--ignore-not-found")
        return not completed.stdout.strip() or "deletionTimestamp" in json.loads(completed.stdout)["metadata"]

    eventually(evicted, what="the pod on the labeler's node evicted")
    # Others are not matched: the admin evicts the pod on B.
    completed = cluster.kubectl(
        "create",
        "-f",
        "-",
        "--raw",
        f"/api/v1/namespaces/{namespace}/pods/on-b/eviction",
        stdin=json.dumps({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "on-b", "namespace": namespace}}),
    )
    assert completed.returncode == 0, completed.stderr
