"""GPU nodes are a trust zone: a pod that can reach one gets only what is known to be safe there.

A list of what is dangerous on a node is always one entry short (another path that gives root,
another capability that unlocks a syscall, another spelling of the same directory), and applied to
every pod it also refuses the CI runners, exporters and log shippers that never touch a GPU. So the
rule has two sides:

1. **A pod that can reach a GPU node** (`reach`) gets only what the allowances (`Allowance`) name:
   host paths from a short allowlist (read-only unless an admin says otherwise), capabilities from
   Pod Security `baseline`'s set plus the few that GPU workloads need and that open no route out,
   volume types from Pod Security `restricted`'s set plus NFS, and no privileged container, host
   namespace, unmasked /proc, SELinux label or Windows host process. Everything else is refused,
   however it is spelled (`node_power`). GPU002 refuses the privilege, GPU003 the volumes.
2. **A pod that asks for no GPU and does not target GPU nodes** may have any of that: GPU103 gives
   it the required node affinity `aliyun.accelerator/nvidia_name DoesNotExist`, and with it the pod
   cannot reach a GPU node, so rule 1 has nothing to say about it.

"Can reach a GPU node" (`reach`), in this order:
- it requests a GPU resource (the explicit list in `gpu.is_gpu_resource`, plus `gpuResources` the
  admin adds), or claims devices through Dynamic Resource Allocation (`spec.resourceClaims`: the
  class is not visible in the pod, so any claim counts);
- its nodeSelector or node affinity asks for GPU-labelled nodes (`nodeaffinity.targets_gpu_nodes`);
- it runs on a node (`spec.nodeName`) whose labels are known (the webhook looks them up for an
  ephemeral container added to a running pod): a GPU node's labels make it reach one, whatever its
  affinity says (a GPU node without the card-name label matches GPU103's affinity), others keep it
  off; unknown labels leave it to the points below, where GPU103's affinity settles it for a pod
  being created: the kubelet refuses a pod whose required node affinity its node does not match
  (node affinity is one of the kubelet's admission predicates);
- otherwise, when every required node-affinity term holds `nvidia_name DoesNotExist`
  (`stays_off_gpu_nodes`), it cannot: the scheduler and, for a pod that names its node, the
  kubelet's own admission check (node affinity is one of its general predicates) keep it off;
- it tolerates a GPU node taint by key (`nvidia.com/gpu`, a GPU resource or GPU node label key, or
  `gpuNodeTaints`): it asks to be let onto GPU nodes;
- otherwise it *may* reach one: nothing keeps it off. That is the case GPU103 settles by adding the
  affinity (`Reach.intent` is False then); when GPU103 does not act `enforce`, the pod stays a pod
  that may reach a GPU node, and rule 1 refuses its node power.

A wildcard toleration (`operator: Exists` without a key, what generic node agents carry) is not an
intent: such a pod gets the affinity like any other. `trustZone.strict: true` judges every pod by
rule 1, for clusters that want no node power anywhere.

Pure data and functions: no settings object (its `TrustZone` part is built in `policies.settings`).
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from policies import gpu, hostpaths, nodeaffinity, podspec

# --- capabilities -------------------------------------------------------------------------------

# Pod Security Standards `baseline`: the capabilities a container may add (Kubernetes docs, "Pod
# Security Standards", Capabilities; the default set of container runtimes). containerd's default
# seccomp profile unlocks no syscall for any of them except SYS_CHROOT (`chroot`, inside the
# container's own mount namespace).
BASELINE_CAPABILITIES: frozenset[str] = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
# What real GPU workloads add beyond baseline, each with why it opens no route to the node or to
# another tenant's card (checked against containerd's default seccomp profile, contrib/seccomp,
# and against an Unconfined profile, which profiling workloads run with):
GPU_WORKLOAD_CAPABILITIES: Mapping[str, str] = types.MappingProxyType(
    {
        "IPC_LOCK": "pinned (page-locked) host memory for CUDA and RDMA memory registration; it only lifts the "
        "container's own mlock limit and unlocks no syscall in the default seccomp profile",
        "SYS_NICE": "NUMA placement and thread priorities of data loaders and NCCL (mbind, set_mempolicy, "
        "sched_setaffinity); it acts on processes the container can see, which without hostPID are its own",
        "SYS_RESOURCE": "raising the container's own resource limits (open files, locked memory) for large "
        "jobs; unlocks no syscall in the default seccomp profile",
        "SYS_PTRACE": "profilers and debuggers (Nsight Systems, py-spy, cuda-gdb); ptrace and process_vm_* "
        "reach only processes in the container's PID namespace, so it is allowed only without hostPID",
    }
)
DEFAULT_CAPABILITIES: frozenset[str] = BASELINE_CAPABILITIES | frozenset(GPU_WORKLOAD_CAPABILITIES)
# NET_ADMIN and NET_RAW are not in it: NET_ADMIN opens nf_tables and traffic control to the pod, the
# kernel code behind most container escapes of recent years (CVE-2022-1015, CVE-2023-32233,
# CVE-2024-1086), and NET_RAW is why Pod Security baseline left it out (CVE-2020-14386). So
# `kubectl debug --profile=netadmin` is refused on pods that can reach a GPU node; an admin may
# allow them for a namespace. Allowed there, they (and SYS_PTRACE) still need the pod's own
# namespace: allowed only where the pod does not share this namespace of the host.
NEEDS_OWN_NAMESPACE: Mapping[str, str] = types.MappingProxyType(
    {"SYS_PTRACE": "hostPID", "NET_ADMIN": "hostNetwork", "NET_RAW": "hostNetwork"}
)
_SHARED_WITH_HOST = {
    "hostPID": "reaches every process of the node",
    "hostNetwork": "reaches the node's network stack and its local daemons",
}

# --- volumes --------------------------------------------------------------------------------------

# Pod Security Standards `restricted`'s volume types (image among them), plus NFS (datasets of real
# ML jobs; the kernel's NFS client mounts it for the kubelet, with nothing of the node exposed).
# gitRepo (runs git on the node: CVE-2018-11235, CVE-2024-10220), flexVolume (the node's driver
# runs as root with the pod's options), iscsi, rbd, cephfs, glusterfs and the other in-tree network
# filesystems (the node mounts what the pod names) are not in it.
DEFAULT_VOLUME_TYPES: frozenset[str] = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "image",
        "nfs",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
HOST_PATH = "hostPath"
# A volume's keys that are not its source.
_VOLUME_FIELDS = frozenset({"name"})

# --- host paths -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class HostPath:
    """One allowed host path (resolved) and what lies under it; read-only unless `read_only` is False."""

    path: str
    read_only: bool = True
    reason: str = ""


# The built-in allowlist: read-only paths that real GPU workloads mount and that give no route.
DEFAULT_HOST_PATHS: tuple[HostPath, ...] = (
    HostPath(
        path="/var/lib/lxcfs",
        reason="lxcfs's FUSE views of /proc/meminfo, cpuinfo, stat, uptime, ... sized to the container "
        "(what ACK's lxcfs-admission-webhook mounts): files computed for the reader, nothing of the node",
    ),
    HostPath(path="/etc/localtime", reason="the node's time zone, so logs and schedules agree with the node"),
    HostPath(path="/usr/share/zoneinfo", reason="the time zone database, read-only data"),
    HostPath(
        path="/etc/ssl/certs",
        reason="the node's CA bundle (Debian, Ubuntu, Alpine layout): public certificates, mounted so a job "
        "trusts what the node trusts; read-only, it gives nothing",
    ),
    HostPath(
        path="/etc/pki/ca-trust/extracted",
        reason="the node's CA bundle (RHEL, Fedora, Amazon Linux layout, update-ca-trust's output): public "
        "certificates; read-only, it gives nothing",
    ),
)

# The files ACK's lxcfs admission webhook mounts, as it writes them: a hostPath volume of exactly
# one of these paths (no `type`), mounted at the /proc or /sys file of the same name, with no
# `readOnly` in its earlier versions (AliyunContainerService/lxcfs-admission-webhook, forked from
# denverdino/lxcfs-admission-webhook, lxcfs.go `volumesTemplate`/`volumeMountsTemplate`: commit
# 2155668 mounts the seven /proc files without readOnly; f6a24c6 mounts cpuinfo, meminfo,
# diskstats, stat, uptime and /sys/devices/system/cpu/online with readOnly: true). Such a mount
# may be writable: lxcfs's FUSE files refuse writes themselves (lxc/lxcfs v7.0.0, src/proc_fuse.c
# `proc_write` returns -EINVAL for every file but the /proc/pressure/* triggers, and `proc_getattr`
# gives them mode 0444; src/sysfs_fuse.c `sys_write` returns -EINVAL or -EACCES). Only the exact
# path counts: `..`, another spelling, a subPath or a directory of /var/lib/lxcfs (its cgroup view
# takes writes) stays read-only.
LXCFS_FILES: Mapping[str, str] = types.MappingProxyType(
    {
        f"/var/lib/lxcfs{target}": target
        for target in (
            "/proc/cpuinfo",
            "/proc/meminfo",
            "/proc/diskstats",
            "/proc/stat",
            "/proc/swaps",
            "/proc/uptime",
            "/proc/loadavg",
            "/sys/devices/system/cpu/online",
        )
    }
)

# --- host ports -----------------------------------------------------------------------------------

# Ports a node's own daemons (or our components) listen on: a pod's hostPort on one of them takes
# the node's traffic for it (the CNI portmap plugin DNATs the node's address and port to the pod).
RESERVED_HOST_PORTS: Mapping[int, str] = types.MappingProxyType(
    {
        2379: "etcd's client port",
        2380: "etcd's peer port",
        6443: "kube-apiserver's secure port",
        8089: "our labeler's health port (deploy/labeler.yaml)",
        8443: "our webhook's and extender's port (deploy/webhook.yaml, deploy/extender.yaml)",
        9090: "our components' metrics port (deploy/components/monitoring)",
        9100: "the Prometheus node exporter",
        9400: "NVIDIA's DCGM exporter",
        10248: "the kubelet's health port (healthzPort)",
        10249: "kube-proxy's metrics port",
        10250: "the kubelet's API (exec, attach, logs and port-forward of every pod on the node)",
        10255: "the kubelet's read-only port",
        10256: "kube-proxy's health port",
        10257: "kube-controller-manager's secure port",
        10259: "kube-scheduler's secure port",
    }
)
# The built-in allowlist: unprivileged ports below the Service NodePort range (30000-32767 by
# default: a hostPort there would capture NodePort traffic to the node) and below the kernel's
# ephemeral range (32768-60999), where containerd and CRI-O open their streaming servers for exec,
# attach and port-forward (`stream_server_port = "0"`, `stream_port = "0"`: a random free port),
# with every reserved port left out. Ports under 1024 are the node's services (ssh, DNS, ...).
HOST_PORT_FLOOR = 1024
HOST_PORT_CEILING = 29999


@dataclasses.dataclass(frozen=True, kw_only=True)
class PortRange:
    """Host ports `low` to `high`, both included."""

    low: int
    high: int

    def __contains__(self, port: object) -> bool:
        return isinstance(port, int) and self.low <= port <= self.high

    def __str__(self) -> str:
        return str(self.low) if self.low == self.high else f"{self.low}-{self.high}"


def without_reserved(ranges: Iterable[PortRange]) -> tuple[PortRange, ...]:
    """`ranges` with every port of RESERVED_HOST_PORTS cut out."""
    out: list[PortRange] = []
    for span in ranges:
        low = span.low
        for port in sorted(p for p in RESERVED_HOST_PORTS if span.low <= p <= span.high):
            if low < port:
                out.append(PortRange(low=low, high=port - 1))
            low = port + 1
        if low <= span.high:
            out.append(PortRange(low=low, high=span.high))
    return tuple(out)


DEFAULT_HOST_PORTS: tuple[PortRange, ...] = without_reserved([PortRange(low=HOST_PORT_FLOOR, high=HOST_PORT_CEILING)])

# Pod Security `baseline`'s SELinux types a container may run as.
BASELINE_SELINUX_TYPES: frozenset[str] = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
HOST_NAMESPACES: tuple[str, ...] = ("hostNetwork", "hostPID", "hostIPC")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Allowance:
    """What a pod that can reach a GPU node may have (in one namespace)."""

    capabilities: frozenset[str] = DEFAULT_CAPABILITIES
    host_paths: tuple[HostPath, ...] = DEFAULT_HOST_PATHS
    volume_types: frozenset[str] = DEFAULT_VOLUME_TYPES
    host_namespaces: frozenset[str] = frozenset()  # of HOST_NAMESPACES
    host_ports: tuple[PortRange, ...] = DEFAULT_HOST_PORTS

    def widened(self, other: Allowance) -> Allowance:
        """This allowance with `other`'s additions (a namespace's allowances over the cluster's)."""
        return Allowance(
            capabilities=self.capabilities | other.capabilities,
            host_paths=tuple(dict.fromkeys((*self.host_paths, *other.host_paths))),
            volume_types=self.volume_types | other.volume_types,
            host_namespaces=self.host_namespaces | other.host_namespaces,
            host_ports=tuple(dict.fromkeys((*self.host_ports, *other.host_ports))),
        )

    def host_port(self, port: int) -> bool:
        """Whether a pod may have this host port."""
        return any(port in span for span in self.host_ports)

    def host_path(self, path: str) -> HostPath | None:
        """The allowed entry that `path` (as written in a pod) is, or lies in; None when it is not allowed.

        A read-only entry allows what lies under it; a writable one only itself: a pod that may write
        there could plant a symbolic link (`/scratch/x -> /`) that the node follows when the next pod
        mounts `/scratch/x` (pods reach into a writable entry with `subPath`, whose links the kubelet
        refuses to follow out). A writable entry wins over a read-only one for the same path.
        """
        resolved = hostpaths.resolve(path)
        found = [
            entry
            for entry in self.host_paths
            if (hostpaths.within(resolved, entry.path) if entry.read_only else resolved == entry.path)
        ]
        if not found:
            return None
        return next((entry for entry in found if not entry.read_only), found[0])


