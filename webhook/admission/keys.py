"""Typed keys for what the app and each request carry (aiohttp ``AppKey`` / ``RequestKey``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from aiohttp import web

from policies import settings
from webhook.admission import claims, decisioncache, envsources, events, namespaces, nodes
from webhook.serving import metrics


@dataclasses.dataclass
class State:
    """Whether the app can serve reviews; flipped by the app's lifetime context."""

    ready: bool = False
    reason: str = "starting"


@dataclasses.dataclass
class LiveSettings:
    """The settings in force; the configuration reload (``webhook.admission.configwatch``) replaces them whole."""

    current: settings.Settings


SETTINGS = web.AppKey("settings", settings.Settings)  # as the app was built; reviews use LIVE_SETTINGS
LIVE_SETTINGS = web.AppKey("live_settings", LiveSettings)
METRICS = web.AppKey("metrics", metrics.WebhookMetrics)
STATE = web.AppKey("state", State)
DECISIONS = web.AppKey("decisions", decisioncache.Cache)
# Present only with cluster access (``serve`` adds them; see ``webhook.admission.clustercontext``).
NAMESPACES = web.AppKey("namespaces", namespaces.Informer)
ENV_SOURCES = web.AppKey("env_sources", envsources.Cache)
NODES = web.AppKey("nodes", nodes.Cache)
CLAIMS = web.AppKey("claims", claims.Cache)  # GPU011: the DRA claims pods name
EVENTS = web.AppKey("events", events.Recorder)
# The labeler's evictions (`evictions`): a pod's spec.nodeName by (namespace, name), None when it does not exist.
POD_NODES: web.AppKey[Callable[[str, str], str | None]] = web.AppKey("pod_nodes")
UID = web.RequestKey("uid", str)
