"""GPU104 exported as a MutatingAdmissionPolicy (`policies export-map`) inside a real kube-apiserver
started with the MutatingAdmissionPolicy feature gate and admissionregistration.k8s.io/v1beta1.

The cluster of this module is its own (the session cluster runs the default apiserver), with
gpu-admission installed as usual. Creates are server-side dry runs, which run the whole admission
chain and return the pod as it would be stored. The same pods are created three ways: through the
webhook alone (the policy not applied), through the policy alone (the mutating webhook
registration removed), and through both; every CPU pod comes out byte-for-byte the same, and a
pod that already carries the mutation comes out unchanged (idempotence). Then the mutating webhook
is given the ordinary-pod match condition: an ordinary pod costs the webhook no call at all (its
own log counts the calls) and still gets the variable, while a GPU pod is still reviewed twice.
"""

from __future__ import annotations

import copy
import datetime
import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies import settings as settings_
from tests.e2e.harness import Cluster, eventually
from webhook.cluster import controlplane, install, nodes
from webhook.commands import mutating_policy

pytestmark = pytest.mark.e2e

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


@pytest.fixture(scope="module")
def map_cluster(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    directory = tmp_path_factory.mktemp("map-cluster")
    state = install.bring_up(
        directory,
        bin_dir=bin_dir,
        fake_nodes=nodes.load(None)[:2],
        apiserver_flags=controlplane.MUTATING_ADMISSION_POLICY_FLAGS,
    )
    try:
        yield Cluster(state)
    finally:
        controlplane.down(directory)


def pod(name: str, *containers: dict[str, Any], init: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"image": "registry.example/app:1", **c} for c in containers]}
    if init:
        spec["initContainers"] = [{"image": "registry.example/init:1", **c} for c in init]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


CPU_PODS = (
    pod("bare", {"name": "main"}),
    pod("with-env", {"name": "main", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}),
    pod(
        "two",
        {"name": "a", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}},
        {"name": "b", "env": [{"name": "C", "value": "3"}]},
        init=({"name": "setup"}, {"name": "prep", "env": [{"name": "D", "value": "4"}]}),
    ),
    pod("named-already", {"name": "main", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}]}, {"name": "side"}),
)
# A GPU pod with a CPU sidecar: only the sidecar gets the variable.
GPU_POD = pod("gpu", {"name": "train", "resources": {"limits": {"nvidia.com/gpu": 1}}}, {"name": "side"})


def dry_run(cluster: Cluster, manifest: dict[str, Any], *, namespace: str) -> dict[str, Any]:
    """The pod as the apiserver would store it, its random service-account token volume name made fixed."""
    completed = cluster.kubectl(
        "create", "--dry-run=server", "-n", namespace, "-o", "json", "-f", "-", stdin=json.dumps(manifest)
    )
    assert completed.returncode == 0, completed.stderr
    created: dict[str, Any] = json.loads(re.sub(r'"kube-api-access-[a-z0-9]+"', '"kube-api-access"', completed.stdout))
    return created


def env_of(created: dict[str, Any]) -> dict[str, list[Any]]:
    spec = created["spec"]
    return {f"{kind}/{c['name']}": c.get("env", []) for kind in ("initContainers", "containers") for c in spec.get(kind, [])}


def apply_policy(cluster: Cluster) -> None:
    exported = mutating_policy.export(settings_.Settings(), now=NOW)
    completed = cluster.kubectl("apply", "-f", "-", stdin=mutating_policy.render(exported.manifests))
    assert completed.returncode == 0, completed.stderr


def delete_policy(cluster: Cluster) -> None:
    for kind in ("mutatingadmissionpolicybindings", "mutatingadmissionpolicies"):
        cluster.kubectl("delete", kind, mutating_policy.NAME, "--ignore-not-found")


def mutating_registration(cluster: Cluster, *, skip_ordinary: bool) -> None:
    """Apply deploy/'s mutating webhook registration (pointed at the local webhook), with or without the skip."""
    with open(install.deploy_dir() / install.WEBHOOK_CONFIGURATIONS, encoding="utf-8") as stream:
        documents = [d for d in yaml.safe_load_all(stream) if d and d.get("kind") == "MutatingWebhookConfiguration"]
    state = cluster.state
    items = install.local_registrations(
        documents,
        base_url=f"https://127.0.0.1:{state.ports['webhook']}",
        ca_bundle=(state.directory / "webhook" / "ca.crt").read_bytes(),
    )
    if skip_ordinary:
        items = [mutating_policy.with_webhook_condition(i) for i in items]
    completed = cluster.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    assert completed.returncode == 0, completed.stderr


