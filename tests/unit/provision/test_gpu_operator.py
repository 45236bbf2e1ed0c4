"""Beside the NVIDIA GPU Operator: its real DaemonSets (tests/data/gpu-operator/, copied from
github.com/NVIDIA/gpu-operator, see each file's header) pass unchanged once its namespace is exempt
the documented way, and without that they would be refused, which is why the exemption is needed.

The documented way: the GPU Operator's namespace (default `gpu-operator`, created by the admin who
installs the operator) is added to `exemptNamespaces` in the policy ConfigMap and to the NotIn list
of both webhook configurations' namespaceSelector. deploy/ ships neither (a namespace that is
exempt before the admin creates it could be created by someone else), which the last tests hold.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from policies import nodeaffinity
from webhook import config
from webhook.cmdline import manifests
from webhook.commands import dryrun

REPO = Path(__file__).resolve().parents[3]
DATA = REPO / "tests" / "data" / "gpu-operator"
DEPLOY = REPO / "deploy"
OPERATOR_NAMESPACE = "gpu-operator"
COMPONENTS = (
    "container-toolkit",
    "dcgm-exporter",
    "device-plugin",
    "driver",
    "gpu-feature-discovery",
    "mig-manager",
    "operator-validator",
)


def deploy_settings_text() -> str:
    [config_map] = [d for d in yaml.safe_load_all((DEPLOY / "policy-config.yaml").read_text()) if d]
    text: str = config_map["data"]["config.yaml"]
    return text


def settings_from(text: str, tmp_path: Path) -> Any:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return config.load(str(path))


def with_operator_exempt(text: str) -> str:
    """The documented edit: the operator's namespace appended to exemptNamespaces."""
    [line] = [line for line in text.splitlines() if line.startswith("exemptNamespaces:")]
    listed = yaml.safe_load(line)["exemptNamespaces"]
    return text.replace(line, f"exemptNamespaces: [{', '.join([*listed, OPERATOR_NAMESPACE])}]")


def daemonset(component: str) -> dict[str, Any]:
    [document] = [d for d in yaml.safe_load_all((DATA / f"{component}.yaml").read_text()) if d]
    assert document["kind"] == "DaemonSet" and document["metadata"]["namespace"] == OPERATOR_NAMESPACE
    loaded: dict[str, Any] = document
    return loaded


def pod_of(workload: dict[str, Any]) -> dict[str, Any]:
    """The pod the DaemonSet controller creates from the template (what the mutating webhook sees)."""
    template = copy.deepcopy(workload["spec"]["template"])
    metadata = {**template.get("metadata", {}), "name": f"{workload['metadata']['name']}-x1", "namespace": OPERATOR_NAMESPACE}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]}


def outcomes(objects: list[dict[str, Any]], settings: Any) -> list[dryrun.Outcome]:
    documents = [manifests.Document(source=f"{o['kind']}/{o['metadata']['name']}", object=o) for o in objects]
    return dryrun.evaluate(documents, settings=settings)


@pytest.fixture(scope="module")
def operator_objects() -> list[dict[str, Any]]:
    objects = []
    for component in COMPONENTS:
        workload = daemonset(component)
        objects += [workload, pod_of(workload)]
    return objects


def test_the_copied_manifests_are_the_operators_privileged_gpu_node_daemonsets(operator_objects: list[dict[str, Any]]) -> None:
    pods = [o for o in operator_objects if o["kind"] == "Pod"]
    assert len(pods) == len(COMPONENTS)
    for pod in pods:
        spec = pod["spec"]
        assert nodeaffinity.targets_gpu_nodes(spec), pod["metadata"]["name"]  # nvidia.com/gpu.deploy.<operand>: "true"
        containers = spec.get("initContainers", []) + spec["containers"]
        assert any(c.get("securityContext", {}).get("privileged") for c in containers), pod["metadata"]["name"]


