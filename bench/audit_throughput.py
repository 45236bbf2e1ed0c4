"""Audit at scale: `gpu-admission audit` on N pods over M KWOK nodes, its wall time, peak memory, list calls and writes.

Brings up its own local control plane (`webhook.cluster.controlplane.up`, no webhook, no extender)
with the apiserver's audit log on (list calls and report writes only, `AUDIT_POLICY`). The labelers
label the 8 default KWOK nodes once and are stopped; the other `--nodes` - 8 nodes are copies of
those 8 as the labeler left them (labels, card inventory annotation, capacity), round robin, so
the node pools keep the default set's proportions. kube-scheduler and kube-controller-manager are
stopped once the namespaces have their `default` ServiceAccount: pods are created already bound
(`spec.nodeName`), so neither has work, and without the node lifecycle controller nothing evicts
pods from nodes whose lease lapses while KWOK is stopped.

Pods are created with a raw HTTPS client (`--workers` threads, one POST each, no kubectl and no
model objects), spread over `--namespaces` namespaces, and set Running: by default this script
PATCHes each pod's status right after its create with what KWOK's pod-ready stage writes
(conditions, container statuses, IPs, phase; `--mark-running kwok` leaves it to KWOK, which manages
a few dozen pods a second beside 5,000 node leases on 2 cores). KWOK initialises the nodes and is
stopped before the pods come, so nothing but the audit runs while it is measured. With `--dir D --keep` the cluster
stays up and a later run with `--reuse --dir D` only adds the pods and nodes it lacks (pods are
named by index): 10k, then 30k, then 100k on one cluster.

Pod mix (per 100): 1 sets NVIDIA_VISIBLE_DEVICES=all (GPU001) on a CPU node, 40 ask for
aliyun.com/gpu-mem (1 GiB) on a cgpu/share node with the extender's allocation annotation naming
that node and a card (spread evenly over the shared nodes' cards), 10 ask for nvidia.com/gpu on an
exclusive node, 49 ask for nothing (NVIDIA_VISIBLE_DEVICES=void, as GPU104 would leave them) on
any node. Every pod asks for CPU and memory and carries an app label, as real ones do.

Measured, each as a subprocess (`gpu-admission audit --write-reports`, table output to a file):
wall time and the peak RSS of the audit process (`os.wait4`'s rusage, `ru_maxrss`); the list
calls it made and whether each carries `limit` (counted from the apiserver's audit log, by the
python client's user agent, in the run's time window: the apiserver's own record, not the
client's); its writes (creates, updates, patches, deletes). The first run writes the reports;
the next `--repeat` runs find nothing changed and must write nothing. The script ends with one
JSON line of headline figures. `--table` adds the older in-process table (kubectl reference,
list, list + judge, judge, offline `-f`, report writes), which holds every pod in this process.

    .venv/bin/python bench/audit_throughput.py --pods 100000 --nodes 5000
    BASE=$(mktemp -d) && git archive REF | tar -x -C "$BASE"   # a baseline tree, run in turns with this one
    .venv/bin/python bench/audit_throughput.py --pods 10000 --nodes 5000 --against "$BASE"
    DIR=$(mktemp -d)
    .venv/bin/python bench/audit_throughput.py --pods 10000 --nodes 5000 --dir "$DIR" --keep
    .venv/bin/python bench/audit_throughput.py --pods 30000 --nodes 5000 --dir "$DIR" --keep --reuse
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import datetime
import io
import json
import os
import pathlib
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import records  # noqa: E402 - bench/ is on sys.path (scripts run as bench/<name>.py); one record per run
import urllib3

from policies import settings as settings_
from webhook.audit import kube, scan, sweep
from webhook.cluster import binaries, controlplane, install, nodes
from webhook.cmdline import manifests

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_BASES = ("cgpu-binpack-0", "cgpu-binpack-1", "cgpu-spread-0", "share-binpack-0")
EXCLUSIVE_BASES = ("exclusive-0",)
CPU_BASES = ("cpu-0",)
USER_AGENT = "audit-throughput-bench"
# Only what the measurement needs: every list (any user agent; filtered when read) and every write
# of a report. Pod creates are not logged, so 100,000 of them cost no log lines.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [
        {"level": "Metadata", "verbs": ["list"]},
        {
            "level": "Metadata",
            "resources": [{"group": "wgpolicyk8s.io"}],
            "verbs": ["create", "update", "patch", "delete", "deletecollection"],
        },
        {"level": "None"},
    ],
}
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


# --- the cluster's shape --------------------------------------------------------------------------


class Layout:
    """Node names by role: the 8 default nodes first, then their copies `<base>-c<k>` round robin."""

    def __init__(self, bases: Sequence[str], total: int) -> None:
        self.names: list[str] = list(bases)
        self.base_of: dict[str, str] = {name: name for name in bases}
        for k in range(max(total - len(bases), 0)):
            base = bases[k % len(bases)]
            name = f"{base}-c{k:05d}"
            self.names.append(name)
            self.base_of[name] = base
        self.shared = [n for n in self.names if self.base_of[n] in SHARED_BASES]
        self.exclusive = [n for n in self.names if self.base_of[n] in EXCLUSIVE_BASES]
        self.cpu = [n for n in self.names if self.base_of[n] in CPU_BASES]


def node_copy(labelled: dict[str, Any], name: str) -> dict[str, Any]:
    """A copy of a labelled default node under another name: labels, annotations (the card
    inventory) and capacity as the labeler left them; KWOK fills the status' conditions."""
    metadata = labelled["metadata"]
    labels = {**metadata.get("labels", {}), "kubernetes.io/hostname": name}
    capacity = copy.deepcopy(labelled.get("status", {}).get("capacity", {}))
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": dict(metadata.get("annotations", {}))},
        "spec": {},
        "status": {"capacity": capacity, "allocatable": copy.deepcopy(labelled.get("status", {}).get("allocatable", capacity))},
    }


