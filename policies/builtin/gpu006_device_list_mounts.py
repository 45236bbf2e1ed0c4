"""GPU006: no container mounts anything at the NVIDIA toolkit's device-list path.

With `accept-nvidia-visible-devices-as-volume-mounts = true` (the strategy that makes the toolkit
ignore `NVIDIA_VISIBLE_DEVICES` in unprivileged containers), the toolkit reads the container's
mounts before its environment: every mount whose source is `/dev/null` and whose destination
starts with `/var/run/nvidia-container-devices` requests the device named by the rest of the
destination (`.../all`, `.../0`, `.../GPU-<uuid>`, `.../cdi/<vendor>/<class>/<device>`,
`.../imex/<channel>`). NVIDIA/nvidia-container-toolkit, internal/config/image/cuda_image.go
(`DeviceListAsVolumeMountsRoot`, `requestsFromMounts`), shows exactly how:

- source and destination are cleaned (`filepath.Clean`: `..`, `.`, repeated and trailing slashes);
- the source must be `/dev/null`: a hostPath volume, or any volume a PersistentVolume backs with it;
- the destination is matched with a string prefix, not a path prefix, so
  `/var/run/nvidia-container-devicesall` names device `all` too;
- only mount destinations are read: a mount at a parent (`/var/run`, `/run`) holding such files is
  not a device request, so parents are not refused (an emptyDir at `/var/run` is common);
- the `/run/...` spelling is not read (the OCI spec keeps the destination as written), but nothing
  legitimate mounts there either, so it is refused as well, in case a runtime resolves the link.

This policy refuses any volumeMount (every volume type, since the kubelet decides the mount source
and a PersistentVolume can point at `/dev/null`) and any volumeDevices entry (block devices reach
the runtime as devices, not mounts, so the toolkit does not read them today; nothing legitimate
goes there) whose path, cleaned and read from `/`, starts with either spelling. It judges every
container kind: init, sidecar, regular and ephemeral (including the `ephemeralcontainers`
subresource), and pod templates of workloads.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable

from policies import applicability, podspec, policy

# The toolkit's DeviceListAsVolumeMountsRoot, and the same directory through the /var/run link.
DEVICE_LIST_ROOT = "/var/run/nvidia-container-devices"
DEVICE_LIST_PREFIXES: tuple[str, ...] = (DEVICE_LIST_ROOT, "/run/nvidia-container-devices")
_NAME = applicability.DEVICE_LIST_NAME  # "nvidia-container-devices", one definition for the pre-check too


def clean(path: str) -> str:
    """`path` as the toolkit cleans it, read from `/` when relative."""
    return "/" + posixpath.normpath("/" + path).lstrip("/")


def device_request(path: str) -> str | None:
    """The device a mount at `path` requests ('' for the directory itself); None when it requests none."""
    if _NAME not in path:  # cleaning keeps components as written, so the name must be there already
        return None
    cleaned = clean(path)
    for prefix in DEVICE_LIST_PREFIXES:
        if cleaned.startswith(prefix):
            return cleaned[len(prefix) :].strip("/")
    return None


class DeviceListMounts(policy.ContainerValidator):
    """Refuses mounts and devices at the toolkit's device-list path, in every container."""

    id = "GPU006"
    summary = "no container may mount anything at the NVIDIA device-list path /var/run/nvidia-container-devices"

    def relevant(self, context: policy.Context, facts: applicability.Facts) -> bool:
        """Only where a container in scope mounts a path that names the device-list directory."""
        del context
        return facts.scope_device_list_mounts

    def check_container(self, context: policy.Context, container: podspec.ContainerRef) -> Iterable[policy.Finding]:
        """A finding per mount or device entry at the device-list path."""
        del context
        findings: list[policy.Finding] = []
        for field, key in (("volumeMounts", "mountPath"), ("volumeDevices", "devicePath")):
            for index, entry in enumerate(podspec.sequence(container.container.get(field))):
                path = podspec.mapping(entry).get(key)
                if not isinstance(path, str):
                    continue
                device = device_request(path)
                if device is None:
                    continue
                name = podspec.mapping(entry).get("name")
                volume = f'volume "{name}"' if isinstance(name, str) and name else f"{field}[{index}]"
                cleaned = clean(path)
                shown = cleaned if cleaned == path else f"{cleaned} (written {path!r})"
                asks = f'GPU "{device}"' if device else "the device-list directory"
                findings.append(
                    policy.Finding(
                        detail=(
                            f"{container.label} mounts {volume} at {shown}, which the NVIDIA container toolkit "
                            f"reads as a request for {asks}; request GPUs as resources (nvidia.com/gpu, "
                            "aliyun.com/gpu-mem) instead"
                        )
                    )
                )
        return findings
