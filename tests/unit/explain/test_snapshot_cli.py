"""`gpu-admission snapshot`: -o is the format (yaml|json), --output-file the file, stdout without one;
the old `-o FILE` is refused with a line naming --output-file."""

from __future__ import annotations

import argparse
import json
import pathlib
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from webhook import cli
from webhook.explain import cli as explain_cli
from webhook.explain import snapshot

NOW = 1_800_000_000.0
Factory = Callable[..., dict[str, Any]]


@pytest.fixture
def live(monkeypatch: pytest.MonkeyPatch, make_node: Factory, make_placed: Factory) -> snapshot.Snapshot:
    """The "live cluster" the command reads: one node with one placed GPU pod."""
    nodes = [make_node("a", count=2, gib=16)]
    pods = [make_placed("busy", node_name="a", card=0, mem=4)]
    monkeypatch.setattr(explain_cli, "read_cluster", lambda args: (nodes, pods, NOW))
    monkeypatch.setattr(explain_cli, "read_pdbs", lambda args: [])
    monkeypatch.setattr(explain_cli, "read_ledgers", lambda args: ([], "gpu-admission"))
    monkeypatch.setattr(explain_cli, "read_dra", lambda args: ([], []))  # no DRA in this cluster
    return snapshot.take(nodes, pods, now=NOW, pdbs=[])


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = cli.main(["snapshot", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_without_an_output_file_the_snapshot_is_yaml_on_stdout(
    live: snapshot.Snapshot, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = _run(capsys)
    assert status == 0 and err == ""
    assert out == snapshot.dumps(live) and yaml.safe_load(out) == snapshot.document(live)
    status, out, _ = _run(capsys, "-o", "json")
    assert status == 0 and json.loads(out) == snapshot.document(live)


@pytest.mark.parametrize(
    ("name", "argv", "as_json"),
    [
        ("snap.json", [], True),  # the format follows the file's suffix where -o is not given
        ("snap.yaml", [], False),
        ("snap", [], False),
        ("snap.json", ["-o", "yaml"], False),  # -o decides where given
        ("snap.yaml", ["-o", "json"], True),
    ],
)
def test_output_file_gets_the_snapshot_in_the_format_asked(
    live: snapshot.Snapshot, capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path, name: str, argv: list[str], as_json: bool
) -> None:
    target = tmp_path / name
    status, out, err = _run(capsys, *argv, "--output-file", str(target))
    assert status == 0 and out == ""
    assert err == f"saved 1 nodes, 1 GPU pods and 0 ledger Leases to {target}\n"
    assert target.read_text(encoding="utf-8") == snapshot.dumps(live, as_json=as_json)
    assert snapshot.load(str(target)).nodes == live.nodes  # explain/simulate --snapshot read it back
    assert [p.name for p in tmp_path.iterdir()] == [name]


@pytest.mark.parametrize("old", ["snap.json", "out/snap.yaml", "-"])
def test_the_old_o_file_spelling_is_refused_naming_output_file(
    live: snapshot.Snapshot, capsys: pytest.CaptureFixture[str], old: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["snapshot", "-o", old])
    out, err = capsys.readouterr()
    assert exited.value.code == 2 and out == ""
    assert err.startswith("usage: gpu-admission snapshot ")
    assert err.splitlines()[-1].endswith(f"-o names the format; to write to a file use --output-file {old}")


def test_the_snapshot_flags_are_the_shared_ones() -> None:
    parser = cli.make_parser(("webhook.explain.cli",))
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]  # noqa: SLF001 - no public accessor
    options = {flag: action for action in commands.choices["snapshot"]._actions for flag in action.option_strings}  # noqa: SLF001
    assert options["-o"] is options["--output"] and tuple(options["-o"].choices or ()) == ("yaml", "json")
    assert options["-o"].default is None and not options["-o"].required
    assert {"--output-file", "--kubeconfig", "--context", "--ledger-namespace"} <= set(options)
    assert options["--ledger-namespace"].default == "gpu-admission"
