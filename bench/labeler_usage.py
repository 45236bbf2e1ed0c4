"""The cost of reading real use: the labeler's CPU and memory per interval, and the apiserver writes
the usage annotation adds across a fleet.

`interval` (one simulated node): 8 cards and 50 GPU processes, each a real `sleep` in a real cgroup
with a kubelet-shaped path (45 in pods' cgroups, 5 in `docker run`-shaped ones) where cgroups can
be created (root), else cgroup files under a scratch proc root; 110 pods listed on the node. Each
pass is what `Runner.step` does on a GPU node: read the inventory file (standing in for NVML), compute
the labels, diff them against the Node, map every process to its pod through /proc/<pid>/cgroup,
decide significance and render the annotation, against an in-memory Node. The processes' memory
moves a little every pass (±1 %) and every tenth pass one pod's process set changes, so some passes
write. CPU is `time.process_time` per pass; memory is tracemalloc's peak per pass and the process's
max RSS.

`churn` (a simulation of N nodes, not a cluster): each node has 8 cards of 81920 MiB; pods arrive
per card as a Poisson process (mean `--pod-every` seconds), live an exponential time (mean
`--pod-life`), hold a random 2-20 GiB that drifts by a random walk of `--drift` of the card per
minute; an out-of-band process appears on a node with probability `--oob-rate` per hour and lives
10 minutes. Each node's labeler passes every `--interval`, and the real `policies.gpu.usage.significant`
plus the at-most-once-per-interval limit decide each write. Reported: writes per minute for the
fleet, next to what writing on every pass and on every change would cost.

    .venv/bin/python bench/labeler_usage.py interval --passes 200
    .venv/bin/python bench/labeler_usage.py churn --nodes 500 --minutes 60
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import random
import resource
import statistics
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import records  # noqa: E402 - bench/ is on sys.path (scripts run as bench/<name>.py); one record per run

from policies.gpu import usage  # noqa: E402 - after the path set-up above
from tests import cgroup_processes  # noqa: E402
from webhook.labeler import attribution, cgroups, inventory, ownership, runner  # noqa: E402

NODE = "bench-gpu-0"
CARDS = 8


class MemoryNodes:
    """An in-memory Node with merge patches (what the runner writes), counting writes."""

    def __init__(self) -> None:
        self.obj: dict[str, Any] = {
            "metadata": {"name": NODE, "resourceVersion": "1", "labels": {"ack.node.gpu.schedule": "share"}, "annotations": {}},
            "status": {"capacity": {}, "allocatable": {}},
        }
        self.writes = 0

    def get(self, name: str) -> ownership.Node:
        return ownership.Node.from_object(self.obj)

    def patch(self, name: str, body: Mapping[str, Any]) -> None:
        self.writes += 1
        _merge(self.obj, body)

    def patch_status(self, name: str, body: Mapping[str, Any]) -> None:
        self.writes += 1
        _merge(self.obj, body)


def _merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping):
            _merge(target.setdefault(key, {}), value)
        else:
            target[key] = value


class ListedPods:
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods

    def pods_on(self, node_name: str) -> list[Mapping[str, Any]]:
        return list(self.pods)


@contextlib.contextmanager
def processes(count: int, pod_uids: list[str]) -> Iterator[tuple[list[int], Path, str]]:
    """`count` processes: real ones in real cgroups where possible, else fake cgroup files. Yields
    (pids, proc root, what was used)."""
    found = cgroup_processes.hierarchies()
    tag = uuid.uuid4().hex[:8]
    paths = [
        cgroup_processes.systemd_pod_path(pod_uids[i % len(pod_uids)], uuid.uuid4().hex * 2, tag=tag)
        if i % 10
        else cgroup_processes.docker_run_path(uuid.uuid4().hex * 2, tag=tag)
        for i in range(count)
    ]
    if found:
        _, mount = found[0]
        with contextlib.ExitStack() as stack:
            pids = [stack.enter_context(cgroup_processes.process_in(mount, path)) for path in paths]
            yield pids, Path("/proc"), f"real processes in real cgroups ({mount})"
        return
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        pids = list(range(100000, 100000 + count))
        for pid, path in zip(pids, paths, strict=True):
            (root / str(pid)).mkdir()
            (root / str(pid) / "cgroup").write_text(f"0::/{path}\n")
        yield pids, root, "cgroup files under a scratch proc root (no root here)"


def interval(args: argparse.Namespace) -> int:
    rng = random.Random(7)
    pod_uids = [str(uuid.uuid4()) for _ in range(110)]
    pods = [{"metadata": {"uid": uid, "namespace": f"team-{i % 7}", "name": f"job-{i}"}} for i, uid in enumerate(pod_uids)]
    with processes(args.processes, pod_uids[:40]) as (pids, proc_root, how), tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "inventory.yaml"
        memory = {pid: rng.randint(500, 8000) for pid in pids}

        def write(pass_number: int) -> None:
            for pid in memory:
                memory[pid] = max(1, int(memory[pid] * rng.uniform(0.99, 1.01)))
            cards: list[dict[str, Any]] = []
            for index in range(CARDS):
                mine = [pid for n, pid in enumerate(pids) if n % CARDS == index]
                if index == pass_number % CARDS and pass_number % 10 == 0:
                    mine = mine[1:]  # a pod's process ends on one card every tenth pass
                listed = [{"pid": pid, "usedMiB": memory[pid]} for pid in mine]
                cards.append(
                    {
                        "index": index,
                        "uuid": f"GPU-{index}",
                        "name": "NVIDIA H100 80GB HBM3",
                        "memoryMiB": 81559,
                        "usedMiB": sum(p["usedMiB"] for p in listed),
                        "processes": listed,
                    }
                )
            scratch_file = path.with_suffix(".tmp")
            scratch_file.write_text(json.dumps({"gpus": cards}))
            scratch_file.replace(path)

        write(1)
        nodes = MemoryNodes()
        loop = runner.Runner(
            source=lambda: inventory.load(path),
            nodes=nodes,
            pods=ListedPods(pods),
            options=runner.Options(node_name=NODE, usage_interval_s=0.0, proc_root=proc_root),
        )
        loop.step()  # the first pass writes everything: not what a steady interval costs
        cpu: list[float] = []
        usage_cpu: list[float] = []
        peaks: list[int] = []
        writes_before = loop.usage_writes
        for number in range(args.passes):  # CPU, without tracemalloc's overhead
            write(number + 2)
            started = time.process_time()
            loop.step()
            cpu.append(time.process_time() - started)
            inv = inventory.load(path)
            started = time.process_time()
            summary = attribution.summarise(
                inv,
                pods=[attribution.PodRef.from_object(p) for p in pods],
                identify=lambda pid: cgroups.read(pid, proc_root=proc_root),
                now=time.time(),
            )
            usage.significant(usage.parse(nodes.obj["metadata"]["annotations"].get(usage.USAGE_ANNOTATION)), summary)
            usage.render(summary)
            usage_cpu.append(time.process_time() - started)
        tracemalloc.start()
        for number in range(min(args.passes, 50)):  # memory
            write(number + 2)
            tracemalloc.reset_peak()
            loop.step()
            peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        annotation = nodes.obj["metadata"]["annotations"][usage.USAGE_ANNOTATION]
    cpu_ms = sorted(c * 1000 for c in cpu)
    print(f"labeler pass on a node with {CARDS} cards, {args.processes} GPU processes, {len(pods)} pods listed ({how})")
    print(
        f"  passes: {args.passes}; usage annotation writes: {loop.usage_writes - writes_before}; annotation size {len(annotation)} bytes"
    )
    print(
        f"  CPU per pass: median {statistics.median(cpu_ms):.2f} ms, p95 {cpu_ms[int(len(cpu_ms) * 0.95) - 1]:.2f} ms, max {cpu_ms[-1]:.2f} ms"
    )
    print(
        f"  of which reading real use (cgroups of {args.processes} processes, attribution, significance, codec): median {statistics.median(usage_cpu) * 1000:.2f} ms"
    )
    print(f"  at --interval 60s: {statistics.mean(cpu) / 60 * 100:.4f} % of one core")
    print(
        f"  Python heap peak per pass (tracemalloc): median {statistics.median(peaks) / 1024:.0f} KiB, max {max(peaks) / 1024:.0f} KiB"
    )
    print(f"  process max RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MiB")
    records.write(
        bench="labeler_usage",
        inputs=vars(args),
        figures={
            "cpu_ms_per_pass_median": round(statistics.median(cpu_ms), 2),
            "real_use_ms_median": round(statistics.median(usage_cpu) * 1000, 2),
            "annotation_bytes": len(annotation),
            "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        },
        headline=records.Headline(figure="cpu_ms_per_pass_median", label="labeler CPU per pass", unit="ms", better="lower"),
    )
    return 0


# --- churn ----------------------------------------------------------------------------------------


class SimPod:
    def __init__(self, uid: str, card: int, mib: int, ends: float) -> None:
        self.uid, self.card, self.mib, self.ends = uid, card, mib, ends


@dataclasses.dataclass(frozen=True)
class Churn:
    """What the churn simulation counted: usage writes (rate-limited), changes, writes per tick."""

    limited: int
    every_change: int
    per_minute: list[int]

    def writes_per_min(self, minutes: float) -> float:
        return round(self.limited / minutes, 1)


def simulate(args: argparse.Namespace) -> Churn:
    """The usage summary's writes for ``args.nodes`` simulated nodes (the fields of the ``churn`` command)."""
    rng = random.Random(11)
    total = 81920
    step = args.interval
    pods: dict[int, list[SimPod]] = {n: [] for n in range(args.nodes)}
    oob: dict[int, tuple[int, int, float]] = {}  # node -> (pid, MiB, ends)
    written: dict[int, usage.NodeUsage | None] = {n: None for n in range(args.nodes)}
    # Labelers start at different times: each node's rate limit runs on its own phase.
    last_write: dict[int, float] = {n: -rng.uniform(0, args.usage_interval) for n in range(args.nodes)}
    previous: dict[int, usage.NodeUsage] = {}
    limited = every_change = 0
    per_minute: list[int] = []
    ticks = int(args.minutes * 60 / step)
    warmup = int(args.warmup * 60 / step)
    arrival = step / args.pod_every  # per card per tick
    for tick in range(ticks + warmup):
        now = tick * step
        count_this_tick = 0
        for node in range(args.nodes):
            for card in range(CARDS):
                if rng.random() < arrival:
                    pods[node].append(
                        SimPod(
                            str(uuid.UUID(int=rng.getrandbits(128))),
                            card,
                            rng.randint(2, 20) * 1024,
                            now + rng.expovariate(1 / args.pod_life),
                        )
                    )
            pods[node] = [p for p in pods[node] if p.ends > now]
            for p in pods[node]:
                p.mib = max(256, int(p.mib + rng.gauss(0, args.drift * total * step / 60)))
            if node in oob and oob[node][2] <= now:
                del oob[node]
            if node not in oob and rng.random() < args.oob_rate * step / 3600:
                oob[node] = (rng.randint(1000, 99999), rng.randint(1, 10) * 1024, now + 600)
            cards = tuple(
                usage.CardUse(
                    index=card,
                    total_mib=total,
                    used_mib=sum(p.mib for p in pods[node] if p.card == card)
                    + (oob[node][1] if node in oob and card == 0 else 0),
                    pods=tuple(
                        usage.PodUse(uid=p.uid, namespace="ns", name="p", used_mib=p.mib) for p in pods[node] if p.card == card
                    ),
                    out_of_band=(usage.OutOfBand(pid=oob[node][0], used_mib=oob[node][1]),) if node in oob and card == 0 else (),
                )
                for card in range(CARDS)
            )
            summary = usage.NodeUsage(cards=cards)
            if tick >= warmup and previous.get(node) != summary:
                every_change += 1
            previous[node] = summary
            if usage.significant(written[node], summary) and now - last_write[node] >= args.usage_interval:
                written[node] = summary
                last_write[node] = now
                if tick >= warmup:
                    limited += 1
                    count_this_tick += 1
        if tick >= warmup:
            per_minute.append(count_this_tick)
    return Churn(limited=limited, every_change=every_change, per_minute=per_minute)


