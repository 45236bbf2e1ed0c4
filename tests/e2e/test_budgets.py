"""GPU-memory budgets per namespace (`gpuBudgets`), kept by the scheduler extender behind a real
kube-scheduler, on KWOK nodes.

Setup, per module: the module's namespaces are made first, so that one settings file can name them:
`extenderSchedulers` (the webhook lets our schedulers place GPU pods, as in test_extender) and
`gpuBudgets`. The session webhook is restarted on that file, and every extender replica is started
with `--config` on the same file, as a deployment mounts the webhook's settings into the extender.
Each test starts its own replicas (test_extender's `Replica`: an extender and the kube-scheduler
that calls it) and its own KWOK pools, tainted so that only its pods land there.

What must hold is read from what the apiserver stores, not from the extender's memory: the sum of
the `aliyun.com/gpu-mem` (or whole cards' memory) of the pods bound in a budgeted namespace never
exceeds its budget, at every poll.

A MIG slice is placed by kube-scheduler and the device plugin, not the extender: the webhook gives
it the budget's scheduling gate, the extender's gatekeeper charges it to the namespace's ledger and
lifts the gate, and a slice the budget has no room for stays gated until room frees up.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from policies.gpu import budgets, reservations
from tests.e2e import test_extender as extender_e2e  # its Replica, KWOK pools and pods
from tests.e2e.harness import Cluster, eventually, extender_token, webhook_settings
from webhook.cluster import nodes

pytestmark = pytest.mark.e2e

CARD_16_MIB = 16384
TEAM_GIB = 32  # the first test's budget
# The burst: three namespaces with budgets, pods of these sizes in turn, 200 pods in all.
BURST_BUDGETS_GIB = (40, 52, 30)
BURST_SIZES_GIB = (2, 3, 5)
BURST_PODS = 200
# One namespace, one node: binds batched on the node, each charged to the same budget Lease.
ONE_NODE_PODS = 24
ONE_NODE_BUDGET_GIB = 40
# Shares and MIG slices (nvidia.com/mig-1g.10gb: 10 GiB each) in one budget.
MIG_BUDGET_GIB = 24
MIG_RESOURCE = "nvidia.com/mig-1g.10gb"


class Namespaces:
    """The module's namespaces, made before the settings that name them."""

    def __init__(self, cluster: Cluster) -> None:
        self.team = cluster.namespace()  # budget TEAM_GIB
        self.free = cluster.namespace()  # no budget: unlimited
        self.burst = tuple(cluster.namespace() for _ in BURST_BUDGETS_GIB)
        self.one_node = cluster.namespace()  # budget ONE_NODE_BUDGET_GIB
        self.mig = cluster.namespace()  # budget MIG_BUDGET_GIB

    def budgets_gib(self) -> dict[str, int]:
        return {
            self.team: TEAM_GIB,
            **dict(zip(self.burst, BURST_BUDGETS_GIB, strict=True)),
            self.one_node: ONE_NODE_BUDGET_GIB,
            self.mig: MIG_BUDGET_GIB,
        }


def budget_name(namespace: str) -> str:
    return f"budget-{namespace}"


@pytest.fixture(scope="module")
def spaces(cluster: Cluster) -> Namespaces:
    return Namespaces(cluster)


