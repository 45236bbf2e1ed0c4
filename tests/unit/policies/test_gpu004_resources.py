"""GPU004: GPU resources are well formed."""

from __future__ import annotations

import pytest

from policies import model
from tests.unit.policies.conftest import ContainerFactory, Evaluate, PodFactory, ResultOf, ViolationMessages, WorkloadFactory

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
def test_well_formed_gpu_limits_are_allowed(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, limits: dict[str, int | str]
) -> None:
    decision = evaluate(pod(container(gpu=limits)))

    assert decision.allowed, decision.denial_message
    assert result(decision, "GPU004") is model.Result.PASS


def test_requests_equal_to_limits_are_allowed(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    decision = evaluate(pod(container(gpu={"nvidia.com/gpu": 1}, requests={"nvidia.com/gpu": "1", "cpu": "1"})))

    assert decision.allowed


# Judged as the cluster stores them: "1500m" is 1.5, "-2000m" is -2, "0Ki" and null are 0, "1n" is a
# nano; "1kk", "K" and "--1" are not quantities at all.
@pytest.mark.parametrize(
    "value", [0, -1, "1.5", 1.5, "abc", True, None, "1500m", "0.5", "-2000m", "0Ki", "1n", "1kk", "K", "--1", "", "1 000"]
)
def test_gpu_limit_that_is_not_a_positive_integer_is_denied(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, value: object
) -> None:
    decision = evaluate(pod(container(gpu={"aliyun.com/gpu-mem": value})))

    assert not decision.allowed
    assert decision.denial_message == (
        PREFIX + f'container "main" sets aliyun.com/gpu-mem={value!r}; it must be a positive integer'
    )


def test_gpu_in_requests_only_is_denied(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    decision = evaluate(pod(container(requests={"nvidia.com/gpu": 1})))

    assert decision.denial_message == (
        PREFIX + 'container "main" sets nvidia.com/gpu in requests only; GPU resources belong in limits'
    )


def test_gpu_request_different_from_its_limit_is_denied(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    decision = evaluate(pod(container(gpu={"nvidia.com/gpu": 2}, requests={"nvidia.com/gpu": 1})))

    assert decision.denial_message == (
        PREFIX + 'container "main" requests nvidia.com/gpu=1 but limits it to 2; they must be equal'
    )


def test_core_percentage_over_100_is_denied(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    decision = evaluate(pod(container(gpu={"aliyun.com/gpu-mem": 4, "aliyun.com/gpu-core.percentage": 150})))

    assert decision.denial_message == (
        PREFIX + 'container "main" sets aliyun.com/gpu-core.percentage=150; it must be at most 100'
    )


@pytest.mark.parametrize("resource", ["aliyun.com/gpu-core.percentage", "aliyun.com/gpu-count"])
def test_core_percentage_or_count_without_gpu_memory_is_denied(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, resource: str
) -> None:
    decision = evaluate(pod(container(gpu={resource: 1})))

    assert not decision.allowed
    assert PREFIX + f'container "main" sets {resource} without aliyun.com/gpu-mem' in (decision.denial_message)


def test_pod_mixing_resource_families_is_denied(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, violation_messages: ViolationMessages
) -> None:
    mixed = pod(
        container("trainer", gpu={"nvidia.com/gpu": 1}),
        container("sidecar", gpu={"aliyun.com/gpu-mem": 2}),
    )

    decision = evaluate(mixed)

    assert violation_messages(decision, "GPU004") == [
        PREFIX + 'pod mixes resource families aliyun.com/gpu-mem (container "sidecar") and '
        'nvidia.com/gpu (container "trainer"); a node serves only one'
    ]


def test_memory_and_core_containers_in_one_pod_are_one_family(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    decision = evaluate(
        pod(
            container("a", gpu={"aliyun.com/gpu-mem": 2}),
            container("b", gpu={"aliyun.com/gpu-mem": 2, "aliyun.com/gpu-core.percentage": 50}),
        )
    )

    assert decision.allowed, decision.denial_message


def test_malformed_gpu_limit_in_a_job_init_container_is_denied(
    pod: PodFactory, container: ContainerFactory, workload: WorkloadFactory, evaluate: Evaluate
) -> None:
    job = workload("Job", pod(container(), init=[container("fetch", gpu={"aliyun.com/gpu": 0})]))

    decision = evaluate(job)

    assert decision.denial_message == (PREFIX + 'init container "fetch" sets aliyun.com/gpu=0; it must be a positive integer')


@pytest.mark.parametrize("value", ["2000m", "+2", "2e0", "0.002k", " 2 ", "2.", 2.0, "02"])
def test_odd_spellings_of_a_whole_number_are_judged_by_their_value(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, value: str | float
) -> None:
    # kube-apiserver hands the webhook "2" (or keeps "+2", "2e0", "02"): the dry-run must agree.
    decision = evaluate(pod(container(gpu={"aliyun.com/gpu-mem": value})))

    assert decision.allowed, decision.denial_message
    assert result(decision, "GPU004") is model.Result.PASS


@pytest.mark.parametrize("value", ["1k", "1e3", "1000", "1Ki"])
def test_suffixed_counts_are_whole_numbers_too(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, value: str
) -> None:
    # 1k is 1000 GiB: well formed (no card has it, which the extender says); never read as 0 or 1.
    decision = evaluate(pod(container(gpu={"aliyun.com/gpu-mem": value})))

    assert decision.allowed, decision.denial_message


def test_a_suffixed_core_percentage_is_judged_as_its_value(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    decision = evaluate(pod(container(gpu={"aliyun.com/gpu-mem": 4, "aliyun.com/gpu-core.percentage": "1k"})))

    assert decision.denial_message == (
        PREFIX + 'container "main" sets aliyun.com/gpu-core.percentage=1000; it must be at most 100'
    )


def test_requests_equal_in_value_but_not_in_spelling_are_allowed(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    decision = evaluate(pod(container(gpu={"aliyun.com/gpu-mem": "2000m"}, requests={"aliyun.com/gpu-mem": "+2"})))

    assert decision.allowed, decision.denial_message


def test_requests_differing_in_value_are_denied_whatever_the_spelling(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    decision = evaluate(pod(container(gpu={"aliyun.com/gpu-mem": "2"}, requests={"aliyun.com/gpu-mem": "2001m"})))

    assert decision.denial_message == (
        PREFIX + "container \"main\" requests aliyun.com/gpu-mem='2001m' but limits it to 2; they must be equal"
    )


@pytest.mark.parametrize("other", ["nvidia.com/mig-1g.5gb", "nvidia.com/gpu.shared", "nvidia.com/mig-2g.10gb"])
def test_nvidia_device_plugin_resources_are_one_family(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, other: str
) -> None:
    decision = evaluate(pod(container("a", gpu={"nvidia.com/gpu": 1}), container("b", gpu={other: 1})))

    assert decision.allowed, decision.denial_message


def test_a_mig_slice_beside_gpu_memory_mixes_families(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, violation_messages: ViolationMessages
) -> None:
    decision = evaluate(
        pod(container("mig", gpu={"nvidia.com/mig-1g.5gb": 1}), container("shared", gpu={"aliyun.com/gpu-mem": 2}))
    )

    assert violation_messages(decision, "GPU004") == [
        PREFIX + 'pod mixes resource families aliyun.com/gpu-mem (container "shared") and '
        'nvidia.com/gpu (container "mig"); a node serves only one'
    ]


def test_a_mig_slice_must_be_a_positive_integer_in_limits(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    decision = evaluate(pod(container(gpu={"nvidia.com/mig-1g.5gb": "500m"})))

    assert decision.denial_message == (
        PREFIX + "container \"main\" sets nvidia.com/mig-1g.5gb='500m'; it must be a positive integer"
    )


@pytest.mark.parametrize("value", ["1e19", "10e18", "16Ei", "10e2147483646"])
def test_amounts_past_what_kubernetes_counts_exactly_are_denied(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, value: str
) -> None:
    # kube-apiserver's integer arithmetic overflows there (it accepts these, reading a milli-value
    # of 0 or a multiple of 1000 by chance); the webhook, seeing the written form, refuses them.
    decision = evaluate(pod(container(gpu={"aliyun.com/gpu-mem": value})))

    assert decision.denial_message == (
        PREFIX + f'container "main" sets aliyun.com/gpu-mem={value!r}, more than Kubernetes counts exactly '
        "(9223372036854775); ask for what a node has"
    )


def test_the_largest_amount_kubernetes_counts_exactly_is_well_formed(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    assert evaluate(pod(container(gpu={"aliyun.com/gpu-mem": "9223372036854775"}))).allowed


@pytest.mark.parametrize("value", ["999999999999999999", "9223372036854776", "99999999999999999999999"])
def test_amounts_the_apiservers_own_validation_refuses_are_denied(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, value: str
) -> None:
    # Their milli-value overflows to something not a multiple of 1000: "must be an integer".
    decision = evaluate(pod(container(gpu={"aliyun.com/gpu-mem": value})))

    assert decision.denial_message == (
        PREFIX + f'container "main" sets aliyun.com/gpu-mem={value!r}; it must be a positive integer'
    )


@pytest.mark.parametrize("value", ["1000E", "1000000000000000000000"])
def test_amounts_kubernetes_1_34_writes_back_as_1_are_judged_as_1(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, value: str
) -> None:
    # Written back without their exponent ("1"): the webhook sees 1 and allows it, and the
    # apiserver validates the re-decoded "1" after the mutation, so the dry-run allows it too.
    assert evaluate(pod(container(gpu={"aliyun.com/gpu-mem": value}))).allowed
