"""Installs gpu-admission into the local cluster: the webhook as a local process, registered with
the webhook configurations of `deploy/`, changed only in clientConfig."""

from __future__ import annotations

import base64
import copy
import json
import shutil
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from policies import gpu
from policies.gpu import reservations
from webhook.cluster import controlplane, incluster, nodes, realnode

WEBHOOK_CONFIGURATIONS = "webhook-configurations.yaml"
NODE_GUARD = "node-guard.yaml"
SCHEDULER_CONFIGURATION = "scheduler-config.yaml"
_PROBE_NAMESPACE = "default"


def deploy_dir() -> Path:
    """The repository's `deploy/` directory, the single source of truth for the registrations."""
    return Path(__file__).resolve().parents[2] / "deploy"


def executable() -> str:
    """Our own console script, next to the running interpreter when installed in a virtualenv."""
    beside = Path(sys.executable).with_name("gpu-admission")
    if beside.exists():
        return str(beside)
    found = shutil.which("gpu-admission")
    if found is None:
        raise controlplane.ClusterError("the gpu-admission command is not on PATH; install the package first")
    return found


def local_registrations(documents: Sequence[Mapping[str, Any]], *, base_url: str, ca_bundle: bytes) -> list[dict[str, Any]]:
    """The webhook configurations with each clientConfig pointed at `base_url` + the Service path.

    Everything else (rules, failurePolicy, selectors, matchConditions, timeouts, sideEffects) is kept
    as it is in `deploy/`.
    """
    result: list[dict[str, Any]] = []
    for document in documents:
        changed = copy.deepcopy(dict(document))
        for hook in changed.get("webhooks", []):
            path = hook["clientConfig"]["service"].get("path", "/")
            hook["clientConfig"] = {"url": base_url + path, "caBundle": base64.b64encode(ca_bundle).decode()}
        result.append(changed)
    return result


def start_webhook(state: controlplane.State, *, config: Path | None = None, timeout: float = 30.0) -> None:
    """Issue certificates, start `gpu-admission serve` under the cluster (with its kubeconfig, so that
    it reads namespace labels and ConfigMaps as in a real cluster), wait until it is ready."""
    certs = state.directory / "webhook"
    if not (certs / "tls.crt").exists():
        subprocess.run(
            [executable(), "certs", "generate", "--out-dir", str(certs), "--host", "127.0.0.1", "--host", "localhost"],
            check=True,
            capture_output=True,
            text=True,
        )
    port = state.ports.get("webhook") or controlplane.free_port()
    state.ports["webhook"] = port
    command = [
        executable(),
        "serve",
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--tls-cert-file",
        str(certs / "tls.crt"),
        "--tls-private-key-file",
        str(certs / "tls.key"),
        # Cluster access like the real webhook's: namespace labels, ConfigMap lookups for GPU001.
        "--kubeconfig",
        str(state.kubeconfig),
    ]
    if config is not None:
        command += ["--config", str(config.resolve())]
    controlplane.start(state, "webhook", command=command)
    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))

    def ready() -> bool:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=context, timeout=2) as response:
            return bool(response.status == 200)

    controlplane.wait_for(ready, what="the webhook /readyz", timeout=timeout, state=state, component="webhook")


def register(state: controlplane.State, *, timeout: float = 60.0, deploy: Path | None = None, port: int | None = None) -> None:
    """Apply the registrations from `deploy/` (or another copy of it, `deploy`: a benchmark's older
    tree) pointed at the webhook (or at `port`), and wait until the apiserver calls it."""
    with open((deploy or deploy_dir()) / WEBHOOK_CONFIGURATIONS, encoding="utf-8") as stream:
        documents = [d for d in yaml.safe_load_all(stream) if d]
    ca_bundle = (state.directory / "webhook" / "ca.crt").read_bytes()
    port = port or state.ports["webhook"]
    items = local_registrations(documents, base_url=f"https://127.0.0.1:{port}", ca_bundle=ca_bundle)
    controlplane.kubectl(state, "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    controlplane.wait_for(
        lambda: _webhook_effective(state),
        what="the apiserver to call the webhook",
        timeout=timeout,
        state=state,
        component="webhook",
    )


def local_scheduler_configuration(document: Mapping[str, Any], *, base_url: str) -> dict[str, Any]:
    """The scheduler configuration of `deploy/` with each extender pointed at `base_url` over HTTP."""
    changed = copy.deepcopy(dict(document))
    for extender in changed.get("extenders", []):
        extender["urlPrefix"] = base_url
        extender["enableHTTPS"] = False
        extender.pop("tlsConfig", None)
    return changed


def start_extender(
    state: controlplane.State, *, timeout: float = 30.0, create_ledger_namespace: bool = True
) -> dict[str, Any] | None:
    """Start `gpu-admission extender` under the cluster and return the scheduler configuration
    that calls it (None while `deploy/` has no scheduler configuration). Its reservation ledgers
    are Leases in the ledger namespace, created here unless `create_ledger_namespace` is False
    (a Helm install must own that namespace; until it exists binds are refused, naming it)."""
    source = deploy_dir() / SCHEDULER_CONFIGURATION
    if not source.exists():
        return None
    with open(source, encoding="utf-8") as stream:
        document = yaml.safe_load(stream)
    port = state.ports.get("extender") or controlplane.free_port()
    state.ports["extender"] = port
    command = [executable(), "extender", "--port", str(port), "--host", "127.0.0.1", "--kubeconfig", str(state.kubeconfig)]
    if create_ledger_namespace:  # deploy/ creates it too (exists already: fine)
        controlplane.kubectl(state, "create", "namespace", reservations.LEDGER_NAMESPACE, check=False)
    controlplane.start(state, "extender", command=command)
    controlplane.wait_for(
        lambda: _http_ok(f"http://127.0.0.1:{port}/healthz"),
        what="the extender /healthz",
        timeout=timeout,
        state=state,
        component="extender",
    )
    return local_scheduler_configuration(document, base_url=f"http://127.0.0.1:{port}")


