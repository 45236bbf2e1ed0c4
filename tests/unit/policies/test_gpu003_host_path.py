"""GPU003: a pod that can reach a GPU node mounts only the host paths GPU nodes allow (the trust zone)."""

from __future__ import annotations

from typing import Any

import pytest

from policies import hostpaths, model, settings
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
)

KEEP_OFF = [dict(e) for e in DEFAULT_ZONE.keep_off]

PREFIX = "GPU003: a pod that can reach a GPU node may mount only the host paths and volume types GPU nodes allow: "
INSTEAD = (
    "; the pod requests the GPU resource nvidia.com/gpu; use an emptyDir, a PersistentVolumeClaim or a ConfigMap, "
    "mount an allowed path read-only, run the part that needs the node in a pod that asks for no GPU (it is kept "
    "off GPU nodes), or ask an admin to allow the path for the namespace (trustZone)"
)
GPU = {"nvidia.com/gpu": 1}
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
OFF_GPU_NODES = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": KEEP_OFF}]}}}


def with_host_path(pod: PodFactory, container: ContainerFactory, path: str, *, gpu: bool = True, **extra: Any) -> dict[str, Any]:
    """A pod (asking for a card unless `gpu` is False) mounting `path` read-only."""
    main = container(gpu=GPU if gpu else None, volumeMounts=[{"name": "host", "mountPath": "/host", "readOnly": True}])
    return pod(main, volumes=[{"name": "host", "hostPath": {"path": path, **extra}}])


# --- the attack side: a pod that asks for a card ----------------------------------------------------

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
DEVICES = [
    "/dev/nvidia0",
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/dri",
    "/dev/dri/card0",
    "/dev/null",
    "/dev/fuse",
    "/dev/shm",
]
WHOLE_HOST = [
    "/proc",
    "/proc/1/root",
    "/sys",
    "/sys/bus/pci/devices",
    "/sys/fs/cgroup",
    "/run/nvidia/driver",
    "/var/run/nvidia-persistenced/socket",
]
# Paths no list of protected roots ever named: refused all the same, since only the allowlist passes.
UNLISTED = [
    "/var/log",
    "/var/log/pods",
    "/tmp",
    "/data",
    "/etc/ssl",
    "/var/lib/container/kubelet",
    "/etc/ld.so.preload",
    "/opt/nri/plugins",
]


@pytest.mark.parametrize("path", RUNTIME_SOCKETS + CONTROL_STATE + DEVICES + WHOLE_HOST + UNLISTED)
def test_host_path_outside_the_allowlist_is_denied(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, path: str
) -> None:
    decision = evaluate(with_host_path(pod, container, path))

    assert not decision.allowed
    assert decision.denial_message.startswith(PREFIX + 'volume "host" mounts hostPath ')
    assert decision.denial_message.endswith(INSTEAD)


def test_the_message_names_the_volume_the_path_the_root_and_what_to_do(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    decision = evaluate(with_host_path(pod, container, "/run/containerd/containerd.sock"))

    assert decision.denial_message == (
        PREFIX + 'volume "host" mounts hostPath /run/containerd/containerd.sock, which is not an allowed host path (lies in '
        "/run: container runtime, NRI and device-plugin sockets, CDI specs and the NVIDIA runtime directories)" + INSTEAD
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
def test_host_path_on_a_parent_of_a_protected_root_is_denied(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, path: str, root: str
) -> None:
    decision = evaluate(with_host_path(pod, container, path))

    assert not decision.allowed
    assert f"mounts hostPath {path}, which is not an allowed host path (contains {root}: " in decision.denial_message


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
        # out of an allowed path, back up into the node
        ("/etc/localtime/../kubernetes", "/etc/kubernetes"),
        ("/usr/share/zoneinfo/../../bin", "/usr/bin"),
    ],
)
def test_host_path_is_resolved_as_the_node_resolves_it_before_it_is_judged(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, written: str, resolved: str
) -> None:
    decision = evaluate(with_host_path(pod, container, written))

    assert not decision.allowed
    assert f"mounts hostPath {resolved} (written {written!r})" in decision.denial_message


@pytest.mark.parametrize("kind", ["Deployment", "DaemonSet", "Job", "CronJob", "StatefulSet"])
def test_a_runtime_socket_in_a_workload_template_is_denied(
    pod: PodFactory, container: ContainerFactory, workload: WorkloadFactory, evaluate: Evaluate, kind: str
) -> None:
    template = pod(
        container(gpu=GPU, volumeMounts=[{"name": "sock", "mountPath": "/run/containerd/containerd.sock"}]),
        init=[container("setup")],
        volumes=[{"name": "sock", "hostPath": {"path": "/run/containerd/containerd.sock", "type": "Socket"}}],
    )
    decision = evaluate(workload(kind, template))

    assert not decision.allowed
    assert 'volume "sock" mounts hostPath /run/containerd/containerd.sock, which is not an allowed host path (lies in /run' in (
        decision.denial_message
    )


