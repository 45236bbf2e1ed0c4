"""Finding the pod spec in Pods and workloads and walking its containers, tolerant of any shape.

Every accessor here accepts whatever a decoded manifest holds: a field of the wrong type reads as
absent (an empty mapping or sequence), never as an exception. The apiserver rejects such objects on
its own; the engine only has to survive them.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from policies import patching

# Where each supported kind keeps its pod template, as JSON-pointer tokens from the object root.
_SPEC_TOKENS: Mapping[str, tuple[str, ...]] = {
    "Pod": ("spec",),
    "PodTemplate": ("template", "spec"),
    "Deployment": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "ReplicationController": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}
SUPPORTED_KINDS: frozenset[str] = frozenset(_SPEC_TOKENS)
WORKLOAD_KINDS: frozenset[str] = SUPPORTED_KINDS - {"Pod"}


class ContainerKind(enum.StrEnum):
    """The three container lists of a pod spec; the value is the field name."""

    INIT = "initContainers"
    REGULAR = "containers"
    EPHEMERAL = "ephemeralContainers"


# The order in which the kubelet starts them; reports list containers in this order too.
CONTAINER_KINDS: tuple[ContainerKind, ...] = (
    ContainerKind.INIT,
    ContainerKind.REGULAR,
    ContainerKind.EPHEMERAL,
)


# ContainerRef and Template are built several times per review (the engine's context, the
# policies' own walks): their __init__ fills the instance dict directly, which costs a third of
# the generated frozen __init__'s object.__setattr__ per field. Still frozen (no setattr), with
# the generated eq, hash and repr.


@dataclasses.dataclass(frozen=True, kw_only=True, init=False)
class ContainerRef:
    """One container of a pod spec with the JSON pointer to it."""

    kind: ContainerKind
    index: int
    path: str  # e.g. /spec/template/spec/initContainers/0
    container: Mapping[str, Any]

    def __init__(self, *, kind: ContainerKind, index: int, path: str, container: Mapping[str, Any]) -> None:
        fields = self.__dict__
        fields["kind"], fields["index"], fields["path"], fields["container"] = kind, index, path, container

    @property
    def name(self) -> str:
        """The container's name, or its position where it has none."""
        name = self.container.get("name")
        return name if isinstance(name, str) and name else f"{self.kind}[{self.index}]"

    @property
    def label(self) -> str:
        """How messages name the container: `container "main"`, `init container "setup"`."""
        prefix = {
            ContainerKind.INIT: "init container",
            ContainerKind.REGULAR: "container",
            ContainerKind.EPHEMERAL: "ephemeral container",
        }[self.kind]
        return f'{prefix} "{self.name}"'


@dataclasses.dataclass(frozen=True, kw_only=True, init=False)
class Template:
    """The pod (or pod template) inside a supported object: its spec and metadata with paths."""

    kind: str
    spec_path: str  # /spec for a Pod, /spec/template/spec for most workloads
    spec: Mapping[str, Any]
    metadata_path: str  # /metadata for a Pod, /spec/template/metadata for most workloads
    metadata: Mapping[str, Any]

    def __init__(
        self, *, kind: str, spec_path: str, spec: Mapping[str, Any], metadata_path: str, metadata: Mapping[str, Any]
    ) -> None:
        fields = self.__dict__
        fields["kind"], fields["spec_path"], fields["spec"] = kind, spec_path, spec
        fields["metadata_path"], fields["metadata"] = metadata_path, metadata

    @property
    def is_pod(self) -> bool:
        """Whether the object is a Pod itself rather than a workload holding a template."""
        return self.kind == "Pod"

    @property
    def annotations(self) -> Mapping[str, Any]:
        """The pod's annotations (empty where absent or malformed)."""
        return mapping(self.metadata.get("annotations"))


def mapping(value: object) -> Mapping[str, Any]:
    """`value` if it is a mapping, else an empty one."""
    # A decoded review holds plain dicts, and an absent field reads as None: the exact tests spare
    # the hot path the ABC check.
    if type(value) is dict:
        return value
    if value is None:
        return {}
    return value if isinstance(value, Mapping) else {}


def sequence(value: object) -> Sequence[Any]:
    """`value` if it is a list or tuple, else an empty sequence (a string is not a sequence here)."""
    return value if type(value) is list or isinstance(value, (list, tuple)) else ()


