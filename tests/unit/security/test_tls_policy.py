"""The webhook's TLS: 1.2 or newer only, and in 1.2 only forward-secret AEAD suites.

Handshakes run between two ``ssl`` objects over memory BIOs (no sockets), each offering exactly one
protocol version or one cipher suite, so the server's whole acceptance table is enumerated. The
client context is put at OpenSSL security level 0 so it can offer what a hostile or outdated client
would. Families this OpenSSL build cannot offer at all (compiled out of OpenSSL 3) get no handshake
test; ``test_the_server_enables_no_tls12_suite_but_forward_secret_aead_ones`` covers them from the
server's own list.
The last test starts ``gpu-admission serve`` and checks the same over a real socket.
"""

from __future__ import annotations

import datetime
import pathlib
import re
import socket
import ssl
import subprocess
import sys
import time
import warnings

import pytest

from webhook.certificates import certfiles
from webhook.serving import tls

# What the server may accept in TLS 1.2: ephemeral ECDH key exchange and an AEAD cipher.
ACCEPTABLE_TLS12 = re.compile(r"^ECDHE-(ECDSA|RSA)-(AES(128|256)-GCM-SHA(256|384)|CHACHA20-POLY1305)$")
WEAK_FAMILIES = {
    "RC4": "RC4",
    "3DES": "3DES",
    "NULL": "eNULL",
    "EXPORT": "EXP",
    "DES": "DES",
    "CBC-SHA1": "SHA1",
    "CBC-SHA256/384": "AES+SHA256:AES+SHA384:CAMELLIA",
    "anonymous": "aNULL",
    "PSK": "PSK",
    "static RSA": "kRSA",
    "MD5": "MD5",
}


class Refused(Exception):
    def __init__(self, side: str, error: ssl.SSLError) -> None:
        super().__init__(f"{side}: {error}")
        self.side = side
        self.error = error


def handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> tuple[str, str]:
    """(version, cipher) the pair agrees on, or ``Refused`` naming the side that gave up first."""
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client_side = client.wrap_bio(c_in, c_out, server_hostname="127.0.0.1")
    server_side = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(20):
        for name, obj, out, peer_in in (("client", client_side, c_out, s_in), ("server", server_side, s_out, c_in)):
            if not done[name]:
                try:
                    obj.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLError as error:
                    raise Refused(name, error) from error
                finally:
                    data = out.read()
                    if data:
                        peer_in.write(data)
        if all(done.values()):
            version, cipher = client_side.version(), client_side.cipher()
            assert version is not None and cipher is not None
            return version, cipher[0]
    raise AssertionError("the handshake did not finish")


