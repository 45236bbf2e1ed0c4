"""/filter, /prioritize and /bind of the extender under hostile bodies: a 200 answer or a 4xx, never a 5xx."""

from __future__ import annotations

import json

import pytest
from hypothesis import event, given

from tests.unit.fuzz import hostile
from tests.unit.fuzz.servers import FUZZ, Client, ThreadServer

UNKNOWN_CHARSET = "application/json; charset=no-such-codec"


def _check(path: str, status: int, data: bytes) -> None:
    """200 in the verb's own answer type (never an internal error), or a 4xx with a reason."""
    assert status in (200, 400, 413), (path, status, data[:300])
    answer = json.loads(data) if data and status != 413 else None
    if status == 200 and path == "/prioritize":
        assert isinstance(answer, list) and all(set(item) == {"Host", "Score"} for item in answer), answer
    elif status in (200, 400):
        assert isinstance(answer, dict) and "Error" in answer
        assert status == 200 or answer["Error"]
        assert not answer["Error"].startswith("internal error"), answer["Error"]


def _post_hostile(extender: Client, path: str, drawn: hostile.Body, *, content_type: str | None) -> None:
    """Post one drawn body: the answer passes `_check`, within 5 s."""
    label, body = drawn
    status, data, seconds = extender.post(path, body, content_type=content_type)
    event(f"{label.split()[0]} -> {status}")
    _check(path, status, data)
    assert seconds < 5


@FUZZ
@given(drawn=hostile.filter_bodies(), content_type=hostile.CONTENT_TYPES)
def test_filter_survives_hostile_bodies(extender: Client, drawn: hostile.Body, content_type: str | None) -> None:
    _post_hostile(extender, "/filter", drawn, content_type=content_type)


@FUZZ
@given(drawn=hostile.filter_bodies(), content_type=hostile.CONTENT_TYPES)
def test_prioritize_survives_hostile_bodies(extender: Client, drawn: hostile.Body, content_type: str | None) -> None:
    _post_hostile(extender, "/prioritize", drawn, content_type=content_type)


@FUZZ
@given(drawn=hostile.bind_bodies(), content_type=hostile.CONTENT_TYPES)
def test_bind_survives_hostile_bodies(extender: Client, drawn: hostile.Body, content_type: str | None) -> None:
    _post_hostile(extender, "/bind", drawn, content_type=content_type)


def test_the_extender_answers_a_good_filter_after_the_hostile_ones(extender_server: ThreadServer, extender: Client) -> None:
    assert extender_server.alive
    status, data, _ = extender.post("/filter", json.dumps(hostile.filter_args()).encode())
    assert status == 200 and json.loads(data)["NodeNames"] == ["gpu-0", "gpu-1"]


@pytest.mark.parametrize("path", ["/filter", "/prioritize", "/bind"])
def test_an_unknown_charset_is_a_400_like_any_unreadable_body(extender: Client, path: str) -> None:
    body = json.dumps(hostile.bind_args() if path == "/bind" else hostile.filter_args()).encode()
    status, data, _ = extender.post(path, body, content_type=UNKNOWN_CHARSET)
    _check(path, status, data)
    assert status == 400


@pytest.mark.parametrize("path", ["/filter", "/prioritize", "/bind"])
def test_a_body_nested_past_the_decoders_limit_is_a_400(extender: Client, path: str) -> None:
    status, data, _ = extender.post(path, b"[" * 5000 + b"]" * 5000)
    _check(path, status, data)
    assert status == 400
