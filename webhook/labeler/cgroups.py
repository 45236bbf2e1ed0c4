"""Which pod and container a process belongs to, from its `/proc/<pid>/cgroup`.

`parse` is pure (the text of the file in, an `Identity` out); `read` is the thin reader, with the
proc root a parameter so tests and a labeler that mounts the host's `/proc` elsewhere can point it
anywhere.

The path shapes come from the kubelet and the runtimes (kubernetes `pkg/kubelet/cm`:
`cgroup_manager_linux.go` names a pod's cgroup `pod<UID>` under `kubepods[/<qos>]`, and for the
systemd driver escapes `-` to `_` and expands the name into nested slices; the runtimes name a
container's scope `cri-containerd-<id>.scope` (containerd), `crio-<id>.scope` (CRI-O),
`docker-<id>.scope` (Docker/cri-dockerd), and put it under the pod's cgroup as `<id>` with the
cgroupfs driver):

| driver | example path |
|---|---|
| systemd | `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6f0c_..slice/cri-containerd-<64 hex>.scope` |
| systemd, Guaranteed | `/kubepods.slice/kubepods-pod6f0c_..slice/crio-<64 hex>.scope` |
| cgroupfs | `/kubepods/burstable/pod6f0c-../<64 hex>` (Guaranteed: `/kubepods/pod<uid>/<id>`) |
| kubelet in a container (kind) | `/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/...` |

Outside Kubernetes: `docker run` gives `/system.slice/docker-<id>.scope` (systemd) or
`/docker/<id>` (cgroupfs), `ctr run` gives `/<namespace>/<id>` (e.g. `/default/<id>`), podman
`libpod-<id>.scope`; none of those has a pod segment, so such a process is out-of-band, with its
container ID where the path shows one.

Read from inside a container with a private cgroup namespace (the default with cgroup v2), the
kernel shows another process's path relative to the reader's own cgroup, climbing out with `..`
(`0::/../../kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope`); `..` segments are
skipped, so this reads the same.

cgroup v1 lists one line per hierarchy (`4:memory:/kubepods/...`); cgroup v2 one line (`0::/...`);
a hybrid host has both, and the v2 line may be `/` while the v1 lines carry the path. The first
line that names a pod wins; failing that, the first that names a container. A pod UID is a UUID
(API pods) or 32 hex digits (static pods: the kubelet uses the config hash as their UID, which the
mirror pod carries as the annotation `kubernetes.io/config.hash`).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

DEFAULT_PROC_ROOT = Path("/proc")

_UUID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_POD = re.compile(rf"(?:^|-)pod({_UUID}|[0-9a-f]{{32}})(?:\.slice)?$")
_SCOPE = re.compile(r"^(?:cri-containerd|crio|docker|libpod|containerd)-([0-9a-f]{64})\.scope$")
_BARE_ID = re.compile(r"^[0-9a-f]{64}$")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Identity:
    """What a process's cgroup says: its pod's UID and its container's ID ("" where it names none)."""

    pod_uid: str = ""
    container_id: str = ""
    path: str = ""  # the cgroup path the answer came from

    @property
    def in_pod(self) -> bool:
        return bool(self.pod_uid)


def parse_path(path: str) -> Identity:
    """The pod and container a single cgroup path names."""
    segments = [segment for segment in path.strip().split("/") if segment]
    pod_uid = ""
    container_id = ""
    under_kubepods = False
    for segment in segments:
        lowered = segment.lower()
        if "kubepods" in lowered:
            under_kubepods = True
        match = _POD.search(lowered)
        if match is not None and under_kubepods:
            pod_uid = match.group(1).replace("_", "-")
            continue
        scope = _SCOPE.match(lowered)
        if scope is not None:
            container_id = scope.group(1)
        elif _BARE_ID.match(lowered):
            container_id = lowered
    return Identity(pod_uid=pod_uid, container_id=container_id, path=path.strip())


def parse(text: str) -> Identity:
    """The identity in the text of `/proc/<pid>/cgroup` (v1, v2 or hybrid); empty when none."""
    first_container: Identity | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        found = parse_path(parts[2])
        if found.pod_uid:
            return found
        if found.container_id and first_container is None:
            first_container = found
    return first_container or Identity(path=_first_path(text))


def _first_path(text: str) -> str:
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[0] == "0":
            return parts[2].strip()
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            return parts[2].strip()
    return ""


def read(pid: int, *, proc_root: Path = DEFAULT_PROC_ROOT) -> Identity | None:
    """The identity of process `pid`; None when its cgroup file cannot be read (gone, no access)."""
    if pid <= 0:
        return None
    try:
        text = (proc_root / str(pid) / "cgroup").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return parse(text)
