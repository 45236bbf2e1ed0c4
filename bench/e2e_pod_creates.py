"""Pod creates per second through a local kube-apiserver, with and without the webhook, and the p99 it adds.

Brings up its own local control plane (``webhook.cluster``: etcd, kube-apiserver, controller
manager, scheduler, KWOK nodes; no gpu-admission), then drives ``POST /api/v1/namespaces/default/pods``
with the Go load generator (admin client certificate, kept-alive HTTP/1.1 connections) for a GPU pod
asking for ``aliyun.com/gpu-mem: 3`` with ``generateName`` (every request a new pod; ``--pods cpu,gpu``
adds an ordinary CPU pod, measured in the same phases, whose validating call the match condition
``pod-create-not-ordinary`` skips). The run ends with one JSON line of headline figures,
``{"gpu_ratio": …, "cpu_ratio": …, …}``: per pod kind the ratio, creates/s with and without, the
webhook calls per create as the apiserver counts them; and the load average.

1. without the webhook: saturation (closed loop, ``--connections``), then open-loop arrivals at
   each ``--rates`` (p50/p99, achieved rate, errors);
2. the webhook installed as ``deploy/`` registers it (mutating + validating, ``failurePolicy:
   Fail``; ``gpu-admission serve`` as a local process, ``--webhook-workers`` of them): the same runs.

3. with ``--map``: GPU104 as the MutatingAdmissionPolicy ``policies export-map`` writes (the cluster
   is started with the MutatingAdmissionPolicy feature gate and ``admissionregistration.k8s.io/v1beta1``),
   the webhook registered as in 2 but its mutating webhook given the ordinary-pod match condition
   too, so that an ordinary pod costs no webhook call at all ("policy" rows; a GPU pod is still
   reviewed twice).

4. with ``--against REF``: the webhook and its registrations as they were at REF (a git worktree of
   REF, its ``gpu-admission serve`` started beside this tree's on the same certificates and settings,
   its ``deploy/`` registrations pointed at it): rows "against", before and after in one run; and
   rows "regs": this tree's webhook with REF's registrations, which tells the registrations' share
   of the difference from the server's.

The phases alternate for ``--rounds`` rounds (the registrations deleted and applied again in between),
so that load from other work on a shared machine falls on both; "added" is the difference of the
rounds' means.

Creates are server-side dry runs (``?dryRun=All``) by default: admission, webhooks included, runs in
full and nothing is stored, so every run starts from the same etcd. ``--real`` stores them instead
(in a namespace of their own, with a ``schedulerName`` no scheduler serves, so nothing schedules
them and the first phase's pods do not slow the second; the namespace is deleted in between).

Also shown: CPU seconds per 1,000 creates of kube-apiserver and of the webhook, and the apiserver's
own view of the webhook (``apiserver_admission_webhook_admission_duration_seconds``, mean per call).

    .venv/bin/python bench/e2e_pod_creates.py
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import re
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import apiserver_probe  # noqa: E402 - bench/ is not a package; its helpers sit beside the scripts
import loadgen  # noqa: E402
import records  # noqa: E402 - bench/ is on sys.path (scripts run as bench/<name>.py); one record per run

from policies import settings as settings_  # noqa: E402
from webhook.cluster import binaries, controlplane, install, nodes  # noqa: E402
from webhook.commands import mutating_policy  # noqa: E402

NAMESPACE = "default"
# --real stores its pods with a scheduler nobody runs; GPU008 refuses extender-managed resources for
# schedulers not listed in extenderSchedulers, so the bench's webhook lists it (the refusal is not
# what this bench measures).
BENCH_SCHEDULER = "gpu-admission-bench-nobody"


POD_KINDS = ("gpu", "cpu")

# --profile: where kube-apiserver's CPU per create goes around the webhooks (cumulative: a row
# includes what it calls, and rows overlap).
ADMISSION_BUCKETS: tuple[tuple[str, str], ...] = (
    ("mutating webhooks (dispatch, both rounds)", r"mutating\.\(\*mutatingDispatcher\)\.Dispatch$"),
    ("  the call (encode, HTTP, decode, patch)", r"mutating\.\(\*mutatingDispatcher\)\.callAttrMutatingHook$"),
    ("validating webhooks (dispatch)", r"validating\.\(\*validatingDispatcher\)\.Dispatch$"),
    ("  the call", r"validating\.\(\*validatingDispatcher\)\.callHook$"),
    ("whether to call (ShouldCallHook)", r"generic\.\(\*Webhook\)\.ShouldCallHook$"),
    ("  match conditions (CEL activation and evaluation)", r"matchconditions\.\(\*matcher\)\.Match$"),
    ("  pod to unstructured for CEL", r"cel\.convertObjectToUnstructured$"),
    ("versioned copy of the pod", r"\.\(\*versionedAttributeAccessor\)\.VersionedAttribute$"),
)


def pod(*, real: bool, kind: str = "gpu") -> dict[str, Any]:
    """The bench's pod: `gpu` asks for aliyun.com/gpu-mem (both webhook calls); `cpu` asks for CPU
    and memory only, an ordinary pod whose validating call the match condition skips."""
    limits: dict[str, Any] = {"aliyun.com/gpu-mem": 3} if kind == "gpu" else {"cpu": "1", "memory": "1Gi"}
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "train",
                "image": "registry.example/ml/train:1.0",
                "env": [{"name": "EPOCHS", "value": "10"}],
                "resources": {"limits": limits},
            }
        ]
    }
    if real:
        spec["schedulerName"] = BENCH_SCHEDULER
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "bench-", "labels": {"app": "bench"}}, "spec": spec}


def webhook_metrics(state: controlplane.State) -> dict[str, tuple[float, float]]:
    """(sum seconds, count) of the apiserver's admission-webhook latency histogram, per webhook name."""
    pki = state.directory / "pki"
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    with urllib.request.urlopen(state.server + "/metrics", context=context, timeout=10) as answer:
        text = answer.read().decode()
    found: dict[str, list[float]] = {}
    for line in text.splitlines():
        match = re.match(r"apiserver_admission_webhook_admission_duration_seconds_(sum|count)\{([^}]*)\} (\S+)", line)
        if match:
            name = re.search(r'name="([^"]+)"', match.group(2))
            key = name.group(1) if name else "?"
            entry = found.setdefault(key, [0.0, 0.0])
            entry[0 if match.group(1) == "sum" else 1] += float(match.group(3))
    return {k: (v[0], v[1]) for k, v in found.items()}