@pytest.fixture(scope="module")
def settings_file(cluster: Cluster, spaces: Namespaces, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The one settings file of the webhook and of every extender replica here."""
    settings = {
        "extenderSchedulers": ["default-scheduler", *(extender_e2e.scheduler_name(t) for t in extender_e2e.TAGS)],
        "gpuBudgets": [
            {"name": budget_name(ns), "namespaces": [ns], "memory": f"{gib}Gi"} for ns, gib in spaces.budgets_gib().items()
        ],
    }
    directory = tmp_path_factory.mktemp("budget-settings")
    with webhook_settings(cluster, settings, directory=directory):
        yield str(directory / "config.yaml")


@pytest.fixture
def pools(cluster: Cluster) -> Iterator[list[str]]:
    created: list[str] = []
    yield created
    if created:
        cluster.kubectl("delete", "node", "--wait=false", *created)


# --- what the apiserver stores --------------------------------------------------------------------------


def _limits(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    containers = pod["spec"].get("containers", [])
    assert len(containers) == 1, "the pods here have one container"
    limits: Mapping[str, Any] = containers[0].get("resources", {}).get("limits", {})
    return limits


def held_gib(pod: Mapping[str, Any], *, card_gib: Mapping[str, int]) -> int:
    """What a bound, unfinished pod holds of its namespace's budget, from its spec: its gpu-mem, or
    its whole cards times the card size of its node (`card_gib`: the pools' nodes); 0 otherwise."""
    node = pod["spec"].get("nodeName")
    if not node or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
        return 0
    limits = _limits(pod)
    slices = [
        int(value) * (budgets.mig_memory_mib(name) or 0) // 1024
        for name, value in limits.items()
        if name.startswith("nvidia.com/mig-")
    ]
    if slices:
        return sum(slices)
    if "aliyun.com/gpu-mem" in limits:
        return int(limits["aliyun.com/gpu-mem"])
    if "aliyun.com/gpu" in limits:
        return int(limits["aliyun.com/gpu"]) * card_gib[node]
    return 0


def used_gib(cluster: Cluster, namespace: str, *, card_gib: Mapping[str, int], budget: int | None) -> int:
    """The namespace's bound GiB; asserts it is within `budget` (where there is one)."""
    total = sum(held_gib(p, card_gib=card_gib) for p in cluster.pods(namespace=namespace))
    assert budget is None or total <= budget, f"namespace {namespace} holds {total} GiB, over its budget of {budget} GiB"
    return total


def unschedulable(pod: Mapping[str, Any]) -> bool:
    return not pod["spec"].get("nodeName") and any(
        c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
        for c in pod.get("status", {}).get("conditions", [])
    )


def inspect_budgets(replica: extender_e2e.Replica) -> dict[str, dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{replica.port}/inspect", timeout=10) as answer:  # noqa: S310 - a local URL
        document = json.loads(answer.read())
    return {row["namespace"]: row for row in document.get("budgets", [])}


def budget_leases(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """The budget Leases in the ledger namespace, by the namespace whose ledger each is."""
    completed = cluster.kubectl("get", "leases", "-n", reservations.LEDGER_NAMESPACE, "-o", "json")
    assert completed.returncode == 0, completed.stderr
    found = {}
    for lease in json.loads(completed.stdout)["items"]:
        namespace = budgets.lease_namespace(lease)
        if namespace is not None:
            found[namespace] = lease
    return found


# --- tests ---------------------------------------------------------------------------------------------


def test_a_32_gib_budget_filled_with_shares_and_a_whole_card_keeps_the_next_pod_pending_until_one_goes(
    cluster: Cluster, spaces: Namespaces, settings_file: str, pools: list[str]
) -> None:
    replica = extender_e2e._replica(cluster, "a", flags=["--config", settings_file])
    try:
        shares = extender_e2e.make_pool(cluster, pools)  # one node, four 15 GiB cards
        whole = extender_e2e.make_pool(cluster, pools, mode="topology", gpus=(CARD_16_MIB,) * 2)
        card_gib = {name: 16 for name in whole.nodes} | {name: 15 for name in shares.nodes}
        scheduler = replica.scheduler_name

        def share(name: str, gib: int) -> dict[str, Any]:
            return extender_e2e.gpu_pod(name, pool=shares, scheduler=scheduler, group="budget", mem=gib)

        team, free = spaces.team, spaces.free
        # In some order: a share, the whole 16 GiB card, two more shares: 8 + 16 + 4 + 4 = 32 GiB.
        steps = [
            [share("share-8", 8)],
            [extender_e2e.gpu_pod("card-16", pool=whole, scheduler=scheduler, group="budget", whole=1)],
            [share("share-4a", 4), share("share-4b", 4)],
        ]
        placed = 0
        for step in steps:
            extender_e2e.create(cluster, step, namespace=team)
            placed += len(step)
            cluster.running_pods(namespace=team, count=placed, timeout=120)
            used_gib(cluster, team, card_gib=card_gib, budget=TEAM_GIB)
        assert used_gib(cluster, team, card_gib=card_gib, budget=TEAM_GIB) == 32
        card = cluster.get("pod", "card-16", namespace=team)
        assert card["spec"]["nodeName"] == whole.nodes[0] and extender_e2e.allocation(card)["whole"] is True

        # The next share does not fit the budget (the cards have 44 GiB free): Pending, and
        # kube-scheduler's event carries the extender's message, which names budget, used and asked.
        extender_e2e.create(cluster, [share("over", 4)], namespace=team)
        expected = (
            f"namespace {team} budget {budget_name(team)!r} (32Gi of GPU memory): "
            "32 GiB used + 4 GiB asked > 32 GiB of GPU memory"
        )
        eventually(
            lambda: any(expected in m for m in extender_e2e.events_of(cluster, team, "over")),
            what="the NAMESPACE_BUDGET message in the pending pod's events",
            timeout=120,
        )
        assert replica.metric("gpu_admission_extender_filter_reasons_total", code="NAMESPACE_BUDGET") >= 1
        row = inspect_budgets(replica)[team]
        assert (row["budget"], row["memoryBudgetMiB"], row["memoryUsedMiB"], row["cardsUsed"]) == (
            budget_name(team),
            32 * 1024,
            32 * 1024,
            1,
        )
        assert (
            replica.metric("gpu_admission_extender_namespace_gpu_memory_used_bytes", namespace=team, budget=budget_name(team))
            == 32 * 2**30
        )

        # A namespace without a budget is still placed on the same cards.
        extender_e2e.create(cluster, [share("elsewhere", 4)], namespace=free)
        cluster.running_pods(namespace=free, count=1, timeout=120)
        pending = cluster.get("pod", "over", namespace=team)
        assert not pending["spec"].get("nodeName") and unschedulable(pending)
        assert used_gib(cluster, team, card_gib=card_gib, budget=TEAM_GIB) == 32

        # Room frees up: the pending pod runs, and the budget holds again.
        completed = cluster.kubectl("delete", "pod", "share-4a", "-n", team, "--wait=true", "--timeout=60s")
        assert completed.returncode == 0, completed.stderr
        cluster.pod_once(
            "over",
            namespace=team,
            condition=lambda p: p.get("status", {}).get("phase") == "Running",
            what="the pending pod to run once a pod of its namespace is gone",
            timeout=180,
        )
        assert used_gib(cluster, team, card_gib=card_gib, budget=TEAM_GIB) == 32
        assert budgets.lease_name(team) == budget_leases(cluster)[team]["metadata"]["name"]
    finally:
        replica.stop()


def test_a_burst_of_200_pods_in_three_budgeted_namespaces_with_two_replicas_never_exceeds_a_budget(
    cluster: Cluster, spaces: Namespaces, settings_file: str, pools: list[str]
) -> None:
    replicas = [extender_e2e._replica(cluster, tag, flags=["--config", settings_file]) for tag in extender_e2e.TAGS]
    try:
        # 4 nodes of four 15 GiB cards: 240 GiB, far more than the budgets' 122 GiB, so only the budgets limit.
        pool = extender_e2e.make_pool(cluster, pools, count=4)
        card_gib = {name: 15 for name in pool.nodes}
        limits = dict(zip(spaces.burst, BURST_BUDGETS_GIB, strict=True))
        # Both replicas place a pod of a namespace without a budget first: each kube-scheduler sees
        # the pool's nodes schedulable (the node controller's not-ready taint gone), so the burst is
        # raced by both from its first pod, not won by whichever scheduler saw the nodes first.
        group = f"warm-{pool.name}"
        extender_e2e.create(
            cluster,
            [
                extender_e2e.gpu_pod(f"{group}-{i}", pool=pool, scheduler=r.scheduler_name, group=group, mem=1)
                for i, r in enumerate(replicas)
            ],
            namespace=spaces.free,
        )
        cluster.running_pods(
            namespace=spaces.free, selector=f"{extender_e2e.GROUP_LABEL}={group}", count=len(replicas), timeout=120
        )
        before = [r.metric("gpu_admission_extender_requests_total", verb="bind", result="ok") for r in replicas]
        by_namespace: dict[str, list[dict[str, Any]]] = {ns: [] for ns in spaces.burst}
        for i in range(BURST_PODS):
            namespace = spaces.burst[i % len(spaces.burst)]
            size = BURST_SIZES_GIB[(i // len(spaces.burst)) % len(BURST_SIZES_GIB)]
            scheduler = replicas[i % len(replicas)].scheduler_name
            by_namespace[namespace].append(
                extender_e2e.gpu_pod(f"burst-{i:03d}", pool=pool, scheduler=scheduler, group="burst", mem=size)
            )
        assert sum(len(p) for p in by_namespace.values()) == BURST_PODS
        # The three namespaces' pods are created at once, each namespace by one kubectl.
        creating = [
            subprocess.Popen(
                [
                    str(cluster.state.bin_dir / "kubectl"),
                    f"--kubeconfig={cluster.state.kubeconfig}",
                    "create",
                    "-n",
                    ns,
                    "-f",
                    "-",
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for ns in spaces.burst
        ]
        for process, ns in zip(creating, spaces.burst, strict=True):
            assert process.stdin is not None
            process.stdin.write(json.dumps({"apiVersion": "v1", "kind": "List", "items": by_namespace[ns]}))
            process.stdin.close()
        polls = 0
        final: dict[str, tuple[int, list[int]]] = {}

        def filled() -> bool:
            """Checked at every poll: no namespace over its budget. Done when every pod is created,
            and each one is bound or judged unschedulable, in a namespace with no room left for it."""
            nonlocal polls
            polls += 1
            done = True
            for ns, budget in limits.items():
                pods = cluster.pods(namespace=ns)
                used = sum(held_gib(p, card_gib=card_gib) for p in pods)
                assert used <= budget, f"poll {polls}: namespace {ns} holds {used} GiB, over its budget of {budget} GiB"
                waiting = [int(_limits(p)["aliyun.com/gpu-mem"]) for p in pods if not p["spec"].get("nodeName")]
                final[ns] = (used, waiting)
                done = done and (
                    len(pods) == len(by_namespace[ns])
                    and all(unschedulable(p) for p in pods if not p["spec"].get("nodeName"))
                    and (not waiting or budget - used < min(waiting))
                )
            return done

        try:
            eventually(filled, what="every namespace filled to its budget and the rest unschedulable", timeout=360)
        finally:
            for process in creating:
                assert process.wait(timeout=120) == 0, process.stderr.read() if process.stderr else ""
        assert polls >= 3, "the invariant should have been checked while the burst was under way"
        for ns, budget in limits.items():
            used, waiting = final[ns]
            assert waiting, f"{ns}: the burst asks for more than its budget, so some pods must wait"
            assert budget - used < min(waiting), f"{ns}: {used} of {budget} GiB used, yet pods of {sorted(set(waiting))} GiB wait"
        for ns in spaces.burst:  # every bound pod went through bind (card_use asserts it)
            extender_e2e.card_use(cluster, pool, ns)
        binds = [
            r.metric("gpu_admission_extender_requests_total", verb="bind", result="ok") - b
            for r, b in zip(replicas, before, strict=True)
        ]
        assert all(b > 0 for b in binds), f"both replicas should have bound pods: {binds}"
        assert sum(binds) >= sum(len(by_namespace[ns]) - len(final[ns][1]) for ns in spaces.burst)
        leases = budget_leases(cluster)
        assert set(spaces.burst) <= set(leases), "every budgeted namespace bound to has its budget Lease"
        # Both replicas' /inspect agree with the apiserver (their pod watches catch up).
        wanted = {ns: (budget * 1024, final[ns][0] * 1024) for ns, budget in limits.items()}
        for r in replicas:

            def seen(replica: extender_e2e.Replica = r) -> bool:
                rows = inspect_budgets(replica)
                return {ns: (row["memoryBudgetMiB"], row["memoryUsedMiB"]) for ns, row in rows.items() if ns in wanted} == wanted

            eventually(seen, what=f"the budgets in {r.extender}'s /inspect", timeout=30)
    finally:
        for r in replicas:
            r.stop()


def test_a_burst_in_one_budgeted_namespace_onto_one_node_binds_without_waiting_on_itself(
    cluster: Cluster, spaces: Namespaces, settings_file: str, pools: list[str]
) -> None:
    """kube-scheduler's binds to one node arrive together and are committed as one batch, each pod's
    charge to the same budget Lease first: the extender must not wait for the pod watch to show
    Bindings that come only after the batch (each bind would wait, and time out)."""
    replica = extender_e2e._replica(cluster, "a", flags=["--config", settings_file])
    try:
        pool = extender_e2e.make_pool(cluster, pools)  # one node, four 15 GiB cards: 60 GiB
        ns = spaces.one_node
        extender_e2e.create(
            cluster,
            [
                extender_e2e.gpu_pod(f"one-{i:02d}", pool=pool, scheduler=replica.scheduler_name, group="one", mem=1)
                for i in range(ONE_NODE_PODS)
            ],
            namespace=ns,
        )
        cluster.running_pods(namespace=ns, count=ONE_NODE_PODS, timeout=60)
        assert used_gib(cluster, ns, card_gib={pool.nodes[0]: 15}, budget=ONE_NODE_BUDGET_GIB) == ONE_NODE_PODS
        assert replica.metric("gpu_admission_extender_requests_total", verb="bind", result="ok") == ONE_NODE_PODS
        # A bind that failed (timed out) shows as kube-scheduler's FailedScheduling event "binding
        # rejected: ..." (kube-scheduler v1.34 pkg/scheduler/schedule_one.go, the binding cycle's error).
        rejected = [
            m
            for p in cluster.pods(namespace=ns)
            for m in extender_e2e.events_of(cluster, ns, p["metadata"]["name"])
            if "binding rejected" in m
        ]
        assert not rejected, rejected[:3]
    finally:
        replica.stop()


def _mig_pool(cluster: Cluster, pools: list[str]) -> str:
    """One KWOK node as NVIDIA's device plugin leaves a MIG card in the mixed strategy: seven 1g.10gb
    slices, no GPU mode label (the default mode); tainted like the extender pools."""
    pool = f"mig{uuid.uuid4().hex[:6]}"
    manifest = nodes.FakeNode(name=pool, labels={extender_e2e.POOL_LABEL: pool}, capacity={MIG_RESOURCE: "7"}).manifest()
    manifest["spec"]["taints"] = [{"key": extender_e2e.TAINT_KEY, "value": pool, "effect": "NoSchedule"}]
    pools.append(pool)
    completed = cluster.kubectl("create", "-f", "-", stdin=json.dumps(manifest))
    assert completed.returncode == 0, completed.stderr
    eventually(
        lambda: any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in cluster.get("node", pool, namespace="default").get("status", {}).get("conditions", [])
        ),
        what=f"MIG node {pool} Ready",
    )
    return pool


def _slice_pod(name: str, *, node_pool: str, scheduler: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {extender_e2e.GROUP_LABEL: "mig"}},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": {extender_e2e.POOL_LABEL: node_pool},
            "tolerations": [{"key": extender_e2e.TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "main", "image": "registry.example/trainer:1", "resources": {"limits": {MIG_RESOURCE: "1"}}}],
        },
    }


def test_a_mig_slice_waits_at_the_budget_gate_and_counts_with_the_shares(
    cluster: Cluster, spaces: Namespaces, settings_file: str, pools: list[str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The issue's mix in one 24 GiB budget: a 10 GiB MIG slice (the webhook gates it, the extender
    charges it and lifts the gate), an 8 GiB share; the next slice (10 + 8 + 10 > 24) stays gated,
    with an Event saying why, until the share goes."""
    # The extender with its own rights: only its ServiceAccount may lift the gate (GPU013).
    token = extender_token(cluster, tmp_path_factory.mktemp("mig-extender"))
    replica = extender_e2e._replica(cluster, "a", flags=["--config", settings_file, "--kubeconfig", str(token)])
    try:
        shares = extender_e2e.make_pool(cluster, pools)  # one node, four 15 GiB cards
        mig = _mig_pool(cluster, pools)
        ns, scheduler = spaces.mig, replica.scheduler_name
        card_gib = {name: 15 for name in shares.nodes}

        # What the webhook makes of the slice: the budget's gate (a server-side dry run shows it).
        dry = cluster.kubectl(
            "create",
            "-n",
            ns,
            "--dry-run=server",
            "-o",
            "json",
            "-f",
            "-",
            stdin=json.dumps(_slice_pod("dry", node_pool=mig, scheduler=scheduler)),
        )
        assert dry.returncode == 0, dry.stderr
        assert {"name": budgets.GATE} in json.loads(dry.stdout)["spec"].get("schedulingGates", [])

        extender_e2e.create(cluster, [_slice_pod("slice-1", node_pool=mig, scheduler=scheduler)], namespace=ns)
        try:
            [first] = cluster.running_pods(namespace=ns, count=1, timeout=120)
        except AssertionError as error:
            pod = cluster.get("pod", "slice-1", namespace=ns)
            raise AssertionError(
                f"{error}: spec.schedulingGates={pod['spec'].get('schedulingGates')}, status={pod.get('status')}, "
                f"events={extender_e2e.events_of(cluster, ns, 'slice-1')}, extender log: "
                + (cluster.state.directory / "logs" / f"{replica.extender}.log").read_text()[-3000:]
            ) from error
        assert first["spec"]["nodeName"] == mig and not first["spec"].get("schedulingGates")
        extender_e2e.create(
            cluster, [extender_e2e.gpu_pod("share-8", pool=shares, scheduler=scheduler, group="mig", mem=8)], namespace=ns
        )
        cluster.running_pods(namespace=ns, count=2, timeout=120)
        assert used_gib(cluster, ns, card_gib=card_gib, budget=MIG_BUDGET_GIB) == 18

        extender_e2e.create(cluster, [_slice_pod("slice-2", node_pool=mig, scheduler=scheduler)], namespace=ns)
        eventually(
            lambda: any(
                "waiting at scheduling gate gpu-admission.io/budget" in m for m in extender_e2e.events_of(cluster, ns, "slice-2")
            ),
            what="the NamespaceBudget Event on the gated slice",
            timeout=60,
        )
        held = cluster.get("pod", "slice-2", namespace=ns)
        assert {"name": budgets.GATE} in held["spec"].get("schedulingGates", []) and not held["spec"].get("nodeName")
        assert used_gib(cluster, ns, card_gib=card_gib, budget=MIG_BUDGET_GIB) == 18

        completed = cluster.kubectl("delete", "pod", "share-8", "-n", ns, "--wait=true", "--timeout=60s")
        assert completed.returncode == 0, completed.stderr
        cluster.pod_once(
            "slice-2",
            namespace=ns,
            condition=lambda p: p.get("status", {}).get("phase") == "Running",
            what="the gated slice to run once the share is gone",
            timeout=120,
        )
        assert used_gib(cluster, ns, card_gib=card_gib, budget=MIG_BUDGET_GIB) == 20
        row = inspect_budgets(replica)[ns]
        assert row["memoryBudgetMiB"] == MIG_BUDGET_GIB * 1024
    finally:
        replica.stop()
