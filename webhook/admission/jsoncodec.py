"""JSON on the review path: ``orjson`` where it gives the same answer, the standard library otherwise.

``orjson`` decodes a review 2-4 times and encodes 5-20 times faster than ``json`` (bench/README.md,
"Webhook against OPA, per core"). It is stricter: it takes UTF-8 only, no lone surrogates, no
number past a double's range; and it reads an integer past 64 bits as a float. So ``loads`` tries
``orjson`` first, unless the body holds 19 digits in a row, and gives every body it refuses to the
standard decoder, whose verdict (a value, or ``ValueError``) stands: a body decodes to what the
standard library makes of it, or is refused as before. ``dumps`` falls back the same way for what
``orjson`` cannot encode (a lone surrogate, an integer past 64 bits).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover - a dependency; the standard library still gives every answer
    orjson = None  # type: ignore[assignment]  # the fallback paths below never touch it then


# orjson reads an integer past 64 bits as a float where json keeps it exact; 19 digits in a row
# (anywhere, strings included: the check must stay C-speed passes, a regex search costs more than
# orjson's whole decode) send a body to the standard one.
_DIGITS_ONLY = bytes(ord("0") if chr(b).isdigit() and b < 128 else ord(" ") for b in range(256))
_NINETEEN_DIGITS = b"0" * 19


def loads(body: bytes, *, fallback: Callable[[bytes], Any]) -> Any:
    """``body`` decoded; ``fallback`` (the standard decoder) where orjson refuses it or might
    read a number differently."""
    if orjson is not None and _NINETEEN_DIGITS not in body.translate(_DIGITS_ONLY):
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
    return fallback(body)


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON of ``value`` (non-ASCII as is; a lone surrogate escaped)."""
    if orjson is not None:
        try:
            return orjson.dumps(value)
        except TypeError:  # orjson.JSONEncodeError: a lone surrogate, an integer past 64 bits
            pass
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")


def dumps_text(value: Any) -> str:
    """``dumps`` as text, for aiohttp's ``json_response(dumps=...)``."""
    return dumps(value).decode("utf-8", "surrogatepass")
