"""The scheduler extender with a real kube-scheduler: pictures, bursts, restarts, two replicas.

Setup, per module: our own extender process and our own kube-scheduler, configured from
`deploy/scheduler-config-second.yaml` (only urlPrefix, TLS, kubeconfig, leader election and the
profile's schedulerName changed), so the test owns the processes it kills and restarts. Two
replicas are two such pairs: each kube-scheduler calls its own extender, and pods of both
schedulers target the same nodes, so two extender processes bind onto the same cards at the same
time. That is the honest version of "two replicas at once": kube-scheduler talks to exactly one
extender URL, and a Service in front of two pods spreads calls the same way.

Every test gets its own KWOK nodes (a unique pool label and a NoSchedule taint only our pods
tolerate), so the pictures are not disturbed by other tests, and checks what is stored in the
apiserver: the gpushare annotations of bound pods, summed per card, never exceed the card.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies import gpu
from policies.gpu import inventory, reservations
from tests import resources
from tests.e2e.harness import Cluster, eventually, webhook_settings
from webhook.cluster import controlplane, install, nodes

pytestmark = pytest.mark.e2e

POOL_LABEL = "gpu-admission.io/e2e-pool"
TAINT_KEY = "gpu-admission.io/e2e-extender"
GROUP_LABEL = "e2e-group"
T4_MIB = 15360
SCHEDULER_CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "scheduler-config-second.yaml"


# --- processes ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Replica:
    """One extender process and the kube-scheduler that calls it."""

    cluster: Cluster
    scheduler_name: str
    extender: str  # process names under the cluster state
    scheduler: str
    port: int = 0
    flags: tuple[str, ...] = ()  # more flags for the extender (e.g. --config)

    @property
    def state(self) -> controlplane.State:
        return self.cluster.state

    def start_extender(self) -> None:
        self.port = self.port or controlplane.free_port()
        command = [
            sys.executable,
            "-m",
            "webhook.extender.cli",
            "extender",
            "--port",
            str(self.port),
            "--host",
            "127.0.0.1",
            "--kubeconfig",
            str(self.state.kubeconfig),
            "--reservation-ttl",
            "60",
            *self.flags,
        ]
        controlplane.start(self.state, self.extender, command=command)
        controlplane.wait_for(
            lambda: _http_status(f"http://127.0.0.1:{self.port}/healthz") == 200,
            what=f"{self.extender} /healthz",
            timeout=30,
            state=self.state,
            component=self.extender,
        )

    def kill_extender(self) -> None:
        """SIGKILL, as an OOM kill or a node loss would: no graceful shutdown, binds cut mid-way."""
        pid = self.state.pids[self.extender]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        eventually(lambda: not self.state.running().get(self.extender, False), what=f"{self.extender} to die", timeout=10)
        controlplane.stop(self.state, [self.extender])

    def start_scheduler(self) -> None:
        document = yaml.safe_load(SCHEDULER_CONFIG.read_text())
        config = install.local_scheduler_configuration(document, base_url=f"http://127.0.0.1:{self.port}")
        config["profiles"] = [{"schedulerName": self.scheduler_name}]
        config["clientConnection"] = {"kubeconfig": str(self.state.kubeconfig)}
        config["leaderElection"] = {"leaderElect": False}
        path = self.state.directory / f"{self.scheduler}.yaml"
        path.write_text(json.dumps(config, indent=2))
        port = controlplane.free_port()
        kubeconfig = str(self.state.kubeconfig)
        command = [
            str(self.state.bin_dir / "kube-scheduler"),
            f"--config={path}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
        ]
        controlplane.start(self.state, self.scheduler, command=command)
        controlplane.wait_for(
            lambda: _http_status(f"https://127.0.0.1:{port}/healthz") == 200,
            what=f"{self.scheduler} /healthz",
            timeout=60,
            state=self.state,
            component=self.scheduler,
        )

    def stop(self) -> None:
        controlplane.stop(self.state, [self.scheduler, self.extender])

    def metric(self, name: str, **labels: str) -> float:
        """The sample of `name` with exactly these labels, in whatever order the exposition writes them."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5).read().decode()
        for line in text.splitlines():
            found = re.fullmatch(re.escape(name) + r"(?:\{(.*)\})? (\S+)", line)
            if found and dict(re.findall(r'(\w+)="([^"]*)"', found.group(1) or "")) == labels:
                return float(found.group(2))
        return 0.0


