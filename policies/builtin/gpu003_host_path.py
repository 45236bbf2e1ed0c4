"""GPU003: no hostPath volume exposes GPU devices or their control sockets.

Protected: the device nodes (`/dev/nvidia*`, `/dev/dri`), the driver and toolkit runtime
directories (`/run/nvidia*`, `/var/run/nvidia*`), and the kubelet's device-plugin and pod-resources
sockets, through which a pod could register fake devices or read every pod's allocation.

A path is refused when it equals one of these, lies under one, or is a parent of one (`/`, `/dev`,
`/run`, `/var`, `/var/run`, `/var/lib`, `/var/lib/kubelet`), after normalisation: repeated and
trailing slashes, `.` and `..` are resolved, and a relative path is read from `/`. Other children
of `/dev` (such as `/dev/shm`) expose no GPU and are allowed.
"""

from __future__ import annotations

import fnmatch
import posixpath
from collections.abc import Iterable

from policies import podspec, policy

PROTECTED_PATHS: tuple[str, ...] = (
    "/dev/nvidia*",
    "/dev/dri",
    "/run/nvidia*",
    "/var/run/nvidia*",
    "/var/lib/kubelet/device-plugins",
    "/var/lib/kubelet/pod-resources",
)


def normalise(path: str) -> str:
    """An absolute path with `.`, `..`, repeated and trailing slashes resolved."""
    normal = posixpath.normpath("/" + path)
    return "/" + normal.lstrip("/")


def _components(path: str) -> list[str]:
    return [part for part in path.split("/") if part]


def exposes_gpu(path: str) -> str | None:
    """The protected path that `path` equals, lies under or contains; None if it is safe."""
    parts = _components(normalise(path))
    for protected in PROTECTED_PATHS:
        pattern = _components(protected)
        if all(fnmatch.fnmatchcase(p, q) for p, q in zip(parts, pattern, strict=False)):
            return protected
    return None


class HostPathDevices(policy.PodValidator):
    """Refuses hostPath volumes on GPU device nodes, runtime directories and kubelet sockets."""

    id = "GPU003"
    summary = "hostPath volumes must not expose GPU devices or their control sockets"

    def check_pod(self, context: policy.Context) -> Iterable[policy.Finding]:
        """A finding per offending hostPath volume."""
        findings: list[policy.Finding] = []
        for index, volume in podspec.volumes(context.template.spec):
            path = podspec.mapping(volume.get("hostPath")).get("path")
            if not isinstance(path, str):
                continue
            protected = exposes_gpu(path)
            if protected is None:
                continue
            name = volume.get("name") if isinstance(volume.get("name"), str) else f"volumes[{index}]"
            normal = normalise(path)
            shown = normal if normal == path else f"{normal} (written {path!r})"
            findings.append(
                policy.Finding(detail=f'volume "{name}" mounts hostPath {shown}, covering {protected}')
            )
        return findings
