"""TLS contexts for the webhook server (TLS 1.2 or newer) and for clients that trust our CA."""

from __future__ import annotations

import pathlib
import ssl

from webhook import errors

MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2


def server_context(*, cert_file: str, key_file: str) -> ssl.SSLContext:
    """A server context that serves ``cert_file`` (leaf first, then any chain) with ``key_file``.

    ``load`` can be called again on the same context to pick up a rotated certificate: new
    handshakes use the new pair, established connections keep theirs.
    """
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = MINIMUM_VERSION
    # kube-apiserver offers h2 and http/1.1; aiohttp speaks only the latter.
    context.set_alpn_protocols(["http/1.1"])
    load(context, cert_file=cert_file, key_file=key_file)
    return context


def load(context: ssl.SSLContext, *, cert_file: str, key_file: str) -> None:
    """Load (or reload) the serving pair into ``context``; bad files are one ``InputError`` line."""
    for path in (cert_file, key_file):
        if not pathlib.Path(path).is_file():
            raise errors.InputError(f"{path}: no such file")
    try:
        context.load_cert_chain(certfile=cert_file, keyfile=key_file)
    except (ssl.SSLError, OSError) as error:
        raise errors.InputError(
            f"cannot load the TLS pair {cert_file} / {key_file}: {getattr(error, 'reason', None) or error}"
        ) from error


def client_context(*, ca_file: str) -> ssl.SSLContext:
    """A client context that trusts only ``ca_file`` and verifies the host name."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    context.minimum_version = MINIMUM_VERSION
    return context
