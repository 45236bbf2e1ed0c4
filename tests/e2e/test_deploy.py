"""`kubectl apply -k deploy/` on a real apiserver: every object accepted, an upgrade changes objects in
place, `kubectl delete -k` leaves nothing labelled part-of gpu-admission behind.

These run on a throwaway control plane of their own (no gpu-admission process in it), never on the
session cluster: applying the base registers both webhook configurations (failurePolicy Fail)
against the Service gpu-admission-webhook, which nothing serves locally (no kube-proxy, KWOK pods
have no processes), so every later pod create there would be refused. A server-side dry run would
keep the session cluster safe too, but it cannot show what an upgrade changes or what a delete
leaves behind, and it cannot create the objects that later objects need (the namespace, the CRDs).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.harness import bare_control_plane, eventually
from webhook.cluster import controlplane, install

pytestmark = pytest.mark.e2e

DEPLOY = install.deploy_dir()
PART_OF = "app.kubernetes.io/part-of=gpu-admission"


@pytest.fixture(scope="module")
def cluster(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[controlplane.State]:
    with bare_control_plane(tmp_path_factory.mktemp("deploy"), bin_dir=bin_dir, fake_nodes=2) as state:
        yield state


def kubectl(state: controlplane.State, *args: str, stdin: str | None = None) -> str:
    return controlplane.kubectl(state, *args, stdin=stdin).stdout


def rendered(state: controlplane.State, directory: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(kubectl(state, "kustomize", str(directory))) if d]


def overlay(tmp_path: Path, *, tag: str, shared_mode: str) -> Path:
    """A user's kustomization on top of deploy/: another image tag and one policy setting changed."""
    base = os.path.relpath(DEPLOY, tmp_path)
    [config_map] = [d for d in yaml.safe_load_all((DEPLOY / "policy-config.yaml").read_text()) if d]
    settings = config_map["data"]["config.yaml"].replace("defaultSharedMode: cgpu", f"defaultSharedMode: {shared_mode}")
    assert settings != config_map["data"]["config.yaml"]
    patch = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "gpu-admission-policy", "namespace": "gpu-admission"},
        "data": {"config.yaml": settings},
    }
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(patch))
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [base],
                "images": [{"name": "gpu-admission", "newTag": tag}],
                "patches": [{"path": "policy.yaml"}],
            }
        )
    )
    return tmp_path


def part_of(state: controlplane.State) -> list[str]:
    """Every object in the cluster labelled part-of gpu-admission, as kind/name (all namespaces)."""
    kinds = kubectl(state, "api-resources", "--verbs=list", "-o", "name").split()
    listed = kubectl(state, "get", ",".join(kinds), "--all-namespaces", "-l", PART_OF, "-o", "name", "--ignore-not-found")
    return sorted(listed.split())


def webhook_pods(state: controlplane.State) -> list[dict[str, Any]]:
    found = json.loads(
        kubectl(state, "get", "pods", "-n", "gpu-admission", "-l", "app.kubernetes.io/component=webhook", "-o", "json")
    )
    items: list[dict[str, Any]] = found["items"]
    return items


