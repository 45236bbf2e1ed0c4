"""What a pod asks of the scheduler extender: GiB and core percent on one card, or whole cards.

The extender's filter, prioritize and bind, `explain` and the audit read a pod's ask through
`pod_request`, so they can never disagree about it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from policies import gpu, podspec
from policies.gpu import cardmodel, podrequests


@dataclasses.dataclass(frozen=True, kw_only=True)
class Request:
    """What a pod asks of the extender: GiB and core percent on one card, or whole cards."""

    memory_gib: int = 0
    core_percent: int = 0
    cards: int = 0
    problem: str = ""  # non-empty: the request is malformed and fits nowhere
    card: cardmodel.Constraint = cardmodel.ANY  # GPU102's card-model annotations, judged per card by the extender

    @property
    def family(self) -> gpu.Family | None:
        if self.cards:
            return gpu.Family.TOPOLOGY
        if self.core_percent:
            return gpu.Family.SHARED_CORE
        if self.memory_gib:
            return gpu.Family.SHARED
        return None

    @property
    def managed(self) -> bool:
        """Whether the pod asks for anything the extender places."""
        return bool(self.problem) or self.family is not None

    def describe(self) -> str:
        if self.cards:
            return f"{self.cards} whole card{'s' if self.cards != 1 else ''} ({gpu.Resource.ALIYUN_GPU})"
        if self.core_percent:
            return f"{self.memory_gib} GiB ({gpu.Resource.GPU_MEM}) and {self.core_percent}% ({gpu.Resource.GPU_CORE_PERCENTAGE}) on one card"
        return f"{self.memory_gib} GiB ({gpu.Resource.GPU_MEM}) on one card"


def _managed(name: str) -> bool:
    return name in gpu.EXTENDER_RESOURCES


def pod_request(pod: Mapping[str, Any]) -> Request:
    """The effective request of a pod, per resource, counted as kube-scheduler counts it.

    `policies.gpu.podrequests` does the counting: regular containers and sidecars (init containers with
    `restartPolicy: Always`) add up, an ordinary init container needs its own amount plus the
    sidecars started before it, and the pod needs the largest of these; values are read as the
    cluster stores them (`2000m` is 2, `1k` is 1000). All containers of a pod share one card, as
    with gpushare: a 4 GiB sidecar beside a 4 GiB main container needs 8 GiB on one card.
    """
    spec = podspec.mapping(pod.get("spec"))
    asked = podrequests.pod_requests(spec, wanted=_managed)
    if asked.malformed:
        bad = asked.malformed[0]
        return Request(
            problem=f"{bad.container} asks for {bad.resource}: {bad.value!r}, which is not a whole non-negative number"
        )
    memory, core, whole = (asked.get(name) for name in gpu.EXTENDER_MANAGED)
    if whole and (memory or core):
        return Request(
            problem=f"{gpu.Resource.ALIYUN_GPU} (whole cards) cannot be combined with {gpu.Resource.GPU_MEM} or {gpu.Resource.GPU_CORE_PERCENTAGE}"
        )
    if core and not memory:
        return Request(problem=f"{gpu.Resource.GPU_CORE_PERCENTAGE} needs {gpu.Resource.GPU_MEM} beside it")
    if core > gpu.MAX_CORE_PERCENTAGE:
        return Request(problem=f"{gpu.Resource.GPU_CORE_PERCENTAGE} is {core}, more than one card ({gpu.MAX_CORE_PERCENTAGE})")
    annotations = podspec.mapping(podspec.mapping(pod.get("metadata")).get("annotations"))
    return Request(memory_gib=memory, core_percent=core, cards=whole, card=cardmodel.from_annotations(annotations))
