"""The webhook over real TLS: the AdmissionReview contract, the 4xx channel, probes and metrics."""

from __future__ import annotations

import base64
import json
import logging
import ssl
import warnings
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from policies import settings as engine_settings
from webhook.admission import decisions, review

Factory = Callable[..., Any]

GPU_MEM_POD_PATCH = [
    {"op": "add", "path": "/spec/nodeSelector", "value": {"ack.node.gpu.schedule": "cgpu"}},
]


async def _post(client: Any, path: str, body: dict[str, Any] | bytes) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with client.post(path, data=data, headers={"Content-Type": "application/json"}) as answer:
        text = await answer.text()
        try:
            return answer.status, json.loads(text)
        except ValueError:
            return answer.status, text


def _patch_of(answer: dict[str, Any]) -> list[dict[str, Any]]:
    response = answer["response"]
    if "patch" not in response:
        return []
    assert response["patchType"] == "JSONPatch"
    decoded: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"], validate=True))
    return decoded


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
async def test_every_review_gets_200_echoing_uid_api_version_and_kind(
    webhook_client: Factory, make_review: Factory, make_pod: Factory, path: str
) -> None:
    client = await webhook_client()
    status, answer = await _post(client, path, make_review(make_pod(), uid="c0ffee-1"))
    assert status == 200
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == "c0ffee-1"
    assert answer["response"]["allowed"] is True


async def _answer_to_visible_devices(
    path: str, value: str, *, gpu001: str | None = None, webhook_client: Factory, make_review: Factory, make_pod: Factory
) -> tuple[int, dict[str, Any]]:
    """The HTTP status and the AdmissionReview response of `path` to a pod setting NVIDIA_VISIBLE_DEVICES
    to `value`, with GPU001 acting `gpu001` (its default when None)."""
    config = None if gpu001 is None else engine_settings.from_mapping({"policies": {"GPU001": {"action": gpu001}}})
    client = await webhook_client(config)
    pod = make_pod(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": value}])
    status, answer = await _post(client, path, make_review(pod))
    response: dict[str, Any] = answer["response"]
    return status, response


async def test_validate_denies_a_visible_devices_bypass_with_403_naming_gpu001(
    webhook_client: Factory, make_review: Factory, make_pod: Factory
) -> None:
    status, response = await _answer_to_visible_devices(
        "/validate", "all", webhook_client=webhook_client, make_review=make_review, make_pod=make_pod
    )
    assert status == 200
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert response["status"]["message"].startswith("GPU001: ")
    assert "patch" not in response


async def test_mutate_allows_the_same_bypass_and_leaves_denying_to_validate(
    webhook_client: Factory, make_review: Factory, make_pod: Factory
) -> None:
    status, response = await _answer_to_visible_devices(
        "/mutate", "all", webhook_client=webhook_client, make_review=make_review, make_pod=make_pod
    )
    assert (status, response["allowed"]) == (200, True)
    assert "status" not in response


async def test_mutate_returns_the_exact_patch_base64_encoded(
    webhook_client: Factory, make_review: Factory, make_pod: Factory
) -> None:
    client = await webhook_client()
    pod = make_pod(limits={"aliyun.com/gpu-mem": 3})
    status, answer = await _post(client, "/mutate", make_review(pod))
    assert status == 200 and answer["response"]["allowed"] is True
    assert _patch_of(answer) == GPU_MEM_POD_PATCH


async def test_mutate_of_already_mutated_pod_has_no_patch_fields(
    webhook_client: Factory, make_review: Factory, make_pod: Factory
) -> None:
    client = await webhook_client()
    pod = make_pod(limits={"aliyun.com/gpu-mem": 3}, node_selector={"ack.node.gpu.schedule": "cgpu"})
    _, answer = await _post(client, "/mutate", make_review(pod))
    assert answer["response"] == {"uid": answer["response"]["uid"], "allowed": True}


async def test_validate_never_returns_a_patch(webhook_client: Factory, make_review: Factory, make_pod: Factory) -> None:
    client = await webhook_client()
    _, answer = await _post(client, "/validate", make_review(make_pod(limits={"aliyun.com/gpu-mem": 3})))
    assert answer["response"]["allowed"] is True and "patch" not in answer["response"]


async def test_warn_mode_allows_with_a_warning_naming_the_policy(
    webhook_client: Factory, make_review: Factory, make_pod: Factory
) -> None:
    _, response = await _answer_to_visible_devices(
        "/validate", "0,1", gpu001="warn", webhook_client=webhook_client, make_review=make_review, make_pod=make_pod
    )
    assert response["allowed"] is True
    assert any(w.startswith("GPU001: ") for w in response["warnings"])


async def test_audit_mode_allows_silently_and_records_an_audit_annotation(
    webhook_client: Factory, make_review: Factory, make_pod: Factory
) -> None:
    _, response = await _answer_to_visible_devices(
        "/validate", "all", gpu001="audit", webhook_client=webhook_client, make_review=make_review, make_pod=make_pod
    )
    assert response["allowed"] is True and "warnings" not in response
    assert response["auditAnnotations"]["GPU001"].startswith("GPU001: ")


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
@pytest.mark.parametrize("namespace", ["kube-system", "kube-node-lease", "gpu-admission"])
async def test_exempt_namespaces_are_allowed_with_a_reason_and_no_patch(
    webhook_client: Factory, make_review: Factory, make_pod: Factory, path: str, namespace: str
) -> None:
    client = await webhook_client()
    pod = make_pod(
        namespace=namespace,
        privileged=True,
        limits={"aliyun.com/gpu-mem": 3},
        env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
    )
    _, answer = await _post(client, path, make_review(pod))
    response = answer["response"]
    assert response["allowed"] is True and "patch" not in response
    assert response["status"]["code"] == 200 and namespace in response["status"]["message"]


async def test_a_configured_exempt_namespace_replaces_the_defaults(
    webhook_client: Factory, make_review: Factory, make_pod: Factory
) -> None:
    client = await webhook_client(engine_settings.from_mapping({"exemptNamespaces": ["sandbox"]}))
    bypass = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    _, sandbox = await _post(client, "/validate", make_review(make_pod(namespace="sandbox", env=bypass)))
    _, team = await _post(client, "/validate", make_review(make_pod(namespace="team-a", env=bypass)))
    assert sandbox["response"]["allowed"] is True and team["response"]["allowed"] is False


async def test_the_request_namespace_counts_when_the_object_names_none(
    webhook_client: Factory, make_review: Factory, make_pod: Factory
) -> None:
    """Pods created by controllers arrive without metadata.namespace; the request carries it."""
    client = await webhook_client()
    pod = make_pod(namespace=None, env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])
    _, answer = await _post(client, "/validate", make_review(pod, namespace="kube-system"))
    assert answer["response"]["allowed"] is True


