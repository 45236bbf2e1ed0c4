"""Leader election over a coordination.k8s.io/v1 Lease, as a pure step function (client-go's rules).

`step(lease, ...)` looks at the Lease as read and says whether this replica leads and what to
write. Expiry is judged by *this* replica's clock from the moment it observed the holder's last
renewal (as client-go does), never by comparing another machine's `renewTime` with ours, so skewed
clocks cannot make two leaders. That local clock is ``monotonic`` where the caller gives one (a
wall clock set back or forward then changes nothing); ``now``, the wall clock, only fills in
`renewTime` and `acquireTime`. A replica:

- creates the Lease when there is none, and leads;
- renews it while it holds it (`renewTime` = now);
- takes it over when the holder is empty, or when the record has not changed for
  `leaseDurationSeconds` of local time since it was first seen (`leaseTransitions` + 1);
- otherwise follows, writing nothing.

A write that loses the race (HTTP 409) means another replica wrote first: follow until the next step.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any

DEFAULT_DURATION_S = 15
DEFAULT_RETRY_S = 5.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Election:
    """Which Lease, who we are, and how long a holder's claim lasts."""

    namespace: str
    name: str
    identity: str
    duration_s: int = DEFAULT_DURATION_S


@dataclasses.dataclass(frozen=True, kw_only=True)
class Observation:
    """The holder's record as last seen and the local (monotonic) time it was first seen like that."""

    record: tuple[str, str, int]  # holderIdentity, renewTime, leaseTransitions
    seen_at: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class Step:
    """What to do now: whether we lead if the write (if any) succeeds, and the Lease to write."""

    leader: bool
    write: dict[str, Any] | None = None
    create: bool = False
    observation: Observation | None = None


def micro_time(unix: float) -> str:
    """A metav1.MicroTime: RFC 3339 UTC with microseconds."""
    moment = datetime.datetime.fromtimestamp(unix, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _spec(lease: Mapping[str, Any] | None) -> Mapping[str, Any]:
    spec = (lease or {}).get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _record(spec: Mapping[str, Any]) -> tuple[str, str, int]:
    transitions = spec.get("leaseTransitions")
    return (
        str(spec.get("holderIdentity") or ""),
        str(spec.get("renewTime") or ""),
        transitions if isinstance(transitions, int) else 0,
    )


def _held(election: Election, *, now: float, acquired: str, transitions: int, duration_s: int) -> dict[str, Any]:
    return {
        "holderIdentity": election.identity,
        "leaseDurationSeconds": duration_s,
        "acquireTime": acquired,
        "renewTime": micro_time(now),
        "leaseTransitions": transitions,
    }


def step(
    lease: Mapping[str, Any] | None,
    *,
    election: Election,
    now: float,
    observed: Observation | None,
    monotonic: float | None = None,
) -> Step:
    """Decide from the Lease as just read (None: it does not exist). ``monotonic`` times the
    holder's silence (``now`` when not given)."""
    local = now if monotonic is None else monotonic
    if lease is None:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"namespace": election.namespace, "name": election.name},
            "spec": _held(election, now=now, acquired=micro_time(now), transitions=0, duration_s=election.duration_s),
        }
        return Step(leader=True, write=body, create=True)
    spec = _spec(lease)
    record = _record(spec)
    holder, _, transitions = record
    observation = observed if observed is not None and observed.record == record else Observation(record=record, seen_at=local)
    duration = spec.get("leaseDurationSeconds")
    duration_s = duration if isinstance(duration, int) and duration > 0 else election.duration_s
    if holder == election.identity:
        acquired = str(spec.get("acquireTime") or micro_time(now))
        renewed = _held(election, now=now, acquired=acquired, transitions=transitions, duration_s=election.duration_s)
        return Step(leader=True, write=_with_spec(lease, renewed), observation=observation)
    expired = not holder or observation.seen_at + duration_s <= local
    if expired:
        taken = _held(election, now=now, acquired=micro_time(now), transitions=transitions + 1, duration_s=election.duration_s)
        return Step(leader=True, write=_with_spec(lease, taken), observation=observation)
    return Step(leader=False, observation=observation)


def release(lease: Mapping[str, Any] | None, *, election: Election, now: float) -> dict[str, Any] | None:
    """The Lease to write when stepping down (holder cleared, so another replica takes over at once);
    None when we do not hold it."""
    spec = _spec(lease)
    if lease is None or spec.get("holderIdentity") != election.identity:
        return None
    cleared = dict(spec)
    cleared.update({"holderIdentity": None, "leaseDurationSeconds": 1, "renewTime": micro_time(now)})
    return _with_spec(lease, cleared)


def _with_spec(lease: Mapping[str, Any], spec: Mapping[str, Any]) -> dict[str, Any]:
    """The Lease with a new spec, keeping metadata (resourceVersion makes the replace conditional)."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": dict(lease.get("metadata") or {}),
        "spec": dict(spec),
    }