DEFAULT_ALLOWANCE = Allowance()


# --- which nodes are GPU nodes -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class NodeLabel:
    """One label that marks a GPU node: any value (`values` empty) or one of `values`."""

    key: str
    values: tuple[str, ...] = ()
    source: str = ""  # who writes it, and where that is documented

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a node with these labels is a GPU node by this label."""
        value = labels.get(self.key)
        return value is not None and (not self.values or value in self.values)

    def keep_off(self) -> dict[str, Any]:
        """The node-selector requirement a node matching this label fails (DoesNotExist / NotIn)."""
        if self.values:
            return {"key": self.key, "operator": "NotIn", "values": list(self.values)}
        return {"key": self.key, "operator": "DoesNotExist"}

    def asks_for(self, expression: Mapping[str, Any]) -> bool:
        """Whether a node-affinity expression can only match nodes this label marks (Exists, In, Gt, Lt)."""
        if expression.get("key") != self.key:
            return False
        operator = expression.get("operator")
        if not self.values:
            return operator in ("In", "Exists", "Gt", "Lt")
        wanted = {str(v) for v in podspec.sequence(expression.get("values"))}
        return operator == "In" and bool(wanted) and wanted <= set(self.values)

    def __str__(self) -> str:
        return self.key if not self.values else f"{self.key} in ({', '.join(self.values)})"


_TRUE = ("true",)
# The labels that mark a GPU node, whoever wrote them. GPU103's keep-off affinity fails every one
# of them, `reach` and the audit read nodes by them, and `trustZone.gpuNodeLabels` adds more.
DEFAULT_GPU_NODE_LABELS: tuple[NodeLabel, ...] = (
    NodeLabel(
        key=gpu.CARD_NAME_LABEL,
        source="our labeler, and ACK on its GPU node pools (kubernetes/autoscaler, cluster-autoscaler/"
        "cloudprovider/alicloud/alicloud_cloud_provider.go GPULabel)",
    ),
    NodeLabel(
        key=gpu.SCHEDULE_LABEL,
        source="ACK's GPU sharing node pools (ack.node.gpu.schedule: the node's scheduling mode)",
    ),
    NodeLabel(
        key="nvidia.com/gpu.present",
        values=_TRUE,
        source='NVIDIA GPU Operator (controllers/state_manager.go gpuNodeLabels: "true" on GPU nodes, '
        '"false" once their GPUs are gone)',
    ),
    NodeLabel(
        key="nvidia.com/gpu.count",
        source="NVIDIA GPU Feature Discovery (k8s-device-plugin internal/lm mig-strategy.go newGPULabelers)",
    ),
    NodeLabel(
        key="nvidia.com/gpu.product",
        source="NVIDIA GPU Feature Discovery (k8s-device-plugin internal/lm/resource.go getProductName)",
    ),
    NodeLabel(
        key="feature.node.kubernetes.io/pci-10de.present",
        values=_TRUE,
        source="Node Feature Discovery, NVIDIA's PCI vendor 10de with deviceLabelFields [vendor] (the GPU Operator's setting)",
    ),
    NodeLabel(
        key="feature.node.kubernetes.io/pci-0302_10de.present",
        values=_TRUE,
        source="Node Feature Discovery's default class_vendor label: a 3D controller of vendor 10de",
    ),
    NodeLabel(
        key="feature.node.kubernetes.io/pci-0300_10de.present",
        values=_TRUE,
        source="Node Feature Discovery's default class_vendor label: a VGA controller of vendor 10de",
    ),
    NodeLabel(
        key="cloud.google.com/gke-accelerator",
        source="GKE on every GPU node pool (kubernetes/autoscaler, cluster-autoscaler/cloudprovider/gce/"
        "gce_cloud_provider.go GPULabel)",
    ),
    NodeLabel(
        key="karpenter.k8s.aws/instance-gpu-count",
        source="EKS with Karpenter (aws/karpenter-provider-aws pkg/apis/v1/labels.go LabelInstanceGPUCount; "
        "pkg/providers/instancetype/types.go sets it only on instance types with GPUs)",
    ),
    NodeLabel(
        key="eks.amazonaws.com/instance-gpu-count",
        source="EKS Auto Mode's node pools (the same label under the eks.amazonaws.com group)",
    ),
    NodeLabel(
        key="k8s.amazonaws.com/accelerator",
        source="EKS node groups labelled for the cluster autoscaler (kubernetes/autoscaler, "
        "cluster-autoscaler/cloudprovider/aws/aws_cloud_provider.go GPULabel)",
    ),
    NodeLabel(
        key="kubernetes.azure.com/accelerator",
        source="AKS on GPU node pools, value nvidia (AKS docs, articles/aks/use-labels.md, reserved system labels)",
    ),
)


def gpu_node_label_of(labels: Mapping[str, str], node_labels: Iterable[NodeLabel]) -> NodeLabel | None:
    """The first of `node_labels` that marks a node with these labels as a GPU node; None when none does."""
    return next((label for label in node_labels if label.matches(labels)), None)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrustZone:
    """The trust-zone settings other than the per-namespace allowances (those need a namespace)."""

    strict: bool = False
    gpu_resources: tuple[str, ...] = ()  # extra GPU resource names; a trailing * is a prefix
    gpu_node_taints: tuple[str, ...] = ()  # extra toleration keys that let a pod onto GPU nodes
    gpu_node_labels: tuple[NodeLabel, ...] = ()  # extra labels that mark GPU nodes (trustZone.gpuNodeLabels)

    @functools.cached_property
    def node_labels(self) -> tuple[NodeLabel, ...]:
        """Every label that marks a GPU node: the built-in ones and `gpu_node_labels`."""
        return (*DEFAULT_GPU_NODE_LABELS, *self.gpu_node_labels)

    @functools.cached_property
    def keep_off(self) -> tuple[dict[str, Any], ...]:
        """GPU103's requirements: a node that any of `node_labels` marks fails one of them."""
        return tuple(label.keep_off() for label in self.node_labels)

    def gpu_node_label(self, labels: Mapping[str, str]) -> NodeLabel | None:
        """The label by which a node with these labels is a GPU node; None when it is not one."""
        return gpu_node_label_of(labels, self.node_labels)

    def is_gpu_resource(self, name: object) -> bool:
        """Whether a resource name asks for a GPU: the built-in list or one of `gpu_resources`."""
        return gpu.is_gpu_resource(name) or (isinstance(name, str) and any(_matches(name, p) for p in self.gpu_resources))

    def requests_gpu(self, container: Mapping[str, Any]) -> bool:
        """Whether a container mentions a GPU resource in its limits or requests."""
        if gpu.requests_gpu(container):
            return True
        if not self.gpu_resources:
            return False
        resources = podspec.mapping(container.get("resources"))
        return any(
            self.is_gpu_resource(name)
            for section in (resources.get("limits"), resources.get("requests"))
            for name in podspec.mapping(section)
        )

    def pod_requests_gpu(self, spec: Mapping[str, Any]) -> str:
        """The first GPU resource any container of the pod mentions; "" when none does."""
        for ref in podspec.iter_containers(spec, spec_path=""):
            resources = podspec.mapping(ref.container.get("resources"))
            for section in (resources.get("limits"), resources.get("requests")):
                for name in podspec.mapping(section):
                    if self.is_gpu_resource(name):
                        return str(name)
        return ""

    def is_gpu_taint(self, key: object) -> bool:
        """Whether a taint key marks GPU nodes: `nvidia.com/gpu`, a GPU resource or node label, or configured."""
        return (
            isinstance(key, str)
            and bool(key)
            and (
                self.is_gpu_resource(key)
                or nodeaffinity.is_gpu_node_label(key)
                or key in self.gpu_node_taints
                or any(label.key == key for label in self.node_labels)
            )
        )


