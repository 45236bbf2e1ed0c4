"""The README's fresh-machine commands, read from README.md so that CI runs them as written.

`.ci/run fresh` runs `python3 tests/readme.py` in a fresh container, on the README of a fresh clone,
and then each command it prints (one a line, in order); a unit test holds the README to the shape
the tier counts on (an install-and-demo command, then the test command). Standard library only:
it runs before anything is installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

SECTION = "Fresh machine"  # the heading's first words: "## Fresh machine: two commands"
README = Path(__file__).resolve().parents[1] / "README.md"


class ReadmeError(ValueError):
    """The README has no fresh-machine section, or no commands in it."""


def fresh_machine_commands(markdown: str) -> list[str]:
    """The commands of the first fenced block under the heading that starts with `SECTION`:
    its lines less comments and blank lines, a line ending in a backslash joined to the next."""
    lines = markdown.splitlines()
    heading = next(
        (i for i, line in enumerate(lines) if line.startswith("#") and line.lstrip("#").strip().startswith(SECTION)), None
    )
    if heading is None:
        raise ReadmeError(f"no heading starting with {SECTION!r}")
    level = len(lines[heading]) - len(lines[heading].lstrip("#"))
    commands: list[str] = []
    inside = closed = False
    pending = ""
    for line in lines[heading + 1 :]:
        if not inside and line.startswith("#") and len(line) - len(line.lstrip("#")) <= level:
            break  # the next section at the same level or above: the block was not in this one
        if line.strip().startswith("```"):
            if inside:
                # A closing fence is the backticks alone; one with an info string ("```sh") opens
                # the next block, so this one was never closed.
                closed = line.strip().strip("`") == ""
                break
            inside = True
            continue
        if not inside or not line.strip() or line.strip().startswith("#"):
            continue
        pending += line.strip()
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip() + " "
            continue
        commands.append(pending)
        pending = ""
    if inside and not closed:
        # An unclosed fence runs to the next one: the prose between would be read as commands.
        raise ReadmeError(f"the fenced block under the {SECTION!r} heading is not closed before the next fence")
    if not commands:
        raise ReadmeError(f"no commands in a fenced block under the {SECTION!r} heading")
    return commands


def main() -> int:
    try:
        commands = fresh_machine_commands(README.read_text())
    except ReadmeError as error:
        print(f"readme.py: {README.name}: {error}", file=sys.stderr)
        return 1
    print("\n".join(commands))
    return 0


if __name__ == "__main__":
    sys.exit(main())
