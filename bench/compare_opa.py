"""The webhook against a reference engine, OPA, in one run: same TLS, same load, same reviews.

OPA (``github.com/open-policy-agent/opa``, built with ``go install`` into
``~/.cache/gpu-admission/bench/opa-<version>/``) serves ``bench/opa/policy.rego`` (GPU001, GPU002
and GPU004 in Rego) as a validating webhook: ``POST /`` answers with ``data.system.main``, an
AdmissionReview. gpu-admission serves ``POST /validate``. Both get the same serving certificate and
the same two review bodies (a small GPU pod and a large pod of about 50 KB), driven by the same Go
load generator (``bench/loadgen``), interleaved server by server so that background load on a
shared machine hits both alike.

Per server and body: throughput at saturation (closed loop, ``--connections`` in flight), p50/p99
at fixed open-loop arrival rates (default 500, 1,000, 2,000 /s; achieved rate and errors shown),
CPU seconds per 1,000 requests (utime + stime from ``/proc``, the saturation window) and memory
(RSS and PSS, idle after start and the peak under load). Then the ratio ours / OPA of each.

On a shared machine the load average says little (it counts waiting, not working); each figure
comes with the cores the server used and the cores everything else used meanwhile ("others":
the machine's busy time from ``/proc/stat`` less the server's and the load generator's). CPU per
request is the figure least moved by neighbours; throughput at saturation is whatever share of
the cores the server got.

Before any load, every server answers a set of probe reviews (allowed and denied for each of the
three rules); the verdicts and the policy IDs named must agree, or the run stops.

Servers: ``ours`` (``--workers 2``), ``ours<N>`` (N workers; ``ours1`` is one process), a ``3p``
suffix for the three rules only, an ``nc`` suffix for the decision cache off
(``serve --decision-cache-entries 0``: every review evaluated, the cost of a first-seen pod;
the load repeats one body, so with the cache on every review after the first is a hit, the cost of
a replica of a template already seen: ``bench/replica_stream.py`` says how often that happens),
and ``opa``. ``--against REF`` also starts every ``ours*`` server from a git worktree of REF (shown as
``<name>@REF``), measured in the same interleaved order: before and after in one run (``nc`` ones
too, unless ``--no-against-nc``: a REF from before the decision cache has no such server).
``--rounds N`` repeats everything N times, server order alternating, and reports medians.

Memory is PSS summed over the server's whole process tree (``/proc/PID/smaps_rollup``): for
``--workers N`` the supervisor and every worker, pages they share counted once in all.

The last line of the output is one JSON object with the headline ratios (ours / OPA, per server
and body: saturation, CPU per review, p99 at each rate, PSS idle and peak).

    .venv/bin/python bench/compare_opa.py                      # defaults: ours --workers 2, OPA
    .venv/bin/python bench/compare_opa.py --servers ours1,ours,opa --duration 5
    .venv/bin/python bench/compare_opa.py --servers ours,oursnc,ours1,opa --against 4c49163 --rounds 3
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import re
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import loadgen  # noqa: E402 - bench/ is not a package; its helpers sit beside the scripts
import records  # noqa: E402 - bench/ is on sys.path (scripts run as bench/<name>.py); one record per run

from webhook.certificates import certfiles  # noqa: E402 - after the path set-up above
from webhook.cluster import controlplane  # noqa: E402 - same

OPA_VERSION = "v1.22.3"
OPA_MODULE = "github.com/open-policy-agent/opa"
POLICY = loadgen.HERE.parent / "opa" / "policy.rego"
RATES = (500.0, 1000.0, 2000.0)
THREE = {"GPU001", "GPU002", "GPU004"}


def opa_binary(version: str = OPA_VERSION) -> pathlib.Path:
    """OPA built from the Go module proxy into the cache (``go install``; the module has no replace
    directives, so no tools module is needed)."""
    directory = loadgen.CACHE / f"opa-{version}"
    target = directory / "opa"
    if target.exists():
        return target
    if shutil.which("go") is None:
        raise SystemExit("building OPA needs a Go toolchain")
    directory.mkdir(parents=True, exist_ok=True)
    print(f"building {OPA_MODULE}@{version} into {directory} (a few minutes) ...", file=sys.stderr)
    subprocess.run(["go", "install", f"{OPA_MODULE}@{version}"], check=True, env={**os.environ, "GOBIN": str(directory)})
    return target


# --- the review bodies ----------------------------------------------------------------------------------


def review(
    obj: dict[str, Any], *, namespace: str = "ml-team", uid: str = "5f1c3a62-0d4e-4b8a-9e2f-bench00000001"
) -> dict[str, Any]:
    kind = obj["kind"]
    group, _, version = obj["apiVersion"].rpartition("/")
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": kind.lower() + "s"},
            "name": obj["metadata"].get("name", ""),
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "bench", "groups": ["system:authenticated"]},
            "object": obj,
            "oldObject": None,
            "dryRun": False,
        },
    }


def small_pod() -> dict[str, Any]:
    """One container asking for 3 GiB of a shared card: every rule looks, none objects."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "cgpu-small", "namespace": "ml-team", "labels": {"app": "cgpu-small"}},
        "spec": {
            "containers": [
                {
                    "name": "train",
                    "image": "registry.example/ml/train:1.0",
                    "command": ["python", "train.py"],
                    "env": [{"name": "EPOCHS", "value": "10"}],
                    "resources": {"limits": {"aliyun.com/gpu-mem": 3}},
                }
            ]
        },
    }


