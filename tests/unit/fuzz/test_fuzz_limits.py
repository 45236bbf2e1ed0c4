"""The request size and nesting limits, over HTTP at their exact edges and as properties of the scan."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tests.unit.fuzz import hostile
from tests.unit.fuzz.servers import FUZZ, Client, rss_bytes
from webhook.admission import app as admission_app
from webhook.admission import review


def depth(value: Any) -> int:
    """Bracket nesting of a decoded JSON value: a scalar is 0, ``[]`` is 1, ``[[1]]`` is 2."""
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


def _sized(total: int) -> bytes:
    """A valid review of exactly ``total`` bytes (the padding is an annotation value)."""
    document = hostile.review(uid="sized")
    document["request"]["object"]["metadata"]["annotations"] = {"pad": ""}
    empty = len(json.dumps(document).encode())
    document["request"]["object"]["metadata"]["annotations"]["pad"] = "x" * (total - empty)
    body = json.dumps(document).encode()
    assert len(body) == total
    return body


def _nested(levels: int) -> bytes:
    """A valid review whose deepest bracket sits at ``levels``."""
    document = hostile.review(uid="nested")
    base = depth(document)
    assert base < levels, "the review itself is deeper than asked"
    inner: Any = 1
    for _ in range(levels - 4):  # request.object.metadata is at depth 4
        inner = [inner]
    document["request"]["object"]["metadata"]["deep"] = inner
    assert depth(document) == levels
    return json.dumps(document).encode()


def test_a_body_of_exactly_the_size_limit_is_evaluated_and_one_byte_more_is_a_400(webhook: Client) -> None:
    limit = admission_app.MAX_BODY_BYTES
    status, data, _ = webhook.post("/validate", _sized(limit))
    assert status == 200 and json.loads(data)["response"]["uid"] == "sized"
    status, data, _ = webhook.post("/validate", _sized(limit + 1))
    assert status == 400 and data.startswith(b"bad AdmissionReview: body larger than")


def test_nesting_of_exactly_the_limit_is_evaluated_and_one_level_more_is_a_400(webhook: Client) -> None:
    status, data, _ = webhook.post("/validate", _nested(review.MAX_DEPTH))
    assert status == 200 and json.loads(data)["response"]["uid"] == "nested"
    status, data, _ = webhook.post("/validate", _nested(review.MAX_DEPTH + 1))
    assert status == 400 and b"nests deeper than" in data


def test_bodies_over_the_size_limit_again_and_again_leave_memory_bounded(webhook: Client) -> None:
    oversized = b'{"pad":"' + b"x" * admission_app.MAX_BODY_BYTES + b'"}'
    webhook.post("/mutate", oversized)
    before = rss_bytes()
    for _ in range(15):
        status, _, _ = webhook.post("/mutate", oversized)
        assert status == 400
    grown = rss_bytes() - before
    assert grown < 32 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB over 15 oversized bodies"


# Strings that try to fool a scan for brackets: escaped quotes, escaped backslashes before quotes,
# brackets inside strings, unicode escapes of quotes.
_TRICKY_TEXT = st.text(alphabet='[]{}"\\/ab\u00e9\u2028', max_size=12)
_NESTED = st.recursive(
    st.none() | st.integers() | _TRICKY_TEXT,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(_TRICKY_TEXT, children, max_size=3),
    max_leaves=40,
)


@FUZZ
@given(value=_NESTED, extra=st.integers(0, 110), ascii_only=st.booleans())
def test_the_depth_scan_agrees_with_the_decoded_depth(value: Any, extra: int, ascii_only: bool) -> None:
    for _ in range(extra):
        value = [value, '"]\\'] if extra % 2 else {'k\\"': value}
    body = json.dumps(value, ensure_ascii=ascii_only).encode()
    assert review._too_deep(body) == (depth(value) > review.MAX_DEPTH)


@FUZZ
@given(prefix=st.binary(max_size=300), suffix=st.binary(max_size=300))
def test_the_depth_scan_never_raises_on_any_bytes(prefix: bytes, suffix: bytes) -> None:
    body = prefix + b"[" * 120 + suffix
    try:
        review.parse(body)
    except review.BadReview:
        pass
