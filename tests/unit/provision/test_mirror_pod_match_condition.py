"""deploy/webhook-configurations.yaml `not-a-mirror-pod`: only a kubelet's mirror pods skip the webhooks.

Anyone who may create pods may write the `kubernetes.io/config.mirror` annotation (kube-apiserver
does not refuse it on create); such a pod must be judged like any other. Evaluated with the CEL
runtime the user policies use, on both webhooks' copies of the condition.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from policies import cel

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
MIRROR = {"kubernetes.io/config.mirror": "0123abcd"}


def conditions() -> list[tuple[str, str]]:
    documents = [d for d in yaml.safe_load_all((DEPLOY / "webhook-configurations.yaml").read_text()) if d]
    found = []
    for configuration in documents:
        for hook in configuration["webhooks"]:
            for condition in hook.get("matchConditions", []):
                if condition["name"] == "not-a-mirror-pod":
                    found.append((hook["name"], condition["expression"]))
    return found


def sent(expression: str, *, username: str, annotations: dict[str, str] | None, resource: str = "pods") -> bool:
    compiled = cel.compile_expression(cel.environment(), expression, field="not-a-mirror-pod")
    metadata: dict[str, Any] = {"name": "p", "namespace": "team-a"}
    if annotations is not None:
        metadata["annotations"] = annotations
    request = {
        "operation": "CREATE",
        "resource": {"group": "", "version": "v1", "resource": resource},
        "userInfo": {"username": username, "groups": ["system:authenticated"]},
    }
    result = cel.evaluate(compiled, {"request": request, "object": {"metadata": metadata}, "oldObject": None})
    assert isinstance(result, bool)
    return result


def test_both_webhooks_carry_the_condition() -> None:
    assert sorted(name for name, _ in conditions()) == ["mutate.gpu-admission.io", "validate.gpu-admission.io"]


@pytest.mark.parametrize(("hook", "expression"), conditions())
@pytest.mark.parametrize(
    "username",
    ["alice", "system:serviceaccount:team-a:deployer", "system:nodes", "system:node", "node:system:node:x", "System:node:x"],
)
def test_a_mirror_annotated_pod_from_anyone_but_a_kubelet_is_sent(hook: str, expression: str, username: str) -> None:
    assert sent(expression, username=username, annotations=MIRROR), hook


@pytest.mark.parametrize(("hook", "expression"), conditions())
def test_a_kubelets_mirror_pod_is_skipped(hook: str, expression: str) -> None:
    assert not sent(expression, username="system:node:gpu-node-1", annotations=MIRROR), hook


@pytest.mark.parametrize(("hook", "expression"), conditions())
@pytest.mark.parametrize("annotations", [None, {}, {"team": "ml"}])
@pytest.mark.parametrize("username", ["alice", "system:node:gpu-node-1"])
def test_ordinary_pods_are_sent_whoever_creates_them(hook: str, expression: str, annotations: Any, username: str) -> None:
    assert sent(expression, username=username, annotations=annotations), hook


@pytest.mark.parametrize(("hook", "expression"), conditions())
def test_other_resources_are_sent(hook: str, expression: str) -> None:
    assert sent(expression, username="system:node:gpu-node-1", annotations=MIRROR, resource="deployments"), hook
