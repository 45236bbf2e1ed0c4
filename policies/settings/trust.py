"""`trustZone` and `hostPaths`: what a pod that can reach a GPU node may have (`policies.trustzone`)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from policies import hostpaths, podspec, trustzone
from policies.settings import selection, shapes


@dataclasses.dataclass(frozen=True, kw_only=True)
class ZoneAllowance:
    """More of what pods that can reach a GPU node may have, in the namespaces `match` selects."""

    name: str
    match: selection.NamespaceMatch
    allowance: trustzone.Allowance


def host_paths(value: object) -> hostpaths.HostPathRules:
    if value is None:
        return hostpaths.DEFAULT_RULES
    if not isinstance(value, Mapping):
        raise shapes.InvalidSettings(f"hostPaths: must be a mapping with protect and/or allow, got {value!r}")
    shapes.keys(value, field="hostPaths", known=("protect", "allow"))
    lists = {
        key: () if value.get(key) is None else shapes.strings(value[key], field=f"hostPaths.{key}", allow_empty_list=True)
        for key in ("protect", "allow")
    }
    try:
        return hostpaths.configured(protect=lists["protect"], allow=lists["allow"])
    except ValueError as error:
        raise shapes.InvalidSettings(f"hostPaths.{error}") from None


_ALLOW_KEYS = ("hostPaths", "capabilities", "volumeTypes", "hostPorts", *trustzone.HOST_NAMESPACES)
_ZONE_KEYS = ("strict", "gpuResources", "gpuNodeTaints", "gpuNodeLabels", "hostPorts", "allow", "namespaces")
# Kubernetes label syntax (apimachinery validation IsQualifiedName, IsValidLabelValue).
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def _label_key(key: object, *, field: str) -> str:
    if not isinstance(key, str):
        raise shapes.InvalidSettings(f"{field}: must be a label key, got {key!r}")
    prefix, _, name = key.rpartition("/")
    if not _LABEL_NAME.match(name) or ("/" in key and (not prefix or len(prefix) > 253 or not _LABEL_PREFIX.match(prefix))):
        raise shapes.InvalidSettings(f"{field}: {key!r} is not a valid label key ([prefix/]name, name up to 63 characters)")
    return key


def _gpu_node_labels(value: object, *, field: str) -> tuple[trustzone.NodeLabel, ...]:
    """`trustZone.gpuNodeLabels`: label keys (any value marks a GPU node) or {key, values}."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise shapes.InvalidSettings(f"{field}: must be a list of label keys or {{key: ..., values: [...]}}, got {value!r}")
    found: list[trustzone.NodeLabel] = []
    for index, entry in enumerate(value):
        where = f"{field}[{index}]"
        if isinstance(entry, str):
            entry = {"key": entry}
        if not isinstance(entry, Mapping):
            raise shapes.InvalidSettings(f"{where}: must be a label key or {{key: ..., values: [...]}}, got {entry!r}")
        shapes.keys(entry, field=where, known=("key", "values"))
        key = _label_key(entry.get("key"), field=f"{where}.key")
        values = shapes.strings(entry["values"], field=f"{where}.values") if entry.get("values") is not None else ()
        for position, item in enumerate(values):
            if not _LABEL_VALUE.match(item):
                raise shapes.InvalidSettings(
                    f"{where}.values[{position}]: {item!r} is not a valid label value (up to 63 characters)"
                )
        found.append(trustzone.NodeLabel(key=key, values=values, source="the settings (trustZone.gpuNodeLabels)"))
    return tuple(found)


def _host_ports(value: object, *, field: str) -> tuple[trustzone.PortRange, ...]:
    """A list of host ports and ranges (`8888`, `"8000-8999"`)."""
    if not isinstance(value, list):
        raise shapes.InvalidSettings(f'{field}: must be a list of ports and ranges (8888, "8000-8999"), got {value!r}')
    found: list[trustzone.PortRange] = []
    for index, entry in enumerate(value):
        where = f"{field}[{index}]"
        low: object
        high: object
        if isinstance(entry, int) and not isinstance(entry, bool):
            low = high = entry
        elif isinstance(entry, str) and re.fullmatch(r"\d+(-\d+)?", entry.strip()):
            first, _, last = entry.strip().partition("-")
            low, high = int(first), int(last or first)
        else:
            raise shapes.InvalidSettings(f'{where}: must be a port or a range "LOW-HIGH", got {entry!r}')
        assert isinstance(low, int) and isinstance(high, int)
        if not (1 <= low <= 65535 and 1 <= high <= 65535):
            raise shapes.InvalidSettings(f"{where}: {entry!r} is not within 1-65535")
        if low > high:
            raise shapes.InvalidSettings(f"{where}: {entry!r} is upside down (the first port must not be above the last)")
        found.append(trustzone.PortRange(low=low, high=high))
    return tuple(found)


