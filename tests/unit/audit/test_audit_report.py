"""PolicyReport building: shape against our CRD, summary counts, stored results, timestamps, the write plan."""

from __future__ import annotations

import copy
import dataclasses
import pathlib
from collections.abc import Mapping
from typing import Any, cast

import pytest
import yaml

from policies import model
from webhook.audit import findings, report

CRDS = pathlib.Path(__file__).resolve().parents[3] / "deploy" / "crds"
NOW = report.timestamp(1_750_000_000.25)


def finding(
    name: str, result: model.Result, *, namespace: str = "team-a", policy: str = "GPU001", kind: str = "Pod"
) -> findings.Finding:
    return findings.Finding(
        policy=policy,
        rule="visible-devices",
        result=result,
        action=model.Action.ENFORCE,
        severity=findings.Severity.HIGH,
        category="GPU Security",
        message="" if result is model.Result.PASS else f"{policy}: something about {name}",
        subject=findings.ObjectRef(namespace=namespace, kind=kind, name=name, api_version="v1", uid=f"uid-{name}"),
    )


MIXED = [
    finding("a", model.Result.FAIL),
    finding("b", model.Result.PASS),
    finding("c", model.Result.WARN),
    finding("d", model.Result.SKIP),
    finding("e", model.Result.ERROR),
    finding("f", model.Result.PASS),
]


