"""GPU102 on pods whose cards the scheduler extender picks: the annotations are read, not turned into node affinity.

The node labels summarise a node (most common model, smallest card), so node affinity built from
them would keep a `min-gpu-memory: 20Gi` pod off a node with 2 x 16 GB and 2 x 32 GB cards; the
extender judges each card instead (tests/unit/extender/test_card_model_placement.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from policies import model
from policies.builtin import gpu102_card_model
from tests.unit.policies.conftest import ContainerFactory, Evaluate, Patched, PodFactory, ResultOf, WorkloadFactory

ANNOTATIONS = {"gpu-admission.io/gpu-model": "Tesla V100-SXM2-16GB", "gpu-admission.io/min-gpu-memory": "20Gi"}
EXTENDER_REQUESTS = [
    {"aliyun.com/gpu-mem": 4},
    {"aliyun.com/gpu-mem": 4, "aliyun.com/gpu-core.percentage": 30},
    {"aliyun.com/gpu": 2},
]


def affinity_operations(decision: model.Decision) -> list[dict[str, Any]]:
    return [dict(op) for op in decision.patch if "affinity" in str(op["path"]) or "affinity" in str(op.get("value"))]


@pytest.mark.parametrize("resources", EXTENDER_REQUESTS, ids=["gpu-mem", "gpu-mem+core", "aliyun-gpu"])
def test_a_pod_the_extender_places_gets_no_card_model_affinity(
    pod: PodFactory,
    container: ContainerFactory,
    evaluate: Evaluate,
    patched: Patched,
    result: ResultOf,
    resources: dict[str, int],
) -> None:
    obj = pod(container(gpu=resources), annotations=ANNOTATIONS)

    decision = evaluate(obj)

    assert decision.allowed
    assert result(decision, "GPU102") is model.Result.PASS
    assert affinity_operations(decision) == []
    again = evaluate(patched(obj, decision.patch))
    assert again.allowed and again.patch == ()


def test_a_workload_template_the_extender_places_gets_no_card_model_affinity(
    pod: PodFactory, container: ContainerFactory, workload: WorkloadFactory, evaluate: Evaluate
) -> None:
    decision = evaluate(workload("Deployment", pod(container(gpu={"aliyun.com/gpu-mem": 4}), annotations=ANNOTATIONS)))

    assert decision.allowed
    assert affinity_operations(decision) == []


def test_an_unreadable_annotation_is_still_refused_on_a_pod_the_extender_places(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    obj = pod(container(gpu={"aliyun.com/gpu-mem": 4}), annotations={"gpu-admission.io/min-gpu-memory": "20G"})

    decision = evaluate(obj)

    assert not decision.allowed
    assert decision.denial_message == (
        "GPU102: card-model annotations constrain the card a pod gets: annotation gpu-admission.io/min-gpu-memory "
        "must be a positive amount of MiB such as 16384, got '20G'"
    )


def test_a_whole_card_nvidia_pod_still_gets_the_node_affinity(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    decision = evaluate(pod(container(gpu={"nvidia.com/gpu": 1}), annotations=ANNOTATIONS))

    assert decision.allowed
    (operation,) = affinity_operations(decision)
    terms = operation["value"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [
        {
            "matchExpressions": [
                {"key": "aliyun.accelerator/nvidia_name", "operator": "In", "values": ["Tesla-V100-SXM2-16GB"]},
                {"key": "gpu-admission.io/gpu-memory-mib", "operator": "Gt", "values": ["20479"]},
            ]
        }
    ]


@pytest.mark.parametrize(
    ("resources", "placed"),
    [
        ({"aliyun.com/gpu-mem": 1}, True),
        ({"aliyun.com/gpu": 1}, True),
        ({"nvidia.com/gpu": 1}, False),
        ({"nvidia.com/mig-1g.10gb": 1}, False),
        ({}, False),
    ],
)
def test_placed_by_extender_means_every_card_of_the_pod_is_the_extenders(resources: dict[str, int], placed: bool) -> None:
    spec = {"containers": [{"name": "main", "resources": {"limits": resources}}]}

    assert gpu102_card_model.placed_by_extender(spec) is placed


def test_a_pod_mixing_extender_and_device_plugin_cards_keeps_the_affinity() -> None:
    spec = {
        "containers": [
            {"name": "a", "resources": {"limits": {"aliyun.com/gpu-mem": 1}}},
            {"name": "b", "resources": {"limits": {"nvidia.com/gpu": 1}}},
        ]
    }

    assert gpu102_card_model.placed_by_extender(spec) is False
