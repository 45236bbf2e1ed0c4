"""An object less what its replicas differ in: one key for the replicas of one template, another for anything else."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from policies import replicas

UIDS = ["0b6f1c9e-1111-4d7a-9c59-6f2f5e1a0001", "0b6f1c9e-2222-4d7a-9c59-6f2f5e1a0002", "0b6f1c9e-3333-4d7a-9c59-6f2f5e1a0003"]
SUFFIXES = ["x7k2p", "q9zmd", "b4tnw"]


def replica(i: int) -> dict[str, Any]:
    """The i-th pod a ReplicaSet made from one template, as the webhook or the audit sees it."""
    token = f"kube-api-access-{SUFFIXES[i]}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"train-7d9f5-{SUFFIXES[i]}",
            "generateName": "train-7d9f5-",
            "namespace": "team-a",
            "uid": UIDS[i],
            "creationTimestamp": f"2026-11-26T18:0{i}:00Z",
            "resourceVersion": str(1000 + i),
            "managedFields": [{"manager": "kube-controller-manager", "time": f"2026-11-26T18:0{i}:00Z"}],
            "labels": {"app": "train", "pod-template-hash": "7d9f5"},
            "annotations": {"team": "a"},
        },
        "spec": {
            "initContainers": [
                {"name": "fetch", "image": "busybox:1.36", "volumeMounts": [{"name": token, "mountPath": "/var/run/secrets"}]}
            ],
            "containers": [
                {
                    "name": "main",
                    "image": "trainer:1.0",
                    "env": [{"name": "EPOCHS", "value": "10"}],
                    "resources": {"limits": {"aliyun.com/gpu-mem": "8"}},
                    "volumeMounts": [
                        {"name": "data", "mountPath": "/data"},
                        {"name": token, "mountPath": "/var/run/secrets", "readOnly": True},
                    ],
                }
            ],
            "volumes": [
                {"name": "data", "emptyDir": {}},
                {"name": token, "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}},
            ],
            "nodeName": "gpu-0",
        },
    }


def key(obj: dict[str, Any], *, keeps_names: bool = False) -> bytes:
    return replicas.digest(json.dumps(replicas.replica_form(obj, keeps_names=keeps_names).object).encode())


def test_replicas_of_one_template_give_one_key_and_name_what_was_left_out() -> None:
    pods = [replica(i) for i in range(3)]
    before = copy.deepcopy(pods)

    assert len({key(p) for p in pods}) == 1
    form = replicas.replica_form(pods[1], keeps_names=False)
    assert form.dropped == ("train-7d9f5-q9zmd", "train-7d9f5-", UIDS[1])
    assert form.token_volume == "kube-api-access-q9zmd"
    assert form.volatile == ["train-7d9f5-q9zmd", "train-7d9f5-", UIDS[1], "kube-api-access-q9zmd"]
    assert pods == before, "the objects themselves are not changed"


def test_the_form_is_the_object_less_volatile_metadata_with_the_token_volume_renamed() -> None:
    form = replicas.replica_form(replica(0), keeps_names=False).object

    assert form["metadata"] == {
        "namespace": "team-a",
        "labels": {"app": "train", "pod-template-hash": "7d9f5"},
        "annotations": {"team": "a"},
    }
    assert form["spec"]["volumes"] == [
        {"name": "data", "emptyDir": {}},
        {"name": "kube-api-access-*", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}},
    ]
    assert form["spec"]["containers"][0]["volumeMounts"] == [
        {"name": "data", "mountPath": "/data"},
        {"name": "kube-api-access-*", "mountPath": "/var/run/secrets", "readOnly": True},
    ]
    assert form["spec"]["initContainers"][0]["volumeMounts"] == [{"name": "kube-api-access-*", "mountPath": "/var/run/secrets"}]
    assert list(form) == ["apiVersion", "kind", "metadata", "spec"], "the object's own key order"
    assert replicas.replica_form(form, keeps_names=False).object == form, (
        "idempotent (the placeholder is no token name to rename)"
    )


def _set(path: tuple[str | int, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(obj: dict[str, Any]) -> None:
        target: Any = obj
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value

    return change


CHANGES: dict[str, Callable[[dict[str, Any]], None]] = {
    "image": _set(("spec", "containers", 0, "image"), "trainer:1.1"),
    "env": _set(("spec", "containers", 0, "env", 0, "value"), "11"),
    "resources": _set(("spec", "containers", 0, "resources", "limits", "aliyun.com/gpu-mem"), "16"),
    "nodeName": _set(("spec", "nodeName"), "gpu-1"),
    "label": _set(("metadata", "labels", "app"), "serve"),
    "annotation": _set(("metadata", "annotations", "team"), "b"),
    "namespace": _set(("metadata", "namespace"), "team-b"),
    "status": _set(("status",), {"phase": "Running"}),  # kept here; the audit's own key keeps only the phase
    "mount path": _set(("spec", "containers", 0, "volumeMounts", 1, "mountPath"), "/elsewhere"),
}


@pytest.mark.parametrize("change", CHANGES, ids=list(CHANGES))
def test_a_change_in_anything_else_gives_another_key(change: str) -> None:
    changed = replica(2)
    CHANGES[change](changed)

    assert key(changed) != key(replica(0))
    assert key(changed) != key(replica(2))


def test_names_stay_in_where_an_exception_matches_by_name() -> None:
    pods = [replica(i) for i in range(3)]

    assert len({key(p, keeps_names=True) for p in pods}) == 3
    form = replicas.replica_form(pods[0], keeps_names=True)
    assert form.object["metadata"]["name"] == "train-7d9f5-x7k2p" and form.object["metadata"]["generateName"] == "train-7d9f5-"
    assert "uid" not in form.object["metadata"] and "resourceVersion" not in form.object["metadata"]
    assert form.dropped == (UIDS[0],)


def test_the_token_volume_is_renamed_only_where_it_is_the_one_projected_kube_api_access_volume_of_a_pod() -> None:
    two = [replica(i) for i in range(2)]
    for pod in two:
        pod["spec"]["volumes"].append({"name": "kube-api-access-extra", "projected": {"sources": []}})
    assert key(two[0]) != key(two[1]), "two candidates: which is the token is not guessed"
    assert replicas.replica_form(two[0], keeps_names=False).token_volume is None

    not_projected = [replica(i) for i in range(2)]
    for pod in not_projected:
        del pod["spec"]["volumes"][1]["projected"]
        pod["spec"]["volumes"][1]["emptyDir"] = {}
    assert key(not_projected[0]) != key(not_projected[1])

    template = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "a"}, "spec": replica(0)["spec"]}
    form = replicas.replica_form(template, keeps_names=False)
    assert form.token_volume is None and form.object["spec"] is template["spec"], "only a Pod's own volumes are renamed"


def test_an_object_without_metadata_or_spec_as_mappings_is_left_as_it_is() -> None:
    odd = {"kind": "Pod", "metadata": "not a mapping", "spec": ["not", "a", "mapping"]}

    form = replicas.replica_form(odd, keeps_names=False)

    assert form.object is odd and form.volatile == []


def test_digest_is_128_bits_of_blake2b() -> None:
    assert len(replicas.digest(b"{}")) == replicas.DIGEST_SIZE == 16
    assert replicas.digest(b"{}") == replicas.digest(b"{}") != replicas.digest(b"[]")