def churn(args: argparse.Namespace) -> int:
    step = args.interval
    found = simulate(args)
    limited, every_change, per_minute = found.limited, found.every_change, found.per_minute
    minutes = args.minutes
    print(
        f"simulated {args.nodes} nodes x {CARDS} cards for {minutes} min (after {args.warmup} min warm-up), labeler every {step:g}s, "
        f"--usage-interval {args.usage_interval:g}s; pods every {args.pod_every:g}s per card, living {args.pod_life:g}s on average, "
        f"drift {args.drift * 100:g}%/min, out-of-band {args.oob_rate:g}/node/hour"
    )
    print(
        f"  usage annotation writes: {limited / minutes:.0f} per minute for the fleet ({limited / minutes / args.nodes:.3f} per node per minute)"
    )
    print(
        f"  writing on every change instead: {every_change / minutes:.0f} per minute; on every pass: {args.nodes * 60 / step:.0f} per minute"
    )
    buckets = [sum(per_minute[i : i + int(60 / step)]) for i in range(0, len(per_minute), max(1, int(60 / step)))]
    print(f"  busiest minute: {max(buckets)} writes; quietest: {min(buckets)}")
    records.write(
        bench="labeler_usage_churn",
        inputs=vars(args),
        figures={
            "writes_per_min": round(limited / minutes, 1),
            "every_change_per_min": round(every_change / minutes, 1),
            "busiest_minute": max(buckets),
            "quietest_minute": min(buckets),
        },
        reference={"name": "writing on every change", "figures": {"writes_per_min": round(every_change / minutes, 1)}},
        headline=records.Headline(
            figure="writes_per_min",
            label="usage annotation writes a minute for the fleet (simulated)",
            unit="writes/min",
            better="lower",
        ),
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="what", required=True)
    one = sub.add_parser("interval", help="CPU and memory of one labeler pass (8 cards, 50 processes)")
    one.add_argument("--passes", type=int, default=200)
    one.add_argument("--processes", type=int, default=50)
    one.set_defaults(func=interval)
    many = sub.add_parser("churn", help="apiserver writes of the usage annotation for a fleet under churn (simulated)")
    many.add_argument("--nodes", type=int, default=500)
    many.add_argument("--minutes", type=float, default=60)
    many.add_argument("--warmup", type=float, default=30)
    many.add_argument("--interval", type=float, default=60.0, help="labeler pass interval, seconds")
    many.add_argument("--usage-interval", type=float, default=60.0, help="least time between two writes, seconds")
    many.add_argument("--pod-every", type=float, default=1800.0, help="mean seconds between pod arrivals per card")
    many.add_argument("--pod-life", type=float, default=3600.0, help="mean pod lifetime, seconds")
    many.add_argument("--drift", type=float, default=0.01, help="memory random walk per process per minute, fraction of the card")
    many.add_argument("--oob-rate", type=float, default=0.1, help="out-of-band processes per node per hour")
    many.set_defaults(func=churn)
    args = parser.parse_args(argv)
    status: int = args.func(args)
    return status


if __name__ == "__main__":
    sys.exit(main())
