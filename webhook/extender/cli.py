"""`gpu-admission extender` (serve the scheduler extender) and `gpu-admission inspect` (the per-card
allocation table; also installed as `kubectl-inspect-cgpu`, so `kubectl inspect cgpu` works)."""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import datetime
import json
import logging
import pathlib
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from policies import settings
from policies.gpu import allocation, budgets, budgetusage, cards, dra, inspection, reservations
from policies.gpu import usage as policies_usage
from policies.settings import budgets as settings_budgets
from policies.settings import scheduling
from webhook import config
from webhook.cmdline import errors, flags, output
from webhook.config import watched
from webhook.extender import app, binder, budgeting, gates, kube, native, nudge, taints
from webhook.extender import store as store_module
from webhook.kube import errors as kube_errors
from webhook.serving import shell

log = logging.getLogger(__name__)

DEFAULT_PORT = 12345
KUBE_THREADS = 32  # blocking apiserver calls in flight at once (binds are I/O-bound)
INSPECT_OUTPUTS = ("table", "wide", "json", "yaml", "name")
TIDY_EVERY_S = 5.0  # how often stale reservation ledgers are looked for


def add_parser(subparsers: Any) -> None:
    """Register `extender` and `inspect` on the top-level CLI."""
    serve = subparsers.add_parser(
        "extender",
        help="run the kube-scheduler extender (POST /filter, /prioritize, /bind; GET /inspect, /healthz, /metrics)",
        description="Serve the kube-scheduler HTTP extender (extender/v1, nodeCacheCapable) that places "
        "aliyun.com/gpu-mem, aliyun.com/gpu-core.percentage and aliyun.com/gpu pods on a node and a card. "
        "HTTP unless a certificate and key are given; the certificate files (and the client CA bundle) are "
        "reloaded when they change and on SIGHUP. Port 0 picks a free port; the bound address is printed on "
        "stdout as 'listening on https://HOST:PORT'. /healthz answers 200 once nodes and pods are loaded; "
        "SIGTERM/SIGINT stop gracefully: /readyz answers 503, requests in flight finish (see --drain-seconds).",
    )
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to bind (default: {DEFAULT_PORT}; 0 picks one)")
    serve.add_argument("--host", default="0.0.0.0", help="address to bind (default: 0.0.0.0)")
    serve.add_argument(
        "--tls-cert-file", metavar="CRT", help="PEM serving certificate: serve HTTPS (needs --tls-private-key-file)"
    )
    serve.add_argument("--tls-private-key-file", metavar="KEY", help="PEM private key for --tls-cert-file")
    serve.add_argument(
        "--tls-client-ca-file",
        metavar="CA",
        help="require client certificates issued by this CA (kube-scheduler's tlsConfig certFile/keyFile) for "
        "the verbs and /inspect (not for /healthz, /readyz and /metrics): without it anyone who reaches the port can ask for binds",
    )
    flags.add_cert_check_interval(serve, what="the certificate files and the client CA bundle")
    flags.add_drain(serve)
    flags.add_cluster(serve)
    serve.add_argument(
        "--reservation-ttl",
        type=flags.positive_duration,
        default=allocation.DEFAULT_RESERVATION_TTL_S,
        metavar="DURATION",
        help="how long a card stays held for a pod whose bind did not complete "
        f"(default: {allocation.DEFAULT_RESERVATION_TTL_S:g}s; bare seconds as before)",
    )
    serve.add_argument(
        "--honour-out-of-band-usage",
        action="store_true",
        help="treat GPU memory held by out-of-band processes (no pod; from the labeler's gpu-admission.io/gpu-usage "
        "summary) as taken when picking a card; off by default: the summary can be up to one labeler interval old",
    )
    flags.add_ledger_namespace(serve, note="; every replica must name the same one")
    _add_config(serve)
    flags.add_logging(serve)
    serve.set_defaults(func=run_extender)

    show = subparsers.add_parser(
        "inspect",
        help="per-GPU allocation table of shared GPU nodes (also: kubectl inspect cgpu)",
        description="Print GPU memory allocated per card, as `kubectl inspect cgpu` does.",
    )
    add_inspect_arguments(show)
    show.set_defaults(func=run_inspect)


def add_inspect_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-d", "--details", action="store_true", help="one row per pod")
    flags.add_output(parser, INSPECT_OUTPUTS)
    flags.add_output_file(parser)
    flags.add_cluster(parser)
    flags.add_ledger_namespace(parser)
    _add_config(parser)
    parser.add_argument("node", nargs="*", help="only these nodes")