async def test_dry_run_requests_get_the_same_verdict_and_patch(
    webhook_client: Factory, make_review: Factory, make_pod: Factory
) -> None:
    client = await webhook_client()
    pod = make_pod(limits={"aliyun.com/gpu-mem": 3})
    bypass = make_pod(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])
    for path, obj in (("/mutate", pod), ("/validate", bypass)):
        _, real = await _post(client, path, make_review(obj, uid="u"))
        _, dry = await _post(client, path, make_review(obj, uid="u", dry_run=True))
        assert dry == real


async def test_a_delete_review_without_object_is_allowed(
    webhook_client: Factory, make_review: Factory, make_pod: Factory
) -> None:
    client = await webhook_client()
    for path in ("/mutate", "/validate"):
        status, answer = await _post(client, path, make_review(None, operation="DELETE", old_object=make_pod()))
        assert status == 200 and answer["response"]["allowed"] is True and "patch" not in answer["response"]


def _nested(depth: int) -> bytes:
    """A review whose request is ``depth`` objects deep, written directly (json.dumps would recurse)."""
    inner = b'{"x":' * depth + b"{}" + b"}" * depth
    return b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": ' + inner + b"}"


BAD_BODIES: list[tuple[str, bytes, str]] = [
    ("malformed JSON", b'{"apiVersion": "admission.k8s.io/v1", "kind": ', "not JSON"),
    ("empty body", b"", "not JSON"),
    ("non-object body", b"[1, 2, 3]", "must be a JSON object"),
    ("no request", json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(), "no request"),
    (
        "v1beta1",
        json.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {}}).encode(),
        "apiVersion",
    ),
    (
        "wrong types",
        json.dumps(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": 1, "operation": "CREATE"}}
        ).encode(),
        "uid",
    ),
    (
        "object not an object",
        json.dumps(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": {"uid": "u", "operation": "CREATE", "object": "pod"},
            }
        ).encode(),
        "request.object",
    ),
    ("too deep", _nested(5000), "nests deeper"),
    ("deep unbalanced", b"[" * 100_000, "nests deeper"),
    ("not UTF-8", b"\xff\xfe\xfd", "not JSON"),
]


