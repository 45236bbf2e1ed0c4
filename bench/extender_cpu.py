"""The extender's own CPU per scheduled pod, in process: filter and prioritize as kube-scheduler sends them.

No control plane: a `Store` is filled with N synthetic GPU nodes (cgpu, binpack, 4 x 15 GiB, as
`bench/extender_throughput.py` makes them), and for each of P pods the driver does what the
scheduler and the watch would do to the extender:

1. the pod's ADDED watch event (`Store.apply`);
2. `POST /filter` with the Pod as the apiserver serves it (managedFields, status) and the node
   names the scheduler's own filters passed (nodeCacheCapable: names only; as many as
   kube-scheduler's adaptive `percentageOfNodesToScore` keeps, from a rotating start, or with
   `--percentage 100` every node, as the shipped `scheduler-config-second.yaml` and
   `extender_throughput.py` have it);
3. `POST /prioritize` with the nodes filter passed;
4. the bind's effect on the cache: the pod MODIFIED with `spec.nodeName` and the allocation
   annotations on the best-scored node (the card `placement.choose` picks).

Each request goes through the app's own middleware and handler with the body as bytes, so JSON
decoding, the verdicts, building the answer and encoding it are all counted; the HTTP parsing of
aiohttp is not (the same for any answer). The bind itself (apiserver calls) is not measured here;
its hold check is (`Binder._with_holds` on the bind's node state, in ns per bind: with no
preemption under way, what every bind pays).

    .venv/bin/python bench/extender_cpu.py --nodes 500 --pods 1000 [--against DIR] [--http] [--profile]

`--against DIR` runs this same driver on the source tree in DIR (`git archive REF | tar -x -C DIR`
of an older commit, with this file copied into DIR/bench) in a second process, interleaved round by
round with this tree, and prints both and their ratio; it also checks that both trees gave
byte-identical answers to every request. `--http` serves the app on a local port in the child
instead and sends the verbs over keep-alive HTTP, counting the child's whole CPU less what steering
the pod events costs. `--profile` prints cProfile's tables for this tree. The last line is one JSON
object of the headline figures (ms per pod from each tree's quietest round, filter CPU p50/p99).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import hashlib
import json
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import records  # noqa: E402 - bench/ is on sys.path (scripts run as bench/<name>.py); one record per run
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
NOW = 1_800_000_000.0
T4_GIB = 15


def feasible(total: int, percentage: int = 0) -> int:
    """How many feasible nodes kube-scheduler looks for before it stops filtering
    (numFeasibleNodesToFind): adaptive with `percentage` 0 (its default), else that share of the
    nodes (the shipped `scheduler-config-second.yaml` sets `percentageOfNodesToScore: 100`)."""
    if total < 100 or percentage >= 100:
        return total
    if not percentage:
        percentage = max(5, 50 - total // 125)
    return max(100, total * percentage // 100)


def make_nodes(count: int) -> list[dict[str, Any]]:
    from policies import gpu
    from policies.gpu import inventory

    listed = inventory.encode_inventory(
        inventory.Card(index=i, memory_mib=15360, uuid=f"GPU-bench-{i}", name="Tesla-T4") for i in range(4)
    )
    return [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": f"bench-{i:04d}",
                "uid": f"node-uid-{i}",
                "resourceVersion": str(100 + i),
                "labels": {
                    "ack.node.gpu.schedule": "cgpu",
                    "ack.node.gpu.placement": "binpack",
                    "kubernetes.io/hostname": f"bench-{i:04d}",
                },
                "annotations": {gpu.INVENTORY_ANNOTATION: listed, "node.alpha.kubernetes.io/ttl": "0"},
            },
            "spec": {},
            "status": {
                "capacity": {
                    "aliyun.com/gpu-mem": "60",
                    "aliyun.com/gpu-count": "4",
                    "cpu": "32",
                    "memory": "256Gi",
                    "pods": "110",
                },
                "allocatable": {
                    "aliyun.com/gpu-mem": "60",
                    "aliyun.com/gpu-count": "4",
                    "cpu": "32",
                    "memory": "256Gi",
                    "pods": "110",
                },
                "addresses": [{"type": "InternalIP", "address": f"10.0.{i // 250}.{i % 250}"}],
            },
        }
        for i in range(count)
    ]


def make_pod(index: int, *, memory: int, version: int) -> dict[str, Any]:
    """A pod as the apiserver serves it to the scheduler (what the scheduler then sends in `Pod`)."""
    name = f"bench-{index:05d}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"0000{index:08d}-aaaa-bbbb-cccc-dddddddddddd",
            "resourceVersion": str(version),
            "creationTimestamp": "2026-11-26T17:00:00Z",
            "labels": {"bench": "cpu"},
            "managedFields": [
                {
                    "manager": "python-requests",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-11-26T17:00:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {"f:labels": {".": {}, "f:bench": {}}},
                        "f:spec": {"f:containers": {'k:{"name":"main"}': {".": {}}}},
                    },
                }
            ],
        },
        "spec": {
            "schedulerName": "gpu-bench",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/infer:1",
                    "resources": {"limits": {"aliyun.com/gpu-mem": str(memory)}, "requests": {"aliyun.com/gpu-mem": str(memory)}},
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "securityContext": {},
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            ],
        },
        "status": {"phase": "Pending", "qosClass": "BestEffort"},
    }


class _Request:
    """What the app's middleware and verb handlers read of an aiohttp request."""

    def __init__(self, app: Any, path: str, body: bytes) -> None:
        self.app, self.path, self._body = app, path, body
        self.charset: str | None = None
        self.transport = None
        self.method = "POST"

    async def read(self) -> bytes:
        return self._body


