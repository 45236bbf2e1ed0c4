"""Per-resource PolicyReports through the real apiserver (`audit --write-reports --report-scope
resource`): one report per object, named by its uid, with `scope` and an ownerReference, which the
garbage collector follows when the object is deleted; the per-namespace report is left alone."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.harness import Cluster, eventually
from tests.e2e.test_audit import BYPASS_ENV, audit, crds, pod, webhook_unregistered

pytestmark = pytest.mark.e2e

__all__ = ["crds"]  # the fixture, used by name


def scoped_reports(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    completed = cluster.kubectl(
        "get", "policyreports", "-n", namespace, "-l", "gpu-admission.io/report-scope=resource", "-o", "json"
    )
    assert completed.returncode == 0, completed.stderr
    items: list[dict[str, Any]] = json.loads(completed.stdout)["items"]
    return items


def test_per_resource_reports_are_scoped_owned_and_collected_with_their_object(cluster: Cluster, crds: None) -> None:
    ns = cluster.namespace()
    with webhook_unregistered(cluster):
        created = cluster.apply([pod("sneaky", env=BYPASS_ENV), pod("clean")], namespace=ns)
        assert created.returncode == 0, created.stderr
    sneaky = cluster.get("pod", "sneaky", namespace=ns)
    uid = sneaky["metadata"]["uid"]
    written = audit(cluster, "-n", ns, "--write-reports", "--report-scope", "resource", "-o", "json")
    assert written.returncode == 1, written.stderr  # GPU001 fails at enforce level
    (found,) = [item for item in scoped_reports(cluster, ns) if item["metadata"]["name"] == uid]
    assert found["scope"] == {"apiVersion": "v1", "kind": "Pod", "namespace": ns, "name": "sneaky", "uid": uid}
    assert found["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod", "name": "sneaky", "uid": uid}]
    assert {r["policy"] for r in found["results"] if r["result"] == "fail"} >= {"GPU001"}
    assert (
        cluster.kubectl("get", "policyreport", "gpu-admission", "-n", ns).returncode != 0
    )  # no per-namespace report was written

    again = audit(cluster, "-n", ns, "--write-reports", "--report-scope", "resource")
    assert "0 created, 0 replaced, 0 deleted" in again.stderr  # an unchanged namespace writes nothing

    deleted = cluster.kubectl("delete", "pod", "sneaky", "-n", ns, "--grace-period=0", "--force")
    assert deleted.returncode == 0, deleted.stderr
    eventually(
        lambda: all(item["metadata"]["name"] != uid for item in scoped_reports(cluster, ns)),
        what="the report collected with its pod",
        timeout=90,
    )
    cluster.kubectl("delete", "namespace", ns, "--wait=false")
