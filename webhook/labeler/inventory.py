"""What a node's GPUs are: the Inventory data model, and the inventory file that stands in for NVML.

Both sources of an inventory (the NVML adapter `webhook.labeler.nvml` and an inventory file read
here) produce the same frozen `Inventory`, so label computation never knows where the cards came
from. The file is YAML (JSON is YAML too):

```yaml
gpus:
  - {index: 0, uuid: GPU-5a1b..., name: "Tesla V100-SXM2-32GB", memoryMiB: 32510}
  - {index: 1, uuid: GPU-9c2d..., name: "Tesla V100-SXM2-32GB", memoryMiB: 32510,
     usedMiB: 9300,                                   # optional: memory in use (NVML's "used")
     processes: [{pid: 41233, usedMiB: 5200}, {pid: 41250}]}  # optional: compute processes
driverVersion: "550.107.02"   # optional
cudaVersion: "12.4"           # optional
topology:                     # optional; pairwise link levels, as `nvidia-smi topo -m` names them
  links:
    - [0, 1, NV2]             # two NVLinks between card 0 and card 1
```

`usedMiB` and `processes` stand in for NVML's memory info and compute-process list (a process's
`usedMiB` may be left out, as NVML leaves it out where it has no figure); PIDs are host PIDs, which
the labeler maps to pods through `/proc/<pid>/cgroup`. `topology` may also be the bare list of links. A link level is one of `NV<n>` (n NVLinks, 1 to 99),
`PIX` (one PCIe switch), `PXB` (several PCIe switches), `PHB` (the same PCIe host bridge),
`NODE` (the same NUMA node) or `SYS` (across CPU sockets), best connection first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeGuard

import yaml

from policies.gpu import inventory as codec  # the GPU model's link levels; this module is the labeler's inventory


class InventoryError(ValueError):
    """An inventory (file) cannot be used; the message is one line naming the file and field."""


# The inventory file's top-level keys (the format above); the local cluster's node file embeds them per node.
GPUS_KEY = "gpus"
TOPOLOGY_KEY = "topology"
DRIVER_VERSION_KEY = "driverVersion"
CUDA_VERSION_KEY = "cudaVersion"
FILE_KEYS = (GPUS_KEY, TOPOLOGY_KEY, DRIVER_VERSION_KEY, CUDA_VERSION_KEY)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Card:
    """One physical GPU as NVML reports it (name unsanitised; memory in MiB = total bytes // 2**20)."""

    index: int
    uuid: str
    name: str
    memory_mib: int
    used_mib: int | None = None  # None: not read (NVML NotSupported, or the file does not say)
    processes: tuple[Process, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Process:
    """A compute process on a card: its host PID and the memory it holds (None where NVML has no figure)."""

    pid: int
    used_mib: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Link:
    """How cards `a` < `b` are connected: `nvlinks` NVLinks if any, else the PCIe/CPU `level`."""

    a: int
    b: int
    nvlinks: int = 0
    level: codec.Level = codec.Level.SYS  # PCIe/CPU, best first; the NVLink case is `nvlinks`

    @property
    def code(self) -> str:
        """The `nvidia-smi topo -m` spelling: `NV<n>` when NVLinked, else the level."""
        return codec.nvlink_level(self.nvlinks) if self.nvlinks > 0 else self.level.value


@dataclasses.dataclass(frozen=True, kw_only=True)
class Inventory:
    """Every card of a node (sorted by index), the driver and CUDA versions, and the links."""

    cards: tuple[Card, ...]
    driver_version: str | None = None
    cuda_version: str | None = None
    links: tuple[Link, ...] = ()


def link(a: int, b: int, code: str) -> Link:
    """A link from its `nvidia-smi topo -m` code (`NV2`, `PIX`, ...), with the ends ordered.

    Raises ValueError for an unknown code or a card linked to itself.
    """
    if a == b:
        raise ValueError(f"a card cannot link to itself ({a})")
    low, high = min(a, b), max(a, b)
    level = codec.link_level(code)  # ValueError for an unknown level
    nvlinks = codec.nvlinks_of(level)
    if nvlinks:
        return Link(a=low, b=high, nvlinks=nvlinks)
    return Link(a=low, b=high, level=codec.Level(level))


def make(
    cards: Sequence[Card],
    *,
    driver_version: str | None = None,
    cuda_version: str | None = None,
    links: Sequence[Link] = (),
) -> Inventory:
    """An Inventory with cards sorted by index and links sorted and de-duplicated (last wins).

    Raises ValueError for duplicate card indices or UUIDs, or a link naming an unknown card.
    """
    ordered = tuple(sorted(cards, key=lambda card: card.index))
    indices = [card.index for card in ordered]
    if len(set(indices)) != len(indices):
        raise ValueError(f"duplicate card index in {indices}")
    uuids = [card.uuid for card in ordered]
    if len(set(uuids)) != len(uuids):
        raise ValueError("duplicate card uuid")
    by_pair: dict[tuple[int, int], Link] = {}
    for item in links:
        for end in (item.a, item.b):
            if end not in indices:
                raise ValueError(f"link {item.a}-{item.b} names card {end}, which is not in the inventory")
        by_pair[(item.a, item.b)] = item
    return Inventory(
        cards=ordered,
        driver_version=driver_version,
        cuda_version=cuda_version,
        links=tuple(by_pair[pair] for pair in sorted(by_pair)),
    )


def parse(document: Any, *, source: str) -> Inventory:
    """Read an inventory document (see the module docstring); InventoryError names what is wrong."""
    if not isinstance(document, Mapping) or not isinstance(document.get(GPUS_KEY), list):
        raise InventoryError(f"{source}: expected a mapping with a '{GPUS_KEY}' list")
    cards = [_card(entry, where=f"{source}: {GPUS_KEY}[{position}]") for position, entry in enumerate(document[GPUS_KEY])]
    driver_version = _optional_text(document.get(DRIVER_VERSION_KEY), where=f"{source}: {DRIVER_VERSION_KEY}")
    cuda_version = _optional_text(document.get(CUDA_VERSION_KEY), where=f"{source}: {CUDA_VERSION_KEY}")
    links = _links(document.get(TOPOLOGY_KEY), where=f"{source}: {TOPOLOGY_KEY}")
    try:
        return make(cards, driver_version=driver_version, cuda_version=cuda_version, links=links)
    except ValueError as error:
        raise InventoryError(f"{source}: {error}") from error


def load(path: Path) -> Inventory:
    """Read and parse an inventory file; InventoryError (one line) when it is missing or invalid."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise InventoryError(f"{path}: {error.strerror or error}") from error
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise InventoryError(f"{path}: invalid YAML: {str(error).splitlines()[0]}") from error
    return parse(document, source=str(path))


def _card(entry: Any, *, where: str) -> Card:
    if not isinstance(entry, Mapping):
        raise InventoryError(f"{where}: expected a mapping with index, uuid, name and memoryMiB")
    index = entry.get("index")
    memory = entry.get("memoryMiB")
    uuid = entry.get("uuid")
    name = entry.get("name")
    if not _is_int(index) or index < 0:
        raise InventoryError(f"{where}.index: expected a non-negative integer, got {index!r}")
    if not _is_int(memory) or memory <= 0:
        raise InventoryError(f"{where}.memoryMiB: expected a positive integer (MiB), got {memory!r}")
    if not isinstance(uuid, str) or not uuid:
        raise InventoryError(f"{where}.uuid: expected a non-empty string")
    if not isinstance(name, str) or not name.strip():
        raise InventoryError(f"{where}.name: expected the card's NVML name, a non-empty string")
    used = entry.get("usedMiB")
    if used is not None and (not _is_int(used) or used < 0):
        raise InventoryError(f"{where}.usedMiB: expected a non-negative integer (MiB), got {used!r}")
    return Card(
        index=index,
        uuid=uuid,
        name=name,
        memory_mib=memory,
        used_mib=used,
        processes=_processes(entry.get("processes"), where=f"{where}.processes"),
    )


def _processes(value: Any, *, where: str) -> tuple[Process, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InventoryError(f"{where}: expected a list of {{pid, usedMiB}} mappings")
    found: dict[int, Process] = {}
    for position, item in enumerate(value):
        here = f"{where}[{position}]"
        if not isinstance(item, Mapping):
            raise InventoryError(f"{here}: expected a mapping with pid and usedMiB")
        pid, used = item.get("pid"), item.get("usedMiB")
        if not _is_int(pid) or pid <= 0:
            raise InventoryError(f"{here}.pid: expected a positive integer, got {pid!r}")
        if used is not None and (not _is_int(used) or used < 0):
            raise InventoryError(f"{here}.usedMiB: expected a non-negative integer (MiB), got {used!r}")
        if pid in found:
            raise InventoryError(f"{here}.pid: {pid} is listed twice on this card")
        found[pid] = Process(pid=pid, used_mib=used)
    return tuple(found.values())


def _links(value: Any, *, where: str) -> list[Link]:
    if value is None:
        return []
    entries = value.get("links") if isinstance(value, Mapping) else value
    if not isinstance(entries, list):
        raise InventoryError(f"{where}: expected a list of [a, b, level] links (or a mapping with 'links')")
    found: list[Link] = []
    for position, entry in enumerate(entries):
        here = f"{where}[{position}]"
        if not isinstance(entry, list) or len(entry) != 3 or not _is_int(entry[0]) or not _is_int(entry[1]):
            raise InventoryError(f"{here}: expected [a, b, level] with two card indices, got {entry!r}")
        if not isinstance(entry[2], str):
            raise InventoryError(f"{here}: the level must be a string such as NV2, PIX or SYS")
        try:
            found.append(link(entry[0], entry[1], entry[2]))
        except ValueError as error:
            raise InventoryError(f"{here}: {error}") from error
    return found


def _optional_text(value: Any, *, where: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise InventoryError(f"{where}: expected a version string")
    return str(value)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
