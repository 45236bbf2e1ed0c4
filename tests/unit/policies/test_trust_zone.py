"""GPU nodes are a trust zone (issue 25): attacked from a tenant's side, and the ordinary workloads beside.

Every route class gets the same three checks: refused in a pod that asks for a GPU (and in one that
only targets, tolerates its way onto or runs on a GPU node), admitted with GPU103's affinity in a
pod that asks for none. Real manifests written by others (tests/data/manifests/trustzone, each
naming its source) must pass where they belong: CI runners and exporters on CPU nodes, GPU jobs
with what GPU jobs really use.
"""

from __future__ import annotations

import copy
import dataclasses
import pathlib
from typing import Any

import pytest
import yaml

from policies import engine, model, podspec, settings, trustzone
from tests.unit.policies.conftest import apply_patch, messages, run_engine

FIXTURES = pathlib.Path(__file__).parents[2] / "data" / "manifests" / "trustzone"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
DOES_NOT_EXIST = {"key": "aliyun.accelerator/nvidia_name", "operator": "DoesNotExist"}
GPU_LIMIT = {"nvidia.com/gpu": 1}


def fixture(name: str, kind: str | None = None) -> dict[str, Any]:
    documents = [d for d in yaml.safe_load_all((FIXTURES / name).read_text()) if d]
    found: dict[str, Any] = next(d for d in documents if kind is None or d["kind"] == kind)
    return found


def spec_of(obj: dict[str, Any]) -> dict[str, Any]:
    found = podspec.template(obj)
    assert found is not None and isinstance(found.spec, dict)
    return found.spec