def test_apply_installs_every_object_of_the_base_and_a_second_apply_changes_nothing(cluster: controlplane.State) -> None:
    objects = rendered(cluster, DEPLOY)
    applied = controlplane.kubectl(cluster, "apply", "-k", str(DEPLOY), check=False)
    assert applied.returncode == 0, applied.stderr
    for document in objects:
        name = document["metadata"]["name"]
        namespace = document["metadata"].get("namespace")
        where = ["-n", namespace] if namespace else []
        found = json.loads(kubectl(cluster, "get", document["kind"], name, *where, "-o", "json"))
        assert found["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpu-admission", f"{document['kind']}/{name}"
    # The Deployment's pods pass restricted Pod Security and the critical priority class.
    eventually(lambda: len(webhook_pods(cluster)) == 3, what="three webhook pods", timeout=90)
    for pod in webhook_pods(cluster):
        assert pod["spec"]["priorityClassName"] == "system-cluster-critical"
        assert pod["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpu-admission"
    versions = {
        line: kubectl(cluster, "get", line, "-n", "gpu-admission", "-o", "jsonpath={.metadata.resourceVersion}")
        for line in ("pdb/gpu-admission-webhook", "deployment/gpu-admission-webhook")
    }
    again = kubectl(cluster, "apply", "-k", str(DEPLOY)).strip().splitlines()
    # kubectl reports a PodDisruptionBudget as "configured" on every client-side apply: its selector
    # is patched with strategy "replace", so the patch always carries it. The object stays the same.
    changed = [line for line in again if not line.endswith("unchanged") and not line.startswith("poddisruptionbudget.policy/")]
    assert len(again) == len(objects) and changed == [], again
    for name, version in versions.items():
        assert kubectl(cluster, "get", name, "-n", "gpu-admission", "-o", "jsonpath={.metadata.resourceVersion}") == version, name


def test_an_upgrade_changes_the_image_and_the_setting_in_place(cluster: controlplane.State, tmp_path: Path) -> None:
    before = part_of(cluster)
    deployment = json.loads(kubectl(cluster, "get", "deployment", "gpu-admission-webhook", "-n", "gpu-admission", "-o", "json"))
    upgrade = overlay(tmp_path, tag="0.2.0", shared_mode="share")
    applied = kubectl(cluster, "apply", "-k", str(upgrade))
    assert "deployment.apps/gpu-admission-webhook configured" in applied
    assert "configmap/gpu-admission-policy configured" in applied
    after = json.loads(kubectl(cluster, "get", "deployment", "gpu-admission-webhook", "-n", "gpu-admission", "-o", "json"))
    assert after["spec"]["template"]["spec"]["containers"][0]["image"] == "gpu-admission:0.2.0"
    assert after["metadata"]["generation"] == deployment["metadata"]["generation"] + 1
    assert after["spec"]["selector"] == deployment["spec"]["selector"], "the immutable selector is untouched"
    stored = json.loads(kubectl(cluster, "get", "configmap", "gpu-admission-policy", "-n", "gpu-admission", "-o", "json"))
    assert "defaultSharedMode: share" in stored["data"]["config.yaml"]
    eventually(
        lambda: (
            {p["spec"]["containers"][0]["image"] for p in webhook_pods(cluster) if "deletionTimestamp" not in p["metadata"]}
            == {"gpu-admission:0.2.0"}
        ),
        what="the rollout to the new image",
        timeout=120,
    )
    # Nothing new but the rollouts' own children (the one image also rolls the extender Deployment
    # and the labeler DaemonSet; each child is owned by its workload and collected with it).
    grown = sorted(set(part_of(cluster)) - set(before))
    assert grown and all(name.startswith(("pod/", "replicaset.apps/", "controllerrevision.apps/")) for name in grown), grown


def test_delete_leaves_nothing_labelled_part_of_gpu_admission(cluster: controlplane.State, tmp_path: Path) -> None:
    assert part_of(cluster), "the base is installed"
    # The PolicyReport CRDs are applied on their own, and another engine (Kyverno) keeps a report in
    # them: deleting our install must leave both.
    kubectl(cluster, "apply", "-k", str(DEPLOY / "crds"))
    kubectl(cluster, "wait", "--for", "condition=established", "crd/policyreports.wgpolicyk8s.io", "--timeout=60s")
    theirs = {
        "apiVersion": "wgpolicyk8s.io/v1alpha2",
        "kind": "PolicyReport",
        "metadata": {"name": "kyverno-polr", "namespace": "default", "labels": {"app.kubernetes.io/managed-by": "kyverno"}},
    }
    kubectl(cluster, "apply", "-f", "-", stdin=json.dumps(theirs))
    deleted = controlplane.kubectl(cluster, "delete", "-k", str(DEPLOY), "--wait=true", "--timeout=120s", check=False)
    assert deleted.returncode == 0, deleted.stderr
    eventually(
        lambda: controlplane.kubectl(cluster, "get", "namespace", "gpu-admission", check=False).returncode != 0,
        what="the namespace gone",
        timeout=120,
    )
    eventually(lambda: part_of(cluster) == [], what="no object labelled part-of gpu-admission", timeout=60)
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        assert controlplane.kubectl(cluster, "get", kind, "gpu-admission", check=False).returncode != 0
    for crd in ("policyreports.wgpolicyk8s.io", "clusterpolicyreports.wgpolicyk8s.io"):
        assert controlplane.kubectl(cluster, "get", "crd", crd, check=False).returncode == 0, f"{crd} deleted with our install"
    assert (
        kubectl(cluster, "get", "policyreport", "kyverno-polr", "-n", "default", "-o", "name").strip()
        == "policyreport.wgpolicyk8s.io/kyverno-polr"
    )


def test_the_cert_manager_component_builds_on_the_base(cluster: controlplane.State, tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(DEPLOY, tmp_path)],
                "components": [os.path.relpath(DEPLOY / "overlays" / "cert-manager", tmp_path)],
            }
        )
    )
    objects = {(d["kind"], d["metadata"]["name"]): d for d in rendered(cluster, tmp_path)}
    assert ("Certificate", "gpu-admission-webhook") in objects and ("Issuer", "gpu-admission-ca") in objects
    # The webhook no longer manages certificates, so that RBAC goes; its cluster context's (namespaces,
    # ConfigMaps) and the extender's and labeler's stay.
    rbac = {(kind, name) for kind, name in objects if kind in {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}}
    assert not {name for _, name in rbac} & {"gpu-admission-webhook"}, rbac
    assert {("ClusterRole", "gpu-admission-webhook-context"), ("ClusterRoleBinding", "gpu-admission-webhook-context")} <= rbac, (
        rbac
    )
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        annotations = objects[(kind, "gpu-admission")]["metadata"]["annotations"]
        assert annotations["cert-manager.io/inject-ca-from"] == "gpu-admission/gpu-admission-webhook"
    container = objects[("Deployment", "gpu-admission-webhook")]["spec"]["template"]["spec"]["containers"][0]
    assert (
        "--self-managed-certs" not in container["args"] and "--tls-cert-file=/etc/gpu-admission/tls/tls.crt" in container["args"]
    )
    assert all(d["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpu-admission" for d in objects.values())