def pod(index: int, namespace: str, layout: Layout) -> dict[str, Any]:
    """Pod number `index` of the mix described in the module docstring."""
    name = f"p-{index:06d}"
    container: dict[str, Any] = {
        "name": "main",
        "image": "registry.example/app:1",
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
    }
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": {"bench": "audit", "app": f"app-{index % 50}"}}
    spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 0}
    hundred, kind = divmod(index, 100)
    if kind == 0:
        container["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
        spec["nodeName"] = layout.cpu[hundred % len(layout.cpu)]
    elif kind <= 40:
        ordinal = hundred * 40 + kind - 1
        node = layout.shared[ordinal % len(layout.shared)]
        card = (ordinal // len(layout.shared)) % 4
        mode = "share" if layout.base_of[node].startswith("share") else "cgpu"
        container["resources"]["limits"]["aliyun.com/gpu-mem"] = "1"
        spec["nodeName"] = node
        spec["nodeSelector"] = {"ack.node.gpu.schedule": mode}
        metadata["annotations"] = {
            "gpu-admission.io/allocation": json.dumps(
                {
                    "node": node,
                    "cards": [card],
                    "memGiB": 1,
                    "corePercent": 0,
                    "whole": False,
                    "assumedAt": "2026-01-01T00:00:00.000Z",
                }
            ),
            "ALIYUN_COM_GPU_MEM_IDX": str(card),
            "ALIYUN_COM_GPU_MEM_POD": "1",
        }
    elif kind <= 50:
        ordinal = hundred * 10 + kind - 41
        container["resources"]["limits"]["nvidia.com/gpu"] = "1"
        spec["nodeName"] = layout.exclusive[ordinal % len(layout.exclusive)]
    else:
        container["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
        spec["nodeName"] = layout.names[index % len(layout.names)]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def running_status(index: int, pod: dict[str, Any], *, now: str) -> dict[str, Any]:
    """The status KWOK's pod-ready stage writes (kwok-stages.yaml), for `--mark-running self`."""
    ip = f"10.{244 + index // 65_025 % 8}.{index // 255 % 255}.{index % 255 + 1}"
    containers = pod["spec"]["containers"]
    return {
        "status": {
            "conditions": [
                {"lastProbeTime": None, "lastTransitionTime": now, "status": "True", "type": kind}
                for kind in ("Initialized", "Ready", "ContainersReady")
            ],
            "containerStatuses": [
                {
                    "image": c["image"],
                    "imageID": "",
                    "lastState": {},
                    "name": c["name"],
                    "ready": True,
                    "restartCount": 0,
                    "started": True,
                    "state": {"running": {"startedAt": now}},
                }
                for c in containers
            ],
            "hostIP": "10.240.0.1",
            "hostIPs": [{"ip": "10.240.0.1"}],
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": now,
        }
    }


# --- a raw client ---------------------------------------------------------------------------------


class Raw:
    """HTTPS straight to the apiserver with the admin client certificate; JSON in and out."""

    def __init__(self, state: controlplane.State, *, connections: int) -> None:
        pki = state.directory / "pki"
        self.server = state.server
        self.pool = urllib3.PoolManager(
            maxsize=connections,
            cert_file=str(pki / "admin.crt"),
            key_file=str(pki / "admin.key"),
            ca_certs=str(pki / "ca.crt"),
            cert_reqs="CERT_REQUIRED",
            retries=urllib3.Retry(total=5, status_forcelist=(429, 500, 503), backoff_factor=0.2, allowed_methods=None),
        )

    def call(self, method: str, path: str, body: Any = None, *, accept: str = "application/json") -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Accept": accept, "User-Agent": USER_AGENT}
        response = self.pool.request(method, self.server + path, body=data, headers=headers, timeout=60.0)
        return response.status, response.data

    def create(self, path: str, body: Any) -> None:
        status, data = self.call("POST", path, body)
        if status not in (201, 409):  # 409: already there (a reused cluster)
            raise RuntimeError(f"POST {path}: {status} {data[:300]!r}")

    def patch_status(self, path: str, body: Any) -> None:
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/merge-patch+json", "Accept": "application/json", "User-Agent": USER_AGENT}
        response = self.pool.request("PATCH", self.server + path + "/status", body=data, headers=headers, timeout=60.0)
        if response.status != 200:
            raise RuntimeError(f"PATCH {path}/status: {response.status} {response.data[:300]!r}")

    def names(self, path: str) -> Iterator[str]:
        """Names of every object a paged list returns (metadata only)."""
        return (name for _, name in self.refs(path))

    def refs(self, path: str) -> Iterator[tuple[str, str]]:
        """(namespace, name) of every object a paged list returns (metadata only)."""
        token = ""
        while True:
            query = {"limit": "5000", **({"continue": token} if token else {})}
            status, data = self.call(
                "GET",
                f"{path}{'&' if '?' in path else '?'}{urllib.parse.urlencode(query)}",
                accept="application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io",
            )
            if status != 200:
                raise RuntimeError(f"GET {path}: {status} {data[:300]!r}")
            page = json.loads(data)
            yield from ((item["metadata"].get("namespace", ""), item["metadata"]["name"]) for item in page.get("items") or ())
            token = page["metadata"].get("continue") or ""
            if not token:
                return


def create_all(
    raw: Raw,
    jobs: Sequence[tuple[str, dict[str, Any]]],
    *,
    workers: int,
    what: str,
    after: Callable[[str, dict[str, Any]], None] | None = None,
) -> float:
    """POST every (path, body) with `workers` threads, then `after(path, body)`; returns seconds."""
    started = time.perf_counter()
    done = 0
    lock = threading.Lock()

    def send(job: tuple[str, dict[str, Any]]) -> None:
        nonlocal done
        raw.create(*job)
        if after is not None:
            after(*job)
        with lock:
            done += 1
            if done % 10_000 == 0:
                rate = done / (time.perf_counter() - started)
                print(f"#   {done} of {len(jobs)} {what} ({rate:.0f}/s)", file=sys.stderr, flush=True)

    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(send, jobs))
    return time.perf_counter() - started


def _all_ready(raw: Raw, count: int) -> bool:
    status, data = raw.call("GET", "/api/v1/nodes?limit=0")
    items = json.loads(data).get("items") or ()
    ready = sum(
        1
        for item in items
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in item.get("status", {}).get("conditions", []))
    )
    return status == 200 and ready >= count


def not_running(raw: Raw) -> int:
    """How many benchmark pods are not Running yet (filtered by the apiserver, names only)."""
    query = urllib.parse.urlencode({"labelSelector": "bench=audit", "fieldSelector": "status.phase!=Running"})
    return sum(1 for _ in raw.names(f"/api/v1/pods?{query}"))


# --- bring-up -------------------------------------------------------------------------------------


def with_audit_log(state: controlplane.State) -> dict[str, list[str]]:
    """`controlplane.up`'s prepare hook: the apiserver writes `AUDIT_POLICY`'s events to logs/audit.log."""
    policy = state.directory / "audit-policy.json"
    policy.write_text(json.dumps(AUDIT_POLICY))
    return {
        "kube-apiserver": [
            f"--audit-policy-file={policy}",
            f"--audit-log-path={state.directory / 'logs' / 'audit.log'}",
            "--audit-log-maxsize=0",  # never rotated: the offsets read below stay valid
            "--audit-log-format=json",
        ]
    }


def bring_up(directory: pathlib.Path) -> controlplane.State:
    fake_nodes = nodes.load(None)
    state = controlplane.up(directory, bin_dir=binaries.ensure(), fake_nodes=fake_nodes, prepare=with_audit_log)
    try:
        install.start_labelers(state, fake_nodes)
        controlplane.stop(state, [name for name in state.pids if name.startswith("labeler-")])
        controlplane.kubectl(state, "apply", "-k", str(REPO / "deploy" / "crds"))
        for name in ("policyreports.wgpolicyk8s.io", "clusterpolicyreports.wgpolicyk8s.io"):
            # Polled: right after the create the CRD has no status.conditions yet, and `kubectl
            # wait` fails on that at once instead of waiting.
            def established(name: str = name) -> bool:
                waited = controlplane.kubectl(
                    state, "wait", "--for", "condition=established", f"crd/{name}", "--timeout=5s", check=False
                )
                return waited.returncode == 0

            controlplane.wait_for(established, what=f"CRD {name} established", timeout=60, state=state)
    except BaseException:
        controlplane.stop(state)
        raise
    return state


def fill(state: controlplane.State, args: argparse.Namespace) -> dict[str, float]:
    """Create the nodes, namespaces and pods the cluster lacks, and wait until every pod is Running."""
    raw = Raw(state, connections=args.workers)
    timings: dict[str, float] = {}
    if "kwok" not in state.pids or not state.running().get("kwok"):
        controlplane.start(state, "kwok")
    namespaces = [f"bench-{i:02d}" for i in range(args.namespaces)]
    have_ns = set(raw.names("/api/v1/namespaces"))
    missing_ns = [n for n in namespaces if n not in have_ns]
    if missing_ns:
        create_all(
            raw,
            [("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}) for n in missing_ns],
            workers=4,
            what="namespaces",
        )

        def service_accounts() -> bool:
            return all(raw.call("GET", f"/api/v1/namespaces/{n}/serviceaccounts/default")[0] == 200 for n in missing_ns)

        controlplane.wait_for(service_accounts, what="default ServiceAccounts", timeout=120, state=state)
    # Nothing left for these two (see the module docstring).
    controlplane.stop(state, [name for name in ("kube-scheduler", "kube-controller-manager") if name in state.pids])

    bases = [n.name for n in nodes.load(None)]
    layout = Layout(bases, args.nodes)
    existing_nodes = set(raw.names("/api/v1/nodes"))
    labelled = {name: json.loads(raw.call("GET", f"/api/v1/nodes/{name}")[1]) for name in bases}
    new_nodes = [("/api/v1/nodes", node_copy(labelled[layout.base_of[n]], n)) for n in layout.names if n not in existing_nodes]
    if new_nodes:
        print(f"# creating {len(new_nodes)} nodes", file=sys.stderr, flush=True)
        timings["nodes_create_s"] = create_all(raw, new_nodes, workers=args.workers, what="nodes")

    existing = set(raw.names("/api/v1/pods?" + urllib.parse.urlencode({"labelSelector": "bench=audit"})))
    jobs = []
    for index in range(args.pods):
        # Spread so that every namespace gets every kind of pod (the kinds repeat every 100 pods).
        namespace = namespaces[(index + index // 100) % len(namespaces)]
        body = pod(index, namespace, layout)
        if body["metadata"]["name"] not in existing:
            jobs.append((f"/api/v1/namespaces/{namespace}/pods", body))
    after: Callable[[str, dict[str, Any]], None] | None = None
    if args.mark_running == "self":
        # KWOK only initialises the new nodes; its 5,000 lease renewals would otherwise compete with
        # the creates, and its pod controller marks pods Running at a few dozen a second on 2 cores.
        controlplane.wait_for(lambda: _all_ready(raw, len(layout.names)), what="every node Ready", timeout=600, state=state)
        controlplane.stop(state, ["kwok"])
        now = f"{datetime.datetime.now(datetime.UTC):%Y-%m-%dT%H:%M:%SZ}"

        def after(path: str, body: dict[str, Any]) -> None:
            index = int(body["metadata"]["name"].split("-")[1])
            raw.patch_status(f"{path}/{body['metadata']['name']}", running_status(index, body, now=now))

    if jobs:
        print(f"# creating {len(jobs)} pods ({len(existing)} there already)", file=sys.stderr, flush=True)
        timings["pods_create_s"] = create_all(raw, jobs, workers=args.workers, what="pods", after=after)
        timings["pods_per_s"] = len(jobs) / timings["pods_create_s"]
    if args.mark_running == "self":
        # Pods a KWOK-marked run left Pending (a reused cluster): marked here too.
        query = urllib.parse.urlencode({"labelSelector": "bench=audit", "fieldSelector": "status.phase!=Running"})
        pending = [
            (f"/api/v1/namespaces/{ns}/pods", pod(int(name.split("-")[1]), ns, layout))
            for ns, name in raw.refs(f"/api/v1/pods?{query}")
        ]
        if pending and after is not None:
            print(f"# marking {len(pending)} pending pods Running", file=sys.stderr, flush=True)
            with concurrent.futures.ThreadPoolExecutor(max_workers=args.workers) as threads:
                list(threads.map(lambda job: after(*job), pending))
    started = time.monotonic()
    while (waiting := not_running(raw)) > 0:
        if time.monotonic() - started > 3600:
            raise RuntimeError(f"{waiting} pods still not Running after an hour")
        print(f"#   {waiting} pods not Running yet", file=sys.stderr, flush=True)
        time.sleep(10.0)
    timings["running_wait_s"] = time.monotonic() - started
    controlplane.stop(state, [name for name in ("kwok",) if name in state.pids])
    return timings


# --- measuring the audit --------------------------------------------------------------------------


def audit_events(log: pathlib.Path, offset: int, *, since: float, until: float) -> list[dict[str, Any]]:
    """The audit log's events after `offset` from the python client (the audit) between `since` and `until`."""
    found = []
    with log.open("rb") as stream:
        stream.seek(offset)
        for line in stream:
            event = json.loads(line)
            agent = str(event.get("userAgent", ""))
            if not agent.startswith("OpenAPI-Generator"):
                continue
            stamp = datetime.datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
            if since - 1.0 <= stamp <= until + 1.0:
                found.append(event)
    return found


def run_audit(
    state: controlplane.State, *, scratch: pathlib.Path, label: str, source: pathlib.Path | None = None
) -> dict[str, Any]:
    """One `gpu-admission audit --write-reports` as a subprocess: wall, peak RSS, list calls, writes."""
    log = state.directory / "logs" / "audit.log"
    time.sleep(1.5)  # the previous run's last events are on disk; this run's window starts clean
    offset = log.stat().st_size
    out, err = scratch / f"{label}.out", scratch / f"{label}.err"
    command = [install.executable(), "audit", "--kubeconfig", str(state.kubeconfig), "--write-reports", "--output-file", str(out)]
    since = time.time()
    started = time.perf_counter()
    with err.open("wb") as stderr:
        env = {**os.environ, **({"PYTHONPATH": str(source)} if source else {})}
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
        _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    until = time.time()
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode not in (0, 1):
        raise RuntimeError(f"audit exited {process.returncode}: {err.read_text()[-500:]}")
    time.sleep(1.5)  # the audit log backend writes an event once the response is complete
    events = audit_events(log, offset, since=since, until=until)
    lists = [e for e in events if e.get("verb") == "list"]
    unpaged = [
        e["requestURI"] for e in lists if "limit" not in urllib.parse.parse_qs(urllib.parse.urlsplit(e["requestURI"]).query)
    ]
    writes = [f"{e['verb']} {e['requestURI']}" for e in events if e.get("verb") in WRITE_VERBS]
    reported = re.search(r"reports: (\d+) created, (\d+) replaced, (\d+) deleted, (\d+) unchanged", err.read_text())
    by_resource: dict[str, int] = {}
    for event in lists:
        resource = str((event.get("objectRef") or {}).get("resource", "?"))
        by_resource[resource] = by_resource.get(resource, 0) + 1
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "max_rss_mib": round(usage.ru_maxrss / 1024, 1),  # ru_maxrss is in KiB on Linux
        "exit": process.returncode,
        "list_calls": len(lists),
        "list_calls_by_resource": by_resource,
        "list_calls_without_limit": unpaged,
        "writes": len(writes),
        "write_calls": writes[:10],
        "cli_says": reported.group(0) if reported else None,
        "output_bytes": out.stat().st_size if out.exists() else 0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=8, help="KWOK nodes in all (the 8 default ones and copies of them)")
    parser.add_argument("--namespaces", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=2, help="unchanged audit runs after the first")
    parser.add_argument(
        "--mark-running",
        choices=("self", "kwok"),
        default="self",
        help="who sets the pods Running: this script (the status KWOK's pod-ready stage writes, PATCHed right after "
        "each create, KWOK stopped) or KWOK itself (a few dozen pods a second with 5,000 nodes on 2 cores)",
    )
    parser.add_argument("--workers", type=int, default=16, help="threads creating pods in parallel")
    parser.add_argument("--dir", type=pathlib.Path, help="cluster state directory (default: a temporary one, removed)")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running (needs --dir)")
    parser.add_argument("--reuse", action="store_true", help="use the cluster already running in --dir")
    parser.add_argument(
        "--audit-source",
        type=pathlib.Path,
        metavar="DIR",
        help="run the audit from another source tree (PYTHONPATH=DIR for the audit only): a baseline, e.g. `git archive` of a commit",
    )
    parser.add_argument(
        "--against",
        type=pathlib.Path,
        metavar="DIR",
        help="also run the audit from this baseline tree, in turns with this checkout (or --audit-source) on the same "
        "cluster, and print both with after/before ratios",
    )
    parser.add_argument("--table", action="store_true", help="also the in-process table (holds every pod in this process)")
    args = parser.parse_args()
    if (args.keep or args.reuse) and args.dir is None:
        parser.error("--keep and --reuse need --dir")
    scratch = None
    directory = args.dir
    if directory is None:
        scratch = tempfile.TemporaryDirectory(prefix="gpu-admission-audit-bench-")
        directory = pathlib.Path(scratch.name)
    directory = directory.resolve()
    if args.reuse:
        loaded = controlplane.State.load(directory)
        if loaded is None or not loaded.running().get("kube-apiserver"):
            parser.error(f"no running cluster in {directory}")
        state = loaded
    else:
        print(f"# bringing up a local cluster in {directory}", file=sys.stderr, flush=True)
        state = bring_up(directory)
    try:
        return _bench(state, args)
    finally:
        if not args.keep:
            controlplane.down(directory)
        if scratch is not None:
            scratch.cleanup()


def _bench(state: controlplane.State, args: argparse.Namespace) -> int:
    timings = fill(state, args)
    print(f"# cluster ready: {json.dumps({k: round(v, 1) for k, v in timings.items()})}", file=sys.stderr, flush=True)
    if args.against is not None:
        return _bench_against(state, args, timings)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = pathlib.Path(scratch_dir)
        first = run_audit(state, scratch=scratch, label="first", source=args.audit_source)
        print(f"# first run: {json.dumps(first)}", file=sys.stderr, flush=True)
        again = []
        for index in range(args.repeat):
            again.append(run_audit(state, scratch=scratch, label=f"again-{index}", source=args.audit_source))
            print(f"# unchanged run {index + 1}: {json.dumps(again[-1])}", file=sys.stderr, flush=True)
    load_after = os.getloadavg()
    if args.table:
        in_process_table(state, args)
    runs = [first, *again]
    headline = {
        "when": f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
        "pods": args.pods,
        "audit_source": str(args.audit_source or "this checkout"),
        **_machine(args, load_before, load_after),
        "first_wall_s": first["wall_s"],
        "first_max_rss_mib": first["max_rss_mib"],
        "first_writes": first["writes"],
        "unchanged_wall_s": statistics.median(r["wall_s"] for r in again) if again else None,
        "unchanged_cpu_s": statistics.median(r["cpu_s"] for r in again) if again else None,
        "max_rss_mib": max(r["max_rss_mib"] for r in runs),
        "list_calls": first["list_calls"],
        "list_calls_without_limit": sorted({uri for r in runs for uri in r["list_calls_without_limit"]}),
        "unchanged_writes": [r["writes"] for r in again],
        "goal_wall_under_30s": all(r["wall_s"] < 30 for r in runs),
        "goal_rss_under_1gib": all(r["max_rss_mib"] < 1024 for r in runs),
        "goal_every_list_paged": not any(r["list_calls_without_limit"] for r in runs),
        "goal_unchanged_writes_nothing": all(r["writes"] == 0 for r in again),
        **{k: round(v, 1) for k, v in timings.items()},
    }
    print(json.dumps(headline))
    print("# no record: a record needs the reference of the same run (--against DIR)", flush=True)
    return 0


def _machine(args: argparse.Namespace, load_before: tuple[float, ...], load_after: tuple[float, ...]) -> dict[str, Any]:
    return {
        "nodes": args.nodes,
        "namespaces": args.namespaces,
        "nproc": os.cpu_count(),
        "cpu_model": records.cpu_model(),
        "python": platform.python_version(),
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in load_after],
    }


def _bench_against(state: controlplane.State, args: argparse.Namespace, timings: dict[str, float]) -> int:
    """`--against DIR`: the baseline tree and this checkout (or `--audit-source`) in turns on one cluster.

    Round 0 runs the baseline first: it writes the reports (unless a previous run left them); every
    later run, this checkout's first included, finds them as its own output would be and must write
    nothing, which holds the two trees' reports equal. Each tree's table output is compared too.
    """
    sources = {"before": args.against, "after": args.audit_source}
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in sources}
    outputs: dict[str, list[bytes]] = {label: [] for label in sources}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = pathlib.Path(scratch_dir)
        for index in range(1 + args.repeat):
            for label, source in sources.items():
                found = run_audit(state, scratch=scratch, label=f"{label}-{index}", source=source)
                runs[label].append(found)
                outputs[label].append((scratch / f"{label}-{index}.out").read_bytes())
                print(f"# {label} run {index}: {json.dumps(found)}", file=sys.stderr, flush=True)
    load_after = os.getloadavg()

    def figures(label: str) -> dict[str, Any]:
        mine = runs[label]
        return {
            "wall_s": [r["wall_s"] for r in mine],
            "cpu_s": [r["cpu_s"] for r in mine],
            "median_wall_s": statistics.median(r["wall_s"] for r in mine),
            "median_cpu_s": statistics.median(r["cpu_s"] for r in mine),
            "max_rss_mib": max(r["max_rss_mib"] for r in mine),
            "list_calls": mine[0]["list_calls"],
            "list_calls_by_resource": mine[0]["list_calls_by_resource"],
            "list_calls_without_limit": sorted({uri for r in mine for uri in r["list_calls_without_limit"]}),
            "writes": [r["writes"] for r in mine],
        }

    before, after = figures("before"), figures("after")
    later = [r for label in sources for r in runs[label]][1:]  # every run but the very first
    headline = {
        "when": f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
        "pods": args.pods,
        "before_source": str(args.against),
        "after_source": str(args.audit_source or "this checkout"),
        **_machine(args, load_before, load_after),
        "before": before,
        "after": after,
        "wall_ratio": round(after["median_wall_s"] / before["median_wall_s"], 3),
        "cpu_ratio": round(after["median_cpu_s"] / before["median_cpu_s"], 3),
        "rss_ratio": round(after["max_rss_mib"] / before["max_rss_mib"], 3),
        "table_output_identical": all(o == outputs["before"][0] for label in sources for o in outputs[label]),
        "after_max_wall_s": max(after["wall_s"]),
        "goal_wall_under_30s": all(w < 30 for w in after["wall_s"]),
        "goal_rss_under_1gib": after["max_rss_mib"] < 1024,
        "goal_every_list_paged": not after["list_calls_without_limit"],
        "goal_unchanged_writes_nothing": all(r["writes"] == 0 for r in later),
        **{k: round(v, 1) for k, v in timings.items()},
    }
    print(json.dumps(headline))
    records.write(
        bench="audit_throughput",
        inputs=vars(args),
        figures=after,
        reference={"name": str(args.against), "figures": before},
        headline=records.Headline(figure="median_cpu_s", label="audit CPU on the KWOK cluster", unit="s", better="lower"),
    )
    return 0


# --- the older in-process table (--table) ---------------------------------------------------------

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


def in_process_table(state: controlplane.State, args: argparse.Namespace) -> None:
    """The in-process steps, each `--repeat` times (median), as a markdown table on stdout."""
    repeat = max(args.repeat, 1)
    api = kube.api_client(str(state.kubeconfig))
    settings = settings_.Settings()
    cpu: Cpu = {}
    reference, _ = timed(lambda: controlplane.kubectl(state, "get", "pods", "-A", "-o", "json"), repeat=repeat)
    listing, inventory = timed(lambda: kube.inventory(api), repeat=repeat, cpu=cpu, label="list")
    auditing, audit = timed(
        lambda: sweep.audit_cluster(api, settings=settings, namespace=None, now=time.time()),
        repeat=repeat,
        cpu=cpu,
        label="audit",
    )
    unchanged_write, (_, second) = timed(
        lambda: sweep.write_reports(api, audit, all_results=False, now=time.time()), repeat=repeat, cpu=cpu, label="unchanged"
    )
    with tempfile.TemporaryDirectory() as scratch:
        snapshot = pathlib.Path(scratch) / "snapshot.json"
        objects = [*inventory.nodes, *inventory.workloads, *inventory.pods]
        snapshot.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
        size_mb = snapshot.stat().st_size / 1e6

        def offline() -> scan.Audit:
            documents = manifests.read([str(snapshot)], stdin=io.StringIO())
            return scan.run(scan.Inventory.of(d.object for d in documents), settings=settings, now=time.time())

        offline_s, offline_audit = timed(offline, repeat=repeat, cpu=cpu, label="offline")
    judging, _ = timed(lambda: scan.run(inventory, settings=settings, now=time.time()), repeat=repeat, cpu=cpu, label="judge")
    objects_n = audit.objects
    failing = sum(1 for f in audit.findings if f.result.value != "pass")
    rows = [
        ("reference: kubectl get pods -A -o json", reference, None, len(inventory.pods)),
        ("list (paged, raw JSON)", listing, cpu["list"], len(inventory.pods) + len(inventory.workloads) + len(inventory.nodes)),
        ("audit: list + judge", auditing, cpu["audit"], objects_n),
        ("judge only (in memory)", judging, cpu["judge"], objects_n),
        (f"offline -f: parse {size_mb:.0f} MB JSON + judge", offline_s, cpu["offline"], offline_audit.objects),
        (f"write reports, unchanged ({second.writes} writes)", unchanged_write, cpu["unchanged"], objects_n),
    ]
    print(
        f"\n{args.pods} pods, {len(inventory.nodes)} nodes: {objects_n} objects audited, {len(audit.findings)} results, {failing} not pass.\n"
    )
    print("| step | wall s | objects/s (wall) | CPU s (this process) | objects/s (CPU) |")
    print("|---|---:|---:|---:|---:|")
    for label, seconds, used, count in rows:
        cpu_cells = f"{used:.2f} | {count / used:,.0f}" if used else "- | -"
        print(f"| {label} | {seconds:.2f} | {count / seconds:,.0f} | {cpu_cells} |")


if __name__ == "__main__":
    sys.exit(main())
