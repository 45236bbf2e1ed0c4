"""GPU003: no hostPath volume reaches the node's devices, container runtimes or control state.

A list of known files is always one file short, so whole roots are protected. A pod that can read
or write under one of them can reach a card outside the scheduler's accounting, or change what the
next GPU container gets:

- `/dev` (the cards' `/dev/nvidia*`, `/dev/dri` and every other device node), except `/dev/shm`;
- `/proc` (`/proc/1/root` is the host's whole filesystem, every socket included) and `/sys` (the
  cards' PCI resources and device attributes), except `/sys/fs/cgroup`, which monitoring agents
  read: changing a device cgroup there needs CAP_SYS_ADMIN, which GPU002 refuses in GPU pods;
- `/run`, all of it: the runtime sockets (`/run/containerd`, `/run/crio`, `/run/docker.sock`,
  `/run/cri-dockerd.sock`), the NRI socket (`/run/nri`, a plugin may add `/dev/nvidia*` to later
  containers), CDI's runtime specs (`/run/cdi`) and the NVIDIA driver and toolkit directories;
- the kubelet's state `/var/lib/kubelet` (other pods' service-account tokens under `pods`, its
  credentials in `pki`, `plugins_registry` where a fake device plugin registers, `device-plugins`,
  `pod-resources`) and `/etc/kubernetes` (static pod manifests, which never pass admission, and
  kubeconfigs);
- the container runtimes' state and configuration (`/var/lib/containerd`, `/var/lib/docker`,
  `/var/lib/containers`, `/etc/containerd`, `/etc/docker`, `/etc/containers` and CRI-O's OCI hooks
  in `/usr/share/containers`, ...), the NVIDIA container toolkit's configuration
  (`/etc/nvidia-container-runtime`, `/etc/nvidia-container-toolkit`: its root hook can be
  repointed), CDI specs (`/etc/cdi`: what a GPU request injects) and CNI (`/etc/cni`, `/opt/cni`:
  run as root for every pod);
- the programs and libraries the runtime runs as root when it starts a GPU container (runc,
  `nvidia-container-runtime`, its hook and `nvidia-container-cli` in `/usr/bin` or `/usr/local`,
  the driver's `libnvidia-ml` in `/usr/lib`): `/usr/bin`, `/usr/sbin`, `/usr/lib`, `/usr/lib64`,
  `/usr/local`, `/bin`, `/sbin`, `/lib`, `/lib64`.

A path is refused when it lies in a protected root or is a parent of one (`/`, `/var`, `/var/lib`,
`/etc`, `/usr`, `/opt`, ...), after resolving it the way the node does: repeated and trailing
slashes and `.` go, `..` goes up (the apiserver refuses `..` in hostPath.path, but `dry-run` sees
files that never reached it), a relative path is read from `/`, and `/var/run` and `/var/lock` are
read as `/run` and `/run/lock`, the symbolic links every current distribution ships, so
`/var/run/../etc` is `/etc`. The merged-/usr links (`/bin` -> `/usr/bin`, ...) are not followed:
both sides are protected, and read literally `/bin/..` stays at `/`, the stricter reading.

Protected leaves are refused like roots, but their parents are not: the CUDA MPS control daemon's
pipe directory `/tmp/nvidia-mps` (its default `CUDA_MPS_PIPE_DIRECTORY`) and its log directories
(`/var/log/nvidia-mps`, the default `CUDA_MPS_LOG_DIRECTORY`, and `/tmp/nvidia-log`, the one
NVIDIA's MPS guide starts the daemon with). Through the pipes a pod runs work in another tenant's
MPS server or sends the control daemon commands (`quit`, `set_default_device_pinned_mem_limit`,
`set_default_active_thread_percentage`, `start_server`) that change every tenant's share of the
card. Refusing their parents would refuse `/tmp` and `/var/log` (log agents) everywhere, so a
hostPath of `/tmp` itself is admitted and reaches the pipes: on nodes that run MPS with its
default pipe directory, admins add `/tmp` to `hostPaths.protect`. A pod without the card's device
nodes gets no card from the pipes: since Volta, MPS clients submit work to the GPU themselves and
need the device nodes the device plugin gives them (NVIDIA's MPS guide; NVIDIA/nvidia-docker#1120:
a client seeing another card than the server does not work). The NVIDIA device plugin's own MPS
directory `/run/nvidia/mps` lies in `/run`. The `CUDA_MPS_*` variables are not guarded: the pipe
and log directory variables reach only directories the container can see, the thread and
pinned-memory limits can only narrow what the control daemon set (NVIDIA's MPS guide). An MPS
setup whose pods mount the default pipe directory by hostPath (instead of through the device
plugin) allows it with `hostPaths.allow: [/tmp/nvidia-mps]`.

Everything else passes, for instance `/var/log` and `/var/log/pods` (log agents), `/etc/localtime`,
`/etc/ssl/certs`, `/tmp`, `/data`, `/mnt/disks/ssd0`, `/dev/shm` and `/sys/fs/cgroup`.

`/var/log/pods` and its parent `/var/log` (log agents) pass only read-only: every container that
mounts the volume must say `readOnly: true`. The kubelet serves `kubectl logs` from the container's
log file under `/var/log/pods` and resolves symbolic links first (kubernetes pkg/kubelet/kuberuntime/
logs/logs.go `ReadLogs`: `filepath.EvalSymlinks`, "the container log path is owned by kubelet and
the container runtime"), so a pod that can write there replaces its own `0.log` with a link to any
host file, `/var/lib/kubelet/pods/<uid>/volumes/.../token` of the labeler included, and reads it as
root with `kubectl logs`.

`/sys/fs/cgroup` (and what lies under it) passes only read-only, recursively: every container that
mounts the volume (init, sidecar, regular, and an ephemeral container added later, which may mount
a volume the pod already has) must say `readOnly: true` and `recursiveReadOnly: Enabled`. On a
cgroup v1 node a writable cgroupfs is a way out of the container's device cgroup without any
capability: the kernel lets a root-uid writer move any task into any cgroup of the hierarchy
(linux kernel/cgroup/cgroup-v1.c `__cgroup1_procs_write` checks only the uid), so the container
moves itself into the devices hierarchy's root (`a *:* rwm`), creates `/dev/nvidia*` with mknod
(containerd's default capabilities include CAP_MKNOD) and opens every card of the node. A plain
`readOnly: true` is not enough there: it makes only the top bind mount read-only, and cgroup v1
mounts each controller below `/sys/fs/cgroup` as a submount that stays writable (Kubernetes
KEP-3857, recursive read-only mounts, GA in 1.33). `IfPossible` is not enough either: it falls back
to the plain read-only mount on kernels before 5.12 and on runtimes without support, which is
where cgroup v1 nodes are. On cgroup v2 nodes the runtime gives containers a private cgroup
namespace, which keeps migrations inside the container's own cgroup, but a pod cannot tell which
kind of node it lands on. An admin who allows `/sys/fs/cgroup` (or `/sys/fs`), or `/var/log/pods`
(or `/var/log`), explicitly in `hostPaths.allow` lifts its read-only condition.

Admins extend both sides in the settings (`hostPaths`, see `hostpaths.configured`): `protect` adds
roots, such as a kubelet root directory or `staticPodPath` outside the defaults; `allow` lets one
path and what lies under it through, such as `/run/xtables.lock` for a CNI agent. An allowed path is
never a parent of, nor equal to, a protected root, so allowing a path never uncovers another root; a
namespace that needs a whole root (a node agent) gets an exception instead.
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Mapping

from policies import applicability, hostpaths, podspec, policy


class HostPathDevices(policy.PodValidator):
    """Refuses hostPath volumes in, or above, the node's devices, runtimes and control state."""

    id = "GPU003"
    summary = "hostPath volumes must not reach the node's devices, container runtimes or control state"

    def relevant(self, context: policy.Context, facts: applicability.Facts) -> bool:
        """Only where a volume has a hostPath (both parts judge hostPath volumes only)."""
        del context
        return facts.host_path_volumes

    def validate(self, context: policy.Context) -> Iterable[policy.Finding]:
        """The volumes' findings (whole pods only), then writable mounts of read-only-only host paths.

        The second part also runs on the `ephemeralcontainers` subresource: an ephemeral container
        cannot add a volume, but it can mount one the pod already has.
        """
        findings = list(self.check_pod(context)) if context.whole_pod else []
        findings.extend(_writable_mounts(context))
        return findings

    def check_pod(self, context: policy.Context) -> Iterable[policy.Finding]:
        """A finding per offending hostPath volume."""
        rules = context.settings.host_paths
        findings: list[policy.Finding] = []
        for index, volume in podspec.volumes(context.template.spec):
            path = podspec.mapping(volume.get("hostPath")).get("path")
            if not isinstance(path, str):
                continue
            verdict = rules.judge(path)
            if verdict is None:
                continue
            name = volume.get("name") if isinstance(volume.get("name"), str) else f"volumes[{index}]"
            resolved = hostpaths.resolve(path)
            shown = resolved if resolved == path else f"{resolved} (written {path!r})"
            where = "contains" if verdict.contains else "lies in"
            findings.append(
                policy.Finding(
                    detail=(
                        f'volume "{name}" mounts hostPath {shown}, which {where} the protected {verdict.root} '
                        f"({verdict.reason}); use an emptyDir, a PersistentVolumeClaim or a ConfigMap, request "
                        "GPUs as resources, or ask an admin to allow the path (hostPaths.allow)"
                    )
                )
            )
        return findings


