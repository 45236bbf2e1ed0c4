"""GPU102: card-model annotations constrain the card a pod gets (node affinity where the extender does not pick it)."""

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
    required_node_affinity,
)

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
TERMS = f"/spec/affinity/nodeAffinity/{REQUIRED}/nodeSelectorTerms"


def gpu_pod(pod: PodFactory, container: ContainerFactory, annotations: dict[str, str] | None, **spec: Any) -> dict[str, Any]:
    return pod(container(gpu={"nvidia.com/gpu": 1}), annotations=annotations, **spec)


def test_gpu_model_annotation_becomes_required_in_affinity(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, patched: Patched
) -> None:
    obj = gpu_pod(pod, container, {"gpu-admission.io/gpu-model": "Tesla-V100-SXM2-32GB, Tesla T4"})

    decision = evaluate(obj)

    assert decision.allowed
    assert decision.patch == (
        {
            "op": "add",
            "path": "/spec/affinity",
            "value": {
                "nodeAffinity": {
                    REQUIRED: {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "aliyun.accelerator/nvidia_name",
                                        "operator": "In",
                                        "values": ["Tesla-V100-SXM2-32GB", "Tesla-T4"],
                                    }
                                ]
                            }
                        ]
                    }
                }
            },
        },
    )
    assert_second_pass_is_empty(evaluate, patched, obj, decision)


def test_all_three_annotations_become_one_term_in_order(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, patched: Patched
) -> None:
    obj = gpu_pod(
        pod,
        container,
        {
            "gpu-admission.io/gpu-model": "A100",
            "gpu-admission.io/exclude-gpu-model": "Tesla-M40",
            "gpu-admission.io/min-gpu-memory": "16Gi",
        },
    )

    decision = evaluate(obj)

    term = decision.patch[0]["value"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"][0]
    assert term == {
        "matchExpressions": [
            {"key": "aliyun.accelerator/nvidia_name", "operator": "In", "values": ["A100"]},
            {"key": "aliyun.accelerator/nvidia_name", "operator": "NotIn", "values": ["Tesla-M40"]},
            {"key": "gpu-admission.io/gpu-memory-mib", "operator": "Gt", "values": ["16383"]},
        ]
    }
    assert_second_pass_is_empty(evaluate, patched, obj, decision)


@pytest.mark.parametrize(("written", "gt"), [("16384", "16383"), ("1", "0"), ("2GiB", "2047"), ("512Mi", "511")])
def test_min_gpu_memory_means_at_least(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, written: str, gt: str
) -> None:
    decision = evaluate(gpu_pod(pod, container, {"gpu-admission.io/min-gpu-memory": written}))

    expression = decision.patch[0]["value"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"][0]["matchExpressions"][0]
    assert expression == {"key": "gpu-admission.io/gpu-memory-mib", "operator": "Gt", "values": [gt]}


def test_expressions_are_added_to_every_existing_term(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, patched: Patched
) -> None:
    affinity = required_node_affinity(
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
    )
    obj = gpu_pod(pod, container, {"gpu-admission.io/exclude-gpu-model": "Tesla-M40"}, affinity=affinity)
    not_in = {"key": "aliyun.accelerator/nvidia_name", "operator": "NotIn", "values": ["Tesla-M40"]}

    decision = evaluate(obj)

    assert decision.patch == (
        {"op": "add", "path": f"{TERMS}/0/matchExpressions/-", "value": not_in},
        {"op": "add", "path": f"{TERMS}/1/matchExpressions", "value": [not_in]},
    )
    assert_second_pass_is_empty(evaluate, patched, obj, decision)


def test_node_affinity_is_added_beside_other_affinity(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, patched: Patched
) -> None:
    anti: dict[str, Any] = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    obj = gpu_pod(pod, container, {"gpu-admission.io/gpu-model": "A10"}, affinity=anti)

    decision = evaluate(obj)

    assert decision.patch == (
        {
            "op": "add",
            "path": "/spec/affinity/nodeAffinity",
            "value": {
                REQUIRED: {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "aliyun.accelerator/nvidia_name", "operator": "In", "values": ["A10"]}]}
                    ]
                }
            },
        },
    )
    assert_second_pass_is_empty(evaluate, patched, obj, decision)


def test_replicaset_template_annotations_drive_the_template_affinity(
    pod: PodFactory, container: ContainerFactory, workload: WorkloadFactory, evaluate: Evaluate
) -> None:
    obj = workload("ReplicaSet", gpu_pod(pod, container, {"gpu-admission.io/gpu-model": "A10"}))

    decision = evaluate(obj)

    assert [op["path"] for op in decision.patch] == ["/spec/template/spec/affinity"]


@pytest.mark.parametrize(
    ("annotations", "detail"),
    [
        (
            {"gpu-admission.io/min-gpu-memory": "lots"},
            "annotation gpu-admission.io/min-gpu-memory must be a positive amount of MiB such as 16384, got 'lots'",
        ),
        (
            {"gpu-admission.io/min-gpu-memory": "0"},
            "annotation gpu-admission.io/min-gpu-memory must be a positive amount of MiB such as 16384, got '0'",
        ),
        ({"gpu-admission.io/gpu-model": " , "}, "annotation gpu-admission.io/gpu-model names no card model"),
        ({"gpu-admission.io/exclude-gpu-model": "(/)"}, "annotation gpu-admission.io/exclude-gpu-model names no card model"),
    ],
)
def test_annotation_that_cannot_be_honoured_is_denied(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, annotations: dict[str, str], detail: str
) -> None:
    decision = evaluate(gpu_pod(pod, container, annotations))

    assert not decision.allowed
    assert decision.patch == ()
    assert decision.denial_message == ("GPU102: card-model annotations constrain the card a pod gets: " + detail)


def test_annotation_that_cannot_be_honoured_only_warns_under_warn(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    decision = evaluate(
        gpu_pod(pod, container, {"gpu-admission.io/min-gpu-memory": "lots"}),
        config={"policies": {"GPU102": {"action": "warn"}}},
    )

    assert decision.allowed
    assert len(decision.warnings) == 1
    assert decision.warnings[0].startswith("GPU102: ")


def test_pod_without_card_annotations_gets_no_affinity(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    decision = evaluate(gpu_pod(pod, container, {"team": "vision"}))

    assert decision.patch == ()


def test_card_models_are_spelled_as_the_labeler_writes_them(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    obj = gpu_pod(pod, container, {"gpu-admission.io/gpu-model": "NVIDIA TITAN X (Pascal)"})

    decision = evaluate(obj)

    [op] = decision.patch
    [term] = op["value"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]
    assert term["matchExpressions"][0]["values"] == ["NVIDIA-TITAN-X-Pascal"]
