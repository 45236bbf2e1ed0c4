"""gpu-admission as users install it: the image built with `docker build`, `kubectl apply -k deploy/`
(through the small test overlay of `webhook.cluster.incluster`) onto a real kubelet on containerd,
beside the KWOK GPU nodes. The webhook and the extender run as real containers; kube-apiserver calls
the webhook through its Service, kube-scheduler the extender through its Service with the client
certificate the install made.

Needs root, Docker and the host packages `.ci/run realnode` installs; skipped elsewhere unless
GPU_ADMISSION_REAL_NODE=require (CI), which turns a missing piece into a failure. GPU_ADMISSION_IMAGE
names an image already built from the Dockerfile (CI builds it once in its realnode tier).
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies import gpu
from tests.e2e.harness import eventually
from webhook.cluster import binaries, controlplane, incluster, install, nodes, realnode

pytestmark = pytest.mark.e2e

REQUIRE_ENV = "GPU_ADMISSION_REAL_NODE"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NAMESPACE = "real-node-demo"
PART_OF = "app.kubernetes.io/part-of=gpu-admission"


def _missing() -> str:
    if os.geteuid() != 0:
        return "not root"
    missing = realnode.missing_host_tools(which=shutil.which, cni_dirs=realnode.CNI_BIN_DIRS)
    if missing:
        return realnode.missing_tools_message(missing, cni_dirs=realnode.CNI_BIN_DIRS)
    if shutil.which("go") is None:
        return "no go"
    if subprocess.run(["docker", "info"], capture_output=True, check=False).returncode != 0:
        return "dockerd is not running"
    return ""


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[controlplane.State]:
    missing = _missing()
    if missing:
        if os.environ.get(REQUIRE_ENV) == "require":
            pytest.fail(f"the real-node tier is required here but {missing} (run .ci/run realnode)")
        pytest.skip(f"real node: {missing}")
    bin_dir = binaries.ensure(real_node=True)
    directory = tmp_path_factory.mktemp("realnode")
    started = time.monotonic()
    up = install.bring_up(
        directory,
        bin_dir=bin_dir,
        fake_nodes=nodes.load(None),
        real_node=True,
        in_cluster=True,
        image=os.environ.get("GPU_ADMISSION_IMAGE"),
    )
    print(f"real node with gpu-admission in containers up in {time.monotonic() - started:.0f}s")
    try:
        controlplane.kubectl(up, "create", "namespace", NAMESPACE)
        eventually(
            lambda: kubectl(up, "get", "serviceaccount", "default", "-n", NAMESPACE, check=False).returncode == 0,
            what="the test namespace",
            timeout=60,
        )
        yield up
    finally:
        stopped = install.tear_down(directory)
        assert "kubelet" in stopped and "containerd" in stopped


def kubectl(
    state: controlplane.State, *args: str, stdin: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return controlplane.kubectl(state, *args, stdin=stdin, check=check)


def pods(state: controlplane.State, namespace: str, selector: str = "") -> list[dict[str, Any]]:
    args = ["get", "pods", "-n", namespace, "-o", "json"] + (["-l", selector] if selector else [])
    items: list[dict[str, Any]] = json.loads(kubectl(state, *args).stdout)["items"]
    return items


def apply_example(state: controlplane.State, path: Path) -> subprocess.CompletedProcess[str]:
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for document in documents:
        document.get("metadata", {}).pop("namespace", None)
    return kubectl(
        state,
        "apply",
        "-n",
        NAMESPACE,
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": documents}),
        check=False,
    )


def test_the_webhook_and_the_extender_run_as_containers_on_the_real_node(state: controlplane.State) -> None:
    node = json.loads(kubectl(state, "get", "node", realnode.NODE_NAME, "-o", "json").stdout)
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://1.6")
    assert [a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"] == [state.node_ip]
    for component in ("webhook", "extender"):
        running = pods(state, incluster.NAMESPACE, f"app.kubernetes.io/component={component}")
        assert running, component
        for pod in running:
            assert pod["spec"]["nodeName"] == realnode.NODE_NAME
            [status] = pod["status"]["containerStatuses"]
            assert status["ready"] and status["containerID"].startswith("containerd://"), (component, status)
            assert status["image"].endswith(incluster.IMAGE)
            assert pod["spec"]["securityContext"]["runAsNonRoot"] is True


def test_logs_and_exec_reach_the_kubelet_which_refuses_anonymous_callers(state: controlplane.State) -> None:
    [pod, *_] = pods(state, incluster.NAMESPACE, "app.kubernetes.io/component=webhook")
    name = pod["metadata"]["name"]
    assert kubectl(state, "logs", "-n", incluster.NAMESPACE, name).stdout.strip(), "the webhook logs something at start"
    who = kubectl(
        state,
        "exec",
        "-n",
        incluster.NAMESPACE,
        name,
        "--",
        "/opt/gpu-admission/bin/python",
        "-c",
        "import os; print(os.getuid())",
    )
    assert who.stdout.strip() == "65532", "every command runs as the image's non-root user"
    written = kubectl(
        state,
        "exec",
        "-n",
        incluster.NAMESPACE,
        name,
        "--",
        "/opt/gpu-admission/bin/python",
        "-c",
        "open('/opt/x', 'w')",
        check=False,
    )
    assert written.returncode != 0 and "Read-only file system" in written.stderr
    context = ssl.create_default_context(cafile=str(state.directory / "pki" / "ca.crt"))
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"https://{state.node_ip}:{state.ports['kubelet']}/pods", context=context, timeout=5)
    assert refused.value.code == 401


def test_the_extender_filters_only_for_callers_with_the_install_made_client_certificate(state: controlplane.State) -> None:
    ip = kubectl(
        state, "get", "service", incluster.EXTENDER_SERVICE, "-n", incluster.NAMESPACE, "-o", "jsonpath={.spec.clusterIP}"
    ).stdout.strip()
    files = state.directory / "scheduler-extender"
    arguments = json.dumps(
        {"Pod": {"metadata": {"name": "probe", "namespace": "default"}, "spec": {"containers": []}}, "NodeNames": []}
    ).encode()

    def filter_status(context: ssl.SSLContext) -> int:
        request = urllib.request.Request(f"https://{ip}:443/filter", data=arguments, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, context=context, timeout=5) as response:
                return int(response.status)
        except urllib.error.HTTPError as error:
            return int(error.code)

    context = ssl.create_default_context(cafile=str(files / "ca.crt"))
    context.check_hostname = False  # the ClusterIP is not a SAN; kube-scheduler names the Service in serverName
    with urllib.request.urlopen(f"https://{ip}:443/healthz", context=context, timeout=5) as response:
        assert response.status == 200, "the kubelet's probes come without a client certificate"
    assert filter_status(context) == 401
    context.load_cert_chain(str(files / "tls.crt"), str(files / "tls.key"))
    assert filter_status(context) == 200


def test_seed_workloads_are_admitted_and_placed_on_gpu_cards_by_the_in_cluster_components(state: controlplane.State) -> None:
    workloads = sorted((EXAMPLES / "workloads").glob("*.yaml"))
    assert workloads, "no seed workloads under examples/workloads"
    for path in workloads:
        applied = apply_example(state, path)
        assert applied.returncode == 0, f"{path.name}: {applied.stderr}"

    def placed() -> bool:
        found = pods(state, NAMESPACE)
        return bool(found) and all(p.get("status", {}).get("phase") == "Running" for p in found)

    eventually(placed, what="every seed pod Running on a KWOK node", timeout=120)
    shared = 0
    for pod in pods(state, NAMESPACE):
        assert pod["spec"]["nodeName"] != realnode.NODE_NAME, pod["metadata"]["name"]
        limits = [c.get("resources", {}).get("limits", {}) for c in pod["spec"]["containers"]]
        if any(str(gpu.Resource.GPU_MEM) in limit for limit in limits):
            shared += 1
            # The card was chosen by the extender in its container (kube-scheduler's bind verb).
            assert gpu.GPUSHARE_MEM_IDX_ANNOTATION in pod["metadata"].get("annotations", {}), pod["metadata"]["name"]
    assert shared, "the seeds include GPU-sharing pods"


def test_each_bypass_is_refused_by_the_webhook_in_its_container(state: controlplane.State) -> None:
    bypasses = sorted((EXAMPLES / "bypasses").glob("*.yaml"))
    assert bypasses, "no bypasses under examples/bypasses"
    for path in bypasses:
        refused = apply_example(state, path)
        assert refused.returncode != 0, f"{path.name} was admitted"
        assert "denied the request" in refused.stderr and "GPU0" in refused.stderr, f"{path.name}: {refused.stderr}"


def test_a_rollout_restart_of_the_webhook_fails_no_pod_create(state: controlplane.State) -> None:
    probe = json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"generateName": "during-rollout-", "namespace": NAMESPACE},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }
    )
    failures: list[str] = []
    creates = {"count": 0}
    done = threading.Event()

    def create_until_done() -> None:
        while not done.is_set():
            result = kubectl(state, "create", "--dry-run=server", "-f", "-", stdin=probe, check=False)
            creates["count"] += 1
            if result.returncode != 0:
                failures.append(result.stderr.strip())

    worker = threading.Thread(target=create_until_done)
    worker.start()
    try:
        kubectl(state, "rollout", "restart", "deployment/gpu-admission-webhook", "-n", incluster.NAMESPACE)
        status = kubectl(
            state,
            "rollout",
            "status",
            "deployment/gpu-admission-webhook",
            "-n",
            incluster.NAMESPACE,
            "--timeout=300s",
            check=False,
        )
        assert status.returncode == 0, status.stderr
        time.sleep(2)  # creates after the last old pod went, on the new pods alone
    finally:
        done.set()
        worker.join(timeout=60)
    assert creates["count"] >= 10, creates
    assert failures == [], failures[:3]


def test_the_labeler_runs_on_the_gpu_less_node_says_no_nvml_once_labels_nothing_and_never_restarts(
    state: controlplane.State,
) -> None:
    # Late in the module on purpose: by now the pod has run for minutes, several 60 s passes.
    [pod] = pods(state, incluster.NAMESPACE, "app.kubernetes.io/component=labeler")
    name = pod["metadata"]["name"]
    assert pod["spec"]["nodeName"] == realnode.NODE_NAME
    assert "hostPID" not in pod["spec"] and not any("hostPath" in v for v in pod["spec"].get("volumes", []))
    age = time.time() - datetime.datetime.fromisoformat(pod["status"]["startTime"].replace("Z", "+00:00")).timestamp()
    if age < 70:  # at least one more pass than the first
        time.sleep(70 - age)
    for _ in range(2):  # restartCount 0 now and ~20 s later: no crash loop, no failed liveness probe
        [status] = json.loads(kubectl(state, "get", "pod", name, "-n", incluster.NAMESPACE, "-o", "json").stdout)["status"][
            "containerStatuses"
        ]
        assert status["ready"] and status["restartCount"] == 0, status
        time.sleep(20)
    log = kubectl(state, "logs", name, "-n", incluster.NAMESPACE).stdout
    assert len([line for line in log.splitlines() if "NVML is not available on this node" in line]) == 1, log
    node = json.loads(kubectl(state, "get", "node", realnode.NODE_NAME, "-o", "json").stdout)
    ours = [
        k
        for k in node["metadata"].get("labels", {})
        if k.startswith(gpu.ACCELERATOR_LABEL_PREFIX) or k == gpu.CARD_MEMORY_MIB_LABEL
    ]
    ours += [k for k in node["metadata"].get("annotations", {}) if k.startswith(gpu.OWN_PREFIX)]
    ours += [k for k in node["status"].get("capacity", {}) if k.startswith("aliyun.com/")]
    assert ours == [], ours


def _ctr(state: controlplane.State, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    completed = subprocess.run(
        ["ctr", "--address", str(realnode.socket_path(state)), "-n", realnode.NAMESPACE, *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert not check or completed.returncode == 0, f"ctr {' '.join(args)}: {completed.stderr}"
    return completed


def _task_pid(state: controlplane.State, container_id: str) -> int:
    for line in _ctr(state, "tasks", "ls").stdout.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 3 and fields[0] == container_id and fields[2] == "RUNNING":
            return int(fields[1])
    raise AssertionError(f"no running task {container_id}")


def test_the_labeler_attributes_a_real_pod_and_flags_a_ctr_container_which_the_audit_reports(
    state: controlplane.State, tmp_path: Path
) -> None:
    # Real processes in the cgroups the kubelet and containerd made: the extender's container (a pod
    # of the cluster) and a container started with `ctr run` beside the kubelet (no pod at all).
    [pod, *_] = pods(state, incluster.NAMESPACE, "app.kubernetes.io/component=extender")
    [status] = pod["status"]["containerStatuses"]
    pod_pid = _task_pid(state, status["containerID"].removeprefix("containerd://"))
    assert f"pod{pod['metadata']['uid']}" in Path(f"/proc/{pod_pid}/cgroup").read_text()
    rogue_id = uuid.uuid4().hex + uuid.uuid4().hex  # 64 hex digits, as containerd names its containers
    before = json.loads(kubectl(state, "get", "node", realnode.NODE_NAME, "-o", "json").stdout)["metadata"]
    _ctr(state, "run", "-d", "--null-io", realnode.PAUSE_IMAGE, rogue_id)
    try:
        rogue_pid = _task_pid(state, rogue_id)
        assert f"/{realnode.NAMESPACE}/{rogue_id}" in Path(f"/proc/{rogue_pid}/cgroup").read_text()
        inventory = tmp_path / "inventory.yaml"
        inventory.write_text(
            yaml.safe_dump(
                {
                    "gpus": [
                        {
                            "index": 0,
                            "uuid": "GPU-real-node-0",
                            "name": "Tesla T4",
                            "memoryMiB": 15360,
                            "usedMiB": 7000,
                            "processes": [{"pid": pod_pid, "usedMiB": 1000}, {"pid": rogue_pid, "usedMiB": 6000}],
                        }
                    ]
                }
            )
        )
        labeler = [
            install.executable(),
            "labeler",
            "--node-name",
            realnode.NODE_NAME,
            "--kubeconfig",
            str(state.kubeconfig),
            "--inventory",
            str(inventory),
            "--proc-root",
            "/proc",
            "--once",
        ]
        preview = subprocess.run(
            [*labeler, "--dry-run", "--list-pods", "-o", "json"], capture_output=True, text=True, check=False, timeout=120
        )
        assert preview.returncode == 0, preview.stderr
        [card] = json.loads(preview.stdout)["usage"]
        assert card["processes"] == [
            {
                "pid": pod_pid,
                "usedMiB": 1000,
                "containerID": status["containerID"].removeprefix("containerd://"),
                "pod": {"namespace": incluster.NAMESPACE, "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]},
            },
            {"pid": rogue_pid, "usedMiB": 6000, "outOfBand": True, "containerID": rogue_id},
        ], card
        written = subprocess.run(labeler, capture_output=True, text=True, check=False, timeout=120)
        assert written.returncode == 0, written.stderr
        audited = subprocess.run(
            [install.executable(), "audit", "--kubeconfig", str(state.kubeconfig), "-o", "json"],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        results = [r for item in json.loads(audited.stdout)["items"] for r in item.get("results", [])]
        gpu213 = [r for r in results if r["policy"] == "GPU213" and realnode.NODE_NAME in r["message"]]
        assert len(gpu213) == 1 and gpu213[0]["result"] == "fail", gpu213
        message = gpu213[0]["message"]
        assert (
            f"card 0: pid {rogue_pid} holds 6000 MiB in container {rogue_id[:12]}, started on the node outside Kubernetes"
            in message
        )
        assert f"pid {pod_pid}" not in message, "the pod's process is accounted for"
    finally:
        _ctr(state, "tasks", "kill", "-s", "SIGKILL", rogue_id, check=False)
        eventually(
            lambda: (
                _ctr(state, "tasks", "delete", rogue_id, check=False).returncode == 0
                or rogue_id not in _ctr(state, "tasks", "ls").stdout
            ),
            what="the ctr task gone",
            timeout=30,
        )
        _ctr(state, "containers", "delete", rogue_id, check=False)
        # Take off what the labeler wrote on the node, so the uninstall finds it as the install left it.
        after = json.loads(kubectl(state, "get", "node", realnode.NODE_NAME, "-o", "json").stdout)["metadata"]
        for verb, field in (("label", "labels"), ("annotate", "annotations")):
            added = [key for key in after.get(field, {}) if key not in before.get(field, {})]
            if added:
                kubectl(state, verb, "node", realnode.NODE_NAME, *(f"{key}-" for key in added))
    assert rogue_id not in _ctr(state, "containers", "ls", "-q").stdout
    node = json.loads(kubectl(state, "get", "node", realnode.NODE_NAME, "-o", "json").stdout)["metadata"]
    assert [k for k in node.get("annotations", {}) if k.startswith(gpu.OWN_PREFIX)] == []


def test_uninstall_leaves_nothing_of_ours(state: controlplane.State) -> None:
    kubectl(state, "delete", "namespace", NAMESPACE, "--wait=false")
    incluster.uninstall(state)
    assert kubectl(state, "get", "namespace", incluster.NAMESPACE, check=False).returncode != 0
    kinds = kubectl(state, "api-resources", "--verbs=list", "-o", "name").stdout.split()
    left = kubectl(
        state, "get", ",".join(kinds), "--all-namespaces", "-l", PART_OF, "-o", "name", "--ignore-not-found"
    ).stdout.split()
    assert left == []
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        assert kubectl(state, "get", kind, "gpu-admission", check=False).returncode != 0
