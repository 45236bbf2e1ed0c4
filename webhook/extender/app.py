"""The extender's aiohttp application: the four scheduler verbs, inspect, probes and metrics.

Two error channels, as for the webhook: a body the scheduler would never send (not JSON, wrong
shape) gets HTTP 400 with a JSON body saying what is wrong, in the verb's own answer type where
that type has an `Error` field. Everything else is HTTP 200, failures included (`Error` set):
kube-scheduler only reads the message of a 200, and nothing here answers 500.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import gc
import itertools
import json
import logging
import operator
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Hashable
from typing import Any, Protocol, TypeVar

import orjson
from aiohttp import web

from policies import podspec
from policies.gpu import allocation, cardrequest, cards, inspection, reservations
from webhook.extender import (
    binder,
    budgeting,
    gates,
    holds,
    nudge,
    occupancy,
    overview,
    placement,
    preemption,
    reality,
    taints,
    wire,
)
from webhook.extender import store as store_module
from webhook.serving import metrics

log = logging.getLogger(__name__)

# A filter body carries one Pod and the node names (or, without nodeCacheCapable, every Node).
MAX_BODY_BYTES = 16 * 1024 * 1024
# 15, 20, 30 and 40 ms (issue 19): the filter's p99 goal is 20 ms at 5,000 nodes, and between 10 and
# 50 ms histogram_quantile's linear estimate could be off by up to 25 ms.
FINE_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


class Watch(Protocol):
    """Keeps the store in step with the apiserver while the app runs (`kube.Watcher`)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    ttl: float = allocation.DEFAULT_RESERVATION_TTL_S
    clock: Callable[[], float] = time.time
    # Refuse the verbs and /inspect to callers without a verified client certificate. The TLS
    # context asks for one but does not insist (CERT_OPTIONAL), so kubelet probes of /healthz work.
    require_client_certificate: bool = False
    # --honour-out-of-band-usage: Nodes sent by kube-scheduler are read less out-of-band use too
    # (the cache and bind apply it themselves; see `reality`).
    honour_out_of_band: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class Meters:
    registry: metrics.Registry
    requests: metrics.Counter
    duration: metrics.Histogram
    nodes: metrics.Counter
    conflicts: metrics.Counter
    reasons: metrics.Counter
    preempted_nodes: metrics.Counter
    victims: metrics.Counter


def make_meters() -> Meters:
    """The extender's meters; latency per verb is the histogram (quantiles: histogram_quantile)."""
    registry = metrics.Registry(runtime=True)
    return Meters(
        registry=registry,
        requests=registry.register(
            metrics.Counter(
                "gpu_admission_extender_requests_total",
                "Extender requests by verb and result (ok, error, bad_request).",
                ("verb", "result"),
            )
        ),
        duration=registry.register(
            metrics.Histogram(
                "gpu_admission_extender_request_duration_seconds",
                "Time to answer a scheduler call.",
                ("verb",),
                buckets=FINE_BUCKETS,
            )
        ),
        nodes=registry.register(
            metrics.Counter(
                "gpu_admission_extender_filtered_nodes_total",
                "Nodes judged by filter: passed, failed (full now), unresolvable (never fits).",
                ("outcome",),
            )
        ),
        conflicts=registry.register(
            metrics.Counter(
                "gpu_admission_extender_bind_conflicts_total",
                "Compare-and-swap conflicts on a node's reservation ledger (retried).",
                (),
            )
        ),
        reasons=registry.register(
            metrics.Counter(
                "gpu_admission_extender_filter_reasons_total",
                "Why filter turned nodes away, by stable reason code (as `gpu-admission explain` shows them).",
                ("code",),
            )
        ),
        preempted_nodes=registry.register(
            metrics.Counter(
                "gpu_admission_extender_preemption_nodes_total",
                "Candidate nodes of kube-scheduler's preemption: kept (victims free one card) or dropped (no such set).",
                ("outcome",),
            )
        ),
        victims=registry.register(
            metrics.Counter(
                "gpu_admission_extender_preemption_victims_total",
                "Victims the preempt verb returned that were not being deleted already (evictions it asked for).",
                (),
            )
        ),
    )


