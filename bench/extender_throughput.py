"""Scheduling throughput of a real kube-scheduler with and without the gpu-admission extender.

One control plane (etcd, kube-apiserver, kube-controller-manager, KWOK) with N fake GPU nodes
(cgpu, binpack, 4 x 15 GiB each, inventory annotation and capacity as the labeler writes them).
No admission webhook: this measures scheduling. Rounds alternate two kube-scheduler processes that
differ only in the extender:

- plain: `deploy/scheduler-config-second.yaml` without its `extenders` entry. kube-scheduler counts
  `aliyun.com/gpu-mem` per node (NodeResourcesFit) and binds itself; no card is chosen.
- extender: the same file as shipped (urlPrefix pointed at a local `gpu-admission extender`).

For each round, P pods asking for `aliyun.com/gpu-mem: 1` are created first, for a scheduler name no
process serves yet; then that scheduler starts and drains the backlog. Throughput is pods bound per
second between the first and the last bind, seen through a watch (so scheduler start-up is not
counted). Both schedulers get `clientConnection.qps/burst` 5000, as scheduler_perf does, so the
default client rate limit (50 qps) is not what is measured. Filter and bind latency come from the
extender's own `/metrics` (estimated from its latency histogram as PromQL's histogram_quantile
does). Apiserver requests per bound pod come from the apiserver's own `apiserver_request_total`
(by verb, resource and subresource), read before and after each round, with the reservation
ledger's writes split by where they go (`node_writes_per_pod`: the Node annotation of versions
before the Lease ledger; `lease_writes_per_pod`: the node's ledger Lease, and
`ledger_lease_writes_per_pod` counted exactly from a watch on those Leases); the extender's CPU per
pod from /proc. The last line of output is one JSON object of the headline figures.

    .venv/bin/python bench/extender_throughput.py --nodes 500 --pods 1000 --rounds 2 [--against REF]

With `--against REF` the extender of commit REF runs too (rounds "before"), interleaved with the
others on the same control plane, so a change is measured side by side with what it replaces.

With `--budgets` this tree's extender also runs with a settings file (`--config`) that gives every
namespace the pods land in a GPU-memory budget (`gpuBudgets`) of all the cluster's GPU memory, so
that it never refuses (rounds "budgets"): what keeping the budgets costs (their filter check and
the compare-and-swap of the namespace's budget Lease in every bind). The record's `budgets` has
its figures and `ratio_to_extender`, its pods/s over the rounds "extender" (the same extender without
budgets) of the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(Path(__file__).resolve().parent))

import apiserver_probe  # noqa: E402 - the bench helpers, after the path fix above
import records  # noqa: E402 - bench/ is on sys.path (scripts run as bench/<name>.py); one record per run

from policies import gpu  # noqa: E402 - after the path fix above
from policies.gpu import inventory, reservations  # noqa: E402 - after the path fix above
from webhook.cluster import binaries, controlplane, install, nodes  # noqa: E402
from webhook.extender import kube  # noqa: E402

CONFIG = ROOT / "deploy" / "scheduler-config-second.yaml"
T4 = 15360
CARDS = 4
NAMESPACES = ("default",)  # where the pods land (`pods`)


def fake_nodes(count: int) -> list[nodes.FakeNode]:
    listed = inventory.encode_inventory(
        inventory.Card(index=i, memory_mib=T4, uuid=f"GPU-bench-{i}", name="Tesla-T4") for i in range(CARDS)
    )
    return [
        nodes.FakeNode(
            name=f"bench-{i:04d}",
            labels={"ack.node.gpu.schedule": "cgpu", "ack.node.gpu.placement": "binpack"},
            capacity={"aliyun.com/gpu-mem": str(CARDS * T4 // 1024), "aliyun.com/gpu-count": str(CARDS)},
            annotations={gpu.INVENTORY_ANNOTATION: listed},
        )
        for i in range(count)
    ]


def pods(count: int, *, scheduler: str, prefix: str) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{prefix}-{i:05d}", "namespace": NAMESPACES[0], "labels": {"bench": prefix}},
            "spec": {
                "schedulerName": scheduler,
                "containers": [
                    {"name": "main", "image": "registry.example/infer:1", "resources": {"limits": {"aliyun.com/gpu-mem": "1"}}}
                ],
            },
        }
        for i in range(count)
    ]


class BindWatch:
    """Records when each pod of one label first shows a nodeName."""

    def __init__(self, api: kube.KubeApi, *, label: str) -> None:
        self.api = api
        self.label = label
        self.bound: dict[str, float] = {}
        self.stopped = threading.Event()
        _, self.version = api.list("/api/v1/pods")
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        path = "/api/v1/pods"
        while not self.stopped.is_set():
            try:
                for event, obj in self.api.watch(path, resource_version=self.version, stopped=self.stopped):
                    meta = obj.get("metadata") or {}
                    self.version = str(meta.get("resourceVersion", self.version))
                    if event in ("ADDED", "MODIFIED") and (meta.get("labels") or {}).get("bench") == self.label:
                        if (obj.get("spec") or {}).get("nodeName") and meta["name"] not in self.bound:
                            self.bound[meta["name"]] = time.monotonic()
            except Exception:  # noqa: BLE001 - a dropped watch is resumed from the last version
                time.sleep(0.2)

    def wait(self, count: int, *, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.bound) < count:
            if time.monotonic() > deadline:
                raise SystemExit(f"only {len(self.bound)} of {count} pods bound within {timeout:.0f} s")
            time.sleep(0.2)
        self.stopped.set()


def ready_nodes(state: controlplane.State) -> int:
    listed = controlplane.kubectl(state, "get", "nodes", "--no-headers").stdout
    return sum(1 for line in listed.splitlines() if line.split()[1:2] == ["Ready"])


def scheduler_config(state: controlplane.State, *, name: str, extender_port: int | None) -> Path:
    document = yaml.safe_load(CONFIG.read_text())
    if extender_port is None:
        document.pop("extenders", None)
        config = copy.deepcopy(document)
    else:
        config = install.local_scheduler_configuration(document, base_url=f"http://127.0.0.1:{extender_port}")
    config["profiles"] = [{"schedulerName": name}]
    config["clientConnection"] = {"kubeconfig": str(state.kubeconfig), "qps": 5000, "burst": 5000}
    config["leaderElection"] = {"leaderElect": False}
    path = state.directory / f"{name}.yaml"
    path.write_text(json.dumps(config, indent=2))
    return path


def start_scheduler(state: controlplane.State, *, name: str, config: Path, port: int) -> None:
    """kube-scheduler at `-v=3`: its log then says when each scheduling attempt starts and when each
    pod is bound (`binding_latencies`)."""
    kubeconfig = str(state.kubeconfig)
    controlplane.start(
        state,
        name,
        command=[
            str(state.bin_dir / "kube-scheduler"),
            f"--config={config}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            "-v=3",
        ],
    )


# kube-scheduler v1.34 (pkg/scheduler/schedule_one.go) logs "Attempting to schedule pod" at V(3) as
# each scheduling cycle begins (cycles run one at a time), and "Successfully bound pod to node" at
# V(2) when a binding cycle's bind returned: the extender's /bind where an extender binds
# (`extendersBinding`), else the DefaultBinder's Binding POST (`RunBindPlugins`). Its own Bind
# histogram times only the latter, and ends at 204.8 ms.
_KLOG = re.compile(
    r"^[IWEF]\d{4} (?P<h>\d{2}):(?P<m>\d{2}):(?P<s>\d{2}\.\d+)\s+\d+ \S+\] "
    r'"(?P<what>Attempting to schedule pod|Successfully bound pod to node)" pod="(?P<pod>[^"]+)"'
)


def binding_latencies(log: Path) -> list[float]:
    """Each bound pod's binding latency in seconds, as kube-scheduler's log shows it: from the end
    of the pod's last scheduling cycle (the start of the next one: the pod is assumed on its node
    and its binding cycle begins) to "Successfully bound". The same clock and the same two points
    whoever binds, kube-scheduler itself or the extender. A pod with no cycle after its own (the
    last one scheduled) is left out."""
    attempts: list[tuple[float, str]] = []
    bound: dict[str, float] = {}
    day, last = 0.0, -1.0
    for line in log.read_text(errors="replace").splitlines():
        found = _KLOG.match(line)
        if found is None:
            continue
        at = int(found["h"]) * 3600 + int(found["m"]) * 60 + float(found["s"]) + day
        if at < last - 43200:  # past midnight
            day += 86400
            at += 86400
        last = at
        if found["what"].startswith("Attempting"):
            attempts.append((at, found["pod"]))
        else:
            bound.setdefault(found["pod"], at)
    attempts.sort()
    starts = [at for at, _ in attempts]
    cycle_of: dict[str, int] = {}
    for index, (_, pod) in enumerate(attempts):
        if pod in bound and starts[index] <= bound[pod]:
            cycle_of[pod] = index  # its last attempt before the bind
    return [
        bound[pod] - starts[index + 1]
        for pod, index in cycle_of.items()
        if index + 1 < len(starts) and starts[index + 1] <= bound[pod]
    ]


def exact_quantile(values: list[float], q: float) -> float | None:
    """Quantile `q` of `values` (linear between the closest ranks, as numpy's default); None for none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def budget_settings(node_count: int, namespaces: tuple[str, ...] = NAMESPACES) -> dict[str, Any]:
    """Settings (`gpuBudgets`) that give each of `namespaces` a budget of all the GPU memory of
    `node_count` bench nodes: kept (charged, checked, written) on every bind, never refusing one."""
    memory_gib = max(1, node_count) * CARDS * T4 // 1024
    return {
        "gpuBudgets": [
            {"name": f"bench-{namespace}", "namespaces": [namespace], "memory": f"{memory_gib}Gi"} for namespace in namespaces
        ]
    }


def budget_figures(figures: dict[str, dict[str, float | None]]) -> dict[str, float | None]:
    """The rounds "budgets" against the rounds "extender" of the same run: their figures and
    `ratio_to_extender` (pods/s with budgets over pods/s without)."""
    with_budgets, without = figures["budgets"], figures["extender"]
    rate, reference = with_budgets["extender_pods_per_s"], without["extender_pods_per_s"]
    ratio = round(rate / reference, 3) if rate is not None and reference else None
    return {"ratio_to_extender": ratio, "extender_pods_per_s_without_budgets": reference, **with_budgets}


def start_extender(state: controlplane.State, *, log_level: str, source: Path | None = None, config: Path | None = None) -> int:
    """`gpu-admission extender` from this tree, or from `source` (an exported older commit), with
    `config` (a settings file: `--config`) where given."""
    port = controlplane.free_port()
    command = [
        sys.executable,
        "-m",
        "webhook.extender.cli",
        "extender",
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--kubeconfig",
        str(state.kubeconfig),
        "--log-level",
        log_level,
        *(["--config", str(config)] if config is not None else []),
    ]
    controlplane.start(state, "extender", command=command, env={"PYTHONPATH": str(source)} if source is not None else None)

    def healthy() -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
            return bool(answer.status == 200)

    controlplane.wait_for(healthy, what="the extender /healthz", timeout=120, state=state, component="extender")
    return port


def extender_metrics(port: int) -> dict[str, float]:
    """The extender's latency histogram buckets ("verb le" -> cumulative count) and its bind conflicts."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=120).read().decode()  # thousands of nodes: seconds
    found = {}
    for match in re.finditer(
        r'gpu_admission_extender_request_duration_seconds_bucket\{le="(?P<le>[^"]+)",verb="(?P<verb>\w+)"\} (?P<n>\S+)', text
    ):
        found[f"{match['verb']} {match['le']}"] = float(match["n"])
    conflicts = re.search(r"^gpu_admission_extender_bind_conflicts_total (\S+)$", text, re.MULTILINE)
    found["conflicts"] = float(conflicts.group(1)) if conflicts else 0.0
    return found


def quantiles(scraped: list[dict[str, float]]) -> dict[str, float]:
    """p50/p90/p99 per verb in ms over the rounds' histograms (summed), estimated as PromQL's
    histogram_quantile does (linear within the bucket), and the bind conflicts."""
    summed: dict[str, float] = {}
    for one in scraped:
        for key, value in one.items():
            summed[key] = summed.get(key, 0.0) + value
    buckets: dict[str, list[tuple[float, float]]] = {}
    for key, value in summed.items():
        if " " in key:
            verb, le = key.split(" ")
            buckets.setdefault(verb, []).append((float(le), value))
    found = {}
    for verb, series in buckets.items():
        series.sort()
        total = series[-1][1]
        for q in (0.5, 0.9, 0.99):
            found[f"{verb} p{round(q * 100)}"] = _bucket_quantile(q, series, total) * 1000
        # The same estimate from the bounds every version has (15, 20, 30 and 40 ms came later):
        # what compares with an older extender's figure.
        coarse = [(bound, count) for bound, count in series if bound in COARSE_BOUNDS]
        found[f"{verb} p99 coarse"] = _bucket_quantile(0.99, coarse, total) * 1000
        at_20 = dict(series).get(0.02)
        if at_20 is not None and total > 0:
            found[f"{verb} over 20ms"] = (total - at_20) / total  # exact: a bucket bound
    found["conflicts"] = summed.get("conflicts", 0.0)
    return found


# The extender's latency bounds before 15, 20, 30 and 40 ms were added (and +Inf).
COARSE_BOUNDS = frozenset(
    {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, float("inf")}
)


SCHEDULER_BIND = "scheduler_framework_extension_point_duration_seconds_bucket"


def scheduler_bind_metrics(state: controlplane.State, port: int) -> dict[str, float]:
    """kube-scheduler's own Bind extension point latency buckets ("schedulerbind le" -> cumulative
    count), from its /metrics: the DefaultBinder's Binding POST when it binds itself (the plain
    rounds). An extender that binds replaces that extension point, so its rounds have none."""
    text = apiserver_probe.fetch(state, "/metrics", server=f"https://127.0.0.1:{port}").decode()
    found: dict[str, float] = {}
    for labels, value in apiserver_probe.families(text, {SCHEDULER_BIND})[SCHEDULER_BIND]:
        if labels.get("extension_point") == "Bind":
            key = f"schedulerbind {labels['le']}"
            found[key] = found.get(key, 0.0) + value
    return found


def _bucket_quantile(q: float, series: list[tuple[float, float]], total: float) -> float:
    if total <= 0:
        return float("nan")
    rank, lower, below = q * total, 0.0, 0.0
    for bound, cumulative in series:
        if cumulative >= rank:
            if bound == float("inf"):
                return lower  # as histogram_quantile: the highest finite bound
            return lower + (bound - lower) * (rank - below) / max(cumulative - below, 1e-12)
        lower, below = bound, cumulative
    return lower


def cpu_of(state: controlplane.State, names: list[str]) -> dict[str, float]:
    return {name: apiserver_probe.cpu_seconds(state.pids[name]) for name in names if name in state.pids}


REQUEST_DURATION = "apiserver_request_duration_seconds_bucket"
# The bind path's writes as the apiserver times them (its handling, etcd included; the client's
# queueing and the network not): what the extender's own step times compare with. The apiserver
# does not label by namespace, so "PUT leases" has KWOK's node Lease renewals in it too (the plain
# rounds show how many).
TIMED = (("POST", "pods", "binding"), ("PUT", "leases", ""))


def apiserver_metrics(state: controlplane.State) -> str:
    return controlplane.kubectl(state, "get", "--raw", "/metrics").stdout


def apiserver_durations(text: str) -> dict[str, float]:
    """`apiserver_request_duration_seconds` buckets of the `TIMED` writes ("VERB/resource/sub le" -> count)."""
    found: dict[str, float] = {}
    for labels, value in apiserver_probe.families(text, {REQUEST_DURATION})[REQUEST_DURATION]:
        key = (labels.get("verb", ""), labels.get("resource", ""), labels.get("subresource", ""))
        if key in TIMED:
            name = "/".join(k for k in key if k) + f" {labels['le']}"
            found[name] = found.get(name, 0.0) + value
    return found


def apiserver_requests(state: controlplane.State, text: str | None = None) -> dict[tuple[str, str, str], float]:
    """`apiserver_request_total` summed over codes, by (verb, resource, subresource)."""
    text = apiserver_metrics(state) if text is None else text
    found: dict[tuple[str, str, str], float] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line[: line.rindex("}")]))
        key = (labels.get("verb", ""), labels.get("resource", ""), labels.get("subresource", ""))
        found[key] = found.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return found


WRITES = ("POST", "PUT", "PATCH", "DELETE")
# What a bind can cost the apiserver, by (verb, resource, subresource): the Binding, the ledger's
# compare-and-swap (on the Node before issue 19's Lease ledger, on the node's Lease since), and the
# reads bind may make (the Node, the Lease, the pods on it, a pod). KWOK renews its node Leases
# with PUTs too: the plain rounds' rate of those is taken off (`headline`), and the ledger Leases'
# own writes are also counted exactly, from a watch on them (`LedgerWatch`).
NODE_WRITES = (("PATCH", "nodes", ""),)
LEASE_WRITES = (("POST", "leases", ""), ("PUT", "leases", ""), ("PATCH", "leases", ""))
BIND_WRITES = (("POST", "pods", "binding"), *NODE_WRITES, *LEASE_WRITES)
BIND_READS = (("GET", "nodes", ""), ("GET", "leases", ""), ("LIST", "pods", ""), ("GET", "pods", ""))


class LedgerWatch:
    """Counts the successful writes of the extender's ledger Leases (one watch event each)."""

    def __init__(self, api: kube.KubeApi) -> None:
        self.api = api
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{reservations.LEDGER_NAMESPACE}/leases"
        self.selector = f"{reservations.LEDGER_LABEL}=true"
        self.writes = 0
        self.stopped = threading.Event()
        _, self.version = api.list(self.path, label_selector=self.selector)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.is_set():
            try:
                for event, obj in self.api.watch(
                    self.path, resource_version=self.version, stopped=self.stopped, label_selector=self.selector
                ):
                    self.version = str((obj.get("metadata") or {}).get("resourceVersion", self.version))
                    if event in ("ADDED", "MODIFIED"):
                        self.writes += 1
            except Exception:  # noqa: BLE001 - a dropped watch is resumed from the last version
                time.sleep(0.2)

    def stop(self) -> int:
        time.sleep(1.0)  # the last events of the round
        self.stopped.set()
        return self.writes


