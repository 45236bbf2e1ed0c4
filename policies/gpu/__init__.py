"""The GPU vocabulary: every node label, extended resource and annotation key, and how they relate.

This module is the one owner of these literals (DESIGN section 1, from the seeds
`000_2d8695719794de07.txt`, `002_e2b829a309310c51.txt`, `003_c28dd89f5a652d9c.txt` and
`004_79385826ac27146d.txt`). Everything else, inside and outside `policies`, imports them from here.
The formats of the annotations have one codec each beside it: `inventory` (the labeler's cards and
links), `allocation` (what a pod holds), `reservations` (the extender's ledger) and `usage`.

The relation that matters most:

| resource family (what the pod asks for)        | modes (`ack.node.gpu.schedule`) that serve it |
|------------------------------------------------|-----------------------------------------------|
| `nvidia.com/gpu` (`.shared`, MIG `nvidia.com/mig-*`) | default (also: label absent)             |
| `aliyun.com/gpu-mem`                           | cgpu, share, mps, core_mem                    |
| `aliyun.com/gpu-mem` + `gpu-core.percentage`   | core_mem                                      |
| `aliyun.com/gpu`                               | topology                                      |
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from policies import podspec
from policies.gpu import podrequests

# --- node labels --------------------------------------------------------------------------------

SCHEDULE_LABEL = "ack.node.gpu.schedule"
PLACEMENT_LABEL = "ack.node.gpu.placement"

ACCELERATOR_LABEL_PREFIX = "aliyun.accelerator/"
CARD_NAME_LABEL = "aliyun.accelerator/nvidia_name"
CARD_MEMORY_LABEL = "aliyun.accelerator/nvidia_mem"
CARD_COUNT_LABEL = "aliyun.accelerator/nvidia_count"

# Our own keys; never `nvidia.com/` or `aliyun.com/` for things we invent.
OWN_PREFIX = "gpu-admission.io/"
CARD_MEMORY_MIB_LABEL = "gpu-admission.io/gpu-memory-mib"  # numeric, written by the labeler


class Mode(enum.StrEnum):
    """A node's GPU scheduling mode, the value of `ack.node.gpu.schedule` (one per node)."""

    DEFAULT = "default"  # exclusive whole cards; also what a node without the label does
    CGPU = "cgpu"  # shared compute, isolated memory
    CORE_MEM = "core_mem"  # isolated compute and memory
    SHARE = "share"  # shared, no isolation
    MPS = "mps"  # NVIDIA MPS plus cGPU memory isolation
    TOPOLOGY = "topology"  # whole cards, best-connected set


SHARED_MODES: tuple[Mode, ...] = (Mode.CGPU, Mode.SHARE, Mode.MPS, Mode.CORE_MEM)
# The modes `defaultSharedMode` may name: those serving plain `aliyun.com/gpu-mem`. core_mem is left
# out on purpose: it is what pods asking for a core percentage get, not a default for memory-only pods.
DEFAULT_SHARED_MODE_CHOICES: tuple[Mode, ...] = (Mode.CGPU, Mode.SHARE, Mode.MPS)


class Placement(enum.StrEnum):
    """Which card inside a shared-mode node a pod lands on, the value of `ack.node.gpu.placement`."""

    BINPACK = "binpack"  # the default: fill one card before the next
    SPREAD = "spread"


def mode_of(labels: Mapping[str, object]) -> Mode | None:
    """A node's mode from its labels: `default` when the label is absent, None for a value that is no mode.

    An empty value is no mode: it is not what an unlabelled node does, and no nodeSelector a pod
    gets from GPU101 matches it.
    """
    if SCHEDULE_LABEL not in labels:
        return Mode.DEFAULT
    value = labels[SCHEDULE_LABEL]
    if not isinstance(value, str):
        return None
    try:
        return Mode(value)
    except ValueError:
        return None


def placement_of(labels: Mapping[str, object]) -> Placement:
    """A node's placement from its labels: `spread` only where the label says so, else `binpack`."""
    return Placement.SPREAD if labels.get(PLACEMENT_LABEL) == Placement.SPREAD else Placement.BINPACK


