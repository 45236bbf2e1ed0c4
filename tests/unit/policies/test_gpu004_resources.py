"""GPU004: GPU resources are well formed."""

from __future__ import annotations

import pytest

from policies import model

PREFIX = "GPU004: GPU resources must be positive integers in limits, of one family per pod: "


@pytest.mark.parametrize(
    "limits",
    [
        {"nvidia.com/gpu": 1},
        {"nvidia.com/gpu": "2"},
        {"aliyun.com/gpu-mem": 3},
        {"aliyun.com/gpu-mem": 4, "aliyun.com/gpu-core.percentage": 30},
        {"aliyun.com/gpu-mem": 4, "aliyun.com/gpu-core.percentage": 100},
        {"aliyun.com/gpu-mem": 4, "aliyun.com/gpu-count": 1},
        {"aliyun.com/gpu": 2},
    ],
)
def test_well_formed_gpu_limits_are_allowed(pod, container, evaluate, result, limits):
    decision = evaluate(pod(container(gpu=limits)))

    assert decision.allowed, decision.denial_message
    assert result(decision, "GPU004") is model.Result.PASS


def test_requests_equal_to_limits_are_allowed(pod, container, evaluate):
    decision = evaluate(
        pod(container(gpu={"nvidia.com/gpu": 1}, requests={"nvidia.com/gpu": "1", "cpu": "1"}))
    )

    assert decision.allowed


@pytest.mark.parametrize("value", [0, -1, "1.5", 1.5, "abc", True, None, "1Gi"])
def test_gpu_limit_that_is_not_a_positive_integer_is_denied(pod, container, evaluate, value):
    decision = evaluate(pod(container(gpu={"aliyun.com/gpu-mem": value})))

    assert not decision.allowed
    assert decision.denial_message == (
        PREFIX + f'container "main" sets aliyun.com/gpu-mem={value!r}; it must be a positive integer'
    )


def test_gpu_in_requests_only_is_denied(pod, container, evaluate):
    decision = evaluate(pod(container(requests={"nvidia.com/gpu": 1})))

    assert decision.denial_message == (
        PREFIX + 'container "main" sets nvidia.com/gpu in requests only; GPU resources belong in limits'
    )


def test_gpu_request_different_from_its_limit_is_denied(pod, container, evaluate):
    decision = evaluate(
        pod(container(gpu={"nvidia.com/gpu": 2}, requests={"nvidia.com/gpu": 1}))
    )

    assert decision.denial_message == (
        PREFIX + 'container "main" requests nvidia.com/gpu=1 but limits it to 2; they must be equal'
    )


def test_core_percentage_over_100_is_denied(pod, container, evaluate):
    decision = evaluate(
        pod(container(gpu={"aliyun.com/gpu-mem": 4, "aliyun.com/gpu-core.percentage": 150}))
    )

    assert decision.denial_message == (
        PREFIX + 'container "main" sets aliyun.com/gpu-core.percentage=150; it must be at most 100'
    )


@pytest.mark.parametrize("resource", ["aliyun.com/gpu-core.percentage", "aliyun.com/gpu-count"])
def test_core_percentage_or_count_without_gpu_memory_is_denied(pod, container, evaluate, resource):
    decision = evaluate(pod(container(gpu={resource: 1})))

    assert not decision.allowed
    assert PREFIX + f'container "main" sets {resource} without aliyun.com/gpu-mem' in (
        decision.denial_message
    )


def test_pod_mixing_resource_families_is_denied(pod, container, evaluate, violation_messages):
    mixed = pod(
        container("trainer", gpu={"nvidia.com/gpu": 1}),
        container("sidecar", gpu={"aliyun.com/gpu-mem": 2}),
    )

    decision = evaluate(mixed)

    assert violation_messages(decision, "GPU004") == [
        PREFIX + 'pod mixes resource families aliyun.com/gpu-mem (container "sidecar") and '
        'nvidia.com/gpu (container "trainer"); a node serves only one'
    ]


def test_memory_and_core_containers_in_one_pod_are_one_family(pod, container, evaluate):
    decision = evaluate(
        pod(
            container("a", gpu={"aliyun.com/gpu-mem": 2}),
            container("b", gpu={"aliyun.com/gpu-mem": 2, "aliyun.com/gpu-core.percentage": 50}),
        )
    )

    assert decision.allowed, decision.denial_message


def test_malformed_gpu_limit_in_a_job_init_container_is_denied(pod, container, workload, evaluate):
    job = workload("Job", pod(container(), init=[container("fetch", gpu={"aliyun.com/gpu": 0})]))

    decision = evaluate(job)

    assert decision.denial_message == (
        PREFIX + 'init container "fetch" sets aliyun.com/gpu=0; it must be a positive integer'
    )
