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
extender's own `/metrics` (exact quantiles over its last 4096 calls per verb).

    .venv/bin/python bench/extender_throughput.py --nodes 500 --pods 1000 --rounds 2
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import re
import statistics
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

from policies import gpu, inventory  # noqa: E402 - after the path fix above
from webhook.cluster import binaries, controlplane, install, nodes  # noqa: E402
from webhook.extender import kube  # noqa: E402

CONFIG = ROOT / "deploy" / "scheduler-config-second.yaml"
T4 = 15360


def fake_nodes(count: int) -> list[nodes.FakeNode]:
    listed = inventory.encode_inventory(inventory.Card(index=i, memory_mib=T4, uuid=f"GPU-bench-{i}", name="Tesla-T4") for i in range(4))
    return [
        nodes.FakeNode(
            name=f"bench-{i:04d}",
            labels={"ack.node.gpu.schedule": "cgpu", "ack.node.gpu.placement": "binpack"},
            capacity={"aliyun.com/gpu-mem": "60", "aliyun.com/gpu-count": "4"},
            annotations={gpu.INVENTORY_ANNOTATION: listed},
        )
        for i in range(count)
    ]


def pods(count: int, *, scheduler: str, prefix: str) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{prefix}-{i:05d}", "namespace": "default", "labels": {"bench": prefix}},
            "spec": {
                "schedulerName": scheduler,
                "containers": [{"name": "main", "image": "registry.example/infer:1", "resources": {"limits": {"aliyun.com/gpu-mem": "1"}}}],
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


def start_scheduler(state: controlplane.State, *, name: str, config: Path) -> None:
    kubeconfig = str(state.kubeconfig)
    controlplane.start(
        state, name,
        command=[
            str(state.bin_dir / "kube-scheduler"), f"--config={config}",
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={controlplane.free_port()}",
        ],
    )


def start_extender(state: controlplane.State, *, log_level: str) -> int:
    port = controlplane.free_port()
    command = [sys.executable, "-m", "webhook.extender.cli", "extender", "--port", str(port), "--host", "127.0.0.1",
               "--kubeconfig", str(state.kubeconfig), "--log-level", log_level]
    controlplane.start(state, "extender", command=command)

    def healthy() -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
            return bool(answer.status == 200)

    controlplane.wait_for(healthy, what="the extender /healthz", timeout=120, state=state, component="extender")
    return port


def quantiles(port: int) -> dict[str, float]:
    """p50/p90/p99 per verb in ms, estimated from the latency histogram as PromQL's
    histogram_quantile does (linear within the bucket), and the bind conflicts."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    buckets: dict[str, list[tuple[float, float]]] = {}
    for match in re.finditer(r'gpu_admission_extender_request_duration_seconds_bucket\{le="(?P<le>[^"]+)",verb="(?P<verb>\w+)"\} (?P<n>\S+)', text):
        buckets.setdefault(match["verb"], []).append((float(match["le"]), float(match["n"])))
    found = {}
    for verb, series in buckets.items():
        series.sort()
        total = series[-1][1]
        for q in (0.5, 0.9, 0.99):
            found[f"{verb} p{round(q * 100)}"] = _bucket_quantile(q, series, total) * 1000
    conflicts = re.search(r"^gpu_admission_extender_bind_conflicts_total (\S+)$", text, re.MULTILINE)
    found["conflicts"] = float(conflicts.group(1)) if conflicts else 0.0
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


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its reaped children, from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def cpu_of(state: controlplane.State, names: list[str]) -> dict[str, float]:
    return {name: cpu_seconds(state.pids[name]) for name in names if name in state.pids}


def one_round(state: controlplane.State, api: kube.KubeApi, *, kind: str, index: int, count: int, extender_port: int | None) -> float:
    name = f"bench-{kind}-{index}"
    config = scheduler_config(state, name=name, extender_port=extender_port)
    batch = pods(count, scheduler=name, prefix=name)
    watch = BindWatch(api, label=name)
    for start in range(0, count, 250):
        controlplane.kubectl(state, "create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": batch[start:start + 250]}))
    watched = ["kube-apiserver", "etcd", "extender"]
    start_scheduler(state, name=name, config=config)
    before = cpu_of(state, [*watched, name])
    try:
        watch.wait(count, timeout=900)
        after = cpu_of(state, [*watched, name])
    finally:
        controlplane.stop(state, [name])
    times = sorted(watch.bound.values())
    rate = (len(times) - 1) / (times[-1] - times[0]) if times[-1] > times[0] else float("inf")
    used = ", ".join(f"{k} {after[k] - before.get(k, 0.0):.1f}" for k in after if k != "extender" or extender_port is not None)
    print(
        f"  {kind:<8} round {index}: {count} pods bound in {times[-1] - times[0]:.1f} s -> {rate:.0f} pods/s "
        f"(CPU s: {used.replace(name, 'kube-scheduler')}; load {os.getloadavg()[0]:.1f})",
        flush=True,
    )
    return rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=1000, help="pods per round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per scheduler (alternating)")
    parser.add_argument("--dir", type=Path, default=None, help="cluster directory (default: a temporary one)")
    parser.add_argument("--extender-log-level", default="info", choices=("debug", "info", "warning"))
    parser.add_argument("--keep", action="store_true", help="leave the cluster directory (logs) in place")
    args = parser.parse_args()
    directory = args.dir or Path(tempfile.mkdtemp(prefix="extender-bench-"))
    bin_dir = binaries.ensure()
    print(f"control plane with {args.nodes} KWOK nodes in {directory} ...", flush=True)
    started = time.monotonic()
    state = controlplane.up(directory, bin_dir=bin_dir, fake_nodes=fake_nodes(args.nodes), timeout=600)
    print(f"  up in {time.monotonic() - started:.0f} s; nproc {os.cpu_count()}; load {os.getloadavg()[0]:.1f}", flush=True)
    try:
        controlplane.stop(state, ["kube-scheduler"])  # the stock one would race for nothing; ours start per round
        api = kube.KubeApi(kube.load_client(str(state.kubeconfig)))
        port = start_extender(state, log_level=args.extender_log_level)
        rates: dict[str, list[float]] = {"plain": [], "extender": []}
        for index in range(args.rounds):
            rates["plain"].append(one_round(state, api, kind="plain", index=index, count=args.pods, extender_port=None))
            rates["extender"].append(one_round(state, api, kind="extender", index=index, count=args.pods, extender_port=port))
        latency = quantiles(port)
        print(f"\n{args.nodes} nodes, {args.pods} pods per round, {args.rounds} rounds each, load {os.getloadavg()[0]:.1f}")
        print("| scheduler | pods/s per round | median pods/s |")
        print("|---|---|---:|")
        for kind, values in rates.items():
            print(f"| {kind} | {', '.join(f'{v:.0f}' for v in values)} | {statistics.median(values):.0f} |")
        print("\n| extender verb | p50 ms | p90 ms | p99 ms |")
        print("|---|---:|---:|---:|")
        for verb in ("filter", "prioritize", "bind"):
            print(f"| {verb} | {latency.get(f'{verb} p50', 0):.2f} | {latency.get(f'{verb} p90', 0):.2f} | {latency.get(f'{verb} p99', 0):.2f} |")
        print(f"\nbind conflicts (CAS retries): {latency['conflicts']:.0f}")
    finally:
        with contextlib.suppress(Exception):
            controlplane.down(directory)
        if args.keep:
            print(f"logs: {directory / 'logs'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
