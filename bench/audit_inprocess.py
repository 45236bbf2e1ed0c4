"""The audit of a large cluster in process: the CLI's list-judge-render path against a simulated apiserver, two trees side by side.

`bench/audit_throughput.py` runs `gpu-admission audit` against a real control plane; building its
100,000-pod cluster takes a quarter of an hour of creates, and its figures carry the apiserver's
CPU. This bench runs the same audit code path in one fresh interpreter per tree, fed by a fake
apiserver below the kubernetes client (its urllib3 pool answers from pages made before the clock
starts), so only the audit's own CPU is measured:

    `sweep.audit_cluster` (the client's API classes, paged lists with `limit`/`continue`, decoding,
    judging, the node pass) → `sweep.reports` (the namespace reports, as `--write-reports` builds
    them) → the table `audit` prints.

The cluster is the one `audit_throughput.py` builds (same node layout, same pod mix and namespaces,
`audit_throughput.pod`), with what the apiserver and KWOK add: a uid, resourceVersion,
creationTimestamp and managedFields on every object; on pods the defaulted spec fields, the
ServiceAccount token volume `kube-api-access-<5 random characters>` and its mounts, the
tolerations, the Running status and qosClass; on nodes the labels, inventory annotation and
capacity the labelers write, and KWOK's status. Random parts are seeded: both trees see the same
bytes.

Per tree and round: CPU seconds of the timed part (`time.process_time`, the prefetch thread
included), its wall time, peak RSS of the worker, and a digest of every finding, the table and the
reports, which must be equal across the trees. The trees alternate round by round; the median
over rounds is reported and the last line is one JSON object.

    .venv/bin/python bench/audit_inprocess.py --against REF [--tree REF] [--pods 20000] [--nodes 5000] [--rounds 3]
    .venv/bin/python bench/audit_inprocess.py --profile OUT.pstats [--pods 20000]   # this tree only, under cProfile
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import pathlib
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from typing import Any

import records  # noqa: E402 - bench/ is on sys.path (scripts run as bench/<name>.py); one record per run

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOW = 1_800_000_000.0
STAMP = "2026-11-26T20:00:00Z"
NAMESPACES = 20
CHUNK = 500  # what the audit asks for (`webhook.audit.kube.CHUNK`); other limits are paged on demand


# --- the cluster ----------------------------------------------------------------------------------


def _token(rng: random.Random) -> str:
    return "".join(rng.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5))


def _uid(rng: random.Random) -> str:
    h = f"{rng.getrandbits(128):032x}"
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:32]}"


def _fields(keys: dict[str, Any]) -> dict[str, Any]:
    """A FieldsV1 document of the keys' shape, as a managedFields entry holds it."""
    return {f"f:{k}": (_fields(v) if isinstance(v, dict) and v else {}) for k, v in keys.items()}


