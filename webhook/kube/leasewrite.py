"""One write of a coordination.k8s.io/v1 Lease as a compare-and-swap: created where the writer read
none, else replaced at the resourceVersion it read.

The extender keeps two kinds of record in Leases, its per-node reservation ledger
(`webhook.extender.binder`) and its preemption holds (`webhook.extender.holds`), and both write
them the same way: read, change, `write`. A create fails with `errors.Conflict` (409
AlreadyExists) where a Lease of that name appeared since; a replace fails with `errors.Conflict`
where the Lease moved on since the read, and with `errors.NotFound` where it was deleted. Either way
the writer reads again: what to do about each failure is the caller's, this module only makes the
write conditional on what was read. (Leader election writes its Lease through the blocking client:
`webhook.kube.leader`.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class Leases(Protocol):
    """The two apiserver calls a write needs (`webhook.extender.kube.KubeApi` has them)."""

    async def create_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]: ...

    async def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]: ...


async def write(api: Leases, namespace: str, body: Mapping[str, Any], *, read: Mapping[str, Any] | None) -> dict[str, Any]:
    """`body` (a whole Lease, its `metadata.name` set) written as the Lease `read` was replaced:
    created where `read` is None, else replaced carrying `read`'s `metadata.resourceVersion`.
    Returns the Lease as stored (its new resourceVersion)."""
    if read is None:
        return await api.create_lease(namespace, body)
    metadata = dict(_mapping(body.get("metadata")))
    metadata["resourceVersion"] = str(_mapping(read.get("metadata")).get("resourceVersion", ""))
    return await api.replace_lease(namespace, str(metadata.get("name", "")), {**body, "metadata": metadata})


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
