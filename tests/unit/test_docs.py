"""The documentation: generated pages current, the site builds with `mkdocs build --strict`."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from docs import generate
from policies import settings
from policies.builtin import POLICIES
from webhook.audit.checks import CHECKS

REGENERATE = "run `.venv/bin/python -m docs.generate` and commit what it writes"


def test_every_generated_page_is_what_the_generator_writes_now() -> None:
    changed = [str(path.relative_to(generate.ROOT)) for path in generate.differing()]
    assert not changed, f"not current: {', '.join(changed)}; {REGENERATE}"


def test_a_changed_policy_makes_its_page_not_current(monkeypatch: pytest.MonkeyPatch) -> None:
    # The check above can fail: a summary edited in the registry is seen on the page.
    item = POLICIES[0]
    monkeypatch.setattr(type(item), "summary", item.summary + " (edited)")
    assert generate.DOCS / "policies" / f"{item.id}.md" in generate.differing()


def test_there_is_a_page_and_a_nav_entry_per_policy_and_per_check() -> None:
    nav = (generate.ROOT / "mkdocs.yml").read_text()
    for item in POLICIES:
        assert f"policies/{item.id}.md" in nav
    for check in CHECKS:
        assert f"audit-checks/{check.id}.md" in nav
    assert generate.stale() == []


def test_the_settings_reference_names_every_key_the_loader_accepts() -> None:
    page = generate.settings_page()
    for key in settings._KEYS:  # noqa: SLF001 - the loader's own list of keys
        assert f"### {key}\n" in page


def test_the_cli_reference_has_a_section_per_command() -> None:
    page = generate.cli_page()
    for name in ("serve", "dry-run", "audit", "certs rotate", "cluster up", "completion"):
        assert f"`gpu-admission {name}`" in page
    assert "| `--kubeconfig` | `FILE` |" in page or "`--kubeconfig`" in page


def test_the_site_builds_strict(tmp_path: pathlib.Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=generate.ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "policies" / "GPU001" / "index.html").exists()
    assert (tmp_path / "site" / "threat-model" / "index.html").exists()


def test_a_broken_link_fails_the_strict_build(tmp_path: pathlib.Path) -> None:
    # Strictness is configuration (mkdocs.yml's validation), so prove it holds: a copy of the docs
    # with one link to a page that does not exist must not build.
    docs = tmp_path / "docs"
    subprocess.run(["cp", "-r", str(generate.DOCS), str(docs)], check=True)
    (docs / "index.md").write_text((docs / "index.md").read_text() + "\n[gone](no-such-page.md)\n")
    config = (generate.ROOT / "mkdocs.yml").read_text()
    (tmp_path / "mkdocs.yml").write_text(config)
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode != 0
    assert "no-such-page.md" in done.stderr
