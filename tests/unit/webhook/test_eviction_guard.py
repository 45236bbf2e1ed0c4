"""`/validate-eviction`: the labeler's ServiceAccount may evict only pods on the node of its token."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from policies import settings
from tests.conftest import ReviewFactory
from webhook.admission import app as admission_app
from webhook.admission import evictions, keys

NODE_A, NODE_B = "gpu-a", "gpu-b"
PODS = {("ml", "train-0"): NODE_A, ("ml", "train-1"): NODE_B, ("ml", "pending"): ""}


def pod_node(namespace: str, name: str) -> str | None:
    return PODS.get((namespace, name))


def eviction(name: str) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": "ml"}}


def as_labeler(body: dict[str, Any], *, node: str | None, user: str = evictions.LABELER_USER) -> dict[str, Any]:
    body["request"]["subResource"] = "eviction"
    body["request"]["userInfo"] = {"username": user, "groups": ["system:serviceaccounts"]}
    if node is not None:
        body["request"]["userInfo"]["extra"] = {evictions.NODE_CLAIM: [node]}
    return body


@pytest.mark.parametrize(
    ("user", "node", "pod", "refusal"),
    [
        (evictions.LABELER_USER, NODE_A, "train-0", ""),  # its own node's pod
        (evictions.LABELER_USER, NODE_A, "train-1", "runs on node gpu-b, not on gpu-a"),  # another node's pod
        (evictions.LABELER_USER, NODE_A, "pending", "runs on node (none)"),  # not bound
        (evictions.LABELER_USER, None, "train-0", "no authentication.kubernetes.io/node-name claim"),  # legacy token
        (evictions.LABELER_USER, NODE_A, "gone", ""),  # no such pod: the eviction answers 404 itself
        ("system:serviceaccount:kube-system:disruption-controller", None, "train-1", ""),  # anyone else: not ours to judge
    ],
)
def test_the_labeler_evicts_only_pods_on_its_own_node(user: str, node: str | None, pod: str, refusal: str) -> None:
    extra = {evictions.NODE_CLAIM: [node]} if node is not None else {}
    why = evictions.judge(user=user, extra=extra, namespace="ml", name=pod, pod_node=pod_node)
    assert (why == "") if not refusal else (refusal in why)


def test_an_unreadable_pod_or_no_cluster_access_refuses() -> None:
    def broken(namespace: str, name: str) -> str | None:
        raise OSError("cannot read pod ml/train-0: 403 Forbidden")

    extra = {evictions.NODE_CLAIM: [NODE_A]}
    assert "403 Forbidden" in evictions.judge(
        user=evictions.LABELER_USER, extra=extra, namespace="ml", name="train-0", pod_node=broken
    )
    assert "no cluster access" in evictions.judge(
        user=evictions.LABELER_USER, extra=extra, namespace="ml", name="train-0", pod_node=None
    )
    two = {evictions.NODE_CLAIM: [NODE_A, NODE_B]}  # a claim is one node; anything else is no claim
    assert "no authentication" in evictions.judge(
        user=evictions.LABELER_USER, extra=two, namespace="ml", name="train-0", pod_node=pod_node
    )


async def test_the_endpoint_answers_the_review(aiohttp_client: Callable[..., Any], make_review: ReviewFactory) -> None:
    app = admission_app.make_app(settings.Settings())
    app[keys.POD_NODES] = pod_node
    client = await aiohttp_client(app)
    allowed = await (
        await client.post("/validate-eviction", json=as_labeler(make_review(eviction("train-0")), node=NODE_A))
    ).json()
    assert allowed["response"]["allowed"] is True
    refused = await (
        await client.post("/validate-eviction", json=as_labeler(make_review(eviction("train-1")), node=NODE_A))
    ).json()
    assert refused["response"]["allowed"] is False and refused["response"]["status"]["code"] == 403
    assert "runs on node gpu-b, not on gpu-a" in refused["response"]["status"]["message"]
    bad = await client.post("/validate-eviction", data=b"{}")
    assert bad.status == 400
