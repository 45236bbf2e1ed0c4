"""ConfigMap/Secret data for GPU001 in the live webhook: a short TTL cache, fetched before evaluating.

The engine is pure and calls ``Request.env_lookup`` synchronously, so the webhook never lets it
reach the apiserver: the handler first asks ``Cache.prefetch`` for the sources the object references
(``policies.lookups.env_sources``); misses are read in worker threads (the kubernetes client
blocks), all at once, each bounded by ``timeout_s``; the engine then gets a lookup over what was
found. A source that could not be read in time (or at all) is None, and GPU001 judges it as it does
offline (``envFrom``: admitted where GPU007 is enforced, a warning where it is not). Results, found or not, are kept ``ttl_s`` seconds,
so a burst of pods from one Deployment costs one read.

Secrets are read only when ``kinds`` has them (``serve --lookup-secrets``): reading every Secret in
the cluster is a large privilege for an admission webhook, so by default a Secret is treated as
unreadable (offline judgement) and the ServiceAccount needs no access to Secrets.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping

from policies import model

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 10.0
DEFAULT_TIMEOUT_S = 1.0

# Reads one source (blocking); None when it does not exist or cannot be read.
Reader = Callable[[model.EnvSource], Mapping[str, str] | None]


@dataclasses.dataclass
class Cache:
    """What the ConfigMaps and Secrets held, for ``ttl_s`` seconds after they were read."""

    reader: Reader
    kinds: frozenset[str] = frozenset({"ConfigMap"})  # the rest are never read: GPU001 judges them offline
    ttl_s: float = DEFAULT_TTL_S
    timeout_s: float = DEFAULT_TIMEOUT_S
    clock: Callable[[], float] = time.monotonic
    _entries: dict[model.EnvSource, tuple[float, Mapping[str, str] | None]] = dataclasses.field(default_factory=dict)

    def cached(self, source: model.EnvSource) -> tuple[bool, Mapping[str, str] | None]:
        """(whether a fresh entry exists, its data)."""
        entry = self._entries.get(source)
        if entry is None or self.clock() - entry[0] >= self.ttl_s:
            return False, None
        return True, entry[1]

    async def prefetch(self, sources: Iterable[model.EnvSource]) -> model.EnvLookup:
        """Read what is not cached (in parallel, each bounded in time) and return a lookup over all."""
        wanted = {s for s in sources if s.kind in self.kinds}
        found: dict[model.EnvSource, Mapping[str, str] | None] = {}
        missing: list[model.EnvSource] = []
        for source in wanted:
            fresh, data = self.cached(source)
            if fresh:
                found[source] = data
            else:
                missing.append(source)
        if missing:
            read = await asyncio.gather(*(self._read(s) for s in missing))
            found.update(zip(missing, read, strict=True))
            self._expire()  # only on the slow path: a review served from the cache stays O(sources)
        return lambda source: found.get(source)

    async def _read(self, source: model.EnvSource) -> Mapping[str, str] | None:
        try:
            data = await asyncio.wait_for(asyncio.to_thread(self.reader, source), timeout=self.timeout_s)
        except TimeoutError:
            # Not cached: the next review tries again. The thread ends with the read's own timeout.
            log.warning(
                "uid=- %s %s/%s not read within %.1fs; GPU001 judges it unknown",
                source.kind,
                source.namespace,
                source.name,
                self.timeout_s,
            )
            return None
        except Exception as error:  # noqa: BLE001 - a failed read only means the data is unknown
            log.warning("uid=- cannot read %s %s/%s: %s", source.kind, source.namespace, source.name, error)
            return None
        self._entries[source] = (self.clock(), data)
        return data

    def _expire(self) -> None:
        now = self.clock()
        for source in [s for s, (at, _) in self._entries.items() if now - at >= self.ttl_s]:
            del self._entries[source]
