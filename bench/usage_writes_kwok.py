"""The apiserver writes the usage summary adds on 500 KWOK GPU nodes under churn: a cluster run.

`labeler_usage.py churn` simulates the writes; this runs them. One local control plane (etcd,
kube-apiserver, kube-controller-manager, kube-scheduler, KWOK; `webhook.cluster.controlplane.up`, as
`extender_throughput.py` brings up its 500 nodes) with N fake GPU nodes (8 cards of 81,920 MiB,
mode `share`). One process then runs N real labelers, one `webhook.labeler.runner.Runner` per node,
all sharing one real `webhook.labeler.publisher.Publisher` (the labeler's kubernetes client: a GET of
the Node every pass, a merge PATCH of the Node when the summary must be written). Each runner's
source is a synthetic inventory that the churn model of `labeler_usage.py churn` changes (pods
arriving per card as a Poisson process and living an exponential time, holding 2-20 GiB that
drifts by a random walk, out-of-band processes appearing at a rate per node per hour and living 10
minutes); each pod's process has a PID whose cgroup file under a scratch proc root carries a
kubelet-shaped path with the pod's UID (an out-of-band one a `docker run`-shaped path), so the
runner's own attribution (`attribution.summarise` through `cgroups.read`), significance rule
(`policies.gpu.usage.significant`), codec (`usage.render` / `usage.parse` of what is on the Node) and
rate limit (`--usage-interval`) decide every write. The pod list the runner asks for comes from the
model in memory (the KWOK nodes run no pods; a list is a read, not a write).

Time is simulated and compressed: the runners get a simulated clock, and a labeler pass every
`--interval` (60 s) of simulated time is run as fast as the machine allows, all N nodes per tick
(a few worker threads). The churn model first runs alone for `--warmup` simulated minutes (to reach
its steady state, as the simulation's warm-up does), then the runners pass for `--settle` minutes
uncounted (their first pass writes labels and the first summary; node i's labeler starts i mod
(usage interval / pass interval) ticks late, standing in for the simulation's random phase), then
`--minutes` are counted.

Counted: the PATCHes of `nodes` (no subresource) the apiserver received, from kube-apiserver's
`/metrics` (`apiserver_request_total{verb="PATCH",resource="nodes",subresource=""}`, read with the
admin client certificate as `e2e_pod_creates.py` reads its metrics) before and after the counted
window, and the writes the labelers believe they made (`Runner.usage_writes`). Right after `up`,
kube-controller-manager and KWOK patch each new Node a few times; the script waits until no Node
PATCH arrives for 10 s before the first model, after which nothing else patches these Nodes (KWOK
writes `nodes/status` and Leases), so the two counts should agree.

    .venv/bin/python bench/usage_writes_kwok.py --nodes 500 --minutes 10
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import logging
import os
import random
import re
import ssl
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import extender_throughput  # noqa: E402 - after the path set-up above
import labeler_usage  # noqa: E402
import records  # noqa: E402 - bench/ is on sys.path (scripts run as bench/<name>.py); one record per run

from policies.gpu import usage  # noqa: E402
from tests import cgroup_processes  # noqa: E402
from webhook.cluster import binaries, controlplane, nodes  # noqa: E402
from webhook.labeler import inventory, publisher, runner  # noqa: E402

CARDS = labeler_usage.CARDS
CARD_MIB = 81920  # what the simulation gives every card

# The simulation's four rows (bench/README.md): name -> (usage interval s, pod every s, pod life s, drift/min, oob/node/h).
MODELS: dict[str, tuple[float, float, float, float, float]] = {
    "default-60s": (60.0, 1800.0, 3600.0, 0.01, 0.1),
    "default-300s": (300.0, 1800.0, 3600.0, 0.01, 0.1),
    "heavy-300s": (300.0, 300.0, 600.0, 0.03, 1.0),
    "calm-60s": (60.0, 7200.0, 14400.0, 0.002, 0.1),
}


def simulated_writes_per_min(name: str, *, nodes: int, args: argparse.Namespace) -> float:
    """The simulation's figure for the same model, nodes, warm-up and counted minutes, computed in
    this run (``labeler_usage.simulate``, the code behind ``labeler_usage.py churn``)."""
    usage_interval, pod_every, pod_life, drift, oob_rate = MODELS[name]
    found = labeler_usage.simulate(
        argparse.Namespace(
            nodes=nodes,
            minutes=args.minutes,
            warmup=args.warmup,
            interval=args.interval,
            usage_interval=usage_interval,
            pod_every=pod_every,
            pod_life=pod_life,
            drift=drift,
            oob_rate=oob_rate,
        )
    )
    return found.writes_per_min(args.minutes)


def fake_nodes(count: int) -> list[nodes.FakeNode]:
    """N share-mode GPU nodes, named as `extender_throughput.fake_nodes` names its own."""
    return [
        nodes.FakeNode(
            name=f"usage-{i:04d}",
            labels={"ack.node.gpu.schedule": "share"},
            capacity={"aliyun.com/gpu-mem": str(CARDS * CARD_MIB // 1024), "aliyun.com/gpu-count": str(CARDS)},
        )
        for i in range(count)
    ]


class Clock:
    """The simulated time every runner reads (seconds)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Fleet:
    """The churn model of `labeler_usage.churn`, per node, turned into inventories and a pod list.

    Each pod's process gets a fresh host PID whose cgroup file under `proc_root` names the pod;
    an out-of-band process's names a `docker run` container.
    """

    def __init__(
        self, names: list[str], *, proc_root: Path, model: tuple[float, float, float, float, float], step: float, seed: int
    ) -> None:
        _, self.pod_every, self.pod_life, self.drift, self.oob_rate = model
        self.names = names
        self.proc_root = proc_root
        self.step = step
        self.rng = random.Random(seed)
        self.pods: dict[str, list[labeler_usage.SimPod]] = {n: [] for n in names}
        self.pid_of: dict[str, int] = {}  # pod uid -> its process
        self.oob: dict[str, tuple[int, int, float]] = {}  # node -> (pid, MiB, ends)
        self.next_pid = 100000 + seed * 10_000_000
        self.tag = uuid.uuid4().hex[:8]

    def _process(self, path: str) -> int:
        pid = self.next_pid
        self.next_pid += 1
        (self.proc_root / str(pid)).mkdir()
        (self.proc_root / str(pid) / "cgroup").write_text(f"0::/{path}\n")
        return pid

    def tick(self, now: float) -> None:
        """One step of the simulation's model for every node (the same draws, in the same order)."""
        rng, step = self.rng, self.step
        arrival = step / self.pod_every
        for node in self.names:
            for card in range(CARDS):
                if rng.random() < arrival:
                    pod = labeler_usage.SimPod(
                        str(uuid.UUID(int=rng.getrandbits(128))),
                        card,
                        rng.randint(2, 20) * 1024,
                        now + rng.expovariate(1 / self.pod_life),
                    )
                    self.pods[node].append(pod)
                    self.pid_of[pod.uid] = self._process(
                        cgroup_processes.systemd_pod_path(pod.uid, uuid.uuid4().hex * 2, tag=self.tag)
                    )
            for pod in self.pods[node]:
                if pod.ends <= now:
                    self.pid_of.pop(pod.uid, None)
            self.pods[node] = [p for p in self.pods[node] if p.ends > now]
            for p in self.pods[node]:
                p.mib = max(256, int(p.mib + rng.gauss(0, self.drift * CARD_MIB * step / 60)))
            if node in self.oob and self.oob[node][2] <= now:
                del self.oob[node]
            if node not in self.oob and rng.random() < self.oob_rate * step / 3600:
                pid = self._process(cgroup_processes.docker_run_path(uuid.uuid4().hex * 2, tag=self.tag))
                self.oob[node] = (pid, rng.randint(1, 10) * 1024, now + 600)

    def inventory(self, node: str) -> inventory.Inventory:
        """What NVML would report on the node now: per card the pods' processes and the out-of-band one."""
        cards = []
        for card in range(CARDS):
            procs = [inventory.Process(pid=self.pid_of[p.uid], used_mib=p.mib) for p in self.pods[node] if p.card == card]
            if card == 0 and node in self.oob:
                procs.append(inventory.Process(pid=self.oob[node][0], used_mib=self.oob[node][1]))
            cards.append(
                inventory.Card(
                    index=card,
                    uuid=f"GPU-{node}-{card}",
                    name="NVIDIA H100 80GB HBM3",
                    memory_mib=CARD_MIB,
                    used_mib=sum(p.used_mib or 0 for p in procs),
                    processes=tuple(procs),
                )
            )
        return inventory.make(cards)

    def pods_on(self, node_name: str) -> list[Mapping[str, Any]]:
        """The `store.Pods` the runners list: the model's pods on that node."""
        return [{"metadata": {"uid": p.uid, "namespace": "ns", "name": f"p-{p.uid[:8]}"}} for p in self.pods[node_name]]


