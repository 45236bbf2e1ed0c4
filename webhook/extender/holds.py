"""Writes the preempt verb's records (`preemption.Hold`) to a node's hold Lease, so that the card
a preemption freed stays held for its preemptor across what clears kube-scheduler's nomination
(an extender restart, a failed bind).

A record is written when the store first sees a pod nominated to a node (`Store.on_nominated`):
kube-scheduler picks one of the nodes the verb answered and nominates the pod there, so only that
node gets a record (writing one per node answered would hold cards where nobody was evicted, and
cost a write per candidate). Its victims: the pods on the node answered to this preemptor by the
verb (`promised`, per process) or being deleted already, of lower priority than the preemptor;
with none, nothing is written (there is nothing a record would add to the nomination).

The Lease lives in the ledger namespace beside the ledger Leases (their label, their watch, their
Role: get, create, update), one per node, owned by its Node. A write is a compare-and-swap on the
Lease's resourceVersion: read (the cache's copy first, the apiserver's after a conflict), add the
record, drop those past `preemption.HOLD_MAX_S`, create or replace. Two replicas answering
preemptions on one node at once each retry on the 409 and keep the other's record. The store takes
the written Lease at once (`Store.put_hold_lease`), so the hold stands before the watch brings it.

Filter's side of the holds is here too: `judge_fits` and `held_states` judge the candidate nodes
with the cards held there (`Store.with_holds`), where any pod is nominated or any record stands.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from policies import podspec
from policies.gpu import cardrequest, cards
from webhook.extender import placement, preemption
from webhook.extender import store as store_module
from webhook.kube import errors as kube_errors
from webhook.kube import leasewrite

log = logging.getLogger(__name__)

ATTEMPTS = 4
# How often a node's hold Lease whose records have all passed `preemption.HOLD_MAX_S` is emptied
# (the extender may not delete Leases; an empty one costs nothing, and filter skips its node).
TIDY_S = 60.0


class LeaseApi(leasewrite.Leases, Protocol):
    async def get_lease(self, namespace: str, name: str) -> dict[str, Any]: ...


class Recorder:
    """`record(hold, now=...)`: the record in its node's hold Lease."""

    def __init__(
        self,
        api: LeaseApi,
        cache: store_module.Store,
        *,
        namespace: str,
        promised: Callable[[str], frozenset[str]] = lambda uid: frozenset(),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._api = api
        self._cache = cache
        self._namespace = namespace
        self._promised = promised
        self._clock = clock
        self._waiting: dict[str, str] = {}  # preemptor UID -> the node it was seen nominated to
        self._wake = asyncio.Event()

    def nominated(self, uid: str, node: str) -> None:
        """The store saw `uid` nominated to `node` (on the event loop's thread): record it soon."""
        self._waiting[uid] = node
        self._wake.set()

    async def run(self) -> None:
        """Write the records of the nominations seen, one at a time, and empty the Leases whose
        records are all past, until cancelled."""
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=TIDY_S)
            except TimeoutError:
                try:
                    await self.tidy()
                except Exception:  # noqa: BLE001 - a Lease left full only costs filter a little; the loop goes on
                    log.warning("cannot tidy the preemption hold Leases", exc_info=True)
                continue
            self._wake.clear()
            while self._waiting:
                uid, node = self._waiting.popitem()
                try:
                    await self.record_nomination(uid, node)
                except Exception:  # noqa: BLE001 - a failed record leaves the nomination's own hold; the loop goes on
                    log.warning("cannot record the preemption hold of %s on %s", uid, node, exc_info=True)

    def hold_of(self, uid: str, node: str, *, now: float) -> preemption.Hold | None:
        """The record for `uid` nominated to `node`, from the live pods; None where there is none to
        write (the pod no longer waits there, or no victim of its preemption is on the node)."""
        pod = self._cache.pod(uid)
        if pod is None or preemption.nominated_node(pod) != node or preemption.never_preempts(pod):
            return None
        priority = preemption.priority_of(pod)
        promised = self._promised(uid)
        victims = frozenset(
            other_uid
            for other in self._cache.pods_on(node)
            if (other_uid := str(podspec.mapping(other.get("metadata")).get("uid", "")))
            and preemption.priority_of(other) < priority
            and (other_uid in promised or podspec.mapping(other.get("metadata")).get("deletionTimestamp") is not None)
        )
        if not victims:
            return None
        metadata = podspec.mapping(pod.get("metadata"))
        return preemption.Hold(
            uid=uid,
            namespace=str(metadata.get("namespace", "")),
            name=str(metadata.get("name", "")),
            node=node,
            priority=priority,
            victims=victims,
            at=now,
        )

    async def record_nomination(self, uid: str, node: str) -> bool:
        """Write the record of `uid` nominated to `node` (`hold_of`); False where there is none."""
        now = self._clock()
        hold = self.hold_of(uid, node, now=now)
        if hold is None:
            return False
        await self.record(hold, now=now)
        log.info("holding a card on %s for %s/%s (victims %s)", node, hold.namespace, hold.name, ", ".join(sorted(hold.victims)))
        return True

    async def tidy(self) -> int:
        """Empty the hold Leases whose records are all past HOLD_MAX_S; how many were emptied."""
        now = self._clock()
        emptied = 0
        for node, records in list(self._cache.hold_nodes().items()):
            if all(record.at + preemption.HOLD_MAX_S <= now for record in records.values()):
                await self._write(
                    node, lambda current: {uid: r for uid, r in current.items() if r.at + preemption.HOLD_MAX_S > now}
                )
                emptied += 1
        return emptied

    async def record(self, hold: preemption.Hold, *, now: float) -> None:
        await self._write(hold.node, lambda current: preemption.with_hold(current, hold, now=now))

    async def _write(self, node: str, change: Callable[[Mapping[str, preemption.Hold]], Mapping[str, preemption.Hold]]) -> None:
        """The node's hold Lease with `change` applied to its records, by compare-and-swap."""
        name = preemption.hold_lease_name(node)
        lease: Mapping[str, Any] | None = self._cache.hold_lease(node)
        current: Mapping[str, preemption.Hold] = self._cache.hold_nodes().get(node, {})
        for attempt in range(ATTEMPTS):
            if attempt:
                try:
                    lease = await self._api.get_lease(self._namespace, name)
                except kube_errors.NotFound:
                    lease = None
                text = (
                    podspec.mapping(podspec.mapping(lease.get("metadata")).get("annotations")).get(preemption.HOLDS_ANNOTATION)
                    if lease
                    else None
                )
                current = preemption.read_holds(text, node=node)
            node_uid = str(podspec.mapping((self._cache.node(node) or {}).get("metadata")).get("uid", ""))
            body = preemption.hold_lease_body(node, node_uid, change(current), namespace=self._namespace)
            try:
                written = await leasewrite.write(self._api, self._namespace, body, read=lease)
            except (kube_errors.Conflict, kube_errors.NotFound):
                continue  # another writer came first, or the Lease went: read again
            self._cache.put_hold_lease(written)
            return
        raise kube_errors.KubeError(f"the hold Lease of {node} kept changing ({ATTEMPTS} attempts)", status=409)