def large_pod() -> dict[str, Any]:
    """About 50 KB: eight containers (one with a GPU), many env entries, volumes and managedFields,
    the shape a big operator-made pod has. Every rule walks all of it; none objects."""
    containers = []
    for index in range(8):
        container: dict[str, Any] = {
            "name": f"worker-{index}",
            "image": f"registry.example/platform/worker-{index}:2024.11.3",
            "args": [f"--shard={index}", "--log-format=json", "--metrics-addr=:9090"],
            "env": [{"name": f"CONFIG_SETTING_{n:03d}", "value": f"value-{index}-{n}-" + "x" * 24} for n in range(60)]
            + [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
            "envFrom": [{"configMapRef": {"name": f"worker-{index}-settings"}, "prefix": "APP_"}],
            "ports": [{"name": "metrics", "containerPort": 9090, "protocol": "TCP"}],
            "resources": {"limits": {"cpu": "2", "memory": "4Gi"}, "requests": {"cpu": "1", "memory": "2Gi"}},
            "volumeMounts": [{"name": f"data-{index}", "mountPath": f"/data/{index}"}],
            "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False},
        }
        containers.append(container)
    containers[0]["resources"]["limits"]["aliyun.com/gpu-mem"] = 8
    managed = [
        {
            "manager": f"operator-{n}",
            "operation": "Update",
            "apiVersion": "v1",
            "time": "2024-11-03T10:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:labels": {f"f:label-{k}": {} for k in range(20)}}},
        }
        for n in range(12)
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "platform-large",
            "namespace": "ml-team",
            "labels": {f"label-{k}": f"value-{k}" for k in range(20)},
            "annotations": {f"example.com/note-{k}": "n" * 60 for k in range(10)},
            "managedFields": managed,
        },
        "spec": {
            "containers": containers,
            "volumes": [{"name": f"data-{index}", "emptyDir": {}} for index in range(8)],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
    }


def as_mutated(obj: dict[str, Any], *, namespace: str = "ml-team") -> dict[str, Any]:
    """``obj`` with the mutating webhook's patch applied under the default settings, as kube-apiserver
    stores it and sends it on to the validating webhooks."""
    from policies import patching, settings
    from webhook.admission import decisions

    decision = decisions.decide(obj, settings=settings.from_mapping({}), namespace=namespace, operation="CREATE")
    mutated: dict[str, Any] = json.loads(json.dumps(obj))
    patching.apply(mutated, decision.patch)
    return mutated


