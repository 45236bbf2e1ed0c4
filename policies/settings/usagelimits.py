"""`usageLimits`: what the labeler does about a pod above its GPU memory request on a shared card."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from policies.settings import selection, shapes

USAGE_OBSERVE = "observe"  # usageLimits modes: an Event when a pod goes above its request and back
USAGE_EVICT = "evict"  # the Event, then the Eviction API after the grace period
USAGE_MODES = (USAGE_OBSERVE, USAGE_EVICT)
DEFAULT_USAGE_GRACE_S = 300


@dataclasses.dataclass(frozen=True, kw_only=True)
class UsageLimit:
    """`usageLimits`: what the labeler does about pods above their request in the namespaces `match` selects."""

    name: str
    match: selection.NamespaceMatch
    mode: str = USAGE_OBSERVE
    grace_s: int = DEFAULT_USAGE_GRACE_S


DEFAULT_USAGE_LIMIT = UsageLimit(name="default", match=selection.NamespaceMatch(), mode=USAGE_OBSERVE)


def usage_limits_of(data: Mapping[str, Any] | None) -> tuple[UsageLimit, ...]:
    """Only the `usageLimits` of a settings document (what the labeler reads of the same file; the
    rest is the webhook's and may name user policies the labeler does not load)."""
    if data is not None and not isinstance(data, Mapping):
        raise shapes.InvalidSettings(f"settings: must be a mapping, got {type(data).__name__}")
    return usage_limits((data or {}).get("usageLimits"))


def usage_limits(value: object) -> tuple[UsageLimit, ...]:
    if value is None:
        return ()
    found: list[UsageLimit] = []
    known = ("name", "namespaces", "namespaceSelector", "mode", "gracePeriodSeconds")
    for field, entry in shapes.entries(value, field="usageLimits", known=known):
        name, match = selection.anchored_entry(entry, field=field)
        mode = entry.get("mode", USAGE_OBSERVE)
        if mode not in USAGE_MODES:
            raise shapes.InvalidSettings(f"{field}.mode: must be one of {', '.join(USAGE_MODES)}, got {mode!r}")
        grace = entry.get("gracePeriodSeconds", DEFAULT_USAGE_GRACE_S)
        if not isinstance(grace, int) or isinstance(grace, bool) or grace < 0:
            raise shapes.InvalidSettings(f"{field}.gracePeriodSeconds: must be a whole number of seconds >= 0, got {grace!r}")
        found.append(UsageLimit(name=name, match=match, mode=mode, grace_s=grace))
    return tuple(found)