def phase(
    state: controlplane.State,
    body: pathlib.Path,
    *,
    url: str,
    args: argparse.Namespace,
    label: str,
    webhook_name: str = "webhook",
) -> dict[str, Any]:
    pki = state.directory / "pki"
    common = {"url": url, "body": body, "ca": pki / "ca.crt", "client_cert": pki / "admin.crt", "client_key": pki / "admin.key"}
    apiserver = state.pids["kube-apiserver"]
    webhook = state.pids.get(webhook_name)
    loadgen.run(seconds=args.warmup, connections=args.connections, **common)  # type: ignore[arg-type]
    before = webhook_metrics(state)
    with loadgen.Meter(apiserver) as api_meter, loadgen.Meter(webhook or apiserver) as hook_meter:
        saturation = loadgen.run(seconds=args.duration, connections=args.connections, **common)  # type: ignore[arg-type]
    after = webhook_metrics(state)
    calls = {name: (after[name][0] - before.get(name, (0, 0))[0], after[name][1] - before.get(name, (0, 0))[1]) for name in after}
    result: dict[str, Any] = {
        "saturation": saturation,
        "apiserver_cpu_per_1k": api_meter.cpu_s / max(saturation["ok"], 1) * 1000,
        "webhook_cpu_per_1k": hook_meter.cpu_s / max(saturation["ok"], 1) * 1000 if webhook else 0.0,
        "webhook_mean_ms": {name: s / c * 1000 for name, (s, c) in calls.items() if c},
        # The apiserver's count of webhook calls (any webhook, any verdict) during the saturation
        # run, per create it answered: an ordinary pod whose validating call the match condition
        # skips reads 1.0, a GPU pod 2.0.
        "webhook_calls_per_create": sum(c for _, c in calls.values()) / max(saturation["ok"], 1),
        "rates": {},
    }
    print(
        f"  {label:<16} saturation {saturation['achieved_rate']:7.1f}/s p50 {saturation['p50_ms']:7.2f} p99 {saturation['p99_ms']:8.2f} "
        f"errors {saturation['errors']} load {os.getloadavg()[0]:.1f}",
        file=sys.stderr,
        flush=True,
    )
    for index, rate in enumerate(args.rates):
        profile = None
        if args.profile and index == 0:
            path = state.directory / f"profile-{re.sub(r'[^a-z0-9]+', '-', label)}.pprof"
            profile = apiserver_probe.Profile(state, path, seconds=max(int(args.duration) - 2, 1), ready=lambda: True)
        run = loadgen.run(seconds=args.duration, rate=rate, connections=args.connections, **common)  # type: ignore[arg-type]
        result["rates"][rate] = run
        if profile is not None:
            profile.join()
            creates = run["achieved_rate"] * profile.seconds
            sampled = apiserver_probe.profile_cpu_seconds(profile.path)
            result["profile_ms_per_create"] = {
                "sampled": (sampled or 0.0) / creates * 1000,
                **{k: v / creates * 1000 for k, v in apiserver_probe.buckets(profile.path, ADMISSION_BUCKETS).items()},
            }
        print(
            f"  {label:<16} {rate:5.0f}/s -> {run['achieved_rate']:7.1f}/s p50 {run['p50_ms']:7.2f} p99 {run['p99_ms']:8.2f} "
            f"errors {run['errors']} late {run['late']} load {os.getloadavg()[0]:.1f}",
            file=sys.stderr,
            flush=True,
        )
    return result