def probe_env(cluster: Cluster, *, namespace: str) -> list[Any]:
    return env_of(dry_run(cluster, pod(f"probe-{uuid.uuid4().hex[:6]}", {"name": "p"}), namespace=namespace))["containers/p"]


VOID = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}


def test_the_policy_gives_cpu_pods_exactly_the_webhooks_mutation_and_is_idempotent(map_cluster: Cluster) -> None:
    cluster = map_cluster
    ns = cluster.namespace()
    by_webhook = {p["metadata"]["name"]: dry_run(cluster, p, namespace=ns) for p in (*CPU_PODS, GPU_POD)}
    assert env_of(by_webhook["bare"])["containers/main"] == [VOID]
    assert env_of(by_webhook["named-already"])["containers/main"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}]

    cluster.kubectl("delete", "mutatingwebhookconfiguration", "gpu-admission")
    try:
        eventually(lambda: probe_env(cluster, namespace=ns) == [], what="the apiserver to stop calling /mutate", timeout=60)
        apply_policy(cluster)
        eventually(lambda: probe_env(cluster, namespace=ns) == [VOID], what="the MutatingAdmissionPolicy to act", timeout=60)
        by_policy = {p["metadata"]["name"]: dry_run(cluster, p, namespace=ns) for p in (*CPU_PODS, GPU_POD)}
        for manifest in CPU_PODS:
            name = manifest["metadata"]["name"]
            assert by_policy[name]["spec"] == by_webhook[name]["spec"], name
            # idempotent: the mutated pod sent again comes back unchanged
            again = copy.deepcopy(manifest)
            for kind in ("containers", "initContainers"):
                for sent, mutated in zip(again["spec"].get(kind, []), by_policy[name]["spec"].get(kind, []), strict=True):
                    sent["env"] = mutated["env"]
            assert dry_run(cluster, again, namespace=ns)["spec"] == by_policy[name]["spec"], name
        # The GPU pod: the sidecar gets the variable exactly as from the webhook, the GPU container none.
        assert env_of(by_policy["gpu"]) == env_of(by_webhook["gpu"]) == {"containers/train": [], "containers/side": [VOID]}

        # Both at once (a cluster moving over): still exactly one entry per container.
        mutating_registration(cluster, skip_ordinary=False)
        for manifest in CPU_PODS:
            name = manifest["metadata"]["name"]
            assert dry_run(cluster, manifest, namespace=ns)["spec"] == by_webhook[name]["spec"], name
    finally:
        delete_policy(cluster)
        mutating_registration(cluster, skip_ordinary=False)


def webhook_calls(cluster: Cluster, *, name: str, namespace: str) -> dict[str, int]:
    log = (cluster.state.directory / "logs" / "webhook.log").read_text(errors="replace")
    return {
        endpoint: len(re.findall(rf"endpoint={endpoint} CREATE Pod/{re.escape(name)} ns={re.escape(namespace)} ", log))
        for endpoint in ("mutate", "validate")
    }


def test_with_the_policy_an_ordinary_pod_costs_no_webhook_call(map_cluster: Cluster) -> None:
    cluster = map_cluster
    ns = cluster.namespace()
    apply_policy(cluster)
    mutating_registration(cluster, skip_ordinary=True)
    try:
        # Stored creates (dry runs are logged the same way, but stored pods are what users make).
        eventually(lambda: probe_env(cluster, namespace=ns) == [VOID], what="the policy to act", timeout=60)
        plain = pod("plain", {"name": "main"})
        completed = cluster.apply(plain, namespace=ns)
        assert completed.returncode == 0, completed.stderr
        assert cluster.get("pod", "plain", namespace=ns)["spec"]["containers"][0]["env"] == [VOID]
        completed = cluster.apply(GPU_POD, namespace=ns)
        assert completed.returncode == 0, completed.stderr
        eventually(
            lambda: webhook_calls(cluster, name="gpu", namespace=ns) == {"mutate": 1, "validate": 1},
            what=f"the GPU pod reviewed twice, got {webhook_calls(cluster, name='gpu', namespace=ns)}",
            timeout=20,
        )
        assert webhook_calls(cluster, name="plain", namespace=ns) == {"mutate": 0, "validate": 0}
        # A bypass attempt is not ordinary: still sent, still refused.
        completed = cluster.apply(
            pod("bypass", {"name": "m", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}), namespace=ns
        )
        assert completed.returncode != 0 and "GPU001" in completed.stderr
    finally:
        delete_policy(cluster)
        mutating_registration(cluster, skip_ordinary=False)
