"""`explain` names the namespace's GPU budget when it is why a pod waits (NAMESPACE_BUDGET), issue 36."""

from __future__ import annotations

import argparse
import json
import pathlib
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from policies import settings
from policies.gpu import budgets
from tests.unit.explain.conftest import NOW
from webhook import cli
from webhook.cmdline import errors as cmd_errors
from webhook.explain import analysis, budget, render, snapshot
from webhook.explain import cli as explain_cli
from webhook.kube import errors as kube_errors

Factory = Callable[..., dict[str, Any]]


def config(memory: str = "32Gi", **extra: Any) -> settings.Settings:
    return settings.from_mapping({"gpuBudgets": [{"name": "team-a", "namespaces": ["team-a"], "memory": memory, **extra}]})


def cluster(make_node: Factory, make_pod: Factory, make_placed: Factory) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """team-a holds 29 GiB (8 + 8 + 8 + 5 on shared T4s) and asks for 4 more; team-b holds 10."""
    nodes = [make_node("gpu-0", count=3), make_node("gpu-1", count=3)]
    pods = [make_placed(f"busy-{i}", node_name="gpu-0", card=i, mem=8) for i in range(3)]
    pods.append(make_placed("small", node_name="gpu-1", card=0, mem=5))
    pods.append(make_placed("other", node_name="gpu-1", card=1, mem=10, namespace="team-b"))
    pods.append(make_pod("want", mem=4))
    return nodes, pods


def explain(
    pod: dict[str, Any],
    nodes: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    loaded: settings.Settings | None,
    *,
    labels: dict[str, str] | None = None,
    leases: list[dict[str, Any]] | None = None,
) -> analysis.Report:
    judged = explain_cli.Budgets(gpu_budgets=loaded.gpu_budgets if loaded else None, namespace_labels=labels)
    return explain_cli.explain_pod(pod, nodes=nodes, pods=pods, now=NOW, settings=loaded, leases=leases or [], budgets=judged)


def test_a_budget_with_no_room_is_the_reason_on_every_node(make_node: Factory, make_pod: Factory, make_placed: Factory) -> None:
    nodes, pods = cluster(make_node, make_pod, make_placed)

    report = explain(pods[-1], nodes, pods, config("32Gi"), labels={})

    note = report.budget
    assert note is not None and note.state == budget.OVER
    assert note.reason is not None and str(note.reason.code) == "NAMESPACE_BUDGET"
    message = "budget 'team-a' (32Gi of GPU memory): 29 GiB used + 4 GiB asked > 32 GiB of GPU memory"
    assert note.reason.message == message
    assert [(v.node, v.fits, [str(c) for c in v.codes]) for v in report.nodes] == [
        ("gpu-0", False, ["NAMESPACE_BUDGET"]),
        ("gpu-1", False, ["NAMESPACE_BUDGET"]),
    ]
    lines = render.table(report).splitlines()
    assert f"Budget:     NAMESPACE_BUDGET {message}" in lines
    assert lines[-1] == "Best node:  none until the namespace's budget has room for the pod (NAMESPACE_BUDGET)"
    document = json.loads(render.render(report, output="json"))
    assert document["budget"]["state"] == "over" and document["budget"]["reason"] == {
        "code": "NAMESPACE_BUDGET",
        "message": message,
    }
    assert (document["budget"]["usedMiB"], document["budget"]["askedMiB"]) == (29 * 1024, 4 * 1024)


def test_a_budget_with_room_changes_nothing(make_node: Factory, make_pod: Factory, make_placed: Factory) -> None:
    nodes, pods = cluster(make_node, make_pod, make_placed)

    report = explain(pods[-1], nodes, pods, config("33Gi"), labels={})

    assert report.budget is not None and report.budget.state == budget.FITS and report.budget.reason is None
    assert [v.node for v in report.nodes if v.fits] == ["gpu-0", "gpu-1"]
    assert "Budget:     budget 'team-a' (33Gi of GPU memory): 29 GiB used + 4 GiB asked fits" in render.table(report)
    assert report.nodes == analysis.explain(pods[-1], cluster=analysis.Cluster(nodes, pods, now=NOW)).nodes


def test_no_settings_file_means_not_judged_not_unlimited(make_node: Factory, make_pod: Factory, make_placed: Factory) -> None:
    nodes, pods = cluster(make_node, make_pod, make_placed)

    report = explain(pods[-1], nodes, pods, None)

    assert report.budget is not None and report.budget.state == budget.UNKNOWN
    assert "Budget:     not judged: no settings file given (--config FILE)" in render.table(report)
    assert [v.node for v in report.nodes if v.fits] == ["gpu-0", "gpu-1"]  # nothing guessed either way


def test_unreadable_namespace_labels_leave_a_selector_budget_unjudged(
    make_node: Factory, make_pod: Factory, make_placed: Factory
) -> None:
    nodes, pods = cluster(make_node, make_pod, make_placed)
    by_label = settings.from_mapping(
        {"gpuBudgets": [{"name": "ml", "namespaceSelector": {"matchLabels": {"team": "a"}}, "memory": "8Gi"}]}
    )

    unread = explain(pods[-1], nodes, pods, by_label, labels=None)
    labelled = explain(pods[-1], nodes, pods, by_label, labels={"team": "a"})
    unlabelled = explain(pods[-1], nodes, pods, by_label, labels={})

    assert unread.budget is not None and unread.budget.state == budget.UNKNOWN
    assert "could not be read" in unread.budget.why and "'ml'" in unread.budget.why
    assert labelled.budget is not None and labelled.budget.state == budget.OVER
    assert unlabelled.budget is not None and unlabelled.budget.state == budget.UNLIMITED
    assert unlabelled.budget.describe() == "none: namespace team-a has no GPU budget (unlimited)"