def start_reference_webhook(state: controlplane.State, tree: pathlib.Path, *, workers: int) -> None:
    """REF's ``gpu-admission serve`` from its worktree (``-m webhook.cli`` with the tree first on the
    path), on the certificates and settings of this tree's webhook, recorded as ``webhook-ref``."""
    certs = state.directory / "webhook"
    port = controlplane.free_port()
    state.ports["webhook-ref"] = port
    command = [
        sys.executable,
        "-m",
        "webhook.cli",
        "serve",
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--tls-cert-file",
        str(certs / "tls.crt"),
        "--tls-private-key-file",
        str(certs / "tls.key"),
        "--kubeconfig",
        str(state.kubeconfig),
        "--config",
        str((state.directory / "bench-config.yaml").resolve()),
    ]
    if workers != 1:
        command += ["--workers", str(workers)]
    controlplane.start(state, "webhook-ref", command=command, env={"PYTHONPATH": str(tree)})
    ca = certs / "ca.crt"
    controlplane.wait_for(
        lambda: _ok(f"https://127.0.0.1:{port}/readyz", ca),
        what="REF's webhook /readyz",
        timeout=60,
        state=state,
        component="webhook-ref",
    )


def start_webhook(state: controlplane.State, *, workers: int) -> None:
    config = state.directory / "bench-config.yaml"
    config.write_text(json.dumps({"extenderSchedulers": ["default-scheduler", BENCH_SCHEDULER]}))
    if workers == 1:
        install.start_webhook(state, config=config)
    else:
        # install.start_webhook's command with --workers; the same certificates and readiness wait.
        certs = state.directory / "webhook"
        install.start_webhook(state, config=config)  # issues the certificates, proves the command works
        controlplane.stop(state, ["webhook"])
        port = state.ports["webhook"]
        command = [
            install.executable(),
            "serve",
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "--workers",
            str(workers),
            "--tls-cert-file",
            str(certs / "tls.crt"),
            "--tls-private-key-file",
            str(certs / "tls.key"),
            "--config",
            str(config.resolve()),
        ]
        controlplane.start(state, "webhook", command=command)
        ca = certs / "ca.crt"
        controlplane.wait_for(
            lambda: _ok(f"https://127.0.0.1:{port}/readyz", ca),
            what="the webhook /readyz",
            timeout=30,
            state=state,
            component="webhook",
        )
    install.register(state)


