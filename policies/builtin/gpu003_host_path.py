"""GPU003: a pod that can reach a GPU node mounts only the host paths and volume types GPU nodes allow.

GPU nodes are a trust zone (`policies.trustzone`). A list of dangerous host paths is always one path
short: the kubelet's FlexVolume plugin directory (the kubelet runs a new driver's `init` as root),
`/etc/ld.so.preload`, cron and systemd directories, udev rules, `modprobe.d` install hooks, other
distributions' static-pod directories, NRI's plugin directory, and the protected directories
themselves under another name (ACK's data-disk nodes bind-mount `/var/lib/container/kubelet` onto
`/var/lib/kubelet`: no rule on the path string can know that). So a pod that can reach a GPU node
(`trustzone.reach`) mounts host paths only from an allowlist: by default lxcfs's `/var/lib/lxcfs`,
`/etc/localtime` and `/usr/share/zoneinfo`, read-only (`trustzone.DEFAULT_HOST_PATHS` says why
each is safe); admins add paths for every namespace (`trustZone.allow.hostPaths`) or some
(`trustZone.namespaces`), read-only unless they say `readOnly: false`. Everything else is refused,
however it is spelled: the path is resolved as the node resolves it first (repeated and trailing
slashes, `.`, `..`, and `/var/run` and `/var/lock` read as `/run` and `/run/lock`), so
`/etc/localtime/../passwd` is `/etc/passwd`, and where a refused path lies in one of the roots
`policies.hostpaths` knows (devices, /proc, /sys, /run, the kubelet's and runtimes' state, ...)
the message names it.

A mount of an allowed read-only path must say `readOnly: true` in every container that mounts the
volume (init, sidecar, regular, and an ephemeral container added later, which may mount a volume
the pod already has); under `/sys/fs/cgroup`, if an admin allows it, also `recursiveReadOnly:
Enabled` (cgroup v1 controllers are submounts a plain read-only bind leaves writable, and a
writable cgroup hierarchy lets a container leave its device cgroup).

Volume types, too, come from an allowlist: Pod Security `restricted`'s (configMap, csi,
downwardAPI, emptyDir, ephemeral, persistentVolumeClaim, projected, secret) plus nfs and image,
and `trustZone.allow.volumeTypes`. gitRepo (git runs on the node: CVE-2018-11235, CVE-2024-10220),
flexVolume (the node's driver runs as root with the pod's options) and the in-tree network block
and file systems (iscsi, rbd, cephfs, glusterfs, ...) are refused.

A pod that asks for no GPU and does not target GPU nodes mounts what it likes: GPU103 keeps it off
GPU nodes (a Docker-in-Docker CI runner with `/lib/modules`, an exporter with the container
runtime's socket, a log shipper with `/var/log`).
"""

from __future__ import annotations

from collections.abc import Iterable

from policies import applicability, policy, trustzone
from policies.builtin import gpu002_privileged


class HostPathDevices(policy.Validator):
    """Refuses host paths and volume types GPU nodes do not allow in pods that can reach a GPU node."""

    id = "GPU003"
    summary = "a pod that can reach a GPU node may mount only the host paths and volume types GPU nodes allow"

    def relevant(self, context: policy.Context, facts: applicability.Facts) -> bool:
        """Only where a volume is of a type outside the built-in safe ones (hostPath among them)."""
        del context
        return facts.unsafe_volumes

    def validate(self, context: policy.Context) -> Iterable[policy.Finding]:
        """A finding per volume (whole pods only) and per writable mount of a read-only host path."""
        return gpu002_privileged.findings(
            context,
            trustzone.VOLUME,
            instead="use an emptyDir, a PersistentVolumeClaim or a ConfigMap, mount an allowed path read-only, "
            "run the part that needs the node in a pod that asks for no GPU (it is kept off GPU nodes), or ask "
            "an admin to allow the path for the namespace (trustZone)",
        )
