"""GPU003: no hostPath volume reaches the node's devices, container runtimes or control state."""

from __future__ import annotations

from typing import Any

import pytest

from policies import hostpaths, model, settings
from tests.unit.policies.conftest import ContainerFactory, Evaluate, PodFactory, ResultOf, ViolationMessages, WorkloadFactory

PREFIX = "GPU003: hostPath volumes must not reach the node's devices, container runtimes or control state: "
INSTEAD = (
    "; use an emptyDir, a PersistentVolumeClaim or a ConfigMap, request GPUs as resources, "
    "or ask an admin to allow the path (hostPaths.allow)"
)


def with_host_path(pod: PodFactory, container: ContainerFactory, path: str, **extra: Any) -> dict[str, Any]:
    return pod(container(), volumes=[{"name": "host", "hostPath": {"path": path, **extra}}])


# --- the attack side ---------------------------------------------------------------------------

RUNTIME_SOCKETS = [
    "/run/containerd/containerd.sock",
    "/var/run/containerd/containerd.sock",
    "/run/containerd",
    "/var/run/docker.sock",
    "/run/docker.sock",
    "/var/run/crio/crio.sock",
    "/run/crio/crio.sock",
    "/var/run/cri-dockerd.sock",
    "/run/cri-dockerd.sock",
    "/var/run/nri/nri.sock",
    "/var/run/nri",
]
CONTROL_STATE = [
    "/var/lib/kubelet/plugins_registry",
    "/var/lib/kubelet/pods",
    "/var/lib/kubelet/pki",
    "/var/lib/kubelet/device-plugins/kubelet.sock",
    "/var/lib/kubelet/pod-resources/",
    "/var/lib/kubelet",
    "/etc/kubernetes/manifests",
    "/etc/kubernetes/admin.conf",
    "/etc/nvidia-container-runtime",
    "/etc/nvidia-container-runtime/config.toml",
    "/etc/nvidia-container-toolkit",
    "/etc/cdi",
    "/var/run/cdi",
    "/run/cdi/nvidia.yaml",
    "/var/lib/containerd",
    "/var/lib/docker",
    "/var/lib/containers/storage",
    "/etc/containerd/config.toml",
    "/usr/share/containers/oci/hooks.d",
    "/usr/bin/nvidia-container-runtime-hook",
    "/usr/local/nvidia/toolkit",
    "/usr/lib/x86_64-linux-gnu",
]
DEVICES = ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/dri", "/dev/dri/card0", "/dev/null", "/dev/fuse"]
WHOLE_HOST = ["/proc", "/proc/1/root", "/sys", "/sys/bus/pci/devices", "/run/nvidia/driver", "/var/run/nvidia-persistenced/socket"]


@pytest.mark.parametrize("path", RUNTIME_SOCKETS + CONTROL_STATE + DEVICES + WHOLE_HOST)
def test_host_path_in_a_protected_root_is_denied(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, path: str) -> None:
    decision = evaluate(with_host_path(pod, container, path))

    assert not decision.allowed
    assert decision.denial_message.startswith(PREFIX + 'volume "host" mounts hostPath ')
    assert decision.denial_message.endswith(INSTEAD)


