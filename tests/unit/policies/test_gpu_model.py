"""The GPU model's node facts: a node's mode and placement from its labels, and what each mode advertises."""

from __future__ import annotations

import pytest

from policies import gpu


@pytest.mark.parametrize(
    ("node_labels", "expected"),
    [
        ({}, gpu.Mode.DEFAULT),  # an unlabelled node is a default node
        ({gpu.SCHEDULE_LABEL: "cgpu"}, gpu.Mode.CGPU),
        ({gpu.SCHEDULE_LABEL: "core_mem"}, gpu.Mode.CORE_MEM),
        ({gpu.SCHEDULE_LABEL: "topology"}, gpu.Mode.TOPOLOGY),
        ({gpu.SCHEDULE_LABEL: "default"}, gpu.Mode.DEFAULT),
        ({gpu.SCHEDULE_LABEL: "cgup"}, None),
        ({gpu.SCHEDULE_LABEL: "CGPU"}, None),  # label values are case-sensitive
        ({gpu.SCHEDULE_LABEL: ""}, None),  # present but empty: no mode, not the default
        ({gpu.SCHEDULE_LABEL: 3}, None),
    ],
)
def test_the_mode_comes_from_the_schedule_label_and_defaults_to_default(
    node_labels: dict[str, object], expected: gpu.Mode | None
) -> None:
    assert gpu.mode_of(node_labels) is expected


@pytest.mark.parametrize(
    ("node_labels", "expected"),
    [
        ({}, gpu.Placement.BINPACK),
        ({gpu.PLACEMENT_LABEL: "spread"}, gpu.Placement.SPREAD),
        ({gpu.PLACEMENT_LABEL: "binpack"}, gpu.Placement.BINPACK),
        ({gpu.PLACEMENT_LABEL: "scatter"}, gpu.Placement.BINPACK),
    ],
)
def test_placement_is_binpack_unless_the_label_says_spread(node_labels: dict[str, object], expected: gpu.Placement) -> None:
    assert gpu.placement_of(node_labels) is expected


def test_every_mode_advertises_what_its_families_ask_for_and_nothing_of_another_family() -> None:
    assert set(gpu.MODE_RESOURCES) == set(gpu.Mode)
    for mode, advertised in gpu.MODE_RESOURCES.items():
        for resource in advertised:
            family = gpu.family_of(resource)
            assert family is not None and mode in gpu.modes_for(family), (mode, resource)
    assert gpu.MODE_RESOURCES[gpu.Mode.CORE_MEM] == (
        gpu.Resource.GPU_MEM,
        gpu.Resource.GPU_COUNT,
        gpu.Resource.GPU_CORE_PERCENTAGE,
    )
    assert gpu.MODE_RESOURCES[gpu.Mode.DEFAULT] == (gpu.Resource.NVIDIA_GPU,)
