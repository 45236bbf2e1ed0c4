"""A tiny Prometheus registry (counters, gauges, histograms, text format 0.0.4) and the webhook's metrics.

Small enough to own instead of adding ``prometheus_client``; every app builds its own registry, so
tests and several apps in one process never share counts.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Sequence
from typing import TypeVar

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Seconds; admission latency is expected well under 10 ms, the tail up to the 10 s webhook timeout.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


# Bound, not constrained, so that `register` hands back what it was given (a Gauge stays a Gauge).
_M = TypeVar("_M", bound="Counter | Histogram")


class Counter:
    """A monotonically increasing value per label set."""

    type_name = "counter"  # what the `# TYPE` line says

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str]) -> None:
        self.name = name
        self.help_text = help_text
        self.labelnames = tuple(labelnames)
        self._values: dict[tuple[str, ...], float] = {}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        key = _label_values(self.labelnames, labels)
        self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        return self._values.get(_label_values(self.labelnames, labels), 0.0)

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {_escape_help(self.help_text)}", f"# TYPE {self.name} {self.type_name}"]
        for key in sorted(self._values):
            lines.append(f"{self.name}{_labels(self.labelnames, key)} {_number(self._values[key])}")
        return lines


class Gauge(Counter):
    """A value per label set that is set, not only increased; rendered like a counter but for its TYPE."""

    type_name = "gauge"

    def set(self, value: float, **labels: str) -> None:
        self._values[_label_values(self.labelnames, labels)] = value  # only `inc` refuses to go down


@dataclasses.dataclass
class _Series:
    buckets: list[int]
    total: float = 0.0
    count: int = 0


class Histogram:
    """Observations counted into cumulative ``le`` buckets, with ``_sum`` and ``_count``."""

    def __init__(
        self, name: str, help_text: str, labelnames: Sequence[str], *, buckets: Sequence[float] = LATENCY_BUCKETS
    ) -> None:
        if list(buckets) != sorted(set(buckets)):
            raise ValueError("histogram buckets must be strictly increasing")
        self.name = name
        self.help_text = help_text
        self.labelnames = tuple(labelnames)
        self.bounds = tuple(buckets)
        self._series: dict[tuple[str, ...], _Series] = {}

    def observe(self, value: float, **labels: str) -> None:
        key = _label_values(self.labelnames, labels)
        series = self._series.setdefault(key, _Series(buckets=[0] * len(self.bounds)))
        index = bisect.bisect_left(self.bounds, value)
        if index < len(self.bounds):
            series.buckets[index] += 1
        series.total += value
        series.count += 1

    def count(self, **labels: str) -> int:
        series = self._series.get(_label_values(self.labelnames, labels))
        return series.count if series else 0

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {_escape_help(self.help_text)}", f"# TYPE {self.name} histogram"]
        for key in sorted(self._series):
            series = self._series[key]
            cumulative = 0
            for bound, in_bucket in zip(self.bounds, series.buckets, strict=True):
                cumulative += in_bucket
                labels = _labels((*self.labelnames, "le"), (*key, _number(bound)))
                lines.append(f"{self.name}_bucket{labels} {cumulative}")
            labels = _labels((*self.labelnames, "le"), (*key, "+Inf"))
            lines.append(f"{self.name}_bucket{labels} {series.count}")
            lines.append(f"{self.name}_sum{_labels(self.labelnames, key)} {_number(series.total)}")
            lines.append(f"{self.name}_count{_labels(self.labelnames, key)} {series.count}")
        return lines


class Registry:
    """The metrics of one application, rendered in registration order."""

    def __init__(self) -> None:
        self._metrics: list[Counter | Histogram] = []

    def register(self, metric: _M) -> _M:
        if any(existing.name == metric.name for existing in self._metrics):
            raise ValueError(f"metric {metric.name} registered twice")
        self._metrics.append(metric)
        return metric

    def render(self) -> str:
        lines: list[str] = []
        for metric in self._metrics:
            lines.extend(metric.render())
        return "\n".join(lines) + "\n"


@dataclasses.dataclass(frozen=True, kw_only=True)
class WebhookMetrics:
    """The admission webhook's metrics, all under the ``gpu_admission_`` prefix."""

    registry: Registry
    http_requests: Counter
    http_duration: Histogram
    admission_reviews: Counter
    policy_results: Counter


def webhook_metrics() -> WebhookMetrics:
    """A fresh registry with the webhook's metrics registered."""
    registry = Registry()
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
    )


def _label_values(names: tuple[str, ...], labels: dict[str, str]) -> tuple[str, ...]:
    # Called on every request: the set comparison only when the cheap check fails.
    if len(labels) == len(names):
        try:
            return tuple([labels[name] for name in names])
        except KeyError:
            pass
    raise ValueError(f"labels {sorted(labels)} do not match {list(names)}")


def _labels(names: Sequence[str], values: Sequence[str]) -> str:
    if not names:
        return ""
    pairs = ",".join(f'{name}="{_escape_value(value)}"' for name, value in zip(names, values, strict=True))
    return "{" + pairs + "}"


def _escape_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else f"{value:.1f}"