# --- extended resources -------------------------------------------------------------------------


class Resource(enum.StrEnum):
    """The extended resources of the GPU model; a pod asks for them in `limits`."""

    NVIDIA_GPU = "nvidia.com/gpu"
    GPU_MEM = "aliyun.com/gpu-mem"  # GiB on one card
    GPU_COUNT = "aliyun.com/gpu-count"  # advertised by shared-mode nodes
    GPU_CORE_PERCENTAGE = "aliyun.com/gpu-core.percentage"  # <= 100, on one card
    ALIYUN_GPU = "aliyun.com/gpu"  # whole cards, topology-aware


GPU_RESOURCES: frozenset[str] = frozenset(Resource)
# The GPU resources of NVIDIA's device plugin besides `nvidia.com/gpu`, by an explicit list: renamed
# shared cards `nvidia.com/gpu.shared` (time-slicing or MPS with renameByDefault) and MIG slices
# `nvidia.com/mig-<profile>` (the mixed MIG strategy). They come from the device plugin on
# `default`-mode nodes, so they belong to the exclusive family (one family per pod: `nvidia.com/gpu`
# beside a MIG slice is fine, beside `aliyun.com/gpu-mem` it is not). Not every `nvidia.com/` name
# is a GPU: the NVIDIA Network Operator publishes NICs there (`nvidia.com/hostdev`,
# `nvidia.com/rdma_shared_device_a`, whatever its `resourcePrefix` and names say), so a prefix rule
# would call a NIC a GPU and leave its container without `NVIDIA_VISIBLE_DEVICES=void` (GPU104).
# A device plugin renamed to anything else is named in the settings (`trustZone.gpuResources`).
NVIDIA_RESOURCE_PREFIX = "nvidia.com/"
NVIDIA_GPU_RESOURCES: frozenset[str] = frozenset({"nvidia.com/gpu", "nvidia.com/gpu.shared"})
NVIDIA_MIG_PREFIX = "nvidia.com/mig-"


def is_gpu_resource(name: object) -> bool:
    """Whether a resource name asks for a GPU: one of `Resource`, `nvidia.com/gpu.shared` or a MIG slice."""
    return isinstance(name, str) and (name in GPU_RESOURCES or name in NVIDIA_GPU_RESOURCES or name.startswith(NVIDIA_MIG_PREFIX))


# The resources the scheduler extender places (DESIGN section 3), in one order (memory, core
# percentage, whole cards) for the extender's request arithmetic; `nvidia.com/gpu` is not one of
# them: the kubelet's device manager hands out those cards itself.
EXTENDER_MANAGED: tuple[Resource, ...] = (Resource.GPU_MEM, Resource.GPU_CORE_PERCENTAGE, Resource.ALIYUN_GPU)
EXTENDER_RESOURCES: frozenset[str] = frozenset(EXTENDER_MANAGED)
MAX_CORE_PERCENTAGE = 100  # per card: the core percentage a node advertises is 100 per card
MIB_PER_GIB = 1024  # `aliyun.com/gpu-mem` counts GiB; NVML and the labels count MiB

# What a node of each mode advertises (DESIGN section 1); enabling one mode sets every other GPU
# resource to 0 on that node. The labeler writes capacity from it and the audit checks nodes against it.
MODE_RESOURCES: Mapping[Mode, tuple[Resource, ...]] = {
    Mode.DEFAULT: (Resource.NVIDIA_GPU,),
    Mode.CGPU: (Resource.GPU_MEM, Resource.GPU_COUNT),
    Mode.SHARE: (Resource.GPU_MEM, Resource.GPU_COUNT),
    Mode.MPS: (Resource.GPU_MEM, Resource.GPU_COUNT),
    Mode.CORE_MEM: (Resource.GPU_MEM, Resource.GPU_COUNT, Resource.GPU_CORE_PERCENTAGE),
    Mode.TOPOLOGY: (Resource.ALIYUN_GPU,),
}


