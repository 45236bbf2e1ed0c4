"""A kubelet's mirror pods skip the webhooks; anyone else's mirror-annotated pod is judged.

Two places hold the rule: the validating webhook's ``not-a-mirror-pod`` match condition in
deploy/webhook-configurations.yaml (evaluated here with the CEL runtime the user policies use),
and ``webhook.admission.mirror``, by which the mutating webhook, which has no match conditions (each
webhook with some costs kube-apiserver a conversion of the whole pod per create), answers them
itself. Anyone who may create pods may write the ``kubernetes.io/config.mirror`` annotation
(kube-apiserver does not refuse it on create); such a pod must be judged like any other.

The outcome must be what it was when the mutating webhook carried the condition too: generated
reviews (users, annotations, CREATE and the ``ephemeralcontainers`` update, every settings of the
property tests) get, where the condition skips, an answer that allows and changes nothing, and
everywhere else the very bytes the plain path makes.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import yaml
from aiohttp import test_utils
from hypothesis import strategies as st

from policies import cel, settings
from tests.unit.policies.test_properties import CONFIGS, pod_spec
from tests.unit.webhook.test_served_bytes import plain
from webhook.admission import app as admission_app
from webhook.admission import mirror, review
from webhook.commands import vap

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
MIRROR = {"kubernetes.io/config.mirror": "0123abcd"}


def documents() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / "webhook-configurations.yaml").read_text()) if d]


def conditions() -> list[tuple[str, str]]:
    found = []
    for configuration in documents():
        for hook in configuration["webhooks"]:
            for condition in hook.get("matchConditions", []):
                if condition["name"] == "not-a-mirror-pod":
                    found.append((hook["name"], condition["expression"]))
    return found


def hooks() -> dict[str, dict[str, Any]]:
    return {hook["name"]: hook for configuration in documents() for hook in configuration["webhooks"]}


_COMPILED: dict[str, cel.Expression] = {}


def sent_by(expression: str, body: dict[str, Any]) -> bool:
    """Whether kube-apiserver would call the webhook: the condition on the review's request."""
    if expression not in _COMPILED:
        _COMPILED[expression] = cel.compile_expression(cel.environment(), expression, field="not-a-mirror-pod")
    request = body["request"]
    result = cel.evaluate(
        _COMPILED[expression], {"request": request, "object": request.get("object"), "oldObject": request.get("oldObject")}
    )
    assert isinstance(result, bool)
    return result


def pod_review(
    *,
    username: str,
    annotations: dict[str, str] | None,
    resource: str = "pods",
    spec: dict[str, Any] | None = None,
    ephemeral_update: bool = False,
    uid: str = "uid-1",
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "p", "namespace": "team-a"}
    if annotations is not None:
        metadata["annotations"] = annotations
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": spec or {"containers": [{"name": "c", "image": "i"}]},
    }
    request: dict[str, Any] = {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": resource},
        "name": "p",
        "namespace": "team-a",
        "operation": "CREATE",
        "userInfo": {"username": username, "groups": ["system:authenticated"]},
        "object": obj,
        "dryRun": False,
    }
    if ephemeral_update:
        old = json.loads(json.dumps(obj))
        old["spec"].pop("ephemeralContainers", None)
        request.update(operation="UPDATE", subResource="ephemeralcontainers", oldObject=old)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def sent(expression: str, *, username: str, annotations: dict[str, str] | None, resource: str = "pods") -> bool:
    return sent_by(expression, pod_review(username=username, annotations=annotations, resource=resource))


def test_the_validating_webhook_carries_the_condition_and_the_mutating_webhook_none() -> None:
    assert [name for name, _ in conditions()] == ["validate.gpu-admission.io"]
    assert "matchConditions" not in hooks()["mutate.gpu-admission.io"]


def test_the_condition_is_the_one_the_policy_exports_use() -> None:
    ((_, expression),) = conditions()
    assert " ".join(expression.split()) == " ".join(vap.MIRROR_POD.split())


@pytest.mark.parametrize(
    "username",
    ["alice", "system:serviceaccount:team-a:deployer", "system:nodes", "system:node", "node:system:node:x", "System:node:x"],
)
def test_a_mirror_annotated_pod_from_anyone_but_a_kubelet_is_sent(username: str) -> None:
    ((_, expression),) = conditions()
    body = pod_review(username=username, annotations=MIRROR)
    assert sent_by(expression, body)
    assert not mirror.is_kubelets_mirror_pod(review.check(body))


def test_a_kubelets_mirror_pod_is_skipped_and_answered_unjudged() -> None:
    ((_, expression),) = conditions()
    body = pod_review(username="system:node:gpu-node-1", annotations=MIRROR)
    assert not sent_by(expression, body)
    assert mirror.is_kubelets_mirror_pod(review.check(body))


@pytest.mark.parametrize("annotations", [None, {}, {"team": "ml"}])
@pytest.mark.parametrize("username", ["alice", "system:node:gpu-node-1"])
def test_ordinary_pods_are_sent_whoever_creates_them(annotations: Any, username: str) -> None:
    ((_, expression),) = conditions()
    body = pod_review(username=username, annotations=annotations)
    assert sent_by(expression, body)
    assert not mirror.is_kubelets_mirror_pod(review.check(body))


def test_other_resources_are_sent() -> None:
    ((_, expression),) = conditions()
    assert sent(expression, username="system:node:gpu-node-1", annotations=MIRROR, resource="deployments")


