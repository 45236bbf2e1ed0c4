"""podspec (finding pod specs and containers) and patching (JSON pointers and add operations)."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from policies import gpu, patching, podspec
from tests.unit.policies.conftest import ContainerFactory, PodFactory, WorkloadFactory


@pytest.mark.parametrize(
    ("kind", "path"),
    [
        ("Deployment", "/spec/template/spec"),
        ("StatefulSet", "/spec/template/spec"),
        ("DaemonSet", "/spec/template/spec"),
        ("ReplicaSet", "/spec/template/spec"),
        ("ReplicationController", "/spec/template/spec"),
        ("Job", "/spec/template/spec"),
        ("CronJob", "/spec/jobTemplate/spec/template/spec"),
    ],
)
def test_pod_spec_of_a_workload_is_found_with_its_path(
    pod: PodFactory, container: ContainerFactory, workload: WorkloadFactory, kind: str, path: str
) -> None:
    obj = workload(kind, pod(container("main")))

    found = podspec.pod_spec(obj)

    assert found is not None
    assert found[0] == path
    assert found[1]["containers"][0]["name"] == "main"


def test_pod_spec_of_a_pod_is_at_spec(pod: PodFactory, container: ContainerFactory) -> None:
    found = podspec.pod_spec(pod(container()))
    assert found is not None and found[0] == "/spec"


@pytest.mark.parametrize(
    "obj", [None, "x", {"kind": "Service"}, {"kind": "Pod", "spec": 5}, {"kind": "Job", "spec": {"template": []}}]
)
def test_pod_spec_of_anything_else_is_none(obj: object) -> None:
    assert podspec.pod_spec(obj) is None


def test_containers_are_walked_init_regular_ephemeral_with_json_pointers(
    pod: PodFactory, container: ContainerFactory, workload: WorkloadFactory
) -> None:
    obj = workload(
        "Deployment",
        pod(container("a"), "garbage", container("b"), init=[container("i")], ephemeral=[container("e")]),
    )

    refs = list(podspec.containers(obj))

    assert [(ref.kind, ref.name, ref.path) for ref in refs] == [
        (podspec.ContainerKind.INIT, "i", "/spec/template/spec/initContainers/0"),
        (podspec.ContainerKind.REGULAR, "a", "/spec/template/spec/containers/0"),
        (podspec.ContainerKind.REGULAR, "b", "/spec/template/spec/containers/2"),
        (podspec.ContainerKind.EPHEMERAL, "e", "/spec/template/spec/ephemeralContainers/0"),
    ]


def test_template_metadata_of_a_workload_is_its_template_metadata(
    pod: PodFactory, container: ContainerFactory, workload: WorkloadFactory
) -> None:
    found = podspec.template(workload("CronJob", pod(container(), annotations={"a": "b"})))

    assert found is not None
    assert found.metadata_path == "/spec/jobTemplate/spec/template/metadata"
    assert found.annotations == {"a": "b"}


@pytest.mark.parametrize(
    ("tokens", "pointer"),
    [
        (("metadata", "labels", "aliyun.accelerator/nvidia_name"), "/metadata/labels/aliyun.accelerator~1nvidia_name"),
        (("a~b", "c/~d"), "/a~0b/c~1~0d"),
        ((), ""),
    ],
)
def test_pointer_escapes_tilde_and_slash(tokens: tuple[str, ...], pointer: str) -> None:
    assert patching.pointer(*tokens) == pointer
    assert patching.split(pointer) == list(tokens)


def test_applying_add_operations_matches_jsonpatch() -> None:
    document: dict[str, Any] = {"metadata": {"labels": {}}, "spec": {"containers": [{"env": []}, {}]}}
    operations = [
        patching.add(patching.pointer("metadata", "labels", gpu.CARD_NAME_LABEL), "A10"),
        patching.add("/spec/containers/0/env/-", {"name": "X"}),
        patching.add("/spec/containers/1/env", [{"name": "Y"}]),
        patching.add("/spec/containers/0", {"name": "first"}),
    ]
    ours = copy.deepcopy(document)

    patching.apply(ours, operations)

    assert ours == jsonpatch.apply_patch(document, operations)
    assert ours["metadata"]["labels"] == {"aliyun.accelerator/nvidia_name": "A10"}


@pytest.mark.parametrize(
    "operation",
    [
        {"op": "remove", "path": "/a"},
        {"op": "add", "path": "/missing/x", "value": 1},
        {"op": "add", "path": "/list/5", "value": 1},
        {"op": "add", "path": "/list/01", "value": 1},
        {"op": "add", "path": "/leaf/x", "value": 1},
        {"op": "add", "path": "", "value": 1},
    ],
)
def test_operations_that_do_not_fit_are_refused(operation: dict[str, Any]) -> None:
    with pytest.raises(patching.PatchError):
        patching.apply({"a": 1, "list": [], "leaf": 3}, [operation])
