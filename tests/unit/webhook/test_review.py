"""Parsing a body into a Review: well-formed reviews pass, everything else is a short BadReview."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from webhook.admission import review


def _body(data: object) -> bytes:
    return json.dumps(data).encode()


def test_a_recorded_apiserver_review_parses_into_the_request_fields(
    make_review: Callable[..., dict[str, Any]], make_pod: Callable[..., dict[str, Any]]
) -> None:
    pod = make_pod(namespace=None)
    data = make_review(
        pod, uid="705ab4f5-6393-11e8-b7cc-42010a800002", namespace="team-a", dry_run=True, subresource="ephemeralcontainers"
    )
    parsed = review.parse(_body(data))
    assert parsed.uid == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert (parsed.operation, parsed.namespace, parsed.name, parsed.object_kind) == ("CREATE", "team-a", "trainer", "Pod")
    assert parsed.object == pod and parsed.old_object is None
    assert (parsed.user, parsed.groups, parsed.subresource, parsed.dry_run) == (
        "alice",
        ("system:authenticated",),
        "ephemeralcontainers",
        True,
    )


def test_a_minimal_review_with_only_uid_and_operation_is_accepted() -> None:
    parsed = review.parse(
        _body({"apiVersion": review.API_VERSION, "kind": "AdmissionReview", "request": {"uid": "u", "operation": "DELETE"}})
    )
    assert (parsed.object, parsed.namespace, parsed.user, parsed.groups, parsed.dry_run) == (None, "", "", (), False)


def _with_request(**fields: object) -> dict[str, Any]:
    request: dict[str, Any] = {"uid": "u-1", "operation": "CREATE", "object": {"kind": "Pod"}}
    request.update(fields)
    return {"apiVersion": review.API_VERSION, "kind": "AdmissionReview", "request": request}


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "not JSON"),
        (b"{not json", "not JSON"),
        (b'{"apiVersion": NaN}', "not JSON"),
        (b"\xff\xfe\x00garbage", "not JSON"),
        (b"[]", "must be a JSON object, not an array"),
        (b'"review"', "must be a JSON object, not a string"),
        (b"null", "must be a JSON object, not null"),
        (_body({"kind": "AdmissionReview", "request": {}}), "apiVersion must be admission.k8s.io/v1"),
        (_body({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}), "apiVersion must be"),
        (_body({"apiVersion": review.API_VERSION, "kind": "Pod"}), "kind must be AdmissionReview"),
        (_body({"apiVersion": review.API_VERSION, "kind": "AdmissionReview"}), "review has no request object"),
        (_body({"apiVersion": review.API_VERSION, "kind": "AdmissionReview", "request": [1]}), "request must be an object"),
        (_body(_with_request(uid="")), "request.uid must be a non-empty string"),
        (_body(_with_request(uid=7)), "request.uid must be a non-empty string"),
        (_body(_with_request(operation="PATCH")), "request.operation must be one of"),
        (_body(_with_request(object=[])), "request.object must be an object or null, not an array"),
        (_body(_with_request(object={"kind": 3})), "request.object.kind must be a string"),
        (_body(_with_request(oldObject="x")), "request.oldObject must be an object or null"),
        (_body(_with_request(namespace=5)), "request.namespace must be a string, not a number"),
        (_body(_with_request(dryRun="yes")), "request.dryRun must be a boolean, not a string"),
        (_body(_with_request(userInfo={"groups": "admins"})), "request.userInfo.groups must be an array"),
        (_body(_with_request(userInfo={"groups": [1]})), "request.userInfo.groups must be a list of strings"),
        (_body(_with_request(userInfo={"username": True})), "request.userInfo.username must be a string, not a boolean"),
        (_body(_with_request(kind="Pod")), "request.kind must be an object"),
    ],
)
def test_a_body_that_is_not_a_review_is_a_bad_review_with_a_short_reason(body: bytes, reason: str) -> None:
    with pytest.raises(review.BadReview, match=reason) as caught:
        review.parse(body)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 200


def _spec_nested_to(depth: int) -> dict[str, Any]:
    """A pod spec whose innermost object sits at ``depth``: envelope (1) + request (2) + object (3) + spec (4)."""
    deep: dict[str, Any] = {}
    for _ in range(depth - 4):
        deep = {"a": deep}
    return deep


def test_nesting_one_past_the_limit_is_refused_before_decoding() -> None:
    with pytest.raises(review.BadReview, match="nests deeper than"):
        review.parse(_body(_with_request(object={"kind": "Pod", "spec": _spec_nested_to(review.MAX_DEPTH + 1)})))


def test_nesting_at_the_limit_is_accepted() -> None:
    parsed = review.parse(_body(_with_request(object={"kind": "Pod", "spec": _spec_nested_to(review.MAX_DEPTH)})))
    assert parsed.object is not None


def test_unbalanced_deep_brackets_are_refused_without_recursion_errors() -> None:
    with pytest.raises(review.BadReview, match="nests deeper than|not JSON"):
        review.parse(b"[" * 200_000)


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    tricky = '"[[[[{{{{' * 50 + '\\"]]"'
    parsed = review.parse(_body(_with_request(object={"kind": "Pod", "metadata": {"name": tricky * 40}})))
    assert parsed.object is not None and parsed.object["metadata"]["name"] == tricky * 40


def test_a_wide_but_shallow_body_is_accepted() -> None:
    env = [{"name": f"VAR_{i}", "value": str(i)} for i in range(500)]
    parsed = review.parse(_body(_with_request(object={"kind": "Pod", "spec": {"containers": [{"name": "a", "env": env}]}})))
    assert parsed.object is not None
