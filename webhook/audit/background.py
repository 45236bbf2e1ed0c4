"""The background audit inside ``serve``: every interval the leader replica audits and writes the reports.

Wiring (serve): `add_serve_arguments(parser)` adds the flags, and
`app.cleanup_ctx.append(background_audit(settings, interval=..., kubeconfig=..., context=...))` runs the loop
for the app's lifetime. Nothing runs when the interval is 0 (the default).

- Only one replica audits: the one holding the `coordination.k8s.io/v1` Lease
  `gpu-admission-audit` in the process's namespace, through the package's one election
  (`webhook.kube.leader.Elector`, timed by the monotonic clock). The Lease is renewed by its own
  task every few seconds, also while a long audit runs, and released on shutdown.
- A run never overlaps the one before: one task runs them one after another, each in a worker
  thread (the kubernetes client blocks). A run that takes longer than the interval delays the
  next one; the next starts `interval` after the previous one started, or at once when late.
  A run that finds leadership lost before writing does not write.
- Metrics, in the app's registry: `gpu_admission_audit_runs_total{result}`,
  `gpu_admission_audit_duration_seconds`, `gpu_admission_audit_last_run_timestamp_seconds`
  (end of the last successful run), `gpu_admission_audit_leader`, and
  `gpu_admission_audit_results{result}` (the last run's results by kind).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from aiohttp import web

from policies import settings as settings_
from policies.gpu import reservations
from webhook import kube as webhook_kube
from webhook.audit import kube, report, sweep
from webhook.cmdline import errors, flags
from webhook.kube import errors as kube_errors
from webhook.kube import leader
from webhook.serving import metrics

log = logging.getLogger(__name__)

LEASE_NAME = "gpu-admission-audit"
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The background audit's flags on `serve`."""
    parser.add_argument(
        "--audit-interval",
        type=flags.duration,  # an ArgumentTypeError: a usage line, not a traceback
        default=0.0,
        metavar="DURATION",
        help="write PolicyReports every DURATION (e.g. 10m) from the leader replica; 0 (default) turns it off",
    )
    # The audit reads the cluster serve's own --kubeconfig and --context name: one cluster per process.
    flags.add_renamed(parser, "--audit-kubeconfig", new="--kubeconfig (and --context): the background audit uses serve's")
    parser.add_argument("--audit-all-results", action="store_true", help="store pass results in the reports too")


# --- metrics --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class AuditMetrics:
    """The background audit's meters."""

    runs: metrics.Counter
    duration: metrics.Histogram
    last_run: metrics.Gauge
    leader: metrics.Gauge
    results: metrics.Gauge


def audit_metrics(registry: metrics.Registry) -> AuditMetrics:
    """Register the background audit's meters in `registry`."""
    return AuditMetrics(
        runs=registry.register(
            metrics.Counter("gpu_admission_audit_runs_total", "Background audit runs by result (ok, error).", ("result",))
        ),
        duration=registry.register(
            metrics.Histogram(
                "gpu_admission_audit_duration_seconds", "Time one background audit run took.", (), buckets=DURATION_BUCKETS
            )
        ),
        last_run=registry.register(
            metrics.Gauge(
                "gpu_admission_audit_last_run_timestamp_seconds",
                "Unix time the last successful audit run ended.",
                (),
                multiprocess_mode="livemax",
            )
        ),
        leader=registry.register(
            metrics.Gauge(
                "gpu_admission_audit_leader", "1 while this replica holds the audit Lease.", (), multiprocess_mode="livesum"
            )
        ),
        results=registry.register(
            metrics.Gauge(
                "gpu_admission_audit_results",
                "Results of the last audit run, by result (pass, fail, warn, error, skip).",
                ("result",),
                multiprocess_mode="livemostrecent",
            ),
        ),
    )


# --- the loop -------------------------------------------------------------------------------------


# One audit run: given "do we still lead?", audit, write if so, and return the results by kind.
Job = Callable[[Callable[[], bool]], Mapping[str, int]]


@dataclasses.dataclass
class State:
    """What the loop knows (`BackgroundAudit.state`)."""

    leader: bool = False
    runs: int = 0
    running: bool = False
    last_error: str = ""
    overlaps: int = 0  # runs started while one was running; stays 0 by construction


class Background:
    """The election task and the audit task of one replica."""

    def __init__(
        self,
        *,
        interval: float,
        elector: leader.Elector,
        job: Job,
        meters: AuditMetrics,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        state: State | None = None,
    ) -> None:
        self.interval = interval
        self.elector = elector
        self.job = job
        self.meters = meters
        self.clock = clock  # wall time, for the last-run metric only
        self.monotonic = monotonic  # schedules the runs; the elector times the Lease by its own
        self.state = state if state is not None else State()
        self._leading = asyncio.Event()

    def leading(self) -> bool:
        """Whether we hold the Lease and renewed it recently enough that no other replica can have
        taken over (`leader.Elector.leader`: false two thirds into the lease without a successful
        renewal, however long a hung call takes)."""
        return self.elector.leader

    def set_leader(self, leader: bool) -> None:
        election = self.elector.election
        if leader != self.state.leader:
            log.info(
                "uid=- background audit: %s the lease %s/%s", "acquired" if leader else "lost", election.namespace, election.name
            )
        self.state.leader = leader
        self.meters.leader.set(1.0 if leader else 0.0)
        if leader:
            self._leading.set()
        else:
            self._leading.clear()

    async def elect(self) -> None:
        """Renew or contend for the Lease every ``retry_s`` seconds, for ever."""
        while True:
            self.set_leader(await self.elector.step())
            await asyncio.sleep(self.elector.retry_s)

    async def audit(self) -> None:
        """Run the job while leading, at most every `interval` seconds, never two at once."""
        while True:
            await self._leading.wait()
            started = self.monotonic()
            if self.state.running:
                self.state.overlaps += 1
            self.state.running = True
            timer = time.perf_counter()
            try:
                counted = await asyncio.to_thread(self.job, self.leading)
            except Exception as error:  # noqa: BLE001 - one failed run must not end the loop
                self.meters.runs.inc(result="error")
                self.state.last_error = str(error).splitlines()[0] if str(error) else type(error).__name__
                log.error("uid=- background audit run failed: %s", self.state.last_error)
            else:
                self.meters.runs.inc(result="ok")
                self.meters.last_run.set(self.clock())
                for name, value in counted.items():
                    self.meters.results.set(float(value), result=name)
                self.state.last_error = ""
            finally:
                self.state.running = False
                self.state.runs += 1
                self.meters.duration.observe(time.perf_counter() - timer)
            delay = max(0.0, started + self.interval - self.monotonic())
            await asyncio.sleep(delay)


