"""explain and simulate at scale, from a synthetic snapshot (no cluster needed).

Builds a snapshot of `--nodes` GPU nodes (a mix as in the local cluster: cgpu binpack and spread,
share, core_mem and topology nodes, 4 cards of 15 GiB or 8 whole cards) filled to about half with
bound pods, writes it to a temporary file, then times, `--repeat` times each (median shown):

- explain: `gpu-admission explain pod` of one pending 10 GiB pod through the CLI entry point on
  the snapshot file (read + admission + every node judged + table), the way a user runs it;
- explain (analysis only): the report for the same pod on already-read objects;
- simulate: `gpu-admission simulate` of `--pods` pending pods (mixed: 2-14 GiB, some with cores,
  some whole-card) on the snapshot, through the CLI entry point (read + admission of every pod +
  placement in order + the per-card table).

    .venv/bin/python bench/explain_scale.py --nodes 500 --pods 1000
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import pathlib
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import records  # noqa: E402 - bench/ is on sys.path (scripts run as bench/<name>.py); one record per run
import yaml

from policies import gpu
from policies.gpu import allocation as allocation_  # `allocation` names a pod's allocation here
from policies.gpu import inventory
from webhook import cli
from webhook.explain import cli as explain_cli
from webhook.explain import snapshot

NOW = 1_800_000_000.0
CARD_MIB = 15360


def node(name: str, *, mode: str, placement: str = "binpack") -> dict[str, Any]:
    count = 8 if mode == "topology" else (2 if mode == "core_mem" else 4)
    listed = [inventory.Card(index=i, memory_mib=CARD_MIB, uuid=f"GPU-{name}-{i}", name="Tesla-T4") for i in range(count)]
    labels = {"ack.node.gpu.schedule": mode, "aliyun.accelerator/nvidia_name": "Tesla-T4", "kubernetes.io/hostname": name}
    if mode != "topology":
        labels["ack.node.gpu.placement"] = placement
    capacity = (
        {"aliyun.com/gpu": str(count)}
        if mode == "topology"
        else {"aliyun.com/gpu-mem": str(15 * count), "aliyun.com/gpu-count": str(count)}
    )
    if mode == "core_mem":
        capacity["aliyun.com/gpu-core.percentage"] = str(100 * count)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "labels": labels,
            "annotations": {gpu.INVENTORY_ANNOTATION: inventory.encode_inventory(listed)},
        },
        "spec": {},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def gpu_pod(name: str, *, mem: int = 0, core: int = 0, whole: int = 0, namespace: str = "team-a") -> dict[str, Any]:
    limits: dict[str, str] = {}
    if mem:
        limits["aliyun.com/gpu-mem"] = str(mem)
    if core:
        limits["aliyun.com/gpu-core.percentage"] = str(core)
    if whole:
        limits["aliyun.com/gpu"] = str(whole)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}"},
        "spec": {"containers": [{"name": "main", "image": "registry.example/app:1", "resources": {"limits": limits}}]},
        "status": {"phase": "Pending"},
    }


def synthetic(nodes: int, *, seed: int = 7) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`nodes` GPU nodes, about half full of bound pods."""
    rng = random.Random(seed)
    kinds = (
        [("cgpu", "binpack")] * 5
        + [("cgpu", "spread")] * 2
        + [("share", "binpack")]
        + [("core_mem", "binpack")]
        + [("topology", "")]
    )
    made = [
        node(f"gpu-{i:04d}", mode=kinds[i % len(kinds)][0], placement=kinds[i % len(kinds)][1] or "binpack") for i in range(nodes)
    ]
    pods: list[dict[str, Any]] = []
    for item in made:
        name = item["metadata"]["name"]
        mode = item["metadata"]["labels"]["ack.node.gpu.schedule"]
        count = len(inventory.decode_inventory(item["metadata"]["annotations"][gpu.INVENTORY_ANNOTATION]))
        for index in range(count):
            if mode == "topology":
                if rng.random() < 0.5:
                    pods.append(_placed(f"{name}-w{index}", node_name=name, card=index, whole=True))
                continue
            used = 0
            while used < 8:
                size = rng.randint(1, 6)
                pods.append(
                    _placed(f"{name}-c{index}-{used}", node_name=name, card=index, mem=size, core=20 if mode == "core_mem" else 0)
                )
                used += size
    return made, pods


