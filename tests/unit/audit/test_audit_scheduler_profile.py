"""`gpu-admission audit` in front of another GPU scheduler says on stderr that it does not read that
scheduler's allocations, passes the pods its scheduler annotated, and still fails a tenant's bypass."""

from __future__ import annotations

import pathlib

import pytest
import yaml

from webhook.audit import cli

DATA = pathlib.Path(__file__).resolve().parents[2] / "data" / "schedulers"


def test_the_audit_names_the_profile_and_judges_koordinators_pods_as_written_by_design(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    written = yaml.safe_load((DATA / "annotations.yaml").read_text())["koordinator"]
    placed = yaml.safe_load((DATA / "koordinator-gpu-share.yaml").read_text())
    placed["metadata"] = {"name": "placed", "namespace": "ml", "annotations": written}
    placed["spec"]["nodeName"] = "gpu-0"
    manifest = tmp_path / "pods.yaml"
    manifest.write_text(yaml.safe_dump(placed))
    config = tmp_path / "config.yaml"
    config.write_text("scheduler: koordinator\n")

    assert cli.main(["-f", str(manifest), "--config", str(config)]) == 0
    told = capsys.readouterr()
    assert told.err.startswith(
        "gpu-admission audit: scheduler profile koordinator: cards are placed and accounted by koordinator"
    )
    assert "the audit does not read its allocations" in told.err
    assert "GPU010" not in told.out

    # the same stored pod before the default profile: the annotation is a finding, as before
    assert cli.main(["-f", str(manifest)]) == 1
    default = capsys.readouterr()
    assert default.err == ""
    assert "GPU010" in default.out
