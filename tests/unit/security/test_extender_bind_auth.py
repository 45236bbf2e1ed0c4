"""The extender's verbs (bind above all) answer only the scheduler: mutual TLS, as deploy/ runs it.

``gpu-admission extender`` is started the way ``deploy/extender.yaml`` starts it: a serving pair from
one CA and ``--tls-client-ca-file`` naming a second CA that issues only kube-scheduler's client
certificate. Its kubeconfig points at an address where no apiserver listens: nothing here needs one,
and a bind that gets through authentication then fails inside the binder, which is how the test
tells "refused at the door" (401 or a failed handshake) from "let in".
"""

from __future__ import annotations

import datetime
import json
import pathlib
import re
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from certs import authority
from tests import tlsclient

BIND = {"PodName": "p", "PodNamespace": "team-a", "PodUID": "uid-p", "Node": "gpu-0"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("extender-pki")
    now = datetime.datetime.now(datetime.UTC)
    serving_ca = authority.issue_ca(now=now)
    client_ca = authority.issue_ca(now=now)
    serving = authority.issue_serving(serving_ca, hosts=["127.0.0.1"], now=now)
    scheduler = authority.issue_client(client_ca, common_name="kube-scheduler", now=now)
    stranger = authority.issue_client(serving_ca, common_name="someone-else", now=now)  # trusted for serving, not as a client
    files = {
        "ca.crt": serving_ca.certificate_pem,
        "tls.crt": serving.certificate_pem,
        "tls.key": serving.key_pem,
        "client-ca.crt": client_ca.certificate_pem,
        "scheduler.crt": scheduler.certificate_pem,
        "scheduler.key": scheduler.key_pem,
        "stranger.crt": stranger.certificate_pem,
        "stranger.key": stranger.key_pem,
    }
    for name, data in files.items():
        (directory / name).write_bytes(data)
    (directory / "kubeconfig").write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "nowhere",
                "clusters": [{"name": "nowhere", "cluster": {"server": "https://127.0.0.1:9", "insecure-skip-tls-verify": True}}],
                "users": [{"name": "nobody", "user": {"token": "not-a-token"}}],
                "contexts": [{"name": "nowhere", "context": {"cluster": "nowhere", "user": "nobody"}}],
            }
        )
    )
    return directory


@pytest.fixture(scope="module")
def extender(pki: pathlib.Path) -> Iterator[int]:
    log = (pki / "extender.log").open("w")
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
            str(pki / "tls.crt"),
            "--tls-private-key-file",
            str(pki / "tls.key"),
            "--tls-client-ca-file",
            str(pki / "client-ca.crt"),
            "--kubeconfig",
            str(pki / "kubeconfig"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        port = 0
        while not port:
            found = re.search(r"listening on https://127\.0\.0\.1:(\d+)", (pki / "extender.log").read_text())
            if found:
                port = int(found.group(1))
                break
            assert process.poll() is None, (pki / "extender.log").read_text()
            assert time.monotonic() < deadline, "the extender did not start"
            time.sleep(0.05)  # polling the child's log for its port, with a deadline
        yield port
    finally:
        process.terminate()
        process.wait(20)
        log.close()


def _post(port: int, path: str, *, pki: pathlib.Path, cert: str | None) -> tuple[int, dict[str, object]]:
    body = json.dumps(
        BIND if path == "/bind" else {"Pod": {"metadata": {"name": "p"}, "spec": {"containers": []}}, "NodeNames": ["gpu-0"]}
    ).encode()
    request = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body
    pair = None if cert is None else (pki / f"{cert}.crt", pki / f"{cert}.key")
    status, payload, _ = tlsclient.exchange(port, request, ca_file=pki / "ca.crt", client=pair)
    return status, json.loads(payload or b"{}")


@pytest.mark.parametrize("path", ["/bind", "/filter", "/prioritize"])
def test_a_caller_without_a_client_certificate_is_refused(extender: int, pki: pathlib.Path, path: str) -> None:
    status, answer = _post(extender, path, pki=pki, cert=None)
    assert status == 401 and answer["Error"] == "a client certificate is required"


def test_a_certificate_from_any_other_ca_fails_the_handshake(extender: int, pki: pathlib.Path) -> None:
    with pytest.raises((ssl.SSLError, ConnectionError)):
        _post(extender, "/bind", pki=pki, cert="stranger")


def test_the_schedulers_certificate_gets_through_to_the_binder(extender: int, pki: pathlib.Path) -> None:
    status, answer = _post(extender, "/bind", pki=pki, cert="scheduler")
    assert status == 200, answer
    assert answer["Error"] and "client certificate" not in str(answer["Error"]), "let in: the binder itself answered"


def test_probes_need_no_certificate(extender: int, pki: pathlib.Path) -> None:
    """/healthz answers an anonymous kubelet; 503 here, as no apiserver ever filled the cache."""
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    with (
        socket.create_connection(("127.0.0.1", extender), timeout=10) as plain,
        context.wrap_socket(plain, server_hostname="127.0.0.1") as sock,
    ):
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.split(b" ", 2)[1] in (b"200", b"503") and b"client certificate" not in answer
