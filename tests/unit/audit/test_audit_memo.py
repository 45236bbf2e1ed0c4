"""Verdicts remembered per pod template (`webhook.audit.verdicts`, issue 19): the fast path changes nothing.

Every test runs the same objects through `scan.run` with the memo (the default) and without it
(`remember=False`, the plain path: every pod through the whole engine) and holds the findings,
and every rendering and report the CLI prints, equal byte for byte.
"""

from __future__ import annotations

import copy
import gc
import io
import itertools
import json
import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from policies import cel, model
from policies import settings as settings_
from tests.unit.audit.conftest import NOW, allocation, build_node, build_pod
from webhook.audit import cli, findings, scan, sweep, verdicts
from webhook.cmdline import manifests

SNAPSHOT = pathlib.Path(__file__).parent / "data" / "cluster.yaml"
NVIDIA_ALL = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}
NVIDIA_VOID = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}


def _listed(pod: dict[str, Any], index: int) -> dict[str, Any]:
    """`pod` as a replica the apiserver lists: own name, uid, token volume, managedFields, running status."""
    listed = copy.deepcopy(pod)
    metadata = listed["metadata"]
    metadata["name"] = f"{metadata['name']}-{index:04x}"
    metadata["uid"] = f"uid-{index:08d}"
    metadata["generateName"] = f"{pod['metadata']['name']}-"
    metadata["resourceVersion"] = str(1000 + index)
    metadata["creationTimestamp"] = f"2026-01-01T00:{index % 60:02d}:00Z"
    metadata["managedFields"] = [{"manager": "kubelet", "operation": "Update", "fieldsV1": {"f:status": {}}}]
    token = f"kube-api-access-{index:05x}"
    listed["spec"].setdefault("volumes", []).append(
        {"name": token, "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}
    )
    for container in listed["spec"]["containers"]:
        container.setdefault("volumeMounts", []).append(
            {"name": token, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}
        )
    listed["status"] = {"phase": listed["status"]["phase"], "podIP": f"10.0.{index // 250}.{index % 250}", "hostIP": "10.240.0.1"}
    return listed


def _templates() -> list[dict[str, Any]]:
    """Pod templates covering passes, failures of each kind, checks, allocations and odd shapes."""
    return [
        build_pod("web", namespace="team-a", node_name="cpu-0", env=[NVIDIA_VOID]),
        build_pod("leak", namespace="team-a", node_name="cpu-0", env=[NVIDIA_ALL]),
        build_pod("leak", namespace="team-b", node_name="cgpu-0", env=[NVIDIA_ALL]),
        build_pod("root", namespace="team-a", node_name="cgpu-0", privileged=True),
        build_pod("host", namespace="team-b", volumes=[{"name": "dev", "hostPath": {"path": "/dev"}}]),
        build_pod(
            "share",
            namespace="team-a",
            node_name="cgpu-0",
            gpu_mem=2,
            node_selector={"ack.node.gpu.schedule": "cgpu"},
            annotations=allocation("cgpu-0", [1], mem=2),
        ),
        build_pod(
            "share",
            namespace="team-a",
            node_name="cgpu-0",
            gpu_mem=2,
            node_selector={"ack.node.gpu.schedule": "cgpu"},
            annotations=allocation("cgpu-0", [2], mem=2),
        ),
        build_pod("gone", namespace="team-a", node_name="cgpu-0", gpu_mem=4, annotations=allocation("nowhere", [0], mem=4)),
        build_pod("wrong", namespace="team-b", node_name="cgpu-0", gpu_mem=1, node_selector={"ack.node.gpu.schedule": "share"}),
        build_pod("whole", namespace="team-b", node_name="exclusive-0", limits={"nvidia.com/gpu": 1}),
        build_pod(
            "done",
            namespace="team-b",
            node_name="cgpu-0",
            gpu_mem=2,
            phase="Succeeded",
            annotations=allocation("cgpu-0", [3], mem=2),
        ),
        build_pod("owned", namespace="team-a", node_name="cpu-0", env=[NVIDIA_ALL], owner=("ReplicaSet", "owned-abc")),
        build_pod("lab", namespace="kube-system", node_name="cpu-0", env=[NVIDIA_ALL]),
    ]


def _objects(replicas: int) -> list[dict[str, Any]]:
    nodes = [build_node("cgpu-0"), build_node("exclusive-0", mode="default"), build_node("cpu-0", mode=None)]
    pods = [_listed(template, i * 100 + k) for k, template in enumerate(_templates()) for i in range(replicas)]
    # One pod named like its volume: GPU003's message names the volume, hence this pod.
    named = build_pod("data", namespace="team-a", volumes=[{"name": "data", "hostPath": {"path": "/dev/nvidia0"}}])
    snapshot = [dict(d.object) for d in manifests.read([str(SNAPSHOT)], stdin=io.StringIO())]
    return [*nodes, *snapshot, *pods, _listed(named, 7), _listed(named, 8)]


def _settings(document: dict[str, Any]) -> settings_.Settings:
    return settings_.from_mapping(document)


SETTINGS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "exempt and overridden": {
        "exemptNamespaces": ["kube-system"],
        "policies": {"GPU001": {"action": "enforce"}, "GPU003": {"action": "audit"}},
        "namespaceOverrides": [{"name": "b", "namespaces": ["team-b"], "policies": {"GPU001": {"action": "warn"}}}],
    },
    "exception by name": {
        "exceptions": [
            {"name": "legacy", "policies": ["GPU001"], "match": {"namespaces": ["team-a"], "names": ["leak-0001", "owned-*"]}}
        ],
    },
    "exception by namespace": {
        "exceptions": [{"name": "lab", "policies": ["GPU001", "GPU002"], "match": {"namespaces": ["team-a"]}}],
    },
}