DEFAULT_ZONE = TrustZone()


def _matches(name: str, pattern: str) -> bool:
    return name.startswith(pattern[:-1]) if pattern.endswith("*") else name == pattern


# --- can the pod reach a GPU node ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Reach:
    """Why a pod can reach a GPU node ("" when it cannot), and whether it asked to."""

    why: str = ""
    intent: bool = False  # True: it asks for GPUs or GPU nodes; False: nothing keeps it off

    def __bool__(self) -> bool:
        return bool(self.why)


UNREACHABLE = Reach()


def stays_off_gpu_nodes(spec: Mapping[str, Any], zone: TrustZone = DEFAULT_ZONE) -> bool:
    """Whether every required node-affinity term fails every GPU node label of `zone` (GPU103's affinity).

    A term fails a label when it holds the label's keep-off requirement (`NodeLabel.keep_off`):
    `DoesNotExist`, or `NotIn` with at least the label's values. A term missing one of them lets
    the nodes that label marks through.
    """
    terms = list(nodeaffinity.required_terms(spec))
    return bool(terms) and all(
        all(_fails(label, list(nodeaffinity.expressions(term))) for label in zone.node_labels) for term in terms
    )


def _fails(label: NodeLabel, expressions: list[Mapping[str, Any]]) -> bool:
    for e in expressions:
        if e.get("key") != label.key:
            continue
        operator = e.get("operator")
        if operator == "DoesNotExist":
            return True
        if operator == "NotIn" and label.values and set(label.values) <= {str(v) for v in podspec.sequence(e.get("values"))}:
            return True
    return False


