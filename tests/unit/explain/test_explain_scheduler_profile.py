"""`explain` in front of another GPU scheduler says, in the table and the JSON, that the cards are that
scheduler's and not accounted here; with the default profile the report is as before."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from policies import settings
from webhook.explain import cli as explain_cli
from webhook.explain import render

NOW = 1_800_000_000.0
Factory = Callable[..., dict[str, Any]]


def test_explain_names_the_other_scheduler_in_the_table_and_the_json(make_node: Factory, make_pod: Factory) -> None:
    pod = make_pod("p")
    hami = explain_cli.explain_pod(
        pod, nodes=[make_node("n")], pods=[pod], now=NOW, settings=settings.from_mapping({"scheduler": "hami"})
    )

    table = render.render(hami, output="table").splitlines()
    document = json.loads(render.render(hami, output="json"))

    assert table[1] == (
        "Scheduler:  scheduler profile hami: cards are placed and accounted by HAMi (hami-scheduler and its "
        "device plugin), not by this project's extender; the audit does not read its allocations (GPU210 "
        "and the usage report see none of its pods)"
    )
    assert document["scheduler"] == table[1].removeprefix("Scheduler:  ")


def test_with_the_default_profile_explain_says_nothing_about_schedulers(make_node: Factory, make_pod: Factory) -> None:
    pod = make_pod("p")
    report = explain_cli.explain_pod(pod, nodes=[make_node("n")], pods=[pod], now=NOW)

    assert report.scheduler == ""
    assert "scheduler" not in json.loads(render.render(report, output="json"))
    assert not any(line.startswith("Scheduler:") for line in render.render(report, output="table").splitlines())
