"""GPU004: GPU resources are well formed (DESIGN section 1, seeds `002_…` and `003_…`).

Per container: every GPU resource is a positive integer, appears in `limits` (a `requests` entry
alone does not reserve an extended resource), a `requests` entry equals its limit,
`aliyun.com/gpu-core.percentage` is at most 100, and it and `aliyun.com/gpu-count` only come
beside `aliyun.com/gpu-mem`. Per pod: one resource family only, because a node serves exactly one
mode and enabling one mode zeroes the others' resources, so a mixed pod can never be scheduled.
Every `nvidia.com/*` resource (MIG slices, shared cards) is of the `nvidia.com/gpu` family.

Values are judged as the cluster judges them (`policies.gpu.quantity`): kube-apiserver decodes every
quantity and writes it back in its own form, which is all an admission webhook sees, and after a
mutating webhook's patch (GPU101 pins every gpu-mem pod) it decodes that form again and validates
it (`quantity.passes_integer_validation`: `1500m` fails). So `2000m`, `+2`, `2e0` and `0.002k` are
2 and allowed, `1k` is 1000, and Kubernetes 1.34's `1000E`, written back as `1`, is 1. Amounts
past `quantity.MAX_MILLI_VALUE`, where Kubernetes' own integer arithmetic overflows, are refused
(`1e19`, written as `10e18`). The dry-run, reading the author's spelling, therefore judges what the
webhook and the apiserver will. One corner remains: a pod no mutation touches, asking for a
decimal amount of 10^21 or more, is validated by the apiserver as the author wrote it (and
refused), while its written-back value (`1` for `1000000000000000000000`) is what this policy sees.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from policies import applicability, gpu, podspec, policy
from policies.gpu import quantity


def _check_container(container: podspec.ContainerRef, mentioned: frozenset[str]) -> list[policy.Finding]:
    """The findings on one container's GPU resources (`mentioned`: gpu.container_gpu_resources of it)."""
    if not mentioned:
        return []
    resources = podspec.mapping(container.container.get("resources"))
    limits: Mapping[str, Any] = podspec.mapping(resources.get("limits"))
    requests: Mapping[str, Any] = podspec.mapping(resources.get("requests"))
    named = sorted(mentioned)
    findings: list[policy.Finding] = []
    who = container.label
    for name in named:
        if name not in limits:
            findings.append(policy.Finding(detail=f"{who} sets {name} in requests only; GPU resources belong in limits"))
            continue
        # What the webhook sees, and what the apiserver validates once a mutation re-decodes the pod.
        found = quantity.stored(limits[name])
        if found is not None and not quantity.passes_integer_validation(found):
            found = None
        limit = found.as_int64() if found is not None else None
        if found is not None and found.sign > 0 and found.is_integer() and (limit is None or limit > quantity.MAX_MILLI_VALUE):
            findings.append(
                policy.Finding(
                    detail=f"{who} sets {name}={limits[name]!r}, more than Kubernetes counts exactly "
                    f"({quantity.MAX_MILLI_VALUE}); ask for what a node has"
                )
            )
            continue
        if limit is None or limit <= 0:
            findings.append(policy.Finding(detail=f"{who} sets {name}={limits[name]!r}; it must be a positive integer"))
            continue
        request = quantity.stored(requests[name]) if name in requests else None
        if name in requests and (request is None or found is None or not request.same_value(found)):
            findings.append(
                policy.Finding(detail=f"{who} requests {name}={requests[name]!r} but limits it to {limit}; they must be equal")
            )
        if name == gpu.Resource.GPU_CORE_PERCENTAGE and limit > gpu.MAX_CORE_PERCENTAGE:
            findings.append(policy.Finding(detail=f"{who} sets {name}={limit}; it must be at most {gpu.MAX_CORE_PERCENTAGE}"))
    if gpu.Resource.GPU_MEM not in named:
        for needs_memory in (gpu.Resource.GPU_CORE_PERCENTAGE, gpu.Resource.GPU_COUNT):
            if needs_memory in named:
                findings.append(policy.Finding(detail=f"{who} sets {needs_memory} without {gpu.Resource.GPU_MEM}"))
    return findings


class WellFormedResources(policy.PodValidator):
    """Refuses malformed GPU resource requests and pods mixing resource families."""

    id = "GPU004"
    summary = "GPU resources must be positive integers in limits, of one family per pod"

    def relevant(self, context: policy.Context, facts: applicability.Facts) -> bool:
        """Only where some container mentions a GPU resource."""
        del context
        return facts.requests_gpu

    def check_pod(self, context: policy.Context) -> Iterable[policy.Finding]:
        """Per-container findings, then one for a pod mixing families."""
        spec = context.template.spec
        findings: list[policy.Finding] = []
        by_family: dict[gpu.Family, list[str]] = {}
        for container in podspec.iter_containers(spec, spec_path=context.template.spec_path):
            mentioned = gpu.container_gpu_resources(container.container)
            findings.extend(_check_container(container, mentioned))
            for name in mentioned:
                family = gpu.family_of(name)
                if family is not None:
                    by_family.setdefault(family, []).append(container.label)
        families = gpu.merge_families(by_family)
        if len(families) > 1:
            parts = [f"{family} ({', '.join(sorted(set(by_family[family])))})" for family in sorted(families)]
            findings.append(
                policy.Finding(detail="pod mixes resource families " + " and ".join(parts) + "; a node serves only one")
            )
        return findings
