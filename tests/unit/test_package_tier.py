"""CI's `package` tier: the wheel as users get it, run from outside the checkout (.ci/run)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _subshell_function(script: str, name: str) -> str:
    """The body of `name() ( ... )` in a bash script."""
    body = script[script.index(f"\n{name}() (\n") :]
    return body[: body.index("\n)\n")]


def test_ci_builds_the_wheel_installs_it_outside_the_checkout_and_runs_the_three_commands() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    [default] = re.findall(r"^TIERS=\((.*)\)$", script, flags=re.MULTILINE)
    assert "package" in default.split()
    check = _subshell_function(script, "package_check")
    assert ".venv/bin/python -m build --outdir" in check
    assert 'python3 -m venv "$work/venv"' in check and '"$work/venv/bin/pip" install -q "$work"/dist/gpu_admission-*.whl' in check
    assert 'cd "$work"' in check, "the commands run outside the checkout"
    for command in ('"$bin/gpu-admission" dry-run -f', '"$bin/gpu-admission" policies list', '"$bin/gpu-admission" demo'):
        assert command in check


def test_the_sdist_carries_the_examples_the_wheel_s_demo_falls_back_to() -> None:
    assert "graft examples" in (ROOT / "MANIFEST.in").read_text().splitlines()
    assert 'cmdclass={"build_py": BuildWithExamples}' in (ROOT / "setup.py").read_text()
    assert sorted((ROOT / "examples" / "bypasses").glob("*.yaml")), "no bypass examples for the wheel to carry"
