"""Tell kube-scheduler when cards come free that only the extender saw held.

kube-scheduler keeps a pod that no node passed (the extender's filter turned every one away) among
its unschedulable pods and tries it again on a cluster event it watches (a Node update, a Pod
deleted, ...) or after its periodic flush (five minutes by default). While the reservation ledger
lived on the Node, every ledger write was such an event. It lives in a Lease now, which the
scheduler does not watch, so two things free cards without any event the scheduler acts on:

- a ledger entry dropped (a bind that died after its commit expires, or its pod is found gone),
  which changes only the Lease;
- a pod delete the scheduler saw before the extender's own watch did: the scheduler retries at
  once, the extender still counts the pod, turns the retry away, and no further event comes.

So when the store sees cards free up on a node (a counted pod deleted, finished or moved; ledger
entries gone) and the filter has turned a pod away since that node's last nudge, the extender
stamps the Node's `gpu-admission.io/ledger-freed` annotation with the time: a Node update the
scheduler acts on, sent after the extender's cache shows the free, so the retry finds it. At most
one stamp per node per `min_interval`, and none while nothing was turned away: a cluster with no
pending GPU pods sees no Node writes from the extender at all (after a start, at most one per
node: what the process before it turned away is unknown).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable

from policies.gpu import allocation

log = logging.getLogger(__name__)

MIN_INTERVAL_S = 1.0  # at most one stamp per node per second

Stamp = Callable[[str, str], Awaitable[None]]  # (node, timestamp) -> the Node patched


class Nudger:
    """Which nodes to stamp, and when; `run` does the stamping."""

    def __init__(
        self,
        stamp: Stamp,
        *,
        min_interval: float = MIN_INTERVAL_S,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._stamp = stamp
        self._min_interval = min_interval
        self._monotonic = monotonic
        self._wall = wall
        # The last time the filter turned a pod away from some node. A process that just started
        # cannot know what its predecessor turned away: it counts as having refused at its start,
        # so each node's first free after a restart is stamped once.
        self._refused_at = monotonic()
        self._stamped_at: dict[str, float] = {}  # node -> when it was last stamped
        self._due: set[str] = set()
        self._wake = asyncio.Event()
        self.stamped = 0  # Node writes made (for tests and the log)

    def refused(self) -> None:
        """The filter turned a pod away from at least one node."""
        self._refused_at = self._monotonic()

    def freed(self, node: str) -> None:
        """Cards may have come free on `node` (the store saw it)."""
        if self._refused_at > self._stamped_at.get(node, -math.inf):
            self._due.add(node)
            self._wake.set()

    def due(self) -> frozenset[str]:
        return frozenset(self._due)

    async def run(self) -> None:
        """Stamp due nodes until cancelled; a failed stamp is logged and dropped (the scheduler's
        periodic retry remains)."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self.stamp_due()

    async def stamp_due(self) -> None:
        """Stamp every due node whose last stamp is at least `min_interval` old; come back for the rest."""
        now = self._monotonic()
        ready = sorted(n for n in self._due if now - self._stamped_at.get(n, -math.inf) >= self._min_interval)
        for node in ready:
            self._due.discard(node)
            self._stamped_at[node] = self._monotonic()
            try:
                await self._stamp(node, allocation.timestamp(self._wall()))
                self.stamped += 1
            except Exception:  # noqa: BLE001 - a missing nudge only delays a retry
                log.warning("stamping %s after cards came free failed", node, exc_info=True)
        if self._due:
            wait = min(self._stamped_at.get(n, -math.inf) + self._min_interval for n in self._due) - self._monotonic()
            asyncio.get_running_loop().call_later(max(wait, 0.0), self._wake.set)
