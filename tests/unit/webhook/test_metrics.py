"""The metrics front on prometheus_client: typed labels, one registry per app, the text format."""

from __future__ import annotations

import pytest

from webhook.serving import metrics


def test_counters_render_help_type_and_escaped_series() -> None:
    registry = metrics.Registry()
    counter = registry.register(metrics.Counter("demo_total", "Demo\ncounter.", ("path", "code")))
    counter.inc(path="/b", code="200")
    counter.inc(2, path='/a"\\', code="400")
    assert registry.render() == (
        "# HELP demo_total Demo\\ncounter.\n"
        "# TYPE demo_total counter\n"
        'demo_total{code="200",path="/b"} 1.0\n'
        'demo_total{code="400",path="/a\\"\\\\"} 2.0\n'
    )


def test_histograms_are_cumulative_with_inf_sum_and_count() -> None:
    registry = metrics.Registry()
    histogram = registry.register(metrics.Histogram("lat_seconds", "Latency.", ("route",), buckets=(0.1, 1.0)))
    for value in (0.05, 0.1, 0.5, 3.0):
        histogram.observe(value, route="/x")
    assert histogram.count(route="/x") == 4
    assert registry.render().splitlines()[2:] == [
        'lat_seconds_bucket{le="0.1",route="/x"} 2.0',
        'lat_seconds_bucket{le="1.0",route="/x"} 3.0',
        'lat_seconds_bucket{le="+Inf",route="/x"} 4.0',
        'lat_seconds_count{route="/x"} 4.0',
        'lat_seconds_sum{route="/x"} 3.65',
    ]


def test_wrong_labels_and_negative_increments_are_programming_errors() -> None:
    counter = metrics.Counter("c_total", "C.", ("a",))
    with pytest.raises(ValueError):
        counter.inc(b="1")
    with pytest.raises(ValueError):
        counter.inc(-1, a="1")
    registry = metrics.Registry()
    registry.register(counter)
    with pytest.raises(ValueError):
        registry.register(metrics.Counter("c_total", "again", ()))
    with pytest.raises(ValueError):
        metrics.Histogram("h", "H.", (), buckets=(1.0, 0.5))


def test_each_webhook_metrics_set_has_its_own_registry() -> None:
    one, two = metrics.webhook_metrics(), metrics.webhook_metrics()
    one.admission_reviews.inc(endpoint="validate", result="allowed")
    assert two.admission_reviews.value(endpoint="validate", result="allowed") == 0
    assert one.admission_reviews.value(endpoint="validate", result="allowed") == 1
    assert metrics.sample(two.registry.render(), "gpu_admission_reviews_total", endpoint="validate", result="allowed") is None
    assert metrics.sample(one.registry.render(), "gpu_admission_reviews_total", endpoint="validate", result="allowed") == 1


def test_the_webhook_registry_carries_build_info_and_process_metrics() -> None:
    text = metrics.webhook_metrics().registry.render()
    found = metrics.samples(text)
    build = [dict(labels) for name, labels in found if name == metrics.BUILD_INFO]
    assert len(build) == 1 and build[0]["version"] == metrics.version() and build[0]["python"].count(".") == 2
    assert ("process_cpu_seconds_total", frozenset()) in found
    assert ("process_resident_memory_bytes", frozenset()) in found


def test_gauges_are_set_up_and_down_and_render_as_gauges() -> None:
    registry = metrics.Registry()
    gauge = registry.register(metrics.Gauge("demo_seconds", "Demo gauge.", ("which",)))
    assert isinstance(gauge, metrics.Gauge)  # register hands back the gauge itself, with its `set`
    gauge.set(1700000000, which="b")
    gauge.set(5.5, which="a")
    gauge.set(2, which="a")  # a gauge may go down
    gauge.inc(which="b")
    gauge.dec(0.5, which="a")
    assert gauge.value(which="a") == 1.5
    text = registry.render()
    assert "# TYPE demo_seconds gauge" in text
    assert metrics.sample(text, "demo_seconds", which="a") == 1.5
    assert metrics.sample(text, "demo_seconds", which="b") == 1700000001
    gauge.remove(which="b")
    assert metrics.sample(registry.render(), "demo_seconds", which="b") is None


def test_gauge_labels_are_checked_like_a_counters() -> None:
    gauge = metrics.Gauge("g", "G.", ("a",))
    for wrong in ({}, {"b": "1"}, {"a": "1", "b": "2"}):
        with pytest.raises(ValueError):
            gauge.set(1, **wrong)
    with pytest.raises(ValueError):
        gauge.inc(-1, a="1")
    unlabelled = metrics.Gauge("u", "U.", ())
    unlabelled.set(0)
    assert unlabelled.render() == ["# HELP u U.", "# TYPE u gauge", "u 0.0"]


def test_inc_one_counts_the_same_series_as_keyword_inc() -> None:
    registry = metrics.Registry()
    counter = registry.register(metrics.Counter("pos_total", "Positional.", ("endpoint", "result")))
    counter.inc_one("validate", "pass")  # a new series through the positional path
    counter.inc(endpoint="validate", result="pass")
    counter.inc_one("validate", "pass")
    counter.inc_one("mutate", "fail")
    assert counter.value(endpoint="validate", result="pass") == 3.0
    assert counter.value(endpoint="mutate", result="fail") == 1.0
    assert counter.value(endpoint="mutate", result="pass") == 0.0
    assert registry.render().splitlines()[2:] == [
        'pos_total{endpoint="validate",result="pass"} 3.0',
        'pos_total{endpoint="mutate",result="fail"} 1.0',
    ]
    with pytest.raises(ValueError):
        counter.inc_one("validate")  # one value short of the declared labels
    with pytest.raises(ValueError):
        counter.inc_one("validate", "pass", "extra")
