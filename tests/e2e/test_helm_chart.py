"""The Helm chart: `helm lint`, `helm template`, and the same objects as the kustomize base.

The chart renders the base's own files (deploy/helm/gpu-admission/files/ links to them), so drift
can only come from the chart's templates; these tests hold every rendered object equal to what
`kubectl kustomize` builds (whole objects, only Helm's own labels set aside): with the defaults
against deploy/, with certificates.mode=certManager against deploy/ plus the cert-manager
component, with the monitoring values against deploy/ plus the monitoring component, with
labeler.processAttribution against deploy/ plus the process-attribution component, with
labeler.usageLimits against deploy/ plus that and the usage-limits component, and with
crds.install against deploy/crds/ (plus the keep annotation). Marked e2e: helm and kubectl are
built with Go (kubectl from the control-plane cache).
"""

from __future__ import annotations

import copy
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import ecosystem

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
CHART = DEPLOY / "helm" / "gpu-admission"
KUBE_VERSION = "v1.34.4"
HELM_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance")
Key = tuple[str, str, str]


@pytest.fixture(scope="module")
def helm() -> Path:
    return ecosystem.tool("helm")


@pytest.fixture(scope="module")
def kubectl(bin_dir: Path) -> Path:
    return bin_dir / "kubectl"


def render(helm: Path, *values: str) -> dict[Key, dict[str, Any]]:
    # The version of the local control plane (helm built from source assumes v1.20 otherwise).
    command = [str(helm), "template", "gpu-admission", str(CHART), "--kube-version", KUBE_VERSION]
    for value in values:
        command += ["--set", value]
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    assert completed.returncode == 0, completed.stderr
    return _index(completed.stdout)


def kustomize(kubectl: Path, tmp_path: Path, *components: str) -> dict[Key, dict[str, Any]]:
    """deploy/ with `components` (paths under deploy/), from a kustomization outside deploy/ as
    the components' own comments say to use them."""
    root = tmp_path / "kustomization"
    root.mkdir(exist_ok=True)
    relative = os.path.relpath(DEPLOY, root)
    document = {"resources": [relative], "components": [f"{relative}/{c}" for c in components]}
    (root / "kustomization.yaml").write_text(yaml.safe_dump(document))
    completed = subprocess.run([str(kubectl), "kustomize", str(root)], capture_output=True, text=True, check=False)
    assert completed.returncode == 0, completed.stderr
    return _index(completed.stdout)


def _index(text: str) -> dict[Key, dict[str, Any]]:
    found: dict[Key, dict[str, Any]] = {}
    for document in yaml.safe_load_all(text):
        if not document:
            continue
        metadata = document["metadata"]
        key = (document["kind"], metadata.get("namespace", ""), metadata["name"])
        assert key not in found, f"{key} rendered twice"
        found[key] = document
    return found


def _without_helm(document: dict[str, Any]) -> dict[str, Any]:
    changed = copy.deepcopy(document)
    labels = changed["metadata"].get("labels", {})
    for label in HELM_LABELS:
        labels.pop(label, None)
    if "labels" in changed["metadata"] and not labels:
        del changed["metadata"]["labels"]
    return changed


def assert_same(chart: dict[Key, dict[str, Any]], base: dict[Key, dict[str, Any]]) -> None:
    assert sorted(chart) == sorted(base)
    for key, document in base.items():
        assert _without_helm(chart[key]) == document, key


def test_helm_lint_passes_with_the_defaults_and_every_mode(helm: Path) -> None:
    for values in (
        [],
        [
            "certificates.mode=certManager",
            "extender.mode=secondScheduler",
            "crds.install=true",
            "monitoring.serviceMonitor.enabled=true",
            "monitoring.prometheusRule.enabled=true",
            "labeler.enabled=false",
        ],
        ["labeler.processAttribution=true"],
        ["labeler.processAttribution=true", "labeler.usageLimits=true"],
    ):
        command = [str(helm), "lint", "--strict", str(CHART)] + [arg for v in values for arg in ("--set", v)]
        completed = subprocess.run(command, capture_output=True, text=True, check=False)
        assert completed.returncode == 0, completed.stdout + completed.stderr


