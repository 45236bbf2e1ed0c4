"""One raw HTTP/1.1 exchange over a new TLS connection, for tests that judge a server's handshake itself."""

from __future__ import annotations

import pathlib
import socket
import ssl


def exchange(
    port: int, request: bytes, *, ca_file: pathlib.Path, client: tuple[pathlib.Path, pathlib.Path] | None = None
) -> tuple[int, bytes, bytes]:
    """Send ``request`` (ending in ``Connection: close``) to 127.0.0.1:``port`` and read the whole answer:
    its status, its body and the DER of the certificate the server presented. ``client`` is a
    certificate and key file to present in turn."""
    context = ssl.create_default_context(cafile=str(ca_file))
    if client is not None:
        context.load_cert_chain(*client)
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as plain,
        context.wrap_socket(plain, server_hostname="127.0.0.1") as sock,
    ):
        der = sock.getpeercert(binary_form=True)
        assert der is not None
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    if not answer:
        # TLS 1.3: the server checks the client's certificate after the client considers the
        # handshake done, so a refusal shows as an alert or a closed connection at the first read.
        raise ConnectionError("the server closed the connection without an answer")
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body, der
