"""PolicyReports (wgpolicyk8s.io/v1alpha2) from findings, and what to write to make the cluster match.

Pure: findings in, report objects and a write plan out; `kube` carries the plan out.

Lifecycle (the decisions, in one place):

- One `PolicyReport` named `gpu-admission` per namespace that has stored results, and one
  `ClusterPolicyReport` named `gpu-admission` for cluster-scoped findings (nodes). No `scope`:
  a report covers its namespace; every result names its objects in `resources`.
- Stored results: everything but `pass` by default, everything with `all_results`. `summary`
  counts the stored results (so `Pass` is 0 unless all results are stored).
- A report is replaced whole on every run, so results for fixed or deleted objects are gone
  after the next run. A namespace left with no stored results has its report deleted (not
  emptied): `kubectl get polr -A` lists exactly the namespaces with something to look at, and
  thousands of clean namespaces cost no etcd objects.
- Idempotent: a result that was already in the report keeps its timestamp (the time it was first
  seen), so an unchanged cluster yields byte-for-byte the same report and no write at all.
- Results as Kyverno reports them: a failure of a policy whose action is `warn` is `result: warn`
  (Kyverno turns `fail` into `warn` for policies annotated `policies.kyverno.io/scored: "false"`),
  and every `warn` result is `scored: false`; `fail`, `error`, `pass` and `skip` are scored. The
  summary counts results as written. policy-reporter (kyverno/policy-reporter,
  pkg/openreports/common.go) reads `warn` as "requirements not met, the policy is not scored".
- Per-resource mode (``audit --report-scope resource``), Kyverno's layout since 1.10: one report
  per object with results, named by the object's uid, with `scope` (the object's
  ObjectReference) and an ownerReference to it, so the garbage collector removes the report with
  its object; labelled `gpu-admission.io/report-scope: resource` so the two modes never touch
  each other's reports. Cluster-scoped objects (nodes) get a ClusterPolicyReport each. Keys are
  `(namespace, name)` there, the namespace alone in the default mode.
- Size: etcd refuses objects past ~1.5 MiB, so a report keeps at most `MAX_RESULTS` results, the
  most serious first; the annotation `gpu-admission.io/omitted-results` says how many were left
  out (summary still counts them).
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, NotRequired, TypedDict

from policies import model
from webhook.audit import findings

GROUP = "wgpolicyk8s.io"
VERSION = "v1alpha2"
API_VERSION = f"{GROUP}/{VERSION}"
NAME = "gpu-admission"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpu-admission"
OMITTED_ANNOTATION = "gpu-admission.io/omitted-results"
MAX_RESULTS = 2000
CLUSTER = ""  # the key of the ClusterPolicyReport among per-namespace reports
SCOPE_LABEL = "gpu-admission.io/report-scope"
RESOURCE_SCOPE = "resource"
REPORT_SCOPES = ("namespace", RESOURCE_SCOPE)
Key = str | tuple[str, str]  # a namespace (default mode) or (namespace, report name) (per-resource mode)

ResultName = Literal["pass", "fail", "warn", "error", "skip"]


class Timestamp(TypedDict):
    """metav1.Timestamp: seconds and nanos since the Unix epoch (not an RFC 3339 string)."""

    seconds: int
    nanos: int


class WireResult(TypedDict):
    """One PolicyReportResult as we write it."""

    source: str
    policy: str
    rule: str
    category: str
    severity: str
    timestamp: Timestamp
    result: ResultName
    scored: bool
    resources: list[dict[str, str]]
    message: str
    properties: dict[str, str]


# PolicyReportSummary; `pass` is a keyword, so only the functional TypedDict form can spell it.
Counts = TypedDict("Counts", {"pass": int, "fail": int, "warn": int, "error": int, "skip": int})


class WireReport(TypedDict):
    """A PolicyReport or ClusterPolicyReport."""

    apiVersion: str
    kind: Literal["PolicyReport", "ClusterPolicyReport"]
    metadata: dict[str, Any]
    scope: NotRequired[dict[str, str]]
    summary: Counts
    results: list[WireResult]


def timestamp(now: float) -> Timestamp:
    """The metav1.Timestamp of a Unix time in seconds."""
    seconds = int(now // 1)
    nanos = min(int(round((now - seconds) * 1e9)), 999_999_999)
    return {"seconds": seconds, "nanos": nanos}


def result_of(finding: findings.Finding) -> ResultName:
    """The result a report writes: a failure of a warn-level policy is `warn`, as Kyverno's unscored policies."""
    return _result_name(finding.result, finding.action)


def _result_name(result: model.Result, action: model.Action) -> ResultName:
    if result is model.Result.FAIL and action is model.Action.WARN:
        return "warn"
    name: ResultName = result.value
    return name


