"""``gpu-admission serve``: run the admission webhook over HTTPS until SIGTERM or SIGINT.

Certificates, one of two ways:

- files (``--tls-cert-file``/``--tls-private-key-file``): the pair is loaded again whenever the files
  change (checked every ``--cert-check-interval``) and on SIGHUP, so a Secret mount renewed by
  cert-manager or ``gpu-admission certs rotate`` needs no restart.
- self-managed (``--self-managed-certs``): the CA and serving pair live in a Secret that this
  webhook creates, renews ahead of expiry and whose CA it injects into its own webhook
  configurations; one replica (the Lease holder) writes, every replica reloads (`webhook.certificates.provision`).

Either way a new pair goes into the live TLS context: new handshakes use it, nothing restarts.

Stopping (SIGTERM, SIGINT), for HA behind a Service: /readyz answers 503 at once and every response
carries ``Connection: close``. kube-apiserver's HTTP client does not retry a POST on a kept-alive
connection that the server closes under it, so the server must never close one that the client may
be about to use; instead each is closed right after answering a request on it. In two phases:

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
import dataclasses
import datetime
import gc
import logging
import os
import pathlib
import signal
import ssl
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator

from aiohttp import web
from aiohttp.typedefs import Handler

from certs import rotation
from policies import settings
from webhook import config, kube
from webhook.admission import clustercontext, configwatch
from webhook.cmdline import errors, flags
from webhook.kube import leader
from webhook.serving import metrics, metricsserver, tls, workers
from webhook.certificates import provision
from webhook.admission import app as admission_app
from webhook.admission import keys
from webhook.audit import background as audit_background

log = logging.getLogger(__name__)

DEFAULT_PORT = 8443
SHUTDOWN_TIMEOUT_S = 5.0
# Longer than the idle timeout of kube-apiserver's webhook client (Go's 90 s), so that the client,
# never the server, closes an idle kept-alive connection: a server-side close races a request sent
# on that connection, which Go does not retry.
KEEPALIVE_TIMEOUT_S = 120.0


@dataclasses.dataclass
class Drain:
    """Whether this server is draining: every response then closes its connection."""

    active: bool = False


DRAIN = web.AppKey("drain", Drain)


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
        type=_seconds,
        default=configwatch.DEFAULT_INTERVAL_S,
        metavar="DURATION",
        help="how often --config and --policies-dir are checked for changes and reloaded; an invalid "
        "change is refused and the last good configuration stays (default: 3s)",
    )
    parser.add_argument(
        "--drain-seconds",
        type=_seconds,
        default=0.0,
        metavar="S",
        help="on SIGTERM, keep accepting for S seconds, with readyz 503 and 'Connection: close' on every "
        "response (default: 0; in a Deployment: longer than endpoints take to drop the pod, e.g. 10)",
    )
    parser.add_argument(
        "--drain-idle-seconds",
        type=_seconds,
        default=0.0,
        metavar="S",
        help="then, with the listener closed, wait up to S seconds for clients to close their kept-alive "
        "connections (default: 0; kube-apiserver closes idle ones after 90 s, so e.g. 95)",
    )
    flags.add_logging(parser)
    files = parser.add_argument_group("certificates from files")
    files.add_argument("--tls-cert-file", metavar="CRT", help="PEM serving certificate (+ chain)")
    files.add_argument("--tls-private-key-file", metavar="KEY", help="PEM private key")
    files.add_argument(
        "--cert-check-interval",
        type=_duration,
        default=datetime.timedelta(seconds=10),
        metavar="DURATION",
        help="how often the files (or, self-managed, the Secret) are checked for a new pair (default: 10s)",
    )
    managed = parser.add_argument_group("self-managed certificates (--self-managed-certs)")
    managed.add_argument(
        "--self-managed-certs",
        action="store_true",
        help="keep a CA and serving pair in a Secret, renewed ahead of expiry, and inject the CA into the "
        "webhook configurations",
    )
    managed.add_argument("--namespace", metavar="NS", help="namespace of the Secret, Service and Lease (default: the pod's own)")
    managed.add_argument("--certs-secret", default=provision.SECRET, metavar="NAME", help=f"default: {provision.SECRET}")
    managed.add_argument(
        "--service", default=provision.SERVICE, metavar="NAME", help=f"Service the certificate is for (default: {provision.SERVICE})"
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
    managed.add_argument("--lease", default=provision.LEASE, metavar="NAME", help=f"Lease of the writing replica (default: {provision.LEASE})")
    managed.add_argument("--cert-validity", type=_duration, default=rotation.Policy().serving_validity, metavar="DURATION", help="default: 365d")
    managed.add_argument("--renew-before", type=_duration, default=rotation.SERVING_RENEW_BEFORE, metavar="DURATION", help="default: 60d")
    managed.add_argument("--ca-validity", type=_duration, default=rotation.Policy().ca_validity, metavar="DURATION", help="default: 3650d")
    managed.add_argument("--ca-renew-before", type=_duration, default=rotation.CA_RENEW_BEFORE, metavar="DURATION", help="default: 365d")
    managed.add_argument(
        "--ca-propagation-delay",
        type=_duration,
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
    # What exists now (modules, settings, compiled policies) lives as long as the process. Frozen,
    # the collector's full passes stop walking it: that took p99 on a 49 KB review at 300/s from
    # ~30 ms to ~6 ms (bench/README.md), and forked workers keep sharing those pages.
    gc.collect()
    gc.freeze()
    if args.workers > 1:
        if files:
            tls.read_pair(cert_file=args.tls_cert_file, key_file=args.tls_private_key_file)  # one error line, not one per worker
        with _metrics_directory() as directory:
            metrics.use_multiprocess(directory)
            return workers.supervise(args, serve_one=run, on_exit=metrics.worker_exited)
    tls.limit_read_buffers()
    certificates = _self_managed(args) if args.self_managed_certs else _files(args)
    context = clustercontext.from_args(args)  # before the loop: loading a kubeconfig reads files
    asyncio.run(_serve(loaded, args=args, certificates=certificates, context=context))
    return 0


@contextlib.contextmanager
def _metrics_directory() -> Iterator[pathlib.Path]:
    """This run's directory for the workers' metric files: ``$PROMETHEUS_MULTIPROC_DIR`` where the
    pod sets one (an emptyDir), else a fresh temporary one removed at exit. ``use_multiprocess``
    empties it first either way: an earlier run's counts must not add to this run's."""
    given = os.environ.get(metrics.MULTIPROC_ENV)
    if given:
        yield pathlib.Path(given)
        return
    with tempfile.TemporaryDirectory(prefix="gpu-admission-metrics-") as scratch:
        yield pathlib.Path(scratch)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Certificates:
    """The live TLS context and how to check for a new pair now (SIGHUP)."""

    context: ssl.SSLContext
    reload: Callable[[], None]


# An async context manager factory: given the expiry gauge, yields the live certificates for the
# server's lifetime and keeps them fresh in the background.
CertificateSource = Callable[[metrics.Gauge], contextlib.AbstractAsyncContextManager[Certificates]]


async def _serve(
    loaded: settings.Settings,
    *,
    args: argparse.Namespace,
    certificates: CertificateSource,
    context: clustercontext.Context | None = None,
) -> None:
    app = admission_app.make_app(loaded)
    if context is not None:
        context.install(app)
    app.cleanup_ctx.append(
        audit_background.background_audit(
            loaded, interval=args.audit_interval, kubeconfig=args.audit_kubeconfig, all_results=args.audit_all_results
        )
    )
    source = configwatch.Source(config_path=args.config, policies_dir=args.policies_dir)
    app.cleanup_ctx.append(configwatch.watch(source, interval_s=args.config_reload_interval))
    _add_drain(app)
    gauge = tls.expiry_gauge(app[keys.METRICS].registry)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S, keepalive_timeout=KEEPALIVE_TIMEOUT_S)
    async with certificates(gauge) as live:
        await runner.setup()
        try:
            site = await _listen(runner, host=args.host, port=args.port, context=live.context, reuse_port=args.reuse_port)
            plain = contextlib.AsyncExitStack()
            if args.metrics_port is not None:
                await plain.enter_async_context(
                    metricsserver.listening(app[keys.METRICS].registry, host=args.host, port=args.metrics_port, reuse_port=args.reuse_port)
                )
            stop, hurry = asyncio.Event(), asyncio.Event()
            loop = asyncio.get_running_loop()
            for number in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(number, _stop_then_hurry, stop, hurry)
            loop.add_signal_handler(signal.SIGHUP, live.reload)
            await stop.wait()
            await _drain(app, runner=runner, site=site, seconds=args.drain_seconds, idle_seconds=args.drain_idle_seconds, hurry=hurry)
            await plain.aclose()
        finally:
            await runner.cleanup()


async def _listen(runner: web.AppRunner, *, host: str, port: int, context: ssl.SSLContext, reuse_port: bool) -> web.TCPSite:
    site = web.TCPSite(runner, host, port, ssl_context=context, reuse_port=reuse_port or None)
    try:
        await site.start()
    except OSError as error:
        raise errors.InputError(f"cannot listen on {host}:{port}: {error.strerror or error}") from error
    for address in runner.addresses:
        # On stdout whatever the log level: with --port 0 this is how callers learn the port.
        print(f"listening on https://{address[0]}:{address[1]}", flush=True)
    return site


# --- draining -------------------------------------------------------------------------------------


def _add_drain(app: web.Application) -> None:
    app[DRAIN] = Drain()
    # A middleware, not on_response_prepare: that signal fires after the headers are settled.
    app.middlewares.append(_close_while_draining)


@web.middleware
async def _close_while_draining(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        response = await handler(request)
    except web.HTTPException as error:
        if request.app[DRAIN].active:
            error.force_close()
        raise
    if request.app[DRAIN].active:
        response.force_close()  # "Connection: close", and the connection ends after this response
    return response


def _stop_then_hurry(stop: asyncio.Event, hurry: asyncio.Event) -> None:
    if stop.is_set():
        hurry.set()
    stop.set()


async def _drain(
    app: web.Application, *, runner: web.AppRunner, site: web.TCPSite, seconds: float, idle_seconds: float, hurry: asyncio.Event
) -> None:
    """Not ready, every response closes its connection; accept for ``seconds``, then wait up to
    ``idle_seconds`` for the open connections to end (``hurry`` cuts both short)."""
    state = app[keys.STATE]
    state.ready, state.reason = False, "shutting down"
    app[DRAIN].active = True
    if seconds <= 0 and idle_seconds <= 0:
        log.info("uid=- shutting down")
        return
    if seconds > 0:
        log.info("uid=- draining: readyz 503, every response closes its connection; accepting for %gs", seconds)
        await _until(hurry, timeout=seconds)
    await site.stop()
    server = runner.server
    if idle_seconds > 0 and server is not None and not hurry.is_set():
        log.info("uid=- listener closed; waiting up to %gs for %d connection(s) to end", idle_seconds, len(server.connections))
        deadline = asyncio.get_running_loop().time() + idle_seconds
        while server.connections and not hurry.is_set() and asyncio.get_running_loop().time() < deadline:
            await _until(hurry, timeout=0.1)
        if server.connections:
            log.warning("uid=- closing %d connection(s) still open after the drain", len(server.connections))
    log.info("uid=- drained; finishing requests in flight")


async def _until(event: asyncio.Event, *, timeout: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout=timeout)


# --- certificates ---------------------------------------------------------------------------------


def _files(args: argparse.Namespace) -> CertificateSource:
    @contextlib.asynccontextmanager
    async def source(gauge: metrics.Gauge) -> AsyncIterator[Certificates]:
        serving = tls.Serving(tls.new_server_context(), gauge=gauge)
        watch = tls.FileWatch(serving, cert_file=args.tls_cert_file, key_file=args.tls_private_key_file)
        watch.start()
        task = asyncio.create_task(watch.run(interval=args.cert_check_interval.total_seconds()))
        try:
            yield Certificates(context=serving.context, reload=lambda: _sighup(watch))
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    return source


def _sighup(watch: tls.FileWatch) -> None:
    watch.reload(reason="SIGHUP", force=True)


def _self_managed(args: argparse.Namespace) -> CertificateSource:
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
    async def source(gauge: metrics.Gauge) -> AsyncIterator[Certificates]:
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
                    yield Certificates(context=manager.serving.context, reload=reload)
                finally:
                    for task in list(tasks):
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await task
        finally:
            kube.close(api)

    return source


def _duration(text: str) -> datetime.timedelta:
    try:
        return provision.duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error


def _seconds(text: str) -> float:
    return _duration(text).total_seconds()
