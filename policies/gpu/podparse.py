"""One parse per pod object for the readers of one pass: what it asks of the extender, what it holds.

Several readers of one pod work out the same things from it: the audit's checks each ask
`cardrequest.pod_request` (what the pod asks of the extender), `allocation.pod_allocation` (what it
holds by its annotations) and `gpu.pod_gpu_requests` (its effective request of every GPU resource).
A `PodParses` made for one pass (an audit page, one evaluation) answers each of them once per pod
object and hands the same answer to every later reader in that pass.

The answers are exactly the functions' own. They are keyed on the pod object itself, not on its
content: an entry holds a reference to its pod, so the object cannot be collected and its `id`
handed to another pod while the entry exists, and a lookup checks identity (`is`) before it answers.
The caller's part of the bargain is that the pods of a pass are not changed in place while it lasts
(the audit judges objects as listed); a pod that is changed must be read through a new `PodParses`.
At most `limit` pods are kept; past that the table starts afresh, so memory stays bounded even when
a caller keeps one for longer than a page.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from policies import gpu, podspec
from policies.gpu import allocation, cardrequest, podrequests

DEFAULT_LIMIT = 4096

_T = TypeVar("_T")


class PodParses:
    """The parses of the pods one pass reads, each worked out once per pod object (see the module)."""

    __slots__ = ("_limit", "_requests", "_allocations", "_gpu_requests", "hits", "misses")

    def __init__(self, *, limit: int = DEFAULT_LIMIT) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self._limit = limit
        self._requests: dict[int, tuple[Mapping[str, Any], cardrequest.Request]] = {}
        self._allocations: dict[tuple[int, float, float], tuple[Mapping[str, Any], allocation.Allocation | None]] = {}
        self._gpu_requests: dict[int, tuple[Mapping[str, Any], podrequests.PodRequests]] = {}
        self.hits = 0
        self.misses = 0

    def request(self, pod: Mapping[str, Any]) -> cardrequest.Request:
        """`cardrequest.pod_request(pod)`."""
        found = self._requests.get(id(pod))
        if found is not None and found[0] is pod:
            self.hits += 1
            return found[1]
        value = cardrequest.pod_request(pod)
        self._keep(self._requests, id(pod), pod, value)
        return value

    def allocation(
        self, pod: Mapping[str, Any], *, now: float, ttl: float = allocation.DEFAULT_RESERVATION_TTL_S
    ) -> allocation.Allocation | None:
        """`allocation.pod_allocation(pod, now=now, ttl=ttl)`."""
        key = (id(pod), now, ttl)
        found = self._allocations.get(key)
        if found is not None and found[0] is pod:
            self.hits += 1
            return found[1]
        value = allocation.pod_allocation(pod, now=now, ttl=ttl)
        self._keep(self._allocations, key, pod, value)
        return value

    def gpu_requests(self, pod: Mapping[str, Any]) -> podrequests.PodRequests:
        """`gpu.pod_gpu_requests` of the pod's spec."""
        found = self._gpu_requests.get(id(pod))
        if found is not None and found[0] is pod:
            self.hits += 1
            return found[1]
        value = gpu.pod_gpu_requests(podspec.mapping(pod.get("spec")))
        self._keep(self._gpu_requests, id(pod), pod, value)
        return value

    def _keep(self, table: dict[Any, tuple[Mapping[str, Any], _T]], key: object, pod: Mapping[str, Any], value: _T) -> None:
        self.misses += 1
        if len(table) >= self._limit:
            table.clear()
        table[key] = (pod, value)
