"""The webhook's cluster context on a real apiserver: namespace labels select a namespace override,
and GPU001 reads the ConfigMap a pod's envFrom names.

The session cluster's webhook runs with the default settings; these tests need a namespace override
by label selector, so the module restarts that webhook with a --config of its own (same port, same
registrations) and restores the default one afterwards. Cheaper than a throwaway cluster, and the
path under test is the same: kube-apiserver calls the local `gpu-admission serve`, which has the
cluster's kubeconfig (as `webhook.cluster.install` starts it).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.harness import Cluster, eventually, webhook_settings

pytestmark = pytest.mark.e2e

LAB_WARNS = {
    "namespaceOverrides": [
        {"name": "lab", "namespaceSelector": {"matchLabels": {"team": "lab"}}, "policies": {"GPU002": {"action": "warn"}}},
        # Where GPU007 only warns, a ConfigMap can carry the key (as one made before GPU007 was
        # enforced would): GPU001 then reads it through the cluster context.
        {
            "name": "legacy",
            "namespaceSelector": {"matchLabels": {"sources": "legacy"}},
            "policies": {"GPU007": {"action": "warn"}},
        },
    ]
}


@pytest.fixture(scope="module")
def lab_cluster(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The session cluster, its webhook restarted with LAB_WARNS; restored to the defaults after."""
    with webhook_settings(cluster, LAB_WARNS, directory=tmp_path_factory.mktemp("context")):
        yield cluster


def namespace(cluster: Cluster, **labels: str) -> str:
    """A fresh namespace created with its labels at once (no window without them)."""
    name = f"e2e-ctx-{uuid.uuid4().hex[:8]}"
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
    completed = cluster.kubectl("create", "-f", "-", stdin=json.dumps(body))
    assert completed.returncode == 0, completed.stderr
    eventually(
        lambda: cluster.kubectl("get", "serviceaccount", "default", "-n", name).returncode == 0, what=f"ServiceAccount in {name}"
    )
    return name


def gpu_pod(name: str, **container: Any) -> dict[str, Any]:
    """A pod asking for one whole card (so GPU104 leaves its env alone), with `container` fields."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/trainer:1",
                    "resources": {"limits": {"nvidia.com/gpu": 1}},
                    **container,
                }
            ]
        },
    }


def create(cluster: Cluster, obj: dict[str, Any], *, namespace: str) -> tuple[bool, str]:
    completed = cluster.kubectl("create", "-n", namespace, "-f", "-", stdin=json.dumps(obj))
    return completed.returncode == 0, completed.stderr


def test_a_privileged_gpu_pod_is_warned_in_a_namespace_labelled_team_lab_and_refused_elsewhere(lab_cluster: Cluster) -> None:
    privileged = gpu_pod("privileged", securityContext={"privileged": True})
    lab = namespace(lab_cluster, team="lab")
    admitted, stderr = create(lab_cluster, privileged, namespace=lab)
    assert admitted, stderr
    assert "Warning:" in stderr and "GPU002" in stderr, stderr
    plain = namespace(lab_cluster)
    admitted, stderr = create(lab_cluster, privileged, namespace=plain)
    assert not admitted and "GPU002" in stderr, stderr


def test_a_label_added_later_reaches_the_webhook_through_the_watch(lab_cluster: Cluster) -> None:
    later = namespace(lab_cluster)
    privileged = gpu_pod("privileged", securityContext={"privileged": True})
    assert not create(lab_cluster, privileged, namespace=later)[0]
    labelled = lab_cluster.kubectl("label", "namespace", later, "team=lab")
    assert labelled.returncode == 0, labelled.stderr

    def admitted_with_a_warning() -> bool:
        completed = lab_cluster.kubectl("create", "--dry-run=server", "-n", later, "-f", "-", stdin=json.dumps(privileged))
        return completed.returncode == 0 and "GPU002" in completed.stderr

    eventually(admitted_with_a_warning, what="the new label in the webhook's namespace cache", timeout=30)


def test_env_from_a_config_map_that_sets_visible_devices_is_refused_naming_it(lab_cluster: Cluster) -> None:
    # GPU007 refuses such a ConfigMap in an ordinary namespace; in the legacy one it only warns.
    where = namespace(lab_cluster, sources="legacy")
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "gpu-env"},
        "data": {"NVIDIA_VISIBLE_DEVICES": "all"},
    }
    created, stderr = create(lab_cluster, config_map, namespace=where)
    assert created and "GPU007" in stderr, stderr
    admitted, stderr = create(lab_cluster, gpu_pod("sneaky", envFrom=[{"configMapRef": {"name": "gpu-env"}}]), namespace=where)
    assert not admitted, stderr
    assert "GPU001" in stderr and "ConfigMap 'gpu-env', whose key NVIDIA_VISIBLE_DEVICES" in stderr, stderr


def test_env_from_a_config_map_without_the_variable_is_admitted_without_a_gpu001_warning(lab_cluster: Cluster) -> None:
    where = namespace(lab_cluster)
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app-env"}, "data": {"LOG_LEVEL": "debug"}}
    assert create(lab_cluster, config_map, namespace=where)[0]
    admitted, stderr = create(lab_cluster, gpu_pod("honest", envFrom=[{"configMapRef": {"name": "app-env"}}]), namespace=where)
    assert admitted, stderr
    assert "GPU001" not in stderr, stderr
