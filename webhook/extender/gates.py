"""The budget gate's keeper: lifts `gpu-admission.io/budget` from pods once their charge is in their
namespace's ledger.

Pods the device plugin or DRA places (`nvidia.com/gpu`, `nvidia.com/gpu.shared`, MIG slices, DRA
claims) never reach the extender's filter or bind, so in a namespace with a GPU budget the admission
webhook creates them behind the scheduling gate `policies.gpu.budgets.GATE` (GPU107), which only the
extender's ServiceAccount may remove (GPU013). `Gatekeeper` runs in the extender, once a second and
whenever woken (`wake`: a gated pod appeared, a namespace's usage went down), once its cache has
its first lists, and for every pod of the cache that carries the gate:

- in a namespace without a budget (none, or one removed since the pod was created): lifts the gate
  without a charge, so a budget removed later strands no pod;
- where the budgets cannot be read (`Keeper.budget_of` raises): keeps the pod gated and logs why,
  never failing open;
- where the pod's charge (`budgets.gate_charge`: the most any node of the cluster could charge it)
  cannot be computed, or alone exceeds the budget: keeps it gated, with an Event saying why;
- while another scheduling gate holds the pod too (Kueue's, say): leaves it, uncharged, until that
  gate is lifted, so a pod held elsewhere neither takes its namespace's room nor a turn in its queue;
- else asks the keeper to commit the charge to the namespace's ledger (`Keeper.charge`, no expiry:
  the entry holds until the pod is seen bound, finished or gone) and, once committed, lifts the gate.
  A refusal (the NAMESPACE_BUDGET message) keeps the pod gated, with an Event; a failure to write
  the ledger (the keeper raises) keeps it gated until a later pass, and is logged.

The Event (reason `NamespaceBudget`, type Warning like kube-scheduler's FailedScheduling) says which
budget, what is used and what the pod asks; at most one per pod per `EVENT_INTERVAL_S`, and at most
`EVENTS_PER_PASS` per pass, written together once the pass has lifted what it could.

**Order.** Each pass takes the gated pods oldest first (`metadata.creationTimestamp`, then the order
this process first saw them), and within a namespace strictly first come, first served: once the
keeper refuses a pod, the younger gated pods of that namespace wait for this pass too, even those
small enough to fit. Otherwise a stream of small pods would take every bit of room a big pod waits
for, and it would starve for ever. A pod that can never fit (its charge alone is over the budget,
which GPU014 warned about at admission) or whose charge is unknown does not hold the queue up.

**The lift** is a JSON patch (`lift_patch`) that tests the pod's UID and that the entry at the gate's
index is the gate before it removes it: a pod replaced under the same name, or a gate list that
changed since the cache saw it, fails the test (422) and nothing is removed; the next pass, on
fresher data, tries again. The charge stays in the ledger meanwhile, and `Keeper.charge` of the same
pod again replaces its entry (the ledger is by pod UID), so nothing is charged twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import itertools
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from policies import podspec
from policies.gpu import allocation, budgets
from policies.settings import budgets as budget_settings
from webhook.kube import errors as kube_errors
from webhook.kube import leader

log = logging.getLogger(__name__)

Object = dict[str, Any]
INTERVAL_S = 1.0  # a pass at least this often, woken or not
EVENT_INTERVAL_S = 60.0  # at most one Event per gated pod per minute
EVENTS_PER_PASS = 50  # written together at the end of a pass; the rest wait for the next passes
EVENT_REASON = "NamespaceBudget"
COMPONENT = "gpu-admission-extender"
MAX_MESSAGE = 1024


class Keeper(Protocol):
    """The namespace budgets' keeper (the extender's budgeting module)."""

    def budget_of(self, namespace: str) -> budget_settings.Budget | None:
        """The namespace's budget; None: unlimited. Raises (any Exception) when the budgets cannot be read."""
        ...

    async def charge(self, pod: Mapping[str, Any], charge: budgets.Charge, *, expires: float | None) -> str:
        """Commit `charge` for `pod` to its namespace's ledger: "" when committed, else why not (NAMESPACE_BUDGET)."""
        ...