def targets_gpu_node_labels(spec: Mapping[str, Any], zone: TrustZone = DEFAULT_ZONE) -> str:
    """The GPU node label (of `zone`'s) the pod's nodeSelector or node affinity asks for; "" when none.

    A nodeSelector entry, or a required or preferred affinity expression that only nodes the
    label marks can satisfy (`NodeLabel.asks_for`).
    """
    selector = nodeaffinity.node_selector(spec)
    for label in zone.node_labels:
        value = selector.get(label.key)
        if value is not None and (not label.values or str(value) in label.values):
            return label.key
    preferred = podspec.sequence(nodeaffinity.node_affinity(spec).get("preferredDuringSchedulingIgnoredDuringExecution"))
    preferences = [podspec.mapping(podspec.mapping(item).get("preference")) for item in preferred]
    for term in (*nodeaffinity.required_terms(spec), *preferences):
        for expression in nodeaffinity.expressions(term):
            for label in zone.node_labels:
                if label.asks_for(expression):
                    return label.key
    return ""


def claims_devices(spec: Mapping[str, Any]) -> bool:
    """Whether the pod claims devices through Dynamic Resource Allocation (`spec.resourceClaims`)."""
    return any(isinstance(claim, Mapping) for claim in podspec.sequence(spec.get("resourceClaims")))


