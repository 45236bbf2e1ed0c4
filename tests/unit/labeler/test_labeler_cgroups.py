"""Process -> pod: the cgroup path shapes of the kubelet's two drivers and the runtimes, then real
processes in real cgroups created with those shapes."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from tests import cgroup_processes
from webhook.labeler import cgroups

UID = "6f0c2a1e-9b7d-4c3e-8a5f-1d2e3f4a5b6c"
ESC = UID.replace("-", "_")
CID = "3f1e" + "a" * 60
STATIC = "d41d8cd98f00b204e9800998ecf8427e"  # a static pod's UID: the kubelet's config hash


@pytest.mark.parametrize(
    ("text", "pod_uid", "container_id"),
    [
        pytest.param(
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{ESC}.slice/cri-containerd-{CID}.scope\n",
            UID,
            CID,
            id="v2-systemd-containerd-burstable",
        ),
        pytest.param(
            f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{ESC}.slice/crio-{CID}.scope\n",
            UID,
            CID,
            id="v2-systemd-crio-besteffort",
        ),
        pytest.param(
            f"0::/kubepods.slice/kubepods-pod{ESC}.slice/docker-{CID}.scope\n", UID, CID, id="v2-systemd-docker-guaranteed"
        ),
        pytest.param(f"0::/kubepods/burstable/pod{UID}/{CID}\n", UID, CID, id="v2-cgroupfs-burstable"),
        # Read from inside a container with its own cgroup namespace: the kernel shows other
        # processes' paths relative to the reader's root, climbing out with "..".
        pytest.param(
            f"0::/../../kubepods-burstable-pod{ESC}.slice/cri-containerd-{CID}.scope\n",
            UID,
            CID,
            id="v2-seen-from-a-cgroup-namespace",
        ),
        pytest.param(f"0::/../../../system.slice/docker-{CID}.scope\n", "", CID, id="docker-run-seen-from-a-cgroup-namespace"),
        pytest.param(f"0::/kubepods/pod{UID}/{CID}\n", UID, CID, id="v2-cgroupfs-guaranteed"),
        pytest.param(
            f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{ESC}.slice/cri-containerd-{CID}.scope\n",
            UID,
            CID,
            id="v2-kind-nested-kubelet",
        ),
        pytest.param(
            f"12:pids:/kubepods/besteffort/pod{UID}/{CID}\n11:memory:/kubepods/besteffort/pod{UID}/{CID}\n1:name=systemd:/kubepods/besteffort/pod{UID}/{CID}\n0::/\n",
            UID,
            CID,
            id="v1-cgroupfs-many-lines",
        ),
        pytest.param(
            f"9:name=systemd:/\n8:pids:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{ESC}.slice/cri-containerd-{CID}.scope\n0::/\n",
            UID,
            CID,
            id="hybrid-v2-root-v1-carries-path",
        ),
        pytest.param(
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{ESC}.slice\n",
            UID,
            "",
            id="pod-level-no-container",
        ),
        pytest.param(f"0::/kubepods/burstable/pod{STATIC}/{CID}\n", STATIC, CID, id="static-pod-hash-uid"),
        pytest.param(
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{ESC.upper()}.slice/x.scope\n",
            UID,
            "",
            id="upper-case",
        ),
        # Outside Kubernetes: no pod, the container where the path shows one.
        pytest.param(f"0::/system.slice/docker-{CID}.scope\n", "", CID, id="docker-run-systemd"),
        pytest.param(f"4:memory:/docker/{CID}\n0::/\n", "", CID, id="docker-run-cgroupfs-v1"),
        pytest.param(f"0::/default/{CID}\n", "", CID, id="ctr-run-default-namespace"),
        pytest.param(f"0::/machine.slice/libpod-{CID}.scope\n", "", CID, id="podman"),
        pytest.param("0::/user.slice/user-1000.slice/session-3.scope\n", "", "", id="host-login-session"),
        pytest.param("0::/\n", "", "", id="root"),
        # A pod-shaped name outside kubepods is no pod: only the kubelet's hierarchy counts.
        pytest.param(f"0::/system.slice/pod{UID}/{CID}\n", "", CID, id="pod-name-outside-kubepods"),
        pytest.param("garbage\n\n::\n", "", "", id="malformed"),
        pytest.param("", "", "", id="empty"),
    ],
)
def test_the_cgroup_names_the_pod_and_container(text: str, pod_uid: str, container_id: str) -> None:
    found = cgroups.parse(text)
    assert (found.pod_uid, found.container_id) == (pod_uid, container_id)
    assert found.in_pod is bool(pod_uid)


def test_a_missing_process_reads_as_none(tmp_path: Path) -> None:
    assert cgroups.read(424242, proc_root=tmp_path) is None
    assert cgroups.read(0, proc_root=tmp_path) is None


def test_the_reader_uses_the_proc_root(tmp_path: Path) -> None:
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "cgroup").write_text(f"0::/kubepods/pod{UID}/{CID}\n")
    found = cgroups.read(77, proc_root=tmp_path)
    assert found is not None and found.pod_uid == UID and found.container_id == CID


# --- real processes in real cgroups -------------------------------------------------------------

HIERARCHIES = cgroup_processes.hierarchies()


@pytest.mark.skipif(not HIERARCHIES, reason="needs root and a writable cgroup filesystem at /sys/fs/cgroup to create cgroups")
@pytest.mark.parametrize(("kind", "mount"), HIERARCHIES, ids=[kind for kind, _ in HIERARCHIES])
@pytest.mark.parametrize("shape", ["systemd", "cgroupfs", "docker-run", "host"])
def test_real_processes_in_kubelet_shaped_cgroups_map_to_their_pod(kind: str, mount: Path, shape: str) -> None:
    pod_uid = str(uuid.uuid4())
    container = uuid.uuid4().hex + uuid.uuid4().hex
    tag = uuid.uuid4().hex[:8]  # unique top-level names: parallel runs never share a cgroup
    paths = {
        "systemd": cgroup_processes.systemd_pod_path(pod_uid, container, tag=tag),
        "cgroupfs": f"kubepods{tag}/besteffort/pod{pod_uid}/{container}",
        "docker-run": cgroup_processes.docker_run_path(container, tag=tag),
        "host": f"gpu-admission-test-{tag}.slice/session-1.scope",
    }
    want_pod = pod_uid if shape in ("systemd", "cgroupfs") else ""
    want_container = container if shape != "host" else ""
    with cgroup_processes.process_in(mount, paths[shape]) as pid:
        text = (Path("/proc") / str(pid) / "cgroup").read_text()
        found = cgroups.read(pid)
    assert paths[shape].split("/")[-1] in text, f"{kind}: the process did not move: {text!r}"
    assert found is not None
    assert (found.pod_uid, found.container_id) == (want_pod, want_container), text


V2 = [mount for kind, mount in HIERARCHIES if kind == "v2"]


@pytest.mark.skipif(not V2 or shutil.which("unshare") is None, reason="needs root, a writable cgroup v2 hierarchy and unshare(1)")
def test_a_reader_in_its_own_cgroup_namespace_still_finds_the_pod() -> None:
    # The labeler runs in a container with a private cgroup namespace: the kernel then shows a pod's
    # path relative to the labeler's own cgroup ("/../../kubepods-...").
    (mount,) = V2[:1]
    tag = uuid.uuid4().hex[:8]
    pod_uid = str(uuid.uuid4())
    container = uuid.uuid4().hex + uuid.uuid4().hex
    with (
        cgroup_processes.process_in(mount, cgroup_processes.systemd_pod_path(pod_uid, container, tag=tag)) as pid,
        cgroup_processes.process_in(mount, f"gpu-admission-test-{tag}-reader.slice/labeler.scope") as parked,
    ):
        reader_cgroup = mount / f"gpu-admission-test-{tag}-reader.slice" / "labeler.scope"
        script = f'echo $$ > "{reader_cgroup}/cgroup.procs" && exec unshare --cgroup cat /proc/{pid}/cgroup'
        text = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30, check=True).stdout  # noqa: S603, S607
        assert parked > 0
    assert "/../" in text, text
    found = cgroups.parse(text)
    assert (found.pod_uid, found.container_id) == (pod_uid, container)
