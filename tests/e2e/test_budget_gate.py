"""The budget gate through the real kube-apiserver and the webhook (GPU107, GPU013, GPU014).

The webhook runs with a GPU budget for one fresh namespace. There a pod asking for `nvidia.com/gpu`
is stored behind `gpu-admission.io/budget` and kube-scheduler reports it SchedulingGated; a
Deployment's pods are gated one by one, its template is not; a pod naming its node is refused; a
pod over the budget alone is admitted with a warning; a tenant lifting the gate is refused. In a
namespace without a budget nothing is gated. The gatekeeper itself (`webhook.extender.gates`, with a
stand-in for the budget keeper) runs with a token of the extender's ServiceAccount and the RBAC of
deploy/extender.yaml: it lifts a pod whose charge was committed through the node guard and GPU013,
and records a NamespaceBudget Event on one it keeps.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from policies.gpu import budgets
from policies.settings import budgets as budget_settings
from tests.e2e.harness import Cluster, eventually, extender_token, webhook_settings
from webhook.extender import gates, kube, native

pytestmark = pytest.mark.e2e

GATE = {"name": budgets.GATE}


@pytest.fixture(scope="module")
def budgeted(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(a namespace with a 32 GiB budget, one without), with the webhook on those settings."""
    namespace, free = cluster.namespace(), cluster.namespace()
    settings = {"gpuBudgets": [{"name": "team", "namespaces": [namespace], "memory": "32Gi"}]}
    with webhook_settings(cluster, settings, directory=tmp_path_factory.mktemp("budget-gate")):
        yield namespace, free
    cluster.kubectl("delete", "namespace", namespace, free, "--wait=false")


def gpu_pod(name: str, limits: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "registry.example/train:1", "resources": {"limits": limits}}], **spec},
    }


def create(cluster: Cluster, obj: dict[str, Any], *, namespace: str) -> Any:
    return cluster.kubectl("create", "-n", namespace, "-f", "-", stdin=json.dumps(obj))


def test_a_device_plugin_pod_waits_at_the_gate_in_a_budgeted_namespace_only(cluster: Cluster, budgeted: tuple[str, str]) -> None:
    namespace, free = budgeted
    for where in (namespace, free):
        created = create(cluster, gpu_pod("train", {"nvidia.com/gpu": 1}), namespace=where)
        assert created.returncode == 0, created.stderr

    stored = cluster.get("pod", "train", namespace=namespace)
    assert stored["spec"]["schedulingGates"] == [GATE]
    assert "schedulingGates" not in cluster.get("pod", "train", namespace=free)["spec"]

    def gated() -> bool:
        conditions = cluster.get("pod", "train", namespace=namespace).get("status", {}).get("conditions", [])
        return any(c.get("type") == "PodScheduled" and c.get("reason") == "SchedulingGated" for c in conditions)

    eventually(gated, what="kube-scheduler to report the pod SchedulingGated")

    lifted = cluster.kubectl("patch", "pod", "train", "-n", namespace, "--type=merge", "-p", '{"spec":{"schedulingGates":null}}')
    assert lifted.returncode != 0 and "GPU013" in lifted.stderr, lifted.stderr
    assert cluster.get("pod", "train", namespace=namespace)["spec"]["schedulingGates"] == [GATE]


def test_a_deployments_pods_are_gated_and_its_template_is_not(cluster: Cluster, budgeted: tuple[str, str]) -> None:
    namespace, _ = budgeted
    template = gpu_pod("x", {"nvidia.com/mig-1g.10gb": 1})
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "infer"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "infer"}},
            "template": {"metadata": {"labels": {"app": "infer"}}, "spec": template["spec"]},
        },
    }
    created = create(cluster, deployment, namespace=namespace)
    assert created.returncode == 0, created.stderr

    assert "schedulingGates" not in cluster.get("deployment", "infer", namespace=namespace)["spec"]["template"]["spec"]
    eventually(lambda: len(cluster.pods(namespace=namespace, selector="app=infer")) == 2, what="the Deployment's two pods")
    assert [p["spec"].get("schedulingGates") for p in cluster.pods(namespace=namespace, selector="app=infer")] == [[GATE]] * 2


