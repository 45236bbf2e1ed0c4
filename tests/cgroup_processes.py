"""Real processes in real cgroups with the path shapes a kubelet and container runtimes make (tests only).

Needs root and a writable cgroup filesystem at /sys/fs/cgroup (v2, v1 or hybrid); `hierarchies()`
is empty where cgroups cannot be created, and tests skip with that reason.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def hierarchies() -> list[tuple[str, Path]]:
    """(kind, mount) of the writable hierarchies here: the v2 one, and one v1 controller."""
    if os.geteuid() != 0 or not CGROUP_ROOT.is_dir():
        return []
    found: list[tuple[str, Path]] = []
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        found.append(("v2", CGROUP_ROOT))
    elif (CGROUP_ROOT / "unified" / "cgroup.controllers").exists():
        found.append(("v2", CGROUP_ROOT / "unified"))
    for controller in ("pids", "cpu", "memory"):
        if (CGROUP_ROOT / controller / "cgroup.procs").exists():
            found.append(("v1", CGROUP_ROOT / controller))
            break
    return [(kind, mount) for kind, mount in found if can_create(mount)]


def can_create(mount: Path) -> bool:
    probe = mount / f"gpu-admission-probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
    except OSError:
        return False
    probe.rmdir()
    return True


def systemd_pod_path(pod_uid: str, container_id: str, *, tag: str) -> str:
    """A kubelet systemd-driver path (Burstable, containerd), under a test-unique top slice."""
    escaped = pod_uid.replace("-", "_")
    return (
        f"kubepods{tag}.slice/kubepods{tag}-burstable.slice/kubepods{tag}-burstable-pod{escaped}.slice/"
        f"cri-containerd-{container_id}.scope"
    )


def docker_run_path(container_id: str, *, tag: str) -> str:
    """What `docker run` gives a container with the systemd cgroup driver, under a test-unique slice."""
    return f"gpu-admission-test-{tag}.slice/docker-{container_id}.scope"


@contextlib.contextmanager
def process_in(mount: Path, relative: str) -> Iterator[int]:
    """A `sleep` moved into the cgroup `mount/relative` (created here); everything undone after."""
    created: list[Path] = []
    here = mount
    for part in relative.strip("/").split("/"):
        here = here / part
        if not here.exists():
            here.mkdir()
            created.append(here)
    process = subprocess.Popen(["sleep", "600"])  # noqa: S607 - coreutils sleep from PATH
    try:
        (here / "cgroup.procs").write_text(str(process.pid))
        yield process.pid
    finally:
        process.kill()
        process.wait()
        for path in reversed(created):
            with contextlib.suppress(OSError):
                path.rmdir()
