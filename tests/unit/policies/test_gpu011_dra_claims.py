"""GPU011: DRA claims and claim templates reach GPUs only where the settings grant them, selectors
through other classes do not pick GPUs, and adminAccess stays in admin namespaces; attacked from
a tenant's side (templates as well as claims, firstAvailable, other spellings, an UPDATE)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from policies import engine, lookups, model, settings
from tests.unit.policies.conftest import Evaluate, ResultOf

GRANTS: dict[str, Any] = {
    "dra": {"claims": [{"name": "ml", "namespaces": ["ml"], "classes": ["gpu.nvidia.com"]}], "adminNamespaces": ["gpu-ops"]}
}


def claim(request: dict[str, Any], *, kind: str = "ResourceClaim", namespace: str = "team-a") -> dict[str, Any]:
    spec = {"devices": {"requests": [{"name": "gpu", **request}]}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": "c", "namespace": namespace},
        "spec": {"spec": spec} if kind == "ResourceClaimTemplate" else spec,
    }


GPU = {"exactly": {"deviceClassName": "gpu.nvidia.com"}}


@pytest.mark.parametrize("kind", ["ResourceClaim", "ResourceClaimTemplate"])
def test_a_tenant_claim_for_a_gpu_class_is_denied_by_default(evaluate: Evaluate, kind: str) -> None:
    decision = evaluate(claim(GPU, kind=kind), config=GRANTS, namespace="team-a")
    assert not decision.allowed
    assert "GPU DeviceClass 'gpu.nvidia.com', which namespace 'team-a' is not granted" in decision.denial_message


@pytest.mark.parametrize("kind", ["ResourceClaim", "ResourceClaimTemplate"])
def test_a_granted_namespace_may_claim_the_gpu_class(evaluate: Evaluate, result: ResultOf, kind: str) -> None:
    decision = evaluate(claim(GPU, kind=kind, namespace="ml"), config=GRANTS, namespace="ml")
    assert decision.allowed
    assert result(decision, "GPU011") is model.Result.PASS


def test_a_grant_is_per_class(evaluate: Evaluate) -> None:
    mig = {"exactly": {"deviceClassName": "mig.nvidia.com"}}
    assert not evaluate(claim(mig, namespace="ml"), config=GRANTS, namespace="ml").allowed


def test_a_gpu_class_hidden_among_first_available_alternatives_is_denied(evaluate: Evaluate) -> None:
    request = {
        "firstAvailable": [
            {"name": "cpu", "deviceClassName": "cpu.example.com"},
            {"name": "g", "deviceClassName": "gpu.nvidia.com"},
        ]
    }
    decision = evaluate(claim(request), config=GRANTS)
    assert not decision.allowed and "request 'gpu/g'" in decision.denial_message


@pytest.mark.parametrize(
    "expression",
    [
        "device.driver == 'gpu.nvidia.com'",
        "device.attributes['gpu.nvidia.com'].type == 'gpu'",
        "device.driver.startsWith('gpu')",
        "device.driver == 'gpu.nv' + 'idia.com'",
    ],
)
def test_a_selector_picking_gpus_through_another_class_is_denied(evaluate: Evaluate, expression: str) -> None:
    request = {"exactly": {"deviceClassName": "everything", "selectors": [{"cel": {"expression": expression}}]}}
    decision = evaluate(claim(request), config=GRANTS)
    assert not decision.allowed and "which is no GPU class" in decision.denial_message


def test_a_selector_on_another_driver_through_another_class_is_allowed(evaluate: Evaluate) -> None:
    request = {
        "exactly": {"deviceClassName": "nics", "selectors": [{"cel": {"expression": "device.driver == 'nic.example.com'"}}]}
    }
    assert evaluate(claim(request), config=GRANTS).allowed


def test_admin_access_is_kept_to_admin_namespaces(evaluate: Evaluate) -> None:
    request = {"exactly": {"deviceClassName": "gpu.nvidia.com", "adminAccess": True}}
    denied = evaluate(claim(request, namespace="ml"), config=GRANTS, namespace="ml")
    assert not denied.allowed and "adminAccess" in denied.denial_message
    admins = copy.deepcopy(GRANTS)
    admins["dra"]["claims"].append({"name": "ops", "namespaces": ["gpu-ops"], "classes": ["gpu.nvidia.com"]})
    assert evaluate(claim(request, namespace="gpu-ops"), config=admins, namespace="gpu-ops").allowed


def test_a_later_update_of_a_template_is_judged_again(evaluate: Evaluate) -> None:
    harmless = claim({"exactly": {"deviceClassName": "nics"}}, kind="ResourceClaimTemplate")
    changed = claim(GPU, kind="ResourceClaimTemplate")
    assert not evaluate(changed, config=GRANTS, operation="UPDATE", old=harmless).allowed


def test_a_metadata_update_of_an_old_claim_goes_through(evaluate: Evaluate) -> None:
    stored = claim(GPU)
    finalized = copy.deepcopy(stored)
    finalized["metadata"]["finalizers"] = []  # the resourceclaim controller releasing a claim written earlier
    assert evaluate(finalized, config=GRANTS, operation="UPDATE", old=stored).allowed


def test_a_malformed_claim_is_not_a_crash(evaluate: Evaluate, result: ResultOf) -> None:
    decision = evaluate({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"}, "spec": "x"})
    assert decision.allowed and result(decision, "GPU011") is model.Result.PASS


def test_claims_grants_must_be_anchored_to_namespaces() -> None:
    with pytest.raises(settings.InvalidSettings):
        settings.from_mapping({"dra": {"claims": [{"name": "all", "classes": ["gpu.nvidia.com"]}]}})
    with pytest.raises(settings.InvalidSettings):
        settings.from_mapping({"dra": {"claims": [{"name": "x", "namespaces": ["a"]}]}})  # no classes


# --- pods, judged by the claims they use ----------------------------------------------------------


def gpu_pod(**ref: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team-a"},
        "spec": {
            "containers": [{"name": "main", "image": "registry.example/app:1", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", **ref}],
        },
    }


def judged(pod: dict[str, Any], claims: dict[tuple[str, str], Any] | None, *, namespace: str = "team-a") -> model.Decision:
    request = model.Request(operation="CREATE", object=pod, namespace=namespace, claims=claims)
    return engine.evaluate(request, settings=settings.from_mapping(GRANTS))


def test_a_pod_using_a_claim_of_a_gpu_class_written_before_the_rules_is_denied() -> None:
    old_claim = claim(GPU)
    decision = judged(gpu_pod(resourceClaimName="c"), {("ResourceClaim", "c"): old_claim})
    assert not decision.allowed
    assert "the pod uses ResourceClaim 'c': request 'gpu' claims GPU DeviceClass" in decision.denial_message


def test_a_pod_using_a_template_is_judged_by_the_template() -> None:
    template = claim(GPU, kind="ResourceClaimTemplate")
    decision = judged(gpu_pod(resourceClaimTemplateName="t"), {("ResourceClaimTemplate", "t"): template})
    assert not decision.allowed and "ResourceClaimTemplate 't'" in decision.denial_message
    granted = judged(gpu_pod(resourceClaimTemplateName="t"), {("ResourceClaimTemplate", "t"): template}, namespace="ml")
    assert granted.allowed


def test_a_pod_using_a_claim_that_cannot_be_read_fails_closed() -> None:
    decision = judged(gpu_pod(resourceClaimName="c"), {("ResourceClaim", "c"): None})
    assert not decision.allowed and "could not be read" in decision.denial_message


def test_a_pod_using_a_claim_that_does_not_exist_yet_is_allowed_the_claim_is_judged_when_written() -> None:
    assert judged(gpu_pod(resourceClaimName="later"), {("ResourceClaim", "later"): {}}).allowed


def test_offline_a_pod_using_a_claim_gets_a_warning_not_a_denial() -> None:
    decision = judged(gpu_pod(resourceClaimName="c"), None)
    assert decision.allowed
    assert any("cannot be judged offline" in w for w in decision.warnings)


def test_a_workload_template_using_a_claim_template_is_judged_too() -> None:
    pod = gpu_pod(resourceClaimTemplateName="t")
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "team-a"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": pod["spec"]}},
    }
    decision = judged(deployment, {("ResourceClaimTemplate", "t"): claim(GPU, kind="ResourceClaimTemplate")})
    assert not decision.allowed


def test_a_pod_without_claims_is_not_looked_at() -> None:
    pod = gpu_pod(resourceClaimName="c")
    del pod["spec"]["resourceClaims"]
    assert lookups.claims_to_look_up(pod) == frozenset()
    assert judged(pod, None).allowed and not judged(pod, None).warnings
