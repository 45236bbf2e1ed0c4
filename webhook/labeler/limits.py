"""Limits that act on a pod above its GPU memory request on a shared card (settings `usageLimits`).

Each fresh pass of the labeler hands its per-pod figures (`podusage.PodCard`) to `Enforcer.step`.
Per pod, by the first `usageLimits` entry that matches its namespace (observe where none does):

- `observe` (the default): a Warning Event `GPUMemoryAboveRequest` on the pod when it goes above
  its request on some card (beyond the tolerance, except on `share` nodes), and a Normal Event
  `GPUMemoryBackUnderRequest` when it is back within it. Nothing else.
- `evict`: the same Events; and once the pod has been above for `gracePeriodSeconds` (counted
  from the first fresh pass that saw it above), an eviction through the Eviction API
  (`pods/<name>/eviction`, with the pod's UID as a precondition, so a new pod of the same name is
  never hit), which honours PodDisruptionBudgets. A Warning Event `GPUMemoryEvicted` says why and
  by how much. When the API refuses (429: a PodDisruptionBudget allows no disruption now; or any
  other error), the refusal is reported once as a Warning Event `GPUMemoryEvictionRefused` with
  the API's reason, counted, and the eviction is tried again after a backoff (`base_s`, doubling,
  at most `cap_s`). Never a delete, never forced.

Never acted on: pods given whole cards (`aliyun.com/gpu`, `whole` figures), pods holding no
allocation through gpu-admission (nothing to compare), and anything on a stale pass (`fresh`
False: the cards or a process's cgroup could not be read, or the pods could not be listed): a
stale pass neither sends Events nor evicts, and keeps each pod's clock as it was.

The limits come from the webhook's settings file (`LimitsFile`): read at start, where bad limits
stop the labeler, and read again when the file changes (the settings ConfigMap, mounted as a
volume, is updated in place), where bad limits are logged and the last good ones stay in force.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from policies import settings
from webhook.config import watched
from webhook.kube import errors as kube_errors
from webhook.labeler import podusage

logger = logging.getLogger(__name__)

ABOVE_REASON = "GPUMemoryAboveRequest"
UNDER_REASON = "GPUMemoryBackUnderRequest"
EVICTED_REASON = "GPUMemoryEvicted"
REFUSED_REASON = "GPUMemoryEvictionRefused"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Target:
    """The pod an Event or an eviction is about."""

    uid: str
    namespace: str
    name: str


class Actions(Protocol):
    """What the enforcer does in the cluster (`publisher.Publisher` in production).

    Both raise `webhook.kube.errors` types: `evict` a `TooManyRequests` when a PodDisruptionBudget
    forbids the eviction now, `NotFound` when the pod is gone.
    """

    def record(self, pod: Target, *, reason: str, message: str, warning: bool) -> None: ...

    def evict(self, pod: Target) -> None: ...


class LimitsFile(watched.SettingsFile[settings.Settings]):
    """The `usageLimits` of a settings file, read again when its bytes change (`watched.SettingsFile`):
    at start bad limits stop the labeler; later they are logged and the last good limits stay. The
    file is looked at only when a limit is asked for (a pod above its request)."""

    def __init__(
        self,
        path: Path,
        *,
        read: Callable[[Path], settings.Settings],
        every_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(
            path,
            read=read,
            what="usage limits",
            describe=lambda found: f" ({len(found.usage_limits)} entries)",
            every_s=every_s,
            clock=clock,
        )

    def usage_limit(self, namespace: str) -> settings.UsageLimit:
        """The limit for a pod of `namespace` under the file as it is now."""
        return self.current().usage_limit(namespace)


@dataclasses.dataclass(kw_only=True)
class _Track:
    over_since: float
    next_try: float = 0.0
    refusals: int = 0
    evicted: bool = False


class Enforcer:
    """Events and evictions for the pods of one node, pass by pass."""

    def __init__(
        self,
        *,
        node: str,
        limit_of: Callable[[str], settings.UsageLimit],
        actions: Actions,
        base_s: float = 10.0,
        cap_s: float = 300.0,
    ) -> None:
        self._node = node
        self._limit_of = limit_of
        self._actions = actions
        self._base_s = base_s
        self._cap_s = cap_s
        self._tracks: dict[str, _Track] = {}
        # For /metrics: Events sent by reason, evictions by result (evicted, refused, failed).
        self.events: dict[str, int] = {}
        self.evictions: dict[str, int] = {}

    def above(self) -> dict[str, float]:
        """The pods above their request now, by UID, with the clock time they went above."""
        return {uid: track.over_since for uid, track in self._tracks.items()}

    def step(self, figures: Sequence[podusage.PodCard], *, fresh: bool, now: float) -> None:
        """Act on one pass's figures (nothing at all when they are stale)."""
        if not fresh:
            return
        by_pod: dict[str, list[podusage.PodCard]] = {}
        for figure in figures:
            by_pod.setdefault(figure.uid, []).append(figure)
        for uid in [uid for uid in self._tracks if uid not in by_pod]:
            del self._tracks[uid]  # the pod is gone (or has no figures any more)
        for uid, cards in sorted(by_pod.items()):
            target = Target(uid=uid, namespace=cards[0].namespace, name=cards[0].name)
            over = [c for c in cards if c.over_mib > 0]
            track = self._tracks.get(uid)
            if not over:
                if track is not None and not track.evicted:
                    self._record(
                        target,
                        UNDER_REASON,
                        f"back within its GPU memory request on node {self._node}: {_figures(cards)}",
                        warning=False,
                    )
                self._tracks.pop(uid, None)
                continue
            if any(c.whole for c in cards):
                continue  # whole cards: theirs (never over; kept for clarity)
            if track is None:
                track = self._tracks[uid] = _Track(over_since=now)
                self._record(
                    target, ABOVE_REASON, f"above its GPU memory request on node {self._node}: {_figures(over)}", warning=True
                )
            limit = self._limit_of(target.namespace)
            if limit.mode != settings.USAGE_EVICT or track.evicted:
                continue
            if now - track.over_since < limit.grace_s or now < track.next_try:
                continue
            self._evict(target, track, over, limit=limit, now=now)

    def _evict(
        self, target: Target, track: _Track, over: list[podusage.PodCard], *, limit: settings.UsageLimit, now: float
    ) -> None:
        why = (
            f"on node {self._node}: {_figures(over)}, for {now - track.over_since:.0f}s "
            f"(usageLimits entry {limit.name!r}: evict after {limit.grace_s}s)"
        )
        try:
            self._actions.evict(target)
        except kube_errors.NotFound:
            self._tracks.pop(target.uid, None)
            return
        except kube_errors.KubeError as error:
            track.refusals += 1
            wait = min(self._cap_s, self._base_s * 2 ** (track.refusals - 1))
            track.next_try = now + wait
            result = "refused" if isinstance(error, kube_errors.TooManyRequests) else "failed"
            self.evictions[result] = self.evictions.get(result, 0) + 1
            logger.warning("evicting pod %s/%s %s: %s; trying again in %.0fs", target.namespace, target.name, result, error, wait)
            if track.refusals == 1:
                self._record(
                    target,
                    REFUSED_REASON,
                    f"eviction {result} ({error.reason}); not forced, tried again with backoff; {why}",
                    warning=True,
                )
            return
        track.evicted = True
        self.evictions["evicted"] = self.evictions.get("evicted", 0) + 1
        logger.warning("evicted pod %s/%s: above its GPU memory request %s", target.namespace, target.name, why)
        self._record(target, EVICTED_REASON, f"evicted: above its GPU memory request {why}", warning=True)

    def _record(self, target: Target, reason: str, message: str, *, warning: bool) -> None:
        try:
            self._actions.record(target, reason=reason, message=message, warning=warning)
        except kube_errors.KubeError as error:
            logger.warning("recording %s on pod %s/%s failed: %s", reason, target.namespace, target.name, error)
            return
        self.events[reason] = self.events.get(reason, 0) + 1


def _figures(cards: Sequence[podusage.PodCard]) -> str:
    parts = []
    for card in cards:
        requested = "?" if card.requested_mib is None else f"{card.requested_mib} MiB"
        excess = f", {card.used_mib - (card.requested_mib or 0)} MiB above" if card.over_mib else ""
        parts.append(f"card {card.card} holds {card.used_mib} MiB of its {requested}{excess}")
    return "; ".join(parts)