def wire_result(finding: findings.Finding, *, at: Timestamp) -> WireResult:
    """The PolicyReportResult of a finding; `properties.action` is the action it acts with."""
    result = result_of(finding)
    return {
        "source": findings.SOURCE,
        "policy": finding.policy,
        "rule": finding.rule,
        "category": finding.category,
        "severity": finding.severity.value,
        "timestamp": {"seconds": at["seconds"], "nanos": at["nanos"]},  # a copy: reports never share one
        "result": result,
        "scored": result != "warn",
        "resources": [ref.wire() for ref in finding.resources],
        "message": finding.message,
        "properties": {"action": finding.action.value},
    }


def stored(finding: findings.Finding, *, all_results: bool) -> bool:
    """Whether a finding goes into a report: every non-pass one, passes only with `all_results`."""
    return all_results or finding.result is not model.Result.PASS


def counts(results: Iterable[findings.Finding]) -> Counts:
    """How many results of each kind."""
    return tallied(results)[0]


def tallied(results: Iterable[findings.Finding]) -> tuple[Counts, int]:
    """`counts` and how many results are `enforced`, in one pass.

    A cluster audit has a million results: they are counted by (result, action) pair, a few
    distinct pairs, and each pair named once (`result_of`, `findings.Finding.enforced`)."""
    pairs = collections.Counter((finding.result, finding.action) for finding in results)
    tally: Counts = {"pass": 0, "fail": 0, "warn": 0, "error": 0, "skip": 0}
    enforced = 0
    for (result, action), number in pairs.items():
        tally[_result_name(result, action)] += number
        if findings.is_enforced(result, action):
            enforced += number
    return tally, enforced


def _key(result: Mapping[str, Any]) -> str:
    """What identifies a result across runs: everything but its timestamp."""
    return json.dumps({k: v for k, v in result.items() if k != "timestamp"}, sort_keys=True)


def previous_timestamps(report: Mapping[str, Any] | None) -> dict[str, Timestamp]:
    """The timestamps of an existing report's results, by result identity."""
    found: dict[str, Timestamp] = {}
    if not report:
        return found
    for item in report.get("results") or ():
        if isinstance(item, Mapping) and isinstance(item.get("timestamp"), Mapping):
            stamp = item["timestamp"]
            if isinstance(stamp.get("seconds"), int) and isinstance(stamp.get("nanos"), int):
                found[_key(item)] = {"seconds": stamp["seconds"], "nanos": stamp["nanos"]}
    return found


def _importance(finding: findings.Finding) -> tuple[Any, ...]:
    return (findings.RESULT_ORDER[finding.result], findings.SEVERITY_ORDER[finding.severity], findings.sort_key(finding))


def build(
    selected: Sequence[findings.Finding],
    *,
    namespace: str,
    now: Timestamp,
    previous: Mapping[str, Any] | None = None,
    max_results: int = MAX_RESULTS,
    subject: findings.ObjectRef | None = None,
) -> WireReport:
    """The report of one namespace ("" for the ClusterPolicyReport) holding `selected` findings.

    Results keep the timestamp they had in `previous` and are in a stable order, so building from
    the same findings twice gives an equal report.
    """
    kept = sorted(selected, key=_importance)[:max_results]
    omitted = len(selected) - len(kept)
    stamps = previous_timestamps(previous)
    results: list[WireResult] = []
    for finding in sorted(kept, key=findings.sort_key):
        result = wire_result(finding, at=now)
        result["timestamp"] = stamps.get(_key(result), result["timestamp"])
        results.append(result)
    metadata: dict[str, Any] = {"name": NAME, "labels": {MANAGED_BY_LABEL: MANAGED_BY}}
    if subject is not None:
        metadata["name"] = resource_report_name(subject)
        metadata["labels"][SCOPE_LABEL] = RESOURCE_SCOPE
        if subject.uid and subject.api_version and subject.kind and subject.name:
            metadata["ownerReferences"] = [
                {"apiVersion": subject.api_version, "kind": subject.kind, "name": subject.name, "uid": subject.uid}
            ]
    if namespace:
        metadata["namespace"] = namespace
    if omitted:
        metadata["annotations"] = {OMITTED_ANNOTATION: str(omitted)}
    built: WireReport = {
        "apiVersion": API_VERSION,
        "kind": "PolicyReport" if namespace else "ClusterPolicyReport",
        "metadata": metadata,
        "summary": counts(selected),
        "results": results,
    }
    if subject is not None:
        built["scope"] = subject.wire()
    return built


def resource_report_name(subject: findings.ObjectRef) -> str:
    """The per-resource report's name: the object's uid (Kyverno's choice), else kind-name for objects
    from files, which have none."""
    if subject.uid:
        return subject.uid
    text = f"{subject.kind}-{subject.name}".lower()
    return "".join(c if c.isalnum() or c in "-." else "-" for c in text).strip("-.")[:253] or "unnamed"


