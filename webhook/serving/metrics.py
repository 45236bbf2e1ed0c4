"""The servers' Prometheus metrics: a small typed front on ``prometheus_client``, and the webhook's set.

``prometheus_client`` does what a hand-written registry cannot do well: the multi-process mode
``serve --workers N`` needs (every worker writes its values into memory-mapped files in one
directory and any worker's scrape merges them all, so successive scrapes never go back), the text
exposition, and the process metrics. The front keeps three habits of ours:

- every app builds its own ``Registry``, so tests and several apps in one process never share
  counts (in multi-process mode the files are shared by design: one process, one app);
- labels are keyword arguments checked against the declared names, and each label set's child is
  cached in a plain dict, so the hot path is one dict lookup and one ``inc``;
- gauges say how workers' values combine (``multiprocess_mode``: ``livesum`` for an in-flight
  count, ``livemin`` for an expiry, ...); the ``live`` modes drop a worker's values once the
  supervisor reports it dead (``worker_exited``).

Multi-process mode is switched on once, in the supervisor before it forks
(``use_multiprocess``): prometheus_client picks its value class when it is imported, from
``PROMETHEUS_MULTIPROC_DIR``; setting the variable and the class here does the same for the
workers forked afterwards. prometheus_client documents that process metrics are not exported in
that mode; ours are those of the whole serving tree instead (``_ServingTree``): CPU time of the
supervisor, of its reaped workers and of the live ones, so the counter never goes back when a
worker is replaced.
"""

from __future__ import annotations

import bisect
import dataclasses
import importlib.metadata
import math
import os
import pathlib
import platform
from collections.abc import Iterable, Sequence
from typing import Any, Literal, TypeVar

import prometheus_client
from prometheus_client import multiprocess, values
from prometheus_client import parser as text_parser
from prometheus_client import registry as prom_registry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

CONTENT_TYPE = prometheus_client.CONTENT_TYPE_PLAIN_0_0_4
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
BUILD_INFO = "gpu_admission_build_info"

# Seconds; admission latency is expected well under 10 ms, the tail up to the 10 s webhook timeout.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# `_created` series double every counter's lines and mean nothing to a rate(); off, as in
# prometheus_client's own multi-process mode.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]  # unannotated upstream

# How workers' values of a gauge combine (prometheus_client's modes; `live*` forget dead workers).
MultiprocessMode = Literal["all", "liveall", "min", "livemin", "max", "livemax", "sum", "livesum", "mostrecent", "livemostrecent"]

_M = TypeVar("_M", bound="_Metric")


class _Metric:
    """One metric family: the prometheus_client object and a cache of its labelled children."""

    type_name = ""

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str]) -> None:
        self.name = name
        self.help_text = help_text
        self.labelnames = tuple(labelnames)
        self.wrapped: Any = self._make()
        self._children: dict[tuple[str, ...], Any] = {}

    def _make(self) -> Any:
        raise NotImplementedError

    def _child(self, labels: dict[str, str]) -> Any:
        key = _label_values(self.labelnames, labels)
        child = self._children.get(key)
        if child is None:
            child = self.wrapped.labels(*key) if self.labelnames else self.wrapped
            self._children[key] = child
        return child

    def render(self) -> list[str]:
        """This family alone in the text format (tests, debugging)."""
        registry = prom_registry.CollectorRegistry(auto_describe=False)
        registry.register(self.wrapped)
        text = prometheus_client.generate_latest(registry).decode()
        return text.splitlines()


class Counter(_Metric):
    """A monotonically increasing value per label set."""

    type_name = "counter"

    def _make(self) -> Any:
        return prometheus_client.Counter(self.name, self.help_text, self.labelnames, registry=None)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        # The value object directly: prometheus_client's child.inc re-checks on every call that the
        # child is labelled, which doubles the cost of the reviews' hot path (bench/webhook_load.py).
        self._child(labels)._value.inc(amount)

    def inc_one(self, *values: str) -> None:
        """``inc()`` with the label values in declared order: a review counts one outcome per
        policy, and building the keyword dict and its tuple each time cost more than the count."""
        child = self._children.get(values)
        if child is None:
            child = self._child(dict(zip(self.labelnames, values, strict=True)))
        child._value.inc(1.0)

    def value(self, **labels: str) -> float:
        """This process's value (tests); reading creates no series."""
        child = self._children.get(_label_values(self.labelnames, labels))
        return float(child._value.get()) if child is not None else 0.0