def apply_policy(state: controlplane.State) -> None:
    """GPU104's MutatingAdmissionPolicy, and the mutating webhook skipping ordinary pods; returns once
    an ordinary pod gets the variable from the policy (the webhook no longer sees it)."""
    exported = mutating_policy.export(settings_.Settings(), now=datetime.datetime.now(datetime.UTC))
    controlplane.kubectl(state, "apply", "-f", "-", stdin=mutating_policy.render(exported.manifests))
    with open(install.deploy_dir() / install.WEBHOOK_CONFIGURATIONS, encoding="utf-8") as stream:
        documents = [d for d in yaml.safe_load_all(stream) if d and d.get("kind") == "MutatingWebhookConfiguration"]
    items = install.local_registrations(
        documents,
        base_url=f"https://127.0.0.1:{state.ports['webhook']}",
        ca_bundle=(state.directory / "webhook" / "ca.crt").read_bytes(),
    )
    items = [mutating_policy.with_webhook_condition(item) for item in items]
    controlplane.kubectl(state, "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "bench-map-probe"},
        "spec": {"containers": [{"name": "p", "image": "p"}]},
    }

    def mutated() -> bool:
        done = controlplane.kubectl(
            state, "create", "--dry-run=server", "-n", NAMESPACE, "-o", "json", "-f", "-", stdin=json.dumps(probe), check=False
        )
        return done.returncode == 0 and json.loads(done.stdout)["spec"]["containers"][0].get("env") == [
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
        ]

    controlplane.wait_for(mutated, what="the MutatingAdmissionPolicy to act", timeout=60)
    time.sleep(2)  # the registration change reaches the apiserver's informer within about a second


def delete_policy(state: controlplane.State) -> None:
    for kind in ("mutatingadmissionpolicybindings", "mutatingadmissionpolicies"):
        controlplane.kubectl(state, "delete", kind, mutating_policy.NAME, "--ignore-not-found")


def unregister(state: controlplane.State) -> None:
    """Delete the webhook configurations of deploy/ and wait until a bypass pod is admitted again."""
    for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        controlplane.kubectl(state, "delete", kind, "-l", "app.kubernetes.io/name=gpu-admission", "--ignore-not-found")
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "bench-probe", "namespace": NAMESPACE},
        "spec": {"containers": [{"name": "p", "image": "p", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]},
    }
    controlplane.wait_for(
        lambda: (
            controlplane.kubectl(state, "create", "--dry-run=server", "-f", "-", stdin=json.dumps(probe), check=False).returncode
            == 0
        ),
        what="the apiserver to stop calling the webhook",
        timeout=60,
    )


def _ok(url: str, ca: pathlib.Path) -> bool:
    with urllib.request.urlopen(url, context=ssl.create_default_context(cafile=str(ca)), timeout=2) as answer:
        return bool(answer.status == 200)


