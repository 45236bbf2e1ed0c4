"""Test-side handle on the running local cluster: kubectl, object lookups and polling."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from webhook.cluster import controlplane, install, nodes


class Cluster:
    """Test-side handle on the running cluster: kubectl, object lookups and polling."""

    def __init__(self, state: controlplane.State) -> None:
        self.state = state

    def kubectl(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return controlplane.kubectl(self.state, *args, stdin=stdin, check=False)

    def apply(self, manifest: Mapping[str, Any] | list[Mapping[str, Any]], *, namespace: str) -> subprocess.CompletedProcess[str]:
        items = manifest if isinstance(manifest, list) else [manifest]
        body = json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
        return self.kubectl("apply", "-n", namespace, "-f", "-", stdin=body)

    def get(self, kind: str, name: str, *, namespace: str) -> dict[str, Any]:
        completed = self.kubectl("get", kind, name, "-n", namespace, "-o", "json")
        assert completed.returncode == 0, completed.stderr
        result: dict[str, Any] = json.loads(completed.stdout)
        return result

    def pods(self, *, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        args = ["get", "pods", "-n", namespace, "-o", "json"] + (["-l", selector] if selector else [])
        completed = self.kubectl(*args)
        assert completed.returncode == 0, completed.stderr
        items: list[dict[str, Any]] = json.loads(completed.stdout)["items"]
        return items

    def node_labels(self, name: str) -> dict[str, str]:
        labels: dict[str, str] = self.get("node", name, namespace="default")["metadata"].get("labels", {})
        return labels

    def namespace(self) -> str:
        """A fresh namespace whose default ServiceAccount exists, so pods can be created at once."""
        name = f"e2e-{uuid.uuid4().hex[:8]}"
        completed = self.kubectl("create", "namespace", name)
        assert completed.returncode == 0, completed.stderr
        eventually(
            lambda: self.kubectl("get", "serviceaccount", "default", "-n", name).returncode == 0, what=f"ServiceAccount in {name}"
        )
        return name

    def running_pods(self, *, namespace: str, selector: str = "", count: int = 1, timeout: float = 60) -> list[dict[str, Any]]:
        """Poll until `count` pods are Running, and return them."""
        found: list[dict[str, Any]] = []

        def ready() -> bool:
            nonlocal found
            found = [
                p for p in self.pods(namespace=namespace, selector=selector) if p.get("status", {}).get("phase") == "Running"
            ]
            return len(found) >= count

        eventually(ready, what=f"{count} running pods in {namespace} {selector}", timeout=timeout)
        return found

    def pod_once(
        self, name: str, *, namespace: str, condition: Callable[[dict[str, Any]], bool], what: str, timeout: float = 60
    ) -> dict[str, Any]:
        """Poll pod `name` until `condition` holds for it, and return it as stored then."""
        found: dict[str, Any] = {}

        def holds() -> bool:
            nonlocal found
            found = self.get("pod", name, namespace=namespace)
            return condition(found)

        eventually(holds, what=what, timeout=timeout)
        return found


def deployment(
    name: str, spec: Mapping[str, Any], *, app: str, replicas: int = 1, annotations: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A Deployment `name` whose pod template (labelled app=`app`, with `annotations`) has `spec`."""
    metadata: dict[str, Any] = {"labels": {"app": app}}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": app}},
            "template": {"metadata": metadata, "spec": spec},
        },
    }


def eventually(predicate: Callable[[], bool], *, what: str, timeout: float = 60) -> None:
    """Poll with a deadline (never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    delay = 0.1
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 1.5, 1.0)


def restart_webhook(cluster: Cluster, *, config: Path | None) -> None:
    """The session cluster's webhook restarted with `config` (None: the defaults); same port, so the
    registrations stay valid. Returns once the apiserver calls the new process (a bypass is refused)."""
    controlplane.stop(cluster.state, ["webhook"], grace=5)
    install.start_webhook(cluster.state, config=config)
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "restart-probe"},
        "spec": {"containers": [{"name": "m", "image": "probe", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]},
    }

    def refused() -> bool:
        completed = cluster.kubectl("create", "--dry-run=server", "-n", "default", "-f", "-", stdin=json.dumps(probe))
        return completed.returncode != 0 and "GPU001" in completed.stderr

    eventually(refused, what="the apiserver to call the restarted webhook", timeout=60)


@contextlib.contextmanager
def webhook_settings(cluster: Cluster, settings: Mapping[str, Any], *, directory: Path) -> Iterator[Cluster]:
    """The session cluster with its webhook restarted on `settings` (written into `directory`); the
    defaults again on the way out."""
    config = directory / "config.yaml"
    config.write_text(json.dumps(settings))  # JSON is YAML
    restart_webhook(cluster, config=config)
    try:
        yield cluster
    finally:
        restart_webhook(cluster, config=None)


@contextlib.contextmanager
def bare_control_plane(directory: Path, *, bin_dir: Path, fake_nodes: int) -> Iterator[controlplane.State]:
    """A throwaway control plane in `directory` with the first `fake_nodes` fake nodes and nothing
    installed; torn down on the way out."""
    state = controlplane.up(directory, bin_dir=bin_dir, fake_nodes=nodes.load(None)[:fake_nodes])
    try:
        yield state
    finally:
        controlplane.down(directory)


def extender_token(cluster: Cluster, directory: Path) -> Path:
    """A kubeconfig in `directory` holding a token of the extender's ServiceAccount, with its RBAC
    from deploy/ (the ClusterRole, and the Roles of its namespace: the ledger and budget Leases),
    so that a test's extender acts with the rights it has in a cluster, not an admin's."""
    wanted = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    deploy = Path(__file__).resolve().parents[2] / "deploy"
    items = [
        d
        for name in ("namespace.yaml", "extender.yaml")
        for d in yaml.safe_load_all((deploy / name).read_text())
        if d and d["kind"] in wanted
    ]
    applied = cluster.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    assert applied.returncode == 0, applied.stderr
    account = "system:serviceaccount:gpu-admission:gpu-admission-extender"
    eventually(
        lambda: (
            cluster.kubectl("auth", "can-i", "patch", "pods", "-A", f"--as={account}").stdout.strip() == "yes"
            and cluster.kubectl("auth", "can-i", "update", "leases", "-n", "gpu-admission", f"--as={account}").stdout.strip()
            == "yes"
        ),
        what="the extender's RBAC",
    )
    created = cluster.kubectl("create", "token", "gpu-admission-extender", "-n", "gpu-admission", "--duration=30m")
    assert created.returncode == 0, created.stderr
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "e2e",
                "cluster": {
                    "server": cluster.state.server,
                    "certificate-authority": str(cluster.state.directory / "pki" / "ca.crt"),
                },
            }
        ],
        "users": [{"name": "extender", "user": {"token": created.stdout.strip()}}],
        "contexts": [{"name": "extender", "context": {"cluster": "e2e", "user": "extender"}}],
        "current-context": "extender",
    }
    path = directory / "kubeconfig"
    path.write_text(json.dumps(config))
    return path