class Family(enum.StrEnum):
    """The kind of GPU a pod asks for; a pod asks for at most one."""

    EXCLUSIVE = Resource.NVIDIA_GPU.value
    SHARED = Resource.GPU_MEM.value
    SHARED_CORE = f"{Resource.GPU_MEM.value}+{Resource.GPU_CORE_PERCENTAGE.value}"
    TOPOLOGY = Resource.ALIYUN_GPU.value


_FAMILY_OF: Mapping[str, Family] = {
    Resource.NVIDIA_GPU: Family.EXCLUSIVE,
    Resource.GPU_MEM: Family.SHARED,
    # gpu-count only makes sense beside gpu-mem (GPU004 insists on that), so it is the shared family.
    Resource.GPU_COUNT: Family.SHARED,
    Resource.GPU_CORE_PERCENTAGE: Family.SHARED_CORE,
    Resource.ALIYUN_GPU: Family.TOPOLOGY,
}

_MODES_FOR: Mapping[Family, tuple[Mode, ...]] = {
    Family.EXCLUSIVE: (Mode.DEFAULT,),
    Family.SHARED: SHARED_MODES,
    Family.SHARED_CORE: (Mode.CORE_MEM,),
    Family.TOPOLOGY: (Mode.TOPOLOGY,),
}


def family_of(resource: str) -> Family | None:
    """The family a resource name belongs to; None for anything that is not a GPU resource."""
    found = _FAMILY_OF.get(resource)
    if found is None and is_gpu_resource(resource):
        return Family.EXCLUSIVE  # MIG slices, shared and renamed cards of NVIDIA's device plugin
    return found


def modes_for(family: Family) -> tuple[Mode, ...]:
    """The node modes whose nodes advertise what `family` asks for."""
    return _MODES_FOR[family]


def merge_families(families: Iterable[Family]) -> frozenset[Family]:
    """Fold families that one node mode serves together: memory plus core is the core family."""
    found = frozenset(families)
    if Family.SHARED_CORE in found and Family.SHARED in found:
        found = found - {Family.SHARED}
    return found


def injected_mode(family: Family, *, shared_default: Mode) -> Mode | None:
    """The mode GPU101 pins a pod of `family` to, or None where no pin is needed.

    `nvidia.com/gpu` gets none: `default` is also what unlabelled nodes do, so a selector would
    wrongly exclude them.
    """
    if family is Family.SHARED:
        return shared_default
    if family is Family.SHARED_CORE:
        return Mode.CORE_MEM
    if family is Family.TOPOLOGY:
        return Mode.TOPOLOGY
    return None


def container_gpu_resources(container: Mapping[str, Any]) -> frozenset[str]:
    """The GPU resource names a container mentions in its limits or requests."""
    resources = podspec.mapping(container.get("resources"))
    if not resources:
        return _NO_RESOURCES
    # Called by several policies per container on every review: one comprehension, no generators.
    return frozenset(
        [
            name
            for section in (resources.get("limits"), resources.get("requests"))
            for name in podspec.mapping(section)
            if is_gpu_resource(name)
        ]
    )


_NO_RESOURCES: frozenset[str] = frozenset()


def requests_gpu(container: Mapping[str, Any]) -> bool:
    """Whether a container mentions any GPU resource (any value: GPU004 judges the values)."""
    return bool(container_gpu_resources(container))


def pod_families(spec: Mapping[str, Any]) -> frozenset[Family]:
    """Every resource family any container of the pod spec asks for (merged; see merge_families)."""
    found: list[Family] = []
    for ref in podspec.iter_containers(spec, spec_path=""):
        for name in container_gpu_resources(ref.container):
            family = family_of(name)
            if family is not None:
                found.append(family)
    return merge_families(found)


def pod_family(spec: Mapping[str, Any]) -> Family | None:
    """The one family the pod asks for; None when it asks for no GPU or mixes families."""
    families = pod_families(spec)
    if len(families) != 1:
        return None
    (family,) = families
    return family