@pytest.mark.parametrize(("case", "body", "reason"), BAD_BODIES, ids=[case for case, _, _ in BAD_BODIES])
@pytest.mark.parametrize("path", ["/mutate", "/validate"])
async def test_a_body_that_is_not_a_review_gets_400_with_a_short_reason(
    webhook_client: Factory, path: str, case: str, body: bytes, reason: str
) -> None:
    client = await webhook_client()
    status, text = await _post(client, path, body)
    assert status == 400, case
    assert isinstance(text, str) and reason in text and text.count("\n") == 1 and len(text) < 200
    async with client.get("/healthz") as still_up:
        assert still_up.status == 200


async def test_an_oversized_body_gets_400_and_the_server_keeps_serving(
    webhook_client: Factory, make_review: Factory, make_pod: Factory
) -> None:
    client = await webhook_client(max_body_bytes=64 * 1024)
    pod = make_pod(annotations={"filler": "x" * (80 * 1024)})
    status, text = await _post(client, "/validate", make_review(pod))
    assert status == 400 and "larger than 65536 bytes" in text
    status, _ = await _post(client, "/validate", make_review(make_pod()))
    assert status == 200


async def test_a_review_over_one_mebibyte_is_accepted_by_default(
    webhook_client: Factory, make_review: Factory, make_pod: Factory
) -> None:
    """An UPDATE review carries object and oldObject; aiohttp's 1 MiB default would refuse it."""
    client = await webhook_client()
    pod = make_pod(annotations={"filler": "x" * (900 * 1024)})
    body = make_review(pod, operation="UPDATE", old_object=pod)
    assert len(json.dumps(body)) > 1024 * 1024
    status, answer = await _post(client, "/validate", body)
    assert status == 200 and answer["response"]["allowed"] is True


async def test_wrong_method_and_unknown_path_are_http_errors_not_crashes(webhook_client: Factory) -> None:
    client = await webhook_client()
    async with client.get("/validate") as answer:
        assert answer.status == 405
    async with client.post("/nope", data=b"{}") as answer:
        assert answer.status == 404


async def test_an_internal_error_still_answers_the_review(
    webhook_client: Factory, make_review: Factory, make_pod: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    client = await webhook_client()
    monkeypatch.setattr(decisions, "answer", broken)
    status, validated = await _post(client, "/validate", make_review(make_pod(), uid="u-err"))
    assert status == 200
    assert validated["response"]["uid"] == "u-err" and validated["response"]["allowed"] is False
    assert validated["response"]["status"]["code"] == 500
    status, mutated = await _post(client, "/mutate", make_review(make_pod(), uid="u-err"))
    assert (status, mutated["response"]["allowed"]) == (200, True) and "patch" not in mutated["response"]


async def test_probes_report_live_and_ready(webhook_client: Factory) -> None:
    client = await webhook_client()
    for path in ("/healthz", "/readyz"):
        async with client.get(path) as answer:
            assert (answer.status, await answer.text()) == (200, "ok\n")


async def test_metrics_count_reviews_policy_results_and_latency(
    webhook_client: Factory, make_review: Factory, make_pod: Factory
) -> None:
    client = await webhook_client()
    await _post(client, "/validate", make_review(make_pod(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])))
    await _post(client, "/validate", make_review(make_pod()))
    await _post(client, "/mutate", make_review(make_pod(namespace="kube-system")))
    await _post(client, "/mutate", b"{")
    async with client.get("/metrics") as answer:
        assert answer.status == 200
        assert answer.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        lines = (await answer.text()).splitlines()
    for expected in (
        'gpu_admission_reviews_total{endpoint="validate",result="denied"} 1.0',
        'gpu_admission_reviews_total{endpoint="validate",result="allowed"} 1.0',
        'gpu_admission_reviews_total{endpoint="mutate",result="exempt"} 1.0',
        'gpu_admission_reviews_total{endpoint="mutate",result="bad_request"} 1.0',
        'gpu_admission_policy_results_total{endpoint="validate",policy="GPU001",result="fail"} 1.0',
        'gpu_admission_policy_results_total{endpoint="validate",policy="GPU001",result="pass"} 1.0',
        'gpu_admission_http_requests_total{code="200",route="/validate"} 2.0',
        'gpu_admission_http_requests_total{code="400",route="/mutate"} 1.0',
        'gpu_admission_http_request_duration_seconds_count{route="/validate"} 2.0',
        'gpu_admission_http_request_duration_seconds_bucket{le="+Inf",route="/mutate"} 2.0',
    ):
        assert expected in lines


