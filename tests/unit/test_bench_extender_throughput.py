"""bench/extender_throughput.py's `--budgets` rounds: the settings they give the extender, and the
ratio with budgets over without that the record carries."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import types

import pytest

from policies import settings
from policies.gpu import budgets
from policies.settings import budgets as settings_budgets
from webhook import config
from webhook.cluster import controlplane

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))  # bench/ is not a package; its scripts import their helpers the same way
import extender_throughput  # noqa: E402


def test_every_namespace_the_pods_land_in_gets_a_budget_of_all_the_clusters_gpu_memory(tmp_path: pathlib.Path) -> None:
    document = extender_throughput.budget_settings(500)
    path = tmp_path / "budgets.yaml"
    path.write_text(json.dumps(document))
    found = config.load_section(path, settings.budgets_of)  # as the extender's --config reads it
    landed = {pod["metadata"]["namespace"] for pod in extender_throughput.pods(3, scheduler="s", prefix="p")}
    assert landed == set(extender_throughput.NAMESPACES)
    cluster_mib = 500 * extender_throughput.CARDS * extender_throughput.T4
    for namespace in landed:
        budget = settings_budgets.budget_for(found, namespace, None)
        assert budget is not None, f"{namespace} has no budget"
        assert budget.memory_mib == cluster_mib and budget.cards is None
        # Never refuses: every card of every node full is still within the budget; one MiB more is not.
        full = budgets.Charge(memory_mib=cluster_mib)
        assert budgets.over(budget.memory_mib, budget.cards, budgets.NOTHING, full) == ""
        assert budgets.over(budget.memory_mib, budget.cards, full, budgets.Charge(memory_mib=1)) != ""
    # A namespace the pods do not land in keeps no budget (unlimited).
    assert settings_budgets.budget_for(found, "elsewhere", None) is None


def test_the_fake_nodes_capacity_is_the_memory_the_budget_is_sized_from() -> None:
    (node,) = extender_throughput.fake_nodes(1)
    capacity = node.manifest()["status"]["capacity"]
    assert int(capacity["aliyun.com/gpu-mem"]) * 1024 == extender_throughput.CARDS * extender_throughput.T4


def test_the_budgets_rounds_are_compared_with_the_extender_rounds_of_the_same_run() -> None:
    figures: dict[str, dict[str, float | None]] = {
        "extender": {"extender_pods_per_s": 100.0, "ratio": 0.4},
        "budgets": {"extender_pods_per_s": 95.0, "ratio": 0.38},
    }
    found = extender_throughput.budget_figures(figures)
    assert found == {
        "ratio_to_extender": 0.95,
        "extender_pods_per_s_without_budgets": 100.0,
        "extender_pods_per_s": 95.0,
        "ratio": 0.38,
    }
    figures["extender"]["extender_pods_per_s"] = 0.0
    assert extender_throughput.budget_figures(figures)["ratio_to_extender"] is None


def test_the_budgets_rounds_extender_reads_the_settings_file_and_the_others_read_none(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[list[str]] = []
    monkeypatch.setattr(controlplane, "free_port", lambda: 1)
    monkeypatch.setattr(controlplane, "start", lambda state, name, command, env: started.append(command))
    monkeypatch.setattr(controlplane, "wait_for", lambda *args, **kwargs: None)
    state = types.SimpleNamespace(kubeconfig=tmp_path / "kubeconfig")
    path = tmp_path / "budgets.yaml"
    extender_throughput.start_extender(state, log_level="info", config=path)  # type: ignore[arg-type]
    extender_throughput.start_extender(state, log_level="info")  # type: ignore[arg-type]
    with_budgets, without = started
    assert with_budgets[with_budgets.index("--config") + 1] == str(path)
    assert "--config" not in without and without == with_budgets[: len(without)]


def test_the_option_is_offered() -> None:
    helped = subprocess.run(
        [sys.executable, str(BENCH / "extender_throughput.py"), "--help"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert "--budgets" in helped and "ratio_to_extender" in helped
