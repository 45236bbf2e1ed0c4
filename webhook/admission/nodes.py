"""Node labels for GPU009 in the live webhook: a short TTL cache of the Nodes pods are bound to.

GPU009 decides whether a privileged ephemeral container may join a running pod by the labels of
the Node in the pod's ``spec.nodeName``. Reviews never carry them, so the handler asks this cache
first, and only for the rare request that needs them (``policies.lookups.node_to_look_up``:
an ephemeralcontainers update adding a privileged or SYS_ADMIN container to a bound pod); every
other review costs nothing here.

A miss is one ``get`` on the Node, in a worker thread (the kubernetes client blocks), bounded by
``timeout_s``. A Node that does not exist, a read that fails or times out: the labels are unknown
(None), nothing is cached, and GPU009 fails closed on them. Found labels are kept ``ttl_s``
seconds; a node labelled as a GPU node within that window is seen at the next read after it.
One get per Node and TTL, instead of a list/watch of every Node: the webhook needs only ``get``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 10.0
DEFAULT_TIMEOUT_S = 1.0

# Reads one Node's labels (blocking); None when the Node does not exist.
Reader = Callable[[str], Mapping[str, str] | None]


@dataclasses.dataclass
class Cache:
    """What the Nodes' labels were, for ``ttl_s`` seconds after they were read."""

    reader: Reader
    ttl_s: float = DEFAULT_TTL_S
    timeout_s: float = DEFAULT_TIMEOUT_S
    clock: Callable[[], float] = time.monotonic
    _entries: dict[str, tuple[float, Mapping[str, str]]] = dataclasses.field(default_factory=dict)

    async def labels_for(self, name: str, *, uid: str = "-") -> Mapping[str, str] | None:
        """The Node's labels (cached or read now), or None when they cannot be known in time."""
        entry = self._entries.get(name)
        now = self.clock()
        if entry is not None and now - entry[0] < self.ttl_s:
            return entry[1]
        try:
            labels = await asyncio.wait_for(asyncio.to_thread(self.reader, name), timeout=self.timeout_s)
        except TimeoutError:
            log.warning("uid=%s Node %s not read within %.1fs; GPU009 judges its labels unknown", uid, name, self.timeout_s)
            return None
        except Exception as error:  # noqa: BLE001 - a failed read only means the labels are unknown
            log.warning("uid=%s cannot read Node %s: %s; GPU009 judges its labels unknown", uid, name, error)
            return None
        if labels is None:
            return None
        self._expire(now)
        self._entries[name] = (self.clock(), labels)
        return labels

    def _expire(self, now: float) -> None:
        for name in [n for n, (at, _) in self._entries.items() if now - at >= self.ttl_s]:
            del self._entries[name]
