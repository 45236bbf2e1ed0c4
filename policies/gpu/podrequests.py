"""A pod's effective request per resource, counted the way Kubernetes counts it.

The one place every reader of a pod's GPU ask goes through: the extender (filter, prioritize, bind,
the sizes it allocates), the audit's per-node sums, and the policies that need the pod's total.
The rule is kube-scheduler's, `PodRequests` / `AggregateContainerRequests` in
`k8s.io/component-helpers` `resource/helpers.go` (Kubernetes 1.34), after KEP 753 (sidecar
containers):

- regular containers add up;
- a sidecar (an init container with `restartPolicy: Always`) keeps running, so it adds to that sum
  too, and to every init container started after it;
- an ordinary init container runs alone beside the sidecars started before it: its need is its own
  request plus theirs;
- the pod needs the larger of the running sum and every init container's need, per resource;
- `spec.overhead` (set from the RuntimeClass, never by the pod's author) is added on top.

Pod-level `spec.resources` (beta in 1.34) replaces the container sum only for the resources
Kubernetes supports there: cpu, memory and `hugepages-*` (the same file's
`IsSupportedPodLevelResource`). Extended resources such as GPUs cannot be set at pod level, so for
them the container rule above is the whole story, and this module counts only whole amounts:
extended resources are integers by API rule; cpu and memory are not its business.

A container's amount of a resource is its `requests` entry, else its `limits` entry (the apiserver
copies a missing request from the limit before anyone else sees the pod), read with `quantity`
exactly as the cluster stores it. An amount that is not a whole non-negative number counts as 0
and is reported in `malformed`, for the caller to refuse or ignore.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from policies import podspec
from policies.gpu import quantity

SIDECAR_RESTART_POLICY = "Always"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Malformed:
    """One container's amount that is not a whole non-negative number."""

    container: str  # how messages name it: `container "main"`, `init container "setup"`
    resource: str
    value: object


@dataclasses.dataclass(frozen=True, kw_only=True)
class PodRequests:
    """What a pod asks for, per resource, and the amounts that could not be read."""

    amounts: Mapping[str, int]
    malformed: tuple[Malformed, ...] = ()

    def get(self, resource: str) -> int:
        """The pod's effective request of `resource` (0 where it asks for none)."""
        return self.amounts.get(resource, 0)


def is_sidecar(container: Mapping[str, Any]) -> bool:
    """Whether an init container is a sidecar (`restartPolicy: Always`): it runs beside the pod."""
    return container.get("restartPolicy") == SIDECAR_RESTART_POLICY


def container_amounts(
    container: Mapping[str, Any], *, wanted: Callable[[str], bool]
) -> tuple[dict[str, int], list[tuple[str, object]]]:
    """A container's wanted resources: (amounts, [(resource, raw value) that could not be read])."""
    resources = podspec.mapping(container.get("resources"))
    limits = podspec.mapping(resources.get("limits"))
    requests = podspec.mapping(resources.get("requests"))
    amounts: dict[str, int] = {}
    bad: list[tuple[str, object]] = []
    for name in sorted({*limits, *requests}, key=str):
        if not isinstance(name, str) or not wanted(name):
            continue
        raw = requests[name] if name in requests else limits[name]
        amount = quantity.count(raw)
        if amount is None:
            bad.append((name, raw))
            amount = 0
        amounts[name] = amount
    return amounts, bad


def pod_requests(spec: Mapping[str, Any], *, wanted: Callable[[str], bool]) -> PodRequests:
    """The pod spec's effective request of every wanted resource (see the module docstring)."""
    total: dict[str, int] = {}
    malformed: list[Malformed] = []

    def read(ref: podspec.ContainerRef) -> dict[str, int]:
        amounts, bad = container_amounts(ref.container, wanted=wanted)
        malformed.extend(Malformed(container=ref.label, resource=name, value=raw) for name, raw in bad)
        return amounts

    for ref in podspec.iter_containers(spec, spec_path="", kinds=(podspec.ContainerKind.REGULAR,)):
        _add(total, read(ref))
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for ref in podspec.iter_containers(spec, spec_path="", kinds=(podspec.ContainerKind.INIT,)):
        amounts = read(ref)
        if is_sidecar(ref.container):
            _add(total, amounts)
            _add(sidecars, amounts)
            need = dict(sidecars)
        else:
            need = dict(amounts)
            _add(need, sidecars)
        for name, amount in need.items():
            init_peak[name] = max(init_peak.get(name, 0), amount)
    for name, amount in init_peak.items():
        total[name] = max(total.get(name, 0), amount)
    overhead = podspec.mapping(spec.get("overhead"))
    for name, raw in overhead.items():
        if isinstance(name, str) and wanted(name):
            extra = quantity.count(raw)
            if extra is not None:
                total[name] = total.get(name, 0) + extra
    return PodRequests(amounts={name: amount for name, amount in total.items() if amount}, malformed=tuple(malformed))


def _add(into: dict[str, int], amounts: Mapping[str, int]) -> None:
    for name, amount in amounts.items():
        into[name] = into.get(name, 0) + amount
