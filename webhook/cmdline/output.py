"""Where a command's output goes: stdout, or the ``--output-file`` written whole.

A file is written atomically: a temporary file beside it, renamed over it, so a reader (or a
failed run) never sees half a report, and an existing file is replaced only by a complete one.
``-`` as the file is stdout, as kubectl and most tools read it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from webhook.cmdline import errors

STDOUT = "-"


def to_file(path: str | None) -> bool:
    """Whether ``--output-file path`` names a file (not absent, not ``-``)."""
    return path is not None and path != STDOUT


def emit(text: str, *, path: str | None) -> None:
    """Print ``text``, or write it whole to ``path``; a file that cannot be written is one ``InputError``."""
    if path is None or path == STDOUT:
        sys.stdout.write(text)
        return
    write(Path(path), text)


def write(target: Path, text: str) -> None:
    """Write ``target`` whole (mode 0644): a temporary file in its directory, renamed over it."""
    temporary = ""
    try:
        descriptor, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        with os.fdopen(descriptor, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    except OSError as error:
        if temporary:
            Path(temporary).unlink(missing_ok=True)
        raise errors.InputError(f"{target}: cannot write: {error.strerror or error}") from error