def probes() -> list[tuple[str, dict[str, Any], bool, set[str]]]:
    """(name, review, allowed, policy IDs denying) pairs every server must answer alike."""

    def pod(**container: Any) -> dict[str, Any]:
        obj = small_pod()
        obj["spec"]["containers"][0].update(container)
        return obj

    gpu = {"limits": {"aliyun.com/gpu-mem": 3}}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "dep", "namespace": "ml-team"},
        "spec": {
            "template": {
                "metadata": {"labels": {"app": "x"}},
                "spec": pod(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])["spec"],
            }
        },
    }
    # What /validate sees of a privileged CPU pod: the pod after /mutate, GPU103's keep-off affinity
    # included (the validating webhook judges the pod as stored and credits no mutation of its own).
    kept_off = as_mutated(pod(resources={}, securityContext={"privileged": True}))
    on_gpu_nodes = pod(resources={}, securityContext={"privileged": True})
    on_gpu_nodes["spec"]["nodeSelector"] = {"aliyun.accelerator/nvidia_name": "Tesla-V100-SXM2-32GB"}
    return [
        ("small allowed", review(small_pod()), True, set()),
        ("large allowed", review(large_pod()), True, set()),
        ("GPU001 value", review(pod(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])), False, {"GPU001"}),
        ("GPU001 void", review(pod(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": " VOID "}])), True, set()),
        (
            "GPU001 valueFrom",
            review(pod(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}])),
            False,
            {"GPU001"},
        ),
        ("GPU001 envFrom warns", review(pod(envFrom=[{"configMapRef": {"name": "cm"}}])), True, set()),
        ("GPU002 privileged GPU pod", review(pod(securityContext={"privileged": True})), False, {"GPU002"}),
        ("GPU002 privileged on GPU nodes", review(on_gpu_nodes), False, {"GPU002"}),
        ("GPU002 privileged, no GPU, kept off GPU nodes", review(kept_off), True, set()),
        ("GPU004 requests only", review(pod(resources={"requests": {"aliyun.com/gpu-mem": 3}})), False, {"GPU004"}),
        ("GPU004 zero", review(pod(resources={"limits": {"nvidia.com/gpu": "0"}})), False, {"GPU004"}),
        ("GPU004 fraction", review(pod(resources={"limits": {"nvidia.com/gpu": 1.5}})), False, {"GPU004"}),
        (
            "GPU004 unequal",
            review(pod(resources={"limits": {"aliyun.com/gpu-mem": 3}, "requests": {"aliyun.com/gpu-mem": 2}})),
            False,
            {"GPU004"},
        ),
        (
            "GPU004 core > 100",
            review(pod(resources={"limits": {"aliyun.com/gpu-mem": 3, "aliyun.com/gpu-core.percentage": 150}})),
            False,
            {"GPU004"},
        ),
        ("GPU004 core alone", review(pod(resources={"limits": {"aliyun.com/gpu-core.percentage": 50}})), False, {"GPU004"}),
        ("GPU004 mixed", review(pod(resources={"limits": {"aliyun.com/gpu-mem": 3, "nvidia.com/gpu": 1}})), False, {"GPU004"}),
        (
            "exempt namespace",
            review(pod(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]), namespace="kube-system"),
            True,
            set(),
        ),
        ("Deployment template", review(deployment), False, {"GPU001"}),
        (
            "all three",
            review(
                pod(
                    env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}],
                    securityContext={"privileged": True},
                    resources={"limits": {"nvidia.com/gpu": 0}},
                )
            ),
            False,
            {"GPU001", "GPU002", "GPU004"},
        ),
        ("ok", review(pod(resources=gpu)), True, set()),
    ]


# --- servers --------------------------------------------------------------------------------------------


def three_policies_config(path: pathlib.Path) -> pathlib.Path:
    """Settings with only GPU001, GPU002 and GPU004 on: the same work the Rego does."""
    from policies import engine

    lines = ["policies:"] + [f"  {p.id}: {{action: {'enforce' if p.id in THREE else 'off'}}}" for p in engine.POLICIES]
    path.write_text("\n".join(lines) + "\n")
    return path