class Driver:
    """One tree's app and store, stepped pod by pod."""

    def __init__(self, *, nodes: int, percentage: int = 0) -> None:
        from webhook.extender import app as app_module
        from webhook.extender import binder
        from webhook.extender import store as store_module

        self.app_module = app_module
        self.store = store_module.Store()
        self.store.replace_nodes(make_nodes(nodes))
        self.store.replace_pods([])
        if hasattr(self.store, "replace_leases"):  # the reservation ledger on a Lease per node (later trees)
            self.store.replace_leases([])
        self.store.seen("Pod", "1000")
        assert self.store.synced
        settings = app_module.Settings(clock=lambda: NOW)
        self.app = app_module.make_app(cache=self.store, bind=binder.Binder.__new__(binder.Binder), settings=settings)
        self.names = [f"bench-{i:04d}" for i in range(nodes)]
        self.feasible = feasible(nodes, percentage)
        self.start = 0
        self.version = 10_000
        self.digest = hashlib.sha256()
        self.loop = asyncio.new_event_loop()
        self.spent = 0.0  # CPU seconds inside the app and the store (not building bodies, not reading answers)
        self.filter_times: list[float] = []
        # The bind's hold check (`Binder._with_holds`: the cards held for preemptors, as filter
        # judges), timed on each bind's state in ns, with the timer's own cost beside it; None
        # for a tree whose binder has none.
        self.hold_check: Any = None
        with contextlib.suppress(AttributeError, TypeError):
            self.hold_check = binder.Binder(None, cache=self.store)._with_holds  # type: ignore[arg-type]  # no apiserver: never called
        self.hold_check_ns: list[int] = []
        self.timer_ns: list[int] = []

    def warm(self, pods: int) -> None:
        """The first `pods` steps, then what the app does once its node states are warm: the
        collector's full passes stop walking what is here now (`gc.freeze`, as `app._warm`)."""
        for index in range(pods):
            self.step(index)
        gc.collect()
        gc.freeze()

    def _call(self, path: str, body: bytes, handler: Any) -> bytes:
        request = _Request(self.app, path, body)
        started = time.process_time()
        response = self.loop.run_until_complete(self.app_module._observe(request, handler))  # type: ignore[arg-type]  # what it reads
        took = time.process_time() - started
        self.spent += took
        if path == "/filter":
            self.filter_times.append(took)
        assert isinstance(response, web.Response) and isinstance(response.body, bytes)
        return response.body

    def _apply(self, event: str, pod: dict[str, Any]) -> None:
        started = time.process_time()
        self.store.apply("Pod", event, pod)
        self.spent += time.process_time() - started

    def next_pod(self, index: int) -> tuple[dict[str, Any], list[str]]:
        """The pod of step `index` and the node names the scheduler sends for it."""
        self.version += 1
        pod = make_pod(index, memory=(1, 1, 2, 4)[index % 4], version=self.version)
        count = len(self.names)
        names = [self.names[(self.start + i) % count] for i in range(self.feasible)]
        self.start = (self.start + self.feasible) % count
        return pod, names

    def step(self, index: int) -> None:
        """One pod through ADDED, filter, prioritize and the bind's MODIFIED event."""
        pod, names = self.next_pod(index)
        self._apply("ADDED", json.loads(json.dumps(pod)))
        body = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode()
        filtered = self._call("/filter", body, self.app_module.filter_nodes)
        self.digest.update(filtered)
        passed = json.loads(filtered)["NodeNames"] or []
        if not passed:
            return
        body = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": passed}).encode()
        scored = self._call("/prioritize", body, self.app_module.prioritize)
        self.digest.update(scored)
        best = max(json.loads(scored), key=lambda h: (h["Score"], h["Host"]))["Host"]
        bound = self.bound(pod, best)
        if bound is not None:
            self._apply("MODIFIED", bound)

    def bound(self, pod: dict[str, Any], best: str) -> dict[str, Any] | None:
        """The pod as its watch event shows it once bind placed it on `best` (None: it does not fit there)."""
        from policies.gpu import allocation, cardrequest
        from webhook.extender import placement

        memory = cardrequest.pod_request(pod).memory_gib
        wanted = cardrequest.pod_request(pod)
        state = self.store.state(best, now=NOW, ttl=120.0)
        if state is not None and self.hold_check is not None:
            started = time.perf_counter_ns()
            self.hold_check(best, pod["metadata"]["uid"], state, now=NOW)
            self.hold_check_ns.append(time.perf_counter_ns() - started)
            started = time.perf_counter_ns()
            self.timer_ns.append(time.perf_counter_ns() - started)
        chosen = placement.choose(wanted, state) if state is not None else None
        if chosen is None:
            return None
        held = allocation.Allocation(
            uid=pod["metadata"]["uid"],
            namespace="default",
            name=pod["metadata"]["name"],
            node=best,
            cards=chosen,
            memory_gib=memory,
            assumed_at=NOW,
        )
        self.version += 1
        bound: dict[str, Any] = json.loads(json.dumps(pod))
        bound["metadata"]["resourceVersion"] = str(self.version)
        bound["metadata"]["annotations"] = allocation.bind_annotations(held, card_memory_gib=T4_GIB)
        bound["spec"]["nodeName"] = best
        return bound


