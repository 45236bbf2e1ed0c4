"""GPU107: device-plugin and DRA pods in a namespace with a GPU budget are created behind the budget gate."""

from __future__ import annotations

from typing import Any

import pytest

from policies import model
from policies.gpu import budgets
from tests.unit.policies.conftest import ContainerFactory, Evaluate, Patched, PodFactory, ResultOf, WorkloadFactory

CONFIG: dict[str, Any] = {"gpuBudgets": [{"name": "team-a", "namespaces": ["team-a"], "memory": "32Gi"}]}
GATE = {"name": "gpu-admission.io/budget"}
ADD_LIST = {"op": "add", "path": "/spec/schedulingGates", "value": [GATE]}


def test_the_gate_is_the_gpu_models() -> None:
    assert budgets.GATE == GATE["name"]


@pytest.mark.parametrize(
    "limits",
    [
        {"nvidia.com/gpu": 1},
        {"nvidia.com/gpu.shared": 1},
        {"nvidia.com/mig-3g.40gb": 1},
        {"nvidia.com/mig-1g.10gb": 2, "cpu": "1"},
    ],
    ids=["whole-card", "time-sliced", "mig", "two-mig-slices"],
)
def test_a_device_plugin_pod_gets_the_gate_and_a_second_pass_adds_nothing(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, patched: Patched, limits: dict[str, Any]
) -> None:
    obj = pod(container(gpu=limits))

    decision = evaluate(obj, config=CONFIG)

    assert decision.allowed
    assert decision.patch == (ADD_LIST,)
    after = patched(obj, decision.patch)
    assert after["spec"]["schedulingGates"] == [GATE]
    again = evaluate(after, config=CONFIG)
    assert again.allowed and again.patch == ()


def test_a_pod_with_other_gates_gets_ours_appended_once(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, patched: Patched
) -> None:
    obj = pod(container(gpu={"nvidia.com/gpu": 2}), schedulingGates=[{"name": "kueue.x-k8s.io/admission"}])

    decision = evaluate(obj, config=CONFIG)

    assert decision.patch == ({"op": "add", "path": "/spec/schedulingGates/-", "value": GATE},)
    after = patched(obj, decision.patch)
    assert after["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/admission"}, GATE]
    assert evaluate(after, config=CONFIG).patch == ()


def test_an_empty_gate_list_gets_ours(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, patched: Patched) -> None:
    obj = pod(container(gpu={"nvidia.com/gpu": 1}), schedulingGates=[])

    decision = evaluate(obj, config=CONFIG)

    assert decision.patch == ({"op": "add", "path": "/spec/schedulingGates/-", "value": GATE},)
    assert patched(obj, decision.patch)["spec"]["schedulingGates"] == [GATE]


def test_a_pod_created_with_the_gate_already_is_not_gated_twice(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf
) -> None:
    obj = pod(container(gpu={"nvidia.com/gpu": 1}), schedulingGates=[{"name": "example.com/x"}, GATE])

    decision = evaluate(obj, config=CONFIG)

    assert decision.allowed and decision.patch == ()
    assert result(decision, "GPU107") is model.Result.PASS


def test_a_dra_pod_gets_the_gate(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, patched: Patched) -> None:
    claims = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    obj = pod(container(resources={"claims": [{"name": "gpu"}]}), resourceClaims=claims)

    decision = evaluate(obj, config=CONFIG)

    assert ADD_LIST in decision.patch
    assert evaluate(patched(obj, decision.patch), config=CONFIG).patch == ()


