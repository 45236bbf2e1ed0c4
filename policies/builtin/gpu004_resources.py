"""GPU004: GPU resources are well formed (DESIGN section 1, seeds `002_…` and `003_…`).

Per container: every GPU resource is a positive integer, appears in `limits` (a `requests` entry
alone does not reserve an extended resource), a `requests` entry equals its limit,
`aliyun.com/gpu-core.percentage` is at most 100, and it and `aliyun.com/gpu-count` only come
beside `aliyun.com/gpu-mem`. Per pod: one resource family only, because a node serves exactly one
mode and enabling one mode zeroes the others' resources, so a mixed pod can never be scheduled.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from policies import gpu, podspec, policy

_INTEGER = re.compile(r"^\+?[0-9]+$")


def quantity(value: object) -> int | None:
    """An integer quantity as written in a manifest (`2`, `"2"`, `2.0`); None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and _INTEGER.match(value.strip()):
        return int(value.strip())
    return None


def _check_container(container: podspec.ContainerRef) -> list[policy.Finding]:
    resources = podspec.mapping(container.container.get("resources"))
    limits: Mapping[str, Any] = podspec.mapping(resources.get("limits"))
    requests: Mapping[str, Any] = podspec.mapping(resources.get("requests"))
    named = sorted(gpu.container_gpu_resources(container.container))
    findings: list[policy.Finding] = []
    who = container.label
    for name in named:
        if name not in limits:
            findings.append(
                policy.Finding(
                    detail=f"{who} sets {name} in requests only; GPU resources belong in limits"
                )
            )
            continue
        limit = quantity(limits[name])
        if limit is None or limit <= 0:
            findings.append(
                policy.Finding(
                    detail=f"{who} sets {name}={limits[name]!r}; it must be a positive integer"
                )
            )
            continue
        if name in requests and quantity(requests[name]) != limit:
            findings.append(
                policy.Finding(
                    detail=f"{who} requests {name}={requests[name]!r} but limits it to {limit}; "
                    "they must be equal"
                )
            )
        if name == gpu.Resource.GPU_CORE_PERCENTAGE and limit > gpu.MAX_CORE_PERCENTAGE:
            findings.append(
                policy.Finding(
                    detail=f"{who} sets {name}={limit}; it must be at most {gpu.MAX_CORE_PERCENTAGE}"
                )
            )
    if gpu.Resource.GPU_MEM not in named:
        for needs_memory in (gpu.Resource.GPU_CORE_PERCENTAGE, gpu.Resource.GPU_COUNT):
            if needs_memory in named:
                findings.append(
                    policy.Finding(
                        detail=f"{who} sets {needs_memory} without {gpu.Resource.GPU_MEM}"
                    )
                )
    return findings


class WellFormedResources(policy.PodValidator):
    """Refuses malformed GPU resource requests and pods mixing resource families."""

    id = "GPU004"
    summary = "GPU resources must be positive integers in limits, of one family per pod"

    def check_pod(self, context: policy.Context) -> Iterable[policy.Finding]:
        """Per-container findings, then one for a pod mixing families."""
        spec = context.template.spec
        findings: list[policy.Finding] = []
        by_family: dict[gpu.Family, list[str]] = {}
        for container in podspec.iter_containers(spec, spec_path=context.template.spec_path):
            findings.extend(_check_container(container))
            for name in gpu.container_gpu_resources(container.container):
                family = gpu.family_of(name)
                if family is not None:
                    by_family.setdefault(family, []).append(container.label)
        families = gpu.merge_families(by_family)
        if len(families) > 1:
            parts = [
                f"{family} ({', '.join(sorted(set(by_family[family])))})"
                for family in sorted(families)
            ]
            findings.append(
                policy.Finding(
                    detail="pod mixes resource families " + " and ".join(parts)
                    + "; a node serves only one"
                )
            )
        return findings
