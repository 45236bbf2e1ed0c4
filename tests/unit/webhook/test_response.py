"""Response building: exact wire shapes for allow, deny, warn, exempt, patch and internal errors."""

from __future__ import annotations

import base64
import json

from policies import model
from webhook.admission import response, review

REQUEST = review.Review(
    api_version=review.API_VERSION,
    kind=review.KIND,
    uid="uid-1",
    operation="CREATE",
    object={"kind": "Pod"},
    old_object=None,
    namespace="team-a",
    name="p",
    object_kind="Pod",
    subresource="",
    user="",
    groups=(),
    dry_run=False,
)
PATCH = ({"op": "add", "path": "/spec/nodeSelector", "value": {"ack.node.gpu.schedule": "cgpu"}},)
ENFORCED = model.Violation(policy="GPU001", action=model.Action.ENFORCE, message="GPU001: no NVIDIA_VISIBLE_DEVICES")
WARNED = model.Violation(policy="GPU002", action=model.Action.WARN, message="GPU002: privileged GPU container")
AUDITED = model.Violation(policy="GPU003", action=model.Action.AUDIT, message="GPU003: hostPath /dev")


def test_an_allowed_review_is_just_uid_and_allowed() -> None:
    assert response.build(uid="x", allowed=True) == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": "x", "allowed": True},
    }


def test_the_patch_is_base64_of_the_compact_json_patch() -> None:
    built = response.build(uid="x", allowed=True, patch=PATCH)
    assert built["response"]["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(built["response"]["patch"])) == list(PATCH)


def test_mutation_allows_and_carries_the_patch_even_when_validation_would_deny() -> None:
    decision = model.Decision(allowed=False, violations=(ENFORCED,), patch=PATCH)
    built = response.for_mutation(request=REQUEST, decision=decision)["response"]
    assert built["allowed"] is True and "status" not in built
    assert json.loads(base64.b64decode(built["patch"])) == list(PATCH)


def test_mutation_without_a_patch_has_no_patch_fields() -> None:
    built = response.for_mutation(request=REQUEST, decision=model.Decision(allowed=True))["response"]
    assert built == {"uid": "uid-1", "allowed": True}


def test_validation_denies_with_403_naming_the_enforced_policies_and_keeps_warnings() -> None:
    decision = model.Decision(allowed=False, violations=(ENFORCED, WARNED), warnings=(WARNED.message,), patch=PATCH)
    built = response.for_validation(request=REQUEST, decision=decision)["response"]
    assert built == {
        "uid": "uid-1",
        "allowed": False,
        "status": {"code": 403, "message": "GPU001: no NVIDIA_VISIBLE_DEVICES"},
        "warnings": ["GPU002: privileged GPU container"],
    }


def test_validation_records_audit_violations_as_audit_annotations() -> None:
    decision = model.Decision(allowed=True, violations=(AUDITED,))
    built = response.for_validation(request=REQUEST, decision=decision)["response"]
    assert built == {"uid": "uid-1", "allowed": True, "auditAnnotations": {"GPU003": "GPU003: hostPath /dev"}}


def test_exempt_requests_are_allowed_with_the_reason_and_no_patch() -> None:
    decision = model.Decision(allowed=True, exempt_reason="namespace kube-system is exempt", patch=PATCH)
    for built in (
        response.for_mutation(request=REQUEST, decision=decision),
        response.for_validation(request=REQUEST, decision=decision),
    ):
        assert built["response"] == {
            "uid": "uid-1",
            "allowed": True,
            "status": {"code": 200, "message": "namespace kube-system is exempt"},
        }


def test_a_denial_without_enforced_violations_still_names_the_policies() -> None:
    decision = model.Decision(allowed=False, violations=(WARNED,))
    assert response.for_validation(request=REQUEST, decision=decision)["response"]["status"]["message"] == WARNED.message


def test_internal_errors_fail_open_on_mutate_and_closed_on_validate() -> None:
    assert response.for_internal_error(request=REQUEST, endpoint="mutate")["response"]["allowed"] is True
    denied = response.for_internal_error(request=REQUEST, endpoint="validate")["response"]
    assert denied["allowed"] is False and denied["status"]["code"] == 500


def test_warnings_are_cut_to_what_the_apiserver_keeps() -> None:
    long = ["W" * 1000] + [f"warning {i}: " + "x" * 200 for i in range(40)]
    kept = response.bounded_warnings(long)
    assert all(len(w) <= response.MAX_WARNING_CHARS for w in kept)
    assert sum(len(w) for w in kept) <= response.MAX_WARNINGS_TOTAL
    assert kept[0].endswith("...") and kept[-1].startswith("...and ")
    assert response.bounded_warnings(["a", "b"]) == ["a", "b"]