class Gauge(_Metric):
    """A value per label set that is set, not only increased.

    ``multiprocess_mode`` (prometheus_client's): how workers' values combine under ``--workers``.
    """

    type_name = "gauge"

    def __init__(
        self, name: str, help_text: str, labelnames: Sequence[str], *, multiprocess_mode: MultiprocessMode = "livemax"
    ) -> None:
        self.multiprocess_mode = multiprocess_mode
        super().__init__(name, help_text, labelnames)

    def _make(self) -> Any:
        return prometheus_client.Gauge(
            self.name, self.help_text, self.labelnames, registry=None, multiprocess_mode=self.multiprocess_mode
        )

    def set(self, value: float, **labels: str) -> None:
        self._child(labels).set(value)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError("inc takes a positive amount; use dec or set")
        self._add(amount, labels)

    def dec(self, amount: float = 1.0, **labels: str) -> None:
        self._add(-amount, labels)

    def _add(self, amount: float, labels: dict[str, str]) -> None:
        child = self._child(labels)
        if self.multiprocess_mode in ("mostrecent", "livemostrecent"):
            child.inc(amount)  # refused there, as prometheus_client refuses it
        else:
            child._value.inc(amount)  # as Counter.inc: skip the per-call check

    def remove(self, **labels: str) -> None:
        """Forget one label set (a node that left the cluster)."""
        key = _label_values(self.labelnames, labels)
        if self._children.pop(key, None) is not None:
            self.wrapped.remove(*key)

    def value(self, **labels: str) -> float:
        child = self._children.get(_label_values(self.labelnames, labels))
        return float(child._value.get()) if child is not None else 0.0


class Histogram(_Metric):
    """Observations counted into cumulative ``le`` buckets, with ``_sum`` and ``_count``."""

    type_name = "histogram"

    def __init__(
        self, name: str, help_text: str, labelnames: Sequence[str], *, buckets: Sequence[float] = LATENCY_BUCKETS
    ) -> None:
        if list(buckets) != sorted(set(buckets)):
            raise ValueError("histogram buckets must be strictly increasing")
        self.bounds = tuple(buckets)
        self._upper = (*self.bounds, math.inf)
        super().__init__(name, help_text, labelnames)

    def _make(self) -> Any:
        return prometheus_client.Histogram(self.name, self.help_text, self.labelnames, registry=None, buckets=self.bounds)

    def observe(self, value: float, **labels: str) -> None:
        # What prometheus_client's child.observe does (buckets are kept per bucket, summed at
        # collection), without its per-call check and linear bucket scan: a bisection.
        child = self._child(labels)
        child._sum.inc(value)
        child._buckets[bisect.bisect_left(self._upper, value)].inc(1.0)

    def count(self, **labels: str) -> int:
        """This process's observations (tests)."""
        child = self._children.get(_label_values(self.labelnames, labels))
        return int(sum(bucket.get() for bucket in child._buckets)) if child is not None else 0