def test_the_message_names_the_volume_the_path_the_root_and_what_to_do(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    decision = evaluate(with_host_path(pod, container, "/run/containerd/containerd.sock"))

    assert decision.denial_message == (
        PREFIX + 'volume "host" mounts hostPath /run/containerd/containerd.sock, which lies in the protected /run '
        "(container runtime, NRI and device-plugin sockets, CDI specs and the NVIDIA runtime directories)" + INSTEAD
    )


@pytest.mark.parametrize(
    ("path", "root"),
    [
        ("/", "/dev"),
        ("/var", "/var/lib/kubelet"),
        ("/var/lib", "/var/lib/kubelet"),
        ("/etc", "/etc/kubernetes"),
        ("/usr", "/usr/share/containers"),
        ("/usr/share", "/usr/share/containers"),
        ("/opt", "/opt/cni"),
    ],
)
def test_host_path_on_a_parent_of_a_protected_root_is_denied(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, path: str, root: str) -> None:
    decision = evaluate(with_host_path(pod, container, path))

    assert not decision.allowed
    assert f"mounts hostPath {path}, which contains the protected {root} (" in decision.denial_message


@pytest.mark.parametrize(
    ("written", "resolved"),
    [
        ("//run///containerd/", "/run/containerd"),
        ("/var/run/../run/containerd", "/run/containerd"),
        ("/var/./run", "/run"),
        ("run/containerd", "/run/containerd"),
        ("/var/run", "/run"),
        ("/var/lock", "/run/lock"),
        ("/dev/", "/dev"),
        ("/tmp/../dev/nvidia0", "/dev/nvidia0"),
        ("/dev/shm/../nvidia0", "/dev/nvidia0"),
        # /var/run is a link to /run, so its parent is /, not /var: the node reads this as /etc.
        ("/var/run/../etc/kubernetes", "/etc/kubernetes"),
        ("/var/log/../lib/./kubelet//pods", "/var/lib/kubelet/pods"),
        ("dev", "/dev"),
    ],
)
def test_host_path_is_resolved_as_the_node_resolves_it_before_it_is_judged(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, written: str, resolved: str) -> None:
    decision = evaluate(with_host_path(pod, container, written))

    assert not decision.allowed
    assert f"mounts hostPath {resolved} (written {written!r})" in decision.denial_message


@pytest.mark.parametrize("kind", ["Deployment", "DaemonSet", "Job", "CronJob", "StatefulSet"])
def test_a_runtime_socket_in_a_workload_template_is_denied(pod: PodFactory, container: ContainerFactory, workload: WorkloadFactory, evaluate: Evaluate, kind: str) -> None:
    template = pod(
        container(volumeMounts=[{"name": "sock", "mountPath": "/run/containerd/containerd.sock"}]),
        init=[container("setup")],
        volumes=[{"name": "sock", "hostPath": {"path": "/run/containerd/containerd.sock", "type": "Socket"}}],
    )
    decision = evaluate(workload(kind, template))

    assert not decision.allowed
    assert 'volume "sock" mounts hostPath /run/containerd/containerd.sock, which lies in the protected /run' in (
        decision.denial_message
    )


def test_a_host_path_used_only_by_an_init_container_is_denied(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    spec_pod = pod(
        container(),
        init=[container("copy", volumeMounts=[{"name": "pki", "mountPath": "/pki"}])],
        volumes=[{"name": "pki", "hostPath": {"path": "/var/lib/kubelet/pki"}}],
    )

    decision = evaluate(spec_pod)

    assert not decision.allowed
    assert 'volume "pki" mounts hostPath /var/lib/kubelet/pki' in decision.denial_message


def test_every_offending_volume_is_named(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, violation_messages: ViolationMessages) -> None:
    volumes = [
        {"name": "logs", "hostPath": {"path": "/var/log"}},
        {"name": "docker", "hostPath": {"path": "/var/run/docker.sock"}},
        {"name": "proc", "hostPath": {"path": "/proc"}},
    ]
    decision = evaluate(pod(container(), volumes=volumes))

    docker, proc = violation_messages(decision, "GPU003")
    assert docker.startswith(PREFIX + 'volume "docker" mounts hostPath /run/docker.sock (written ')
    assert proc.startswith(PREFIX + 'volume "proc" mounts hostPath /proc, which lies in the protected /proc')


# --- ordinary pods keep working ------------------------------------------------------------------

ORDINARY = [
    "/var/log",
    "/var/log/pods",
    "/var/log/containers",
    "/etc/localtime",
    "/etc/ssl/certs",
    "/etc/pki/tls/certs",
    "/usr/share/zoneinfo",
    "/usr/share/ca-certificates",
    "/data",
    "/data/models",
    "/mnt/disks/ssd0",
    "/tmp",
    "/dev/shm",
    "/dev/shm/nccl",
    "/sys/fs/cgroup",
    "/var/lib/mysql",
    "/var/lib/calico",
    "/srv/www",
    "/home/share",
    "/devices",
    "/runner",
    "/procedures",
    "/etc/kubernetes-backup",
]


@pytest.mark.parametrize("path", ORDINARY)
def test_host_path_outside_every_protected_root_is_allowed(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, path: str) -> None:
    decision = evaluate(with_host_path(pod, container, path, type="DirectoryOrCreate"))

    assert decision.allowed
    assert result(decision, "GPU003") is model.Result.PASS


def test_a_log_agent_daemonset_is_allowed(pod: PodFactory, container: ContainerFactory, workload: WorkloadFactory, evaluate: Evaluate, result: ResultOf) -> None:
    template = pod(
        container("fluent-bit", volumeMounts=[{"name": "varlog", "mountPath": "/var/log", "readOnly": True}]),
        volumes=[
            {"name": "varlog", "hostPath": {"path": "/var/log"}},
            {"name": "tz", "hostPath": {"path": "/etc/localtime", "type": "File"}},
        ],
    )
    decision = evaluate(workload("DaemonSet", template))

    assert decision.allowed
    assert result(decision, "GPU003") is model.Result.PASS


@pytest.mark.parametrize(
    "volume",
    [
        {"name": "x", "hostPath": {"path": 5}},
        {"name": "x", "hostPath": "x"},
        {"name": "x", "hostPath": {}},
        {"name": "x", "emptyDir": {}},
        {"hostPath": None},
        3,
    ],
)
def test_malformed_or_other_volumes_are_ignored(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, volume: object) -> None:
    decision = evaluate(pod(container(), volumes=[volume]))

    assert result(decision, "GPU003") is model.Result.PASS


# --- settings: hostPaths.protect and hostPaths.allow --------------------------------------------


def test_an_extra_protected_root_refuses_the_path_and_its_parents(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    config = {"hostPaths": {"protect": ["/srv/kubelet"]}}

    inside = evaluate(with_host_path(pod, container, "/srv/kubelet/pods"), config=config)
    parent = evaluate(with_host_path(pod, container, "/srv"), config=config)
    beside = evaluate(with_host_path(pod, container, "/srv/www"), config=config)

    assert "which lies in the protected /srv/kubelet (protected by the settings (hostPaths.protect))" in (
        inside.denial_message
    )
    assert "mounts hostPath /srv, which contains the protected /srv/kubelet" in parent.denial_message
    assert beside.allowed


@pytest.mark.parametrize("written", ["/run/xtables.lock", "/var/run/xtables.lock", "//run/./xtables.lock/"])
def test_an_allowed_path_passes_in_any_spelling(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, written: str) -> None:
    config = {"hostPaths": {"allow": ["/var/run/xtables.lock"]}}

    decision = evaluate(with_host_path(pod, container, written), config=config)

    assert result(decision, "GPU003") is model.Result.PASS


@pytest.mark.parametrize(
    "path", ["/run", "/run/flannel/../containerd", "/run/flannel/../../etc/kubernetes", "/run/flannelx", "/run/cni"]
)
def test_an_allowed_path_uncovers_nothing_beside_or_above_it(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, path: str) -> None:
    config = {"hostPaths": {"allow": ["/run/flannel"]}}

    decision = evaluate(with_host_path(pod, container, path), config=config)

    assert not decision.allowed
    assert evaluate(with_host_path(pod, container, "/run/flannel/subnet.env"), config=config).allowed


def test_protecting_dev_shm_takes_its_built_in_allowance_away(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    config = {"hostPaths": {"protect": ["/dev/shm"]}}

    assert not evaluate(with_host_path(pod, container, "/dev/shm"), config=config).allowed
    assert evaluate(with_host_path(pod, container, "/dev/shm")).allowed


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("x", "hostPaths: must be a mapping with protect and/or allow, got 'x'"),
        ({"deny": []}, "hostPaths.deny: unknown key; known: protect, allow"),
        ({"allow": "/data"}, "hostPaths.allow: must be a list of non-empty strings, got '/data'"),
        ({"protect": [""]}, "hostPaths.protect: must be a list of non-empty strings, got ['']"),
        ({"allow": ["data"]}, "hostPaths.allow[0]: must be an absolute path, got 'data'"),
        (
            {"allow": ["/var"]},
            "hostPaths.allow[0]: '/var' contains the protected root /var/lib/kubelet; allow a path below it, "
            "or give the namespaces that need all of it an exception",
        ),
        (
            {"allow": ["/var/run"]},
            "hostPaths.allow[0]: '/var/run' is the protected root /run; allow a path below it, "
            "or give the namespaces that need all of it an exception",
        ),
        ({"allow": ["/"]}, "hostPaths.allow[0]: '/' contains the protected root /dev; allow a path below it, "
         "or give the namespaces that need all of it an exception"),
        (
            {"protect": ["/data/secret"], "allow": ["/data"]},
            "hostPaths.allow[0]: '/data' contains the protected root /data/secret; allow a path below it, "
            "or give the namespaces that need all of it an exception",
        ),
    ],
)
def test_invalid_host_path_settings_are_a_clear_error(document: object, message: str) -> None:
    with pytest.raises(settings.InvalidSettings) as raised:
        settings.from_mapping({"hostPaths": document})

    assert str(raised.value) == message


def test_empty_host_path_settings_are_the_built_in_rules() -> None:
    assert settings.from_mapping({"hostPaths": {}}).host_paths == hostpaths.DEFAULT_RULES
    assert settings.from_mapping({"hostPaths": {"protect": [], "allow": None}}).host_paths == hostpaths.DEFAULT_RULES
    assert settings.Settings().host_paths is hostpaths.DEFAULT_RULES


def test_protecting_everything_makes_allow_an_allow_list(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    config = {"hostPaths": {"protect": ["/"], "allow": ["/var/log"]}}

    assert evaluate(with_host_path(pod, container, "/var/log/pods"), config=config).allowed
    assert not evaluate(with_host_path(pod, container, "/data"), config=config).allowed


# --- the helpers other modules use --------------------------------------------------------------


def test_exposes_gpu_names_the_protected_root_for_the_audit() -> None:
    assert hostpaths.exposes_gpu("/dev") == "/dev"
    assert hostpaths.exposes_gpu("/var/run/docker.sock") == "/run"
    assert hostpaths.exposes_gpu("/") == "/dev"
    assert hostpaths.exposes_gpu("/var/log") is None
