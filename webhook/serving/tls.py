"""TLS for the servers (TLS 1.2 or newer): contexts, hot-swapping the serving pair and the trusted
client CAs, the expiry metric.

A rotated serving pair goes into the *live* ``SSLContext`` (``load_cert_chain`` again): new
handshakes use the new pair, established connections keep theirs, nothing restarts. A pair is
loaded into a scratch context first and only then into the live one, because OpenSSL drops the
live private key as soon as a certificate that does not match it is loaded: a half-written
rotation (new key, old certificate) must leave the server exactly as it was.

Client CAs (the extender's ``--tls-client-ca-file``) cannot be swapped that way: OpenSSL adds
certificates to a context's trust store but never removes one, and a CA dropped from the bundle
must stop being trusted. So where clients are verified, every change (pair or bundle) builds one
complete new context, and the live context's SNI callback, which OpenSSL calls for every
ClientHello (with or without a server name), hands the handshake over to it (Go's
``GetConfigForClient``, as kube-apiserver's dynamic client CA does). The live context itself trusts
no CA: were the hand-over ever skipped, a client certificate would fail to verify (closed, not open).
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import dataclasses
import datetime
import logging
import os
import pathlib
import ssl
import tempfile

from cryptography import x509
from cryptography.hazmat.primitives import hashes

from webhook.cmdline import errors
from webhook.serving import metrics

log = logging.getLogger(__name__)

MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2
# TLS 1.2 suites: ephemeral ECDH and an AEAD cipher only (Mozilla's "intermediate" profile). Left out
# on purpose: CBC modes (ECDHE-*-AES*-SHA256/SHA384 remain in Python's default list), static RSA key
# exchange and finite-field DHE. Go's crypto/tls, as in kube-apiserver and kube-scheduler, offers
# these first. TLS 1.3 suites are all AEAD and are not affected by this string.
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"
EXPIRY_METRIC = "gpu_admission_certificate_expiry_timestamp_seconds"
# asyncio gives every TLS connection a zero-filled read buffer of asyncio.sslproto.SSLProtocol.max_size
# bytes, 256 KiB: resident for as long as the connection lives, so kube-apiserver's pool of kept-alive
# connections costs 8 MiB per 32. 64 KiB still takes a 49 KB review in one read (four TLS records).
READ_BUFFER_BYTES = 64 * 1024


def limit_read_buffers(size: int = READ_BUFFER_BYTES) -> None:
    """Give asyncio's TLS connections in this process ``size``-byte read buffers instead of 256 KiB.

    Call before serving. Measured with 32 connections at saturation on a small review: RSS 65 MiB
    with the default, 59 MiB with 64 KiB, same throughput (bench/README.md).
    """
    protocol = asyncio.sslproto.SSLProtocol
    if getattr(protocol, "max_size", 0) > size:  # an asyncio without the attribute keeps its own
        protocol.max_size = size


def new_server_context() -> ssl.SSLContext:
    """A server context without a pair yet (load one with `load_pem` or `load`)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = MINIMUM_VERSION
    context.set_ciphers(TLS12_CIPHERS)
    # A client may not make the server renegotiate (TLS 1.2): each one costs the server a handshake.
    context.options |= ssl.OP_NO_RENEGOTIATION
    # kube-apiserver offers h2 and http/1.1; aiohttp speaks only the latter.
    context.set_alpn_protocols(["http/1.1"])
    return context


def server_context(*, cert_file: str, key_file: str) -> ssl.SSLContext:
    """A server context that serves ``cert_file`` (leaf first, then any chain) with ``key_file``."""
    context = new_server_context()
    load(context, cert_file=cert_file, key_file=key_file)
    return context


def load(context: ssl.SSLContext, *, cert_file: str, key_file: str) -> None:
    """Load (or reload) the pair from files into ``context``; bad files are one ``InputError`` line."""
    certificate_pem, key_pem = read_pair(cert_file=cert_file, key_file=key_file)
    load_pem(context, certificate_pem=certificate_pem, key_pem=key_pem, source=_pair_name(cert_file, key_file))