def test_the_defaults_render_the_kustomize_base(helm: Path, kubectl: Path, tmp_path: Path) -> None:
    chart, base = render(helm), kustomize(kubectl, tmp_path)
    assert_same(chart, base)
    # Helm's labels on objects only, never on selectors (an upgrade must not change one).
    webhook = chart[("Deployment", "gpu-admission", "gpu-admission-webhook")]
    assert webhook["metadata"]["labels"]["app.kubernetes.io/instance"] == "gpu-admission"
    assert "app.kubernetes.io/instance" not in webhook["spec"]["selector"]["matchLabels"]


def test_cert_manager_mode_renders_the_base_with_the_cert_manager_component(helm: Path, kubectl: Path, tmp_path: Path) -> None:
    chart, base = render(helm, "certificates.mode=certManager"), kustomize(kubectl, tmp_path, "overlays/cert-manager")
    assert_same(chart, base)
    assert ("ClusterRole", "", "gpu-admission-webhook") not in chart
    assert ("Certificate", "gpu-admission", "gpu-admission-webhook") in chart


def test_monitoring_values_render_the_base_with_the_monitoring_component(helm: Path, kubectl: Path, tmp_path: Path) -> None:
    chart = render(helm, "monitoring.serviceMonitor.enabled=true", "monitoring.prometheusRule.enabled=true")
    assert_same(chart, kustomize(kubectl, tmp_path, "components/monitoring"))
    labelled = render(
        helm, "monitoring.prometheusRule.enabled=true", "monitoring.prometheusRule.labels.release=kube-prometheus-stack"
    )
    assert (
        labelled[("PrometheusRule", "gpu-admission", "gpu-admission")]["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    )


def test_process_attribution_renders_the_base_with_the_process_attribution_component(
    helm: Path, kubectl: Path, tmp_path: Path
) -> None:
    chart = render(helm, "labeler.processAttribution=true")
    assert_same(chart, kustomize(kubectl, tmp_path, "components/process-attribution"))
    labeler = chart[("DaemonSet", "gpu-admission", "gpu-admission-labeler")]["spec"]["template"]["spec"]
    assert labeler["volumes"][0]["hostPath"]["path"] == "/proc" and "hostPID" not in labeler
    # Off by default: the base's pods pass the namespace's "restricted".
    namespace = render(helm)[("Namespace", "", "gpu-admission")]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_usage_limits_render_the_base_with_the_usage_limits_component(helm: Path, kubectl: Path, tmp_path: Path) -> None:
    chart = render(helm, "labeler.processAttribution=true", "labeler.usageLimits=true")
    assert_same(chart, kustomize(kubectl, tmp_path, "components/process-attribution", "components/usage-limits"))
    labeler = chart[("DaemonSet", "gpu-admission", "gpu-admission-labeler")]["spec"]["template"]["spec"]
    assert "--usage-limits=/etc/gpu-admission/config/config.yaml" in labeler["containers"][0]["args"]
    webhooks = chart[("ValidatingWebhookConfiguration", "", "gpu-admission")]["webhooks"]
    assert webhooks[-1]["name"] == "validate-labeler-evictions.gpu-admission.io"
    assert ("ClusterRole", "", "gpu-admission-labeler-usage-limits") in chart
    # Off by default: no evictions, no eviction webhook entry.
    assert ("ClusterRole", "", "gpu-admission-labeler-usage-limits") not in render(helm, "labeler.processAttribution=true")


def test_usage_limits_without_process_attribution_are_refused_with_the_reason(helm: Path) -> None:
    for values in (
        ["labeler.usageLimits=true"],
        ["labeler.usageLimits=true", "labeler.processAttribution=true", "labeler.enabled=false"],
    ):
        command = [str(helm), "template", "gpu-admission", str(CHART), "--kube-version", KUBE_VERSION]
        command += [arg for v in values for arg in ("--set", v)]
        completed = subprocess.run(command, capture_output=True, text=True, check=False)
        assert (
            completed.returncode != 0
            and "labeler.usageLimits needs labeler.enabled and labeler.processAttribution" in completed.stderr
        )


def test_crds_are_opt_in_and_kept_on_uninstall(helm: Path, kubectl: Path) -> None:
    assert not any(kind == "CustomResourceDefinition" for kind, _, _ in render(helm))
    chart = {k: v for k, v in render(helm, "crds.install=true").items() if k[0] == "CustomResourceDefinition"}
    completed = subprocess.run([str(kubectl), "kustomize", str(DEPLOY / "crds")], capture_output=True, text=True, check=True)
    base = _index(completed.stdout)
    assert sorted(chart) == sorted(base) and len(base) == 2
    for key, document in base.items():
        rendered = _without_helm(chart[key])
        assert rendered["metadata"]["annotations"].pop("helm.sh/resource-policy") == "keep"
        if not rendered["metadata"]["annotations"]:
            del rendered["metadata"]["annotations"]
        assert rendered == document, key


def test_values_change_only_what_they_name(helm: Path) -> None:
    default = render(helm)
    changed = render(
        helm,
        "image.repository=registry.example/gpu-admission",
        "image.tag=9.9.9",
        "webhook.replicas=5",
        "extender.replicas=1",
        "webhook.resources.requests.cpu=1",
        "policySettings.policies.GPU103.action=warn",
        "labeler.enabled=false",
        "namespace.create=false",
    )
    webhook = changed[("Deployment", "gpu-admission", "gpu-admission-webhook")]
    assert webhook["spec"]["replicas"] == 5
    assert webhook["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/gpu-admission:9.9.9"
    assert webhook["spec"]["template"]["spec"]["containers"][0]["resources"] == {"requests": {"cpu": 1}}
    extender = changed[("Deployment", "gpu-admission", "gpu-admission-extender")]
    assert extender["spec"]["replicas"] == 1
    assert {
        c["image"]
        for c in extender["spec"]["template"]["spec"]["initContainers"] + extender["spec"]["template"]["spec"]["containers"]
    } == {"registry.example/gpu-admission:9.9.9"}
    policy = yaml.safe_load(changed[("ConfigMap", "gpu-admission", "gpu-admission-policy")]["data"]["config.yaml"])
    assert policy == {"policies": {"GPU103": {"action": "warn"}}}
    gone = set(default) - set(changed)
    assert gone == {
        key
        for key in default
        if key[2] == "gpu-admission-labeler"
        and key[0] != "ValidatingAdmissionPolicy"
        and key[0] != "ValidatingAdmissionPolicyBinding"
    } | {("Namespace", "", "gpu-admission")}


def test_second_scheduler_mode_runs_kube_scheduler_with_the_shipped_configuration(helm: Path) -> None:
    assert not any(name.startswith("gpu-admission-scheduler") and kind == "Deployment" for kind, _, name in render(helm))
    chart = render(helm, "extender.mode=secondScheduler")
    deployment = chart[("Deployment", "gpu-admission", "gpu-admission-scheduler")]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gpu-admission-scheduler"
    config = yaml.safe_load(
        chart[("ConfigMap", "gpu-admission", "gpu-admission-scheduler-config-in-cluster")]["data"]["scheduler-config.yaml"]
    )
    shipped = yaml.safe_load((DEPLOY / "scheduler-config-second.yaml").read_text())
    assert "kubeconfig" not in config.get("clientConnection", {})  # in-cluster
    assert config["extenders"] == shipped["extenders"] and config["profiles"] == shipped["profiles"]
    mounted = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    tls_dir = os.path.dirname(shipped["extenders"][0]["tlsConfig"]["certFile"])
    assert tls_dir in mounted
    secret = next(v["secret"] for v in pod["volumes"] if "secret" in v)
    assert {item["path"] for item in secret["items"]} == {
        os.path.basename(shipped["extenders"][0]["tlsConfig"][k]) for k in ("caFile", "certFile", "keyFile")
    }
    bindings = {
        doc["roleRef"]["name"]
        for (kind, _, _), doc in chart.items()
        if kind == "ClusterRoleBinding" and "scheduler" in doc["metadata"]["name"]
    }
    assert bindings == {"system:kube-scheduler", "system:volume-scheduler"}
    with pytest.raises(AssertionError, match="extender.mode"):
        render(helm, "extender.mode=elsewhere")


def test_values_outside_the_schema_are_refused_with_their_name(helm: Path) -> None:
    for wrong, named in (
        ("certificates.mode=vault", "certificates.mode"),
        ("webhook.replicas=0", "webhook.replicas"),
        ("webhook.replica=3", "replica"),
        ("crds.install=maybe", "crds.install"),
    ):
        with pytest.raises(AssertionError, match=named):
            render(helm, wrong)