def run_worker(args: argparse.Namespace) -> None:
    """The child side of `--against` (and of the plain run): prints one JSON line per round."""
    driver = Driver(nodes=args.nodes, percentage=args.percentage)
    driver.warm(args.warmup)
    index = args.warmup
    for _ in range(args.rounds):
        line = sys.stdin.readline()  # the parent's go: rounds of the two trees alternate
        if not line:
            return
        driver.spent, driver.filter_times, driver.hold_check_ns, driver.timer_ns = 0.0, [], [], []
        for _ in range(args.pods):
            driver.step(index)
            index += 1
        spent = driver.spent
        times = sorted(driver.filter_times)
        tail = {f"filter_p{q}_ms": round(1000 * times[min(len(times) - 1, len(times) * q // 100)], 3) for q in (50, 99)}
        checks, timer = sorted(driver.hold_check_ns), sorted(driver.timer_ns)
        if checks:  # ns per bind, the timer's own cost included (`bind_hold_timer_ns_p50` is that cost)
            tail |= {f"bind_hold_check_ns_p{q}": checks[min(len(checks) - 1, len(checks) * q // 100)] for q in (50, 99)}
            tail["bind_hold_timer_ns_p50"] = timer[len(timer) // 2]
        print(json.dumps({"ms_per_pod": 1000 * spent / args.pods, "digest": driver.digest.hexdigest()} | tail), flush=True)


def run_server(args: argparse.Namespace) -> None:
    """The child side of `--http`: the app served on a local port; the parent sends filter and
    prioritize over HTTP (keep-alive, as kube-scheduler does) and steers the pod events on stdin:
    `next` (the next pod's ADDED event; answers the filter body), `bind NODE` (the MODIFIED event
    of the pod bound there), `cpu` (CPU seconds of this process so far, less what the steering
    itself spent: building the pods, choosing the card). Applying the events counts, as a watch's would."""
    import threading

    driver = Driver(nodes=args.nodes, percentage=args.percentage)
    driver.warm(args.warmup)
    loop = driver.loop
    # What the app's middleware records per verb (`_observe`: from the handler's start, body read
    # included), kept exactly rather than as the histogram's buckets.
    observed: dict[str, list[float]] = {}
    duration = driver.app[driver.app_module.METERS].duration
    recording = duration.observe

    def observe(value: float, **labels: str) -> None:
        observed.setdefault(labels.get("verb", ""), []).append(value)
        recording(value, **labels)

    duration.observe = observe  # a bench hook (the histogram instance keeps recording)
    runner = web.AppRunner(driver.app, access_log=None)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    steering = [0.0]

    def on_loop(event: str, pod: dict[str, Any]) -> None:
        done = threading.Event()

        def apply() -> None:
            driver.store.apply("Pod", event, pod)
            done.set()

        loop.call_soon_threadsafe(apply)
        done.wait()

    def steer() -> None:
        index, pod = args.warmup, None
        for line in sys.stdin:
            started = time.thread_time()
            command, _, rest = line.strip().partition(" ")
            if command == "next":
                pod, names = driver.next_pod(index)
                index += 1
                added = json.loads(json.dumps(pod))
                body = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})
                steering[0] += time.thread_time() - started
                on_loop("ADDED", added)
                print(body, flush=True)
                continue
            if command == "bind" and pod is not None:
                bound = driver.bound(pod, rest)
                steering[0] += time.thread_time() - started
                if bound is not None:
                    on_loop("MODIFIED", bound)
                print("ok", flush=True)
                continue
            if command == "cpu":
                seen = {verb: list(values) for verb, values in observed.items()}
                observed.clear()
                print(
                    json.dumps({"cpu": time.process_time() - steering[0] - (time.thread_time() - started), "observed": seen}),
                    flush=True,
                )
                steering[0] += time.thread_time() - started
        loop.call_soon_threadsafe(loop.stop)

    print(json.dumps({"port": port}), flush=True)
    threading.Thread(target=steer, daemon=True).start()
    loop.run_forever()


class _Remote:
    """The parent's end of one `--http` server."""

    def __init__(self, tree: Path, args: argparse.Namespace) -> None:
        import http.client

        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--serve",
            "--nodes",
            str(args.nodes),
            "--warmup",
            str(args.warmup),
            "--percentage",
            str(args.percentage),
        ]
        env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
        self.process = subprocess.Popen(command, cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        port = json.loads(self._read())["port"]
        self.http = http.client.HTTPConnection("127.0.0.1", port)
        self.digest = hashlib.sha256()
        self.walls: dict[
            str, list[float]
        ] = {}  # per verb: seconds from sending the request to the answer read, as the client sees it
        self.observed: dict[str, list[float]] = {}  # per verb: what the server's middleware recorded

    def _read(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline()

    def _say(self, line: str) -> str:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        return self._read()

    def _post(self, path: str, body: bytes) -> bytes:
        started = time.perf_counter()
        self.http.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        answer = self.http.getresponse().read()
        self.walls.setdefault(path.strip("/"), []).append(time.perf_counter() - started)
        self.digest.update(answer)
        return answer

    def cpu(self) -> float:
        answer = json.loads(self._say("cpu"))
        self.observed = answer.get("observed") or {}
        return float(answer["cpu"])

    def step(self) -> None:
        body = self._say("next").strip()
        pod = json.loads(body)["Pod"]
        passed = json.loads(self._post("/filter", body.encode()))["NodeNames"] or []
        if not passed:
            return
        scored = json.loads(self._post("/prioritize", json.dumps({"Pod": pod, "Nodes": None, "NodeNames": passed}).encode()))
        best = max(scored, key=lambda h: (h["Score"], h["Host"]))["Host"]
        self._say(f"bind {best}")

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=30)


def _quantile(values: list[float], q: int) -> float:
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, len(ordered) * q // 100)], 3) if ordered else 0.0


def run_http(args: argparse.Namespace, trees: dict[str, Path]) -> dict[str, list[dict[str, Any]]]:
    remotes = {label: _Remote(tree, args) for label, tree in trees.items()}
    results: dict[str, list[dict[str, Any]]] = {label: [] for label in trees}
    for _ in range(args.rounds):
        for label, remote in remotes.items():  # one at a time
            before = remote.cpu()
            remote.walls = {}
            for _ in range(args.pods):
                remote.step()
            spent = remote.cpu() - before
            tails = {
                f"{verb}_{where}_p{q}_ms": _quantile(values, q)
                for where, found in (("wall", remote.walls), ("observed", remote.observed))
                for verb, values in found.items()
                if verb in ("filter", "prioritize")
                for q in (50, 99)
            }
            results[label].append({"ms_per_pod": 1000 * spent / args.pods, "digest": remote.digest.hexdigest()} | tails)
            shown = ", ".join(f"{key} {value}" for key, value in tails.items() if key.startswith("filter"))
            print(f"{label} (http): {results[label][-1]['ms_per_pod']:.3f} ms/pod; {shown}", file=sys.stderr, flush=True)
    for remote in remotes.values():
        remote.close()
    return results


def profile(args: argparse.Namespace) -> None:
    driver = Driver(nodes=args.nodes, percentage=args.percentage)
    driver.warm(args.warmup)
    profiler = cProfile.Profile()
    profiler.enable()
    for index in range(args.warmup, args.warmup + args.pods):
        driver.step(index)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(45)
    pstats.Stats(profiler).sort_stats("tottime").print_stats(30)


def _spawn(tree: Path, args: argparse.Namespace) -> subprocess.Popen[str]:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "--nodes",
        str(args.nodes),
        "--pods",
        str(args.pods),
        "--rounds",
        str(args.rounds),
        "--warmup",
        str(args.warmup),
        "--percentage",
        str(args.percentage),
    ]
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    return subprocess.Popen(command, cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=1000, help="pods per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=200, help="pods scheduled before measuring")
    parser.add_argument(
        "--percentage",
        type=int,
        default=0,
        help="kube-scheduler's percentageOfNodesToScore: how many node names filter gets (default 0: its adaptive "
        "default; the shipped scheduler-config-second.yaml and extender_throughput.py use 100, every node)",
    )
    parser.add_argument("--against", type=Path, help="another source tree (a worktree of an older commit) run side by side")
    parser.add_argument("--profile", action="store_true", help="print cProfile's tables for this tree instead")
    parser.add_argument(
        "--http", action="store_true", help="serve the app on a local port in the child and send the verbs over HTTP"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker or args.serve:
        sys.path.insert(0, os.environ.get("PYTHONPATH", str(ROOT)))
        (run_server if args.serve else run_worker)(args)
        return 0
    if args.profile:
        sys.path.insert(0, str(ROOT))
        profile(args)
        return 0
    trees = {"after": ROOT} | ({"before": args.against.resolve()} if args.against else {})
    if args.http:
        results = run_http(args, trees)
    else:
        results = run_direct(args, trees)
    best = {label: min(r["ms_per_pod"] for r in rounds) for label, rounds in results.items()}
    headline: dict[str, Any] = {
        "nodes": args.nodes,
        "feasible": feasible(args.nodes, args.percentage),
        "pods": args.pods * args.rounds,
        "http": args.http,
    }
    headline |= {f"{label}_ms_per_pod": round(value, 3) for label, value in best.items()}
    for label, rounds in results.items():  # filter CPU per call (direct) or wall times (http), from the quietest round
        quietest = min(rounds, key=lambda r: r["ms_per_pod"])
        headline |= {
            f"{label}_{key}": value for key, value in quietest.items() if key.startswith(("filter_", "prioritize_", "bind_hold_"))
        }
    if "before" in best:
        headline["ratio"] = round(best["after"] / best["before"], 3)
        headline["same_answers"] = all(
            a["digest"] == b["digest"] for a, b in zip(results["after"], results["before"], strict=True)
        )
    print(json.dumps(headline))
    if "before" not in best:
        print("# no record: a record needs the reference of the same run (--against DIR)", flush=True)
        return 0
    records.write(
        bench="extender_cpu",
        inputs=vars(args),
        figures=headline,
        reference={"name": str(args.against), "figures": {"after_ms_per_pod": headline["before_ms_per_pod"]}},
        headline=records.Headline(
            figure="after_ms_per_pod", label=f"extender CPU per pod in process, {args.nodes:,} nodes", unit="ms", better="lower"
        ),
    )
    return 0


def run_direct(args: argparse.Namespace, trees: dict[str, Path]) -> dict[str, list[dict[str, Any]]]:
    workers = {label: _spawn(tree, args) for label, tree in trees.items()}
    results: dict[str, list[dict[str, Any]]] = {label: [] for label in trees}
    for _ in range(args.rounds):
        for label, worker in workers.items():  # one at a time: the other waits on its stdin
            assert worker.stdin is not None and worker.stdout is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
            results[label].append(json.loads(worker.stdout.readline()))
            print(f"{label}: {results[label][-1]['ms_per_pod']:.3f} ms/pod", file=sys.stderr, flush=True)
    for worker in workers.values():
        assert worker.stdin is not None
        worker.stdin.close()
        worker.wait()
    return results


if __name__ == "__main__":
    sys.exit(main())