def test_a_pod_naming_its_node_is_refused_and_one_over_the_budget_is_warned(cluster: Cluster, budgeted: tuple[str, str]) -> None:
    namespace, _ = budgeted
    named = create(cluster, gpu_pod("pinned", {"nvidia.com/gpu": 1}, nodeName="somewhere"), namespace=namespace)
    assert named.returncode != 0 and "GPU107" in named.stderr and "spec.nodeName" in named.stderr, named.stderr

    huge = create(cluster, gpu_pod("huge", {"nvidia.com/mig-7g.80gb": 1}), namespace=namespace)
    assert huge.returncode == 0, huge.stderr
    assert "GPU014" in huge.stderr and "budget 'team'" in huge.stderr, huge.stderr
    assert cluster.get("pod", "huge", namespace=namespace)["spec"]["schedulingGates"] == [GATE]


DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


@pytest.fixture(scope="module")
def extender_kubeconfig(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kubeconfig holding a token of the extender's ServiceAccount, with its RBAC from deploy/."""
    return extender_token(cluster, tmp_path_factory.mktemp("extender"))


class Keeper:
    """A stand-in for the budget keeper: 32 GiB, of which `used` is held."""

    def __init__(self, namespace: str, *, used_mib: int) -> None:
        [self.budget] = budget_settings.budgets([{"name": "team", "namespaces": [namespace], "memory": "32Gi"}])
        self.namespace = namespace
        self.used = used_mib

    def budget_of(self, namespace: str) -> budget_settings.Budget | None:
        return self.budget if namespace == self.namespace else None

    async def charge(self, pod: Mapping[str, Any], charge: budgets.Charge, *, expires: float | None) -> str:
        why = budgets.over(self.budget.memory_mib, None, budgets.Charge(memory_mib=self.used), charge)
        if why:
            return f"NAMESPACE_BUDGET: {self.budget.describe()}: {why}"
        self.used += charge.memory_mib
        return ""


class Cache:
    """The pods of one namespace and the nodes, read from the apiserver as the watch cache holds them."""

    synced = True

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster, self.namespace = cluster, namespace

    def pods(self) -> list[dict[str, Any]]:
        return self.cluster.pods(namespace=self.namespace)

    def nodes(self) -> list[dict[str, Any]]:
        listed = self.cluster.kubectl("get", "nodes", "-o", "json")
        assert listed.returncode == 0, listed.stderr
        items: list[dict[str, Any]] = json.loads(listed.stdout)["items"]
        return items

    def claims_gate_charge(self, pod: Mapping[str, Any]) -> budgets.Charge:
        return budgets.NOTHING  # these pods ask for MIG slices, not claims


@pytest.mark.parametrize("on_the_loop", [True, False], ids=["event-loop-session", "client-threads"])
async def test_the_gatekeeper_lifts_and_keeps_with_the_extenders_own_rights(
    cluster: Cluster, extender_kubeconfig: Path, on_the_loop: bool
) -> None:
    namespace = cluster.namespace()  # budgeted by the stand-in keeper only: the webhook gates nothing here
    for name in ("fits", "waits"):
        pod = gpu_pod(name, {"nvidia.com/mig-1g.10gb": 1}, schedulingGates=[GATE])
        created = create(cluster, pod, namespace=namespace)
        assert created.returncode == 0, created.stderr
    client = kube.load_client(str(extender_kubeconfig))
    session = native.Session.of(client.configuration, limit=4) if on_the_loop else None
    assert (session is not None) is on_the_loop
    api = kube.KubeApi(client, session=session)
    keeper = Keeper(namespace, used_mib=20 * 1024)  # 12 GiB left: the first pod fits, the second not
    try:
        done = await gates.Gatekeeper(keeper, Cache(cluster, namespace), api).run_once()
    finally:
        await api.close()

    assert done.lifted == [f"{namespace}/fits"], done
    assert "30 GiB used + 10 GiB asked > 32 GiB" in done.kept[f"{namespace}/waits"]
    assert "schedulingGates" not in cluster.get("pod", "fits", namespace=namespace)["spec"]
    assert cluster.get("pod", "waits", namespace=namespace)["spec"]["schedulingGates"] == [GATE]
    listed = cluster.kubectl("get", "events", "-n", namespace, "--field-selector", "reason=NamespaceBudget", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    [event] = json.loads(listed.stdout)["items"]
    assert event["involvedObject"]["name"] == "waits" and "budget 'team'" in event["message"]
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
