"""From the cards' processes to their pods: the usage summary of one node (`policies.gpu.usage`).

Pure apart from the `identify` callable it is given (in production `cgroups.read` over the host's
`/proc`). A process is attributed to a pod when its cgroup names the UID of a pod the apiserver
has on this node, or the config hash of a mirror pod there (a static pod's processes run under
the hash, which the kubelet uses as the static pod's UID). Every other process with a readable
cgroup is out-of-band, whatever its cgroup says: a runtime container started beside the kubelet,
a plain host process, a static pod without a mirror, or the leftover of a pod that is gone.

With no pod list at all (`pods` None: `--dry-run` without a cluster, or listing pods failed) a
process in a pod's cgroup is attributed to that pod by UID alone, with its namespace and name
unknown (""); only processes outside any pod's cgroup are out-of-band then.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from policies.gpu import usage
from webhook.labeler import cgroups, inventory

MIRROR_HASH_ANNOTATION = "kubernetes.io/config.hash"


@dataclasses.dataclass(frozen=True, kw_only=True)
class PodRef:
    """A pod on this node as the apiserver lists it."""

    uid: str
    namespace: str
    name: str
    config_hash: str = ""  # mirror pods: the static pod's UID on the node

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> PodRef:
        metadata = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
        assert isinstance(metadata, Mapping)
        annotations = metadata.get("annotations") if isinstance(metadata.get("annotations"), Mapping) else {}
        assert isinstance(annotations, Mapping)
        config_hash = annotations.get(MIRROR_HASH_ANNOTATION)
        return cls(
            uid=str(metadata.get("uid") or ""),
            namespace=str(metadata.get("namespace") or ""),
            name=str(metadata.get("name") or ""),
            config_hash=config_hash if isinstance(config_hash, str) else "",
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProcessView:
    """One process as `--dry-run` shows it."""

    card: int
    pid: int
    used_mib: int | None
    identity: cgroups.Identity | None
    pod: PodRef | None
    out_of_band: bool


Identify = Callable[[int], cgroups.Identity | None]


def views(inv: inventory.Inventory, *, pods: Iterable[PodRef] | None, identify: Identify) -> list[ProcessView]:
    """Every process of every card with its pod (or out-of-band, or unknown where identity is None)."""
    known = _index(pods)
    found: list[ProcessView] = []
    for card in inv.cards:
        for process in card.processes:
            identity = identify(process.pid)
            pod: PodRef | None = None
            out_of_band = False
            if identity is not None:
                if known is None:
                    pod = PodRef(uid=identity.pod_uid, namespace="", name="") if identity.pod_uid else None
                else:
                    pod = known.get(identity.pod_uid) if identity.pod_uid else None
                out_of_band = pod is None
            found.append(
                ProcessView(
                    card=card.index,
                    pid=process.pid,
                    used_mib=process.used_mib,
                    identity=identity,
                    pod=pod,
                    out_of_band=out_of_band,
                )
            )
    return found


def summarise(
    inv: inventory.Inventory, *, pods: Iterable[PodRef] | None, identify: Identify, now: float | None = None
) -> usage.NodeUsage:
    """The node's usage summary: per card, memory used, the pods' processes summed per pod, and the
    out-of-band and unreadable processes."""
    by_card: dict[int, list[ProcessView]] = {}
    for view in views(inv, pods=pods, identify=identify):
        by_card.setdefault(view.card, []).append(view)
    cards: list[usage.CardUse] = []
    for card in inv.cards:
        pod_mib: dict[str, int] = {}
        pod_pids: dict[str, int] = {}
        pod_refs: dict[str, PodRef] = {}
        oob: list[usage.OutOfBand] = []
        unknown: list[int] = []
        for view in by_card.get(card.index, []):
            if view.identity is None:
                unknown.append(view.pid)
            elif view.pod is not None:
                pod_mib[view.pod.uid] = pod_mib.get(view.pod.uid, 0) + (view.used_mib or 0)
                pod_pids[view.pod.uid] = pod_pids.get(view.pod.uid, 0) + 1
                pod_refs[view.pod.uid] = view.pod
            else:
                oob.append(
                    usage.OutOfBand(
                        pid=view.pid,
                        used_mib=view.used_mib,
                        container_id=view.identity.container_id,
                        pod_uid=view.identity.pod_uid,
                    )
                )
        cards.append(
            usage.CardUse(
                index=card.index,
                total_mib=card.memory_mib,
                used_mib=card.used_mib,
                pods=tuple(
                    usage.PodUse(
                        uid=uid, namespace=ref.namespace or "?", name=ref.name or "?", used_mib=pod_mib[uid], pids=pod_pids[uid]
                    )
                    for uid, ref in pod_refs.items()
                ),
                out_of_band=tuple(oob),
                unknown=tuple(unknown),
            )
        )
    return usage.NodeUsage(cards=tuple(cards), at=_timestamp(now))


def _index(pods: Iterable[PodRef] | None) -> dict[str, PodRef] | None:
    if pods is None:
        return None
    index: dict[str, PodRef] = {}
    for pod in pods:
        if pod.uid:
            index[pod.uid] = pod
        if pod.config_hash:
            index.setdefault(pod.config_hash, pod)
    return index


def _timestamp(now: float | None) -> str:
    if now is None:
        return ""
    return datetime.datetime.fromtimestamp(now, tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