def pod_gpu_requests(spec: Mapping[str, Any]) -> podrequests.PodRequests:
    """The pod's effective request of every GPU resource, counted as Kubernetes counts it.

    Sidecars add to the regular containers, an init container needs its own amount plus the
    sidecars started before it, the pod needs the largest of these (see `podrequests`).
    """
    return podrequests.pod_requests(spec, wanted=is_gpu_resource)


def pod_requests_gpu(spec: Mapping[str, Any]) -> bool:
    """Whether any container of the pod spec mentions a GPU resource."""
    return any(requests_gpu(ref.container) for ref in podspec.iter_containers(spec, spec_path=""))


# --- annotations ----------------------------------------------------------------------------------

# A pod's card-model constraint (read by `policies.gpu.cardmodel`). For the pods it places, the scheduler
# extender judges each card against it from the labeler's inventory; the other pods (`nvidia.com/gpu`,
# whose card the device plugin picks) get GPU102's node affinity on CARD_NAME_LABEL / CARD_MEMORY_MIB_LABEL.
GPU_MODEL_ANNOTATION = "gpu-admission.io/gpu-model"  # comma list; the card is one of these models
EXCLUDE_GPU_MODEL_ANNOTATION = "gpu-admission.io/exclude-gpu-model"  # comma list; the card is none of these
MIN_GPU_MEMORY_ANNOTATION = "gpu-admission.io/min-gpu-memory"  # MiB (or Gi); the card has at least this much

# Node annotations. The labeler writes the card inventory and the link topology (their one codec is
# `policies.gpu.inventory`); earlier versions of the scheduler extender kept their reservation ledger
# here (`policies.gpu.reservations`), still read during an upgrade.
INVENTORY_ANNOTATION = "gpu-admission.io/gpu-inventory"
TOPOLOGY_ANNOTATION = "gpu-admission.io/gpu-topology"
RESERVATIONS_ANNOTATION = "gpu-admission.io/reservations"
# The ledger's home since it left the Node: one Lease per GPU node in the extender's namespace
# (`policies.gpu.reservations.lease_body`), found by LEDGER_LABEL, naming its node in LEDGER_NODE_ANNOTATION
# and carrying the ledger in RESERVATIONS_ANNOTATION, the same JSON as on the Node.
LEDGER_LABEL = "gpu-admission.io/ledger"  # "true" on every ledger Lease (list/watch selector)
LEDGER_NODE_ANNOTATION = "gpu-admission.io/node"  # the node whose ledger a Lease is
# The one Node write the extender still makes: when cards it alone knew were held come free (a
# ledger entry dropped, a pod it counted gone) while pods it turned away may be waiting, it stamps
# this annotation (the time) so that kube-scheduler, which retries such pods on Node updates, tries
# them again (`webhook.extender.nudge`).
LEDGER_FREED_ANNOTATION = "gpu-admission.io/ledger-freed"


class AnnotationError(ValueError):
    """An annotation of the GPU model that cannot be read; the message is one line naming the key."""


def load_annotation(text: str, *, key: str) -> Any:
    """The JSON document an annotation of the GPU model holds; `AnnotationError` naming `key` when it is not JSON.

    The strict readers of every codec (`inventory`, `allocation`, `reservations`) start here, so a
    broken annotation is named the same way whichever one reads it.
    """
    try:
        return json.loads(text)
    except ValueError as error:
        raise AnnotationError(f"{key}: not JSON ({error})") from None


