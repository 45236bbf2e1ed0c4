"""The trust zone in GPU clusters as they exist (issue 33): GPU nodes whoever labelled them, host
ports, and the mounts real platforms inject (ACK's lxcfs webhook, CA bundles)."""

from __future__ import annotations

import copy
import pathlib
from typing import Any

import pytest
import yaml

from policies import model, settings, trustzone
from tests.unit.policies.conftest import apply_patch, messages, run_engine

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
GPU_LIMIT = {"nvidia.com/gpu": 1}
KEEP_OFF = [dict(e) for e in trustzone.DEFAULT_ZONE.keep_off]
VOID = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]  # GPU104's addition to a container without GPUs
EXAMPLES = pathlib.Path(__file__).parents[3] / "examples" / "workloads"


def pod(*containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": list(containers), **spec}}


def main(gpu: bool = False, **fields: Any) -> dict[str, Any]:
    if gpu:
        fields["resources"] = {"limits": dict(GPU_LIMIT)}
    return {"name": "main", "image": "registry.example/app:1", **fields}


def refused_by(decision: model.Decision) -> list[str]:
    return sorted({v.policy for v in decision.violations if v.action is model.Action.ENFORCE})


# --- every GPU node label ---------------------------------------------------------------------------

# Labels as each stack writes them on a GPU node (and nothing else of a GPU).
LABELLED_BY = {
    "gpu-operator": {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.deploy.driver": "true"},
    "gpu-feature-discovery": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "8"},
    "nfd": {"feature.node.kubernetes.io/pci-10de.present": "true"},
    "nfd-class-vendor": {"feature.node.kubernetes.io/pci-0302_10de.present": "true"},
    "gke": {"cloud.google.com/gke-accelerator": "nvidia-l4"},
    "eks-karpenter": {"karpenter.k8s.aws/instance-gpu-count": "1"},
    "eks-auto-mode": {"eks.amazonaws.com/instance-gpu-count": "4"},
    "aks": {"kubernetes.azure.com/accelerator": "nvidia"},
    "ack": {"aliyun.accelerator/nvidia_name": "Tesla-T4"},
}


def matches(labels: dict[str, str], term: list[dict[str, Any]]) -> bool:
    """Kubernetes' nodeSelectorRequirement semantics for the operators the keep-off affinity uses."""
    for e in term:
        value = labels.get(e["key"])
        if e["operator"] == "DoesNotExist" and value is not None:
            return False
        if e["operator"] == "NotIn" and value is not None and value in e["values"]:
            return False
    return True


@pytest.mark.parametrize("stack", sorted(LABELLED_BY))
def test_the_keep_off_affinity_fails_a_gpu_node_whoever_labelled_it(stack: str) -> None:
    labels = LABELLED_BY[stack]
    assert not matches(labels, KEEP_OFF)
    assert trustzone.DEFAULT_ZONE.gpu_node_label(labels) is not None
    # A pod bound to such a node reaches it, whatever its own affinity says.
    reach = trustzone.reach(
        {"nodeName": "n", "affinity": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": KEEP_OFF}]}}}},
        node_labels=labels,
    )
    assert reach and reach.intent


@pytest.mark.parametrize(
    "labels",
    [
        {"kubernetes.io/hostname": "cpu-0"},
        {"nvidia.com/gpu.present": "false"},  # the GPU Operator's mark of a node whose GPUs are gone
        {"feature.node.kubernetes.io/pci-10de.present": "false"},
    ],
)
def test_the_keep_off_affinity_lets_cpu_nodes_through(labels: dict[str, str]) -> None:
    assert matches(labels, KEEP_OFF)
    assert trustzone.DEFAULT_ZONE.gpu_node_label(labels) is None


def test_a_privileged_cpu_pod_gets_every_label_in_every_term_and_a_second_pass_adds_nothing() -> None:
    terms = [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
    ]
    obj = pod(main(securityContext={"privileged": True}), affinity={"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": terms}}})

    decision = run_engine(obj)

    path = f"/spec/affinity/nodeAffinity/{REQUIRED}/nodeSelectorTerms"
    assert decision.allowed
    assert decision.patch == (
        *({"op": "add", "path": f"{path}/{index}/matchExpressions/-", "value": e} for index in (0, 1) for e in KEEP_OFF),
        {"op": "add", "path": "/spec/containers/0/env", "value": VOID},
    )
    patched = apply_patch(obj, decision.patch)
    assert trustzone.stays_off_gpu_nodes(patched["spec"])
    assert run_engine(patched).patch == ()


