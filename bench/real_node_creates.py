"""Pod creates per second through kube-apiserver with the webhook in containers behind its Service,
against the same webhook as a local process, on one cluster in one run; and the cold start to Ready
of a webhook pod.

Brings up the local cluster with a real node and gpu-admission installed from deploy/ as containers
(`cluster up --real-node --in-cluster`; root, Docker), then, with `e2e_pod_creates`'s load generator
and GPU pod (server-side dry runs: admission in full, nothing stored):

1. in containers: the apiserver resolves the Service gpu-admission-webhook to its ClusterIP and
   kube-proxy's iptables rules send the call over the CNI bridge to one of the two pods;
2. local: the same registrations pointed at `gpu-admission serve` on 127.0.0.1 (one process), the
   in-cluster webhook scaled to 0.

Cold start: a webhook pod deleted, the time until its replacement is Ready (kubelet, containerd,
Python start, certificates from the Secret, readiness probe).

    sudo .venv/bin/python bench/real_node_creates.py [--image gpu-admission:0.1.0]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import e2e_pod_creates  # noqa: E402 - bench/ is not a package; its helpers sit beside the scripts
import records  # noqa: E402 - bench/ is on sys.path (scripts run as bench/<name>.py); one record per run

from webhook.cluster import binaries, controlplane, incluster, install, nodes  # noqa: E402


def cold_start(state: controlplane.State) -> float:
    """Seconds from deleting one webhook pod to its replacement being Ready."""
    listed = json.loads(
        controlplane.kubectl(
            state, "get", "pods", "-n", incluster.NAMESPACE, "-l", "app.kubernetes.io/component=webhook", "-o", "json"
        ).stdout
    )
    before = {p["metadata"]["name"] for p in listed["items"]}
    victim = sorted(before)[0]
    started = time.monotonic()
    controlplane.kubectl(state, "delete", "pod", victim, "-n", incluster.NAMESPACE, "--wait=false")

    def replaced() -> bool:
        now = json.loads(
            controlplane.kubectl(
                state, "get", "pods", "-n", incluster.NAMESPACE, "-l", "app.kubernetes.io/component=webhook", "-o", "json"
            ).stdout
        )
        return any(
            p["metadata"]["name"] not in before
            and any(c.get("type") == "Ready" and c.get("status") == "True" for c in p.get("status", {}).get("conditions", []))
            for p in now["items"]
        )

    controlplane.wait_for(replaced, what="a new webhook pod Ready", timeout=180)
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default=None, help="a local image built from the Dockerfile (default: build one)")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",") if x], default=[])
    args = parser.parse_args()
    bin_dir = binaries.ensure(real_node=True)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="gpu-admission-real-bench-") as tmp:
        directory = pathlib.Path(tmp) / "cluster"
        started = time.monotonic()
        state = install.bring_up(
            directory, bin_dir=bin_dir, fake_nodes=nodes.load(None), real_node=True, in_cluster=True, image=args.image
        )
        results["cluster_up_s"] = time.monotonic() - started
        try:
            results["webhook_pod_cold_start_s"] = cold_start(state)
            controlplane.kubectl(
                state, "rollout", "status", "deployment/gpu-admission-webhook", "-n", incluster.NAMESPACE, "--timeout=180s"
            )
            body = pathlib.Path(tmp) / "pod.json"
            body.write_text(json.dumps(e2e_pod_creates.pod(real=False)))
            url = f"{state.server}/api/v1/namespaces/default/pods?dryRun=All"
            results["in_containers"] = e2e_pod_creates.phase(state, body, url=url, args=args, label="in containers")
            controlplane.kubectl(state, "scale", "deployment/gpu-admission-webhook", "-n", incluster.NAMESPACE, "--replicas=0")
            # Until the last pod has drained, its certificate loop would inject the in-cluster CA
            # into the registrations again and the local webhook's calls would fail TLS.
            controlplane.wait_for(
                lambda: (
                    not json.loads(
                        controlplane.kubectl(
                            state,
                            "get",
                            "pods",
                            "-n",
                            incluster.NAMESPACE,
                            "-l",
                            "app.kubernetes.io/component=webhook",
                            "-o",
                            "json",
                        ).stdout
                    )["items"]
                ),
                what="the in-cluster webhook pods gone",
                timeout=240,
            )
            install.start_webhook(state)
            install.register(state)
            results["local_process"] = e2e_pod_creates.phase(state, body, url=url, args=args, label="local process")
        finally:
            install.tear_down(directory)
    summary = {
        "cluster_up_s": round(results["cluster_up_s"], 1),
        "webhook_pod_cold_start_s": round(results["webhook_pod_cold_start_s"], 1),
        **{
            label: {key: results[label]["saturation"][key] for key in ("achieved_rate", "p50_ms", "p99_ms", "errors")}
            for label in ("in_containers", "local_process")
        },
    }
    print(json.dumps(summary, indent=2))
    records.write(
        bench="real_node_creates",
        inputs=vars(args),
        figures={**summary, "creates_per_s": summary["in_containers"]["achieved_rate"]},
        reference={
            "name": "the webhook as a local process on the same cluster",
            "figures": {"creates_per_s": summary["local_process"]["achieved_rate"]},
        },
        headline=records.Headline(
            figure="creates_per_s", label="pod creates through the webhook in containers", unit="creates/s", better="higher"
        ),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
