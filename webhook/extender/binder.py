"""Bind: choose the card(s) from provably current state, commit by compare-and-swap on the node's
ledger Lease, create the Binding that carries the allocation annotations.

Why this cannot over-commit a card, not under a burst, not across a restart, not with several
extender replicas (docs/architecture.md has the argument in full):

1. Read: the node's ledger Lease (`policies.gpu.reservations.lease_body`: one per node in the ledger
   namespace; its `resourceVersion` R and its ledger), the Node (its cards, and the ledger an
   earlier version kept in its annotation `gpu-admission.io/reservations`, read only), and the
   pods bound to it. From the watch cache when it is provably current: its Lease copy is (step 3
   fails on any other version), and its pods are once the pod watch has delivered every event up
   to revision R (resourceVersions are etcd revisions, one sequence for all objects). Otherwise
   GET the Lease (a quorum read, at R) and LIST its pods as of R or later.
2. Decide: `cards.node_state` (bound pods' allocation annotations plus unexpired entries of both
   ledgers, the pod being bound left out) and `placement.evaluate` pick the card(s).
3. Commit: write the Lease's ledger with this pod's entry added (expiring after the reservation
   TTL): a create where there was no Lease (409 AlreadyExists if one appeared), else a replace
   carrying `metadata.resourceVersion: R` (409 if the Lease moved on). Either way a 409 goes back
   to 1. Node heartbeats do not touch the Lease, so they no longer make a commit fail.
4. Create the Binding, carrying the annotations (gpushare keys plus `gpu-admission.io/allocation`):
   the apiserver copies a Binding's annotations onto the pod in the same write that sets
   `spec.nodeName`, so a pod is never bound without them (and never annotated but unbound). The
   pod's UID is the Binding's precondition.

Every successful commit on a node happened at a distinct resourceVersion of its Lease, so the
commits form a sequence. Each commit read the ledger at the version just before it, so it saw
every earlier commit: either as its ledger entry, or — when a later commit pruned that entry — as
a pod bound to the node, which carries its annotation (bound and annotated in one write). A commit
prunes an entry only for a pod it saw bound (or gone) before its own write, so at a revision below
that write's, which is at or below R of any later commit: a LIST at R or later, or a pod cache
complete up to R, shows that pod bound (or gone) too.
Pruning drops only entries of pods listed as bound there, expired ones, and ones whose pod a GET
shows deleted, replaced, finished or bound to another node: none of those hold a card of this
node. So no commit can choose memory another commit already took, whichever process made it.
Nothing lives only in memory: a restarted (or a second) extender reads the same Lease and
annotations. A bind that dies after step 3 leaves a ledger entry that holds the card until it
expires (or, sooner, until a later commit finds the pod deleted); the scheduler retries the pod,
and the retry replaces the entry (entries are keyed by pod UID, and the pod is left out of its own
state). The Node annotation's ledger is never written: its entries count until they expire.

Inside one process, binds to the same node do not race each other: they queue per node, and one
task commits whatever is waiting as a batch — one read, a card choice per pod in arrival order
(each seeing the choices before it), one CAS — then every pod goes on to step 4 in parallel. A
bind to an idle node starts its commit at once; only binds that arrive while one is in flight
wait, and then they share the next write. The CAS retries are for other replicas. A commit's
write travels on connections of its own (`native.LEDGER`), so it never waits for a free connection
behind the Binding POSTs of the binds before it.

Ledger entries of pods that are gone (deleted, replaced, finished, bound elsewhere) are dropped at
the next commit once they are older than a few seconds (one GET per such entry), rather than
holding a card for the whole TTL; `prune` does the same without a bind (the app calls it for the
ledgers its cache finds stale).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import random
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

from policies import podspec
from policies.gpu import allocation as allocation_  # `allocation` is the name of what bind hands out
from policies.gpu import budgets, cardrequest, cards, reservations
from webhook.extender import api, budgeting, placement, preemption, reality, wire
from webhook.extender import store as store_module
from webhook.kube import errors as kube_errors
from webhook.kube import leasewrite

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 50
MAX_BATCH = 64  # binds to one node committed by one compare-and-swap
POD_CATCH_UP_S = 0.1  # how long bind waits for the pod watch to reach the Node's version before it LISTs
_BACKOFF_S = 0.002  # first conflict backoff; grows linearly with jitter, capped at _BACKOFF_CAP_S
_BACKOFF_CAP_S = 0.1


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Decision:
    allocation: allocation_.Allocation | None = None
    node: Mapping[str, Any] | None = None  # as decided upon: the cards' sizes for the annotations
    conflicts: int = 0
    error: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Waiting:
    request: wire.BindRequest
    wanted: cardrequest.Request
    future: asyncio.Future[_Decision]
    queued_at: float = dataclasses.field(default_factory=time.perf_counter)  # when it joined its node's queue


@dataclasses.dataclass(kw_only=True)
class _NodeQueue:
    """Binds waiting to be committed on one node, and the task committing them."""

    pending: list[_Waiting] = dataclasses.field(default_factory=list)
    task: asyncio.Task[None] | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class BindResult:
    """What bind did: the allocation, or the error the scheduler gets; `conflicts` for metrics."""

    allocation: allocation_.Allocation | None = None
    error: str = ""
    conflicts: int = 0


class Binder:
    """Binds pods; safe to call concurrently, and safe beside other Binders on other processes."""

    def __init__(
        self,
        client: api.Api,
        *,
        ttl: float = allocation_.DEFAULT_RESERVATION_TTL_S,
        clock: Callable[[], float] = time.time,
        cache: store_module.Store | None = None,
        max_attempts: int = MAX_ATTEMPTS,
        honour_out_of_band: bool = False,
        namespace: str = reservations.LEDGER_NAMESPACE,
        identity: str = "",
        keeper: budgeting.Keeper | None = None,
    ) -> None:
        self._api = client
        self._keeper = keeper  # the namespaces' GPU budgets: a pod's charge is committed before its node's ledger
        self._namespace = namespace  # where the ledger Leases live
        self._identity = identity or default_identity()  # the Leases' holderIdentity (informational)
        self._honour_out_of_band = honour_out_of_band  # decide on cards less out-of-band use (`reality`)
        self._ttl = ttl
        self._clock = clock
        self._cache = cache
        self._max_attempts = max_attempts
        self._queues: dict[str, _NodeQueue] = {}

    async def bind(self, request: wire.BindRequest) -> BindResult:
        try:
            return await self._bind(request)
        except kube_errors.KubeError as error:
            log.warning("bind %s to %s: %s", request.pod_key, request.node, error)
            return BindResult(error=f"binding {request.pod_key} to {request.node}: {error}")

    async def _bind(self, request: wire.BindRequest) -> BindResult:
        # The watch cache's copy is enough to read what the pod asks for (extended resources cannot
        # be resized); the Binding's UID precondition catches a pod replaced in the meantime.
        pod = self._cache.pod(request.uid) if self._cache is not None else None
        if pod is None or _key(pod) != (request.namespace, request.name):
            pod = await self._api.get_pod(request.namespace, request.name)
        metadata = podspec.mapping(pod.get("metadata"))
        if metadata.get("uid") != request.uid:
            return BindResult(error=f"pod {request.pod_key} has UID {metadata.get('uid')}, not {request.uid}: it was replaced")
        bound_to = podspec.mapping(pod.get("spec")).get("nodeName")
        if bound_to:
            if bound_to == request.node:
                return BindResult()  # a retried call after a bind that did succeed
            return BindResult(error=f"pod {request.pod_key} is already bound to {bound_to}")
        wanted = cardrequest.pod_request(pod)
        if wanted.problem:
            return BindResult(error=wanted.problem)
        if wanted.family is None:
            # The scheduler only sends pods asking for a managed resource; binding anything else on
            # request would let any caller of this endpoint place arbitrary pods.
            return BindResult(error=f"pod {request.pod_key} asks for no resource the GPU extender places; refusing to bind it")
        started = time.perf_counter()
        allocation, committed, conflicts, message = await self._commit(request, wanted)
        if allocation is None or committed is None:
            return BindResult(error=message, conflicts=conflicts)
        card = cards.node_cards(committed).card(allocation.cards[0])
        annotations = allocation_.bind_annotations(allocation, card_memory_gib=card.memory_gib if card else 0)
        committed_at = time.perf_counter()
        try:
            await self._api.bind(request.namespace, request.name, uid=request.uid, node=request.node, annotations=annotations)
        except kube_errors.Conflict:
            fresh = await self._api.get_pod(request.namespace, request.name)
            if podspec.mapping(fresh.get("spec")).get("nodeName") != request.node:
                raise
            return BindResult(conflicts=conflicts)  # an earlier attempt of this very pod got there first
        if self._cache is not None:
            self._cache.put_pod(_bound_copy(pod, node=request.node, annotations=annotations))  # filter sees it at once
        log.info(
            "bound %s to %s cards %s (%d GiB, %d%% core each%s) after %d conflicts; commit %.0f ms, binding %.0f ms",
            request.pod_key,
            request.node,
            list(allocation.cards),
            allocation.memory_gib,
            allocation.core_percent,
            ", whole" if allocation.whole else "",
            conflicts,
            (committed_at - started) * 1000,
            (time.perf_counter() - committed_at) * 1000,
        )
        return BindResult(allocation=allocation, conflicts=conflicts)

    def _with_holds(self, node: str, uid: str, state: cards.NodeState, *, now: float) -> cards.NodeState:
        """The state with the cards held for preemptors of the pod's priority or above
        (`Store.with_holds`, as filter judges), so that bind never hands out a held card; the
        state itself without a cache, or where nothing is held."""
        pod = self._cache.pod(uid) if self._cache is not None else None
        return state if self._cache is None or pod is None else self._cache.with_holds(node, state, pod=pod, now=now)

    @property
    def nodes_committing(self) -> frozenset[str]:
        """The nodes with binds waiting to be committed now."""
        return frozenset(self._queues)

    async def _commit(
        self, request: wire.BindRequest, wanted: cardrequest.Request
    ) -> tuple[allocation_.Allocation | None, Mapping[str, Any] | None, int, str]:
        """Steps 1-3 of the protocol for this pod, committed together with every other bind to the
        same node that is waiting at that moment. Returns (allocation, committed node, conflicts, error)."""
        queue = self._queues.setdefault(request.node, _NodeQueue())
        future: asyncio.Future[_Decision] = asyncio.get_running_loop().create_future()
        queue.pending.append(_Waiting(request=request, wanted=wanted, future=future))
        if queue.task is None:
            queue.task = asyncio.create_task(self._drain(request.node, queue), name=f"commit {request.node}")
        decision = await future
        return decision.allocation, decision.node, decision.conflicts, decision.error

    async def _drain(self, node_name: str, queue: _NodeQueue) -> None:
        """Commit waiting binds for one node, a batch at a time, until none wait."""
        try:
            while queue.pending:
                batch, queue.pending = queue.pending[:MAX_BATCH], queue.pending[MAX_BATCH:]
                try:
                    decisions = await self._commit_batch(node_name, batch)
                except Exception as error:  # noqa: BLE001 - every waiter gets the failure, the queue goes on
                    for waiting in batch:
                        if not waiting.future.done():
                            waiting.future.set_exception(error)
                    continue
                for waiting, decision in zip(batch, decisions, strict=True):
                    if not waiting.future.done():
                        waiting.future.set_result(decision)
        finally:
            queue.task = None
            # A node's queue lives only while binds to it wait: kept, the map would grow with every
            # node name ever bound to (autoscaled nodes come and go; a fuzzed /bind names any).
            if not queue.pending and self._queues.get(node_name) is queue:
                del self._queues[node_name]

    async def _commit_batch(self, node_name: str, batch: list[_Waiting]) -> list[_Decision]:
        """One read of the node, a card choice for each waiting pod in arrival order, one CAS."""
        conflicts = 0
        began = time.perf_counter()
        for attempt in range(self._max_attempts):
            started = time.perf_counter()
            read = await self._read(node_name, attempt=attempt)
            pods = read.pods
            read_at = time.perf_counter()
            now = self._clock()
            held = self._lease_ledger(read)
            ledger = await self._live(
                reservations.union(read.node, read.lease, namespace=self._namespace), read=read, node=node_name, now=now
            )
            batch_uids = {waiting.request.uid for waiting in batch}
            chosen: dict[str, allocation_.Allocation] = {}
            errors: dict[int, str] = {}
            # `cards.node_state`; the cache's version reads what each of its own pod copies holds
            # once per copy (the same state: tests), a listed pod afresh.
            node_state = self._cache.node_state_of if self._cache is not None else cards.node_state
            for position, waiting in enumerate(batch):
                request = waiting.request
                others = {uid: entry for uid, entry in ledger.items() if uid not in batch_uids}
                state = node_state(
                    read.view,
                    pods,
                    now=now,
                    ttl=self._ttl,
                    reservations={**others, **chosen},
                    exclude_uid=request.uid,
                )
                state = self._with_holds(node_name, request.uid, state, now=now)
                fit = placement.evaluate(waiting.wanted, state)
                if not fit.fits:
                    errors[position] = f"{node_name}: {fit.message}{preemption.held_note(state)}"
                    continue
                chosen[request.uid] = allocation_.Allocation(
                    uid=request.uid,
                    namespace=request.namespace,
                    name=request.name,
                    node=node_name,
                    cards=fit.cards,
                    memory_gib=waiting.wanted.memory_gib,
                    core_percent=waiting.wanted.core_percent,
                    whole=bool(waiting.wanted.cards),
                    assumed_at=now,
                    expires=now + self._ttl,
                    source="reservation",
                )
            if not chosen:
                return [_Decision(error=errors[i], conflicts=_first(i, conflicts)) for i in range(len(batch))]
            # The chosen pods' charges go to their namespaces' budget Leases while the node's ledger
            # is written: both must be in before a Binding, neither needs the other, and in series
            # they cost a bind two writes' time. A pod its budget refuses keeps its node ledger
            # entry until it expires (or its next bind replaces it): over-counting a card is safe.
            charging = (
                asyncio.ensure_future(self._charge(batch, dict(chosen), node=read.node, expires=now + self._ttl))
                if self._keeper is not None
                else None
            )
            # Only the Lease's entries are written (`ledger` has no gone pods); the Node annotation's,
            # from an earlier version, count above but stay where they are until they expire.
            kept = reservations.prune({uid: e for uid, e in ledger.items() if uid in held}, pods=pods, now=now)
            for uid in batch_uids:
                kept.pop(uid, None)
            kept.update(chosen)
            decided_at = time.perf_counter()
            try:
                committed = await self._write(node_name, read, kept)
            except (kube_errors.Conflict, _LeaseGone):
                if charging is not None:
                    await asyncio.gather(charging, return_exceptions=True)  # charged again with the next choice
                conflicts += 1
                await asyncio.sleep(min(_BACKOFF_CAP_S, _BACKOFF_S * (attempt + 1)) * random.random())  # noqa: S311 - jitter, not crypto
                continue
            except BaseException:
                if charging is not None:
                    charging.cancel()
                raise
            self._committed(node_name, read, committed)
            if charging is not None:
                for position, why in (await charging).items():
                    errors[position] = why
                    chosen.pop(batch[position].request.uid, None)
            # Each step of the bind queue, for bench/extender_throughput.py --extender-log-level debug:
            # how long the batch's binds waited behind the node's previous commit, then this one's steps.
            log.debug(
                "committed %d of %d binds on %s (%d pods %s, %d ledger entries): queued %.0f ms (longest), "
                "read %.0f ms, decide %.0f ms, write %.0f ms",
                len(chosen),
                len(batch),
                node_name,
                len(pods),
                "cached" if read.cached else "listed",
                len(kept),
                (began - min(w.queued_at for w in batch)) * 1000,
                (read_at - started) * 1000,
                (decided_at - read_at) * 1000,
                (time.perf_counter() - decided_at) * 1000,
            )
            return [
                _Decision(error=errors[i], conflicts=_first(i, conflicts))
                if i in errors
                else _Decision(
                    allocation=dataclasses.replace(chosen[w.request.uid], expires=None, source="allocation"),
                    node=read.node,
                    conflicts=_first(i, conflicts),
                )
                for i, w in enumerate(batch)
            ]
        message = f"{node_name}: gave up after {conflicts} conflicting updates of its reservation ledger; will retry"
        return [_Decision(error=message, conflicts=_first(i, conflicts)) for i in range(len(batch))]

    async def _charge(
        self,
        batch: list[_Waiting],
        chosen: Mapping[str, allocation_.Allocation],
        *,
        node: Mapping[str, Any],
        expires: float,
    ) -> dict[int, str]:
        """Each chosen pod's charge committed to its namespace's budget (`budgeting`), one charge of
        the batch per namespace; returns the positions of the pods their budget has no room for,
        with the reason."""
        assert self._keeper is not None
        by_namespace: dict[str, list[tuple[int, wire.BindRequest]]] = {}
        for position, waiting in enumerate(batch):
            if waiting.request.uid in chosen:
                by_namespace.setdefault(waiting.request.namespace, []).append((position, waiting.request))
        answers = await asyncio.gather(
            *(
                self._keeper.charge_many(
                    [
                        (
                            {"metadata": {"namespace": request.namespace, "name": request.name, "uid": request.uid}},
                            budgets.allocation_charge(chosen[request.uid], node),
                        )
                        for _, request in asked
                    ],
                    expires=expires,
                )
                for asked in by_namespace.values()
            )
        )
        refused: dict[int, str] = {}
        for asked, answer in zip(by_namespace.values(), answers, strict=True):
            for position, request in asked:
                if answer.get(request.uid):
                    refused[position] = f"{request.node}: {answer[request.uid]}"
        return refused

    async def prune(self, node_name: str) -> bool:
        """Drop expired entries from the node's ledger Lease, and those of pods that are gone or
        placed elsewhere, if there are any. True if it wrote. (The Node annotation's ledger of an
        earlier version is never written: its entries stop counting by themselves.)"""
        for attempt in range(self._max_attempts):
            read = await self._read(node_name, attempt=attempt)
            if read.lease is None:
                return False
            now = self._clock()
            held = self._lease_ledger(read)
            kept = reservations.prune(await self._live(held, read=read, node=node_name, now=now), pods=read.pods, now=now)
            if kept.keys() == held.keys():
                return False
            try:
                committed = await self._write(node_name, read, kept)
            except (kube_errors.Conflict, _LeaseGone):
                await asyncio.sleep(min(_BACKOFF_CAP_S, _BACKOFF_S * (attempt + 1)) * random.random())  # noqa: S311 - jitter, not crypto
                continue
            self._committed(node_name, read, committed)
            log.info("pruned %d ledger entries on %s", len(held) - len(kept), node_name)
            return True
        return False

    def _lease_ledger(self, read: _Read) -> dict[str, allocation_.Allocation]:
        return reservations.lease_reservations(read.lease, namespace=self._namespace) if read.lease is not None else {}

    async def _write(self, node_name: str, read: _Read, ledger: dict[str, allocation_.Allocation]) -> dict[str, Any]:
        """Step 3: the node's ledger Lease with `ledger`, created where the read found none (the
        create fails where one exists by now), else replaced at the read resourceVersion."""
        node_uid = str(podspec.mapping(read.node.get("metadata")).get("uid", ""))
        body = reservations.lease_body(node_name, node_uid, ledger, self._identity, namespace=self._namespace)
        try:
            return await leasewrite.write(self._api, self._namespace, body, read=read.lease)
        except kube_errors.NotFound as error:
            if read.lease is not None:
                raise _LeaseGone(str(error)) from error  # deleted since the read: read again (and create it)
            raise kube_errors.KubeError(
                f"creating the reservation ledger Lease of {node_name} in namespace {self._namespace!r}: {error} "
                "(does the ledger namespace exist? see --ledger-namespace)",
                status=404,
            ) from error

    async def _read(self, node_name: str, *, attempt: int) -> _Read:
        """Step 1: the node (its cards, and any ledger an earlier version left on it), its ledger
        Lease (resourceVersion R), and the pods bound to it.

        From the watch cache when it can vouch for them: the Lease is the cache's copy (the
        compare-and-swap on R proves it current, else the next attempt GETs it; where the cache has
        no Lease, R is the revision of the Lease list or of the deletion of the node's Lease the
        watch delivered, whichever is later, and the create fails if one exists), and
        the pods are the cache's once the pod watch has delivered every event up to R, and up to the
        first Node copy with the Node's annotation ledger (waiting up to `POD_CATCH_UP_S`). Every
        entry any commit pruned was pruned because its pod was seen bound (or gone) before that
        commit's write, which is at or before R; so a pod cache complete up to R shows each such pod
        bound, with its annotations (or gone). Otherwise a GET of the Lease (at R') and a LIST of
        the node's pods as of R' or later (a quorum LIST where there is no Lease)."""
        cache = self._cache
        if cache is not None and cache.synced and attempt == 0:
            cached_node = cache.node(node_name)
            if cached_node is not None:
                lease = cache.lease(node_name)
                version = store_module.revision(lease) if lease is not None else cache.lease_floor(node_name)
                need = max(version, cache.node_ledger_version(node_name))
                # Our own last commit on this node, decided on this cache: it covers that version
                # already, with no need to wait for the pod watch to deliver our own Bindings.
                own = (
                    lease is not None
                    and version >= 0
                    and cache.vouched(node_name) == version
                    and cache.pods_version >= cache.node_ledger_version(node_name)
                )
                if version >= 0 and (own or await cache.wait_for_pods(need, timeout=POD_CATCH_UP_S)):
                    real = cache.real_node(node_name) or cached_node
                    complete = cache.pods_version >= need
                    view = self._view(real, cached_node if cache.honours_out_of_band else None)
                    return _Read(
                        node=real, lease=lease, view=view, pods=cache.bound_pods(node_name), cached=True, complete=complete
                    )
        try:
            lease = await self._api.get_lease(self._namespace, reservations.lease_name(node_name))
        except kube_errors.NotFound:
            lease = None
        cached_node = cache.node(node_name) if cache is not None and cache.nodes_synced else None
        if cache is not None and cached_node is not None:
            node, node_floor = cache.real_node(node_name) or cached_node, cache.node_ledger_version(node_name)
        else:
            node = await self._api.get_node(node_name)
            node_floor = store_module.revision(node) if reservations.node_reservations(node) else -1
        version = store_module.revision(lease) if lease is not None else -1
        need = max(version, node_floor)
        if version >= 0 and cache is not None and cache.pods_synced and await cache.wait_for_pods(need, timeout=0.0):
            # a fresh Lease the pod cache is already past
            pods, cached, complete = cache.bound_pods(node_name), True, True
        else:
            # As of the Lease's version or later is all the protocol needs (the apiserver's watch
            # cache can answer that); without a Lease (or a version that is no revision), a quorum read.
            pods, cached, complete = (
                await self._api.list_node_pods(node_name, at_least=str(need) if version >= 0 else ""),
                False,
                False,
            )
        if cache is not None and lease is not None:
            cache.put_lease(lease)
        view = self._view(node, cached_node if cache is not None and cache.honours_out_of_band else None)
        return _Read(node=node, lease=lease, view=view, pods=pods, cached=cached, complete=complete)

    def _view(self, node: Mapping[str, Any], shrunk: Mapping[str, Any] | None) -> Mapping[str, Any]:
        """The node's cards as the bind decides on them: less out-of-band use with
        `--honour-out-of-band-usage` (the cache's copy `shrunk` where it already is), else `node`.
        `node` itself stays the real one: the Binding's card sizes are the real cards'."""
        if shrunk is not None:
            return shrunk
        return reality.honour_out_of_band(node) if self._honour_out_of_band else node

    def _committed(self, node_name: str, read: _Read, committed: dict[str, Any]) -> None:
        """Our write is in: the cache takes the Lease, and vouches for it where it covered the read."""
        if self._cache is not None:
            self._cache.put_lease(committed)
            if read.cached:
                self._cache.vouch(node_name, store_module.revision(committed))

    async def _live(
        self, ledger: dict[str, allocation_.Allocation], *, read: _Read, node: str, now: float
    ) -> dict[str, allocation_.Allocation]:
        """The ledger without entries of pods that are gone: deleted, replaced under the same name,
        finished, or bound to another node. Such a pod will never use the card, so its entry need
        not wait for its TTL. Entries of pods listed on the node, or unbound and alive, stay.

        With `read.cached` the cache's copy of such a pod decides (bound elsewhere, finished and
        deleted are for good); with `read.complete` as well (the pod cache is complete up to the
        Node's version, so up to every entry's write, which came after its pod's creation) a pod the
        cache does not hold is gone. Every other such pod is read from the apiserver."""
        listed = {str(podspec.mapping(p.get("metadata")).get("uid", "")) for p in read.pods}
        unsure = [
            e
            for uid, e in ledger.items()
            if uid not in listed and (e.expires or 0.0) > now and (e.assumed_at or 0.0) + reservations.IN_FLIGHT_GRACE_S <= now
        ]
        if not unsure:
            return ledger
        found: list[dict[str, Any] | BaseException | None] = [None] * len(unsure)
        if read.cached and self._cache is not None:
            for i, entry in enumerate(unsure):
                held = self._cache.pod(entry.uid)
                if held is not None:
                    found[i] = held
                elif read.complete:
                    found[i] = kube_errors.NotFound(f"pod {entry.namespace}/{entry.name} ({entry.uid}) is gone", status=404)
        asked = [i for i, got in enumerate(found) if got is None]
        if asked:
            answers = await asyncio.gather(
                *(self._api.get_pod(unsure[i].namespace, unsure[i].name) for i in asked), return_exceptions=True
            )
            for i, answer in zip(asked, answers, strict=True):
                found[i] = answer
        gone: set[str] = set()
        for entry, pod in zip(unsure, found, strict=True):
            if isinstance(pod, kube_errors.NotFound):
                gone.add(entry.uid)
            elif pod is None or isinstance(pod, BaseException):
                continue  # cannot tell: keep it (over-counting is safe, under-counting is not)
            else:
                meta, spec = podspec.mapping(pod.get("metadata")), podspec.mapping(pod.get("spec"))
                elsewhere = bool(spec.get("nodeName")) and spec.get("nodeName") != node
                finished = allocation_.is_terminal(pod)
                if meta.get("uid") != entry.uid or elsewhere or finished:
                    gone.add(entry.uid)
        return {uid: entry for uid, entry in ledger.items() if uid not in gone}


class _LeaseGone(Exception):
    """The ledger Lease was deleted between the read and the replace: read again."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Read:
    node: Mapping[str, Any]  # its cards (and an earlier version's annotation ledger, read-only)
    lease: Mapping[str, Any] | None  # the ledger Lease as read (its resourceVersion guards the commit); None: none yet
    view: dict[str, Any] | Mapping[str, Any]  # as decided upon (less out-of-band use where asked)
    pods: list[dict[str, Any]]
    cached: bool  # the pods came from the watch cache, which covers the Lease's version (see `_read`)
    complete: bool = False  # ... and has every pod event up to that version


def default_identity() -> str:
    """This replica's name in the Leases it writes: the host (a pod's name) and the process."""
    return f"{socket.gethostname()}_{os.getpid()}"


def _first(position: int, conflicts: int) -> int:
    """A batch's conflicts are reported once (with its first pod), so metrics count them once."""
    return conflicts if position == 0 else 0


def _key(pod: dict[str, Any]) -> tuple[str, str]:
    metadata = podspec.mapping(pod.get("metadata"))
    return str(metadata.get("namespace", "")), str(metadata.get("name", ""))


def _bound_copy(pod: dict[str, Any], *, node: str, annotations: dict[str, str]) -> dict[str, Any]:
    """The pod as the Binding left it (same resourceVersion: the watch event that follows is newer)."""
    metadata = dict(podspec.mapping(pod.get("metadata")))
    metadata["annotations"] = {**podspec.mapping(metadata.get("annotations")), **annotations}
    return {**pod, "metadata": metadata, "spec": {**podspec.mapping(pod.get("spec")), "nodeName": node}}
