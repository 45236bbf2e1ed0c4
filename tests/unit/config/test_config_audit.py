"""Audit sees what the webhook sees: user policies, namespace overrides, exceptions, and expired exceptions as GPU209."""

from __future__ import annotations

import pathlib

import pytest
import yaml

from policies import model, settings
from tests.conftest import PodFactory
from webhook import cli, config
from webhook.audit import scan

REPO = pathlib.Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples" / "policies"
NOW = 1_780_000_000.0  # 2026-05-28


def test_an_expired_exception_is_a_gpu209_finding_in_a_cluster_wide_audit() -> None:
    configured = settings.from_mapping(
        {
            "exceptions": [
                {"name": "old", "policies": ["GPU002"], "match": {"namespaces": ["a"]}, "expires": "2026-01-01T00:00:00Z"},
                {"name": "current", "policies": ["GPU002"], "match": {"namespaces": ["a"]}, "expires": "2027-01-01T00:00:00Z"},
            ]
        }
    )

    audit = scan.run(scan.Inventory(), settings=configured, now=NOW)
    scoped = scan.run(scan.Inventory(), settings=configured, now=NOW, scope=scan.Scope(namespaces=frozenset({"a"})))

    (found,) = [f for f in audit.findings if f.policy == "GPU209"]
    assert found.result is model.Result.FAIL and found.action is model.Action.WARN
    assert found.subject.kind == "GpuAdmissionException" and found.subject.name == "old"
    assert found.message == (
        "GPU209: exceptions in the settings are removed or renewed when they expire: "
        "exception 'old' for GPU002 expired 2026-01-01T00:00:00+00:00"
    )
    assert not [f for f in scoped.findings if f.policy == "GPU209"]


def test_audit_judges_user_policies_and_applies_overrides_and_live_exceptions(make_pod: PodFactory) -> None:
    configured = config.load(None, policies_dir=str(EXAMPLES))
    configured = settings.from_mapping(
        {
            "namespaceOverrides": [{"namespaces": ["lab"], "policies": {"USR003": {"action": "audit"}}}],
            "exceptions": [
                {
                    "name": "big-ok",
                    "policies": ["USR003"],
                    "match": {"namespaces": ["team-a"], "names": ["big-ok"]},
                    "expires": "2027-01-01T00:00:00Z",
                }
            ],
        },
        user_policies=configured.user_policies,
    )
    big = make_pod(name="big", namespace="team-a", limits={"aliyun.com/gpu-mem": 24})
    lab = make_pod(name="big-lab", namespace="lab", limits={"aliyun.com/gpu-mem": 24})
    excepted = make_pod(name="big-ok", namespace="team-a", limits={"aliyun.com/gpu-mem": 24})

    audit = scan.run(scan.Inventory.of([big, lab, excepted]), settings=configured, now=NOW)

    usr003 = {f.subject.name: f for f in audit.findings if f.policy == "USR003"}
    assert (usr003["big"].result, usr003["big"].action) == (model.Result.FAIL, model.Action.ENFORCE)
    assert usr003["big"].rule == "gpu-mem-limit"
    assert (usr003["big-lab"].result, usr003["big-lab"].action) == (model.Result.FAIL, model.Action.AUDIT)
    assert usr003["big-ok"].result is model.Result.SKIP
    assert audit.exit_status == 1


def test_a_namespace_override_cannot_switch_a_mutator_on_in_audit(make_pod: PodFactory) -> None:
    configured = settings.from_mapping(
        {"namespaceOverrides": [{"namespaces": ["team-a"], "policies": {"GPU104": {"action": "enforce"}}}]}
    )

    effective = scan.audit_settings(configured)

    assert effective.action("GPU104", namespace="team-a") is model.Action.OFF


def test_the_audit_command_takes_the_policies_directory(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = tmp_path / "pods.yaml"
    manifest.write_text((EXAMPLES / "manifests" / "gpu-mem-limit-denied.yaml").read_text())

    assert cli.main(["audit", "-f", str(manifest), "-o", "json"]) == 0
    capsys.readouterr()
    assert cli.main(["audit", "-f", str(manifest), "-o", "json", "--policies-dir", str(EXAMPLES)]) == 1
    reports = yaml.safe_load(capsys.readouterr().out)["items"]  # a v1 List of PolicyReports
    assert any(r["policy"] == "USR003" and r["result"] == "fail" for report in reports for r in report.get("results", []))
