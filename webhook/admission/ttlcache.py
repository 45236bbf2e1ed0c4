"""A short TTL cache of objects the webhook reads one by one while judging a review.

Reviews never carry the Node a pod runs on (GPU009) or the DRA claims it uses (GPU011), so the
handler reads them. A miss is one blocking read in a worker thread, bounded by `timeout_s`; a read
that answers None (the object does not exist, where the reader says so), fails or times out leaves
the value unknown (None) and caches nothing, and the policy fails closed on it. A value read is
kept `ttl_s` seconds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 10.0
DEFAULT_TIMEOUT_S = 1.0

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclasses.dataclass
class Cache(Generic[K, V]):
    """What the objects were, for `ttl_s` seconds after they were read."""

    reader: Callable[[K], V | None]
    ttl_s: float = DEFAULT_TTL_S
    timeout_s: float = DEFAULT_TIMEOUT_S
    clock: Callable[[], float] = time.monotonic
    policy: str = ""  # who fails closed on an unknown value, for the log line
    _entries: dict[K, tuple[float, V]] = dataclasses.field(default_factory=dict)

    async def get(self, key: K, *, uid: str = "-") -> V | None:
        """The value (cached or read now), or None when it cannot be known in time."""
        entry = self._entries.get(key)
        now = self.clock()
        if entry is not None and now - entry[0] < self.ttl_s:
            return entry[1]
        try:
            value = await asyncio.wait_for(asyncio.to_thread(self.reader, key), timeout=self.timeout_s)
        except TimeoutError:
            log.warning("uid=%s %s not read within %.1fs; %s judges it unknown", uid, key, self.timeout_s, self.policy)
            return None
        except Exception as error:  # noqa: BLE001 - a failed read only means the value is unknown
            log.warning("uid=%s cannot read %s: %s; %s judges it unknown", uid, key, error, self.policy)
            return None
        if value is None:
            return None
        for stale in [k for k, (at, _) in self._entries.items() if now - at >= self.ttl_s]:
            del self._entries[stale]
        self._entries[key] = (self.clock(), value)
        return value
