"""What a pod holds on a node's cards, as its annotations say: the allocation annotations' one codec.

The scheduler extender's bind writes them (`bind_annotations`); the extender's accounting,
`inspect`, `explain` and the audit read them back (`pod_allocation`). Two sets of keys
(`gpu.ALLOCATION_ANNOTATIONS`, which only a Binding from the extender may carry, GPU008):

- gpushare's, for its device plugin: `ALIYUN_COM_GPU_MEM_IDX` (the card index of a shared pod; the
  comma list of indices for whole cards), `ALIYUN_COM_GPU_MEM_POD` (the pod's GiB) and
  `ALIYUN_COM_GPU_MEM_DEV` (the card's GiB), both for shared pods only,
  `ALIYUN_COM_GPU_MEM_ASSIGNED` (`false`; the device plugin flips it) and
  `ALIYUN_COM_GPU_MEM_ASSUME_TIME` (nanoseconds since the epoch);
- ours, `gpu-admission.io/allocation`, compact JSON:
  `{"node":"gpu-0","cards":[1],"memGiB":4,"corePercent":0,"whole":false,"assumedAt":"2026-11-26T12:00:00.000Z"}`
  (`cards` a non-empty list of card indices; `memGiB` and `corePercent` per card; `whole` for
  `aliyun.com/gpu` pods, whose cards nobody else may use; times are RFC 3339 UTC with milliseconds).

What a pod holds (`pod_allocation`): a pod bound to a node (`spec.nodeName`) holds what our
annotation says when it names that node, else what gpushare's say (pods placed by gpushare before
us); a pod not bound yet holds what our annotation says for `ttl` seconds after `assumedAt` (a bind
in flight). Succeeded and Failed pods hold nothing; terminating ones still do, since their
processes hold the card until they exit.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
from collections.abc import Mapping
from typing import Any, TypeGuard

from policies import gpu, podspec

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
DEFAULT_RESERVATION_TTL_S = 120.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Allocation:
    """What one pod holds on one node: cards, and GiB and core percent on each of them."""

    uid: str
    namespace: str
    name: str
    node: str
    cards: tuple[int, ...]
    memory_gib: int = 0  # per card
    core_percent: int = 0  # per card
    whole: bool = False  # whole cards (aliyun.com/gpu): nobody else may use them
    assumed_at: float | None = None  # unix seconds of the bind decision
    expires: float | None = None  # reservations only
    bound: bool = False
    source: str = "allocation"  # "allocation" (our annotation), "gpushare" or "reservation"

    @property
    def pod_key(self) -> str:
        return f"{self.namespace}/{self.name}"


def encode(allocation: Allocation) -> str:
    """The value of `gpu.ALLOCATION_ANNOTATION` for an allocation."""
    return json.dumps(fields(allocation), separators=(",", ":"))


def fields(allocation: Allocation) -> dict[str, Any]:
    """The JSON fields of an allocation, in their written order (the ledger's entries share them)."""
    return {
        "node": allocation.node,
        "cards": list(allocation.cards),
        "memGiB": allocation.memory_gib,
        "corePercent": allocation.core_percent,
        "whole": allocation.whole,
        "assumedAt": timestamp(allocation.assumed_at or 0.0),
    }


def decode(text: str) -> Allocation:
    """Our allocation annotation read back (uid, namespace and name empty); `gpu.AnnotationError` when malformed."""
    document = gpu.load_annotation(text, key=gpu.ALLOCATION_ANNOTATION)
    if not isinstance(document, Mapping):
        raise gpu.AnnotationError(f"{gpu.ALLOCATION_ANNOTATION}: expected a JSON object, got {type(document).__name__}")
    parsed = read_fields(document, key=gpu.ALLOCATION_ANNOTATION)
    node, cards, memory, core, whole, assumed = parsed
    return Allocation(
        uid="",
        namespace="",
        name="",
        node=node,
        cards=cards,
        memory_gib=memory,
        core_percent=core,
        whole=whole,
        assumed_at=assumed,
    )


Fields = tuple[str, tuple[int, ...], int, int, bool, float | None]  # node, cards, GiB, core %, whole, assumedAt


def read_fields(document: Mapping[str, Any], *, key: str) -> Fields:
    """The allocation fields of a JSON object (our annotation, or a ledger entry); `gpu.AnnotationError` names the bad one."""
    node, cards = document.get("node"), document.get("cards")
    memory, core = document.get("memGiB", 0), document.get("corePercent", 0)
    whole = document.get("whole", False)
    if not isinstance(node, str) or not node:
        raise gpu.AnnotationError(f"{key}: node must be a non-empty string, got {node!r}")
    if not isinstance(cards, list) or not cards or not all(_is_count(card) for card in cards):
        raise gpu.AnnotationError(f"{key}: cards must be a non-empty list of card indices, got {cards!r}")
    for name, value in (("memGiB", memory), ("corePercent", core)):
        if not _is_count(value):
            raise gpu.AnnotationError(f"{key}: {name} must be a non-negative integer, got {value!r}")
    if not isinstance(whole, bool):
        raise gpu.AnnotationError(f"{key}: whole must be true or false, got {whole!r}")
    return node, tuple(cards), memory, core, whole, parse_time(document.get("assumedAt"))


def bind_annotations(allocation: Allocation, *, card_memory_gib: int) -> dict[str, str]:
    """Every annotation bind writes: the gpushare-compatible ones and our JSON allocation.

    `ALIYUN_COM_GPU_MEM_IDX` holds one index for a shared pod, as gpushare's device plugin expects;
    for whole cards it is the comma list of indices. `ALIYUN_COM_GPU_MEM_POD` and `_DEV` are written
    for shared pods only (they are GiB of `aliyun.com/gpu-mem`, which whole-card pods do not ask for).
    """
    assumed = allocation.assumed_at or 0.0
    found = {
        gpu.GPUSHARE_MEM_IDX_ANNOTATION: ",".join(str(card) for card in allocation.cards),
        gpu.GPUSHARE_MEM_ASSIGNED_ANNOTATION: "false",
        gpu.GPUSHARE_MEM_ASSUME_TIME_ANNOTATION: str(int(assumed * 1_000_000_000)),
        gpu.ALLOCATION_ANNOTATION: encode(allocation),
    }
    if not allocation.whole:
        found[gpu.GPUSHARE_MEM_POD_ANNOTATION] = str(allocation.memory_gib)
        found[gpu.GPUSHARE_MEM_DEV_ANNOTATION] = str(card_memory_gib)
    return found


def pod_allocation(pod: Mapping[str, Any], *, now: float, ttl: float = DEFAULT_RESERVATION_TTL_S) -> Allocation | None:
    """What the pod holds according to its annotations, or None when it holds nothing now."""
    if is_terminal(pod):
        return None
    metadata = podspec.mapping(pod.get("metadata"))
    annotations = podspec.mapping(metadata.get("annotations"))
    uid, namespace, name = str(metadata.get("uid", "")), str(metadata.get("namespace", "")), str(metadata.get("name", ""))
    bound_to = bound_node(pod)
    ours = _read(_string(annotations.get(gpu.ALLOCATION_ANNOTATION)))
    if ours is not None:
        node, cards, memory, core, whole, assumed = ours
        if bound_to and bound_to != node:
            return None  # placed elsewhere by someone else; the annotation is stale
        if not bound_to and (assumed is None or assumed + ttl <= now):
            return None  # an annotated pod that never got bound: the reservation has expired
        return Allocation(
            uid=uid,
            namespace=namespace,
            name=name,
            node=node,
            cards=cards,
            memory_gib=memory,
            core_percent=core,
            whole=whole,
            assumed_at=assumed,
            bound=bool(bound_to),
        )
    if not bound_to:
        return None
    index = podspec.whole_number(annotations.get(gpu.GPUSHARE_MEM_IDX_ANNOTATION))
    shared = podspec.whole_number(annotations.get(gpu.GPUSHARE_MEM_POD_ANNOTATION))
    if index is None or shared is None:
        return None
    return Allocation(
        uid=uid, namespace=namespace, name=name, node=bound_to, cards=(index,), memory_gib=shared, bound=True, source="gpushare"
    )


def annotated_node(pod: Mapping[str, Any]) -> str:
    """The node a pod's (valid) allocation annotation names, expired or stale ones too; "" where there is none."""
    annotations = podspec.mapping(podspec.mapping(pod.get("metadata")).get("annotations"))
    parsed = _read(_string(annotations.get(gpu.ALLOCATION_ANNOTATION)))
    return parsed[0] if parsed is not None else ""


def bound_node(pod: Mapping[str, Any]) -> str:
    """The node a pod is bound to (`spec.nodeName`); "" when it is not bound."""
    node = podspec.mapping(pod.get("spec")).get("nodeName")
    return node if isinstance(node, str) else ""


def is_terminal(pod: Mapping[str, Any]) -> bool:
    """Whether the pod has finished (Succeeded or Failed): it holds no card any more."""
    return podspec.mapping(pod.get("status")).get("phase") in TERMINAL_PHASES


def timestamp(unix: float) -> str:
    """RFC 3339 UTC with milliseconds, as the annotations hold times."""
    moment = datetime.datetime.fromtimestamp(unix, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_time(value: object) -> float | None:
    """Unix seconds of an annotation's time (a naive time is UTC); None when it is no time."""
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


@functools.lru_cache(maxsize=65536)  # pure and immutable: one entry per allocated pod
@functools.lru_cache(
    maxsize=4096
)  # a pure function of an immutable string: every reader of one pod, and the extender's re-reads, share one json.loads
def _read(text: str | None) -> Fields | None:
    if not text:
        return None
    try:
        document = json.loads(text)
    except ValueError:
        return None
    if not isinstance(document, Mapping):
        return None
    try:
        return read_fields(document, key=gpu.ALLOCATION_ANNOTATION)
    except gpu.AnnotationError:
        return None


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _string(value: object) -> str | None:
    return value if isinstance(value, str) else None
