"""The node store the runner reads and patches: its protocol and the errors it raises.

`webhook.labeler.publisher` implements it against the apiserver; unit tests implement it in memory.
Kept apart from the publisher so that nothing but the cluster path imports the `kubernetes` client:
`labeler --dry-run` on a GPU host needs only `nvidia-ml-py` and PyYAML.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from webhook.kube import errors as kube_errors
from webhook.labeler import ownership


# The errors a store raises are the Kubernetes layer's, named here for the runner and the fakes.
NodeNotFound = kube_errors.NotFound  # the node does not exist (yet)
Conflict = kube_errors.Conflict  # the node changed since it was read (the patch carried its resourceVersion)
ApiError = kube_errors.KubeError  # any other failure talking to the apiserver; worth retrying at the next interval


class Nodes(Protocol):
    """Read one Node; merge-patch it and its `status` subresource."""

    def get(self, name: str) -> ownership.Node: ...

    def patch(self, name: str, body: Mapping[str, Any]) -> None: ...

    def patch_status(self, name: str, body: Mapping[str, Any]) -> None: ...


class Pods(Protocol):
    """List the pods bound to one node (for attributing GPU processes to pods)."""

    def pods_on(self, node_name: str) -> list[Mapping[str, Any]]: ...