async def test_every_admission_log_line_carries_the_review_uid(
    webhook_client: Factory, make_review: Factory, make_pod: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    client = await webhook_client()
    caplog.set_level(logging.DEBUG, logger="webhook")
    await _post(client, "/validate", make_review(make_pod(), uid="uid-in-logs"))
    await _post(client, "/mutate", make_review(make_pod(limits={"nvidia.com/gpu": 1}), uid="uid-in-logs"))
    admission = [r.getMessage() for r in caplog.records if r.name.startswith("webhook.admission")]
    assert len(admission) >= 4  # a decision line and an access line per request
    assert all("uid=uid-in-logs" in line for line in admission)


async def test_tls_1_1_is_refused_by_the_server_and_tls_1_2_accepted(webhook_client: Factory, tls_dir: Any) -> None:
    client = await webhook_client()
    url = client.make_url("/healthz")

    def only(version: ssl.TLSVersion) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(tls_dir / "ca.crt"))
        context.set_ciphers("DEFAULT:@SECLEVEL=0")  # let this client really offer old versions
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # TLSv1_1 is deprecated: that is the point
            context.minimum_version = context.maximum_version = version
        return context

    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientConnectorError) as refused:
            async with session.get(url, ssl=only(ssl.TLSVersion.TLSv1_1)):
                pass
        # The server ends the handshake (an alert, or asyncio just drops the connection); a client
        # unable to offer TLS 1.1 would fail differently ("no protocols available").
        reason = refused.value.os_error
        assert isinstance(reason, ConnectionResetError) or "PROTOCOL_VERSION" in repr(reason)
        async with session.get(url, ssl=only(ssl.TLSVersion.TLSv1_2)) as answer:
            assert answer.status == 200


async def test_plain_http_is_refused(webhook_client: Factory) -> None:
    client = await webhook_client()
    url = client.make_url("/healthz").with_scheme("http")
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientError):
            async with session.get(url):
                pass


def test_review_module_is_what_the_handlers_parse_with() -> None:
    """The 400 reasons above come from review.parse; keep the two in one vocabulary."""
    with pytest.raises(review.BadReview, match="no request"):
        review.parse(b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}')


async def test_a_recorded_statefulset_pod_review_gets_the_exact_patch(webhook_client: Factory, data_dir: Any) -> None:
    body = (data_dir / "reviews" / "pod-create-gpu-mem.json").read_bytes()
    client = await webhook_client()
    status, answer = await _post(client, "/mutate", body)
    assert status == 200 and answer["response"]["uid"] == "4b1f3c8e-2d1a-4f6b-9c3e-7a5d2e9b1c04"
    assert _patch_of(answer) == [
        {"op": "add", "path": "/spec/nodeSelector", "value": {"ack.node.gpu.schedule": "cgpu"}},
        {"op": "add", "path": "/spec/containers/1/env", "value": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]},
    ]
    _, validated = await _post(client, "/validate", body)
    assert validated["response"] == {"uid": "4b1f3c8e-2d1a-4f6b-9c3e-7a5d2e9b1c04", "allowed": True}