# gpushare-compatible pod annotations the scheduler extender writes on bind (DESIGN section 3).
GPUSHARE_MEM_IDX_ANNOTATION = "ALIYUN_COM_GPU_MEM_IDX"
GPUSHARE_MEM_POD_ANNOTATION = "ALIYUN_COM_GPU_MEM_POD"
GPUSHARE_MEM_DEV_ANNOTATION = "ALIYUN_COM_GPU_MEM_DEV"
GPUSHARE_MEM_ASSIGNED_ANNOTATION = "ALIYUN_COM_GPU_MEM_ASSIGNED"
GPUSHARE_MEM_ASSUME_TIME_ANNOTATION = "ALIYUN_COM_GPU_MEM_ASSUME_TIME"
# Our own JSON allocation (node, card indices, GiB and core percent per card), written beside them.
ALLOCATION_ANNOTATION = "gpu-admission.io/allocation"
# Every pod annotation the extender's accounting, the device plugin and `inspect` read a card
# allocation from: only a Binding from the extender may carry them (GPU008).
ALLOCATION_ANNOTATIONS: tuple[str, ...] = (
    GPUSHARE_MEM_IDX_ANNOTATION,
    GPUSHARE_MEM_POD_ANNOTATION,
    GPUSHARE_MEM_DEV_ANNOTATION,
    GPUSHARE_MEM_ASSIGNED_ANNOTATION,
    GPUSHARE_MEM_ASSUME_TIME_ANNOTATION,
    ALLOCATION_ANNOTATION,
)

# Pod annotation domains whose keys ask the node for devices (GPU010). A key is one of them when it
# is the domain itself or starts with the domain and `/` (`is_device_annotation`): keys are
# case-sensitive and every reader compares them exactly. The readers:
# - `cdi.k8s.io/`: CDI's annotation prefix (container-device-interface, pkg/cdi/annotations.go),
#   and the NVIDIA container runtime's default `annotation-prefixes`: it injects the CDI devices
#   such keys in the container's OCI spec name (`auto` mode switches to `cdi` for them). CRI-O
#   copies every pod annotation into each container's OCI spec; containerd does for the pod
#   annotations a runtime's `pod_annotations` patterns match.
# - `nvidia.cdi.k8s.io`: the NVIDIA container toolkit's NRI plugin injects the CDI devices named in
#   the pod's `nvidia.cdi.k8s.io/container.<name>`, `nvidia.cdi.k8s.io/pod` or
#   `nvidia.cdi.k8s.io` (containerd/nri GetEffectiveAnnotation); the toolkit's earlier NRI
#   plugin, like NRI's device-injector sample, read `cdi-devices.noderesource.dev` and
#   `cdi-devices.nri.io`.
# - `devices.noderesource.dev`, `devices.nri.io`, `mounts.noderesource.dev`, `mounts.nri.io`: NRI's
#   device-injector plugin adds any host device node or mount such a key names.
# Other GPU schedulers' node agents turn their scheduler's allocation, read from the pod's own
# annotations, into the container's devices; a tenant who writes one on their pod picks a card:
# - koordinator's `scheduling.koordinator.sh/device-allocated` (apis/extension/device_share.go):
#   koordlet's GPU hook sets NVIDIA_VISIBLE_DEVICES from it, its RDMA hook adds the listed
#   InfiniBand devices (pkg/koordlet/runtimehooks/hooks/gpu, hooks/rdma);
# - HAMi's device plugin decodes `hami.io/vgpu-devices-to-allocate` (and reads
#   `hami.io/vgpu-devices-allocated`, `hami.io/vgpu-mig-allocations`) of the pending pod its
#   `hami.io/vgpu-node` names (pkg/util/util.go GetPendingPod, plugin/util.go GetNextDeviceRequest);
# - Volcano: `volcano.sh/gpu-index` becomes NVIDIA_VISIBLE_DEVICES in its GPU-share device plugin
#   (volcano-sh/devices pkg/plugin/nvidia), `volcano.sh/devices-to-allocate` and
#   `volcano.sh/vgpu-ids-new` are its vGPU plugin's (volcano-vgpu-device-plugin pkg/util);
# - Intel's GPU plugin picks cards from `gas-container-cards` and `gas-container-tiles`;
# - node runtimes that act on pod annotations where the admin let them through: systemd unit
#   properties (`org.systemd.property.DeviceAllow=...` opens a device in the cgroup; runc and
#   crun read `org.systemd.property.*`), and Kata's `io.katacontainers.config.*` (VFIO hot and cold
#   plug, the hypervisor's binaries, kernel parameters, guest seccomp off).
# An entry ending in `.` is a prefix of plain keys; any other is a domain (`d` or `d/...`) or, with a
# `/` in it, one exact key.
DEVICE_ANNOTATION_DOMAINS: tuple[str, ...] = (
    "cdi.k8s.io",
    "nvidia.cdi.k8s.io",
    "cdi-devices.noderesource.dev",
    "cdi-devices.nri.io",
    "devices.noderesource.dev",
    "devices.nri.io",
    "mounts.noderesource.dev",
    "mounts.nri.io",
    "scheduling.koordinator.sh/device-allocated",
    "hami.io/vgpu-devices-to-allocate",
    "hami.io/vgpu-devices-allocated",
    "hami.io/vgpu-mig-allocations",
    "volcano.sh/gpu-index",
    "volcano.sh/devices-to-allocate",
    "volcano.sh/vgpu-ids-new",
    "gas-container-cards",
    "gas-container-tiles",
    "org.systemd.property.",
    "io.katacontainers.config.",
)


