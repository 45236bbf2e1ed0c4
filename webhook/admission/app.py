"""The webhook application factory: routes, body-size limit, observing middleware and readiness."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.typedefs import Handler

from policies import model, settings
from webhook.admission import decisioncache, decisions, evictions, handlers, keys, settingscheck
from webhook.serving import metrics

log = logging.getLogger(__name__)

# An AdmissionReview for an UPDATE carries object and oldObject; big pods (many env entries,
# managedFields) push that past aiohttp's 1 MiB default. The apiserver caps request bodies at 3 MiB.
MAX_BODY_BYTES = 3 * 1024 * 1024


# A pod that touches the GPU rules, evaluated once at start-up so /readyz means "can evaluate".
_PROBE_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "gpu-admission-readiness-probe", "namespace": "default"},
    "spec": {"containers": [{"name": "probe", "image": "probe", "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
}


def make_app(
    config: settings.Settings,
    *,
    max_body_bytes: int = MAX_BODY_BYTES,
    decision_cache_entries: int = decisioncache.DEFAULT_MAX_ENTRIES,
) -> web.Application:
    """Build the webhook app for ``config``; serve it over TLS (see ``webhook.commands.serve``).

    ``decision_cache_entries``: how many decisions to remember (0: none; ``serve
    --decision-cache-entries``).
    """
    app = web.Application(client_max_size=max_body_bytes, middlewares=[_observe])
    app[keys.SETTINGS] = config
    app[keys.LIVE_SETTINGS] = keys.LiveSettings(current=config)
    app[keys.METRICS] = metrics.webhook_metrics()
    outcomes = app[keys.METRICS].registry.register(
        metrics.Counter(
            "gpu_admission_decision_cache_total",
            "Reviews by what the decision cache did: hit, miss (evaluated and remembered), bypass (never cached).",
            ("result",),
        )
    )
    app[keys.DECISIONS] = decisioncache.Cache(max_entries=decision_cache_entries, on_outcome=outcomes.inc_one)
    app[keys.STATE] = keys.State()
    app.cleanup_ctx.append(_readiness)
    app.router.add_post("/mutate", handlers.mutate)
    app.router.add_post("/validate", handlers.validate)
    app.router.add_post("/validate-eviction", evictions.validate_eviction)
    app.router.add_post("/validate-settings", settingscheck.validate_settings)
    app.router.add_get("/healthz", handlers.healthz)
    app.router.add_get("/readyz", handlers.readyz)
    app.router.add_get("/metrics", handlers.metrics_text)
    return app


async def _readiness(app: web.Application) -> AsyncIterator[None]:
    state = app[keys.STATE]
    try:
        decision = decisions.decide(_PROBE_POD, settings=app[keys.LIVE_SETTINGS].current)
    except Exception:  # noqa: BLE001 - reported through /readyz instead of refusing to start
        log.exception("uid=- the policy engine raised on the readiness probe pod")
        decision = None
    if decision is None or (decision.results and all(r.result is model.Result.ERROR for r in decision.results)):
        state.reason = "the policy engine fails on a plain GPU pod"
        log.error("uid=- not ready: %s", state.reason)
    else:
        state.ready, state.reason = True, ""
    yield
    state.ready, state.reason = False, "shutting down"


@web.middleware
async def _observe(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Access log (with the review uid) and HTTP metrics for every request, errors included."""
    started = time.perf_counter()
    status = 500
    try:
        answer = await handler(request)
        status = answer.status
        return answer
    except web.HTTPException as error:
        status = error.status
        raise
    finally:
        elapsed = time.perf_counter() - started
        route = request.match_info.route.resource.canonical if request.match_info.route.resource else "other"
        meters = request.app[keys.METRICS]
        meters.http_requests.inc(route=route, code=str(status))
        meters.http_duration.observe(elapsed, route=route)
        log.debug(
            "uid=%s %s %s -> %d in %.2f ms",
            request.get(keys.UID, "-"),
            request.method,
            request.path,
            status,
            elapsed * 1000,
        )