def whole_number(value: object) -> int | None:
    """`value` as a non-negative integer, given as one or as a string of digits (a label, an annotation), else None."""
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        number = int(value.strip())
        return number if number >= 0 else None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def template(obj: object) -> Template | None:
    """The pod template of a Pod or workload, or None for other kinds and malformed objects."""
    if not isinstance(obj, Mapping):
        return None
    kind = obj.get("kind")
    if not isinstance(kind, str) or kind not in _SPEC_TOKENS:
        return None
    tokens = _SPEC_TOKENS[kind]
    node: object = obj
    for token in tokens:
        node = mapping(node).get(token)
    if not isinstance(node, Mapping):
        return None
    metadata_tokens = (*tokens[:-1], "metadata")
    metadata: object = obj
    for token in metadata_tokens:
        metadata = mapping(metadata).get(token)
    return Template(
        kind=kind,
        spec_path=_pointer(tokens),
        spec=node,
        metadata_path=_pointer(metadata_tokens),
        metadata=mapping(metadata),
    )


@functools.lru_cache(maxsize=64)
def _pointer(tokens: tuple[str, ...]) -> str:
    return patching.pointer(*tokens)


def pod_spec(obj: object) -> tuple[str, Mapping[str, Any]] | None:
    """The JSON pointer to the pod spec of a Pod or workload and the spec; None if there is none."""
    found = template(obj)
    return None if found is None else (found.spec_path, found.spec)


def iter_containers(
    spec: Mapping[str, Any],
    *,
    spec_path: str,
    kinds: Sequence[ContainerKind] = CONTAINER_KINDS,
) -> Iterator[ContainerRef]:
    """Every container of a pod spec (init, regular, ephemeral), skipping malformed entries.

    Indices are the positions in the original list, so paths stay correct when entries are skipped.
    """
    for kind in kinds:
        for index, container in enumerate(sequence(spec.get(kind))):
            if type(container) is dict or isinstance(container, Mapping):
                yield ContainerRef(kind=kind, index=index, path=_container_path(spec_path, kind, index), container=container)


@functools.lru_cache(maxsize=4096)
def _container_path(spec_path: str, kind: str, index: int) -> str:
    # The same few paths for every pod (`/spec/containers/0`): built once, not per policy and pod.
    return patching.join(spec_path, kind, str(index))


def containers(obj: object) -> Iterator[ContainerRef]:
    """Every container of any supported object, with paths from the object's root."""
    found = pod_spec(obj)
    if found is not None:
        path, spec = found
        yield from iter_containers(spec, spec_path=path)


def env_entries(container: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """The well-formed entries of a container's `env` list."""
    for entry in sequence(container.get("env")):
        if isinstance(entry, Mapping):
            yield entry


def has_env(container: Mapping[str, Any], name: str) -> bool:
    """Whether the container's `env` list names `name` (whatever the value)."""
    return any(entry.get("name") == name for entry in env_entries(container))


def is_privileged(container: Mapping[str, Any]) -> bool:
    """Whether the container sets `securityContext.privileged: true`."""
    return mapping(container.get("securityContext")).get("privileged") is True


def capability_name(value: object) -> str:
    """A `capabilities.add` entry as the runtimes read it: upper case, without a `CAP_` prefix.

    containerd's CRI plugin upper-cases each entry and prefixes `CAP_` (containerd/containerd,
    the CRI `WithCapabilities` spec option; `ALL` is compared case-insensitively), so `sys_admin`
    is SYS_ADMIN there. An entry already spelled `CAP_SYS_ADMIN` is read as SYS_ADMIN too: other
    runtimes strip or accept the prefix, and for a refusal the stricter reading is the safe one.
    A non-string entry is "" (the apiserver refuses it anyway).
    """
    if not isinstance(value, str):
        return ""
    name = value.strip().upper()
    return name[len("CAP_") :] if name.startswith("CAP_") else name


def added_capabilities(container: Mapping[str, Any]) -> tuple[str, ...]:
    """The container's `securityContext.capabilities.add` entries as written (strings only)."""
    capabilities = mapping(mapping(container.get("securityContext")).get("capabilities"))
    return tuple(entry for entry in sequence(capabilities.get("add")) if isinstance(entry, str))


def volumes(spec: Mapping[str, Any]) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """The well-formed volumes of a pod spec with their indices."""
    for index, volume in enumerate(sequence(spec.get("volumes"))):
        if isinstance(volume, Mapping):
            yield index, volume


# The Pod subresource through which ephemeral containers are added to a running pod.
EPHEMERAL_SUBRESOURCE = "ephemeralcontainers"


def new_ephemeral_containers(obj: object, *, old_object: object) -> list[ContainerRef]:
    """The ephemeral containers of a Pod that its previous version did not have (by name)."""
    found = template(obj)
    if found is None:
        return []
    old = template(old_object)
    existing = (
        set()
        if old is None
        else {ref.name for ref in iter_containers(old.spec, spec_path=old.spec_path, kinds=(ContainerKind.EPHEMERAL,))}
    )
    return [
        ref
        for ref in iter_containers(found.spec, spec_path=found.spec_path, kinds=(ContainerKind.EPHEMERAL,))
        if ref.name not in existing
    ]
