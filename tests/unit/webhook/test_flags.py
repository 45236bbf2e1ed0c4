"""Shared CLI flags: declared once, the same on every command that reads the cluster; --context
selects the kubeconfig context; unknown flags answered with the subcommand's usage; JSON logs."""

from __future__ import annotations

import argparse
import datetime
import io
import json
import logging
import pathlib
import tomllib
from typing import Any

import pytest
import yaml

from webhook import cli, kube
from webhook.cmdline import flags

# Every command (path of subcommand names) that reads the cluster.
CLUSTER_COMMANDS = (
    ("audit",),
    ("inspect",),
    ("extender",),
    ("serve",),
    ("labeler",),
    ("certs", "install"),
    ("certs", "rotate"),
    ("certs", "show"),
    ("certs", "extender"),
    ("explain",),
    ("snapshot",),
    ("simulate",),
    ("defrag", "plan"),
    ("defrag", "apply"),
)
LONG_RUNNING = (("serve",), ("extender",), ("labeler",))
REPO = pathlib.Path(__file__).resolve().parents[3]


def _parser_at(path: tuple[str, ...]) -> argparse.ArgumentParser:
    parser = cli.make_parser()
    for name in path:
        (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]  # noqa: SLF001 - no public accessor
        parser = action.choices[name]
    return parser


def _option(parser: argparse.ArgumentParser, flag: str) -> argparse.Action | None:
    return next((a for a in parser._actions if flag in a.option_strings), None)  # noqa: SLF001


@pytest.mark.parametrize("path", CLUSTER_COMMANDS, ids=" ".join)
def test_every_cluster_command_takes_kubeconfig_and_context_with_one_help(path: tuple[str, ...]) -> None:
    parser = _parser_at(path)
    kubeconfig, context = _option(parser, "--kubeconfig"), _option(parser, "--context")
    assert kubeconfig is not None and context is not None
    assert context.help == flags.CONTEXT_HELP
    if path != ("serve",):  # serve's says what else it is for (self-managed certificates)
        assert kubeconfig.help == flags.KUBECONFIG_HELP


@pytest.mark.parametrize("path", LONG_RUNNING, ids=" ".join)
def test_every_long_running_command_takes_log_format(path: tuple[str, ...]) -> None:
    action = _option(_parser_at(path), "--log-format")
    assert action is not None and tuple(action.choices or ()) == ("text", "json")


def test_namespace_flags_are_kubectls() -> None:
    audit = _parser_at(("audit",))
    assert _option(audit, "-n") is _option(audit, "--namespace")
    assert _option(audit, "-A") is not None
    assert _option(_parser_at(("certs", "show")), "-n") is not None


def test_inspect_offers_kubectls_output_formats() -> None:
    action = _option(_parser_at(("inspect",)), "-o")
    assert action is not None and tuple(action.choices or ()) == ("table", "wide", "json", "yaml", "name")


def test_an_unknown_output_format_is_refused_when_declared() -> None:
    with pytest.raises(ValueError):
        flags.add_output(argparse.ArgumentParser(), ("table", "csv"))
    with pytest.raises(ValueError):
        flags.add_output(argparse.ArgumentParser(), ("json",), default="table")


def test_version_prints_the_programme_and_its_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    declared = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    assert capsys.readouterr().out == f"gpu-admission {declared}\n"
    assert flags.version() == declared


# --- the whole tree -------------------------------------------------------------------------------