_RESOURCE_NAME = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def _allowed_host_path(entry: object, *, field: str) -> trustzone.HostPath:
    if isinstance(entry, str):
        entry = {"path": entry}
    if not isinstance(entry, Mapping):
        raise shapes.InvalidSettings(f"{field}: must be an absolute path or {{path: ..., readOnly: false}}, got {entry!r}")
    shapes.keys(entry, field=field, known=("path", "readOnly", "reason"))
    path = entry.get("path")
    if not isinstance(path, str) or not path.startswith("/"):
        raise shapes.InvalidSettings(f"{field}.path: must be an absolute path, got {path!r}")
    resolved = hostpaths.resolve(path)
    if resolved == "/":
        raise shapes.InvalidSettings(
            f"{field}.path: {path!r} is the node's whole filesystem; give the namespaces that need it an exception"
        )
    read_only = entry.get("readOnly", True)
    if not isinstance(read_only, bool):
        raise shapes.InvalidSettings(f"{field}.readOnly: must be true or false, got {read_only!r}")
    reason = entry.get("reason", "")
    if not isinstance(reason, str):
        raise shapes.InvalidSettings(f"{field}.reason: must be a string, got {reason!r}")
    return trustzone.HostPath(path=resolved, read_only=read_only, reason=reason or "allowed by the settings")


def _allow(value: object, *, field: str) -> trustzone.Allowance:
    """The additions of one `allow` mapping, as an Allowance holding only them."""
    if value is None:
        return trustzone.Allowance(capabilities=frozenset(), host_paths=(), volume_types=frozenset(), host_ports=())
    if not isinstance(value, Mapping):
        raise shapes.InvalidSettings(f"{field}: must be a mapping with {', '.join(_ALLOW_KEYS)}, got {value!r}")
    shapes.keys(value, field=field, known=_ALLOW_KEYS)
    paths = value.get("hostPaths") or []
    if not isinstance(paths, list):
        raise shapes.InvalidSettings(f"{field}.hostPaths: must be a list, got {paths!r}")
    capabilities = shapes.strings(value.get("capabilities") or [], field=f"{field}.capabilities", allow_empty_list=True)
    names = frozenset(podspec.capability_name(c) for c in capabilities)
    if "ALL" in names or "SYS_ADMIN" in names:
        raise shapes.InvalidSettings(
            f"{field}.capabilities: ALL and SYS_ADMIN cannot be allowed (the NVIDIA toolkit treats SYS_ADMIN as "
            "privileged); give the namespaces that need them an exception"
        )
    types_ = shapes.strings(value.get("volumeTypes") or [], field=f"{field}.volumeTypes", allow_empty_list=True)
    if "hostPath" in types_:
        raise shapes.InvalidSettings(f"{field}.volumeTypes: hostPath volumes are allowed by path (hostPaths), not as a type")
    namespaces = frozenset(name for name in trustzone.HOST_NAMESPACES if shapes.flag(value.get(name), field=f"{field}.{name}"))
    ports = value.get("hostPorts")
    return trustzone.Allowance(
        capabilities=names,
        host_paths=tuple(_allowed_host_path(p, field=f"{field}.hostPaths[{i}]") for i, p in enumerate(paths)),
        volume_types=frozenset(types_),
        host_namespaces=namespaces,
        host_ports=() if ports is None else _host_ports(ports, field=f"{field}.hostPorts"),
    )


def zone(value: object, legacy: object) -> tuple[trustzone.TrustZone, trustzone.Allowance, tuple[ZoneAllowance, ...]]:
    legacy_paths = tuple(
        trustzone.HostPath(path=p, read_only=False, reason="allowed by the settings (hostPaths.allow)")
        for p in legacy_allow(legacy)
    )
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise shapes.InvalidSettings(f"trustZone: must be a mapping with {', '.join(_ZONE_KEYS)}, got {value!r}")
    shapes.keys(value, field="trustZone", known=_ZONE_KEYS)
    resources = shapes.strings(value.get("gpuResources") or [], field="trustZone.gpuResources", allow_empty_list=True)
    for index, name in enumerate(resources):
        if not _RESOURCE_NAME.match(name.removesuffix("*").rstrip("-_.") or "-"):
            raise shapes.InvalidSettings(
                f"trustZone.gpuResources[{index}]: {name!r} is not a resource name (a trailing * is a prefix)"
            )
    zone = trustzone.TrustZone(
        strict=shapes.flag(value.get("strict"), field="trustZone.strict"),
        gpu_resources=resources,
        gpu_node_taints=shapes.strings(value.get("gpuNodeTaints") or [], field="trustZone.gpuNodeTaints", allow_empty_list=True),
        gpu_node_labels=_gpu_node_labels(value.get("gpuNodeLabels"), field="trustZone.gpuNodeLabels"),
    )
    added = _allow(value.get("allow"), field="trustZone.allow")
    added = dataclasses.replace(added, host_paths=(*added.host_paths, *legacy_paths))
    allowance = trustzone.DEFAULT_ALLOWANCE
    if value.get("hostPorts") is not None:
        allowance = dataclasses.replace(allowance, host_ports=_host_ports(value["hostPorts"], field="trustZone.hostPorts"))
    allowance = allowance.widened(added)
    entries: list[ZoneAllowance] = []
    for field, entry in shapes.entries(
        value.get("namespaces") or [], field="trustZone.namespaces", known=("name", "namespaces", "namespaceSelector", "allow")
    ):
        name, match = selection.anchored_entry(entry, field=field)
        entries.append(ZoneAllowance(name=name, match=match, allowance=_allow(entry.get("allow"), field=f"{field}.allow")))
    return zone, allowance, tuple(entries)


def legacy_allow(value: object) -> tuple[str, ...]:
    if not isinstance(value, Mapping):
        return ()
    found = value.get("allow")
    return tuple(hostpaths.resolve(p) for p in found) if isinstance(found, list) else ()
