"""`gpu-admission explain`, `snapshot` and `simulate`: why a GPU pod is pending, and what a batch would do.

All three read the cluster with the usual flags (`--kubeconfig`, `--context`; the nodes' ledger
Leases in `--ledger-namespace`) or, for explain and simulate, a snapshot file (`--snapshot`), and
never write to the cluster.

Exit statuses: explain 0 (a report, whatever it says), 2 for a pod that does not exist or bad
input; simulate 0 when every GPU pod lands, 1 when some do not (or are denied), 2 for bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from policies import podspec
from policies import settings as settings_
from policies.gpu import allocation as allocation_  # `allocation` names a pod's allocation here
from policies.gpu import budgetusage, inspection, reservations
from webhook import config, kube
from webhook.admission import decisions
from webhook.cmdline import errors, flags, manifests, output
from webhook.commands import dryrun
from webhook.explain import analysis, budget, defrag, render, simulate, snapshot
from webhook.extender import kube as extender_kube
from webhook.kube import errors as kube_errors

EXIT_ALL_PLACED, EXIT_NOT_PLACED = 0, 1
SNAPSHOT_OUTPUTS = ("yaml", "json")


def add_parser(subparsers: Any) -> None:
    """Register `explain`, `snapshot` and `simulate`."""
    explain = subparsers.add_parser(
        "explain",
        help="why a GPU pod is pending: admission, request, each node's reason (stable codes), the best node",
        description="Explain one pod: would it be admitted, what it asks for, why each GPU node cannot take it "
        "(the scheduler extender's own placement code), and the node that would fit after the smallest change.",
    )
    explain.add_argument("kind", choices=("pod",), help="what to explain (pod)")
    explain.add_argument("name", help="the pod's name")
    flags.add_namespaces(
        explain, namespace_help="the pod's namespace (default: default)", all_help=None, default=decisions.DEFAULT_NAMESPACE
    )
    _common(explain)
    explain.set_defaults(func=run_explain)

    save = subparsers.add_parser(
        "snapshot",
        help="save nodes, GPU pods and reservations to a file, for explain/simulate --snapshot",
        description="Write the cluster's GPU allocation (nodes, GPU pods, reservation ledgers) to stdout or "
        "--output-file, so that `explain` and `simulate` can replay it offline.",
    )
    flags.add_output(save, SNAPSHOT_OUTPUTS, default=None, default_help="json for an --output-file ending in .json, else yaml")
    flags.add_output_file(save)
    _cluster_flags(save)
    save.set_defaults(func=run_snapshot)

    sim = subparsers.add_parser(
        "simulate",
        help="place manifests' GPU pods on a copy of the allocation, with the extender's placement; writes nothing",
        description="Place the GPU pods of the manifests in order on a copy of the current allocation (live or "
        "--snapshot), as admission, kube-scheduler and the extender would: where each lands (node, card), which "
        "do not fit and why, the per-card table afterwards. Exit 0: all land; 1: some do not.",
    )
    sim.add_argument("-f", "--filename", action="append", required=True, metavar="PATH", help="file, directory or -; repeatable")
    sim.add_argument(
        "--add-nodes",
        metavar="FILE",
        help="Node objects to add copies of until every pod fits: answers how many more nodes of this kind are needed",
    )
    _common(sim)
    sim.set_defaults(func=run_simulate)

    defrag_parser = subparsers.add_parser(
        "defrag",
        help="plan (and carry out) moves of controller-owned GPU pods that free whole cards or make room for a pod",
        description="`defrag plan` finds the moves that free the most whole cards, or room for the pod in --for; "
        "`defrag apply` carries the plan out through the Eviction API (PodDisruptionBudgets apply), one pod at a "
        "time, waiting for each replacement to be scheduled, and stops on the first surprise. Only pods a "
        "controller recreates are moved.",
    )
    steps = defrag_parser.add_subparsers(dest="step", required=True, metavar="STEP")
    for step, text in (("plan", "print the plan"), ("apply", "carry the plan out (only prints it without --yes)")):
        sub = steps.add_parser(step, help=text, description=text)
        sub.add_argument("--for", dest="for_file", metavar="FILE", help="make room for the (first GPU) pod in this manifest")
        sub.add_argument(
            "--max-moves", type=int, default=defrag.DEFAULT_MAX_MOVES, metavar="N", help="at most N moves (default: %(default)s)"
        )
        if step == "apply":
            sub.add_argument("--yes", action="store_true", help="evict for real")
            sub.add_argument(
                "--timeout",
                type=flags.positive_duration,
                default=300.0,
                metavar="DURATION",
                help="wait per replacement, e.g. 90s, 10m (default: 5m)",
            )
        _common(sub)
        sub.set_defaults(func=run_defrag_plan if step == "plan" else run_defrag_apply)


def _cluster_flags(parser: argparse.ArgumentParser) -> None:
    flags.add_cluster(parser)
    flags.add_ledger_namespace(parser, note="; a snapshot records its own")


def _common(parser: argparse.ArgumentParser) -> None:
    flags.add_output(parser, ("table", "json", "yaml"))
    flags.add_output_file(parser)
    parser.add_argument("--snapshot", metavar="FILE", help="read a snapshot file instead of the cluster")
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="settings YAML for the admission step (as dry-run) and, for explain, the namespaces' GPU budgets (gpuBudgets)",
    )
    parser.add_argument("--policies-dir", metavar="DIR", help="user (CEL) policies for the admission step")
    _cluster_flags(parser)


# --- reading --------------------------------------------------------------------------------------


def _client(args: argparse.Namespace) -> extender_kube.KubeApi:
    return extender_kube.KubeApi(kube.api_client(args.kubeconfig, context=args.context))


def read_cluster(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]], float]:
    """Nodes, pods and the moment they describe: the snapshot's, or the live cluster now."""
    if getattr(args, "snapshot", None):
        taken = snapshot.load(args.snapshot)
        return taken.nodes, taken.pods, taken.taken_at
    client = _client(args)
    try:
        nodes, _ = client.list("/api/v1/nodes")
        pods, _ = client.list("/api/v1/pods")
    except kube_errors.KubeError as error:
        raise errors.InputError(f"cannot read nodes and pods: {error}") from error
    return nodes, pods, time.time()


