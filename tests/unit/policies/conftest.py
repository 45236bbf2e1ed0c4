"""Factories for the policy-engine tests: containers, pods, workloads, requests and patch application.

Each fixture returns a plain function, so tests read as `pod(container(gpu={...}))`.
"""

from __future__ import annotations

import copy
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import jsonpatch
import pytest
import yaml

from policies import engine, model, settings

DATA = pathlib.Path(__file__).parents[2] / "data" / "policies"

# Where each workload kind keeps its pod template, for the `workload` factory.
WORKLOAD_TEMPLATE_PATHS: Mapping[str, tuple[str, ...]] = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "ReplicationController": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}
API_VERSIONS: Mapping[str, str] = {
    "Pod": "v1",
    "ReplicationController": "v1",
    "Job": "batch/v1",
    "CronJob": "batch/v1",
}


def build_container(
    name: str = "main",
    *,
    gpu: Mapping[str, Any] | None = None,
    requests: Mapping[str, Any] | None = None,
    env: Sequence[Mapping[str, Any]] | None = None,
    env_from: Sequence[Mapping[str, Any]] | None = None,
    privileged: bool | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A container; `gpu` goes into resources.limits, `requests` into resources.requests."""
    built: dict[str, Any] = {"name": name, "image": "registry.example/app:1"}
    resources: dict[str, Any] = {}
    if gpu is not None:
        resources["limits"] = dict(gpu)
    if requests is not None:
        resources["requests"] = dict(requests)
    if resources:
        built["resources"] = resources
    if env is not None:
        built["env"] = [dict(e) for e in env]
    if env_from is not None:
        built["envFrom"] = [dict(e) for e in env_from]
    if privileged is not None:
        built["securityContext"] = {"privileged": privileged}
    built.update(extra)
    return built


def build_pod(
    *containers: Mapping[str, Any],
    init: Sequence[Mapping[str, Any]] = (),
    ephemeral: Sequence[Mapping[str, Any]] = (),
    annotations: Mapping[str, str] | None = None,
    name: str = "app",
    **spec: Any,
) -> dict[str, Any]:
    """A Pod with the given containers (one plain `main` container when none is given)."""
    pod_spec: dict[str, Any] = {
        # Non-mapping entries pass through untouched, for tests of malformed pods.
        "containers": [dict(c) if isinstance(c, Mapping) else c for c in containers] or [build_container()],
    }
    if init:
        pod_spec["initContainers"] = [dict(c) for c in init]
    if ephemeral:
        pod_spec["ephemeralContainers"] = [dict(c) for c in ephemeral]
    pod_spec.update(spec)
    metadata: dict[str, Any] = {"name": name, "namespace": "team-a"}
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def wrap_in_workload(kind: str, pod: Mapping[str, Any]) -> dict[str, Any]:
    """A workload of `kind` whose pod template is `pod`'s metadata and spec."""
    template = {
        "metadata": {**copy.deepcopy(dict(pod["metadata"])), "labels": {"app": "app"}},
        "spec": copy.deepcopy(dict(pod["spec"])),
    }
    template["metadata"].pop("namespace", None)
    template["metadata"].pop("name", None)
    tokens = WORKLOAD_TEMPLATE_PATHS[kind]
    root: dict[str, Any] = {
        "apiVersion": API_VERSIONS.get(kind, "apps/v1"),
        "kind": kind,
        "metadata": {"name": "app", "namespace": "team-a"},
    }
    node = root
    for token in tokens[:-1]:
        node = node.setdefault(token, {})
    node[tokens[-1]] = template
    return root


# What the fixtures below hand a test, for its parameters' annotations.
ContainerFactory = Callable[..., dict[str, Any]]
PodFactory = Callable[..., dict[str, Any]]
WorkloadFactory = Callable[[str, Mapping[str, Any]], dict[str, Any]]
Patched = Callable[[Mapping[str, Any], Sequence[Mapping[str, Any]]], dict[str, Any]]
ManifestLoader = Callable[[str], dict[str, Any]]
ViolationMessages = Callable[[model.Decision, str], list[str]]
ResultOf = Callable[[model.Decision, str], model.Result]


class Evaluate(Protocol):
    def __call__(
        self,
        obj: Mapping[str, Any],
        *,
        config: Mapping[str, Any] | None = None,
        operation: str = "CREATE",
        namespace: str = "team-a",
        subresource: str = "",
        old: Mapping[str, Any] | None = None,
        lookup: model.EnvLookup | None = None,
    ) -> model.Decision: ...


def run_engine(
    obj: Mapping[str, Any],
    *,
    config: Mapping[str, Any] | None = None,
    operation: str = "CREATE",
    namespace: str = "team-a",
    subresource: str = "",
    old: Mapping[str, Any] | None = None,
    lookup: model.EnvLookup | None = None,
) -> model.Decision:
    """The engine's decision on `obj`, with settings parsed from `config` (defaults when None)."""
    request = model.Request(
        operation=operation,
        object=obj,
        old_object=old,
        namespace=namespace,
        subresource=subresource,
        env_lookup=lookup,
    )
    parsed = settings.Settings() if config is None else settings.from_mapping(config)
    return engine.evaluate(request, settings=parsed)


def apply_patch(obj: Mapping[str, Any], patch: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """`obj` with an RFC 6902 patch applied by the reference implementation (jsonpatch)."""
    result: dict[str, Any] = jsonpatch.apply_patch(copy.deepcopy(dict(obj)), list(patch))
    return result


def messages(decision: model.Decision, policy_id: str) -> list[str]:
    """The violation messages of one policy."""
    return [v.message for v in decision.violations if v.policy == policy_id]


def result_of(decision: model.Decision, policy_id: str) -> model.Result:
    """The result one policy had."""
    return next(r.result for r in decision.results if r.policy == policy_id)


def required_node_affinity(*terms: Mapping[str, Any]) -> dict[str, Any]:
    """A pod's `affinity` whose required node affinity is these node selector terms."""
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [dict(t) for t in terms]}}}


def assert_second_pass_is_empty(
    evaluate: Evaluate, patched: Patched, obj: Mapping[str, Any], decision: model.Decision, **kwargs: Any
) -> None:
    """Idempotence: `obj` with the decision's patch applied is allowed again and patched no further."""
    again = evaluate(patched(obj, decision.patch), **kwargs)
    assert again.allowed
    assert again.patch == ()


def load_manifest(name: str) -> dict[str, Any]:
    """A manifest from tests/data/policies."""
    loaded: dict[str, Any] = yaml.safe_load((DATA / name).read_text())
    return loaded


@pytest.fixture
def container() -> ContainerFactory:
    return build_container


@pytest.fixture
def pod() -> PodFactory:
    return build_pod


@pytest.fixture
def workload() -> WorkloadFactory:
    return wrap_in_workload


@pytest.fixture
def evaluate() -> Evaluate:
    return run_engine


@pytest.fixture
def patched() -> Patched:
    return apply_patch


@pytest.fixture
def manifest() -> ManifestLoader:
    return load_manifest


@pytest.fixture
def violation_messages() -> ViolationMessages:
    return messages


@pytest.fixture
def result() -> ResultOf:
    return result_of
