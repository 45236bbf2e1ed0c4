"""GPU002: a pod that can reach a GPU node has only the privileges GPU nodes allow (the trust zone)."""

from __future__ import annotations

import pytest

from policies import model
from policies.trustzone import DEFAULT_ZONE
from tests.unit.policies.conftest import (
    ContainerFactory,
    Evaluate,
    Patched,
    PodFactory,
    ResultOf,
    ViolationMessages,
    WorkloadFactory,
    assert_second_pass_is_empty,
    required_node_affinity,
)

KEEP_OFF = [dict(e) for e in DEFAULT_ZONE.keep_off]

PREFIX = "GPU002: a pod that can reach a GPU node may have only the privileges GPU nodes allow: "
INSTEAD = (
    "; drop it, run the privileged part in a pod that asks for no GPU (it is kept off GPU nodes), "
    "or ask an admin to allow it for the namespace (trustZone)"
)
EPHEMERAL_PREFIX = "GPU009: privileged ephemeral containers cannot be added to pods on GPU nodes: "
EPHEMERAL_INSTEAD = (
    "; use a debug profile without privilege (kubectl debug --profile=general or baseline), "
    "or debug a copy of the pod on a node without GPUs"
)
TARGETS = "; the pod's nodeSelector or node affinity asks for GPU nodes"
OFF_GPU_NODES = required_node_affinity({"matchExpressions": KEEP_OFF})


def requests(resource: str) -> str:
    return f"; the pod requests the GPU resource {resource}"


def test_privileged_container_requesting_a_gpu_is_denied(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    decision = evaluate(pod(container(gpu={"nvidia.com/gpu": 1}, privileged=True)))

    assert not decision.allowed
    assert decision.denial_message == PREFIX + 'container "main" is privileged' + requests("nvidia.com/gpu") + INSTEAD


def test_privileged_init_container_in_a_pod_pinned_to_a_card_model_is_denied(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, violation_messages: ViolationMessages
) -> None:
    spec_pod = pod(
        container(),
        init=[container("setup", privileged=True)],
        nodeSelector={"aliyun.accelerator/nvidia_name": "Tesla-M40"},
    )

    decision = evaluate(spec_pod)

    assert not decision.allowed
    assert violation_messages(decision, "GPU002") == [PREFIX + 'init container "setup" is privileged' + TARGETS + INSTEAD]


def test_privileged_daemonset_preferring_gpu_nodes_is_denied(
    pod: PodFactory, container: ContainerFactory, workload: WorkloadFactory, evaluate: Evaluate
) -> None:
    preferring = pod(
        container(privileged=True),
        affinity={
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 1,
                        "preference": {"matchExpressions": [{"key": "ack.node.gpu.schedule", "operator": "Exists"}]},
                    }
                ]
            }
        },
    )

    decision = evaluate(workload("DaemonSet", preferring))

    assert not decision.allowed
    assert decision.denial_message == PREFIX + 'container "main" is privileged' + TARGETS + INSTEAD


def test_privileged_debug_container_added_to_a_gpu_pod_is_denied_by_gpu009(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    old = pod(container(gpu={"aliyun.com/gpu-mem": 2}))
    new = pod(container(gpu={"aliyun.com/gpu-mem": 2}), ephemeral=[container("debug", privileged=True)])

    decision = evaluate(new, operation="UPDATE", subresource="ephemeralcontainers", old=old)

    assert not decision.allowed
    assert decision.denial_message == (
        EPHEMERAL_PREFIX + 'ephemeral container "debug" is privileged' + requests("aliyun.com/gpu-mem") + EPHEMERAL_INSTEAD
    )


def test_unprivileged_gpu_pod_is_allowed(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf
) -> None:
    decision = evaluate(pod(container(gpu={"nvidia.com/gpu": 1}, privileged=False)))

    assert decision.allowed
    assert result(decision, "GPU002") is model.Result.PASS


def test_privileged_pod_without_gpus_is_allowed_and_kept_off_gpu_nodes(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, patched: Patched, result: ResultOf
) -> None:
    obj = pod(container(privileged=True))

    decision = evaluate(obj)

    assert decision.allowed
    assert result(decision, "GPU002") is model.Result.PASS
    assert decision.patch == (
        {"op": "add", "path": "/spec/affinity", "value": OFF_GPU_NODES},
        {"op": "add", "path": "/spec/containers/0/env", "value": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]},
    )
    assert decision.notices == (
        "GPU103: pods that use no GPU but have node power are kept off GPU nodes: kept off GPU nodes (required node "
        'affinity against every GPU node label): container "main" is privileged, which GPU nodes do not allow',
    )
    assert_second_pass_is_empty(evaluate, patched, obj, decision)


@pytest.mark.parametrize("action", ["warn", "audit", "off"])
def test_privileged_pod_without_gpus_is_denied_where_gpu103_does_not_keep_it_off_gpu_nodes(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, action: str
) -> None:
    decision = evaluate(pod(container(privileged=True)), config={"policies": {"GPU103": {"action": action}}})

    assert not decision.allowed
    assert decision.denial_message == (
        PREFIX + 'container "main" is privileged; nothing keeps the pod off GPU nodes (no required node affinity '
        "against every GPU node label)" + INSTEAD
    )


