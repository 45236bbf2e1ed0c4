"""GPU101: GPU-sharing and topology pods are pinned to nodes of the matching scheduling mode."""

from __future__ import annotations

import pytest

from tests.unit.policies.conftest import (
    ContainerFactory,
    Evaluate,
    Patched,
    PodFactory,
    WorkloadFactory,
    assert_second_pass_is_empty,
)


@pytest.mark.parametrize(
    ("limits", "mode"),
    [
        ({"aliyun.com/gpu-mem": 3}, "cgpu"),
        ({"aliyun.com/gpu-mem": 3, "aliyun.com/gpu-core.percentage": 50}, "core_mem"),
        ({"aliyun.com/gpu": 2}, "topology"),
    ],
)
def test_pod_without_a_mode_selector_is_pinned_to_the_mode_serving_its_resource(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, patched: Patched, limits: dict[str, int], mode: str
) -> None:
    obj = pod(container(gpu=limits))

    decision = evaluate(obj)

    assert decision.allowed
    assert decision.patch == ({"op": "add", "path": "/spec/nodeSelector", "value": {"ack.node.gpu.schedule": mode}},)
    assert_second_pass_is_empty(evaluate, patched, obj, decision)


def test_mode_is_added_beside_an_existing_node_selector(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, patched: Patched
) -> None:
    obj = pod(container(gpu={"aliyun.com/gpu-mem": 3}), nodeSelector={"disktype": "ssd"})

    decision = evaluate(obj)

    assert decision.patch == ({"op": "add", "path": "/spec/nodeSelector/ack.node.gpu.schedule", "value": "cgpu"},)
    assert patched(obj, decision.patch)["spec"]["nodeSelector"] == {
        "disktype": "ssd",
        "ack.node.gpu.schedule": "cgpu",
    }
    assert_second_pass_is_empty(evaluate, patched, obj, decision)


def test_configured_shared_mode_is_used_for_gpu_memory(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    decision = evaluate(pod(container(gpu={"aliyun.com/gpu-mem": 3})), config={"defaultSharedMode": "share"})

    assert decision.patch == ({"op": "add", "path": "/spec/nodeSelector", "value": {"ack.node.gpu.schedule": "share"}},)


def test_null_node_selector_is_replaced(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, patched: Patched
) -> None:
    obj = pod(container(gpu={"aliyun.com/gpu": 1}), nodeSelector=None)

    decision = evaluate(obj)

    assert decision.patch == ({"op": "add", "path": "/spec/nodeSelector", "value": {"ack.node.gpu.schedule": "topology"}},)
    assert_second_pass_is_empty(evaluate, patched, obj, decision)


def test_whole_card_pods_get_no_mode_selector(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    decision = evaluate(pod(container(gpu={"nvidia.com/gpu": 1})))

    assert decision.allowed
    assert decision.patch == ()


def test_a_compatible_mode_the_user_chose_is_kept(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    decision = evaluate(pod(container(gpu={"aliyun.com/gpu-mem": 3}), nodeSelector={"ack.node.gpu.schedule": "mps"}))

    assert decision.allowed
    # No nodeSelector from GPU101; only GPU106's MPS memory limit for the mps pod.
    assert decision.patch == (
        {"op": "add", "path": "/spec/containers/0/env", "value": [{"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=3G"}]},
    )


def test_a_mode_chosen_by_required_affinity_is_kept(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "ack.node.gpu.schedule", "operator": "In", "values": ["share", "cgpu"]}]}
                ]
            }
        }
    }

    decision = evaluate(pod(container(gpu={"aliyun.com/gpu-mem": 3}), affinity=affinity))

    assert decision.allowed
    assert decision.patch == ()


def test_deployment_template_patch_points_into_the_workload(
    pod: PodFactory, container: ContainerFactory, workload: WorkloadFactory, evaluate: Evaluate, patched: Patched
) -> None:
    obj = workload("Deployment", pod(container(gpu={"aliyun.com/gpu-mem": 3})))

    decision = evaluate(obj)

    assert decision.patch == (
        {
            "op": "add",
            "path": "/spec/template/spec/nodeSelector",
            "value": {"ack.node.gpu.schedule": "cgpu"},
        },
    )
    assert_second_pass_is_empty(evaluate, patched, obj, decision)


def test_cronjob_template_patch_points_into_the_job_template(
    pod: PodFactory, container: ContainerFactory, workload: WorkloadFactory, evaluate: Evaluate
) -> None:
    decision = evaluate(workload("CronJob", pod(container(gpu={"aliyun.com/gpu": 4}))))

    assert decision.patch == (
        {
            "op": "add",
            "path": "/spec/jobTemplate/spec/template/spec/nodeSelector",
            "value": {"ack.node.gpu.schedule": "topology"},
        },
    )
