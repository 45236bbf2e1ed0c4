"""The one serving shell of every HTTPS server here (``serve``, ``extender``): listen, TLS that follows
its files, readiness, drain on SIGTERM/SIGINT, reload on SIGHUP, the plain-HTTP metrics listener.

Given an aiohttp ``Application``, where to listen and where its certificates come from, `Shell.run`
serves until stopped, then drains and returns (the command exits 0):

- **listen**: one TCP site (``reuse_port`` for ``serve --workers``); the bound address is printed
  on stdout, whatever the log level, as ``listening on https://HOST:PORT`` (``http://`` without
  TLS): with port 0 that line is how callers learn the port.
- **TLS**: a `CertificateSource` yields the live context for the server's lifetime and keeps it
  fresh (`files`: the serving pair, and the client CA bundle where clients are verified, reloaded
  when the files change and on SIGHUP; ``serve --self-managed-certs`` brings its own). New
  handshakes use the new material; established connections keep theirs (`webhook.serving.tls`).
- **readiness**: while draining, the readiness path answers 503 ``not ready: shutting down``
  before the app sees it, whatever the app would say, so endpoints drop the pod.
- **drain** (`Drain`): the first `Shell.stop` (SIGTERM, SIGINT) turns readiness false and makes
  every response close its connection (``Connection: close``); for ``seconds`` new connections are
  still accepted (endpoints take a moment to drop a terminating pod); then the listener closes
  (new connections are refused) and, for up to ``idle_seconds``, the server waits for clients to
  close their kept-alive connections. Requests in flight then get up to ``grace_seconds`` to
  finish before the rest is closed. A second stop cuts the waiting short.

Why responses close their connections rather than the server closing idle ones: Go's HTTP client
(kube-apiserver calling a webhook, kube-scheduler calling an extender) does not retry a POST on a
kept-alive connection that the server closes under it, so the server must never close one the
client may be about to use; a connection is closed right after answering a request on it instead.
For the same reason the keep-alive timeout (120 s) outlasts Go's idle timeout (90 s): the client,
never the server, ends an idle connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import ssl
import sys
from collections.abc import AsyncIterator, Callable, Iterator

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from webhook.cmdline import errors
from webhook.serving import metrics, metricsserver, tls

log = logging.getLogger(__name__)

GRACE_S = 5.0
KEEPALIVE_TIMEOUT_S = 120.0
READINESS_PATH = "/readyz"
_POLL_S = 0.1  # how often the idle phase looks whether the last connections have ended


@dataclasses.dataclass
class Draining:
    """Whether this server is draining: readiness is false and every response closes its connection."""

    active: bool = False


DRAINING = web.AppKey("draining", Draining)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Listen:
    """Where to listen: ``port`` 0 picks a free port; ``metrics_port`` adds the plain-HTTP
    ``/metrics`` listener (`webhook.serving.metricsserver`) on the same host."""

    host: str
    port: int
    reuse_port: bool = False
    metrics_port: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Drain:
    """How a stop drains (see the module docstring); all zero but the grace: stop at once."""

    seconds: float = 0.0
    idle_seconds: float = 0.0
    grace_seconds: float = GRACE_S


@dataclasses.dataclass(frozen=True, kw_only=True)
class Certificates:
    """The live TLS context and how to check for new material now (SIGHUP)."""

    context: ssl.SSLContext
    reload: Callable[[], None]


# An async context manager factory: given the expiry gauge, yields the live certificates for the
# server's lifetime and keeps them fresh in the background.
CertificateSource = Callable[[metrics.Gauge | None], contextlib.AbstractAsyncContextManager[Certificates]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class TlsFiles:
    """Certificates from files: the serving pair and, to verify clients, the CA bundle they trust.

    ``check_interval`` is how often the files are looked at for a change (seconds)."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None
    check_interval: float = 10.0


def files(source: TlsFiles) -> CertificateSource:
    """The `CertificateSource` of files: loaded now (a bad one is an ``InputError``: nothing to
    serve), again whenever they change and on SIGHUP (forced)."""

    @contextlib.asynccontextmanager
    async def live(gauge: metrics.Gauge | None) -> AsyncIterator[Certificates]:
        serving = tls.Serving(tls.new_server_context(), gauge=gauge)
        watch = tls.FileWatch(serving, cert_file=source.cert_file, key_file=source.key_file, client_ca_file=source.client_ca_file)
        watch.start()
        task = asyncio.create_task(watch.run(interval=source.check_interval), name="certificate files")
        try:
            yield Certificates(context=serving.context, reload=lambda: _sighup(watch))
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    return live


def announce(line: str) -> None:
    """Print ``line`` on stdout in one write: unbuffered (``python -u``), ``print`` writes the text and
    its newline apart, and a reader sharing the file with stderr could see half a port number."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _sighup(watch: tls.FileWatch) -> None:
    watch.reload(reason="SIGHUP", force=True)


def install(app: web.Application, *, readiness_path: str = READINESS_PATH) -> Draining:
    """Give ``app`` the drain's state and middleware (`Shell` does; for in-process tests)."""
    state = app[DRAINING] = Draining()
    app.middlewares.append(_draining_middleware(readiness_path))
    return state