def test_privileged_pod_that_avoids_gpu_nodes_is_allowed(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    avoiding = pod(
        container(privileged=True),
        nodeSelector={"kubernetes.io/os": "linux"},
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "aliyun.accelerator/nvidia_name", "operator": "DoesNotExist"}]}
                    ]
                }
            }
        },
    )

    decision = evaluate(avoiding)

    assert decision.allowed


def caps(*added: object) -> dict[str, object]:
    return {"securityContext": {"capabilities": {"add": list(added)}}}


@pytest.mark.parametrize("spelled", ["SYS_ADMIN", "CAP_SYS_ADMIN", "sys_admin", "Cap_Sys_Admin", " SYS_ADMIN ", "ALL", "all"])
def test_a_gpu_container_adding_sys_admin_or_all_in_any_spelling_is_denied(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, spelled: str
) -> None:
    decision = evaluate(pod(container(gpu={"aliyun.com/gpu-mem": 2}, **caps("NET_BIND_SERVICE", spelled))))

    assert not decision.allowed
    assert (
        decision.denial_message
        == PREFIX + f'container "main" adds capability {spelled}' + requests("aliyun.com/gpu-mem") + INSTEAD
    )


@pytest.mark.parametrize(
    "capability", ["SYS_ADMINISTRATOR", "CAP_ALL_OF_THEM", "SYS_MODULE", "dac_read_search", "NET_ADMIN", "net_raw"]
)
def test_a_gpu_container_adding_a_capability_outside_the_allowlist_is_denied_whatever_its_name(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, capability: str
) -> None:
    decision = evaluate(pod(container(gpu={"nvidia.com/gpu": 1}, **caps(capability))))

    assert (
        decision.denial_message
        == PREFIX + f'container "main" adds capability {capability}' + requests("nvidia.com/gpu") + INSTEAD
    )


@pytest.mark.parametrize("capability", ["NET_BIND_SERVICE", "SYS_PTRACE", "CHOWN", "IPC_LOCK", "SYS_NICE", "SYS_RESOURCE"])
def test_a_gpu_container_adding_an_ordinary_capability_is_allowed(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, capability: str
) -> None:
    decision = evaluate(pod(container(gpu={"nvidia.com/gpu": 1}, **caps(capability))))

    assert decision.allowed
    assert result(decision, "GPU002") is model.Result.PASS


def test_dropping_sys_admin_is_not_adding_it(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf
) -> None:
    dropped = {"securityContext": {"capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}}

    decision = evaluate(pod(container(gpu={"nvidia.com/gpu": 1}, **dropped)))

    assert decision.allowed and result(decision, "GPU002") is model.Result.PASS


@pytest.mark.parametrize(
    "security_context",
    [
        {"capabilities": {"add": "SYS_ADMIN"}},
        {"capabilities": {"add": [None, 7, {"x": 1}]}},
        {"capabilities": "ALL"},
        "privileged",
    ],
)
def test_malformed_capabilities_are_ignored_without_an_error(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, security_context: object
) -> None:
    decision = evaluate(pod(container(gpu={"nvidia.com/gpu": 1}, securityContext=security_context)))

    assert result(decision, "GPU002") is model.Result.PASS


def test_a_sys_admin_sidecar_in_a_gpu_pod_is_denied(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, violation_messages: ViolationMessages
) -> None:
    sidecar = container("proxy", restartPolicy="Always", **caps("SYS_ADMIN"))

    decision = evaluate(pod(container(gpu={"nvidia.com/gpu": 1}), init=[sidecar]))

    assert violation_messages(decision, "GPU002") == [
        PREFIX + 'init container "proxy" adds capability SYS_ADMIN' + requests("nvidia.com/gpu") + INSTEAD
    ]


@pytest.mark.parametrize("kind", ["Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob", "ReplicationController"])
def test_a_workload_template_with_all_capabilities_on_a_gpu_pod_is_denied(
    pod: PodFactory, container: ContainerFactory, workload: WorkloadFactory, evaluate: Evaluate, kind: str
) -> None:
    decision = evaluate(workload(kind, pod(container(gpu={"aliyun.com/gpu": 2}, **caps("ALL")))))

    assert not decision.allowed
    assert decision.denial_message == PREFIX + 'container "main" adds capability ALL' + requests("aliyun.com/gpu") + INSTEAD


def test_a_sys_admin_debug_container_added_to_a_gpu_pod_is_denied_by_gpu009_only(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf
) -> None:
    old = pod(container(gpu={"nvidia.com/gpu": 1}))
    new = pod(container(gpu={"nvidia.com/gpu": 1}), ephemeral=[container("debugger", **caps("CAP_SYS_ADMIN"))])

    decision = evaluate(new, operation="UPDATE", subresource="ephemeralcontainers", old=old)

    assert not decision.allowed
    assert [v.policy for v in decision.violations] == ["GPU009"]
    assert decision.denial_message == (
        EPHEMERAL_PREFIX
        + 'ephemeral container "debugger" adds capability CAP_SYS_ADMIN'
        + requests("nvidia.com/gpu")
        + EPHEMERAL_INSTEAD
    )


def test_a_general_profile_debug_container_added_to_a_gpu_pod_is_allowed(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    old = pod(container(gpu={"nvidia.com/gpu": 1}))
    new = pod(container(gpu={"nvidia.com/gpu": 1}), ephemeral=[container("debugger", **caps("SYS_PTRACE"))])

    decision = evaluate(new, operation="UPDATE", subresource="ephemeralcontainers", old=old)

    assert decision.allowed and decision.violations == ()
