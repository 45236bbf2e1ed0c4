"""Node labels for GPU009 in the live webhook: a short TTL cache of the Nodes pods are bound to.

GPU009 decides whether a privileged ephemeral container may join a running pod by the labels of
the Node in the pod's ``spec.nodeName``. Reviews never carry them, so the handler asks this cache
first, and only for the rare request that needs them (``policies.lookups.node_to_look_up``:
an ephemeralcontainers update adding a privileged or SYS_ADMIN container to a bound pod); every
other review costs nothing here.

A miss is one ``get`` on the Node (``ttlcache``: in a worker thread, bounded by ``timeout_s``). A
Node that does not exist, a read that fails or times out: the labels are unknown (None), nothing
is cached, and GPU009 fails closed on them. Found labels are kept ``ttl_s`` seconds; a node
labelled as a GPU node within that window is seen at the next read after it. One get per Node and
TTL, instead of a list/watch of every Node: the webhook needs only ``get``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from webhook.admission import ttlcache

DEFAULT_TTL_S = ttlcache.DEFAULT_TTL_S
DEFAULT_TIMEOUT_S = ttlcache.DEFAULT_TIMEOUT_S

# Reads one Node's labels (blocking); None when the Node does not exist.
Reader = Callable[[str], Mapping[str, str] | None]


@dataclasses.dataclass
class Cache(ttlcache.Cache[str, Mapping[str, str]]):
    """What the Nodes' labels were, for ``ttl_s`` seconds after they were read."""

    policy: str = "GPU009"

    async def labels_for(self, name: str, *, uid: str = "-") -> Mapping[str, str] | None:
        """The Node's labels (cached or read now), or None when they cannot be known in time."""
        return await self.get(name, uid=uid)