def read_pair(*, cert_file: str, key_file: str) -> tuple[bytes, bytes]:
    """The bytes of both files; a missing or unreadable one is an ``InputError``."""
    pair = []
    for path in (cert_file, key_file):
        try:
            pair.append(pathlib.Path(path).read_bytes())
        except FileNotFoundError as error:
            raise errors.InputError(f"{path}: no such file") from error
        except OSError as error:
            raise errors.InputError(f"{path}: {error.strerror or error}") from error
    return pair[0], pair[1]


def load_pem(context: ssl.SSLContext, *, certificate_pem: bytes, key_pem: bytes, source: str = "the TLS pair") -> None:
    """Load a PEM pair into ``context``, or raise ``InputError`` and leave ``context`` untouched."""
    # ssl loads only from files: write both into one private file, gone once loaded.
    with tempfile.TemporaryDirectory(prefix="gpu-admission-tls-") as directory:
        combined = pathlib.Path(directory) / "pair.pem"
        descriptor = os.open(combined, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(certificate_pem.rstrip(b"\n") + b"\n" + key_pem)
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(certfile=str(combined))
            context.load_cert_chain(certfile=str(combined))
        except (ssl.SSLError, OSError) as error:
            raise errors.InputError(f"cannot load {source}: {getattr(error, 'reason', None) or error}") from error


def client_context(*, ca_file: str) -> ssl.SSLContext:
    """A client context that trusts only ``ca_file`` and verifies the host name."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    context.minimum_version = MINIMUM_VERSION
    return context


def expiry_gauge(registry: metrics.Registry) -> metrics.Gauge:
    """Register ``gpu_admission_certificate_expiry_timestamp_seconds{certificate="serving"|"ca"}``."""
    gauge = metrics.Gauge(
        EXPIRY_METRIC,
        "Unix time the certificate expires: the serving certificate this replica serves now, and the CA that signs it.",
        ("certificate",),
        multiprocess_mode="livemin",  # under --workers: the earliest expiry any worker serves
    )
    registry.register(gauge)
    return gauge


@dataclasses.dataclass
class Serving:
    """The live serving pair of one server, and the client CAs it trusts, if any: swapped in place
    (see the module docstring), the pair's expiry exported."""

    context: ssl.SSLContext
    gauge: metrics.Gauge | None = None
    fingerprint: bytes = b""
    not_after: datetime.datetime | None = None
    # PEM bundle of the CAs whose client certificates are verified (asked for, not insisted on:
    # CERT_OPTIONAL, the app decides which paths need one); None: no client certificate is asked for.
    client_cas: bytes | None = None
    _pair: tuple[bytes, bytes] | None = dataclasses.field(default=None, repr=False)
    _handshakes: ssl.SSLContext | None = dataclasses.field(default=None, repr=False)

    def offer(
        self, *, certificate_pem: bytes, key_pem: bytes, source: str, now: datetime.datetime | None = None, force: bool = False
    ) -> bool:
        """Load the pair if it differs from the one served (or ``force``); True when it was loaded.

        An unloadable pair, or an expired certificate while the current one is still good, raises
        ``InputError`` and keeps the current pair.
        """
        certificate = _leaf(certificate_pem, source=source)
        fingerprint = certificate.fingerprint(hashes.SHA256())
        if fingerprint == self.fingerprint and not force:
            return False
        moment = now or datetime.datetime.now(datetime.UTC)
        current_good = self.not_after is not None and moment < self.not_after
        if certificate.not_valid_after_utc <= moment and current_good:
            raise errors.InputError(f"{source}: the certificate expired at {certificate.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}")
        load_pem(self.context, certificate_pem=certificate_pem, key_pem=key_pem, source=source)
        self.fingerprint, self.not_after = fingerprint, certificate.not_valid_after_utc
        self._pair = (certificate_pem, key_pem)
        if self.client_cas is not None:
            self._hand_over_to(self._verifying(self.client_cas, source=source))
        if self.gauge is not None:
            self.gauge.set(certificate.not_valid_after_utc.timestamp(), certificate="serving")
        return True

    def trust(self, bundle_pem: bytes, *, source: str, force: bool = False) -> bool:
        """Verify client certificates against the CAs of ``bundle_pem`` on every new handshake from
        now on (only these: one dropped from the bundle is no longer trusted); True when it changed.

        A bundle without a certificate, or one OpenSSL cannot load, raises ``InputError`` and keeps
        the current one. Before the first pair is offered, the bundle waits for it.
        """
        if not bundle_pem.strip() or b"-----BEGIN CERTIFICATE-----" not in bundle_pem:
            raise errors.InputError(f"{source}: no PEM certificate in it")
        if bundle_pem == self.client_cas and not force:
            return False
        if self._pair is None:
            _trust_store(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), bundle_pem, source=source)  # refuse a bad one now
        else:
            self._hand_over_to(self._verifying(bundle_pem, source=source))
        self.client_cas = bundle_pem
        return True

    def _verifying(self, bundle_pem: bytes, *, source: str) -> ssl.SSLContext:
        """A complete context for new handshakes: the current pair, ``bundle_pem`` as the only CAs."""
        assert self._pair is not None
        fresh = new_server_context()
        load_pem(fresh, certificate_pem=self._pair[0], key_pem=self._pair[1], source=source)
        _trust_store(fresh, bundle_pem, source=source)
        _verify_clients(fresh)
        return fresh

    def _hand_over_to(self, fresh: ssl.SSLContext) -> None:
        self._handshakes = fresh
        if self.context.sni_callback is None:
            # The verify mode is the live context's (OpenSSL copies it into each connection before
            # the hand-over); its trust store stays empty.
            _verify_clients(self.context)
            self.context.sni_callback = self._hand_over

    def _hand_over(self, connection: ssl.SSLObject, _server_name: str | None, _context: ssl.SSLContext) -> None:
        if self._handshakes is not None:
            connection.context = self._handshakes

    def set_ca(self, certificate: x509.Certificate) -> None:
        if self.gauge is not None:
            self.gauge.set(certificate.not_valid_after_utc.timestamp(), certificate="ca")


