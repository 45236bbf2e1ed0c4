"""`gpu-admission cluster` as a user runs it: up, a refused second up, status, down."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from webhook.cluster import controlplane

pytestmark = pytest.mark.e2e

CLI = str(Path(sys.executable).with_name("gpu-admission"))


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, "cluster", *args], capture_output=True, text=True, timeout=300, check=False)


def test_up_status_second_up_and_down(bin_dir: Path, tmp_path: Path) -> None:
    nodes_file = tmp_path / "nodes.yaml"
    nodes_file.write_text(
        "nodes:\n  - name: solo\n    labels: {ack.node.gpu.schedule: cgpu}\n    capacity: {aliyun.com/gpu-mem: 60}\n"
    )
    directory = tmp_path / "c"
    try:
        started = run("up", "--dir", str(directory), "--nodes", str(nodes_file), "--no-install")
        assert started.returncode == 0, started.stderr
        assert f"kubeconfig: {directory / 'kubeconfig'}" in started.stdout
        state = controlplane.State.load(directory)
        assert state is not None and set(state.pids) == set(controlplane.START_ORDER)
        assert len(set(state.ports.values())) == len(state.ports)  # every component on its own free port
        nodes = controlplane.kubectl(state, "get", "nodes", "-o", "name").stdout.split()
        assert nodes == ["node/solo"]

        status = run("status", "--dir", str(directory))
        assert status.returncode == 0
        assert all(f"{name} " in status.stdout for name in controlplane.START_ORDER)
        assert "EXITED" not in status.stdout

        again = run("up", "--dir", str(directory), "--nodes", str(nodes_file), "--no-install")
        assert again.returncode == 2
        assert again.stderr.strip().count("\n") == 0
        assert "already runs" in again.stderr
        assert "Traceback" not in again.stderr
    finally:
        stopped = run("down", "--dir", str(directory))
    assert stopped.returncode == 0
    assert "stopped: etcd, kube-apiserver" in stopped.stdout
    assert controlplane.State.load(directory) is None
    assert not (directory / "etcd").exists() and not (directory / "kubeconfig").exists()
    assert (directory / "logs" / "kube-apiserver.log").exists()
    assert all(not controlplane._alive(pid) for pid in state.pids.values())
    assert run("status", "--dir", str(directory)).returncode == 1


def test_a_bad_node_file_is_a_one_line_error(tmp_path: Path) -> None:
    nodes_file = tmp_path / "nodes.yaml"
    nodes_file.write_text("nodes: [{name: a}, {name: a}]")
    completed = run("up", "--dir", str(tmp_path / "c"), "--nodes", str(nodes_file))
    assert completed.returncode == 2
    assert completed.stderr.strip() == f"gpu-admission: error: {nodes_file}: duplicate node names: a"