def _add_config(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="the webhook's settings YAML: where its `scheduler` names another GPU scheduler, say that its "
        "cards are not accounted here; the extender also keeps its `gpuBudgets` (read again when the file changes)",
    )


def scheduler_notice(path: str | None) -> str:
    """The profile's notice when the settings at `path` name another GPU scheduler ("" for ours).
    Only the `scheduler` section is read: the rest may name user policies not loaded here."""
    if path is None:
        return ""
    return config.load_section(path, lambda data: scheduling.scheduler((data or {}).get("scheduler"))).profile.notice


def budget_source(path: str | None) -> watched.SettingsFile[tuple[settings.Budget, ...]] | None:
    """The `gpuBudgets` of the settings file at `path`, read again when it changes; None without a file."""
    if path is None:
        return None
    return watched.SettingsFile(
        pathlib.Path(path),
        read=lambda found: config.load_section(found, settings.budgets_of),
        what="GPU budgets",
        describe=lambda found: f" ({len(found)} budgets)",
    )


# --- inspect --------------------------------------------------------------------------------------


def run_inspect(args: argparse.Namespace) -> int:
    notice = scheduler_notice(args.config)
    if notice:  # stderr: the table and the JSON on stdout keep their shape
        print(f"gpu-admission inspect: {notice}; the cards below show only what this project's extender placed", file=sys.stderr)
    client = kube.KubeApi(kube.load_client(args.kubeconfig, context=args.context))
    try:
        nodes, _ = client.list("/api/v1/nodes")
        pods, _ = client.list("/api/v1/pods")
    except kube_errors.KubeError as error:
        print(f"gpu-admission inspect: cannot read nodes and pods: {error}", file=sys.stderr)
        return 1
    try:
        leases = kube.list_ledger_leases(client, args.ledger_namespace)
    except kube_errors.KubeError as error:  # no access to the ledger namespace: bound pods still show
        log.warning(
            "cannot read the reservation ledgers in %s (%s); showing bound pods and Node ledgers only",
            args.ledger_namespace,
            error,
        )
        leases = []
    ledgers = reservations.leases_by_node(leases, namespace=args.ledger_namespace)
    slices, claims, problem = kube.list_dra(client)
    if problem:
        log.warning("%s", problem)
    held = dra.holds(slices, claims, namespace=args.ledger_namespace)
    grouped = cards.pods_by_node(pods)
    now = time.time()
    states = {
        str(node["metadata"]["name"]): cards.node_state(
            node,
            grouped.get(str(node["metadata"]["name"]), ()),
            now=now,
            reservations=reservations.union(node, ledgers.get(str(node["metadata"]["name"])), namespace=args.ledger_namespace),
            dra_holds=held.get(str(node["metadata"]["name"]), dra.NO_HOLDS),
        )
        for node in nodes
    }
    if args.node:
        missing = sorted(set(args.node) - set(states))
        if missing:
            raise errors.InputError(f"no such node: {', '.join(missing)}")
        states = {name: state for name, state in states.items() if name in args.node}
    real = inspection.node_usages(nodes)  # the labeler's usage summaries, where nodes carry one
    text = _inspect_text(args, states, usage=real)
    text = _with_unmatched(args, text, dra.unmatched(slices, claims, namespace=args.ledger_namespace))
    found = config.load_section(args.config, settings.budgets_of) if args.config is not None else ()
    if found:
        listed = {str(p.get("metadata", {}).get("namespace", "")): None for p in pods}
        try:
            namespaces, _ = client.list("/api/v1/namespaces")
        except kube_errors.KubeError as error:  # names still match; label selectors see the name label only
            log.warning("cannot read namespaces (%s); budgets chosen by label may be missed", error)
            namespaces = []
        labels = {str(n["metadata"]["name"]): dict(n["metadata"].get("labels") or {}) for n in namespaces}
        rows = []
        objects = budgetusage.listed(nodes=nodes, leases=leases, claims=claims, slices=slices, home=args.ledger_namespace)
        by_namespace: dict[str, list[dict[str, Any]]] = {}
        for item in pods:
            by_namespace.setdefault(str(item.get("metadata", {}).get("namespace", "")), []).append(item)
        for namespace in sorted(set(listed) | set(labels)):
            budget = settings_budgets.budget_for(found, namespace, labels.get(namespace))
            if budget is None:
                continue
            # The pods were listed before the Leases: an entry of a pod made since is no pod gone.
            used = budgetusage.namespace_usage(namespace, by_namespace.get(namespace, ()), objects, now=now, complete=False)
            rows.append(budgeting.row(namespace, budget, used))
        text = _with_budgets(args, text, rows)
    output.emit(text, path=args.output_file)
    return 0


