"""webhook.admission.jsoncodec: the fast codec gives the standard library's answer on every body."""

from __future__ import annotations

import json
from typing import Any

import hypothesis
import pytest
from hypothesis import strategies as st

from webhook.admission import jsoncodec, review

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


def standard(body: bytes) -> Any:
    return json.loads(body)


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(value=values)
def test_any_json_value_decodes_as_the_standard_library_decodes_it(value: Any) -> None:
    for body in (json.dumps(value).encode(), json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")):
        try:
            expected = json.loads(body)
        except ValueError:
            with pytest.raises(ValueError):
                jsoncodec.loads(body, fallback=standard)
            continue
        got = jsoncodec.loads(body, fallback=standard)
        assert got == expected and json.dumps(got) == json.dumps(expected)


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(value=values)
def test_encoding_round_trips_through_the_standard_decoder(value: Any) -> None:
    assert json.loads(jsoncodec.dumps(value).decode("utf-8", "surrogatepass")) == value


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"s": "\\ud800"}', {"s": "\ud800"}),  # a lone surrogate: orjson refuses, json keeps it
        (b'{"n": 123456789012345678901234567890}', {"n": 123456789012345678901234567890}),  # past 64 bits
        ('{"a": "é"}'.encode("utf-16"), {"a": "é"}),  # UTF-16 with a BOM
        (b'\xef\xbb\xbf{"a": 1}', {"a": 1}),  # UTF-8 with a BOM
        (b'{"a": 1, "a": 2}', {"a": 2}),  # the last duplicate wins either way
        (b'{"n": 18446744073709551616}', {"n": 18446744073709551616}),  # orjson would read a float
        (b'{"x": 1e400}', {"x": float("inf")}),  # past a double: orjson refuses, json reads inf
    ],
)
def test_bodies_orjson_refuses_are_decoded_by_the_standard_library(body: bytes, expected: Any) -> None:
    assert review._standard_loads(body) == expected  # noqa: SLF001 - the fallback the webhook uses
    assert jsoncodec.loads(body, fallback=review._standard_loads) == expected  # noqa: SLF001


@pytest.mark.parametrize("body", [b'{"a": NaN}', b'{"a": Infinity}', b"{'a': 1}", b'{"a": 1,}', b"\xff\xfe\xfd"])
def test_what_neither_accepts_is_still_a_bad_review(body: bytes) -> None:
    with pytest.raises(review.BadReview):
        review.parse(body)


def test_dumps_falls_back_for_what_orjson_cannot_encode() -> None:
    assert jsoncodec.dumps({"s": "\ud800"}) == '{"s":"\ud800"}'.encode("utf-8", "surrogatepass")
    assert jsoncodec.dumps([2**70]) == b"[1180591620717411303424]"
    assert jsoncodec.dumps({"é": [1, 1.5, None, True]}) == '{"é":[1,1.5,null,true]}'.encode()
