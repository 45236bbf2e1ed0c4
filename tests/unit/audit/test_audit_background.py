"""The background audit: one leader among replicas, runs never overlap, metrics, shutdown, flags."""

from __future__ import annotations

import argparse
import asyncio
import copy
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from aiohttp import web

from policies import settings as settings_
from webhook import cli
from webhook.admission import keys
from webhook.audit import background
from webhook.audit import kube as audit_kube
from webhook.cmdline import errors
from webhook.kube import errors as kube_errors
from webhook.kube import leader
from webhook.serving import metrics


class MemoryLeaseStore:
    """A Lease in memory with the apiserver's optimistic concurrency (resourceVersion, 409 on a stale write)."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.lock = threading.Lock()

    def read(self) -> Mapping[str, Any] | None:
        with self.lock:
            return copy.deepcopy(self.lease)

    def write(self, body: Mapping[str, Any], *, create: bool) -> Mapping[str, Any]:
        with self.lock:
            if create and self.lease is not None:
                raise kube_errors.Conflict("exists")
            if not create:
                current = self.lease or {}
                if body["metadata"].get("resourceVersion") != current.get("metadata", {}).get("resourceVersion"):
                    raise kube_errors.Conflict("stale")
            self.version += 1
            stored = copy.deepcopy(dict(body))
            stored["metadata"]["resourceVersion"] = str(self.version)
            self.lease = stored
            return copy.deepcopy(stored)


class RecordingJob:
    """Counts runs per replica and the most runs in flight at once (across replicas)."""

    def __init__(self, *, duration: float = 0.0, fail: bool = False) -> None:
        self.duration = duration
        self.fail = fail
        self.runs: dict[str, int] = {}
        self.in_flight = 0
        self.most_in_flight = 0
        self.lock = threading.Lock()

    def for_replica(self, name: str) -> background.Job:
        def job(still_leader: Callable[[], bool]) -> Mapping[str, int]:
            with self.lock:
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
            try:
                deadline = time.monotonic() + self.duration
                while time.monotonic() < deadline:  # a busy run of known length, in the worker thread
                    time.sleep(0.005)
                if self.fail:
                    raise RuntimeError("apiserver went away\nwith details")
                assert still_leader()
                return {"pass": 3, "fail": 1, "warn": 0, "error": 0, "skip": 0}
            finally:
                with self.lock:
                    self.in_flight -= 1
                    self.runs[name] = self.runs.get(name, 0) + 1

        return job


async def until(predicate: Callable[[], bool], *, what: str, timeout: float = 10.0) -> None:
    """Poll with a deadline."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def replica(
    store: MemoryLeaseStore, job: background.Job, *, interval: float = 0.05
) -> tuple[web.Application, background.BackgroundAudit]:
    app = web.Application()
    app[keys.METRICS] = metrics.webhook_metrics()
    context = background.background_audit(
        settings_.Settings(),
        interval=interval,
        kubeconfig=None,
        lease_namespace="gpu-admission",
        store=store,
        job=job,
        retry_s=0.02,
        registry=app[keys.METRICS].registry,
    )
    app.cleanup_ctx.append(context)
    return app, context


async def test_only_the_lease_holder_audits_and_the_other_takes_over_after_it_stops() -> None:
    store, job = MemoryLeaseStore(), RecordingJob()
    first_app, first = replica(store, job.for_replica("first"))
    second_app, second = replica(store, job.for_replica("second"))
    first_runner, second_runner = web.AppRunner(first_app), web.AppRunner(second_app)
    await first_runner.setup()
    await until(lambda: first.state.leader, what="the first replica to lead")
    await second_runner.setup()
    await until(lambda: job.runs.get("first", 0) >= 3, what="three runs on the leader")
    assert not second.state.leader
    assert "second" not in job.runs

    await first_runner.cleanup()  # releases the Lease on the way out
    assert store.lease is not None and store.lease["spec"]["holderIdentity"] is None
    await until(lambda: job.runs.get("second", 0) >= 1, what="the second replica to take over and run", timeout=2.0)
    await second_runner.cleanup()
    assert job.most_in_flight == 1


async def test_a_run_longer_than_the_interval_delays_the_next_one_instead_of_overlapping() -> None:
    store, job = MemoryLeaseStore(), RecordingJob(duration=0.15)
    app, context = replica(store, job.for_replica("only"), interval=0.02)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        await until(lambda: job.runs.get("only", 0) >= 3, what="three long runs")
    finally:
        await runner.cleanup()
    assert job.most_in_flight == 1
    assert context.state.overlaps == 0


async def test_runs_are_measured_in_the_apps_metrics() -> None:
    store, job = MemoryLeaseStore(), RecordingJob()
    app, context = replica(store, job.for_replica("only"))
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        await until(lambda: context.state.runs >= 2, what="two runs")
        text = app[keys.METRICS].registry.render()
    finally:
        await runner.cleanup()
    assert 'gpu_admission_audit_runs_total{result="ok"}' in text
    assert "# TYPE gpu_admission_audit_duration_seconds histogram" in text
    assert "gpu_admission_audit_duration_seconds_count" in text
    assert "# TYPE gpu_admission_audit_last_run_timestamp_seconds gauge" in text
    last_run = float(
        next(line.split()[1] for line in text.splitlines() if line.startswith("gpu_admission_audit_last_run_timestamp_seconds "))
    )
    assert abs(last_run - time.time()) < 60
    assert "gpu_admission_audit_leader 1.0" in text
    assert 'gpu_admission_audit_results{result="fail"} 1.0' in text


