"""`kubectl inspect cgpu`: the seed's table, the -d details and the JSON, from the shared state."""

from __future__ import annotations

from typing import Any

from policies.gpu import allocation as allocation_
from policies.gpu import cards, inspection

NOW = 1_800_000_000.0
Factory = Any
NODE = "cn-shanghai.192.0.2.109"

# The seed 002_e2b829a309310c51.txt, binpack example, whitespace as printed there.
SEED_BINPACK = """\
NAME IPADDRESS GPU0(Allocated/Total) GPU1(Allocated/Total) GPU2(Allocated/Total) GPU3(Allocated/Total) GPU Memory(GiB)
cn-shanghai.192.0.2.109 192.0.2.109 15/15 9/15 0/15 0/15 24/60
--------------------------------------------------------------------------------------
Allocated/Total GPU Memory In Cluster:
24/60 (40%)"""


def _states(
    make_node: Factory, make_gpu_pod: Factory, placed: list[tuple[str, int, int]], **node_kwargs: Any
) -> list[cards.NodeState]:
    obj = make_node(NODE, **node_kwargs)
    pods = []
    for i, (name, card, mem) in enumerate(placed):
        allocation = allocation_.Allocation(
            uid=f"u{i}", namespace="default", name=name, node=NODE, cards=(card,), memory_gib=mem, assumed_at=NOW
        )
        pods.append(
            make_gpu_pod(
                name,
                namespace="default",
                uid=f"u{i}",
                mem=mem,
                node_name=NODE,
                annotations=allocation_.bind_annotations(allocation, card_memory_gib=15),
            )
        )
    return [cards.node_state(obj, pods, now=NOW)]


BINPACK = [("binpack-0", 0, 5), ("binpack-1", 0, 5), ("binpack-2", 0, 5), ("binpack-3", 1, 5), ("binpack-4", 1, 4)]


def test_the_summary_is_the_seed_table(make_node: Factory, make_gpu_pod: Factory) -> None:
    text = inspection.summary(_states(make_node, make_gpu_pod, BINPACK))
    assert "\n".join(" ".join(line.split()) if not line.startswith("-") else line for line in text.splitlines()) == SEED_BINPACK
    assert text == (
        "NAME                     IPADDRESS    GPU0(Allocated/Total)  GPU1(Allocated/Total)  GPU2(Allocated/Total)  GPU3(Allocated/Total)  GPU Memory(GiB)\n"
        "cn-shanghai.192.0.2.109  192.0.2.109  15/15                  9/15                   0/15                   0/15                   24/60\n"
        "--------------------------------------------------------------------------------------\n"
        "Allocated/Total GPU Memory In Cluster:\n"
        "24/60 (40%)\n"
    )


def test_the_summary_of_the_spread_example(make_node: Factory, make_gpu_pod: Factory) -> None:
    placed = [("spread-0", 0, 4), ("spread-1", 1, 4), ("spread-2", 3, 4)]
    lines = inspection.summary(_states(make_node, make_gpu_pod, placed, placement="spread")).splitlines()
    assert lines[1].split() == [NODE, "192.0.2.109", "4/15", "4/15", "0/15", "4/15", "12/60"]
    assert lines[-1] == "12/60 (20%)"


def test_only_shared_nodes_are_tabled_and_short_nodes_get_dashes(make_node: Factory) -> None:
    states = [
        cards.node_state(make_node("a-four"), [], now=NOW),
        cards.node_state(make_node("b-two", count=2, gib=22, mode="core_mem"), [], now=NOW),
        cards.node_state(make_node("c-topo", mode="topology", count=8), [], now=NOW),
        cards.node_state(make_node("d-exclusive", mode="default"), [], now=NOW),
    ]
    lines = inspection.summary(states).splitlines()
    assert [line.split()[0] for line in lines[1:3]] == ["a-four", "b-two"]
    assert lines[2].split()[2:] == ["0/22", "0/22", "-", "-", "0/44"]
    assert lines[-1] == "0/104 (0%)"


def test_an_empty_cluster_prints_zero_of_zero(make_node: Factory) -> None:
    assert inspection.summary([]).splitlines()[-1] == "0/0 (0%)"


def test_details_list_each_pod_with_its_gib_per_card(make_node: Factory, make_gpu_pod: Factory) -> None:
    text = inspection.details(_states(make_node, make_gpu_pod, BINPACK))
    lines = text.splitlines()
    assert lines[0] == f"NAME:       {NODE}" and lines[1] == "IPADDRESS:  192.0.2.109"
    assert lines[3].split() == ["NAME", "NAMESPACE", "GPU0(Allocated)", "GPU1(Allocated)", "GPU2(Allocated)", "GPU3(Allocated)"]
    assert lines[4].split() == ["binpack-0", "default", "5", "0", "0", "0"]
    assert lines[8].split() == ["binpack-4", "default", "0", "4", "0", "0"]
    assert "Allocated :  24 (40%)" in lines and "Total :      60" in lines
    assert lines[-2:] == ["Allocated/Total GPU Memory In Cluster:", "24/60 (40%)"]


def test_json_carries_cards_pods_and_cores(make_node: Factory, make_gpu_pod: Factory) -> None:
    document = inspection.as_json(_states(make_node, make_gpu_pod, BINPACK))
    (node,) = document["nodes"]
    assert (node["name"], node["usedGPU"], node["totalGPU"], node["placement"]) == (NODE, 24, 60, "binpack")
    assert [d["usedGPU"] for d in node["devs"]] == [15, 9, 0, 0]
    assert [p["name"] for p in node["devs"][1]["pods"]] == ["binpack-3", "binpack-4"]
    assert (document["usedGPU"], document["totalGPU"]) == (24, 60)


def test_name_output_is_a_node_line_per_tabled_node(make_node: Factory) -> None:
    states = [
        cards.node_state(make_node("b-shared"), [], now=NOW),
        cards.node_state(make_node("a-shared", mode="core_mem"), [], now=NOW),
        cards.node_state(make_node("c-topo", mode="topology"), [], now=NOW),
    ]
    assert inspection.names(states) == "node/a-shared\nnode/b-shared\n"
    assert inspection.names([]) == ""


def test_wide_output_is_a_row_per_card_with_model_and_uuid(make_node: Factory, make_gpu_pod: Factory) -> None:
    inventoried = cards.node_state(make_node("a-inv", count=2, inventory=[15360, 15360]), [], now=NOW)
    [placed] = _states(make_node, make_gpu_pod, BINPACK)
    lines = inspection.wide([placed, inventoried]).splitlines()
    assert lines[0].split() == [
        "NAME",
        "IPADDRESS",
        "MODE",
        "GPU",
        "MODEL",
        "UUID",
        "ALLOCATED/TOTAL(GiB)",
        "CORE(%)",
        "USED(GiB)",
        "PODS",
    ]
    assert lines[1].split() == ["a-inv", "192.0.2.109", "cgpu", "0", "Tesla-T4", "GPU-0000", "0/15", "0", "-", "0"]
    assert lines[2].split() == ["a-inv", "192.0.2.109", "cgpu", "1", "Tesla-T4", "GPU-0001", "0/15", "0", "-", "0"]
    # a node advertising capacity only has no model or UUID to show
    assert lines[3].split() == [NODE, "192.0.2.109", "cgpu", "0", "-", "-", "15/15", "0", "-", "3"]
    assert lines[4].split()[6:] == ["9/15", "0", "-", "2"]
    assert lines[-1] == "24/90 (26%)"
