"""Typed keys for what the app and each request carry (aiohttp ``AppKey`` / ``RequestKey``)."""

from __future__ import annotations

import dataclasses

from aiohttp import web

from policies import settings
from webhook import metrics


@dataclasses.dataclass
class State:
    """Whether the app can serve reviews; flipped by the app's lifetime context."""

    ready: bool = False
    reason: str = "starting"


SETTINGS = web.AppKey("settings", settings.Settings)
METRICS = web.AppKey("metrics", metrics.WebhookMetrics)
STATE = web.AppKey("state", State)
UID = web.RequestKey("uid", str)
