"""The wheel carries the examples: `gpu-admission demo`'s offline fallback judges them.

Everything else of the build is declared in pyproject.toml. The seed workloads and bypass attempts
live at the repository's top (`examples/`, where the README's commands name them), outside any
package, so package data cannot reach them: build_py copies them into `webhook/examples/` of the
build (never of the source tree), where `webhook.commands.demo.examples_dir` finds them in an
installed wheel. MANIFEST.in puts them into the sdist, which the wheel is built from.
"""

from __future__ import annotations

import pathlib
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

EXAMPLES = pathlib.Path(__file__).resolve().parent / "examples"


class BuildWithExamples(build_py):
    """build_py, then examples/*/**.yaml into the built `webhook` package."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return  # an editable install runs from the checkout, which has examples/ at its top
        found = sorted(EXAMPLES.rglob("*.yaml"))
        if not found:
            raise SystemExit(f"setup.py: no examples under {EXAMPLES}: the wheel's demo fallback needs them")
        target = pathlib.Path(self.build_lib) / "webhook" / "examples"
        for path in found:
            destination = target / path.relative_to(EXAMPLES)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, destination)


setup(cmdclass={"build_py": BuildWithExamples})
