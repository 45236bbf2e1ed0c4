"""Building AdmissionReview v1 responses: pure, keyword-only functions from a decision to the wire."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any

from policies import model
from webhook.admission import review

# The apiserver may truncate a warning past 256 characters and drops all of them past 4096 in total
# (Dynamic Admission Control docs); cut them here so what the user sees is what we chose.
MAX_WARNING_CHARS = 256
MAX_WARNINGS_TOTAL = 4096
DENIED_CODE = 403
INTERNAL_ERROR_CODE = 500


def build(
    *,
    uid: str,
    allowed: bool,
    api_version: str = review.API_VERSION,
    kind: str = review.KIND,
    status_code: int | None = None,
    message: str = "",
    warnings: Sequence[str] = (),
    patch: Sequence[Mapping[str, Any]] = (),
    audit_annotations: Mapping[str, str] | None = None,
) -> review.AdmissionReviewResponse:
    """One AdmissionReview response; optional parts appear only when they carry something."""
    response: review.AdmissionResponse = {"uid": uid, "allowed": allowed}
    if status_code is not None or message:
        status: review.Status = {}
        if status_code is not None:
            status["code"] = status_code
        if message:
            status["message"] = message
        response["status"] = status
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = encode_patch(patch)
    if warnings:
        response["warnings"] = bounded_warnings(warnings)
    if audit_annotations:
        response["auditAnnotations"] = dict(audit_annotations)
    return {"apiVersion": api_version, "kind": kind, "response": response}


def for_mutation(*, request: review.Review, decision: model.Decision) -> review.AdmissionReviewResponse:
    """The /mutate answer: always allowed, with the engine's patch when it has one.

    Denying is the validating webhook's job: it sees the object after every mutating webhook ran,
    and a mutating webhook should fail open. So a violation here never blocks, it only stays in
    the decision for /validate to act on.
    """
    if decision.exempt_reason:
        return build(uid=request.uid, allowed=True, status_code=200, message=decision.exempt_reason)
    return build(uid=request.uid, allowed=True, patch=decision.patch, warnings=decision.notices)


def for_validation(*, request: review.Review, decision: model.Decision) -> review.AdmissionReviewResponse:
    """The /validate answer: allowed or denied (403 naming the policies), warnings, audit notes."""
    if decision.exempt_reason:
        return build(uid=request.uid, allowed=True, status_code=200, message=decision.exempt_reason)
    audited = {v.policy: v.message for v in decision.violations if v.action is model.Action.AUDIT}
    if decision.allowed:
        return build(uid=request.uid, allowed=True, warnings=decision.warnings, audit_annotations=audited)
    return build(
        uid=request.uid,
        allowed=False,
        status_code=DENIED_CODE,
        message=decision.denial_message or _fallback_denial(decision),
        warnings=decision.warnings,
        audit_annotations=audited,
    )


def for_verdict(*, request: review.Review, why: str, warnings: Sequence[str] = ()) -> review.AdmissionReviewResponse:
    """The answer of an endpoint that judges one thing itself (`evictions`, `settingscheck`):
    allowed where `why` is empty, else denied (403) with `why` as the message."""
    return build(
        uid=request.uid,
        allowed=not why,
        api_version=request.api_version,
        kind=request.kind,
        status_code=DENIED_CODE if why else None,
        message=why,
        warnings=warnings,
    )


def for_internal_error(*, request: review.Review, endpoint: str) -> review.AdmissionReviewResponse:
    """A well-formed review whose evaluation failed inside the webhook (a bug, never bad input).

    Still HTTP 200, as the review was fine: /mutate lets the object through unchanged (fail open,
    like its failurePolicy) and /validate refuses it with a 500 status the user can report.
    """
    if endpoint == "mutate":
        return build(uid=request.uid, allowed=True, warnings=("gpu-admission: mutation skipped after an internal error",))
    return build(
        uid=request.uid,
        allowed=False,
        status_code=INTERNAL_ERROR_CODE,
        message="gpu-admission: internal error while evaluating policies; see the webhook log for this request's uid",
    )


def encode_patch(patch: Sequence[Mapping[str, Any]]) -> str:
    """The base64 of the compact JSON of an RFC 6902 patch, as ``response.patch`` wants it."""
    document = json.dumps(list(patch), separators=(",", ":"), ensure_ascii=False)
    return base64.b64encode(document.encode("utf-8")).decode("ascii")


def bounded_warnings(warnings: Sequence[str]) -> list[str]:
    """Warnings cut to what the apiserver passes on intact (per-warning and total limits)."""
    kept: list[str] = []
    total = 0
    for index, warning in enumerate(warnings):
        text = warning if len(warning) <= MAX_WARNING_CHARS else warning[: MAX_WARNING_CHARS - 3] + "..."
        rest = len(warnings) - index
        if total + len(text) > MAX_WARNINGS_TOTAL - 40:
            kept.append(f"...and {rest} more warning(s)")
            break
        kept.append(text)
        total += len(text)
    return kept


def _fallback_denial(decision: model.Decision) -> str:
    """A denial the engine gave no enforced violation for: still name every policy involved."""
    named = "; ".join(v.message for v in decision.violations)
    return named or "denied by gpu-admission"