class Cache(Protocol):
    """The extender's watch cache (`store.Store`): slim pods, with `spec.schedulingGates`, and Nodes."""

    @property
    def synced(self) -> bool:
        """Whether the first lists are in (before, a pod's charge could miss the nodes' card memory)."""
        ...

    def pods(self) -> list[Object]: ...

    def nodes(self) -> list[Object]: ...

    def claims_gate_charge(self, pod: Mapping[str, Any]) -> budgets.Charge:
        """What the pod's DRA claims are charged at the gate (`Store.claims_gate_charge`)."""
        ...


class GateApi(Protocol):
    """What the gatekeeper writes (`api.Api`'s last two methods)."""

    async def json_patch_pod(self, namespace: str, name: str, operations: Sequence[Mapping[str, Any]]) -> Object: ...

    async def create_event(self, namespace: str, body: Mapping[str, Any]) -> Object: ...


def lift_patch(*, uid: str, index: int) -> list[dict[str, Any]]:
    """The JSON patch (RFC 6902) that removes the budget gate at `index` from the pod of `uid`, and
    fails (nothing removed) where the pod or the entry at that index is another."""
    at = f"/spec/schedulingGates/{index}"
    return [
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "test", "path": at, "value": {"name": budgets.GATE}},
        {"op": "remove", "path": at},
    ]


def event_body(pod: Mapping[str, Any], message: str, *, now: float) -> dict[str, Any]:
    """A core/v1 Event on the pod in client-go's recorder shape (name `<pod>.<unix ns in hex>`)."""
    metadata = podspec.mapping(pod.get("metadata"))
    name, namespace = str(metadata.get("name", "")), str(metadata.get("namespace", ""))
    stamp = datetime.datetime.fromtimestamp(now, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 3] + "..."
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.{int(now * 1e9):x}", "namespace": namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": namespace,
            "name": name,
            "uid": str(metadata.get("uid", "")),
        },
        "reason": EVENT_REASON,
        "message": message,
        "type": "Warning",
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


@dataclasses.dataclass(kw_only=True)
class Pass:
    """What one pass did, by pod (namespace/name)."""

    lifted: list[str] = dataclasses.field(default_factory=list)  # gate removed (charged, or no budget)
    kept: dict[str, str] = dataclasses.field(default_factory=dict)  # still gated, and why