def gpu_toleration(spec: Mapping[str, Any], zone: TrustZone = DEFAULT_ZONE) -> str:
    """The first toleration key that lets the pod onto GPU nodes; "" when none does."""
    for entry in podspec.sequence(spec.get("tolerations")):
        key = podspec.mapping(entry).get("key")
        if zone.is_gpu_taint(key):
            return str(key)
    return ""


def intent(spec: Mapping[str, Any], zone: TrustZone = DEFAULT_ZONE) -> str:
    """Why the pod asks for GPUs or GPU nodes, in words; "" when it does not."""
    resource = zone.pod_requests_gpu(spec)
    if resource:
        return f"the pod requests the GPU resource {resource}"
    if claims_devices(spec):
        return "the pod claims devices through resourceClaims, which may be GPUs"
    if nodeaffinity.targets_gpu_nodes(spec) or targets_gpu_node_labels(spec, zone):
        return "the pod's nodeSelector or node affinity asks for GPU nodes"
    return ""


def reach(spec: Mapping[str, Any], zone: TrustZone = DEFAULT_ZONE, *, node_labels: Mapping[str, str] | None = None) -> Reach:
    """Whether (and why) a pod with this spec can reach a GPU node; see the module docstring."""
    if zone.strict:
        return Reach(why="strict mode (trustZone.strict) judges every pod as if on a GPU node", intent=True)
    asked = intent(spec, zone)
    if asked:
        return Reach(why=asked, intent=True)
    node = spec.get("nodeName")
    if isinstance(node, str) and node and node_labels is not None:
        # Known labels win over an affinity: a GPU node without the card-name label matches it.
        found = sorted(k for k, v in node_labels.items() if nodeaffinity.is_gpu_node_label(k, v))
        marked = zone.gpu_node_label(node_labels)
        if found or marked:
            return Reach(why=f"the pod runs on the GPU node {node} (label {found[0] if found else marked})", intent=True)
        return UNREACHABLE
    if stays_off_gpu_nodes(spec, zone):
        return UNREACHABLE
    toleration = gpu_toleration(spec, zone)
    if toleration:
        return Reach(why=f"the pod tolerates the GPU node taint {toleration}", intent=True)
    # The same words whether or not the pod names a node whose labels are not known: the audit
    # remembers verdicts under a key without spec.nodeName (webhook/audit/verdicts.py).
    return Reach(why="nothing keeps the pod off GPU nodes (no required node affinity against every GPU node label)")


