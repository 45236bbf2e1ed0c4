"""The one error type a command raises for bad input; the CLI prints it as one line."""

from __future__ import annotations


class InputError(Exception):
    """Bad input from the user (a flag, a file, a document): reported as one line, exit status 2."""
