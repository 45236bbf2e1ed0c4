"""What the webhook sends is, byte for byte, what the plain path makes of the same review.

The served path is built for speed (one ``decisions.Question`` per review, the decision cache, the
response's JSON bytes put straight into the body). The plain path is the slowest, most obvious
one: ``review.check`` of the decoded body, ``decisions.decide`` with every field as a keyword, the
review mark added as the handlers add it, ``response.for_mutation``/``for_validation`` and the
standard library's ``json.dumps``. Generated Pods and workloads, each sent as three replicas (the
second and third are cache hits where the key allows), under every settings of the property
tests: every body and its Content-Type must be the same.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import types
from typing import Any

import hypothesis
from aiohttp import test_utils
from hypothesis import strategies as st

from policies import settings
from tests.unit.policies.test_properties import CONFIGS, objects
from tests.unit.webhook.test_decision_cache import BY_NAME, replicas
from tests.unit.webhook.test_decision_cache import review as make_review
from webhook.admission import app as admission_app
from webhook.admission import decisions, handlers, keys, response, review


def plain(body: dict[str, Any], *, endpoint: str, config: settings.Settings) -> bytes:
    """The answer to ``body`` the slow way (see the module docstring)."""
    checked = review.check(json.loads(json.dumps(body)))
    question = decisions.Question(
        object=checked.object,
        namespace=checked.namespace,
        operation=checked.operation,
        old_object=checked.old_object,
        user=checked.user,
        groups=checked.groups,
        subresource=checked.subresource,
        dry_run=checked.dry_run,
    )
    decision = decisions.answer(question, settings=config)
    if endpoint == "validate" and decisions.needs_stored(question, decision):
        # /validate judges the pod as stored: the engine's own additions are not credited.
        decision = decisions.answer(dataclasses.replace(question, stored=True), settings=config)
    if endpoint == "mutate":
        app = {keys.LIVE_SETTINGS: keys.LiveSettings(current=config)}
        decision = handlers._marked_for_review(types.SimpleNamespace(app=app), checked, decision)  # type: ignore[arg-type]  # noqa: SLF001
        answer = response.for_mutation(request=checked, decision=decision)
    else:
        answer = response.for_validation(request=checked, decision=decision)
    return json.dumps(answer, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


@hypothesis.settings(max_examples=60, deadline=None, suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(objs=st.lists(objects(), min_size=1, max_size=3), config=st.sampled_from([*CONFIGS, BY_NAME]))
def test_every_served_answer_is_the_plain_paths_byte_for_byte(objs: list[dict[str, Any]], config: dict[str, Any]) -> None:
    loaded = settings.from_mapping(config)

    async def run() -> None:
        app = admission_app.make_app(loaded)
        async with test_utils.TestClient(test_utils.TestServer(app)) as client:
            sent = 0
            for obj in objs:
                for copied in replicas(obj, 3):
                    sent += 1
                    body = make_review(copied, uid=f"uid-{sent}")
                    for endpoint in ("mutate", "validate"):
                        answer = await client.post(
                            f"/{endpoint}", data=json.dumps(body), headers={"Content-Type": "application/json"}
                        )
                        assert answer.status == 200
                        assert answer.headers["Content-Type"] == "application/json; charset=utf-8"
                        assert await answer.read() == plain(body, endpoint=endpoint, config=loaded), (endpoint, copied)

    asyncio.run(run())


def test_a_denial_with_warnings_and_a_patch_with_non_ascii_text_match_too() -> None:
    """Fixed cases the generator may miss: a denial (status, message), warnings and audit
    annotations, a patch, and text outside ASCII, which both encoders must leave unescaped."""
    loaded = settings.from_mapping({"policies": {"GPU001": {"action": "warn"}, "GPU003": {"action": "audit"}}})
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "träin-0", "namespace": "team-a", "labels": {"app": "é"}},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "trainer:1",
                    "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                    "securityContext": {"privileged": True},
                    "resources": {"limits": {"aliyun.com/gpu-mem": 3}},
                    "volumeMounts": [{"name": "dev", "mountPath": "/dev/nvidia0"}],
                }
            ],
            "volumes": [{"name": "dev", "hostPath": {"path": "/dev/nvidia0"}}],
        },
    }
    allowed_pod = json.loads(json.dumps(pod))
    del allowed_pod["spec"]["containers"][0]["securityContext"]

    async def run() -> None:
        async with test_utils.TestClient(test_utils.TestServer(admission_app.make_app(loaded))) as client:
            seen = {}
            for index, obj in enumerate((pod, allowed_pod)):
                body = make_review(obj, uid=f"ü-{index}")
                for endpoint in ("mutate", "validate"):
                    answer = await client.post(
                        f"/{endpoint}", data=json.dumps(body), headers={"Content-Type": "application/json"}
                    )
                    served = await answer.read()
                    assert served == plain(body, endpoint=endpoint, config=loaded)
                    seen[(index, endpoint)] = json.loads(served)["response"]
            assert seen[(0, "validate")]["allowed"] is False and "GPU002" in seen[(0, "validate")]["status"]["message"]
            assert seen[(1, "validate")]["allowed"] is True and any("GPU001" in w for w in seen[(1, "validate")]["warnings"])
            assert "GPU003" in seen[(1, "validate")]["auditAnnotations"]
            assert seen[(1, "mutate")]["patchType"] == "JSONPatch"
            assert "ü-1" in json.dumps(seen[(1, "validate")], ensure_ascii=False)

    asyncio.run(run())
