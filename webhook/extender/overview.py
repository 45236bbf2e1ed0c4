"""The whole-cluster views, `/inspect` and the occupancy families of `/metrics`, kept per node (issue 19).

Both used to recompute every node's card state on every call: more than 5 s per scrape at 5,000
nodes. Here each node's part of both answers (its `inspection.as_json` entry, encoded as
`json.dumps` encodes it, and its sample lines of the `occupancy` families) is kept with the
store's version of the node, and computed again only when that version moves (the node, its
pods or its ledger changed), the reservation TTL setting changes, or the first time-limited
allocation in it stops counting. A call then costs a lookup per node and a join.

The answers are the same bytes as before: `inspect_json` is the body `web.json_response` wrote for
`inspection.as_json(store.all_states(...).values(), usage=inspection.node_usages(store.nodes()))`,
and `metrics_text` what prometheus_client wrote for `occupancy.Collector` and
`occupancy.UsageCollector` over the same store (tests compare them on generated clusters).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any, Protocol

from prometheus_client import exposition
from prometheus_client import registry as prom_registry
from prometheus_client.utils import floatToGoString

from policies import podspec
from policies.gpu import cards, inspection, usage
from webhook.extender import occupancy


class Source(Protocol):
    """What the overview reads of `store.Store`."""

    def nodes(self) -> list[dict[str, Any]]: ...

    def node(self, name: str) -> dict[str, Any] | None: ...

    def version(self, name: str) -> int: ...

    def inspect_state(self, name: str, *, now: float, ttl: float) -> cards.NodeState | None: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Entry:
    version: int
    ttl: float
    computed_at: float
    valid_until: float
    node_json: str | None  # the node's `as_json` entry as json.dumps writes it; None: not a managed node
    table: tuple[int, int] | None  # (used, total) GiB where the cgpu table counts the node in the cluster totals
    occupancy: tuple[str, ...]  # the node's sample lines of each `occupancy.NAMES` family
    usage: tuple[str, ...]  # ... and of each `occupancy.USAGE_NAMES` family


class Overview:
    """`/inspect`'s body and `/metrics`' occupancy text, from per-node parts kept with the store's versions."""

    def __init__(self, source: Source) -> None:
        self._source = source
        self._kept: dict[str, _Entry] = {}
        self._headers = _family_headers()

    def inspect_json(self, *, now: float, ttl: float) -> bytes:
        entries = self._entries(now=now, ttl=ttl)
        texts = [e.node_json for e in entries if e.node_json is not None]
        counted = [e.table for e in entries if e.table is not None]
        used, total = sum(u for u, _ in counted), sum(t for _, t in counted)
        return ('{"nodes": [' + ", ".join(texts) + f'], "totalGPU": {total}, "usedGPU": {used}}}').encode()

    def metrics_text(self, *, now: float, ttl: float) -> str:
        entries = self._entries(now=now, ttl=ttl)
        parts: list[str] = []
        for index, header in enumerate(self._headers[: len(occupancy.NAMES)]):
            parts.append(header)
            parts.extend(e.occupancy[index] for e in entries)
        for index, header in enumerate(self._headers[len(occupancy.NAMES) :]):
            parts.append(header)
            parts.extend(e.usage[index] for e in entries)
        return "".join(parts)

    def prepare(self, name: str, *, now: float, ttl: float) -> None:
        """Compute `name`'s parts now, where they are missing or stale (the app warms every node
        after a start, so the first scrape does not compute them all at once)."""
        version = self._source.version(name)
        entry = self._kept.get(name)
        if entry is None or entry.version != version or entry.ttl != ttl or not entry.computed_at <= now < entry.valid_until:
            fresh = _entry(self._source, name, version=version, now=now, ttl=ttl)
            if fresh is not None:
                self._kept[name] = fresh

    def _entries(self, *, now: float, ttl: float) -> list[_Entry]:
        """Every node's parts, by name, refreshed where the node changed or a time limit passed."""
        source, kept = self._source, self._kept
        names = sorted(str(podspec.mapping(node.get("metadata")).get("name", "")) for node in source.nodes())
        found: list[_Entry] = []
        for name in names:
            version = source.version(name)
            entry = kept.get(name)
            if entry is None or entry.version != version or entry.ttl != ttl or not entry.computed_at <= now < entry.valid_until:
                fresh = _entry(source, name, version=version, now=now, ttl=ttl)
                if fresh is None:
                    continue
                entry = kept[name] = fresh
            found.append(entry)
        if len(kept) > len(found):  # nodes that left
            present = set(names)
            for gone in [name for name in kept if name not in present]:
                del kept[gone]
        return found