# --- filter's side: the candidate nodes judged with their holds ---


def judge_fits(
    cache: store_module.Store,
    names: Sequence[str],
    fits: list[placement.Fit | None],
    *,
    pod: Mapping[str, Any],
    wanted: cardrequest.Request,
    now: float,
    ttl: float,
) -> None:
    """Judge again, with their holds (`Store.with_holds`), the candidate nodes `names` (whose
    verdicts `fits` are, in order) that pods are nominated to or hold records on: few, only while
    preemptions are under way; nothing to do where none are."""
    nominated = cache.nominated_nodes()
    recorded = cache.hold_nodes()
    if not nominated and not recorded:
        return
    uid = str(podspec.mapping(pod.get("metadata")).get("uid", ""))
    for index, name in enumerate(names):
        if name not in nominated and name not in recorded:
            continue
        state = cache.state(name, now=now, ttl=ttl, exclude_uid=uid)
        if state is None:
            continue
        kept = cache.with_holds(name, state, pod=pod, now=now)
        if kept is not state:
            fit = placement.evaluate(wanted, kept, decide=False)
            if not fit.fits and fit.reasons and (fits[index] or fit).fits:
                last = fit.reasons[-1]
                held = dataclasses.replace(last, message=f"{last.message}{preemption.held_note(kept)}")
                fit = dataclasses.replace(fit, reasons=(*fit.reasons[:-1], held))
            fits[index] = fit


def held_states(
    cache: store_module.Store,
    states: Mapping[str, cards.NodeState | None],
    *,
    pod: Mapping[str, Any],
    now: float,
) -> Mapping[str, cards.NodeState | None]:
    """`states` with the cards held for preemptors of the pod's priority or above (`Store.with_holds`);
    `states` itself where no pod is nominated and no record stands."""
    if not cache.nominated_nodes() and not cache.hold_nodes():
        return states
    return {name: None if state is None else cache.with_holds(name, state, pod=pod, now=now) for name, state in states.items()}
