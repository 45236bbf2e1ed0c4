"""``gpu-admission serve``: run the admission webhook over HTTPS until SIGTERM or SIGINT.

SIGHUP reloads the serving certificate and key from the same files (new connections get the new
pair), so a certificate rotated by ``gpu-admission certs generate`` needs no restart.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import ssl

from aiohttp import web

from policies import settings
from webhook import config, errors, tls
from webhook.admission import app as admission_app
from webhook.admission import keys

log = logging.getLogger(__name__)

DEFAULT_PORT = 8443
SHUTDOWN_TIMEOUT_S = 5.0


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the admission webhook (HTTPS: /mutate, /validate, /healthz, /readyz, /metrics)",
        description="Serve the AdmissionReview v1 webhook over TLS 1.2+. Port 0 picks a free port; "
        "the bound address is printed on stdout as 'listening on https://HOST:PORT'. "
        "SIGHUP reloads the certificate files; SIGTERM/SIGINT stop gracefully.",
    )
    parser.add_argument("--host", default="0.0.0.0", help="address to bind (default: 0.0.0.0)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to bind (default: {DEFAULT_PORT})")
    parser.add_argument("--tls-cert-file", required=True, metavar="CRT", help="PEM serving certificate (+ chain)")
    parser.add_argument("--tls-private-key-file", required=True, metavar="KEY", help="PEM private key")
    parser.add_argument("--config", metavar="FILE", help="settings YAML (policy actions, exempt namespaces, ...)")
    parser.add_argument(
        "--log-level", default="info", choices=("debug", "info", "warning", "error"), help="default: info"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise errors.InputError(f"--port must be 0-65535, not {args.port}")
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    loaded = config.load(args.config)
    context = tls.server_context(cert_file=args.tls_cert_file, key_file=args.tls_private_key_file)
    asyncio.run(
        _serve(
            loaded,
            host=args.host,
            port=args.port,
            context=context,
            cert_file=args.tls_cert_file,
            key_file=args.tls_private_key_file,
        )
    )
    return 0


async def _serve(
    loaded: settings.Settings, *, host: str, port: int, context: ssl.SSLContext, cert_file: str, key_file: str
) -> None:
    app = admission_app.make_app(loaded)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, ssl_context=context)
        try:
            await site.start()
        except OSError as error:
            raise errors.InputError(f"cannot listen on {host}:{port}: {error.strerror or error}") from error
        for address in runner.addresses:
            # On stdout whatever the log level: with --port 0 this is how callers learn the port.
            print(f"listening on https://{address[0]}:{address[1]}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        loop.add_signal_handler(signal.SIGHUP, _reload, context, cert_file, key_file)
        await stop.wait()
        log.info("uid=- shutting down")
        app[keys.STATE].ready, app[keys.STATE].reason = False, "shutting down"
    finally:
        await runner.cleanup()


def _reload(context: ssl.SSLContext, cert_file: str, key_file: str) -> None:
    try:
        tls.load(context, cert_file=cert_file, key_file=key_file)
    except errors.InputError as error:
        log.error("uid=- SIGHUP: kept the previous certificate: %s", error)
    else:
        log.info("uid=- SIGHUP: reloaded %s", cert_file)