def _with_budgets(args: argparse.Namespace, text: str, rows: list[dict[str, Any]]) -> str:
    """The views with the namespaces' GPU budgets (used / budget): a `budgets` list in JSON and
    YAML, a closing table in the text views; unchanged where no namespace has a budget."""
    if not rows or args.output == "name":
        return text
    if args.output == "json":
        return json.dumps({**json.loads(text), "budgets": rows}, indent=2) + "\n"
    if args.output == "yaml":
        return text + str(yaml.safe_dump({"budgets": rows}, sort_keys=False))
    lines = ["", "NAMESPACE  BUDGET  GPU MEMORY (USED/BUDGET GiB)  WHOLE CARDS (USED/BUDGET)"]
    for row in rows:
        cards_ = f"{row['cardsUsed']}/{row['cardsBudget']}" if row["cardsBudget"] is not None else f"{row['cardsUsed']}/-"
        memory = f"{budgets.gib(row['memoryUsedMiB'])}/{budgets.gib(row['memoryBudgetMiB'])}"
        lines.append(f"{row['namespace']}  {row['budget']}  {memory}  {cards_}")
        lines.extend(f"  charge unknown: {problem}" for problem in row["unknownCharges"])
    return text + "\n".join(lines) + "\n"


def _with_unmatched(args: argparse.Namespace, text: str, found: Sequence[dra.Held]) -> str:
    """The views with the DRA claims that match no card (`dra.unmatched`) added: a `draUnmatched`
    list in JSON and YAML, a closing section in the text views; unchanged where there is none."""
    if not found or args.output == "name":
        return text
    if args.output == "json":
        return json.dumps({**json.loads(text), "draUnmatched": dra.unmatched_json(found)}, indent=2) + "\n"
    if args.output == "yaml":
        return text + str(yaml.safe_dump({"draUnmatched": dra.unmatched_json(found)}, sort_keys=False))
    return text + dra.unmatched_text(found)


def _inspect_text(
    args: argparse.Namespace, states: dict[str, cards.NodeState], *, usage: Mapping[str, policies_usage.NodeUsage]
) -> str:
    if args.output == "json":
        return json.dumps(inspection.as_json(states.values(), usage=usage), indent=2) + "\n"
    if args.output == "yaml":
        document: Any = inspection.as_json(states.values(), usage=usage)
        return str(yaml.safe_dump(document, sort_keys=False))
    if args.output == "name":
        return inspection.names(states.values())
    if args.output == "wide":
        return inspection.wide(states.values(), usage=usage)
    if args.details:
        return inspection.details(states.values(), usage=usage)
    return inspection.summary(states.values(), usage=usage)


def inspect_main(argv: Sequence[str] | None = None) -> int:
    """The `kubectl-inspect-cgpu` console script: `kubectl inspect cgpu [-d] [-o json]`."""
    parser = argparse.ArgumentParser(prog="kubectl inspect cgpu", description="GPU memory allocated per card.")
    add_inspect_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_inspect(args)
    except errors.InputError as error:
        print(f"kubectl inspect cgpu: error: {error}", file=sys.stderr)
        return 2


# --- extender -------------------------------------------------------------------------------------