def outdated_client(*, version: ssl.TLSVersion | None = None, ciphers: str = "ALL:COMPLEMENTOFALL") -> ssl.SSLContext:
    """A client that offers whatever it is told to, certificate checks off (we test the server)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_ciphers(f"{ciphers}:@SECLEVEL=0")
    if version is not None:
        with warnings.catch_warnings():  # TLSv1 and TLSv1_1 are deprecated names: exactly the point
            warnings.simplefilter("ignore", DeprecationWarning)
            context.minimum_version = context.maximum_version = version
    else:
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    return context


def offerable(cipher_string: str) -> list[str]:
    """TLS 1.2-and-older suites this OpenSSL can put in a ClientHello for ``cipher_string``."""
    try:
        context = outdated_client(ciphers=cipher_string)
    except ssl.SSLError:
        return []
    return [c["name"] for c in context.get_ciphers() if c["protocol"] != "TLSv1.3"]


@pytest.fixture(scope="module")
def server(server_ssl: ssl.SSLContext) -> ssl.SSLContext:
    return server_ssl


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")
@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1], ids=["TLSv1.0", "TLSv1.1"])
def test_tls_1_0_and_1_1_handshakes_are_refused_by_the_server(server: ssl.SSLContext, version: ssl.TLSVersion) -> None:
    with pytest.raises(Refused) as refused:
        handshake(server, outdated_client(version=version, ciphers="ALL"))
    assert refused.value.side == "server", "the client must have offered it; the server must be the one that says no"
    assert "UNSUPPORTED_PROTOCOL" in str(refused.value.error) or "protocol" in str(refused.value.error).lower()


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3], ids=["TLSv1.2", "TLSv1.3"])
def test_tls_1_2_and_1_3_are_accepted(server: ssl.SSLContext, version: ssl.TLSVersion) -> None:
    client = ssl.create_default_context(cafile=None)
    client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
    client.minimum_version = client.maximum_version = version
    negotiated, cipher = handshake(server, client)
    assert negotiated == {ssl.TLSVersion.TLSv1_2: "TLSv1.2", ssl.TLSVersion.TLSv1_3: "TLSv1.3"}[version]
    assert "GCM" in cipher or "CHACHA20" in cipher


def test_a_modern_client_gets_tls_1_3_with_an_aead_suite(server: ssl.SSLContext, tls_dir: pathlib.Path) -> None:
    version, cipher = handshake(server, tls.client_context(ca_file=str(tls_dir / "ca.crt")))
    assert version == "TLSv1.3" and cipher in {"TLS_AES_256_GCM_SHA384", "TLS_AES_128_GCM_SHA256", "TLS_CHACHA20_POLY1305_SHA256"}


def test_in_tls_1_2_the_server_accepts_only_forward_secret_aead_suites(server: ssl.SSLContext) -> None:
    accepted = []
    for suite in offerable("ALL:COMPLEMENTOFALL"):
        try:
            handshake(server, outdated_client(ciphers=suite))
        except Refused:
            continue
        accepted.append(suite)
    assert accepted, "no TLS 1.2 suite at all: kube-apiserver's Go client would need TLS 1.3"
    assert all(ACCEPTABLE_TLS12.match(suite) for suite in accepted), accepted
    # What Go's crypto/tls (kube-apiserver, kube-scheduler) offers first for an ECDSA certificate.
    assert "ECDHE-ECDSA-AES128-GCM-SHA256" in accepted


def test_the_server_enables_no_tls12_suite_but_forward_secret_aead_ones(server: ssl.SSLContext) -> None:
    # Every weak family, including those this OpenSSL cannot even offer as a client (RC4, EXPORT,
    # single DES and 3DES are compiled out of OpenSSL 3), is outside what the server may negotiate.
    enabled = [c["name"] for c in server.get_ciphers() if c["protocol"] != "TLSv1.3"]
    assert enabled and all(ACCEPTABLE_TLS12.match(name) for name in enabled), enabled


@pytest.mark.parametrize("family", [f for f in sorted(WEAK_FAMILIES) if offerable(WEAK_FAMILIES[f])])
def test_the_weak_families_this_openssl_can_offer_are_all_refused(server: ssl.SSLContext, family: str) -> None:
    for suite in offerable(WEAK_FAMILIES[family]):
        with pytest.raises(Refused):
            handshake(server, outdated_client(ciphers=suite))


def test_renegotiation_and_compression_are_off(server: ssl.SSLContext) -> None:
    assert server.options & ssl.OP_NO_COMPRESSION
    assert server.options & ssl.OP_NO_RENEGOTIATION


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1:DeprecationWarning")
def test_gpu_admission_serve_applies_the_same_policy_on_its_socket(tmp_path: pathlib.Path) -> None:
    """The wiring: the real command, a real socket, one old and one current client."""
    certfiles.generate(out_dir=tmp_path, hosts=("127.0.0.1",), now=datetime.datetime.now(datetime.UTC))
    log = (tmp_path / "serve.out").open("w")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--tls-cert-file",
            str(tmp_path / "tls.crt"),
            "--tls-private-key-file",
            str(tmp_path / "tls.key"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        port = _port(tmp_path / "serve.out", process)
        with pytest.raises(ssl.SSLError):
            _connect(port, outdated_client(version=ssl.TLSVersion.TLSv1_1, ciphers="ALL"))
        with pytest.raises(ssl.SSLError):
            _connect(port, outdated_client(ciphers="ECDHE-ECDSA-AES128-SHA256"))
        version, cipher = _connect(port, outdated_client(ciphers="ECDHE-ECDSA-AES128-GCM-SHA256"))
        assert (version, cipher) == ("TLSv1.2", "ECDHE-ECDSA-AES128-GCM-SHA256")
        assert _connect(port, tls.client_context(ca_file=str(tmp_path / "ca.crt")))[0] == "TLSv1.3"
    finally:
        process.terminate()
        process.wait(20)
        log.close()


def _port(out: pathlib.Path, process: subprocess.Popen[bytes]) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = re.search(r"listening on https://[^:]+:(\d+)", out.read_text())
        if found:
            return int(found.group(1))
        assert process.poll() is None, out.read_text()
        time.sleep(0.05)  # polling the child's output for its port, with a deadline
    raise AssertionError(f"serve did not start:\n{out.read_text()}")


def _connect(port: int, context: ssl.SSLContext) -> tuple[str, str]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as plain:
        with context.wrap_socket(plain, server_hostname="127.0.0.1") as sock:
            version, cipher = sock.version(), sock.cipher()
            assert version is not None and cipher is not None
            return version, cipher[0]
