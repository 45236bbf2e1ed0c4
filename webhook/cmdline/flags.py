"""The flags every command shares, declared once: cluster access, namespaces, output, logging, version.

A command that reads the cluster calls ``add_cluster`` (``--kubeconfig``, ``--context``) and makes
its client with ``api_client(args)``, so ``--context`` really picks the kubeconfig context, as
kubectl's does. ``add_namespaces`` gives kubectl's ``-n/--namespace`` and ``-A/--all-namespaces``,
``add_output`` ``-o/--output`` with the formats a command can print (``table`` first, the default),
``add_output_file`` ``--output-file`` (written whole by ``webhook.cmdline.output``), ``add_logging``
``--log-level`` and ``--log-format text|json`` for the long-running commands, and
``configure_logging`` applies them.

``-o`` is always a format, never a file: a value that looks like a file name is refused with a line
that names ``--output-file``. Durations are one syntax everywhere (``webhook.cmdline.durations``):
``duration``, ``positive_duration`` and ``duration_delta`` are their argparse types. ``add_renamed``
keeps an old flag spelling as a one-line error naming the new one (exit status 2), so a renamed flag
never silently changes meaning.

JSON logs are one object per line with ``time``, ``level``, ``logger`` and ``message``, plus every
``key=value`` token the text line carries (``uid=...``, ``endpoint=...``), so a log pipeline can
filter on the review uid without parsing the message.

``Parser`` is the ``argparse.ArgumentParser`` of the top-level CLI: an unknown flag after a
subcommand is reported by that subcommand's own parser, with its usage, rather than by the
top-level parser with the list of commands.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import re
import time
from collections.abc import Sequence
from importlib import metadata
from typing import TYPE_CHECKING, Any, Final, NoReturn

from policies.gpu import reservations
from webhook.cmdline import durations

if TYPE_CHECKING:
    from webhook.kube import client

DISTRIBUTION: Final = "gpu-admission"
KUBECONFIG_HELP: Final = "kubeconfig file (default: in-cluster config, then $KUBECONFIG or ~/.kube/config)"
CONTEXT_HELP: Final = "the kubeconfig context to use (default: the kubeconfig's current-context)"
LOG_LEVELS: Final = ("debug", "info", "warning", "error")
LOG_FORMATS: Final = ("text", "json")
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s %(message)s"
# Every output format a command may offer, in the order help lists them.
OUTPUT_FORMATS: Final = ("table", "wide", "json", "yaml", "name", "markdown", "html")

_Container = argparse.ArgumentParser | argparse._ArgumentGroup


def version() -> str:
    """This installation's version, else ``unknown`` (a source tree run without installing)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def add_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")


def add_cluster(parser: _Container, *, kubeconfig_help: str = KUBECONFIG_HELP) -> None:
    """``--kubeconfig`` and ``--context``: how a command reaches the cluster."""
    parser.add_argument("--kubeconfig", metavar="FILE", help=kubeconfig_help)
    parser.add_argument("--context", metavar="NAME", help=CONTEXT_HELP)


def api_client(args: argparse.Namespace, *, pool_size: int | None = None) -> client.ApiClient:
    """The client for ``--kubeconfig`` and ``--context`` (``webhook.kube.api_client``)."""
    from webhook import kube  # noqa: PLC0415 - flags are parsed before any command needs the kubernetes client

    return kube.api_client(args.kubeconfig, context=getattr(args, "context", None), pool_size=pool_size)


def add_namespaces(
    parser: _Container,
    *,
    namespace_help: str,
    all_help: str | None = "every namespace (the default)",
    default: str | None = None,
) -> None:
    """``-n/--namespace`` and, unless ``all_help`` is None, ``-A/--all-namespaces`` excluding it."""
    where: _Container = parser.add_mutually_exclusive_group() if all_help is not None else parser
    where.add_argument("-n", "--namespace", metavar="NS", default=default, help=namespace_help)
    if all_help is not None:
        where.add_argument("-A", "--all-namespaces", action="store_true", help=all_help)