def start(
    name: str, scratch: pathlib.Path, *, opa: pathlib.Path | None, trees: dict[str, pathlib.Path] | None = None
) -> tuple[loadgen.Server, str]:
    """Start one server; ``ours`` (``--workers`` from the name: ``ours1``, ``ours2``; ``ours3p`` = three
    policies only; ``oursnc`` = no decision cache; ``<name>@REF`` = from the worktree ``trees[REF]``)
    or ``opa``. Returns the server and the URL reviews go to."""
    # The pair sits in a directory of its own: OPA watches the certificate's directory and reloads
    # its TLS configuration on every change there, so logs written beside the pair (its own
    # included) would keep it reloading, and burning a core, for ever.
    tls_dir = scratch / "tls"
    cert, key = tls_dir / "tls.crt", tls_dir / "tls.key"
    if name == "opa":
        assert opa is not None
        # OPA logs the address it was given, not the one bound, so port 0 cannot be used; a port
        # the kernel just handed out is free in practice.
        port = controlplane.free_port()
        argv = [
            str(opa),
            "run",
            "--server",
            "--addr",
            f"127.0.0.1:{port}",
            "--tls-cert-file",
            str(cert),
            "--tls-private-key-file",
            str(key),
            "--disable-telemetry",
            str(POLICY),
        ]
        server = loadgen.Server(argv, log=scratch / f"{name}.log")
        server.wait_for_line("Initializing server.")
        loadgen.wait_ready(f"https://127.0.0.1:{port}/health", ca=tls_dir / "ca.crt", server=server)
        url = f"https://127.0.0.1:{port}/"
    else:
        match = re.fullmatch(r"ours(\d*)(3p)?(nc)?(?:@(.+))?", name)
        if match is None:
            raise SystemExit(f"unknown server {name!r}: ours, ours<N>, ours<N>3p, ours<N>nc or opa")
        workers = int(match.group(1) or 2)
        tree = (trees or {})[match.group(4)] if match.group(4) else loadgen.REPO
        env: dict[str, str] = {}
        argv = [
            sys.executable,
            "-m",
            "webhook.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--tls-cert-file",
            str(cert),
            "--tls-private-key-file",
            str(key),
        ]
        if workers != 1:
            argv += ["--workers", str(workers)]
        if match.group(3):
            argv += ["--decision-cache-entries", "0"]
        if match.group(2):
            argv += ["--config", str(three_policies_config(scratch / "three.yaml"))]
        server = loadgen.Server(argv, log=scratch / f"{name.replace('/', '_')}.log", env=env, cwd=tree)
        line = server.wait_for_line("listening on https://")
        port = int(line.rsplit(":", 1)[1])
        loadgen.wait_ready(f"https://127.0.0.1:{port}/readyz", ca=tls_dir / "ca.crt", server=server)
        url = f"https://127.0.0.1:{port}/validate"
    return server, url


def post(url: str, body: bytes, context: ssl.SSLContext) -> dict[str, Any]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, context=context, timeout=10) as answer:
        result: dict[str, Any] = json.loads(answer.read())
        return result


def check_agreement(urls: dict[str, str], context: ssl.SSLContext) -> list[str]:
    """Each server's verdict and denying policy IDs on every probe; the differences as lines."""
    problems = []
    for label, body, allowed, denying in probes():
        for name, url in urls.items():
            answer = post(url, json.dumps(body).encode(), context)["response"]
            ids = set(re.findall(r"GPU\d{3}", answer.get("status", {}).get("message", ""))) & THREE
            if answer["allowed"] is not allowed or (not allowed and ids != denying):
                problems.append(
                    f"{label}: {name} answered allowed={answer['allowed']} naming {sorted(ids)}; expected allowed={allowed} {sorted(denying)}"
                )
            if answer.get("uid") != body["request"]["uid"]:
                problems.append(f"{label}: {name} did not echo the uid")
    return problems


# --- measuring ------------------------------------------------------------------------------------------


