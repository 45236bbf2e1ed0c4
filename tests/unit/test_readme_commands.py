"""The README's two fresh-machine commands are what CI's fresh tier runs: read from the README at run
time, in the shape the tier counts on (install and demo, then the test command)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests import readme

CI = Path(__file__).resolve().parents[2] / ".ci"


def test_the_readme_gives_the_install_and_demo_command_then_the_test_command() -> None:
    install, tests = readme.fresh_machine_commands(readme.README.read_text())
    assert install.startswith("python3 -m venv .venv && ") and ".venv/bin/pip install -e '.[test]'" in install
    assert install.endswith("gpu-admission demo")
    assert re.fullmatch(r"\.venv/bin/python -m pytest\b.*", tests), "the fresh tier counts the tests in this command's summary"


def test_ci_runs_the_commands_the_readme_gives_in_its_default_run() -> None:
    script = (CI / "run").read_text()
    [default] = re.findall(r"^TIERS=\((.*)\)$", script, flags=re.MULTILINE)
    assert "fresh" in default.split()
    body = script[script.index("\nfresh() {") :]
    body = body[: body.index("\n}\n")]
    assert '"$base" bash .ci/fresh-machine' in body
    assert "--env GPU_ADMISSION_E2E=require" in body, "the end-to-end tier must not skip unseen in the fresh container"
    inside = (CI / "fresh-machine").read_text()
    assert "listing=$(python3 tests/readme.py)" in inside, "the commands come from the README at run time, never a copy"
    assert 'bash -c "$command"' in inside


def test_the_commands_are_the_first_block_under_the_heading_less_comments_with_continuations_joined() -> None:
    markdown = "\n".join(
        [
            "# Project",
            "",
            "```sh",
            "not this",
            "```",
            "## Fresh machine: three commands",
            "",
            "Text.",
            "",
            "```sh",
            "# 1. install",
            "python3 -m venv .venv && \\",
            "  .venv/bin/pip install .",
            "",
            "# 2. test",
            "make test",
            "```",
            "",
            "```sh",
            "not this either",
            "```",
        ]
    )
    assert readme.fresh_machine_commands(markdown) == ["python3 -m venv .venv && .venv/bin/pip install .", "make test"]


@pytest.mark.parametrize(
    "markdown",
    [
        "# Project\n\n```sh\nmake\n```\n",
        "## Fresh machine\n\nNo block here.\n\n## Next\n\n```sh\nmake\n```\n",
        "## Fresh machine\n\n```sh\n# only a comment\n```\n",
        "## Fresh machine\n\n```sh\nmake\n\nThe prose under it.\n\n## Next\n\n```sh\nmake install\n```\n",
    ],
    ids=["no heading", "block in the next section", "no command in the block", "the block not closed"],
)
def test_a_readme_without_the_commands_is_an_error_not_an_empty_run(markdown: str) -> None:
    with pytest.raises(readme.ReadmeError):
        readme.fresh_machine_commands(markdown)