def add_output(
    parser: _Container, formats: Sequence[str], *, default: str | None = "table", default_help: str | None = None
) -> None:
    """``-o/--output`` with the formats this command prints (each one of ``OUTPUT_FORMATS``); a
    ``default`` of None leaves the choice to the command, which ``default_help`` then describes."""
    unknown = [name for name in formats if name not in OUTPUT_FORMATS]
    if unknown or (default not in formats if default is not None else default_help is None):
        raise ValueError(f"output formats {unknown} unknown, or default {default!r} not offered")
    parser.add_argument(
        "-o",
        "--output",
        type=_output_format(tuple(formats)),
        choices=tuple(formats),
        default=default,
        metavar="FORMAT",
        help=f"output format: {'|'.join(formats)} (default: {default_help or default})",
    )


def _output_format(formats: tuple[str, ...]) -> Any:
    """The argparse type of ``-o``: a format, or one line naming ``--output-file`` for a file name."""

    def output_format(text: str) -> str:
        if text in formats:
            return text
        if text == "-" or any(mark in text for mark in "./\\"):
            raise argparse.ArgumentTypeError(
                f"{text!r} is not an output format ({'|'.join(formats)}): -o names the format; "
                f"to write to a file use --output-file {text}"
            )
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join(formats)})")

    return output_format


def add_ledger_namespace(parser: _Container, *, note: str = "") -> None:
    """`--ledger-namespace`: where the scheduler extender keeps the nodes' reservation-ledger Leases.
    Every command that writes or reads the ledgers takes it; a Lease elsewhere is never a ledger."""
    parser.add_argument(
        "--ledger-namespace",
        default=reservations.LEDGER_NAMESPACE,
        metavar="NAMESPACE",
        help="where the scheduler extender keeps the nodes' reservation-ledger Leases, one per GPU node "
        f"(default: %(default)s; a Lease elsewhere is never read as a ledger{note})",
    )


def add_output_file(parser: _Container) -> None:
    parser.add_argument(
        "--output-file",
        metavar="FILE",
        help="write the output to FILE (whole, or not at all: a temporary file renamed over it) instead of stdout",
    )


def add_renamed(parser: _Container, old: str, *, new: str, takes_value: bool = True) -> None:
    """Keep ``old``, a flag's former spelling, as a one-line error naming ``new`` (exit status 2);
    hidden from help and completion."""
    parser.add_argument(old, action=_Renamed, nargs="?" if takes_value else 0, new=new, help=argparse.SUPPRESS)