# --- what the zone does not allow ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Power:
    """One thing a pod has that GPU nodes do not allow."""

    kind: str  # "privilege" (GPU002) or "volume" (GPU003)
    detail: str  # names the container, volume or field


PRIVILEGE = "privilege"
VOLUME = "volume"


def container_power(
    container: podspec.ContainerRef, allowance: Allowance, *, shared: frozenset[str] = frozenset()
) -> Iterator[Power]:
    """What one container has that GPU nodes do not allow; `shared`: the host namespaces the pod shares."""
    body = container.container
    security = podspec.mapping(body.get("securityContext"))
    label = container.label
    yield from _host_ports(container, allowance)
    if not security:
        return
    if security.get("privileged") is True:
        yield Power(kind=PRIVILEGE, detail=f"{label} is privileged")
    refused = []
    beside: list[str] = []
    for entry in podspec.added_capabilities(body):
        name = podspec.capability_name(entry)
        namespace = NEEDS_OWN_NAMESPACE.get(name)
        if name not in allowance.capabilities:
            refused.append(entry)
        elif namespace in shared:
            refused.append(entry)
            beside.append(f"{name} with {namespace} {_SHARED_WITH_HOST[namespace]}")
    if refused:
        extra = f" ({'; '.join(beside)})" if beside else ""
        yield Power(kind=PRIVILEGE, detail=f"{label} adds capability {', '.join(refused)}{extra}")
    proc_mount = security.get("procMount")
    if proc_mount is not None and proc_mount != "Default":
        yield Power(kind=PRIVILEGE, detail=f"{label} sets procMount {proc_mount!s} (the node's /proc unmasked)")
    yield from _security_options(security, where=label)


