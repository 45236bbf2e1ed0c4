"""GPU003: no hostPath volume exposes GPU devices or their control sockets."""

from __future__ import annotations

import pytest

from policies import model

PREFIX = "GPU003: hostPath volumes must not expose GPU devices or their control sockets: "


def with_host_path(pod, container, path: str):
    return pod(container(), volumes=[{"name": "host", "hostPath": {"path": path}}])


@pytest.mark.parametrize(
    "path",
    [
        "/dev/nvidia0",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/dri",
        "/dev/dri/card0",
        "/run/nvidia",
        "/run/nvidia/driver",
        "/var/run/nvidia-persistenced/socket",
        "/var/lib/kubelet/device-plugins",
        "/var/lib/kubelet/device-plugins/kubelet.sock",
        "/var/lib/kubelet/pod-resources/",
    ],
)
def test_host_path_on_gpu_devices_and_sockets_is_denied(pod, container, evaluate, path):
    decision = evaluate(with_host_path(pod, container, path))

    assert not decision.allowed
    assert decision.denial_message.startswith(PREFIX + 'volume "host" mounts hostPath ')


@pytest.mark.parametrize("path", ["/", "/dev", "/run", "/var", "/var/run", "/var/lib", "/var/lib/kubelet"])
def test_host_path_on_a_parent_of_gpu_devices_is_denied(pod, container, evaluate, path):
    decision = evaluate(with_host_path(pod, container, path))

    assert not decision.allowed


@pytest.mark.parametrize(
    ("written", "normal"),
    [
        ("/dev/", "/dev"),
        ("//dev//", "/dev"),
        ("/tmp/../dev/nvidia0", "/dev/nvidia0"),
        ("/var/run/../lib/kubelet", "/var/lib/kubelet"),
        ("dev", "/dev"),
    ],
)
def test_host_path_is_normalised_before_it_is_judged(pod, container, evaluate, written, normal):
    decision = evaluate(with_host_path(pod, container, written))

    assert not decision.allowed
    assert f"mounts hostPath {normal} (written {written!r})" in decision.denial_message


def test_host_path_message_names_the_volume_path_and_protected_location(pod, container, evaluate):
    decision = evaluate(with_host_path(pod, container, "/var/lib/kubelet"))

    assert decision.denial_message == (
        PREFIX + 'volume "host" mounts hostPath /var/lib/kubelet, covering '
        "/var/lib/kubelet/device-plugins"
    )


@pytest.mark.parametrize(
    "path", ["/dev/shm", "/devices", "/tmp", "/var/log", "/var/lib/docker", "/data/models", "/runner"]
)
def test_host_path_elsewhere_is_allowed(pod, container, evaluate, result, path):
    decision = evaluate(with_host_path(pod, container, path))

    assert decision.allowed
    assert result(decision, "GPU003") is model.Result.PASS


def test_host_path_on_dev_in_a_cronjob_template_is_denied(pod, container, workload, evaluate):
    decision = evaluate(workload("CronJob", with_host_path(pod, container, "/dev")))

    assert not decision.allowed
    assert decision.denial_message == (
        PREFIX + 'volume "host" mounts hostPath /dev, covering /dev/nvidia*'
    )
