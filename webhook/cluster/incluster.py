"""gpu-admission installed the way users install it, on the local cluster's real node: the image built
with `docker build`, loaded into the node's containerd, then `kubectl apply -k` of `deploy/` through
a small overlay.

The overlay changes only what a real cluster would also set for itself:
- the image name (a local build, never pulled: `IfNotPresent` finds it in containerd);
- replica counts (one small node: two webhook replicas, so that a rollout and the
  PodDisruptionBudget still leave one serving; one extender);
- where the pods run: KWOK nodes run no processes, so every workload of the install gets a
  nodeSelector for the real node (in a real cluster every node is real), and a toleration of the
  taint that keeps everything else off it (the seed workloads' images cannot be pulled here, so
  they must land on KWOK nodes, as GPU pods do anyway);
and, outside deploy/, kube-scheduler's configuration: `deploy/scheduler-config.yaml` with the
extender Service's ClusterIP in urlPrefix (kube-scheduler runs on the host and resolves no cluster
names; serverName stays the Service name, which the serving certificate names) and the client pair
the install itself made (Secret gpu-admission-extender-client), written to files for it.

The KWOK GPU nodes keep their local labelers (fed by inventory files): they stand in for the NVML
those fake nodes do not have. The real node is GPU-less: it is marked as a GPU node the way
node-feature-discovery would mark one (`feature.node.kubernetes.io/pci-10de.present=true`), so that
the labeler DaemonSet runs there and finds no NVML, says so once, and keeps running.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import ssl
import subprocess
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from webhook.cluster import controlplane, realnode

NAMESPACE = "gpu-admission"
IMAGE_NAME = "gpu-admission.local/gpu-admission"
IMAGE_TAG = "0.1.0"
IMAGE = f"{IMAGE_NAME}:{IMAGE_TAG}"
WEBHOOK_REPLICAS = 2
EXTENDER_REPLICAS = 1
WORKLOADS = (
    ("Deployment", "gpu-admission-webhook"),
    ("Deployment", "gpu-admission-extender"),
    ("DaemonSet", "gpu-admission-labeler"),
)
GPU_NODE_LABEL = "feature.node.kubernetes.io/pci-10de.present"
REAL_NODE_TAINT = f"{realnode.REAL_LABEL}=true:NoSchedule"
TOLERATION = {"key": realnode.REAL_LABEL, "operator": "Exists", "effect": "NoSchedule"}
CLIENT_SECRET = "gpu-admission-extender-client"
EXTENDER_SERVICE = "gpu-admission-extender"


def deploy_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "deploy"


def image_script() -> Path:
    return Path(__file__).resolve().parents[2] / "tests" / "e2e" / "image" / "build.sh"


def overlay_dir(state: controlplane.State) -> Path:
    return state.directory / "overlay"


def overlay(
    *, base: str, image_name: str = IMAGE_NAME, image_tag: str = IMAGE_TAG, node_label: str = realnode.REAL_LABEL
) -> dict[str, Any]:
    """The test overlay's kustomization: image, replicas, and the real node for every workload."""
    selector = {"spec": {"template": {"spec": {"nodeSelector": {node_label: "true"}}}}}
    patches: list[dict[str, Any]] = []
    for kind, name in WORKLOADS:
        patch: dict[str, Any] = copy.deepcopy(selector)
        patch.update({"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name, "namespace": NAMESPACE}})
        if name == "gpu-admission-webhook":
            patch["spec"]["replicas"] = WEBHOOK_REPLICAS
        elif name == "gpu-admission-extender":
            patch["spec"]["replicas"] = EXTENDER_REPLICAS
        patches.append({"patch": yaml.safe_dump(patch, sort_keys=False)})
        # Appended (a JSON patch), so that a workload's own tolerations stay; "-" needs the list.
        patches.append(
            {
                "target": {"kind": kind, "name": name, "namespace": NAMESPACE},
                "patch": yaml.safe_dump(
                    [
                        *([] if kind == "DaemonSet" else [{"op": "add", "path": "/spec/template/spec/tolerations", "value": []}]),
                        {"op": "add", "path": "/spec/template/spec/tolerations/-", "value": TOLERATION},
                    ]
                ),
            }
        )
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [base],
        "images": [{"name": "gpu-admission", "newName": image_name, "newTag": image_tag}],
        "patches": patches,
    }


def write_overlay(state: controlplane.State) -> Path:
    directory = overlay_dir(state)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "kustomization.yaml").write_text(
        yaml.safe_dump(overlay(base=os.path.relpath(deploy_dir(), directory)), sort_keys=False)
    )
    return directory


def build_image(*, tag: str = IMAGE) -> str:
    """`docker build` of the repository's Dockerfile on the local base (tests/e2e/image/build.sh)."""
    completed = subprocess.run(
        ["bash", str(image_script()), tag], stdout=subprocess.PIPE, stderr=None, text=True, check=False, timeout=1800
    )
    if completed.returncode != 0:
        raise controlplane.ClusterError(f"building the image {tag} failed (exit {completed.returncode})")
    return tag


