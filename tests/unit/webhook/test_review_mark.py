"""/mutate marks pod CREATEs for review while the settings make the validating webhook's ordinary-pod
skip unsound (policies.ordinary: user policies, a mutator acting warn or audit), and only then."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable
from typing import Any

from policies import ordinary, policy
from policies import settings as engine_settings

Factory = Callable[..., Any]
MARK = {"op": "add", "path": "/metadata/annotations", "value": {ordinary.REVIEW_ANNOTATION: ordinary.REVIEW_VALUE}}


class _TeamPolicy(policy.Validator):
    id = "TEAM001"
    summary = "pods carry a team label"

    def validate(self, context: policy.Context) -> Iterable[policy.Finding]:
        del context
        return ()


async def _patch(client: Any, body: dict[str, Any]) -> list[dict[str, Any]]:
    async with client.post("/mutate", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}) as answer:
        response = json.loads(await answer.text())["response"]
    assert response["allowed"] is True
    if "patch" not in response:
        return []
    decoded: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return decoded


async def test_default_settings_add_no_mark(webhook_client: Factory, make_review: Factory, make_pod: Factory) -> None:
    client = await webhook_client()
    patch = await _patch(client, make_review(make_pod()))
    assert patch and MARK not in patch and not any("annotations" in op["path"] for op in patch)


async def test_user_policies_mark_every_pod_create(webhook_client: Factory, make_review: Factory, make_pod: Factory) -> None:
    client = await webhook_client(engine_settings.from_mapping({}, user_policies=[_TeamPolicy()]))
    patch = await _patch(client, make_review(make_pod()))
    assert patch[-1] == MARK
    assert patch[:-1] and all("annotations" not in op["path"] for op in patch[:-1])  # GPU104's env stays


async def test_a_quiet_mutator_marks_them_too(webhook_client: Factory, make_review: Factory, make_pod: Factory) -> None:
    client = await webhook_client(engine_settings.from_mapping({"policies": {"GPU104": {"action": "warn"}}}))
    assert await _patch(client, make_review(make_pod())) == [MARK]