def asking_for_a_gpu(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` with its first container asking for one whole card."""
    changed = copy.deepcopy(obj)
    first = spec_of(changed)["containers"][0]
    first.setdefault("resources", {}).setdefault("limits", {}).update(GPU_LIMIT)
    return changed


def pod(*containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": list(containers), **spec}}


def main(**fields: Any) -> dict[str, Any]:
    return {"name": "main", "image": "registry.example/app:1", **fields}


def gpu_main(**fields: Any) -> dict[str, Any]:
    return main(resources={"limits": dict(GPU_LIMIT)}, **fields)


def refused_by(decision: model.Decision) -> list[str]:
    return sorted({v.policy for v in decision.violations if v.action is model.Action.ENFORCE})


def affinity_added(decision: model.Decision) -> bool:
    return any(op["path"].endswith("/affinity") or op.get("value") == DOES_NOT_EXIST for op in decision.patch)


def assert_kept_off_gpu_nodes(obj: dict[str, Any], *, config: dict[str, Any] | None = None, namespace: str = "team-a") -> None:
    """Admitted with GPU103's affinity and a warning saying why; a second pass changes nothing."""
    decision = run_engine(obj, config=config, namespace=namespace)
    assert decision.allowed, decision.denial_message
    assert affinity_added(decision)
    assert any(
        w.startswith("GPU103: pods that use no GPU but have node power are kept off GPU nodes: kept off GPU nodes")
        for w in decision.notices
    )
    assert not decision.warnings  # the validating webhook's warnings: nothing to warn about
    patched = apply_patch(obj, decision.patch)
    assert trustzone.stays_off_gpu_nodes(spec_of(patched))
    again = run_engine(patched, config=config, namespace=namespace)
    assert again.allowed and again.patch == ()


# --- real manifests of others ----------------------------------------------------------------------

CPU_WORKLOADS = [
    ("dind-ci-runner.yaml", ["GPU002", "GPU003"]),  # privileged DinD, /lib/modules read-only
    ("jenkins-agent-docker-socket.yaml", ["GPU002", "GPU003"]),  # privileged, the Docker socket
    ("exporter-container-sockets.yaml", ["GPU003"]),  # cAdvisor: /, /var/run, /sys, /var/lib/docker
    ("node-exporter.yaml", ["GPU002", "GPU003"]),  # hostPID, hostNetwork, SYS_TIME, / and /sys
    ("pss-dev-null.yaml", ["GPU003"]),  # Pod Security's own fixture: /dev/null
    ("cuda-libs-docs-example-v1.9.yaml", ["GPU003"]),  # the old docs' /usr/lib/nvidia-375 mount
]


@pytest.mark.parametrize(("name", "policies"), CPU_WORKLOADS)
def test_ci_runners_and_exporters_that_ask_for_no_gpu_are_admitted_and_kept_off_gpu_nodes(name: str, policies: list[str]) -> None:
    assert_kept_off_gpu_nodes(fixture(name))


@pytest.mark.parametrize(("name", "policies"), CPU_WORKLOADS)
def test_the_same_manifests_are_refused_when_they_ask_for_a_gpu(name: str, policies: list[str]) -> None:
    decision = run_engine(asking_for_a_gpu(fixture(name)))

    assert not decision.allowed
    assert refused_by(decision) == policies
    assert all("the pod requests the GPU resource nvidia.com/gpu" in m for p in policies for m in messages(decision, p))


GPU_WORKLOADS = [
    "lxcfs-gpu-pod.yaml",  # lxcfs's eight read-only /var/lib/lxcfs mounts, a GPU toleration
    "vllm-deployment.yaml",
    "triton-deployment.yaml",
    "kubeflow-pytorchjob.yaml",
    "kueue-job.yaml",
    "rdma-ipc-lock.yaml",  # IPC_LOCK beside nvidia.com/gpu and an RDMA device
    "mig-slice-pod.yaml",
]


@pytest.mark.parametrize("name", GPU_WORKLOADS)
def test_real_gpu_workloads_pass(name: str) -> None:
    obj = fixture(name)
    if obj["kind"] not in podspec.SUPPORTED_KINDS:  # a Kubeflow PyTorchJob: each replica's template
        templates = [r["template"] for r in obj["spec"]["pytorchReplicaSpecs"].values()]
        objects = [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "r"}, "spec": t["spec"]} for t in templates]
    else:
        objects = [obj]
    for item in objects:
        decision = run_engine(item)
        assert decision.allowed, decision.denial_message
        assert not affinity_added(decision)


def test_a_dra_claim_pod_passes_and_counts_as_reaching_gpu_nodes() -> None:
    claim_pod = fixture("dra-gpu-claim-pod.yaml", "Pod")
    assert run_engine(claim_pod).allowed
    spec = spec_of(claim_pod)
    assert trustzone.reach(spec).intent
    privileged = copy.deepcopy(claim_pod)
    spec_of(privileged)["containers"][0]["securityContext"] = {"privileged": True}
    assert refused_by(run_engine(privileged)) == ["GPU002"]


def test_dcgm_exporter_on_gpu_nodes_needs_an_exception_and_gets_it() -> None:
    exporter = fixture("dcgm-exporter.yaml")
    targeted = copy.deepcopy(exporter)
    spec_of(targeted)["nodeSelector"] = {"nvidia.com/gpu.present": "true"}
    decision = run_engine(targeted)
    assert refused_by(decision) == ["GPU002", "GPU003"]  # SYS_ADMIN and the pod-resources socket
    config = {"exceptions": [{"name": "dcgm", "policies": ["GPU002", "GPU003"], "match": {"namespaces": ["gpu-operator"]}}]}
    assert run_engine(targeted, config=config, namespace="gpu-operator").allowed
    assert not run_engine(targeted, config=config, namespace="team-a").allowed


# --- host paths: the allowlist, from the tenant's side ---------------------------------------------

ROOT_ON_THE_NODE = [
    "/usr/libexec/kubernetes/kubelet-plugins/volume/exec",  # FlexVolume: the kubelet runs a new driver's init as root
    "/etc/ld.so.preload",
    "/etc/cron.d",
    "/var/spool/cron/crontabs",
    "/etc/udev/rules.d",
    "/etc/modprobe.d",
    "/etc/systemd/system/kubelet.service.d",
    "/etc/kubernetes/manifests",
    "/etc/origin/node/pods",  # another distribution's static pods
    "/opt/nri/plugins",  # NRI's pre-installed plugins
    "/var/lib/container/kubelet",  # ACK data-disk nodes: the kubelet's state under another name
    "/var/lib/container/kubelet/pods",
    "/run/containerd/containerd.sock",
    "/var/run/docker.sock",
    "/dev/nvidia0",
    "/proc/1/root",
    "/",
    "/etc/localtime/../shadow",  # an allowed path's parent, reached through it
    "//usr/share/zoneinfo/../../../etc",
    "/var/lib/lxcfs/../kubelet",
    "/tmp",
    "/home/tenant/.ssh",
]


def host_path_pod(path: str, *, gpu: bool = True, read_only: bool = True, **spec: Any) -> dict[str, Any]:
    mounts = [{"name": "host", "mountPath": "/host", "readOnly": read_only}]
    container = gpu_main(volumeMounts=mounts) if gpu else main(volumeMounts=mounts)
    return pod(container, volumes=[{"name": "host", "hostPath": {"path": path}}], **spec)


@pytest.mark.parametrize("path", ROOT_ON_THE_NODE)
def test_a_host_path_outside_the_allowlist_is_refused_in_a_gpu_pod_however_spelled(path: str) -> None:
    decision = run_engine(host_path_pod(path))

    assert refused_by(decision) == ["GPU003"]
    [message] = messages(decision, "GPU003")
    assert "which is not an allowed host path" in message
    assert message.endswith(
        "; the pod requests the GPU resource nvidia.com/gpu; use an emptyDir, a PersistentVolumeClaim or a ConfigMap, "
        "mount an allowed path read-only, run the part that needs the node in a pod that asks for no GPU (it is kept "
        "off GPU nodes), or ask an admin to allow the path for the namespace (trustZone)"
    )


@pytest.mark.parametrize("path", ROOT_ON_THE_NODE)
def test_the_same_host_path_in_a_pod_without_gpus_is_admitted_and_kept_off_gpu_nodes(path: str) -> None:
    assert_kept_off_gpu_nodes(host_path_pod(path, gpu=False))


@pytest.mark.parametrize(
    "spec",
    [
        {"nodeSelector": {"aliyun.accelerator/nvidia_name": "Tesla-T4"}},
        {"nodeSelector": {"nvidia.com/gpu.present": "true"}},
        {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
        {
            "affinity": {
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 1,
                            "preference": {"matchExpressions": [{"key": "ack.node.gpu.schedule", "operator": "Exists"}]},
                        }
                    ]
                }
            }
        },
        {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu"}]},
    ],
    ids=["selects-a-gpu-label", "selects-gpu-present", "tolerates-the-gpu-taint", "prefers-a-gpu-mode", "claims-dra-devices"],
)
def test_a_pod_that_asks_for_gpu_nodes_without_a_gpu_resource_is_judged_by_the_zone(spec: dict[str, Any]) -> None:
    decision = run_engine(host_path_pod("/var/run/docker.sock", gpu=False, **spec))

    assert refused_by(decision) == ["GPU003"]
    assert not affinity_added(decision)


def test_a_wildcard_toleration_is_no_intent_and_gets_the_affinity() -> None:
    assert_kept_off_gpu_nodes(host_path_pod("/proc", gpu=False, tolerations=[{"operator": "Exists"}]))


@pytest.mark.parametrize(
    "path",
    [
        "/var/lib/lxcfs/proc/../proc/meminfo",
        "/var/lib/lxcfs/cgroup",
        "/etc/localtime",
        "//etc/./localtime",
        "/usr/share/zoneinfo/UTC",
    ],
)
def test_the_built_in_allowed_paths_pass_read_only_and_are_refused_writable(path: str) -> None:
    assert run_engine(host_path_pod(path)).allowed
    decision = run_engine(host_path_pod(path, read_only=False))
    assert refused_by(decision) == ["GPU003"]
    assert "without readOnly: true; the allowed host paths are read-only" in messages(decision, "GPU003")[0]


def test_a_writable_mount_by_another_container_of_an_allowed_path_is_refused() -> None:
    obj = host_path_pod("/etc/localtime")
    obj["spec"]["initContainers"] = [main(name="init", volumeMounts=[{"name": "host", "mountPath": "/x"}])]

    assert refused_by(run_engine(obj)) == ["GPU003"]


def test_an_admin_allows_a_path_per_namespace_read_only_or_writable() -> None:
    config = {
        "trustZone": {
            "allow": {"hostPaths": ["/opt/models"]},
            "namespaces": [
                {"name": "scratch", "namespaces": ["research"], "allow": {"hostPaths": [{"path": "/scratch", "readOnly": False}]}}
            ],
        }
    }
    assert run_engine(host_path_pod("/opt/models/llama"), config=config).allowed
    assert not run_engine(host_path_pod("/opt/models/llama", read_only=False), config=config).allowed
    assert run_engine(host_path_pod("/scratch", read_only=False), config=config, namespace="research").allowed
    assert not run_engine(host_path_pod("/scratch", read_only=False), config=config, namespace="team-a").allowed


def test_a_writable_allowed_path_allows_no_path_below_it_where_a_link_could_have_been_planted() -> None:
    # Pod A may write /scratch and plants /scratch/x -> /; pod B mounting hostPath /scratch/x would
    # get the node's root. Below a writable entry only subPath reaches (the kubelet checks its links).
    config = {
        "trustZone": {"allow": {"hostPaths": [{"path": "/scratch", "readOnly": False}]}},
        "hostPaths": {"allow": ["/var/log"]},
    }
    for planted in ("/scratch/x", "/scratch/x/etc", "/var/log/planted-link"):
        decision = run_engine(host_path_pod(planted), config=config)
        assert refused_by(decision) == ["GPU003"], planted
    subpath = host_path_pod("/scratch", read_only=False)
    subpath["spec"]["containers"][0]["volumeMounts"][0]["subPath"] = "x"
    assert run_engine(subpath, config=config).allowed
    assert not run_engine(host_path_pod("/opt/modelsx"), config=config).allowed


def test_the_earlier_host_path_allow_setting_still_allows_writable_paths() -> None:
    config = {"hostPaths": {"allow": ["/run/xtables.lock"]}}
    assert run_engine(host_path_pod("/var/run/xtables.lock", read_only=False), config=config).allowed
    assert not run_engine(host_path_pod("/run/xtables.lock.d"), config=config).allowed


# --- capabilities and other privileges ------------------------------------------------------------

ESCAPING_CAPABILITIES = [
    ["SYS_ADMIN"],
    ["ALL"],
    ["sys_module"],
    ["CAP_DAC_READ_SEARCH"],
    [" sys_rawio "],
    ["BPF"],
    ["PERFMON"],
    ["SYS_BOOT"],
    ["SYSLOG"],
    ["SYS_TIME"],
    ["MAC_ADMIN"],
    ["LINUX_IMMUTABLE"],
    ["WAKE_ALARM"],
    ["NET_ADMIN"],
    ["net_raw"],
    ["CHECKPOINT_RESTORE"],
    ["A_CAPABILITY_ADDED_NEXT_YEAR"],
    ["CHOWN", "SYS_MODULE"],
]


@pytest.mark.parametrize("added", ESCAPING_CAPABILITIES)
def test_a_capability_outside_the_allowlist_is_refused_in_a_gpu_pod_whatever_its_spelling(added: list[str]) -> None:
    obj = pod(gpu_main(securityContext={"capabilities": {"add": added}}))
    decision = run_engine(obj)

    assert refused_by(decision) == ["GPU002"]
    assert 'container "main" adds capability' in messages(decision, "GPU002")[0]
    assert_kept_off_gpu_nodes(pod(main(securityContext={"capabilities": {"add": added}})))


@pytest.mark.parametrize(
    "added",
    [["IPC_LOCK"], ["SYS_NICE", "sys_resource"], ["CAP_SYS_PTRACE"], ["NET_BIND_SERVICE", "CHOWN", "SETUID", "MKNOD"], []],
)
def test_baseline_and_gpu_workload_capabilities_pass_in_a_gpu_pod(added: list[str]) -> None:
    decision = run_engine(pod(gpu_main(securityContext={"capabilities": {"add": added}})))

    assert decision.allowed, decision.denial_message


@pytest.mark.parametrize(
    ("capability", "namespace", "why"),
    [
        ("SYS_PTRACE", "hostPID", "SYS_PTRACE with hostPID reaches every process of the node"),
        ("NET_ADMIN", "hostNetwork", "NET_ADMIN with hostNetwork reaches the node's network stack"),
        ("net_raw", "hostNetwork", "NET_RAW with hostNetwork reaches the node's network stack"),
    ],
)
def test_a_capability_that_needs_the_pods_own_namespace_is_refused_beside_the_hosts_even_where_that_is_allowed(
    capability: str, namespace: str, why: str
) -> None:
    allow: dict[str, Any] = {namespace: True, "capabilities": ["NET_ADMIN", "NET_RAW"]}  # NET_*: an admin's addition
    config = {"trustZone": {"namespaces": [{"name": "mps", "namespaces": ["mps"], "allow": allow}]}}
    shared = pod(gpu_main(securityContext={"capabilities": {"add": [capability]}}), **{namespace: True})
    assert run_engine(
        pod(gpu_main(securityContext={"capabilities": {"add": [capability]}})), config=config, namespace="mps"
    ).allowed

    assert run_engine(pod(gpu_main(), **{namespace: True}), config=config, namespace="mps").allowed
    decision = run_engine(shared, config=config, namespace="mps")
    assert refused_by(decision) == ["GPU002"]
    assert why in messages(decision, "GPU002")[0]


@pytest.mark.parametrize(
    ("spec", "container"),
    [
        ({"hostPID": True}, {}),
        ({"hostIPC": True}, {}),
        ({"hostNetwork": True}, {}),
        ({}, {"securityContext": {"privileged": True}}),
        ({}, {"securityContext": {"procMount": "Unmasked"}}),
        ({}, {"securityContext": {"seLinuxOptions": {"type": "spc_t"}}}),
        ({"securityContext": {"seLinuxOptions": {"user": "system_u"}}}, {}),
        ({}, {"securityContext": {"windowsOptions": {"hostProcess": True}}}),
    ],
    ids=["hostPID", "hostIPC", "hostNetwork", "privileged", "procMount", "selinux-type", "selinux-user", "hostProcess"],
)
def test_host_namespaces_and_node_security_options_are_refused_in_a_gpu_pod(
    spec: dict[str, Any], container: dict[str, Any]
) -> None:
    assert refused_by(run_engine(pod(gpu_main(**container), **spec))) == ["GPU002"]
    assert_kept_off_gpu_nodes(pod(main(**container), **spec))


def test_a_namespace_allowance_opens_host_ipc_and_network_for_mps_and_nccl_jobs_there_only() -> None:
    config = {
        "trustZone": {
            "namespaces": [
                {
                    "name": "nccl",
                    "namespaceSelector": {"matchLabels": {"team": "hpc"}},
                    "allow": {"hostIPC": True, "hostNetwork": True},
                }
            ]
        }
    }
    job = pod(gpu_main(), hostIPC=True, hostNetwork=True)

    allowed = engine.evaluate(
        model.Request(operation="CREATE", object=job, namespace="hpc", namespace_labels={"team": "hpc"}),
        settings=settings.from_mapping(config),
    )
    assert allowed.allowed
    assert not run_engine(job, config=config, namespace="team-a").allowed


@pytest.mark.parametrize(
    "allow",
    [
        {"capabilities": ["SYS_ADMIN"]},
        {"capabilities": ["cap_all"]},
        {"volumeTypes": ["hostPath"]},
        {"hostPaths": ["/"]},
        {"hostPaths": ["relative"]},
        {"hostNetwork": "yes"},
    ],
)
def test_allowances_that_would_reopen_the_node_are_refused_with_one_line(allow: dict[str, Any]) -> None:
    with pytest.raises(settings.InvalidSettings) as raised:
        settings.from_mapping({"trustZone": {"allow": allow}})
    assert "\n" not in str(raised.value) and str(raised.value).startswith("trustZone.allow.")


def test_a_namespace_allowance_must_be_anchored_to_namespaces() -> None:
    for entry in (
        {"name": "x", "allow": {"hostIPC": True}},
        {"name": "x", "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]}},
    ):
        with pytest.raises(settings.InvalidSettings, match="is not anchored to namespaces"):
            settings.from_mapping({"trustZone": {"namespaces": [entry]}})


# --- volume types ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "volume",
    [
        {"gitRepo": {"repository": "https://example.com/x.git"}},
        {"flexVolume": {"driver": "example.com/driver"}},
        {"iscsi": {"targetPortal": "10.0.0.1:3260", "iqn": "iqn.x", "lun": 0}},
        {"rbd": {"monitors": ["10.0.0.1"], "image": "x"}},
        {"cephfs": {"monitors": ["10.0.0.1"]}},
        {"glusterfs": {"endpoints": "x", "path": "y"}},
    ],
    ids=["gitRepo", "flexVolume", "iscsi", "rbd", "cephfs", "glusterfs"],
)
def test_volume_types_with_host_side_effects_are_refused_in_a_gpu_pod(volume: dict[str, Any]) -> None:
    obj = pod(gpu_main(), volumes=[{"name": "v", **volume}])
    decision = run_engine(obj)
    assert refused_by(decision) == ["GPU003"]
    assert "a type GPU nodes do not allow" in messages(decision, "GPU003")[0]
    assert_kept_off_gpu_nodes(pod(main(), volumes=[{"name": "v", **volume}]))


def test_ordinary_volume_types_and_nfs_datasets_pass_in_a_gpu_pod() -> None:
    volumes = [
        {"name": "a", "emptyDir": {"medium": "Memory"}},
        {"name": "b", "persistentVolumeClaim": {"claimName": "data"}},
        {"name": "c", "configMap": {"name": "cfg"}},
        {"name": "d", "nfs": {"server": "nfs.example", "path": "/datasets"}},
        {"name": "e", "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}},
    ]
    assert run_engine(pod(gpu_main(), volumes=volumes)).allowed


# --- resources: an explicit list -------------------------------------------------------------------


@pytest.mark.parametrize("resource", ["nvidia.com/hostdev", "nvidia.com/rdma_shared_device_a", "rdma/rdma_shared_device_a"])
def test_a_nic_is_no_gpu_so_its_container_gets_void_even_when_the_image_says_all(resource: str) -> None:
    obj = pod(main(resources={"limits": {resource: 1}}))
    decision = run_engine(obj)

    assert decision.allowed
    assert {
        "op": "add",
        "path": "/spec/containers/0/env",
        "value": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}],
    } in decision.patch
    assert not trustzone.reach(spec_of(obj)).intent


@pytest.mark.parametrize("resource", ["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.5gb", "aliyun.com/gpu-mem"])
def test_gpu_resources_by_the_explicit_list_get_no_void(resource: str) -> None:
    decision = run_engine(pod(main(resources={"limits": {resource: 1}})))
    assert not any(op["path"].endswith("/env") for op in decision.patch)


def test_a_renamed_device_plugin_is_named_in_the_settings() -> None:
    config = {"trustZone": {"gpuResources": ["example.com/vgpu-*"]}}
    obj = pod(main(resources={"limits": {"example.com/vgpu-a10": 1}}, securityContext={"capabilities": {"add": ["SYS_MODULE"]}}))

    with_config = run_engine(obj, config=config)
    assert refused_by(with_config) == ["GPU002"]
    assert "the pod requests the GPU resource example.com/vgpu-a10" in messages(with_config, "GPU002")[0]
    assert_kept_off_gpu_nodes(obj)  # without it, it is no GPU: kept off GPU nodes instead


# --- the switches ---------------------------------------------------------------------------------


def test_strict_mode_judges_every_pod_by_the_zone() -> None:
    config = {"trustZone": {"strict": True}}
    decision = run_engine(fixture("jenkins-agent-docker-socket.yaml"), config=config)

    assert refused_by(decision) == ["GPU002", "GPU003"]
    assert "strict mode (trustZone.strict)" in messages(decision, "GPU003")[0]
    assert run_engine(pod(main()), config=config).allowed


@pytest.mark.parametrize("action", ["off", "warn", "audit"])
def test_without_gpu103_enforcing_a_pod_with_node_power_could_reach_a_gpu_node_and_is_refused(action: str) -> None:
    config = {"policies": {"GPU103": {"action": action}}}
    decision = run_engine(host_path_pod("/var/run/docker.sock", gpu=False), config=config)

    assert refused_by(decision) == ["GPU003"]
    assert "nothing keeps the pod off GPU nodes" in messages(decision, "GPU003")[0]


def test_a_workload_template_without_gpus_is_admitted_and_its_pods_will_get_the_affinity() -> None:
    deployment: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "runner"},
        "spec": {"template": {"metadata": {}, "spec": host_path_pod("/var/run/docker.sock", gpu=False)["spec"]}},
    }
    decision = run_engine(deployment)
    assert decision.allowed
    assert any(op["path"] == "/spec/template/spec/affinity" for op in decision.patch)
    assert refused_by(run_engine(asking_for_a_gpu(deployment))) == ["GPU003"]


# --- later: ephemeral containers, annotations -----------------------------------------------------


def test_an_ephemeral_container_with_an_escaping_capability_is_refused_on_a_pod_on_a_gpu_node() -> None:
    old = pod(main(), nodeName="gpu-0")
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"] = [
        {"name": "dbg", "image": "busybox", "securityContext": {"capabilities": {"add": ["SYS_MODULE"]}}}
    ]
    request = model.Request(
        operation="UPDATE",
        object=new,
        old_object=old,
        subresource="ephemeralcontainers",
        node_labels={"aliyun.accelerator/nvidia_name": "Tesla-T4"},
    )
    decision = engine.evaluate(request, settings=settings.Settings())
    assert refused_by(decision) == ["GPU009"]
    on_cpu = engine.evaluate(
        dataclasses.replace(request, node_labels={"kubernetes.io/os": "linux"}), settings=settings.Settings()
    )
    assert on_cpu.allowed


@pytest.mark.parametrize(
    "key",
    [
        "scheduling.koordinator.sh/device-allocated",
        "hami.io/vgpu-devices-to-allocate",
        "volcano.sh/gpu-index",
        "gas-container-cards",
        "org.systemd.property.DeviceAllow",
        "io.katacontainers.config.hypervisor.cold_plug_vfio",
        "cdi.k8s.io/gpu",
    ],
)
def test_node_agents_device_annotations_are_refused_on_every_pod(key: str) -> None:
    obj = pod(main())
    obj["metadata"]["annotations"] = {key: "0"}
    assert refused_by(run_engine(obj)) == ["GPU010"]


def test_a_node_agents_ordinary_annotations_pass() -> None:
    obj = pod(main())
    obj["metadata"]["annotations"] = {
        "scheduling.koordinator.sh/gang-name": "g",
        "hami.io/gpu-scheduler-policy": "binpack",
        "volcano.sh/queue-name": "q",
    }
    assert run_engine(obj).allowed