@dataclasses.dataclass
class Round:
    rate: float
    seconds: float  # from the scheduler's start to the last bind (what the request counts span)
    cpu: dict[str, float]
    requests: dict[tuple[str, str, str], float]
    extender: dict[str, float]  # its /metrics at the end of the round (latency buckets, conflicts)
    scheduler: dict[str, float] = dataclasses.field(default_factory=dict)  # kube-scheduler's Bind latency buckets
    bindings: list[float] = dataclasses.field(default_factory=list)  # each pod's binding latency, s (`binding_latencies`)
    durations: dict[str, float] = dataclasses.field(default_factory=dict)  # the apiserver's latency buckets of `TIMED`
    ledger_writes: int = 0  # successful writes of the ledger Leases (events of `LedgerWatch`)
    probe: apiserver_probe.Snapshot | None = None  # the apiserver's request and watch counters over the round
    profile_ms_per_pod: float | None = None  # apiserver CPU in the profile's window / pods bound in it


def one_round(
    state: controlplane.State,
    api: kube.KubeApi,
    *,
    kind: str,
    index: int,
    count: int,
    source: Path | None | bool,
    log_level: str,
    consulted: bool = True,
    profile_seconds: int = 0,
    profile_dir: Path | None = None,
    config: Path | None = None,
) -> Round:
    """One backlog of `count` pods drained by a fresh kube-scheduler; `source` False: no extender,
    None: the extender of this tree, a path: the extender of that exported tree. The extender is
    started (and has listed everything) before the scheduler, and stopped after the round, so
    each round's extender costs only its own round. `consulted` False: the extender runs (its
    watches, its background work) but the scheduler does not call it. `profile_seconds`: a
    kube-apiserver CPU profile of that many seconds, from the tenth bound pod on, into
    `profile_dir`. `config`: the extender's settings file (`--config`; the budgets)."""
    name = f"bench-{kind}-{index}"
    port = (
        None
        if source is False
        else start_extender(state, log_level=log_level, source=source if isinstance(source, Path) else None, config=config)
    )
    try:
        config = scheduler_config(state, name=name, extender_port=port if consulted else None)
        batch = pods(count, scheduler=name, prefix=name)
        watch = BindWatch(api, label=name)
        ledger = LedgerWatch(api)
        for start in range(0, count, 250):
            controlplane.kubectl(
                state,
                "create",
                "-f",
                "-",
                stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": batch[start : start + 250]}),
            )
        watched = ["kube-apiserver", "etcd", "extender"] if port is not None else ["kube-apiserver", "etcd"]
        metrics_before = apiserver_metrics(state)
        requests_before, durations_before = apiserver_requests(state, metrics_before), apiserver_durations(metrics_before)
        probe_before = apiserver_probe.snapshot(state)
        profile = scheduler_profile = None
        scheduler_port = controlplane.free_port()
        if profile_seconds and profile_dir is not None:
            profile = apiserver_probe.Profile(
                state,
                profile_dir / f"apiserver-{kind}-{index}.pprof",
                seconds=profile_seconds,
                ready=lambda: len(watch.bound) >= max(1, count // 10),
            )
            scheduler_profile = apiserver_probe.Profile(  # the same window, kube-scheduler's side
                state,
                profile_dir / f"scheduler-{kind}-{index}.pprof",
                seconds=profile_seconds,
                ready=lambda: len(watch.bound) >= max(1, count // 10),
                server=f"https://127.0.0.1:{scheduler_port}",
            )
        began = time.monotonic()
        start_scheduler(state, name=name, config=config, port=scheduler_port)
        before = cpu_of(state, [*watched, name])
        try:
            watch.wait(count, timeout=900)
            after = cpu_of(state, [*watched, name])
            scheduler_scraped = scheduler_bind_metrics(state, scheduler_port)
            metrics_after = apiserver_metrics(state)
            requests_after, durations_after = apiserver_requests(state, metrics_after), apiserver_durations(metrics_after)
            probe = apiserver_probe.snapshot(state).minus(probe_before)
            seconds = time.monotonic() - began
            for taken in (profile, scheduler_profile):
                if taken is not None:
                    taken.join()
        finally:
            controlplane.stop(state, [name])
        ledger_writes = ledger.stop()
        scraped = extender_metrics(port) if port is not None else {}
        bindings = binding_latencies(state.directory / "logs" / f"{name}.log")
    finally:
        if port is not None:
            controlplane.stop(state, ["extender"])
    times = sorted(watch.bound.values())
    rate = (len(times) - 1) / (times[-1] - times[0]) if times[-1] > times[0] else float("inf")
    used = ", ".join(f"{k} {after[k] - before.get(k, 0.0):.1f}" for k in after)
    print(
        f"  {kind:<8} round {index}: {count} pods bound in {times[-1] - times[0]:.1f} s -> {rate:.0f} pods/s "
        f"(CPU s: {used.replace(name, 'kube-scheduler')}; load {os.getloadavg()[0]:.1f})",
        flush=True,
    )
    requests = {key: requests_after[key] - requests_before.get(key, 0.0) for key in requests_after}
    bind_path = {
        "/".join(k for k in key if k): requests.get(key, 0.0) / count for key in (*BIND_WRITES, *BIND_READS) if requests.get(key)
    }
    print(
        f"    apiserver requests per pod on the bind path: {json.dumps({k: round(v, 2) for k, v in bind_path.items()})}; "
        f"ledger Lease writes (watched) {ledger_writes / count:.2f}/pod",
        flush=True,
    )
    print(f"    all apiserver requests per pod: {json.dumps(apiserver_probe.per_pod(probe.requests, count, top=16))}", flush=True)
    print(
        f"    watch events per pod: {json.dumps(apiserver_probe.per_pod(probe.watch_events, count))}; "
        f"watch kB per pod: {json.dumps({k: round(v / 1000, 2) for k, v in apiserver_probe.per_pod(probe.watch_bytes, count).items()})}; "
        f"watches open: {json.dumps({k: v for k, v in sorted(probe.watches_open.items()) if v})}",
        flush=True,
    )
    durations = {key: value - durations_before.get(key, 0.0) for key, value in durations_after.items()}
    timed = quantiles([durations])
    print(
        f"    apiserver's own latency, ms: {json.dumps({k: round(v, 1) for k, v in timed.items() if k.endswith(('p50', 'p99'))})}",
        flush=True,
    )
    profiled = None
    if profile is not None and profile.window is not None:
        inside = sum(1 for t in times if profile.window[0] <= t <= profile.window[1])
        cpu = apiserver_probe.profile_cpu_seconds(profile.path)
        if cpu is not None and inside:
            profiled = cpu * 1000 / inside
        print(
            f"    apiserver profile {profile.path.name}: {cpu} CPU s over {inside} binds -> {profiled and round(profiled, 2)} ms/pod",
            flush=True,
        )
        if scheduler_profile is not None and scheduler_profile.window is not None:
            inside = sum(1 for t in times if scheduler_profile.window[0] <= t <= scheduler_profile.window[1])
            cpu = apiserver_probe.profile_cpu_seconds(scheduler_profile.path)
            print(
                f"    kube-scheduler profile {scheduler_profile.path.name}: {cpu} CPU s over {inside} binds"
                f" -> {cpu and inside and round(cpu * 1000 / inside, 2)} ms/pod",
                flush=True,
            )
    elif profile is not None:
        print(f"    apiserver profile not taken: {profile.error or 'the round ended first'}", flush=True)
    return Round(
        rate=rate,
        seconds=seconds,
        cpu={k: after[k] - before.get(k, 0.0) for k in after},
        requests=requests,
        extender=scraped,
        scheduler=scheduler_scraped,
        bindings=bindings,
        durations=durations,
        ledger_writes=ledger_writes,
        probe=probe,
        profile_ms_per_pod=profiled,
    )


def headline(
    rounds: dict[str, list[Round]], kind: str, *, pods_per_round: int, idle: dict[str, float] | None = None
) -> dict[str, float | None]:
    """The figures of the `kind` extender rounds against the plain ones. `idle`: the apiserver's
    CPU cores with nothing scheduled, taken off each round's CPU for as long as the round lasted
    (a slower round pays more of that background per pod)."""
    plain, ext = rounds["plain"], rounds[kind]
    total = float(pods_per_round * len(ext))
    latency = quantiles([r.extender for r in ext])
    # The same requests also come from others (KWOK's node and lease updates, controllers): their
    # rate in the plain rounds, where nothing else touches these resources, is taken off.
    plain_seconds = sum(r.seconds for r in plain)

    def extender_only(keys: tuple[tuple[str, str, str], ...]) -> float:
        found = 0.0
        for key in keys:
            background = (
                0.0 if key == ("POST", "pods", "binding") else sum(r.requests.get(key, 0.0) for r in plain) / plain_seconds
            )
            found += sum(max(0.0, r.requests.get(key, 0.0) - background * r.seconds) for r in ext)
        return found / total

    plain_rate, rate = statistics.median(r.rate for r in plain), statistics.median(r.rate for r in ext)
    # kube-scheduler's own binding (its Bind extension point, plain rounds) over the same backlogs.
    own = quantiles([r.scheduler for r in plain])
    # Binding latency the same way on both sides: from kube-scheduler's log (`binding_latencies`).
    ours_bound = [t for r in ext for t in r.bindings]
    plain_bound = [t for r in plain for t in r.bindings]
    bind_p99, plain_p99 = exact_quantile(ours_bound, 0.99), exact_quantile(plain_bound, 0.99)
    bind_p50, plain_p50 = exact_quantile(ours_bound, 0.5), exact_quantile(plain_bound, 0.5)
    served, plain_served = quantiles([r.durations for r in ext]), quantiles([r.durations for r in plain])
    return {
        "plain_pods_per_s": round(plain_rate, 1),
        "extender_pods_per_s": round(rate, 1),
        "ratio": round(rate / plain_rate, 3),
        "bind_p50_ms": _ms(None if bind_p50 is None else bind_p50 * 1000),
        "bind_p99_ms": _ms(None if bind_p99 is None else bind_p99 * 1000),
        "plain_bind_p50_ms": _ms(None if plain_p50 is None else plain_p50 * 1000),
        "plain_bind_p99_ms": _ms(None if plain_p99 is None else plain_p99 * 1000),
        "bind_p99_over_plain_ms": _ms((bind_p99 - plain_p99) * 1000) if bind_p99 is not None and plain_p99 is not None else None,
        "binds_timed": len(ours_bound),
        "plain_binds_timed": len(plain_bound),
        # The same writes as the apiserver times them (`TIMED`): how much of a bind is the apiserver's.
        "apiserver_binding_p99_ms": _ms(served.get("POST/pods/binding p99")),
        "plain_apiserver_binding_p99_ms": _ms(plain_served.get("POST/pods/binding p99")),
        "apiserver_lease_put_p99_ms": _ms(served.get("PUT/leases p99")),
        # The extender's own /bind histogram (its side of the call) and kube-scheduler's Bind
        # extension point (the DefaultBinder's POST, plain rounds only): a quantile past a
        # histogram's top bucket is only "at least" that bound, so it is stored as such, not as a time.
        **_histogram_p99("extender_bind", [r.extender for r in ext], "bind", latency.get("bind p99")),
        **_histogram_p99("plain_bind_plugin", [r.scheduler for r in plain], "schedulerbind", own.get("schedulerbind p99")),
        "writes_per_pod": round(extender_only(BIND_WRITES), 2),
        "node_writes_per_pod": round(extender_only(NODE_WRITES), 2),
        "lease_writes_per_pod": round(extender_only(LEASE_WRITES), 2),
        "ledger_lease_writes_per_pod": round(sum(r.ledger_writes for r in ext) / total, 2),  # exact, successful only
        "reads_per_pod": round(extender_only(BIND_READS), 2),
        "node_reads_per_pod": round(extender_only((("GET", "nodes", ""),)), 2),
        "lease_reads_per_pod": round(extender_only((("GET", "leases", ""),)), 2),
        "extender_cpu_ms_per_pod": round(sum(r.cpu.get("extender", 0.0) for r in ext) * 1000 / total, 2),
        "apiserver_cpu_ms_per_pod": round(sum(r.cpu.get("kube-apiserver", 0.0) for r in ext) * 1000 / total, 2),
        "filter_p50_ms": round(latency.get("filter p50", 0.0), 2),
        "filter_p99_ms": round(latency.get("filter p99", 0.0), 2),
        "filter_p99_coarse_ms": round(latency.get("filter p99 coarse", 0.0), 2),  # from the bounds older versions have too
        **({"filter_over_20ms": round(latency["filter over 20ms"], 4)} if "filter over 20ms" in latency else {}),
        "prioritize_p99_ms": round(latency.get("prioritize p99", 0.0), 2),
        "conflicts": latency["conflicts"],
        **_apiserver_cpu(plain, ext, pods_per_round=pods_per_round, idle=idle or {}),
    }


def _histogram_p99(name: str, scraped: list[dict[str, float]], verb: str, estimate: float | None) -> dict[str, float | None]:
    """`{name}_p99_ms` from a histogram's estimate, or null with `{name}_p99_ms_at_least` (its top
    finite bound) where the p99 lies above that bound."""
    if _above_top_bucket(scraped, verb, 0.99):
        return {f"{name}_p99_ms": None, f"{name}_p99_ms_at_least": _top_bound(scraped, verb) * 1000}
    return {f"{name}_p99_ms": _ms(estimate)}


def _top_bound(scraped: list[dict[str, float]], verb: str) -> float:
    """The highest finite bucket bound of `verb`'s histogram, in seconds."""
    bounds = {float(key.partition(" ")[2]) for one in scraped for key in one if key.partition(" ")[0] == verb}
    return max((bound for bound in bounds if bound != float("inf")), default=float("nan"))


def _above_top_bucket(scraped: list[dict[str, float]], verb: str, q: float) -> bool:
    """Whether quantile `q` of `verb`'s summed histogram lies above its highest finite bound."""
    summed: dict[float, float] = {}
    for one in scraped:
        for key, value in one.items():
            name, _, le = key.partition(" ")
            if name == verb:
                summed[float(le)] = summed.get(float(le), 0.0) + value
    finite = [bound for bound in summed if bound != float("inf")]
    total = summed.get(float("inf"), 0.0)
    return bool(finite) and total > 0 and summed[max(finite)] < q * total


def _ms(value: float | None) -> float | None:
    """A latency in ms, rounded; None where there was nothing to estimate it from (NaN)."""
    return None if value is None or value != value else round(value, 1)


def _apiserver_cpu(plain: list[Round], ext: list[Round], *, pods_per_round: int, idle: dict[str, float]) -> dict[str, float]:
    """kube-apiserver CPU per pod, plain against `ext`: whole rounds, above the idle background,
    and inside the profiles' windows (when taken)."""
    background = idle.get("kube-apiserver", 0.0)

    def per_pod(values: list[Round], *, above_idle: bool) -> float:
        used = sum(r.cpu.get("kube-apiserver", 0.0) - (background * r.seconds if above_idle else 0.0) for r in values)
        return round(used * 1000 / (pods_per_round * len(values)), 2)

    found = {
        "plain_apiserver_cpu_ms_per_pod": per_pod(plain, above_idle=False),
        "apiserver_cpu_ms_per_pod_above_idle": per_pod(ext, above_idle=True),
        "plain_apiserver_cpu_ms_per_pod_above_idle": per_pod(plain, above_idle=True),
        "apiserver_idle_cores": background,
    }
    profiled = [r.profile_ms_per_pod for r in ext if r.profile_ms_per_pod is not None]
    plain_profiled = [r.profile_ms_per_pod for r in plain if r.profile_ms_per_pod is not None]
    if profiled:
        found["apiserver_profile_ms_per_pod"] = round(statistics.median(profiled), 2)
    if plain_profiled:
        found["plain_apiserver_profile_ms_per_pod"] = round(statistics.median(plain_profiled), 2)
    return found


def print_profiles(
    rounds: dict[str, list[Round]], directory: Path, *, component: str, table: tuple[tuple[str, str], ...]
) -> None:
    """CPU ms per bound pod in each round's profile window, by where it went (cumulative: rows overlap).
    The binds inside a window are those the apiserver profile counted; both profiles share it."""
    columns = []
    for kind, values in rounds.items():
        for index, one in enumerate(values):
            path = directory / f"{component}-{kind}-{index}.pprof"
            apiserver_total = apiserver_probe.profile_cpu_seconds(directory / f"apiserver-{kind}-{index}.pprof")
            if not path.exists() or not one.profile_ms_per_pod or not apiserver_total:
                continue
            binds = apiserver_total * 1000 / one.profile_ms_per_pod
            columns.append((f"{kind} {index}", path, binds))
    if not columns or not apiserver_probe.go_binary():
        return
    print(f"\n| {component} CPU ms per bound pod (profile window, cumulative) | " + " | ".join(c[0] for c in columns) + " |")
    print("|---|" + "---:|" * len(columns))
    totals = [apiserver_probe.profile_cpu_seconds(path) or 0.0 for _, path, _ in columns]
    print(
        "| all | "
        + " | ".join(f"{total * 1000 / binds:.2f}" for total, (_, _, binds) in zip(totals, columns, strict=True))
        + " |"
    )
    spent = [apiserver_probe.buckets(path, table) for _, path, _ in columns]
    for label, _ in table:
        print(
            f"| {label} | "
            + " | ".join(f"{one[label] * 1000 / binds:.2f}" for one, (_, _, binds) in zip(spent, columns, strict=True))
            + " |"
        )


def export(ref: str) -> Path:
    """The Python packages of commit `ref`, exported to a temporary directory (nothing in this
    checkout changes); the extender runs from there with it first on PYTHONPATH."""
    directory = Path(tempfile.mkdtemp(prefix="extender-bench-src-"))
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "webhook", "policies", "certs"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(directory)], input=archive, check=True)
    return directory


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=1000, help="pods per round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per scheduler (alternating)")
    parser.add_argument(
        "--against",
        metavar="REF",
        default=None,
        help="also run the extender of this commit (rounds 'before'), interleaved with the others",
    )
    parser.add_argument(
        "--extender-ref",
        metavar="REF",
        default=None,
        help="the rounds 'extender' (and 'watching') run the extender of this commit instead of the working "
        "tree (a figure of a commit, whatever is being edited meanwhile)",
    )
    parser.add_argument("--dir", type=Path, default=None, help="cluster directory (default: a temporary one)")
    parser.add_argument("--extender-log-level", default="info", choices=("debug", "info", "warning"))
    parser.add_argument("--keep", action="store_true", help="leave the cluster directory (logs) in place")
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="SECONDS",
        help="take a kube-apiserver CPU profile of SECONDS in each round (from the tenth bound pod on); "
        "figures per pod inside its window, files under the cluster directory's profiles/",
    )
    parser.add_argument(
        "--idle",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="measure the apiserver's idle CPU (KWOK heartbeats, controllers) for SECONDS before the rounds (0: not)",
    )
    parser.add_argument(
        "--budgets",
        action="store_true",
        help="also rounds 'budgets': this tree's extender with a GPU budget on every namespace the pods land in, "
        "too large to refuse (what keeping budgets costs); the record's 'budgets' has ratio_to_extender",
    )
    parser.add_argument(
        "--watching",
        action="store_true",
        help="also rounds 'watching': the plain scheduler while this tree's extender runs unconsulted "
        "(its watches and background work only)",
    )
    args = parser.parse_args()
    directory = args.dir or Path(tempfile.mkdtemp(prefix="extender-bench-"))
    older = export(args.against) if args.against else None
    current = export(args.extender_ref) if args.extender_ref else None
    bin_dir = binaries.ensure()
    print(f"control plane with {args.nodes} KWOK nodes in {directory} ...", flush=True)
    started = time.monotonic()
    every = fake_nodes(args.nodes)
    # One `kubectl apply` of thousands of Nodes outlasts kubectl's timeout: the first 500 come up
    # with the control plane, the rest in batches after it.
    state = controlplane.up(directory, bin_dir=bin_dir, fake_nodes=every[:500], timeout=600)
    try:
        for start in range(500, len(every), 500):
            items = [n.manifest() for n in every[start : start + 500]]
            controlplane.kubectl(
                state, "create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
            )
        if len(every) > 500:
            controlplane.wait_for(
                lambda: ready_nodes(state) >= len(every),
                what=f"{len(every)} fake nodes Ready",
                timeout=900,
                state=state,
                component="kwok",
            )
        print(f"  up in {time.monotonic() - started:.0f} s; nproc {os.cpu_count()}; load {os.getloadavg()[0]:.1f}", flush=True)
        controlplane.stop(state, ["kube-scheduler"])  # the stock one would race for nothing; ours start per round
        # The extender's ledger Leases live in its namespace (deploy/ makes it; here, we do).
        controlplane.kubectl(state, "create", "namespace", reservations.LEDGER_NAMESPACE, check=False)
        api = kube.KubeApi(kube.load_client(str(state.kubeconfig)))
        idle = (
            apiserver_probe.idle_cores(state, ["kube-apiserver", "etcd", "kwok", "kube-controller-manager"], seconds=args.idle)
            if args.idle
            else {}
        )
        if idle:
            print(f"  idle CPU cores over {args.idle:.0f} s: {json.dumps(idle)}", flush=True)
        profile_dir = directory / "profiles"
        profile_dir.mkdir(exist_ok=True)
        kinds: dict[str, Path | None | bool] = {
            "plain": False,
            **({"watching": current} if args.watching else {}),
            **({"before": older} if older else {}),
            "extender": current,
            **({"budgets": current} if args.budgets else {}),
        }
        configs: dict[str, Path] = {}
        if args.budgets:
            configs["budgets"] = directory / "budgets.yaml"
            configs["budgets"].write_text(json.dumps(budget_settings(args.nodes)))  # JSON is YAML
        rounds: dict[str, list[Round]] = {kind: [] for kind in kinds}
        for index in range(args.rounds):
            for kind, source in kinds.items():
                rounds[kind].append(
                    one_round(
                        state,
                        api,
                        kind=kind,
                        index=index,
                        count=args.pods,
                        source=source,
                        log_level=args.extender_log_level,
                        consulted=kind != "watching",
                        profile_seconds=args.profile,
                        profile_dir=profile_dir,
                        config=configs.get(kind),
                    )
                )
        if args.idle:
            time.sleep(min(args.idle, 10.0))  # KWOK's catching up with the last round's pods
            later = apiserver_probe.idle_cores(
                state, ["kube-apiserver", "etcd", "kwok", "kube-controller-manager"], seconds=args.idle
            )
            print(f"  idle CPU cores after the rounds, over {args.idle:.0f} s: {json.dumps(later)}", flush=True)
            idle = {name: round((idle.get(name, 0.0) + value) / 2, 3) for name, value in later.items()}
        figures = {kind: headline(rounds, kind, pods_per_round=args.pods, idle=idle) for kind in kinds if kind != "plain"}
        print(f"\n{args.nodes} nodes, {args.pods} pods per round, {args.rounds} rounds each, load {os.getloadavg()[0]:.1f}")
        print("| scheduler | pods/s per round | median pods/s |")
        print("|---|---|---:|")
        for kind, values in rounds.items():
            print(f"| {kind} | {', '.join(f'{r.rate:.0f}' for r in values)} | {statistics.median(r.rate for r in values):.0f} |")
        for kind, found in figures.items():
            print(f"\n{kind}: {json.dumps(found)}")
        line: dict[str, Any] = {
            "nodes": args.nodes,
            "pods": args.pods,
            "rounds": args.rounds,
            **({"ref": args.extender_ref} if current else {}),
            **figures["extender"],
        }
        if "before" in figures:
            line["before"] = {"ref": args.against, **figures["before"]}
        if "budgets" in figures:
            line["budgets"] = budget_figures(figures)
            print(
                f"\nwith budgets: {line['budgets']['extender_pods_per_s']} pods/s, without: "
                f"{line['budgets']['extender_pods_per_s_without_budgets']} pods/s, ratio {line['budgets']['ratio_to_extender']}",
                flush=True,
            )
        if "watching" in figures:
            line["watching"] = {
                k: figures["watching"][k]
                for k in (
                    "ratio",
                    "extender_cpu_ms_per_pod",
                    "apiserver_cpu_ms_per_pod",
                    "apiserver_cpu_ms_per_pod_above_idle",
                    "apiserver_profile_ms_per_pod",
                )
                if k in figures["watching"]
            }
        if args.profile:
            print(f"apiserver profiles: {profile_dir} (go tool pprof -top FILE)", flush=True)
            for component, table in (("apiserver", apiserver_probe.BUCKETS), ("scheduler", apiserver_probe.SCHEDULER_BUCKETS)):
                print_profiles(rounds, profile_dir, component=component, table=table)
        print(json.dumps(line), flush=True)  # the last line: the headline figures
        # 5,000 nodes and more is a record of its own: the table and the plots compare like with like.
        records.write(
            bench="extender_throughput_5000" if args.nodes >= 5000 else "extender_throughput",
            inputs=vars(args),
            figures=line,
            reference={
                "name": "plain kube-scheduler (no extender), same run",
                "figures": {
                    "extender_pods_per_s": line["plain_pods_per_s"],
                    "bind_p50_ms": line["plain_bind_p50_ms"],
                    "bind_p99_ms": line["plain_bind_p99_ms"],
                },
            },
            headline=records.Headline(
                figure="extender_pods_per_s",
                label=f"pods scheduled per second with the extender, {args.nodes:,} nodes",
                unit="pods/s",
                better="higher",
            ),
            ratio=line.get("ratio") if isinstance(line.get("ratio"), (int, float)) else None,
        )
    finally:
        with contextlib.suppress(Exception):
            controlplane.down(directory)
        for exported in (older, current):
            if exported is not None:
                shutil.rmtree(exported, ignore_errors=True)
        if args.keep:
            print(f"logs: {directory / 'logs'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