class FileWatch:
    """Reloads the serving pair, and the client CA bundle where one is given, when their files change
    (size, inode or mtime of any of them).

    Kubelet swaps a mounted Secret's files by renaming a symlink and ``certs generate`` renames
    new files over the old: both change the inode, so polling ``stat`` sees every rotation. A pair
    that does not load (the key already new, the certificate still old) is tried again next time;
    so is a bundle that does not load, and either keeps serving what it had meanwhile.
    """

    def __init__(self, serving: Serving, *, cert_file: str, key_file: str, client_ca_file: str | None = None) -> None:
        self.serving = serving
        self.cert_file = cert_file
        self.key_file = key_file
        self.client_ca_file = client_ca_file
        self.reloads = 0
        self._loaded: tuple[tuple[int, int, int], ...] | None = None
        self._reported: tuple[tuple[int, int, int], ...] | None = None

    def start(self) -> None:
        """The first load; files that do not load are an ``InputError`` (nothing to serve yet)."""
        signature = self._signature()
        if self.client_ca_file is not None:
            self.serving.trust(read_bundle(self.client_ca_file), source=_bundle_name(self.client_ca_file))
        certificate_pem, key_pem = read_pair(cert_file=self.cert_file, key_file=self.key_file)
        self.serving.offer(certificate_pem=certificate_pem, key_pem=key_pem, source=_pair_name(self.cert_file, self.key_file))
        self._loaded = signature

    def _paths(self) -> tuple[str, ...]:
        return (
            (self.cert_file, self.key_file)
            if self.client_ca_file is None
            else (self.cert_file, self.key_file, self.client_ca_file)
        )

    def _signature(self) -> tuple[tuple[int, int, int], ...]:
        signature = []
        for path in self._paths():
            try:
                status = os.stat(path)
            except OSError:
                signature.append((0, 0, 0))
            else:
                signature.append((status.st_ino, status.st_mtime_ns, status.st_size))
        return tuple(signature)

    def changed(self) -> bool:
        return self._signature() != self._loaded

    def reload(self, *, reason: str, force: bool = False) -> bool:
        """Load the files now if they hold a new pair or bundle (or ``force``); True when something
        was loaded. Runs on the event loop's thread because the live context is not thread-safe."""
        signature = self._signature()
        problems: list[str] = []
        loaded = False
        try:
            certificate_pem, key_pem = read_pair(cert_file=self.cert_file, key_file=self.key_file)
            if self.serving.offer(
                certificate_pem=certificate_pem, key_pem=key_pem, source=_pair_name(self.cert_file, self.key_file), force=force
            ):
                loaded = True
                log.info("uid=- %s: reloaded %s (expires %s)", reason, self.cert_file, _iso(self.serving.not_after))
        except errors.InputError as error:
            problems.append(f"kept the previous certificate: {error}")
        if self.client_ca_file is not None:
            try:
                if self.serving.trust(read_bundle(self.client_ca_file), source=_bundle_name(self.client_ca_file), force=force):
                    loaded = True
                    log.info("uid=- %s: reloaded the client CAs %s", reason, self.client_ca_file)
            except errors.InputError as error:
                problems.append(f"kept the previous client CAs: {error}")
        if problems:
            if signature != self._reported:
                for problem in problems:
                    log.warning("uid=- %s: %s", reason, problem)
                self._reported = signature
        else:
            self._loaded = signature
        if loaded:
            self.reloads += 1
        return loaded

    async def run(self, *, interval: float) -> None:
        """Poll for changes every ``interval`` seconds, for ever."""
        while True:
            await asyncio.sleep(interval)
            if await asyncio.to_thread(self.changed):
                self.reload(reason="certificate files changed")


