"""The ``inspect`` table as Prometheus gauges: allocated and total GPU memory per node and per card.

Computed at scrape time from the extender's store (the same ``inspection.as_json`` figures
``kubectl inspect cgpu`` prints), so a node that leaves the cluster leaves the metrics with it and
nothing is kept up to date between scrapes. Bytes, as Prometheus names units; the table's GiB
times 2^30. HAMi's scheduler exports the same kind of per-card allocation
(``GPUDeviceMemoryAllocated`` in Project-HAMi/HAMi, pkg/scheduler/metrics.go).

Real use beside it (``UsageCollector``, ``USAGE_NAMES``): per card, the memory its processes hold
and the part out-of-band processes hold, from the labeler's usage summaries on the Nodes (the
figures ``inspect`` shows in its ``GPUi(Used)`` columns); only cards of nodes that carry one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client.core import GaugeMetricFamily, Metric

from policies.gpu import cards, inspection, usage

GIB = 1 << 30
PREFIX = "gpu_admission_extender_"
NAMES = (
    PREFIX + "node_gpu_memory_allocated_bytes",
    PREFIX + "node_gpu_memory_total_bytes",
    PREFIX + "card_gpu_memory_allocated_bytes",
    PREFIX + "card_gpu_memory_total_bytes",
    PREFIX + "card_gpu_core_allocated_percent",
    PREFIX + "card_pods",
)


class Collector:
    """A prometheus_client collector over ``states()`` (the store's states of every node now)."""

    def __init__(self, states: Callable[[], Iterable[cards.NodeState]]) -> None:
        self._states = states

    def collect(self) -> Iterable[Metric]:
        table = inspection.as_json(self._states())
        node_labels, card_labels = ("node", "mode"), ("node", "card")
        node_used = GaugeMetricFamily(
            NAMES[0], "GPU memory allocated on a node (what inspect's table shows).", labels=node_labels
        )
        node_total = GaugeMetricFamily(NAMES[1], "GPU memory of a node's cards.", labels=node_labels)
        card_used = GaugeMetricFamily(
            NAMES[2], "GPU memory allocated on a card (a whole-card pod takes all of it).", labels=card_labels
        )
        card_total = GaugeMetricFamily(NAMES[3], "GPU memory of a card.", labels=card_labels)
        card_core = GaugeMetricFamily(NAMES[4], "Share of a card's cores allocated, in percent.", labels=card_labels)
        card_pods = GaugeMetricFamily(NAMES[5], "Pods allocated on a card (bound or reserved).", labels=card_labels)
        for node in table["nodes"]:
            node_used.add_metric([node["name"], node["mode"]], float(node["usedGPU"] * GIB))
            node_total.add_metric([node["name"], node["mode"]], float(node["totalGPU"] * GIB))
            for device in node["devs"]:
                labels = [node["name"], str(device["id"])]
                card_used.add_metric(labels, float(device["usedGPU"] * GIB))
                card_total.add_metric(labels, float(device["totalGPU"] * GIB))
                card_core.add_metric(labels, float(device["usedCore"]))
                card_pods.add_metric(labels, float(len(device["pods"])))
        yield from (node_used, node_total, card_used, card_total, card_core, card_pods)


USAGE_NAMES = (
    PREFIX + "card_gpu_memory_used_bytes",
    PREFIX + "card_gpu_memory_out_of_band_bytes",
)
MIB = 1 << 20


class UsageCollector:
    """Real use per card from ``usages()`` (node name -> the labeler's usage summary)."""

    def __init__(self, usages: Callable[[], Mapping[str, usage.NodeUsage]]) -> None:
        self._usages = usages

    def collect(self) -> Iterable[Metric]:
        labels = ("node", "card")
        used = GaugeMetricFamily(
            USAGE_NAMES[0], "GPU memory the processes on a card hold (the labeler's NVML reading).", labels=labels
        )
        oob = GaugeMetricFamily(USAGE_NAMES[1], "GPU memory held on a card by processes of no pod.", labels=labels)
        for name, summary in sorted(self._usages().items()):
            for card in summary.cards:
                real = inspection.real_mib(card)
                if real is not None:
                    used.add_metric([name, str(card.index)], float(real * MIB))
                oob.add_metric([name, str(card.index)], float(card.out_of_band_mib * MIB))
        yield from (used, oob)
