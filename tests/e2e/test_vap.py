"""The exported ValidatingAdmissionPolicies inside the real kube-apiserver: they refuse the bypasses themselves.

The webhook is installed in this cluster too and refuses the same pods, so each refusal here is
proved to be the policy's own: kube-apiserver runs ValidatingAdmissionPolicy before the validating
webhooks, and its message names the policy and binding (``ValidatingAdmissionPolicy
'gpu-admission-gpu001' with binding 'gpu-admission-gpu001' denied request``); the user policies
are not loaded in the webhook at all. Creates are server-side dry runs (nothing is stored), and the
bindings are narrowed to namespaces labelled for this module, so other tests never meet these
policies; everything is deleted at the end.
"""

from __future__ import annotations

import copy
import datetime
import json
import pathlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests import bypasses
from tests.e2e.harness import Cluster, eventually
from webhook import config
from webhook.commands import vap

pytestmark = pytest.mark.e2e

REPO = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
POLICIES = EXAMPLES / "policies"
LABEL = "gpu-admission.io/e2e-vap"
COMPONENT = "app.kubernetes.io/component=validating-admission-policy"
USER_NAMESPACES = ("team-small", "inference")  # named by the example policies


def load(path: pathlib.Path) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(path.read_text())
    return document


def as_pod(document: dict[str, Any], name: str) -> dict[str, Any]:
    """The pod a manifest stands for: a Pod as it is, a workload's pod template as a Pod."""
    if document["kind"] == "Pod":
        pod = copy.deepcopy(document)
    else:
        spec = document["spec"]
        template = spec["jobTemplate"]["spec"]["template"] if document["kind"] == "CronJob" else spec["template"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": copy.deepcopy(template.get("metadata") or {}),
            "spec": copy.deepcopy(template["spec"]),
        }
    pod["metadata"]["name"] = name
    pod["metadata"].pop("namespace", None)
    return pod


def dry_create(cluster: Cluster, pod: dict[str, Any], *, namespace: str) -> Any:
    return cluster.kubectl("create", "-n", namespace, "--dry-run=server", "-f", "-", stdin=json.dumps(pod))


def refusal(policy: str) -> str:
    return f"ValidatingAdmissionPolicy '{policy}' with binding '{policy}' denied request"


@pytest.fixture(scope="module")
def vap_namespaces(cluster: Cluster) -> Iterator[tuple[str, str]]:
    """(a fresh namespace, this run's label value) with the exported policies bound to labelled namespaces only."""
    run = uuid.uuid4().hex[:8]
    namespace = cluster.namespace()
    created = []
    for name in USER_NAMESPACES:
        if cluster.kubectl("create", "namespace", name).returncode == 0:
            created.append(name)
    for name in (namespace, *USER_NAMESPACES):
        labelled = cluster.kubectl("label", "namespace", name, f"{LABEL}={run}", "--overwrite")
        assert labelled.returncode == 0, labelled.stderr
    exported = vap.export(config.load(None, policies_dir=str(POLICIES)), now=datetime.datetime.now(datetime.UTC))
    manifests = [copy.deepcopy(m) for m in exported.manifests]
    for manifest in manifests:
        if manifest["kind"] == "ValidatingAdmissionPolicyBinding":
            selector = manifest["spec"]["matchResources"]["namespaceSelector"]
            selector["matchLabels"] = {LABEL: run}  # the exported exclusions stay; this narrows further
    applied = cluster.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests}))
    assert applied.returncode == 0, applied.stderr
    try:
        bypass = as_pod(load(EXAMPLES / "bypasses" / "gpu001-visible-devices-env.yaml"), "probe")
        eventually(
            lambda: refusal("gpu-admission-gpu001") in dry_create(cluster, bypass, namespace=namespace).stderr,
            what="the exported policies in force",
            timeout=60,
        )
        yield namespace, run
    finally:
        cluster.kubectl("delete", "validatingadmissionpolicybinding", "-l", COMPONENT, "--wait=false")
        cluster.kubectl("delete", "validatingadmissionpolicy", "-l", COMPONENT, "--wait=false")
        for name in (*created, namespace):
            cluster.kubectl("delete", "namespace", name, "--wait=false")