def test_whole_cards_are_refused_only_where_the_largest_cards_go_over(make_node: Factory, make_pod: Factory) -> None:
    nodes = [make_node("small", mode="topology", count=2, gib=16), make_node("big", mode="topology", count=2, gib=40)]
    want = make_pod("want", whole=1)

    report = explain(want, nodes, [want], config("20Gi"), labels={})

    note = report.budget
    assert note is not None and note.state == budget.OVER and note.reason is None  # it fits the budget on "small"
    assert set(note.per_node) == {"big"}
    assert "0 GiB used + 40 GiB asked > 20 GiB" in note.per_node["big"].message
    assert {v.node: v.fits for v in report.nodes} == {"small": True, "big": False}


def test_a_device_plugin_pod_is_judged_by_the_largest_card(make_node: Factory, make_pod: Factory) -> None:
    nodes = [make_node("plain", mode="default", count=2, gib=16)]
    want = make_pod("want")
    want["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 1}}

    blocked = explain(want, nodes, [want], config("8Gi"), labels={})
    room = explain(want, nodes, [want], config("16Gi"), labels={})

    assert blocked.budget is not None and blocked.budget.reason is not None
    assert blocked.budget.reason.message.endswith("0 GiB used + 16 GiB asked > 8 GiB of GPU memory")
    assert "Budget:     NAMESPACE_BUDGET" in render.table(blocked)
    assert room.budget is not None and room.budget.state == budget.FITS


def test_the_pods_own_ledger_entry_is_not_counted_against_it(make_node: Factory, make_pod: Factory, make_placed: Factory) -> None:
    nodes, pods = cluster(make_node, make_pod, make_placed)
    want = pods[-1]
    uid = want["metadata"]["uid"]
    entry = budgets.Entry(uid=uid, pod="team-a/want", charge=budgets.Charge(memory_mib=4096), assumed_at=NOW - 1)
    lease = budgets.lease_body("team-a", {uid: entry}, "extender-0")

    report = explain(want, nodes, pods, config("32Gi"), labels={}, leases=[lease])

    assert report.budget is not None and report.budget.state == budget.CHARGED
    assert report.budget.used.memory_mib == 33 * 1024
    assert all(v.fits for v in report.nodes)


def test_the_cli_reads_budgets_from_config_and_a_snapshot_keeps_ledgers_and_labels(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], make_node: Factory, make_pod: Factory, make_placed: Factory
) -> None:
    nodes, pods = cluster(make_node, make_pod, make_placed)
    gated = make_pod("gated", mem=2)  # let through the budget gate: its 2 GiB are in the ledger, not on a node
    entry = budgets.Entry(
        uid=gated["metadata"]["uid"], pod="team-a/gated", charge=budgets.Charge(memory_mib=2048), assumed_at=NOW
    )
    lease = budgets.lease_body("team-a", {entry.uid: entry}, "extender-0")
    taken = snapshot.take(nodes, [*pods, gated], now=NOW, leases=[lease], namespace_labels={"team-a": {"tier": "gold"}})
    path = tmp_path / "snap.yaml"
    path.write_text(snapshot.dumps(taken))
    settings_file = tmp_path / "settings.yaml"
    settings_file.write_text(
        yaml.safe_dump(
            {"gpuBudgets": [{"name": "gold", "namespaceSelector": {"matchLabels": {"tier": "gold"}}, "memory": "34Gi"}]}
        )
    )

    status = cli.main(
        ["explain", "pod", "want", "-n", "team-a", "--snapshot", str(path), "--config", str(settings_file), "-o", "json"]
    )
    judged = json.loads(capsys.readouterr().out)
    status_bare = cli.main(["explain", "pod", "want", "-n", "team-a", "--snapshot", str(path)])
    bare = capsys.readouterr().out

    assert status == 0 and status_bare == 0
    assert judged["budget"]["state"] == "over" and judged["budget"]["budget"] == "gold"
    assert judged["budget"]["reason"]["message"].endswith("31 GiB used + 4 GiB asked > 34 GiB of GPU memory")
    assert "Budget:     not judged: no settings file given (--config FILE)" in bare


class FakeApi:
    def __init__(self, found: dict[str, Any] | None) -> None:
        self.found = found
        self.asked: list[str] = []

    def request(self, method: str, path: str) -> dict[str, Any]:
        self.asked.append(f"{method} {path}")
        if self.found is None:
            raise kube_errors.KubeError('namespaces "team-a" is forbidden', status=403)
        return self.found


def test_live_namespace_labels_are_read_and_a_refusal_is_said_not_guessed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = argparse.Namespace(snapshot=None, kubeconfig=None, context=None)
    readable = FakeApi({"metadata": {"name": "team-a", "labels": {"tier": "gold"}}})
    monkeypatch.setattr(explain_cli, "_client", lambda _: readable)

    assert explain_cli.read_namespace_labels(args, "team-a") == {"tier": "gold"}
    assert readable.asked == ["GET /api/v1/namespaces/team-a"]

    monkeypatch.setattr(explain_cli, "_client", lambda _: FakeApi(None))
    assert explain_cli.read_namespace_labels(args, "team-a") is None
    assert "warning: cannot read namespace team-a" in capsys.readouterr().err


def test_malformed_namespace_labels_in_a_snapshot_are_refused_naming_the_key(tmp_path: pathlib.Path) -> None:
    document = snapshot.document(snapshot.take([], [], now=NOW, namespace_labels={"team-a": {}}))
    assert document["namespaceLabels"] == {"team-a": {}}
    document["namespaceLabels"] = ["team-a"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))

    with pytest.raises(cmd_errors.InputError, match="namespaceLabels must map each namespace to its labels"):
        snapshot.load(str(path))
