"""The labeler's optional health endpoint (`--health-port`): `/healthz`, `/readyz` and `/metrics` over plain HTTP.

- `/healthz` is 200 while the loop keeps passing (the last pass is younger than three intervals plus
  a minute), else 503: a hung loop gets the pod restarted, while a missing NVML or an unreachable
  apiserver does not (the loop still passes; restarting would not help, see the runner).
- `/readyz` is 200 once the first pass has finished.
- `/metrics`: passes by outcome, the Unix time of the last pass that wrote the node (or found
  it right), process metrics and build info; with real use read (`policies.gpu.usage`), per card the
  memory its processes hold, the memory and number of out-of-band processes, and the usage
  annotation writes; per pod and card (`namespace`, `pod`, `card`) the memory its processes hold
  and what its allocation gives it (`podusage`; a pod's series go when the pod goes, since the
  collector yields only the last pass's pods); whether those figures are stale
  (`gpu_admission_labeler_usage_stale` 1: the last pass could not read the cards, a process's
  cgroup or the pods, and the figures are older) and when they were last read; with usage limits
  on, the Events sent and the evictions by result.

Scrape the labeler with `honorLabels: true` (deploy/components/monitoring/monitors.yaml): the
per-pod series carry the tenant pod's `namespace` and `pod`, which must win over the target's own.

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

from policies.gpu import usage
from webhook.labeler import limits, runner
from webhook.serving import metrics

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
POD_USED_METRIC = "gpu_admission_labeler_pod_memory_used_mib"
POD_REQUESTED_METRIC = "gpu_admission_labeler_pod_memory_requested_mib"
USAGE_STALE_METRIC = "gpu_admission_labeler_usage_stale"
USAGE_READ_METRIC = "gpu_admission_labeler_usage_read_timestamp_seconds"
LIMIT_EVENTS_METRIC = "gpu_admission_labeler_usage_limit_events_total"
EVICTIONS_METRIC = "gpu_admission_labeler_usage_limit_evictions_total"


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
        oob_mib = GaugeMetricFamily(
            OUT_OF_BAND_MIB_METRIC, "GPU memory held by processes of no pod, per card (MiB).", labels=("card",)
        )
        oob_count = GaugeMetricFamily(OUT_OF_BAND_PROCESSES_METRIC, "Processes of no pod on each card.", labels=("card",))
        summary = self._loop.last_usage
        for card in summary.cards if isinstance(summary, usage.NodeUsage) else ():
            if card.used_mib is not None:
                used.add_metric([str(card.index)], float(card.used_mib))
            oob_mib.add_metric([str(card.index)], float(card.out_of_band_mib))
            oob_count.add_metric([str(card.index)], float(len(card.out_of_band)))
        yield from (used, oob_mib, oob_count)
        yield from self._per_pod()

    def _per_pod(self) -> Iterable[Metric]:
        labels = ("namespace", "pod", "card")
        used = GaugeMetricFamily(POD_USED_METRIC, "GPU memory the pod's processes hold on the card (MiB).", labels=labels)
        requested = GaugeMetricFamily(
            POD_REQUESTED_METRIC,
            "GPU memory the pod's allocation gives it on the card (MiB; 0: a card it was not given).",
            labels=labels,
        )
        figures = self._loop.pod_figures
        for figure in figures if isinstance(figures, tuple) else ():
            key = [figure.namespace, figure.name, str(figure.card)]
            used.add_metric(key, float(figure.used_mib))
            if figure.requested_mib is not None:
                requested.add_metric(key, float(figure.requested_mib))
        stale = GaugeMetricFamily(
            USAGE_STALE_METRIC,
            "1 when the per-pod figures are stale (the last pass could not read the cards, a cgroup or the pods).",
        )
        stale.add_metric([], 1.0 if self._loop.usage_stale else 0.0)
        yield from (used, requested, stale)
        read_at = self._loop.usage_read_wall
        if isinstance(read_at, float):
            read = GaugeMetricFamily(USAGE_READ_METRIC, "Unix time of the last pass that read the per-pod figures fresh.")
            read.add_metric([], read_at)
            yield read
        events = CounterMetricFamily(
            LIMIT_EVENTS_METRIC.removesuffix("_total"), "Events the usage limits sent, by reason.", labels=("reason",)
        )
        evictions = CounterMetricFamily(
            EVICTIONS_METRIC.removesuffix("_total"),
            "Evictions of pods above their GPU memory request, by result.",
            labels=("result",),
        )
        enforcer = self._loop.enforcer
        if isinstance(enforcer, limits.Enforcer):
            for reason, count in sorted(enforcer.events.items()):
                events.add_metric([reason], float(count))
            for result, count in sorted(enforcer.evictions.items()):
                evictions.add_metric([result], float(count))
        yield from (events, evictions)


def registry(loop: runner.Runner) -> metrics.Registry:
    """The labeler's metrics over ``loop``."""
    found = metrics.Registry(runtime=True)
    found.register_collector(
        _Collector(loop),
        names=(
            PASSES_METRIC,
            LAST_SUCCESS_METRIC,
            USAGE_WRITES_METRIC,
            CARD_USED_METRIC,
            OUT_OF_BAND_MIB_METRIC,
            OUT_OF_BAND_PROCESSES_METRIC,
            POD_USED_METRIC,
            POD_REQUESTED_METRIC,
            USAGE_STALE_METRIC,
            USAGE_READ_METRIC,
            LIMIT_EVENTS_METRIC,
            EVICTIONS_METRIC,
        ),
    )
    return found


def serve(
    loop: runner.Runner, *, port: int, host: str = "0.0.0.0", clock: Callable[[], float] = time.monotonic
) -> http.server.ThreadingHTTPServer:
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