def _tree(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every (path, parser) under ``parser`` that takes no further subcommand."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]  # noqa: SLF001
    if not subs:
        return [(path, parser)]
    return [leaf for name, child in subs[0].choices.items() for leaf in _tree(child, (*path, name))]


LEAVES = _tree(cli.make_parser())
LEAF_IDS = [" ".join(path) for path, _ in LEAVES]
# Duration flags of the servers (serve, extender) still spelled in seconds: each says why it is here.
SECONDS_SPELLINGS: dict[str, str] = {}


def test_the_tree_is_every_command() -> None:
    assert {path[0] for path, _ in LEAVES} == set(cli.SUBCOMMANDS)
    assert ("defrag", "apply") in dict(LEAVES) and ("certs", "show") in dict(LEAVES)


@pytest.mark.parametrize(("path", "parser"), LEAVES, ids=LEAF_IDS)
def test_cluster_flags_come_in_pairs_declared_once(path: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
    kubeconfig, context = _option(parser, "--kubeconfig"), _option(parser, "--context")
    assert (kubeconfig is None) == (context is None), "--kubeconfig and --context go together"
    if context is not None:
        assert context.help == flags.CONTEXT_HELP and context.metavar == "NAME"
        assert kubeconfig is not None and kubeconfig.metavar == "FILE"
    assert (kubeconfig is not None) == (path in CLUSTER_COMMANDS), "a command reads a cluster iff it takes --kubeconfig"
    if _option(parser, "-n") is not None:
        assert _option(parser, "-n") is _option(parser, "--namespace")
    if _option(parser, "-A") is not None:
        assert _option(parser, "-A") is _option(parser, "--all-namespaces")


@pytest.mark.parametrize(
    ("path", "parser"),
    [(p, q) for p, q in LEAVES if _option(q, "-o")],
    ids=[i for (p, q), i in zip(LEAVES, LEAF_IDS, strict=True) if _option(q, "-o")],
)
def test_o_is_always_a_format_and_a_file_name_is_refused_naming_output_file(
    path: tuple[str, ...], parser: argparse.ArgumentParser, capsys: pytest.CaptureFixture[str]
) -> None:
    output = _option(parser, "-o")
    assert output is not None and output is _option(parser, "--output") and output.metavar == "FORMAT"
    assert set(output.choices or ()) <= set(flags.OUTPUT_FORMATS)
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["-o", "report.yaml"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: gpu-admission {' '.join(path)} ")
    assert err.splitlines()[-1].endswith("-o names the format; to write to a file use --output-file report.yaml")


@pytest.mark.parametrize(("path", "parser"), LEAVES, ids=LEAF_IDS)
def test_every_duration_flag_reads_one_syntax(path: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:  # noqa: SLF001
        flag = action.option_strings[-1] if action.option_strings else ""
        if flag in SECONDS_SPELLINGS:
            continue
        assert action.metavar not in ("S", "SECONDS"), f"{flag}: a duration is DURATION"
        if action.metavar != "DURATION":
            continue
        parse = action.type
        assert callable(parse)
        value = parse("1m30s")
        assert (value.total_seconds() if isinstance(value, datetime.timedelta) else value) == 90, flag
        assert parse("45") in (45, datetime.timedelta(seconds=45)), flag  # bare seconds, as before
        with pytest.raises(argparse.ArgumentTypeError, match="is not a duration like 500ms, 30s, 10m, 1h30m or 365d"):
            parse("ten minutes")


@pytest.mark.parametrize(("path", "parser"), LEAVES, ids=LEAF_IDS)
def test_an_unknown_flag_on_any_command_prints_that_commands_usage(
    path: tuple[str, ...], parser: argparse.ArgumentParser, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main([*path, "--no-such-flag"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: gpu-admission {' '.join(path)} "), err
    # required arguments are reported first where missing; otherwise the unknown flag is named
    assert f"gpu-admission {' '.join(path)}: error: " in err


def test_a_renamed_flag_is_one_line_naming_the_new_one(capsys: pytest.CaptureFixture[str]) -> None:
    parser = flags.Parser(prog="gpu-admission")
    sub = parser.add_subparsers(dest="command", required=True).add_parser("thing")
    flags.add_renamed(sub, "--old-file", new="--output-file")
    flags.add_renamed(sub, "--old-switch", new="--new-switch", takes_value=False)
    assert "--old-file" not in sub.format_help()  # hidden
    assert not hasattr(sub.parse_args([]), "old_file")
    for argv, named in ((["thing", "--old-file", "x.yaml"], "--output-file"), (["thing", "--old-switch"], "--new-switch")):
        with pytest.raises(SystemExit) as exited:
            parser.parse_args(argv)
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("usage: gpu-admission thing ")
        assert (
            err.splitlines()[-1]
            == f"gpu-admission thing: error: {argv[1]} is no longer a flag of gpu-admission thing: use {named}"
        )


@pytest.mark.parametrize(
    ("text", "seconds"), [("90s", 90.0), ("1h30m", 5400.0), ("500ms", 0.5), ("365d", 365 * 86400.0), ("0", 0.0), ("2.5", 2.5)]
)
def test_durations_are_one_syntax(text: str, seconds: float) -> None:
    assert flags.duration(text) == seconds
    assert flags.duration_delta(text) == datetime.timedelta(seconds=seconds)
    if seconds > 0:
        assert flags.positive_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0s", "0", "-1s", "2x", "1y", "nan", "inf"])
def test_a_positive_duration_refuses_zero_and_nonsense(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        flags.positive_duration(text)


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (["audit", "--no-such-flag"], "usage: gpu-admission audit "),
        (["certs", "show", "--no-such-flag"], "usage: gpu-admission certs show "),
        (["inspect", "--bogus", "x"], "usage: gpu-admission inspect "),
    ],
)
def test_an_unknown_flag_prints_the_subcommands_usage(capsys: pytest.CaptureFixture[str], argv: list[str], usage: str) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage), err
    assert (
        f"gpu-admission {' '.join(a for a in argv if not a.startswith('-') and a != 'x')}: error: unrecognized arguments: " in err
    )


# --- --context really selects the context --------------------------------------------------------


def _kubeconfig(path: pathlib.Path) -> pathlib.Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "first",
        "clusters": [
            {"name": "one", "cluster": {"server": "https://one.example:6443"}},
            {"name": "two", "cluster": {"server": "https://two.example:6443"}},
        ],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [
            {"name": "first", "context": {"cluster": "one", "user": "u"}},
            {"name": "second", "context": {"cluster": "two", "user": "u"}},
        ],
    }
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def test_context_picks_the_kubeconfig_context(tmp_path: pathlib.Path) -> None:
    config = str(_kubeconfig(tmp_path / "config"))
    chosen = {}
    for context in (None, "second"):
        args = argparse.Namespace(kubeconfig=config, context=context)
        api = flags.api_client(args)
        chosen[context] = api.configuration.host
        kube.close(api)
    assert chosen == {None: "https://one.example:6443", "second": "https://two.example:6443"}


def test_an_unknown_context_is_one_line(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = str(_kubeconfig(tmp_path / "config"))
    status = cli.main(["audit", "--kubeconfig", config, "--context", "nowhere"])
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    assert err.startswith("gpu-admission: error: ") and err.count("\n") == 1 and "nowhere" in err


def test_inspect_reads_the_cluster_of_the_chosen_context(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from webhook.extender import cli as extender_cli
    from webhook.extender import kube as extender_kube

    seen: list[str] = []

    class Api:
        def __init__(self, client: Any) -> None:
            seen.append(client.configuration.host)

        def list(self, path: str, *, label_selector: str = "") -> tuple[list[Any], str]:
            return [], "1"

    monkeypatch.setattr(extender_kube, "KubeApi", Api)
    config = str(_kubeconfig(tmp_path / "config"))
    assert extender_cli.inspect_main(["--kubeconfig", config, "--context", "second", "-o", "name"]) == 0
    assert seen == ["https://two.example:6443"]


# --- JSON logs ------------------------------------------------------------------------------------


def _record(message: str, *args: Any, level: int = logging.INFO) -> logging.LogRecord:
    return logging.LogRecord("webhook.admission.handlers", level, __file__, 1, message, args, None)


def test_a_json_log_line_carries_time_level_logger_message_and_the_text_fields() -> None:
    line = flags.JsonFormatter().format(
        _record("uid=%s endpoint=%s %s ns=%s allowed=%s exempt=%r", "abc-1", "validate", "CREATE", "team-a", False, "kube-system")
    )
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["level"] == "info" and parsed["logger"] == "webhook.admission.handlers"
    assert parsed["message"] == "uid=abc-1 endpoint=validate CREATE ns=team-a allowed=False exempt='kube-system'"
    assert (parsed["uid"], parsed["endpoint"], parsed["ns"], parsed["allowed"], parsed["exempt"]) == (
        "abc-1",
        "validate",
        "team-a",
        "False",
        "kube-system",
    )
    assert parsed["time"].endswith("+00:00") and "T" in parsed["time"]


def test_a_field_never_replaces_the_records_own_keys() -> None:
    parsed = json.loads(flags.JsonFormatter().format(_record("level=forged message=x logger=y")))
    assert parsed["level"] == "info" and parsed["logger"] == "webhook.admission.handlers"
    assert parsed["message"] == "level=forged message=x logger=y"


def test_a_json_log_line_carries_the_traceback() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        import sys

        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "uid=%s failed", ("u",), sys.exc_info())
    parsed = json.loads(flags.JsonFormatter().format(record))
    assert parsed["uid"] == "u" and parsed["level"] == "error"
    assert "RuntimeError: boom" in parsed["exception"]


def test_the_text_formatter_writes_what_the_standard_one_writes() -> None:
    standard, ours = logging.Formatter(flags.TEXT_FORMAT), flags.TextFormatter(flags.TEXT_FORMAT)
    for created in (1_800_000_000.0, 1_800_000_000.999, 1_800_000_001.0005, 1_800_000_000.5, 1_800_003_600.25):
        record = logging.LogRecord("webhook.x", logging.INFO, __file__, 1, "uid=%s allowed", ("u",), None)
        record.created, record.msecs = created, int((created - int(created)) * 1000)
        assert ours.format(record) == standard.format(record)
    dated = flags.TextFormatter("%(asctime)s %(message)s", datefmt="%H:%M")
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", (), None)
    assert dated.format(record) == logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M").format(record)


def test_configure_logging_installs_the_json_formatter(monkeypatch: pytest.MonkeyPatch) -> None:
    for switch in ("_srcfile", "logThreads", "logProcesses", "logMultiprocessing"):
        monkeypatch.setattr(logging, switch, getattr(logging, switch))  # configure_logging turns them off
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", root.level)
    flags.configure_logging(argparse.Namespace(log_level="debug", log_format="json"))
    (handler,) = root.handlers
    assert isinstance(handler.formatter, flags.JsonFormatter) and root.level == logging.DEBUG
    stream = io.StringIO()
    handler.setStream(stream)  # type: ignore[attr-defined] # a StreamHandler, as configure_logging made it
    logging.getLogger("webhook.commands.serve").info("uid=- shutting down")
    assert json.loads(stream.getvalue()) | {"time": ""} == {
        "time": "",
        "level": "info",
        "logger": "webhook.commands.serve",
        "message": "uid=- shutting down",
        "uid": "-",
    }


class _Configured(Exception):
    """Raised by the stand-in for configure_logging: the command got that far, with these flags."""


@pytest.mark.parametrize(
    "argv",
    [
        ["labeler", "--dry-run", "--log-format", "json", "--log-level", "debug"],
        ["extender", "--port", "0", "--log-format", "json", "--log-level", "debug"],
        ["serve", "--self-managed-certs", "--log-format", "json", "--log-level", "debug"],
    ],
    ids=lambda argv: argv[0],
)
def test_every_long_running_command_configures_logging_from_its_flags(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> None:
    seen: list[tuple[str, str]] = []

    def configure(args: argparse.Namespace) -> None:
        seen.append((args.log_format, args.log_level))
        raise _Configured

    monkeypatch.setattr(flags, "configure_logging", configure)
    with pytest.raises(_Configured):
        cli.main(argv)
    assert seen == [("json", "debug")]
