"""The ``gpu-admission`` command line: one parser, one subcommand per module in ``COMMANDS``.

Each command module exposes ``add_parser(subparsers) -> None``, which registers its subcommand and
sets ``func(args: argparse.Namespace) -> int`` (the exit status). Bad input is raised as
``errors.InputError`` and printed as one line with exit status 2 (``errors.run``), never as a traceback.

A run imports only the module of the command it names (``SUBCOMMANDS``): ``serve`` then never
loads the labeler's NVML binding or the cluster tools (4 MiB resident, and start-up time, in
every webhook process). ``--help`` and anything unknown build the whole parser.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from webhook.cmdline import errors, flags

PROG = "gpu-admission"

# Each subcommand and the module that registers it, in the order `--help` lists them
# (tests/unit/test_cli.py checks this against the parser).
SUBCOMMANDS: dict[str, str] = {
    "demo": "webhook.commands.demo",
    "serve": "webhook.commands.serve",
    "dry-run": "webhook.commands.dryrun",
    "audit": "webhook.audit.cli",
    "policies": "webhook.commands.policies_cli",
    "certs": "webhook.certificates.certfiles",
    "extender": "webhook.extender.cli",
    "inspect": "webhook.extender.cli",
    "explain": "webhook.explain.cli",
    "snapshot": "webhook.explain.cli",
    "simulate": "webhook.explain.cli",
    "defrag": "webhook.explain.cli",
    "labeler": "webhook.labeler.cli",
    "cluster": "webhook.cluster.cli",
    "completion": "webhook.commands.completion",
}
# Every command module, once each.
MODULES: tuple[str, ...] = tuple(dict.fromkeys(SUBCOMMANDS.values()))


def commands(names: Sequence[str] = MODULES) -> tuple[ModuleType, ...]:
    """The command modules ``names``, imported."""
    return tuple(importlib.import_module(name) for name in names)


def make_parser(modules: Sequence[str] = MODULES) -> argparse.ArgumentParser:
    parser = flags.Parser(prog=PROG, description="Safe GPU scheduling for Kubernetes: admission webhook, dry-run and tools.")
    flags.add_version(parser)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in commands(modules):
        command.add_parser(subparsers)
    return parser


def _parser_for(argv: Sequence[str]) -> argparse.ArgumentParser:
    """The parser with only the named command's module, where the first argument names one."""
    named = SUBCOMMANDS.get(argv[0]) if argv else None
    return make_parser((named,) if named is not None else MODULES)


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    return errors.run(_parser_for(argv).parse_args(argv), prog=PROG)


if __name__ == "__main__":
    sys.exit(main())
