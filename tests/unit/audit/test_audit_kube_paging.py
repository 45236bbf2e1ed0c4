"""The audit's kube adapter pages every list it makes: our reports too, not only what it audits (issue 19)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import kubernetes.client
import pytest

from webhook.audit import kube, report


@dataclasses.dataclass
class Response:
    """What the client returns with `_preload_content=False`: the raw body."""

    body: dict[str, Any]

    @property
    def data(self) -> bytes:
        return json.dumps(self.body).encode()


def _report(kind: str, namespace: str, name: str = report.NAME) -> dict[str, Any]:
    metadata = {"name": name, "resourceVersion": "7", "labels": {report.MANAGED_BY_LABEL: report.MANAGED_BY}}
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": report.API_VERSION, "kind": kind, "metadata": metadata, "results": []}


class FakeCustom:
    """CustomObjectsApi's list calls: PolicyReports in two pages of one, one ClusterPolicyReport page."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def list_cluster_custom_object(self, group: str, version: str, plural: str, **kwargs: Any) -> Response:
        self.calls.append((plural, kwargs))
        if plural == "clusterpolicyreports":
            return Response({"metadata": {}, "items": [_report("ClusterPolicyReport", "")]})
        if kwargs.get("_continue") == "page-2":
            return Response(
                {"metadata": {}, "items": [_report("PolicyReport", "b"), _report("PolicyReport", "b", "someone-else")]}
            )
        return Response({"metadata": {"continue": "page-2"}, "items": [_report("PolicyReport", "a")]})

    def list_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, **kwargs: Any) -> Response:
        self.calls.append((f"{plural}/{namespace}", kwargs))
        return Response({"metadata": {}, "items": [_report("PolicyReport", namespace)]})


@pytest.fixture
def custom(monkeypatch: pytest.MonkeyPatch) -> FakeCustom:
    fake = FakeCustom()
    # `webhook.kube.client` is a lazy handle that reads its attributes off kubernetes.client.
    monkeypatch.setattr(kubernetes.client, "CustomObjectsApi", lambda api: fake)
    return fake


def test_existing_reports_are_listed_page_by_page_with_a_limit(custom: FakeCustom) -> None:
    api: Any = object()

    found = kube.existing_reports(api, namespace=None, cluster=True)

    assert sorted(found) == [report.CLUSTER, "a", "b"]  # another name in namespace b is not ours
    assert [plural for plural, _ in custom.calls] == ["policyreports", "policyreports", "clusterpolicyreports"]
    assert all(kwargs["limit"] == kube.CHUNK for _, kwargs in custom.calls)
    assert [kwargs.get("_continue") for _, kwargs in custom.calls] == [None, "page-2", None]
    assert all(kwargs["label_selector"] == f"{report.MANAGED_BY_LABEL}={report.MANAGED_BY}" for _, kwargs in custom.calls)


def test_one_namespace_lists_that_namespace_only_and_no_cluster_report(custom: FakeCustom) -> None:
    api: Any = object()

    found = kube.existing_reports(api, namespace="team", cluster=False)

    assert list(found) == ["team"]
    assert [(plural, kwargs["limit"]) for plural, kwargs in custom.calls] == [("policyreports/team", kube.CHUNK)]


def test_listed_objects_arrive_without_managed_fields_and_with_their_kind() -> None:
    calls: list[dict[str, Any]] = []

    def list_pods(**kwargs: Any) -> Response:
        calls.append(kwargs)
        managed = [{"manager": "kubelet", "operation": "Update", "fieldsV1": {"f:status": {}}}]
        pod = {"metadata": {"name": f"p{len(calls)}", "managedFields": managed, "labels": {"a": "b"}}, "spec": {}}
        return Response({"metadata": {"continue": "next"} if len(calls) == 1 else {}, "items": [pod]})

    listing = kube._Listing(kind="Pod", api_version="v1", all_namespaces=list_pods, namespaced=None)

    found = list(kube._pages(listing, namespace=None, chunk=1))

    assert found == [
        {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": name, "labels": {"a": "b"}}, "spec": {}} for name in ("p1", "p2")
    ]
    assert [c.get("_continue") for c in calls] == [None, "next"] and all(c["limit"] == 1 for c in calls)
