"""GPU003's protected leaves: the CUDA MPS pipe and log directories are refused in any spelling and
kind of pod, while their parents (`/tmp`, `/var/log`) stay open; allowing a leaf is possible, and
allowing a parent uncovers no leaf; the exported ValidatingAdmissionPolicy agrees path by path."""

from __future__ import annotations

import datetime
import itertools
from typing import Any

import pytest

from policies import cel, hostpaths, model, settings
from tests.unit.policies.conftest import ContainerFactory, Evaluate, PodFactory, ResultOf, WorkloadFactory
from webhook.commands import vap

PREFIX = "GPU003: hostPath volumes must not reach the node's devices, container runtimes or control state: "
INSTEAD = (
    "; use an emptyDir, a PersistentVolumeClaim or a ConfigMap, request GPUs as resources, "
    "or ask an admin to allow the path (hostPaths.allow)"
)
PIPES = "the CUDA MPS control daemon's pipes, which run work in and reconfigure every tenant's MPS server"


def with_host_path(pod: PodFactory, container: ContainerFactory, path: str) -> dict[str, Any]:
    return pod(container(), volumes=[{"name": "mps", "hostPath": {"path": path}}])


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
def test_an_mps_directory_is_refused_in_any_spelling(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, written: str, leaf: str) -> None:
    decision = evaluate(with_host_path(pod, container, written))

    assert not decision.allowed
    [violation] = [v for v in decision.violations if v.policy == "GPU003"]
    assert f"which lies in the protected {leaf} (the CUDA MPS control daemon's" in violation.message


def test_the_message_names_the_volume_the_leaf_and_what_to_do(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    decision = evaluate(with_host_path(pod, container, "/tmp/nvidia-mps"))

    assert decision.denial_message == (
        PREFIX + f'volume "mps" mounts hostPath /tmp/nvidia-mps, which lies in the protected /tmp/nvidia-mps ({PIPES})' + INSTEAD
    )


@pytest.mark.parametrize("kind", ["Deployment", "DaemonSet", "Job", "CronJob"])
def test_a_workload_template_or_an_init_container_reaching_the_pipes_is_refused(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, workload: WorkloadFactory, kind: str) -> None:
    template = pod(container(gpu={"aliyun.com/gpu-mem": 2}), init=[container("setup", volumeMounts=[{"name": "mps", "mountPath": "/tmp/nvidia-mps"}])],
                   volumes=[{"name": "mps", "hostPath": {"path": "/tmp/nvidia-mps", "type": "Directory"}}])

    decision = evaluate(workload(kind, template))

    assert any("/tmp/nvidia-mps" in v.message for v in decision.violations if v.policy == "GPU003")


@pytest.mark.parametrize(
    "path",
    ["/tmp", "/tmp/", "/tmp/.X11-unix", "/tmp/nvidia-mps-build", "/tmp/nvidia", "/var/log", "/var/log/pods", "/var/log/nvidia", "/data/nvidia-mps"],
)
def test_the_parents_and_neighbours_of_the_leaves_pass(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, path: str) -> None:
    decision = evaluate(with_host_path(pod, container, path))

    assert result(decision, "GPU003") is model.Result.PASS


def test_an_admin_may_allow_the_pipe_directory_itself(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    config = {"hostPaths": {"allow": ["/tmp/nvidia-mps"]}}

    assert evaluate(with_host_path(pod, container, "/tmp/nvidia-mps"), config=config).allowed
    assert evaluate(with_host_path(pod, container, "/tmp/nvidia-mps/control"), config=config).allowed
    assert not evaluate(with_host_path(pod, container, "/var/log/nvidia-mps"), config=config).allowed


@pytest.mark.parametrize(
    ("config", "path"),
    [
        ({"hostPaths": {"allow": ["/tmp"]}}, "/tmp/nvidia-mps"),
        ({"hostPaths": {"allow": ["/var/log"]}}, "/var/log/nvidia-mps/control.log"),
        ({"hostPaths": {"protect": ["/"], "allow": ["/var/log"]}}, "/var/log/nvidia-mps"),
    ],
    ids=["tmp", "var-log", "allow-list"],
)
def test_allowing_a_parent_uncovers_no_leaf(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, config: dict[str, Any], path: str) -> None:
    assert not evaluate(with_host_path(pod, container, path), config=config).allowed


def test_an_admin_may_protect_tmp_itself_where_mps_runs(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    config = {"hostPaths": {"protect": ["/tmp"]}}

    assert not evaluate(with_host_path(pod, container, "/tmp"), config=config).allowed
    assert evaluate(with_host_path(pod, container, "/tmp"), config=None).allowed


def test_the_device_plugins_mps_directory_lies_in_run() -> None:
    assert hostpaths.exposes_gpu("/run/nvidia/mps") == "/run"
    assert hostpaths.exposes_gpu("/var/run/nvidia/mps/nvidia.com/gpu/pipe") == "/run"
    assert hostpaths.exposes_gpu("/tmp/nvidia-mps") == "/tmp/nvidia-mps"  # the audit sees leaves too


@pytest.mark.parametrize(
    "document",
    [{}, {"hostPaths": {"allow": ["/tmp/nvidia-mps/control"]}}, {"hostPaths": {"protect": ["/"], "allow": ["/var/log", "/tmp"]}}],
    ids=["defaults", "allowed-inside-a-leaf", "allow-list"],
)
def test_the_exported_policy_agrees_with_the_webhook_around_the_leaves(document: dict[str, Any]) -> None:
    export = vap.export(settings.from_mapping(document), now=datetime.datetime(2026, 6, 1, tzinfo=datetime.UTC))
    [manifest] = [m for m in export.manifests if m["kind"] == "ValidatingAdmissionPolicy" and m["metadata"]["name"] == "gpu-admission-gpu003"]
    [validation] = manifest["spec"]["validations"]
    compiled = cel.compile_expression(cel.environment(), validation["expression"], field="validation")
    rules = settings.from_mapping(document).host_paths
    parts = ["", "tmp", "nvidia-mps", "nvidia-log", "var", "log", "control", "."]
    paths = {"/" + "/".join(p) for p in itertools.product(parts, repeat=4)} | {"/".join(p) for p in itertools.product(parts[1:], repeat=3)}

    disagree = [
        path
        for path in sorted(paths)
        if (cel.evaluate(compiled, {"object": {"spec": {"volumes": [{"name": "v", "hostPath": {"path": path}}]}}}) is True)
        is not (rules.judge(path) is None)
    ]
    assert len(paths) > 4000
    assert "/tmp/nvidia-mps" in {verdict.root for verdict in map(rules.judge, paths) if verdict is not None}
    assert disagree == []