STORE = web.AppKey("store", store_module.Store)
BINDER = web.AppKey("binder", binder.Binder)
SETTINGS = web.AppKey("settings", Settings)
METERS = web.AppKey("meters", Meters)
WATCH: web.AppKey[Callable[[asyncio.AbstractEventLoop], Watch]] = web.AppKey("watch")
TIDY_EVERY = web.AppKey("tidy_every", float)
TAINT_KEEPER = web.AppKey("taint_keeper", taints.Keeper)  # the leader's DRA DeviceTaintRules
OVERVIEW = web.AppKey("overview", overview.Overview)
NUDGER = web.AppKey("nudger", nudge.Nudger)
# The victims the preempt verb last answered per preemptor (`preemption.Promises`). kube-scheduler
# may call again while the first victims are being evicted (its async preemption deletes all but the
# last victim first); the same victims are then answered again rather than a new set.
PROMISED = web.AppKey("promised", preemption.Promises)
# Lists the cluster's PodDisruptionBudgets for the preempt verb (absent: no budget is known).
BUDGETS: web.AppKey[Callable[[], Awaitable[list[dict[str, Any]]]]] = web.AppKey("budgets")
# Writes a record of each nomination the preempt verb led to (`holds`); absent: the hold lives only
# as long as kube-scheduler's nomination.
HOLDS = web.AppKey("holds", holds.Recorder)
# The namespaces' GPU budgets (`budgeting`); absent: no budget is kept (every namespace unlimited).
KEEPER = web.AppKey("keeper", budgeting.Keeper)
# Lifts the budget gate of pods the extender does not place once their charge is committed (`gates`).
GATEKEEPER = web.AppKey("gatekeeper", gates.Gatekeeper)


def make_app(
    *,
    cache: store_module.Store,
    bind: binder.Binder,
    settings: Settings | None = None,
    watch: Callable[[asyncio.AbstractEventLoop], Watch] | None = None,
    tidy_every: float | None = None,
    nudger: nudge.Nudger | None = None,
    budgets: Callable[[], Awaitable[list[dict[str, Any]]]] | None = None,
    leases: holds.LeaseApi | None = None,
    ledger_namespace: str = reservations.LEDGER_NAMESPACE,
    max_body_bytes: int = MAX_BODY_BYTES,
    taint_keeper: taints.Keeper | None = None,
    keeper: budgeting.Keeper | None = None,
    gatekeeper: gates.Gatekeeper | None = None,
) -> web.Application:
    """The extender app. `watch`, when given, starts keeping `cache` in step on app start-up;
    `tidy_every` (seconds), when given, prunes stale reservation ledgers in the background;
    `nudger`, when given, hears of turned-away pods and freed cards and stamps Nodes for
    kube-scheduler (`nudge`); `taint_keeper`, when given, keeps the DRA DeviceTaintRules of cards
    that hold shared pods (`taints`); `leases`, when given, is where the preemption holds are
    recorded (the hold Leases in `ledger_namespace`: `holds`); `keeper`, when given, keeps the
    namespaces' GPU budgets in filter, preempt, `/inspect` and `/metrics` (bind keeps them through
    its own keeper: `binder.Binder`); `gatekeeper`, when given, lifts the budget gate of the pods
    kube-scheduler places alone (`gates`)."""
    app = web.Application(client_max_size=max_body_bytes, middlewares=[_observe])
    app[STORE] = cache
    app[BINDER] = bind
    app[SETTINGS] = settings or Settings()
    app[METERS] = make_meters()
    # The occupancy families (`occupancy.Collector`, `occupancy.UsageCollector`) are written by
    # `overview` from per-node parts after the registry's text (issue 19: 5 s per scrape at 5,000
    # nodes otherwise); the registry only knows their names.
    app[OVERVIEW] = overview.Overview(cache)
    app[METERS].registry.register_collector(overview.Names(), names=(*occupancy.NAMES, *occupancy.USAGE_NAMES))
    if watch is not None:
        app[WATCH] = watch
        app.cleanup_ctx.append(_watching)
        app.cleanup_ctx.append(_background("warm the node states", _warm))
    if tidy_every is not None:
        app[TIDY_EVERY] = tidy_every
        app.cleanup_ctx.append(_background("tidy reservation ledgers", _tidy))
    if nudger is not None:
        app[NUDGER] = nudger
        cache.on_freed = nudger.freed
        app.cleanup_ctx.append(_background("stamp nodes whose cards came free", lambda app: app[NUDGER].run()))
    if taint_keeper is not None:
        app[TAINT_KEEPER] = taint_keeper
        app.cleanup_ctx.append(_background("keep the DRA taint rules", lambda app: app[TAINT_KEEPER].run()))
    if keeper is not None:
        app[KEEPER] = keeper
    if gatekeeper is not None:
        app[GATEKEEPER] = gatekeeper
        cache.on_gated = gatekeeper.wake
        app.cleanup_ctx.append(_background("lift budget gates", lambda app: app[GATEKEEPER].run()))
    if keeper is not None:

        def freed(namespace: str, node: str) -> None:
            # Room in a budget: gated pods may go, and kube-scheduler retries a turned-away pod only
            # on an event; a pod deleted before our watch saw it, or a ledger entry gone, sent none
            # it acts on: a Node update is one (`nudge`). Namespaces without a budget free none.
            try:
                if keeper.budget_of(namespace) is None:
                    return
            except budgeting.Unreadable:
                pass  # it may have one: tell
            if gatekeeper is not None:
                gatekeeper.wake()
            if nudger is not None and (node := node or cache.any_node()):
                nudger.freed(node)

        cache.on_budget_freed = freed
        app[METERS].registry.register_collector(
            budgeting.Collector(keeper, clock=app[SETTINGS].clock), names=budgeting.METRIC_NAMES
        )
    app.router.add_post("/filter", filter_nodes)
    app.router.add_post("/prioritize", prioritize)
    app.router.add_post("/bind", bind_pod)
    app.router.add_post("/preempt", preempt)
    app[PROMISED] = preemption.Promises()
    if budgets is not None:
        app[BUDGETS] = budgets
    if leases is not None:
        app[HOLDS] = holds.Recorder(
            leases, cache, namespace=ledger_namespace, clock=app[SETTINGS].clock, promised=app[PROMISED].of
        )
        cache.on_nominated = app[HOLDS].nominated
        app.cleanup_ctx.append(_background("record preemption holds", lambda app: app[HOLDS].run()))
    app.router.add_get("/inspect", inspect_all)
    app.router.add_get("/inspect/{node}", inspect_node)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", healthz)
    app.router.add_get("/metrics", metrics_text)
    return app


