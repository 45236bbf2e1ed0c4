"""The GPU scheduler a cluster runs: one frozen profile per scheduler, what each one means to the rules.

gpu-admission is the gate in front of a GPU scheduler. Its own (`gpushare`: the scheduler extender
of this project with the gpushare device plugin) is the default; a cluster that shares cards with
HAMi, Volcano, koordinator or KAI-Scheduler names that one in the settings (`scheduler`). Every
fact the rules need about a scheduler lives in its `Profile` here, taken from the scheduler's own
sources (files and versions cited beside each profile):

- `gpu_resources`: the extended resources that mean "this container uses a GPU" beyond the
  built-in list (`gpu.is_gpu_resource`). They join `trustZone.gpuResources`, so the trust zone's
  `reach` (GPU002, GPU003, GPU103), GPU104's `void` and every reader of the zone follow;
- `gpu_annotations`: pod annotations that ask for a GPU without any resource (KAI's fractions).
  No rule lets such a pod through: KAI hands a fraction its card by a ConfigMap whose name the
  pod's own annotation gives, which GPU001 and GPU007 refuse (docs/schedulers/kai.md says why
  that stays so);
- `writer_annotations`: the device annotations (all of them `gpu.DEVICE_ANNOTATION_DOMAINS` keys,
  which GPU010 refuses) that the scheduler, or its device plugin, writes on a pod by UPDATE. GPU010
  lets `writers` (named service accounts, matched exactly against the request's
  `userInfo.username`) change them; anyone else, a tenant's create or update included, stays
  refused. `default_writers` are the service accounts the scheduler's own chart installs;
- `skipped`: the policies that assume this project's extender and do not apply (the mode
  selectors GPU101/GPU005, GPU008's extender bypass, GPU105's scheduler name, the GPU budgets'
  gate and warning GPU107/GPU013/GPU014);
- `ours`, `audit` and `notice`: whether this project's extender and audit account the cards
  (only `gpushare`); for every other profile they do not read its allocations, and `explain`,
  `audit`, `inspect` and the extender say so in one line (`Profile.notice`).

Pure data: the settings (`policies.settings`) pick a profile and its writers.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Mapping

SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"


class Name(enum.StrEnum):
    """The profiles the `scheduler` setting may name."""

    GPUSHARE = "gpushare"
    HAMI = "hami"
    VOLCANO = "volcano"
    KOORDINATOR = "koordinator"
    KAI = "kai"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServiceAccount:
    """A service account, anchored to its namespace: only a token of exactly this account matches."""

    namespace: str
    name: str

    @property
    def username(self) -> str:
        """The username the apiserver puts in `userInfo` for this account's tokens."""
        return f"{SERVICE_ACCOUNT_PREFIX}{self.namespace}:{self.name}"

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


# The policies that assume this project's extender and node modes. GPU013, GPU014 and GPU107 are
# the GPU budgets', which only this project's extender keeps: in front of another scheduler nothing
# would lift the budget gate.
EXTENDER_POLICIES: frozenset[str] = frozenset({"GPU005", "GPU008", "GPU013", "GPU014", "GPU101", "GPU105", "GPU107"})


@dataclasses.dataclass(frozen=True, kw_only=True)
class Profile:
    """What one GPU scheduler means to the rules; see the module docstring."""

    name: Name
    title: str
    ours: bool = False  # True only for gpushare: the extender and the audit account its cards
    gpu_resources: tuple[str, ...] = ()
    gpu_annotations: tuple[str, ...] = ()
    writer_annotations: tuple[str, ...] = ()
    default_writers: tuple[ServiceAccount, ...] = ()
    skipped: frozenset[str] = EXTENDER_POLICIES
    scheduler_names: tuple[str, ...] = ()  # the schedulerName its pods carry (documentation, explain)
    audit: str = ""
    source: str = ""

    @property
    def notice(self) -> str:
        """One line for `explain`, `inspect` and the extender: whose accounting the cluster's cards are."""
        if self.ours:
            return ""
        return (
            f"scheduler profile {self.name}: cards are placed and accounted by {self.title}, not by this "
            f"project's extender; {self.audit}"
        )


_NOT_AUDITED = "the audit does not read its allocations (GPU210 and the usage report see none of its pods)"

GPUSHARE = Profile(
    name=Name.GPUSHARE,
    title="the gpu-admission scheduler extender",
    ours=True,
    skipped=frozenset(),
    scheduler_names=("default-scheduler",),
    audit="the audit reads the extender's allocation annotations (GPU210)",
    source="this project (webhook/extender)",
)

