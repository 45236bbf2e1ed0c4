"""explain and simulate judge card-model annotations per card, with the extender's own placement.

The mixed node has 2 x Tesla-V100-SXM2-16GB (16160 MiB) and 2 x Tesla-V100-SXM2-32GB (32510 MiB).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from policies import gpu
from webhook.explain import cli as explain_cli

NOW = 1_800_000_000.0
Factory = Callable[..., dict[str, Any]]
MIXED = [("Tesla-V100-SXM2-16GB", 16160)] * 2 + [("Tesla-V100-SXM2-32GB", 32510)] * 2


def mixed_node(make_node: Factory) -> dict[str, Any]:
    inventory = [{"index": i, "uuid": f"GPU-{i}", "name": model, "memoryMiB": mib} for i, (model, mib) in enumerate(MIXED)]
    return make_node(
        "mixed",
        count=4,
        gib=23,
        annotations={gpu.INVENTORY_ANNOTATION: json.dumps(inventory)},
        labels={gpu.CARD_MEMORY_MIB_LABEL: "16160"},
        models=[model for model, _ in MIXED],
    )


def annotated(make_pod: Factory, name: str, mem: int, annotations: dict[str, str]) -> dict[str, Any]:
    obj = make_pod(name, mem=mem)
    obj["metadata"]["annotations"] = annotations
    return obj


def test_simulate_places_each_constrained_pod_on_a_card_that_meets_it(make_node: Factory, make_pod: Factory) -> None:
    batch = [
        annotated(make_pod, "large", 4, {gpu.MIN_GPU_MEMORY_ANNOTATION: "20Gi"}),
        annotated(make_pod, "sixteen", 20, {gpu.GPU_MODEL_ANNOTATION: "Tesla-V100-SXM2-16GB"}),
        make_pod("ordinary", mem=4),
    ]

    result = explain_cli.simulate_batch(batch, nodes=[mixed_node(make_node)], pods=[], now=NOW)

    assert result is not None
    assert [(landing.pod, landing.node, landing.cards) for landing in result.landings] == [
        ("team-a/large", "mixed", (2,)),  # admitted without node affinity: the smallest-card label is 16160
        ("team-a/sixteen", "", ()),
        ("team-a/ordinary", "mixed", (0,)),
    ]
    (verdict,) = result.landings[1].verdicts
    assert [str(code) for code in verdict.codes] == ["CARD_MODEL"]
    assert verdict.never
