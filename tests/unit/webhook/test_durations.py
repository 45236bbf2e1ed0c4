"""Durations on the command line, shared by serve (certificates), audit and the labeler."""

from __future__ import annotations

import pytest

from webhook.cmdline import durations


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90.0), ("10m", 600.0), ("1h30m", 5400.0), ("500ms", 0.5), ("365d", 365 * 86400.0), ("2.5", 2.5), (" 0 ", 0.0)],
)
def test_go_style_durations_days_and_bare_seconds_are_read(text: str, seconds: float) -> None:
    assert durations.seconds(text) == seconds


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is not a duration"),
        ("10 minutes", "is not a duration"),
        ("5x", "is not a duration"),
        ("-3", "not negative"),
        ("nan", "not negative"),
        ("inf", "finite"),
    ],
)
def test_anything_else_is_a_one_line_error_naming_the_text(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        durations.seconds(text)
    assert repr(text) in str(caught.value) and "\n" not in str(caught.value)
