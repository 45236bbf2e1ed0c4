"""GPU014: admission warns (never refuses) when one pod alone is over its namespace's GPU budget."""

from __future__ import annotations

from typing import Any

import pytest

from policies import model
from tests.unit.policies.conftest import ContainerFactory, Evaluate, PodFactory, ResultOf, ViolationMessages, WorkloadFactory

CONFIG: dict[str, Any] = {"gpuBudgets": [{"name": "team-a", "namespaces": ["team-a"], "memory": "32Gi", "cards": 2}]}


@pytest.mark.parametrize(
    ("limits", "said"),
    [
        ({"aliyun.com/gpu-mem": 40}, "at least 40 GiB"),
        ({"nvidia.com/mig-7g.80gb": 1}, "at least 80 GiB"),
        ({"nvidia.com/mig-3g.20gb": 2}, "at least 40 GiB"),
        ({"nvidia.com/gpu": 3}, "3 whole cards"),
        ({"aliyun.com/gpu": 3}, "3 whole cards"),
    ],
    ids=["share", "mig", "two-mig-slices", "device-plugin-cards", "extender-cards"],
)
def test_a_pod_over_the_budget_alone_is_warned_not_refused(
    pod: PodFactory,
    container: ContainerFactory,
    evaluate: Evaluate,
    violation_messages: ViolationMessages,
    limits: dict[str, Any],
    said: str,
) -> None:
    decision = evaluate(pod(container(gpu=limits)), config=CONFIG)

    assert decision.allowed
    [message] = violation_messages(decision, "GPU014")
    assert said in message and "budget 'team-a' (32Gi of GPU memory and 2 whole cards)" in message
    assert message in decision.warnings
    assert [v.action for v in decision.violations if v.policy == "GPU014"] == [model.Action.WARN]


@pytest.mark.parametrize(
    "limits",
    [
        {"aliyun.com/gpu-mem": 32},  # exactly the budget fits
        {"nvidia.com/mig-3g.20gb": 1},
        {"nvidia.com/gpu": 2},  # whole cards' memory depends on the node: judged as cards only
        {"nvidia.com/gpu.shared": 1},
        {"cpu": "1"},
    ],
    ids=["share-at-budget", "mig", "two-cards", "time-sliced", "no-gpu"],
)
def test_a_pod_that_fits_passes(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, limits: dict[str, Any]
) -> None:
    decision = evaluate(pod(container(gpu=limits)), config=CONFIG)

    assert decision.allowed and result(decision, "GPU014") is model.Result.PASS
    assert not any(w.startswith("GPU014") for w in decision.warnings)


def test_without_a_budget_nothing_is_said(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf
) -> None:
    obj = pod(container(gpu={"aliyun.com/gpu-mem": 400}))

    assert result(evaluate(obj, config=CONFIG, namespace="team-b"), "GPU014") is model.Result.PASS
    assert result(evaluate(obj), "GPU014") is model.Result.SKIP


def test_a_workload_whose_pods_never_fit_is_warned(
    pod: PodFactory,
    container: ContainerFactory,
    workload: WorkloadFactory,
    evaluate: Evaluate,
    violation_messages: ViolationMessages,
) -> None:
    decision = evaluate(workload("Deployment", pod(container(gpu={"nvidia.com/mig-7g.80gb": 1}))), config=CONFIG)

    assert decision.allowed
    [message] = violation_messages(decision, "GPU014")
    assert "each pod of the template asks for at least 80 GiB" in message


def test_enforce_refuses_where_an_admin_asks_for_it(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    config = {**CONFIG, "policies": {"GPU014": {"action": "enforce"}}}

    assert not evaluate(pod(container(gpu={"aliyun.com/gpu-mem": 40})), config=config).allowed
    assert evaluate(pod(container(gpu={"aliyun.com/gpu-mem": 4})), config=config).allowed