def _outputs(audit: scan.Audit) -> dict[str, str]:
    """What the CLI prints in every format (json and yaml are the reports), with and without passes."""
    out: dict[str, str] = {}
    for all_results, output in itertools.product((False, True), cli.OUTPUTS):
        reports = sweep.reports(audit, all_results=all_results, now=NOW)
        out[f"{output}/{all_results}"] = cli._text(audit, reports, output=output, all_results=all_results)
    resource = sweep.reports(audit, all_results=True, now=NOW, scope="resource")
    out["resource-scope"] = json.dumps({str(k): v for k, v in resource.items()}, sort_keys=True)
    return out


def _everything(audit: scan.Audit) -> tuple[Any, ...]:
    return (audit.findings, audit.nodes, audit.objects, audit.folded, audit.namespaces, audit.exit_status)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_the_memo_changes_no_finding_and_no_byte_of_any_output(name: str) -> None:
    settings = _settings(SETTINGS[name])
    objects = _objects(replicas=4)

    plain = scan.run(scan.Inventory.of(objects), settings=settings, now=NOW, remember=False)
    fast = scan.run(scan.Inventory.of(objects), settings=settings, now=NOW)

    assert _everything(fast) == _everything(plain)
    assert _outputs(fast) == _outputs(plain)
    assert any(f.result is model.Result.FAIL and f.subject.name.startswith("leak-") for f in plain.findings)


class Counting(verdicts.Memo):
    made: list[Counting] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        Counting.made.append(self)


@pytest.fixture
def memos(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Counting]]:
    Counting.made = []
    monkeypatch.setattr(verdicts, "Memo", Counting)
    yield Counting.made


def test_replicas_are_judged_once_per_template_and_named_each_by_its_own_name(memos: list[Counting]) -> None:
    templates = _templates()
    objects = [build_node("cgpu-0"), *(_listed(t, i * 100 + k) for k, t in enumerate(templates) for i in range(5))]

    audit = scan.run(scan.Inventory.of(objects), settings=settings_.Settings(), now=NOW)

    (memo,) = memos
    assert (memo.misses, memo.hits) == (len(templates), 4 * len(templates))
    leaks = sorted({f.subject.name for f in audit.findings if f.policy == "GPU001" and f.result is model.Result.FAIL})
    assert leaks == sorted(
        [f"leak-{i * 100 + k:04x}" for k in (1, 2) for i in range(5)] + [f"owned-{i * 100 + 11:04x}" for i in range(5)]
    )
    assert {f.subject.uid for f in audit.findings if f.subject.name == "leak-0001"} == {"uid-00000001"}


def test_results_naming_the_pod_are_never_shared(memos: list[Counting]) -> None:
    named = build_pod("data", namespace="team-a", volumes=[{"name": "data", "hostPath": {"path": "/dev/nvidia0"}}])
    objects = [_listed(named, 1), _listed(named, 2)]
    for obj in objects:
        obj["spec"]["volumes"][0]["name"] = obj["metadata"]["name"]  # the volume is named like the pod

    audit = scan.run(scan.Inventory.of(objects), settings=settings_.Settings(), now=NOW)

    (memo,) = memos
    assert (memo.hits, memo.misses) == (0, 2)
    messages = {f.subject.name: f.message for f in audit.findings if f.policy == "GPU003"}
    assert messages["data-0001"] != messages["data-0002"] and "data-0002" in messages["data-0002"]


def test_with_user_policies_nothing_is_remembered_and_a_policy_reading_the_uid_is_right(memos: list[Counting]) -> None:
    document = {
        "apiVersion": "gpu-admission.io/v1alpha1",
        "kind": "GpuAdmissionPolicy",
        "metadata": {"name": "usr001"},
        "spec": {
            "id": "USR001",
            "action": "enforce",
            "matchConstraints": {
                "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]
            },
            "validations": [{"expression": "object.metadata.uid != 'uid-00000002'", "message": "not this one"}],
        },
    }
    settings = settings_.from_mapping({}, user_policies=[cel.compile_policy(document, source="usr.yaml#0")])
    objects = [_listed(build_pod("app"), i) for i in range(4)]

    fast = scan.run(scan.Inventory.of(objects), settings=settings, now=NOW)
    plain = scan.run(scan.Inventory.of(objects), settings=settings, now=NOW, remember=False)

    assert memos == [] or not memos[0].enabled
    assert _everything(fast) == _everything(plain)
    failed = [f.subject.name for f in fast.findings if f.policy == "USR001" and f.result is model.Result.FAIL]
    assert failed == ["app-0002"]


