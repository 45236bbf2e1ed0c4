"""GPU106 sets MPS's per-client device-memory limit from aliyun.com/gpu-mem; GPU012 refuses a
tenant's own value for it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.policies.conftest import (
    ContainerFactory,
    Evaluate,
    Patched,
    PodFactory,
    WorkloadFactory,
    assert_second_pass_is_empty,
)

LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
MPS = {"ack.node.gpu.schedule": "mps"}


def limit_ops(decision: Any) -> list[dict[str, Any]]:
    return [op for op in decision.patch if LIMIT in str(op["value"])]


def test_an_mps_pod_gets_the_limit_of_its_gpu_mem_exactly_and_once(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, patched: Patched
) -> None:
    obj = pod(container(gpu={"aliyun.com/gpu-mem": 4}, env=[{"name": "LOG", "value": "1"}]), nodeSelector=MPS)
    decision = evaluate(obj)
    assert decision.allowed
    assert limit_ops(decision) == [{"op": "add", "path": "/spec/containers/0/env/-", "value": {"name": LIMIT, "value": "0=4G"}}]
    assert_second_pass_is_empty(evaluate, patched, obj, decision)


def test_each_gpu_mem_container_gets_its_own_and_others_none(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    obj = pod(
        container("a", gpu={"aliyun.com/gpu-mem": 2}),
        container("logger"),
        init=[container("warmup", gpu={"aliyun.com/gpu-mem": 3})],
        nodeSelector=MPS,
    )
    assert limit_ops(evaluate(obj)) == [
        {"op": "add", "path": "/spec/initContainers/0/env", "value": [{"name": LIMIT, "value": "0=3G"}]},
        {"op": "add", "path": "/spec/containers/0/env", "value": [{"name": LIMIT, "value": "0=2G"}]},
    ]


def test_defaultsharedmode_mps_limits_pods_without_a_mode_of_their_own(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    obj = pod(container(gpu={"aliyun.com/gpu-mem": 6}))
    assert limit_ops(evaluate(obj, config={"defaultSharedMode": "mps"})) == [
        {"op": "add", "path": "/spec/containers/0/env", "value": [{"name": LIMIT, "value": "0=6G"}]}
    ]
    assert limit_ops(evaluate(obj)) == []  # cgpu by default: cGPU isolates, no MPS limit


def test_a_choice_of_modes_that_includes_mps_or_nothing_pinning_the_pod_is_limited(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, patched: Patched
) -> None:
    either = {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "ack.node.gpu.schedule", "operator": "In", "values": ["cgpu", "mps"]}]}
            ]
        }
    }
    obj = pod(container(gpu={"aliyun.com/gpu-mem": 3}), affinity={"nodeAffinity": either})
    decision = evaluate(obj)
    assert limit_ops(decision) == [{"op": "add", "path": "/spec/containers/0/env", "value": [{"name": LIMIT, "value": "0=3G"}]}]
    assert_second_pass_is_empty(evaluate, patched, obj, decision)
    # GPU101 off: nothing keeps a pod without a mode off MPS nodes.
    unpinned = evaluate(pod(container(gpu={"aliyun.com/gpu-mem": 3})), config={"policies": {"GPU101": {"action": "off"}}})
    assert limit_ops(unpinned) == [{"op": "add", "path": "/spec/containers/0/env", "value": [{"name": LIMIT, "value": "0=3G"}]}]
    # And the tenant cannot raise it on such a pod either.
    raised = evaluate(
        pod(container(gpu={"aliyun.com/gpu-mem": 3}, env=[{"name": LIMIT, "value": "0=15G"}]), affinity={"nodeAffinity": either})
    )
    assert not raised.allowed and "GPU012" in raised.denial_message


@pytest.mark.parametrize("selector", [{"ack.node.gpu.schedule": "cgpu"}, {"ack.node.gpu.schedule": "share"}])
def test_pods_on_other_modes_and_whole_card_pods_get_nothing(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, selector: dict[str, str]
) -> None:
    assert limit_ops(evaluate(pod(container(gpu={"aliyun.com/gpu-mem": 4}), nodeSelector=selector))) == []
    assert limit_ops(evaluate(pod(container(gpu={"nvidia.com/gpu": 1})), config={"defaultSharedMode": "mps"})) == []


def test_workload_templates_are_limited_too(
    workload: WorkloadFactory, pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    obj = workload("Deployment", pod(container(gpu={"aliyun.com/gpu-mem": 1}), nodeSelector=MPS))
    assert limit_ops(evaluate(obj)) == [
        {"op": "add", "path": "/spec/template/spec/containers/0/env", "value": [{"name": LIMIT, "value": "0=1G"}]}
    ]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"name": LIMIT, "value": "0=15G"}, f"sets {LIMIT}=0=15G; the webhook sets it to 0=4G"),
        ({"name": LIMIT, "value": "0=4G,1=4G"}, f"sets {LIMIT}=0=4G,1=4G"),
        ({"name": LIMIT, "value": ""}, f"sets {LIMIT}="),
        ({"name": LIMIT, "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}, "from valueFrom"),
    ],
)
def test_a_tenants_own_value_is_refused(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, entry: dict[str, Any], message: str
) -> None:
    decision = evaluate(pod(container(gpu={"aliyun.com/gpu-mem": 4}, env=[entry]), nodeSelector=MPS))
    assert not decision.allowed
    assert "GPU012" in decision.denial_message and message in decision.denial_message


def test_the_exact_value_is_admitted_and_containers_without_a_limit_due_are_not_judged(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    same = evaluate(pod(container(gpu={"aliyun.com/gpu-mem": 4}, env=[{"name": LIMIT, "value": "0=4G"}]), nodeSelector=MPS))
    assert same.allowed and limit_ops(same) == []
    # A container without a GPU gets no card (and NVIDIA_VISIBLE_DEVICES=void): its own limit limits
    # nothing, so it is not judged, and a pod without GPU resources stays unrefusable (ordinary).
    helper = evaluate(
        pod(
            container(gpu={"aliyun.com/gpu-mem": 4}),
            container("helper", env=[{"name": LIMIT, "value": "0=1G"}]),
            nodeSelector=MPS,
        )
    )
    assert helper.allowed
    plain = evaluate(pod(container(env=[{"name": LIMIT, "value": "0=64G"}])))
    assert plain.allowed and limit_ops(plain) == []
    # Off MPS the variable does nothing: a cGPU pod's own value is not judged either.
    cgpu = evaluate(
        pod(
            container(gpu={"aliyun.com/gpu-mem": 4}, env=[{"name": LIMIT, "value": "0=8G"}]),
            nodeSelector={"ack.node.gpu.schedule": "cgpu"},
        )
    )
    assert cgpu.allowed
