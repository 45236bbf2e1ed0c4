"""Audit throughput: objects audited per second with N pods on a local cluster (KWOK nodes) and offline.

Brings up its own local control plane (no webhook, no extender: pods are created straight through
the apiserver, bound to the fake nodes with `spec.nodeName`; the labelers label the nodes once and
are stopped), fills it with `--pods` pods spread
over `--namespaces` namespaces, waits until KWOK reports them all Running (so nothing churns while
measuring), then times, `--repeat` times each (median shown):

- reference: `kubectl get pods -A -o json` (what merely reading the pods costs, outside Python);
- list: the audit's paged listing alone (`kube.inventory`: pods, workloads, nodes);
- audit: list + judge (`sweep.audit_cluster`, what `gpu-admission audit` does before printing);
- write (first): creating the PolicyReports, write (unchanged): the second run's no-op plan;
- offline parse+judge: the same objects from one JSON file (`audit -f`), and judge alone.

Pod mix (per 100): 1 sets NVIDIA_VISIBLE_DEVICES=all (GPU001), 40 ask for aliyun.com/gpu-mem on a
cgpu/share node with an allocation annotation, 10 ask for nvidia.com/gpu on the exclusive node,
49 ask for nothing (with NVIDIA_VISIBLE_DEVICES=void, as GPU104 would leave them).

    .venv/bin/python bench/audit_throughput.py --pods 10000
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import io
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client

from policies import settings as settings_
from webhook.commands import dryrun
from webhook.audit import kube, scan, sweep
from webhook.cluster import binaries, controlplane, install, nodes

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_NODES = ("cgpu-binpack-0", "cgpu-binpack-1", "cgpu-spread-0", "share-binpack-0")
BATCH = 500


def pod(index: int, namespace: str) -> dict[str, Any]:
    """Pod number `index` of the mix described in the module docstring."""
    name = f"p-{index:05d}"
    container: dict[str, Any] = {"name": "main", "image": "registry.example/app:1"}
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": {"bench": "audit"}}
    spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 0}
    kind = index % 100
    if kind == 0:
        container["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
        spec["nodeName"] = "cpu-0"
    elif kind <= 40:
        node = SHARED_NODES[index % len(SHARED_NODES)]
        mode = "share" if node.startswith("share") else "cgpu"
        card = index % 4
        container["resources"] = {"limits": {"aliyun.com/gpu-mem": 1}}
        spec["nodeName"] = node
        spec["nodeSelector"] = {"ack.node.gpu.schedule": mode}
        metadata["annotations"] = {
            "gpu-admission.io/allocation": json.dumps(
                {"node": node, "cards": [card], "memGiB": 1, "corePercent": 0, "whole": False, "assumedAt": "2026-01-01T00:00:00.000Z"}
            ),
            "ALIYUN_COM_GPU_MEM_IDX": str(card),
            "ALIYUN_COM_GPU_MEM_POD": "1",
        }
    elif kind <= 50:
        container["resources"] = {"limits": {"nvidia.com/gpu": 1}}
        spec["nodeName"] = "exclusive-0"
    else:
        container["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
        spec["nodeName"] = ("cpu-0", "cgpu-binpack-0", "topology-0", "core-mem-0")[index % 4]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def create_pods(state: controlplane.State, *, count: int, namespaces: list[str], workers: int) -> float:
    """Create the pods in Lists of BATCH with a few kubectl processes in parallel; returns seconds."""
    batches: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    for index in range(count):
        # Contiguous blocks per namespace, so each namespace gets its share of every kind of pod.
        current.append(pod(index, namespaces[index * len(namespaces) // count]))
        if len(current) == BATCH:
            batches.append(current)
            current = []
    if current:
        batches.append(current)

    def send(items: list[dict[str, Any]]) -> None:
        body = json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
        completed = controlplane.kubectl(state, "create", "-f", "-", "-o", "name", stdin=body, check=False)
        if completed.returncode != 0:
            raise RuntimeError(completed.stderr[-500:])

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(send, batches))
    return time.perf_counter() - started


def wait_running(api: Any, *, count: int, timeout: float) -> float:
    """Poll until every benchmark pod is Running; returns seconds waited."""
    core = client.CoreV1Api(api)
    started = time.monotonic()
    while True:
        # Only the pods not Running yet are listed (remainingItemCount is not set for filtered lists).
        # With _preload_content=False the client returns the raw urllib3 response, not the V1PodList
        # its annotation names.
        response: Any = core.list_pod_for_all_namespaces(
            label_selector="bench=audit", field_selector="status.phase!=Running", _preload_content=False
        )
        waiting = len(json.loads(response.data)["items"])
        if waiting == 0:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"{waiting} of {count} pods still not Running after {timeout:.0f} s")
        time.sleep(1.0)


# CPU seconds of this process per step, by step label; filled by `timed`.
Cpu = dict[str, float]


def timed(function: Callable[[], Any], *, repeat: int, cpu: Cpu | None = None, label: str = "") -> tuple[float, Any]:
    """Median wall seconds over `repeat` calls, and the last call's result; the median CPU seconds
    of this process go to `cpu[label]` (on a shared machine wall time mostly measures the others)."""
    seconds: list[float] = []
    used: list[float] = []
    result: Any = None
    for _ in range(repeat):
        started, started_cpu = time.perf_counter(), time.process_time()
        result = function()
        seconds.append(time.perf_counter() - started)
        used.append(time.process_time() - started_cpu)
    if cpu is not None:
        cpu[label] = statistics.median(used)
    return statistics.median(seconds), result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--namespaces", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4, help="kubectl processes creating pods in parallel")
    parser.add_argument("--dir", type=pathlib.Path, help="cluster state directory (default: a temporary one, removed)")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running (needs --dir)")
    args = parser.parse_args()
    scratch = None
    directory = args.dir
    if directory is None:
        scratch = tempfile.TemporaryDirectory(prefix="gpu-admission-audit-bench-")
        directory = pathlib.Path(scratch.name)
    print(f"# bringing up a local cluster in {directory}", file=sys.stderr)
    fake_nodes = nodes.load(None)
    state = install.bring_up(directory, bin_dir=binaries.ensure(), fake_nodes=fake_nodes, with_install=False)
    try:
        # The labelers write card labels, inventories and capacity as in a real cluster; once they
        # have, they are stopped so that nothing but the audit runs while it is measured.
        install.start_labelers(state, fake_nodes)
        controlplane.stop(state, [name for name in state.pids if name.startswith("labeler-")])
        return _bench(state, args)
    finally:
        if not args.keep:
            controlplane.down(directory)
        if scratch is not None:
            scratch.cleanup()


def _bench(state: controlplane.State, args: argparse.Namespace) -> int:
    controlplane.kubectl(state, "apply", "-k", str(REPO / "deploy" / "crds"))
    namespaces = [f"bench-{i:02d}" for i in range(args.namespaces)]
    controlplane.kubectl(state, "create", "-f", "-", stdin=json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in namespaces]}
    ))
    for name in ("policyreports.wgpolicyk8s.io", "clusterpolicyreports.wgpolicyk8s.io"):
        controlplane.kubectl(state, "wait", "--for", "condition=established", f"crd/{name}", "--timeout=60s")
    print(f"# creating {args.pods} pods in {len(namespaces)} namespaces", file=sys.stderr)
    creating = create_pods(state, count=args.pods, namespaces=namespaces, workers=args.workers)
    api = kube.api_client(str(state.kubeconfig))
    waiting = wait_running(api, count=args.pods, timeout=1800)
    print(f"# created in {creating:.1f} s ({args.pods / creating:.0f} pods/s), all Running {waiting:.1f} s later", file=sys.stderr)

    settings = settings_.Settings()
    cpu: Cpu = {}
    load_before = os.getloadavg()[0]
    reference, _ = timed(lambda: controlplane.kubectl(state, "get", "pods", "-A", "-o", "json"), repeat=args.repeat)
    listing, inventory = timed(lambda: kube.inventory(api), repeat=args.repeat, cpu=cpu, label="list")
    auditing, audit = timed(
        lambda: sweep.audit_cluster(api, settings=settings, namespace=None, now=time.time()), repeat=args.repeat, cpu=cpu, label="audit"
    )
    first_write, (_, first) = timed(lambda: sweep.write_reports(api, audit, all_results=False, now=time.time()), repeat=1, cpu=cpu, label="first")
    unchanged_write, (_, second) = timed(
        lambda: sweep.write_reports(api, audit, all_results=False, now=time.time()), repeat=args.repeat, cpu=cpu, label="unchanged"
    )

    with tempfile.TemporaryDirectory() as scratch:
        snapshot = pathlib.Path(scratch) / "snapshot.json"
        objects = [*inventory.nodes, *inventory.workloads, *inventory.pods]
        snapshot.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
        size_mb = snapshot.stat().st_size / 1e6

        def offline() -> scan.Audit:
            documents = dryrun.read([str(snapshot)], stdin=io.StringIO())
            return scan.run(scan.Inventory.of(d.object for d in documents), settings=settings, now=time.time())

        offline_s, offline_audit = timed(offline, repeat=args.repeat, cpu=cpu, label="offline")
    judging, _ = timed(lambda: scan.run(inventory, settings=settings, now=time.time()), repeat=args.repeat, cpu=cpu, label="judge")

    objects_n = audit.objects
    failing = sum(1 for f in audit.findings if f.result.value != "pass")
    rows = [
        ("reference: kubectl get pods -A -o json", reference, None, len(inventory.pods)),
        ("list (paged, raw JSON)", listing, cpu["list"], len(inventory.pods) + len(inventory.workloads) + len(inventory.nodes)),
        ("audit: list + judge", auditing, cpu["audit"], objects_n),
        ("judge only (in memory)", judging, cpu["judge"], objects_n),
        (f"offline -f: parse {size_mb:.0f} MB JSON + judge", offline_s, cpu["offline"], offline_audit.objects),
        (f"write reports, first ({first.created} created)", first_write, cpu["first"], objects_n),
        (f"write reports, unchanged ({second.writes} writes)", unchanged_write, cpu["unchanged"], objects_n),
    ]
    load_after = os.getloadavg()[0]
    print(f"\n### {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {args.pods} pods in {len(namespaces)} namespaces, "
          f"{len(inventory.nodes)} KWOK nodes (load average {load_before:.1f} → {load_after:.1f})\n")
    print(f"Machine: nproc {os.cpu_count()}, Python {platform.python_version()}; median of {args.repeat}. "
          f"{objects_n} objects audited, {len(audit.findings)} results, {failing} not pass.\n")
    print("| step | wall s | objects/s (wall) | CPU s (this process) | objects/s (CPU) |")
    print("|---|---:|---:|---:|---:|")
    for label, seconds, used, count in rows:
        cpu_cells = f"{used:.2f} | {count / used:,.0f}" if used else "- | -"
        print(f"| {label} | {seconds:.2f} | {count / seconds:,.0f} | {cpu_cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
