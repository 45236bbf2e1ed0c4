"""The NVML adapter against a scripted pynvml: units, links, and how NVML errors are sorted."""

from __future__ import annotations

import dataclasses
import pathlib
import re
import types
from typing import Any

import pynvml  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information
import pytest

from policies.gpu import inventory as codec  # the GPU model's link levels; `inventory` is the labeler's
from webhook.labeler import inventory, nvml

GIB = 2**30


@dataclasses.dataclass
class Device:
    name: str | bytes
    uuid: str
    total: int
    bus_id: bytes
    nvlinks: dict[int, bytes] = dataclasses.field(default_factory=dict)  # link -> remote bus id
    used: int | None = None  # bytes; None: the memory info carries no `used`
    processes: list[tuple[int, int | None]] | int = dataclasses.field(default_factory=list)  # (pid, bytes) or an NVML error code


class FakeNvml:
    """Patches the pynvml calls the adapter makes; errors are real pynvml error classes."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, devices: list[Device], *, ancestors: dict[tuple[int, int], int] | None = None
    ) -> None:
        self.devices = devices
        self.ancestors = ancestors or {}
        self.init_error: int | None = None
        self.fail: dict[str, int] = {}
        self.inits = 0
        self.shutdowns = 0
        calls = {
            "nvmlInit": self.init,
            "nvmlShutdown": self.shutdown,
            "nvmlDeviceGetCount": lambda: len(self.devices),
            "nvmlDeviceGetHandleByIndex": self.handle,
            "nvmlDeviceGetName": lambda h: self._call("name", h).name,
            "nvmlDeviceGetUUID": lambda h: h.uuid,
            "nvmlDeviceGetMemoryInfo": self.memory_info,
            "nvmlDeviceGetComputeRunningProcesses": self.processes,
            "nvmlDeviceGetPciInfo": lambda h: types.SimpleNamespace(busId=h.bus_id),
            "nvmlDeviceGetNvLinkState": self.nvlink_state,
            "nvmlDeviceGetNvLinkRemotePciInfo": lambda h, link: types.SimpleNamespace(busId=h.nvlinks[link]),
            "nvmlDeviceGetTopologyCommonAncestor": self.ancestor,
            "nvmlSystemGetDriverVersion": lambda: self._call("driver", None) or "550.107.02",
            "nvmlSystemGetCudaDriverVersion": lambda: 12040,
        }
        for name, call in calls.items():
            monkeypatch.setattr(pynvml, name, call)

    def init(self) -> None:
        self.inits += 1
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def shutdown(self) -> None:
        self.shutdowns += 1

    def memory_info(self, handle: Device) -> Any:
        device = self._call("memory", handle)
        if device.used is None:
            return types.SimpleNamespace(total=device.total)
        return types.SimpleNamespace(total=device.total, used=device.used, free=device.total - device.used)

    def processes(self, handle: Device) -> list[Any]:
        if isinstance(handle.processes, int):
            raise pynvml.NVMLError(handle.processes)
        # nvidia-ml-py turns NVML_VALUE_NOT_AVAILABLE into usedGpuMemory=None
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in handle.processes]

    def handle(self, index: int) -> Device:
        return self.devices[index]

    def nvlink_state(self, handle: Device, link: int) -> int:
        if not handle.nvlinks:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= 6:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED if link in handle.nvlinks else 0

    def ancestor(self, a: Device, b: Device) -> int:
        key = (self.devices.index(a), self.devices.index(b))
        if key not in self.ancestors:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.ancestors[key]

    def _call(self, what: str, handle: Any) -> Any:
        if what in self.fail:
            raise pynvml.NVMLError(self.fail[what])
        return handle


def t4(index: int) -> Device:
    return Device(
        name="Tesla T4", uuid=f"GPU-t4-{index}", total=15360 * 2**20 + 12345, bus_id=f"00000000:{index + 0x3B:02X}:00.0".encode()
    )


def test_cards_are_read_with_memory_in_mib_and_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(monkeypatch, [t4(0), t4(1)])
    inv = nvml.read()
    assert inv.cards == (
        inventory.Card(index=0, uuid="GPU-t4-0", name="Tesla T4", memory_mib=15360),
        inventory.Card(index=1, uuid="GPU-t4-1", name="Tesla T4", memory_mib=15360),
    )
    assert inv.driver_version == "550.107.02"
    assert inv.cuda_version == "12.4"
    assert (fake.inits, fake.shutdowns) == (1, 1)


def test_byte_names_are_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    device = t4(0)
    device.name = b"NVIDIA A10"
    FakeNvml(monkeypatch, [device])
    assert nvml.read().cards[0].name == "NVIDIA A10"


def test_nvlinks_are_counted_per_peer_and_pcie_levels_come_from_the_common_ancestor(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, c = t4(0), t4(1), t4(2)
    # Remote ids spelled with a 4-digit domain, as nvmlDeviceGetNvLinkRemotePciInfo may.
    a.nvlinks = {0: b"0000:3C:00.0", 1: b"0000:3c:00.0", 2: b"0000:3D:00.0"}
    b.nvlinks = {0: b"0000:3B:00.0", 1: b"0000:3B:00.0"}
    c.nvlinks = {0: b"0000:3B:00.0"}
    FakeNvml(monkeypatch, [a, b, c], ancestors={(1, 2): pynvml.NVML_TOPOLOGY_SYSTEM})
    assert nvml.read().links == (
        inventory.Link(a=0, b=1, nvlinks=2),
        inventory.Link(a=0, b=2, nvlinks=1),
        inventory.Link(a=1, b=2, level=codec.Level.SYS),
    )


@pytest.mark.parametrize(
    ("ancestor", "level"),
    [
        (pynvml.NVML_TOPOLOGY_INTERNAL, codec.Level.PIX),
        (pynvml.NVML_TOPOLOGY_SINGLE, codec.Level.PIX),
        (pynvml.NVML_TOPOLOGY_MULTIPLE, codec.Level.PXB),
        (pynvml.NVML_TOPOLOGY_HOSTBRIDGE, codec.Level.PHB),
        (pynvml.NVML_TOPOLOGY_NODE, codec.Level.NODE),
        (pynvml.NVML_TOPOLOGY_SYSTEM, codec.Level.SYS),
    ],
)
def test_pcie_levels_follow_nvidia_smi_topo(monkeypatch: pytest.MonkeyPatch, ancestor: int, level: codec.Level) -> None:
    FakeNvml(monkeypatch, [t4(0), t4(1)], ancestors={(0, 1): ancestor})
    assert nvml.read().links == (inventory.Link(a=0, b=1, level=level),)


def test_pairs_without_topology_information_are_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml(monkeypatch, [t4(0), t4(1)])
    assert nvml.read().links == ()


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED])
def test_no_library_or_no_driver_is_unavailable(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    fake = FakeNvml(monkeypatch, [])
    fake.init_error = code
    with pytest.raises(nvml.Unavailable):
        nvml.read()
    assert fake.shutdowns == 0


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_NO_PERMISSION, pynvml.NVML_ERROR_UNKNOWN])
def test_other_init_failures_are_read_errors(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    fake = FakeNvml(monkeypatch, [])
    fake.init_error = code
    with pytest.raises(nvml.ReadError, match="nvmlInit"):
        nvml.read()


def test_a_lost_gpu_is_a_read_error_and_nvml_is_still_shut_down(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(monkeypatch, [t4(0)])
    fake.fail["memory"] = pynvml.NVML_ERROR_GPU_IS_LOST
    with pytest.raises(nvml.ReadError, match="GPU is lost"):
        nvml.read()
    assert fake.shutdowns == 1


def test_a_missing_driver_version_is_tolerated(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(monkeypatch, [t4(0)])
    fake.fail["driver"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    assert nvml.read().driver_version is None


def test_no_module_but_the_adapter_imports_pynvml() -> None:
    imports = re.compile(r"^\s*(import|from)\s+pynvml\b", re.MULTILINE)
    package = pathlib.Path(nvml.__file__).parent.parent.parent
    importers = sorted(
        str(path.relative_to(package))
        for root in ("webhook", "policies", "certs")
        for path in (package / root).rglob("*.py")
        if imports.search(path.read_text(encoding="utf-8"))
    )
    assert importers == ["webhook/labeler/nvml.py"]


# --- per-card use ---------------------------------------------------------------------------------


def test_memory_used_and_the_compute_processes_are_read_in_mib(monkeypatch: pytest.MonkeyPatch) -> None:
    card = t4(0)
    card.used = 9300 * 2**20 + 7
    card.processes = [(41233, 5200 * 2**20), (41250, None)]
    FakeNvml(monkeypatch, [card])
    read = nvml.read().cards[0]
    assert read.used_mib == 9300
    assert read.processes == (inventory.Process(pid=41233, used_mib=5200), inventory.Process(pid=41250, used_mib=None))


def test_a_pid_listed_twice_is_one_process_with_its_memory_summed(monkeypatch: pytest.MonkeyPatch) -> None:
    card = t4(0)
    card.processes = [(7, 100 * 2**20), (7, 28 * 2**20), (8, None), (8, 5 * 2**20), (0, 1)]
    FakeNvml(monkeypatch, [card])
    assert nvml.read().cards[0].processes == (inventory.Process(pid=7, used_mib=128), inventory.Process(pid=8, used_mib=5))


def test_a_card_without_a_process_list_reads_as_no_processes_not_as_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    card = t4(0)
    card.used = 2**30
    card.processes = pynvml.NVML_ERROR_NOT_SUPPORTED
    FakeNvml(monkeypatch, [card])
    read = nvml.read().cards[0]
    assert (read.used_mib, read.processes) == (1024, ())


def test_another_process_list_error_is_a_read_error_so_the_last_good_reading_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    card = t4(0)
    card.processes = pynvml.NVML_ERROR_GPU_IS_LOST
    FakeNvml(monkeypatch, [card])
    with pytest.raises(nvml.ReadError):
        nvml.read()
