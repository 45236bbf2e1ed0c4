"""GPU002 and Dynamic Resource Allocation: a pod claiming devices through `spec.resourceClaims`
(NVIDIA's DRA driver hands out whole cards and MIG devices that way) is a GPU pod for GPU002, so a
privileged or SYS_ADMIN/ALL container beside the claim, which would see every card of the node,
is refused."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from policies import model
from tests.unit.policies.conftest import ContainerFactory, Evaluate, PodFactory, ResultOf, ViolationMessages, WorkloadFactory

CLAIMS = [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}]
USES_CLAIM = {"claims": [{"name": "gpu"}]}


def dra_pod(
    pod: PodFactory, container: ContainerFactory, *, main_security: dict[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    main = container(resources=USES_CLAIM)
    if main_security is not None:
        main["securityContext"] = main_security
    return pod(main, resourceClaims=copy.deepcopy(CLAIMS), **extra)


@pytest.mark.parametrize(
    "security",
    [{"privileged": True}, {"capabilities": {"add": ["SYS_ADMIN"]}}, {"capabilities": {"add": ["all"]}}],
)
def test_a_privileged_container_claiming_a_device_is_denied(
    pod: PodFactory,
    container: ContainerFactory,
    evaluate: Evaluate,
    violation_messages: ViolationMessages,
    security: dict[str, Any],
) -> None:
    decision = evaluate(dra_pod(pod, container, main_security=security))

    assert not decision.allowed
    (message,) = violation_messages(decision, "GPU002")
    assert 'container "main"' in message
    assert "the pod claims devices through resourceClaims, which may be GPUs" in message


def test_a_privileged_sidecar_beside_a_claiming_container_is_denied(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, violation_messages: ViolationMessages
) -> None:
    manifest = dra_pod(pod, container, init=[container("helper", restartPolicy="Always", privileged=True)])

    decision = evaluate(manifest)

    assert not decision.allowed
    (message,) = violation_messages(decision, "GPU002")
    assert 'init container "helper"' in message


@pytest.mark.parametrize("kind", ["Deployment", "Job", "CronJob", "StatefulSet"])
def test_a_privileged_claiming_template_is_denied(
    pod: PodFactory,
    container: ContainerFactory,
    workload: WorkloadFactory,
    evaluate: Evaluate,
    violation_messages: ViolationMessages,
    kind: str,
) -> None:
    decision = evaluate(workload(kind, dra_pod(pod, container, main_security={"privileged": True})))

    assert not decision.allowed
    assert violation_messages(decision, "GPU002")


def test_a_privileged_debug_container_added_to_a_claiming_pod_is_denied(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, violation_messages: ViolationMessages
) -> None:
    running = dra_pod(pod, container, nodeName="gpu-node-1")
    updated = copy.deepcopy(running)
    updated["spec"]["ephemeralContainers"] = [container("debugger", privileged=True)]

    decision = evaluate(updated, operation="UPDATE", subresource="ephemeralcontainers", old=running)

    assert not decision.allowed
    assert any('ephemeral container "debugger"' in m for m in violation_messages(decision, "GPU009"))


# --- the ordinary side -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "security",
    [None, {"capabilities": {"add": ["IPC_LOCK", "SYS_NICE"]}}, {"capabilities": {"drop": ["ALL"]}}, {"privileged": False}],
)
def test_an_unprivileged_claiming_pod_is_allowed(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, security: dict[str, Any] | None
) -> None:
    decision = evaluate(dra_pod(pod, container, main_security=security))

    assert decision.allowed
    assert result(decision, "GPU002") is model.Result.PASS


@pytest.mark.parametrize("claims", [None, [], "x", [3], [None]])
def test_a_privileged_pod_without_a_well_formed_claim_is_left_to_gpu103(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, claims: object
) -> None:
    manifest = pod(container(privileged=True), resourceClaims=claims)

    decision = evaluate(manifest)

    assert decision.allowed
    assert result(decision, "GPU002") is model.Result.PASS
    assert "DoesNotExist" in str(decision.patch)  # GPU103 keeps the privileged pod off GPU nodes
