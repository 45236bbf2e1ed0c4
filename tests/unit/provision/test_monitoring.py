"""The monitoring objects name only metrics we export, and fit the components they watch.

Every metric name in the alert rules (deploy/components/monitoring/rules.yaml) and in the Grafana
dashboard (deploy/grafana/gpu-admission.json) is parsed out of the PromQL and looked up among the
sample names the webhook, the extender and the labeler expose. `promtool check rules` runs in the
e2e tier (tests/e2e/test_monitoring_rules.py), where promtool is built.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import parser as text_parser

from webhook.admission import clustercontext, configwatch
from webhook.audit import background
from webhook.extender import app as extender_app
from webhook.extender import occupancy
from webhook.labeler import health, runner
from webhook.serving import metrics, tls

REPO = Path(__file__).resolve().parents[3]
RULES = REPO / "deploy" / "components" / "monitoring" / "rules.yaml"
MONITORS = REPO / "deploy" / "components" / "monitoring" / "monitors.yaml"
DASHBOARD = REPO / "deploy" / "grafana" / "gpu-admission.json"

# Our names all start so; PromQL functions, keywords and label names never do.
_METRIC = re.compile(r"\b(?:gpu_admission_[a-z0-9_]+|process_[a-z0-9_]+)\b")
_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gauge": ("",),
    "summary": ("", "_sum", "_count"),
}


class _Loop:
    """What the labeler's collector reads from a runner, with a success recorded (any other
    figure it reads is 0)."""

    outcomes: dict[runner.Outcome, int] = {runner.Outcome.CHANGED: 1}
    last_success_wall = 1.0

    def __getattr__(self, name: str) -> int:
        return 0


@functools.cache
def exported() -> frozenset[str]:
    """Every sample name the three components can expose (families render even without samples)."""
    webhook = metrics.webhook_metrics()
    tls.expiry_gauge(webhook.registry)
    configwatch.register(webhook.registry)
    background.audit_metrics(webhook.registry)
    webhook.registry.register(metrics.Counter(clustercontext.WATCH_ERRORS_METRIC, "x", ()))
    texts = [webhook.registry.render(), extender_app.make_meters().registry.render()]
    occupancy_registry = metrics.Registry()
    occupancy_registry.register_collector(occupancy.Collector(lambda: []), names=occupancy.NAMES)
    texts.append(occupancy_registry.render())
    texts.append(health.registry(_Loop()).render())  # type: ignore[arg-type]  # the attributes the collector reads
    names: set[str] = set()
    for text in texts:
        for family in text_parser.text_string_to_metric_families(text):
            names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",)))
    return frozenset(names)


def _rule_expressions() -> list[str]:
    spec = yaml.safe_load(RULES.read_text())["spec"]
    return [rule["expr"] for group in spec["groups"] for rule in group["rules"]]


def _dashboard_expressions() -> list[str]:
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("expr", "query", "definition") and isinstance(value, str):
                    found.append(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(json.loads(DASHBOARD.read_text()))
    return found


def test_every_metric_the_rules_use_is_exported() -> None:
    names = exported()
    used = {name for expr in _rule_expressions() for name in _METRIC.findall(expr)}
    assert used and used <= names, sorted(used - names)
    # The five alerts the issue asks for are there, each on the metric that measures it.
    alerts = {
        rule["alert"]: rule["expr"] for group in yaml.safe_load(RULES.read_text())["spec"]["groups"] for rule in group["rules"]
    }
    assert "gpu_admission_certificate_expiry_timestamp_seconds" in alerts["GpuAdmissionCertificateExpiresSoon"]
    assert 'result="denied"' in alerts["GpuAdmissionDenyRateHigh"]
    assert "gpu_admission_review_duration_seconds_bucket" in alerts["GpuAdmissionLatencyNearTimeout"]
    assert 'verb="bind",result="error"' in alerts["GpuAdmissionExtenderBindFailures"]
    assert "gpu_admission_labeler_last_success_timestamp_seconds" in alerts["GpuAdmissionLabelerStale"]


def test_every_metric_the_dashboard_uses_is_exported() -> None:
    names = exported()
    expressions = _dashboard_expressions()
    used = {name for expr in expressions for name in _METRIC.findall(expr)}
    assert len(expressions) > 10 and used <= names, sorted(used - names)
    # The inspect table over time: per node and per card, allocated and total.
    assert set(occupancy.NAMES) <= used


def test_the_name_check_catches_a_name_we_do_not_export() -> None:
    names = exported()
    assert "gpu_admission_reviews_total" in names and "gpu_admission_review_duration_seconds_bucket" in names
    assert "gpu_admission_review_total" not in names  # a typo is caught
    assert "gpu_admission_reviews_total_bucket" not in names  # a counter has no buckets


def test_the_latency_alert_stays_under_the_webhook_timeout() -> None:
    configurations = list(yaml.safe_load_all((REPO / "deploy" / "webhook-configurations.yaml").read_text()))
    timeouts = {hook["timeoutSeconds"] for doc in configurations if doc for hook in doc.get("webhooks", [])}
    expressions = {
        rule["alert"]: rule["expr"] for group in yaml.safe_load(RULES.read_text())["spec"]["groups"] for rule in group["rules"]
    }
    found = re.search(r"\)\)\)\s*>\s*([\d.]+)", expressions["GpuAdmissionLatencyNearTimeout"])
    threshold = float(found.group(1))  # type: ignore[union-attr]
    assert timeouts and 0 < threshold < min(timeouts)


def test_the_monitors_scrape_ports_the_workloads_declare() -> None:
    monitors = {doc["metadata"]["name"]: doc for doc in yaml.safe_load_all(MONITORS.read_text()) if doc}
    deploy = REPO / "deploy"
    ports: dict[str, set[str]] = {}
    for path in ("webhook.yaml", "extender.yaml", "labeler.yaml"):
        for doc in yaml.safe_load_all((deploy / path).read_text()):
            if doc and doc["kind"] in ("Deployment", "DaemonSet", "Service"):
                component = doc["metadata"]["labels"]["app.kubernetes.io/component"]
                if doc["kind"] == "Service":
                    ports.setdefault(component + "/service", set()).update(p["name"] for p in doc["spec"]["ports"])
                else:
                    containers = doc["spec"]["template"]["spec"]["containers"]
                    ports.setdefault(component, set()).update(p["name"] for c in containers for p in c.get("ports", []))
    assert [e["port"] for e in monitors["gpu-admission-labeler"]["spec"]["podMetricsEndpoints"]] == ["health"]
    assert "health" in ports["labeler"]
    assert [e["port"] for e in monitors["gpu-admission-extender"]["spec"]["endpoints"]] == ["https"]
    assert "https" in ports["extender/service"]
    # The webhook's metrics port is the component's patch: it adds the port the monitor names.
    patch = yaml.safe_load((MONITORS.parent / "kustomization.yaml").read_text())["patches"][0]["patch"]
    operations = yaml.safe_load(patch)
    assert {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "--metrics-port=9090"} in operations
    added = [op["value"] for op in operations if op["path"].endswith("/ports/-")]
    assert added == [{"name": "metrics", "containerPort": 9090, "protocol": "TCP"}]
    assert [e["port"] for e in monitors["gpu-admission-webhook"]["spec"]["podMetricsEndpoints"]] == ["metrics"]
    webhook = next(
        doc for doc in yaml.safe_load_all((deploy / "webhook.yaml").read_text()) if doc and doc["kind"] == "Deployment"
    )
    assert webhook["spec"]["template"]["spec"]["containers"][0]["name"] == "webhook"  # what containers/0 patches
