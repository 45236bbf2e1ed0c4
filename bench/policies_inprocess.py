"""In-process CPU of the policy engine, the audit's judging and the per-pod parses, two trees side by side.

Three measurements, each run in a fresh interpreter per tree, the trees alternating round by round
(`--rounds`), the minimum CPU time of `--repeat` passes kept per round and the median over rounds
reported:

- `engine`: `policies.engine.evaluate` on a small GPU pod, a CPU pod and a Deployment-style pod (a
  ServiceAccount token volume, defaults filled in), under the default settings and under settings
  with namespace overrides; microseconds per evaluation.
- `audit`: `webhook.audit.scan.run` on an inventory built from the audit tests' cluster snapshot
  (tests/unit/audit/data/cluster.yaml), its nodes and pods copied `--copies` times under new names;
  milliseconds per run and microseconds per pod.
- `parses`: the calls the audit's checks and node states make on each pod (two
  `cardrequest.pod_request`, four `allocation.pod_allocation`, one `gpu.pod_gpu_requests`), called
  directly, and, in a tree that has `policies.gpu.podparse`, through one `PodParses` for the pass;
  microseconds per pod.

    .venv/bin/python bench/policies_inprocess.py --against REF [--tree REF] [--rounds 5]

`--tree` defaults to the working tree. The last line is one JSON object of the headline figures.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import records  # noqa: E402 - bench/ is on sys.path (scripts run as bench/<name>.py); one record per run

ROOT = pathlib.Path(__file__).resolve().parent.parent
SNAPSHOT = "tests/unit/audit/data/cluster.yaml"
NOW = 1_800_000_000.0

OVERRIDES: dict[str, Any] = {
    "namespaceOverrides": [
        {"name": "lab", "namespaces": ["lab"], "policies": {"GPU001": {"action": "off"}}},
        {"name": "dev", "namespaceSelector": {"matchLabels": {"tier": "dev"}}, "policies": {"GPU003": {"action": "warn"}}},
    ]
}


def _container(limits: dict[str, str] | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {
        "name": "main",
        "image": "registry.example/app:1.0",
        "imagePullPolicy": "IfNotPresent",
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "volumeMounts": [
            {"name": "kube-api-access-x1", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": True}
        ],
    }
    if limits:
        found["resources"] = {"limits": limits, "requests": dict(limits)}
    return found


def _pods() -> dict[str, dict[str, Any]]:
    small = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team-a"},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"aliyun.com/gpu-mem": "4"}}}]},
    }
    cpu = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team-a"},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }
    deployment = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web-7d9f-abcde", "namespace": "team-a", "labels": {"app": "web", "pod-template-hash": "7d9f"}},
        "spec": {
            "containers": [_container({"aliyun.com/gpu-mem": "8"})],
            "dnsPolicy": "ClusterFirst",
            "restartPolicy": "Always",
            "schedulerName": "default-scheduler",
            "serviceAccountName": "default",
            "terminationGracePeriodSeconds": 30,
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            ],
            "volumes": [
                {
                    "name": "kube-api-access-x1",
                    "projected": {
                        "defaultMode": 420,
                        "sources": [{"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}],
                    },
                }
            ],
        },
    }
    return {"small-gpu": small, "cpu": cpu, "deployment-gpu": deployment}


def _cpu(work: Callable[[], object], *, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        work()
        best = min(best, time.process_time() - started)
    return best


def _inventory_objects(copies: int) -> list[dict[str, Any]]:
    import yaml

    items = yaml.safe_load((ROOT / SNAPSHOT).read_text())["items"]
    nodes = [item["metadata"]["name"] for item in items if item["kind"] == "Node"]
    objects: list[dict[str, Any]] = []
    for index in range(copies):
        text = json.dumps(items)
        for name in nodes:
            text = text.replace(f'"{name}"', f'"{name}-{index}"').replace(f'\\"{name}\\"', f'\\"{name}-{index}\\"')
        for item in json.loads(text):
            metadata = item.setdefault("metadata", {})
            if item["kind"] != "Node":
                metadata["name"] = f"{metadata.get('name', 'x')}-{index}"
                metadata["uid"] = f"{metadata.get('uid', 'uid')}-{index}"
            objects.append(item)
    return objects


def worker(args: argparse.Namespace) -> dict[str, float]:
    sys.path.insert(0, os.getcwd())
    from policies import engine, gpu, model, podspec
    from policies import settings as settings_
    from policies.gpu import allocation, cardrequest
    from webhook.audit import scan

    figures: dict[str, float] = {}
    defaults = settings_.Settings()
    overrides = settings_.from_mapping(OVERRIDES)
    n = args.evaluations
    for pod_name, pod in _pods().items():
        for settings_name, current in (("defaults", defaults), ("overrides", overrides)):
            request = model.Request(operation="CREATE", object=pod, namespace="team-a", namespace_labels={"tier": "prod"})

            def evaluations(request: model.Request = request, current: settings_.Settings = current) -> None:
                for _ in range(n):
                    engine.evaluate(request, settings=current)

            figures[f"engine {pod_name} {settings_name} us"] = _cpu(evaluations, repeat=args.repeat) / n * 1e6

    objects = _inventory_objects(args.copies)
    pods = [o for o in objects if o["kind"] == "Pod"]
    judged = _cpu(lambda: scan.run(scan.Inventory.of(copy.deepcopy(objects)), settings=defaults, now=NOW), repeat=args.repeat)
    figures["audit run ms"] = judged * 1e3
    figures["audit us per pod"] = judged / len(pods) * 1e6

    def direct() -> None:
        for pod in pods:
            cardrequest.pod_request(pod)
            cardrequest.pod_request(pod)
            for _ in range(4):
                allocation.pod_allocation(pod, now=NOW)
            gpu.pod_gpu_requests(podspec.mapping(pod.get("spec")))

    figures["parses direct us per pod"] = _cpu(direct, repeat=args.repeat) / len(pods) * 1e6
    try:
        from policies.gpu import podparse  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        return figures
    if not pathlib.Path(podparse.__file__).resolve().is_relative_to(pathlib.Path.cwd().resolve()):
        return figures  # an editable install's finder found another tree's module: this tree has none

    def shared() -> None:
        parses = podparse.PodParses()
        for pod in pods:
            parses.request(pod)
            parses.request(pod)
            for _ in range(4):
                parses.allocation(pod, now=NOW)
            parses.gpu_requests(pod)

    figures["parses shared us per pod"] = _cpu(shared, repeat=args.repeat) / len(pods) * 1e6
    return figures


def _worktree(ref: str, where: pathlib.Path) -> pathlib.Path:
    path = where / ref.replace("/", "_")
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(path), ref], check=True, capture_output=True)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--against", required=True, help="the commit to compare with (before)")
    parser.add_argument("--tree", default="", help="a commit to measure as 'after' (default: the working tree)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--evaluations", type=int, default=1000)
    parser.add_argument("--copies", type=int, default=200, help="copies of the snapshot's nodes and pods for the audit")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as scratch:
        where = pathlib.Path(scratch)
        trees = {"before": _worktree(args.against, where), "after": _worktree(args.tree, where) if args.tree else ROOT}
        runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
        try:
            for round_ in range(args.rounds):
                order = ("before", "after") if round_ % 2 == 0 else ("after", "before")
                for name in order:
                    command = [
                        sys.executable,
                        str(pathlib.Path(__file__).resolve()),
                        "--worker",
                        "--against",
                        args.against,
                        "--repeat",
                        str(args.repeat),
                        "--evaluations",
                        str(args.evaluations),
                        "--copies",
                        str(args.copies),
                    ]
                    done = subprocess.run(
                        command,
                        cwd=trees[name],
                        check=True,
                        capture_output=True,
                        text=True,
                        env={**os.environ, "PYTHONPATH": str(trees[name])},
                    )
                    runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
        finally:
            for path in trees.values():
                if path != ROOT:
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], capture_output=True)
    load_after = os.getloadavg()
    median = {name: {key: statistics.median(r[key] for r in rs if key in r) for key in rs[0]} for name, rs in runs.items()}
    print(
        f"before {args.against}, after {args.tree or 'working tree'}; {args.rounds} rounds, min of {args.repeat} each, median over rounds"
    )
    print(f"load average {load_before[0]:.1f} -> {load_after[0]:.1f}\n")
    print("| figure | before | after | after / before |")
    print("|---|---:|---:|---:|")
    headline: dict[str, Any] = {"load": [round(load_before[0], 1), round(load_after[0], 1)]}
    for key in median["after"]:
        before = median["before"].get(key)
        after = median["after"][key]
        ratio = f"{after / before:.2f}x" if before else "-"
        print(f"| {key} | {before:.1f} | {after:.1f} | {ratio} |" if before else f"| {key} | - | {after:.1f} | - |")
        headline[key] = round(after, 1)
        if before:
            headline[f"{key} ratio"] = round(after / before, 3)
    print(json.dumps(headline))
    first = next(iter(median["after"]))  # the first pod with the default settings
    records.write(
        bench="policies_inprocess",
        inputs=vars(args),
        figures={"engine_us": median["after"][first], "engine_figure": first, **median["after"]},
        reference={"name": str(args.against), "figures": {"engine_us": median["before"][first], **median["before"]}},
        headline=records.Headline(
            figure="engine_us", label=f"engine CPU in process ({first.removesuffix(' us')})", unit="µs", better="lower"
        ),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
