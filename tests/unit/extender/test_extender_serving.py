"""``gpu-admission extender`` serves through the serving shell: a rotated serving pair reaches new
handshakes without a restart, the client CA bundle it trusts follows its file (SIGHUP forces it),
and SIGTERM drains (readiness false) and exits 0; in-process, the extender app's own readiness
turns false during a drain.

The process gets a kubeconfig pointing where no apiserver listens: nothing here needs one (its
readiness then says it is still loading nodes and pods, which is how the drain's answer is told apart).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import pathlib
import re
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import pytest
from cryptography import x509

from certs import authority
from tests import tlsclient
from webhook.certificates import certfiles
from webhook.extender import app, binder, store
from webhook.serving import shell

NOW = datetime.datetime.now(datetime.UTC)
DEADLINE_S = 20.0  # for polls only; nothing here asserts how fast anything is
REPO = pathlib.Path(__file__).resolve().parents[3]


class Pki:
    """A serving CA and pair for 127.0.0.1, a client CA and kube-scheduler's pair from it."""

    def __init__(self, directory: pathlib.Path) -> None:
        self.directory = directory
        self.serving_ca = authority.issue_ca(now=NOW)
        self.client_ca = authority.issue_ca(now=NOW)
        self.write("ca.crt", self.serving_ca.certificate_pem)
        self.write("client-ca.crt", self.client_ca.certificate_pem)
        self.rotate_serving()
        self.write_client("scheduler", authority.issue_client(self.client_ca, common_name="kube-scheduler", now=NOW))
        (directory / "kubeconfig").write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "nowhere",
                    "clusters": [
                        {"name": "nowhere", "cluster": {"server": "https://127.0.0.1:9", "insecure-skip-tls-verify": True}}
                    ],
                    "users": [{"name": "nobody", "user": {"token": "not-a-token"}}],
                    "contexts": [{"name": "nowhere", "context": {"cluster": "nowhere", "user": "nobody"}}],
                }
            )
        )

    def write(self, name: str, data: bytes) -> None:
        certfiles.write_atomically(self.directory / name, data, mode=0o600)

    def write_client(self, name: str, pair: authority.KeyPair) -> None:
        self.write(f"{name}.crt", pair.certificate_pem)
        self.write(f"{name}.key", pair.key_pem)

    def rotate_serving(self) -> int:
        """A new serving pair in the files (key first, as a real rotation may land); its serial."""
        pair = authority.issue_serving(self.serving_ca, hosts=["127.0.0.1"], now=NOW)
        self.write("tls.key", pair.key_pem)
        self.write("tls.crt", pair.certificate_pem)
        return pair.certificate.serial_number


Started = tuple[subprocess.Popen[bytes], int]


@pytest.fixture
def pki(tmp_path: pathlib.Path) -> Pki:
    return Pki(tmp_path)


@pytest.fixture
def start(pki: Pki) -> Iterator[Callable[..., Started]]:
    """Start the extender with mutual TLS from ``pki`` and the extra flags; its process and port."""
    started: list[subprocess.Popen[bytes]] = []
    log_path = pki.directory / "extender.log"

    def run(*extra: str) -> Started:
        d = pki.directory
        log = log_path.open("ab")
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "webhook.cli",
                "extender",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--tls-cert-file",
                str(d / "tls.crt"),
                "--tls-private-key-file",
                str(d / "tls.key"),
                "--tls-client-ca-file",
                str(d / "client-ca.crt"),
                "--kubeconfig",
                str(d / "kubeconfig"),
                *extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
        log.close()
        started.append(process)
        found = wait_for_log(pki, process, r"listening on https://127\.0\.0\.1:(\d+)\n")
        return process, int(found.group(1))

    yield run
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(DEADLINE_S)


def wait_for_log(pki: Pki, process: subprocess.Popen[bytes], pattern: str) -> re.Match[str]:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        text = (pki.directory / "extender.log").read_text()
        found = re.search(pattern, text)
        if found:
            return found
        assert process.poll() is None, text
        assert time.monotonic() < deadline, f"no {pattern!r} in the extender's log:\n{text}"
        time.sleep(0.05)  # polling the child's log, with a deadline


def get(port: int, path: str, *, pki: Pki, client: str | None = None) -> tuple[int, bytes, int]:
    """GET ``path`` on a new connection: status, body and the serial of the certificate served."""
    pair = None if client is None else (pki.directory / f"{client}.crt", pki.directory / f"{client}.key")
    request = f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
    status, body, der = tlsclient.exchange(port, request, ca_file=pki.directory / "ca.crt", client=pair)
    return status, body, x509.load_der_x509_certificate(der).serial_number


def until(check: Callable[[], bool], *, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)  # polling the server, with a deadline