async def test_a_failing_run_is_counted_and_the_loop_goes_on() -> None:
    store, job = MemoryLeaseStore(), RecordingJob(fail=True)
    app, context = replica(store, job.for_replica("only"))
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        await until(lambda: job.runs.get("only", 0) >= 2, what="two failed runs")
        text = app[keys.METRICS].registry.render()
    finally:
        await runner.cleanup()
    assert 'gpu_admission_audit_runs_total{result="error"}' in text
    assert context.state.last_error == "apiserver went away"


async def test_an_interval_of_zero_runs_nothing() -> None:
    store, job = MemoryLeaseStore(), RecordingJob()
    app, context = replica(store, job.for_replica("only"), interval=0)
    runner = web.AppRunner(app)
    await runner.setup()
    await runner.cleanup()
    assert store.lease is None and context.state.runs == 0
    assert "gpu_admission_audit" not in app[keys.METRICS].registry.render()


@pytest.mark.parametrize(
    ("text", "seconds"), [("90s", 90), ("10m", 600), ("1h30m", 5400), ("500ms", 0.5), ("45", 45), ("0", 0), ("2.5m", 150)]
)
def test_the_interval_reads_the_one_duration_syntax(text: str, seconds: float) -> None:
    parser = argparse.ArgumentParser()
    background.add_serve_arguments(parser)
    assert parser.parse_args(["--audit-interval", text]).audit_interval == seconds


@pytest.mark.parametrize("text", ["", "ten minutes", "10x", "-5", "5m junk"])
def test_a_bad_interval_is_a_usage_error_not_a_traceback(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["serve", "--audit-interval", text])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: gpu-admission serve ") and "Traceback" not in err
    assert err.splitlines()[-1].startswith("gpu-admission serve: error: argument --audit-interval: ")


def test_serve_arguments_default_to_no_background_audit() -> None:
    parser = argparse.ArgumentParser()
    background.add_serve_arguments(parser)
    assert parser.parse_args([]).audit_interval == 0
    parsed = parser.parse_args(["--audit-interval", "10m", "--audit-all-results"])
    assert (parsed.audit_interval, parsed.audit_all_results) == (600, True)


def test_the_old_audit_kubeconfig_names_serves_kubeconfig(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["serve", "--audit-interval", "10m", "--audit-kubeconfig", "k"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "gpu-admission serve: error: --audit-kubeconfig is no longer a flag of gpu-admission serve: "
        "use --kubeconfig (and --context): the background audit uses serve's"
    )


async def test_the_background_audit_reads_the_cluster_that_kubeconfig_and_context_name(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str | None, str | None]] = []

    def refuse(kubeconfig: str | None = None, *, context: str | None = None) -> Any:
        seen.append((kubeconfig, context))
        raise kube_errors.KubeError("no cluster here")

    monkeypatch.setattr(audit_kube, "api_client", refuse)  # the module background calls
    audit = background.background_audit(settings_.Settings(), interval=60, kubeconfig="cluster.yaml", context="second")
    with pytest.raises(errors.InputError, match="^background audit: no cluster here$"):
        await audit(web.Application()).__anext__()
    assert seen == [("cluster.yaml", "second")]


async def test_leadership_lapses_two_thirds_into_the_lease_without_a_renewal_by_the_monotonic_clock() -> None:
    monotonic, wall = [100.0], [1_700_000_000.0]
    store = MemoryLeaseStore()
    elector = leader.Elector(
        store,
        namespace="gpu-admission",
        name="gpu-admission-audit",
        identity="me",
        duration_s=15,
        retry_s=5.0,
        clock=lambda: wall[0],
        monotonic=lambda: monotonic[0],
    )
    loop = background.Background(
        interval=60,
        elector=elector,
        job=RecordingJob().for_replica("me"),
        meters=background.audit_metrics(metrics.Registry()),
    )
    assert not loop.leading()
    loop.set_leader(await elector.step())
    assert loop.leading()
    wall[0] -= 3600  # the wall clock jumping back (or forward) changes nothing: the claim runs on the monotonic one
    monotonic[0] = 109.9
    assert loop.leading()
    monotonic[0] = 110.0  # 10 s = 2/3 of 15 s since the last successful renewal: another replica may soon take over
    assert not loop.leading()
    loop.set_leader(await elector.step())  # a renewal restores it
    assert loop.leading()


async def test_a_failed_renewal_keeps_the_claim_until_the_renew_deadline() -> None:
    monotonic = [100.0]
    store = MemoryLeaseStore()
    elector = leader.Elector(
        store,
        namespace="gpu-admission",
        name="gpu-admission-audit",
        identity="me",
        duration_s=15,
        retry_s=5.0,
        monotonic=lambda: monotonic[0],
    )
    loop = background.Background(
        interval=60,
        elector=elector,
        job=RecordingJob().for_replica("me"),
        meters=background.audit_metrics(metrics.Registry()),
    )
    loop.set_leader(await elector.step())

    def unreachable() -> Mapping[str, Any] | None:
        raise kube_errors.Unreachable("cannot read lease gpu-admission/gpu-admission-audit: connection refused")

    store.read = unreachable  # type: ignore[method-assign]  # the apiserver goes away
    monotonic[0] = 105.0
    loop.set_leader(await elector.step())
    assert loop.leading() and loop.state.leader, "5 s without a renewal is within the 10 s deadline"
    monotonic[0] = 110.0
    loop.set_leader(await elector.step())
    assert not loop.leading() and not loop.state.leader