def apiserver_pod(index: int, namespace: str, layout: Any, rng: random.Random, resource_version: int) -> dict[str, Any]:
    """`audit_throughput.pod` as the apiserver lists it after its create and status patch."""
    import audit_throughput  # noqa: PLC0415  (bench/ is on sys.path)

    pod = audit_throughput.pod(index, namespace, layout)
    created = json.loads(json.dumps(pod))
    token = f"kube-api-access-{_token(rng)}"
    given = pod["metadata"]
    metadata = {
        "name": given["name"],
        "namespace": given["namespace"],
        "uid": _uid(rng),
        "resourceVersion": str(resource_version),
        "generation": 1,
        "creationTimestamp": STAMP,
        "labels": dict(sorted(given["labels"].items())),
    }
    if "annotations" in given:
        metadata["annotations"] = dict(sorted(given["annotations"].items()))
    containers = []
    for container in pod["spec"]["containers"]:
        limits = container["resources"].get("limits", {})
        requests = {
            **{k: v for k, v in limits.items()},
            **container["resources"].get("requests", {}),
        }  # requests default to limits
        made = {"name": container["name"], "image": container["image"]}
        if "env" in container:
            made["env"] = container["env"]
        made.update(
            resources={"limits": dict(sorted(limits.items())), "requests": dict(sorted(requests.items()))},
            volumeMounts=[{"name": token, "readOnly": True, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
            terminationMessagePath="/dev/termination-log",
            terminationMessagePolicy="File",
            imagePullPolicy="IfNotPresent",
        )
        containers.append(made)
    given_spec = pod["spec"]
    spec: dict[str, Any] = {
        "volumes": [
            {
                "name": token,
                "projected": {
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                        {
                            "downwardAPI": {
                                "items": [
                                    {"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}
                                ]
                            }
                        },
                    ],
                    "defaultMode": 420,
                },
            }
        ],
        "containers": containers,
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": given_spec["terminationGracePeriodSeconds"],
        "dnsPolicy": "ClusterFirst",
    }
    if "nodeSelector" in given_spec:
        spec["nodeSelector"] = given_spec["nodeSelector"]
    spec.update(
        serviceAccountName="default",
        serviceAccount="default",
        nodeName=given_spec["nodeName"],
        securityContext={},
        schedulerName="default-scheduler",
        tolerations=[
            {"key": f"node.kubernetes.io/{what}", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            for what in ("not-ready", "unreachable")
        ],
        priority=0,
        enableServiceLinks=True,
        preemptionPolicy="PreemptLowerPriority",
    )
    pod = {"metadata": metadata, "spec": spec}
    status = audit_throughput.running_status(index, pod, now=STAMP)["status"]
    status = {"phase": status.pop("phase"), **status, "qosClass": "Burstable"}
    pod["status"] = status
    metadata["managedFields"] = [
        {
            "manager": "audit-throughput-bench",
            "operation": "Update",
            "apiVersion": "v1",
            "time": STAMP,
            "fieldsType": "FieldsV1",
            "fieldsV1": _fields({"metadata": created["metadata"], "spec": created["spec"]}),
        },
        {
            "manager": "audit-throughput-bench",
            "operation": "Update",
            "apiVersion": "v1",
            "time": STAMP,
            "fieldsType": "FieldsV1",
            "fieldsV1": _fields({"status": status}),
            "subresource": "status",
        },
    ]
    return pod


def kwok_nodes(count: int, rng: random.Random) -> tuple[list[dict[str, Any]], Any]:
    """The 8 default nodes as their labelers leave them and `count - 8` copies (`audit_throughput.node_copy`), with KWOK's status."""
    import audit_throughput  # noqa: PLC0415

    from webhook.cluster import nodes
    from webhook.labeler import inventory, labels

    bases = nodes.load(None)
    labelled: dict[str, dict[str, Any]] = {}
    for fake in bases:
        node = fake.manifest()
        if fake.inventory is not None:
            inv = inventory.parse(dict(fake.inventory), source=fake.name)
            desired = labels.compute(inv)
            node["metadata"]["labels"].update(desired.labels)
            node["metadata"]["annotations"].update(desired.annotations)
            from policies import gpu

            mode = gpu.mode_of(node["metadata"]["labels"])
            if mode is not None:
                node["status"]["capacity"].update(labels.capacity(inv, mode=mode))
                node["status"]["allocatable"] = dict(node["status"]["capacity"])
        labelled[fake.name] = node
    layout = audit_throughput.Layout([n.name for n in bases], count)
    made = []
    for version, name in enumerate(layout.names):
        node = labelled[name] if name in labelled else audit_throughput.node_copy(labelled[layout.base_of[name]], name)
        node = json.loads(json.dumps(node))
        node["metadata"].update(uid=_uid(rng), resourceVersion=str(1000 + version), creationTimestamp=STAMP)
        node["metadata"]["annotations"]["node.alpha.kubernetes.io/ttl"] = "0"
        node["metadata"]["managedFields"] = [
            {
                "manager": "kwok",
                "operation": "Update",
                "apiVersion": "v1",
                "time": STAMP,
                "fieldsType": "FieldsV1",
                "fieldsV1": _fields({"status": {"conditions": {}, "addresses": {}, "daemonEndpoints": {}, "nodeInfo": {}}}),
                "subresource": "status",
            },
        ]
        node["status"].update(
            conditions=[
                {
                    "type": kind,
                    "status": status,
                    "lastHeartbeatTime": STAMP,
                    "lastTransitionTime": STAMP,
                    "reason": reason,
                    "message": message,
                }
                for kind, status, reason, message in (
                    ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
                    ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                    ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                    ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                    ("NetworkUnavailable", "False", "RouteCreated", "RouteController created a route"),
                )
            ],
            addresses=[{"type": "InternalIP", "address": "10.240.0.1"}],
            daemonEndpoints={"kubeletEndpoint": {"Port": 10250}},
            nodeInfo={
                "architecture": "amd64",
                "bootID": "",
                "containerRuntimeVersion": "kwok-v0.8.0",
                "kernelVersion": "",
                "kubeProxyVersion": "",
                "kubeletVersion": "kwok-v0.8.0",
                "machineID": "",
                "operatingSystem": "linux",
                "osImage": "",
                "systemUUID": "",
            },
            phase="Running",
        )
        made.append(node)
    return made, layout


def cluster(pods: int, node_count: int, seed: int) -> dict[str, list[dict[str, Any]]]:
    """Every listed object of the bench's cluster, by the list path the client asks for."""
    rng = random.Random(seed)
    nodes_, layout = kwok_nodes(node_count, rng)
    names = [f"bench-{i:02d}" for i in range(NAMESPACES)]
    namespaces: list[dict[str, Any]] = [
        {
            "metadata": {
                "name": n,
                "uid": _uid(rng),
                "resourceVersion": str(10 + i),
                "creationTimestamp": STAMP,
                "labels": {"kubernetes.io/metadata.name": n},
            },
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        }
        for i, n in enumerate(["default", "kube-system", "kube-public", "kube-node-lease", *names])
    ]
    config_maps = [
        {
            "metadata": {
                "name": "kube-root-ca.crt",
                "namespace": ns["metadata"]["name"],
                "uid": _uid(rng),
                "resourceVersion": "20",
                "creationTimestamp": STAMP,
            },
            "data": {"ca.crt": "-----BEGIN CERTIFICATE-----\n" + "A" * 1000 + "\n-----END CERTIFICATE-----\n"},
        }
        for ns in namespaces
    ]
    listed = []
    for index in range(pods):
        namespace = names[(index + index // 100) % len(names)]
        listed.append(apiserver_pod(index, namespace, layout, rng, 100_000 + index))
    listed.sort(key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"]))  # etcd's key order
    return {"/api/v1/nodes": nodes_, "/api/v1/namespaces": namespaces, "/api/v1/configmaps": config_maps, "/api/v1/pods": listed}


# --- the fake apiserver ---------------------------------------------------------------------------


class FakePool:
    """Stands in for the client's urllib3 pool: answers GETs of lists from pre-made pages."""

    def __init__(self, objects: dict[str, list[dict[str, Any]]]) -> None:
        import orjson

        self._objects = objects
        self._pages: dict[tuple[str, int, int], bytes] = {}
        self.calls: list[str] = []
        for path, items in objects.items():
            for start in range(0, max(len(items), 1), CHUNK):
                self._pages[(path, start, CHUNK)] = self._page(path, start, CHUNK, orjson)

    def _page(self, path: str, start: int, limit: int, orjson: Any) -> bytes:
        items = self._objects.get(path, [])
        chunk = items[start : start + limit]
        end = start + len(chunk)
        metadata: dict[str, Any] = {"resourceVersion": "999999"}
        if end < len(items):
            metadata["continue"] = f"offset-{end}"
            metadata["remainingItemCount"] = len(items) - end
        kind = path.rsplit("/", 1)[-1]
        data: bytes = orjson.dumps({"kind": f"{kind}List", "apiVersion": "v1", "metadata": metadata, "items": chunk})
        return data

    def request(self, method: str, url: str, **kwargs: Any) -> Any:
        import orjson
        import urllib3

        parts = urllib.parse.urlsplit(url)
        query = urllib.parse.parse_qs(parts.query)
        self.calls.append(f"{method} {parts.path}?{parts.query}")
        if method != "GET":
            return urllib3.HTTPResponse(
                body=io.BytesIO(b"{}"), status=201, headers={"Content-Type": "application/json"}, preload_content=False
            )
        limit = int(query.get("limit", ["0"])[0]) or 1_000_000
        token = query.get("continue", [""])[0]
        start = int(token.split("-", 1)[1]) if token else 0
        path = parts.path
        if path not in self._objects:
            if "limit" in query:  # a list of a kind this cluster has none of
                data = orjson.dumps({"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": []})
                return urllib3.HTTPResponse(
                    body=io.BytesIO(data), status=200, headers={"Content-Type": "application/json"}, preload_content=False
                )
            body = orjson.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404})
            return urllib3.HTTPResponse(
                body=io.BytesIO(body), status=404, headers={"Content-Type": "application/json"}, preload_content=False
            )
        page = self._pages.get((path, start, limit)) or self._page(path, start, limit, orjson)
        return urllib3.HTTPResponse(
            body=io.BytesIO(page), status=200, headers={"Content-Type": "application/json"}, preload_content=False
        )

    def clear(self) -> None:
        pass


# --- one tree's worker ----------------------------------------------------------------------------


def worker(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, os.getcwd())
    sys.path.insert(1, str(pathlib.Path(__file__).resolve().parent))
    objects = cluster(args.pods, args.nodes, args.seed)
    pool = FakePool(objects)
    del objects
    import gc

    gc.collect()
    # What `gpu-admission audit` has imported before it lists (its CLI, the client's configuration).
    import kubernetes.client

    from policies import settings as settings_
    from webhook.audit import cli, render, sweep  # noqa: F401

    configuration = kubernetes.client.Configuration()
    configuration.host = "https://apiserver.invalid"
    api = kubernetes.client.ApiClient(configuration)
    api.rest_client.pool_manager = pool  # type: ignore[assignment]  # answers like a urllib3 pool
    settings = settings_.Settings()
    from webhook.audit import verdicts

    memos: list[Any] = []
    made = verdicts.Memo.__init__

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        memos.append(self)

    verdicts.Memo.__init__ = counted  # type: ignore[method-assign]  # to read its hits and misses after the run
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    started, started_cpu = time.perf_counter(), time.process_time()
    audit = sweep.audit_cluster(api, settings=settings, namespace=None, now=NOW)
    judged_cpu = time.process_time() - started_cpu
    reports = sweep.reports(audit, all_results=False, now=NOW)
    table = cli._text(audit, reports, output="table", all_results=False)
    cpu = time.process_time() - started_cpu
    wall = time.perf_counter() - started
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.profile)
    digest = hashlib.sha256()
    for found in audit.findings:
        digest.update(repr(found).encode())
    findings_digest = digest.hexdigest()[:16]
    reports_digest = hashlib.sha256(json.dumps({str(k): v for k, v in reports.items()}, sort_keys=True).encode()).hexdigest()[:16]
    return {
        "cpu_s": round(cpu, 3),
        "judge_cpu_s": round(judged_cpu, 3),
        "tail_cpu_s": round(cpu - judged_cpu, 3),
        "wall_s": round(wall, 3),
        "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "findings": len(audit.findings),
        "findings_digest": findings_digest,
        "table_digest": hashlib.sha256(table.encode()).hexdigest()[:16],
        "reports_digest": reports_digest,
        "memo_hits": sum(m.hits for m in memos),
        "memo_misses": sum(m.misses for m in memos),
        "memo_policy_hits": sum(
            getattr(m, "policy_hits", 0) for m in memos
        ),  # misses the policies' results served (trees since 39cc164)
        "list_calls": sum(1 for c in pool.calls if c.startswith("GET")),
        "list_calls_without_limit": sum(1 for c in pool.calls if c.startswith("GET") and "limit=" not in c),
    }


def _tree(ref: str, where: pathlib.Path) -> pathlib.Path:
    path = where / ref.replace("/", "_")
    path.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(path)], input=archive, check=True)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--against", help="the commit (or a source directory) to compare with (before)")
    parser.add_argument(
        "--tree", default="", help="a commit (or a source directory) to measure as 'after' (default: the working tree)"
    )
    parser.add_argument("--pods", type=int, default=20_000)
    parser.add_argument("--nodes", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument("--profile", default="", help="run this tree once under cProfile and write the stats here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    script = str(pathlib.Path(__file__).resolve())
    common = ["--pods", str(args.pods), "--nodes", str(args.nodes), "--seed", str(args.seed)]
    if args.profile:
        done = subprocess.run(
            [sys.executable, script, "--worker", *common, "--profile", str(pathlib.Path(args.profile).resolve())],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        print(done.stdout.strip().splitlines()[-1])
        return 0
    if not args.against:
        parser.error("--against is needed (or --profile)")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as scratch:
        where = pathlib.Path(scratch)

        def resolve(ref: str) -> pathlib.Path:
            return pathlib.Path(ref).resolve() if pathlib.Path(ref).is_dir() else _tree(ref, where)

        trees = {"before": resolve(args.against), "after": resolve(args.tree) if args.tree else ROOT}
        runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
        for round_ in range(args.rounds):
            order = ("before", "after") if round_ % 2 == 0 else ("after", "before")
            for name in order:
                done = subprocess.run(
                    [sys.executable, script, "--worker", *common],
                    cwd=trees[name],
                    check=True,
                    capture_output=True,
                    text=True,
                    env={**os.environ, "PYTHONPATH": str(trees[name])},
                )
                runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(f"# {name} round {round_}: {json.dumps(runs[name][-1])}", file=sys.stderr, flush=True)
    load_after = os.getloadavg()
    print(
        f"before {args.against}, after {args.tree or 'working tree'}; {args.pods} pods on {args.nodes} nodes; "
        f"{args.rounds} rounds, median; load average {load_before[0]:.1f} -> {load_after[0]:.1f}\n"
    )
    print("| figure | before | after | after / before |")
    print("|---|---:|---:|---:|")
    headline: dict[str, Any] = {
        "pods": args.pods,
        "nodes": args.nodes,
        "rounds": args.rounds,
        "load": [round(load_before[0], 1), round(load_after[0], 1)],
    }
    for key in ("cpu_s", "judge_cpu_s", "tail_cpu_s", "wall_s", "max_rss_mib"):
        before = statistics.median(r[key] for r in runs["before"])
        after = statistics.median(r[key] for r in runs["after"])
        print(f"| {key} | {before:.2f} | {after:.2f} | {after / before:.2f}x |")
        headline[f"before_{key}"] = before
        headline[f"after_{key}"] = after
        headline[f"{key}_ratio"] = round(after / before, 3)
    # The least CPU of the rounds as well: on a shared machine another process' load only ever adds.
    headline["before_cpu_s_min"] = min(r["cpu_s"] for r in runs["before"])
    headline["after_cpu_s_min"] = min(r["cpu_s"] for r in runs["after"])
    headline["cpu_s_min_ratio"] = round(headline["after_cpu_s_min"] / headline["before_cpu_s_min"], 3)
    headline["before_cpu_s_all"] = [r["cpu_s"] for r in runs["before"]]
    headline["after_cpu_s_all"] = [r["cpu_s"] for r in runs["after"]]
    every = [r for name in runs for r in runs[name]]
    headline["outputs_identical"] = all(
        (r["findings_digest"], r["table_digest"], r["reports_digest"])
        == (every[0]["findings_digest"], every[0]["table_digest"], every[0]["reports_digest"])
        for r in every
    )
    headline["findings"] = every[0]["findings"]
    headline["list_calls"] = [runs["before"][0]["list_calls"], runs["after"][0]["list_calls"]]
    headline["list_calls_without_limit"] = [
        runs["before"][0]["list_calls_without_limit"],
        runs["after"][0]["list_calls_without_limit"],
    ]
    print(json.dumps(headline))
    records.write(
        bench="audit_inprocess",
        inputs=vars(args),
        figures={**headline, "cpu_s": headline["after_cpu_s"]},
        reference={"name": str(args.against), "figures": {"cpu_s": headline["before_cpu_s"]}},
        headline=records.Headline(figure="cpu_s", label="audit CPU in process (median of rounds)", unit="s", better="lower"),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
