"""`/validate-settings` (issue 36): a settings ConfigMap that would not load is refused where it is written."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from policies import settings
from tests.conftest import ReviewFactory
from webhook.admission import app as admission_app
from webhook.admission import keys, namespaces, settingscheck

NAMESPACES = {"team-a": {"team": "a"}, "team-b": {"team": "b"}}


def configmap(text: str | None, *, name: str = settingscheck.CONFIGMAP) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "gpu-admission"},
        "data": {} if text is None else {settingscheck.KEY: text},
    }


@pytest.mark.parametrize(
    ("text", "refusal"),
    [
        ("policies: {GPU103: {action: warn}}\n", ""),
        ("gpuBudgets:\n  - {name: a, namespaceSelector: {matchLabels: {team: a}}, memory: 32Gi}\n", ""),
        (
            "gpuBudgets: [{name: a, namespaces: [team-a], memory: -32Gi}]\n",
            "data.config.yaml: gpuBudgets[0].memory: must not be negative, got '-32Gi'",
        ),
        (
            "gpuBudgets: [{name: a, namespaces: [team-a], memory: lots}]\n",
            "data.config.yaml: gpuBudgets[0].memory: 'lots' is not a quantity; write e.g. 160Gi or 40960Mi",
        ),
        (
            "gpuBudgets:\n  - {name: a, namespaceSelector: {matchLabels: {team: c}}, memory: 32Gi}\n",
            "data.config.yaml: gpuBudgets[0]: budget 'a' selects no namespace that exists; check its namespaceSelector",
        ),
        ("policies: [\n", "data.config.yaml: invalid YAML: "),
        ("- just a list\n", "data.config.yaml: the settings must be a mapping, not list"),
        ("polices: {}\n", "data.config.yaml: polices: unknown key; known: "),
        (None, "data.config.yaml: missing; the webhook, the extender and the labeler read their settings from it"),
    ],
)
def test_what_would_not_load_is_refused_in_one_line(text: str | None, refusal: str) -> None:
    why, warnings = settingscheck.judge(configmap(text), namespaces=NAMESPACES)
    assert why.startswith(refusal) if refusal else why == ""
    assert "\n" not in why
    assert warnings == []


def test_a_budget_for_a_namespace_not_made_yet_is_allowed_with_a_warning() -> None:
    why, warnings = settingscheck.judge(
        configmap("gpuBudgets: [{name: new, namespaces: [team-z], memory: 8Gi}]\n"), namespaces=NAMESPACES
    )
    assert why == ""
    assert warnings == ["data.config.yaml: gpuBudgets[0]: budget 'new' names no namespace that exists yet: team-z"]
    why, warnings = settingscheck.judge(
        configmap("gpuBudgets: [{name: a, namespaces: [team-a], memory: 8Gi}]\n"), namespaces=None
    )
    assert why == "" and warnings == [
        "the webhook has no namespace list: whether each GPU budget selects a namespace was not checked"
    ]


async def test_the_endpoint_refuses_a_bad_settings_write_and_ignores_other_configmaps(
    aiohttp_client: Callable[..., Any], make_review: ReviewFactory
) -> None:
    app = admission_app.make_app(settings.Settings())
    informer = namespaces.Informer(source=None)  # type: ignore[arg-type]  # never started: its labels are set here
    informer.labels.replace(
        [{"metadata": {"name": name, "labels": labels}} for name, labels in NAMESPACES.items()], resource_version="1"
    )
    app[keys.NAMESPACES] = informer
    client = await aiohttp_client(app)
    bad = configmap("gpuBudgets:\n  - {name: a, namespaceSelector: {matchLabels: {team: typo}}, memory: 32Gi}\n")
    refused = await (await client.post("/validate-settings", json=make_review(bad, operation="UPDATE"))).json()
    assert refused["response"]["allowed"] is False and refused["response"]["status"]["code"] == 403
    assert refused["response"]["status"]["message"].endswith(
        "budget 'a' selects no namespace that exists; check its namespaceSelector"
    )
    other = await (await client.post("/validate-settings", json=make_review(configmap("[", name="unrelated")))).json()
    assert other["response"]["allowed"] is True
    good = configmap("gpuBudgets:\n  - {name: a, namespaceSelector: {matchLabels: {team: a}}, memory: 32Gi}\n")
    allowed = await (await client.post("/validate-settings", json=make_review(good))).json()
    assert allowed["response"]["allowed"] is True and "warnings" not in allowed["response"]
    assert (await client.post("/validate-settings", data=b"{}")).status == 400
