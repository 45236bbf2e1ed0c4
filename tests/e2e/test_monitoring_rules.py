"""The alert rules parse and fire: `promtool check rules` and `promtool test rules` on the
PrometheusRule's groups (deploy/components/monitoring/rules.yaml, which the chart renders too).

Marked e2e: promtool is built from the Go module proxy (tests/e2e/ecosystem/build.sh).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests import ecosystem

pytestmark = pytest.mark.e2e

RULES = Path(__file__).resolve().parents[2] / "deploy" / "components" / "monitoring" / "rules.yaml"


@pytest.fixture(scope="module")
def promtool() -> Path:
    return ecosystem.tool("promtool")


@pytest.fixture
def rule_file(tmp_path: Path) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(yaml.safe_load(RULES.read_text())["spec"]))
    return path


def test_promtool_checks_the_rules(promtool: Path, rule_file: Path) -> None:
    completed = subprocess.run([str(promtool), "check", "rules", str(rule_file)], capture_output=True, text=True, check=False)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "SUCCESS: 9 rules found" in completed.stdout


def test_the_alerts_fire_on_the_series_they_watch_and_stay_quiet_otherwise(
    promtool: Path, rule_file: Path, tmp_path: Path
) -> None:
    day = 86400
    tests = {
        "rule_files": [str(rule_file)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    # Expires in 20 days (at t=0): the 30-day warning, not the 7-day page.
                    {
                        "series": 'gpu_admission_certificate_expiry_timestamp_seconds{certificate="serving",namespace="gpu-admission",pod="w-1"}',
                        "values": f"{20 * day}x120",
                    },
                    {
                        "series": 'gpu_admission_certificate_expiry_timestamp_seconds{certificate="ca",namespace="gpu-admission",pod="w-1"}',
                        "values": f"{3000 * day}x120",
                    },
                    # A labeler that wrote at t=0 and never again; another that writes every minute.
                    {"series": 'gpu_admission_labeler_last_success_timestamp_seconds{pod="labeler-a"}', "values": "0x60"},
                    {"series": 'gpu_admission_labeler_last_success_timestamp_seconds{pod="labeler-b"}', "values": "0+60x60"},
                    # Binds: 2 errors a minute; filters fine.
                    {"series": 'gpu_admission_extender_requests_total{verb="bind",result="error"}', "values": "0+2x60"},
                    {"series": 'gpu_admission_extender_requests_total{verb="filter",result="error"}', "values": "0x60"},
                    # Half the reviews refused, at 1/s each.
                    {"series": 'gpu_admission_reviews_total{endpoint="validate",result="denied"}', "values": "0+60x60"},
                    {"series": 'gpu_admission_reviews_total{endpoint="validate",result="allowed"}', "values": "0+60x60"},
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "90m",
                        "alertname": "GpuAdmissionCertificateExpiresSoon",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "certificate": "serving",
                                    "namespace": "gpu-admission",
                                    "pod": "w-1",
                                },
                                "exp_annotations": _annotations(
                                    rule_file, "GpuAdmissionCertificateExpiresSoon", {"certificate": "serving"}, "19d 22h 30m 0s"
                                ),
                            }
                        ],
                    },
                    {"eval_time": "90m", "alertname": "GpuAdmissionCertificateExpiresVerySoon", "exp_alerts": []},
                    {
                        "eval_time": "30m",
                        "alertname": "GpuAdmissionExtenderBindFailures",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "warning"},
                                "exp_annotations": _annotations(rule_file, "GpuAdmissionExtenderBindFailures", {}, "20"),
                            }
                        ],
                    },
                    {
                        "eval_time": "30m",
                        "alertname": "GpuAdmissionDenyRateHigh",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "warning"},
                                "exp_annotations": _annotations(rule_file, "GpuAdmissionDenyRateHigh", {}, "50%"),
                            }
                        ],
                    },
                    {"eval_time": "30m", "alertname": "GpuAdmissionLatencyNearTimeout", "exp_alerts": []},
                ],
            }
        ],
    }
    # The stale labeler: checked apart, since its annotation carries a duration that depends on
    # the evaluation time only.
    tests["tests"][0]["alert_rule_test"].append(  # type: ignore[index]
        {
            "eval_time": "20m",
            "alertname": "GpuAdmissionLabelerStale",
            "exp_alerts": [
                {
                    "exp_labels": {"severity": "warning", "pod": "labeler-a"},
                    "exp_annotations": _annotations(rule_file, "GpuAdmissionLabelerStale", {"pod": "labeler-a"}, "20m 0s"),
                }
            ],
        }
    )
    path = tmp_path / "tests.yaml"
    path.write_text(yaml.safe_dump(tests))
    completed = subprocess.run([str(promtool), "test", "rules", str(path)], capture_output=True, text=True, check=False)
    assert completed.returncode == 0, completed.stdout + completed.stderr


def test_the_pod_above_request_alert_fires_after_its_time_and_not_on_stale_figures(
    promtool: Path, rule_file: Path, tmp_path: Path
) -> None:
    used, requested = "gpu_admission_labeler_pod_memory_used_mib", "gpu_admission_labeler_pod_memory_requested_mib"
    a = 'instance="10.0.0.1:8089",namespace="ml",pod="train-0",card="0"'
    b = 'instance="10.0.0.1:8089",namespace="ml",pod="infer-0",card="0"'
    c = 'instance="10.0.0.2:8089",namespace="ml",pod="train-1",card="1"'
    tests = {
        "rule_files": [str(rule_file)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    # train-0: 2048 MiB above its 4096 for 30 minutes; infer-0 within its request.
                    {"series": f"{used}{{{a}}}", "values": "6144x30"},
                    {"series": f"{requested}{{{a}}}", "values": "4096x30"},
                    {"series": f"{used}{{{b}}}", "values": "1000x30"},
                    {"series": f"{requested}{{{b}}}", "values": "8192x30"},
                    {
                        "series": 'gpu_admission_labeler_usage_stale{instance="10.0.0.1:8089",namespace="gpu-admission",pod="labeler-a"}',
                        "values": "0x30",
                    },
                    # train-1 is above too, but its labeler's figures are stale: no alert.
                    {"series": f"{used}{{{c}}}", "values": "9000x30"},
                    {"series": f"{requested}{{{c}}}", "values": "4096x30"},
                    {
                        "series": 'gpu_admission_labeler_usage_stale{instance="10.0.0.2:8089",namespace="gpu-admission",pod="labeler-b"}',
                        "values": "1x30",
                    },
                ],
                "alert_rule_test": [
                    {"eval_time": "10m", "alertname": "GpuAdmissionPodAboveGpuMemoryRequest", "exp_alerts": []},
                    {
                        "eval_time": "20m",
                        "alertname": "GpuAdmissionPodAboveGpuMemoryRequest",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "instance": "10.0.0.1:8089",
                                    "namespace": "ml",
                                    "pod": "train-0",
                                    "card": "0",
                                },
                                "exp_annotations": _annotations(
                                    rule_file,
                                    "GpuAdmissionPodAboveGpuMemoryRequest",
                                    {"namespace": "ml", "pod": "train-0", "card": "0"},
                                    "2048",
                                ),
                            }
                        ],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "tests.yaml"
    path.write_text(yaml.safe_dump(tests))
    completed = subprocess.run([str(promtool), "test", "rules", str(path)], capture_output=True, text=True, check=False)
    assert completed.returncode == 0, completed.stdout + completed.stderr


def _annotations(rule_file: Path, alert: str, labels: dict[str, str], value: str) -> dict[str, str]:
    """The rule's annotations with $labels and the humanized $value filled in as Prometheus would."""
    spec = yaml.safe_load(rule_file.read_text())
    rule = next(r for g in spec["groups"] for r in g["rules"] if r.get("alert") == alert)
    filled = {}
    for key, text in rule["annotations"].items():
        for name, label in labels.items():
            text = text.replace("{{ $labels." + name + " }}", label)
        for function in ("humanizeDuration", "humanizePercentage"):
            text = text.replace("{{ $value | " + function + " }}", value)
        filled[key] = text.replace("{{ $value }}", value)
    return filled