def test_a_rotated_serving_pair_reaches_new_handshakes_without_a_restart(pki: Pki, start: Callable[..., Started]) -> None:
    process, port = start("--cert-check-interval", "100ms")
    before = get(port, "/inspect", pki=pki, client="scheduler")
    assert before[0] == 200
    renewed = pki.rotate_serving()
    assert renewed != before[2]
    until(lambda: get(port, "/inspect", pki=pki, client="scheduler")[2] == renewed, what="the new serial on a new handshake")
    assert process.poll() is None, "the same process, never restarted"
    assert get(port, "/inspect", pki=pki, client="scheduler")[0] == 200
    wait_for_log(pki, process, r"certificate files changed: reloaded .*tls\.crt")


def test_the_trusted_client_ca_bundle_follows_its_file_on_sighup(pki: Pki, start: Callable[..., Started]) -> None:
    process, port = start()  # the default interval (10s): only SIGHUP makes it look now
    assert get(port, "/inspect", pki=pki, client="scheduler")[0] == 200
    successor = authority.issue_ca(now=NOW)
    pki.write_client("successor", authority.issue_client(successor, common_name="kube-scheduler", now=NOW))
    with pytest.raises((ssl.SSLError, ConnectionError)):
        get(port, "/inspect", pki=pki, client="successor")
    pki.write("client-ca.crt", successor.certificate_pem)  # the old client CA leaves the bundle
    process.send_signal(signal.SIGHUP)
    wait_for_log(pki, process, r"SIGHUP: reloaded the client CAs")
    assert get(port, "/inspect", pki=pki, client="successor")[0] == 200
    with pytest.raises((ssl.SSLError, ConnectionError)):
        get(port, "/inspect", pki=pki, client="scheduler")
    assert get(port, "/inspect", pki=pki)[0] == 401, "no client certificate: still refused by the app"


def test_sigterm_turns_readiness_false_for_the_drain_then_exits_0(pki: Pki, start: Callable[..., Started]) -> None:
    process, port = start("--drain-seconds", "1h")
    assert get(port, "/readyz", pki=pki)[:2] == (503, b"loading nodes, pods and ledger Leases\n")
    process.send_signal(signal.SIGTERM)
    until(lambda: get(port, "/readyz", pki=pki)[:2] == (503, b"not ready: shutting down\n"), what="readyz: shutting down")
    assert process.poll() is None, "still draining"
    process.send_signal(signal.SIGTERM)  # a second signal ends the drain early
    assert process.wait(DEADLINE_S) == 0


def test_a_bad_client_ca_bundle_is_one_line_at_start(pki: Pki, capsys: pytest.CaptureFixture[str]) -> None:
    from webhook import cli  # noqa: PLC0415 - the CLI entry point, in-process for its error line

    (pki.directory / "client-ca.crt").write_text("not a certificate\n")
    d = pki.directory
    status = cli.main(
        [
            "extender",
            "--port",
            "0",
            "--tls-cert-file",
            str(d / "tls.crt"),
            "--tls-private-key-file",
            str(d / "tls.key"),
            "--tls-client-ca-file",
            str(d / "client-ca.crt"),
            "--kubeconfig",
            str(d / "kubeconfig"),
        ]
    )
    out, err = capsys.readouterr()
    assert status == 2 and err.count("\n") == 1 and "client CA bundle" in err and "client-ca.crt" in err


async def test_the_extender_apps_readiness_is_false_during_a_drain_and_its_liveness_is_not(
    pki: Pki, apiserver: Any, make_node: Callable[..., dict[str, Any]]
) -> None:
    cache = store.Store()
    cache.replace_nodes([make_node("gpu-0")])
    cache.replace_leases([])  # no ledger Leases yet
    cache.replace_pods([])
    application = app.make_app(cache=cache, bind=binder.Binder(apiserver, cache=cache))
    d = pki.directory
    server = shell.Shell(
        application,
        listen=shell.Listen(host="127.0.0.1", port=0),
        certificates=shell.files(shell.TlsFiles(cert_file=str(d / "tls.crt"), key_file=str(d / "tls.key"))),
        registry=application[app.METERS].registry,
        drain=shell.Drain(seconds=3600),
        signals=False,
    )
    task = asyncio.create_task(server.run())
    await asyncio.wait_for(server.listening.wait(), timeout=DEADLINE_S)
    context = ssl.create_default_context(cafile=str(d / "ca.crt"))
    base = f"https://127.0.0.1:{server.addresses[0][1]}"
    try:
        async with aiohttp.ClientSession() as session:

            async def status(path: str) -> int:
                async with session.get(base + path, ssl=context) as answer:
                    return answer.status

            assert (await status("/readyz"), await status("/healthz")) == (200, 200)
            server.stop()
            deadline = asyncio.get_running_loop().time() + DEADLINE_S
            while await status("/readyz") != 503:
                assert asyncio.get_running_loop().time() < deadline, "readyz never turned 503"
            assert await status("/healthz") == 200
            async with session.get(base + "/metrics", ssl=context) as scraped:
                assert 'gpu_admission_certificate_expiry_timestamp_seconds{certificate="serving"}' in await scraped.text()
    finally:
        server.stop()
        server.stop()
        await asyncio.wait_for(task, timeout=DEADLINE_S)
