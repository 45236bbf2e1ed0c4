"""The labeler against real NVML: run on a machine with an NVIDIA driver (see run_on_gpu.sh).

Everywhere else every test here skips with one line saying there is no NVML. With
``GPU_ADMISSION_NVML=require`` (run_on_gpu.sh sets it) a missing library, driver, nvidia-smi or libcuda
fails instead: on the GPU machine a CUDA or driver failure must not pass as a skip. Nothing here needs
a cluster, and nothing imports the kubernetes client: the device machine's image does not have it.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
from typing import NoReturn

import pytest

from policies import gpu
from webhook.labeler import cli, inventory, labels, nvml

LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def unavailable(reason: str) -> NoReturn:
    """Skip with ``reason``; fail with it where ``GPU_ADMISSION_NVML=require`` says NVML must be here."""
    if os.environ.get("GPU_ADMISSION_NVML") == "require":
        pytest.fail(f"GPU_ADMISSION_NVML=require: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def real() -> inventory.Inventory:
    """What NVML reports here; skips the module where nvmlInit finds no library or no driver."""
    try:
        return nvml.read()
    except nvml.Unavailable as error:
        unavailable(f"no NVML on this machine (nvmlInit: {error})")


def nvidia_smi() -> list[dict[str, str]]:
    if shutil.which("nvidia-smi") is None:
        unavailable("nvidia-smi is not installed: nothing to compare NVML with")
    completed = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    rows = csv.reader(io.StringIO(completed.stdout), skipinitialspace=True)
    return [{"index": r[0], "uuid": r[1], "name": r[2], "memory": r[3]} for r in rows if r]


def test_nvml_reports_every_card_with_a_uuid_a_name_and_memory(real: inventory.Inventory) -> None:
    assert real.cards, "NVML works but reports no GPU"
    assert [card.index for card in real.cards] == list(range(len(real.cards)))
    for card in real.cards:
        assert card.uuid.startswith("GPU-"), card
        assert card.name.strip(), card
        assert card.memory_mib > 1024, card
    assert real.driver_version is not None and re.match(r"^\d+\.\d+(\.\d+)?$", real.driver_version)
    assert real.cuda_version is not None and re.match(r"^\d+\.\d+$", real.cuda_version)


def test_nvml_agrees_with_nvidia_smi_so_nvidia_mem_is_the_figure_ack_writes(real: inventory.Inventory) -> None:
    # ACK's own labeling took nvidia_mem from `nvidia-smi --query-gpu=memory.total` (MiB); ours is
    # NVML's total bytes // 2**20. This is where the two are compared on real hardware.
    rows = nvidia_smi()
    assert [(int(r["index"]), r["uuid"], r["name"], int(r["memory"])) for r in rows] == [
        (card.index, card.uuid, card.name, card.memory_mib) for card in real.cards
    ]


def test_labels_from_real_cards_are_valid_label_values(real: inventory.Inventory) -> None:
    desired = labels.compute(real)
    for key, value in desired.labels.items():
        assert len(value) <= 63 and LABEL_VALUE.match(value), (key, value)
    assert desired.labels["aliyun.accelerator/nvidia_count"] == str(len(real.cards))


def test_links_name_real_cards_and_cover_pairs_where_nvml_knows_them(real: inventory.Inventory) -> None:
    indices = {card.index for card in real.cards}
    for link in real.links:
        assert link.a < link.b and {link.a, link.b} <= indices, link
    if len(real.cards) < 2:
        assert real.links == ()


def test_reads_are_repeatable(real: inventory.Inventory) -> None:
    # NVML is initialised and shut down on every pass; a second pass must see the same cards.
    assert nvml.read().cards == real.cards


def test_the_dry_run_cli_prints_the_real_labels(real: inventory.Inventory, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["labeler", "--once", "--dry-run", "-o", "json", "--node-name", "gpu-host"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["source"] == "nvml"
    assert report["labels"]["aliyun.accelerator/nvidia_count"] == str(len(real.cards))
    assert len(json.loads(report["annotations"][gpu.INVENTORY_ANNOTATION])) == len(real.cards)


# --- real use -------------------------------------------------------------------------------------

# A process that holds GPU memory with nothing but the driver's libcuda (no CUDA toolkit, no torch):
# cuInit, a context on device 0, 256 MiB allocated, then it waits to be killed.
_HOLDER = r"""
import ctypes, sys, time
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
device, context, pointer = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
assert cuda.cuDeviceGet(ctypes.byref(device), 0) == 0
assert cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device) == 0
assert cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(256 * 2**20)) == 0
print("ready", flush=True)
time.sleep(600)
"""


def test_memory_used_is_known_and_within_the_card(real: inventory.Inventory) -> None:
    for card in real.cards:
        assert card.used_mib is not None and 0 <= card.used_mib <= card.memory_mib
        assert all(process.pid > 0 for process in card.processes)


def test_a_process_holding_gpu_memory_is_listed_with_its_memory_and_a_readable_cgroup(real: inventory.Inventory) -> None:
    from webhook.labeler import cgroups

    try:
        holder = subprocess.Popen([sys.executable, "-c", _HOLDER], stdout=subprocess.PIPE, text=True)
    except OSError as error:
        unavailable(f"cannot start a GPU process: {error}")
    try:
        line = holder.stdout.readline() if holder.stdout is not None else ""
        if line.strip() != "ready":
            unavailable("no libcuda here to hold GPU memory with (the driver's CUDA library is missing)")
        seen = {p.pid: p for card in nvml.read().cards for p in card.processes}
        assert holder.pid in seen, f"NVML lists {sorted(seen)}, not {holder.pid}"
        used = seen[holder.pid].used_mib
        assert used is None or used >= 256
        assert cgroups.read(holder.pid) is not None
    finally:
        holder.kill()
        holder.wait()
