"""DRA objects that unit and end-to-end tests build alike: a test driver's ResourceSlice, claims."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from policies.gpu import dra

GPU_CLASS = "gpu.nvidia.com"


def slice_for(
    node: str, uuids: Sequence[str], *, parents: Sequence[tuple[str, str, str]] = (), gib: int | None = None
) -> dict[str, Any]:
    """What a driver publishes for `node` (pool = the node's name): one `gpu-<i>` device per card
    UUID, as NVIDIA's driver names them, and MIG devices as (name, MIG UUID, parent card UUID)."""
    devices: list[dict[str, Any]] = []
    for i, uuid in enumerate(uuids):
        device: dict[str, Any] = {"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}, "uuid": {"string": uuid}}}
        if gib is not None:
            device["capacity"] = {"memory": {"value": f"{gib}Gi"}}
        devices.append(device)
    for name, uuid, parent in parents:
        devices.append(
            {"name": name, "attributes": {"type": {"string": "mig"}, "uuid": {"string": uuid}, "parentUUID": {"string": parent}}}
        )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu.nvidia.com"},
        "spec": {
            "driver": dra.NVIDIA_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def claim(
    name: str,
    *,
    namespace: str = "",
    kind: str = "ResourceClaim",
    class_name: str = GPU_CLASS,
    allocated: tuple[str, str] | None = None,
    uid: str = "",
    **result: Any,
) -> dict[str, Any]:
    """A claim (or template) of one device of `class_name`; `allocated` = (pool, device) adds the
    allocation the scheduler writes, with `result`'s extra fields (adminAccess, consumedCapacity...)."""
    spec = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": class_name}}]}}
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    if uid:
        metadata["uid"] = uid
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": kind,
        "metadata": metadata,
        "spec": {"spec": spec} if kind == "ResourceClaimTemplate" else spec,
    }
    if allocated is not None:
        pool, device = allocated
        obj["status"] = {
            "allocation": {
                "devices": {
                    "results": [{"driver": dra.NVIDIA_DRIVER, "pool": pool, "device": device, "request": "gpu", **result}]
                }
            }
        }
    return obj
