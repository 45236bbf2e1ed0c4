"""helm and promtool for the tests that check the chart and the alert rules.

Built from the Go module proxy by tests/e2e/ecosystem/build.sh into the same per-user cache as the
control plane, keyed by version (a no-op once built). Without Go the tests skip, unless
GPU_ADMISSION_E2E=require (CI), where they fail: these checks must never go quietly missing there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "tests" / "e2e" / "ecosystem" / "build.sh"
ENV_BIN_DIR = "GPU_ADMISSION_ECOSYSTEM_BIN_DIR"  # a directory holding helm and promtool already
REQUIRE_ENV = "GPU_ADMISSION_E2E"


def tool(name: str) -> Path:
    """The path of `helm` or `promtool`, built when missing."""
    override = os.environ.get(ENV_BIN_DIR)
    if override:
        path = Path(override) / name
        if not path.exists():
            pytest.fail(f"{ENV_BIN_DIR}={override} lacks {name}")
        return path
    if shutil.which("go") is None:
        if os.environ.get(REQUIRE_ENV) == "require":
            pytest.fail(f"{name} is required here but there is no Go toolchain to build it")
        pytest.skip(f"no Go toolchain: {name} is built with go")
    completed = subprocess.run(["bash", str(BUILD), name], capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        pytest.fail(f"building {name} failed (exit {completed.returncode}):\n{completed.stderr[-2000:]}")
    return Path(completed.stdout.strip().splitlines()[-1]) / name
