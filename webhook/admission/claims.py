"""DRA claims for GPU011 in the live webhook: a short TTL cache of the ResourceClaims and
ResourceClaimTemplates pods name.

GPU011 judges a pod by the claims it uses (`policies.lookups.claims_to_look_up`), which reviews
never carry. Only a pod (or workload template) with `spec.resourceClaims` asks; every other review
costs nothing here. A miss is one `get` per object, in a worker thread, bounded by `timeout_s`; the
reads of one review run together. An object that does not exist reads as an empty mapping (it will
be judged when it is written); a read that fails or times out leaves it unknown (None), nothing is
cached, and GPU011 fails closed on it. Found objects are kept `ttl_s` seconds: a claim's spec is
immutable, and a template's change is judged by GPU011 itself when it is written.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 10.0
DEFAULT_TIMEOUT_S = 1.0

Key = tuple[str, str]  # (kind, name)
# Reads one object (blocking): (namespace, kind, name) -> the object, or {} where it does not exist.
Reader = Callable[[str, str, str], Mapping[str, Any]]


@dataclasses.dataclass
class Cache:
    """What the claims were, for `ttl_s` seconds after they were read."""

    reader: Reader
    ttl_s: float = DEFAULT_TTL_S
    timeout_s: float = DEFAULT_TIMEOUT_S
    clock: Callable[[], float] = time.monotonic
    _entries: dict[tuple[str, str, str], tuple[float, Mapping[str, Any]]] = dataclasses.field(default_factory=dict)

    async def fetch(self, namespace: str, wanted: Iterable[Key], *, uid: str = "-") -> dict[Key, Mapping[str, Any] | None]:
        """Each wanted (kind, name) in `namespace`: the object, {} where absent, None where unknown."""
        keys = sorted(set(wanted))
        found = await asyncio.gather(*(self._one(namespace, kind, name, uid=uid) for kind, name in keys))
        return dict(zip(keys, found))

    async def _one(self, namespace: str, kind: str, name: str, *, uid: str) -> Mapping[str, Any] | None:
        key = (namespace, kind, name)
        now = self.clock()
        entry = self._entries.get(key)
        if entry is not None and now - entry[0] < self.ttl_s:
            return entry[1]
        try:
            obj = await asyncio.wait_for(asyncio.to_thread(self.reader, namespace, kind, name), timeout=self.timeout_s)
        except TimeoutError:
            log.warning("uid=%s %s %s/%s not read within %.1fs; GPU011 judges it unknown", uid, kind, namespace, name, self.timeout_s)
            return None
        except Exception as error:  # noqa: BLE001 - a failed read only means the claim is unknown
            log.warning("uid=%s cannot read %s %s/%s: %s; GPU011 judges it unknown", uid, kind, namespace, name, error)
            return None
        for stale in [k for k, (at, _) in self._entries.items() if now - at >= self.ttl_s]:
            del self._entries[stale]
        self._entries[key] = (self.clock(), obj)
        return obj
