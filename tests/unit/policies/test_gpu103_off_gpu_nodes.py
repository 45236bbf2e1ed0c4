"""GPU103: pods that use no GPU but have node power are kept off GPU nodes (the trust zone)."""

from __future__ import annotations

import pytest

from policies.trustzone import DEFAULT_ZONE
from tests.unit.policies.conftest import (
    ContainerFactory,
    Evaluate,
    Patched,
    PodFactory,
    WorkloadFactory,
    assert_second_pass_is_empty,
    required_node_affinity,
)

KEEP_OFF = [dict(e) for e in DEFAULT_ZONE.keep_off]

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
DOES_NOT_EXIST = {"key": "aliyun.accelerator/nvidia_name", "operator": "DoesNotExist"}
VOID_ENV = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}


def test_privileged_pod_without_gpus_gets_does_not_exist_affinity(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, patched: Patched
) -> None:
    obj = pod(container(privileged=True))

    decision = evaluate(obj)

    assert decision.allowed
    assert decision.patch == (
        {
            "op": "add",
            "path": "/spec/affinity",
            "value": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": KEEP_OFF}]}}},
        },
        {"op": "add", "path": "/spec/containers/0/env", "value": [VOID_ENV]},
    )
    assert_second_pass_is_empty(evaluate, patched, obj, decision)


NOTICE = (
    "GPU103: pods that use no GPU but have node power are kept off GPU nodes: kept off GPU nodes "
    "(required node affinity against every GPU node label): "
)


def test_the_admission_warning_says_what_keeps_the_pod_off_gpu_nodes(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    decision = evaluate(pod(container(privileged=True)))

    assert decision.notices == (NOTICE + 'container "main" is privileged, which GPU nodes do not allow',)
    assert decision.warnings == ()


def test_the_admission_warning_names_the_first_power_and_counts_the_rest(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    obj = pod(
        container(privileged=True, env=[VOID_ENV]),
        hostPID=True,
        volumes=[{"name": "root", "hostPath": {"path": "/"}}, {"name": "repo", "gitRepo": {"repository": "r"}}],
    )

    decision = evaluate(obj)

    assert decision.allowed
    assert decision.notices == (NOTICE + "the pod sets hostPID: true (and 3 more), which GPU nodes do not allow",)


def test_a_pod_without_node_power_gets_no_warning(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    decision = evaluate(pod(container(env=[VOID_ENV], securityContext={"runAsNonRoot": True})))

    assert decision.allowed and decision.patch == () and decision.notices == ()


def test_privileged_init_container_counts(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    decision = evaluate(pod(container(), init=[container("sysctl", privileged=True)]))

    assert decision.patch[0]["path"] == "/spec/affinity"


def test_requirement_goes_into_every_existing_term(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, patched: Patched
) -> None:
    affinity = required_node_affinity(
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
    )
    obj = pod(container(privileged=True, env=[VOID_ENV]), affinity=affinity)

    decision = evaluate(obj)

    terms = f"/spec/affinity/nodeAffinity/{REQUIRED}/nodeSelectorTerms"
    assert decision.patch == tuple(
        {"op": "add", "path": f"{terms}/{index}/matchExpressions/-", "value": expression}
        for index in (0, 1)
        for expression in KEEP_OFF
    )
    assert_second_pass_is_empty(evaluate, patched, obj, decision)


def test_unprivileged_pod_without_gpus_is_left_on_any_node_by_default(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    decision = evaluate(pod(container(env=[VOID_ENV])))

    assert decision.patch == ()


def test_every_pod_without_gpus_is_kept_off_gpu_nodes_when_configured(
    pod: PodFactory, container: ContainerFactory, workload: WorkloadFactory, evaluate: Evaluate, patched: Patched
) -> None:
    config = {"keepNonGpuPodsOffGpuNodes": True}
    obj = workload("Deployment", pod(container(env=[VOID_ENV])))

    decision = evaluate(obj, config=config)

    assert decision.patch == (
        {
            "op": "add",
            "path": "/spec/template/spec/affinity",
            "value": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": KEEP_OFF}]}}},
        },
    )
    assert_second_pass_is_empty(evaluate, patched, obj, decision, config=config)


def test_pod_that_asks_for_gpu_nodes_is_not_given_a_contradicting_affinity(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    decision = evaluate(
        pod(container(env=[VOID_ENV]), nodeSelector={"aliyun.accelerator/nvidia_name": "A10"}),
        config={"keepNonGpuPodsOffGpuNodes": True},
    )

    assert decision.allowed
    assert decision.patch == ()


def test_gpu_pods_are_never_kept_off_gpu_nodes(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    decision = evaluate(pod(container(gpu={"nvidia.com/gpu": 1})), config={"keepNonGpuPodsOffGpuNodes": True})

    assert decision.patch == ()


def caps(*added: str) -> dict[str, object]:
    return {"securityContext": {"capabilities": {"add": list(added)}}}


AFFINITY = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": KEEP_OFF}]}}}


@pytest.mark.parametrize("added", [("SYS_ADMIN",), ("ALL",), ("NET_ADMIN", "cap_sys_admin"), ("all",)])
def test_a_pod_without_gpus_adding_sys_admin_or_all_is_kept_off_gpu_nodes(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, patched: Patched, added: tuple[str, ...]
) -> None:
    obj = pod(container(env=[VOID_ENV], **caps(*added)))

    decision = evaluate(obj)

    assert decision.allowed
    assert decision.patch == ({"op": "add", "path": "/spec/affinity", "value": AFFINITY},)
    assert_second_pass_is_empty(evaluate, patched, obj, decision)


def test_a_sys_admin_sidecar_keeps_the_pod_off_gpu_nodes(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, patched: Patched
) -> None:
    sidecar = container("mounter", restartPolicy="Always", env=[VOID_ENV], **caps("SYS_ADMIN"))
    obj = pod(container(env=[VOID_ENV]), init=[sidecar])

    decision = evaluate(obj)

    assert decision.patch == ({"op": "add", "path": "/spec/affinity", "value": AFFINITY},)
    assert_second_pass_is_empty(evaluate, patched, obj, decision)


@pytest.mark.parametrize("kind", ["Deployment", "CronJob"])
def test_a_workload_template_with_all_capabilities_is_kept_off_gpu_nodes(
    pod: PodFactory, container: ContainerFactory, workload: WorkloadFactory, evaluate: Evaluate, patched: Patched, kind: str
) -> None:
    obj = workload(kind, pod(container(env=[VOID_ENV], **caps("ALL"))))
    spec = "/spec/template/spec" if kind == "Deployment" else "/spec/jobTemplate/spec/template/spec"

    decision = evaluate(obj)

    assert decision.patch == ({"op": "add", "path": f"{spec}/affinity", "value": AFFINITY},)
    assert_second_pass_is_empty(evaluate, patched, obj, decision)


@pytest.mark.parametrize("added", [("NET_BIND_SERVICE",), ("IPC_LOCK", "SYS_NICE"), ("SYS_PTRACE",), ("CHOWN",)])
def test_a_pod_adding_ordinary_capabilities_is_left_on_any_node(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, added: tuple[str, ...]
) -> None:
    decision = evaluate(pod(container(env=[VOID_ENV], **caps(*added))))

    assert decision.allowed
    assert decision.patch == ()
