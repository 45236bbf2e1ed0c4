"""In front of HAMi, koordinator and Volcano, through the real apiserver: the scheduler's own service account
writes its device annotations by pod UPDATE and is admitted, a tenant writing the same is refused, a
tenant's pod asking for that scheduler's resources with `privileged: true` or
`NVIDIA_VISIBLE_DEVICES=all` is refused, and its containers without a GPU get `void`.

The webhook runs with `scheduler: hami` (or `koordinator`, `volcano`), whose default writers are the service
accounts the schedulers' charts install. The test makes those accounts, with RBAC to patch pods as
the real schedulers have, and acts as them by impersonation (`kubectl --as`). The pods and
annotation values are the schedulers' own (tests/data/schedulers/).

With `scheduler: kai`, KAI-Scheduler's fraction pod as KAI's webhook returns it, and the card its
binder writes into the ConfigMap that pod names, are refused; the binder's empty ConfigMap and the
fraction pod before KAI's webhook are admitted (docs/schedulers/kai.md says why).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.harness import Cluster, webhook_settings

pytestmark = pytest.mark.e2e

DATA = Path(__file__).resolve().parents[1] / "data" / "schedulers"
WRITTEN: dict[str, dict[str, str]] = yaml.safe_load((DATA / "annotations.yaml").read_text())
PROFILES = {
    # profile: (the scheduler's service account, the example pod)
    "hami": (("kube-system", "hami-scheduler"), "hami-default_use.yaml"),
    "koordinator": (("koordinator-system", "koord-scheduler"), "koordinator-gpu-share.yaml"),
    "volcano": (("volcano-system", "volcano-scheduler"), "volcano-vgpu-case01.yml"),
}
VOID = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}


def example(name: str, pod_name: str) -> dict[str, Any]:
    found: dict[str, Any] = yaml.safe_load((DATA / name).read_text())
    found["metadata"] = {"name": pod_name}
    found["spec"]["containers"][0]["image"] = "registry.example/app:1"
    return found


def create(cluster: Cluster, obj: dict[str, Any], *, namespace: str) -> Any:
    return cluster.kubectl("create", "-n", namespace, "-f", "-", stdin=json.dumps(obj))


def annotate(cluster: Cluster, name: str, *, namespace: str, annotations: dict[str, str], user: str = "") -> Any:
    patch = json.dumps({"metadata": {"annotations": annotations}})
    impersonate = [f"--as={user}"] if user else []
    return cluster.kubectl("patch", "pod", name, "-n", namespace, "--type=merge", "-p", patch, *impersonate)


def scheduler_account(cluster: Cluster, namespace: str, name: str) -> str:
    """The service account, made with RBAC to read and patch pods (what the scheduler's chart grants)."""
    manifests = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": f"e2e-{namespace}-{name}"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "patch", "update"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"e2e-{namespace}-{name}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"e2e-{namespace}-{name}"},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    ]
    for manifest in manifests:
        completed = cluster.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
        assert completed.returncode == 0, completed.stderr
    return f"system:serviceaccount:{namespace}:{name}"


@pytest.fixture(scope="module", params=sorted(PROFILES))
def profiled(
    request: pytest.FixtureRequest, cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Cluster]]:
    profile = str(request.param)
    with webhook_settings(cluster, {"scheduler": profile}, directory=tmp_path_factory.mktemp(profile)):
        yield profile, cluster


def test_the_schedulers_service_account_writes_its_device_annotations_and_a_tenant_cannot(profiled: tuple[str, Cluster]) -> None:
    profile, cluster = profiled
    (account_namespace, account), pod_file = PROFILES[profile]
    writer = scheduler_account(cluster, account_namespace, account)
    ns = cluster.namespace()
    assert create(cluster, example(pod_file, "shared"), namespace=ns).returncode == 0
    written = WRITTEN[profile]

    tenant = annotate(cluster, "shared", namespace=ns, annotations=written)
    assert tenant.returncode != 0
    assert 'admission webhook "validate.gpu-admission.io" denied the request: GPU010: ' in tenant.stderr
    assert f"the update adds {sorted(written)[0]}" in tenant.stderr
    # a tenant's own account of the same name is another user
    impostor = scheduler_account(cluster, ns, account)
    assert annotate(cluster, "shared", namespace=ns, annotations=written, user=impostor).returncode != 0
    assert not set(written) & set(cluster.get("pod", "shared", namespace=ns)["metadata"].get("annotations", {}))

    scheduler = annotate(cluster, "shared", namespace=ns, annotations=written, user=writer)
    assert scheduler.returncode == 0, scheduler.stderr
    stored = cluster.get("pod", "shared", namespace=ns)["metadata"]["annotations"]
    assert {key: stored[key] for key in written} == written

    # once written, a tenant cannot change them either
    changed = {
        key: value.replace("3000", "30000").replace("16Gi", "80Gi").replace("16384", "81920") for key, value in written.items()
    }
    assert changed != written
    assert annotate(cluster, "shared", namespace=ns, annotations=changed).returncode != 0