def read_ledgers(args: argparse.Namespace) -> tuple[list[dict[str, Any]], str]:
    """The nodes' ledger Leases and their namespace: the snapshot's, or the live cluster's in --ledger-namespace.

    Only that namespace is listed (a Lease elsewhere is never a ledger). Where they cannot be read,
    a warning says so and the ledgers are the Node annotations' only (versions before the Lease).
    """
    if getattr(args, "snapshot", None):
        taken = snapshot.load(args.snapshot)
        return taken.leases, taken.ledger_namespace
    namespace = getattr(args, "ledger_namespace", None) or reservations.LEDGER_NAMESPACE
    try:
        leases = extender_kube.list_ledger_leases(_client(args), namespace)
    except kube_errors.KubeError as error:
        print(
            f"gpu-admission: warning: cannot read the ledger Leases in namespace {namespace}, "
            f"counting the Node annotations' reservations only: {error}",
            file=sys.stderr,
        )
        return [], namespace
    return leases, namespace


def read_dra(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The ResourceSlices and allocated ResourceClaims (`policies.gpu.dra`): the snapshot's, or the live
    cluster's; where they cannot be read, a warning says so and no card counts as allocated by DRA."""
    if getattr(args, "snapshot", None):
        taken = snapshot.load(args.snapshot)
        return taken.slices, taken.claims
    slices, claims, problem = extender_kube.list_dra(_client(args))
    if problem:
        print(f"gpu-admission: warning: {problem}", file=sys.stderr)
    return slices, claims


def _find_pod(args: argparse.Namespace, pods: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    for pod in pods:
        metadata = pod.get("metadata") or {}
        if metadata.get("name") == args.name and metadata.get("namespace") == args.namespace:
            return pod
    raise errors.InputError(f'pod "{args.name}" not found in namespace "{args.namespace}"')


# --- explain --------------------------------------------------------------------------------------


def run_explain(args: argparse.Namespace) -> int:
    settings = config.load(args.config, policies_dir=args.policies_dir)
    if args.snapshot:
        nodes, pods, now = read_cluster(args)
        pod = _find_pod(args, pods)
    else:
        client = _client(args)
        try:
            pod = client.request("GET", f"/api/v1/namespaces/{args.namespace}/pods/{args.name}")
        except kube_errors.NotFound as error:
            raise errors.InputError(f'pod "{args.name}" not found in namespace "{args.namespace}"') from error
        except kube_errors.KubeError as error:
            raise errors.InputError(f"cannot read pod {args.namespace}/{args.name}: {error}") from error
        nodes, pods, now = read_cluster(args)
    leases, ledger_namespace = read_ledgers(args)
    slices, claims = read_dra(args)
    namespace = str(podspec.mapping(pod.get("metadata")).get("namespace") or args.namespace)
    report = explain_pod(
        pod,
        nodes=nodes,
        pods=pods,
        now=now,
        settings=settings,
        leases=leases,
        ledger_namespace=ledger_namespace,
        slices=slices,
        claims=claims,
        budgets=Budgets(
            gpu_budgets=settings.gpu_budgets if args.config else None,
            namespace_labels=read_namespace_labels(args, namespace) if settings.gpu_budgets else {},
            complete=not args.snapshot,
        ),
    )
    output.emit(render.render(report, output=args.output, now=now), path=args.output_file)
    return 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Budgets:
    """What explain judges the namespace's GPU budget with (`budget.judge`)."""

    gpu_budgets: Sequence[settings_.Budget] | None  # None: no settings file read, the budgets are not known
    namespace_labels: Mapping[str, str] | None  # the pod's namespace's labels; None: could not be read
    complete: bool = True  # whether `pods` holds every pod (live) or only the GPU pods (a snapshot)


def read_namespace_labels(args: argparse.Namespace, namespace: str) -> Mapping[str, str] | None:
    """The namespace's labels: the snapshot's, or the live Namespace's; None (with a warning) where
    they cannot be read, so that a budget selecting by label is not guessed."""
    if getattr(args, "snapshot", None):
        listed = snapshot.load(args.snapshot).namespace_labels
        return None if listed is None else listed.get(namespace, {})
    try:
        found = _client(args).request("GET", f"/api/v1/namespaces/{namespace}")
    except kube_errors.KubeError as error:
        print(f"gpu-admission: warning: cannot read namespace {namespace}: {error}", file=sys.stderr)
        return None
    labels = podspec.mapping(podspec.mapping(found.get("metadata")).get("labels"))
    return {str(k): str(v) for k, v in labels.items()}


def explain_pod(
    pod: Mapping[str, Any],
    *,
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    now: float,
    settings: Any | None = None,
    leases: Sequence[Mapping[str, Any]] = (),
    ledger_namespace: str = reservations.LEDGER_NAMESPACE,
    slices: Sequence[Mapping[str, Any]] = (),
    claims: Sequence[Mapping[str, Any]] = (),
    budgets: Budgets | None = None,
) -> analysis.Report:
    """The report for one pod (admission with `settings`, default settings when None); `leases`:
    the nodes' ledger Leases (and the namespaces' budget ledgers), trusted in `ledger_namespace`
    only; `slices` and `claims`: DRA's ResourceSlices and ResourceClaims (cards they hold are not
    offered); `budgets`: judge the pod against its namespace's GPU budget (None: not at all).

    The pod is a stored one, so it is judged as the audit judges stored objects: a bound pod's
    nodeName and the extender's allocation annotations are there by design, not a request to refuse.
    """
    loaded = settings if settings is not None else config.load(None)
    decision = decisions.decide(pod, settings=loaded.for_stored_objects())
    cluster = analysis.Cluster(
        nodes, pods, now=now, leases=leases, ledger_namespace=ledger_namespace, slices=slices, claims=claims
    )
    report = analysis.explain(pod, cluster=cluster, admission=decision)
    if budgets is not None:
        note = budget.judge(
            pod,
            gpu_budgets=budgets.gpu_budgets,
            namespace_labels=budgets.namespace_labels,
            pods=pods,
            nodes=cluster.nodes,
            candidates=[v.node for v in report.nodes],
            objects=budgetusage.listed(nodes=nodes, leases=leases, claims=claims, slices=slices, home=ledger_namespace),
            now=now,
            complete=budgets.complete,
        )
        report = budget.applied(report, note)
    notice = loaded.scheduler.profile.notice
    return dataclasses.replace(report, scheduler=notice) if notice else report


# --- snapshot -------------------------------------------------------------------------------------


def read_pdbs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The PodDisruptionBudgets: the snapshot's, or the live cluster's."""
    if getattr(args, "snapshot", None):
        return snapshot.load(args.snapshot).pdbs
    try:
        items, _ = _client(args).list("/apis/policy/v1/poddisruptionbudgets")
    except kube_errors.KubeError as error:
        raise errors.InputError(f"cannot read PodDisruptionBudgets: {error}") from error
    return items


def read_namespaces(args: argparse.Namespace) -> dict[str, dict[str, str]] | None:
    """Every Namespace's labels (for budgets that select by label); None, with a warning, where they cannot be listed."""
    try:
        client = _client(args)
    except errors.InputError:  # no cluster configured: nothing else was read from one either
        return None
    try:
        items, _ = client.list("/api/v1/namespaces")
    except kube_errors.KubeError as error:
        print(
            f"gpu-admission: warning: cannot list the Namespaces, the snapshot has no namespace labels: {error}", file=sys.stderr
        )
        return None
    return settings_.labels_by_namespace({"kind": "Namespace", **item} for item in items)


def run_snapshot(args: argparse.Namespace) -> int:
    nodes, pods, now = read_cluster(args)
    leases, ledger_namespace = read_ledgers(args)
    slices, claims = read_dra(args)
    taken = snapshot.take(
        nodes,
        pods,
        now=now,
        pdbs=read_pdbs(args),
        leases=leases,
        ledger_namespace=ledger_namespace,
        slices=slices,
        claims=claims,
        namespace_labels=read_namespaces(args),
    )
    as_json = args.output == "json" or (args.output is None and str(args.output_file or "").endswith(".json"))
    output.emit(snapshot.dumps(taken, as_json=as_json), path=args.output_file)
    if output.to_file(args.output_file):
        print(
            f"saved {len(taken.nodes)} nodes, {len(taken.pods)} GPU pods and {len(taken.leases)} ledger Leases to {args.output_file}",
            file=sys.stderr,
        )
    return 0


# --- simulate -------------------------------------------------------------------------------------


def run_simulate(args: argparse.Namespace) -> int:
    settings = config.load(args.config, policies_dir=args.policies_dir)
    documents = manifests.read(args.filename, stdin=sys.stdin)
    templates = _nodes_file(args.add_nodes) if args.add_nodes else []
    nodes, pods, now = read_cluster(args)
    leases, ledger_namespace = read_ledgers(args)
    slices, claims = read_dra(args)
    result = simulate_batch(
        [d.object for d in documents],
        nodes=nodes,
        pods=pods,
        now=now,
        settings=settings,
        templates=templates,
        leases=leases,
        ledger_namespace=ledger_namespace,
        slices=slices,
        claims=claims,
    )
    output.emit(
        render_simulation(result, output=args.output, asked_for_nodes=bool(args.add_nodes), now=now), path=args.output_file
    )
    return EXIT_ALL_PLACED if result is not None and not result.unplaced and not _denied(result) else EXIT_NOT_PLACED


def simulate_batch(
    objects: Sequence[Mapping[str, Any]],
    *,
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    now: float,
    settings: Any | None = None,
    templates: Sequence[Mapping[str, Any]] = (),
    leases: Sequence[Mapping[str, Any]] = (),
    ledger_namespace: str = reservations.LEDGER_NAMESPACE,
    slices: Sequence[Mapping[str, Any]] = (),
    claims: Sequence[Mapping[str, Any]] = (),
) -> simulate.Result | None:
    """Admit and place the manifests' pods; with `templates`, the fewest added nodes (None: none do).
    `leases`: the nodes' ledger Leases, trusted in `ledger_namespace` only."""
    loaded = settings if settings is not None else config.load(None)
    expanded = simulate.expand(objects)
    documents = [manifests.Document(source=f"pod#{i}", object=p) for i, p in enumerate(expanded)]
    outcomes = dryrun.evaluate(documents, settings=loaded)
    admitted = [outcome.patched for outcome in outcomes]
    for pod, outcome in zip(admitted, outcomes, strict=True):
        pod.setdefault("metadata", {})["namespace"] = outcome.namespace
    denials = {i: o.decision.denial_message for i, o in enumerate(outcomes) if not o.decision.allowed}
    cluster = analysis.Cluster(
        nodes, pods, now=now, leases=leases, ledger_namespace=ledger_namespace, slices=slices, claims=claims
    )
    if templates:
        return simulate.with_added_nodes(admitted, cluster=cluster, templates=templates, denials=denials)
    return simulate.run(admitted, cluster=cluster, denials=denials)


def _denied(result: simulate.Result) -> bool:
    return any(landing.denied for landing in result.landings)


def _nodes_file(path: str) -> list[dict[str, Any]]:
    found = [d.object for d in manifests.read([path], stdin=sys.stdin) if d.object.get("kind") == "Node"]
    if not found:
        raise errors.InputError(f"{path}: no Node objects to add")
    return found


def simulation_json(result: simulate.Result | None) -> dict[str, Any]:
    if result is None:
        return {"placements": [], "addedNodes": None, "cards": None}
    return {
        "placements": [
            {
                "pod": landing.pod,
                "node": landing.node or None,
                "cards": list(landing.cards),
                "ties": list(landing.ties),
                "denied": landing.denied or None,
                "gpu": landing.managed,
                "preempted": list(landing.preempted),
                "nodes": [
                    {"node": v.node, "fits": v.fits, "reasons": [render.reason_json(r) for r in v.reasons]}
                    for v in landing.verdicts
                ],
            }
            for landing in result.landings
        ],
        "addedNodes": result.added,
        "cards": inspection.as_json(result.states.values()),
        **({"holds": render.holds_json(result.holds)} if result.holds else {}),
    }


def render_simulation(result: simulate.Result | None, *, output: str, asked_for_nodes: bool = False, now: float = 0.0) -> str:
    if output == "json":
        return json.dumps(simulation_json(result), indent=2) + "\n"
    if output == "yaml":
        return yaml.safe_dump(simulation_json(result), sort_keys=False)
    if result is None:
        return f"no number of added nodes (up to {simulate.MAX_ADDED_NODES}) lets every pod fit: the pods do not fit that kind of node\n"
    rows = [["POD", "NODE", "CARDS", "NOTE"]]
    for landing in result.landings:
        if landing.denied:
            rows.append([landing.pod, "-", "-", f"denied at admission: {landing.denied}"])
        elif not landing.managed:
            rows.append([landing.pod, "-", "-", "asks for no GPU the extender places; not simulated"])
        elif landing.placed:
            note = f"as good: {', '.join(landing.ties[:3])}{' ...' if len(landing.ties) > 3 else ''}" if landing.ties else ""
            if landing.preempted:
                note = f"preempts {', '.join(landing.preempted)}" + (f"; {note}" if note else "")
            rows.append([landing.pod, landing.node, ",".join(f"GPU{i}" for i in landing.cards), note])
        else:
            rows.append(
                [landing.pod, "-", "-", "does not fit: " + ", ".join(sorted({str(c) for v in landing.verdicts for c in v.codes}))]
            )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    for landing in result.landings:
        if landing.managed and not landing.placed and not landing.denied:
            lines += ["", f"{landing.pod} does not fit:", *render.grouped(landing.verdicts)]
    if result.holds:
        lines += ["", *render.holds_lines(result.holds, now=now)]
    if asked_for_nodes:
        lines += ["", f"Nodes to add: {result.added}"]
    lines += ["", inspection.summary(result.states.values()).rstrip("\n")]
    return "\n".join(lines) + "\n"


# --- defrag ---------------------------------------------------------------------------------------


def make_plan(args: argparse.Namespace) -> defrag.Plan:
    target = None
    if args.for_file:
        settings = config.load(args.config, policies_dir=args.policies_dir)
        expanded = simulate.expand([d.object for d in manifests.read([args.for_file], stdin=sys.stdin)])
        outcomes = dryrun.evaluate(
            [manifests.Document(source=f"pod#{i}", object=p) for i, p in enumerate(expanded)], settings=settings
        )
        wanted = [o for o in outcomes if snapshot.is_gpu_pod(o.patched)]
        if not wanted:
            raise errors.InputError(f"{args.for_file}: no pod asking for a GPU the extender places")
        target = wanted[0].patched
        target.setdefault("metadata", {})["namespace"] = wanted[0].namespace
    nodes, pods, now = read_cluster(args)
    leases, ledger_namespace = read_ledgers(args)
    slices, claims = read_dra(args)
    cluster = analysis.Cluster(
        nodes, pods, now=now, leases=leases, ledger_namespace=ledger_namespace, slices=slices, claims=claims
    )
    return defrag.plan(cluster, pdbs=read_pdbs(args), target=target, max_moves=args.max_moves)


def plan_json(plan: defrag.Plan) -> dict[str, Any]:
    return {
        "goal": plan.goal,
        "moves": [
            {
                "pod": m.pod,
                "owner": m.owner,
                "memoryGiB": m.memory_gib,
                "from": {"node": m.node, "cards": list(m.cards)},
                "to": {"node": m.to_node, "cards": list(m.to_cards)},
            }
            for m in plan.moves
        ],
        "freed": [{"node": node, "cards": list(indices)} for node, indices in plan.freed],
        "targetNode": plan.target_node or None,
        "skipped": list(plan.skipped),
    }


def render_plan(plan: defrag.Plan, *, output: str) -> str:
    if output == "json":
        return json.dumps(plan_json(plan), indent=2) + "\n"
    if output == "yaml":
        return yaml.safe_dump(plan_json(plan), sort_keys=False)
    lines = [f"Goal: {plan.goal}"]
    if plan.moves:
        rows = [["#", "POD", "OWNER", "GiB", "FROM", "TO"]]
        for number, m in enumerate(plan.moves, 1):
            rows.append(
                [
                    str(number),
                    m.pod,
                    m.owner,
                    str(m.memory_gib),
                    f"{m.node} {','.join(f'GPU{i}' for i in m.cards)}",
                    f"{m.to_node} {','.join(f'GPU{i}' for i in m.to_cards)}",
                ]
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines += ["  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in rows]
    else:
        lines.append("No moves.")
    if plan.freed:
        lines.append(
            "Cards freed: " + "; ".join(f"{node} {','.join(f'GPU{i}' for i in indices)}" for node, indices in plan.freed)
        )
    if plan.target_node:
        lines.append(f"Then the pod fits on: {plan.target_node}")
    lines += [f"Skipped: {reason}" for reason in plan.skipped]
    return "\n".join(lines) + "\n"


def run_defrag_plan(args: argparse.Namespace) -> int:
    output.emit(render_plan(make_plan(args), output=args.output), path=args.output_file)
    return 0


def run_defrag_apply(args: argparse.Namespace) -> int:
    if args.snapshot:
        raise errors.InputError("defrag apply acts on the live cluster; --snapshot is for plans")
    plan = make_plan(args)
    output.emit(render_plan(plan, output=args.output), path=args.output_file)
    if not args.yes:
        print("(not applied: add --yes to evict)", file=sys.stderr)
        return 0
    client = _client(args)
    for number, move in enumerate(plan.moves, 1):
        problem = apply_move(client, move, freed=plan.freed, timeout=args.timeout)
        if problem:
            print(f"gpu-admission defrag: stopped at move {number} ({move.pod}): {problem}", file=sys.stderr)
            return 1
        print(f"moved {move.pod}: its replacement is scheduled", file=sys.stderr)
    return 0


def apply_move(
    client: extender_kube.KubeApi,
    move: defrag.Move,
    *,
    freed: Sequence[tuple[str, tuple[int, ...]]],
    timeout: float,
    clock: Any = time.monotonic,
    sleep: Any = time.sleep,
) -> str:
    """Evict one pod and wait for its replacement to be scheduled; "" when done, else the surprise."""
    base = f"/api/v1/namespaces/{move.namespace}/pods"
    try:
        current = client.request("GET", f"{base}/{move.name}")
    except kube_errors.NotFound:
        return "the pod is gone already"
    except kube_errors.KubeError as error:
        return f"cannot read the pod: {error}"
    if (current.get("metadata") or {}).get("uid") != move.uid or (current.get("spec") or {}).get("nodeName") != move.node:
        return "the pod changed since the plan was made"
    try:
        before = {(p.get("metadata") or {}).get("uid") for p in _owned(client, move)}
    except kube_errors.KubeError as error:
        return f"cannot list the controller's pods: {error}"
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": move.name, "namespace": move.namespace}}
    try:
        client.request("POST", f"{base}/{move.name}/eviction", body=body)
    except kube_errors.KubeError as error:
        return f"the eviction was refused (a PodDisruptionBudget?): {error}"
    deadline = clock() + timeout
    delay = 0.2
    while clock() < deadline:
        try:
            owned = _owned(client, move)
        except kube_errors.KubeError as error:
            return f"cannot list the replacement pods: {error}"
        for pod in owned:
            metadata = pod.get("metadata") or {}
            node = (pod.get("spec") or {}).get("nodeName")
            if metadata.get("uid") in before or not node or metadata.get("deletionTimestamp"):
                continue
            allocation = allocation_.pod_allocation(pod, now=time.time())
            held = set(allocation.cards) if allocation is not None else set()
            for freed_node, indices in freed:
                if node == freed_node and held & set(indices):
                    return f"the replacement {metadata.get('name')} landed on the card being freed ({node} {sorted(held)})"
            return ""
        sleep(delay)
        delay = min(delay * 1.5, 2.0)
    return f"no replacement was scheduled within {timeout:g} s"


def _owned(client: extender_kube.KubeApi, move: defrag.Move) -> list[dict[str, Any]]:
    pods, _ = client.list(f"/api/v1/namespaces/{move.namespace}/pods")
    return [
        p
        for p in pods
        if any(
            isinstance(r, dict) and r.get("uid") == move.owner_uid and r.get("controller") is True
            for r in (p.get("metadata") or {}).get("ownerReferences") or []
        )
    ]
