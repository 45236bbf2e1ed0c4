"""Calling the apiserver: what is tried again, how long it waits, when it gives up. Fake sleepers only."""

from __future__ import annotations

import json
import threading
import types
from collections.abc import Callable

import pytest
from kubernetes.client import exceptions as client_exceptions

from webhook.kube import errors, retry

BACKOFF = retry.Backoff(attempts=4, base_s=0.25, cap_s=4.0, max_wait_s=30.0)


def answer(status: int, *, retry_after: str | None = None, message: str = "") -> Exception:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    body = json.dumps({"kind": "Status", "message": message, "code": status}).encode() if message else b""
    return client_exceptions.ApiException(http_resp=types.SimpleNamespace(status=status, reason="", data=body, headers=headers))


class Script:
    """A client call that fails with the given failures in order, then returns "ok"."""

    def __init__(self, *failures: BaseException) -> None:
        self.failures = list(failures)
        self.calls = 0
        self.threads: set[int] = set()

    def __call__(self) -> str:
        self.calls += 1
        self.threads.add(threading.get_ident())
        if self.failures:
            raise self.failures.pop(0)
        return "ok"


class Sleeper:
    def __init__(self) -> None:
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def run(
    script: Script, *, idempotent: bool = True, backoff: retry.Backoff = BACKOFF, jitter: float = 0.5
) -> tuple[str, list[float]]:
    sleeper = Sleeper()
    result = retry.call(
        script, what="cannot read node gpu-0", idempotent=idempotent, backoff=backoff, sleep=sleeper, jitter=lambda: jitter
    )
    return result, sleeper.waits


def test_a_503_is_retried_with_exponential_backoff_and_jitter() -> None:
    script = Script(answer(503), answer(503), answer(503))
    result, waits = run(script, jitter=0.5)
    assert result == "ok" and script.calls == 4
    assert waits == [0.1875, 0.375, 0.75]  # 0.25 * 2**n, each drawn from the upper half: (0.5 + 0.5/2) of it


def test_the_jitter_spreads_each_wait_over_the_upper_half_of_its_step() -> None:
    _, low = run(Script(answer(503)), jitter=0.0)
    _, high = run(Script(answer(503)), jitter=0.999)
    assert low == [0.125] and high[0] == pytest.approx(0.2499, abs=1e-3)


def test_waits_never_grow_past_the_cap() -> None:
    backoff = retry.Backoff(attempts=8, base_s=1.0, cap_s=4.0)
    _, waits = run(Script(*(answer(500) for _ in range(7))), backoff=backoff, jitter=0.999)
    assert max(waits) < 4.0 and waits[-1] == pytest.approx(4.0, abs=0.01)


def test_a_429_is_retried_after_exactly_its_retry_after() -> None:
    script = Script(answer(429, retry_after="3"), answer(429, retry_after="1"))
    result, waits = run(script)
    assert result == "ok" and waits == [3.0, 1.0]


def test_a_429_without_retry_after_backs_off_like_any_retry() -> None:
    _, waits = run(Script(answer(429)), jitter=0.5)
    assert waits == [0.1875]


def test_a_429_is_retried_even_for_a_create_but_a_503_or_lost_connection_is_not() -> None:
    created = Script(answer(429, retry_after="2"))
    assert run(created, idempotent=False) == ("ok", [2.0])
    for failure in (answer(503), ConnectionResetError(104, "Connection reset by peer"), TimeoutError("timed out")):
        script = Script(failure)
        with pytest.raises((errors.ServerError, errors.Unreachable)):
            run(script, idempotent=False)
        assert script.calls == 1


def test_a_lost_connection_or_timeout_is_retried_for_an_idempotent_call() -> None:
    script = Script(ConnectionResetError(104, "Connection reset by peer"), TimeoutError("timed out"))
    assert run(script) == ("ok", [0.1875, 0.375])


