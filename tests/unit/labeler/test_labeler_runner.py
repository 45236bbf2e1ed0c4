"""The labeling loop against a fake apiserver: what each pass writes, keeps and logs."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest

from policies import gpu
from webhook.kube import errors as kube_errors
from webhook.labeler import inventory, nvml, runner

InventoryFactory = Callable[..., inventory.Inventory]
NODE = "gpu-0"


class Source:
    """Hands out the queued results in turn (the last one repeats); exceptions are raised."""

    def __init__(self, *results: inventory.Inventory | Exception) -> None:
        self.results = list(results)
        self.calls = 0

    def __call__(self) -> inventory.Inventory:
        self.calls += 1
        result = self.results.pop(0) if len(self.results) > 1 else self.results[0]
        if isinstance(result, Exception):
            raise result
        return result


@pytest.fixture
def nodes(fake_nodes: Any, node: Callable[..., dict[str, Any]]) -> Any:
    return fake_nodes(node(NODE, labels={gpu.SCHEDULE_LABEL: "cgpu"}))


def make(source: Source, nodes: Any, **options: Any) -> runner.Runner:
    return runner.Runner(source=source, nodes=nodes, options=runner.Options(node_name=NODE, **{"advertise": True, **options}))


def test_the_first_pass_labels_the_node_and_advertises_its_mode(nodes: Any, cards_of: InventoryFactory) -> None:
    loop = make(Source(cards_of(4)), nodes)
    assert loop.step() is runner.Outcome.CHANGED
    assert nodes.labels(NODE)[gpu.CARD_NAME_LABEL] == "Tesla-T4"
    assert nodes.labels(NODE)[gpu.CARD_COUNT_LABEL] == "4"
    assert nodes.capacity(NODE)["aliyun.com/gpu-mem"] == "60"
    assert nodes.capacity(NODE)["aliyun.com/gpu-count"] == "4"
    assert nodes.objects[NODE]["status"]["allocatable"]["aliyun.com/gpu-mem"] == "60"


def test_a_pass_with_nothing_new_patches_nothing(nodes: Any, cards_of: InventoryFactory) -> None:
    loop = make(Source(cards_of(4)), nodes)
    loop.step()
    patches, status_patches = len(nodes.patches), len(nodes.status_patches)
    assert loop.step() is runner.Outcome.UNCHANGED
    assert (len(nodes.patches), len(nodes.status_patches)) == (patches, status_patches)


def test_a_mode_change_is_advertised_at_the_next_pass(nodes: Any, cards_of: InventoryFactory) -> None:
    loop = make(Source(cards_of(4)), nodes)
    loop.step()
    nodes.set_label(NODE, gpu.SCHEDULE_LABEL, "topology")
    assert loop.step() is runner.Outcome.CHANGED
    capacity = nodes.capacity(NODE)
    assert capacity["aliyun.com/gpu"] == "4"
    assert capacity["aliyun.com/gpu-mem"] == "0"
    assert capacity["aliyun.com/gpu-count"] == "0"
    assert capacity["nvidia.com/gpu"] == "0"


def test_without_advertise_capacity_is_never_touched(nodes: Any, cards_of: InventoryFactory) -> None:
    make(Source(cards_of(4)), nodes, advertise=False).step()
    assert nodes.status_patches == []
    assert "aliyun.com/gpu-mem" not in nodes.capacity(NODE)


def test_default_mode_leaves_nvidia_gpu_to_the_device_plugin(
    fake_nodes: Any, node: Callable[..., Any], cards_of: InventoryFactory
) -> None:
    nodes = fake_nodes(node(NODE, capacity={"nvidia.com/gpu": "4", "aliyun.com/gpu-mem": "60"}))
    make(Source(cards_of(4)), nodes).step()
    assert nodes.capacity(NODE)["nvidia.com/gpu"] == "4"
    assert nodes.capacity(NODE)["aliyun.com/gpu-mem"] == "0"


def test_an_unknown_mode_leaves_capacity_alone_and_says_so_once(
    fake_nodes: Any, node: Callable[..., Any], cards_of: InventoryFactory, caplog: pytest.LogCaptureFixture
) -> None:
    nodes = fake_nodes(node(NODE, labels={gpu.SCHEDULE_LABEL: "cgup"}))
    loop = make(Source(cards_of(4)), nodes)
    with caplog.at_level(logging.WARNING):
        loop.step()
        loop.step()
    assert nodes.status_patches == []
    assert nodes.labels(NODE)[gpu.CARD_COUNT_LABEL] == "4"
    assert sum('ack.node.gpu.schedule="cgup", which is no GPU mode' in r.getMessage() for r in caplog.records) == 1


def test_a_removed_card_updates_the_count_and_inventory(nodes: Any, cards_of: InventoryFactory) -> None:
    loop = make(Source(cards_of(4), cards_of(3)), nodes)
    loop.step()
    loop.step()
    assert nodes.labels(NODE)[gpu.CARD_COUNT_LABEL] == "3"
    assert nodes.capacity(NODE)["aliyun.com/gpu-mem"] == "45"
    assert '"index":3' not in nodes.annotations(NODE)[gpu.INVENTORY_ANNOTATION]


def test_a_transient_read_error_keeps_the_last_good_labels(
    nodes: Any, cards_of: InventoryFactory, caplog: pytest.LogCaptureFixture
) -> None:
    loop = make(Source(cards_of(4), nvml.ReadError("nvmlDeviceGetMemoryInfo: GPU is lost"), cards_of(4)), nodes)
    loop.step()
    before = dict(nodes.labels(NODE))
    patches = len(nodes.patches)
    with caplog.at_level(logging.INFO):
        assert loop.step() is runner.Outcome.READ_FAILED
        assert nodes.labels(NODE) == before
        assert len(nodes.patches) == patches
        assert loop.step() is runner.Outcome.UNCHANGED
    messages = [r.getMessage() for r in caplog.records]
    assert any("GPU is lost" in m and "keeping the last good labels" in m for m in messages)
    assert any("recovered" in m for m in messages)


def test_a_mode_change_during_a_read_error_is_advertised_from_the_last_good_inventory(
    nodes: Any, cards_of: InventoryFactory
) -> None:
    loop = make(Source(cards_of(4), nvml.ReadError("timeout")), nodes)
    loop.step()
    nodes.set_label(NODE, gpu.SCHEDULE_LABEL, "core_mem")
    assert loop.step() is runner.Outcome.READ_FAILED
    assert nodes.capacity(NODE)["aliyun.com/gpu-core.percentage"] == "400"


def test_a_read_error_before_any_good_read_writes_nothing(nodes: Any) -> None:
    loop = make(Source(nvml.ReadError("nvmlInit: Unknown Error")), nodes)
    assert loop.step() is runner.Outcome.READ_FAILED
    assert nodes.patches == [] and nodes.status_patches == []


def test_a_broken_inventory_file_counts_as_a_read_error(nodes: Any, cards_of: InventoryFactory) -> None:
    loop = make(Source(cards_of(2), inventory.InventoryError("inv.yaml: invalid YAML")), nodes)
    loop.step()
    assert loop.step() is runner.Outcome.READ_FAILED
    assert nodes.labels(NODE)[gpu.CARD_COUNT_LABEL] == "2"


def test_without_nvml_it_writes_nothing_logs_one_line_and_keeps_checking(
    nodes: Any, cards_of: InventoryFactory, caplog: pytest.LogCaptureFixture
) -> None:
    source = Source(*[nvml.Unavailable("NVML Shared Library Not Found")] * 3, cards_of(2))
    loop = make(source, nodes)
    with caplog.at_level(logging.INFO, logger="webhook.labeler"):
        assert [loop.step() for _ in range(3)] == [runner.Outcome.NO_NVML] * 3
        assert nodes.patches == [] and nodes.status_patches == []
        assert loop.step() is runner.Outcome.CHANGED  # the driver came up: no restart needed
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "NVML is not available on this node (NVML Shared Library Not Found)" in warnings[0]
    assert source.calls == 4
    assert nodes.labels(NODE)[gpu.CARD_COUNT_LABEL] == "2"


def test_nvml_vanishing_after_a_good_read_keeps_the_labels(nodes: Any, cards_of: InventoryFactory) -> None:
    loop = make(Source(cards_of(2), nvml.Unavailable("Driver Not Loaded")), nodes)
    loop.step()
    assert loop.step() is runner.Outcome.READ_FAILED
    assert nodes.labels(NODE)[gpu.CARD_COUNT_LABEL] == "2"


def test_a_missing_node_is_reported_and_looked_for_again(
    fake_nodes: Any, node: Callable[..., Any], cards_of: InventoryFactory
) -> None:
    nodes = fake_nodes()
    loop = make(Source(cards_of(1)), nodes)
    assert loop.step() is runner.Outcome.NODE_MISSING
    nodes.objects[NODE] = node(NODE)
    assert loop.step() is runner.Outcome.CHANGED


def test_an_apiserver_failure_is_retried_at_the_next_pass(nodes: Any, cards_of: InventoryFactory) -> None:
    nodes.fail_next.append(kube_errors.ServerError("get node gpu-0: 503 Service Unavailable: etcd", status=503))
    loop = make(Source(cards_of(1)), nodes)
    assert loop.step() is runner.Outcome.API_FAILED
    assert loop.step() is runner.Outcome.CHANGED


def test_a_concurrent_change_is_read_again_before_patching(nodes: Any, cards_of: InventoryFactory) -> None:
    nodes.conflicts = 2
    loop = make(Source(cards_of(1)), nodes)
    assert loop.step() is runner.Outcome.CHANGED
    assert nodes.labels(NODE)[gpu.CARD_COUNT_LABEL] == "1"


def test_endless_conflicts_give_up_for_this_pass(nodes: Any, cards_of: InventoryFactory) -> None:
    nodes.conflicts = runner.CONFLICT_RETRIES
    assert make(Source(cards_of(1)), nodes).step() is runner.Outcome.API_FAILED


def test_foreign_aliyun_labels_are_left_alone_and_that_is_said_once(
    fake_nodes: Any, node: Callable[..., Any], cards_of: InventoryFactory, caplog: pytest.LogCaptureFixture
) -> None:
    nodes = fake_nodes(node(NODE, labels={gpu.CARD_NAME_LABEL: "Tesla-M40", gpu.CARD_COUNT_LABEL: "8"}))
    loop = make(Source(cards_of(4)), nodes)
    with caplog.at_level(logging.WARNING):
        loop.step()
        loop.step()
    assert nodes.labels(NODE)[gpu.CARD_NAME_LABEL] == "Tesla-M40"
    assert nodes.labels(NODE)[gpu.CARD_COUNT_LABEL] == "8"
    assert gpu.CARD_MEMORY_LABEL not in nodes.labels(NODE)
    assert nodes.labels(NODE)[gpu.CARD_MEMORY_MIB_LABEL] == "15360"
    assert sum("--take-over" in r.getMessage() for r in caplog.records) == 1


def test_take_over_replaces_foreign_aliyun_labels(fake_nodes: Any, node: Callable[..., Any], cards_of: InventoryFactory) -> None:
    nodes = fake_nodes(node(NODE, labels={gpu.CARD_NAME_LABEL: "Tesla-M40", gpu.CARD_COUNT_LABEL: "8"}))
    make(Source(cards_of(4)), nodes, take_over=True).step()
    assert nodes.labels(NODE)[gpu.CARD_NAME_LABEL] == "Tesla-T4"
    assert nodes.labels(NODE)[gpu.CARD_COUNT_LABEL] == "4"


def test_run_passes_until_stopped(nodes: Any, cards_of: InventoryFactory) -> None:
    stop = threading.Event()
    inv = cards_of(1)

    def source() -> inventory.Inventory:
        if loop.passes >= 2:
            stop.set()
        return inv

    loop = runner.Runner(source=source, nodes=nodes, options=runner.Options(node_name=NODE, interval_s=0.001))
    loop.run(stop=stop)
    assert loop.passes == 3
    assert loop.last_outcome is runner.Outcome.UNCHANGED
    assert loop.last_pass_at is not None