def is_device_annotation(key: object) -> bool:
    """Whether a pod annotation key asks the node for devices: a `DEVICE_ANNOTATION_DOMAINS` key."""
    if not isinstance(key, str):
        return False
    return any(key == d or key.startswith(d + "/") or (d.endswith(".") and key.startswith(d)) for d in DEVICE_ANNOTATION_DOMAINS)


# CRI-O's devices annotation (cri-o/cri-o, pkg/annotations/v2 `Devices` and its v1 spelling), read
# from the pod's annotations as `host[:container[:permissions]]` entries separated by commas
# (internal/config/device `DevicesFromAnnotation`) where the runtime handler allows the annotation;
# each host path must be in `allowed_devices`, by default only these two (pkg/config
# `DefaultRuntimeConfig`). GPU010 refuses any other device in it: an admin who adds a card's device
# node there would hand it to every pod that names it.
CRIO_DEVICES_ANNOTATIONS: tuple[str, ...] = ("devices.crio.io", "io.kubernetes.cri-o.Devices")
CRIO_DEFAULT_ALLOWED_DEVICES: frozenset[str] = frozenset({"/dev/fuse", "/dev/net/tun"})


def crio_extra_devices(value: object) -> list[str]:
    """The host devices a CRI-O devices annotation names beyond CRI-O's default allowed devices.

    CRI-O compares the host path exactly with `allowed_devices` and skips empty entries; a value
    that is not a string is returned as written, so it is refused rather than guessed at.
    """
    if not isinstance(value, str):
        return [repr(value)]
    found: list[str] = []
    for entry in value.split(","):
        source = entry.split(":", 1)[0]
        if entry and source not in CRIO_DEFAULT_ALLOWED_DEVICES:
            found.append(source)
    return found


# --- container environment ------------------------------------------------------------------------

VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
VISIBLE_DEVICES_VOID = "void"
# The values that expose no card. Compared case-insensitively after trimming.
VISIBLE_DEVICES_SAFE_VALUES: frozenset[str] = frozenset({"void", "none"})


def is_safe_visible_devices(value: object) -> bool:
    """Whether an NVIDIA_VISIBLE_DEVICES value exposes no card (`void` or `none`)."""
    return isinstance(value, str) and value.strip().lower() in VISIBLE_DEVICES_SAFE_VALUES


