"""Where the control-plane binaries come from: the Go tools module, built once into a cache."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

NAMES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok")
REAL_NODE_NAMES = ("kubelet", "kube-proxy", "pause")  # built only when asked (`build.sh --real-node`)
ENV_BIN_DIR = "GPU_ADMISSION_BIN_DIR"


class BinariesError(RuntimeError):
    """The binaries are missing and cannot be built; the message says what to do."""


def build_script() -> Path:
    """The build script of the Go tools module in the source tree."""
    return Path(__file__).resolve().parents[2] / "tests" / "e2e" / "controlplane" / "build.sh"


def ensure(*, force: bool = False, real_node: bool = False) -> Path:
    """The cache directory holding every binary, building what is missing (a no-op when warm)."""
    override = os.environ.get(ENV_BIN_DIR)
    if override:
        directory = Path(override)
        missing = [name for name in (*NAMES, *(REAL_NODE_NAMES if real_node else ())) if not (directory / name).exists()]
        if missing:
            raise BinariesError(f"{ENV_BIN_DIR}={override} lacks {', '.join(missing)}")
        return directory
    script = build_script()
    if not script.exists():
        raise BinariesError(f"the Go tools module is not here ({script}); run from a source checkout")
    if shutil.which("go") is None:
        raise BinariesError("Go is not installed: the local control plane is built with the go command")
    command = ["bash", str(script)] + (["--force"] if force else []) + (["--real-node"] if real_node else [])
    completed = subprocess.run(command, stdout=subprocess.PIPE, stderr=None, text=True, check=False)
    if completed.returncode != 0:
        raise BinariesError(f"building the control-plane binaries failed (exit {completed.returncode})")
    return Path(completed.stdout.strip().splitlines()[-1])
