"""GPU217: a node with GPU capacity that no GPU node label marks is a hole in the trust zone (issue 33)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from policies import model, settings
from webhook.audit import findings, scan

NOW = datetime.datetime(2026, 6, 1, tzinfo=datetime.UTC).timestamp()


def node(name: str, labels: dict[str, str], capacity: dict[str, str]) -> dict[str, Any]:
    status = {"capacity": dict(capacity), "allocatable": dict(capacity)}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}, "status": status}


def gpu217(*nodes: dict[str, Any], config: dict[str, Any] | None = None) -> dict[str, findings.Finding]:
    audit = scan.run(scan.Inventory.of(nodes), settings=settings.from_mapping(config), now=NOW)
    return {f.subject.name: f for f in audit.findings if f.policy == "GPU217"}


GPU = {"nvidia.com/gpu": "8", "cpu": "64"}


@pytest.mark.parametrize(
    "labels",
    [
        {"nvidia.com/gpu.present": "true"},
        {"feature.node.kubernetes.io/pci-10de.present": "true"},
        {"cloud.google.com/gke-accelerator": "nvidia-l4"},
        {"kubernetes.azure.com/accelerator": "nvidia"},
        {"aliyun.accelerator/nvidia_name": "Tesla-T4"},
    ],
)
def test_a_gpu_node_labelled_by_any_known_stack_passes(labels: dict[str, str]) -> None:
    found = gpu217(node("gpu-0", labels, GPU))["gpu-0"]

    assert found.result is model.Result.PASS


def test_the_unlabelled_gpu_node_is_named_with_the_label_to_add() -> None:
    found = gpu217(node("bare-gpu", {"kubernetes.io/hostname": "bare-gpu"}, GPU), node("cpu-0", {}, {"cpu": "8"}))

    assert set(found) == {"bare-gpu"}
    failure = found["bare-gpu"]
    assert failure.result is model.Result.FAIL and failure.action is model.Action.ENFORCE
    assert "nvidia.com/gpu: 8" in failure.message
    assert "kubectl label node bare-gpu nvidia.com/gpu.present=true" in failure.message


def test_allocatable_alone_counts_and_a_zero_count_does_not() -> None:
    only_allocatable = node("a", {}, {})
    only_allocatable["status"]["allocatable"] = {"aliyun.com/gpu-mem": "30"}
    zero = node("z", {}, {"nvidia.com/gpu": "0"})

    found = gpu217(only_allocatable, zero)

    assert set(found) == {"a"} and found["a"].result is model.Result.FAIL


def test_a_label_from_the_settings_recognises_the_node_and_a_resource_from_the_settings_counts() -> None:
    pooled = node("pool-0", {"example.com/gpu-pool": "a"}, {"example.com/gpu": "4"})

    assert gpu217(pooled) == {}  # example.com/gpu is no GPU resource to the built-in list
    found = gpu217(pooled, config={"trustZone": {"gpuResources": ["example.com/gpu"]}})
    assert found["pool-0"].result is model.Result.FAIL
    found = gpu217(pooled, config={"trustZone": {"gpuResources": ["example.com/gpu"], "gpuNodeLabels": ["example.com/gpu-pool"]}})
    assert found["pool-0"].result is model.Result.PASS