# The isolation variables: what the gpushare device plugin hands a container in its Allocate
# response (AliyunContainerService/gpushare-device-plugin, pkg/gpu/nvidia/allocate.go and const.go:
# the card index, the pod's and the container's GiB, the card's GiB, and `CGPU_DISABLE=true` only
# where the admin labels the node `cgpu.disable.isolation`), and what the cGPU isolation layer reads
# from the container's environment to size and place its instance (the cGPU README and ACK's "use
# Docker to install and use cGPU": `CGPU_DISABLE`, `ALIYUN_COM_GPU_MEM_DEV`,
# `ALIYUN_COM_GPU_MEM_CONTAINER`, `ALIYUN_COM_GPU_VISIBLE_DEVICES`, `ALIYUN_COM_GPU_SCHD_WEIGHT`,
# with `ALIYUN_COM_GPU_MEM_UNIT` beside them in ACK's own allocators). A pod's env is applied after
# the device plugin's, so a pod that sets any of these overrides what it was allocated: no
# isolation, a bigger share, another card. The pod may not set them at all.
ISOLATION_ENV: frozenset[str] = frozenset(
    {
        # The device plugin names these variables as the bind annotations it reads them from.
        GPUSHARE_MEM_IDX_ANNOTATION,
        GPUSHARE_MEM_POD_ANNOTATION,
        "ALIYUN_COM_GPU_MEM_CONTAINER",
        GPUSHARE_MEM_DEV_ANNOTATION,
        "ALIYUN_COM_GPU_MEM_UNIT",
        "ALIYUN_COM_GPU_VISIBLE_DEVICES",
        "ALIYUN_COM_GPU_SCHD_WEIGHT",
        "CGPU_DISABLE",
    }
)
# Every name a pod's environment must not deliver (GPU001), and no ConfigMap or Secret may carry as a
# key (GPU007): NVIDIA_VISIBLE_DEVICES (void/none excepted, by value only) and the isolation
# variables. Left out on purpose, from the NVIDIA container toolkit's hook
# (nvidia-container-runtime-hook, container_config.go): NVIDIA_DRIVER_CAPABILITIES and
# NVIDIA_REQUIRE_* choose driver libraries and checks, not cards; NVIDIA_MIG_CONFIG_DEVICES and
# NVIDIA_MIG_MONITOR_DEVICES make the hook refuse a container that is not privileged (and a
# privileged GPU pod is GPU002's); CUDA_VISIBLE_DEVICES only narrows what the container already has.
GUARDED_ENV: frozenset[str] = frozenset({VISIBLE_DEVICES_ENV, *ISOLATION_ENV})


def composed_guarded_env(prefix: str) -> frozenset[str]:
    """The guarded names an `envFrom` with `prefix` can compose from some key (prefix + key).

    Keys are never empty, so only names the prefix is a proper beginning of count; "" composes all
    of them (that case is GPU007's, which keeps every key equal to a guarded name out of sources).
    """
    return frozenset(name for name in GUARDED_ENV if name.startswith(prefix) and len(name) > len(prefix))


# --- label values ---------------------------------------------------------------------------------

_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


MAX_LABEL_VALUE = 63
_NOT_LABEL_SAFE = re.compile(r"[^A-Za-z0-9\-_. ]")
_JUNK_ENDS = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$")
_MIG_MARK = "-MIG-"


def card_name_label_value(model_name: str) -> str:
    """A card model as the `aliyun.accelerator/nvidia_name` label spells it; "" when nothing is left.

    GPU Feature Discovery's rule made safe for any input: characters outside `[A-Za-z0-9-_. ]` are
    dropped and runs of spaces become one `-` (`Tesla V100-SXM2-32GB` becomes `Tesla-V100-SXM2-32GB`,
    `NVIDIA TITAN X (Pascal)` becomes `NVIDIA-TITAN-X-Pascal`). Then, unlike GFD, the value is cut to
    63 characters keeping a `-MIG-<profile>` suffix whole (the idea of NVIDIA/k8s-device-plugin
    PR #1880) and trimmed to alphanumeric ends. The labeler writes names with this, and GPU102
    spells the card models pods ask for with it, so the two always compare equal.
    """
    value = _trim("-".join(_NOT_LABEL_SAFE.sub("", model_name).split()))
    if len(value) > MAX_LABEL_VALUE:
        value = _shorten(value)
    return value


def _trim(value: str) -> str:
    return _JUNK_ENDS.sub("", value)


def _shorten(value: str) -> str:
    head, mark, profile = value.rpartition(_MIG_MARK)
    if mark:
        suffix = mark + profile
        room = MAX_LABEL_VALUE - len(suffix)
        model = _trim(head[:room]) if room > 0 else ""
        if model:
            return model + suffix
    return _trim(value[:MAX_LABEL_VALUE])


def is_label_value(value: str) -> bool:
    """Whether `value` is a valid Kubernetes label value (63 characters, alphanumeric ends)."""
    return _LABEL_VALUE.match(value) is not None
