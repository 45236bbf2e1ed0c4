"""The card-model constraint: what GPU102's annotations ask of one card."""

from __future__ import annotations

from typing import Any, TypedDict

import pytest

from policies.gpu import cardmodel


class CardFacts(TypedDict):
    model: str
    memory_mib: int


V100_16 = CardFacts(model="Tesla-V100-SXM2-16GB", memory_mib=16160)
V100_32 = CardFacts(model="Tesla-V100-SXM2-32GB", memory_mib=32510)
UNKNOWN = CardFacts(model="", memory_mib=16384)  # a card counted from node capacity


def test_no_annotation_is_any_card() -> None:
    constraint = cardmodel.from_annotations({"team": "a"})

    assert constraint is cardmodel.ANY
    assert constraint.any
    assert constraint.allows(**V100_16) and constraint.allows(**UNKNOWN)


def test_models_are_spelled_as_the_label_spells_them_and_deduplicated() -> None:
    constraint = cardmodel.from_annotations({"gpu-admission.io/gpu-model": "Tesla V100-SXM2-16GB, Tesla-V100-SXM2-16GB,Tesla T4"})

    assert constraint.models == ("Tesla-V100-SXM2-16GB", "Tesla-T4")
    assert constraint.allows(**V100_16)
    assert not constraint.allows(**V100_32)


def test_an_excluded_model_refuses_that_card_only() -> None:
    constraint = cardmodel.from_annotations({"gpu-admission.io/exclude-gpu-model": "Tesla-V100-SXM2-16GB"})

    assert not constraint.allows(**V100_16)
    assert constraint.allows(**V100_32)


@pytest.mark.parametrize(("written", "mib"), [("20Gi", 20480), ("20480", 20480), ("512Mi", 512), ("2GiB", 2048)])
def test_min_gpu_memory_is_at_least_that_many_mib_per_card(written: str, mib: int) -> None:
    constraint = cardmodel.from_annotations({"gpu-admission.io/min-gpu-memory": written})

    assert constraint.min_memory_mib == mib
    assert constraint.allows(model="", memory_mib=mib)  # the memory floor needs no model
    assert not constraint.allows(model="", memory_mib=mib - 1)


def test_min_gpu_memory_of_20gi_takes_the_32gb_card_and_not_the_16gb_one() -> None:
    constraint = cardmodel.from_annotations({"gpu-admission.io/min-gpu-memory": "20Gi"})

    assert constraint.allows(**V100_32)
    assert not constraint.allows(**V100_16)


def test_a_card_of_unknown_model_meets_no_model_condition() -> None:
    wanted = cardmodel.from_annotations({"gpu-admission.io/gpu-model": "Tesla-T4"})
    excluded = cardmodel.from_annotations({"gpu-admission.io/exclude-gpu-model": "Tesla-T4"})

    assert not wanted.allows(**UNKNOWN)
    assert not excluded.allows(**UNKNOWN)  # it may be a T4: fail closed


@pytest.mark.parametrize(
    ("annotations", "problem"),
    [
        (
            {"gpu-admission.io/min-gpu-memory": "lots"},
            "annotation gpu-admission.io/min-gpu-memory must be a positive amount of MiB such as 16384, got 'lots'",
        ),
        (
            {"gpu-admission.io/min-gpu-memory": "0"},
            "annotation gpu-admission.io/min-gpu-memory must be a positive amount of MiB such as 16384, got '0'",
        ),
        ({"gpu-admission.io/gpu-model": 5}, "annotation gpu-admission.io/gpu-model must be a string, got 5"),
        ({"gpu-admission.io/exclude-gpu-model": " , "}, "annotation gpu-admission.io/exclude-gpu-model names no card model"),
    ],
)
def test_an_unreadable_annotation_is_a_problem_and_meets_no_card(annotations: dict[str, Any], problem: str) -> None:
    constraint = cardmodel.from_annotations(annotations)

    assert constraint.problems == (problem,)
    assert not constraint.any
    assert not constraint.allows(**V100_32)


def test_the_description_names_each_condition_and_its_annotation() -> None:
    constraint = cardmodel.from_annotations(
        {
            "gpu-admission.io/gpu-model": "Tesla-V100-SXM2-16GB",
            "gpu-admission.io/exclude-gpu-model": "Tesla-T4",
            "gpu-admission.io/min-gpu-memory": "8Gi",
        }
    )

    assert constraint.describe() == (
        "card model Tesla-V100-SXM2-16GB (gpu-admission.io/gpu-model), no card model Tesla-T4 "
        "(gpu-admission.io/exclude-gpu-model), at least 8192 MiB per card (gpu-admission.io/min-gpu-memory)"
    )


def test_node_requirements_are_the_label_expressions_gpu102_writes() -> None:
    constraint = cardmodel.from_annotations({"gpu-admission.io/gpu-model": "A10", "gpu-admission.io/min-gpu-memory": "16384"})

    assert list(cardmodel.node_requirements(constraint)) == [
        ("aliyun.accelerator/nvidia_name", "In", ("A10",)),
        ("gpu-admission.io/gpu-memory-mib", "Gt", ("16383",)),
    ]
