"""One audit run: validate policies with their actions, exempt namespaces, controller folding, scope, exit status."""

from __future__ import annotations

import dataclasses

import pytest

from policies import model
from policies import settings as settings_
from policies.builtin import gpu003_host_path
from tests.unit.audit.conftest import NOW, NodeFactory, PodFactory, WorkloadFactory, allocation
from webhook.audit import findings, scan

BYPASS = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
VOID = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]


def run(*objects: dict[str, object], settings: settings_.Settings | None = None, scope: scan.Scope = scan.Scope()) -> scan.Audit:
    return scan.run(scan.Inventory.of(objects), settings=settings or settings_.Settings(), scope=scope, now=NOW)


def of(audit: scan.Audit, name: str, policy: str) -> list[findings.Finding]:
    return [f for f in audit.findings if f.subject.name == name and f.policy == policy]


def test_every_validate_policy_has_a_result_per_pod_passes_included(pod: PodFactory) -> None:
    audit = run(pod("clean", gpu_mem=3, node_selector={"ack.node.gpu.schedule": "cgpu"}))
    by_policy = {f.policy: f.result for f in audit.findings}
    assert by_policy == {
        p: model.Result.PASS
        for p in ("GPU001", "GPU002", "GPU003", "GPU004", "GPU005", "GPU006", "GPU009", "GPU010", "GPU011", "GPU012", "GPU207")
    }
    assert audit.exit_status == 0


def test_a_failure_carries_the_engine_message_and_the_configured_action(pod: PodFactory) -> None:
    audit = run(pod("sneaky", env=BYPASS))
    (found,) = of(audit, "sneaky", "GPU001")
    assert found.result is model.Result.FAIL
    assert found.action is model.Action.ENFORCE
    assert found.message == (
        "GPU001: containers must not set the environment that chooses GPUs or switches off their isolation: "
        'container "main" sets NVIDIA_VISIBLE_DEVICES=all; request GPUs as resources, or use void'
    )
    assert (found.rule, found.severity, found.category) == ("visible-devices", findings.Severity.HIGH, "GPU Security")
    assert audit.exit_status == 1


def test_results_are_recorded_whatever_the_action(pod: PodFactory) -> None:
    for action in (model.Action.AUDIT, model.Action.WARN):
        configured = settings_.from_mapping({"policies": {"GPU001": {"action": action.value}}})
        audit = run(pod("sneaky", env=BYPASS), settings=configured)
        (found,) = of(audit, "sneaky", "GPU001")
        assert (found.result, found.action) == (model.Result.FAIL, action)
        assert audit.exit_status == 0  # only enforce-level failures make the audit fail


def test_a_policy_that_is_off_is_a_skip(pod: PodFactory) -> None:
    configured = settings_.from_mapping({"policies": {"GPU001": {"action": "off"}}})
    (found,) = of(run(pod("sneaky", env=BYPASS), settings=configured), "sneaky", "GPU001")
    assert (found.result, found.message) == (model.Result.SKIP, "GPU001: the policy is off")


def test_objects_are_judged_as_stored_not_as_the_mutators_would_change_them(pod: PodFactory) -> None:
    # GPU104 would add NVIDIA_VISIBLE_DEVICES=void to this container, which env-over-envFrom makes win
    # over what the prefix composes; the stored pod has no such entry, so its envFrom is what GPU001
    # must judge.
    from_config = pod("configured")
    from_config["spec"]["containers"][0]["envFrom"] = [{"prefix": "NVIDIA_", "configMapRef": {"name": "settings"}}]
    (found,) = of(run(from_config), "configured", "GPU001")
    assert (found.result, found.action) == (model.Result.FAIL, model.Action.ENFORCE)


