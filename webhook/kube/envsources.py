"""ConfigMaps and Secrets read for GPU001's envFrom/valueFrom: by the webhook per review and by the audit per run."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

from policies import model
from webhook.kube import client, retry
from webhook.kube import errors as kube_errors


def read_env_source(
    api: client.ApiClient, source: model.EnvSource, *, timeout_s: float | None = None
) -> Mapping[str, str] | None:
    """A ConfigMap's data or a Secret's decoded data, for GPU001; None when it is missing,
    forbidden or odd (the engine then treats the value as unknown). Shared by the audit and the
    webhook (its cluster context), which bounds each read with `timeout_s`."""
    core: Any = client.CoreV1Api(api)
    extra: dict[str, Any] = {"_preload_content": False}
    if timeout_s is not None:
        extra["_request_timeout"] = timeout_s
    read = core.read_namespaced_config_map if source.kind == "ConfigMap" else core.read_namespaced_secret
    try:
        # Tried once: the webhook bounds the wait by `timeout_s`, and an unknown value is judged offline.
        response = retry.call(
            lambda: read(source.name, source.namespace, **extra),
            what=f"cannot read {source.kind} {source.namespace}/{source.name}",
            idempotent=True,
            backoff=retry.ONCE,
        )
        data = json.loads(response.data).get("data") or {}
        if source.kind == "ConfigMap":
            return {str(k): str(v) for k, v in data.items()}
        return {str(k): base64.b64decode(str(v)).decode("utf-8", "replace") for k, v in data.items()}
    except (kube_errors.KubeError, ValueError, binascii.Error):
        return None


def env_lookup(api: client.ApiClient) -> model.EnvLookup:
    """A cached ConfigMap/Secret reader for GPU001's envFrom/valueFrom (one audit run); unreadable sources give None."""
    cache: dict[model.EnvSource, Mapping[str, str] | None] = {}

    def lookup(source: model.EnvSource) -> Mapping[str, str] | None:
        if source not in cache:
            cache[source] = read_env_source(api, source)
        return cache[source]

    return lookup