@pytest.mark.parametrize(
    ("failure", "kind"),
    [
        (answer(409), errors.Conflict),
        (answer(404), errors.NotFound),
        (answer(400), errors.KubeError),
        (answer(410), errors.Gone),
        (answer(403), errors.KubeError),
    ],
)
def test_conflicts_missing_objects_and_bad_requests_are_never_retried(failure: Exception, kind: type[errors.KubeError]) -> None:
    script = Script(failure)
    sleeper = Sleeper()
    with pytest.raises(kind) as raised:
        retry.call(script, what="cannot write lease a/b", idempotent=True, backoff=BACKOFF, sleep=sleeper)
    assert script.calls == 1 and sleeper.waits == []
    assert type(raised.value) is kind and raised.value.__cause__ is failure
    assert str(raised.value).startswith(f"cannot write lease a/b: {failure.status}")  # type: ignore[attr-defined]  # an ApiException


def test_it_gives_up_after_the_limit_with_the_last_error() -> None:
    backoff = retry.Backoff(attempts=3, base_s=0.25, cap_s=4.0)
    script = Script(
        answer(503, message="etcd leader changed"),
        answer(500, message="storage error"),
        answer(502, message="the last one"),
        answer(503),
    )
    sleeper = Sleeper()
    with pytest.raises(errors.ServerError) as raised:
        retry.call(
            script,
            what="cannot list Pod objects in the cluster",
            idempotent=True,
            backoff=backoff,
            sleep=sleeper,
            jitter=lambda: 0.0,
        )
    assert script.calls == 3 and len(sleeper.waits) == 2
    assert raised.value.status == 502
    assert str(raised.value) == "cannot list Pod objects in the cluster: 502 Bad Gateway: the last one"


def test_a_retry_after_longer_than_the_longest_wait_ends_the_tries_at_once() -> None:
    script = Script(answer(429, retry_after="120"))
    sleeper = Sleeper()
    with pytest.raises(errors.TooManyRequests) as raised:
        retry.call(script, what="x", idempotent=True, backoff=BACKOFF, sleep=sleeper)
    assert script.calls == 1 and sleeper.waits == [] and raised.value.retry_after_s == 120.0


def test_once_means_one_try() -> None:
    script = Script(answer(503))
    with pytest.raises(errors.ServerError):
        run(script, backoff=retry.ONCE)
    assert script.calls == 1


def test_a_kube_error_raised_by_the_call_itself_keeps_its_message_and_is_retried_like_any_other() -> None:
    busy = errors.translate(errors.Answer(status=503, body=b""), what="GET /api/v1/nodes/n")
    missing = errors.NotFound("GET /api/v1/nodes/n: 404 Not Found")
    script = Script(busy, missing)
    with pytest.raises(errors.NotFound) as raised:
        run(script)
    assert script.calls == 2 and raised.value is missing


def test_a_failure_that_is_not_the_clusters_propagates_unchanged_at_once() -> None:
    script = Script(KeyError("metadata"))
    with pytest.raises(KeyError):
        run(script)
    assert script.calls == 1


def test_a_backoff_needs_at_least_one_attempt() -> None:
    with pytest.raises(ValueError, match="at least one attempt"):
        retry.Backoff(attempts=0)


async def test_the_async_flavour_tries_in_a_worker_thread_and_waits_on_the_loop() -> None:
    script = Script(answer(429, retry_after="2"), answer(503))
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    result = await retry.call_async(script, what="x", idempotent=True, backoff=BACKOFF, sleep=sleep, jitter=lambda: 0.5)
    assert result == "ok" and waits == [2.0, 0.375]
    assert threading.get_ident() not in script.threads, "the blocking client call never runs on the event loop's thread"


async def test_the_async_flavour_never_retries_a_conflict() -> None:
    script = Script(answer(409))
    slept: Callable[[float], None] = Sleeper()

    async def sleep(seconds: float) -> None:
        slept(seconds)

    with pytest.raises(errors.Conflict):
        await retry.call_async(script, what="x", idempotent=True, sleep=sleep)
    assert script.calls == 1
