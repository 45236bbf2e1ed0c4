"""Calling the apiserver: one try or several, with exponential backoff and jitter where a retry is safe.

    found = retry.call(lambda: core.read_node(name), what=f"cannot read node {name}", idempotent=True)
    found = await retry.call_async(lambda: core.read_node(name), what=..., idempotent=True)

Either returns the call's result or raises the `webhook.kube.errors` type of its failure (one
line, starting with ``what``). What is tried again (`retryable`):

- 429 Too Many Requests, always: the apiserver refused the request before running it. A
  Retry-After is honoured; one longer than ``Backoff.max_wait_s`` ends the tries (the caller's own
  loop comes back later).
- 5xx and no answer (reset, timeout), only when the caller says the call is ``idempotent``: a
  read, or a write that does the same thing twice (a merge patch of fixed values, a delete) or is
  guarded by a resourceVersion or UID precondition (a repeat that lost is then a 409). A create is
  not: it may have happened before the answer was lost.
- Never: 409 Conflict (read again and decide again: the caller's business), 404, 410, 400, 403, ....

Waits grow as ``base_s * 2**n`` up to ``cap_s``, each drawn from the upper half of that ("equal
jitter"), so replicas that failed together do not come back together. ``call_async`` runs each
try in a worker thread (the `kubernetes` client blocks) and waits on the event loop between tries.
Both take the sleeper and the jitter source as arguments (tests pass fakes: no real sleeping).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from webhook.kube import errors

log = logging.getLogger(__name__)

_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Backoff:
    """How many tries in all (the first included) and how long to wait between them."""

    attempts: int = 4
    base_s: float = 0.25
    cap_s: float = 4.0
    max_wait_s: float = 30.0  # a longer Retry-After ends the tries

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.base_s < 0 or self.cap_s < self.base_s:
            raise ValueError("a backoff needs at least one attempt and 0 <= base_s <= cap_s")

    def wait_s(self, retry: int, error: errors.KubeError, *, jitter: float) -> float | None:
        """Seconds to wait before retry number ``retry`` (1, 2, ...) after ``error``; None: do not retry.
        ``jitter`` is uniform in [0, 1)."""
        if error.retry_after_s is not None:
            return error.retry_after_s if error.retry_after_s <= self.max_wait_s else None
        ceiling = min(self.cap_s, self.base_s * 2.0 ** (retry - 1))
        return ceiling * (0.5 + jitter / 2)


DEFAULT = Backoff()
ONCE = Backoff(attempts=1)  # for calls whose caller retries on its own clock (lease renewals, hot-path reads)


def retryable(error: errors.KubeError, *, idempotent: bool) -> bool:
    """Whether a failed call may be sent again (see the module's docstring)."""
    if isinstance(error, errors.TooManyRequests):
        return True
    return idempotent and isinstance(error, (errors.ServerError, errors.Unreachable))


def call(
    function: Callable[[], _T],
    *,
    what: str,
    idempotent: bool,
    backoff: Backoff = DEFAULT,
    sleep: Callable[[float], None] = time.sleep,
    jitter: Callable[[], float] = random.random,
) -> _T:
    """``function()`` (blocking), tried again as `retryable` allows; raises the `errors` type of the last failure."""
    retry = 0
    while True:
        try:
            return function()
        except Exception as failure:
            wait = _next_wait(failure, retry=retry + 1, what=what, idempotent=idempotent, backoff=backoff, jitter=jitter)
        sleep(wait)
        retry += 1


async def call_async(
    function: Callable[[], _T],
    *,
    what: str,
    idempotent: bool,
    backoff: Backoff = DEFAULT,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    jitter: Callable[[], float] = random.random,
) -> _T:
    """`call` for coroutines: each try of the blocking ``function`` in a worker thread, the waits on the loop."""
    retry = 0
    while True:
        try:
            return await asyncio.to_thread(function)
        except Exception as failure:
            wait = _next_wait(failure, retry=retry + 1, what=what, idempotent=idempotent, backoff=backoff, jitter=jitter)
        await sleep(wait)
        retry += 1


def _next_wait(
    failure: Exception, *, retry: int, what: str, idempotent: bool, backoff: Backoff, jitter: Callable[[], float]
) -> float:
    """The wait before the next try; raises the translated failure when there is none."""
    if not errors.recognised(failure):
        raise failure  # not the cluster's: a bug or the caller's own error, unchanged
    error = errors.translate(failure, what=what)
    wait = (
        backoff.wait_s(retry, error, jitter=jitter())
        if retry < backoff.attempts and retryable(error, idempotent=idempotent)
        else None
    )
    if wait is None:
        if error is failure:
            raise error
        raise error from failure
    log.info("uid=- %s; try %d of %d in %.2f s", error, retry + 1, backoff.attempts, wait)
    return wait
