"""The audit lists through plain GETs on the client, not its API classes (issue 19): the same requests,
the client's authentication and errors, and no model class loaded.

A real `kubernetes.client.ApiClient` whose urllib3 pool is replaced by a recorder: everything above
the pool (query serialisation, the bearer token, status handling) is the client's own.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import urllib.parse
from typing import Any

import kubernetes.client
import pytest
import urllib3

from webhook.audit import kube
from webhook.kube import errors as kube_errors


class Recorder:
    """Stands in for the client's urllib3 pool: answers from `pages` by path and continue token."""

    def __init__(self, pages: dict[tuple[str, str], dict[str, Any]], *, status: int = 200) -> None:
        self.pages = pages
        self.status = status
        self.requests: list[tuple[str, str, dict[str, list[str]], dict[str, str]]] = []

    def request(self, method: str, url: str, **kwargs: Any) -> urllib3.HTTPResponse:
        parts = urllib.parse.urlsplit(url)
        query = urllib.parse.parse_qs(parts.query)
        self.requests.append((method, parts.path, query, {k.lower(): v for k, v in (kwargs.get("headers") or {}).items()}))
        if self.status != 200:
            body = json.dumps(
                {"kind": "Status", "status": "Failure", "message": "forbidden: no", "reason": "Forbidden", "code": self.status}
            )
            return urllib3.HTTPResponse(
                body=io.BytesIO(body.encode()), status=self.status, reason="Forbidden", preload_content=False
            )
        page = self.pages.get((parts.path, query.get("continue", [""])[0]), {"metadata": {}, "items": []})
        return urllib3.HTTPResponse(body=io.BytesIO(json.dumps(page).encode()), status=200, preload_content=False)


def _api(recorder: Recorder, *, token: str = "") -> kubernetes.client.ApiClient:
    configuration = kubernetes.client.Configuration()
    configuration.host = "https://apiserver.test:6443"
    if token:
        configuration.api_key = {"BearerToken": token}
        configuration.api_key_prefix = {"BearerToken": "Bearer"}
    api = kubernetes.client.ApiClient(configuration)
    api.rest_client.pool_manager = recorder  # type: ignore[assignment]
    return api


def _pod(name: str, namespace: str = "team-a") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "managedFields": [{"manager": "m"}]}, "spec": {}}


def test_every_list_is_a_paged_get_of_the_kinds_path_with_the_token() -> None:
    recorder = Recorder(
        {
            ("/api/v1/pods", ""): {"metadata": {"continue": "next"}, "items": [_pod("a")]},
            ("/api/v1/pods", "next"): {"metadata": {}, "items": [_pod("b")]},
            ("/api/v1/nodes", ""): {"metadata": {}, "items": [{"metadata": {"name": "n1"}}]},
        }
    )

    objects = list(kube.objects(_api(recorder, token="s3cret"), chunk=1, ledger_namespace="ops"))

    paths = [path for _, path, _, _ in recorder.requests]
    assert paths[0] == "/api/v1/nodes" and paths[-2:] == ["/api/v1/pods", "/api/v1/pods"]
    assert {
        "/apis/apps/v1/deployments",
        "/apis/apps/v1/statefulsets",
        "/apis/apps/v1/daemonsets",
        "/apis/apps/v1/replicasets",
        "/api/v1/replicationcontrollers",
        "/apis/batch/v1/jobs",
        "/apis/batch/v1/cronjobs",
        "/api/v1/namespaces",
        "/api/v1/configmaps",
        "/api/v1/secrets",
        "/apis/coordination.k8s.io/v1/namespaces/ops/leases",
    } <= set(paths)
    assert all(method == "GET" and query["limit"] == ["1"] for method, _, query, _ in recorder.requests)
    assert all(
        headers.get("authorization") == "Bearer s3cret"
        and headers.get("accept") == "application/json"
        and headers.get("user-agent", "").startswith("OpenAPI-Generator/")  # the client's own (the bench counts lists by it)
        for _, _, _, headers in recorder.requests
    )
    assert [query.get("continue") for _, path, query, _ in recorder.requests if path == "/api/v1/pods"] == [None, ["next"]]
    pods = [o for o in objects if o["kind"] == "Pod"]
    assert [(p["metadata"]["name"], p["apiVersion"]) for p in pods] == [("a", "v1"), ("b", "v1")]
    assert all("managedFields" not in p["metadata"] for p in pods)


def test_one_namespace_lists_that_namespaces_paths_and_no_node_ledger() -> None:
    recorder = Recorder({("/api/v1/namespaces/team-a/pods", ""): {"metadata": {}, "items": [_pod("a")]}})

    objects = list(kube.objects(_api(recorder), namespace="team-a"))

    paths = {path for _, path, _, _ in recorder.requests}
    assert {
        "/api/v1/namespaces/team-a/pods",
        "/apis/apps/v1/namespaces/team-a/deployments",
        "/apis/batch/v1/namespaces/team-a/cronjobs",
        "/api/v1/namespaces/team-a/configmaps",
        "/api/v1/namespaces/team-a/secrets",
    } <= paths
    assert "/api/v1/pods" not in paths and not any("leases" in p for p in paths)
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "Pod"] == ["a"]


def test_a_failing_status_is_the_clients_error_with_what_was_being_listed(caplog: pytest.LogCaptureFixture) -> None:
    api = _api(Recorder({}, status=403))

    with pytest.raises(kube_errors.KubeError, match=r"^cannot list Pod objects in the cluster: 403") as raised:
        list(kube._pages(kube._listings(api)[1], namespace=None, chunk=10))
    assert raised.value.status == 403
    assert kube.env_sources(kube._RawCore(kube._Raw(api)), namespace=None) == []  # forbidden sources: a warning each
    assert "ConfigMap objects not listed" in caplog.text and "Secret objects not listed" in caplog.text


def test_listing_loads_none_of_the_clients_api_classes() -> None:
    script = (
        "import sys, kubernetes.client\n"
        "from tests.unit.audit.test_audit_kube_raw import Recorder, _api\n"
        "from webhook.audit import kube\n"
        "list(kube.objects(_api(Recorder({})), namespace=None))\n"
        "loaded = [m for m in ('kubernetes.client.api.core_v1_api', 'kubernetes.client.api.apps_v1_api', "
        "'kubernetes.client.api.batch_v1_api') if m in sys.modules]\n"
        "print(loaded)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
