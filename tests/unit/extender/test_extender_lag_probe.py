"""The debug-level event-loop lag probe: a loop held past its timer is logged with how late it ran."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from webhook.extender import cli


async def test_a_held_loop_is_logged_with_how_late_it_ran(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=cli.log.name)
    probe = asyncio.create_task(cli._lag_probe())
    try:
        await asyncio.sleep(cli.LAG_PROBE_S)
        time.sleep(0.2)  # noqa: ASYNC251 - holds the loop past the probe's timer, on purpose
        await asyncio.sleep(cli.LAG_PROBE_S * 2)
    finally:
        probe.cancel()
    late = [r.getMessage() for r in caplog.records if "event loop" in r.getMessage()]
    assert late and all(m.endswith("ms late") for m in late)
    assert max(int(m.split()[2]) for m in late) >= 100