def test_a_host_path_used_only_by_an_init_container_is_denied(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    spec_pod = pod(
        container(gpu=GPU),
        init=[container("copy", volumeMounts=[{"name": "pki", "mountPath": "/pki"}])],
        volumes=[{"name": "pki", "hostPath": {"path": "/var/lib/kubelet/pki"}}],
    )

    decision = evaluate(spec_pod)

    assert not decision.allowed
    assert 'volume "pki" mounts hostPath /var/lib/kubelet/pki' in decision.denial_message


def test_every_offending_volume_is_named(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, violation_messages: ViolationMessages
) -> None:
    volumes = [
        {"name": "logs", "hostPath": {"path": "/var/log"}},
        {"name": "docker", "hostPath": {"path": "/var/run/docker.sock"}},
        {"name": "proc", "hostPath": {"path": "/proc"}},
        {"name": "tz", "hostPath": {"path": "/etc/localtime"}},
    ]
    decision = evaluate(pod(container(gpu=GPU), volumes=volumes))

    logs, docker, proc = violation_messages(decision, "GPU003")
    assert logs.startswith(PREFIX + 'volume "logs" mounts hostPath /var/log, which is not an allowed host path;')
    assert docker.startswith(PREFIX + 'volume "docker" mounts hostPath /run/docker.sock (written ')
    assert proc.startswith(PREFIX + 'volume "proc" mounts hostPath /proc, which is not an allowed host path (lies in /proc')


@pytest.mark.parametrize(
    "path", ["/etc/localtime", "/usr/share/zoneinfo", "/usr/share/zoneinfo/Asia/Shanghai", "/var/lib/lxcfs/proc/meminfo"]
)
def test_the_allowed_paths_pass_read_only_in_a_gpu_pod(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, path: str
) -> None:
    decision = evaluate(with_host_path(pod, container, path, type="File"))

    assert decision.allowed
    assert result(decision, "GPU003") is model.Result.PASS


# --- pods without GPUs keep working, off GPU nodes --------------------------------------------------

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
    "/var/run/docker.sock",
    "/proc",
]


@pytest.mark.parametrize("path", ORDINARY)
def test_any_host_path_in_a_pod_without_gpus_is_allowed_off_gpu_nodes(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, patched: Patched, path: str
) -> None:
    obj = with_host_path(pod, container, path, gpu=False, type="DirectoryOrCreate")
    decision = evaluate(obj)

    assert decision.allowed
    assert result(decision, "GPU003") is model.Result.PASS
    allowed = ("/etc/localtime", "/etc/ssl/certs", "/usr/share/zoneinfo")  # the allowlist: nothing to keep off GPU nodes
    affinity = {"op": "add", "path": "/spec/affinity", "value": OFF_GPU_NODES}
    assert (affinity in decision.patch) is (path not in allowed)
    assert_second_pass_is_empty(evaluate, patched, obj, decision)


@pytest.mark.parametrize("path", RUNTIME_SOCKETS + CONTROL_STATE + DEVICES + WHOLE_HOST + UNLISTED)
def test_every_refused_path_in_a_pod_without_gpus_is_admitted_with_gpu103s_affinity(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, patched: Patched, path: str
) -> None:
    """The flip side of `test_host_path_outside_the_allowlist_is_denied`: the same pod asking for no card."""
    obj = with_host_path(pod, container, path, gpu=False)
    decision = evaluate(obj)

    assert decision.allowed, decision.denial_message
    assert result(decision, "GPU003") is model.Result.PASS
    assert decision.patch == (
        {"op": "add", "path": "/spec/affinity", "value": OFF_GPU_NODES},
        {"op": "add", "path": "/spec/containers/0/env", "value": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]},
    )
    [notice] = decision.notices
    assert notice.startswith(
        "GPU103: pods that use no GPU but have node power are kept off GPU nodes: kept off GPU nodes (required node "
        'affinity against every GPU node label): volume "host" mounts hostPath '
    ), notice
    assert_second_pass_is_empty(evaluate, patched, obj, decision)