# HAMi v2.10.0 (Project-HAMi/HAMi):
# - resources: charts/hami/values.yaml `resourceName` nvidia.com/gpu, `resourceMem`
#   nvidia.com/gpumem, `resourceMemPercentage` nvidia.com/gpumem-percentage, `resourceCores`
#   nvidia.com/gpucores (examples/nvidia/default_use.yaml);
# - pkg/scheduler/scheduler.go Filter patches `hami.io/vgpu-node`, `hami.io/vgpu-time` and, per
#   device kind, `InRequestDevices` / `SupportDevices` (pkg/device/nvidia/device.go:
#   `hami.io/vgpu-devices-to-allocate`, `hami.io/vgpu-devices-allocated`; mig_allocations.go:
#   `hami.io/vgpu-mig-allocations`) with a merge patch of the pod (pkg/util/util.go
#   PatchPodAnnotations): an UPDATE from the scheduler's service account, `hami-scheduler`
#   (charts/hami/templates/_helpers.tpl `hami-vgpu.scheduler`); Bind patches `hami.io/bind-phase`
#   and `hami.io/bind-time` before the Binding;
# - the device plugin (`hami-device-plugin`, `hami-vgpu.device-plugin`) erases what it allocated
#   from `hami.io/vgpu-devices-to-allocate` (pkg/device-plugin/nvidiadevice/nvinternal/plugin/util.go
#   patchErasedAnnotation) and sets `hami.io/bind-phase`.
# The chart installs into the release namespace; HAMi's install guide uses kube-system.
HAMI = Profile(
    name=Name.HAMI,
    title="HAMi (hami-scheduler and its device plugin)",
    gpu_resources=("nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores"),
    writer_annotations=(
        "hami.io/vgpu-devices-to-allocate",
        "hami.io/vgpu-devices-allocated",
        "hami.io/vgpu-mig-allocations",
    ),
    default_writers=(
        ServiceAccount(namespace="kube-system", name="hami-scheduler"),
        ServiceAccount(namespace="kube-system", name="hami-device-plugin"),
    ),
    scheduler_names=("hami-scheduler",),
    audit=_NOT_AUDITED,
    source="Project-HAMi/HAMi v2.10.0",
)

# Volcano v1.15 (volcano-sh/volcano) with the vGPU device plugin v1.12.0
# (Project-HAMi/volcano-vgpu-device-plugin):
# - resources: pkg/scheduler/api/devices/config/vgpu.go `volcano.sh/vgpu-memory`,
#   `volcano.sh/vgpu-memory-percentage`, `volcano.sh/vgpu-cores`, `volcano.sh/vgpu-number`
#   (examples/vgpu-case01.yml of the device plugin); the older GPU-share plugin's
#   pkg/scheduler/api/devices/nvidia/gpushare/type.go `volcano.sh/gpu-memory`, `volcano.sh/gpu-number`;
# - the scheduler (service account `volcano-scheduler` in volcano-system,
#   installer/volcano-development.yaml) patches `volcano.sh/vgpu-ids-new`,
#   `volcano.sh/devices-to-allocate`, `volcano.sh/vgpu-node`, `volcano.sh/vgpu-time`
#   (pkg/scheduler/api/devices/nvidia/vgpu/type.go; devices/util.go PatchPodAnnotations) or, for
#   GPU share, `volcano.sh/gpu-index` (gpushare/type.go);
# - the vGPU device plugin (`volcano-device-plugin` in kube-system, the chart's values.yaml)
#   rewrites `volcano.sh/devices-to-allocate` as it allocates (pkg/util/util.go EraseNextDeviceTypeFromAnnotation).
VOLCANO = Profile(
    name=Name.VOLCANO,
    title="Volcano (volcano-scheduler and the vGPU or GPU-share device plugin)",
    gpu_resources=(
        "volcano.sh/vgpu-memory",
        "volcano.sh/vgpu-memory-percentage",
        "volcano.sh/vgpu-cores",
        "volcano.sh/vgpu-number",
        "volcano.sh/gpu-memory",
        "volcano.sh/gpu-number",
    ),
    writer_annotations=("volcano.sh/vgpu-ids-new", "volcano.sh/devices-to-allocate", "volcano.sh/gpu-index"),
    default_writers=(
        ServiceAccount(namespace="volcano-system", name="volcano-scheduler"),
        ServiceAccount(namespace="kube-system", name="volcano-device-plugin"),
    ),
    scheduler_names=("volcano",),
    audit=_NOT_AUDITED,
    source="volcano-sh/volcano v1.15, Project-HAMi/volcano-vgpu-device-plugin v1.12.0",
)

