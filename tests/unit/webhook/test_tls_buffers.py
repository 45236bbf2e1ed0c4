"""asyncio's per-connection TLS read buffer is cut from 256 KiB to 64 KiB, and bodies still arrive whole."""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import hashlib
import pathlib
import ssl

import pytest

from webhook.serving import tls

DEFAULT = 256 * 1024


@pytest.fixture
def default_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    """asyncio's own setting for the test; the original is put back afterwards."""
    monkeypatch.setattr(asyncio.sslproto.SSLProtocol, "max_size", DEFAULT)


def _buffer_of_a_new_connection() -> int:
    loop = asyncio.new_event_loop()
    try:
        protocol = asyncio.sslproto.SSLProtocol(
            loop, asyncio.Protocol(), ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), loop.create_future(), server_side=True
        )
        return len(protocol.get_buffer(-1))
    finally:
        loop.close()


@pytest.mark.usefixtures("default_buffers")
def test_a_new_tls_connection_reads_into_64_kib_once_limited() -> None:
    assert _buffer_of_a_new_connection() == DEFAULT
    tls.limit_read_buffers()
    assert _buffer_of_a_new_connection() == tls.READ_BUFFER_BYTES == 64 * 1024


@pytest.mark.usefixtures("default_buffers")
def test_a_smaller_setting_is_left_alone() -> None:
    asyncio.sslproto.SSLProtocol.max_size = 16 * 1024
    tls.limit_read_buffers()
    assert _buffer_of_a_new_connection() == 16 * 1024


@pytest.mark.usefixtures("default_buffers")
async def test_a_body_four_times_the_buffer_arrives_whole_over_tls(tls_dir: pathlib.Path) -> None:
    tls.limit_read_buffers()
    server_context = tls.server_context(cert_file=str(tls_dir / "tls.crt"), key_file=str(tls_dir / "tls.key"))
    body = bytes(range(256)) * (tls.READ_BUFFER_BYTES * 4 // 256) + b"end"

    async def digest(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received = await reader.readexactly(len(body))
        writer.write(hashlib.sha256(received).hexdigest().encode())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(digest, "127.0.0.1", 0, ssl=server_context)
    port = server.sockets[0].getsockname()[1]
    client_context = ssl.create_default_context(cafile=str(tls_dir / "ca.crt"))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context, server_hostname="127.0.0.1")
        writer.write(body)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout=10)
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
    assert answer.decode() == hashlib.sha256(body).hexdigest()
