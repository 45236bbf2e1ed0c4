"""Card-aware preemption on a full cluster: time from a preemptor's creation to Running, and victims
per preemption, with and without the extender's preempt verb (issue 27).

One control plane (etcd, kube-apiserver, kube-controller-manager, KWOK) with N fake GPU nodes
(cgpu, `spread`, two 16 GiB cards each, inventory and capacity as the labeler writes them). No
admission webhook: this measures scheduling. A kube-scheduler configured from
`deploy/scheduler-config-second.yaml` calls a local `gpu-admission extender`; for `--without` the
same file less `preemptVerb`. The cluster is filled first: four 8 GiB pods of priority 0 per node
(spread puts them on alternating cards), so every card is full. Then M preemptors (16 GiB, a
PriorityClass of value 1000) are created one after another, each once the previous one runs; for
each: the seconds from its creation to `Running` (its own pod polled every 50 ms; the thousands
of filler pods are listed only before and after), the pods of priority 0 gone meanwhile (its
victims), and whether they all sat on the card the preemptor got. Both sides run in one command,
one after the other, each in a fresh control plane of the same shape (with the verb first): one
JSON line of figures per side, then one of ratios (with / without).

    .venv/bin/python bench/preemption.py --nodes 500 --preemptors 20 [--only with|without]
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

from policies import gpu  # noqa: E402 - after the path fix above
from policies.gpu import inventory, reservations  # noqa: E402 - after the path fix above
from webhook.cluster import binaries, controlplane, install, nodes  # noqa: E402
from webhook.extender import kube  # noqa: E402

CARD_MIB = 16384
HIGH = "bench-preemptor"
SCHEDULER = "bench-preemption"


def fake_nodes(count: int) -> list[nodes.FakeNode]:
    listed = inventory.encode_inventory(
        inventory.Card(index=i, memory_mib=CARD_MIB, uuid=f"GPU-bench-{i}", name="Tesla-T4") for i in range(2)
    )
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
        "containers": [
            {"name": "main", "image": "registry.example/infer:1", "resources": {"limits": {"aliyun.com/gpu-mem": str(gib)}}}
        ],
    }
    if high:
        spec["priorityClassName"] = HIGH
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"bench": label}},
        "spec": spec,
    }


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


def one_pod(api: kube.KubeApi, name: str) -> tuple[str, int, str] | None:
    """One pod as `placed` reads it (None while not bound): a GET, so polling it costs the apiserver
    little next to a list of thousands of pods, which would slow what is measured."""
    answer = api.request("GET", f"/api/v1/namespaces/default/pods/{name}")
    meta, spec = answer.get("metadata") or {}, answer.get("spec") or {}
    if not spec.get("nodeName") or meta.get("deletionTimestamp"):
        return None
    card = int((meta.get("annotations") or {}).get("ALIYUN_COM_GPU_MEM_IDX", "-1").split(",")[0])
    return spec["nodeName"], card, str((answer.get("status") or {}).get("phase", ""))


def fill(state: controlplane.State, api: kube.KubeApi, *, count: int, batch: int) -> float:
    """`count` 8 GiB priority-0 pods, created `batch` to a kubectl call (one List each), until all are
    bound; the seconds it took."""
    began = time.monotonic()
    pods = [pod(f"low-{i:05d}", gib=8, label="low") for i in range(count)]
    for start in range(0, len(pods), batch):
        controlplane.kubectl(
            state,
            "create",
            "-f",
            "-",
            stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods[start : start + batch]}),
        )
    controlplane.wait_for(
        lambda: len(placed(api, "low")) == count, what="the cluster full", timeout=1800, state=state, component="extender"
    )
    return time.monotonic() - began


def phase(
    state: controlplane.State, api: kube.KubeApi, args: argparse.Namespace, *, verb: bool, extender_port: int
) -> dict[str, Any]:
    """Fill the cluster with kube-scheduler configured with (or without) the verb, then the preemptors."""
    controlplane.stop(state, [SCHEDULER])
    throughput.start_scheduler(
        state, name=SCHEDULER, config=scheduler_config(state, port=extender_port, verb=verb), port=controlplane.free_port()
    )
    label = "with the verb" if verb else "without it"
    fill_s = fill(state, api, count=4 * args.nodes, batch=args.batch)
    print(f"{label}: {4 * args.nodes} pods placed on {args.nodes} nodes in {fill_s:.1f} s", flush=True)
    seconds: list[float] = []
    victims: list[int] = []
    one_card = 0
    figures: dict[str, Any] = {"verb": verb, "nodes": args.nodes, "fill_s": round(fill_s, 1)}
    for index in range(args.preemptors):
        before = placed(api, "low")
        name = f"high-{index:03d}"
        created = time.monotonic()
        controlplane.kubectl(state, "create", "-f", "-", stdin=json.dumps(pod(name, gib=16, label="high", high=True)))
        while True:
            mine = one_pod(api, name)
            if mine is not None and mine[2] == "Running":
                break
            if time.monotonic() - created > args.timeout:
                break
            time.sleep(0.05)
        took = time.monotonic() - created
        after = placed(api, "low")
        gone = {n: where for n, where in before.items() if n not in after}
        if mine is None or mine[2] != "Running":
            # Recorded, not fatal: without the verb this is what the default preemption does.
            print(
                f"  {name}: not Running after {args.timeout:.0f} s; {len(gone)} pods evicted meanwhile on "
                f"{len({n for n, _, _ in gone.values()})} nodes",
                flush=True,
            )
            figures |= {"stuck": name, "stuck_after_s": args.timeout, "evicted_for_it": len(gone), "runs_before": len(seconds)}
            break
        seconds.append(took)
        victims.append(len(gone))
        one_card += all(node == mine[0] and card == mine[1] for node, card, _ in gone.values())
        print(f"  {name}: {took:.2f} s, {len(gone)} victims on {sorted({(n, c) for n, c, _ in gone.values()})}", flush=True)
    if seconds:
        figures |= {
            "ran": len(seconds),
            "to_running_p50_s": round(statistics.median(seconds), 2),
            "to_running_max_s": round(max(seconds), 2),
            "victims_mean": round(statistics.fmean(victims), 2),
            "victims_max": max(victims),
            "victims_on_the_preemptors_card": f"{one_card}/{len(seconds)}",
        }
    return figures


def side(args: argparse.Namespace, *, verb: bool, directory: Path) -> dict[str, Any]:
    """One side in a control plane of its own (deleting 2,000 pods takes the apiserver longer than
    starting a fresh one): the figures of `phase`."""
    began = time.monotonic()
    state = controlplane.up(directory, bin_dir=binaries.ensure(), fake_nodes=fake_nodes(args.nodes), timeout=900)
    print(f"control plane with {args.nodes} nodes up in {time.monotonic() - began:.0f} s", flush=True)
    try:
        controlplane.stop(state, ["kube-scheduler"])
        controlplane.kubectl(state, "create", "namespace", reservations.LEDGER_NAMESPACE, check=False)
        priority_class = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": HIGH},
            "value": 1000,
        }
        controlplane.kubectl(state, "create", "-f", "-", stdin=json.dumps(priority_class))
        port = throughput.start_extender(state, log_level="info")
        api = kube.KubeApi(kube.load_client(str(state.kubeconfig)))
        return phase(state, api, args, verb=verb, extender_port=port)
    finally:
        controlplane.down(directory)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--preemptors", type=int, default=20)
    parser.add_argument("--only", choices=("with", "without"), default=None, help="one side only (default: both, with first)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a preemptor may take to run")
    parser.add_argument("--batch", type=int, default=500, help="filler pods per kubectl create")
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    directory = args.dir or Path(tempfile.mkdtemp(prefix="preemption-bench-"))
    sides = [verb for verb in (True, False) if args.only is None or args.only == ("with" if verb else "without")]
    results = []
    for verb in sides:
        results.append(side(args, verb=verb, directory=directory / ("with" if verb else "without")))
        print(json.dumps(results[-1]), flush=True)
    by_side = dict(zip(("with" if verb else "without" for verb in sides), results, strict=True))
    ours = by_side.get("with") or by_side["without"]
    without = by_side.get("without") if "with" in by_side else None
    if without is None or "to_running_p50_s" not in ours:
        print("# no record: a record needs both sides of the same run, and preemptors that ran with the verb", flush=True)
        return 1 if "to_running_p50_s" not in ours else 0
    name = "kube-scheduler's default preemption (no preempt verb), same run"
    if "to_running_p50_s" in without:
        reference: dict[str, Any] = {"name": name, "figures": without}
    else:
        # A preemptor that never ran within --timeout: its time is at least that, censored, not a time.
        reference = records.censored(
            name, figure="to_running_p50_s", at_least=float(without.get("stuck_after_s") or args.timeout), figures=without
        )
    records.write(
        bench="preemption",
        inputs=vars(args),
        figures=ours,
        reference=reference,
        headline=records.Headline(
            figure="to_running_p50_s",
            label=f"preemptor creation to Running, p50, {args.nodes:,} full nodes",
            unit="s",
            better="lower",
        ),
    )
    if len(results) == 2:
        with_, without = results
        # Without the verb the first preemptor may never run: its time is then at least the timeout.
        slow = without.get("to_running_p50_s", without.get("stuck_after_s"))
        first_victims = without.get("evicted_for_it", without.get("victims_mean"))
        print(
            json.dumps(
                {
                    "nodes": args.nodes,
                    "to_running_p50_with_over_without": round(with_["to_running_p50_s"] / slow, 3)
                    if slow and "to_running_p50_s" in with_
                    else None,
                    "without_ran": without.get("ran", 0),
                    "victims_with_over_without": round(with_["victims_mean"] / first_victims, 3)
                    if first_victims and "victims_mean" in with_
                    else None,
                }
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