def test_the_key_leaves_out_what_replicas_differ_in_and_nothing_else() -> None:
    template = build_pod("app", namespace="team-a", node_name="cgpu-0", gpu_mem=2)
    memo = verdicts.Memo(settings_.Settings())
    one, two = _listed(template, 1), _listed(template, 2)

    assert memo.key(one) is not None and memo.key(two) is not None
    assert memo.key(one)[0] == memo.key(two)[0]  # type: ignore[index]
    assert memo.key(one)[1] == ["app-0001", "app-", "uid-00000001", "kube-api-access-00001"]  # type: ignore[index]
    changes: list[Callable[[dict[str, Any]], object]] = [
        lambda p: p["spec"].update(nodeName="cgpu-1"),
        lambda p: p["metadata"].setdefault("annotations", {}).update(a="b"),
        lambda p: p["metadata"].update(labels={"a": "b"}),
        lambda p: p["status"].update(phase="Failed"),
        lambda p: p["metadata"].update(namespace="team-b"),
        lambda p: p["spec"]["containers"][0].update(image="other"),
    ]
    for change in changes:
        changed = copy.deepcopy(two)
        change(changed)
        assert memo.key(changed)[0] != memo.key(one)[0]  # type: ignore[index]
    by_name = verdicts.Memo(_settings(SETTINGS["exception by name"]))
    assert by_name.key(one)[0] != by_name.key(two)[0]  # type: ignore[index]


def test_a_result_about_another_object_is_not_remembered() -> None:
    memo = verdicts.Memo(settings_.Settings())
    pod = _listed(build_pod("app"), 1)
    subject = findings.ObjectRef.of(pod)
    other = findings.ObjectRef(namespace="team-a", kind="Pod", name="someone-else")
    found = findings.Finding(
        policy="GPU999",
        rule="r",
        result=model.Result.FAIL,
        action=model.Action.AUDIT,
        severity=findings.Severity.LOW,
        category="c",
        message="m",
        subject=other,
    )
    keyed = memo.key(pod)
    assert keyed is not None

    memo.put(keyed[0], keyed[1], subject, [found])

    assert memo.get(keyed[0], subject) is None


def test_the_collector_is_paused_while_a_run_judges_and_restored_after_even_on_error() -> None:
    assert gc.isenabled()
    with sweep.collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()

    with pytest.raises(RuntimeError, match="listing failed"), sweep.collector_paused():
        raise RuntimeError("listing failed")
    assert gc.isenabled()

    gc.disable()
    try:
        with sweep.collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # it was off: left off
    finally:
        gc.enable()


def test_what_a_paused_run_made_is_not_walked_by_the_collector_after_it() -> None:
    """Back on, the collector starts from an empty youngest generation: the run's objects are frozen."""
    assert gc.isenabled()
    frozen_before = gc.get_freeze_count()
    try:
        with sweep.collector_paused():
            made = [[index] for index in range(50_000)]  # lists: always tracked by the collector
        assert gc.isenabled()
        assert gc.get_count()[0] < 1_000  # not 50,000 young objects waiting for a collection
        assert gc.get_freeze_count() >= frozen_before + len(made)
        assert all(gc.is_tracked(item) for item in made[:10])  # still tracked, only set aside
    finally:
        gc.unfreeze()


def test_the_cli_audit_pauses_the_collector_and_serves_background_audit_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """The switch is per process: `serve`'s background audit shares its process with the webhook's
    handlers, whose cyclic garbage must not wait for a whole run."""
    from policies import settings as settings_
    from webhook.audit import background, scan
    from webhook.audit import kube as audit_kube

    seen: list[bool] = []

    def run(*args: object, **kwargs: object) -> scan.Audit:
        seen.append(gc.isenabled())
        raise RuntimeError("judged")

    monkeypatch.setattr(audit_kube, "objects", lambda *args, **kwargs: iter(()))
    monkeypatch.setattr(scan, "run", run)
    with pytest.raises(RuntimeError, match="judged"):
        sweep.audit_cluster(None, settings=settings_.Settings(), namespace=None, now=0.0)  # type: ignore[arg-type]  # never called
    job = background.cluster_job(None, settings=settings_.Settings(), all_results=False)
    with pytest.raises(RuntimeError, match="judged"):
        job(lambda: True)
    assert seen == [False, True] and gc.isenabled()