def test_with_the_documented_exemption_every_operator_daemonset_and_pod_passes_unchanged(
    operator_objects: list[dict[str, Any]], tmp_path: Path
) -> None:
    settings = settings_from(with_operator_exempt(deploy_settings_text()), tmp_path)
    assert OPERATOR_NAMESPACE in settings.exempt_namespaces
    for outcome in outcomes(operator_objects, settings):
        assert outcome.decision.allowed, (outcome.document.source, outcome.decision.denial_message)
        assert outcome.decision.patch == () and outcome.patched == outcome.document.object, outcome.document.source
        assert outcome.decision.exempt_reason, outcome.document.source


def test_without_it_the_operator_would_be_refused_and_its_pods_kept_off_gpu_nodes(
    operator_objects: list[dict[str, Any]], tmp_path: Path
) -> None:
    settings = settings_from(deploy_settings_text(), tmp_path)
    assert OPERATOR_NAMESPACE not in settings.exempt_namespaces
    refused: dict[str, set[str]] = {}
    for outcome in outcomes(operator_objects, settings):
        if outcome.document.object["kind"] != "DaemonSet":
            continue
        assert not outcome.decision.allowed, outcome.document.source
        refused[outcome.document.object["metadata"]["name"]] = {v.policy for v in outcome.decision.violations}
    # Privileged containers on GPU nodes (GPU002) and the hostPaths they need (GPU003: /run/nvidia,
    # /dev, /var/lib/kubelet/device-plugins, /var/lib/kubelet/pod-resources, the host's root).
    assert all("GPU002" in policies for policies in refused.values()), refused
    assert sum("GPU003" in policies for policies in refused.values()) >= len(COMPONENTS) - 1, refused


def test_a_tenant_copy_of_an_operator_daemonset_in_its_own_namespace_is_still_refused(tmp_path: Path) -> None:
    settings = settings_from(with_operator_exempt(deploy_settings_text()), tmp_path)
    stolen = daemonset("device-plugin")
    stolen["metadata"]["namespace"] = "team-a"
    [outcome] = outcomes([stolen], settings)
    assert not outcome.decision.allowed and "GPU002" in outcome.decision.denial_message


def test_the_exemption_leaves_ordinary_gpu_pods_in_other_namespaces_to_the_policies(tmp_path: Path) -> None:
    settings = settings_from(with_operator_exempt(deploy_settings_text()), tmp_path)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train", "namespace": "team-a"},
        "spec": {"containers": [{"name": "app", "image": "app", "resources": {"limits": {"aliyun.com/gpu-mem": "4"}}}]},
    }
    [outcome] = outcomes([pod], settings)
    assert outcome.decision.allowed and not outcome.decision.exempt_reason
    patched = jsonpatch.apply_patch(copy.deepcopy(pod), [dict(op) for op in outcome.decision.patch])
    assert patched["spec"]["nodeSelector"]["ack.node.gpu.schedule"] == "cgpu"


# --- deploy/ exempts only namespaces no tenant can create ---------------------------------------------

# Created by Kubernetes itself, or by deploy/namespace.yaml (restricted Pod Security) before anything else.
ADMIN_CREATED = {"kube-system", "kube-node-lease", "gpu-admission"}


def test_deploy_exempts_only_namespaces_that_exist_before_any_tenant(tmp_path: Path) -> None:
    settings = settings_from(deploy_settings_text(), tmp_path)
    assert settings.exempt_namespaces <= ADMIN_CREATED, settings.exempt_namespaces
    assert OPERATOR_NAMESPACE not in settings.exempt_namespaces, "documented as an admin's step, not a default"


def test_both_webhook_configurations_exclude_exactly_the_exempt_namespaces(tmp_path: Path) -> None:
    settings = settings_from(deploy_settings_text(), tmp_path)
    for configuration in yaml.safe_load_all((DEPLOY / "webhook-configurations.yaml").read_text()):
        for hook in configuration["webhooks"]:
            if hook["name"] == "validate-settings.gpu-admission.io":
                continue  # the settings ConfigMap's own check, in the webhook's namespace only (test_cluster_config)
            [expression] = hook["namespaceSelector"]["matchExpressions"]
            assert expression["key"] == "kubernetes.io/metadata.name" and expression["operator"] == "NotIn"
            assert set(expression["values"]) == settings.exempt_namespaces, hook["name"]
