"""The optional health endpoint: live while the loop passes, ready after the first pass."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from webhook.labeler import health, inventory, runner
from webhook.serving import metrics


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def loop(fake_nodes: Any, node: Callable[..., Any], cards_of: Callable[..., inventory.Inventory], clock: Clock) -> runner.Runner:
    inv = cards_of(1)
    return runner.Runner(
        source=lambda: inv, nodes=fake_nodes(node("gpu-0")), options=runner.Options(node_name="gpu-0", interval_s=10), clock=clock
    )


@pytest.fixture
def base_url(loop: runner.Runner, clock: Clock) -> Iterator[str]:
    server = health.serve(loop, port=0, host="127.0.0.1", clock=clock)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_not_ready_before_the_first_pass_but_live(base_url: str) -> None:
    assert get(base_url + "/readyz")[0] == 503
    assert get(base_url + "/healthz") == (200, "ok starting\n")


def test_ready_and_live_after_a_pass(base_url: str, loop: runner.Runner) -> None:
    loop.step()
    assert get(base_url + "/readyz") == (200, "ready\n")
    assert get(base_url + "/healthz") == (200, "ok changed\n")


def test_a_stalled_loop_is_not_live(base_url: str, loop: runner.Runner, clock: Clock) -> None:
    loop.step()
    clock.now += 3 * 10 + health.GRACE_S + 1
    assert get(base_url + "/healthz")[0] == 503


def test_unknown_paths_are_404(base_url: str) -> None:
    assert get(base_url + "/nothing")[0] == 404


def test_metrics_give_the_last_successful_write_and_passes_by_outcome(
    fake_nodes: Any, node: Callable[..., Any], cards_of: Callable[..., inventory.Inventory], clock: Clock
) -> None:
    wall = [1_700_000_000.0]
    reads: list[inventory.Inventory | Exception] = [cards_of(1), inventory.InventoryError("torn file"), cards_of(1)]

    def source() -> inventory.Inventory:
        item = reads.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    loop = runner.Runner(
        source=source,
        nodes=fake_nodes(node("gpu-0")),
        options=runner.Options(node_name="gpu-0", interval_s=10),
        clock=clock,
        wall_clock=lambda: wall[0],
    )
    assert metrics.sample(health.registry(loop).render(), health.LAST_SUCCESS_METRIC) is None  # no pass yet: no age to alert on
    assert loop.step() is runner.Outcome.CHANGED
    wall[0] += 10
    assert loop.step() is runner.Outcome.READ_FAILED  # the last good labels again: not a success
    text = health.registry(loop).render()
    assert metrics.sample(text, health.LAST_SUCCESS_METRIC) == 1_700_000_000.0
    assert metrics.sample(text, health.PASSES_METRIC, outcome="changed") == 1
    assert metrics.sample(text, health.PASSES_METRIC, outcome="read-failed") == 1
    assert metrics.sample(text, health.PASSES_METRIC, outcome="api-failed") == 0
    wall[0] += 10
    assert loop.step() is runner.Outcome.UNCHANGED
    assert metrics.sample(health.registry(loop).render(), health.LAST_SUCCESS_METRIC) == 1_700_000_020.0


def test_metrics_are_served_in_the_text_format(base_url: str, loop: runner.Runner) -> None:
    loop.step()
    status, text = get(base_url + "/metrics")
    assert status == 200
    assert metrics.sample(text, health.PASSES_METRIC, outcome="changed") == 1
    assert any(name == metrics.BUILD_INFO for name, _ in metrics.samples(text))