_READ_ONLY_REASONS: Mapping[str, str] = types.MappingProxyType({
    "/sys/fs/cgroup": "recursively: a writable cgroup v1 hierarchy lets a container leave its device cgroup "
    "and open every GPU",
    "/var/log/pods": "the kubelet follows a symbolic link planted there when it serves kubectl logs, and reads "
    "any host file as root, other pods' service-account tokens among them",
})


def _writable_mounts(context: policy.Context) -> list[policy.Finding]:
    """A finding per mount, by a container in scope, of a read-only-only hostPath that is not recursively read-only."""
    rules = context.settings.host_paths
    if not rules.read_only:
        return []
    guarded: dict[str, tuple[str, str]] = {}  # volume name -> (path as written, read-only root)
    for _, volume in podspec.volumes(context.template.spec):
        path = podspec.mapping(volume.get("hostPath")).get("path")
        name = volume.get("name")
        if not isinstance(path, str) or not isinstance(name, str) or rules.judge(path) is not None:
            continue  # a refused path already has its finding; a malformed one mounts nothing
        root = rules.read_only_root(path)
        if root is not None:
            guarded[name] = (path, root)
    if not guarded:
        return []
    findings: list[policy.Finding] = []
    for container in context.containers:
        for entry in podspec.sequence(container.container.get("volumeMounts")):
            mount = podspec.mapping(entry)
            name = mount.get("name")
            if not isinstance(name, str) or name not in guarded:
                continue
            path, root = guarded[name]
            recursive = rules.read_only[root]
            if mount.get("readOnly") is True and (not recursive or mount.get("recursiveReadOnly") == "Enabled"):
                continue
            needs = "readOnly: true and recursiveReadOnly: Enabled" if recursive else "readOnly: true"
            findings.append(
                policy.Finding(
                    detail=(
                        f'{container.label} mounts volume "{name}" (hostPath {hostpaths.resolve(path)}) at '
                        f"{mount.get('mountPath')!s} without {needs}; {root} may only be mounted read-only "
                        f"({_READ_ONLY_REASONS.get(root, 'protected by the settings')}); add "
                        f"{'both fields' if recursive else 'it'} to the volumeMount"
                    )
                )
            )
    return findings