def crd_schema(file: str) -> Mapping[str, Any]:
    document = yaml.safe_load((CRDS / file).read_text())
    (version,) = document["spec"]["versions"]
    schema: Mapping[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def violations(value: Any, schema: Mapping[str, Any], path: str = "") -> list[str]:
    """What the apiserver would reject or prune: wrong types, enums, missing required, unknown fields."""
    problems: list[str] = []
    kind = schema.get("type")
    types = {"object": dict, "array": list, "string": str, "boolean": bool, "integer": int}
    if kind and not isinstance(value, types[kind]) or (kind == "integer" and isinstance(value, bool)):
        return [f"{path or '/'}: {value!r} is not {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{path}: {value!r} not in {schema['enum']}")
    if kind == "object":
        properties = schema.get("properties")
        for key in schema.get("required", ()):
            if key not in value:
                problems.append(f"{path}/{key}: required")
        for key, item in value.items():
            if properties is not None and key in properties:
                problems += violations(item, properties[key], f"{path}/{key}")
            elif isinstance(schema.get("additionalProperties"), Mapping):
                problems += violations(item, schema["additionalProperties"], f"{path}/{key}")
            elif properties is not None and path != "/metadata":
                problems.append(f"{path}/{key}: not in the schema (would be pruned)")
    if kind == "array":
        for index, item in enumerate(value):
            problems += violations(item, schema["items"], f"{path}/{index}")
    return problems


@pytest.mark.parametrize(
    ("namespace", "file", "kind"),
    [
        ("team-a", "wgpolicyk8s.io_policyreports.yaml", "PolicyReport"),
        ("", "wgpolicyk8s.io_clusterpolicyreports.yaml", "ClusterPolicyReport"),
    ],
)
def test_a_built_report_fits_the_crd_schema(namespace: str, file: str, kind: str) -> None:
    items = [in_namespace(f, namespace) for f in MIXED]
    built = report.build(items, namespace=namespace, now=NOW)
    assert built["kind"] == kind
    assert violations(built, crd_schema(file)) == []


def in_namespace(item: findings.Finding, namespace: str) -> findings.Finding:
    return dataclasses.replace(item, subject=dataclasses.replace(item.subject, namespace=namespace))


def test_the_crds_name_shortnames_and_printer_columns() -> None:
    for file, short, scope in (
        ("wgpolicyk8s.io_policyreports.yaml", "polr", "Namespaced"),
        ("wgpolicyk8s.io_clusterpolicyreports.yaml", "cpolr", "Cluster"),
    ):
        document = yaml.safe_load((CRDS / file).read_text())
        assert document["apiVersion"] == "apiextensions.k8s.io/v1"
        assert document["spec"]["names"]["shortNames"] == [short]
        assert document["spec"]["scope"] == scope
        (version,) = document["spec"]["versions"]
        assert version["name"] == "v1alpha2" and version["served"] and version["storage"]
        columns = [c["name"] for c in version["additionalPrinterColumns"] if c.get("priority", 0) == 0]
        assert columns == ["Pass", "Fail", "Warn", "Error", "Skip", "Age"]


def test_every_result_has_the_policy_report_fields_and_a_seconds_nanos_timestamp() -> None:
    built = report.build([MIXED[0]], namespace="team-a", now=NOW)
    (result,) = built["results"]
    assert result == {
        "source": "gpu-admission",
        "policy": "GPU001",
        "rule": "visible-devices",
        "category": "GPU Security",
        "severity": "high",
        "timestamp": {"seconds": 1_750_000_000, "nanos": 250_000_000},
        "result": "fail",
        "scored": True,
        "resources": [{"apiVersion": "v1", "kind": "Pod", "namespace": "team-a", "name": "a", "uid": "uid-a"}],
        "message": "GPU001: something about a",
        "properties": {"action": "enforce"},
    }
    assert built["metadata"] == {
        "name": "gpu-admission",
        "namespace": "team-a",
        "labels": {"app.kubernetes.io/managed-by": "gpu-admission"},
    }


def test_only_non_pass_results_are_stored_by_default_and_the_summary_counts_them() -> None:
    wanted = report.desired(MIXED, namespaces={"team-a"}, all_results=False, now=NOW)
    built = wanted["team-a"]
    assert built is not None
    assert sorted(r["result"] for r in built["results"]) == ["error", "fail", "skip", "warn"]
    assert built["summary"] == {"pass": 0, "fail": 1, "warn": 1, "error": 1, "skip": 1}


def test_all_results_stores_passes_too() -> None:
    built = report.desired(MIXED, namespaces={"team-a"}, all_results=True, now=NOW)["team-a"]
    assert built is not None
    assert built["summary"] == {"pass": 2, "fail": 1, "warn": 1, "error": 1, "skip": 1}
    assert len(built["results"]) == 6


def test_namespaces_without_stored_results_get_no_report_and_findings_elsewhere_are_ignored() -> None:
    items = [
        finding("a", model.Result.PASS, namespace="quiet"),
        finding("b", model.Result.FAIL, namespace="loud"),
        finding("n", model.Result.FAIL, namespace="", kind="Node"),
        finding("x", model.Result.FAIL, namespace="not-owned"),
    ]
    wanted = report.desired(items, namespaces={"quiet", "loud", report.CLUSTER}, all_results=False, now=NOW)
    assert set(wanted) == {"quiet", "loud", ""}
    assert wanted["quiet"] is None
    assert wanted["loud"] is not None and wanted["loud"]["kind"] == "PolicyReport"
    assert wanted[""] is not None and wanted[""]["kind"] == "ClusterPolicyReport"
    assert "namespace" not in wanted[""]["metadata"]


def test_results_keep_the_timestamp_they_were_first_seen_with() -> None:
    first = report.build(MIXED[:2], namespace="team-a", now=NOW)
    later = report.timestamp(1_750_000_900.0)
    again = report.build(MIXED[:2] + [finding("g", model.Result.FAIL)], namespace="team-a", now=later, previous=first)
    stamps = {r["resources"][0]["name"]: r["timestamp"] for r in again["results"]}
    assert stamps["a"] == NOW  # unchanged result: first seen at NOW
    assert stamps["g"] == later  # new result
    assert report.build(MIXED[:2], namespace="team-a", now=later, previous=first) == first


def test_the_result_order_is_stable_whatever_the_input_order() -> None:
    assert report.build(list(reversed(MIXED)), namespace="team-a", now=NOW) == report.build(MIXED, namespace="team-a", now=NOW)


def test_a_report_past_the_size_cap_keeps_the_most_serious_results_and_says_how_many_it_left_out() -> None:
    items = [finding(f"p{i}", model.Result.SKIP) for i in range(5)] + [finding("bad", model.Result.FAIL)]
    built = report.build(items, namespace="team-a", now=NOW, max_results=3)
    assert len(built["results"]) == 3
    assert "bad" in {r["resources"][0]["name"] for r in built["results"]}
    assert built["metadata"]["annotations"] == {"gpu-admission.io/omitted-results": "3"}
    assert built["summary"]["skip"] == 5  # the summary counts what was left out too


def stored_copy(built: report.WireReport, *, version: str = "41") -> dict[str, Any]:
    """The report as the apiserver hands it back."""
    existing: dict[str, Any] = copy.deepcopy(dict(built))
    existing["metadata"].update({"resourceVersion": version, "uid": "x", "creationTimestamp": "2025-06-15T15:00:00Z"})
    return existing


def test_the_plan_creates_replaces_deletes_and_leaves_unchanged_reports_alone() -> None:
    same = report.build([MIXED[0]], namespace="same", now=NOW)
    changed_before = report.build([MIXED[0]], namespace="changed", now=NOW)
    changed_after = report.build([MIXED[2]], namespace="changed", now=NOW)
    new = report.build([MIXED[0]], namespace="new", now=NOW)
    existing = {
        "same": stored_copy(same),
        "changed": stored_copy(changed_before, version="7"),
        "fixed": stored_copy(report.build([MIXED[0]], namespace="fixed", now=NOW)),
        "stale": stored_copy(report.build([MIXED[0]], namespace="stale", now=NOW)),
    }
    steps = report.plan({"same": same, "changed": changed_after, "new": new, "fixed": None}, existing)
    assert [(s.verb, s.namespace, s.resource_version) for s in steps] == [
        (report.Verb.REPLACE, "changed", "7"),
        (report.Verb.DELETE, "fixed", ""),
        (report.Verb.CREATE, "new", ""),
        (report.Verb.DELETE, "stale", ""),
    ]


def test_the_list_output_holds_the_reports_that_exist() -> None:
    wanted = report.desired(MIXED, namespaces={"team-a", "quiet"}, all_results=False, now=NOW)
    listed = report.as_list(wanted)
    assert listed["apiVersion"] == "v1" and listed["kind"] == "List"
    assert [item["metadata"]["namespace"] for item in listed["items"]] == ["team-a"]


def test_timestamps_are_whole_seconds_and_nanos() -> None:
    assert report.timestamp(12.5) == {"seconds": 12, "nanos": 500_000_000}
    assert report.timestamp(12.9999999999) == {"seconds": 12, "nanos": 999_999_999}


def _acting(item: findings.Finding, action: model.Action) -> findings.Finding:
    return dataclasses.replace(item, action=action)


def test_a_failure_of_a_warn_level_policy_is_an_unscored_warn_as_kyverno_reports_it() -> None:
    failed_warn = _acting(finding("w", model.Result.FAIL), model.Action.WARN)
    built = report.build([failed_warn], namespace="team-a", now=NOW)
    (result,) = built["results"]
    assert (result["result"], result["scored"], result["properties"]) == ("warn", False, {"action": "warn"})
    assert built["summary"] == {"pass": 0, "fail": 0, "warn": 1, "error": 0, "skip": 0}


@pytest.mark.parametrize("action", [model.Action.ENFORCE, model.Action.AUDIT])
def test_failures_of_enforce_and_audit_policies_stay_scored_failures(action: model.Action) -> None:
    (result,) = report.build([_acting(finding("x", model.Result.FAIL), action)], namespace="team-a", now=NOW)["results"]
    assert (result["result"], result["scored"]) == ("fail", True)


def test_every_warn_is_unscored_and_every_other_result_scored() -> None:
    built = report.desired(MIXED, namespaces={"team-a"}, all_results=True, now=NOW)["team-a"]
    assert built is not None
    assert {r["result"]: r["scored"] for r in built["results"]} == {
        "fail": True,
        "warn": False,
        "skip": True,
        "error": True,
        "pass": True,
    }


def test_an_error_of_a_warn_level_policy_stays_an_error() -> None:
    (result,) = report.build([_acting(finding("e", model.Result.ERROR), model.Action.WARN)], namespace="team-a", now=NOW)[
        "results"
    ]
    assert (result["result"], result["scored"]) == ("error", True)


# --- per-resource reports (--report-scope resource) -----------------------------------------------


def test_a_per_resource_report_is_named_by_uid_scoped_and_owned_by_its_object() -> None:
    a = finding("a", model.Result.FAIL)
    built = report.build([a], namespace="team-a", now=NOW, subject=a.subject)
    assert built["metadata"] == {
        "name": "uid-a",
        "namespace": "team-a",
        "labels": {"app.kubernetes.io/managed-by": "gpu-admission", "gpu-admission.io/report-scope": "resource"},
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "a", "uid": "uid-a"}],
    }
    assert built["scope"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "team-a", "name": "a", "uid": "uid-a"}
    assert violations(built, crd_schema("wgpolicyk8s.io_policyreports.yaml")) == []


