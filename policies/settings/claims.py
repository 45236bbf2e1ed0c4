"""`dra`: which drivers and DeviceClasses hand out GPUs, who may claim them, where adminAccess goes."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from policies.gpu import dra
from policies.settings import selection, shapes


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClaimGrant:
    """GPU DeviceClasses the namespaces `match` selects may claim through DRA."""

    name: str
    match: selection.NamespaceMatch
    classes: frozenset[str]


DEFAULT_GPU_CLASSES = frozenset({"gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com"})


@dataclasses.dataclass(frozen=True, kw_only=True)
class DraSettings:
    """`dra`: which drivers and DeviceClasses hand out GPUs, who may claim them, where adminAccess goes."""

    gpu_drivers: tuple[str, ...] = (dra.NVIDIA_DRIVER,)
    gpu_classes: frozenset[str] = DEFAULT_GPU_CLASSES
    claims: tuple[ClaimGrant, ...] = ()
    admin_namespaces: frozenset[str] = frozenset()

    def may_claim(self, class_name: str, *, namespace: str, namespace_labels: Mapping[str, str] | None = None) -> bool:
        """Whether `namespace` may claim devices of the GPU class `class_name`."""
        labels = selection.labels_of_namespace(namespace, namespace_labels)
        return any(class_name in g.classes and g.match.matches(namespace, labels) for g in self.claims)


def read(value: object) -> DraSettings:
    if value is None:
        return DraSettings()
    if not isinstance(value, Mapping):
        raise shapes.InvalidSettings(
            f"dra: must be a mapping with gpuDrivers, gpuClasses, claims, adminNamespaces; got {value!r}"
        )
    shapes.keys(value, field="dra", known=("gpuDrivers", "gpuClasses", "claims", "adminNamespaces"))
    grants: list[ClaimGrant] = []
    for field, entry in shapes.entries(
        value.get("claims") or [], field="dra.claims", known=("name", "namespaces", "namespaceSelector", "classes")
    ):
        name, match = selection.anchored_entry(entry, field=field)
        grants.append(
            ClaimGrant(name=name, match=match, classes=frozenset(shapes.strings(entry.get("classes"), field=f"{field}.classes")))
        )
    admins = value.get("adminNamespaces")
    return DraSettings(
        gpu_drivers=shapes.strings(value["gpuDrivers"], field="dra.gpuDrivers")
        if "gpuDrivers" in value
        else (dra.NVIDIA_DRIVER,),
        gpu_classes=frozenset(shapes.strings(value["gpuClasses"], field="dra.gpuClasses"))
        if "gpuClasses" in value
        else DEFAULT_GPU_CLASSES,
        claims=tuple(grants),
        admin_namespaces=frozenset() if admins is None else shapes.namespace_names(admins, field="dra.adminNamespaces"),
    )
