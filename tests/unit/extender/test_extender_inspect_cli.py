"""`gpu-admission inspect` (and `kubectl inspect cgpu`) print the per-card table, or write it whole to
``--output-file`` in the chosen format; nothing then goes to stdout."""

from __future__ import annotations

import json
import pathlib
import time
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from policies.gpu import allocation, dra, reservations
from webhook.cmdline import errors
from webhook.extender import cli as extender_cli
from webhook.extender import kube as extender_kube


@pytest.fixture
def cluster(
    monkeypatch: pytest.MonkeyPatch, make_node: Callable[..., dict[str, Any]], make_gpu_pod: Callable[..., dict[str, Any]]
) -> None:
    """The apiserver inspect lists from: one 4 x 15 GiB node, one pod running on it."""
    entry = allocation.Allocation(
        uid="u-waiting",
        namespace="team-a",
        name="waiting",
        node="gpu-0",
        cards=(1,),
        memory_gib=5,
        assumed_at=time.time(),
        expires=time.time() + 600,
        source="reservation",
    )
    listed = {
        "/api/v1/nodes": [make_node("gpu-0")],
        "/api/v1/pods": [make_gpu_pod("trainer", mem=3, node_name="gpu-0", phase="Running")],
        f"/apis/coordination.k8s.io/v1/namespaces/{reservations.LEDGER_NAMESPACE}/leases": [
            reservations.lease_body("gpu-0", "", {entry.uid: entry}, "a-replica")
        ],
        dra.SLICES_PATH: [],  # DRA allocates nothing here
        dra.CLAIMS_PATH: [],
        "/api/v1/namespaces": [{"metadata": {"name": "team-a", "labels": {"team": "a"}}}],
    }

    class Api:
        def __init__(self, _client: Any) -> None:
            pass

        def list(self, path: str, *, label_selector: str = "") -> tuple[list[Any], str]:
            assert label_selector == ("gpu-admission.io/ledger=true" if "leases" in path else "")
            return listed[path], "1"

    monkeypatch.setattr(extender_kube, "KubeApi", Api)
    monkeypatch.setattr(extender_kube, "load_client", lambda *_args, **_kwargs: object())


@pytest.mark.parametrize("fmt", ["json", "yaml", "table"])
def test_output_file_gets_the_same_report_stdout_would(
    cluster: None, fmt: str, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert extender_cli.inspect_main(["-o", fmt]) == 0
    printed = capsys.readouterr().out
    target = tmp_path / f"cards.{fmt}"
    assert extender_cli.inspect_main(["-o", fmt, "--output-file", str(target)]) == 0
    assert capsys.readouterr().out == ""
    assert target.read_text(encoding="utf-8") == printed
    if fmt == "table":
        assert "gpu-0" in printed
    else:
        document = json.loads(printed) if fmt == "json" else yaml.safe_load(printed)
        assert [(n["name"], n["totalGPU"], len(n["devs"])) for n in document["nodes"]] == [("gpu-0", 60, 4)]
        assert [d["usedGPU"] for d in document["nodes"][0]["devs"]] == [0, 5, 0, 0], (
            "the Lease's reservation counts (the trainer has no allocation annotation)"
        )


def test_inspect_with_settings_naming_another_scheduler_says_so_on_stderr_and_keeps_stdout(
    cluster: None, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert extender_cli.inspect_main(["-o", "json"]) == 0
    plain = capsys.readouterr()
    config = tmp_path / "config.yaml"
    config.write_text("scheduler: koordinator\n", encoding="utf-8")

    assert extender_cli.inspect_main(["-o", "json", "--config", str(config)]) == 0
    told = capsys.readouterr()

    assert told.out == plain.out
    assert plain.err == ""
    assert told.err.startswith(
        "gpu-admission inspect: scheduler profile koordinator: cards are placed and accounted by koordinator"
    )
    assert told.err.rstrip().endswith("the cards below show only what this project's extender placed")


def test_the_extender_reads_the_same_notice_and_a_bad_profile_is_one_line(tmp_path: pathlib.Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("scheduler: volcano\n", encoding="utf-8")
    bad = tmp_path / "bad.yaml"
    bad.write_text("scheduler: slurm\n", encoding="utf-8")

    assert extender_cli.scheduler_notice(None) == ""
    assert extender_cli.scheduler_notice(str(config)).startswith(
        "scheduler profile volcano: cards are placed and accounted by Volcano"
    )
    with pytest.raises(errors.InputError) as raised:
        extender_cli.scheduler_notice(str(bad))
    assert "scheduler: unknown scheduler profile 'slurm'" in str(raised.value)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("fmt", ["json", "table"])
def test_inspect_with_budgets_shows_used_and_budget_per_namespace(
    cluster: None, fmt: str, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "gpuBudgets:\n  - {name: team-a, namespaceSelector: {matchLabels: {team: a}}, memory: 8Gi, cards: 1}\n", encoding="utf-8"
    )
    assert extender_cli.inspect_main(["-o", fmt, "--config", str(config)]) == 0
    printed = capsys.readouterr().out
    if fmt == "json":
        assert json.loads(printed)["budgets"] == [
            {
                "namespace": "team-a",
                "budget": "team-a",
                "memoryBudgetMiB": 8192,
                "memoryUsedMiB": 3072,  # the trainer's 3 GiB share; the node ledger's entry is no budget charge
                "cardsBudget": 1,
                "cardsUsed": 0,
                "holders": 1,
                "unknownCharges": [],
            }
        ]
    else:
        assert printed.rstrip().endswith("team-a  team-a  3/8  0/1")


def test_inspect_refuses_a_bad_budget_in_one_line(
    cluster: None, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("gpuBudgets:\n  - {name: a, namespaces: [team-a], memory: -8Gi}\n", encoding="utf-8")
    assert extender_cli.inspect_main(["--config", str(config)]) == 2
    told = capsys.readouterr()
    assert told.out == ""
    assert told.err == f"kubectl inspect cgpu: error: {config}: gpuBudgets[0].memory: must not be negative, got '-8Gi'\n"
