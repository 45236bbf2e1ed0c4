"""deploy/labeler.yaml: least-privilege RBAC, the downward-API node name, and args the CLI accepts."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.labeler import cli

MANIFEST = Path(__file__).resolve().parents[3] / "deploy" / "labeler.yaml"


@pytest.fixture(scope="module")
def objects() -> dict[str, dict[str, Any]]:
    documents = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    return {d["kind"]: d for d in documents}


def test_the_role_allows_get_and_patch_on_nodes_patch_on_node_status_and_list_pods_only(
    objects: dict[str, dict[str, Any]],
) -> None:
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): sorted(r["verbs"]) for r in objects["ClusterRole"]["rules"]}
    assert rules == {(("",), ("nodes",)): ["get", "patch"], (("",), ("nodes/status",)): ["patch"], (("",), ("pods",)): ["list"]}


def test_the_binding_ties_the_role_to_the_daemonsets_service_account(objects: dict[str, dict[str, Any]]) -> None:
    binding, daemonset = objects["ClusterRoleBinding"], objects["DaemonSet"]
    assert binding["roleRef"]["name"] == objects["ClusterRole"]["metadata"]["name"]
    (subject,) = binding["subjects"]
    assert (
        subject["name"]
        == daemonset["spec"]["template"]["spec"]["serviceAccountName"]
        == objects["ServiceAccount"]["metadata"]["name"]
    )
    assert subject["namespace"] == daemonset["metadata"]["namespace"] == objects["ServiceAccount"]["metadata"]["namespace"]


def container(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (only,) = objects["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    result: dict[str, Any] = only
    return result


def test_the_node_name_comes_from_the_downward_api(objects: dict[str, dict[str, Any]]) -> None:
    env = {e["name"]: e for e in container(objects)["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_the_container_runs_without_privileges(objects: dict[str, dict[str, Any]]) -> None:
    pod = objects["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "hostNetwork" not in pod and "hostIPC" not in pod
    # Restricted Pod Security: no host namespace, no host path (the host's /proc comes only with
    # deploy/components/process-attribution).
    assert "hostPID" not in pod and "volumes" not in pod
    assert "volumeMounts" not in container(objects)
    context = container(objects)["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["privileged"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}


def test_resources_and_probes_are_set_and_probe_the_health_port(objects: dict[str, dict[str, Any]]) -> None:
    main = container(objects)
    assert main["resources"]["requests"] and main["resources"]["limits"]["memory"]
    (port,) = main["ports"]
    assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port["name"]}
    assert main["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port["name"]}
    assert f"--health-port={port['containerPort']}" in main["args"]


def test_the_args_are_accepted_by_the_labeler_cli(objects: dict[str, dict[str, Any]]) -> None:
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(container(objects)["args"])
    assert args.func is cli.run
    assert args.node_name is None  # from $NODE_NAME
    assert args.interval == 60.0 and args.advertise and args.health_port == 8089
    assert str(args.proc_root) == "/host/proc"


def test_it_only_runs_on_gpu_nodes(objects: dict[str, dict[str, Any]]) -> None:
    affinity = objects["DaemonSet"]["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    keys = {expression["key"] for term in terms for expression in term["matchExpressions"]}
    assert "aliyun.accelerator/nvidia_count" in keys and "feature.node.kubernetes.io/pci-10de.present" in keys