def _background(
    name: str, work: Callable[[web.Application], Coroutine[Any, Any, None]]
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A cleanup context that runs `work(app)` as a task while the app runs and cancels it after."""

    async def running(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(work(app), name=name)
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return running


async def _watching(app: web.Application) -> AsyncIterator[None]:
    watcher = app[WATCH](asyncio.get_running_loop())
    watcher.start()
    yield
    watcher.stop()


WARM_SLICE_S = 0.002  # CPU the warming takes between two turns of the event loop: a filter waits at most this long


async def _warm(app: web.Application) -> None:
    """Compute every node's card state once the first lists are in, a slice of a few milliseconds
    per turn of the event loop. Otherwise the first filters after a start compute them, a few
    hundred per call: at 5,000 nodes the first ten filters took 20 ms each, which was the whole of
    a 1,000-pod round's p99 (issue 19). Answers do not change: the store computes the same states
    on demand; a node a filter reached first is a cache hit here. `/metrics` and `/inspect`'s
    per-node parts (`overview`) are computed alongside: the first scrape at 5,000 nodes took 3 s."""
    cache, settings, views = app[STORE], app[SETTINGS], app[OVERVIEW]
    while not cache.synced:
        await asyncio.sleep(0.05)
    names = [str(podspec.mapping(node.get("metadata")).get("name", "")) for node in cache.nodes()]
    sliced = time.perf_counter() + WARM_SLICE_S
    for name in names:
        cache.state(name, now=settings.clock(), ttl=settings.ttl)
        views.prepare(name, now=settings.clock(), ttl=settings.ttl)  # and the first /metrics scrape's parts
        if time.perf_counter() >= sliced:
            await asyncio.sleep(0)
            sliced = time.perf_counter() + WARM_SLICE_S
    # What is here now (the modules, the listed Nodes and Pods, their states) lives long: frozen, the
    # cyclic collector's full passes stop walking it. In a 1,000-pod burst at 500 nodes they took
    # about 0.35 ms of CPU per pod and paused the loop for up to 160 ms (issue 19, bench/README.md).
    # Objects frozen here are still freed by reference counting when the store drops them (the
    # JSON the watches decode holds no cycles); only cyclic garbage among them would stay.
    gc.freeze()


async def _tidy(app: web.Application) -> None:
    """Prune ledgers holding entries that no longer count (expired, or of pods gone, finished or
    placed elsewhere). Filter and bind already leave such entries out, but they stay in the ledger
    Lease until a prune or the node's next bind rewrites it; pruned, the Lease stays small to read
    and write, and `inspect`, `explain` and the audit show only what counts. The prune writes the
    Lease alone, which kube-scheduler does not watch: the store tells the nudger of the freed cards
    (as it does of reservations that simply lapsed, which this pass notices), and the nudger stamps
    the Node when pods were turned away (`nudge`)."""
    cache, bind, settings = app[STORE], app[BINDER], app[SETTINGS]
    while True:
        await asyncio.sleep(app[TIDY_EVERY])
        if not cache.synced:
            continue
        now = settings.clock()
        cache.budget_lapsed(now=now)  # budget room an expired ledger entry freed: `on_budget_freed`
        for name in cache.lapsed(now=now):
            cache.state(name, now=now, ttl=settings.ttl)  # a free that no event brought reaches the nudger
        for name in cache.stale_ledgers(now=now):
            try:
                await bind.prune(name)
            except Exception:  # noqa: BLE001 - tidying is best effort; the next pass tries again
                log.warning("pruning the ledger of %s failed", name, exc_info=True)


class _BadRequest(Exception):
    """The body is not an extender request; answered with 400."""


# orjson reads an integer past 64 bits as a float where json keeps it exact: a body with 19 digits
# in a row (anywhere; the check must stay a C-speed pass) goes to json.
_DIGITS_ONLY = bytes(ord("0") if chr(b).isdigit() and b < 128 else ord(" ") for b in range(256))
_NINETEEN_DIGITS = b"0" * 19


async def _json(request: web.Request) -> Any:
    body = await request.read()  # HTTPRequestEntityTooLarge (413) passes through
    if request.charset in (None, "utf-8") and _NINETEEN_DIGITS not in body.translate(_DIGITS_ONLY):
        # orjson decodes a filter body in half json's time (issue 19). What it refuses (not UTF-8,
        # NaN, a lone surrogate, a BOM, nothing) goes on to json, so the same bodies are refused
        # with the same messages, and what it reads it reads as json does.
        with contextlib.suppress(orjson.JSONDecodeError):
            return orjson.loads(body)
    charset = request.charset or "utf-8"
    try:
        text = body.decode(charset)
    except LookupError as error:
        raise _BadRequest(f"unknown charset {charset!r} in the Content-Type") from error
    except UnicodeDecodeError as error:
        raise _BadRequest(f"the body is not {charset}: {error}") from error
    if not text.strip():
        raise _BadRequest("the body is empty; expected JSON")
    try:
        return json.loads(text)
    except RecursionError as error:
        raise _BadRequest("the body is nested too deeply to be an extender request") from error
    except ValueError as error:
        raise _BadRequest(f"the body is not JSON: {error}") from error


async def filter_nodes(request: web.Request) -> web.Response:
    meters = request.app[METERS]
    try:
        args = wire.parse_nodes_request(await _json(request))
    except (_BadRequest, wire.WireError) as error:
        meters.requests.inc(verb="filter", result="bad_request")
        return web.json_response(wire.filter_error(f"bad filter request: {error}"), status=400)
    cache, settings = request.app[STORE], request.app[SETTINGS]
    if not cache.synced:
        meters.requests.inc(verb="filter", result="error")
        return web.json_response(wire.filter_error("the GPU extender is still loading nodes and pods; retry"))
    if not cache.dra_synced:  # a card a DRA claim holds could look free until then
        meters.requests.inc(verb="filter", result="error")
        return web.json_response(
            wire.filter_error("the GPU extender is still loading DRA ResourceSlices and ResourceClaims; retry")
        )
    try:
        wanted = cardrequest.pod_request(args.pod)
        if args.nodes is None:  # nodeCacheCapable: verdicts on the cache's states, remembered per node state
            fits = _judged_list(
                cache,
                args,
                settings=settings,
                key=("filter", wanted),
                judge=lambda s: placement.evaluate(wanted, s, decide=False),
            )
            holds.judge_fits(cache, args.node_names, fits, pod=args.pod, wanted=wanted, now=settings.clock(), ttl=settings.ttl)
            outcome = placement.classify_in_order(fits, args.node_names)
        else:
            states = holds.held_states(cache, _states(cache, args, settings=settings), pod=args.pod, now=settings.clock())
            outcome = placement.filter_nodes(wanted, states=states, names=args.node_names)
        if KEEPER in request.app:
            outcome = request.app[KEEPER].judge(outcome, pod=args.pod, wanted=wanted, now=settings.clock())
    except Exception as error:  # noqa: BLE001 - a bug must fail this call, not the process
        log.exception("filter %s", args.pod_key)
        meters.requests.inc(verb="filter", result="error")
        return web.json_response(wire.filter_error(f"internal error in the GPU extender: {error}"))
    for name, count in (
        ("passed", len(outcome.passed)),
        ("failed", len(outcome.failed)),
        ("unresolvable", len(outcome.unresolvable)),
    ):
        meters.nodes.inc(count, outcome=name)
    if (outcome.failed or outcome.unresolvable) and NUDGER in request.app:
        request.app[NUDGER].refused()
    if outcome.reasons:  # one increment per code, not per node: a full cluster refuses hundreds of nodes per pod
        for code, count in collections.Counter(
            str(reason.code) for found in outcome.reasons.values() for reason in found
        ).items():
            meters.reasons.inc(count, code=code)
    meters.requests.inc(verb="filter", result="ok")
    if log.isEnabledFor(logging.DEBUG):
        log.debug("filter %s: %d of %d nodes fit", args.pod_key, len(outcome.passed), len(args.node_names))
    return _json_answer(
        wire.filter_result(passed=outcome.passed, failed=outcome.failed, unresolvable=outcome.unresolvable, request=args)
    )


async def prioritize(request: web.Request) -> web.Response:
    meters = request.app[METERS]
    try:
        args = wire.parse_nodes_request(await _json(request))
    except (_BadRequest, wire.WireError) as error:
        meters.requests.inc(verb="prioritize", result="bad_request")
        return web.json_response({"Error": f"bad prioritize request: {error}"}, status=400)
    cache, settings = request.app[STORE], request.app[SETTINGS]
    try:
        wanted = cardrequest.pod_request(args.pod)
        if args.nodes is None:
            # Each node's answer entry, encoded, remembered with its state: a hit costs a lookup (issue 19).
            entries = _judged_list(
                cache,
                args,
                settings=settings,
                key=("score-json", wanted),
                judge=lambda s: wire.host_priority_json(s.name, placement.score(wanted, s)),
            )
            if any(map(operator.is_, entries, itertools.repeat(None))):  # nodes not in the cache score 0
                unknown = wire.host_priority_json
                entries = [
                    unknown(name, 0) if entry is None else entry for name, entry in zip(args.node_names, entries, strict=True)
                ]
            body = wire.priorities_json(entries)  # type: ignore[arg-type]  # no None left (checked above)
            meters.requests.inc(verb="prioritize", result="ok")
            return _json_answer(body)
        scores = placement.scores(wanted, states=_states(cache, args, settings=settings), names=args.node_names)
    except Exception:  # noqa: BLE001 - a neutral answer beats a failed call; the scheduler ignores prioritize errors anyway
        log.exception("prioritize %s", args.pod_key)
        meters.requests.inc(verb="prioritize", result="error")
        scores = {name: 0 for name in args.node_names}
    else:
        meters.requests.inc(verb="prioritize", result="ok")
    return _json_answer(wire.priorities(scores))


async def bind_pod(request: web.Request) -> web.Response:
    meters = request.app[METERS]
    try:
        args = wire.parse_bind_request(await _json(request))
    except (_BadRequest, wire.WireError) as error:
        meters.requests.inc(verb="bind", result="bad_request")
        return web.json_response(wire.binding_result(f"bad bind request: {error}"), status=400)
    try:
        result = await request.app[BINDER].bind(args)
    except Exception as error:  # noqa: BLE001 - a bug must fail this bind (the scheduler retries), not the process
        log.exception("bind %s", args.pod_key)
        result = binder.BindResult(error=f"internal error in the GPU extender: {error}")
    if result.conflicts:
        meters.conflicts.inc(result.conflicts)
    meters.requests.inc(verb="bind", result="error" if result.error else "ok")
    return web.json_response(wire.binding_result(result.error))


async def preempt(request: web.Request) -> web.Response:
    """kube-scheduler's `preemptVerb`: for each candidate node its default preemption found, the
    victims that free the pod's request on one card (or one set of whole cards), or the node
    dropped where no such set exists (`preemption.select`). Only nodes kube-scheduler offered are
    answered (it would look victims up on any node it knows; we never widen its choice), and a node
    is never answered with no victim (kube-scheduler refuses that). A failure answers no node: no
    preemption is better than evicting pods for nothing."""
    meters = request.app[METERS]
    try:
        args = wire.parse_preempt_request(await _json(request))
    except (_BadRequest, wire.WireError) as error:
        meters.requests.inc(verb="preempt", result="bad_request")
        return web.json_response({"NodeNameToMetaVictims": {}, "Error": f"bad preempt request: {error}"}, status=400)
    cache = request.app[STORE]
    if not cache.synced:
        meters.requests.inc(verb="preempt", result="error")
        return _json_answer(wire.preemption_result({}))
    try:
        pdbs = await request.app[BUDGETS]() if BUDGETS in request.app else []
    except Exception:  # noqa: BLE001 - without the budgets the victims are still right; only the tie-break loses them
        log.warning("preempt %s: cannot list PodDisruptionBudgets", args.pod_key, exc_info=True)
        pdbs = []
    try:
        promises, settings = request.app[PROMISED], request.app[SETTINGS]
        now = settings.clock()
        uid = str(podspec.mapping(args.pod.get("metadata")).get("uid", ""))
        before = promises.current(uid, now=now)
        room = None
        if KEEPER in request.app:
            keeper, wanted = request.app[KEEPER], cardrequest.pod_request(args.pod)
            room = lambda node, victims: keeper.room_after(args.pod, wanted, node, victims, now=now)  # noqa: E731
        kept = preemption.answer(
            cache, args, now=now, ttl=settings.ttl, budgets=preemption.budgets_of(pdbs), promised=before, room=room
        )
        promises.answered(uid, kept, before=before, now=now)
    except Exception:  # noqa: BLE001 - a bug must fail this call safely (no node), not the process
        log.exception("preempt %s", args.pod_key)
        meters.requests.inc(verb="preempt", result="error")
        return _json_answer(wire.preemption_result({}))
    meters.requests.inc(verb="preempt", result="ok")
    meters.preempted_nodes.inc(len(kept), outcome="kept")
    meters.preempted_nodes.inc(len(args.victims) - len(kept), outcome="dropped")
    # Victims being deleted already, or answered before for this preemptor (a second call while the
    # first preemption's victims are evicted), cost nothing new: only new evictions are counted.
    meters.victims.inc(
        sum(
            1
            for uids, _ in kept.values()
            for victim in uids
            if not preemption.deleting(cache.pod(victim)) and victim not in before
        )
    )
    log.info(
        "preempt %s: %d of %d candidate nodes kept%s",
        args.pod_key,
        len(kept),
        len(args.victims),
        "".join(f"; {node}: {', '.join(uids)}" for node, (uids, _) in sorted(kept.items())),
    )
    return _json_answer(wire.preemption_result(kept))


async def inspect_all(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    body = request.app[OVERVIEW].inspect_json(now=settings.clock(), ttl=settings.ttl)
    if KEEPER in request.app and (rows := budgeting.inspect_rows(request.app[KEEPER], now=settings.clock())):
        body = body[:-1] + b', "budgets": ' + orjson.dumps(rows) + b"}"
    return _json_answer(body)


async def inspect_node(request: web.Request) -> web.Response:
    cache, settings = request.app[STORE], request.app[SETTINGS]
    name = request.match_info["node"]
    state = cache.state(name, now=settings.clock(), ttl=settings.ttl)
    if state is None:
        return web.json_response({"error": f"node {name} is not known to the extender"}, status=404)
    return web.json_response(inspection.as_json([state], usage=inspection.node_usages([cache.node(name) or {}])))


async def healthz(request: web.Request) -> web.Response:
    """200 once the first list of nodes and pods is in: before that, filter could not judge."""
    cache = request.app[STORE]
    if cache.synced:
        return web.Response(text="ok\n")
    waiting = [
        kind
        for kind, done in (("nodes", cache.nodes_synced), ("pods", cache.pods_synced), ("ledger Leases", cache.leases_synced))
        if not done
    ]
    return web.Response(status=503, text=f"loading {', '.join(waiting[:-1])}{' and ' if len(waiting) > 1 else ''}{waiting[-1]}\n")


async def metrics_text(request: web.Request) -> web.Response:
    meters, settings = request.app[METERS], request.app[SETTINGS]
    body = meters.registry.render()
    if metrics.multiprocess_directory() is None:  # in multi-process mode the registry exports no collector either
        body += request.app[OVERVIEW].metrics_text(now=settings.clock(), ttl=settings.ttl)
    return web.Response(body=body.encode(), headers={"Content-Type": metrics.CONTENT_TYPE})


_T = TypeVar("_T")


def _dumps(answer: object) -> str:
    """The verbs' answers: orjson encodes a 500-node answer in a tenth of json's time (issue 19)."""
    return orjson.dumps(answer).decode()


def _json_answer(answer: object) -> web.Response:
    """`web.json_response(answer, dumps=_dumps)` without the round trip through str: the same
    bytes and Content-Type (`application/json; charset=utf-8`). `answer` may be encoded already."""
    body = answer if isinstance(answer, bytes) else orjson.dumps(answer)
    return web.Response(body=body, content_type="application/json", charset="utf-8")


def _judged_list(
    cache: store_module.Store,
    args: wire.NodesRequest,
    *,
    settings: Settings,
    key: Hashable,
    judge: Callable[[cards.NodeState], _T],
) -> list[_T | None]:
    uid = str(podspec.mapping(args.pod.get("metadata")).get("uid", ""))
    return cache.judged_list(args.node_names, now=settings.clock(), ttl=settings.ttl, exclude_uid=uid, key=key, judge=judge)


def _states(cache: store_module.Store, args: wire.NodesRequest, *, settings: Settings) -> dict[str, cards.NodeState | None]:
    now = settings.clock()
    uid = str(podspec.mapping(args.pod.get("metadata")).get("uid", ""))
    if args.nodes is None:
        return cache.states(args.node_names, now=now, ttl=settings.ttl, exclude_uid=uid)
    # Without nodeCacheCapable the scheduler sends the Node objects: fresher than ours.
    return {
        name: cards.node_state(
            reality.honour_out_of_band(obj) if settings.honour_out_of_band else obj,
            cache.pods_on(name),
            now=now,
            ttl=settings.ttl,
            exclude_uid=uid,
            reservations=cache.ledger_with(obj),
        )
        for name, obj in args.nodes.items()
    }


_VERBS = {"/filter": "filter", "/prioritize": "prioritize", "/bind": "bind", "/preempt": "preempt"}
_OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


@web.middleware
async def _observe(request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
    """Client-certificate check, latency per verb, and a last guard: nothing escapes as a 500."""
    started = time.perf_counter()
    if request.app[SETTINGS].require_client_certificate and request.path not in _OPEN_PATHS:
        transport = request.transport
        if transport is None or not transport.get_extra_info("peercert"):
            return web.json_response({"Error": "a client certificate is required"}, status=401)
    try:
        answer: web.StreamResponse = await handler(request)
    except web.HTTPException:
        raise
    except Exception as error:  # noqa: BLE001 - last line of defence; handlers already catch their own
        log.exception("%s %s", request.method, request.path)
        answer = web.json_response({"Error": f"internal error in the GPU extender: {error}"}, status=200)
    verb = _VERBS.get(request.path)
    if verb is not None:
        elapsed = time.perf_counter() - started
        meters = request.app[METERS]
        meters.duration.observe(elapsed, verb=verb)
    return answer