def test_only_our_label_in_the_affinity_no_longer_keeps_a_privileged_pod_off_gpu_nodes() -> None:
    ours = {
        "nodeAffinity": {
            REQUIRED: {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "aliyun.accelerator/nvidia_name", "operator": "DoesNotExist"}]}
                ]
            }
        }
    }
    obj = pod(main(securityContext={"privileged": True}), affinity=ours)

    assert not trustzone.stays_off_gpu_nodes(obj["spec"])
    refused = run_engine(obj, config={"policies": {"GPU103": {"action": "warn"}}})
    assert refused_by(refused) == ["GPU002"]
    assert run_engine(obj).allowed  # GPU103 enforcing adds the rest


def test_a_pod_selecting_a_cloud_gpu_label_asks_for_gpu_nodes_and_is_refused_its_privilege() -> None:
    obj = pod(main(securityContext={"privileged": True}), nodeSelector={"cloud.google.com/gke-accelerator": "nvidia-l4"})

    assert refused_by(run_engine(obj)) == ["GPU002"]


def test_configured_gpu_node_labels_join_the_affinity_and_the_reach() -> None:
    config = {"trustZone": {"gpuNodeLabels": ["example.com/gpu-pool", {"key": "node-role", "values": ["gpu", "gpu-large"]}]}}
    parsed = settings.from_mapping(config)
    zone = parsed.trust_zone

    assert zone.gpu_node_label({"node-role": "gpu"}) is not None and zone.gpu_node_label({"node-role": "cpu"}) is None
    decision = run_engine(pod(main(securityContext={"privileged": True})), config=config)
    operation = decision.patch[0]
    expressions = operation["value"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"][0]["matchExpressions"]
    assert expressions[-2:] == [
        {"key": "example.com/gpu-pool", "operator": "DoesNotExist"},
        {"key": "node-role", "operator": "NotIn", "values": ["gpu", "gpu-large"]},
    ]
    assert refused_by(
        run_engine(pod(main(securityContext={"privileged": True}), nodeSelector={"node-role": "gpu"}), config=config)
    ) == ["GPU002"]


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"gpuNodeLabels": ["bad key!"]}, "trustZone.gpuNodeLabels[0].key:"),
        ({"gpuNodeLabels": ["Example.COM/gpu"]}, "trustZone.gpuNodeLabels[0].key:"),
        ({"gpuNodeLabels": [{"key": "pool", "values": ["not ok"]}]}, "trustZone.gpuNodeLabels[0].values[0]:"),
        ({"gpuNodeLabels": [{"key": "pool", "value": "x"}]}, "trustZone.gpuNodeLabels[0]"),
        ({"hostPorts": ["9000-8000"]}, "trustZone.hostPorts[0]:"),
        ({"hostPorts": [70000]}, "trustZone.hostPorts[0]:"),
        ({"hostPorts": "8888"}, "trustZone.hostPorts:"),
        ({"allow": {"hostPorts": ["x-y"]}}, "trustZone.allow.hostPorts[0]:"),
    ],
)
def test_bad_settings_are_refused_with_one_line_naming_the_key(config: dict[str, Any], field: str) -> None:
    with pytest.raises(settings.InvalidSettings) as raised:
        settings.from_mapping({"trustZone": config})
    message = str(raised.value)
    assert message.startswith(field) and "\n" not in message


# --- host ports ----------------------------------------------------------------------------------


def with_port(host_port: int, *, gpu: bool) -> dict[str, Any]:
    return pod(main(gpu, ports=[{"containerPort": 8080, "hostPort": host_port}]))


