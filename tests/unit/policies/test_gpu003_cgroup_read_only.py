"""GPU003 in the trust zone: `/sys/fs/cgroup` and `/var/log` are no allowed host paths of a pod that can
reach a GPU node; where an admin allows them (read-only), `/sys/fs/cgroup` passes only recursively
read-only and `/var/log` only read-only, in every container that mounts them.

A writable cgroup v1 hierarchy lets a root container move itself into the devices controller's
root cgroup and open every card (see the policy's docstring); a plain `readOnly: true` leaves the
v1 controllers, which are submounts, writable. A writable `/var/log/pods` lets a pod plant a
symbolic link that the kubelet follows as root when it serves `kubectl logs`.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from policies import model
from policies.trustzone import DEFAULT_ZONE
from tests.unit.policies.conftest import (
    ContainerFactory,
    Evaluate,
    Patched,
    PodFactory,
    ResultOf,
    ViolationMessages,
    WorkloadFactory,
    assert_second_pass_is_empty,
    required_node_affinity,
)

KEEP_OFF = [dict(e) for e in DEFAULT_ZONE.keep_off]

RECURSIVE_RO = {"readOnly": True, "recursiveReadOnly": "Enabled"}
GPU = {"nvidia.com/gpu": 1}
# An admin's allowance of both, read-only (what a node-metrics sidecar of a GPU job would need).
ZONE: dict[str, Any] = {"trustZone": {"allow": {"hostPaths": ["/sys/fs/cgroup", "/var/log"]}}}
OFF_GPU_NODES = required_node_affinity({"matchExpressions": KEEP_OFF})
VOID = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]


def cgroup_pod(
    pod: PodFactory,
    container: ContainerFactory,
    *,
    mount: dict[str, Any] | None = None,
    path: str = "/sys/fs/cgroup",
    gpu: bool = True,
    **extra: Any,
) -> dict[str, Any]:
    mount = {} if mount is None else mount
    return pod(
        container(gpu=GPU if gpu else None, volumeMounts=[{"name": "cgroup", "mountPath": "/host/cgroup", **mount}]),
        volumes=[{"name": "cgroup", "hostPath": {"path": path}}],
        **extra,
    )


def add_ephemeral(pod_object: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    updated = copy.deepcopy(pod_object)
    updated["spec"].setdefault("ephemeralContainers", []).append(container)
    return updated


# --- the attack side ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mount",
    [
        {},
        {"readOnly": False},
        {"readOnly": True},
        {"readOnly": True, "recursiveReadOnly": "IfPossible"},
        {"readOnly": True, "recursiveReadOnly": "Disabled"},
        {"readOnly": "true", "recursiveReadOnly": "Enabled"},
        {"readOnly": True, "recursiveReadOnly": "enabled"},
    ],
)
def test_a_cgroup_host_path_mounted_writable_or_only_top_level_read_only_is_denied(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, violation_messages: ViolationMessages, mount: dict[str, Any]
) -> None:
    decision = evaluate(cgroup_pod(pod, container, mount=mount), config=ZONE)

    assert not decision.allowed
    (message,) = violation_messages(decision, "GPU003")
    assert (
        'container "main" mounts volume "cgroup" (hostPath /sys/fs/cgroup) without readOnly: true and recursiveReadOnly: Enabled'
        in message
    )


@pytest.mark.parametrize(
    "path",
    ["/sys/fs/cgroup/devices", "/sys/fs/cgroup/", "//sys/./fs/cgroup", "/sys/fs/cgroup/kubepods.slice", "sys/fs/cgroup"],
)
def test_every_spelling_and_every_path_under_sys_fs_cgroup_needs_the_read_only_mount(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, violation_messages: ViolationMessages, path: str
) -> None:
    decision = evaluate(cgroup_pod(pod, container, path=path), config=ZONE)

    assert not decision.allowed
    assert violation_messages(decision, "GPU003")


def test_a_writable_mount_by_an_init_container_or_sidecar_is_denied_beside_a_read_only_main(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, violation_messages: ViolationMessages
) -> None:
    mount = {"name": "cgroup", "mountPath": "/cg"}
    manifest = pod(
        container(gpu=GPU, volumeMounts=[{**mount, **RECURSIVE_RO}]),
        init=[container("setup", volumeMounts=[mount]), container("agent", restartPolicy="Always", volumeMounts=[mount])],
        volumes=[{"name": "cgroup", "hostPath": {"path": "/sys/fs/cgroup"}}],
    )
    decision = evaluate(manifest, config=ZONE)

    assert not decision.allowed
    found = violation_messages(decision, "GPU003")
    assert len(found) == 2
    assert any('init container "setup"' in m for m in found)
    assert any('"agent"' in m for m in found)
    assert not any('container "main"' in m and "init" not in m for m in found)


@pytest.mark.parametrize("kind", ["Deployment", "DaemonSet", "Job", "CronJob", "ReplicationController"])
def test_a_writable_cgroup_mount_in_a_workload_template_is_denied(
    pod: PodFactory,
    container: ContainerFactory,
    workload: WorkloadFactory,
    evaluate: Evaluate,
    violation_messages: ViolationMessages,
    kind: str,
) -> None:
    decision = evaluate(workload(kind, cgroup_pod(pod, container)), config=ZONE)

    assert not decision.allowed
    assert violation_messages(decision, "GPU003")


def test_an_ephemeral_container_mounting_the_pods_cgroup_volume_writable_is_denied(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, violation_messages: ViolationMessages
) -> None:
    running = cgroup_pod(pod, container, mount=RECURSIVE_RO, nodeName="gpu-node-1")
    debug = container("debugger", volumeMounts=[{"name": "cgroup", "mountPath": "/cg"}])

    decision = evaluate(
        add_ephemeral(running, debug), operation="UPDATE", subresource="ephemeralcontainers", old=running, config=ZONE
    )

    assert not decision.allowed
    (message,) = violation_messages(decision, "GPU003")
    assert 'ephemeral container "debugger" mounts volume "cgroup"' in message


@pytest.mark.parametrize("mount", [RECURSIVE_RO, {"readOnly": True}])
def test_without_an_admins_allowance_cgroup_is_refused_in_a_gpu_pod_even_recursively_read_only(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, violation_messages: ViolationMessages, mount: dict[str, Any]
) -> None:
    decision = evaluate(cgroup_pod(pod, container, mount=mount))

    assert not decision.allowed
    (message,) = violation_messages(decision, "GPU003")
    assert 'volume "cgroup" mounts hostPath /sys/fs/cgroup, which is not an allowed host path' in message


@pytest.mark.parametrize("config", [None, ZONE], ids=["no-allowance", "allowed-read-only"])
@pytest.mark.parametrize("mount", [{}, {"readOnly": True}], ids=["writable", "top-level-read-only"])
@pytest.mark.parametrize("path", ["/sys/fs/cgroup", "/sys/fs/cgroup/devices", "/var/log/pods"])
def test_the_same_mounts_in_a_pod_without_gpus_are_admitted_with_gpu103s_affinity(
    pod: PodFactory,
    container: ContainerFactory,
    evaluate: Evaluate,
    result: ResultOf,
    patched: Patched,
    config: dict[str, Any] | None,
    mount: dict[str, Any],
    path: str,
) -> None:
    """The flip side of the attacks above: without a card the pod is kept off GPU nodes instead.

    (An allowed `/var/log/pods` mounted read-only is no node power: nothing to keep off.)"""
    obj = cgroup_pod(pod, container, path=path, mount=mount, gpu=False)
    decision = evaluate(obj, config=config)

    assert decision.allowed, decision.denial_message
    assert result(decision, "GPU003") is model.Result.PASS
    void = {"op": "add", "path": "/spec/containers/0/env", "value": VOID}
    if config is not None and path == "/var/log/pods" and mount:
        assert decision.patch == (void,)
    else:
        assert decision.patch == ({"op": "add", "path": "/spec/affinity", "value": OFF_GPU_NODES}, void)
    assert_second_pass_is_empty(evaluate, patched, obj, decision, config=config)


# --- the ordinary side -------------------------------------------------------------------------


def test_a_recursively_read_only_cgroup_mount_is_allowed(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf
) -> None:
    decision = evaluate(cgroup_pod(pod, container, mount=RECURSIVE_RO), config=ZONE)

    assert decision.allowed
    assert result(decision, "GPU003") is model.Result.PASS


def test_a_monitoring_daemonset_without_gpus_is_allowed_off_gpu_nodes(
    pod: PodFactory,
    container: ContainerFactory,
    workload: WorkloadFactory,
    evaluate: Evaluate,
    result: ResultOf,
    patched: Patched,
) -> None:
    template = pod(
        container(
            "node-metrics",
            volumeMounts=[
                {"name": "cgroup", "mountPath": "/host/sys/fs/cgroup", **RECURSIVE_RO},
                {"name": "varlog", "mountPath": "/var/log", "readOnly": True},
                {"name": "shm", "mountPath": "/dev/shm"},
            ],
        ),
        volumes=[
            {"name": "cgroup", "hostPath": {"path": "/sys/fs/cgroup"}},
            {"name": "varlog", "hostPath": {"path": "/var/log"}},
            {"name": "shm", "hostPath": {"path": "/dev/shm"}},
        ],
    )
    obj = workload("DaemonSet", template)
    decision = evaluate(obj)

    assert decision.allowed
    assert result(decision, "GPU003") is model.Result.PASS
    assert decision.patch == (
        {"op": "add", "path": "/spec/template/spec/affinity", "value": OFF_GPU_NODES},
        {"op": "add", "path": "/spec/template/spec/containers/0/env", "value": VOID},
    )
    assert_second_pass_is_empty(evaluate, patched, obj, decision)


def test_a_cgroup_volume_no_container_mounts_is_allowed(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf
) -> None:
    decision = evaluate(
        pod(container(gpu=GPU), volumes=[{"name": "cgroup", "hostPath": {"path": "/sys/fs/cgroup"}}]), config=ZONE
    )

    assert result(decision, "GPU003") is model.Result.PASS


def test_an_ephemeral_container_mounting_cgroup_read_only_recursively_or_an_empty_dir_is_allowed(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf
) -> None:
    running = pod(
        container(
            gpu=GPU, volumeMounts=[{"name": "cgroup", "mountPath": "/cg", **RECURSIVE_RO}, {"name": "scratch", "mountPath": "/s"}]
        ),
        volumes=[{"name": "cgroup", "hostPath": {"path": "/sys/fs/cgroup"}}, {"name": "scratch", "emptyDir": {}}],
    )
    debug = container(
        "debugger",
        volumeMounts=[{"name": "cgroup", "mountPath": "/cg", **RECURSIVE_RO}, {"name": "scratch", "mountPath": "/s"}],
    )

    decision = evaluate(
        add_ephemeral(running, debug), operation="UPDATE", subresource="ephemeralcontainers", old=running, config=ZONE
    )

    assert decision.allowed
    assert result(decision, "GPU003") is model.Result.PASS


@pytest.mark.parametrize(("allowed", "passes"), [("/sys/fs/cgroup", True), ("/sys/fs", False)])
def test_an_admin_allowing_cgroup_writable_lifts_the_read_only_condition_for_that_path_only(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, allowed: str, passes: bool
) -> None:
    # A writable allowance is the path itself, never what lies under it: a pod that may write there
    # could plant a link the node follows for the next pod that mounts below it.
    decision = evaluate(cgroup_pod(pod, container), config={"hostPaths": {"allow": [allowed]}})

    assert decision.allowed is passes
    assert (result(decision, "GPU003") is model.Result.PASS) is passes


def test_an_admin_allowing_another_path_keeps_the_read_only_condition(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, violation_messages: ViolationMessages
) -> None:
    decision = evaluate(cgroup_pod(pod, container), config={**ZONE, "hostPaths": {"allow": ["/run/xtables.lock"]}})

    assert not decision.allowed
    assert violation_messages(decision, "GPU003")


def test_an_admin_protecting_cgroup_has_it_named_in_the_message(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, violation_messages: ViolationMessages
) -> None:
    decision = evaluate(cgroup_pod(pod, container, mount=RECURSIVE_RO), config={"hostPaths": {"protect": ["/sys/fs/cgroup"]}})

    assert not decision.allowed
    (message,) = violation_messages(decision, "GPU003")
    assert 'volume "cgroup" mounts hostPath /sys/fs/cgroup, which is not an allowed host path (lies in /sys' in message


@pytest.mark.parametrize(
    "mounts",
    [None, "x", [3], [{"name": 5}], [{"mountPath": "/cg"}], [{"name": "other", "mountPath": "/cg"}]],
)
def test_malformed_or_unrelated_mounts_are_ignored(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, mounts: object
) -> None:
    manifest = pod(
        container(gpu=GPU, volumeMounts=mounts),
        volumes=[{"name": "cgroup", "hostPath": {"path": "/sys/fs/cgroup"}}, {"name": 7, "hostPath": {"path": "/sys/fs/cgroup"}}],
    )

    assert result(evaluate(manifest, config=ZONE), "GPU003") is model.Result.PASS


# --- /var/log/pods and its parent /var/log: read-only where allowed (the kubelet's log symlink) ---


@pytest.mark.parametrize(
    "path", ["/var/log", "/var/log/", "/var/log/pods", "/var/log/pods/team-a_app_0123/main", "/var//log/./pods"]
)
@pytest.mark.parametrize("mount", [{}, {"readOnly": False}, {"recursiveReadOnly": "Disabled"}])
def test_a_writable_mount_of_the_pod_log_directory_or_its_parent_is_denied(
    pod: PodFactory,
    container: ContainerFactory,
    evaluate: Evaluate,
    violation_messages: ViolationMessages,
    path: str,
    mount: dict[str, Any],
) -> None:
    decision = evaluate(cgroup_pod(pod, container, path=path, mount=mount), config=ZONE)

    assert not decision.allowed
    (message,) = violation_messages(decision, "GPU003")
    assert "without readOnly: true; the allowed host paths are read-only" in message
    assert not evaluate(cgroup_pod(pod, container, path=path, mount={"readOnly": True})).allowed  # no allowance: refused


def test_an_ephemeral_container_mounting_the_pods_var_log_writable_is_denied(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, violation_messages: ViolationMessages
) -> None:
    running = cgroup_pod(pod, container, path="/var/log", mount={"readOnly": True})
    debug = container("debugger", volumeMounts=[{"name": "cgroup", "mountPath": "/logs"}])

    decision = evaluate(
        add_ephemeral(running, debug), operation="UPDATE", subresource="ephemeralcontainers", old=running, config=ZONE
    )

    assert not decision.allowed
    (message,) = violation_messages(decision, "GPU003")
    assert 'ephemeral container "debugger"' in message


@pytest.mark.parametrize(
    ("path", "mount"),
    [
        ("/var/log", {"readOnly": True}),
        ("/var/log/pods", {"readOnly": True, "recursiveReadOnly": "IfPossible"}),
        ("/var/log/containers", {"readOnly": True}),
    ],
)
def test_read_only_log_agents_in_a_gpu_pod_pass_where_an_admin_allows_the_directory(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, path: str, mount: dict[str, Any]
) -> None:
    decision = evaluate(cgroup_pod(pod, container, path=path, mount=mount), config=ZONE)

    assert decision.allowed
    assert result(decision, "GPU003") is model.Result.PASS


@pytest.mark.parametrize(
    ("path", "mount"), [("/var/log/app", {}), ("/var/log/nginx", {"readOnly": False}), ("/var/lib/mysql", {})]
)
def test_writable_application_log_directories_pass_in_pods_without_gpus_off_gpu_nodes(
    pod: PodFactory,
    container: ContainerFactory,
    evaluate: Evaluate,
    result: ResultOf,
    patched: Patched,
    path: str,
    mount: dict[str, Any],
) -> None:
    obj = pod(
        container(volumeMounts=[{"name": "logs", "mountPath": "/logs", **mount}]),
        volumes=[{"name": "logs", "hostPath": {"path": path}}],
    )
    decision = evaluate(obj)

    assert decision.allowed
    assert result(decision, "GPU003") is model.Result.PASS
    assert decision.patch == (
        {"op": "add", "path": "/spec/affinity", "value": OFF_GPU_NODES},
        {"op": "add", "path": "/spec/containers/0/env", "value": VOID},
    )
    assert_second_pass_is_empty(evaluate, patched, obj, decision)


@pytest.mark.parametrize(("allowed", "passes"), [("/var/log/pods", True), ("/var/log", False)])
def test_an_admin_allowing_the_log_directory_writable_lifts_its_read_only_condition_for_that_path_only(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, allowed: str, passes: bool
) -> None:
    decision = evaluate(cgroup_pod(pod, container, path="/var/log/pods"), config={"hostPaths": {"allow": [allowed]}})

    assert decision.allowed is passes
    assert (result(decision, "GPU003") is model.Result.PASS) is passes
