"""GPU013: only the scheduler extender removes the budget gate; attacked from a tenant's side."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from policies import model
from policies.builtin import gpu013_budget_gate_kept
from tests.unit.policies.conftest import ContainerFactory, PodFactory, ViolationMessages, run_engine

GATE = {"name": "gpu-admission.io/budget"}
OTHER = {"name": "example.com/other"}
EXTENDER = "system:serviceaccount:gpu-admission:gpu-admission-extender"
TENANT = "system:serviceaccount:team-a:default"
CONFIG: dict[str, Any] = {"gpuBudgets": [{"name": "team-a", "namespaces": ["team-a"], "memory": "32Gi"}]}
DEPLOY = Path(__file__).resolve().parents[3] / "deploy"


def update(new: dict[str, Any], old: dict[str, Any], *, user: str, config: dict[str, Any] | None = None) -> model.Decision:
    from policies import engine, settings

    request = model.Request(operation="UPDATE", object=new, old_object=old, namespace="team-a", user=user)
    return engine.evaluate(request, settings=settings.from_mapping(CONFIG if config is None else config))


@pytest.fixture
def gated(pod: PodFactory, container: ContainerFactory) -> dict[str, Any]:
    return pod(container(gpu={"nvidia.com/gpu": 1}), schedulingGates=[OTHER, GATE])


def json_patch(*operations: dict[str, Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def apply(obj: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = jsonpatch.apply_patch(copy.deepcopy(obj), list(operations))
        return result

    return apply


def setting(gates: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The pod as a merge or strategic-merge patch leaves it: `gates` for the list, None: the field gone."""

    def apply(obj: dict[str, Any]) -> dict[str, Any]:
        result = copy.deepcopy(obj)
        if gates is None:
            result["spec"].pop("schedulingGates", None)
        else:
            result["spec"]["schedulingGates"] = gates
        return result

    return apply


REMOVALS = {
    # kubectl patch --type=json
    "json-remove-entry": json_patch({"op": "remove", "path": "/spec/schedulingGates/1"}),
    "json-remove-list": json_patch({"op": "remove", "path": "/spec/schedulingGates"}),
    "json-replace-list": json_patch({"op": "replace", "path": "/spec/schedulingGates", "value": [OTHER]}),
    "json-replace-entry": json_patch({"op": "replace", "path": "/spec/schedulingGates/1/name", "value": "x.io/y"}),
    # kubectl patch --type=merge '{"spec":{"schedulingGates":null}}' and '[]'
    "merge-null": setting(None),
    "merge-empty": setting([]),
    # strategic merge: '{"spec":{"schedulingGates":[{"$patch":"delete","name":"gpu-admission.io/budget"}]}}'
    # (the list merges by name) or '$patch: replace' with the other gate; kubectl edit or a PUT without it
    "strategic-delete-entry": setting([OTHER]),
    "strategic-replace-empty": setting([]),
    # another spelling of the name is another gate: ours is gone
    "renamed": setting([OTHER, {"name": "GPU-ADMISSION.IO/budget"}]),
}


@pytest.mark.parametrize("remove", list(REMOVALS.values()), ids=list(REMOVALS))
def test_a_tenant_removing_the_gate_is_refused_however_it_is_written(
    gated: dict[str, Any], remove: Callable[[dict[str, Any]], dict[str, Any]], violation_messages: ViolationMessages
) -> None:
    new = remove(gated)

    decision = update(new, gated, user=TENANT)

    assert not decision.allowed
    [message] = violation_messages(decision, "GPU013")
    assert "removes the scheduling gate gpu-admission.io/budget" in message
    assert "gpu-admission/gpu-admission-extender" in message


@pytest.mark.parametrize("remove", list(REMOVALS.values()), ids=list(REMOVALS))
def test_the_extender_lifting_the_gate_passes(gated: dict[str, Any], remove: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    decision = update(remove(gated), gated, user=EXTENDER)

    assert decision.allowed and decision.violations == ()


@pytest.mark.parametrize(
    "user",
    [
        "system:serviceaccount:team-a:gpu-admission-extender",  # the name in another namespace
        "gpu-admission-extender",
        "system:serviceaccount:gpu-admission:gpu-admission-extender-x",
        " system:serviceaccount:gpu-admission:gpu-admission-extender",
        "system:serviceaccount:gpu-admission:gpu-admission-webhook",  # our own webhook is not the extender
        "",
    ],
)
def test_lookalike_users_are_refused(gated: dict[str, Any], user: str) -> None:
    assert not update(setting([OTHER])(gated), gated, user=user).allowed


def test_the_refusal_holds_in_a_namespace_without_a_budget(gated: dict[str, Any]) -> None:
    # The extender lifts the gate there itself, without a charge; nobody else needs to.
    assert not update(setting(None)(gated), gated, user=TENANT, config={}).allowed


def test_updates_that_keep_the_gate_pass(gated: dict[str, Any]) -> None:
    relabelled = copy.deepcopy(gated)
    relabelled["metadata"]["labels"] = {"team": "b"}
    other_gate_lifted = setting([GATE])(gated)

    assert update(relabelled, gated, user=TENANT).allowed
    assert update(other_gate_lifted, gated, user=TENANT).allowed


def test_pods_without_the_gate_pass(pod: PodFactory, container: ContainerFactory) -> None:
    old = pod(container(gpu={"nvidia.com/gpu": 1}), schedulingGates=[OTHER])
    ungated = pod(container(gpu={"nvidia.com/gpu": 1}))

    assert update(setting(None)(old), old, user=TENANT).allowed  # lifting someone else's gate
    assert update(ungated, ungated, user=TENANT).allowed


def test_a_create_with_or_without_the_gate_is_not_judged(
    gated: dict[str, Any], pod: PodFactory, container: ContainerFactory
) -> None:
    assert run_engine(gated, config=CONFIG).allowed
    assert run_engine(pod(container(gpu={"nvidia.com/gpu": 1})), namespace="team-b", config=CONFIG).allowed


def test_warn_lets_the_removal_through_with_a_warning(gated: dict[str, Any]) -> None:
    config = {**CONFIG, "policies": {"GPU013": {"action": "warn"}}}

    decision = update(setting(None)(gated), gated, user=TENANT, config=config)

    assert decision.allowed and any(w.startswith("GPU013:") for w in decision.warnings)


def test_the_policy_judges_pod_updates_and_not_stored_pods() -> None:
    policy = gpu013_budget_gate_kept.BudgetGateKept()
    assert policy.pod_updates and not policy.stored_objects


def test_the_extender_account_is_deploy_extenders_service_account() -> None:
    documents = [d for d in yaml.safe_load_all((DEPLOY / "extender.yaml").read_text()) if d]
    [account] = [d for d in documents if d["kind"] == "ServiceAccount"]
    expected = gpu013_budget_gate_kept.EXTENDER
    assert (account["metadata"]["namespace"], account["metadata"]["name"]) == (expected.namespace, expected.name)
    assert expected.username == EXTENDER
