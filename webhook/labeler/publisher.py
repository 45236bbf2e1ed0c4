"""The Kubernetes adapter of the labeler: read one Node, merge-patch it and its `status` subresource.

The only labeler module that talks to the apiserver (it implements `store.Nodes`). Errors come out
as the Kubernetes layer's types (`webhook.kube.errors`: `NotFound`, `Conflict`, any other
`KubeError`), each with a one-line message; nothing from `kubernetes` or `urllib3` leaks to the runner. Every call is a read
or a merge patch that writes the same values again, so 429, 5xx and lost connections are retried
with backoff (`webhook.kube.retry`, three tries) before the runner waits for its next interval.
The RBAC this
needs is `get`/`patch` on `nodes`, `patch` on `nodes/status`, and `list` on `pods` (the pods of its
own node, by `fieldSelector spec.nodeName=<node>`, to attribute GPU processes; see `deploy/labeler.yaml`).
With usage limits on (`--usage-limits`, `limits.Actions`) it also creates Events on pods of its node
and, in `evict` mode, pod evictions (`create` on `events` and `pods/eviction`, granted only by
`deploy/components/usage-limits`). An eviction is a create: it is not retried here (a 429 from a
PodDisruptionBudget comes back to the enforcer, which tries again later with its own backoff).
"""

from __future__ import annotations

import datetime
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from webhook import kube
from webhook.kube import client, retry
from webhook.labeler import limits, ownership

logger = logging.getLogger(__name__)


FIELD_MANAGER = "gpu-admission-labeler"
MERGE_PATCH = "application/merge-patch+json"
REQUEST_TIMEOUT_S = 30.0
BACKOFF = retry.Backoff(attempts=3)  # with 30 s timeouts, more tries would outlast an interval


class ConnectError(Exception):
    """No usable cluster configuration (no kubeconfig, not in a pod)."""


class Publisher:
    """Reads and patches Nodes through a `kubernetes` CoreV1Api (a `store.Nodes`)."""

    def __init__(self, api: Any, *, node_name: str = "") -> None:
        self._api = api
        self._node_name = node_name  # the Events' source host

    def get(self, name: str) -> ownership.Node:
        obj = self._call(lambda: self._api.read_node(name, _request_timeout=REQUEST_TIMEOUT_S), what=f"get node {name}")
        serialised: Mapping[str, Any] = self._api.api_client.sanitize_for_serialization(obj)
        return ownership.Node.from_object(serialised)

    def patch(self, name: str, body: Mapping[str, Any]) -> None:
        """Merge-patch the Node (labels and annotations)."""
        self._call(
            lambda: self._api.patch_node(
                name, dict(body), field_manager=FIELD_MANAGER, _content_type=MERGE_PATCH, _request_timeout=REQUEST_TIMEOUT_S
            ),
            what=f"patch node {name}",
        )

    def patch_status(self, name: str, body: Mapping[str, Any]) -> None:
        """Merge-patch `nodes/<name>/status` (capacity and allocatable)."""
        self._call(
            lambda: self._api.patch_node_status(
                name, dict(body), field_manager=FIELD_MANAGER, _content_type=MERGE_PATCH, _request_timeout=REQUEST_TIMEOUT_S
            ),
            what=f"patch node {name} status",
        )

    def pods_on(self, node_name: str) -> list[Mapping[str, Any]]:
        """The pods bound to `node_name`, metadata only (name, namespace, uid, annotations)."""
        found = self._call(
            # resourceVersion "0": served from the apiserver's watch cache (indexed by
            # spec.nodeName), not a quorum read of etcd, for every GPU node every interval.
            lambda: self._api.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={node_name}", resource_version="0", _request_timeout=REQUEST_TIMEOUT_S
            ),
            what=f"list pods on node {node_name}",
        )
        pods: list[Mapping[str, Any]] = []
        for item in getattr(found, "items", None) or ():
            metadata = item.metadata
            pod: dict[str, Any] = {
                "metadata": {
                    "uid": metadata.uid,
                    "namespace": metadata.namespace,
                    "name": metadata.name,
                    "annotations": dict(metadata.annotations or {}),
                }
            }
            # What `policies.gpu.allocation` reads besides the annotations: the node it is bound to
            # and whether it has finished (the per-pod figures compare use with the allocation).
            spec, status = getattr(item, "spec", None), getattr(item, "status", None)
            if spec is not None:
                pod["spec"] = {"nodeName": spec.node_name}
            if status is not None:
                pod["status"] = {"phase": status.phase}
            pods.append(pod)
        return pods

    def record(self, pod: limits.Target, *, reason: str, message: str, warning: bool) -> None:
        """A core/v1 Event on the pod, in client-go's recorder shape (name `<pod>.<unix ns in hex>`)."""
        now = datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{pod.name}.{time.time_ns():x}", "namespace": pod.namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": pod.namespace, "name": pod.name, "uid": pod.uid},
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": FIELD_MANAGER, "host": self._node_name},
            "reportingComponent": FIELD_MANAGER,
            "reportingInstance": self._node_name,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        retry.call(
            lambda: self._api.create_namespaced_event(
                pod.namespace, body, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
            ),
            what=f"record event {reason} on pod {pod.namespace}/{pod.name}",
            idempotent=False,
            backoff=retry.ONCE,
        )

    def evict(self, pod: limits.Target) -> None:
        """Evict the pod through the Eviction API (policy/v1), only the pod of that UID."""
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod.name, "namespace": pod.namespace},
            "deleteOptions": {"preconditions": {"uid": pod.uid}},
        }
        retry.call(
            lambda: self._api.create_namespaced_pod_eviction(
                pod.name, pod.namespace, body, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
            ),
            what=f"evict pod {pod.namespace}/{pod.name}",
            idempotent=False,
            backoff=retry.ONCE,
        )

    @staticmethod
    def _call(call: Callable[[], Any], *, what: str) -> Any:
        return retry.call(call, what=what, idempotent=True, backoff=BACKOFF)


def connect(kubeconfig: str | os.PathLike[str] | None, *, context: str | None = None, node_name: str = "") -> Publisher:
    """A Publisher for the cluster of `kubeconfig` (its `context`), else the pod's own service
    account, else the default kubeconfig (`$KUBECONFIG`, `~/.kube/config`)."""
    try:
        return Publisher(client.CoreV1Api(kube.api_client(kubeconfig, context=context)), node_name=node_name)
    except kube.ConfigError as error:
        raise ConnectError(str(error)) from error
