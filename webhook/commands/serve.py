"""``gpu-admission serve``: run the admission webhook over HTTPS until SIGTERM or SIGINT.

Certificates, one of two ways:

- files (``--tls-cert-file``/``--tls-private-key-file``): the pair is loaded again whenever the files
  change (checked every ``--cert-check-interval``) and on SIGHUP, so a Secret mount renewed by
  cert-manager or ``gpu-admission certs rotate`` needs no restart.
- self-managed (``--self-managed-certs``): the CA and serving pair live in a Secret that this
  webhook creates, renews ahead of expiry and whose CA it injects into its own webhook
  configurations; one replica (the Lease holder) writes, every replica reloads (`webhook.certificates.provision`).

Either way a new pair goes into the live TLS context: new handshakes use it, nothing restarts.

Listening, TLS, readiness, the drain on SIGTERM/SIGINT and the metrics listener are the serving
shell's (`webhook.serving.shell`), shared with the extender. Stopping, for HA behind a Service:
/readyz answers 503 at once and every response carries ``Connection: close`` (kube-apiserver does
not retry a POST on a kept-alive connection the server closes under it). In two phases:

1. ``--drain-seconds``: new connections are still accepted (endpoints take a moment to drop a
   terminating pod), each answered request closes its connection;
2. ``--drain-idle-seconds``: the listener is closed and the server waits for the connections it
   still has to end: used ones close after their answer, idle ones are closed by the client (Go
   drops a connection idle for 90 s). Whatever is left at the end is closed.

Then requests in flight finish (up to 5 s) and the process exits. Both default to 0 (stop at once,
as for a single local process); a second signal ends the drain early.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import gc
import logging
import os
import pathlib
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator

from certs import rotation
from policies import settings
from webhook import config, kube
from webhook.admission import app as admission_app
from webhook.admission import clustercontext, configwatch, decisioncache, keys
from webhook.audit import background as audit_background
from webhook.certificates import provision
from webhook.cmdline import errors, flags
from webhook.kube import leader
from webhook.serving import metrics, shell, tls, workers

log = logging.getLogger(__name__)

DEFAULT_PORT = 8443


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the admission webhook (HTTPS: /mutate, /validate, /healthz, /readyz, /metrics)",
        description="Serve the AdmissionReview v1 webhook over TLS 1.2+. Port 0 picks a free port; "
        "the bound address is printed on stdout as 'listening on https://HOST:PORT'. "
        "Certificates come from files (reloaded when they change, and on SIGHUP) or, with "
        "--self-managed-certs, from a Secret this webhook keeps renewed. SIGTERM/SIGINT stop "
        "gracefully (see --drain-seconds).",
    )
    parser.add_argument("--host", default="0.0.0.0", help="address to bind (default: 0.0.0.0)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to bind (default: {DEFAULT_PORT})")
    parser.add_argument(
        "--reuse-port",
        action="store_true",
        help="bind with SO_REUSEPORT, so that several processes share the port (the kernel spreads connections)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="serve from N processes on the port (SO_REUSEPORT; one review uses one core, so N is the number "
        "of cores to use; each prints its own 'listening on' line; default: 1)",
    )
    parser.add_argument(
        "--decision-cache-entries",
        type=flags.non_negative_int,
        default=decisioncache.DEFAULT_MAX_ENTRIES,
        metavar="N",
        help="how many decisions each worker remembers, so that replicas of one pod template are judged "
        f"once (least recently used go first; 0 turns the cache off; default: {decisioncache.DEFAULT_MAX_ENTRIES})",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="also serve /metrics over plain HTTP on PORT, for scrapers without the webhook's CA "
        "(printed as 'metrics on http://HOST:PORT/metrics'; default: /metrics on the HTTPS port only)",
    )
    parser.add_argument("--config", metavar="FILE", help="settings YAML (policy actions, exempt namespaces, ...)")
    audit_background.add_serve_arguments(parser)
    clustercontext.add_serve_arguments(parser)
    parser.add_argument("--policies-dir", metavar="DIR", help="directory of user (CEL) policy YAML files")
    parser.add_argument(
        "--config-reload-interval",
        type=flags.duration,
        default=configwatch.DEFAULT_INTERVAL_S,
        metavar="DURATION",
        help="how often --config and --policies-dir are checked for changes and reloaded; an invalid "
        "change is refused and the last good configuration stays (default: 3s)",
    )
    flags.add_drain(parser)
    flags.add_logging(parser)
    files = parser.add_argument_group("certificates from files")
    files.add_argument("--tls-cert-file", metavar="CRT", help="PEM serving certificate (+ chain)")
    files.add_argument("--tls-private-key-file", metavar="KEY", help="PEM private key")
    flags.add_cert_check_interval(files, what="the files (or, self-managed, the Secret)")
    managed = parser.add_argument_group("self-managed certificates (--self-managed-certs)")
    managed.add_argument(
        "--self-managed-certs",
        action="store_true",
        help="keep a CA and serving pair in a Secret, renewed ahead of expiry, and inject the CA into the webhook configurations",
    )
    flags.add_namespaces(
        managed, namespace_help="namespace of the Secret, Service and Lease (default: the pod's own)", all_help=None
    )
    managed.add_argument("--certs-secret", default=provision.SECRET, metavar="NAME", help=f"default: {provision.SECRET}")
    managed.add_argument(
        "--service",
        default=provision.SERVICE,
        metavar="NAME",
        help=f"Service the certificate is for (default: {provision.SERVICE})",
    )
    managed.add_argument(
        "--webhook-configuration",
        default=provision.WEBHOOK_CONFIGURATION,
        metavar="NAME",
        help="Mutating- and ValidatingWebhookConfiguration whose every caBundle is kept in step "
        f"(default: {provision.WEBHOOK_CONFIGURATION}; '' for none)",
    )
    managed.add_argument(
        "--cert-host", action="append", default=[], metavar="NAME", help="one more SAN (DNS name or IP), repeatable"
    )
    managed.add_argument(
        "--lease", default=provision.LEASE, metavar="NAME", help=f"Lease of the writing replica (default: {provision.LEASE})"
    )
    managed.add_argument(
        "--cert-validity",
        type=flags.duration_delta,
        default=rotation.Policy().serving_validity,
        metavar="DURATION",
        help="default: 365d",
    )
    managed.add_argument(
        "--renew-before",
        type=flags.duration_delta,
        default=rotation.SERVING_RENEW_BEFORE,
        metavar="DURATION",
        help="default: 60d",
    )
    managed.add_argument(
        "--ca-validity",
        type=flags.duration_delta,
        default=rotation.Policy().ca_validity,
        metavar="DURATION",
        help="default: 3650d",
    )
    managed.add_argument(
        "--ca-renew-before", type=flags.duration_delta, default=rotation.CA_RENEW_BEFORE, metavar="DURATION", help="default: 365d"
    )
    managed.add_argument(
        "--ca-propagation-delay",
        type=flags.duration_delta,
        default=rotation.CA_PROPAGATION,
        metavar="DURATION",
        help="after a new CA is injected, how long before a serving certificate from it is used (default: 60s)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise errors.InputError(f"--port must be 0-65535, not {args.port}")
    files = args.tls_cert_file is not None or args.tls_private_key_file is not None
    if args.self_managed_certs == files:
        raise errors.InputError("give either --tls-cert-file and --tls-private-key-file, or --self-managed-certs")
    if files and (args.tls_cert_file is None or args.tls_private_key_file is None):
        raise errors.InputError("--tls-cert-file and --tls-private-key-file go together")
    if args.cert_check_interval <= datetime.timedelta(0):
        raise errors.InputError("--cert-check-interval must be positive")
    if args.workers < 1:
        raise errors.InputError(f"--workers must be at least 1, not {args.workers}")
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        raise errors.InputError(f"--metrics-port must be 0-65535, not {args.metrics_port}")
    flags.configure_logging(args)
    loaded = config.load(args.config, policies_dir=args.policies_dir)
    if args.workers > 1 and clustercontext.has_access(args):
        _import_cluster_client()
    # What exists now (modules, settings, compiled policies) lives as long as the process. Frozen,
    # the collector's full passes stop walking it: that took p99 on a 49 KB review at 300/s from
    # ~30 ms to ~6 ms (bench/README.md), and forked workers keep sharing those pages.
    gc.collect()
    gc.freeze()
    if args.workers > 1:
        if files:
            tls.read_pair(cert_file=args.tls_cert_file, key_file=args.tls_private_key_file)  # one error line, not one per worker
        with _metrics_directory() as (directory, scratch):
            metrics.use_multiprocess(directory)
            return workers.supervise(
                args,
                serve_one=run,
                on_exit=metrics.worker_exited,
                reexec=_command_line(),
                remove_at_exit=str(directory) if scratch else None,
            )
    certificates = _self_managed(args) if args.self_managed_certs else _files(args)
    context = clustercontext.from_args(args)  # before the loop: loading a kubeconfig reads files
    asyncio.run(_serve(loaded, args=args, certificates=certificates, context=context))
    return 0


def _import_cluster_client() -> None:
    """Import the kubernetes client now, before the workers are forked, where they will reach a
    cluster: each worker would otherwise import it on its first use (``webhook.kube.lazy``) into
    pages of its own (the client and its models, urllib3, oauthlib, pydantic); imported here, the
    workers share one copy: two idle workers and the supervisor 92 MiB of PSS instead of 129
    (bench/README.md)."""
    for module in (kube.client, kube.client_exceptions, kube.watch, kube.urllib3):  # the package brings its config
        _ = module.__name__  # a lazy module's first attribute read imports it
    # The API classes the serving path uses; the first read of one imports the client's models.
    for api in ("CoreV1Api", "CoordinationV1Api"):
        getattr(kube.client, api)


def _command_line() -> list[str] | None:
    """This process's ``serve`` command line, to start a worker afresh from (``workers.supervise``),
    where this process is that command (not ``run`` called from within another program)."""
    if "serve" not in sys.argv[1:]:
        return None
    return [sys.executable, "-m", "webhook.cli", *sys.argv[1:]]


@contextlib.contextmanager
def _metrics_directory() -> Iterator[tuple[pathlib.Path, bool]]:
    """This run's directory for the workers' metric files, and whether it is a scratch one:
    ``$PROMETHEUS_MULTIPROC_DIR`` where the pod sets one (an emptyDir), else a fresh temporary one
    removed at exit (by the small supervisor, where ``serve`` execs one). ``use_multiprocess``
    empties it first either way: an earlier run's counts must not add to this run's."""
    given = os.environ.get(metrics.MULTIPROC_ENV)
    if given:
        yield pathlib.Path(given), False
        return
    with tempfile.TemporaryDirectory(prefix="gpu-admission-metrics-") as scratch:
        yield pathlib.Path(scratch), True


async def _serve(
    loaded: settings.Settings,
    *,
    args: argparse.Namespace,
    certificates: shell.CertificateSource,
    context: clustercontext.Context | None = None,
) -> None:
    app = admission_app.make_app(loaded, decision_cache_entries=args.decision_cache_entries)
    if context is not None:
        context.install(app)
    app.cleanup_ctx.append(
        audit_background.background_audit(
            loaded,
            interval=args.audit_interval,
            kubeconfig=args.kubeconfig,
            context=args.context,
            all_results=args.audit_all_results,
            registry=app[keys.METRICS].registry,
        )
    )
    source = configwatch.Source(config_path=args.config, policies_dir=args.policies_dir)
    app.cleanup_ctx.append(configwatch.watch(source, interval_s=args.config_reload_interval))
    server = shell.Shell(
        app,
        listen=shell.Listen(host=args.host, port=args.port, reuse_port=args.reuse_port, metrics_port=args.metrics_port),
        certificates=certificates,
        registry=app[keys.METRICS].registry,
        drain=shell.Drain(seconds=args.drain_seconds, idle_seconds=args.drain_idle_seconds),
    )
    await server.run()


# --- certificates ---------------------------------------------------------------------------------


def _files(args: argparse.Namespace) -> shell.CertificateSource:
    return shell.files(
        shell.TlsFiles(
            cert_file=args.tls_cert_file,
            key_file=args.tls_private_key_file,
            check_interval=args.cert_check_interval.total_seconds(),
        )
    )


def _self_managed(args: argparse.Namespace) -> shell.CertificateSource:
    try:
        policy = rotation.Policy(
            serving_validity=args.cert_validity,
            serving_renew_before=args.renew_before,
            ca_validity=args.ca_validity,
            ca_renew_before=args.ca_renew_before,
            ca_propagation=args.ca_propagation_delay,
        )
    except rotation.InvalidPolicy as error:
        raise errors.InputError(str(error)) from error
    namespace = args.namespace or kube.own_namespace()
    target = provision.Target(
        namespace=namespace,
        secret=args.certs_secret,
        service=args.service,
        webhook_configuration=args.webhook_configuration,
        extra_hosts=tuple(args.cert_host),
    )
    if not target.hosts:
        raise errors.InputError("no host for the certificate: give --service or --cert-host")
    interval = args.cert_check_interval.total_seconds()

    @contextlib.asynccontextmanager
    async def source(gauge: metrics.Gauge | None) -> AsyncIterator[shell.Certificates]:
        api = kube.api_client(args.kubeconfig, context=args.context)
        try:
            store = provision.SecretStore(api, namespace=target.namespace, name=target.secret)
            clients: provision.Clients = (
                provision.WebhookClients(api, name=target.webhook_configuration)
                if target.webhook_configuration
                else provision.NoClients()
            )
            elector = leader.Elector(
                leader.KubeLeaseStore(api, namespace=target.namespace, name=args.lease),
                namespace=target.namespace,
                name=args.lease,
                identity=leader.identity(),
                retry_s=min(leader.DEFAULT_RETRY_S, interval),
                labels=provision.LABELS,
            )
            manager = provision.Manager(store, clients, hosts=target.hosts, elector=elector, policy=policy, interval=interval)
            log.info("uid=- self-managed certificates in %s for %s", store.describe(), ", ".join(target.hosts))
            material = await manager.bootstrap(retry_s=min(2.0, interval))
            manager.serving = tls.Serving(tls.new_server_context(), gauge=gauge)
            manager.apply(material)
            async with leader.elected(elector):
                tasks = {asyncio.create_task(manager.run())}

                def reload() -> None:  # SIGHUP: one pass now; the set keeps the task referenced
                    tick = asyncio.create_task(manager.tick())
                    tasks.add(tick)
                    tick.add_done_callback(tasks.discard)

                try:
                    yield shell.Certificates(context=manager.serving.context, reload=reload)
                finally:
                    for task in list(tasks):
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await task
        finally:
            kube.close(api)

    return source
