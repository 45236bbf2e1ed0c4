"""Lease election: one leader, followers write nothing, leadership lapses before anyone may take over."""

from __future__ import annotations

import pytest

from tests.unit.provision.conftest import MemoryLeases
from webhook.kube import leader


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def elector(leases: MemoryLeases, identity: str, clock: Clock) -> leader.Elector:
    return leader.Elector(
        leases,
        namespace="gpu-admission",
        name="certs",
        identity=identity,
        duration_s=15,
        retry_s=5.0,
        clock=clock,
        monotonic=clock,
        labels={"app.kubernetes.io/part-of": "gpu-admission"},
    )


async def test_the_first_replica_creates_the_lease_and_leads_and_the_second_follows(leases: MemoryLeases) -> None:
    clock = Clock()
    first, second = elector(leases, "a", clock), elector(leases, "b", clock)
    assert await first.step() and first.leader
    assert not await second.step() and not second.leader
    assert leases.lease is not None
    assert leases.lease["spec"]["holderIdentity"] == "a"
    assert leases.lease["metadata"]["labels"] == {"app.kubernetes.io/part-of": "gpu-admission"}


async def test_a_follower_takes_over_once_the_holder_stops_renewing_for_the_lease_duration(leases: MemoryLeases) -> None:
    clock = Clock()
    first, second = elector(leases, "a", clock), elector(leases, "b", clock)
    await first.step()
    await second.step()
    clock.now += 14
    assert not await second.step(), "14 s of silence is not yet 15"
    clock.now += 1
    assert await second.step() and second.leader
    assert not first.leader, "the old holder's own deadline (10 s) passed before the takeover"


async def test_leadership_lapses_after_the_renew_deadline_when_renewals_fail(leases: MemoryLeases) -> None:
    clock = Clock()
    one = elector(leases, "a", clock)
    await one.step()
    leases.fail = True
    clock.now += 9
    assert await one.step(), "a failed renewal within the deadline keeps the claim"
    clock.now += 1.5
    assert not await one.step() and not one.leader, "past two thirds of the lease it no longer claims to lead"


async def test_release_hands_the_lease_over_at_once(leases: MemoryLeases) -> None:
    clock = Clock()
    first, second = elector(leases, "a", clock), elector(leases, "b", clock)
    await first.step()
    await second.step()
    await first.release()
    assert not first.leader
    assert await second.step()


async def test_a_write_that_loses_the_race_is_not_leadership(leases: MemoryLeases) -> None:
    clock = Clock()
    first, second = elector(leases, "a", clock), elector(leases, "b", clock)
    assert await first.step()
    original = leases.read

    def stale_read() -> dict[str, object] | None:  # b read before a's renewal landed
        seen = original()
        return (
            None
            if seen is None
            else {
                **seen,
                "metadata": {**seen["metadata"], "resourceVersion": "0"},
                "spec": {**seen["spec"], "holderIdentity": ""},
            }
        )

    leases.read = stale_read  # type: ignore[method-assign]  # a fake that reads stale data
    assert not await second.step() and not second.leader


def test_a_retry_period_as_long_as_the_lease_is_refused(leases: MemoryLeases) -> None:
    with pytest.raises(ValueError, match="retry period"):
        leader.Elector(leases, namespace="n", name="l", identity="a", duration_s=5, retry_s=5)


async def test_a_wall_clock_jump_does_not_let_a_follower_take_over_early(leases: MemoryLeases) -> None:
    wall, steady = Clock(), Clock()
    first = leader.Elector(
        leases, namespace="gpu-admission", name="certs", identity="a", duration_s=15, retry_s=5.0, clock=wall, monotonic=steady
    )
    second = leader.Elector(
        leases, namespace="gpu-admission", name="certs", identity="b", duration_s=15, retry_s=5.0, clock=wall, monotonic=steady
    )
    assert await first.step()
    assert not await second.step()
    wall.now += 3600  # NTP steps the clock an hour forward; only 5 s really passed
    steady.now += 5
    assert not await second.step(), "the holder's silence is timed by the monotonic clock"
    steady.now += 10
    assert await second.step(), "15 s of real silence is a takeover"
