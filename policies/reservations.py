"""The scheduler extender's reservation ledger on a Node: its format and its one codec.

The ledger is the node annotation `gpu-admission.io/reservations`, the commit record of binds in
flight (the extender's `binder` holds the protocol): a JSON object from pod UID to the allocation
the pod was given, compact and sorted by UID so equal ledgers are equal strings:

    {"<uid>":{"pod":"ns/name","node":"gpu-0","cards":[1],"memGiB":4,"corePercent":0,"whole":false,
              "assumedAt":"2026-11-26T12:00:00.000Z","expires":"2026-11-26T12:02:00.000Z"}}

An entry's fields are those of the pod allocation annotation (`policies.allocation`) plus `pod`
(namespace/name) and `expires`. An unexpired entry holds its cards for a pod that is not seen bound
yet; `prune` drops expired entries and those of pods already bound or finished.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from typing import Any

from policies import allocation, gpu, podspec

# A ledger entry younger than this is a bind in flight: its pod may not show up bound (or even in a
# watch cache) yet. Older entries of pods that are gone or placed elsewhere are dropped early.
IN_FLIGHT_GRACE_S = 10.0


def encode(ledger: Mapping[str, allocation.Allocation]) -> str:
    """The ledger annotation value (compact; sorted so equal ledgers are equal strings)."""
    document = {
        uid: {"pod": entry.pod_key, **allocation.fields(entry), "expires": allocation.timestamp(entry.expires or 0.0)}
        for uid, entry in sorted(ledger.items())
    }
    return json.dumps(document, separators=(",", ":"))


def decode(text: str) -> dict[str, allocation.Allocation]:
    """The ledger by pod UID; `gpu.AnnotationError` names the first malformed entry."""
    return _decode(text, strict=True)


def read(text: str | None) -> dict[str, allocation.Allocation]:
    """The ledger by pod UID; malformed entries are dropped, an unreadable ledger is empty (never raises)."""
    return dict(_read(text))


def node_reservations(node: Mapping[str, Any]) -> dict[str, allocation.Allocation]:
    """The ledger a Node object carries (empty where it has none)."""
    annotations = podspec.mapping(podspec.mapping(node.get("metadata")).get("annotations"))
    text = annotations.get(gpu.RESERVATIONS_ANNOTATION)
    return read(text if isinstance(text, str) else None)


def prune(
    ledger: Mapping[str, allocation.Allocation], *, pods: Iterable[Mapping[str, Any]], now: float
) -> dict[str, allocation.Allocation]:
    """The ledger without expired entries and without pods already seen bound (or finished).

    A bound pod carries its allocation annotation (bind writes it before creating the Binding), so
    its ledger entry is no longer needed; and a pod never unbinds.
    """
    settled = {
        uid
        for uid, pod in ((str(podspec.mapping(p.get("metadata")).get("uid", "")), p) for p in pods)
        if uid and (allocation.bound_node(pod) or allocation.is_terminal(pod))
    }
    return {uid: entry for uid, entry in ledger.items() if (entry.expires or 0.0) > now and uid not in settled}


@functools.lru_cache(maxsize=4096)  # pure; callers get a fresh dict
def _read(text: str | None) -> tuple[tuple[str, allocation.Allocation], ...]:
    if not text:
        return ()
    try:
        return tuple(_decode(text, strict=False).items())
    except gpu.AnnotationError:
        return ()


def _decode(text: str, *, strict: bool) -> dict[str, allocation.Allocation]:
    key = gpu.RESERVATIONS_ANNOTATION
    try:
        document = json.loads(text)
    except ValueError as error:
        raise gpu.AnnotationError(f"{key}: not JSON ({error})") from None
    if not isinstance(document, Mapping):
        raise gpu.AnnotationError(f"{key}: expected a JSON object from pod UID to entry, got {type(document).__name__}")
    found: dict[str, allocation.Allocation] = {}
    for uid, entry in document.items():
        try:
            found[uid] = _entry(uid, entry, key=f"{key}: entry {uid!r}")
        except gpu.AnnotationError:
            if strict:
                raise
    return found


def _entry(uid: str, entry: object, *, key: str) -> allocation.Allocation:
    if not isinstance(entry, Mapping):
        raise gpu.AnnotationError(f"{key}: expected an object, got {type(entry).__name__}")
    node, cards, memory, core, whole, assumed = allocation.read_fields(entry, key=key)
    expires = allocation.parse_time(entry.get("expires"))
    pod = entry.get("pod")
    if expires is None:
        raise gpu.AnnotationError(f"{key}: expires must be an RFC 3339 time, got {entry.get('expires')!r}")
    if not isinstance(pod, str):
        raise gpu.AnnotationError(f"{key}: pod must be a namespace/name string, got {pod!r}")
    namespace, _, name = pod.partition("/")
    return allocation.Allocation(
        uid=uid, namespace=namespace, name=name, node=node, cards=cards, memory_gib=memory, core_percent=core,
        whole=whole, assumed_at=assumed, expires=expires, source="reservation",
    )
