"""GPU006: no container mounts anything at the NVIDIA toolkit's device-list path."""

from __future__ import annotations

from typing import Any

import pytest

from policies import model
from policies.builtin import gpu006_device_list_mounts
from tests.unit.policies.conftest import ContainerFactory, Evaluate, PodFactory, ResultOf, ViolationMessages, WorkloadFactory

PREFIX = "GPU006: no container may mount anything at the NVIDIA device-list path /var/run/nvidia-container-devices: "
INSTEAD = "; request GPUs as resources (nvidia.com/gpu, aliyun.com/gpu-mem) instead"
DEV_NULL = {"name": "devs", "hostPath": {"path": "/dev/null"}}


def mounting(container: ContainerFactory, at: str, *, name: str = "main", volume: str = "devs", **limits: Any) -> dict[str, Any]:
    return container(name, volumeMounts=[{"name": volume, "mountPath": at}], **limits)


def test_the_device_list_volume_in_a_gpu_mem_pod_is_denied(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, violation_messages: ViolationMessages
) -> None:
    attack = pod(
        mounting(container, "/var/run/nvidia-container-devices/all", gpu={"aliyun.com/gpu-mem": 1}),
        volumes=[DEV_NULL],
    )

    decision = evaluate(attack)

    assert not decision.allowed
    assert violation_messages(decision, "GPU006") == [
        PREFIX + 'container "main" mounts volume "devs" at /var/run/nvidia-container-devices/all, which the NVIDIA '
        'container toolkit reads as a request for GPU "all"' + INSTEAD
    ]


@pytest.mark.parametrize(
    ("written", "device"),
    [
        ("/var/run/nvidia-container-devices/0", "0"),
        (
            "/var/run/nvidia-container-devices/GPU-955ef018-3bd9-5f27-80b3-fa20ee8d19c5",
            "GPU-955ef018-3bd9-5f27-80b3-fa20ee8d19c5",
        ),
        ("/var/run/nvidia-container-devices/cdi/nvidia.com/gpu/all", "cdi/nvidia.com/gpu/all"),
        ("/var/run/nvidia-container-devices/imex/0", "imex/0"),
        # The toolkit matches a string prefix, not a path prefix.
        ("/var/run/nvidia-container-devicesall", "all"),
        ("/run/nvidia-container-devices/all", "all"),
        ("//var//run///nvidia-container-devices/all/", "all"),
        ("/var/./run/nvidia-container-devices/all", "all"),
        ("/tmp/../var/run/nvidia-container-devices/all", "all"),
        ("var/run/nvidia-container-devices/all", "all"),
        ("/var/run/nvidia-container-devices", ""),
        ("/var/run/nvidia-container-devices/", ""),
    ],
)
def test_every_spelling_of_the_device_list_path_is_denied(
    pod: PodFactory,
    container: ContainerFactory,
    evaluate: Evaluate,
    violation_messages: ViolationMessages,
    written: str,
    device: str,
) -> None:
    decision = evaluate(pod(mounting(container, written), volumes=[DEV_NULL]))

    [message] = violation_messages(decision, "GPU006")
    assert not decision.allowed
    asks = f'GPU "{device}"' if device else "the device-list directory"
    assert f"which the NVIDIA container toolkit reads as a request for {asks};" in message
    assert gpu006_device_list_mounts.device_request(written) == device


@pytest.mark.parametrize(
    "volume",
    [
        {"name": "devs", "emptyDir": {}},
        {"name": "devs", "persistentVolumeClaim": {"claimName": "null-pv"}},
        {"name": "devs", "configMap": {"name": "x"}},
        {"name": "devs", "hostPath": {"path": "/dev//null"}},
    ],
)
def test_any_volume_type_at_the_device_list_path_is_denied(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, volume: dict[str, Any]
) -> None:
    decision = evaluate(pod(mounting(container, "/var/run/nvidia-container-devices/all"), volumes=[volume]))

    assert result(decision, "GPU006") is model.Result.FAIL


def test_an_init_container_a_sidecar_and_a_later_container_are_each_named(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, violation_messages: ViolationMessages
) -> None:
    spec_pod = pod(
        container("app"),
        mounting(container, "/var/run/nvidia-container-devices/1", name="second"),
        init=[
            mounting(container, "/var/run/nvidia-container-devices/0", name="setup"),
            {**mounting(container, "/var/run/nvidia-container-devices/all", name="proxy"), "restartPolicy": "Always"},
        ],
        volumes=[DEV_NULL],
    )

    found = violation_messages(evaluate(spec_pod), "GPU006")

    assert [m.split(" mounts ")[0].removeprefix(PREFIX) for m in found] == [
        'init container "setup"',
        'init container "proxy"',
        'container "second"',
    ]


