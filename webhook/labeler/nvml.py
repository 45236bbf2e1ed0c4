"""The NVML adapter: the only module that imports `pynvml` (from the `nvidia-ml-py` distribution).

`read()` initialises NVML, reads every card, the driver and CUDA versions and the pairwise links,
and shuts NVML down again. Initialising on every pass (rather than once per process) is deliberate:
a driver that comes up after the labeler (NVIDIA/gpu-feature-discovery #71: NVML never initialises
until the pod restarts) is picked up at the next interval without a restart.

Per-card use (`nvmlDeviceGetMemoryInfo().used` and `nvmlDeviceGetComputeRunningProcesses`) is read
in the same pass. A card or driver that does not support either call (NVML_ERROR_NOT_SUPPORTED,
e.g. some vGPU and MIG set-ups) reads as "not known" (`used_mib` None, no processes), never as a
failed read; a process NVML has no memory figure for (`usedGpuMemory` None, which nvidia-ml-py
sets for NVML_VALUE_NOT_AVAILABLE) is kept with `used_mib` None. PIDs are the host's: the labeler
needs `hostPID` to read their cgroups.

Errors come out as two types, never as `pynvml` ones:
- `Unavailable`: there is no NVML here at all (`NVMLError_LibraryNotFound`, `NVMLError_DriverNotLoaded`);
- `ReadError`: NVML is there but this read failed (a lost GPU, a timeout, ...), so the caller keeps
  the last good inventory.
"""

from __future__ import annotations

import logging
from typing import Any

import pynvml  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information

from policies.gpu import inventory as codec  # the GPU model's link levels; `inventory` is the labeler's
from webhook.labeler import inventory

logger = logging.getLogger(__name__)

_UNAVAILABLE: tuple[type[BaseException], ...] = (
    pynvml.NVMLError_LibraryNotFound,
    pynvml.NVMLError_DriverNotLoaded,
)

# nvmlDeviceGetTopologyCommonAncestor levels -> the PCIe/CPU link level (nvidia-smi topo -m).
_ANCESTOR_LEVELS: dict[int, codec.Level] = {
    pynvml.NVML_TOPOLOGY_INTERNAL: codec.Level.PIX,  # two GPUs on one board
    pynvml.NVML_TOPOLOGY_SINGLE: codec.Level.PIX,
    pynvml.NVML_TOPOLOGY_MULTIPLE: codec.Level.PXB,
    pynvml.NVML_TOPOLOGY_HOSTBRIDGE: codec.Level.PHB,
    pynvml.NVML_TOPOLOGY_NODE: codec.Level.NODE,
    pynvml.NVML_TOPOLOGY_SYSTEM: codec.Level.SYS,
}


class Unavailable(Exception):
    """No NVML on this machine (no library or no driver); the message is NVML's own."""


class ReadError(Exception):
    """NVML is present but reading the cards failed this time; the message names the call."""


def read() -> inventory.Inventory:
    """Every card NVML sees, with versions and links. Raises Unavailable or ReadError."""
    try:
        pynvml.nvmlInit()
    except _UNAVAILABLE as error:
        raise Unavailable(str(error)) from error
    except pynvml.NVMLError as error:
        raise ReadError(f"nvmlInit: {error}") from error
    try:
        return _read_initialised()
    except pynvml.NVMLError as error:
        raise ReadError(str(error)) from error
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as error:
            logger.debug("nvmlShutdown: %s", error)


def _read_initialised() -> inventory.Inventory:
    count: int = pynvml.nvmlDeviceGetCount()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(index) for index in range(count)]
    cards = []
    for index, handle in enumerate(handles):
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        cards.append(
            inventory.Card(
                index=index,
                uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                name=_text(pynvml.nvmlDeviceGetName(handle)),
                memory_mib=int(memory.total) // 2**20,
                used_mib=_used_mib(memory),
                processes=_processes(handle),
            )
        )
    try:
        return inventory.make(
            cards,
            driver_version=_driver_version(),
            cuda_version=_cuda_version(),
            links=_links(handles),
        )
    except ValueError as error:
        raise ReadError(f"inconsistent device list: {error}") from error


def _used_mib(memory: Any) -> int | None:
    used = getattr(memory, "used", None)
    return int(used) // 2**20 if isinstance(used, int) and used >= 0 else None


def _processes(handle: Any) -> tuple[inventory.Process, ...]:
    """The card's compute processes, one entry per PID (memory summed when NVML lists a PID twice)."""
    try:
        listed = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except pynvml.NVMLError_NotSupported as error:
        logger.debug("no process list on this card: %s", error)
        return ()
    found: dict[int, int | None] = {}
    for process in listed or ():
        pid = getattr(process, "pid", None)
        if not isinstance(pid, int) or pid <= 0:
            continue
        raw = getattr(process, "usedGpuMemory", None)
        used = int(raw) // 2**20 if isinstance(raw, int) and raw >= 0 else None
        if pid in found and found[pid] is not None and used is not None:
            found[pid] = (found[pid] or 0) + used
        elif pid not in found or found[pid] is None:
            found[pid] = used
    return tuple(inventory.Process(pid=pid, used_mib=used) for pid, used in found.items())


def _links(handles: list[Any]) -> list[inventory.Link]:
    bus_ids = [_bus_id(handle) for handle in handles]
    found: list[inventory.Link] = []
    for a in range(len(handles)):
        nvlinks = _nvlink_peers(handles[a])
        for b in range(a + 1, len(handles)):
            count = sum(1 for peer in nvlinks if bus_ids[b] is not None and peer == bus_ids[b])
            if count:
                found.append(inventory.Link(a=a, b=b, nvlinks=count))
                continue
            try:
                ancestor = pynvml.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b])
            except pynvml.NVMLError as error:
                logger.debug("no topology between GPU %d and GPU %d: %s", a, b, error)
                continue
            level = _ANCESTOR_LEVELS.get(int(ancestor))
            if level is not None:
                found.append(inventory.Link(a=a, b=b, level=level))
    return found


def _nvlink_peers(handle: Any) -> list[str]:
    """The normalised PCI bus id at the far end of each active NVLink of a card."""
    peers: list[str] = []
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            if pynvml.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_FEATURE_ENABLED:
                continue
            remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
        except pynvml.NVMLError:
            # NotSupported on cards without NVLink, InvalidArgument past the card's last link.
            continue
        peers.append(_normalise_bus_id(_text(remote.busId)))
    return peers


def _bus_id(handle: Any) -> str | None:
    try:
        return _normalise_bus_id(_text(pynvml.nvmlDeviceGetPciInfo(handle).busId))
    except pynvml.NVMLError:
        return None


def _normalise_bus_id(bus_id: str) -> str:
    # NVML spells the domain with 8 hex digits in one call and 4 in another ("00000000:3B:00.0").
    domain, _, rest = bus_id.strip().lower().rpartition(":")
    domain_part, _, bus = domain.rpartition(":")
    return f"{int(domain_part or '0', 16):04x}:{bus}:{rest}" if bus else bus_id.strip().lower()


def _driver_version() -> str | None:
    version = _optional(pynvml.nvmlSystemGetDriverVersion)
    return None if version is None else _text(version)


def _cuda_version() -> str | None:
    version = _optional(pynvml.nvmlSystemGetCudaDriverVersion)
    if version is None:
        return None
    number = int(version)
    return f"{number // 1000}.{number % 1000 // 10}"


def _optional(call: Any) -> Any:
    try:
        return call()
    except pynvml.NVMLError as error:
        logger.debug("%s: %s", getattr(call, "__name__", call), error)
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
