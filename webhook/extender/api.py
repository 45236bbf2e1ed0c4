"""The apiserver operations the extender needs, as an interface: `kube.KubeApi` implements it for
real, the unit tests with an in-memory fake. Objects travel as plain JSON dicts.

Failures are the Kubernetes layer's errors (`webhook.kube.errors`): any `KubeError` (``status`` is
the HTTP code, 0 without an answer), `Conflict` (409: a precondition, resourceVersion or UID, no
longer holds, or the pod is already bound) and `NotFound` (404: the object is gone)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

Object = dict[str, Any]


class Api(Protocol):
    """What the binder reads and writes, each call one apiserver request."""

    async def get_pod(self, namespace: str, name: str) -> Object: ...

    async def get_node(self, name: str) -> Object: ...

    async def list_node_pods(self, node: str, *, at_least: str = "") -> list[Object]:
        """Every pod with `spec.nodeName` = node, in all namespaces: read from the apiserver's
        storage (a quorum read), or, with `at_least` (a resourceVersion), as of that version or a
        later one (the apiserver may answer from its watch cache)."""
        ...

    async def list_namespace_pods(self, namespace: str, *, at_least: str = "") -> list[Object]:
        """Every pod of a namespace (`list_node_pods`' reads, for a GPU budget's usage: `budgeting`)."""
        ...

    async def get_lease(self, namespace: str, name: str) -> Object:
        """A Lease (a node's reservation ledger, `policies.gpu.reservations.lease_body`); NotFound where there is none."""
        ...

    async def create_lease(self, namespace: str, body: Mapping[str, Any]) -> Object:
        """Create a Lease; Conflict (409 AlreadyExists) where one of that name exists. Returns it as stored."""
        ...

    async def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> Object:
        """Replace a Lease (PUT) only if it is still at the `metadata.resourceVersion` the body
        carries; Conflict (409) otherwise, NotFound where it was deleted. Returns it as stored."""
        ...

    async def bind(self, namespace: str, name: str, *, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        """Create the pod's Binding to `node`, carrying `annotations`: the apiserver copies a
        Binding's annotations onto the pod in the same write that sets `spec.nodeName`, so a pod is
        never bound without its allocation annotations. The UID is a precondition (Conflict where
        the pod was replaced or is bound already; NotFound where it is gone)."""
        ...

    async def json_patch_pod(self, namespace: str, name: str, operations: Sequence[Mapping[str, Any]]) -> Object:
        """Apply a JSON patch (RFC 6902) to the pod: the budget gate's lift (`gates.lift_patch`), whose
        `test` operations make the apiserver refuse it (422) where the pod or its gate list is not
        what the cache saw; NotFound where the pod is gone. Returns the pod as stored."""
        ...

    async def create_event(self, namespace: str, body: Mapping[str, Any]) -> Object:
        """Create a core/v1 Event (`gates.event_body`: a gated pod's NamespaceBudget)."""
        ...