@pytest.mark.parametrize("port", [10250, 10255, 10248, 10249, 10256, 2379, 2380, 6443, 9100, 9400, 8443, 22, 30080, 40000])
def test_a_gpu_pod_with_a_node_daemons_or_unlisted_host_port_is_refused(port: int) -> None:
    decision = run_engine(with_port(port, gpu=True))

    assert refused_by(decision) == ["GPU002"]
    [message] = messages(decision, "GPU002")
    assert f"asks for hostPort {port} (" in message


def test_the_kubelet_port_is_named_in_the_refusal() -> None:
    [message] = messages(run_engine(with_port(10250, gpu=True)), "GPU002")
    assert "the node's port of the kubelet's API" in message


@pytest.mark.parametrize("port", [8888, 8080, 1024, 29999, 6006])
def test_a_gpu_pod_with_an_allowed_host_port_is_admitted(port: int) -> None:
    assert run_engine(with_port(port, gpu=True)).allowed


def test_the_seed_notebook_with_host_port_8888_is_admitted() -> None:
    notebook = yaml.safe_load((EXAMPLES / "tf-notebook.yaml").read_text())
    ports = [p for c in notebook["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])]
    assert {"containerPort": 8888, "hostPort": 8888} in ports

    decision = run_engine(notebook)

    assert decision.allowed, decision.denial_message


def test_a_cpu_deployment_with_the_kubelet_port_is_kept_off_gpu_nodes() -> None:
    template = {
        "metadata": {"labels": {"app": "w"}},
        "spec": {"containers": [main(ports=[{"containerPort": 80, "hostPort": 10250}])]},
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "w"},
        "spec": {"selector": {"matchLabels": {"app": "w"}}, "template": template},
    }

    decision = run_engine(deployment)

    assert decision.allowed
    assert decision.patch == (
        {
            "op": "add",
            "path": "/spec/template/spec/affinity",
            "value": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": KEEP_OFF}]}}},
        },
        {"op": "add", "path": "/spec/template/spec/containers/0/env", "value": VOID},
    )
    assert any("hostPort 10250" in notice for notice in decision.notices)
    assert run_engine(apply_patch(deployment, decision.patch)).patch == ()


def test_configured_host_ports_replace_the_built_in_ranges_and_namespaces_add_to_them() -> None:
    config = {
        "trustZone": {
            "hostPorts": ["8000-8999"],
            "namespaces": [{"name": "mon", "namespaces": ["monitoring"], "allow": {"hostPorts": [9100]}}],
        }
    }

    assert run_engine(with_port(8888, gpu=True), config=config).allowed
    assert refused_by(run_engine(with_port(6006, gpu=True), config=config)) == ["GPU002"]
    assert refused_by(run_engine(with_port(9100, gpu=True), config=config)) == ["GPU002"]
    assert run_engine(with_port(9100, gpu=True), config=config, namespace="monitoring").allowed


def test_the_built_in_ranges_leave_out_every_reserved_port() -> None:
    allowance = trustzone.DEFAULT_ALLOWANCE
    assert all(not allowance.host_port(port) for port in trustzone.RESERVED_HOST_PORTS)
    assert allowance.host_port(2378) and allowance.host_port(2381) and not allowance.host_port(1023)


# --- lxcfs and CA bundles ----------------------------------------------------------------------------

# ACK's lxcfs admission webhook, lxcfs.go at commit 2155668 (the seven /proc files, no readOnly) and
# at f6a24c6 (readOnly: true, swaps and loadavg commented out, /sys/devices/system/cpu/online added).
LXCFS_EARLY = [f"/proc/{name}" for name in ("cpuinfo", "meminfo", "diskstats", "stat", "swaps", "uptime", "loadavg")]
LXCFS_LATER = [
    *(f"/proc/{name}" for name in ("cpuinfo", "meminfo", "diskstats", "stat", "uptime")),
    "/sys/devices/system/cpu/online",
]


def lxcfs_injected(obj: dict[str, Any], targets: list[str], *, read_only: bool) -> dict[str, Any]:
    """`obj` with the volumes and mounts the lxcfs webhook's patch adds (names as it writes them)."""
    changed = copy.deepcopy(obj)
    spec = changed["spec"]
    for target in targets:
        name = "lxcfs-" + target.strip("/").replace("/", "-")
        spec.setdefault("volumes", []).append({"name": name, "hostPath": {"path": f"/var/lib/lxcfs{target}"}})
        for container in spec["containers"]:
            mount: dict[str, Any] = {"name": name, "mountPath": target}
            if read_only:
                mount["readOnly"] = True
            container.setdefault("volumeMounts", []).append(mount)
    return changed


@pytest.mark.parametrize(("targets", "read_only"), [(LXCFS_EARLY, False), (LXCFS_LATER, True)])
def test_the_lxcfs_webhooks_injections_are_admitted_on_a_gpu_pod(targets: list[str], read_only: bool) -> None:
    decision = run_engine(lxcfs_injected(pod(main(True)), targets, read_only=read_only))

    assert decision.allowed, decision.denial_message
    assert all(path in trustzone.LXCFS_FILES for path in (f"/var/lib/lxcfs{t}" for t in targets))


@pytest.mark.parametrize(
    "volume_path",
    [
        "/var/lib/lxcfs/proc/../cgroup",
        "/var/lib/lxcfs/cgroup",
        "/var/lib/lxcfs/proc",
        "/var/lib/lxcfs",
        "/var/lib/lxcfs//proc/meminfo",
    ],
)
def test_a_writable_mount_elsewhere_under_the_lxcfs_root_is_refused(volume_path: str) -> None:
    obj = pod(
        main(True, volumeMounts=[{"name": "x", "mountPath": "/x"}]), volumes=[{"name": "x", "hostPath": {"path": volume_path}}]
    )

    assert refused_by(run_engine(obj)) == ["GPU003"]
    read_only = copy.deepcopy(obj)
    read_only["spec"]["containers"][0]["volumeMounts"][0]["readOnly"] = True
    assert run_engine(read_only).allowed


def test_a_writable_sub_path_into_an_lxcfs_file_volume_is_refused() -> None:
    mounts = [{"name": "m", "mountPath": "/proc/meminfo", "subPath": "../cgroup"}]
    obj = pod(main(True, volumeMounts=mounts), volumes=[{"name": "m", "hostPath": {"path": "/var/lib/lxcfs/proc/meminfo"}}])

    assert refused_by(run_engine(obj)) == ["GPU003"]


@pytest.mark.parametrize("path", ["/etc/ssl/certs", "/etc/pki/ca-trust/extracted", "/etc/pki/ca-trust/extracted/pem"])
def test_a_read_only_ca_bundle_is_admitted_on_a_gpu_pod_and_a_writable_one_refused(path: str) -> None:
    def with_bundle(read_only: bool) -> dict[str, Any]:
        mounts = [{"name": "ca", "mountPath": "/etc/ssl/certs", "readOnly": read_only}]
        return pod(main(True, volumeMounts=mounts), volumes=[{"name": "ca", "hostPath": {"path": path}}])

    assert run_engine(with_bundle(True)).allowed
    assert refused_by(run_engine(with_bundle(False))) == ["GPU003"]


@pytest.mark.parametrize("path", ["/etc/ssl/certs/..", "/etc/pki/ca-trust", "/etc/ssl"])
def test_the_ca_bundles_neighbours_stay_refused(path: str) -> None:
    mounts = [{"name": "ca", "mountPath": "/ca", "readOnly": True}]
    obj = pod(main(True, volumeMounts=mounts), volumes=[{"name": "ca", "hostPath": {"path": path}}])

    assert refused_by(run_engine(obj)) == ["GPU003"]


def test_every_built_in_host_path_has_its_reason() -> None:
    assert trustzone.DEFAULT_HOST_PATHS and all(entry.reason for entry in trustzone.DEFAULT_HOST_PATHS)
    assert all(label.source for label in trustzone.DEFAULT_GPU_NODE_LABELS)
    assert all(trustzone.RESERVED_HOST_PORTS.values())