def render(results: dict[str, dict[str, Any]], *, args: argparse.Namespace, machine: dict[str, Any]) -> str:
    mode = "real creates" if args.real else "server-side dry-run creates (`?dryRun=All`)"
    lines = [
        f"Machine: {machine['cpu']} x{machine['nproc']}, Python {machine['python']}; {machine['date']}; "
        f"load average {machine['loadavg']:.1f} → {os.getloadavg()[0]:.1f}; {mode}; webhook workers {args.webhook_workers}.",
        f"Command: `.venv/bin/python bench/e2e_pod_creates.py --duration {args.duration:g} --connections {args.connections}"
        f"{' --real' if args.real else ''} --webhook-workers {args.webhook_workers} --pods {','.join(args.pods)}{' --map' if args.map else ''}"
        f"{' --against ' + args.against if args.against else ''}`",
        "",
        "| | creates/s at saturation (p99 ms) | "
        + " | ".join(f"@{r:.0f}/s: achieved, p50, p99 ms, errors" for r in args.rates)
        + " | apiserver CPU s / 1k | webhook CPU s / 1k | webhook call, mean ms (apiserver's view) |",
        "|---|---:|" + "---:|" * len(args.rates) + "---:|---:|---|",
    ]
    for name in results:
        r = results[name]
        sat = r["saturation"]
        cells = [f"{sat['achieved_rate']:.0f} ({sat['p99_ms']:.1f})"]
        for rate in args.rates:
            run = r["rates"][rate]
            cells.append(f"{run['achieved_rate']:.0f}, {run['p50_ms']:.1f}, {run['p99_ms']:.1f}, {run['errors'] + run['late']}")
        calls = ", ".join(f"{k}: {v:.2f}" for k, v in sorted(r["webhook_mean_ms"].items())) or "—"
        cells += [f"{r['apiserver_cpu_per_1k']:.2f}", f"{r['webhook_cpu_per_1k']:.2f}" if r["webhook_cpu_per_1k"] else "—", calls]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    profiled = [name for name in results if "profile_ms_per_create" in results[name]]
    if profiled:
        lines += [
            "",
            f"kube-apiserver CPU per create at {args.rates[0]:.0f}/s (ms, from its CPU profile; cumulative, rows overlap):",
            "",
        ]
        rows = list(results[profiled[0]]["profile_ms_per_create"])
        lines.append("| | " + " | ".join(profiled) + " |")
        lines.append("|---|" + "---:|" * len(profiled))
        for row in rows:
            lines.append(f"| {row} | " + " | ".join(f"{results[n]['profile_ms_per_create'][row]:.3f}" for n in profiled) + " |")
        lines.append("")

    def mean(kind: str, pick: Callable[[dict[str, Any]], float]) -> float:
        values = [pick(r) for name, r in results.items() if name.startswith(kind + " ")]
        return sum(values) / len(values)

    def added(rate: float, key: str) -> float:
        """What the webhook adds to `key` at `rate`: the mean with it less the mean without."""
        return mean("with", lambda r: r["rates"][rate][key]) - mean("without", lambda r: r["rates"][rate][key])

    cells = [
        f"{mean('with', lambda r: r['saturation']['achieved_rate']) / mean('without', lambda r: r['saturation']['achieved_rate']):.2f}×"
    ]
    for rate in args.rates:
        p50, p99 = added(rate, "p50_ms"), added(rate, "p99_ms")
        cells.append(f"p50 {p50:+.1f} ms, p99 {p99:+.1f} ms")
    cpu = mean("with", lambda r: r["apiserver_cpu_per_1k"]) - mean("without", lambda r: r["apiserver_cpu_per_1k"])
    cells += [f"{cpu:+.2f}", "", ""]
    lines.append(f"| **added by the webhook** (mean of {args.rounds} rounds) | " + " | ".join(cells) + " |")
    if any(name.startswith("policy ") for name in results):
        ratio = mean("policy", lambda r: r["saturation"]["achieved_rate"]) / mean(
            "without", lambda r: r["saturation"]["achieved_rate"]
        )
        versus = mean("policy", lambda r: r["saturation"]["achieved_rate"]) / mean(
            "with", lambda r: r["saturation"]["achieved_rate"]
        )
        lines.append(f"| **policy ÷ without; policy ÷ webhook** | {ratio:.2f}×; {versus:.2f}× |" + " |" * (len(args.rates) + 3))
    for side, what in (("against", f"{args.against}"), ("regs", f"this webhook, {args.against}'s registrations,")):
        if any(name.startswith(side + " ") for name in results):
            ratio = mean(side, lambda r: r["saturation"]["achieved_rate"]) / mean(
                "without", lambda r: r["saturation"]["achieved_rate"]
            )
            cpu = mean(side, lambda r: r["apiserver_cpu_per_1k"]) - mean("without", lambda r: r["apiserver_cpu_per_1k"])
            lines.append(
                f"| **{what} ÷ without; apiserver CPU added** | {ratio:.2f}×; {cpu:+.2f} s / 1k |" + " |" * (len(args.rates) + 3)
            )
    return "\n".join(lines)


def _ratio(results: dict[str, dict[str, Any]], *, side: str = "with", base: str = "without") -> float:
    """Creates/s at saturation of one side ÷ another (with the webhook ÷ without), means over the rounds."""

    def mean(kind: str) -> float:
        values = [float(r["saturation"]["achieved_rate"]) for name, r in results.items() if name.startswith(kind + " ")]
        return sum(values) / len(values)

    return mean(side) / mean(base)


