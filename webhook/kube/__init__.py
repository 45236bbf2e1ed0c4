"""The one place that turns a kubeconfig (or a pod's service account) into a `kubernetes` client.
Every command that talks to a cluster uses it; the client's failures become `webhook.kube.errors`
(through `webhook.kube.retry`).

It also holds the `kubernetes` modules for the rest of the package, imported on first use
(``webhook.kube.lazy``): ``from webhook.kube import client, client_exceptions, urllib3, watch``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from webhook.cmdline import errors as cmdline_errors
from webhook.kube import errors, lazy

if TYPE_CHECKING:
    import urllib3
    from kubernetes import client, config, watch
    from kubernetes.client import exceptions as client_exceptions
    from kubernetes.config import config_exception
else:
    urllib3 = lazy.Module("urllib3")
    client = lazy.Module("kubernetes.client")
    config = lazy.Module("kubernetes.config")
    client_exceptions = lazy.Module("kubernetes.client.exceptions")
    config_exception = lazy.Module("kubernetes.config.config_exception")
    watch = lazy.Module("kubernetes.watch")

__all__ = [  # the lazy kubernetes modules are exported for the package's other cluster code
    "DEFAULT_NAMESPACE",
    "SERVICE_ACCOUNT_NAMESPACE",
    "ConfigError",
    "api_client",
    "client",
    "client_exceptions",
    "close",
    "errors",
    "own_namespace",
    "urllib3",
    "watch",
]

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DEFAULT_NAMESPACE = "gpu-admission"

# `kubernetes.config` is untyped: Any stops here, at the adapter (STYLE habit 3).
_config: Any = config


def close(api: Any) -> None:
    """Release the client's connection pool (``ApiClient.close`` is untyped)."""
    api.close()


class ConfigError(cmdline_errors.InputError):
    """No client could be made: the kubeconfig is missing or bad. One line, exit status 2 in the CLI."""


def api_client(
    kubeconfig: str | os.PathLike[str] | None = None, *, pool_size: int | None = None, context: str | None = None
) -> client.ApiClient:
    """A client for `kubeconfig`; without one, in-cluster config inside a pod, else the default
    kubeconfig (`$KUBECONFIG`, `~/.kube/config`). `context` picks a kubeconfig context."""
    try:
        if kubeconfig:
            configuration = client.Configuration()
            _config.load_kube_config(config_file=os.fspath(kubeconfig), context=context, client_configuration=configuration)
        elif os.environ.get("KUBERNETES_SERVICE_HOST") and not context:
            configuration = client.Configuration()
            _config.load_incluster_config(client_configuration=configuration)
        else:
            configuration = client.Configuration()
            _config.load_kube_config(context=context, client_configuration=configuration)
    except (config_exception.ConfigException, OSError, ValueError, TypeError) as error:
        where = os.fspath(kubeconfig) if kubeconfig else "the in-cluster or default kubeconfig"
        raise ConfigError(f"cannot load {where}: {errors.first_line(error)}") from error
    if pool_size is not None:
        configuration.connection_pool_maxsize = pool_size
    return client.ApiClient(configuration)


def own_namespace() -> str:
    """The namespace this process runs in (service account file, then POD_NAMESPACE), else the default."""
    try:
        found = SERVICE_ACCOUNT_NAMESPACE.read_text(encoding="utf-8").strip()
    except OSError:
        found = ""
    return found or os.environ.get("POD_NAMESPACE", "") or DEFAULT_NAMESPACE
