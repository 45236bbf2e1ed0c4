"""`--honour-out-of-band-usage`: a node's cards as the extender sees them, less what out-of-band processes hold.

Off by default. When on, every Node the extender reads (its watch cache, the Nodes kube-scheduler
sends, and the fresh read bind decides on) passes through `honour_out_of_band`: each card of the
labeler's inventory annotation shrinks by the memory that out-of-band processes (processes that
belong to no pod: `docker run --gpus`, `ctr run`, host processes, leftovers; see `policies.gpu.usage`)
hold on it in the labeler's usage summary. A card with 6000 MiB held out-of-band on a 15360 MiB
card offers `(15360 - 6000) // 1024 = 9` GiB instead of 15, so a new pod is not placed onto memory
that is already taken.

The trade-off: the summary is as fresh as the labeler's last write (a significant change, at most
once per its `--usage-interval`), so a process that just started is not seen yet and one that just
ended still holds its memory for up to an interval; and whoever can start processes on a node can
make its cards look smaller to the scheduler (it can fill them anyway). Pods' own processes never
shrink a card: their memory is already counted by their allocations.

Nodes without an inventory annotation (cards from capacity alone) or without a summary are left
as they are. Pure: data in, data out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from policies import gpu, podspec
from policies.gpu import inventory, usage


def honour_out_of_band(node: Mapping[str, Any]) -> Mapping[str, Any]:
    """`node` with its inventory's cards reduced by their out-of-band memory (the same object when nothing changes)."""
    metadata = podspec.mapping(node.get("metadata"))
    annotations = podspec.mapping(metadata.get("annotations"))
    summary = usage.parse(annotations.get(usage.USAGE_ANNOTATION))
    text = annotations.get(gpu.INVENTORY_ANNOTATION)
    if summary is None or not isinstance(text, str):
        return node
    taken = {card.index: card.out_of_band_mib for card in summary.cards if card.out_of_band_mib > 0}
    if not taken:
        return node
    listed = inventory.read_inventory(text)
    if not listed:
        return node  # nothing readable to shrink: the extender counts the node's capacity instead
    changed = [
        dataclasses.replace(card, memory_mib=max(0, card.memory_mib - taken[card.index])) if card.index in taken else card
        for card in listed
    ]
    return {
        **node,
        "metadata": {**metadata, "annotations": {**annotations, gpu.INVENTORY_ANNOTATION: inventory.encode_inventory(changed)}},
    }
