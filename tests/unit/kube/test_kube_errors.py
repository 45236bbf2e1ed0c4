"""The Kubernetes layer's errors: one type per answer code acts on, one line each, from every kind of failure."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest
import urllib3
from kubernetes.client import exceptions as client_exceptions

from webhook.kube import errors


def api_exception(status: int, *, message: str = "", reason: str = "", headers: dict[str, str] | None = None) -> Exception:
    """An ApiException as the client raises it from an apiserver answer (a metav1.Status body)."""
    body = json.dumps({"kind": "Status", "status": "Failure", "message": message, "code": status}).encode() if message else b""
    answer = types.SimpleNamespace(status=status, reason=reason, data=body, headers=headers or {})
    return client_exceptions.ApiException(http_resp=answer)


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (404, errors.NotFound),
        (409, errors.Conflict),
        (410, errors.Gone),
        (429, errors.TooManyRequests),
        (500, errors.ServerError),
        (503, errors.ServerError),
        (504, errors.ServerError),
        (400, errors.KubeError),
        (403, errors.KubeError),
        (422, errors.KubeError),
    ],
)
def test_each_status_becomes_its_type_and_keeps_the_code(status: int, kind: type[errors.KubeError]) -> None:
    error = errors.translate(api_exception(status), what="cannot read node gpu-0")
    assert type(error) is kind
    assert error.status == status


def test_the_message_is_one_line_with_what_the_status_and_the_apiservers_words() -> None:
    failure = api_exception(
        409,
        reason="Conflict",
        message='Operation cannot be fulfilled on leases.coordination.k8s.io "certs": the object has been modified\nsecond line',
    )
    error = errors.translate(failure, what="cannot write lease gpu-admission/certs")
    assert str(error) == (
        "cannot write lease gpu-admission/certs: 409 Conflict: Operation cannot be fulfilled on "
        'leases.coordination.k8s.io "certs": the object has been modified'
    )
    assert error.reason == str(error)
    assert error.__class__ is errors.Conflict


def test_without_a_status_body_or_reason_the_http_phrase_stands_in() -> None:
    failure = client_exceptions.ApiException(status=503)
    assert str(errors.translate(failure, what="cannot list Pod objects in the cluster")) == (
        "cannot list Pod objects in the cluster: 503 Service Unavailable"
    )


def test_retry_after_is_read_from_429_and_5xx_answers_only() -> None:
    throttled = errors.translate(api_exception(429, headers={"Retry-After": "3"}), what="x")
    busy = errors.translate(api_exception(503, headers={"retry-after": "1"}), what="x")
    missing = errors.translate(api_exception(409, headers={"Retry-After": "3"}), what="x")
    nonsense = errors.translate(api_exception(429, headers={"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}), what="x")
    assert (throttled.retry_after_s, busy.retry_after_s, missing.retry_after_s, nonsense.retry_after_s) == (3.0, 1.0, None, None)


def test_a_raw_answer_of_call_api_is_translated_the_same_way() -> None:
    body = json.dumps({"kind": "Status", "message": 'pods "p" not found', "code": 404})
    error = errors.translate(
        errors.Answer(status=404, body=body.encode(), reason="Not Found"), what="GET /api/v1/namespaces/a/pods/p"
    )
    assert isinstance(error, errors.NotFound)
    assert str(error) == 'GET /api/v1/namespaces/a/pods/p: 404 Not Found: pods "p" not found'
    assert (
        str(errors.translate(errors.Answer(status=502, body=b"<html>bad gateway</html>"), what="GET /x"))
        == "GET /x: 502 Bad Gateway"
    )


@pytest.mark.parametrize(
    ("failure", "expected"),
    [
        (ConnectionResetError(104, "Connection reset by peer"), "cannot read node n: [Errno 104] Connection reset by peer"),
        (TimeoutError("timed out"), "cannot read node n: timed out"),
        (
            urllib3.exceptions.ProtocolError("Connection aborted.", ConnectionResetError(104, "reset")),
            "cannot read node n: ('Connection aborted.', ConnectionResetError(104, 'reset'))",
        ),
        (client_exceptions.ApiException(status=0, reason="SSLError\ncertificate verify failed"), "cannot read node n: SSLError"),
    ],
)
def test_no_answer_is_unreachable_with_status_zero(failure: BaseException, expected: str) -> None:
    error = errors.translate(failure, what="cannot read node n")
    assert isinstance(error, errors.Unreachable) and error.status == 0
    assert str(error) == expected


def test_urllib3s_retry_wrapper_says_the_cause_without_the_connection_objects_repr() -> None:
    class Connection:
        def __repr__(self) -> str:
            return "<urllib3.connection.HTTPSConnection object at 0x7f3a2c10>"

    refused = "Failed to establish a new connection: [Errno 111] Connection refused"
    cause = urllib3.exceptions.NewConnectionError(Connection(), refused)  # type: ignore[arg-type]  # a stand-in connection
    failure = urllib3.exceptions.MaxRetryError(None, "/api/v1/nodes", reason=cause)  # type: ignore[arg-type]  # no pool needed for the text
    error = errors.translate(failure, what="cannot list Node objects in the cluster")
    assert isinstance(error, errors.Unreachable)
    assert (
        str(error)
        == "cannot list Node objects in the cluster: Failed to establish a new connection: [Errno 111] Connection refused"
    )


def test_a_kube_error_passes_through_and_anything_else_is_a_plain_kube_error() -> None:
    conflict = errors.Conflict("the fake apiserver refuses")
    assert errors.translate(conflict, what="ignored") is conflict
    odd = errors.translate(ValueError("Invalid value for `name`, must not be `None`\ndetails"), what="cannot read secret a/b")
    assert type(odd) is errors.KubeError and odd.status == 0
    assert str(odd) == "cannot read secret a/b: Invalid value for `name`, must not be `None`"


def test_only_the_clients_failures_are_recognised() -> None:
    assert errors.recognised(api_exception(500))
    assert errors.recognised(OSError("refused"))
    assert errors.recognised(urllib3.exceptions.ProtocolError("Connection aborted."))
    assert errors.recognised(errors.NotFound("gone"))
    assert not errors.recognised(ValueError("a bug"))
    assert not errors.recognised(KeyError("metadata"))


def test_the_default_status_of_each_type_and_an_explicit_one() -> None:
    assert [
        kind("m").status
        for kind in (
            errors.KubeError,
            errors.NotFound,
            errors.Conflict,
            errors.Gone,
            errors.TooManyRequests,
            errors.ServerError,
            errors.Unreachable,
        )
    ] == [
        0,
        404,
        409,
        410,
        429,
        500,
        0,
    ]
    assert errors.KubeError("evicting", status=429).status == 429


def test_translating_a_transport_error_imports_neither_kubernetes_nor_urllib3() -> None:
    script = (
        "import sys\n"
        "from webhook.kube import errors, retry\n"
        "error = errors.translate(ConnectionRefusedError(111, 'refused'), what='x')\n"
        "assert isinstance(error, errors.Unreachable), error\n"
        "print(sorted(name for name in ('kubernetes', 'urllib3') if name in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"
