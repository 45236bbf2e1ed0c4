"""The labeler's optional health endpoint (`--health-port`): `/healthz`, `/readyz` and `/metrics` over plain HTTP.

- `/healthz` is 200 while the loop keeps passing (the last pass is younger than three intervals plus
  a minute), else 503: a hung loop gets the pod restarted, while a missing NVML or an unreachable
  apiserver does not (the loop still passes; restarting would not help, see the runner).
- `/readyz` is 200 once the first pass has finished.
- `/metrics`: passes by outcome, the Unix time of the last pass that wrote the node (or found
  it right), process metrics and build info; with real use read (`policies.usage`), per card the
  memory its processes hold, the memory and number of out-of-band processes, and the usage
  annotation writes.

The server is the standard library's, in a daemon thread beside the (synchronous) loop: two
fixed-text endpoints do not justify an event loop.
"""

from __future__ import annotations

import http.server
import logging
import threading
import time
from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from policies import usage
from webhook.serving import metrics
from webhook.labeler import runner

logger = logging.getLogger(__name__)

GRACE_S = 60.0


def is_live(loop: runner.Runner, *, now: float) -> bool:
    """Whether the loop has passed recently enough (before the first pass: since it started)."""
    if loop.last_pass_at is None:
        return True
    return now - loop.last_pass_at <= 3 * loop.options.interval_s + GRACE_S


LAST_SUCCESS_METRIC = "gpu_admission_labeler_last_success_timestamp_seconds"
CARD_USED_METRIC = "gpu_admission_labeler_card_memory_used_mib"
OUT_OF_BAND_MIB_METRIC = "gpu_admission_labeler_card_out_of_band_memory_mib"
OUT_OF_BAND_PROCESSES_METRIC = "gpu_admission_labeler_card_out_of_band_processes"
USAGE_WRITES_METRIC = "gpu_admission_labeler_usage_writes_total"
PASSES_METRIC = "gpu_admission_labeler_passes_total"


class _Collector:
    """The runner's figures, read at scrape time (the loop runs in another thread; ints and floats
    are replaced whole, never half-written)."""

    def __init__(self, loop: runner.Runner) -> None:
        self._loop = loop

    def collect(self) -> Iterable[Metric]:
        passes = CounterMetricFamily(PASSES_METRIC.removesuffix("_total"), "Labeling passes by outcome.", labels=("outcome",))
        for outcome in runner.Outcome:
            passes.add_metric([str(outcome)], float(self._loop.outcomes.get(outcome, 0)))
        yield passes
        if self._loop.last_success_wall is not None:
            last = GaugeMetricFamily(
                LAST_SUCCESS_METRIC, "Unix time of the last pass that wrote the node's GPU labels or found them right."
            )
            last.add_metric([], self._loop.last_success_wall)
            yield last
        writes = CounterMetricFamily(USAGE_WRITES_METRIC.removesuffix("_total"), "Writes of the usage summary annotation.")
        writes.add_metric([], float(self._loop.usage_writes))
        yield writes
        # The families are always there (without samples until real use has been read once).
        used = GaugeMetricFamily(CARD_USED_METRIC, "GPU memory in use per card (MiB, NVML's figure).", labels=("card",))
        oob_mib = GaugeMetricFamily(OUT_OF_BAND_MIB_METRIC, "GPU memory held by processes of no pod, per card (MiB).", labels=("card",))
        oob_count = GaugeMetricFamily(OUT_OF_BAND_PROCESSES_METRIC, "Processes of no pod on each card.", labels=("card",))
        summary = self._loop.last_usage
        for card in summary.cards if isinstance(summary, usage.NodeUsage) else ():
            if card.used_mib is not None:
                used.add_metric([str(card.index)], float(card.used_mib))
            oob_mib.add_metric([str(card.index)], float(card.out_of_band_mib))
            oob_count.add_metric([str(card.index)], float(len(card.out_of_band)))
        yield from (used, oob_mib, oob_count)


def registry(loop: runner.Runner) -> metrics.Registry:
    """The labeler's metrics over ``loop``."""
    found = metrics.Registry(runtime=True)
    found.register_collector(
        _Collector(loop),
        names=(PASSES_METRIC, LAST_SUCCESS_METRIC, USAGE_WRITES_METRIC, CARD_USED_METRIC, OUT_OF_BAND_MIB_METRIC, OUT_OF_BAND_PROCESSES_METRIC),
    )
    return found


def serve(loop: runner.Runner, *, port: int, host: str = "0.0.0.0", clock: Callable[[], float] = time.monotonic) -> http.server.ThreadingHTTPServer:
    """Start serving in a daemon thread; the caller shuts the returned server down."""
    meters = registry(loop)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the name http.server dispatches to
            if self.path == "/healthz":
                ok = is_live(loop, now=clock())
                self._answer(200 if ok else 503, f"{'ok' if ok else 'stalled'} {loop.last_outcome or 'starting'}\n")
            elif self.path == "/readyz":
                ready = loop.passes > 0
                self._answer(200 if ready else 503, "ready\n" if ready else "no pass yet\n")
            elif self.path == "/metrics":
                self._answer(200, meters.render(), content_type=metrics.CONTENT_TYPE)
            else:
                self._answer(404, "not found\n")

        def _answer(self, status: int, text: str, *, content_type: str = "text/plain; charset=utf-8") -> None:
            body = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's signature
            logger.debug(format, *args)

    server = http.server.ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    # A short poll keeps shutdown() quick; the cost is a wake-up every 0.1 s in an idle thread.
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="labeler-health", daemon=True).start()
    logger.info("health endpoint on %s:%d (/healthz, /readyz, /metrics)", host, server.server_address[1])
    return server