def run_extender(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise errors.InputError(f"--port must be 0-65535, not {args.port}")
    if bool(args.tls_cert_file) != bool(args.tls_private_key_file):
        raise errors.InputError("--tls-cert-file and --tls-private-key-file go together")
    if args.cert_check_interval <= datetime.timedelta(0):
        raise errors.InputError("--cert-check-interval must be positive")
    if not args.ledger_namespace.strip():
        raise errors.InputError("--ledger-namespace must name a namespace")
    flags.configure_logging(args)
    notice = scheduler_notice(args.config)
    budgets = budget_source(args.config)  # bad budgets stop the extender here, with the line naming the key
    if notice:
        log.warning("%s; this extender places and accounts only aliyun.com/gpu-mem, gpu-core.percentage and gpu pods", notice)
    if args.tls_client_ca_file and not args.tls_cert_file:
        raise errors.InputError("--tls-client-ca-file needs --tls-cert-file and --tls-private-key-file")
    certificates = (
        shell.files(
            shell.TlsFiles(
                cert_file=args.tls_cert_file,
                key_file=args.tls_private_key_file,
                client_ca_file=args.tls_client_ca_file or None,
                check_interval=args.cert_check_interval.total_seconds(),
            )
        )
        if args.tls_cert_file
        else None
    )
    client = kube.load_client(args.kubeconfig, context=args.context)
    asyncio.run(
        _serve(
            client,
            listen=shell.Listen(host=args.host, port=args.port),
            certificates=certificates,
            drain=shell.Drain(seconds=args.drain_seconds, idle_seconds=args.drain_idle_seconds),
            ttl=args.reservation_ttl,
            require_client_certificate=bool(args.tls_client_ca_file),
            honour_out_of_band=args.honour_out_of_band_usage,
            ledger_namespace=args.ledger_namespace,
            budgets=budgets,
        )
    )
    return 0


async def _serve(
    client: Any,
    *,
    listen: shell.Listen,
    certificates: shell.CertificateSource | None,
    drain: shell.Drain,
    ttl: float,
    require_client_certificate: bool,
    honour_out_of_band: bool = False,
    ledger_namespace: str = reservations.LEDGER_NAMESPACE,
    budgets: budgeting.Source | None = None,
) -> None:
    loop = asyncio.get_running_loop()
    loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=KUBE_THREADS, thread_name_prefix="kube"))
    # The bind path's requests on the event loop where the client's settings allow (`native`).
    kube_api = kube.KubeApi(client, session=native.Session.of(client.configuration, limit=kube.POOL_SIZE))
    cache = store_module.Store(honour_out_of_band=honour_out_of_band, namespace=ledger_namespace)
    if honour_out_of_band:
        log.info("honouring out-of-band GPU usage: cards offer their memory less what processes outside any pod hold")
    keeper = (
        budgeting.Keeper(kube_api, cache, budgets, home=ledger_namespace, identity=binder.default_identity())
        if budgets is not None
        else None
    )
    application = app.make_app(
        cache=cache,
        bind=binder.Binder(
            kube_api, ttl=ttl, cache=cache, honour_out_of_band=honour_out_of_band, namespace=ledger_namespace, keeper=keeper
        ),
        keeper=keeper,
        # The leader of the replicas' own election for it lifts the gates (and writes their Events).
        gatekeeper=gates.Gatekeeper(keeper, cache, kube_api, elector=gates.elector_for(client, namespace=ledger_namespace))
        if keeper is not None
        else None,
        settings=app.Settings(
            ttl=ttl, require_client_certificate=require_client_certificate, honour_out_of_band=honour_out_of_band
        ),
        watch=lambda running: kube.Watcher(kube_api, cache, loop=running, namespace=ledger_namespace),
        tidy_every=TIDY_EVERY_S,
        nudger=nudge.Nudger(kube_api.stamp_node),
        budgets=kube_api.list_budgets,
        taint_keeper=taints.Keeper(
            kube_api, cache, elector=taints.elector_for(client, namespace=ledger_namespace), ttl=ttl, namespace=ledger_namespace
        ),
        leases=kube_api,
        ledger_namespace=ledger_namespace,
    )
    server = shell.Shell(
        application, listen=listen, certificates=certificates, registry=application[app.METERS].registry, drain=drain
    )
    probe = asyncio.create_task(_lag_probe(), name="event loop lag probe") if log.isEnabledFor(logging.DEBUG) else None
    try:
        await server.run()
    finally:
        if probe is not None:
            probe.cancel()
        await kube_api.close()


LAG_PROBE_S = 0.05
LAG_LOGGED_S = 0.02


async def _lag_probe() -> None:
    """At debug level only: how late the event loop runs a timer, logged where later than
    `LAG_LOGGED_S` (a handler holding the loop, or the process waiting for a CPU on a busy
    machine): what the bind steps' times include besides the apiserver's answer."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + LAG_PROBE_S
        await asyncio.sleep(LAG_PROBE_S)
        late = loop.time() - due
        if late > LAG_LOGGED_S:
            log.debug("event loop %.0f ms late", late * 1000)


if __name__ == "__main__":  # pragma: no cover - convenience for running without the console script
    _parser = argparse.ArgumentParser(prog="gpu-admission")
    add_parser(_parser.add_subparsers(dest="command", required=True))
    _parsed = _parser.parse_args()
    try:
        sys.exit(_parsed.func(_parsed))
    except errors.InputError as _error:
        print(f"gpu-admission: error: {_error}", file=sys.stderr)
        sys.exit(2)
