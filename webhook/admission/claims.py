"""DRA claims for GPU011 in the live webhook: a short TTL cache of the ResourceClaims and
ResourceClaimTemplates pods name.

GPU011 judges a pod by the claims it uses (`policies.lookups.claims_to_look_up`), which reviews
never carry. Only a pod (or workload template) with `spec.resourceClaims` asks; every other review
costs nothing here. A miss is one `get` per object (`ttlcache`: in a worker thread, bounded by
`timeout_s`); the reads of one review run together. An object that does not exist reads as an
empty mapping (it will be judged when it is written); a read that fails or times out leaves it
unknown (None), nothing is cached, and GPU011 fails closed on it. Found objects are kept `ttl_s`
seconds: a claim's spec is immutable, and a template's change is judged by GPU011 itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from webhook.admission import ttlcache

DEFAULT_TIMEOUT_S = ttlcache.DEFAULT_TIMEOUT_S

Key = tuple[str, str]  # (kind, name)
# Reads one object (blocking): (namespace, kind, name) -> the object, or {} where it does not exist.
Reader = Callable[[tuple[str, str, str]], Mapping[str, Any]]


@dataclasses.dataclass
class Cache(ttlcache.Cache[tuple[str, str, str], Mapping[str, Any]]):
    """What the claims were, for `ttl_s` seconds after they were read."""

    policy: str = "GPU011"

    async def fetch(self, namespace: str, wanted: Iterable[Key], *, uid: str = "-") -> dict[Key, Mapping[str, Any] | None]:
        """Each wanted (kind, name) in `namespace`: the object, {} where absent, None where unknown."""
        keys = sorted(set(wanted))
        found = await asyncio.gather(*(self.get((namespace, kind, name), uid=uid) for kind, name in keys))
        return dict(zip(keys, found, strict=True))
