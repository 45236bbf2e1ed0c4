"""`inspect -d` and `-o json` put each pod's real use (the labeler's summary) next to its allocation."""

from __future__ import annotations

from typing import Any

from policies.gpu import allocation as allocation_
from policies.gpu import cards, inspection, usage

NOW = 1_800_000_000.0
NODE = "gpu-a"


def _state(make_node: Any, make_gpu_pod: Any) -> cards.NodeState:
    pods = []
    for uid, name, card, mem in (("u0", "train-0", 0, 4), ("u1", "infer-0", 0, 8), ("u2", "idle-0", 1, 2)):
        held = allocation_.Allocation(
            uid=uid, namespace="ml", name=name, node=NODE, cards=(card,), memory_gib=mem, assumed_at=NOW
        )
        pods.append(
            make_gpu_pod(
                name,
                namespace="ml",
                uid=uid,
                mem=mem,
                node_name=NODE,
                annotations=allocation_.bind_annotations(held, card_memory_gib=15),
            )
        )
    return cards.node_state(make_node(NODE, count=2), pods, now=NOW)


SUMMARY = usage.NodeUsage(
    cards=(
        usage.CardUse(
            index=0,
            total_mib=15360,
            pods=(
                usage.PodUse(uid="u0", namespace="ml", name="train-0", used_mib=6144),
                usage.PodUse(uid="u1", namespace="ml", name="infer-0", used_mib=1024),
            ),
        ),
        usage.CardUse(index=1, total_mib=15360),
    )
)


def test_details_show_used_next_to_allocated_per_pod_and_card(make_node: Any, make_gpu_pod: Any) -> None:
    state = _state(make_node, make_gpu_pod)
    lines = inspection.details([state], usage={NODE: SUMMARY}).splitlines()
    table = [line.split() for line in lines[3:7]]
    assert table == [
        ["NAME", "NAMESPACE", "GPU0(Allocated)", "GPU1(Allocated)", "GPU0(Used)", "GPU1(Used)"],
        ["idle-0", "ml", "0", "2", "0", "0"],
        ["infer-0", "ml", "8", "0", "1.0", "0"],
        ["train-0", "ml", "4", "0", "6.0", "0"],  # 6 GiB used of 4 allocated
    ]
    # Without the labeler's summary the view is the seed's.
    assert "(Used)" not in inspection.details([state]) and "(Used)" not in inspection.details([state], usage={})


def test_json_gives_each_pod_its_used_mib_per_card(make_node: Any, make_gpu_pod: Any) -> None:
    state = _state(make_node, make_gpu_pod)
    devices = inspection.as_json([state], usage={NODE: SUMMARY})["nodes"][0]["devs"]
    assert sorted((p["name"], p["usedGPU"], p.get("usedMiB")) for p in devices[0]["pods"]) == [
        ("infer-0", 8, 1024),
        ("train-0", 4, 6144),
    ]
    assert [(p["name"], p.get("usedMiB")) for p in devices[1]["pods"]] == [("idle-0", 0)]
    assert all("usedMiB" not in p for d in inspection.as_json([state])["nodes"][0]["devs"] for p in d["pods"])
