"""Faults on a throwaway cluster: the apiserver restarted under the extender and the labelers, and
the extender killed in the middle of binds.

The module brings up a local cluster of its own (``install.bring_up`` into a temporary directory,
``controlplane.down`` at the end): the session cluster is shared with other tests and these tests
stop its apiserver and kill its extender. The extender is the one ``deploy/scheduler-config.yaml``
wires into the default kube-scheduler; the GPU pods here go to one KWOK node of this module's
own (four 15 GiB cards, tainted so that only these pods land there).

What must hold, read from what the apiserver stores and not from the extender's memory: the
allocation annotations of bound pods never sum past a card; reservations of binds that died
(the node's ledger Lease, ``gpu-admission.io/reservations`` on a Node as an earlier version wrote
it, allocation annotations on unbound pods) hold
their card until they expire and free it afterwards; the extender and the labelers pick up where
they were once the apiserver is back.

The long burst adds a second extender replica (test_extender's ``Replica``: its own extender and
kube-scheduler) and pods of KWOK pools of its own, and puts both faults into one burst of
several hundred pods: it counts that no pod is lost and that every pod that fits gets a card.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies import gpu
from policies.gpu import allocation, cards, reservations
from tests.e2e import test_extender as extender_e2e  # its Replica, KWOK pools, pods and per-card count
from tests.e2e.harness import Cluster, eventually
from webhook.cluster import controlplane, install, nodes

pytestmark = pytest.mark.e2e

CARD_MIB = 15360
CARD_GIB = CARD_MIB // 1024
CARDS = 4
TAINT = "gpu-admission.io/e2e-faults"
SHORT_TTL_S = 40.0  # long enough to outlast the steps below on a busy machine, short enough to wait for
# The long burst: 360 pods of 5 GiB for 24 nodes of four 15 GiB cards (test_extender's pools), 288 of which fit.
BURST_PODS = 360
BURST_GIB = 5
BURST_NODES = 24
BURST_CAPACITY = BURST_NODES * 4 * (extender_e2e.T4_MIB // 1024 // BURST_GIB)


# The tests below stand in for the extender: they create pods carrying the annotations bind
# writes, asking for a scheduler nobody runs, to leave the traces of binds that died. GPU008
# refuses both from anyone but the extender's Binding, so this cluster runs with it off.
SETTINGS = {"policies": {"GPU008": {"action": "off"}}}


@pytest.fixture(scope="module")
def throwaway(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    directory = tmp_path_factory.mktemp("faults-cluster")
    config = tmp_path_factory.mktemp("faults-settings") / "config.yaml"
    config.write_text(json.dumps(SETTINGS))
    state = install.bring_up(directory, bin_dir=bin_dir, fake_nodes=nodes.load(None), config=config)
    try:
        assert "extender" in state.pids, "bring_up did not start the extender of deploy/scheduler-config.yaml"
        yield Cluster(state)
    finally:
        controlplane.down(directory)


@pytest.fixture(scope="module")
def gpu_node(throwaway: Cluster) -> str:
    """One KWOK node as the labeler leaves it: four T4 cards in the inventory annotation, cgpu."""
    name = f"faults-{uuid.uuid4().hex[:6]}"
    inventory = [{"index": i, "uuid": f"GPU-{name}-{i}", "name": "Tesla-T4", "memoryMiB": CARD_MIB} for i in range(CARDS)]
    capacity = {"aliyun.com/gpu-mem": str(CARDS * CARD_GIB), "aliyun.com/gpu-count": str(CARDS)}
    manifest = nodes.FakeNode(
        name=name,
        labels={"ack.node.gpu.schedule": "cgpu", "ack.node.gpu.placement": "binpack", "faults": name},
        capacity=capacity,
        annotations={gpu.INVENTORY_ANNOTATION: json.dumps(inventory)},
    ).manifest()
    manifest["spec"]["taints"] = [{"key": TAINT, "value": name, "effect": "NoSchedule"}]
    completed = throwaway.kubectl("create", "-f", "-", stdin=json.dumps(manifest))
    assert completed.returncode == 0, completed.stderr
    eventually(lambda: _ready(throwaway, name), what=f"node {name} Ready")
    return name


def _ready(cluster: Cluster, name: str) -> bool:
    node = cluster.get("node", name, namespace="default")
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node.get("status", {}).get("conditions", []))


def gpu_pod(
    name: str, *, node: str, mem: int, scheduler: str = "default-scheduler", annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": {"faults": node},
            "tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {"name": "main", "image": "registry.example/trainer:1", "resources": {"limits": {"aliyun.com/gpu-mem": str(mem)}}}
            ],
        },
    }


def create(cluster: Cluster, pods: list[dict[str, Any]], *, namespace: str) -> None:
    completed = cluster.kubectl(
        "create", "-n", namespace, "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods})
    )
    assert completed.returncode == 0, completed.stderr


def all_pods(cluster: Cluster) -> list[dict[str, Any]]:
    completed = cluster.kubectl("get", "pods", "-A", "-o", "json")
    assert completed.returncode == 0, completed.stderr
    items: list[dict[str, Any]] = json.loads(completed.stdout)["items"]
    return items


def bound_use(cluster: Cluster, node: str) -> list[int]:
    """GiB per card held by bound, non-terminal pods, from their gpushare annotations (read
    independently of the extender's code); asserts that no card is over-committed."""
    used = [0] * CARDS
    for pod in all_pods(cluster):
        if pod["spec"].get("nodeName") != node or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        annotations = pod["metadata"].get("annotations", {})
        assert "ALIYUN_COM_GPU_MEM_IDX" in annotations, f"{pod['metadata']['name']} was bound without the extender"
        for index in annotations["ALIYUN_COM_GPU_MEM_IDX"].split(","):
            used[int(index)] += int(annotations["ALIYUN_COM_GPU_MEM_POD"])
    assert all(gib <= CARD_GIB for gib in used), f"{node} over-committed: {used} GiB of {CARD_GIB} per card"
    return used


def allocation_problems(pods: list[dict[str, Any]], *, gib: int) -> list[str]:
    """What is wrong with the allocation of each bound pod asking for `gib` GiB: our JSON
    allocation and the gpushare annotations must name the pod's node, one card of it and `gib`."""
    problems = []
    for pod in pods:
        node, name = pod["spec"].get("nodeName"), pod["metadata"]["name"]
        if not node:
            continue
        annotations = pod["metadata"].get("annotations", {})
        try:
            recorded = json.loads(annotations[gpu.ALLOCATION_ANNOTATION])
            index = int(annotations["ALIYUN_COM_GPU_MEM_IDX"])
        except (KeyError, ValueError):
            problems.append(f"{name} on {node}: no readable allocation in {annotations}")
            continue
        wanted = {"node": node, "cards": [index], "memGiB": gib}
        if (
            {key: recorded.get(key) for key in wanted} != wanted
            or annotations.get("ALIYUN_COM_GPU_MEM_POD") != str(gib)
            or not 0 <= index < CARDS
        ):
            problems.append(
                f"{name} on {node}: allocation {recorded}, gpushare card {index} of {annotations.get('ALIYUN_COM_GPU_MEM_POD')} GiB"
            )
    return problems


def tally(pods: list[dict[str, Any]]) -> Counter[str]:
    """How many pods are "bound", and how many unbound ones "pending/<reason>" by their
    PodScheduled condition (reason "none" while the scheduler has not judged them yet)."""
    counts: Counter[str] = Counter()
    for pod in pods:
        if pod["spec"].get("nodeName"):
            counts["bound"] += 1
            continue
        reasons = [
            c.get("reason") or "none" for c in pod.get("status", {}).get("conditions", []) if c.get("type") == "PodScheduled"
        ]
        counts[f"pending/{reasons[0] if reasons else 'none'}"] += 1
    return counts


def create_through_outages(cluster: Cluster, pods: list[dict[str, Any]], *, namespace: str, timeout: float = 240.0) -> None:
    """`create`, tried again while the apiserver is away. kubectl creates a List's items one by one
    and reports each failure, so a try only has to forgive the pods an earlier try created."""
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": pods})
    deadline = time.monotonic() + timeout
    while True:
        completed = cluster.kubectl("create", "-n", namespace, "-f", "-", stdin=body)
        errors = [
            line
            for line in completed.stderr.splitlines()
            if line.strip() and "AlreadyExists" not in line and not line.startswith("Warning:")
        ]
        if completed.returncode == 0 or not errors:
            return
        assert time.monotonic() < deadline, f"pods not created within {timeout:g}s: {completed.stderr}"
        time.sleep(0.5)  # the apiserver is down or starting: nothing to poll but the next try


@contextlib.contextmanager
def created_in_background(cluster: Cluster, pods: list[dict[str, Any]], *, namespace: str, batch: int = 30) -> Iterator[None]:
    """Create `pods`, `batch` at a time, in a thread while the body runs (and injects faults);
    on leaving, wait until every pod exists and raise what the thread raised."""
    failures: list[BaseException] = []

    def run() -> None:
        try:
            for start in range(0, len(pods), batch):
                create_through_outages(cluster, pods[start : start + batch], namespace=namespace)
        except BaseException as error:  # handed to the test's thread below
            failures.append(error)

    thread = threading.Thread(target=run, name="burst-creator", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join(timeout=300)
    assert not thread.is_alive(), "the pods of the burst were still being created after 300 s"
    if failures:
        raise failures[0]


def ledger_leases(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """The extender's ledger Leases by node, as the apiserver stores them."""
    completed = cluster.kubectl(
        "get", "leases", "-n", reservations.LEDGER_NAMESPACE, "-l", f"{reservations.LEDGER_LABEL}=true", "-o", "json"
    )
    assert completed.returncode == 0, completed.stderr
    return {node: dict(lease) for node, lease in reservations.leases_by_node(json.loads(completed.stdout)["items"]).items()}


def held(cluster: Cluster, node: str, *, ttl: float, check: bool = True) -> list[int]:
    """GiB per card as the allocation model counts it now: bound pods, unbound pods with a fresh
    allocation annotation, unexpired ledger entries (the node's Lease, and the Node annotation an
    earlier version wrote). Never past a card either (`check`; off only while an earlier test's
    namespace is torn down: this model counts Terminating pods, which the extender frees at once,
    so a Pending pod of that namespace bound before its own deletion reads as a card too many)."""
    obj = cluster.get("node", node, namespace="default")
    ledger = reservations.union(obj, ledger_leases(cluster).get(node))
    state = cards.node_state(obj, all_pods(cluster), now=time.time(), ttl=ttl, reservations=ledger)
    used = [card.memory_used for card in state.cards]
    assert not check or all(gib <= CARD_GIB for gib in used), f"{node} over-committed counting reservations: {used}"
    return used


def bound_count(cluster: Cluster, namespace: str) -> int:
    return sum(1 for p in cluster.pods(namespace=namespace) if p["spec"].get("nodeName"))


def unschedulable_count(cluster: Cluster, namespace: str) -> int:
    return sum(
        1
        for p in cluster.pods(namespace=namespace)
        if not p["spec"].get("nodeName")
        and any(
            c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
            for c in p.get("status", {}).get("conditions", [])
        )
    )


def restart_extender(cluster: Cluster, *, ttl: float) -> None:
    """The extender `install.start_extender` runs, started again on its port with ``--reservation-ttl``."""
    state = cluster.state
    port = state.ports["extender"]
    command = [
        install.executable(),
        "extender",
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--kubeconfig",
        str(state.kubeconfig),
        "--reservation-ttl",
        f"{ttl:g}",
    ]
    controlplane.start(state, "extender", command=command)
    controlplane.wait_for(
        lambda: _http_ok(f"http://127.0.0.1:{port}/healthz"),
        what="the extender /healthz",
        timeout=30,
        state=state,
        component="extender",
    )


def kill_extender(cluster: Cluster) -> None:
    """SIGKILL, as an OOM kill or a lost node would: binds in flight are cut wherever they are."""
    pid = cluster.state.pids.pop("extender")
    try:
        os.killpg(pid, signal.SIGKILL)  # started in a session of its own: the group is its own
    except ProcessLookupError:
        pass
    cluster.state.save()
    eventually(lambda: not _alive(pid), what="the extender to die", timeout=10)


def restart_apiserver(cluster: Cluster, *, outage_s: float = 6.0) -> None:
    """kube-apiserver stopped, left down for `outage_s` (by default long enough for watches and the
    labelers' next passes, every 2 s, to fail at least once), started again; returns once it is ready."""
    state = cluster.state
    controlplane.stop(state, ["kube-apiserver"])
    deadline = time.monotonic() + outage_s
    while time.monotonic() < deadline:
        time.sleep(0.5)  # the outage itself: nothing to poll for while the apiserver is down
    controlplane.start(state, "kube-apiserver")
    controlplane.wait_for(
        lambda: cluster.kubectl("get", "--raw", "/readyz").returncode == 0,
        what="kube-apiserver back",
        timeout=60,
        state=state,
        component="kube-apiserver",
    )


def _alive(pid: int) -> bool:
    try:
        finished, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        finished = 0
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
    return finished == 0 and Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as answer:
        return bool(answer.status == 200)


def labels_of(cluster: Cluster, node: str) -> dict[str, str]:
    return cluster.node_labels(node)


# --- tests ----------------------------------------------------------------------------------------


def test_after_an_apiserver_restart_the_extender_and_labelers_recover_and_nothing_is_double_allocated(
    throwaway: Cluster, gpu_node: str
) -> None:
    state = throwaway.state
    namespace = throwaway.namespace()
    create(throwaway, [gpu_pod(f"before-{i}", node=gpu_node, mem=5) for i in range(6)], namespace=namespace)
    eventually(lambda: bound_count(throwaway, namespace) == 6, what="6 pods bound before the restart", timeout=120)
    before = bound_use(throwaway, gpu_node)
    assert sum(before) == 30

    restart_apiserver(throwaway)
    running = state.running()
    assert running.get("extender") and all(alive for name, alive in running.items() if name.startswith("labeler-")), running

    # The extender serves from its watch cache: new pods placed correctly prove it caught up. 12
    # pods of 5 GiB fit on four 15 GiB cards, so 6 of these 10 get a card and 4 stay Pending.
    create(throwaway, [gpu_pod(f"after-{i}", node=gpu_node, mem=5) for i in range(10)], namespace=namespace)

    def settled() -> bool:
        bound_use(throwaway, gpu_node)
        return bound_count(throwaway, namespace) == 12 and unschedulable_count(throwaway, namespace) == 4

    eventually(settled, what="12 pods bound and 4 unschedulable after the restart", timeout=180)
    assert bound_use(throwaway, gpu_node) == [CARD_GIB] * CARDS
    first_pods = {
        p["metadata"]["name"]: p["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_IDX"]
        for p in throwaway.pods(namespace=namespace)
        if p["metadata"]["name"].startswith("before-")
    }
    assert len(first_pods) == 6, "pods bound before the restart keep their cards"

    # A labeler that recovered follows its node's inventory again: one card gone, then back.
    node = next(name for name in state.pids if name.startswith("labeler-"))[len("labeler-") :]
    inventory = state.directory / "inventory" / f"{node}.yaml"
    original = inventory.read_text()
    document = yaml.safe_load(original)
    count = len(document["gpus"])
    document["gpus"] = document["gpus"][:-1]
    inventory.write_text(yaml.safe_dump(document, sort_keys=False))
    try:
        eventually(
            lambda: labels_of(throwaway, node).get("aliyun.accelerator/nvidia_count") == str(count - 1),
            what=f"the labeler of {node} to see a card fewer",
            timeout=60,
        )
    finally:
        inventory.write_text(original)
    eventually(
        lambda: labels_of(throwaway, node).get("aliyun.accelerator/nvidia_count") == str(count),
        what=f"the labeler of {node} to see the card again",
        timeout=60,
    )
    throwaway.kubectl("delete", "namespace", namespace, "--wait=false")


def test_binds_cut_by_killing_the_extender_hold_their_card_only_until_the_reservation_expires(
    throwaway: Cluster, gpu_node: str
) -> None:
    eventually(
        lambda: sum(bound_use(throwaway, gpu_node)) == 0 and sum(held(throwaway, gpu_node, ttl=SHORT_TTL_S, check=False)) == 0,
        what=f"{gpu_node} empty after the previous test",
        timeout=120,
    )
    controlplane.stop(throwaway.state, ["extender"])
    restart_extender(throwaway, ttl=SHORT_TTL_S)
    namespace = throwaway.namespace()

    # Leftovers of binds that died, written as the earlier version's binder wrote them (the ledger on
    # the Node: the upgrade case; this version reads it and never writes it), each for 10 GiB of one card. The pods ask for a scheduler nobody runs, so no retry replaces them.
    # - card 0, killed after the ledger commit (step 3): a ledger entry for a pending pod;
    # - card 1, killed after annotating the pod too (step 4): the entry plus the pod's allocation annotations;
    # - card 2, an entry for a pod that is gone: the binder may drop it at once, it must not hold the card.
    now = time.time()
    expires = now + SHORT_TTL_S
    after_annotate = allocation.Allocation(
        uid="", namespace=namespace, name="cut-after-annotate", node=gpu_node, cards=(1,), memory_gib=10, assumed_at=now
    )
    create(
        throwaway,
        [
            gpu_pod("cut-after-commit", node=gpu_node, mem=10, scheduler="nobody"),
            gpu_pod(
                "cut-after-annotate",
                node=gpu_node,
                mem=10,
                scheduler="nobody",
                annotations=allocation.bind_annotations(after_annotate, card_memory_gib=CARD_GIB),
            ),
        ],
        namespace=namespace,
    )
    uids = {
        name: throwaway.get("pod", name, namespace=namespace)["metadata"]["uid"]
        for name in ("cut-after-commit", "cut-after-annotate")
    }
    ledger = {
        uids["cut-after-commit"]: allocation.Allocation(
            uid=uids["cut-after-commit"],
            namespace=namespace,
            name="cut-after-commit",
            node=gpu_node,
            cards=(0,),
            memory_gib=10,
            assumed_at=now,
            expires=expires,
        ),
        uids["cut-after-annotate"]: allocation.Allocation(
            uid=uids["cut-after-annotate"],
            namespace=namespace,
            name="cut-after-annotate",
            node=gpu_node,
            cards=(1,),
            memory_gib=10,
            assumed_at=now,
            expires=expires,
        ),
        "gone-uid": allocation.Allocation(
            uid="gone-uid",
            namespace=namespace,
            name="gone",
            node=gpu_node,
            cards=(2,),
            memory_gib=10,
            assumed_at=now,
            expires=expires,
        ),
    }
    completed = throwaway.kubectl(
        "annotate", "node", gpu_node, "--overwrite", f"{gpu.RESERVATIONS_ANNOTATION}={reservations.encode(ledger)}"
    )
    assert completed.returncode == 0, completed.stderr
    assert held(throwaway, gpu_node, ttl=SHORT_TTL_S)[:3] == [10, 10, 10]

    # A real SIGKILL in the middle of a burst: 4 pods of 15 GiB would take every card, but while
    # the leftovers live only cards 2 (its pod is gone) and 3 can take one.
    create(throwaway, [gpu_pod(f"whole-{i}", node=gpu_node, mem=CARD_GIB) for i in range(4)], namespace=namespace)
    eventually(lambda: bound_count(throwaway, namespace) >= 1, what="a first bind", timeout=120)
    kill_extender(throwaway)

    def reserved_cards_untouched() -> None:
        """Cards 0 and 1 go to nobody while the reservations live (a margin: same machine's clock)."""
        use = bound_use(throwaway, gpu_node)
        if time.time() < expires - 2:
            assert use[:2] == [0, 0], f"a card was handed out while reserved until {expires:.0f} (now {time.time():.0f}): {use}"

    reserved_cards_untouched()
    held(throwaway, gpu_node, ttl=SHORT_TTL_S)  # over-commit check, reservations included
    restart_extender(throwaway, ttl=SHORT_TTL_S)

    # The gone pod's entry stops counting after the in-flight grace and the reservations at their
    # expiry: no watch event says so, and pods the extender turned away meanwhile wait for a cluster
    # event (KEP-624: extenders have no queueing hints). The extender gives it: it stamps the Node's
    # ledger-freed annotation when such a lapse frees cards (`webhook.extender.nudge`); nothing here
    # touches the Node.

    def only_free_cards_used() -> bool:
        reserved_cards_untouched()
        return bound_use(throwaway, gpu_node)[2:] == [CARD_GIB, CARD_GIB]

    try:
        eventually(only_free_cards_used, what="cards 2 and 3 taken by the burst", timeout=120)
    except AssertionError as error:
        pending = [
            (p["metadata"]["name"], [c.get("message") for c in p.get("status", {}).get("conditions", [])])
            for p in throwaway.pods(namespace=namespace)
            if not p["spec"].get("nodeName")
        ]
        raise AssertionError(
            f"{error}: cards {bound_use(throwaway, gpu_node)}, held {held(throwaway, gpu_node, ttl=SHORT_TTL_S)}, pending {pending}"
        ) from None

    # Once the reservations expire, cards 0 and 1 are free again and the remaining whole-card pods
    # get them; the pods whose binds were cut stay unbound and hold nothing.

    def all_cards_taken() -> bool:
        reserved_cards_untouched()
        return bound_use(throwaway, gpu_node) == [CARD_GIB] * CARDS

    eventually(
        all_cards_taken, what="every card taken once the reservations expired", timeout=max(0.0, expires - time.time()) + 180
    )
    names = {p["metadata"]["name"] for p in throwaway.pods(namespace=namespace) if p["spec"].get("nodeName")}
    assert names == {f"whole-{i}" for i in range(4)}, names
    assert held(throwaway, gpu_node, ttl=SHORT_TTL_S) == [CARD_GIB] * CARDS, "nothing but the bound pods holds a card"


def test_a_long_burst_through_an_apiserver_restart_and_a_killed_replica_loses_no_pod_and_over_commits_no_card(
    throwaway: Cluster,
) -> None:
    """Two extender replicas bind a burst of 360 pods onto the same 96 cards while the apiserver is
    restarted and then one replica is SIGKILLed (and started again, as its Deployment would).

    Replica a is the cluster's extender behind the default kube-scheduler, replica b a second
    extender behind a kube-scheduler of its own (`Replica`, as in test_extender.py); the burst's
    pods alternate between the two schedulers. Counted from what the apiserver stores: no card
    ever holds more than its memory, every pod is bound with a valid allocation or Pending with the
    scheduler's reason, and once the faults are over and the reservations of cut binds expired,
    exactly min(created, capacity) pods are bound."""
    started = time.monotonic()
    created_nodes: list[str] = []
    pool = extender_e2e.make_pool(throwaway, created_nodes, count=BURST_NODES)
    namespace = throwaway.namespace()
    controlplane.stop(throwaway.state, ["extender"])
    restart_extender(throwaway, ttl=SHORT_TTL_S)  # replica a: its cut binds hold a card for 40 s, not 120
    second = extender_e2e.Replica(
        cluster=throwaway,
        scheduler_name=f"faults-b-{pool.name}",
        extender=f"extender-b-{pool.name}",
        scheduler=f"scheduler-b-{pool.name}",
    )
    second.start_extender()
    try:
        second.start_scheduler()
        schedulers = ("default-scheduler", second.scheduler_name)
        burst = [
            extender_e2e.gpu_pod(f"burst-{i:03d}", pool=pool, scheduler=schedulers[i % 2], group="burst", mem=BURST_GIB)
            for i in range(BURST_PODS)
        ]
        seen: dict[str, Any] = {}

        def bound_at_least(count: int) -> bool:
            extender_e2e.card_use(throwaway, pool, namespace)
            seen["bound"] = tally(throwaway.pods(namespace=namespace))["bound"]
            return int(seen["bound"]) >= count

        with created_in_background(throwaway, burst, namespace=namespace):
            eventually(lambda: bound_at_least(40), what="40 pods of the burst bound", timeout=120)
            seen["apiserver restarted at"] = seen["bound"]
            restart_apiserver(throwaway)
            eventually(
                lambda: bound_at_least(BURST_CAPACITY // 2),
                what=f"{BURST_CAPACITY // 2} pods bound after the apiserver restart",
                timeout=120,
            )
            seen["replica a killed at"] = seen["bound"]
            kill_extender(throwaway)
            extender_e2e.card_use(throwaway, pool, namespace)
            unbound = {p["metadata"]["uid"] for p in throwaway.pods(namespace=namespace) if not p["spec"].get("nodeName")}
            leases = ledger_leases(throwaway)
            ledgers = [reservations.lease_reservations(leases[name]) for name in pool.nodes if name in leases]
            seen["entries of unbound pods at the kill"] = sum(1 for ledger in ledgers for uid in ledger if uid in unbound)
            assert not any(
                reservations.node_reservations(n)
                for n in json.loads(
                    throwaway.kubectl("get", "nodes", "-l", f"{extender_e2e.POOL_LABEL}={pool.name}", "-o", "json").stdout
                )["items"]
            ), "this version writes no ledger onto a Node"
            restart_extender(throwaway, ttl=SHORT_TTL_S)
        seen["faults over after s"] = round(time.monotonic() - started)

        # Pods the extender turned away (cards full, or held by a cut bind's reservation) wait for a
        # cluster event to be tried again (KEP-624: extenders have no queueing hints). A reservation
        # expiring or pruned is none by itself: the extender stamps the Node then
        # (`webhook.extender.nudge`); nothing here touches a Node.
        fits = min(len(burst), BURST_CAPACITY)

        def settled() -> bool:
            extender_e2e.card_use(throwaway, pool, namespace)
            pods = throwaway.pods(namespace=namespace)
            problems = allocation_problems(pods, gib=BURST_GIB)
            assert not problems, problems
            counts = tally(pods)
            assert counts["bound"] <= fits, f"{counts['bound']} pods bound, but the cards hold {fits}"
            seen["counts"] = dict(counts)
            return len(pods) == len(burst) and counts["bound"] == fits and counts["pending/Unschedulable"] == len(burst) - fits

        try:
            eventually(
                settled, what=f"{fits} of {len(burst)} pods bound and the rest unschedulable", timeout=SHORT_TTL_S + 60 + 120
            )
        except AssertionError as error:
            raise AssertionError(f"{error}: {seen}") from None
        use = extender_e2e.card_use(throwaway, pool, namespace)
        pods = throwaway.pods(namespace=namespace)
        assert sorted(p["metadata"]["name"] for p in pods) == sorted(p["metadata"]["name"] for p in burst), "pods lost"
        assert all(gib == list(pool.card_gib) for gib in use.values()), use
        waiting = [p for p in pods if not p["spec"].get("nodeName")]
        assert all(c.get("message") for p in waiting for c in p["status"]["conditions"] if c.get("type") == "PodScheduled"), (
            "a Pending pod without the scheduler's message"
        )
        by_scheduler = Counter(p["spec"]["schedulerName"] for p in pods if p["spec"].get("nodeName"))
        assert all(by_scheduler[s] > 0 for s in schedulers), f"both replicas should have bound pods: {by_scheduler}"
        print(
            f"\nburst: {len(pods)} created, {len(burst) - len(pods)} lost, capacity {BURST_CAPACITY}, "
            f"bound {sum(by_scheduler.values())} (replica a {by_scheduler[schedulers[0]]}, replica b {by_scheduler[schedulers[1]]}), "
            f"pending {len(waiting)} (all Unschedulable), over-committed cards 0 of {BURST_NODES * len(pool.card_gib)}; "
            f"{seen}; {time.monotonic() - started:.0f} s"
        )
    finally:
        second.stop()
        throwaway.kubectl("delete", "namespace", namespace, "--wait=false")
        throwaway.kubectl("delete", "node", "--wait=false", *created_nodes)
