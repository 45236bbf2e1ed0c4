"""GPU-memory budgets per namespace in the extender: filter refuses, bind commits, preempt checks.

The budgets come from the webhook's settings file (`gpuBudgets`, read again when it changes:
`webhook.config.watched`); what a pod is charged, and how a namespace's usage adds up, is
`policies.gpu.budgets`'. Three places keep a budget:

- filter (`Keeper.judge`): a node where the pod's charge (whole cards: the node's largest cards)
  would take its namespace over budget fails with NAMESPACE_BUDGET, naming the budget, what is
  used and what the pod asks; `failed`, so the pod is tried again when room frees up (a pod of
  the namespace gone or finished, a ledger entry gone: the store tells the nudger as for cards);
  `unresolvable` where the charge alone is more than the whole budget.
- bind (`Keeper.charge_many`): before the Binding, beside the write of the node's ledger, the
  charges of the cards chosen are written to the namespace's budget Lease by compare-and-swap, on
  a read the pod cache covers: the node ledger's protocol (`binder`), with the namespace in the
  node's place. Every commit to a namespace happened at a distinct resourceVersion of its Lease
  and read the one before, so it saw every earlier commit, as an entry or, where a later commit
  pruned the entry, as a pod bound (pruned only once seen bound, and the pod cache is complete up
  to the version read, or the pods were listed as of it). So no two binds, in one process or in
  two replicas, spend the same room. Charges to one namespace queue in one process and are
  committed together (one read, each judged with those before it, one write), so they do not
  conflict with each other and a namespace takes pods as fast as its writes allow whole batches.
  A Lease this process committed last on a read of this cache is read again without waiting for
  the pod watch (as the node ledger's own commit): the cache covers its version; waiting would
  wait for the Bindings of the node's batch, which come only after it.
- preempt (`Keeper.room_after`): a node is answered only where the namespace has room for the pod
  once the victims of its own namespace are gone.

The extender never fails open on a budget it cannot read: where the budgets' namespace selectors
need namespace labels not listed yet, filter and bind refuse with the reason (`Unreadable`); a
settings file that turned bad keeps the last good budgets (and `problem` says why).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from policies import podspec
from policies.gpu import budgets, cardrequest, cards, reasons, reservations
from policies.settings import budgets as settings_budgets
from webhook.extender import placement
from webhook.extender import store as store_module
from webhook.kube import errors as kube_errors
from webhook.kube import leasewrite

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 50
MAX_BATCH = 256  # charges to one namespace committed by one compare-and-swap
POD_CATCH_UP_S = 0.1  # how long a charge waits for the pod watch to reach the budget Lease's version (then it LISTs), as binder
_BACKOFF_S = 0.002
_BACKOFF_CAP_S = 0.1


class Unreadable(Exception):
    """The namespace's budget cannot be known now; the message says why (nothing fails open)."""


class Source(Protocol):
    """Where the budgets come from (`webhook.config.watched.SettingsFile` of `budgets_of`)."""

    def current(self) -> tuple[settings_budgets.Budget, ...]: ...


class Fixed:
    """Budgets that do not change (tests, benches)."""

    def __init__(self, found: Iterable[settings_budgets.Budget]) -> None:
        self._found = tuple(found)

    def current(self) -> tuple[settings_budgets.Budget, ...]:
        return self._found


class LeaseApi(leasewrite.Leases, Protocol):
    async def get_lease(self, namespace: str, name: str) -> dict[str, Any]: ...

    async def list_namespace_pods(self, namespace: str, *, at_least: str = "") -> list[dict[str, Any]]: ...