USERS = [
    "alice",
    "",
    "system:node:gpu-node-1",
    "system:node:",
    "system:nodes",
    "system:node",
    "System:node:x",
    "node:system:node:x",
    " system:node:x",
    "system:serviceaccount:kube-system:replicaset-controller",
]
ANNOTATIONS = st.one_of(
    st.none(),
    st.dictionaries(
        st.sampled_from(
            [
                "kubernetes.io/config.mirror",
                "kubernetes.io/config.source",
                "Kubernetes.io/config.mirror",
                "kubernetes.io/config.mirror ",
                "team",
                "ALIYUN_COM_GPU_MEM_IDX",
                "gpu-admission.io/allocation",
            ]
        ),
        st.sampled_from(["", "0123abcd", "forged", "0"]),
        max_size=3,
    ),
)


def mutation_and_verdict(answer: dict[str, Any]) -> dict[str, Any]:
    """What kube-apiserver acts on in an answer: the verdict, a denial's status, the patch, warnings and
    audit annotations (an allowed answer's status message is not shown to anyone)."""
    response = answer["response"]
    kept = {k: response[k] for k in ("allowed", "patchType", "patch", "warnings", "auditAnnotations") if k in response}
    if not response["allowed"]:
        kept["status"] = response.get("status")
    return kept


@hypothesis.settings(max_examples=150, deadline=None, suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(
    cases=st.lists(st.tuples(st.sampled_from(USERS), ANNOTATIONS, pod_spec, st.booleans()), min_size=1, max_size=4),
    config=st.sampled_from(CONFIGS),
)
def test_generated_reviews_get_the_outcome_they_got_with_the_condition_on_both_webhooks(
    cases: list[tuple[str, dict[str, str] | None, dict[str, Any], bool]], config: dict[str, Any]
) -> None:
    """Before: both webhooks skipped what the condition skips. Now the mutating webhook is called
    and must answer those exactly as a skip (allowed, no patch, no warnings), and every other
    review exactly as the plain path does."""
    ((_, expression),) = conditions()
    loaded = settings.from_mapping(config)

    async def run() -> None:
        async with test_utils.TestClient(test_utils.TestServer(admission_app.make_app(loaded))) as client:
            for index, (username, annotations, spec, ephemeral_update) in enumerate(cases):
                body = pod_review(
                    username=username, annotations=annotations, spec=spec, ephemeral_update=ephemeral_update, uid=f"uid-{index}"
                )
                skipped = not sent_by(expression, body)
                assert mirror.is_kubelets_mirror_pod(review.check(body)) == skipped, (username, annotations)
                for endpoint in ("mutate", "validate"):
                    answer = await client.post(
                        f"/{endpoint}", data=json.dumps(body), headers={"Content-Type": "application/json"}
                    )
                    assert answer.status == 200
                    served = await answer.read()
                    if skipped:
                        assert mutation_and_verdict(json.loads(served)) == {"allowed": True}, (endpoint, username, annotations)
                    else:
                        assert served == plain(body, endpoint=endpoint, config=loaded), (endpoint, username, annotations)

    asyncio.run(run())


def test_a_tenants_forged_mirror_pod_is_still_refused_and_patched() -> None:
    """The attack the condition was written against: a tenant's pod with the mirror annotation, a
    nodeName, forged allocation annotations, a device hostPath and NVIDIA_VISIBLE_DEVICES. From the
    tenant it is judged and refused; the same body from a kubelet is answered unchanged."""
    spec = {
        "nodeName": "gpu-node-1",
        "containers": [
            {
                "name": "c",
                "image": "i",
                "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                "resources": {"limits": {"aliyun.com/gpu-mem": 15}},
                "volumeMounts": [{"name": "dev", "mountPath": "/dev"}],
            }
        ],
        "volumes": [{"name": "dev", "hostPath": {"path": "/dev"}}],
    }
    forged = {**MIRROR, "ALIYUN_COM_GPU_MEM_IDX": "0", "gpu-admission.io/allocation": '{"0": 15}'}

    async def run() -> dict[tuple[str, str], dict[str, Any]]:
        seen = {}
        async with test_utils.TestClient(test_utils.TestServer(admission_app.make_app(settings.Settings()))) as client:
            for username in ("alice", "system:node:gpu-node-1"):
                body = pod_review(username=username, annotations=forged, spec=spec)
                for endpoint in ("mutate", "validate"):
                    answer = await client.post(
                        f"/{endpoint}", data=json.dumps(body), headers={"Content-Type": "application/json"}
                    )
                    seen[(username, endpoint)] = json.loads(await answer.read())["response"]
        return seen

    seen = asyncio.run(run())
    assert seen[("alice", "validate")]["allowed"] is False
    message = seen[("alice", "validate")]["status"]["message"]
    assert "GPU001" in message and "GPU003" in message and "GPU008" in message
    # Judged, not answered as a mirror pod (the mutation has nothing to add to a pod bound by nodeName).
    assert seen[("alice", "mutate")].get("status", {}).get("message") != mirror.DECISION.exempt_reason
    assert seen[("system:node:gpu-node-1", "mutate")]["status"]["message"] == mirror.DECISION.exempt_reason
    for endpoint in ("mutate", "validate"):
        assert mutation_and_verdict({"response": seen[("system:node:gpu-node-1", endpoint)]}) == {"allowed": True}