def test_an_init_container_asking_for_a_card_gates_the_pod(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    obj = pod(container(), init=[container("warm", gpu={"nvidia.com/gpu": 1})])

    assert evaluate(obj, config=CONFIG).patch[-1] == ADD_LIST  # after GPU104's void for the card-less container


@pytest.mark.parametrize(
    "limits",
    [
        {"aliyun.com/gpu-mem": 4},  # the extender keeps the budget for these, in filter and bind
        {"aliyun.com/gpu": 1},
        {"cpu": "2"},
        None,
    ],
    ids=["share", "extender-whole-card", "cpu", "nothing"],
)
def test_pods_the_extender_places_or_without_gpus_are_not_gated(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, limits: dict[str, Any] | None
) -> None:
    decision = evaluate(pod(container(gpu=limits)), config=CONFIG)

    assert not any(op["path"].startswith("/spec/schedulingGates") for op in decision.patch)


def test_a_namespace_without_a_budget_is_not_gated(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf
) -> None:
    obj = pod(container(gpu={"nvidia.com/gpu": 1}))

    elsewhere = evaluate(obj, config=CONFIG, namespace="team-b")
    unconfigured = evaluate(obj)

    assert elsewhere.allowed and elsewhere.patch == ()
    assert result(elsewhere, "GPU107") is model.Result.PASS
    assert result(unconfigured, "GPU107") is model.Result.SKIP  # no budget anywhere: not configured


def test_a_budget_chosen_by_namespace_label_gates_there(pod: PodFactory, container: ContainerFactory) -> None:
    from policies import engine, settings

    config = {"gpuBudgets": [{"name": "teams", "namespaceSelector": {"matchLabels": {"budget": "teams"}}, "memory": "80Gi"}]}
    obj = pod(container(gpu={"nvidia.com/gpu": 1}))

    def decide(labels: dict[str, str] | None) -> model.Decision:
        request = model.Request(operation="CREATE", object=obj, namespace="team-c", namespace_labels=labels)
        return engine.evaluate(request, settings=settings.from_mapping(config))

    assert decide({"budget": "teams"}).patch == (ADD_LIST,)
    assert decide({"budget": "other"}).patch == ()
    # Labels unknown (no cluster access, a namespace newer than the webhook's cache): gated, the
    # safe side; the extender lifts a gate without a charge where there is no budget.
    assert decide(None).patch == (ADD_LIST,)


@pytest.mark.parametrize("kind", ["Deployment", "Job", "CronJob", "StatefulSet"])
def test_workload_templates_are_not_gated(
    pod: PodFactory, container: ContainerFactory, workload: WorkloadFactory, evaluate: Evaluate, kind: str
) -> None:
    # Their pods are gated when each is created, each with its own charge.
    decision = evaluate(workload(kind, pod(container(gpu={"nvidia.com/gpu": 1}))), config=CONFIG)

    assert decision.allowed and not any("schedulingGates" in op["path"] for op in decision.patch)


def test_an_update_is_never_gated(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    # Kubernetes refuses a gate added after creation; the policy does not try.
    obj = pod(container(gpu={"nvidia.com/gpu": 1}))
    new = pod(container(gpu={"nvidia.com/gpu": 1}))
    new["metadata"]["labels"] = {"x": "y"}

    decision = evaluate(new, config=CONFIG, operation="UPDATE", old=obj)

    assert decision.allowed and decision.patch == ()
    assert "GPU107" not in {r.policy for r in decision.results}


def test_ephemeral_containers_add_no_gate(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    old = pod(container(gpu={"nvidia.com/gpu": 1}))
    new = pod(container(gpu={"nvidia.com/gpu": 1}), ephemeral=[container("debug", targetContainerName="main")])

    decision = evaluate(new, config=CONFIG, operation="UPDATE", subresource="ephemeralcontainers", old=old)

    assert not any("schedulingGates" in op["path"] for op in decision.patch)


def test_a_pod_naming_its_node_in_a_budgeted_namespace_is_refused(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, violation_messages: Any
) -> None:
    # The apiserver refuses nodeName beside a gate; without the gate the pod would skip the budget.
    obj = pod(container(gpu={"nvidia.com/gpu": 1}), nodeName="gpu-1")

    decision = evaluate(obj, config=CONFIG)
    elsewhere = evaluate(obj, config=CONFIG, namespace="team-b")
    warned = evaluate(obj, config={**CONFIG, "policies": {"GPU107": {"action": "warn"}}})

    assert not decision.allowed and decision.patch == ()
    [message] = violation_messages(decision, "GPU107")
    assert "spec.nodeName is 'gpu-1'" in message and "budget 'team-a'" in message and "nvidia.com/gpu: 1" in message
    assert elsewhere.allowed
    assert warned.allowed and warned.patch == () and any("GPU107" in w for w in warned.warnings)


def test_warn_and_audit_only_say_what_they_would_add(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    obj = pod(container(gpu={"nvidia.com/gpu": 1}))

    warned = evaluate(obj, config={**CONFIG, "policies": {"GPU107": {"action": "warn"}}})

    assert warned.allowed and warned.patch == ()
    assert any("would have added scheduling gate gpu-admission.io/budget" in w for w in warned.warnings)


def test_malformed_gates_are_left_to_the_apiserver(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    obj = pod(container(gpu={"nvidia.com/gpu": 1}), schedulingGates={"name": "x"})

    decision = evaluate(obj, config=CONFIG)

    assert decision.allowed and decision.patch == ()


@pytest.mark.parametrize("profile", ["hami", "volcano", "koordinator", "kai"])
def test_in_front_of_another_scheduler_nothing_is_gated(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, profile: str
) -> None:
    # Only this project's extender lifts the gate; elsewhere a gated pod would wait for ever.
    decision = evaluate(pod(container(gpu={"nvidia.com/gpu": 1})), config={**CONFIG, "scheduler": profile})

    assert decision.patch == () and result(decision, "GPU107") is model.Result.SKIP
