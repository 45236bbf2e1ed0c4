"""/validate judges the pod as stored: the engine's own in-memory additions are not credited (issue 33).

The flow kube-apiserver runs: /mutate answers a patch, the patched pod (after any later mutating
webhook) goes to /validate. A webhook after ours that drops GPU103's keep-off affinity must not
get a privileged pod onto GPU nodes.
"""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import jsonpatch

from policies import cel, ordinary, trustzone

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def privileged_cpu_pod() -> dict[str, Any]:
    container = {"name": "dind", "image": "docker:dind", "securityContext": {"privileged": True}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "ci-runner", "namespace": "ci"},
        "spec": {"containers": [container]},
    }


async def post(client: Any, path: str, review: dict[str, Any]) -> dict[str, Any]:
    async with client.post(path, json=review) as answer:
        assert answer.status == 200
        body: dict[str, Any] = await answer.json()
        return body


async def test_a_pod_whose_keep_off_affinity_a_later_webhook_removed_is_refused(webhook: Any, make_review: Any) -> None:
    obj = privileged_cpu_pod()
    mutated = await post(webhook, "/mutate", make_review(obj))
    patch = json.loads(base64.b64decode(mutated["response"]["patch"]))
    patched = jsonpatch.apply_patch(obj, patch)
    assert trustzone.stays_off_gpu_nodes(patched["spec"])

    # As stored after our patch: admitted, nothing credited that is not there.
    kept = await post(webhook, "/validate", make_review(patched))
    assert kept["response"]["allowed"] is True

    # A later mutating webhook drops the affinity: refused, though the engine would add it again.
    stripped = copy.deepcopy(patched)
    del stripped["spec"]["affinity"]
    refused = await post(webhook, "/validate", make_review(stripped))
    assert refused["response"]["allowed"] is False
    assert "GPU002" in refused["response"]["status"]["message"]
    assert "nothing keeps the pod off GPU nodes" in refused["response"]["status"]["message"]

    # ... or keeps only our own label: a GPU Operator or cloud labelled GPU node is open to it.
    ours_only = copy.deepcopy(patched)
    ours_only["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"][0]["matchExpressions"] = [
        {"key": "aliyun.accelerator/nvidia_name", "operator": "DoesNotExist"}
    ]
    assert (await post(webhook, "/validate", make_review(ours_only)))["response"]["allowed"] is False


async def test_a_workload_template_is_still_credited_with_what_its_pods_will_get(webhook: Any, make_review: Any) -> None:
    pod = privileged_cpu_pod()
    template = {"metadata": {"labels": {"app": "ci"}}, "spec": pod["spec"]}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "ci-runner", "namespace": "ci"},
        "spec": {"selector": {"matchLabels": {"app": "ci"}}, "template": template},
    }

    answer = await post(webhook, "/validate", make_review(deployment))

    assert answer["response"]["allowed"] is True


async def test_an_ordinary_gpu_pod_is_admitted_at_validate_as_before(webhook: Any, make_review: Any) -> None:
    container = {"name": "train", "image": "registry.example/train:1", "resources": {"limits": {"nvidia.com/gpu": 1}}}
    obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {"containers": [container]},
    }

    answer = await post(webhook, "/validate", make_review(obj))

    assert answer["response"]["allowed"] is True


async def test_a_cpu_pod_whose_only_node_power_is_a_host_port_is_sent_and_refused_once_stripped(
    webhook: Any, make_review: Any
) -> None:
    # The kubelet's port through the CNI portmap plugin; no GPU, no other node power.
    container = {"name": "main", "image": "registry.example/app:1", "ports": [{"containerPort": 80, "hostPort": 10250}]}
    obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "squatter", "namespace": "ci"},
        "spec": {"containers": [container]},
    }
    mutated = await post(webhook, "/mutate", make_review(obj))
    patched = jsonpatch.apply_patch(obj, json.loads(base64.b64decode(mutated["response"]["patch"])))
    assert trustzone.stays_off_gpu_nodes(patched["spec"])
    assert (await post(webhook, "/validate", make_review(patched)))["response"]["allowed"] is True

    stripped = copy.deepcopy(patched)
    del stripped["spec"]["affinity"]
    # kube-apiserver sends it to /validate: the ordinary-pod condition does not skip a host port ...
    condition = cel.compile_expression(cel.environment(), ordinary.condition_expression(), field=ordinary.CONDITION_NAME)
    request = {"operation": "CREATE", "resource": {"group": "", "version": "v1", "resource": "pods"}}
    assert cel.evaluate(condition, {"request": request, "object": stripped, "oldObject": None}) is True
    # ... and /validate refuses it there.
    refused = await post(webhook, "/validate", make_review(stripped))
    assert refused["response"]["allowed"] is False
    message = refused["response"]["status"]["message"]
    assert "GPU002" in message and "hostPort 10250" in message and "nothing keeps the pod off GPU nodes" in message
