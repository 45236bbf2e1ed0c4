"""An extender process beside the e2e cluster, for the tests that call its HTTP verbs themselves
(no kube-scheduler in between): started from this checkout, ready once /healthz answers 200."""

from __future__ import annotations

import contextlib
import sys
import urllib.request
from collections.abc import Iterator, Sequence

from tests.e2e.harness import Cluster, eventually
from webhook.cluster import controlplane


@contextlib.contextmanager
def process(cluster: Cluster, name: str, command: list[str]) -> Iterator[None]:
    """`command` running as the cluster's component `name` (its log under the cluster's logs/)."""
    controlplane.start(cluster.state, name, command=command)
    try:
        yield
    finally:
        controlplane.stop(cluster.state, [name])


@contextlib.contextmanager
def extender(cluster: Cluster, name: str, flags: Sequence[str] = ()) -> Iterator[str]:
    """`gpu-admission extender` with `flags` on a free local port, as component `name`-PORT; yields
    its base URL once /healthz answers 200 (its first list of nodes and pods is in)."""
    port = controlplane.free_port()
    command = [
        sys.executable,
        "-m",
        "webhook.extender.cli",
        "extender",
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--kubeconfig",
        str(cluster.state.kubeconfig),
        *flags,
    ]
    with process(cluster, f"{name}-{port}", command):
        base = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            with contextlib.suppress(OSError, ValueError):
                with urllib.request.urlopen(f"{base}/healthz", timeout=5) as answer:  # noqa: S310 - a local URL
                    return bool(answer.status == 200)
            return False

        eventually(healthy, what=f"{name}'s /healthz")
        yield base