def test_an_object_from_a_file_has_no_uid_so_its_report_is_named_by_kind_and_name_and_owned_by_nothing() -> None:
    subject = findings.ObjectRef(namespace="team-a", kind="Deployment", name="Trainer_1", api_version="apps/v1")
    item = dataclasses.replace(finding("x", model.Result.FAIL), subject=subject)
    built = report.build([item], namespace="team-a", now=NOW, subject=subject)
    assert built["metadata"]["name"] == "deployment-trainer-1" and "ownerReferences" not in built["metadata"]


def test_per_resource_mode_writes_one_report_per_object_and_deletes_the_stale_ones() -> None:
    node = finding("gpu-0", model.Result.FAIL, namespace="", kind="Node")
    stale_key = ("team-a", "uid-gone")
    elsewhere = ("team-b", "uid-other")
    wanted = report.desired_by_resource(
        [*MIXED, node, finding("z", model.Result.FAIL, namespace="team-c")],
        namespaces={"team-a", report.CLUSTER},
        all_results=False,
        now=NOW,
        previous={stale_key: {"results": []}, elsewhere: {"results": []}},
    )
    assert set(wanted) == {
        ("team-a", "uid-a"),
        ("team-a", "uid-c"),
        ("team-a", "uid-d"),
        ("team-a", "uid-e"),
        ("", "uid-gpu-0"),
        stale_key,
    }
    assert wanted[stale_key] is None  # its object is fixed or gone; team-b is not this run's
    cluster_report = wanted[("", "uid-gpu-0")]
    assert cluster_report is not None and cluster_report["kind"] == "ClusterPolicyReport"
    assert violations(cluster_report, crd_schema("wgpolicyk8s.io_clusterpolicyreports.yaml")) == []
    for built in wanted.values():
        if built is not None:
            assert len(built["results"]) == 1 and built["scope"]["name"] == built["results"][0]["resources"][0]["name"]
            assert sum(cast(Mapping[str, int], built["summary"]).values()) == 1  # Counts: every value an int
    steps = report.plan(wanted, {stale_key: {"metadata": {}, "results": []}})
    assert [(s.verb, s.namespace, s.name) for s in steps if s.verb is report.Verb.DELETE] == [
        (report.Verb.DELETE, "team-a", "uid-gone")
    ]
    assert sorted(s.name for s in steps if s.verb is report.Verb.CREATE) == ["uid-a", "uid-c", "uid-d", "uid-e", "uid-gpu-0"]


def test_a_second_per_resource_run_over_the_same_findings_writes_nothing() -> None:
    first = report.desired_by_resource(MIXED, namespaces={"team-a"}, all_results=False, now=NOW)
    stored = {key: body for key, body in first.items() if body is not None}
    later = report.timestamp(1_760_000_000.0)
    again = report.desired_by_resource(MIXED, namespaces={"team-a"}, all_results=False, now=later, previous=stored)
    assert again == first  # timestamps kept
    assert report.plan(again, stored) == []


def test_the_default_mode_keeps_one_report_per_namespace_named_gpu_admission() -> None:
    steps = report.plan(report.desired(MIXED, namespaces={"team-a"}, all_results=False, now=NOW), {})
    assert [(s.verb, s.namespace, s.name) for s in steps] == [(report.Verb.CREATE, "team-a", "gpu-admission")]
