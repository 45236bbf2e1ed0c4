"""The serving shell, in-process on 127.0.0.1 with real TLS: a request in flight at the stop completes
and the listener closes behind it; readiness turns false during the drain while liveness stays; a
reload serves a new pair to new handshakes while established connections keep theirs; the trusted
client CAs follow their bundle (a CA dropped from it is no longer trusted)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509

from certs import authority
from webhook.certificates import certfiles
from webhook.cmdline import errors
from webhook.serving import metrics, shell, tls

NOW = datetime.datetime.now(datetime.UTC)
DEADLINE_S = 10.0  # for polls only; nothing here asserts how fast anything is
ENTERED = web.AppKey("entered", asyncio.Event)
RELEASE = web.AppKey("release", asyncio.Event)


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    certfiles.generate(out_dir=tmp_path, hosts=("127.0.0.1",), now=NOW)
    return tmp_path


def slow_app() -> web.Application:
    """``/slow`` answers once the test releases it; ``/readyz`` always says ready (the shell overrides it)."""
    app = web.Application()
    app[ENTERED], app[RELEASE] = asyncio.Event(), asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        request.app[ENTERED].set()
        await request.app[RELEASE].wait()
        return web.Response(text="finished\n")

    async def ready(_request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def alive(_request: web.Request) -> web.Response:
        return web.Response(text="alive\n")

    app.router.add_get("/slow", slow)
    app.router.add_get("/readyz", ready)
    app.router.add_get("/healthz", alive)
    return app


def client_context(pki: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(pki / "ca.crt"))


@contextlib.asynccontextmanager
async def serving(server: shell.Shell) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``server`` until the block ends; the block gets the task (await it to see the run end)."""
    task = asyncio.create_task(server.run())
    listening = asyncio.create_task(server.listening.wait())
    await asyncio.wait({task, listening}, timeout=DEADLINE_S, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()  # raises what stopped it from starting
    assert server.listening.is_set(), "the shell did not start listening"
    try:
        yield task
    finally:
        listening.cancel()
        if not task.done():
            server.stop()
            server.stop()
            await asyncio.wait_for(task, timeout=DEADLINE_S)


def make_shell(app: web.Application, pki: Path, **options: Any) -> shell.Shell:
    files = shell.TlsFiles(cert_file=str(pki / "tls.crt"), key_file=str(pki / "tls.key"), check_interval=3600)
    return shell.Shell(
        app, listen=shell.Listen(host="127.0.0.1", port=0), certificates=shell.files(files), signals=False, **options
    )


async def refused(port: int) -> bool:
    """Whether a new connection to ``port`` is refused now (one caught in the backlog as the
    listener closed is reset instead: not an answer yet)."""
    try:
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except ConnectionRefusedError:
        return True
    except ConnectionResetError:
        return False
    writer.close()
    return False


async def poll(check: Callable[[], Any], *, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + DEADLINE_S
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, f"never: {what}"
        await asyncio.sleep(0.02)  # polling a condition, with a deadline


async def test_a_request_in_flight_at_the_stop_completes_with_200_and_new_connections_are_refused_after(pki: Path) -> None:
    app = slow_app()
    server = make_shell(app, pki)
    async with serving(server) as task, aiohttp.ClientSession() as session:
        port = server.addresses[0][1]
        url = f"https://127.0.0.1:{port}/slow"
        in_flight = asyncio.create_task(session.get(url, ssl=client_context(pki)))
        await asyncio.wait_for(app[ENTERED].wait(), timeout=DEADLINE_S)
        server.stop()
        await poll(lambda: refused(port), what="the listener closed")
        assert not in_flight.done(), "the request in flight was cut off"
        app[RELEASE].set()
        answer = await asyncio.wait_for(in_flight, timeout=DEADLINE_S)
        assert (answer.status, await answer.text(), answer.headers["Connection"]) == (200, "finished\n", "close")
        await asyncio.wait_for(task, timeout=DEADLINE_S)  # the run ends by itself, without an error
        assert task.exception() is None


async def test_readiness_is_false_during_the_drain_while_liveness_still_answers(pki: Path) -> None:
    registry = metrics.Registry()
    server = make_shell(slow_app(), pki, drain=shell.Drain(seconds=3600), registry=registry)
    async with serving(server) as task, aiohttp.ClientSession() as session:
        base = f"https://127.0.0.1:{server.addresses[0][1]}"
        context = client_context(pki)

        async def get(path: str) -> tuple[int, str, str | None]:
            async with session.get(base + path, ssl=context) as answer:
                return answer.status, await answer.text(), answer.headers.get("Connection")

        assert await get("/readyz") == (200, "ok\n", None)
        server.stop()

        async def draining() -> bool:
            return (await get("/readyz"))[:2] == (503, "not ready: shutting down\n")

        await poll(draining, what="readyz 503 during the drain")
        assert await get("/readyz") == (503, "not ready: shutting down\n", "close"), "whatever the app's own readyz says"
        assert await get("/healthz") == (200, "alive\n", "close"), "liveness stays; each answer closes its connection"
        assert not task.done(), "still accepting: the drain window is open"
        server.stop()  # a second stop ends the drain window early
        await asyncio.wait_for(task, timeout=DEADLINE_S)
        assert await refused(server.addresses[0][1])
    expiry = metrics.sample(registry.render(), tls.EXPIRY_METRIC, certificate="serving")
    assert expiry == x509.load_pem_x509_certificate((pki / "tls.crt").read_bytes()).not_valid_after_utc.timestamp()


def _serial(sock: ssl.SSLSocket) -> int:
    der = sock.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def _exchange(sock: ssl.SSLSocket, path: str) -> bytes:
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    answer = b""
    while b"\r\n\r\n" not in answer or not answer.endswith(b"ok\n"):
        chunk = sock.recv(65536)
        assert chunk, "the connection closed"
        answer += chunk
    return answer.split(b" ", 2)[1]


async def test_a_reload_serves_the_new_pair_to_new_handshakes_and_established_connections_keep_theirs(pki: Path) -> None:
    server = make_shell(slow_app(), pki)
    async with serving(server):
        port = server.addresses[0][1]
        context = client_context(pki)

        def connect() -> ssl.SSLSocket:
            return context.wrap_socket(
                socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S), server_hostname="127.0.0.1"
            )

        kept = await asyncio.to_thread(connect)
        try:
            first = _serial(kept)
            assert await asyncio.to_thread(_exchange, kept, "/readyz") == b"200"
            certfiles.generate(out_dir=pki, hosts=("127.0.0.1",), now=NOW)
            renewed = x509.load_pem_x509_certificate((pki / "tls.crt").read_bytes()).serial_number
            assert renewed != first
            server.reload()  # what SIGHUP does
            fresh = await asyncio.to_thread(connect)
            with fresh:
                assert _serial(fresh) == renewed
            assert await asyncio.to_thread(_exchange, kept, "/readyz") == b"200", "the kept-alive connection still answers"
            assert _serial(kept) == first
        finally:
            kept.close()


async def test_plain_http_without_certificates_and_a_port_taken_is_one_line(pki: Path) -> None:
    server = shell.Shell(slow_app(), listen=shell.Listen(host="127.0.0.1", port=0), certificates=None, signals=False)
    async with serving(server), aiohttp.ClientSession() as session:
        port = server.addresses[0][1]
        async with session.get(f"http://127.0.0.1:{port}/readyz") as answer:
            assert answer.status == 200
        taken = shell.Shell(slow_app(), listen=shell.Listen(host="127.0.0.1", port=port), certificates=None, signals=False)
        with pytest.raises(errors.InputError, match=f"cannot listen on 127.0.0.1:{port}"):
            await taken.run()


# --- the trusted client CAs (in-memory handshakes) ----------------------------------------------


class Refused(Exception):
    """The server side of an in-memory handshake failed."""


def handshake(server: ssl.SSLContext, *, client_pair: authority.KeyPair | None, trust: bytes, directory: Path) -> dict[str, Any]:
    """An in-memory handshake (no sockets): the client certificate the server verified, or ``Refused``."""
    client = ssl.create_default_context(cadata=trust.decode())
    client.check_hostname = False
    if client_pair is not None:
        (directory / "client.crt").write_bytes(client_pair.certificate_pem)
        (directory / "client.key").write_bytes(client_pair.key_pem)
        client.load_cert_chain(directory / "client.crt", directory / "client.key")
    pipes = [ssl.MemoryBIO() for _ in range(4)]
    client_side = client.wrap_bio(pipes[0], pipes[1], server_hostname="127.0.0.1")
    server_side = server.wrap_bio(pipes[2], pipes[3], server_side=True)
    done = False
    for _ in range(10):
        with contextlib.suppress(ssl.SSLWantReadError):
            client_side.do_handshake()
        try:
            server_side.do_handshake()
            done = True
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLError as error:
            raise Refused(str(error)) from error
        pipes[2].write(pipes[1].read())
        pipes[0].write(pipes[3].read())
    assert done
    return server_side.getpeercert() or {}


def _common_name(peer: dict[str, Any]) -> str | None:
    return next((value for rdn in peer.get("subject", ()) for key, value in rdn if key == "commonName"), None)


def test_the_trusted_client_cas_follow_the_bundle_and_a_dropped_ca_is_no_longer_trusted(tmp_path: Path) -> None:
    serving_ca, old_ca, new_ca = (authority.issue_ca(now=NOW) for _ in range(3))
    pair = authority.issue_serving(serving_ca, hosts=["127.0.0.1"], now=NOW)
    old_client = authority.issue_client(old_ca, common_name="old-scheduler", now=NOW)
    new_client = authority.issue_client(new_ca, common_name="new-scheduler", now=NOW)
    live = tls.Serving(tls.new_server_context())
    live.trust(old_ca.certificate_pem, source="bundle")
    live.offer(certificate_pem=pair.certificate_pem, key_pem=pair.key_pem, source="pair")

    def peer(client_pair: authority.KeyPair | None) -> str | None:
        return _common_name(
            handshake(live.context, client_pair=client_pair, trust=serving_ca.certificate_pem, directory=tmp_path)
        )

    assert peer(old_client) == "old-scheduler"
    assert peer(None) is None, "a client without a certificate still gets through (probes); the app decides"
    with pytest.raises(Refused):
        peer(new_client)
    assert live.trust(new_ca.certificate_pem + old_ca.certificate_pem, source="bundle")  # both, while clients move over
    assert (peer(old_client), peer(new_client)) == ("old-scheduler", "new-scheduler")
    assert live.trust(new_ca.certificate_pem, source="bundle")  # the old CA leaves the bundle
    assert peer(new_client) == "new-scheduler"
    with pytest.raises(Refused):
        peer(old_client)
    assert not live.trust(new_ca.certificate_pem, source="bundle"), "the same bundle again changes nothing"
    for bad in (b"", b"not a certificate\n", b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"):
        with pytest.raises(errors.InputError, match="bundle"):
            live.trust(bad, source="bundle")
    assert peer(new_client) == "new-scheduler", "a bad bundle keeps the one trusted"


def test_a_watched_bundle_file_is_reloaded_when_it_changes_and_a_broken_one_is_retried(tmp_path: Path) -> None:
    serving_ca, old_ca, new_ca = (authority.issue_ca(now=NOW) for _ in range(3))
    pair = authority.issue_serving(serving_ca, hosts=["127.0.0.1"], now=NOW)
    files = {"tls.crt": pair.certificate_pem, "tls.key": pair.key_pem, "client-ca.crt": old_ca.certificate_pem}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    watch = tls.FileWatch(
        tls.Serving(tls.new_server_context()),
        cert_file=str(tmp_path / "tls.crt"),
        key_file=str(tmp_path / "tls.key"),
        client_ca_file=str(tmp_path / "client-ca.crt"),
    )
    watch.start()
    new_client = authority.issue_client(new_ca, common_name="new-scheduler", now=NOW)

    def peer() -> str | None:
        return _common_name(
            handshake(watch.serving.context, client_pair=new_client, trust=serving_ca.certificate_pem, directory=tmp_path)
        )

    with pytest.raises(Refused):
        peer()
    certfiles.write_atomically(tmp_path / "client-ca.crt", b"half a file", mode=0o644)
    assert watch.changed() and not watch.reload(reason="test")
    assert watch.changed(), "a bundle that did not load is tried again"
    certfiles.write_atomically(tmp_path / "client-ca.crt", new_ca.certificate_pem, mode=0o644)
    assert watch.reload(reason="test") and not watch.changed()
    assert peer() == "new-scheduler"