# koordinator v1.8.0 (koordinator-sh/koordinator):
# - resources: apis/extension/device_share.go `koordinator.sh/gpu`, `koordinator.sh/gpu.shared`,
#   `koordinator.sh/gpu-core`, `koordinator.sh/gpu-memory`, `koordinator.sh/gpu-memory-ratio`, and
#   their deprecated `kubernetes.io/` spellings (apis/extension/deprecated.go);
# - koord-scheduler's DeviceShare plugin sets `scheduling.koordinator.sh/device-allocated` in
#   PreBind (pkg/scheduler/plugins/deviceshare/plugin.go preBindObject, apiext.SetDeviceAllocations)
#   and the DefaultPreBind plugin patches the pod (pkg/scheduler/plugins/defaultprebind/plugin.go
#   applyPodPatch, util.PatchPodSafe: an UPDATE) as the scheduler's service account,
#   `koord-scheduler` in koordinator-system (config/rbac/service_account.yaml `scheduler` with
#   config/default/kustomization.yaml's namePrefix `koord-` and namespace);
# - koordlet turns that annotation into NVIDIA_VISIBLE_DEVICES (pkg/koordlet/runtimehooks/hooks/gpu).
KOORDINATOR = Profile(
    name=Name.KOORDINATOR,
    title="koordinator (koord-scheduler's DeviceShare and koordlet)",
    gpu_resources=(
        "koordinator.sh/gpu",
        "koordinator.sh/gpu.shared",
        "koordinator.sh/gpu-core",
        "koordinator.sh/gpu-memory",
        "koordinator.sh/gpu-memory-ratio",
        "kubernetes.io/gpu",
        "kubernetes.io/gpu-core",
        "kubernetes.io/gpu-memory",
        "kubernetes.io/gpu-memory-ratio",
    ),
    writer_annotations=("scheduling.koordinator.sh/device-allocated",),
    default_writers=(ServiceAccount(namespace="koordinator-system", name="koord-scheduler"),),
    scheduler_names=("koord-scheduler",),
    audit=_NOT_AUDITED,
    source="koordinator-sh/koordinator v1.8.0",
)

# KAI-Scheduler v0.12.17 (NVIDIA/KAI-Scheduler 6f8c8d7d; the files below are the same at 72de64fc):
# - pkg/common/constants/constants.go: whole cards are `nvidia.com/gpu`; a fraction is asked for by
#   the pod annotations `gpu-fraction` (docs/gpu-sharing/gpu-sharing.yaml: "0.5") or `gpu-memory`
#   (MiB, docs/gpu-sharing/gpu-memory.yaml), with `gpu-fraction-num-devices` and
#   `gpu-fraction-container-name` beside them; the scheduler's name is `kai-scheduler`;
# - KAI's pod webhook (pkg/admission/webhook/v1alpha2/gpusharing/gpu_sharing.go Mutate, at CREATE)
#   points the fraction container's NVIDIA_VISIBLE_DEVICES at the ConfigMap named by the pod's
#   annotation `runai/shared-gpu-configmap` (kept if the pod carries one, else made up:
#   pkg/binder/common/gpusharingconfigmap/config_map.go), and the binder (service account `binder`)
#   writes the card into it (pkg/binder/common/gpu_access.go AddGPUSharingEnvVars,
#   SetNvidiaVisibleDevices), re-owning a ConfigMap of that name another pod owns (config_map.go
#   patchConfigMap). No pod annotation carries devices, so GPU010 has nothing of KAI's to let through;
#   and since nothing binds the ConfigMap to one pod, GPU001 and GPU007 keep refusing that shape here
#   too (docs/schedulers/kai.md gives the evidence).
KAI = Profile(
    name=Name.KAI,
    title="KAI-Scheduler (kai-scheduler and its binder)",
    gpu_annotations=("gpu-fraction", "gpu-memory"),
    scheduler_names=("kai-scheduler",),
    audit=_NOT_AUDITED,
    source="NVIDIA/KAI-Scheduler v0.12.17",
)

PROFILES: Mapping[Name, Profile] = {p.name: p for p in (GPUSHARE, HAMI, VOLCANO, KOORDINATOR, KAI)}
DEFAULT = GPUSHARE

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def is_namespace_name(value: str) -> bool:
    """Whether `value` is a namespace name (a DNS label of at most 63 characters)."""
    return len(value) <= 63 and _DNS_LABEL.match(value) is not None


def is_service_account_name(value: str) -> bool:
    """Whether `value` is a service account name (a DNS subdomain of at most 253 characters)."""
    return len(value) <= 253 and _SUBDOMAIN.match(value) is not None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Scheduler:
    """The `scheduler` setting: the profile and who may write its device annotations."""

    profile: Profile = DEFAULT
    writers: tuple[ServiceAccount, ...] = ()

    def may_write(self, username: str) -> bool:
        """Whether a request's `userInfo.username` is one of the trusted writers (exact match)."""
        return any(username == writer.username for writer in self.writers)

    def writes(self, key: str) -> bool:
        """Whether `key` is a device annotation this scheduler writes (for its trusted writers only)."""
        return key in self.profile.writer_annotations


DEFAULT_SCHEDULER = Scheduler()
# The schedulerName the apiserver gives a pod that names none (GPU105 and GPU008 read it as that).
DEFAULT_SCHEDULER_NAME = "default-scheduler"
