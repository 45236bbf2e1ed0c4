"""The labeler's optional health endpoint (`--health-port`): `/healthz` and `/readyz` over plain HTTP.

- `/healthz` is 200 while the loop keeps passing (the last pass is younger than three intervals plus
  a minute), else 503: a hung loop gets the pod restarted, while a missing NVML or an unreachable
  apiserver does not (the loop still passes; restarting would not help, see the runner).
- `/readyz` is 200 once the first pass has finished.

The server is the standard library's, in a daemon thread beside the (synchronous) loop: two
fixed-text endpoints do not justify an event loop.
"""

from __future__ import annotations

import http.server
import logging
import threading
import time
from collections.abc import Callable

from webhook.labeler import runner

logger = logging.getLogger(__name__)

GRACE_S = 60.0


def is_live(loop: runner.Runner, *, now: float) -> bool:
    """Whether the loop has passed recently enough (before the first pass: since it started)."""
    if loop.last_pass_at is None:
        return True
    return now - loop.last_pass_at <= 3 * loop.options.interval_s + GRACE_S


def serve(loop: runner.Runner, *, port: int, host: str = "0.0.0.0", clock: Callable[[], float] = time.monotonic) -> http.server.ThreadingHTTPServer:
    """Start serving in a daemon thread; the caller shuts the returned server down."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the name http.server dispatches to
            if self.path == "/healthz":
                ok = is_live(loop, now=clock())
                self._answer(200 if ok else 503, f"{'ok' if ok else 'stalled'} {loop.last_outcome or 'starting'}\n")
            elif self.path == "/readyz":
                ready = loop.passes > 0
                self._answer(200 if ready else 503, "ready\n" if ready else "no pass yet\n")
            else:
                self._answer(404, "not found\n")

        def _answer(self, status: int, text: str) -> None:
            body = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's signature
            logger.debug(format, *args)

    server = http.server.ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    # A short poll keeps shutdown() quick; the cost is a wake-up every 0.1 s in an idle thread.
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="labeler-health", daemon=True).start()
    logger.info("health endpoint on %s:%d (/healthz, /readyz)", host, server.server_address[1])
    return server
