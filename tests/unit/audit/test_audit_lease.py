"""Lease election steps: create, renew, follow, take over after a locally observed expiry, release."""

from __future__ import annotations

from typing import Any

from webhook.kube import lease

ME = lease.Election(namespace="gpu-admission", name="gpu-admission-audit", identity="me", duration_s=15)
OTHER = lease.Election(namespace="gpu-admission", name="gpu-admission-audit", identity="other", duration_s=15)


def held_by(holder: str | None, *, renew: str = "2025-06-15T15:00:00.000000Z", transitions: int = 3) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"namespace": "gpu-admission", "name": "gpu-admission-audit", "resourceVersion": "12"},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": 15,
            "renewTime": renew,
            "acquireTime": "2025-06-15T14:00:00.000000Z",
            "leaseTransitions": transitions,
        },
    }


def test_no_lease_means_create_it_and_lead() -> None:
    step = lease.step(None, election=ME, now=100.0, observed=None)
    assert step.leader and step.create and step.write is not None
    assert step.write["metadata"] == {"namespace": "gpu-admission", "name": "gpu-admission-audit"}
    assert step.write["spec"]["holderIdentity"] == "me"
    assert step.write["spec"]["leaseTransitions"] == 0
    assert step.write["spec"]["renewTime"] == "1970-01-01T00:01:40.000000Z"


def test_the_holder_renews_keeping_acquire_time_and_resource_version() -> None:
    step = lease.step(held_by("me"), election=ME, now=100.0, observed=None)
    assert step.leader and not step.create and step.write is not None
    assert step.write["metadata"]["resourceVersion"] == "12"  # a conditional replace
    assert step.write["spec"]["acquireTime"] == "2025-06-15T14:00:00.000000Z"
    assert step.write["spec"]["renewTime"] == lease.micro_time(100.0)
    assert step.write["spec"]["leaseTransitions"] == 3


def test_another_holders_fresh_lease_is_followed_without_writing() -> None:
    step = lease.step(held_by("other"), election=ME, now=100.0, observed=None)
    assert not step.leader and step.write is None
    assert step.observation == lease.Observation(record=("other", "2025-06-15T15:00:00.000000Z", 3), seen_at=100.0)


def test_expiry_is_judged_by_the_local_clock_since_the_record_was_first_seen() -> None:
    first = lease.step(held_by("other"), election=ME, now=100.0, observed=None)
    # The holder's renewTime is far in the past by our clock, yet we only take over once the record
    # has stood still for a whole lease duration of *our* time.
    still = lease.step(held_by("other"), election=ME, now=114.0, observed=first.observation)
    assert not still.leader
    taken = lease.step(held_by("other"), election=ME, now=115.0, observed=still.observation)
    assert taken.leader and taken.write is not None
    assert taken.write["spec"]["holderIdentity"] == "me"
    assert taken.write["spec"]["leaseTransitions"] == 4


def test_a_renewal_by_the_holder_restarts_the_wait() -> None:
    first = lease.step(held_by("other"), election=ME, now=100.0, observed=None)
    renewed = lease.step(
        held_by("other", renew="2025-06-15T15:00:10.000000Z"), election=ME, now=114.0, observed=first.observation
    )
    assert renewed.observation is not None and renewed.observation.seen_at == 114.0
    assert not lease.step(
        held_by("other", renew="2025-06-15T15:00:10.000000Z"), election=ME, now=120.0, observed=renewed.observation
    ).leader


def test_an_empty_holder_is_taken_at_once() -> None:
    step = lease.step(held_by(None), election=ME, now=100.0, observed=None)
    assert step.leader and step.write is not None and step.write["spec"]["holderIdentity"] == "me"


def test_release_clears_the_holder_only_when_we_hold_it() -> None:
    released = lease.release(held_by("me"), election=ME, now=100.0)
    assert released is not None
    assert released["spec"]["holderIdentity"] is None and released["spec"]["leaseDurationSeconds"] == 1
    assert lease.release(held_by("other"), election=ME, now=100.0) is None
    assert lease.release(None, election=ME, now=100.0) is None
    # After a release the other replica does not wait for the lease to expire.
    assert lease.step(released, election=OTHER, now=100.5, observed=None).leader
