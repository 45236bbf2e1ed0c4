"""The extender's apiserver requests and watches on the event loop: one aiohttp keep-alive session
that speaks with the `kubernetes` client's own settings (its server, TLS files and credentials).

Why (issue 19): through the `kubernetes` client each request costs a worker thread, the client's
serialization, urllib3 and `http.client` (whose header parsing is pure Python), about 0.5 ms of the
extender's CPU per call; the same request through aiohttp (its C HTTP parser, no thread hop) about
0.17 ms, measured against one local server (`bench/README.md`). A bound pod costs one Binding and a
share of a ledger Lease write, and binds that wait for a worker thread wait longer. A watch event
read from a thread and handed to the loop cost about 90 us of CPU, decoded and applied on the loop
about 55 (a 3.3 kB Pod event, the store's own work included); there are three to four per bound pod.

`Session.of` reproduces what the client's connection pool does with a `Configuration`: the server
(`host`), the CA (`ssl_ca_cert`, `ca_cert_data`) or no verification (`verify_ssl` False), the
client certificate (`cert_file`, `key_file`), `tls_server_name`, hostname checking switched off by
`assert_hostname` False, and the Authorization header of `auth_settings()` (bearer tokens; a
`refresh_api_key_hook`, as the in-cluster and exec-plugin credentials have, is called in a worker
thread at most every `REFRESH_S`). It returns None for a configuration it does not reproduce (a proxy, a
hostname to assert other than the server's): the caller keeps the client's own path then.

Three lanes, each its own pool of connections, so that one kind of request never waits for a
connection behind another: `REQUESTS` (the Bindings and reads, at most `limit` at once), `LEDGER`
(the ledger and hold Leases: a bind commit's write unblocks every bind queued on its node, so it
must not queue behind those binds' Binding POSTs), and `WATCH` (long-lived streams, no limit: each
holds its connection for as long as it runs).

Answers are raw: (status, reason, headers, body). No answer (refused, reset, timed out, TLS) is
`errors.Unreachable`, as `errors.translate` makes of the client's transport failures.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import ssl
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

import aiohttp

from webhook.kube import errors as kube_errors

log = logging.getLogger(__name__)

REFRESH_S = 10.0  # how often a refreshing credential is asked for its current value
USER_AGENT = "gpu-admission-extender"
REQUESTS, LEDGER, WATCH = "requests", "ledger", "watch"  # the lanes


@dataclasses.dataclass(frozen=True, kw_only=True)
class Answer:
    status: int
    reason: str
    headers: Mapping[str, str]
    body: bytes


class Session:
    """Requests to one apiserver over a pool of keep-alive connections (at most `limit` at once)."""

    def __init__(
        self,
        *,
        host: str,
        context: ssl.SSLContext | bool,
        server_hostname: str | None = None,
        configuration: Any = None,
        limit: int = 64,
    ) -> None:
        self._host = host.rstrip("/")
        self._context = context
        self._server_hostname = server_hostname
        self._configuration = configuration  # the client's Configuration, for its credentials
        self._limits = {REQUESTS: limit, LEDGER: limit, WATCH: 0}  # aiohttp: 0 is no limit
        self._sessions: dict[str, aiohttp.ClientSession] = {}
        self._authorization: str | None = None
        self._authorized_at = float("-inf")

    @classmethod
    def of(cls, configuration: Any, *, limit: int = 64) -> Session | None:
        """A session for the `kubernetes` client's `configuration`, or None where it uses something
        this session does not reproduce (then the client's own path is the one to use)."""
        host = str(configuration.host or "")
        if not host.startswith(("https://", "http://")):
            return None
        if configuration.proxy:
            return None
        if configuration.assert_hostname not in (None, False):
            return None
        context: ssl.SSLContext | bool = False
        if host.startswith("https://"):
            if configuration.verify_ssl:
                context = ssl.create_default_context(
                    cafile=configuration.ssl_ca_cert or None, cadata=configuration.ca_cert_data or None
                )
                if configuration.assert_hostname is False:
                    context.check_hostname = False
            else:
                context = ssl.create_default_context()
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            if configuration.cert_file:
                context.load_cert_chain(configuration.cert_file, configuration.key_file or None)
        return cls(
            host=host,
            context=context,
            server_hostname=configuration.tls_server_name or None,
            configuration=configuration,
            limit=limit,
        )

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: bytes | None = None,
        content_type: str = "application/json",
        timeout: float,
        what: str,
        lane: str = REQUESTS,
    ) -> Answer:
        """One request on `lane`'s connections; `errors.Unreachable` when no answer came."""
        session = self._open(lane)
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if body is not None:
            headers["Content-Type"] = content_type
        authorization = await self._credentials()
        if authorization:
            headers["Authorization"] = authorization
        try:
            async with session.request(
                method,
                self._host + path,
                params=list(query) or None,
                data=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout),
                server_hostname=self._server_hostname,
            ) as response:
                data = await response.read()
                return Answer(status=response.status, reason=response.reason or "", headers=response.headers, body=data)
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise kube_errors.Unreachable(f"{what}: {_reason(error)}") from error

    async def lines(
        self, path: str, *, query: Sequence[tuple[str, str]] = (), read_timeout: float, what: str
    ) -> AsyncGenerator[bytes, None]:
        """The non-empty lines of a streamed GET (a watch), as they come; a failing status is the
        `errors` type of the answer, a stream that breaks off `errors.Unreachable`."""
        session = self._open(WATCH)
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        authorization = await self._credentials()
        if authorization:
            headers["Authorization"] = authorization
        try:
            async with session.get(
                self._host + path,
                params=list(query) or None,
                headers=headers,
                server_hostname=self._server_hostname,
                timeout=aiohttp.ClientTimeout(total=None, connect=10.0, sock_read=read_timeout),
            ) as response:
                if not 200 <= response.status < 300:
                    data = await response.read()
                    raise kube_errors.translate(
                        kube_errors.Answer(
                            status=response.status, body=data, reason=response.reason or "", headers=response.headers
                        ),
                        what=what,
                    )
                pending = b""
                async for chunk in response.content.iter_any():  # no line-length limit (a Node can be large)
                    pending += chunk
                    *complete, pending = pending.split(b"\n")
                    for line in complete:
                        if line.strip():
                            yield line
                if pending.strip():
                    yield pending
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise kube_errors.Unreachable(f"{what}: {_reason(error)}") from error

    def _open(self, lane: str) -> aiohttp.ClientSession:
        session = self._sessions.get(lane)
        if session is None or session.closed:
            # Tracing costs every request a few calls (aiohttp signals each step): only at debug level.
            traces = []
            if log.isEnabledFor(logging.DEBUG):
                trace = aiohttp.TraceConfig()
                trace.on_connection_queued_start.append(_queued_start)
                trace.on_connection_queued_end.append(_queued_end)
                traces.append(trace)
            session = self._sessions[lane] = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._limits[lane], ssl=self._context),
                skip_auto_headers=("User-Agent",),
                trace_configs=traces or None,
            )
        return session

    async def _credentials(self) -> str | None:
        """The Authorization header's value: the configuration's, refreshed (in a worker thread,
        the hook may read a file or run a plugin) at most every `REFRESH_S` where it refreshes."""
        configuration = self._configuration
        if configuration is None:
            return None
        if configuration.refresh_api_key_hook is None:
            return _authorization(configuration)
        now = time.monotonic()
        if now - self._authorized_at >= REFRESH_S:
            self._authorization = await asyncio.to_thread(_authorization, configuration)
            self._authorized_at = now
        return self._authorization

    async def close(self) -> None:
        sessions, self._sessions = self._sessions, {}
        for session in sessions.values():
            await session.close()


async def _queued_start(session: aiohttp.ClientSession, context: Any, params: Any) -> None:
    context.queued_at = time.perf_counter()


async def _queued_end(session: aiohttp.ClientSession, context: Any, params: Any) -> None:
    """A request that waited for a free connection (all `limit` busy): say how long, at debug level."""
    log.debug("waited %.0f ms for a connection to the apiserver", (time.perf_counter() - context.queued_at) * 1000)


def _reason(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _authorization(configuration: Any) -> str | None:
    setting = configuration.auth_settings().get("BearerToken")
    if setting and setting.get("in") == "header" and setting.get("value"):
        return str(setting["value"])
    return None