def test_a_tenant_cannot_create_a_pod_carrying_them(profiled: tuple[str, Cluster]) -> None:
    profile, cluster = profiled
    ns = cluster.namespace()
    forged = example(PROFILES[profile][1], "forged")
    forged["metadata"]["annotations"] = WRITTEN[profile]

    completed = create(cluster, forged, namespace=ns)

    assert completed.returncode != 0
    assert "GPU010: " in completed.stderr
    assert cluster.pods(namespace=ns) == []


@pytest.mark.parametrize(
    "bypass",
    [{"securityContext": {"privileged": True}}, {"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}],
    ids=["privileged", "all-cards"],
)
def test_a_tenant_pod_with_the_schedulers_resources_and_a_bypass_is_refused(
    profiled: tuple[str, Cluster], bypass: dict[str, Any]
) -> None:
    profile, cluster = profiled
    ns = cluster.namespace()
    pod = example(PROFILES[profile][1], "bypass")
    pod["spec"]["containers"][0].update(bypass)

    completed = create(cluster, pod, namespace=ns)

    assert completed.returncode != 0
    policy = "GPU002" if "securityContext" in bypass else "GPU001"
    assert f"denied the request: {policy}: " in completed.stderr
    assert cluster.pods(namespace=ns) == []


def test_its_containers_without_a_gpu_get_void_and_its_gpu_container_keeps_its_devices(profiled: tuple[str, Cluster]) -> None:
    profile, cluster = profiled
    ns = cluster.namespace()
    pod = example(PROFILES[profile][1], "sidecar")
    pod["spec"]["containers"].append({"name": "log", "image": "registry.example/log:1"})
    pod["spec"]["initContainers"] = [{"name": "fetch", "image": "registry.example/fetch:1"}]

    completed = create(cluster, pod, namespace=ns)

    assert completed.returncode == 0, completed.stderr
    spec = cluster.get("pod", "sidecar", namespace=ns)["spec"]
    assert "env" not in spec["containers"][0]
    assert spec["containers"][1]["env"] == [VOID]
    assert spec["initContainers"][0]["env"] == [VOID]
    # the extender's rules are off: koord-scheduler's and HAMi's pods keep their scheduler
    assert spec.get("schedulerName") == pod["spec"].get("schedulerName", "default-scheduler")


KAI_BINDER = ("kai-scheduler", "binder")  # deployments/kai-scheduler/templates/rbac/binder-binding.yaml (v0.12.17)


def kai_binder(cluster: Cluster) -> str:
    """KAI's binder account, with the ConfigMap verbs its ClusterRole `kai-binder` grants."""
    namespace, name = KAI_BINDER
    user = scheduler_account(cluster, namespace, name)
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": f"e2e-{namespace}-{name}"},
        "rules": [
            {"apiGroups": [""], "resources": ["pods", "configmaps"], "verbs": ["create", "get", "list", "patch", "update"]}
        ],
    }
    completed = cluster.kubectl("apply", "-f", "-", stdin=json.dumps(role))
    assert completed.returncode == 0, completed.stderr
    return user


@pytest.fixture(scope="module")
def kai(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with webhook_settings(cluster, {"scheduler": "kai"}, directory=tmp_path_factory.mktemp("kai")) as configured:
        yield configured


def test_kai_fractions_stay_refused_through_the_real_apiserver(kai: Cluster) -> None:
    binder = kai_binder(kai)
    ns = kai.namespace()
    mutated: dict[str, Any] = yaml.safe_load((DATA / "kai-gpu-sharing-mutated.yaml").read_text())
    mutated["spec"]["containers"][0]["image"] = "registry.example/app:1"
    plain = example("kai-gpu-sharing.yaml", "plain")
    plain["metadata"]["annotations"] = {"gpu-fraction": "0.5"}
    config_map: dict[str, Any] = yaml.safe_load((DATA / "kai-shared-gpu-configmap.yaml").read_text())
    name = config_map["metadata"]["name"]
    del config_map["metadata"]["ownerReferences"]  # the pod it names is never created here
    config_map["metadata"]["namespace"] = ns
    card = dict(config_map.pop("data"))

    refused = create(kai, mutated, namespace=ns)
    assert refused.returncode != 0
    assert "denied the request: GPU001: " in refused.stderr
    assert f"from ConfigMap '{name}' key 'NVIDIA_VISIBLE_DEVICES'" in refused.stderr
    assert create(kai, plain, namespace=ns).returncode == 0
    assert [p["metadata"]["name"] for p in kai.pods(namespace=ns)] == ["plain"]

    # the binder's first write (empty) passes; the card it then patches in does not, nor a tenant's
    empty = kai.kubectl("create", "-n", ns, "-f", "-", f"--as={binder}", stdin=json.dumps(config_map))
    assert empty.returncode == 0, empty.stderr
    for user in (binder, ""):
        patch = json.dumps({"data": card if user else {"NVIDIA_VISIBLE_DEVICES": "all"}})
        impersonate = [f"--as={user}"] if user else []
        written = kai.kubectl("patch", "configmap", name, "-n", ns, "--type=merge", "-p", patch, *impersonate)
        assert written.returncode != 0
        assert "denied the request: GPU007: " in written.stderr
    assert "data" not in kai.get("configmap", name, namespace=ns)
