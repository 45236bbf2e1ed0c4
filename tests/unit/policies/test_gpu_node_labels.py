"""NVIDIA's own GPU-node labels (node-feature-discovery's PCI vendor labels, the GPU Operator's
`nvidia.com/gpu.present` and `nvidia.com/gpu.deploy.*`) count as targeting GPU nodes, for GPU002
and GPU103 alike, and only with the values that mark GPU nodes."""

from __future__ import annotations

import copy
import datetime
from typing import Any

import jsonpatch
import pytest

from policies import engine, model, nodeaffinity, settings
from policies.trustzone import DEFAULT_ZONE
from tests.unit.cel import test_cel_vap_export
from tests.unit.policies.conftest import ContainerFactory, Evaluate, Patched, PodFactory, WorkloadFactory
from webhook.audit.checks import facts
from webhook.commands import vap

KEEP_OFF = [dict(e) for e in DEFAULT_ZONE.keep_off]

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
DOES_NOT_EXIST = {"key": "aliyun.accelerator/nvidia_name", "operator": "DoesNotExist"}


def required(*expressions: dict[str, object]) -> dict[str, object]:
    return {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": list(expressions)}]}}}


def preferred(*expressions: dict[str, object]) -> dict[str, object]:
    return {"nodeAffinity": {PREFERRED: [{"weight": 1, "preference": {"matchExpressions": list(expressions)}}]}}


GPU_TARGETING = [
    {"nodeSelector": {"nvidia.com/gpu.present": "true"}},
    {"nodeSelector": {"feature.node.kubernetes.io/pci-10de.present": "true"}},
    {"nodeSelector": {"feature.node.kubernetes.io/pci-0302_10de.present": "true"}},
    {"nodeSelector": {"nvidia.com/gpu.deploy.device-plugin": "true"}},
    {"nodeSelector": {"nvidia.com/gpu.deploy.driver": "paused-for-upgrade"}},  # any value: only GPU nodes carry it
    {"affinity": required({"key": "nvidia.com/gpu.present", "operator": "In", "values": ["false", "true"]})},
    {"affinity": required({"key": "feature.node.kubernetes.io/pci-10de.present", "operator": "Exists"})},
    {"affinity": preferred({"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]})},
    {"affinity": required({"key": "nvidia.com/gpu.deploy.dcgm-exporter", "operator": "Exists"})},
    {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}},  # GPU Feature Discovery's
    {"affinity": required({"key": "nvidia.com/cuda.driver.major", "operator": "Gt", "values": ["530"]})},
]
NOT_GPU_TARGETING = [
    {},
    {"nodeSelector": {"nvidia.com/gpu.present": "false"}},  # the operator's label for nodes whose GPUs are gone
    {"nodeSelector": {"feature.node.kubernetes.io/pci-10de.present": "True"}},  # NFD writes "true"
    {"nodeSelector": {"feature.node.kubernetes.io/pci-8086.present": "true"}},  # another vendor
    {"nodeSelector": {"nvidia.com/mig.strategy": "single"}},  # not in the definition
    {"affinity": required({"key": "nvidia.com/gpu.present", "operator": "In", "values": ["false"]})},
    {"affinity": required({"key": "nvidia.com/gpu.present", "operator": "NotIn", "values": ["true"]})},
    {"affinity": required({"key": "feature.node.kubernetes.io/pci-10de.present", "operator": "DoesNotExist"})},
    {"affinity": required({"key": "nvidia.com/gpu.present", "operator": "Gt", "values": ["1"]})},
    {"affinity": required({"key": "nvidia.com/gpu.deploy.driver", "operator": "DoesNotExist"})},
    {"nodeSelector": {"nvidia.com/gpux": "true"}},
    {"nodeSelector": {"nvidia.com/gpu": "1"}},  # the resource's name, not a label anyone sets
]


@pytest.mark.parametrize("spec", GPU_TARGETING)
def test_nvidia_gpu_node_labels_target_gpu_nodes(spec: dict[str, object]) -> None:
    assert nodeaffinity.targets_gpu_nodes({"containers": [], **spec})


@pytest.mark.parametrize("spec", NOT_GPU_TARGETING)
def test_other_values_operators_and_labels_do_not(spec: dict[str, object]) -> None:
    assert not nodeaffinity.targets_gpu_nodes({"containers": [], **spec})


def test_malformed_selectors_never_raise() -> None:
    for spec in (
        {"nodeSelector": {"nvidia.com/gpu.present": None}},
        {"nodeSelector": ["x"]},
        {"affinity": required({"key": "nvidia.com/gpu.present", "operator": "In", "values": "true"})},
        {"affinity": required({"key": 7, "operator": "In", "values": [True]})},
    ):
        assert nodeaffinity.targets_gpu_nodes(spec) in (True, False)
    assert not nodeaffinity.is_gpu_node_label(None) and not nodeaffinity.is_gpu_node_label(3, "true")


def test_a_privileged_pod_targeting_operator_labelled_nodes_is_refused_by_gpu002(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, workload: WorkloadFactory
) -> None:
    for obj in (
        pod(container(privileged=True), nodeSelector={"nvidia.com/gpu.present": "true"}),
        workload(
            "DaemonSet",
            pod(
                container(),
                init=[container("setup", privileged=True)],
                affinity=required({"key": "feature.node.kubernetes.io/pci-10de.present", "operator": "In", "values": ["true"]}),
            ),
        ),
    ):
        decision = evaluate(obj)
        assert not decision.allowed and decision.denial_message.startswith("GPU002: "), decision.denial_message


def test_a_privileged_pod_selecting_nodes_without_gpus_is_kept_off_gpu_nodes_by_gpu103(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, patched: Patched
) -> None:
    obj = pod(container(privileged=True), nodeSelector={"nvidia.com/gpu.present": "false"})
    decision = evaluate(obj)
    assert decision.allowed
    assert decision.patch[0] == {
        "op": "add",
        "path": "/spec/affinity",
        "value": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": KEEP_OFF}]}}},
    }
    again = evaluate(patched(obj, decision.patch))
    assert again.allowed and again.patch == ()


def test_an_unprivileged_pod_targeting_operator_labelled_nodes_gets_no_gpu103_affinity(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    """GPU103 would contradict the pod's own choice and leave it Pending (the issue: it made the
    operator's components unschedulable on GPU nodes); with keepNonGpuPodsOffGpuNodes too."""
    obj = pod(container(), nodeSelector={"nvidia.com/gpu.deploy.gpu-feature-discovery": "true"})
    for config in (None, {"keepNonGpuPodsOffGpuNodes": True}):
        decision = evaluate(obj, config=config)
        assert decision.allowed and not any(op["path"] == "/spec/affinity" for op in decision.patch), decision.patch


def test_ordinary_pods_beside_them_are_unchanged(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    decision = evaluate(pod(container(), nodeSelector={"kubernetes.io/os": "linux"}))
    assert decision.allowed and not any(op["path"] == "/spec/affinity" for op in decision.patch)


def test_the_audit_tells_gpu_nodes_by_the_same_definition() -> None:
    def node(labels: dict[str, str]) -> dict[str, object]:
        return {"metadata": {"name": "n", "labels": labels}, "status": {"capacity": {"cpu": "8"}}}

    assert facts.is_gpu_node(node({"nvidia.com/gpu.present": "true"}))
    assert facts.is_gpu_node(node({"feature.node.kubernetes.io/pci-10de.present": "true"}))
    assert facts.is_gpu_node(node({"nvidia.com/gpu.deploy.driver": "true"}))
    assert not facts.is_gpu_node(node({"nvidia.com/gpu.present": "false"}))
    assert not facts.is_gpu_node(node({"kubernetes.io/os": "linux"}))


def exported_gpu002_admits(spec: dict[str, object]) -> bool:
    """The exported GPU002 ValidatingAdmissionPolicy, its CEL run here as kube-apiserver would: on the
    pod as the mutating webhook left it (GPU103's affinity added where the webhook adds it)."""
    export = vap.export(settings.Settings(), now=datetime.datetime(2026, 6, 1, tzinfo=datetime.UTC))
    [policy] = [
        m
        for m in export.manifests
        if m["kind"] == "ValidatingAdmissionPolicy" and m["metadata"]["name"] == "gpu-admission-gpu002"
    ]
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team-a"},
        "spec": {"containers": [{"name": "main", "image": "x", "securityContext": {"privileged": True}}], **spec},
    }
    decision = engine.evaluate(model.Request(operation="CREATE", object=pod, namespace="team-a"), settings=settings.Settings())
    mutated = jsonpatch.apply_patch(copy.deepcopy(pod), list(decision.patch)) if decision.allowed else pod
    return test_cel_vap_export.admits(policy, mutated)


@pytest.mark.parametrize("spec", GPU_TARGETING + NOT_GPU_TARGETING)
def test_the_exported_gpu002_policy_uses_the_same_definition(spec: dict[str, object]) -> None:
    assert exported_gpu002_admits(spec) is not nodeaffinity.targets_gpu_nodes({"containers": [], **spec})