@pytest.mark.parametrize("action", ["warn", "audit", "off"])
def test_a_pod_without_gpus_is_denied_where_gpu103_does_not_keep_it_off_gpu_nodes(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, action: str
) -> None:
    decision = evaluate(
        with_host_path(pod, container, "/run/containerd/containerd.sock", gpu=False),
        config={"policies": {"GPU103": {"action": action}}},
    )

    assert not decision.allowed
    assert decision.denial_message == (
        PREFIX + 'volume "host" mounts hostPath /run/containerd/containerd.sock, which is not an allowed host path (lies in '
        "/run: container runtime, NRI and device-plugin sockets, CDI specs and the NVIDIA runtime directories)"
        + INSTEAD.replace(
            "; the pod requests the GPU resource nvidia.com/gpu;",
            "; nothing keeps the pod off GPU nodes (no required node affinity against every GPU node label);",
        )
    )


def test_a_log_agent_daemonset_is_allowed_off_gpu_nodes(
    pod: PodFactory,
    container: ContainerFactory,
    workload: WorkloadFactory,
    evaluate: Evaluate,
    result: ResultOf,
    patched: Patched,
) -> None:
    template = pod(
        container("fluent-bit", volumeMounts=[{"name": "varlog", "mountPath": "/var/log", "readOnly": True}]),
        volumes=[
            {"name": "varlog", "hostPath": {"path": "/var/log"}},
            {"name": "tz", "hostPath": {"path": "/etc/localtime", "type": "File"}},
        ],
    )
    obj = workload("DaemonSet", template)
    decision = evaluate(obj)

    assert decision.allowed
    assert result(decision, "GPU003") is model.Result.PASS
    assert {"op": "add", "path": "/spec/template/spec/affinity", "value": OFF_GPU_NODES} in decision.patch
    assert_second_pass_is_empty(evaluate, patched, obj, decision)


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
def test_malformed_or_other_volumes_are_ignored(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, volume: object
) -> None:
    decision = evaluate(pod(container(gpu=GPU), volumes=[volume]))

    assert result(decision, "GPU003") is model.Result.PASS


# --- settings: trustZone.allow, and hostPaths of earlier versions ----------------------------------


def test_an_extra_protected_root_only_names_the_root_in_the_message(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    config = {"hostPaths": {"protect": ["/srv/kubelet"]}}

    inside = evaluate(with_host_path(pod, container, "/srv/kubelet/pods"), config=config)
    beside = evaluate(with_host_path(pod, container, "/srv/www"), config=config)

    assert "which is not an allowed host path (lies in /srv/kubelet: protected by the settings (hostPaths.protect))" in (
        inside.denial_message
    )
    assert "mounts hostPath /srv/www, which is not an allowed host path;" in beside.denial_message


@pytest.mark.parametrize("written", ["/run/xtables.lock", "/var/run/xtables.lock", "//run/./xtables.lock/"])
def test_an_allowed_path_passes_in_any_spelling(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, written: str
) -> None:
    config = {"hostPaths": {"allow": ["/var/run/xtables.lock"]}}

    decision = evaluate(with_host_path(pod, container, written), config=config)

    assert result(decision, "GPU003") is model.Result.PASS


@pytest.mark.parametrize(
    "path", ["/run", "/run/flannel/../containerd", "/run/flannel/../../etc/kubernetes", "/run/flannelx", "/run/cni"]
)
def test_an_allowed_path_uncovers_nothing_beside_or_above_it(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, path: str
) -> None:
    config = {"trustZone": {"allow": {"hostPaths": ["/run/flannel"]}}}

    decision = evaluate(with_host_path(pod, container, path), config=config)

    assert not decision.allowed
    assert evaluate(with_host_path(pod, container, "/run/flannel/subnet.env"), config=config).allowed


def test_dev_shm_is_refused_in_a_gpu_pod_until_an_admin_allows_it(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    config = {"trustZone": {"allow": {"hostPaths": ["/dev/shm"]}}}

    assert not evaluate(with_host_path(pod, container, "/dev/shm")).allowed
    assert evaluate(with_host_path(pod, container, "/dev/shm"), config=config).allowed


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
        (
            {"allow": ["/"]},
            "hostPaths.allow[0]: '/' contains the protected root /dev; allow a path below it, "
            "or give the namespaces that need all of it an exception",
        ),
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
    assert settings.from_mapping({"hostPaths": {}}).zone_allowance == settings.Settings().zone_allowance


def test_the_allowlist_holds_whatever_hostpaths_protect_says(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    config = {"hostPaths": {"protect": ["/"], "allow": ["/var/log"]}}

    assert evaluate(with_host_path(pod, container, "/var/log"), config=config).allowed
    assert not evaluate(with_host_path(pod, container, "/var/log/pods"), config=config).allowed  # writable: the path only
    assert not evaluate(with_host_path(pod, container, "/data"), config=config).allowed