def test_every_exported_policy_type_checks_in_the_apiserver(cluster: Cluster, vap_namespaces: tuple[str, str]) -> None:
    def checked() -> bool:
        listed = json.loads(cluster.kubectl("get", "validatingadmissionpolicy", "-l", COMPONENT, "-o", "json").stdout)
        return len(listed["items"]) == 7 and all(
            item.get("status", {}).get("observedGeneration") == item["metadata"]["generation"] for item in listed["items"]
        )

    eventually(checked, what="type checking of the exported policies", timeout=60)
    listed = json.loads(cluster.kubectl("get", "validatingadmissionpolicy", "-l", COMPONENT, "-o", "json").stdout)
    warnings = [
        f"{item['metadata']['name']} {found['fieldRef']}: {found['warning']}"
        for item in listed["items"]
        for found in item["status"].get("typeChecking", {}).get("expressionWarnings") or []
    ]
    assert warnings == [], "\n".join(warnings)


@pytest.mark.parametrize(("bypass", "policy"), bypasses.REFUSED_BY_POLICY)
def test_the_policy_itself_refuses_the_bypass_pod(
    cluster: Cluster, vap_namespaces: tuple[str, str], bypass: str, policy: str
) -> None:
    namespace, _ = vap_namespaces
    pod = as_pod(load(EXAMPLES / "bypasses" / bypass), f"bypass-{uuid.uuid4().hex[:6]}")

    # Each policy and binding reaches the apiserver's admission on its own schedule; the fixture
    # waited for GPU001's only, so wait for this one's too before judging the message.
    answers: list[str] = []

    def refused_by_policy() -> bool:
        answers[:] = [dry_create(cluster, pod, namespace=namespace).stderr]
        return refusal(policy) in answers[0]

    eventually(refused_by_policy, what=f"{policy} in force", timeout=60)
    refused_stderr = answers[0]
    assert policy.removeprefix("gpu-admission-").upper() + ":" in refused_stderr


def test_the_seed_workloads_pass_the_policies(cluster: Cluster, vap_namespaces: tuple[str, str]) -> None:
    namespace, _ = vap_namespaces
    workloads = sorted((EXAMPLES / "workloads").glob("*.yaml"))
    assert workloads, "no seed workloads under examples/workloads"
    created = 0
    for path in workloads:
        for index, document in enumerate(yaml.safe_load_all(path.read_text())):
            if not document or document["kind"] not in ("Pod", "Deployment", "StatefulSet", "Job", "CronJob", "DaemonSet"):
                continue
            pod = as_pod(document, f"seed-{index}-{uuid.uuid4().hex[:6]}")
            admitted = dry_create(cluster, pod, namespace=namespace)
            assert admitted.returncode == 0, f"{path.name}#{index}: {admitted.stderr}"
            created += 1
    assert created >= len(workloads), "each seed file holds at least one pod-bearing object"


@pytest.mark.parametrize(
    ("manifest", "policy", "namespace_of_manifest"),
    [
        ("gpu-mem-limit", "gpu-admission-gpu-mem-limit", False),
        ("card-model-required", "gpu-admission-card-model-required", True),
        ("max-gpus-per-pod", "gpu-admission-max-gpus-per-pod", True),
    ],
)
def test_user_policies_refuse_in_the_apiserver_what_the_engine_refuses(
    cluster: Cluster, vap_namespaces: tuple[str, str], manifest: str, policy: str, namespace_of_manifest: bool
) -> None:
    fresh, _ = vap_namespaces
    for verdict in ("allowed", "denied"):
        document = load(POLICIES / "manifests" / f"{manifest}-{verdict}.yaml")
        namespace = document["metadata"]["namespace"] if namespace_of_manifest else fresh
        outcome = dry_create(cluster, as_pod(document, f"{verdict}-{uuid.uuid4().hex[:6]}"), namespace=namespace)
        if verdict == "allowed":
            assert outcome.returncode == 0, outcome.stderr
        else:
            assert outcome.returncode != 0
            assert refusal(policy) in outcome.stderr
