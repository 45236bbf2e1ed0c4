"""explain's output (the JSON contract, YAML, the grouped table) and the commands end to end on a snapshot:
`snapshot` file shape, `explain pod --snapshot`, a missing pod, a pod with no GPU."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from webhook import cli
from webhook.explain import analysis, render, snapshot

NOW = 1_800_000_000.0
Factory = Callable[..., dict[str, Any]]
REASON_CODES = {
    "MODE_MISMATCH",
    "CARD_MODEL",
    "FRAGMENTED",
    "INSUFFICIENT_MEMORY",
    "CORE_EXHAUSTED",
    "NO_TOPOLOGY_SET",
    "RESERVED_IN_FLIGHT",
    "STALE_ALLOCATION",
    "UNSCHEDULABLE",
    "NO_GPU",
    "BAD_REQUEST",
    "NOT_CACHED",
    "PREEMPTION_IMPOSSIBLE",
}


def _cluster(make_node: Factory, make_pod: Factory, make_placed: Factory) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    nodes = [
        make_node("frag", count=3, gib=16),
        make_node("cordoned", count=2, gib=16, unschedulable=True),
        make_node("topo", mode="topology", placement=None, count=4, gib=32),
    ]
    pods = [make_placed(f"busy-{i}", node_name="frag", card=i, mem=mem) for i, mem in enumerate((10, 12, 12))]
    pods.append(make_pod("want-10", mem=10))
    pods.append(make_pod("cpu-only"))
    return nodes, pods


def _write_snapshot(tmp_path: pathlib.Path, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> str:
    path = tmp_path / "snap.yaml"
    path.write_text(snapshot.dumps(snapshot.take(nodes, pods, now=NOW)))
    return str(path)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_the_json_contract(make_node: Factory, make_pod: Factory, make_placed: Factory) -> None:
    nodes, pods = _cluster(make_node, make_pod, make_placed)
    report = analysis.explain(pods[3], cluster=analysis.Cluster(nodes, pods, now=NOW))
    document = json.loads(render.render(report, output="json"))
    assert set(document) == {"pod", "admission", "request", "bound", "nodes", "suggestion"}
    assert document["pod"] == "team-a/want-10"
    assert document["request"] == {
        "family": "aliyun.com/gpu-mem",
        "memoryGiB": 10,
        "corePercent": 0,
        "cards": 0,
        "modes": ["cgpu", "share", "mps", "core_mem"],
        "selectors": [],
        "problem": "",
    }
    assert [n["node"] for n in document["nodes"]] == ["cordoned", "frag", "topo"]
    for entry in document["nodes"]:
        assert set(entry) == {"node", "fits", "reasons", "cards", "chosen", "preemption"}
        assert entry["preemption"] is None  # every pod here has the default priority
        assert entry["fits"] is False
        assert all(set(r) == {"code", "message"} and r["code"] in REASON_CODES for r in entry["reasons"])
    by_node = {n["node"]: n for n in document["nodes"]}
    assert [r["code"] for r in by_node["frag"]["reasons"]] == ["FRAGMENTED"]
    assert [r["code"] for r in by_node["cordoned"]["reasons"]] == ["UNSCHEDULABLE"]
    assert [r["code"] for r in by_node["topo"]["reasons"]] == ["MODE_MISMATCH"]
    assert by_node["frag"]["cards"][0] == {
        "index": 0,
        "model": "Tesla-T4",
        "memoryGiB": 16,
        "usedGiB": 10,
        "freeGiB": 6,
        "coreUsed": 0,
        "whole": False,
        "pods": ["team-a/busy-0"],
    }
    # the cordoned node is empty: uncordoning (tier 1) beats moving a pod (tier 2)
    assert document["suggestion"]["node"] == "cordoned" and "uncordon" in document["suggestion"]["change"]
    assert yaml.safe_load(render.render(report, output="yaml")) == document


def test_the_table_groups_nodes_by_reason(make_node: Factory, make_pod: Factory, make_placed: Factory) -> None:
    nodes, pods = _cluster(make_node, make_pod, make_placed)
    text = render.table(analysis.explain(pods[3], cluster=analysis.Cluster(nodes, pods, now=NOW)))
    lines = text.splitlines()
    assert lines[0] == "Pod:        team-a/want-10"
    assert lines[2] == "Request:    10 GiB (aliyun.com/gpu-mem) on one card"
    assert "  FRAGMENTED (1 node): frag" in lines
    assert "  UNSCHEDULABLE (1 node): cordoned" in lines
    assert "  MODE_MISMATCH (1 node): topo" in lines
    assert lines[-1].startswith("Best node:  cordoned: uncordon")


def test_snapshot_then_explain_offline(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], make_node: Factory, make_pod: Factory, make_placed: Factory
) -> None:
    nodes, pods = _cluster(make_node, make_pod, make_placed)
    path = _write_snapshot(tmp_path, nodes, pods)
    saved = yaml.safe_load(pathlib.Path(path).read_text())
    assert saved["kind"] == "GPUSnapshot" and len(saved["nodes"]) == 3
    assert sorted(p["metadata"]["name"] for p in saved["pods"]) == ["busy-0", "busy-1", "busy-2", "want-10"]  # no CPU pod
    status, out, err = _run(capsys, "explain", "pod", "want-10", "-n", "team-a", "--snapshot", path, "-o", "json")
    assert status == 0 and err == ""
    document = json.loads(out)
    assert document["admission"]["allowed"] is True
    assert {n["node"]: [r["code"] for r in n["reasons"]] for n in document["nodes"]}["frag"] == ["FRAGMENTED"]


def test_a_missing_pod_is_one_line_and_exit_2(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], make_node: Factory, make_pod: Factory, make_placed: Factory
) -> None:
    nodes, pods = _cluster(make_node, make_pod, make_placed)
    path = _write_snapshot(tmp_path, nodes, pods)
    status, out, err = _run(capsys, "explain", "pod", "nope", "-n", "team-a", "--snapshot", path)
    assert status == 2 and out == ""
    assert err == 'gpu-admission: error: pod "nope" not found in namespace "team-a"\n'


def test_a_pod_asking_no_gpu_says_so_and_exits_0(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], make_node: Factory, make_pod: Factory, make_placed: Factory
) -> None:
    nodes, pods = _cluster(make_node, make_pod, make_placed)
    path = tmp_path / "all.json"
    # snapshots keep GPU pods only; a hand-made one may hold any pod
    document = snapshot.document(snapshot.take(nodes, [], now=NOW))
    document["pods"] = pods
    path.write_text(json.dumps(document))
    status, out, _ = _run(capsys, "explain", "pod", "cpu-only", "-n", "team-a", "--snapshot", str(path))
    assert status == 0
    assert "Request:    no GPU" in out and "asks for no GPU the extender places" in out


def test_a_bad_snapshot_is_one_line(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("kind: Something\n")
    status, out, err = _run(capsys, "explain", "pod", "x", "--snapshot", str(path))
    assert status == 2 and out == "" and err.count("\n") == 1 and "not a GPUSnapshot" in err


def test_a_node_is_named_once_per_code_with_all_its_sentences(make_node: Factory, make_pod: Factory) -> None:
    pinned = make_pod("pinned", mem=4, node_selector={"ack.node.gpu.schedule": "cgpu"})
    nodes = [make_node("topo", mode="topology", placement=None, count=4)]
    lines = render.table(analysis.explain(pinned, cluster=analysis.Cluster(nodes, [pinned], now=NOW))).splitlines()
    assert "  MODE_MISMATCH (1 node): topo" in lines
    (detail,) = [line for line in lines if line.startswith("    topo: ")]
    assert 'nodeSelector ack.node.gpu.schedule="cgpu"' in detail and 'node is in GPU mode "topology"' in detail