def request_counts(state: controlplane.State) -> dict[str, float]:
    """kube-apiserver's request counters for nodes: PATCH (no subresource), PATCH nodes/status, GET."""
    pki = state.directory / "pki"
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    with urllib.request.urlopen(state.server + "/metrics", context=context, timeout=30) as answer:
        text = answer.read().decode()
    found = {"patch": 0.0, "patch_status": 0.0, "get": 0.0}
    for match in re.finditer(r"^apiserver_request_total\{([^}]*)\} (\S+)$", text, re.MULTILINE):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        if labels.get("resource") != "nodes":
            continue
        sub = labels.get("subresource", "")
        if labels.get("verb") == "PATCH":
            key = "patch" if sub == "" else "patch_status" if sub == "status" else "patch_other"
            found[key] = found.get(key, 0.0) + float(match.group(2))
        elif labels.get("verb") == "GET" and sub == "":
            found["get"] += float(match.group(2))
    return found


def wait_quiet(state: controlplane.State, *, settle_s: float = 10.0, timeout_s: float = 300.0) -> float:
    """Wait until nothing patches the Nodes for `settle_s` (after `up`, kube-controller-manager and
    KWOK patch each new Node a few times); returns the seconds waited."""
    started = time.monotonic()
    last = request_counts(state)["patch"]
    while time.monotonic() - started < timeout_s:
        time.sleep(settle_s)
        now = request_counts(state)["patch"]
        if now == last:
            break
        last = now
    return time.monotonic() - started


