"""/mutate and /validate under hostile bodies: never a 5xx, never a hang, up afterwards, memory flat."""

from __future__ import annotations

import json
import ssl
import threading
import time

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from tests.unit.fuzz import hostile
from tests.unit.fuzz.servers import FUZZ, Client, ThreadServer, raw_exchange, rss_bytes

ENDPOINTS = st.sampled_from(["/mutate", "/validate"])


def _check_answer(status: int, data: bytes, sent: bytes) -> None:
    """200 only for a usable review, with its uid echoed; every other body is a 400 with a reason."""
    assert status in (200, 400), (status, data[:300])
    if status == 400:
        assert data.startswith(b"bad AdmissionReview: "), data[:300]
        return
    answer = json.loads(data)
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    assert isinstance(answer["response"]["allowed"], bool)
    assert answer["response"]["uid"] == json.loads(sent)["request"]["uid"]


@FUZZ
@given(drawn=hostile.admission_bodies(), content_type=hostile.CONTENT_TYPES, path=ENDPOINTS)
def test_hostile_bodies_get_a_200_verdict_or_a_400_reason_never_a_5xx(
    webhook: Client, drawn: hostile.Body, content_type: str | None, path: str
) -> None:
    label, body = drawn
    status, data, seconds = webhook.post(path, body, content_type=content_type)
    event(f"{label.split()[0]} -> {status}")
    _check_answer(status, data, body)
    assert seconds < 5, f"{label}: {seconds:.1f} s"


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
def test_other_methods_on_the_review_paths_are_4xx(webhook: Client, method: str) -> None:
    status, _, _ = webhook.post("/validate", b"{}", method=method)
    assert 400 <= status < 500


@FUZZ
@given(path=st.text(alphabet="abcdefghijklmnopqrstuvwxyz/%.-_~0123456789", max_size=30))
def test_unknown_paths_are_4xx(webhook: Client, path: str) -> None:
    status, _, _ = webhook.post("/" + path.lstrip("/"), json.dumps(hostile.review()).encode())
    assert status < 500
    if path.strip("/") not in ("mutate", "validate"):
        assert 400 <= status < 500


def test_the_server_answers_a_good_review_after_the_hostile_ones(webhook_server: ThreadServer, webhook: Client) -> None:
    assert webhook_server.alive
    for path in ("/mutate", "/validate"):
        status, data, _ = webhook.post(path, json.dumps(hostile.review(uid="after-fuzz")).encode())
        assert status == 200 and json.loads(data)["response"]["uid"] == "after-fuzz"


def test_a_stalled_body_does_not_hold_up_other_requests(
    webhook_server: ThreadServer, webhook: Client, client_ssl: ssl.SSLContext
) -> None:
    """A client that promises 100 kB and sends 10 bytes ties up its own connection, nobody else's."""
    stalled = b'POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"apiVers'
    done = threading.Event()

    def stall() -> None:
        raw_exchange(webhook_server.port, stalled, context=client_ssl, timeout=3)
        done.set()

    worker = threading.Thread(target=stall, daemon=True)
    worker.start()
    started = time.monotonic()
    status, _, _ = webhook.post("/validate", json.dumps(hostile.review()).encode())
    assert status == 200 and time.monotonic() - started < 2
    worker.join(10)


@pytest.mark.parametrize(
    "raw",
    [
        b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n{}",
        b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n{}",
        b"POST /validate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n{}\r\n0\r\n\r\n",
        b"POST /validate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        b"POST /validate HTTP/1.1\r\n" + b"X-Long: " + b"a" * 70000 + b"\r\n\r\n",
        b"POST /validate HTTP/9.9\r\nHost: x\r\n\r\n",
        b"\x16\x03\x01\x00\x05hello\r\n\r\n",
        b"GARBAGE\r\n\r\n",
    ],
    ids=[
        "negative-length",
        "huge-length",
        "bad-chunk",
        "chunked-and-length",
        "long-header",
        "bad-version",
        "tls-in-tls",
        "garbage",
    ],
)
def test_malformed_http_gets_a_4xx_or_a_closed_connection_never_a_5xx(
    webhook_server: ThreadServer, client_ssl: ssl.SSLContext, raw: bytes
) -> None:
    answer = raw_exchange(webhook_server.port, raw, context=client_ssl, timeout=5)
    if answer:
        status = int(answer.split(b" ", 2)[1])
        assert 400 <= status < 500, answer[:200]
    assert webhook_server.alive


def test_memory_stays_flat_under_repeated_hostile_bodies(webhook: Client) -> None:
    """After a warm-up, thousands more hostile reviews leave resident memory where it was."""
    bodies = [
        json.dumps(
            hostile.review(
                obj={"kind": "Pod", "spec": {"containers": [{"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": n}]}]}},
                uid=f"u{n}",
            )
        ).encode()
        for n in range(50)
    ] + [
        b"[" * 5000,
        b'{"apiVersion": 1}',
        b"\xff\xfe",
        b'{"a":' * 101 + b"1" + b"}" * 101,
        json.dumps(hostile.review())[:-7].encode(),
    ]

    def round_() -> None:
        for body in bodies:
            for path in ("/mutate", "/validate"):
                status, _, _ = webhook.post(path, body)
                assert status in (200, 400)

    for _ in range(10):
        round_()
    before = rss_bytes()
    for _ in range(20):  # 2,200 requests
        round_()
    grown = rss_bytes() - before
    assert grown < 8 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB over 2,200 hostile requests"