def test_objects_in_exempt_namespaces_are_skipped_with_the_reason(node: NodeFactory, pod: PodFactory) -> None:
    audit = run(node(), pod("plugin", namespace="kube-system", node_name="cgpu-0", privileged=True, env=BYPASS))
    results = [f for f in audit.findings if f.subject.name == "plugin"]
    assert {f.policy for f in results} == {
        "GPU001",
        "GPU002",
        "GPU003",
        "GPU004",
        "GPU005",
        "GPU006",
        "GPU009",
        "GPU010",
        "GPU011",
        "GPU012",
        "GPU201",
    }
    assert all(f.result is model.Result.SKIP and f.message == "namespace kube-system is exempt" for f in results)
    assert audit.exit_status == 0


def test_a_template_finding_is_reported_once_on_the_controller(pod: PodFactory, workload: WorkloadFactory) -> None:
    bad = pod(env=BYPASS)
    deployment = workload("Deployment", "web", pod=bad)
    replica_set = workload("ReplicaSet", "web-5d4f", pod=bad, owner=("Deployment", "web"))
    pods = [pod(f"web-5d4f-{i}", env=BYPASS, owner=("ReplicaSet", "web-5d4f")) for i in range(3)]
    audit = run(deployment, replica_set, *pods)
    failing = [f for f in audit.findings if f.result is model.Result.FAIL]
    assert [(f.subject.kind, f.subject.name, f.policy) for f in failing] == [("Deployment", "web", "GPU001")]
    assert audit.folded == 4 * 10  # every result of the ReplicaSet and its three pods repeats the Deployment's


def test_a_pod_that_differs_from_its_template_keeps_its_own_results(pod: PodFactory, workload: WorkloadFactory) -> None:
    deployment = workload("Deployment", "web", pod=pod(env=VOID))
    old = pod("web-old", env=BYPASS, owner=("Deployment", "web"))  # from an earlier template, still running
    (found,) = of(run(deployment, old), "web-old", "GPU001")
    assert found.result is model.Result.FAIL


def test_a_controller_of_another_uid_does_not_fold(pod: PodFactory, workload: WorkloadFactory) -> None:
    recreated = workload("Deployment", "web", pod=pod(env=BYPASS))
    recreated["metadata"]["uid"] = "uid-new"
    orphan = pod("web-1", env=BYPASS, owner=("Deployment", "web"))  # owner uid is uid-team-a-web
    assert of(run(recreated, orphan), "web-1", "GPU001")[0].result is model.Result.FAIL


def test_node_checks_and_allocation_pictures_belong_to_an_all_namespace_audit(node: NodeFactory, pod: PodFactory) -> None:
    objects = [
        node(card_labels=False),
        node("cpu-0", mode=None, capacity={}),
        pod(
            "a",
            node_name="cgpu-0",
            gpu_mem=20,
            annotations=allocation("cgpu-0", [0], mem=20),
            node_selector={"ack.node.gpu.schedule": "cgpu"},
        ),
    ]
    everything = run(*objects)
    node_results = {f.policy: f.result for f in everything.findings if f.subject.kind == "Node"}
    assert node_results == {
        "GPU202": model.Result.FAIL,
        "GPU205": model.Result.PASS,
        "GPU206": model.Result.FAIL,
        "GPU208": model.Result.PASS,
        "GPU212": model.Result.PASS,
        "GPU217": model.Result.PASS,  # its ack.node.gpu.schedule label marks it, card labels or not
    }
    assert [state.name for state in everything.nodes] == ["cgpu-0"]
    assert everything.exit_status == 1

    one = run(*objects, scope=scan.Scope(namespaces=frozenset({"team-a"})))
    assert not [f for f in one.findings if f.subject.kind == "Node"]
    assert one.nodes == ()
    assert {f.policy for f in one.findings} >= {"GPU001", "GPU204"}  # pod checks against nodes still run


def test_a_namespace_filter_leaves_other_namespaces_out(pod: PodFactory) -> None:
    audit = run(
        pod("a", namespace="team-a", env=BYPASS),
        pod("b", namespace="team-b", env=BYPASS),
        scope=scan.Scope(namespaces=frozenset({"team-b"})),
    )
    assert {f.subject.name for f in audit.findings} == {"b"}
    assert audit.namespaces == frozenset({"team-b"})


