"""Which host paths reach a node's devices, container runtimes or control state, read as the node reads them.

The protected roots and leaves, the paths that pass only read-only, the host's symbolic links, and
the admin's additions (`configured`). Since GPU nodes became a trust zone (`policies.trustzone`)
what GPU003 refuses is every path its allowlist does not name; these roots only say, in its
messages, what a refused path lies in, and `resolve` reads a path as the node does.
Pure data and functions: nothing here knows a policy.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping, Sequence

# The protected roots, resolved as `resolve` writes them, with what each one exposes.
PROTECTED_ROOTS: Mapping[str, str] = types.MappingProxyType(
    {
        "/dev": "device nodes, the GPUs' among them",
        "/proc": "the host's processes and, through /proc/1/root, its whole filesystem",
        "/sys": "the cards' PCI resources and device attributes",
        "/run": "container runtime, NRI and device-plugin sockets, CDI specs and the NVIDIA runtime directories",
        "/var/lib/kubelet": "the kubelet's state: pod tokens, credentials, device-plugin and plugin registries",
        "/var/lib/containerd": "the container runtime's state",
        "/var/lib/docker": "the container runtime's state",
        "/var/lib/dockershim": "the container runtime's state",
        "/var/lib/cri-dockerd": "the container runtime's state",
        "/var/lib/containers": "the container runtime's state",
        "/var/lib/crio": "the container runtime's state",
        "/etc/kubernetes": "static pod manifests and kubeconfigs",
        "/etc/containerd": "the container runtime's configuration",
        "/etc/crio": "the container runtime's configuration",
        "/etc/docker": "the container runtime's configuration",
        "/etc/containers": "the container runtime's configuration and OCI hooks",
        "/usr/share/containers": "OCI hooks, the NVIDIA hook among them",
        "/etc/nvidia-container-runtime": "the NVIDIA container toolkit's configuration",
        "/etc/nvidia-container-toolkit": "the NVIDIA container toolkit's configuration",
        "/etc/cdi": "CDI specs, which say what a GPU request injects",
        "/etc/cni": "CNI configuration, run as root for every pod",
        "/opt/cni": "CNI plugins, run as root for every pod",
        "/usr/bin": "programs the runtime runs as root, the NVIDIA runtime and hook among them",
        "/usr/sbin": "programs the runtime runs as root",
        "/usr/local": "programs the runtime runs as root, the NVIDIA toolkit among them",
        "/bin": "programs the runtime runs as root",
        "/sbin": "programs the runtime runs as root",
        "/usr/lib": "libraries the NVIDIA hook loads as root and injects, the driver's among them",
        "/usr/lib64": "libraries the NVIDIA hook loads as root and injects",
        "/lib": "libraries and kernel modules, the driver's among them",
        "/lib64": "libraries the NVIDIA hook loads as root and injects",
    }
)
# Protected like roots, but their parents (`/tmp`, `/var/log`) are not refused: see the docstring.
PROTECTED_LEAVES: Mapping[str, str] = types.MappingProxyType(
    {
        "/tmp/nvidia-mps": "the CUDA MPS control daemon's pipes, which run work in and reconfigure every tenant's MPS server",
        "/tmp/nvidia-log": "the CUDA MPS control daemon's logs",
        "/var/log/nvidia-mps": "the CUDA MPS control daemon's logs",
    }
)
# Children of protected roots that expose no device, runtime or control state.
BUILT_IN_ALLOWED: tuple[str, ...] = ("/dev/shm", "/sys/fs/cgroup")
# Paths that pass (with what lies under them, and their parents that pass at all) only when every
# mount of the volume is read-only; True: recursively (`recursiveReadOnly: Enabled`). See the docstring.
READ_ONLY_PATHS: Mapping[str, bool] = types.MappingProxyType({"/sys/fs/cgroup": True, "/var/log/pods": False})
CONFIGURED_REASON = "protected by the settings (hostPaths.protect)"
# Symbolic links every current distribution ships; the node resolves them, so this module does too.
HOST_LINKS: Mapping[tuple[str, ...], tuple[str, ...]] = types.MappingProxyType(
    {("var", "run"): ("run",), ("var", "lock"): ("run", "lock")}
)


def resolve(path: str) -> str:
    """`path` as the node resolves it: absolute, `.`, `..`, repeated slashes and the host links resolved."""
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
            continue
        parts.append(part)
        link = HOST_LINKS.get(tuple(parts))
        if link is not None:
            parts = list(link)
    return "/" + "/".join(parts)


def within(path: str, root: str) -> bool:
    """Whether resolved `path` is `root` or lies under it."""
    return path == root or root == "/" or path.startswith(root + "/")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Verdict:
    """Why a host path is refused: the protected root it lies in, or contains."""

    root: str
    reason: str
    contains: bool  # True: the path is a parent of the root; False: it lies in the root


@dataclasses.dataclass(frozen=True, kw_only=True)
class HostPathRules:
    """The protected roots and the allowed paths, all resolved; the default is the built-in set.

    A path is refused when it is a parent of a protected root, or lies in one and not in an allowed
    path. `configured` guarantees that no allowed path contains a protected root, so "allowed wins"
    never uncovers one.
    """

    protect: Mapping[str, str] = dataclasses.field(default_factory=lambda: PROTECTED_ROOTS)
    allow: tuple[str, ...] = BUILT_IN_ALLOWED
    # Passed only for read-only mounts (READ_ONLY_PATHS: path -> whether recursively).
    read_only: Mapping[str, bool] = dataclasses.field(default_factory=lambda: READ_ONLY_PATHS)
    # Refused like roots, but a parent of a leaf is not refused for it (PROTECTED_LEAVES).
    leaves: Mapping[str, str] = dataclasses.field(default_factory=lambda: PROTECTED_LEAVES)
    # Every strict parent of a protected root, for one lookup per path instead of a scan of roots.
    _parents: frozenset[str] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parents = {ancestor for root in self.protect for ancestor in _ancestors(root)[:-1]}
        object.__setattr__(self, "_parents", frozenset(parents))

    def judge(self, path: str) -> Verdict | None:
        """Why `path` (as written in a pod) is refused; None when it may be mounted."""
        resolved = resolve(path)
        if resolved in self._parents:
            root = next(r for r in self.protect if r != resolved and within(r, resolved))
            return Verdict(root=root, reason=self.protect[root], contains=True)
        ancestors = _ancestors(resolved)
        protected = [i for i, a in enumerate(ancestors) if a in self.protect or a in self.leaves]
        # Only an allowed path at or below the innermost protected one lets it through: `configured`
        # keeps allowed paths out of roots' parents, and an allowed `/var/log` must not uncover the
        # leaf `/var/log/nvidia-mps` in it.
        if not protected or any(a in self.allow for a in ancestors[protected[-1] :]):
            return None
        inside = ancestors[protected[0]] if ancestors[protected[-1]] in self.protect else ancestors[protected[-1]]
        reason = self.protect[inside] if inside in self.protect else self.leaves[inside]
        return Verdict(root=inside, reason=reason, contains=False)

    def read_only_root(self, path: str) -> str | None:
        """The read-only path that `path` (as written) lies in or contains; None when it has none."""
        resolved = resolve(path)
        return next((r for r in self.read_only if within(resolved, r) or within(r, resolved)), None)


def _ancestors(path: str) -> list[str]:
    """`/`, then each longer prefix of resolved `path`, ending with `path` itself."""
    found = ["/"]
    end = path.find("/", 1)
    while end != -1:
        found.append(path[:end])
        end = path.find("/", end + 1)
    if path != "/":
        found.append(path)
    return found


DEFAULT_RULES = HostPathRules()


def configured(*, protect: Sequence[str] = (), allow: Sequence[str] = ()) -> HostPathRules:
    """The built-in rules with the admin's extra roots and allowed paths; ValueError names the entry.

    Entries are absolute paths, resolved like a pod's. An extra root at or under a built-in allowed
    path (`/dev/shm`, `/sys/fs/cgroup`) takes that allowance away; allowing a READ_ONLY_PATHS entry
    (or a parent of it) explicitly lifts its read-only condition. An allowed path may not be, or
    contain, a protected root, and an extra root may not lie in an allowed path: either would make
    one setting silently undo the other.
    """
    roots = dict(PROTECTED_ROOTS)
    extra: list[str] = []
    for index, entry in enumerate(protect):
        resolved = _entry(entry, field=f"protect[{index}]")
        roots.setdefault(resolved, CONFIGURED_REASON)
        extra.append(resolved)
    built_in = [a for a in BUILT_IN_ALLOWED if not any(within(root, a) for root in extra)]
    allowed = list(built_in)
    for index, entry in enumerate(allow):
        resolved = _entry(entry, field=f"allow[{index}]")
        for root in roots:
            if within(root, resolved):
                relation = "is" if root == resolved else "contains"
                raise ValueError(
                    f"allow[{index}]: {entry!r} {relation} the protected root {root}; allow a path below it, "
                    "or give the namespaces that need all of it an exception"
                )
        allowed.append(resolved)
    explicit = allowed[len(built_in) :]
    read_only = {r: rec for r, rec in READ_ONLY_PATHS.items() if not any(within(r, a) for a in explicit)}
    return HostPathRules(
        protect=types.MappingProxyType(roots),
        allow=tuple(dict.fromkeys(allowed)),
        read_only=types.MappingProxyType(read_only),
    )


def _entry(value: object, *, field: str) -> str:
    if not isinstance(value, str) or not value.startswith("/"):
        raise ValueError(f"{field}: must be an absolute path, got {value!r}")
    return resolve(value)