def scheduler_configuration(document: Mapping[str, Any], *, cluster_ip: str, files: Path) -> dict[str, Any]:
    """deploy/scheduler-config.yaml pointed at the extender's ClusterIP with the install's client pair."""
    changed = copy.deepcopy(dict(document))
    for extender in changed.get("extenders", []):
        extender["urlPrefix"] = f"https://{cluster_ip}:443"
        tls = extender.setdefault("tlsConfig", {})
        tls.update({"caFile": str(files / "ca.crt"), "certFile": str(files / "tls.crt"), "keyFile": str(files / "tls.key")})
    return changed


def point_scheduler_at_the_extender(state: controlplane.State, *, timeout: float = 60.0) -> None:
    """Write the client pair the install made and restart kube-scheduler with the Service's address."""

    def secret_ready() -> bool:
        return controlplane.kubectl(state, "get", "secret", CLIENT_SECRET, "-n", NAMESPACE, check=False).returncode == 0

    controlplane.wait_for(secret_ready, what=f"the Secret {CLIENT_SECRET}", timeout=timeout, state=state)
    secret = json.loads(controlplane.kubectl(state, "get", "secret", CLIENT_SECRET, "-n", NAMESPACE, "-o", "json").stdout)
    files = state.directory / "scheduler-extender"
    files.mkdir(exist_ok=True)
    for key in ("ca.crt", "tls.crt", "tls.key"):
        path = files / key
        path.write_bytes(base64.b64decode(secret["data"][key]))
        path.chmod(0o600)
    cluster_ip = controlplane.kubectl(
        state, "get", "service", EXTENDER_SERVICE, "-n", NAMESPACE, "-o", "jsonpath={.spec.clusterIP}"
    ).stdout.strip()
    with open(deploy_dir() / "scheduler-config.yaml", encoding="utf-8") as stream:
        document = yaml.safe_load(stream)
    controlplane.write_scheduler_config(state, scheduler_configuration(document, cluster_ip=cluster_ip, files=files))
    controlplane.stop(state, ["kube-scheduler"])
    controlplane.start(state, "kube-scheduler")
    port = state.ports["kube-scheduler"]
    controlplane.wait_for(
        lambda: _healthz(state, port),
        what="kube-scheduler /healthz after the restart",
        timeout=timeout,
        state=state,
        component="kube-scheduler",
    )


def _healthz(state: controlplane.State, port: int) -> bool:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # kube-scheduler's self-signed serving certificate; only /healthz is read
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=context, timeout=2) as response:
        return bool(response.status == 200)


# Waited for on install, the labeler DaemonSet included: its pods must pass the namespace's Pod
# Security "restricted" (a refused DaemonSet pod shows only as an event, and the rollout never
# completes), and on the GPU-less real node it must stay up and Ready without NVML.
AWAITED = WORKLOADS


def rollouts(state: controlplane.State, *, timeout_s: int = 300) -> None:
    for kind, name in AWAITED:
        done = controlplane.kubectl(
            state, "rollout", "status", f"{kind.lower()}/{name}", "-n", NAMESPACE, f"--timeout={timeout_s}s", check=False
        )
        if done.returncode != 0:
            raise controlplane.ClusterError(f"{kind} {name} did not roll out: {done.stderr.strip() or done.stdout.strip()}")


def install(state: controlplane.State, *, image: str | None = None) -> None:
    """Image → containerd, the overlay applied, rollouts waited for, kube-scheduler pointed at the extender.

    `image`: a local image already built from the Dockerfile (tagged as the overlay's image here);
    None builds one."""
    if image is None:
        build_image()
    elif image != IMAGE:
        tagged = subprocess.run(["docker", "tag", image, IMAGE], capture_output=True, text=True, check=False, timeout=60)
        if tagged.returncode != 0:
            raise controlplane.ClusterError(f"docker tag {image}: {tagged.stderr.strip()}")
    realnode.load_image(state, realnode.docker_image_archive(state, IMAGE))
    controlplane.kubectl(state, "label", "node", realnode.NODE_NAME, f"{GPU_NODE_LABEL}=true", "--overwrite")
    controlplane.kubectl(state, "taint", "node", realnode.NODE_NAME, REAL_NODE_TAINT, "--overwrite")
    directory = write_overlay(state)
    controlplane.kubectl(state, "apply", "-k", str(directory))
    rollouts(state)
    point_scheduler_at_the_extender(state)


def uninstall(state: controlplane.State, *, timeout_s: float = 300.0) -> None:
    """`kubectl delete -k` of the overlay, then wait until the namespace is gone (the webhook pods
    drain for up to their grace period, longer than one kubectl call may wait)."""
    controlplane.kubectl(state, "delete", "-k", str(overlay_dir(state)), "--wait=false", "--ignore-not-found")
    controlplane.wait_for(
        lambda: controlplane.kubectl(state, "get", "namespace", NAMESPACE, check=False).returncode != 0,
        what=f"the namespace {NAMESPACE} deleted",
        timeout=timeout_s,
    )