def _entry(source: Source, name: str, *, version: int, now: float, ttl: float) -> _Entry | None:
    state = source.inspect_state(name, now=now, ttl=ttl)
    node = source.node(name)
    if state is None or node is None:
        return None
    summary = usage.of_node(node)
    node_json: str | None = None
    occupancy_lines: tuple[str, ...] = ("",) * len(occupancy.NAMES)
    if state.node.cards:
        with_usage = inspection.as_json([state], usage={name: summary} if summary is not None else {})["nodes"][0]
        node_json = json.dumps(with_usage)
        occupancy_lines = _occupancy_lines(with_usage)  # the usage keys it adds are not read there
    table = (state.memory_used, state.memory_total) if inspection.table_nodes([state]) else None
    return _Entry(
        version=version,
        ttl=ttl,
        computed_at=now,
        valid_until=cards.valid_until(state, ttl=ttl),
        node_json=node_json,
        table=table,
        occupancy=occupancy_lines,
        usage=_usage_lines(name, summary),
    )


def _label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _line(name: str, labels: dict[str, str], value: float) -> str:
    """One sample as prometheus_client writes it: labels sorted by name."""
    shown = ",".join(f'{key}="{_label(labels[key])}"' for key in sorted(labels))
    return f"{name}{{{shown}}} {floatToGoString(value)}\n"  # type: ignore[no-untyped-call]  # unannotated upstream


@functools.lru_cache(maxsize=4096)  # few distinct values (GiB multiples, core shares, pod counts)
def _value(value: float) -> str:
    return str(floatToGoString(value))  # type: ignore[no-untyped-call]  # unannotated upstream


def _occupancy_lines(node: inspection.NodeJson) -> tuple[str, ...]:
    """`occupancy.Collector`'s samples of one node, per family: `_line`'s text with the labels
    written in their sorted order once per node and card (5,000 nodes warm after every start)."""
    gib, names = occupancy.GIB, occupancy.NAMES
    shown = _label(node["name"])
    labels = f'{{mode="{_label(node["mode"])}",node="{shown}"}} '  # "mode" < "node"
    node_used = f"{names[0]}{labels}{_value(float(node['usedGPU'] * gib))}\n"
    node_total = f"{names[1]}{labels}{_value(float(node['totalGPU'] * gib))}\n"
    per_card: list[list[str]] = [[], [], [], []]
    for device in node["devs"]:
        card = f'{{card="{_label(str(device["id"]))}",node="{shown}"}} '  # "card" < "node"
        per_card[0].append(f"{names[2]}{card}{_value(float(device['usedGPU'] * gib))}\n")
        per_card[1].append(f"{names[3]}{card}{_value(float(device['totalGPU'] * gib))}\n")
        per_card[2].append(f"{names[4]}{card}{_value(float(device['usedCore']))}\n")
        per_card[3].append(f"{names[5]}{card}{_value(float(len(device['pods'])))}\n")
    return (node_used, node_total, *("".join(lines) for lines in per_card))


def _usage_lines(name: str, summary: usage.NodeUsage | None) -> tuple[str, ...]:
    """`occupancy.UsageCollector`'s samples of one node, per family."""
    if summary is None:
        return ("", "")
    used: list[str] = []
    oob: list[str] = []
    for card in summary.cards:
        labels = {"node": name, "card": str(card.index)}
        real = inspection.real_mib(card)
        if real is not None:
            used.append(_line(occupancy.USAGE_NAMES[0], labels, float(real * occupancy.MIB)))
        oob.append(_line(occupancy.USAGE_NAMES[1], labels, float(card.out_of_band_mib * occupancy.MIB)))
    return ("".join(used), "".join(oob))


def _family_headers() -> tuple[str, ...]:
    """The `# HELP` and `# TYPE` lines of every occupancy family, as prometheus_client writes them."""
    empty = prom_registry.CollectorRegistry(auto_describe=False)
    empty.register(occupancy.Collector(lambda: []))
    empty.register(occupancy.UsageCollector(lambda: {}))
    lines = exposition.generate_latest(empty).decode().splitlines(keepends=True)
    return tuple("".join(lines[i : i + 2]) for i in range(0, len(lines), 2))


class Names:
    """A collector of no samples that names the occupancy families in the registry (`Registry.names`);
    their text comes from `Overview.metrics_text`."""

    def collect(self) -> list[Any]:
        return []