def measure(
    servers: dict[str, tuple[loadgen.Server, str]],
    bodies: dict[str, pathlib.Path],
    *,
    ca: pathlib.Path,
    args: argparse.Namespace,
) -> dict[str, dict[str, dict[str, Any]]]:
    """figures[body][server] = {idle_rss, saturation, rates: {rate: result}, cpu_per_1k, rss_peak}.

    Servers are measured in the order of ``servers``; the caller alternates it between rounds."""
    figures: dict[str, dict[str, dict[str, Any]]] = {}
    for body_name, body in bodies.items():
        figures[body_name] = {
            name: {
                "idle_rss": loadgen.rss_bytes(server.pid),
                "idle_pss": loadgen.pss_bytes(server.pid),
                "pss_peak": 0,
                "rates": {},
            }
            for name, (server, _) in servers.items()
        }
        for _, url in servers.values():  # warm-up: caches, allocator, connections
            loadgen.run(url=url, body=body, ca=ca, seconds=args.warmup, connections=args.connections)
        for name, (server, url) in servers.items():
            with loadgen.Meter(server.pid) as meter:
                result = loadgen.run(url=url, body=body, ca=ca, seconds=args.duration, connections=args.connections)
            entry = figures[body_name][name]
            entry["saturation"] = result
            entry["cpu_s"] = meter.cpu_s
            entry["cpu_per_1k"] = meter.cpu_s / max(result["ok"], 1) * 1000
            entry["rss_peak"] = meter.rss_peak
            entry["pss_peak"] = max(entry["pss_peak"], meter.pss_peak)
            entry["others_cores"] = meter.others_cores(client_cpu_s=result["client_cpu_s"])
            entry["server_cores"] = meter.cpu_s / meter.wall_s
            print(
                f"  {body_name:<5} {name:<7} saturation {result['achieved_rate']:8.0f}/s  p50 {result['p50_ms']:7.2f} ms  "
                f"p99 {result['p99_ms']:7.2f} ms  errors {result['errors']}  cpu/1k {entry['cpu_per_1k']:.3f} s  "
                f"server {entry['server_cores']:.2f} cores, client {result['client_cpu_s'] / meter.wall_s:.2f}, "
                f"others {entry['others_cores']:.2f}",
                file=sys.stderr,
            )
        for rate in args.rates:
            for name, (server, url) in servers.items():
                with loadgen.Meter(server.pid) as meter:
                    result = loadgen.run(
                        url=url, body=body, ca=ca, seconds=args.duration, rate=rate, connections=args.open_connections
                    )
                result["cpu_per_1k"] = meter.cpu_s / max(result["ok"], 1) * 1000
                result["others_cores"] = meter.others_cores(client_cpu_s=result["client_cpu_s"])
                entry = figures[body_name][name]
                entry["rates"][rate] = result
                entry["rss_peak"] = max(entry["rss_peak"], meter.rss_peak)
                entry["pss_peak"] = max(entry["pss_peak"], meter.pss_peak)
                print(
                    f"  {body_name:<5} {name:<7} {rate:6.0f}/s -> {result['achieved_rate']:7.0f}/s  p50 {result['p50_ms']:7.2f} ms  "
                    f"p99 {result['p99_ms']:8.2f} ms  errors {result['errors']}  late {result['late']}  "
                    f"others {result['others_cores']:.2f} cores",
                    file=sys.stderr,
                )
    return figures


def merge(rounds: list[dict[str, dict[str, dict[str, Any]]]]) -> dict[str, dict[str, dict[str, Any]]]:
    """One figure per number: the median over the rounds (idle memory: the first round's, the only
    one taken before any load)."""

    def median(values: list[Any], key: str = "") -> Any:
        first = values[0]
        if key.startswith("idle_"):
            return first
        if isinstance(first, dict):
            return {k: median([v[k] for v in values], str(k)) for k in first}
        if isinstance(first, (int, float)) and not isinstance(first, bool):
            return statistics.median(values)
        return first

    merged: dict[str, dict[str, dict[str, Any]]] = median(rounds)
    return merged


def headline(figures: dict[str, dict[str, dict[str, Any]]], *, rates: list[float]) -> dict[str, Any]:
    """ours / OPA per body and server: what the last output line carries."""
    ratios: dict[str, Any] = {}
    for body_name, per_server in figures.items():
        opa = per_server.get("opa")
        if opa is None:
            continue
        for name, f in per_server.items():
            if name == "opa":
                continue
            entry = {
                "saturation": round(f["saturation"]["achieved_rate"] / opa["saturation"]["achieved_rate"], 3),
                "cpu_per_review": round(f["cpu_per_1k"] / opa["cpu_per_1k"], 3),
                "pss_idle": round(f["idle_pss"] / max(opa["idle_pss"], 1), 3),
                "pss_peak": round(f["pss_peak"] / max(opa["pss_peak"], 1), 3),
            }
            for rate in rates:
                entry[f"p99@{rate:.0f}"] = round(f["rates"][rate]["p99_ms"] / max(opa["rates"][rate]["p99_ms"], 1e-3), 3)
            ratios.setdefault(body_name, {})[name] = entry
    return ratios


def _first_ours(figures: dict[str, dict[str, dict[str, Any]]]) -> tuple[str, str]:
    """The record's headline: the first body and the first of our servers measured beside OPA."""
    for body_name, per_server in figures.items():
        if "opa" in per_server:
            for name in per_server:
                if name != "opa":
                    return body_name, name
    raise SystemExit("compare_opa: the record needs OPA and one of our servers (--servers ours,opa)")


def _mib(value: int) -> str:
    return f"{value / 2**20:.0f}"


