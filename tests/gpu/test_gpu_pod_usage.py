"""Per-pod figures against a process that allocates a known amount on card 0 (see run_on_gpu.sh).

A child process takes a CUDA context on card 0 through the driver API (libcuda, by ctypes: no
CUDA toolkit or framework needed) and allocates ALLOCATE_MIB. The labeler's runner then reads the
cards from real NVML, attributes the child to a pod (its cgroup is not a pod's here: the identity
of that one PID is given, every other process stays "unknown"), and compares the pod's figure with
its allocation: the figure is NVML's per-process memory, the allocation plus the CUDA context.

Without NVML or libcuda every test here skips with one line, unless GPU_ADMISSION_NVML=require is
set (the GPU run sets it): then it fails, so a machine without a usable GPU cannot pass as one.
Nothing here needs a cluster or the kubernetes client.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from policies import gpu
from webhook.labeler import cgroups, inventory, nvml, ownership, runner

ALLOCATE_MIB = 1536
GIVEN_GIB = 1  # the pod's allocation on card 0: 1024 MiB, so it is 512 MiB and its context above
CONTEXT_MAX_MIB = 1024  # a CUDA context's own memory stays well below this on every current GPU
NODE = "gpu-usage-check"
UID = "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9"

ALLOCATOR = r"""
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
def check(status, what):
    if status != 0:
        print(f"{what}: CUresult {status}", flush=True)
        sys.exit(3)
check(cuda.cuInit(0), "cuInit")
device = ctypes.c_int()
check(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
context = ctypes.c_void_p()
check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
check(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
pointer = ctypes.c_uint64()
check(cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(int(sys.argv[1]) * 2**20)), "cuMemAlloc_v2")
print("ready", flush=True)
sys.stdin.read()
"""


def unavailable(reason: str) -> None:
    """Skip, or fail where the run requires a GPU (GPU_ADMISSION_NVML=require)."""
    if os.environ.get("GPU_ADMISSION_NVML") == "require":
        pytest.fail(f"GPU_ADMISSION_NVML=require but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def allocator() -> Iterator[int]:
    """The PID of a process holding ALLOCATE_MIB on card 0 (and its CUDA context)."""
    try:
        nvml.read()
    except nvml.Unavailable as error:
        unavailable(f"no NVML on this machine (nvmlInit: {error})")
    child = subprocess.Popen(
        [sys.executable, "-c", ALLOCATOR, str(ALLOCATE_MIB)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline().strip()
        if line != "ready":
            child.wait(timeout=30)
            unavailable(f"the allocating process could not allocate on card 0: {line or 'no answer'} (exit {child.returncode})")
        yield child.pid
    finally:
        if child.poll() is None:
            assert child.stdin is not None
            child.stdin.close()
            child.wait(timeout=30)


class Nodes:
    def get(self, name: str) -> ownership.Node:
        return ownership.Node(name=name, labels={gpu.SCHEDULE_LABEL: str(gpu.Mode.SHARE)})

    def patch(self, name: str, body: Mapping[str, Any]) -> None:
        pass

    def patch_status(self, name: str, body: Mapping[str, Any]) -> None:
        pass


class Pods:
    def pods_on(self, node_name: str) -> list[Mapping[str, Any]]:
        allocation = {
            "node": NODE,
            "cards": [0],
            "memGiB": GIVEN_GIB,
            "corePercent": 0,
            "whole": False,
            "assumedAt": "2026-01-01T00:00:00.000Z",
        }
        return [
            {
                "metadata": {
                    "uid": UID,
                    "namespace": "ml",
                    "name": "allocator",
                    "annotations": {gpu.ALLOCATION_ANNOTATION: json.dumps(allocation)},
                },
                "spec": {"nodeName": NODE},
                "status": {"phase": "Running"},
            }
        ]


def seen(pid: int) -> inventory.Inventory:
    """NVML's view once it lists the child on card 0 with a memory figure (it may take a moment)."""
    deadline = time.monotonic() + 30
    while True:
        found = nvml.read()
        processes = {p.pid: p for p in found.cards[0].processes} if found.cards else {}
        if pid in processes and processes[pid].used_mib is not None:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"NVML does not list PID {pid} with a memory figure on card 0 after 30 s: {processes}")
        time.sleep(0.5)


def test_the_pods_figure_is_its_processes_memory_beside_its_allocation(allocator: int, monkeypatch: pytest.MonkeyPatch) -> None:
    real = seen(allocator)
    nvml_figure = next(p.used_mib for p in real.cards[0].processes if p.pid == allocator)
    assert nvml_figure is not None and ALLOCATE_MIB <= nvml_figure <= ALLOCATE_MIB + CONTEXT_MAX_MIB, nvml_figure

    def identify(pid: int, *, proc_root: Path = cgroups.DEFAULT_PROC_ROOT) -> cgroups.Identity | None:
        return cgroups.Identity(pod_uid=UID, container_id="c" * 64) if pid == allocator else None

    monkeypatch.setattr(cgroups, "read", identify)
    loop = runner.Runner(source=nvml.read, nodes=Nodes(), pods=Pods(), options=runner.Options(node_name=NODE))
    loop.step()
    [figure] = [f for f in loop.pod_figures if f.card == 0]
    assert (figure.namespace, figure.name, figure.requested_mib) == ("ml", "allocator", GIVEN_GIB * 1024)
    assert ALLOCATE_MIB <= figure.used_mib <= ALLOCATE_MIB + CONTEXT_MAX_MIB, figure
    assert figure.over_mib == figure.used_mib - GIVEN_GIB * 1024 > 0  # share: any excess counts