def cluster_job(
    api: Any,
    *,
    settings: settings_.Settings,
    all_results: bool,
    clock: Callable[[], float] = time.time,
    ledger_namespace: str = reservations.LEDGER_NAMESPACE,
) -> Job:
    """The real run: audit every namespace and the nodes (their ledger Leases read in
    `ledger_namespace`), and write the reports if still leading."""

    def job(still_leader: Callable[[], bool]) -> Mapping[str, int]:
        now = clock()
        audit = sweep.audit_cluster(
            api, settings=settings, namespace=None, now=now, ledger_namespace=ledger_namespace, pause_collector=False
        )
        if still_leader():
            _, written = sweep.write_reports(api, audit, all_results=all_results, now=now)
            log.info(
                "uid=- background audit: %d object(s), reports %d created, %d replaced, %d deleted, %d unchanged",
                audit.objects,
                written.created,
                written.replaced,
                written.deleted,
                written.unchanged,
            )
        else:
            log.info("uid=- background audit: lost the lease during the run; nothing written")
        tally = report.counts(audit.findings)
        return {name: tally[name] for name in ("pass", "fail", "warn", "error", "skip")}

    return job


class BackgroundAudit:
    """The `cleanup_ctx` entry: an async-generator callable; `state` shows what the loop does."""

    def __init__(
        self,
        settings: settings_.Settings,
        *,
        interval: float,
        kubeconfig: str | None,
        context: str | None,
        all_results: bool,
        lease_namespace: str | None,
        store: leader.LeaseStore | None,
        job: Job | None,
        retry_s: float,
        registry: metrics.Registry | None = None,
        ledger_namespace: str = reservations.LEDGER_NAMESPACE,
    ) -> None:
        self.settings = settings
        self.interval = interval
        self.kubeconfig = kubeconfig
        self.context = context
        self.all_results = all_results
        self.lease_namespace = lease_namespace
        self.store = store
        self.registry = registry
        self.job = job
        self.retry_s = retry_s
        self.ledger_namespace = ledger_namespace
        self.state = State()

    async def __call__(self, app: web.Application) -> AsyncIterator[None]:
        if self.interval <= 0:
            yield
            return
        api: Any = None
        if self.store is None or self.job is None:
            try:
                api = kube.api_client(self.kubeconfig, context=self.context)
            except kube_errors.KubeError as error:
                raise errors.InputError(f"background audit: {error}") from error
        namespace = self.lease_namespace or webhook_kube.own_namespace()
        elector = leader.Elector(
            self.store or leader.KubeLeaseStore(api, namespace=namespace, name=LEASE_NAME),
            namespace=namespace,
            name=LEASE_NAME,
            identity=leader.identity(),
            retry_s=self.retry_s,
        )
        registry = self.registry if self.registry is not None else metrics.Registry()
        background = Background(
            interval=self.interval,
            elector=elector,
            job=self.job
            or cluster_job(api, settings=self.settings, all_results=self.all_results, ledger_namespace=self.ledger_namespace),
            meters=audit_metrics(registry),
            state=self.state,
        )
        tasks = [asyncio.create_task(background.elect()), asyncio.create_task(background.audit())]
        log.info("uid=- background audit every %gs as %s (lease %s/%s)", self.interval, elector.identity, namespace, LEASE_NAME)
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await elector.release()
            background.set_leader(False)
            if api is not None:
                webhook_kube.close(api)


def background_audit(
    settings: settings_.Settings,
    *,
    interval: float,
    kubeconfig: str | None,
    context: str | None = None,
    all_results: bool = False,
    lease_namespace: str | None = None,
    store: leader.LeaseStore | None = None,
    job: Job | None = None,
    retry_s: float = leader.DEFAULT_RETRY_S,
    registry: metrics.Registry | None = None,
    ledger_namespace: str = reservations.LEDGER_NAMESPACE,
) -> BackgroundAudit:
    """An aiohttp `cleanup_ctx` factory: the background audit for the app's lifetime (nothing if interval is 0).

    `store` and `job` replace the apiserver Lease and the cluster audit (tests, simulations);
    `registry` is where its metrics go (the server's, so one scrape has them; default: its own).
    """
    return BackgroundAudit(
        settings,
        interval=interval,
        kubeconfig=kubeconfig,
        context=context,
        all_results=all_results,
        lease_namespace=lease_namespace,
        store=store,
        job=job,
        retry_s=retry_s,
        registry=registry,
        ledger_namespace=ledger_namespace,
    )
