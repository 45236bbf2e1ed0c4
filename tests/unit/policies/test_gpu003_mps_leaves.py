"""The CUDA MPS pipe and log directories in the trust zone: refused in any spelling and kind of pod that
can reach a GPU node (together with their parents `/tmp` and `/var/log`, which no longer pass there);
an admin may allow the pipe directory for MPS jobs, and allowing it uncovers nothing beside it; the
exported ValidatingAdmissionPolicy agrees path by path."""

from __future__ import annotations

import datetime
import itertools
from typing import Any

import pytest

from policies import cel, hostpaths, model, settings
from policies.trustzone import DEFAULT_ZONE
from tests.unit.cel.test_cel_vap_export import admits
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
from webhook.commands import vap

KEEP_OFF = [dict(e) for e in DEFAULT_ZONE.keep_off]

PREFIX = "GPU003: a pod that can reach a GPU node may mount only the host paths and volume types GPU nodes allow: "
INSTEAD = (
    "; the pod requests the GPU resource aliyun.com/gpu-mem; use an emptyDir, a PersistentVolumeClaim or a ConfigMap, "
    "mount an allowed path read-only, run the part that needs the node in a pod that asks for no GPU (it is kept "
    "off GPU nodes), or ask an admin to allow the path for the namespace (trustZone)"
)
PIPES = "the CUDA MPS control daemon's pipes, which run work in and reconfigure every tenant's MPS server"
SHARE = {"aliyun.com/gpu-mem": 2}
# GPU103's patch of a pod without GPUs that mounts these paths: its affinity, then GPU104's void.
OFF_GPU_NODES_PATCH = (
    {"op": "add", "path": "/spec/affinity", "value": required_node_affinity({"matchExpressions": KEEP_OFF})},
    {"op": "add", "path": "/spec/containers/0/env", "value": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]},
)


def with_host_path(pod: PodFactory, container: ContainerFactory, path: str, *, gpu: bool = True) -> dict[str, Any]:
    main = container(gpu=SHARE if gpu else None, volumeMounts=[{"name": "mps", "mountPath": "/mps"}])
    return pod(main, volumes=[{"name": "mps", "hostPath": {"path": path}}])


@pytest.mark.parametrize(
    ("written", "leaf"),
    [
        ("/tmp/nvidia-mps", "/tmp/nvidia-mps"),
        ("/tmp/nvidia-mps/control", "/tmp/nvidia-mps"),
        ("//tmp//nvidia-mps/", "/tmp/nvidia-mps"),
        ("/tmp/./nvidia-mps", "/tmp/nvidia-mps"),
        ("tmp/nvidia-mps", "/tmp/nvidia-mps"),
        ("/var/run/../tmp/nvidia-mps", "/tmp/nvidia-mps"),
        ("/tmp/nvidia-log", "/tmp/nvidia-log"),
        ("/var/log/nvidia-mps", "/var/log/nvidia-mps"),
        ("/var/log/nvidia-mps/control.log", "/var/log/nvidia-mps"),
    ],
)
def test_an_mps_directory_is_refused_in_any_spelling(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, written: str, leaf: str
) -> None:
    decision = evaluate(with_host_path(pod, container, written))

    assert not decision.allowed
    [violation] = [v for v in decision.violations if v.policy == "GPU003"]
    assert f"which is not an allowed host path (lies in {leaf}: the CUDA MPS control daemon's" in violation.message


@pytest.mark.parametrize(
    "written", ["/tmp/nvidia-mps", "//tmp//nvidia-mps/", "tmp/nvidia-mps", "/tmp/nvidia-log", "/var/log/nvidia-mps/control.log"]
)
def test_an_mps_directory_in_a_pod_without_gpus_is_admitted_with_gpu103s_affinity(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, patched: Patched, written: str
) -> None:
    obj = with_host_path(pod, container, written, gpu=False)
    decision = evaluate(obj)

    assert decision.allowed, decision.denial_message
    assert result(decision, "GPU003") is model.Result.PASS
    assert decision.patch == OFF_GPU_NODES_PATCH
    assert_second_pass_is_empty(evaluate, patched, obj, decision)