def _draining_middleware(readiness_path: str) -> Middleware:
    # A middleware, not on_response_prepare: that signal fires after the headers are settled.
    @web.middleware
    async def while_draining(request: web.Request, handler: Handler) -> web.StreamResponse:
        draining = request.app[DRAINING].active
        if draining and request.path == readiness_path:
            response: web.StreamResponse = web.Response(status=503, text="not ready: shutting down\n")
        else:
            try:
                response = await handler(request)
            except web.HTTPException as error:
                if request.app[DRAINING].active:
                    error.force_close()
                raise
        if request.app[DRAINING].active:
            response.force_close()  # "Connection: close", and the connection ends after this response
        return response

    return while_draining


class Shell:
    """Serves ``app`` (see the module docstring). ``certificates`` None: plain HTTP.

    ``registry``, where given, gets the certificate expiry gauge and is what ``metrics_port``
    serves. ``signals``: SIGTERM/SIGINT call `stop` and SIGHUP `reload` (off for in-process use)."""

    def __init__(
        self,
        app: web.Application,
        *,
        listen: Listen,
        certificates: CertificateSource | None,
        registry: metrics.Registry | None = None,
        drain: Drain = Drain(),
        readiness_path: str = READINESS_PATH,
        keepalive_timeout: float = KEEPALIVE_TIMEOUT_S,
        signals: bool = True,
    ) -> None:
        if listen.metrics_port is not None and registry is None:
            raise ValueError("a metrics port needs the registry it serves")
        self.app = app
        self.listen = listen
        self.certificates = certificates
        self.registry = registry
        self.drain = drain
        self.readiness_path = readiness_path
        self.keepalive_timeout = keepalive_timeout
        self.signals = signals
        self.addresses: list[tuple[str, int]] = []
        self.metrics_port: int | None = None
        self.listening = asyncio.Event()
        self._stop = asyncio.Event()
        self._hurry = asyncio.Event()
        self._reload: Callable[[], None] = lambda: None
        self._draining = Draining()

    def stop(self) -> None:
        """Start the drain; a second call cuts its waits short."""
        if self._stop.is_set():
            self._hurry.set()
        self._stop.set()

    def reload(self) -> None:
        """Check the certificates for new material now (SIGHUP)."""
        self._reload()

    async def run(self) -> None:
        """Listen, serve until `stop`, drain, then return."""
        tls.limit_read_buffers()
        self._draining = install(self.app, readiness_path=self.readiness_path)
        gauge = tls.expiry_gauge(self.registry) if self.registry is not None and self.certificates is not None else None
        async with contextlib.AsyncExitStack() as stack:
            # First in, last out: a second signal while requests finish must not kill the process.
            stack.enter_context(self._signal_handlers())
            context: ssl.SSLContext | None = None
            if self.certificates is not None:
                live = await stack.enter_async_context(self.certificates(gauge))
                context, self._reload = live.context, live.reload
            runner = web.AppRunner(
                self.app, access_log=None, shutdown_timeout=self.drain.grace_seconds, keepalive_timeout=self.keepalive_timeout
            )
            await runner.setup()
            stack.push_async_callback(runner.cleanup)  # in-flight requests get the grace, then the app's cleanup runs
            site = await self._start(runner, context)
            if self.listen.metrics_port is not None and self.registry is not None:
                self.metrics_port = await stack.enter_async_context(
                    metricsserver.listening(
                        self.registry, host=self.listen.host, port=self.listen.metrics_port, reuse_port=self.listen.reuse_port
                    )
                )
            self.listening.set()
            await self._stop.wait()
            await self._drain(runner, site)

    async def _start(self, runner: web.AppRunner, context: ssl.SSLContext | None) -> web.TCPSite:
        listen = self.listen
        site = web.TCPSite(runner, listen.host, listen.port, ssl_context=context, reuse_port=listen.reuse_port or None)
        try:
            await site.start()
        except OSError as error:
            raise errors.InputError(f"cannot listen on {listen.host}:{listen.port}: {error.strerror or error}") from error
        scheme = "http" if context is None else "https"
        for address in runner.addresses:
            self.addresses.append((str(address[0]), int(address[1])))
            # On stdout whatever the log level: with port 0 this is how callers learn the port.
            announce(f"listening on {scheme}://{address[0]}:{address[1]}")
        return site

    @contextlib.contextmanager
    def _signal_handlers(self) -> Iterator[None]:
        if not self.signals:
            yield
            return
        loop = asyncio.get_running_loop()
        for number in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(number, self.stop)
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        try:
            yield
        finally:
            for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(number)

    async def _drain(self, runner: web.AppRunner, site: web.TCPSite) -> None:
        self._draining.active = True
        seconds, idle_seconds = self.drain.seconds, self.drain.idle_seconds
        if seconds <= 0 and idle_seconds <= 0:
            log.info("uid=- shutting down")
            await site.stop()
            return
        if seconds > 0:
            log.info("uid=- draining: readyz 503, every response closes its connection; accepting for %gs", seconds)
            await self._until_hurried(timeout=seconds)
        await site.stop()
        server = runner.server
        if idle_seconds > 0 and server is not None and not self._hurry.is_set():
            log.info(
                "uid=- listener closed; waiting up to %gs for %d connection(s) to end", idle_seconds, len(server.connections)
            )
            loop = asyncio.get_running_loop()
            deadline = loop.time() + idle_seconds
            while server.connections and not self._hurry.is_set() and loop.time() < deadline:
                await self._until_hurried(timeout=_POLL_S)
            if server.connections:
                log.warning("uid=- closing %d connection(s) still open after the drain", len(server.connections))
        log.info("uid=- drained; finishing requests in flight")

    async def _until_hurried(self, *, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._hurry.wait(), timeout=timeout)