def start_labelers(state: controlplane.State, fake_nodes: Sequence[nodes.FakeNode], *, timeout: float = 60.0) -> None:
    """Run one real labeler per fake node that has cards, fed by its inventory file, and wait
    until every such node carries the labels and the capacity the labeler advertises."""
    directory = state.directory / "inventory"
    directory.mkdir(exist_ok=True)
    labelled = [node for node in fake_nodes if node.inventory is not None]
    for node in labelled:
        inventory = directory / f"{node.name}.yaml"
        inventory.write_text(yaml.safe_dump(dict(node.inventory or {}), sort_keys=False))
        command = [
            executable(),
            "labeler",
            "--node-name",
            node.name,
            "--kubeconfig",
            str(state.kubeconfig),
            "--inventory",
            str(inventory),
            "--interval",
            "2s",
            "--advertise",
        ]
        controlplane.start(state, f"labeler-{node.name}", command=command)
    names = {node.name for node in labelled}

    def labelled_and_advertised() -> bool:
        items = json.loads(controlplane.kubectl(state, "get", "nodes", "-o", "json").stdout)["items"]
        done = {
            item["metadata"]["name"]
            for item in items
            if gpu.CARD_COUNT_LABEL in item["metadata"].get("labels", {})
            and str(gpu.Resource.GPU_MEM) in item.get("status", {}).get("capacity", {})
        }
        return names <= done

    controlplane.wait_for(labelled_and_advertised, what=f"labels on {len(names)} GPU nodes", timeout=timeout, state=state)


def guard_nodes(state: controlplane.State) -> None:
    """Apply `deploy/node-guard.yaml` as it is: the ValidatingAdmissionPolicies binding what the
    labeler's and the extender's ServiceAccounts may change on Nodes. The local labelers and the
    extender authenticate with the cluster's admin kubeconfig, not those ServiceAccounts, so the
    policies leave them alone; they hold for anything that uses the ServiceAccounts' tokens."""
    controlplane.kubectl(state, "apply", "-f", str(deploy_dir() / NODE_GUARD))


def install(state: controlplane.State, *, fake_nodes: Sequence[nodes.FakeNode] = (), config: Path | None = None) -> None:
    """gpu-admission in the local cluster: the node guard, labelers for the fake GPU nodes, then the webhook."""
    guard_nodes(state)
    start_labelers(state, fake_nodes)
    start_webhook(state, config=config)
    register(state)


def bring_up(
    directory: Path,
    *,
    bin_dir: Path,
    fake_nodes: Sequence[nodes.FakeNode],
    with_install: bool = True,
    config: Path | None = None,
    real_node: bool = False,
    in_cluster: bool = False,
    image: str | None = None,
    apiserver_flags: Sequence[str] = (),
    scheduler_flags: Sequence[str] = (),
) -> controlplane.State:
    """The whole local cluster: the control plane and, unless told not to, gpu-admission in it
    (the extender before kube-scheduler starts, then the webhook); with `real_node`, a real
    kubelet on this machine beside the KWOK nodes (`realnode`); with `in_cluster` as well, the
    webhook, extender and labeler run as containers there, installed from deploy/ (`incluster`)."""
    if in_cluster and not real_node:
        raise controlplane.ClusterError("--in-cluster needs --real-node: KWOK nodes run no containers")
    if real_node:
        realnode.check_host(bin_dir)
    local = with_install and not in_cluster
    state = controlplane.up(
        directory,
        bin_dir=bin_dir,
        fake_nodes=fake_nodes,
        before_scheduler=start_extender if local else None,
        prepare=realnode.prepare if real_node else None,
        apiserver_flags=apiserver_flags,
        scheduler_flags=scheduler_flags,
    )
    try:
        if real_node:
            realnode.start(state, address=state.node_ip)
        if local:
            install(state, fake_nodes=fake_nodes, config=config)
        elif with_install:
            start_labelers(state, fake_nodes)  # the KWOK GPU nodes' NVML stand-ins
            incluster.install(state, image=image)
            controlplane.wait_for(
                lambda: _webhook_effective(state), what="the apiserver to call the in-cluster webhook", timeout=120, state=state
            )
    except BaseException:
        tear_down(directory)
        raise
    return state


def tear_down(directory: Path) -> list[str]:
    """Stop everything of the cluster under `directory`: the real node first (its containers,
    mounts and rules), then every process; what was stopped."""
    stopped = realnode.teardown_directory(directory)
    return [*stopped, *controlplane.down(directory)]


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as response:
        return bool(response.status == 200)


def _webhook_effective(state: controlplane.State) -> bool:
    """True once a bypass attempt is refused by the webhook (a server-side dry run, so nothing is stored)."""
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gpu-admission-install-probe", "namespace": _PROBE_NAMESPACE},
        "spec": {
            "containers": [{"name": "probe", "image": "probe", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]
        },
    }
    completed = controlplane.kubectl(state, "create", "--dry-run=server", "-f", "-", stdin=json.dumps(probe), check=False)
    return completed.returncode != 0 and "GPU001" in completed.stderr