def test_the_message_names_the_volume_the_leaf_and_what_to_do(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    decision = evaluate(with_host_path(pod, container, "/tmp/nvidia-mps"))

    assert decision.denial_message == (
        PREFIX
        + f'volume "mps" mounts hostPath /tmp/nvidia-mps, which is not an allowed host path (lies in /tmp/nvidia-mps: {PIPES})'
        + INSTEAD
    )


@pytest.mark.parametrize("kind", ["Deployment", "DaemonSet", "Job", "CronJob"])
def test_a_workload_template_or_an_init_container_reaching_the_pipes_is_refused(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, workload: WorkloadFactory, kind: str
) -> None:
    template = pod(
        container(gpu=SHARE),
        init=[container("setup", volumeMounts=[{"name": "mps", "mountPath": "/tmp/nvidia-mps"}])],
        volumes=[{"name": "mps", "hostPath": {"path": "/tmp/nvidia-mps", "type": "Directory"}}],
    )

    decision = evaluate(workload(kind, template))

    assert any("/tmp/nvidia-mps" in v.message for v in decision.violations if v.policy == "GPU003")


@pytest.mark.parametrize(
    "path",
    [
        "/tmp",
        "/tmp/",
        "/tmp/.X11-unix",
        "/tmp/nvidia-mps-build",
        "/tmp/nvidia",
        "/var/log",
        "/var/log/pods",
        "/var/log/nvidia",
        "/data/nvidia-mps",
    ],
)
def test_the_parents_and_neighbours_of_the_pipes_are_refused_too_in_a_gpu_pod_and_pass_off_gpu_nodes(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, patched: Patched, path: str
) -> None:
    # /tmp itself reaches the pipes; only the allowlist passes where the cards are.
    assert result(evaluate(with_host_path(pod, container, path)), "GPU003") is model.Result.FAIL
    obj = with_host_path(pod, container, path, gpu=False)
    without_gpus = evaluate(obj)
    assert without_gpus.allowed and result(without_gpus, "GPU003") is model.Result.PASS
    assert without_gpus.patch == OFF_GPU_NODES_PATCH
    assert_second_pass_is_empty(evaluate, patched, obj, without_gpus)


def test_an_admin_may_allow_the_pipe_directory_itself(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    config = {
        "trustZone": {
            "namespaces": [
                {
                    "name": "mps",
                    "namespaces": ["mps-jobs"],
                    "allow": {"hostPaths": [{"path": "/tmp/nvidia-mps", "readOnly": False}]},
                }
            ]
        }
    }

    assert evaluate(with_host_path(pod, container, "/tmp/nvidia-mps"), config=config, namespace="mps-jobs").allowed
    # Writable: the directory itself, not a path below it a pod could have planted a link at.
    assert not evaluate(with_host_path(pod, container, "/tmp/nvidia-mps/control"), config=config, namespace="mps-jobs").allowed
    assert not evaluate(with_host_path(pod, container, "/var/log/nvidia-mps"), config=config, namespace="mps-jobs").allowed
    assert not evaluate(with_host_path(pod, container, "/tmp/nvidia-mps"), config=config, namespace="team-a").allowed


def test_an_admin_may_allow_the_pipe_directory_everywhere_read_only(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, violation_messages: ViolationMessages
) -> None:
    config = {"trustZone": {"allow": {"hostPaths": ["/tmp/nvidia-mps"]}}}

    def mounted(read_only: bool) -> dict[str, Any]:
        main = container(gpu=SHARE, volumeMounts=[{"name": "mps", "mountPath": "/mps", "readOnly": read_only}])
        return pod(main, volumes=[{"name": "mps", "hostPath": {"path": "/tmp/nvidia-mps"}}])

    assert not evaluate(mounted(True)).allowed  # without the allowance
    assert evaluate(mounted(True), config=config).allowed
    assert evaluate(mounted(True), config=config, namespace="team-b").allowed
    writable = evaluate(mounted(False), config=config)
    assert not writable.allowed
    assert violation_messages(writable, "GPU003") == [
        PREFIX + 'container "main" mounts volume "mps" (hostPath /tmp/nvidia-mps) without readOnly: true; the allowed host '
        "paths are read-only" + INSTEAD
    ]


@pytest.mark.parametrize(
    ("config", "path"),
    [
        ({"trustZone": {"allow": {"hostPaths": ["/tmp/nvidia-mps"]}}}, "/tmp"),
        ({"trustZone": {"allow": {"hostPaths": ["/tmp/nvidia-mps"]}}}, "/tmp/nvidia-mps/../nvidia-log"),
        ({"trustZone": {"allow": {"hostPaths": ["/tmp/nvidia-mps"]}}}, "/tmp/nvidia-mpsx"),
    ],
    ids=["parent", "beside-through-dotdot", "prefix-only"],
)
def test_allowing_the_pipes_uncovers_nothing_beside_or_above_them(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, config: dict[str, Any], path: str
) -> None:
    assert not evaluate(with_host_path(pod, container, path), config=config).allowed


def test_the_device_plugins_mps_directory_is_named_as_lying_in_run() -> None:
    assert (
        verdict := hostpaths.DEFAULT_RULES.judge("/var/run/nvidia/mps/nvidia.com/gpu/pipe")
    ) is not None and verdict.root == "/run"
    assert (leaf := hostpaths.DEFAULT_RULES.judge("/tmp/nvidia-mps")) is not None and leaf.root == "/tmp/nvidia-mps"


@pytest.mark.parametrize(
    "document",
    [{}, {"trustZone": {"allow": {"hostPaths": ["/tmp/nvidia-mps/control"]}}}, {"hostPaths": {"allow": ["/var/log", "/tmp"]}}],
    ids=["defaults", "allowed-inside-a-pipe-directory", "earlier-allow"],
)
def test_the_exported_policy_agrees_with_the_webhook_around_the_pipes(document: dict[str, Any]) -> None:
    export = vap.export(settings.from_mapping(document), now=datetime.datetime(2026, 6, 1, tzinfo=datetime.UTC))
    [manifest] = [
        m
        for m in export.manifests
        if m["kind"] == "ValidatingAdmissionPolicy" and m["metadata"]["name"] == "gpu-admission-gpu003"
    ]
    allowance = settings.from_mapping(document).allowance("team-a")
    parts = ["", "tmp", "nvidia-mps", "nvidia-log", "var", "log", "control", "."]
    paths = {"/" + "/".join(p) for p in itertools.product(parts, repeat=4)} | {
        "/".join(p) for p in itertools.product(parts[1:], repeat=3)
    }

    # Compiled once: the pod asks for a card, so the policy's reachesGpuNodes variable is true here
    # (checked on one pod through the whole manifest), and the validation alone decides.
    env = cel.environment(extra=("variables",))
    [validation] = [cel.compile_expression(env, v["expression"], field="validation") for v in manifest["spec"]["validations"]]
    gpu_pod = {
        "metadata": {"name": "p"},
        "spec": {
            "containers": [{"name": "c", "resources": {"limits": SHARE}}],
            "volumes": [{"name": "v", "hostPath": {"path": "/proc"}}],
        },
    }
    assert not admits(manifest, gpu_pod)

    def exported_admits(path: str) -> bool:
        activation = {
            "object": {"spec": {"volumes": [{"name": "v", "hostPath": {"path": path}}]}},
            "variables": {vap.REACH: True},
        }
        return cel.evaluate(validation, activation) is True

    disagree = [path for path in sorted(paths) if exported_admits(path) is not (allowance.host_path(path) is not None)]
    assert len(paths) > 4000
    assert disagree == []
    assert cel.MAX_EXPRESSION_CHARS >= max(len(v["expression"]) for v in manifest["spec"]["validations"])