def _host_ports(container: podspec.ContainerRef, allowance: Allowance) -> Iterator[Power]:
    for item in podspec.sequence(container.container.get("ports")):
        port = podspec.mapping(item).get("hostPort")
        if not port or not isinstance(port, int) or isinstance(port, bool) or allowance.host_port(port):
            continue
        why = RESERVED_HOST_PORTS.get(port)
        where = f"the node's port of {why}" if why else "a port outside the allowed host ports"
        yield Power(kind=PRIVILEGE, detail=f"{container.label} asks for hostPort {port} ({where})")


def _security_options(security: Mapping[str, Any], *, where: str) -> Iterator[Power]:
    selinux = podspec.mapping(security.get("seLinuxOptions"))
    if selinux.get("user") or selinux.get("role") or selinux.get("type", "") not in BASELINE_SELINUX_TYPES:
        yield Power(kind=PRIVILEGE, detail=f"{where} sets seLinuxOptions {dict(selinux)!r} (a label of the node's)")
    if podspec.mapping(security.get("windowsOptions")).get("hostProcess") is True:
        yield Power(kind=PRIVILEGE, detail=f"{where} runs as a Windows host process")


def pod_power(
    spec: Mapping[str, Any], allowance: Allowance, rules: hostpaths.HostPathRules = hostpaths.DEFAULT_RULES
) -> Iterator[Power]:
    """What the pod as a whole (host namespaces, pod security context, volumes) has that GPU nodes do not allow."""
    for field in HOST_NAMESPACES:
        if spec.get(field) is True and field not in allowance.host_namespaces:
            yield Power(kind=PRIVILEGE, detail=f"the pod sets {field}: true")
    yield from _security_options(podspec.mapping(spec.get("securityContext")), where="the pod")
    for index, volume in podspec.volumes(spec):
        name = volume.get("name") if isinstance(volume.get("name"), str) else f"volumes[{index}]"
        sources = [key for key in volume if key not in _VOLUME_FIELDS]
        for source in sources:
            if source == HOST_PATH:
                path = podspec.mapping(volume.get(HOST_PATH)).get("path")
                if isinstance(path, str) and allowance.host_path(path) is None:
                    yield Power(
                        kind=VOLUME, detail=f'volume "{name}" mounts hostPath {_shown(path)}, {_not_allowed(path, rules)}'
                    )
            elif source not in allowance.volume_types:
                yield Power(kind=VOLUME, detail=f'volume "{name}" is a {source} volume, a type GPU nodes do not allow')