def render(
    figures: dict[str, dict[str, dict[str, Any]]],
    *,
    sizes: dict[str, int],
    args: argparse.Namespace,
    before: dict[str, Any],
    after_load: float,
) -> str:
    names = list(next(iter(figures.values())))
    rates = list(args.rates)
    lines = [
        f"Machine: {before['cpu']} x{before['nproc']}, Python {before['python']}, OPA {OPA_VERSION}; "
        f"{before['date']}; load average {before['loadavg']:.1f} → {after_load:.1f}.",
        f"Command: `.venv/bin/python bench/compare_opa.py --servers {args.servers} --duration {args.duration:g} "
        f"--connections {args.connections}"
        + (f" --rounds {args.rounds}" if args.rounds > 1 else "")
        + (f" --against {args.against}" if args.against else "")
        + ("" if args.against_nc else " --no-against-nc")
        + "`"
        + (f"; medians of {args.rounds} rounds" if args.rounds > 1 else ""),
        "",
    ]
    header = (
        "| body | server | saturation req/s (p99 ms) [server / others' cores] | "
        + " | ".join(f"@{r:.0f}/s: achieved, p50, p99 ms, errors [others' cores]" for r in rates)
        + " | CPU s / 1k req | RSS idle / peak MiB | PSS idle / peak MiB |"
    )
    for body_name, per_server in figures.items():
        size = sizes[body_name]
        lines += [f"**{body_name} pod** ({size:,} bytes)", "", header, "|---|---|" + "---:|" * (len(rates) + 4)]
        for name in names:
            f = per_server[name]
            sat = f["saturation"]
            cells = [f"{sat['achieved_rate']:.0f} ({sat['p99_ms']:.1f}) [{f['server_cores']:.1f} / {f['others_cores']:.1f}]"]
            for rate in rates:
                r = f["rates"][rate]
                errs = r["errors"] + r["late"]
                cells.append(f"{r['achieved_rate']:.0f}, {r['p50_ms']:.2f}, {r['p99_ms']:.1f}, {errs} [{r['others_cores']:.1f}]")
            cells += [
                f"{f['cpu_per_1k']:.3f}",
                f"{_mib(f['idle_rss'])} / {_mib(f['rss_peak'])}",
                f"{_mib(f['idle_pss'])} / {_mib(f['pss_peak'])}",
            ]
            lines.append(f"| {body_name} | {name} | " + " | ".join(cells) + " |")
        if "opa" in per_server:
            opa = per_server["opa"]
            for name in names:
                if name == "opa":
                    continue
                f = per_server[name]
                cells = [f"{f['saturation']['achieved_rate'] / opa['saturation']['achieved_rate']:.2f}× (higher is better)"]
                for rate in rates:
                    a, b = f["rates"][rate], opa["rates"][rate]
                    cells.append(
                        f"p50 {a['p50_ms'] / max(b['p50_ms'], 1e-3):.2f}×, p99 {a['p99_ms'] / max(b['p99_ms'], 1e-3):.2f}×"
                    )
                cells += [
                    f"{f['cpu_per_1k'] / opa['cpu_per_1k']:.2f}×",
                    f"{f['idle_rss'] / opa['idle_rss']:.2f}× / {f['rss_peak'] / opa['rss_peak']:.2f}×",
                    f"{f['idle_pss'] / opa['idle_pss']:.2f}× / {f['pss_peak'] / max(opa['pss_peak'], 1):.2f}×",
                ]
                lines.append(f"| {body_name} | **{name} / opa** | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--servers",
        default="ours,opa",
        help="comma list: ours (2 workers), ours<N> (N workers), ours<N>3p (three policies only), opa",
    )
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measurement (default 10)")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of load before measuring each body (default 3)")
    parser.add_argument("--connections", type=int, default=32, help="closed-loop connections for saturation (default 32)")
    parser.add_argument("--open-connections", type=int, default=64, help="connection pool for open-loop rates (default 64)")
    parser.add_argument(
        "--rates", type=lambda s: [float(x) for x in s.split(",")], default=list(RATES), help="open-loop rates, comma list"
    )
    parser.add_argument("--bodies", default="small,large", help="comma list of small, large")
    parser.add_argument("--json", metavar="FILE", help="also write every figure as JSON here")
    parser.add_argument(
        "--rounds", type=int, default=1, help="repeat every measurement, server order alternating; medians (default 1)"
    )
    parser.add_argument(
        "--against", metavar="REF", help="also run every ours* server from a git worktree of REF (named <server>@REF)"
    )
    parser.add_argument(
        "--against-nc",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --against, also run the nc servers from REF (needs a REF with the decision cache; default: on)",
    )
    args = parser.parse_args()
    names = [n.strip() for n in args.servers.split(",") if n.strip()]
    if args.against:
        # An nc twin needs a REF that knows --decision-cache-entries; --against-nc off: no nc twins.
        names = [
            m
            for n in names
            for m in ((n, f"{n}@{args.against}") if n.startswith("ours") and (args.against_nc or not n.endswith("nc")) else (n,))
        ]
    opa = opa_binary() if "opa" in names else None
    loadgen.binary()
    before = loadgen.machine()
    with tempfile.TemporaryDirectory(prefix="gpu-admission-opa-") as tmp:
        scratch = pathlib.Path(tmp)
        certfiles.generate(out_dir=scratch / "tls", hosts=("127.0.0.1",), now=datetime.datetime.now(datetime.UTC))
        ca = scratch / "tls" / "ca.crt"
        bodies = {}
        for body_name, make in (("small", small_pod), ("large", large_pod)):
            if body_name in args.bodies.split(","):
                bodies[body_name] = scratch / f"{body_name}.json"
                bodies[body_name].write_text(json.dumps(review(make()), separators=(",", ":")))
        servers: dict[str, tuple[loadgen.Server, str]] = {}
        trees: dict[str, pathlib.Path] = {}
        try:
            if args.against:
                trees[args.against] = scratch / "against"
                subprocess.run(
                    ["git", "-C", str(loadgen.REPO), "worktree", "add", "--detach", str(trees[args.against]), args.against],
                    check=True,
                    capture_output=True,
                )
            for name in names:
                servers[name] = start(name, scratch, opa=opa, trees=trees)
            context = ssl.create_default_context(cafile=str(ca))
            problems = check_agreement({n: u for n, (_, u) in servers.items()}, context)
            if problems:
                print("the servers disagree:\n  " + "\n  ".join(problems), file=sys.stderr)
                return 1
            print(f"{len(probes())} probe reviews: all servers agree", file=sys.stderr)
            rounds = []
            for index in range(args.rounds):
                order = list(servers.items()) if index % 2 == 0 else list(servers.items())[::-1]
                print(f"round {index + 1} of {args.rounds}: {', '.join(n for n, _ in order)}", file=sys.stderr)
                rounds.append(measure(dict(order), bodies, ca=ca, args=args))
            figures = merge(rounds)
            figures = {body: {name: per_server[name] for name in names} for body, per_server in figures.items()}
        finally:
            for server, _ in servers.values():
                server.stop()
            for tree in trees.values():
                subprocess.run(
                    ["git", "-C", str(loadgen.REPO), "worktree", "remove", "--force", str(tree)], check=False, capture_output=True
                )
        sizes = {name: path.stat().st_size for name, path in bodies.items()}
    if args.json:
        pathlib.Path(args.json).write_text(
            json.dumps({"machine": before, "sizes": sizes, "figures": figures, "rounds": rounds}, indent=2, default=str)
        )
    print(render(figures, sizes=sizes, args=args, before=before, after_load=os.getloadavg()[0]))
    ratios = headline(figures, rates=list(args.rates))
    body, ours_name = _first_ours(figures)
    records.write(
        bench="compare_opa",
        inputs=vars(args),
        figures={
            "cpu_s_per_1k": round(figures[body][ours_name]["cpu_per_1k"], 4),
            "server": ours_name,
            "body": body,
            "figures": figures,
            "ratios_vs_opa": ratios,
        },
        reference={
            "name": "OPA, same run (same TLS, bodies and load generator)",
            "figures": {"cpu_s_per_1k": round(figures[body]["opa"]["cpu_per_1k"], 4)},
        },
        headline=records.Headline(
            figure="cpu_s_per_1k",
            label=f"webhook CPU per 1k reviews ({ours_name}, {body} body) against OPA",
            unit="s",
            better="lower",
        ),
    )
    print(
        json.dumps(
            {
                "ratios_vs_opa": ratios,
                "rounds": args.rounds,
                "against": args.against,
                "loadavg": [round(before["loadavg"], 2), round(os.getloadavg()[0], 2)],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
