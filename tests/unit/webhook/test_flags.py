"""Shared CLI flags: declared once, the same on every command that reads the cluster; --context
selects the kubeconfig context; unknown flags answered with the subcommand's usage; JSON logs."""

from __future__ import annotations

import argparse
import io
import json
import logging
import pathlib
from typing import Any

import pytest
import yaml

from webhook import cli, kube
from webhook.cmdline import flags

# Every command (path of subcommand names) that reads the cluster.
CLUSTER_COMMANDS = (
    ("audit",), ("inspect",), ("extender",), ("serve",), ("labeler",),
    ("certs", "install"), ("certs", "rotate"), ("certs", "show"), ("certs", "extender"),
    ("explain",), ("snapshot",), ("simulate",), ("defrag", "plan"), ("defrag", "apply"),
)
LONG_RUNNING = (("serve",), ("extender",), ("labeler",))


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
    assert capsys.readouterr().out.strip() == f"gpu-admission {flags.version()}"


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
    assert f"gpu-admission {' '.join(a for a in argv if not a.startswith('-') and a != 'x')}: error: unrecognized arguments: " in err


# --- --context really selects the context --------------------------------------------------------


def _kubeconfig(path: pathlib.Path) -> pathlib.Path:
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "first",
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

        def list(self, path: str) -> tuple[list[Any], str]:
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
        "abc-1", "validate", "team-a", "False", "kube-system",
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


def test_configure_logging_installs_the_json_formatter(monkeypatch: pytest.MonkeyPatch) -> None:
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", root.level)
    flags.configure_logging(argparse.Namespace(log_level="debug", log_format="json"))
    (handler,) = root.handlers
    assert isinstance(handler.formatter, flags.JsonFormatter) and root.level == logging.DEBUG
    stream = io.StringIO()
    handler.setStream(stream)  # type: ignore[attr-defined] # a StreamHandler, as configure_logging made it
    logging.getLogger("webhook.admission.serve").info("uid=- shutting down")
    assert json.loads(stream.getvalue()) | {"time": ""} == {
        "time": "", "level": "info", "logger": "webhook.admission.serve", "message": "uid=- shutting down", "uid": "-",
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
