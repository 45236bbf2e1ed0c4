"""The node store the runner reads and patches: its protocol.

`webhook.labeler.publisher` implements it against the apiserver; unit tests implement it in memory.
A store raises the Kubernetes layer's errors (`webhook.kube.errors`): `NotFound` when the node does
not exist (yet), `Conflict` when it changed since it was read (the patch carried its
resourceVersion), any other `KubeError` for a failure worth retrying at the next interval.
Kept apart from the publisher so that nothing but the cluster path imports the `kubernetes` client:
`labeler --dry-run` on a GPU host needs only `nvidia-ml-py` and PyYAML.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from webhook.labeler import ownership


class Nodes(Protocol):
    """Read one Node; merge-patch it and its `status` subresource."""

    def get(self, name: str) -> ownership.Node: ...

    def patch(self, name: str, body: Mapping[str, Any]) -> None: ...

    def patch_status(self, name: str, body: Mapping[str, Any]) -> None: ...


class Pods(Protocol):
    """List the pods bound to one node (for attributing GPU processes to pods)."""

    def pods_on(self, node_name: str) -> list[Mapping[str, Any]]: ...