def desired_by_resource(
    audited: Sequence[findings.Finding],
    *,
    namespaces: Iterable[str],
    all_results: bool,
    now: Timestamp,
    previous: Mapping[Key, Mapping[str, Any]] | None = None,
) -> dict[Key, WireReport | None]:
    """Per-resource mode: one report per subject with stored results, keyed (namespace, name).

    A report of an owned namespace that `previous` holds and no finding calls for is None (deleted),
    so a fixed object's report goes on the next run, as in the per-namespace mode.
    """
    previous = previous or {}
    owned = set(namespaces)
    by_subject: dict[findings.ObjectRef, list[findings.Finding]] = {}
    skip = None if all_results else model.Result.PASS  # `stored`, inlined as in `desired`
    for finding in audited:
        if finding.result is not skip and finding.subject.namespace in owned:
            by_subject.setdefault(finding.subject, []).append(finding)
    wanted: dict[Key, WireReport | None] = {key: None for key in previous if isinstance(key, tuple) and key[0] in owned}
    for subject, selected in sorted(by_subject.items(), key=lambda item: (item[0].namespace, item[0].kind, item[0].name)):
        key = (subject.namespace, resource_report_name(subject))
        wanted[key] = build(selected, namespace=subject.namespace, now=now, previous=previous.get(key), subject=subject)
    return wanted


def desired(
    audited: Sequence[findings.Finding],
    *,
    namespaces: Iterable[str],
    all_results: bool,
    now: Timestamp,
    previous: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, WireReport | None]:
    """Every report the run owns, by namespace (CLUSTER for the cluster report); None: must not exist.

    `namespaces` are the report keys this run is responsible for (the audited namespaces, and
    CLUSTER when nodes were audited); keys of findings outside them are ignored.
    """
    previous = previous or {}
    owned = set(namespaces)
    by_namespace: dict[str, list[findings.Finding]] = {key: [] for key in owned}
    # `stored` and `Finding.namespace` inlined: a cluster audit has a million results, most of them passes.
    skip = None if all_results else model.Result.PASS
    for finding in audited:
        if finding.result is not skip and (namespace := finding.subject.namespace) in owned:
            by_namespace[namespace].append(finding)
    return {
        key: build(selected, namespace=key, now=now, previous=previous.get(key)) if selected else None
        for key, selected in sorted(by_namespace.items())
    }


class Verb(enum.StrEnum):
    """What a write step does."""

    CREATE = "create"
    REPLACE = "replace"
    DELETE = "delete"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Step:
    """One write: create or replace `body` (with `resource_version` for a replace), or delete."""

    verb: Verb
    namespace: str  # CLUSTER for the ClusterPolicyReport
    body: WireReport | None = None
    resource_version: str = ""
    name: str = NAME


def locate(key: Key) -> tuple[str, str]:
    """The namespace and name of the report a key stands for."""
    return key if isinstance(key, tuple) else (key, NAME)


def same(existing: Mapping[str, Any], wanted: WireReport) -> bool:
    """Whether the stored report already says what `wanted` says (server-set metadata ignored)."""
    metadata = existing.get("metadata") or {}
    ours = wanted["metadata"]
    return (
        existing.get("results") == wanted["results"]
        and existing.get("summary") == wanted["summary"]
        and (metadata.get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY
        and (metadata.get("annotations") or {}).get(OMITTED_ANNOTATION) == ours.get("annotations", {}).get(OMITTED_ANNOTATION)
    )


def plan(wanted: Mapping[Any, WireReport | None], existing: Mapping[Any, Mapping[str, Any]]) -> list[Step]:
    """The writes that make `existing` (our reports now, by namespace) match `wanted`.

    Unchanged reports produce no step; a report that exists where `wanted` has None (or no entry
    at all) is deleted.
    """
    steps: list[Step] = []
    for key in sorted(set(wanted) | set(existing)):
        body = wanted.get(key)
        current = existing.get(key)
        namespace, name = locate(key)
        if body is None:
            if current is not None:
                steps.append(Step(verb=Verb.DELETE, namespace=namespace, name=name))
        elif current is None:
            steps.append(Step(verb=Verb.CREATE, namespace=namespace, body=body, name=name))
        elif not same(current, body):
            version = str((current.get("metadata") or {}).get("resourceVersion") or "")
            steps.append(Step(verb=Verb.REPLACE, namespace=namespace, body=body, resource_version=version, name=name))
    return steps


def as_list(reports: Mapping[Any, WireReport | None]) -> dict[str, Any]:
    """The reports that exist as a `v1 List` (what `-o json|yaml` prints; `kubectl apply -f` takes it)."""
    items = [reports[key] for key in sorted(reports) if reports[key] is not None]
    return {"apiVersion": "v1", "kind": "List", "items": items}
