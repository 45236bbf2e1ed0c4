"""Card-aware preemption on a full cluster: time from a preemptor's creation to Running, and victims
per preemption, with and without the extender's preempt verb (issue 27).

One control plane (etcd, kube-apiserver, kube-controller-manager, KWOK) with N fake GPU nodes
(cgpu, `spread`, two 16 GiB cards each, inventory and capacity as the labeler writes them). No
admission webhook: this measures scheduling. A kube-scheduler configured from
`deploy/scheduler-config-second.yaml` calls a local `gpu-admission extender`; for `--without` the
same file less `preemptVerb`. The cluster is filled first: four 8 GiB pods of priority 0 per node
(spread puts them on alternating cards), so every card is full. Then M preemptors (16 GiB, a
PriorityClass of value 1000) are created one after another, each once the previous one runs; for
each: the seconds from its creation to `Running` (polled every 50 ms), the pods of priority 0
gone meanwhile (its victims), and whether they all sat on the card the preemptor got. The last
line of output is one JSON object of the figures.

    .venv/bin/python bench/preemption.py --nodes 500 --preemptors 20 [--without]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import extender_throughput as throughput  # noqa: E402 - the bench helpers, after the path fix above
import records  # noqa: E402 - bench/ is on sys.path; one record per run
from policies import gpu, inventory, reservations  # noqa: E402 - after the path fix above
from webhook.cluster import binaries, controlplane, install, nodes  # noqa: E402
from webhook.extender import kube  # noqa: E402

CARD_MIB = 16384
HIGH = "bench-preemptor"
SCHEDULER = "bench-preemption"


def fake_nodes(count: int) -> list[nodes.FakeNode]:
    listed = inventory.encode_inventory(inventory.Card(index=i, memory_mib=CARD_MIB, uuid=f"GPU-bench-{i}", name="Tesla-T4") for i in range(2))
    return [
        nodes.FakeNode(
            name=f"bench-{i:04d}",
            labels={"ack.node.gpu.schedule": "cgpu", "ack.node.gpu.placement": "spread"},
            capacity={"aliyun.com/gpu-mem": "32", "aliyun.com/gpu-count": "2"},
            annotations={gpu.INVENTORY_ANNOTATION: listed},
        )
        for i in range(count)
    ]


def pod(name: str, *, gib: int, label: str, high: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": SCHEDULER,
        "containers": [{"name": "main", "image": "registry.example/infer:1", "resources": {"limits": {"aliyun.com/gpu-mem": str(gib)}}}],
    }
    if high:
        spec["priorityClassName"] = HIGH
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "labels": {"bench": label}}, "spec": spec}


def scheduler_config(state: controlplane.State, *, port: int, verb: bool) -> Path:
    document = yaml.safe_load(throughput.CONFIG.read_text())
    if not verb:
        document["extenders"][0].pop("preemptVerb", None)
    config = install.local_scheduler_configuration(document, base_url=f"http://127.0.0.1:{port}")
    config["profiles"] = [{"schedulerName": SCHEDULER}]
    config["clientConnection"] = {"kubeconfig": str(state.kubeconfig), "qps": 5000, "burst": 5000}
    config["leaderElection"] = {"leaderElect": False}
    path = state.directory / f"{SCHEDULER}.yaml"
    path.write_text(json.dumps(config, indent=2))
    return path


def placed(api: kube.KubeApi, label: str) -> dict[str, tuple[str, int, str]]:
    """Pods of `label` that are bound and not being deleted: name -> (node, card, phase)."""
    items, _ = api.list("/api/v1/namespaces/default/pods", label_selector=f"bench={label}")
    found = {}
    for item in items:
        meta, spec = item.get("metadata") or {}, item.get("spec") or {}
        if spec.get("nodeName") and not meta.get("deletionTimestamp"):
            card = int((meta.get("annotations") or {}).get("ALIYUN_COM_GPU_MEM_IDX", "-1").split(",")[0])
            found[meta["name"]] = (spec["nodeName"], card, str((item.get("status") or {}).get("phase", "")))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--preemptors", type=int, default=20)
    parser.add_argument("--without", action="store_true", help="kube-scheduler without the preempt verb (its default preemption)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a preemptor may take to run")
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    directory = args.dir or Path(tempfile.mkdtemp(prefix="preemption-bench-"))
    state = controlplane.up(directory, bin_dir=binaries.ensure(), fake_nodes=fake_nodes(args.nodes)[:500], timeout=600)
    try:
        controlplane.stop(state, ["kube-scheduler"])
        controlplane.kubectl(state, "create", "namespace", reservations.LEDGER_NAMESPACE, check=False)
        priority_class = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": HIGH}, "value": 1000}
        controlplane.kubectl(state, "create", "-f", "-", stdin=json.dumps(priority_class))
        port = throughput.start_extender(state, log_level="info")
        throughput.start_scheduler(state, name=SCHEDULER, config=scheduler_config(state, port=port, verb=not args.without), port=controlplane.free_port())
        api = kube.KubeApi(kube.load_client(str(state.kubeconfig)))
        fill = [pod(f"low-{i:05d}", gib=8, label="low") for i in range(4 * args.nodes)]
        for start in range(0, len(fill), 250):
            controlplane.kubectl(state, "create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": fill[start:start + 250]}))
        controlplane.wait_for(lambda: len(placed(api, "low")) == len(fill), what="the cluster full", timeout=900, state=state, component="extender")
        seconds: list[float] = []
        victims: list[int] = []
        one_card = 0
        for index in range(args.preemptors):
            before = placed(api, "low")
            name = f"high-{index:03d}"
            created = time.monotonic()
            controlplane.kubectl(state, "create", "-f", "-", stdin=json.dumps(pod(name, gib=16, label="high", high=True)))
            while True:
                mine = placed(api, "high").get(name)
                if mine is not None and mine[2] == "Running":
                    break
                if time.monotonic() - created > args.timeout:
                    break
                time.sleep(0.05)
            gone = {n: where for n, where in before.items() if n not in placed(api, "low")}
            if mine is None or mine[2] != "Running":
                # Recorded, not fatal: without the verb this is what the default preemption does.
                print(f"  {name}: not Running after {args.timeout:.0f} s; {len(gone)} pods evicted meanwhile on "
                      f"{sorted({(n, c) for n, c, _ in gone.values()})}", flush=True)
                print(json.dumps({"verb": not args.without, "nodes": args.nodes, "preemptors": index + 1, "stuck": name,
                                  "stuck_after_s": args.timeout, "evicted_for_it": len(gone), "runs_before": len(seconds)}))
                return 1
            seconds.append(time.monotonic() - created)
            victims.append(len(gone))
            one_card += all(node == mine[0] and card == mine[1] for node, card, _ in gone.values())
            print(f"  {name}: {seconds[-1]:.2f} s, {len(gone)} victims on {sorted({(n, c) for n, c, _ in gone.values()})}", flush=True)
        figures = {
            "verb": not args.without,
            "nodes": args.nodes,
            "preemptors": args.preemptors,
            "to_running_p50_s": round(statistics.median(seconds), 2),
            "to_running_max_s": round(max(seconds), 2),
            "victims_mean": round(statistics.fmean(victims), 2),
            "victims_max": max(victims),
            "victims_on_the_preemptors_card": f"{one_card}/{args.preemptors}",
        }
        print(json.dumps(figures))
        records.write(
            bench="preemption", inputs=vars(args), figures=figures,
            headline=records.Headline(figure="to_running_p50_s", label="preemptor creation to Running, p50", unit="s", better="lower"),
        )
    finally:
        controlplane.down(directory)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
