"""The one error type a command raises for bad input, and the run of a command that prints it as one line."""

from __future__ import annotations

import argparse
import sys

EXIT_INPUT_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C


class InputError(Exception):
    """Bad input from the user (a flag, a file, a document): reported as one line, exit status 2."""


def run(args: argparse.Namespace, *, prog: str) -> int:
    """The exit status of the parsed command, `args.func(args)`; bad input is one line on stderr and 2."""
    try:
        status: int = args.func(args)
    except InputError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return status
