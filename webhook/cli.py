"""The ``gpu-admission`` command line: one parser, one subcommand per module in ``COMMANDS``.

Each command module exposes ``add_parser(subparsers) -> None``, which registers its subcommand and
sets ``func(args: argparse.Namespace) -> int`` (the exit status). Bad input is raised as
``errors.InputError`` and printed here as one line with exit status 2, never as a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType

from webhook import certfiles, demo, dryrun, errors, policies_cli, serve
from webhook.audit import cli as audit_cli
from webhook.cluster import cli as cluster_cli
from webhook.extender import cli as extender_cli
from webhook.labeler import cli as labeler_cli

PROG = "gpu-admission"
EXIT_INPUT_ERROR = 2

COMMANDS: tuple[ModuleType, ...] = (
    demo, serve, dryrun, audit_cli, policies_cli, certfiles, extender_cli, labeler_cli, cluster_cli
)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Safe GPU scheduling for Kubernetes: admission webhook, dry-run and tools."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        status: int = args.func(args)
    except errors.InputError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    except KeyboardInterrupt:
        return 130
    return status


if __name__ == "__main__":
    sys.exit(main())