class Registry:
    """The metrics of one application, rendered in registration order."""

    def __init__(self, *, runtime: bool = False) -> None:
        self._registry = prom_registry.CollectorRegistry(auto_describe=False)
        self._names: set[str] = set()
        self.runtime = runtime
        if runtime:
            for collector in _runtime_collectors():
                self._registry.register(collector)

    def register(self, metric: _M) -> _M:
        if metric.name in self._names:
            raise ValueError(f"metric {metric.name} registered twice")
        self._registry.register(metric.wrapped)
        self._names.add(metric.name)
        return metric

    def register_collector(self, collector: Any, *, names: Iterable[str]) -> None:
        """A prometheus_client collector computed at scrape time (``names``: the families it yields).

        In multi-process mode only the merged files are exported: a collector is for single-process
        servers (the extender, the labeler).
        """
        self._registry.register(collector)
        self._names.update(names)

    @property
    def names(self) -> frozenset[str]:
        """The metric names registered here, as declared (a counter's with its ``_total``)."""
        return frozenset(self._names)

    def render(self) -> str:
        directory = multiprocess_directory()
        if directory is None:
            return prometheus_client.generate_latest(self._registry).decode()
        merged = prom_registry.CollectorRegistry(auto_describe=False)
        multiprocess.MultiProcessCollector(merged, path=str(directory))  # type: ignore[no-untyped-call]  # unannotated upstream
        if self.runtime:
            merged.register(_BuildInfo())
            merged.register(_ServingTree(directory))
        return prometheus_client.generate_latest(merged).decode()


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The samples of an exposition, by name and label set (tests, benches, ``status`` checks)."""
    found: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_parser.text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = float(sample.value)
    return found


def sample(text: str, name: str, **labels: str) -> float | None:
    """One sample's value in an exposition, None when absent."""
    return samples(text).get((name, frozenset(labels.items())))


def use_multiprocess(directory: pathlib.Path) -> None:
    """Switch this process, and every worker forked from it afterwards, to multi-process mode.

    ``directory`` is this run's: emptied first, since values left by an earlier run's workers
    would be added to this run's.
    """
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):
        stale.unlink()
    os.environ[MULTIPROC_ENV] = str(directory)
    values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]  # unannotated upstream


def multiprocess_directory() -> pathlib.Path | None:
    """The directory of multi-process mode when this process is in it."""
    if not getattr(values.ValueClass, "_multiprocess", False):
        return None
    path = os.environ.get(MULTIPROC_ENV)
    return pathlib.Path(path) if path else None


def worker_exited(pid: int) -> None:
    """The supervisor's note that a worker is gone: its ``live*`` gauges stop counting."""
    directory = multiprocess_directory()
    if directory is not None:
        multiprocess.mark_process_dead(pid, str(directory))  # type: ignore[no-untyped-call]  # unannotated upstream


def version() -> str:
    try:
        return importlib.metadata.version("gpu-admission")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class _BuildInfo:
    """``gpu_admission_build_info{version,python} 1``."""

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            BUILD_INFO, "Version of gpu-admission and of Python it runs on (always 1).", labels=("version", "python")
        )
        family.add_metric([version(), platform.python_version()], 1.0)
        yield family


def _runtime_collectors() -> list[Any]:
    return [_BuildInfo(), prometheus_client.ProcessCollector(registry=None), prometheus_client.PlatformCollector(registry=None)]


@dataclasses.dataclass(frozen=True)
class _Stat:
    cpu_seconds: float  # user + system
    children_cpu_seconds: float  # of reaped children
    start_time: float
    virtual_bytes: float
    resident_bytes: float
    parent: int


class _ServingTree:
    """Process metrics of a ``serve --workers N`` tree: the supervisor (the scraped worker's
    parent) and its live workers (the pids the multi-process files are named after)."""

    def __init__(self, directory: pathlib.Path) -> None:
        self.directory = directory

    def collect(self) -> Iterable[Metric]:
        supervisor = os.getppid()
        top = _stat(supervisor)
        if top is None:
            return
        workers = []
        for pid in sorted(_pids_in(self.directory)):
            stat = _stat(pid)
            if stat is not None and stat.parent == supervisor:
                workers.append((pid, stat))
        cpu = top.cpu_seconds + top.children_cpu_seconds + sum(s.cpu_seconds for _, s in workers)
        family = CounterMetricFamily(
            "process_cpu_seconds", "Total user and system CPU time of the supervisor and its workers, reaped ones included."
        )
        family.add_metric([], cpu)
        yield family
        for name, text, value in (
            (
                "process_resident_memory_bytes",
                "Resident memory of the supervisor and its live workers.",
                top.resident_bytes + sum(s.resident_bytes for _, s in workers),
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory of the supervisor and its live workers.",
                top.virtual_bytes + sum(s.virtual_bytes for _, s in workers),
            ),
            ("process_start_time_seconds", "Start time of the supervisor since the Unix epoch.", top.start_time),
            (
                "process_open_fds",
                "Open file descriptors of the supervisor and its live workers.",
                float(sum(_open_fds(p) for p in (supervisor, *[p for p, _ in workers]))),
            ),
            ("gpu_admission_workers", "Live worker processes.", float(len(workers))),
        ):
            gauge = GaugeMetricFamily(name, text)
            gauge.add_metric([], value)
            yield gauge