def _placed(name: str, *, node_name: str, card: int, mem: int = 0, core: int = 0, whole: bool = False) -> dict[str, Any]:
    obj = gpu_pod(name, mem=mem, core=core, whole=1 if whole else 0, namespace="bench")
    allocation = allocation_.Allocation(
        uid=obj["metadata"]["uid"],
        namespace="bench",
        name=name,
        node=node_name,
        cards=(card,),
        memory_gib=mem,
        core_percent=core,
        whole=whole,
        assumed_at=NOW - 600,
    )
    obj["metadata"]["annotations"] = allocation_.bind_annotations(allocation, card_memory_gib=15)
    obj["spec"]["nodeName"] = node_name
    obj["status"]["phase"] = "Running"
    return obj


def batch(count: int, *, seed: int = 11) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    made = []
    for i in range(count):
        roll = rng.random()
        if roll < 0.1:
            made.append(gpu_pod(f"sim-{i}", whole=rng.choice((1, 2, 4))))
        elif roll < 0.25:
            made.append(gpu_pod(f"sim-{i}", mem=rng.randint(2, 8), core=rng.choice((10, 20, 30))))
        else:
            made.append(gpu_pod(f"sim-{i}", mem=rng.randint(2, 14)))
    return made


def timed(function: Callable[[], object], *, repeat: int) -> tuple[float, float]:
    """Median wall seconds and median CPU seconds of this process (CPU: what a shared machine's load
    does not inflate)."""
    walls, cpus = [], []
    for _ in range(repeat):
        started, cpu = time.perf_counter(), time.process_time()
        function()
        walls.append(time.perf_counter() - started)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def quiet(argv: list[str]) -> Callable[[], object]:
    def run() -> object:
        with contextlib.redirect_stdout(io.StringIO()):
            return cli.main(argv)

    return run


def machine() -> str:
    model = ""
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} CPUs ({model or platform.processor() or 'unknown CPU'}), Python {platform.python_version()}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    nodes, placed = synthetic(args.nodes)
    pending = gpu_pod("want-10", mem=10)
    with tempfile.TemporaryDirectory() as directory:
        snap = pathlib.Path(directory) / "snapshot.json"
        snap.write_text(snapshot.dumps(snapshot.take(nodes, [*placed, pending], now=NOW), as_json=True))
        manifests = pathlib.Path(directory) / "batch.yaml"
        manifests.write_text(yaml.safe_dump_all(batch(args.pods)))
        explain_cli_s = timed(quiet(["explain", "pod", "want-10", "-n", "team-a", "--snapshot", str(snap)]), repeat=args.repeat)
        analysis_s = timed(
            lambda: explain_cli.explain_pod(pending, nodes=nodes, pods=[*placed, pending], now=NOW), repeat=args.repeat
        )
        simulate_s = timed(quiet(["simulate", "-f", str(manifests), "--snapshot", str(snap)]), repeat=args.repeat)
        result = explain_cli.simulate_batch(batch(args.pods), nodes=nodes, pods=placed, now=NOW)
    assert result is not None
    landed = sum(1 for landing in result.landings if landing.placed)
    print(f"machine: {machine()}")
    print(f"snapshot: {args.nodes} GPU nodes, {len(placed)} bound GPU pods")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}; medians of {args.repeat}, wall s / CPU s")
    print(f"explain pod (CLI, snapshot file):        {explain_cli_s[0]:.2f} / {explain_cli_s[1]:.2f}")
    print(f"explain pod (analysis on read objects):  {analysis_s[0]:.2f} / {analysis_s[1]:.2f}")
    print(
        f"simulate {args.pods} pods (CLI, snapshot file):  {simulate_s[0]:.2f} / {simulate_s[1]:.2f} ({landed} land, {args.pods - landed} do not fit)"
    )
    records.write(
        bench="explain_scale",
        inputs=vars(args),
        figures={
            "explain_cli_wall_s": explain_cli_s[0],
            "explain_cli_cpu_s": explain_cli_s[1],
            "explain_analysis_cpu_s": analysis_s[1],
            "simulate_wall_s": simulate_s[0],
            "simulate_cpu_s": simulate_s[1],
            "landed": landed,
        },
        headline=records.Headline(figure="explain_cli_cpu_s", label="explain pod on a snapshot", unit="CPU s", better="lower"),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
