"""The plain-HTTP ``/metrics`` listener that ``--metrics-port`` adds beside a TLS server.

Prometheus in another namespace usually scrapes with no access to the webhook's CA; this listener
serves the same registry over HTTP on its own port, and nothing else (no review ever goes there).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import AsyncIterator

from aiohttp import web

from webhook.cmdline import errors
from webhook.serving import metrics

log = logging.getLogger(__name__)

REGISTRY = web.AppKey("registry", metrics.Registry)


def make_app(registry: metrics.Registry) -> web.Application:
    app = web.Application()
    app[REGISTRY] = registry
    app.router.add_get("/metrics", _metrics)
    return app


async def _metrics(request: web.Request) -> web.Response:
    body = request.app[REGISTRY].render()
    return web.Response(body=body.encode("utf-8"), headers={"Content-Type": metrics.CONTENT_TYPE})


@contextlib.asynccontextmanager
async def listening(registry: metrics.Registry, *, host: str, port: int, reuse_port: bool = False) -> AsyncIterator[int]:
    """Serve ``registry`` on ``http://host:port/metrics`` while the block runs; yields the bound port."""
    runner = web.AppRunner(make_app(registry), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, reuse_port=reuse_port or None)
        try:
            await site.start()
        except OSError as error:
            raise errors.InputError(f"cannot listen on {host}:{port} for metrics: {error.strerror or error}") from error
        bound = runner.addresses[0][1] if runner.addresses else port
        for address in runner.addresses:
            # On stdout like the main listener's line: with --metrics-port 0 this is how callers learn the port.
            sys.stdout.write(f"metrics on http://{address[0]}:{address[1]}/metrics\n")  # one write: see shell.announce
            sys.stdout.flush()
        yield int(bound)
    finally:
        await runner.cleanup()