def _headline(kind: str, results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """One pod kind's figures for the closing JSON line: the ratio, both rates, the webhook calls
    per create and the p99 at saturation with the webhook."""

    def mean(side: str, pick: Callable[[dict[str, Any]], float]) -> float:
        values = [pick(r) for name, r in results.items() if name.startswith(side + " ")]
        return sum(values) / len(values)

    figures = {
        f"{kind}_ratio": round(_ratio(results), 3),
        f"{kind}_with_per_s": round(mean("with", lambda r: r["saturation"]["achieved_rate"]), 1),
        f"{kind}_without_per_s": round(mean("without", lambda r: r["saturation"]["achieved_rate"]), 1),
        f"{kind}_webhook_calls_per_create": round(mean("with", lambda r: r.get("webhook_calls_per_create", 0.0)), 2),
        f"{kind}_with_p99_ms": round(mean("with", lambda r: r["saturation"]["p99_ms"]), 1),
    }
    if any(name.startswith("against ") for name in results):
        figures.update(
            {
                f"{kind}_against_ratio": round(_ratio(results, side="against"), 3),
                f"{kind}_against_per_s": round(mean("against", lambda r: r["saturation"]["achieved_rate"]), 1),
                f"{kind}_with_vs_against": round(_ratio(results, side="with", base="against"), 3),
                f"{kind}_apiserver_ms_with": round(mean("with", lambda r: r["apiserver_cpu_per_1k"]), 2),
                f"{kind}_apiserver_ms_against": round(mean("against", lambda r: r["apiserver_cpu_per_1k"]), 2),
                f"{kind}_apiserver_ms_without": round(mean("without", lambda r: r["apiserver_cpu_per_1k"]), 2),
                f"{kind}_regs_ratio": round(_ratio(results, side="regs"), 3),
                f"{kind}_with_vs_regs": round(_ratio(results, side="with", base="regs"), 3),
                f"{kind}_apiserver_ms_regs": round(mean("regs", lambda r: r["apiserver_cpu_per_1k"]), 2),
            }
        )
    for side in ("with", "against", "regs"):
        profiled = [
            r["profile_ms_per_create"]
            for name, r in results.items()
            if name.startswith(side + " ") and "profile_ms_per_create" in r
        ]
        if profiled:
            figures[f"{kind}_apiserver_profile_ms_{side}"] = round(sum(p["sampled"] for p in profiled) / len(profiled), 3)
            figures[f"{kind}_should_call_hook_ms_{side}"] = round(
                sum(p["whether to call (ShouldCallHook)"] for p in profiled) / len(profiled), 3
            )
    if any(name.startswith("policy ") for name in results):
        figures.update(
            {
                f"{kind}_policy_ratio": round(_ratio(results, side="policy"), 3),
                f"{kind}_policy_vs_webhook": round(_ratio(results, side="policy", base="with"), 3),
                f"{kind}_policy_per_s": round(mean("policy", lambda r: r["saturation"]["achieved_rate"]), 1),
                f"{kind}_policy_webhook_calls_per_create": round(
                    mean("policy", lambda r: r.get("webhook_calls_per_create", 0.0)), 2
                ),
            }
        )
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measurement (default 10)")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of unmeasured load per phase (default 3)")
    parser.add_argument("--connections", type=int, default=16, help="closed-loop connections / open-loop pool (default 16)")
    parser.add_argument(
        "--rates",
        type=lambda s: [float(x) for x in s.split(",")],
        default=[50.0, 100.0, 200.0],
        help="open-loop rates, comma list",
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="without/with pairs, alternated so background load hits both (default 2)"
    )
    parser.add_argument("--real", action="store_true", help="store the pods instead of server-side dry runs")
    parser.add_argument("--webhook-workers", type=int, default=1, help="gpu-admission serve --workers (default 1)")
    parser.add_argument("--json", metavar="FILE", help="also write every figure as JSON here")
    parser.add_argument(
        "--pods",
        type=lambda s: [k for k in s.split(",") if k],
        default=["gpu"],
        help="pod kinds, comma list of gpu (aliyun.com/gpu-mem) and cpu (an ordinary pod); each is measured "
        "in every phase of the same run (default gpu)",
    )
    parser.add_argument(
        "--map",
        action="store_true",
        help="also a third phase per round: GPU104 as a MutatingAdmissionPolicy (feature gate on) and the mutating "
        "webhook skipping ordinary pods (rows 'policy')",
    )
    parser.add_argument(
        "--against",
        metavar="REF",
        help="also a phase per round with the webhook and its registrations from a git worktree of REF (rows 'against')",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="a kube-apiserver CPU profile over the first --rates run of every phase: CPU per create around the webhooks",
    )
    args = parser.parse_args()
    if args.map and args.against:
        parser.error("--map and --against: one at a time")
    if not args.pods or any(k not in POD_KINDS for k in args.pods):
        parser.error(f"--pods: a comma list of {', '.join(POD_KINDS)}")
    loadgen.binary()
    bin_dir = binaries.ensure()
    machine = loadgen.machine()
    results: dict[str, dict[str, dict[str, Any]]] = {kind: {} for kind in args.pods}
    with tempfile.TemporaryDirectory(prefix="gpu-admission-e2e-bench-") as tmp:
        directory = pathlib.Path(tmp) / "cluster"
        started = time.monotonic()
        state = install.bring_up(
            directory,
            bin_dir=bin_dir,
            fake_nodes=nodes.load(None),
            with_install=False,
            apiserver_flags=controlplane.MUTATING_ADMISSION_POLICY_FLAGS if args.map else (),
        )
        print(f"control plane up in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
        try:
            bodies = {kind: pathlib.Path(tmp) / f"pod-{kind}.json" for kind in args.pods}
            for kind, body in bodies.items():
                body.write_text(json.dumps(pod(real=args.real, kind=kind)))
            namespace = "bench" if args.real else NAMESPACE
            suffix = "" if args.real else "?dryRun=All"
            url = f"{state.server}/api/v1/namespaces/{namespace}/pods{suffix}"
            registered = False
            policy = False
            tree = pathlib.Path(tmp) / "against"
            if args.against:
                subprocess.run(
                    ["git", "-C", str(loadgen.REPO), "worktree", "add", "--detach", str(tree), args.against],
                    check=True,
                    capture_output=True,
                )
            modes = (
                ("without", "with", "policy")
                if args.map
                else ("without", "with", "against", "regs")
                if args.against
                else ("without", "with")
            )
            for round_ in range(1, args.rounds + 1):
                # Every other round the phases with a webhook run in reverse order, so that neither
                # side always follows the other (a registration switch, a cold server).
                for mode in modes if round_ % 2 else (modes[0], *reversed(modes[1:])):
                    with_webhook = mode != "without"
                    if policy and mode != "policy":
                        delete_policy(state)
                        policy = False
                    if with_webhook and "webhook" not in state.pids:
                        start_webhook(state, workers=args.webhook_workers)
                        registered = True
                    if mode == "against":
                        if "webhook-ref" not in state.pids:
                            start_reference_webhook(state, tree, workers=args.webhook_workers)
                        install.register(state, deploy=tree / "deploy", port=state.ports["webhook-ref"])
                        registered = True
                    elif mode == "regs":
                        install.register(state, deploy=tree / "deploy")
                        registered = True
                    elif with_webhook:
                        install.register(state)  # deploy/'s registrations again: no skip on the mutating webhook
                        registered = True
                    elif not with_webhook and registered:
                        unregister(state)
                        registered = False
                    if mode == "policy":
                        apply_policy(state)
                        policy = True
                    if args.real:
                        controlplane.kubectl(state, "delete", "namespace", namespace, "--ignore-not-found", "--wait=true")
                        controlplane.kubectl(state, "create", "namespace", namespace)
                        controlplane.wait_for(
                            lambda: (
                                controlplane.kubectl(
                                    state, "get", "serviceaccount", "default", "-n", namespace, check=False
                                ).returncode
                                == 0
                            ),
                            what="the bench namespace's ServiceAccount",
                            timeout=60,
                        )
                    for kind, body in bodies.items():
                        label = f"{mode} webhook #{round_}" if mode not in ("policy", "regs") else f"{mode} #{round_}"
                        results[kind][label] = phase(
                            state,
                            body,
                            url=url,
                            args=args,
                            label=f"{label} ({kind} pod)",
                            webhook_name="webhook-ref" if mode == "against" else "webhook",
                        )
        finally:
            controlplane.down(directory)
            if args.against:
                subprocess.run(
                    ["git", "-C", str(loadgen.REPO), "worktree", "remove", "--force", str(tree)], check=False, capture_output=True
                )
    headline: dict[str, float] = {}
    for kind, figures in results.items():
        print(f"\n{kind.upper()} pod\n")
        print(render(figures, args=args, machine=machine))
        headline.update(_headline(kind, figures))
    headline["loadavg_start"] = round(float(machine["loadavg"]), 1)
    headline["loadavg_end"] = round(os.getloadavg()[0], 1)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"machine": machine, "results": results}, indent=2, default=str))
    print(json.dumps(headline))
    records.write(
        bench="e2e_pod_creates",
        inputs=vars(args),
        figures=headline,
        reference={
            "name": "the same apiserver without the webhook",
            "figures": {k.replace("_without_", "_with_"): v for k, v in headline.items() if "_without_" in k},
        },
        headline=records.Headline(
            figure="cpu_with_per_s", label="CPU-pod creates at saturation, with the webhook", unit="creates/s", better="higher"
        ),
        ratio=headline.get("cpu_ratio"),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