def run_model(
    name: str, *, state: controlplane.State, api: publisher.Publisher, names: list[str], args: argparse.Namespace, seed: int
) -> dict[str, Any]:
    model = MODELS[name]
    usage_interval = model[0]
    clock = Clock()
    with tempfile.TemporaryDirectory(prefix="usage-proc-") as scratch:
        fleet = Fleet(names, proc_root=Path(scratch), model=model, step=args.interval, seed=seed)
        runners = {
            node: runner.Runner(
                source=lambda node=node: fleet.inventory(node),
                nodes=api,
                pods=fleet,
                clock=clock,
                wall_clock=lambda: 1.8e9 + clock.now,
                options=runner.Options(
                    node_name=node, interval_s=args.interval, usage_interval_s=usage_interval, proc_root=Path(scratch)
                ),
            )
            for node in names
        }
        ticks_warm, ticks_settle, ticks_count = (int(m * 60 / args.interval) for m in (args.warmup, args.settle, args.minutes))
        for tick in range(ticks_warm):  # the model alone reaches its steady state
            clock.now = tick * args.interval
            fleet.tick(clock.now)
        outcomes: dict[str, int] = {}
        with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
            # Labelers start at different times (the simulation's random phase): node i's labeler
            # starts at settle tick i mod (usage interval / pass interval).
            spread = max(1, min(ticks_settle, round(usage_interval / args.interval)))
            starts = {node: ticks_warm + i % spread for i, node in enumerate(names)}

            def passes(first: int, count: int) -> float:
                started = time.monotonic()
                for tick in range(first, first + count):
                    clock.now = tick * args.interval
                    fleet.tick(clock.now)
                    due = [node for node in names if starts[node] <= tick]
                    for outcome in pool.map(lambda node: runners[node].step(), due):
                        outcomes[outcome] = outcomes.get(outcome, 0) + 1
                return time.monotonic() - started

            passes(ticks_warm, ticks_settle)
            believed_before = sum(r.usage_writes for r in runners.values())
            seen_before = request_counts(state)
            cpu_before = extender_throughput.cpu_of(state, ["kube-apiserver", "etcd"])
            real_s = passes(ticks_warm + ticks_settle, ticks_count)
            seen_after = request_counts(state)
            cpu_after = extender_throughput.cpu_of(state, ["kube-apiserver", "etcd"])
            believed = sum(r.usage_writes for r in runners.values()) - believed_before
    minutes = args.minutes
    seen = {k: seen_after.get(k, 0.0) - seen_before.get(k, 0.0) for k in seen_after}
    failed = {k: v for k, v in outcomes.items() if k not in (runner.Outcome.CHANGED, runner.Outcome.UNCHANGED)}
    result = {
        "model": name,
        "usage_interval_s": usage_interval,
        "nodes": len(names),
        "simulated_minutes": minutes,
        "real_seconds": round(real_s, 1),
        "apiserver_patch_nodes": int(seen["patch"]),
        "labeler_writes": believed,
        "apiserver_writes_per_min": round(seen["patch"] / minutes, 1),
        "labeler_writes_per_min": round(believed / minutes, 1),
        "per_node_per_min": round(seen["patch"] / minutes / len(names), 3),
        "simulation_writes_per_min": simulated_writes_per_min(name, nodes=len(names), args=args),
        "apiserver_get_nodes": int(seen["get"]),
        "apiserver_patch_nodes_status": int(seen["patch_status"]),
        "failed_passes": {str(k): v for k, v in failed.items()},
        "cpu_s": {k: round(cpu_after[k] - cpu_before.get(k, 0.0), 1) for k in cpu_after},
    }
    print(
        f"  {name:<13} --usage-interval {usage_interval:>4.0f}s: apiserver received {int(seen['patch'])} Node PATCHes in "
        f"{minutes:g} simulated min -> {seen['patch'] / minutes:.1f}/min ({seen['patch'] / minutes / len(names):.3f} per node/min); "
        f"labelers believe {believed} ({believed / minutes:.1f}/min); simulation {result['simulation_writes_per_min']}/min; "
        f"{int(seen['get'])} GETs; {real_s:.0f} s real; failed passes {result['failed_passes'] or 'none'}; "
        f"CPU s {result['cpu_s']}; load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--minutes", type=float, default=10, help="simulated minutes counted per churn model")
    parser.add_argument("--warmup", type=float, default=30, help="simulated minutes of the churn model alone first")
    parser.add_argument("--settle", type=float, default=5, help="simulated minutes of labeler passes before counting")
    parser.add_argument("--interval", type=float, default=60.0, help="labeler pass interval, simulated seconds")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--workers", type=int, default=4, help="threads running the passes of one tick")
    parser.add_argument("--dir", type=Path, default=None, help="cluster directory (default: a temporary one)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    chosen = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in MODELS]
    if unknown:
        parser.error(f"unknown churn model(s) {', '.join(unknown)}")
    directory = args.dir or Path(tempfile.mkdtemp(prefix="usage-kwok-"))
    bin_dir = binaries.ensure()
    fleet_nodes = fake_nodes(args.nodes)
    print(f"control plane with {args.nodes} KWOK nodes in {directory} ...", flush=True)
    started = time.monotonic()
    state = controlplane.up(directory, bin_dir=bin_dir, fake_nodes=fleet_nodes, timeout=600)
    print(f"  up in {time.monotonic() - started:.0f} s; nproc {os.cpu_count()}; load {os.getloadavg()[0]:.1f}", flush=True)
    results = []
    try:
        print(f"  no Node PATCH for 10 s after {wait_quiet(state):.0f} s", flush=True)
        api = publisher.connect(str(state.kubeconfig))
        names = [n.name for n in fleet_nodes]
        print(
            f"{args.nodes} labelers in one process, a pass every {args.interval:g} simulated s; per model {args.warmup:g} min model warm-up, "
            f"{args.settle:g} min of passes uncounted, {args.minutes:g} min counted",
            flush=True,
        )
        for seed, name in enumerate(chosen, start=1):
            results.append(run_model(name, state=state, api=api, names=names, args=args, seed=seed))
    finally:
        with contextlib.suppress(Exception):
            controlplane.down(directory)
    print(
        "\n| churn model | `--usage-interval` | apiserver Node PATCHes/min | labelers' writes/min | per node/min | simulation writes/min |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['model']} | {r['usage_interval_s']:.0f} s | {r['apiserver_writes_per_min']:.1f} | {r['labeler_writes_per_min']:.1f} | "
            f"{r['per_node_per_min']:.3f} | {r['simulation_writes_per_min']} |"
        )
    print(
        json.dumps(
            {
                "bench": "usage_writes_kwok",
                "nodes": args.nodes,
                "minutes_per_model": args.minutes,
                "usage_summary": usage.USAGE_ANNOTATION,
                "writes_per_min": {r["model"]: r["apiserver_writes_per_min"] for r in results},
                "labeler_writes_per_min": {r["model"]: r["labeler_writes_per_min"] for r in results},
                "simulation_writes_per_min": {r["model"]: r["simulation_writes_per_min"] for r in results},
            }
        )
    )
    first = results[0]
    records.write(
        bench="usage_writes_kwok",
        inputs=vars(args),
        figures={
            "writes_per_min": first["apiserver_writes_per_min"],
            "model": first["model"],
            **{f"writes_per_min_{r['model']}": r["apiserver_writes_per_min"] for r in results},
        },
        reference={
            "name": "the simulation (labeler_usage.simulate), same models, nodes and minutes, computed in this run",
            "figures": {
                "writes_per_min": first["simulation_writes_per_min"],
                **{f"writes_per_min_{r['model']}": r["simulation_writes_per_min"] for r in results},
            },
        },
        headline=records.Headline(
            figure="writes_per_min",
            label=f"Node PATCHes a minute, {args.nodes:,} nodes, {first['model']}",
            unit="writes/min",
            better="lower",
        ),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