def _http_status(url: str) -> int:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # kube-scheduler's self-signed serving certificate; /healthz only
    try:
        with urllib.request.urlopen(url, timeout=2, context=context if url.startswith("https") else None) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


# GPU008 refuses a pod asking for extender-managed resources whose schedulerName is not a scheduler
# calling the extender. This module's schedulers are such schedulers, so, as an admin would for a
# second scheduler, the module lists them in `extenderSchedulers`: the session webhook is restarted
# with that setting (and restored afterwards). Their names are fixed per run for that reason.
RUN = uuid.uuid4().hex[:6]
TAGS = ("a", "b")


def scheduler_name(tag: str) -> str:
    return f"gpu-admission-e2e-{tag}-{RUN}"


@pytest.fixture(scope="module", autouse=True)
def extender_schedulers(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    settings = {"extenderSchedulers": ["default-scheduler", *(scheduler_name(t) for t in TAGS)]}
    with webhook_settings(cluster, settings, directory=tmp_path_factory.mktemp("extender-settings")):
        yield


def _replica(cluster: Cluster, tag: str, *, flags: Sequence[str] = ()) -> Replica:
    assert tag in TAGS, "a scheduler the webhook's extenderSchedulers does not list gets no GPU pods"
    suffix = uuid.uuid4().hex[:6]
    replica = Replica(
        cluster=cluster,
        scheduler_name=scheduler_name(tag),
        extender=f"e2e-extender-{tag}-{suffix}",
        scheduler=f"e2e-scheduler-{tag}-{suffix}",
        flags=tuple(flags),
    )
    replica.start_extender()
    try:
        replica.start_scheduler()
    except BaseException:
        replica.stop()
        raise
    return replica


@pytest.fixture(scope="module")
def gpu_scheduler(cluster: Cluster) -> Iterator[Replica]:
    replica = _replica(cluster, "a")
    try:
        yield replica
    finally:
        replica.stop()


@pytest.fixture(scope="module")
def pools(cluster: Cluster) -> Iterator[list[str]]:
    """Names of the nodes the tests created; deleted at the end of the module."""
    created: list[str] = []
    yield created
    if created:
        cluster.kubectl("delete", "node", "--wait=false", *created)


# --- nodes and pods ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Pool:
    name: str
    nodes: tuple[str, ...]
    card_gib: tuple[int, ...]


def make_pool(
    cluster: Cluster,
    pools: list[str],
    *,
    count: int = 1,
    mode: str = "cgpu",
    placement: str = "binpack",
    gpus: Sequence[int] = (T4_MIB,) * 4,
    links: Sequence[tuple[int, int, str]] | None = None,
) -> Pool:
    """KWOK nodes as the labeler leaves them: inventory annotation, mode labels, advertised capacity."""
    pool = f"p{uuid.uuid4().hex[:8]}"
    gpu_cards = [inventory.Card(index=i, memory_mib=mib, uuid=f"GPU-{pool}-{i}", name="Tesla-T4") for i, mib in enumerate(gpus)]
    gib = [mib // 1024 for mib in gpus]
    capacity = {
        "aliyun.com/gpu-mem": "0",
        "aliyun.com/gpu-count": "0",
        "aliyun.com/gpu": "0",
        "aliyun.com/gpu-core.percentage": "0",
        "nvidia.com/gpu": "0",
    }
    if mode == "topology":
        capacity["aliyun.com/gpu"] = str(len(gpus))
    else:
        capacity["aliyun.com/gpu-mem"] = str(sum(gib))
        capacity["aliyun.com/gpu-count"] = str(len(gpus))
        if mode == "core_mem":
            capacity["aliyun.com/gpu-core.percentage"] = str(100 * len(gpus))
    annotations = {gpu.INVENTORY_ANNOTATION: inventory.encode_inventory(gpu_cards)}
    if links is not None:
        annotations[gpu.TOPOLOGY_ANNOTATION] = inventory.encode_topology(links)
    labels = {"ack.node.gpu.schedule": mode, POOL_LABEL: pool}
    if mode != "topology":
        labels["ack.node.gpu.placement"] = placement
    names = tuple(f"{pool}-{i}" for i in range(count))
    manifests = []
    for name in names:
        manifest = nodes.FakeNode(name=name, labels=labels, capacity=capacity, annotations=annotations).manifest()
        manifest["spec"]["taints"] = [{"key": TAINT_KEY, "value": pool, "effect": "NoSchedule"}]
        manifests.append(manifest)
    pools.extend(names)
    completed = cluster.kubectl("create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests}))
    assert completed.returncode == 0, completed.stderr

    def ready() -> bool:
        listed = json.loads(cluster.kubectl("get", "nodes", "-l", f"{POOL_LABEL}={pool}", "-o", "json").stdout)["items"]
        return len(listed) == count and all(
            any(c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", [])) for n in listed
        )

    eventually(ready, what=f"pool {pool} Ready")
    return Pool(name=pool, nodes=names, card_gib=tuple(gib))


def gpu_pod(
    name: str,
    *,
    pool: Pool,
    scheduler: str,
    group: str,
    mem: int | None = None,
    core: int | None = None,
    whole: int | None = None,
) -> dict[str, Any]:
    limits = resources.gpu_limits(mem=mem, core=core, whole=whole)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {GROUP_LABEL: group}},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": {POOL_LABEL: pool.name},
            "tolerations": [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "main", "image": "registry.example/trainer:1", "resources": {"limits": limits}}],
        },
    }


