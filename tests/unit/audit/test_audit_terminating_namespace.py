"""A cluster-wide `audit --write-reports` meets namespaces being deleted: the apiserver refuses a
new PolicyReport there (403, NamespaceTerminating). That namespace's pods go with it, so the report
is skipped with a warning; any other refusal (RBAC, a missing CRD) still fails the run."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client import exceptions

from webhook.audit import kube, report
from webhook.kube import errors as kube_errors


class Custom:
    def __init__(self, message: str) -> None:
        self.message = message
        self.created: list[str] = []

    def create_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, body: Any) -> Any:
        if namespace == "going":
            error = exceptions.ApiException(status=403, reason="Forbidden")
            error.body = json.dumps({"kind": "Status", "status": "Failure", "reason": "Forbidden", "message": self.message})
            raise error
        self.created.append(namespace)
        return body


def _step(namespace: str) -> report.Step:
    body: Any = {
        "apiVersion": report.API_VERSION,
        "kind": "PolicyReport",
        "metadata": {"name": report.NAME, "namespace": namespace},
    }
    return report.Step(verb=report.Verb.CREATE, namespace=namespace, body=body)


TERMINATING = 'policyreports.wgpolicyk8s.io "gpu-admission" is forbidden: unable to create new content in namespace going because it is being terminated'


def test_a_report_for_a_namespace_being_deleted_is_skipped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    custom = Custom(TERMINATING)
    kube._write(custom, _step("going"))
    kube._write(custom, _step("team-a"))
    assert custom.created == ["team-a"]
    assert "not writing policyreports/gpu-admission in going: the namespace is being deleted" in caplog.text


def test_any_other_refusal_still_fails_the_write() -> None:
    custom = Custom('policyreports.wgpolicyk8s.io is forbidden: User "audit" cannot create resource "policyreports"')
    with pytest.raises(kube_errors.KubeError, match="cannot create policyreports/gpu-admission in going: 403"):
        kube._write(custom, _step("going"))