class Keeper:
    """Keeps the namespaces' GPU budgets for one extender process (safe beside other replicas)."""

    def __init__(
        self,
        api: LeaseApi,
        cache: store_module.Store,
        source: Source,
        *,
        home: str = reservations.LEDGER_NAMESPACE,
        identity: str = "",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._api, self._cache, self._source = api, cache, source
        self._home, self._identity, self._clock = home, identity or "gpu-admission-extender", clock
        self._queues: dict[str, _Queue] = {}  # namespace -> charges waiting to be committed, and the task committing them
        self.conflicts = 0  # compare-and-swap conflicts on budget Leases (for metrics)
        self._vouched: dict[str, int] = {}  # namespace -> the version of our last commit decided on this cache

    # --- reading ---

    def all_budgets(self) -> tuple[settings_budgets.Budget, ...]:
        return self._source.current()

    def budget_of(self, namespace: str) -> settings_budgets.Budget | None:
        """The namespace's budget, None where it has none (unlimited); `Unreadable` where its labels
        are needed (a budget chooses by namespaceSelector) and not known yet."""
        found = self._source.current()
        if not found:
            return None
        labels = self._cache.namespace_labels(namespace)
        if labels is None and any(b.match.selector is not None for b in found):
            if not self._cache.namespaces_synced:
                raise Unreadable("the GPU extender has not listed the namespaces yet (budgets choose them by label); retry")
            # listed, and not there: a namespace created since; only its name label is known
        return settings_budgets.budget_for(found, namespace, labels)

    def usage(self, namespace: str, *, now: float) -> budgets.Usage:
        return self._cache.budget_usage(namespace, now=now)

    def budgeted(self, *, now: float) -> list[tuple[str, settings_budgets.Budget, budgets.Usage]]:
        """Every namespace known here that has a budget, with its usage (inspect, metrics)."""
        found = self._source.current()
        if not found:
            return []
        names = sorted(set(self._cache.namespaces()) | set(self._cache.pod_namespaces()))
        rows = []
        for namespace in names:
            budget = settings_budgets.budget_for(found, namespace, self._cache.namespace_labels(namespace))
            if budget is not None:
                rows.append((namespace, budget, self.usage(namespace, now=now)))
        return rows

    # --- filter ---

    def judge(
        self, outcome: placement.Outcome, *, pod: Mapping[str, Any], wanted: cardrequest.Request, now: float
    ) -> placement.Outcome:
        """The filter's outcome with the nodes where the pod's charge would take its namespace
        over budget moved from passed to failed (unresolvable where it could never fit)."""
        if not outcome.passed or not wanted.managed or wanted.problem:
            return outcome
        metadata = podspec.mapping(pod.get("metadata"))
        namespace, uid = str(metadata.get("namespace", "")), str(metadata.get("uid", ""))
        try:
            budget = self.budget_of(namespace)
        except Unreadable as error:
            return _refuse(outcome, list(outcome.passed), f"namespace {namespace}: {error}", never=False)
        if budget is None:
            return outcome
        used = self.usage(namespace, now=now).total_without([uid])
        refused: dict[str, str] = {}
        never: dict[str, str] = {}
        shared = None if wanted.cards else budgets.asked(wanted, None)
        for name in outcome.passed:
            charge = shared if shared is not None else budgets.asked(wanted, self._cards(name))
            why = budgets.over(budget.memory_mib, budget.cards, used, charge)
            if not why:
                continue
            message = f"namespace {namespace} {budget.describe()}: {why}"
            if budgets.over(budget.memory_mib, budget.cards, budgets.NOTHING, charge):
                never[name] = message
            else:
                refused[name] = message
        if refused:
            outcome = _refuse(outcome, list(refused), refused, never=False)
        if never:
            outcome = _refuse(outcome, list(never), never, never=True)
        return outcome

    def _cards(self, node: str) -> cards.NodeCards | None:
        return self._cache.real_cards(node)

    # --- preempt ---

    def room_after(
        self, pod: Mapping[str, Any], wanted: cardrequest.Request, node: str, victims: Sequence[str], *, now: float
    ) -> bool:
        """Whether the pod's namespace has room for it on `node` once `victims` are gone (only those of
        its own namespace free any of its budget); False where the budget cannot be read."""
        metadata = podspec.mapping(pod.get("metadata"))
        namespace, uid = str(metadata.get("namespace", "")), str(metadata.get("uid", ""))
        try:
            budget = self.budget_of(namespace)
        except Unreadable:
            return False
        if budget is None:
            return True
        used = self.usage(namespace, now=now).total_without([uid, *victims])
        return not budgets.over(budget.memory_mib, budget.cards, used, budgets.asked(wanted, self._cards(node)))

    # --- bind ---

    async def charge(self, pod: Mapping[str, Any], charge: budgets.Charge, *, expires: float | None) -> str:
        """Commit `charge` for `pod` to its namespace's budget Lease; "" when committed (or the
        namespace has no budget), else why not (NAMESPACE_BUDGET, or a budget it cannot read)."""
        uid = str(podspec.mapping(pod.get("metadata")).get("uid", ""))
        return (await self.charge_many([(pod, charge)], expires=expires)).get(uid, "")

    async def charge_many(
        self, asked: Sequence[tuple[Mapping[str, Any], budgets.Charge]], *, expires: float | None
    ) -> dict[str, str]:
        """`charge` for pods of one namespace, in order; returns why each pod refused was refused
        (by UID). Charges to one namespace queue and are committed together, whatever asked them (a
        node's batch of binds, the gate): one read, each pod judged with the ones before it taken,
        one compare-and-swap. A namespace takes as many pods per second as a write takes, not
        one pod per write (bench/extender_throughput.py --budgets)."""
        if not asked:
            return {}
        namespace = str(podspec.mapping(asked[0][0].get("metadata")).get("namespace", ""))
        queue = self._queues.setdefault(namespace, _Queue())
        loop = asyncio.get_running_loop()
        waiting = [_Asked(pod=pod, charge=charge, expires=expires, future=loop.create_future()) for pod, charge in asked]
        queue.pending.extend(waiting)
        if queue.task is None:
            queue.task = asyncio.create_task(self._drain(namespace, queue), name=f"budget {namespace}")
        answers = await asyncio.gather(*(w.future for w in waiting))
        return {w.uid: why for w, why in zip(waiting, answers, strict=True) if why}

    async def _drain(self, namespace: str, queue: _Queue) -> None:
        """Commit waiting charges of one namespace, a batch at a time, until none wait."""
        try:
            while queue.pending:
                batch, queue.pending = queue.pending[:MAX_BATCH], queue.pending[MAX_BATCH:]
                try:
                    answers = await self._commit(namespace, batch)
                except Exception as error:  # noqa: BLE001 - every waiter gets the failure, the queue goes on
                    for waiting in batch:
                        if not waiting.future.done():
                            waiting.future.set_exception(error)
                    continue
                for waiting in batch:
                    if not waiting.future.done():
                        waiting.future.set_result(answers.get(waiting.uid, ""))
        finally:
            queue.task = None
            if not queue.pending and self._queues.get(namespace) is queue:
                del self._queues[namespace]

    async def _commit(self, namespace: str, batch: list[_Asked]) -> dict[str, str]:
        """One read, each charge judged in order with those before it taken, one compare-and-swap."""
        uids = [waiting.uid for waiting in batch]
        try:
            budget = self.budget_of(namespace)
        except Unreadable as error:
            return dict.fromkeys(uids, f"{reasons.Code.NAMESPACE_BUDGET}: namespace {namespace}: {error}")
        if budget is None:
            return {}
        refused: dict[str, str] = {}
        for waiting in batch:
            if waiting.charge.problem:  # never fail open: what cannot be charged is not let in
                refused[waiting.uid] = (
                    f"{reasons.Code.NAMESPACE_BUDGET}: namespace {namespace} {budget.describe()}: "
                    f"the charge cannot be computed: {waiting.charge.problem}"
                )
        for attempt in range(MAX_ATTEMPTS):
            read = await self._read(namespace, attempt=attempt)
            now = self._clock()
            usage = self._cache.budget_usage(namespace, now=now, lease=read.lease, pods=read.pods)
            used = usage.total_without(uids)
            added: dict[str, budgets.Entry] = {}
            why_not = dict(refused)
            for waiting in batch:
                if waiting.uid in why_not:
                    continue
                why = budgets.over(budget.memory_mib, budget.cards, used, waiting.charge)
                if why:
                    why_not[waiting.uid] = f"{reasons.Code.NAMESPACE_BUDGET}: namespace {namespace} {budget.describe()}: {why}"
                    continue
                used = used + waiting.charge
                added[waiting.uid] = budgets.Entry(
                    uid=waiting.uid,
                    pod=f"{namespace}/{waiting.name}",
                    charge=waiting.charge,
                    assumed_at=now,
                    expires=waiting.expires,
                )
            if not added:
                return why_not
            ledger = budgets.lease_ledger(read.lease, home=self._home)
            if read.pods is not None:
                pods = {str(podspec.mapping(p.get("metadata")).get("uid", "")): p for p in read.pods}
            else:  # only the ledger's pods are looked at: a namespace may hold thousands of pods
                pods = {uid: found for uid in ledger if (found := self._cache.pod(uid)) is not None}
            gone = {entry for entry in ledger if self._cache.gone(entry) or (read.pods is not None and entry not in pods)}
            kept = budgets.prune(ledger, usage, pods=pods, gone=gone, now=now)
            for uid in why_not:
                kept.pop(uid, None)  # a refused pod's earlier entry (a retried bind) holds no room any more
            kept.update(added)
            body = budgets.lease_body(namespace, kept, self._identity, home=self._home)
            try:
                committed = await leasewrite.write(self._api, self._home, body, read=read.lease)
            except (kube_errors.Conflict, kube_errors.NotFound):
                self.conflicts += 1
                await asyncio.sleep(min(_BACKOFF_CAP_S, _BACKOFF_S * (attempt + 1)) * random.random())  # noqa: S311 - jitter
                continue
            self._cache.put_budget_lease(committed)
            if read.pods is None:  # decided on this cache: it covers our own commit's version
                self._vouched[namespace] = store_module.revision(committed)
            return why_not
        message = f"namespace {namespace}: gave up after {MAX_ATTEMPTS} conflicting updates of its budget ledger; will retry"
        return dict.fromkeys(uids, message)

    async def _read(self, namespace: str, *, attempt: int) -> _Read:
        """The namespace's budget Lease (version R) and a view of its pods complete up to R (the
        node ledger's read, `binder._read`, per namespace): the cache's Lease and pods where the pod
        watch has delivered everything up to R, or R is our own last commit, decided on this cache
        (it pruned only what this cache showed bound or gone); else a GET of the Lease and, unless
        the pod watch is past it already, a LIST of the namespace's pods as of R or later."""
        cache = self._cache
        if attempt == 0 and cache.synced:
            lease = cache.budget_lease(namespace)
            version = store_module.revision(lease) if lease is not None else cache.budget_lease_floor(namespace)
            own = lease is not None and version >= 0 and self._vouched.get(namespace) == version
            if version >= 0 and (own or await cache.wait_for_pods(version, timeout=POD_CATCH_UP_S)):
                return _Read(lease=lease)
        try:
            lease = await self._api.get_lease(self._home, budgets.lease_name(namespace))
        except kube_errors.NotFound:
            lease = None  # never written (it has no owner and the extender deletes none): nothing was ever pruned
        if lease is not None and budgets.lease_namespace(lease, home=self._home) != namespace:
            raise kube_errors.KubeError(
                f"the Lease {self._home}/{budgets.lease_name(namespace)} is not this namespace's budget ledger", status=409
            )
        version = store_module.revision(lease) if lease is not None else -1
        if lease is not None:
            cache.put_budget_lease(lease)
        if version >= 0 and cache.pods_synced and await cache.wait_for_pods(version, timeout=0.0):
            return _Read(lease=lease)
        return _Read(
            lease=lease, pods=await self._api.list_namespace_pods(namespace, at_least=str(version) if version >= 0 else "")
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Asked:
    """One charge waiting in its namespace's queue."""

    pod: Mapping[str, Any]
    charge: budgets.Charge
    expires: float | None
    future: asyncio.Future[str]

    @property
    def uid(self) -> str:
        return str(podspec.mapping(self.pod.get("metadata")).get("uid", ""))

    @property
    def name(self) -> str:
        return str(podspec.mapping(self.pod.get("metadata")).get("name", ""))


@dataclasses.dataclass(kw_only=True)
class _Queue:
    pending: list[_Asked] = dataclasses.field(default_factory=list)
    task: asyncio.Task[None] | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Read:
    lease: Mapping[str, Any] | None  # the budget Lease as read (its resourceVersion guards the write); None: none yet
    pods: list[dict[str, Any]] | None = None  # the namespace's pods as listed; None: the cache's vouch for the read


def _refuse(outcome: placement.Outcome, names: list[str], messages: Mapping[str, str] | str, *, never: bool) -> placement.Outcome:
    """`outcome` with `names` moved from passed to failed (or unresolvable with `never`)."""
    moved = set(names)
    target = outcome.unresolvable if never else outcome.failed
    for name in names:
        message = messages if isinstance(messages, str) else messages[name]
        target[name] = message
        outcome.reasons[name] = (reasons.Reason(code=reasons.Code.NAMESPACE_BUDGET, message=message),)
    outcome.passed[:] = [name for name in outcome.passed if name not in moved]
    return outcome


# --- inspect and metrics -----------------------------------------------------------------------------

MIB = 1 << 20
METRIC_NAMES = (
    "gpu_admission_extender_namespace_gpu_memory_budget_bytes",
    "gpu_admission_extender_namespace_gpu_memory_used_bytes",
    "gpu_admission_extender_namespace_gpu_cards_budget",
    "gpu_admission_extender_namespace_gpu_cards_used",
    "gpu_admission_extender_budget_conflicts_total",
)


def inspect_rows(keeper: Keeper, *, now: float) -> list[dict[str, Any]]:
    """Used and budget per budgeted namespace, for `/inspect` (`budgets`), as `gpu-admission inspect` shows them."""
    return [row(namespace, budget, used) for namespace, budget, used in keeper.budgeted(now=now)]


def row(namespace: str, budget: settings_budgets.Budget, used: budgets.Usage) -> dict[str, Any]:
    """One namespace's budget and usage, as `/inspect` and `gpu-admission inspect --config` write it."""
    return {
        "namespace": namespace,
        "budget": budget.name,
        "memoryBudgetMiB": budget.memory_mib,
        "memoryUsedMiB": used.total.memory_mib,
        "cardsBudget": budget.cards,
        "cardsUsed": used.total.cards,
        "holders": len(used.by_holder),
        "unknownCharges": sorted(used.problems.values())[:5],
    }


class Collector:
    """The namespaces' budgets and usage as Prometheus gauges, computed at scrape time."""

    def __init__(self, keeper: Keeper, *, clock: Callable[[], float] = time.time) -> None:
        self._keeper, self._clock = keeper, clock

    def collect(self) -> list[Any]:
        labels = ["namespace", "budget"]
        families: list[Any] = [
            GaugeMetricFamily(METRIC_NAMES[0], "GPU memory a namespace's budget allows (gpuBudgets).", labels=labels),
            GaugeMetricFamily(
                METRIC_NAMES[1],
                "GPU memory charged to a budgeted namespace (bound pods, claims, binds in flight).",
                labels=labels,
            ),
            GaugeMetricFamily(METRIC_NAMES[2], "Whole cards a namespace's budget allows, where it limits them.", labels=labels),
            GaugeMetricFamily(METRIC_NAMES[3], "Whole cards charged to a budgeted namespace.", labels=labels),
        ]
        conflicts = CounterMetricFamily(
            METRIC_NAMES[4].removesuffix("_total"),
            "Compare-and-swap conflicts on the namespaces' budget Leases (another replica wrote first; retried).",
        )
        conflicts.add_metric([], self._keeper.conflicts)
        families.append(conflicts)
        for namespace, budget, used in self._keeper.budgeted(now=self._clock()):
            values = [namespace, budget.name]
            families[0].add_metric(values, budget.memory_mib * MIB)
            families[1].add_metric(values, used.total.memory_mib * MIB)
            if budget.cards is not None:
                families[2].add_metric(values, budget.cards)
            families[3].add_metric(values, used.total.cards)
        return families