def create(cluster: Cluster, pods: list[dict[str, Any]], *, namespace: str) -> None:
    completed = cluster.kubectl(
        "create", "-n", namespace, "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods})
    )
    assert completed.returncode == 0, completed.stderr


def pods_of(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    return cluster.pods(namespace=namespace)


def card_use(cluster: Cluster, pool: Pool, namespace: str) -> dict[str, list[int]]:
    """GiB per card from what the apiserver stores, read independently of the extender's code:
    the gpushare annotations (IDX, POD) of every bound pod. Asserts no card is over-committed and
    every bound pod went through bind."""
    used = {name: [0] * len(pool.card_gib) for name in pool.nodes}
    for pod in pods_of(cluster, namespace):
        node = pod["spec"].get("nodeName")
        if node not in used or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        annotations = pod["metadata"].get("annotations", {})
        assert "ALIYUN_COM_GPU_MEM_IDX" in annotations, f"{pod['metadata']['name']} was bound without the extender"
        for index in annotations["ALIYUN_COM_GPU_MEM_IDX"].split(","):
            used[node][int(index)] += int(annotations.get("ALIYUN_COM_GPU_MEM_POD", "0"))
    for node, per_card in used.items():
        for index, gib in enumerate(per_card):
            assert gib <= pool.card_gib[index], (
                f"{node} GPU{index} over-committed: {gib} of {pool.card_gib[index]} GiB ({per_card})"
            )
    return used


def bound(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    return [p for p in pods_of(cluster, namespace) if p["spec"].get("nodeName")]


def wait_settled(cluster: Cluster, pool: Pool, namespace: str, *, placed: int, total: int, timeout: float = 180) -> None:
    """Until `placed` pods are bound and every other one has been judged unschedulable, checking
    the no-over-commit invariant at every poll."""

    def settled() -> bool:
        card_use(cluster, pool, namespace)
        pods = pods_of(cluster, namespace)
        placed_now = [p for p in pods if p["spec"].get("nodeName")]
        assert len(placed_now) <= placed, f"{len(placed_now)} pods bound, but the cards hold {placed}"
        judged = [
            p
            for p in pods
            if not p["spec"].get("nodeName")
            and any(
                c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
                for c in p.get("status", {}).get("conditions", [])
            )
        ]
        return len(pods) == total and len(placed_now) == placed and len(judged) == total - placed

    try:
        eventually(settled, what=f"{placed} of {total} pods bound and the rest unschedulable in {namespace}", timeout=timeout)
    except AssertionError as error:
        pods = pods_of(cluster, namespace)
        reasons: dict[str, int] = {}
        for pod in pods:
            if pod["spec"].get("nodeName"):
                key = "bound"
            else:
                conditions = [c for c in pod.get("status", {}).get("conditions", []) if c.get("type") == "PodScheduled"]
                key = f"unbound/{conditions[0].get('reason') if conditions else 'no condition'}"
            reasons[key] = reasons.get(key, 0) + 1
        raise AssertionError(f"{error}: {len(pods)} pods, {reasons}, cards {card_use(cluster, pool, namespace)}") from None


def events_of(cluster: Cluster, namespace: str, name: str) -> list[str]:
    completed = cluster.kubectl("get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}", "-o", "json")
    return [item.get("message", "") for item in json.loads(completed.stdout or "{}").get("items", [])]


def allocation(pod: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(pod["metadata"]["annotations"]["gpu-admission.io/allocation"])
    return result


# --- tests -------------------------------------------------------------------------------------


def test_binpack_fills_cards_as_the_seed_shows_and_inspect_prints_the_seed_table(
    cluster: Cluster, gpu_scheduler: Replica, pools: list[str]
) -> None:
    pool = make_pool(cluster, pools, placement="binpack")
    ns = cluster.namespace()
    create(
        cluster,
        [gpu_pod(f"binpack-{i}", pool=pool, scheduler=gpu_scheduler.scheduler_name, group="b", mem=3) for i in range(8)],
        namespace=ns,
    )
    cluster.running_pods(namespace=ns, count=8, timeout=120)
    (node,) = pool.nodes
    assert card_use(cluster, pool, ns)[node] == [15, 9, 0, 0]

    inspected = subprocess.run(
        [sys.executable, "-m", "webhook.extender.cli", "inspect", "--kubeconfig", str(cluster.state.kubeconfig), node],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.splitlines()
    assert inspected[0].split() == ["NAME", "IPADDRESS", *(f"GPU{i}(Allocated/Total)" for i in range(4)), "GPU", "Memory(GiB)"]
    assert inspected[1].split()[0] == node and inspected[1].split()[2:] == ["15/15", "9/15", "0/15", "0/15", "24/60"]
    assert inspected[2:] == ["-" * 86, "Allocated/Total GPU Memory In Cluster:", "24/60 (40%)"]

    plugin = Path(sys.executable).with_name("kubectl-inspect-cgpu")
    assert plugin.exists(), "reinstall the package (pip install -e .) to get the kubectl-inspect-cgpu script"
    environment = {
        **os.environ,
        "KUBECONFIG": str(cluster.state.kubeconfig),
        "PATH": f"{plugin.parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    details = subprocess.run(
        [str(cluster.state.bin_dir / "kubectl"), "inspect", "cgpu", "-d", node],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=environment,
    ).stdout
    rows = {line.split()[0]: line.split()[2:] for line in details.splitlines() if line.startswith("binpack-")}
    assert sorted(rows) == [f"binpack-{i}" for i in range(8)]
    assert sorted(tuple(cells) for cells in rows.values()).count(("3", "0", "0", "0")) == 5


def test_spread_puts_pods_on_different_cards(cluster: Cluster, gpu_scheduler: Replica, pools: list[str]) -> None:
    pool = make_pool(cluster, pools, placement="spread")
    ns = cluster.namespace()
    create(
        cluster,
        [gpu_pod(f"spread-{i}", pool=pool, scheduler=gpu_scheduler.scheduler_name, group="s", mem=4) for i in range(3)],
        namespace=ns,
    )
    cluster.running_pods(namespace=ns, count=3, timeout=120)
    assert card_use(cluster, pool, ns)[pool.nodes[0]] == [4, 4, 4, 0]


def test_a_burst_of_100_pods_never_over_commits_a_card(cluster: Cluster, gpu_scheduler: Replica, pools: list[str]) -> None:
    pool = make_pool(cluster, pools, count=2)
    ns = cluster.namespace()
    # 300 GiB of asks for 8 cards of 15 GiB: exactly 40 pods of 3 GiB fit.
    create(
        cluster,
        [gpu_pod(f"burst-{i:03d}", pool=pool, scheduler=gpu_scheduler.scheduler_name, group="burst", mem=3) for i in range(100)],
        namespace=ns,
    )
    wait_settled(cluster, pool, ns, placed=40, total=100)
    assert card_use(cluster, pool, ns) == {name: [15, 15, 15, 15] for name in pool.nodes}


def test_an_extender_killed_and_restarted_mid_burst_does_not_over_commit(
    cluster: Cluster, gpu_scheduler: Replica, pools: list[str]
) -> None:
    pool = make_pool(cluster, pools, count=2)
    ns = cluster.namespace()
    burst = [gpu_pod(f"restart-{i:02d}", pool=pool, scheduler=gpu_scheduler.scheduler_name, group="r", mem=5) for i in range(60)]
    # Wave one (20 pods, all of which would fit) is being bound when the extender is SIGKILLed;
    # wave two (40) arrives while it is down. 24 fit in all.
    creating = subprocess.Popen(
        [str(cluster.state.bin_dir / "kubectl"), f"--kubeconfig={cluster.state.kubeconfig}", "create", "-n", ns, "-f", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert creating.stdin is not None
    creating.stdin.write(json.dumps({"apiVersion": "v1", "kind": "List", "items": burst[:20]}))
    creating.stdin.close()
    try:
        eventually(lambda: len(bound(cluster, ns)) >= 3, what="the first binds", timeout=120)
        gpu_scheduler.kill_extender()
    finally:
        assert creating.wait(timeout=120) == 0, creating.stderr.read() if creating.stderr else ""
    at_kill = len(bound(cluster, ns))
    card_use(cluster, pool, ns)
    create(cluster, burst[20:], namespace=ns)
    gpu_scheduler.start_extender()  # same port: the scheduler's configuration is unchanged
    wait_settled(cluster, pool, ns, placed=24, total=60)
    assert card_use(cluster, pool, ns) == {name: [15, 15, 15, 15] for name in pool.nodes}
    assert at_kill < 24, f"{at_kill} pods were bound when the extender was killed"


def test_two_extender_replicas_binding_onto_the_same_cards_never_over_commit(
    cluster: Cluster, gpu_scheduler: Replica, pools: list[str]
) -> None:
    second = _replica(cluster, "b")
    try:
        pool = make_pool(cluster, pools, count=2)
        ns = cluster.namespace()
        before = [gpu_scheduler.metric("gpu_admission_extender_requests_total", verb="bind", result="ok"), 0.0]
        schedulers = [gpu_scheduler.scheduler_name, second.scheduler_name]
        create(
            cluster,
            [gpu_pod(f"twin-{i:02d}", pool=pool, scheduler=schedulers[i % 2], group="t", mem=5) for i in range(80)],
            namespace=ns,
        )
        wait_settled(cluster, pool, ns, placed=24, total=80)
        assert card_use(cluster, pool, ns) == {name: [15, 15, 15, 15] for name in pool.nodes}
        binds = [
            gpu_scheduler.metric("gpu_admission_extender_requests_total", verb="bind", result="ok") - before[0],
            second.metric("gpu_admission_extender_requests_total", verb="bind", result="ok") - before[1],
        ]
        assert all(b > 0 for b in binds), f"both replicas should have bound pods: {binds}"
        # Their compare-and-swap was on each node's ledger Lease; neither wrote a ledger onto a Node.
        leases = json.loads(
            cluster.kubectl(
                "get", "leases", "-n", reservations.LEDGER_NAMESPACE, "-l", f"{reservations.LEDGER_LABEL}=true", "-o", "json"
            ).stdout
        )["items"]
        assert set(pool.nodes) <= set(reservations.leases_by_node(leases)), "every node bound to has its ledger Lease"
        for name in pool.nodes:
            assert gpu.RESERVATIONS_ANNOTATION not in cluster.get("node", name, namespace="default")["metadata"].get(
                "annotations", {}
            )
    finally:
        second.stop()


def test_a_topology_pod_gets_nvlink_connected_cards(cluster: Cluster, gpu_scheduler: Replica, pools: list[str]) -> None:
    # Two NVLink islands that are not index ranges: {0,2,4,6} and {1,3,5,7}; SYS between them.
    links = [(a, b, "NV2" if a % 2 == b % 2 else "SYS") for a in range(8) for b in range(a + 1, 8)]
    pool = make_pool(cluster, pools, mode="topology", gpus=(32510,) * 8, links=links)
    ns = cluster.namespace()
    create(
        cluster, [gpu_pod("allreduce-0", pool=pool, scheduler=gpu_scheduler.scheduler_name, group="topo", whole=4)], namespace=ns
    )
    (first,) = cluster.running_pods(namespace=ns, count=1, timeout=120)
    create(
        cluster, [gpu_pod("allreduce-1", pool=pool, scheduler=gpu_scheduler.scheduler_name, group="topo", whole=4)], namespace=ns
    )
    pods = cluster.running_pods(namespace=ns, count=2, timeout=120)
    second = next(p for p in pods if p["metadata"]["name"] == "allreduce-1")
    assert allocation(first)["cards"] in ([0, 2, 4, 6], [1, 3, 5, 7]) and allocation(first)["whole"] is True
    assert sorted(allocation(first)["cards"] + allocation(second)["cards"]) == list(range(8))
    assert first["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_IDX"] == ",".join(map(str, allocation(first)["cards"]))


def test_core_mem_pods_are_accounted_by_core_percentage(cluster: Cluster, gpu_scheduler: Replica, pools: list[str]) -> None:
    pool = make_pool(cluster, pools, mode="core_mem", gpus=(23028, 23028))
    ns = cluster.namespace()
    # 2 GiB and 40 % each: memory would allow 11 per card, cores allow 2 (80 %): 4 pods run. The
    # fifth fits the node's total (200 %, what kube-scheduler checks) but no single card.
    create(
        cluster,
        [gpu_pod(f"core-{i}", pool=pool, scheduler=gpu_scheduler.scheduler_name, group="c", mem=2, core=40) for i in range(5)],
        namespace=ns,
    )
    wait_settled(cluster, pool, ns, placed=4, total=5)
    cores = [0, 0]
    for pod in bound(cluster, ns):
        placed = allocation(pod)
        cores[placed["cards"][0]] += placed["corePercent"]
    assert cores == [80, 80]
    (waiting,) = [p["metadata"]["name"] for p in pods_of(cluster, ns) if not p["spec"].get("nodeName")]
    eventually(
        lambda: any("insufficient GPU memory or cores on any single card" in m for m in events_of(cluster, ns, waiting)),
        what="the extender's message in the pending pod's events",
    )


def test_a_pod_that_fits_nowhere_stays_pending_with_the_extenders_message(
    cluster: Cluster, gpu_scheduler: Replica, pools: list[str]
) -> None:
    pool = make_pool(cluster, pools)
    ns = cluster.namespace()
    create(cluster, [gpu_pod("too-big", pool=pool, scheduler=gpu_scheduler.scheduler_name, group="big", mem=20)], namespace=ns)
    expected = (
        "no GPU card is large enough: the pod needs 20 GiB (aliyun.com/gpu-mem) on one card; the largest card is GPU0 with 15 GiB"
    )
    eventually(lambda: any(expected in m for m in events_of(cluster, ns, "too-big")), what="the FailedScheduling event")
    assert not cluster.get("pod", "too-big", namespace=ns)["spec"].get("nodeName")


def test_the_default_scheduler_extended_by_deploy_config_places_gpu_pods_on_cards(cluster: Cluster, pools: list[str]) -> None:
    assert "extender" in cluster.state.pids, "cluster up did not start the extender of deploy/scheduler-config.yaml"
    pool = make_pool(cluster, pools)
    ns = cluster.namespace()
    pod = gpu_pod("via-default", pool=pool, scheduler="default-scheduler", group="d", mem=5)
    create(cluster, [pod], namespace=ns)
    (running,) = cluster.running_pods(namespace=ns, count=1, timeout=120)
    assert allocation(running)["node"] == pool.nodes[0] and allocation(running)["cards"] == [0]
