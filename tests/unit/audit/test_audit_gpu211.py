"""GPU211 guarded-env-source: existing ConfigMaps/Secrets that carry (or, through a prefix, deliver)
a GPU environment name, with the containers taking them; keys and names only, never values."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from policies import model
from policies import settings as settings_
from tests.unit.audit.conftest import NOW, PodFactory, WorkloadFactory
from webhook.audit import kube, scan

SECRET_VALUE = "do-not-print-me"


def source(kind: str, name: str, data: dict[str, str], *, namespace: str = "team-a") -> dict[str, Any]:
    values = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()} if kind == "Secret" else data
    applied = json.dumps({"kind": kind, "data": values})  # kubectl apply keeps the whole object here
    return {
        "apiVersion": "v1",
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": applied},
        },
        "data": values,
    }


def taking(pod: PodFactory, name: str, env_from: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
    built = pod(name, gpu_mem=1, **kwargs)
    built["spec"]["containers"][0]["envFrom"] = env_from
    return built


def run(*objects: dict[str, Any], settings: settings_.Settings | None = None, scope: scan.Scope = scan.Scope()) -> scan.Audit:
    return scan.run(scan.Inventory.of(objects), settings=settings or settings_.Settings(), scope=scope, now=NOW)


def gpu211(audit: scan.Audit) -> list[Any]:
    return [f for f in audit.findings if f.policy == "GPU211"]


def test_a_secret_with_the_key_that_a_gpu_container_takes_fails_naming_keys_and_containers(pod: PodFactory) -> None:
    audit = run(
        source("Secret", "creds", {"CGPU_DISABLE": SECRET_VALUE, "TOKEN": SECRET_VALUE}),
        taking(pod, "trainer", [{"secretRef": {"name": "creds"}}]),
        taking(pod, "other", [{"secretRef": {"name": "elsewhere"}}]),
    )

    (found,) = gpu211(audit)
    assert (found.result, found.action, found.subject.kind, found.subject.name) == (
        model.Result.FAIL,
        model.Action.ENFORCE,
        "Secret",
        "creds",
    )
    assert found.message == (
        "GPU211: no ConfigMap or Secret delivers a GPU environment variable through envFrom: it has the key CGPU_DISABLE; "
        'envFrom delivers it: Pod/trainer container "main" gets CGPU_DISABLE; rename the keys, or change the envFrom prefix'
    )
    assert [r.name for r in found.related] == ["trainer"]
    assert audit.exit_status == 1
    assert SECRET_VALUE not in repr(audit) and base64.b64encode(SECRET_VALUE.encode()).decode() not in repr(audit)


def test_a_source_with_the_key_that_nothing_takes_yet_warns(pod: PodFactory) -> None:
    audit = run(source("ConfigMap", "gpus", {"NVIDIA_VISIBLE_DEVICES": "void"}), pod("plain", gpu_mem=1))

    (found,) = gpu211(audit)
    assert (found.result, found.action) == (model.Result.WARN, model.Action.WARN)
    assert "it has the key NVIDIA_VISIBLE_DEVICES; no container takes it by envFrom yet" in found.message


def test_a_prefix_that_composes_a_guarded_name_from_an_ordinary_key_fails_on_the_source(
    pod: PodFactory, workload: WorkloadFactory
) -> None:
    template = taking(pod, "tpl", [{"prefix": "NVIDIA_", "configMapRef": {"name": "settings"}}])
    audit = run(
        source("ConfigMap", "settings", {"VISIBLE_DEVICES": "all", "LOG_LEVEL": "debug"}),
        workload("Deployment", "web", pod=template),
    )

    (found,) = gpu211(audit)
    assert found.result is model.Result.FAIL
    assert 'envFrom delivers it: Deployment/web container "main" gets NVIDIA_VISIBLE_DEVICES' in found.message


def test_env_that_sets_the_name_itself_wins_over_env_from(pod: PodFactory) -> None:
    overriding = taking(
        pod, "safe", [{"configMapRef": {"name": "gpus"}}], env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    )

    (found,) = gpu211(run(source("ConfigMap", "gpus", {"NVIDIA_VISIBLE_DEVICES": "all"}), overriding))

    assert found.result is model.Result.WARN  # still a source with the key, but nothing takes it


@pytest.mark.parametrize(
    "objects",
    [
        # An ordinary source taken by a GPU container; a look-alike key; a same-named source of the
        # other kind; a consumer in another namespace; a finished pod.
        lambda pod: [source("ConfigMap", "app", {"LOG_LEVEL": "debug"}), taking(pod, "a", [{"configMapRef": {"name": "app"}}])],
        lambda pod: [source("ConfigMap", "app", {"nvidia_visible_devices": "all", "VISIBLE_DEVICES": "x"})],
        lambda pod: [
            source("Secret", "app", {"VISIBLE_DEVICES": "x"}),
            taking(pod, "a", [{"prefix": "NVIDIA_", "configMapRef": {"name": "app"}}]),
        ],
        lambda pod: [
            source("ConfigMap", "app", {"VISIBLE_DEVICES": "x"}),
            taking(pod, "a", [{"prefix": "NVIDIA_", "configMapRef": {"name": "app"}}], namespace="team-b"),
        ],
        lambda pod: [
            source("ConfigMap", "app", {"VISIBLE_DEVICES": "x"}),
            taking(pod, "a", [{"prefix": "NVIDIA_", "configMapRef": {"name": "app"}}], phase="Succeeded"),
        ],
    ],
)
def test_ordinary_sources_and_consumers_give_no_result(pod: PodFactory, objects: Any) -> None:
    audit = run(*objects(pod))

    assert gpu211(audit) == []


def test_exempt_namespaces_and_the_namespace_filter_are_respected(pod: PodFactory) -> None:
    system = source("ConfigMap", "plugin-env", {"CGPU_DISABLE": "1"}, namespace="kube-system")
    elsewhere = source("ConfigMap", "gpus", {"CGPU_DISABLE": "1"}, namespace="team-b")

    (skipped,) = gpu211(run(system))
    assert (skipped.result, skipped.message) == (model.Result.SKIP, "namespace kube-system is exempt")
    assert gpu211(run(elsewhere, scope=scan.Scope(namespaces=frozenset({"team-a"})))) == []


def test_the_inventory_keeps_keys_only() -> None:
    inventory = scan.Inventory.of([source("Secret", "creds", {"CGPU_DISABLE": SECRET_VALUE})])

    (kept,) = inventory.env_sources
    assert kept == {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "creds", "namespace": "team-a", "uid": "uid-creds"},
        "data": {"CGPU_DISABLE": ""},
    }


# --- the live listing: paged, keys only, a forbidden kind is a warning --------------------------------


class Response:
    def __init__(self, body: dict[str, Any]) -> None:
        self.data = json.dumps(body).encode()


class FakeCore:
    """CoreV1Api's list calls for ConfigMaps (two pages) and Secrets (forbidden, or one page)."""

    def __init__(self, *, secrets_forbidden: bool) -> None:
        self.secrets_forbidden = secrets_forbidden
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def list_config_map_for_all_namespaces(self, **kwargs: Any) -> Response:
        self.calls.append(("configmaps", kwargs))
        if kwargs.get("_continue") == "page-2":
            return Response({"metadata": {}, "items": [source("ConfigMap", "b", {"CGPU_DISABLE": "1"})]})
        return Response({"metadata": {"continue": "page-2"}, "items": [source("ConfigMap", "a", {"X": "1"})]})

    def list_namespaced_config_map(self, namespace: str, **kwargs: Any) -> Response:
        self.calls.append((f"configmaps/{namespace}", kwargs))
        return Response({"metadata": {}, "items": []})

    def list_secret_for_all_namespaces(self, **kwargs: Any) -> Response:
        self.calls.append(("secrets", kwargs))
        if self.secrets_forbidden:
            from webhook.kube import client_exceptions  # noqa: PLC0415 - the lazy kubernetes handle

            raise client_exceptions.ApiException(status=403, reason="Forbidden")
        return Response({"metadata": {}, "items": [source("Secret", "s", {"NVIDIA_VISIBLE_DEVICES": SECRET_VALUE})]})

    def list_namespaced_secret(self, namespace: str, **kwargs: Any) -> Response:
        raise AssertionError("not called without a namespace")


def test_the_listing_pages_through_sources_and_keeps_keys_only() -> None:
    core = FakeCore(secrets_forbidden=False)

    listed = kube.env_sources(core, namespace=None, chunk=1)

    assert [(s["kind"], s["metadata"]["name"]) for s in listed] == [("ConfigMap", "a"), ("ConfigMap", "b"), ("Secret", "s")]
    assert [c[1].get("_continue") for c in core.calls if c[0] == "configmaps"] == [None, "page-2"]
    assert all(c[1]["limit"] == 1 for c in core.calls)
    assert SECRET_VALUE not in repr(listed)


def test_a_forbidden_secret_listing_is_a_warning_and_config_maps_still_count(caplog: pytest.LogCaptureFixture) -> None:
    listed = kube.env_sources(FakeCore(secrets_forbidden=True), namespace=None, chunk=500)

    assert {s["kind"] for s in listed} == {"ConfigMap"}
    assert "Secret objects not listed, GPU211 does not cover them" in caplog.text