def test_a_debug_container_with_the_device_list_mount_is_denied(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, violation_messages: ViolationMessages
) -> None:
    old = pod(container(), volumes=[DEV_NULL])
    new = pod(
        container(),
        ephemeral=[{**mounting(container, "/var/run/nvidia-container-devices/all", name="debug"), "targetContainerName": "main"}],
        volumes=[DEV_NULL],
    )

    decision = evaluate(new, operation="UPDATE", subresource="ephemeralcontainers", old=old)

    assert not decision.allowed
    assert violation_messages(decision, "GPU006") == [
        PREFIX + 'ephemeral container "debug" mounts volume "devs" at /var/run/nvidia-container-devices/all, which '
        'the NVIDIA container toolkit reads as a request for GPU "all"' + INSTEAD
    ]


@pytest.mark.parametrize("kind", ["Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob", "ReplicaSet"])
def test_the_device_list_mount_in_a_workload_template_is_denied(
    pod: PodFactory, container: ContainerFactory, workload: WorkloadFactory, evaluate: Evaluate, result: ResultOf, kind: str
) -> None:
    template = pod(mounting(container, "/var/run/nvidia-container-devices/all"), volumes=[DEV_NULL])

    decision = evaluate(workload(kind, template))

    assert not decision.allowed
    assert result(decision, "GPU006") is model.Result.FAIL


def test_a_block_device_at_the_device_list_path_is_denied(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, violation_messages: ViolationMessages
) -> None:
    spec_pod = pod(
        container(volumeDevices=[{"name": "raw", "devicePath": "/var/run/nvidia-container-devices/all"}]),
        volumes=[{"name": "raw", "persistentVolumeClaim": {"claimName": "block"}}],
    )

    [message] = violation_messages(evaluate(spec_pod), "GPU006")

    assert message.startswith(PREFIX + 'container "main" mounts volume "raw" at /var/run/nvidia-container-devices/all')


# --- ordinary pods keep working ------------------------------------------------------------------


@pytest.mark.parametrize(
    "mount_path",
    [
        "/var/run",  # a parent: the toolkit reads mount destinations only, never what a volume holds
        "/run",
        "/var",
        "/var/run/secrets/app",
        "/var/run/nvidia-container",
        "/var/run/nvidia-container-device",
        "/run/nvidia",
        "/var/lib/nvidia-container-devices/all",
        "/tmp/var/run/nvidia-container-devices/all",
        "/data",
    ],
)
def test_mounts_elsewhere_are_allowed(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, mount_path: str
) -> None:
    spec_pod = pod(
        mounting(container, mount_path, volume="scratch", gpu={"aliyun.com/gpu-mem": 2}),
        volumes=[{"name": "scratch", "emptyDir": {}}],
    )

    decision = evaluate(spec_pod)

    assert decision.allowed
    assert result(decision, "GPU006") is model.Result.PASS


def test_a_gpu_pod_with_ordinary_volumes_is_allowed(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf
) -> None:
    spec_pod = pod(
        container(
            gpu={"nvidia.com/gpu": 1},
            volumeMounts=[
                {"name": "data", "mountPath": "/data"},
                {"name": "shm", "mountPath": "/dev/shm"},
                {"name": "token", "mountPath": "/var/run/secrets/tokens"},
            ],
            volumeDevices=[{"name": "raw", "devicePath": "/dev/xvda"}],
        ),
        volumes=[
            {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
            {"name": "shm", "emptyDir": {"medium": "Memory"}},
            {"name": "token", "projected": {"sources": []}},
            {"name": "raw", "persistentVolumeClaim": {"claimName": "raw"}},
        ],
    )

    decision = evaluate(spec_pod)

    assert decision.allowed
    assert result(decision, "GPU006") is model.Result.PASS


@pytest.mark.parametrize(
    "mounts",
    [
        "x",
        [5, None, "y"],
        [{"name": "v"}],
        [{"name": "v", "mountPath": 5}],
        [{"mountPath": ["/var/run/nvidia-container-devices/all"]}],
    ],
)
def test_malformed_mounts_are_ignored_without_an_error(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, mounts: object
) -> None:
    decision = evaluate(pod(container(volumeMounts=mounts, volumeDevices=mounts)))

    assert result(decision, "GPU006") is model.Result.PASS


def test_an_unnamed_mount_is_named_by_its_position(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, violation_messages: ViolationMessages
) -> None:
    spec_pod = pod(container(volumeMounts=[{"mountPath": "/data"}, {"mountPath": "/var/run/nvidia-container-devices/0"}]))

    [message] = violation_messages(evaluate(spec_pod), "GPU006")

    assert 'container "main" mounts volumeMounts[1] at /var/run/nvidia-container-devices/0' in message


def test_gpu006_is_registered_in_id_order_and_enforced_by_default() -> None:
    from policies import builtin

    ids = [p.id for p in builtin.POLICIES]
    assert ids.index("GPU006") == ids.index("GPU005") + 1
    assert gpu006_device_list_mounts.DeviceListMounts.default_action is model.Action.ENFORCE