class _Renamed(argparse.Action):
    """A removed flag: using it is a usage error that says what to write instead."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, new: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, **kwargs)
        self.new = new

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option_string: str | None = None
    ) -> NoReturn:
        parser.error(f"{option_string} is no longer a flag of {parser.prog}: use {self.new}")


# --- durations ------------------------------------------------------------------------------------


def duration(text: str) -> float:
    """The argparse type of a duration flag: seconds (``500ms``, ``30s``, ``10m``, ``1h30m``, ``365d``
    or bare seconds), not negative."""
    try:
        return durations.seconds(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def positive_duration(text: str) -> float:
    """A ``duration`` that is more than zero (an interval, a timeout)."""
    seconds = duration(text)
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a duration above zero")
    return seconds


def duration_delta(text: str) -> datetime.timedelta:
    """A ``duration`` as a ``timedelta`` (certificate lifetimes and the like)."""
    return datetime.timedelta(seconds=duration(text))


# --- serving (``serve`` and ``extender``: ``webhook.serving.shell``) --------------------------------

CERT_CHECK_INTERVAL: Final = datetime.timedelta(seconds=10)


def add_cert_check_interval(parser: _Container, *, what: str) -> None:
    """``--cert-check-interval``: how often a server looks at ``what`` for new certificates."""
    parser.add_argument(
        "--cert-check-interval",
        type=duration_delta,
        default=CERT_CHECK_INTERVAL,
        metavar="DURATION",
        help=f"how often {what} are checked for changes, loaded when they change (default: 10s)",
    )


def add_drain(parser: _Container) -> None:
    """``--drain-seconds`` and ``--drain-idle-seconds``: how a server drains on SIGTERM/SIGINT."""
    parser.add_argument(
        "--drain-seconds",
        type=duration,
        default=0.0,
        metavar="DURATION",
        help="on SIGTERM, keep accepting for DURATION, with readyz 503 and 'Connection: close' on every "
        "response (default: 0; in a Deployment: longer than endpoints take to drop the pod, e.g. 10s)",
    )
    parser.add_argument(
        "--drain-idle-seconds",
        type=duration,
        default=0.0,
        metavar="DURATION",
        help="then, with the listener closed, wait up to DURATION for clients to close their kept-alive "
        "connections (default: 0; Go clients such as kube-apiserver close idle ones after 90s, so e.g. 95s)",
    )


def add_logging(parser: _Container) -> None:
    """``--log-level`` and ``--log-format`` of a long-running command."""
    parser.add_argument("--log-level", default="info", choices=LOG_LEVELS, help="default: info")
    parser.add_argument(
        "--log-format",
        default="text",
        choices=LOG_FORMATS,
        help="text lines, or one JSON object per line with time, level, logger, message and the "
        "line's key=value fields (default: text)",
    )


def configure_logging(args: argparse.Namespace) -> None:
    """The root logger as ``--log-level`` and ``--log-format`` ask (``logging.basicConfig`` semantics:
    a process that already configured logging keeps its handlers)."""
    handler = logging.StreamHandler()
    if getattr(args, "log_format", "text") == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter(TEXT_FORMAT))
    logging.basicConfig(level=str(getattr(args, "log_level", "info")).upper(), handlers=[handler])
    # Neither format shows where a line was logged from, nor the thread or process: the logging
    # HOWTO's "Optimization" switches, so a record (one per review) does not collect them.
    logging._srcfile = None  # the switch the HOWTO documents
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False


class TextFormatter(logging.Formatter):
    """``logging.Formatter``, with the seconds of ``asctime`` formatted once per second, not per
    line (the webhook logs a line per review)."""

    _stamp: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 - logging's name
        if datefmt or not self.default_msec_format:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        cached, text = self._stamp
        if cached != second:
            text = time.strftime(self.default_time_format, self.converter(record.created))
            self._stamp = (second, text)
        return self.default_msec_format % (text, record.msecs)


# A `key=value` token of a text log line: the key an identifier, the value up to the next space
# (a quoted value, as `%r` writes it, up to its closing quote).
_FIELD = re.compile(r"(?:^|(?<=\s))([A-Za-z_][A-Za-z0-9_.]*)=('[^']*'|\"[^\"]*\"|\S+)")
_RESERVED = frozenset({"time", "level", "logger", "message", "exception"})


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (RFC 3339, UTC), level, logger, message, the message's
    ``key=value`` fields, and ``exception`` with the traceback where there is one."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        line: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": message,
        }
        for key, value in fields(message).items():
            if key not in _RESERVED:
                line.setdefault(key, value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        return json.dumps(line, ensure_ascii=False, default=str)


def fields(message: str) -> dict[str, str]:
    """The ``key=value`` tokens of a text log message, quotes around a value removed."""
    found: dict[str, str] = {}
    for key, value in _FIELD.findall(message):
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        found.setdefault(key, value)
    return found


# --- the parser -----------------------------------------------------------------------------------


class _Subcommands(argparse._SubParsersAction):  # type: ignore[type-arg] # argparse's own generic, private
    """Subcommands whose parser reports arguments it does not know, with its own usage."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option_string: str | None = None
    ) -> None:
        name = values[0]
        chosen = self._name_parser_map.get(name)
        super().__call__(parser, namespace, values, option_string)
        extra = getattr(namespace, argparse._UNRECOGNIZED_ARGS_ATTR, None)
        if chosen is not None and extra:
            chosen.error(f"unrecognized arguments: {' '.join(extra)}")


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose subcommands (at every depth) judge their own arguments."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _Subcommands)


def non_negative_int(text: str) -> int:
    """An argparse type: a whole number, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value
