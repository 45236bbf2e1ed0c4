"""One audit of a live cluster: list, judge, and bring the PolicyReports in line (CLI and background share it).

Synchronous throughout (the kube adapter is); the background audit runs it in a thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
from collections.abc import Iterator, Mapping
from typing import Any

from policies import settings as settings_
from policies.gpu import reservations
from webhook.audit import kube, report, scan
from webhook.kube import client
from webhook.kube import envsources as kube_envsources


@dataclasses.dataclass(frozen=True, kw_only=True)
class Written:
    """What a report write did."""

    created: int = 0
    replaced: int = 0
    deleted: int = 0
    unchanged: int = 0

    @property
    def writes(self) -> int:
        return self.created + self.replaced + self.deleted


def scope_of(namespace: str | None) -> scan.Scope:
    """All namespaces (and the nodes) without a namespace, else just that namespace."""
    return scan.Scope(namespaces=None if namespace is None else frozenset({namespace}))


def audit_cluster(
    api: client.ApiClient,
    *,
    settings: settings_.Settings,
    namespace: str | None,
    now: float,
    ledger_namespace: str = reservations.LEDGER_NAMESPACE,
    pause_collector: bool = True,
) -> scan.Audit:
    """List what `namespace` (None: every namespace and the nodes, with the ledger Leases of
    `ledger_namespace`) holds and judge it, each page of pods as it arrives (`kube.objects` lists
    them last; `scan.run` keeps little of each). `pause_collector=False` leaves Python's cyclic
    collector on: `serve`'s background audit shares its process with the webhook's handlers."""
    inventory = scan.Inventory.streamed(kube.objects(api, namespace=namespace, ledger_namespace=ledger_namespace))
    with collector_paused() if pause_collector else contextlib.nullcontext():
        return scan.run(
            inventory,
            settings=settings,
            scope=scope_of(namespace),
            now=now,
            env_lookup=kube_envsources.env_lookup(api),
            ledger_namespace=ledger_namespace,
        )


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while the pages are decoded and judged, back on after.

    Decoding a page of 500 pods makes some 100,000 objects, and the collector, triggered by
    allocations, walks the young ones again and again and every so often the whole heap (by then
    a million findings): measured on a live 100,000-pod audit, 9.5 of 10.8 s in `orjson.loads` were
    the collector's, not the decoder's. What a run makes is acyclic (decoded JSON, frozen findings),
    so nothing is left for the collector to find. The switch is per process, so `serve`'s background
    audit does not use it (the webhook's handlers there would keep their cyclic garbage for the
    length of a run). No-op where it was off.

    Turned back on, the collector would find every object the run made in its youngest generation
    and walk them all at its first collections (a million findings at 100,000 pods: seconds of the
    reports and the table that follow, measured 1.1 s at 20,000 pods for the next 200,000
    allocations). They are moved to the permanent generation first (`gc.freeze`), so it walks only
    what is made after the run; reference counting still frees them, and a process that audits
    once (the CLI) has nothing else to lose.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.freeze()
            gc.enable()


def owned(audit: scan.Audit) -> set[str]:
    """The report keys a run answers for: the audited namespaces, and the cluster report when nodes were audited."""
    if audit.scope.namespaces is not None:
        return set(audit.scope.namespaces)
    return {*audit.namespaces, report.CLUSTER}


def reports(
    audit: scan.Audit,
    *,
    all_results: bool,
    now: float,
    previous: Mapping[report.Key, Mapping[str, Any]] | None = None,
    scope: str = "namespace",
) -> dict[report.Key, report.WireReport | None]:
    """The reports the audit calls for (None where a report must not exist); `scope` "resource":
    one per object (``report.desired_by_resource``)."""
    if scope == report.RESOURCE_SCOPE:
        return report.desired_by_resource(
            audit.findings, namespaces=owned(audit), all_results=all_results, now=report.timestamp(now), previous=previous
        )
    by_namespace = {key: value for key, value in (previous or {}).items() if isinstance(key, str)}
    wanted: dict[report.Key, report.WireReport | None] = {}
    wanted.update(
        report.desired(
            audit.findings, namespaces=owned(audit), all_results=all_results, now=report.timestamp(now), previous=by_namespace
        )
    )
    return wanted


def write_reports(
    api: client.ApiClient, audit: scan.Audit, *, all_results: bool, now: float, scope: str = "namespace"
) -> tuple[dict[report.Key, report.WireReport | None], Written]:
    """Replace our reports with what `audit` found; unchanged reports are not written.

    With every namespace in scope, our reports in namespaces that no longer hold findings (or no
    longer hold anything) are deleted; with one namespace, only that namespace's report is touched.
    """
    namespace = None if audit.scope.namespaces is None else next(iter(sorted(audit.scope.namespaces)), None)
    existing = kube.existing_reports(api, namespace=namespace, cluster=audit.scope.cluster, scope=scope)
    wanted = reports(audit, all_results=all_results, now=now, previous=existing, scope=scope)
    steps = report.plan(wanted, existing)
    kube.apply(api, steps)
    counted = {verb: sum(1 for step in steps if step.verb is verb) for verb in report.Verb}
    present = sum(1 for body in wanted.values() if body is not None)
    return wanted, Written(
        created=counted[report.Verb.CREATE],
        replaced=counted[report.Verb.REPLACE],
        deleted=counted[report.Verb.DELETE],
        unchanged=present - counted[report.Verb.CREATE] - counted[report.Verb.REPLACE],
    )