def test_objects_without_a_namespace_land_in_default(pod: PodFactory) -> None:
    bare = pod("bare", env=BYPASS)
    del bare["metadata"]["namespace"]
    (found,) = of(run(bare), "bare", "GPU001")
    assert found.namespace == "default"


def test_other_kinds_are_ignored_and_odd_objects_do_not_crash(pod: PodFactory) -> None:
    inventory = scan.Inventory.of(
        [{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}, {"kind": "Pod", "spec": "nonsense"}]
    )
    audit = scan.run(inventory, settings=settings_.Settings(), now=NOW)
    assert audit.objects == 1
    assert {f.result for f in audit.findings} <= {model.Result.PASS, model.Result.SKIP}


def test_a_crashing_policy_is_an_error_result_not_a_crash(monkeypatch: pytest.MonkeyPatch, pod: PodFactory) -> None:
    def boom(self: object, context: object) -> list[object]:
        raise RuntimeError("kaboom")

    monkeypatch.setattr(gpu003_host_path.HostPathDevices, "validate", boom)
    # The pod has no volumes, which GPU003's pre-check would skip it for: make it run and crash.
    monkeypatch.setattr(gpu003_host_path.HostPathDevices, "relevant", lambda self, context, facts: True)
    (found,) = of(run(pod("p")), "p", "GPU003")
    assert found.result is model.Result.ERROR
    assert found.action is model.Action.ENFORCE  # validate errors fail closed by default
    assert "GPU003: policy error: RuntimeError: kaboom" == found.message


def test_audit_settings_turn_every_mutator_off_and_keep_the_rest() -> None:
    configured = settings_.from_mapping({"policies": {"GPU002": {"action": "warn"}}, "exemptNamespaces": ["infra"]})
    effective = scan.audit_settings(configured)
    assert {p: a for p, a in effective.actions.items() if p.startswith("GPU1")} == {
        f"GPU10{i}": model.Action.OFF for i in range(1, 8)
    }
    assert effective.actions["GPU002"] is model.Action.WARN
    assert dataclasses.replace(effective, actions=configured.actions) == configured


LAB_WARNS = {
    "namespaceOverrides": [
        {"name": "lab", "namespaceSelector": {"matchLabels": {"team": "lab"}}, "policies": {"GPU001": {"action": "warn"}}}
    ]
}


def namespace(name: str, **labels: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def test_namespace_overrides_select_on_the_labels_of_the_namespaces_seen(pod: PodFactory) -> None:
    configured = settings_.from_mapping(LAB_WARNS)
    audit = run(
        namespace("research", team="lab"),
        namespace("prod", team="ops"),
        pod("in-lab", namespace="research", env=BYPASS),
        pod("in-prod", namespace="prod", env=BYPASS),
        settings=configured,
    )
    (lab,) = of(audit, "in-lab", "GPU001")
    (prod,) = of(audit, "in-prod", "GPU001")
    assert (lab.result, lab.action) == (model.Result.FAIL, model.Action.WARN)
    assert (prod.result, prod.action) == (model.Result.FAIL, model.Action.ENFORCE)
    assert audit.exit_status == 1  # the prod pod's enforce-level failure


def test_without_the_namespace_object_only_the_name_label_is_known(pod: PodFactory) -> None:
    audit = run(pod("in-lab", namespace="research", env=BYPASS), settings=settings_.from_mapping(LAB_WARNS))
    (found,) = of(audit, "in-lab", "GPU001")
    assert found.action is model.Action.ENFORCE


def test_the_inventory_keeps_namespace_labels_and_drops_the_namespaces_themselves() -> None:
    inventory = scan.Inventory.of(
        [namespace("a", team="x"), {"kind": "Namespace", "metadata": {"name": "b"}}, {"kind": "Namespace"}]
    )
    assert inventory.namespace_labels == {"a": {"team": "x"}, "b": {}}
    assert inventory.pods == inventory.workloads == inventory.nodes == ()
