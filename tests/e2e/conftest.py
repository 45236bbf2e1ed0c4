"""The end-to-end tier: one real local control plane per session, with gpu-admission installed."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import Cluster
from webhook.cluster import binaries, controlplane, install, nodes

REQUIRE_ENV = "GPU_ADMISSION_E2E"  # "require": a missing Go toolchain fails the tier instead of skipping it


@pytest.fixture(scope="session")
def bin_dir() -> Path:
    if shutil.which("go") is None and not os.environ.get(binaries.ENV_BIN_DIR):
        if os.environ.get(REQUIRE_ENV) == "require":
            pytest.fail("the e2e tier is required here but there is no Go toolchain to build the control plane")
        pytest.skip("no Go toolchain: the e2e tier builds kube-apiserver and friends with go")
    return binaries.ensure()


@pytest.fixture(scope="session")
def cluster(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    directory = tmp_path_factory.mktemp("cluster")
    # DeviceTaintRules for test_dra.py: flags on kube-apiserver and kube-scheduler, nothing slower for the
    # others (test_dra.py starts a second cluster without them: `dra_device_taint_flags(False)`).
    apiserver_flags, scheduler_flags = controlplane.dra_device_taint_flags(True)
    state = install.bring_up(
        directory,
        bin_dir=bin_dir,
        fake_nodes=nodes.load(None),
        apiserver_flags=apiserver_flags,
        scheduler_flags=scheduler_flags,
    )
    try:
        yield Cluster(state)
    finally:
        controlplane.down(directory)
