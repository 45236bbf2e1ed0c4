"""gpu: which modes serve which resource family, and what a pod asks for."""

from __future__ import annotations

from typing import Any

import pytest

from policies import gpu


def test_each_family_is_served_by_the_modes_of_the_seeds() -> None:
    assert gpu.modes_for(gpu.Family.EXCLUSIVE) == (gpu.Mode.DEFAULT,)
    assert gpu.modes_for(gpu.Family.SHARED) == (gpu.Mode.CGPU, gpu.Mode.SHARE, gpu.Mode.MPS, gpu.Mode.CORE_MEM)
    assert gpu.modes_for(gpu.Family.SHARED_CORE) == (gpu.Mode.CORE_MEM,)
    assert gpu.modes_for(gpu.Family.TOPOLOGY) == (gpu.Mode.TOPOLOGY,)


def test_labels_and_resources_are_spelled_as_in_the_seeds() -> None:
    assert gpu.SCHEDULE_LABEL == "ack.node.gpu.schedule"
    assert gpu.PLACEMENT_LABEL == "ack.node.gpu.placement"
    assert [str(m) for m in gpu.Mode] == ["default", "cgpu", "core_mem", "share", "mps", "topology"]
    assert [str(p) for p in gpu.Placement] == ["binpack", "spread"]
    assert gpu.CARD_NAME_LABEL == "aliyun.accelerator/nvidia_name"
    assert gpu.CARD_MEMORY_LABEL == "aliyun.accelerator/nvidia_mem"
    assert gpu.CARD_COUNT_LABEL == "aliyun.accelerator/nvidia_count"
    assert gpu.EXTENDER_RESOURCES == {"aliyun.com/gpu-mem", "aliyun.com/gpu-core.percentage", "aliyun.com/gpu"}


def test_our_own_keys_use_our_own_prefix() -> None:
    own = [
        gpu.GPU_MODEL_ANNOTATION,
        gpu.EXCLUDE_GPU_MODEL_ANNOTATION,
        gpu.MIN_GPU_MEMORY_ANNOTATION,
        gpu.CARD_MEMORY_MIB_LABEL,
    ]
    assert all(key.startswith(gpu.OWN_PREFIX) for key in own)


@pytest.mark.parametrize(
    ("containers", "family"),
    [
        ([{"resources": {"limits": {"nvidia.com/gpu": 1}}}], gpu.Family.EXCLUSIVE),
        ([{"resources": {"limits": {"aliyun.com/gpu-mem": 1}}}], gpu.Family.SHARED),
        (
            [
                {"resources": {"limits": {"aliyun.com/gpu-mem": 1}}},
                {"resources": {"limits": {"aliyun.com/gpu-mem": 1, "aliyun.com/gpu-core.percentage": 10}}},
            ],
            gpu.Family.SHARED_CORE,
        ),
        ([{"resources": {"limits": {"aliyun.com/gpu": 1}}}], gpu.Family.TOPOLOGY),
        ([{"resources": {"limits": {"cpu": 1}}}], None),
        (
            [{"resources": {"limits": {"nvidia.com/gpu": 1}}}, {"resources": {"limits": {"aliyun.com/gpu": 1}}}],
            None,
        ),
    ],
)
def test_pod_family_is_the_one_family_its_containers_ask_for(containers: list[dict[str, Any]], family: gpu.Family | None) -> None:
    assert gpu.pod_family({"containers": containers}) is family


def test_injected_mode_follows_the_configured_shared_default() -> None:
    assert gpu.injected_mode(gpu.Family.SHARED, shared_default=gpu.Mode.SHARE) is gpu.Mode.SHARE
    assert gpu.injected_mode(gpu.Family.SHARED_CORE, shared_default=gpu.Mode.SHARE) is gpu.Mode.CORE_MEM
    assert gpu.injected_mode(gpu.Family.TOPOLOGY, shared_default=gpu.Mode.CGPU) is gpu.Mode.TOPOLOGY
    assert gpu.injected_mode(gpu.Family.EXCLUSIVE, shared_default=gpu.Mode.CGPU) is None


def test_card_names_are_spelled_as_the_label_spells_them() -> None:
    assert gpu.card_name_label_value(" Tesla V100-SXM2-32GB ") == "Tesla-V100-SXM2-32GB"


@pytest.mark.parametrize(
    "name",
    ["nvidia.com/gpu", "nvidia.com/mig-1g.5gb", "nvidia.com/mig-2g.10gb", "nvidia.com/gpu.shared"],
)
def test_every_nvidia_device_plugin_resource_is_a_gpu_of_the_exclusive_family(name: str) -> None:
    assert gpu.is_gpu_resource(name)
    assert gpu.family_of(name) is gpu.Family.EXCLUSIVE


# Not every nvidia.com/ name is a GPU: the Network Operator's NICs, a KubeVirt PCI name (named in
# trustZone.gpuResources where a cluster wants it counted), and names that only look close.
@pytest.mark.parametrize(
    "name",
    [
        "cpu",
        "memory",
        "example.com/gpu",
        "nvidia.com",
        "amd.com/gpu",
        None,
        3,
        "nvidia.com/hostdev",
        "nvidia.com/rdma_shared_device_a",
        "nvidia.com/GA100_A100_PCIE_40GB",
        "nvidia.com/gpux",
        "nvidia.com/mig",
    ],
)
def test_other_resources_are_no_gpu(name: object) -> None:
    assert not gpu.is_gpu_resource(name)
    if isinstance(name, str):
        assert gpu.family_of(name) is None


def test_the_aliyun_resources_keep_their_families() -> None:
    assert gpu.family_of("aliyun.com/gpu-mem") is gpu.Family.SHARED
    assert gpu.family_of("aliyun.com/gpu-core.percentage") is gpu.Family.SHARED_CORE
    assert gpu.family_of("aliyun.com/gpu") is gpu.Family.TOPOLOGY