class Gatekeeper:
    """Lifts the budget gate from pods whose charge the keeper committed (see the module docstring)."""

    def __init__(
        self,
        keeper: Keeper,
        cache: Cache,
        api: GateApi,
        *,
        interval: float = INTERVAL_S,
        event_interval: float = EVENT_INTERVAL_S,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        elector: leader.Elector | None = None,
    ) -> None:
        self._keeper = keeper
        self._cache = cache
        self._api = api
        # Only the leader of the replicas' election (its own Lease, `elector_for`) lifts gates, so
        # that replicas do not each write the same NamespaceBudget Events (a second lift of one pod
        # would only fail its JSON patch's test). None: this process alone (tests).
        self._elector = elector
        self._interval = interval
        self._event_interval = event_interval
        self._monotonic = monotonic
        self._wall = wall
        self._wake = asyncio.Event()
        self._seen: dict[str, int] = {}  # uid -> the order this process first saw it gated
        self._counter = itertools.count()
        self._evented: dict[str, float] = {}  # uid -> when its last Event was written
        self._lifted: dict[str, str] = {}  # uid -> the resourceVersion it had when its gate was lifted
        self._unreadable_logged: dict[str, float] = {}  # namespace -> when that was last logged

    def wake(self) -> None:
        """Run a pass soon (a gated pod appeared, or a namespace's usage went down)."""
        self._wake.set()

    async def run(self) -> None:
        """Contend for the election (where there is an elector); a pass every `interval` or when
        woken, until cancelled; a failed pass is logged, the loop goes on."""
        async with contextlib.AsyncExitStack() as stack:
            if self._elector is not None:
                await stack.enter_async_context(leader.elected(self._elector))
            while True:
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=self._interval)
                except TimeoutError:
                    pass
                self._wake.clear()
                try:
                    await self.run_once()
                except Exception:  # noqa: BLE001 - the next pass tries again; pods stay gated meanwhile
                    log.warning("budget gate pass failed", exc_info=True)

    def _gated(self) -> list[tuple[Object, int]]:
        """The pods to look at now, each with its gate's index, oldest first."""
        found: list[tuple[Object, int]] = []
        live: set[str] = set()
        for pod in self._cache.pods():
            index = budgets.gate_index(podspec.mapping(pod.get("spec")))
            metadata = podspec.mapping(pod.get("metadata"))
            uid = str(metadata.get("uid", ""))
            if index is None or not uid or allocation.is_terminal(pod) or metadata.get("deletionTimestamp"):
                continue
            live.add(uid)
            if uid in self._lifted and self._lifted[uid] == str(metadata.get("resourceVersion", "")):
                continue  # lifted; the cache has not seen the update yet
            self._seen.setdefault(uid, next(self._counter))
            found.append((pod, index))
        for book in (self._seen, self._evented, self._lifted):
            for uid in [uid for uid in book if uid not in live]:
                del book[uid]

        def order(item: tuple[Object, int]) -> tuple[str, int]:
            metadata = podspec.mapping(item[0].get("metadata"))
            created = metadata.get("creationTimestamp")
            # RFC 3339 in UTC ("...Z") sorts as text; a pod without one sorts after those with one.
            return (created if isinstance(created, str) and created else "~", self._seen[str(metadata.get("uid"))])

        return sorted(found, key=order)

    async def run_once(self) -> Pass:
        """One pass over the gated pods of the cache."""
        done = Pass()
        if not self._cache.synced or (self._elector is not None and not self._elector.leader):
            return done
        gated = self._gated()
        if not gated:
            return done
        nodes = self._cache.nodes()
        waiting: dict[str, str] = {}  # namespace -> the older pod refused this pass
        unreadable: set[str] = set()
        told: list[tuple[Object, str]] = []  # the Events to write, after the pass
        for pod, index in gated:
            metadata = podspec.mapping(pod.get("metadata"))
            namespace, name = str(metadata.get("namespace", "")), str(metadata.get("name", ""))
            key = f"{namespace}/{name}"
            if namespace in unreadable:
                done.kept[key] = "the namespace's budget cannot be read"
                continue
            try:
                budget = self._keeper.budget_of(namespace)
            except Exception as error:  # noqa: BLE001 - any failure to read: the pod stays gated
                unreadable.add(namespace)
                done.kept[key] = "the namespace's budget cannot be read"
                self._log_unreadable(namespace, error)
                continue
            if budget is None:
                if await self._lift(pod, index):
                    done.lifted.append(key)
                continue
            others = _other_gates(pod)
            if others:
                # Charged only once nothing else holds it: a pod another gate keeps (Kueue's queue, say)
                # would hold its namespace's room for nothing, and it takes no turn in the queue.
                done.kept[key] = f"waits for its other scheduling gates first ({', '.join(others)})"
                continue
            charge = budgets.gate_charge(pod, nodes) + self._cache.claims_gate_charge(pod)
            if namespace in waiting:
                why = (
                    f"asks for {charge.describe()} and waits for the older pod {waiting[namespace]}, first in line "
                    f"for {budget.describe()}"
                )
                done.kept[key] = why
                told.append((pod, why))
                continue
            why = self._never(budget, charge)
            if not why:
                try:
                    why = await self._keeper.charge(pod, charge, expires=None)
                except Exception as error:  # noqa: BLE001 - the ledger write failed: not this pass, and nobody jumps the queue
                    log.warning("cannot commit the charge of %s to its namespace's ledger: %s", key, error)
                    waiting[namespace] = key
                    done.kept[key] = f"its charge could not be committed: {error}"
                    continue
                if why:
                    waiting[namespace] = key
            if why:
                done.kept[key] = why
                told.append((pod, why))
                continue
            if await self._lift(pod, index):
                done.lifted.append(key)
        await self._tell(told)
        return done

    async def _tell(self, told: list[tuple[Object, str]]) -> None:
        """The Events of the pods kept gated whose last one is a minute old, at most `EVENTS_PER_PASS`, at once."""
        now = self._monotonic()
        due = [(pod, why) for pod, why in told if now - self._evented.get(_uid(pod), -math.inf) >= self._event_interval]
        due = due[:EVENTS_PER_PASS]
        for pod, _ in due:
            self._evented[_uid(pod)] = now
        await asyncio.gather(*(self._event(pod, f"waiting at scheduling gate {budgets.GATE}: {why}") for pod, why in due))

    @staticmethod
    def _never(budget: budget_settings.Budget, charge: budgets.Charge) -> str:
        """Why the pod cannot be judged or can never fit ("" otherwise): such a pod holds up no queue."""
        if charge.problem:
            return f"its charge against {budget.describe()} cannot be computed: {charge.problem}"
        over = budgets.over(budget.memory_mib, budget.cards, budgets.NOTHING, charge)
        if over:
            return f"{budget.describe()}: {over}; the pod alone asks for more than the budget, so it can never run here"
        return ""

    async def _lift(self, pod: Mapping[str, Any], index: int) -> bool:
        metadata = podspec.mapping(pod.get("metadata"))
        namespace, name, uid = (str(metadata.get(k, "")) for k in ("namespace", "name", "uid"))
        try:
            await self._api.json_patch_pod(namespace, name, lift_patch(uid=uid, index=index))
        except kube_errors.KubeError as error:
            # 422: a test failed (another pod of that name, the gate list changed); 404: gone; 409: raced.
            expected = error.status in (404, 409, 422)
            log.log(
                logging.INFO if expected else logging.WARNING,
                "cannot lift %s from %s/%s: %s",
                budgets.GATE,
                namespace,
                name,
                error,
            )
            return False
        self._lifted[uid] = str(metadata.get("resourceVersion", ""))
        self._evented.pop(uid, None)
        log.info("lifted %s from %s/%s", budgets.GATE, namespace, name)
        return True

    async def _event(self, pod: Mapping[str, Any], message: str) -> None:
        metadata = podspec.mapping(pod.get("metadata"))
        namespace = str(metadata.get("namespace", ""))
        try:
            await self._api.create_event(namespace, event_body(pod, message, now=self._wall()))
        except Exception:  # noqa: BLE001 - an Event lost only costs the explanation
            log.warning("cannot record the %s event on %s/%s", EVENT_REASON, namespace, metadata.get("name"), exc_info=True)

    def _log_unreadable(self, namespace: str, error: Exception) -> None:
        now = self._monotonic()
        if now - self._unreadable_logged.get(namespace, -math.inf) < self._event_interval:
            return
        self._unreadable_logged[namespace] = now
        log.warning("pods of namespace %s stay behind %s: its GPU budget cannot be read: %s", namespace, budgets.GATE, error)


def _uid(pod: Mapping[str, Any]) -> str:
    return str(podspec.mapping(pod.get("metadata")).get("uid", ""))


def _other_gates(pod: Mapping[str, Any]) -> list[str]:
    """The names of the pod's scheduling gates but the budget gate."""
    gates_ = podspec.sequence(podspec.mapping(pod.get("spec")).get("schedulingGates"))
    return [str(g.get("name")) for g in gates_ if isinstance(g, Mapping) and g.get("name") != budgets.GATE]


LEASE_NAME = "gpu-admission-extender-budget-gate"


def elector_for(client: Any, *, namespace: str) -> leader.Elector:
    """The Lease election among extender replicas for lifting budget gates (its own Lease: the
    leader of the taint rules may be a replica that keeps no budgets)."""
    return leader.Elector(
        leader.KubeLeaseStore(client, namespace=namespace, name=LEASE_NAME),
        namespace=namespace,
        name=LEASE_NAME,
        identity=leader.identity(),
    )