def _pids_in(directory: pathlib.Path) -> set[int]:
    pids = set()
    for path in directory.glob("*.db"):
        tail = path.stem.rsplit("_", 1)[-1]
        if tail.isdigit():
            pids.add(int(tail))
    return pids


def _stat(pid: int) -> _Stat | None:
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(
            float(line.split()[1]) for line in pathlib.Path("/proc/stat").read_text().splitlines() if line.startswith("btime ")
        )
    except (OSError, IndexError, StopIteration, ValueError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return _Stat(
        cpu_seconds=(int(fields[11]) + int(fields[12])) / ticks,
        children_cpu_seconds=(int(fields[13]) + int(fields[14])) / ticks,
        start_time=boot + int(fields[19]) / ticks,
        virtual_bytes=float(fields[20]),
        resident_bytes=float(int(fields[21]) * os.sysconf("SC_PAGE_SIZE")),
        parent=int(fields[1]),
    )


def _open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class WebhookMetrics:
    """The admission webhook's metrics, all under the ``gpu_admission_`` prefix."""

    registry: Registry
    http_requests: Counter
    http_duration: Histogram
    admission_reviews: Counter
    policy_results: Counter
    in_flight: Gauge
    review_duration: Histogram
    decisions: Counter


def webhook_metrics() -> WebhookMetrics:
    """A fresh registry with the webhook's metrics registered (and process metrics, build info)."""
    registry = Registry(runtime=True)
    return WebhookMetrics(
        registry=registry,
        http_requests=registry.register(
            Counter("gpu_admission_http_requests_total", "HTTP requests by route and status code.", ("route", "code"))
        ),
        http_duration=registry.register(
            Histogram("gpu_admission_http_request_duration_seconds", "Time to answer an HTTP request.", ("route",))
        ),
        admission_reviews=registry.register(
            Counter(
                "gpu_admission_reviews_total",
                "AdmissionReviews answered, by endpoint and result (allowed, denied, exempt, bad_request, error).",
                ("endpoint", "result"),
            )
        ),
        policy_results=registry.register(
            Counter(
                "gpu_admission_policy_results_total",
                "Policy outcomes by endpoint, policy ID and result (pass, fail, warn, error, skip).",
                ("endpoint", "policy", "result"),
            )
        ),
        in_flight=registry.register(
            Gauge(
                "gpu_admission_reviews_in_flight",
                "AdmissionReviews being evaluated now, over all workers.",
                ("endpoint",),
                multiprocess_mode="livesum",
            )
        ),
        review_duration=registry.register(
            Histogram(
                "gpu_admission_review_duration_seconds",
                "Time from a parsed AdmissionReview to its answer, by endpoint, operation, object kind and allowed.",
                ("endpoint", "operation", "kind", "allowed"),
            )
        ),
        decisions=registry.register(
            Counter(
                "gpu_admission_policy_decisions_total",
                "Violations by endpoint, policy ID and the action taken (enforce: refused, warn, audit).",
                ("endpoint", "policy", "action"),
            )
        ),
    )


def _label_values(names: tuple[str, ...], labels: dict[str, str]) -> tuple[str, ...]:
    # Called on every request: the set comparison only when the cheap check fails.
    if len(labels) == len(names):
        try:
            return tuple([labels[name] for name in names])
        except KeyError:
            pass
    raise ValueError(f"labels {sorted(labels)} do not match {list(names)}")