def _shown(path: str) -> str:
    resolved = hostpaths.resolve(path)
    return resolved if resolved == path else f"{resolved} (written {path!r})"


def _not_allowed(path: str, rules: hostpaths.HostPathRules) -> str:
    """Why a path is not allowed, in words: where it lies in one of the roots `rules` know, which root."""
    verdict = rules.judge(path)
    if verdict is None:
        return "which is not an allowed host path"
    where = "contains" if verdict.contains else "lies in"
    return f"which is not an allowed host path ({where} {verdict.root}: {verdict.reason})"


def writable_mounts(spec: Mapping[str, Any], containers: Iterable[podspec.ContainerRef], allowance: Allowance) -> Iterator[Power]:
    """Mounts, by `containers`, of an allowed read-only host path that are not read-only.

    A mount of exactly one of ACK's lxcfs files (`LXCFS_FILES`), without a subPath, may be
    writable: the FUSE file refuses writes itself.

    Under `/sys/fs/cgroup` read-only must be recursive (`recursiveReadOnly: Enabled`): cgroup v1
    mounts each controller as a submount that a plain read-only bind leaves writable, and a
    writable cgroup hierarchy lets a container leave its device cgroup.
    """
    guarded: dict[str, str] = {}
    lxcfs: set[str] = set()  # volumes of exactly one of LXCFS_FILES
    for _, volume in podspec.volumes(spec):
        path = podspec.mapping(volume.get(HOST_PATH)).get("path")
        name = volume.get("name")
        if not isinstance(path, str) or not isinstance(name, str):
            continue
        entry = allowance.host_path(path)
        if entry is not None and entry.read_only:
            guarded[name] = hostpaths.resolve(path)
            if path in LXCFS_FILES:
                lxcfs.add(name)
    if not guarded:
        return
    for container in containers:
        for item in podspec.sequence(container.container.get("volumeMounts")):
            mount = podspec.mapping(item)
            name = mount.get("name")
            if not isinstance(name, str) or name not in guarded:
                continue
            if name in lxcfs and not mount.get("subPath") and not mount.get("subPathExpr"):
                continue  # the FUSE file refuses writes itself (LXCFS_FILES)
            path = guarded[name]
            recursive = any(hostpaths.within(path, r) and rec for r, rec in hostpaths.READ_ONLY_PATHS.items())
            if mount.get("readOnly") is True and (not recursive or mount.get("recursiveReadOnly") == "Enabled"):
                continue
            needs = "readOnly: true and recursiveReadOnly: Enabled" if recursive else "readOnly: true"
            yield Power(
                kind=VOLUME,
                detail=f'{container.label} mounts volume "{name}" (hostPath {path}) without {needs}; the allowed '
                "host paths are read-only",
            )


def shared_namespaces(spec: Mapping[str, Any]) -> frozenset[str]:
    """The host namespaces the pod shares (`hostPID: true`, ...)."""
    return frozenset(field for field in HOST_NAMESPACES if spec.get(field) is True)


def node_power(
    spec: Mapping[str, Any],
    containers: Iterable[podspec.ContainerRef],
    allowance: Allowance,
    *,
    whole_pod: bool = True,
    rules: hostpaths.HostPathRules = hostpaths.DEFAULT_RULES,
) -> list[Power]:
    """Everything the pod (or, with `whole_pod` False, only `containers`) has that GPU nodes do not allow.

    `rules` only name, in a message, the protected root a refused host path lies in (the settings'
    `hostPaths.protect` among them); what is refused is all that `allowance` does not allow.
    """
    scope = tuple(containers)
    shared = shared_namespaces(spec)
    found: list[Power] = []
    if whole_pod:
        found.extend(pod_power(spec, allowance, rules))
    for ref in scope:
        found.extend(container_power(ref, allowance, shared=shared))
    found.extend(writable_mounts(spec, scope, allowance))
    return found


def has_node_power(spec: Mapping[str, Any], allowance: Allowance = DEFAULT_ALLOWANCE) -> bool:
    """Whether any part of the pod has what GPU nodes do not allow."""
    return bool(node_power(spec, podspec.iter_containers(spec, spec_path=""), allowance))
