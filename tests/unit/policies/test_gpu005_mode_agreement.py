"""GPU005: the ack.node.gpu.schedule a pod selects must serve the GPU resource it requests."""

from __future__ import annotations

from typing import Any

import pytest

from policies import model
from tests.unit.policies.conftest import ContainerFactory, Evaluate, PodFactory, ResultOf, WorkloadFactory

PREFIX = "GPU005: the GPU scheduling mode a pod selects must serve the GPU resource it requests: "


def required_affinity(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": list(term)} for term in terms]
            }
        }
    }


def on_schedule(operator: str, *values: str) -> dict[str, Any]:
    expression: dict[str, Any] = {"key": "ack.node.gpu.schedule", "operator": operator}
    if values:
        expression["values"] = list(values)
    return expression


def test_gpu_memory_pod_selecting_topology_nodes_is_denied(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    decision = evaluate(
        pod(
            container(gpu={"aliyun.com/gpu-mem": 3}),
            nodeSelector={"ack.node.gpu.schedule": "topology"},
        )
    )

    assert not decision.allowed
    assert decision.denial_message == (
        PREFIX + "the pod requests aliyun.com/gpu-mem but its nodeSelector "
        "ack.node.gpu.schedule=topology allows topology; ack.node.gpu.schedule must be one of "
        "cgpu, share, mps, core_mem"
    )


def test_whole_card_pod_selecting_a_shared_mode_is_denied_naming_default(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    decision = evaluate(pod(container(gpu={"nvidia.com/gpu": 1}), nodeSelector={"ack.node.gpu.schedule": "cgpu"}))

    assert decision.denial_message.endswith("ack.node.gpu.schedule must be one of default")


def test_core_percentage_pod_selecting_cgpu_is_denied_naming_core_mem(
    pod: PodFactory, container: ContainerFactory, workload: WorkloadFactory, evaluate: Evaluate
) -> None:
    statefulset = workload(
        "StatefulSet",
        pod(
            container(gpu={"aliyun.com/gpu-mem": 4, "aliyun.com/gpu-core.percentage": 30}),
            nodeSelector={"ack.node.gpu.schedule": "cgpu"},
        ),
    )

    decision = evaluate(statefulset)

    assert decision.denial_message == (
        PREFIX + "the pod requests aliyun.com/gpu-mem+aliyun.com/gpu-core.percentage but its "
        "nodeSelector ack.node.gpu.schedule=cgpu allows cgpu; ack.node.gpu.schedule must be one "
        "of core_mem"
    )


def test_topology_pod_whose_required_affinity_excludes_topology_is_denied(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    decision = evaluate(
        pod(
            container(gpu={"aliyun.com/gpu": 2}),
            affinity=required_affinity([on_schedule("NotIn", "topology")]),
        )
    )

    assert decision.denial_message == (
        PREFIX + "the pod requests aliyun.com/gpu but its required node affinity on "
        "ack.node.gpu.schedule allows cgpu, core_mem, default, mps, nodes without the label, "
        "share; ack.node.gpu.schedule must be one of topology"
    )


def test_every_ored_term_on_a_wrong_mode_is_denied(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    decision = evaluate(
        pod(
            container(gpu={"aliyun.com/gpu-mem": 2}),
            affinity=required_affinity([on_schedule("In", "topology")], [on_schedule("Exists"), on_schedule("In", "default")]),
        )
    )

    assert not decision.allowed
    assert "allows default, topology;" in decision.denial_message


@pytest.mark.parametrize(
    ("limits", "affinity"),
    [
        ({"aliyun.com/gpu": 2}, required_affinity([on_schedule("In", "topology")])),
        ({"aliyun.com/gpu-mem": 2}, required_affinity([on_schedule("In", "cgpu", "topology")])),
        (
            {"aliyun.com/gpu-mem": 2},
            required_affinity([on_schedule("In", "topology")], [on_schedule("In", "mps")]),
        ),
        ({"nvidia.com/gpu": 1}, required_affinity([on_schedule("DoesNotExist")])),
        ({"nvidia.com/gpu": 1}, required_affinity([on_schedule("NotIn", "cgpu", "share")])),
    ],
)
def test_required_affinity_allowing_a_serving_mode_is_allowed(
    pod: PodFactory,
    container: ContainerFactory,
    evaluate: Evaluate,
    result: ResultOf,
    limits: dict[str, int],
    affinity: dict[str, Any],
) -> None:
    decision = evaluate(pod(container(gpu=limits), affinity=affinity))

    assert decision.allowed, decision.denial_message
    assert result(decision, "GPU005") is model.Result.PASS


def test_gpu_memory_pod_selecting_share_is_allowed(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    decision = evaluate(pod(container(gpu={"aliyun.com/gpu-mem": 2}), nodeSelector={"ack.node.gpu.schedule": "share"}))

    assert decision.allowed


def test_pod_without_gpus_may_select_any_mode(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    decision = evaluate(pod(container(), nodeSelector={"ack.node.gpu.schedule": "topology"}))

    assert decision.allowed
