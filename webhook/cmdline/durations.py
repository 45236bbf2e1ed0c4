"""Durations on the command line: Go-style (`90s`, `10m`, `1h30m`, `500ms`), days (`365d`), or bare seconds."""

from __future__ import annotations

import re

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def seconds(text: str) -> float:
    """The duration in seconds; ValueError (one line naming the text) when it is none or negative."""
    value = text.strip()
    try:
        result = float(value)
    except ValueError:
        parts = _PART.findall(value)
        if not value or "".join(number + unit for number, unit in parts) != value:
            raise ValueError(f"{text!r} is not a duration like 500ms, 30s, 10m, 1h30m or 365d") from None
        result = sum(float(number) * _UNIT_S[unit] for number, unit in parts)
    if not result >= 0 or result == float("inf"):  # NaN and infinity are not durations either
        raise ValueError(f"{text!r} must be a finite duration that is not negative")
    return result