def read_bundle(path: str) -> bytes:
    """The bytes of a CA bundle file; a missing or unreadable one is an ``InputError``."""
    try:
        return pathlib.Path(path).read_bytes()
    except FileNotFoundError as error:
        raise errors.InputError(f"{path}: no such file") from error
    except OSError as error:
        raise errors.InputError(f"{path}: {error.strerror or error}") from error


def _trust_store(context: ssl.SSLContext, bundle_pem: bytes, *, source: str) -> None:
    try:
        context.load_verify_locations(cadata=bundle_pem.decode("ascii", errors="replace"))
    except (ssl.SSLError, ValueError) as error:
        raise errors.InputError(f"cannot load {source}: {getattr(error, 'reason', None) or error}") from error


def _verify_clients(context: ssl.SSLContext) -> None:
    context.verify_mode = ssl.CERT_OPTIONAL  # probes come without one; the app refuses what needs one
    # No TLS 1.3 session tickets: a resumed session skips the client certificate check, so a session
    # from before a CA left the bundle would outlive its trust.
    context.num_tickets = 0


def _leaf(certificate_pem: bytes, *, source: str) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(certificate_pem)
    except ValueError as error:
        raise errors.InputError(f"{source}: not a PEM certificate") from error


def _pair_name(cert_file: str, key_file: str) -> str:
    return f"the TLS pair {cert_file} / {key_file}"


def _bundle_name(path: str) -> str:
    return f"the client CA bundle {path}"


def _iso(moment: datetime.datetime | None) -> str:
    return "unknown" if moment is None else f"{moment:%Y-%m-%dT%H:%M:%SZ}"
