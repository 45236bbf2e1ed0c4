"""Table, Markdown and HTML renderings of an audit; the HTML page rendered by a headless browser."""

from __future__ import annotations

import io
import os
import pathlib
import re
import shutil
import struct
import subprocess
import zlib

import pytest

from policies import settings as settings_
from tests.unit.audit.conftest import NOW, PodFactory
from webhook.audit import render, scan
from webhook.cmdline import manifests

SNAPSHOT = pathlib.Path(__file__).parent / "data" / "cluster.yaml"
BROWSER_REQUIRE_ENV = "GPU_ADMISSION_BROWSER"  # "require": no chromium fails the render test instead of skipping it


@pytest.fixture(scope="module")
def audit() -> scan.Audit:
    documents = manifests.read([str(SNAPSHOT)], stdin=io.StringIO())
    return scan.run(scan.Inventory.of(d.object for d in documents), settings=settings_.Settings(), now=NOW)


def test_the_table_has_one_row_per_stored_result_and_ends_with_the_summary(audit: scan.Audit) -> None:
    text = render.table(audit)
    lines = text.splitlines()
    assert lines[0].split() == ["NAMESPACE", "OBJECT", "POLICY", "RESULT", "ACTION", "SEVERITY", "MESSAGE"]
    # two failures of warn-level policies are written as warn, as Kyverno reports unscored policies
    assert lines[-1] == "14 object(s) audited: 8 fail, 2 warn, 0 error, 11 skip, 134 pass; 8 at enforce level"
    warn_rows = [line.split() for line in lines if re.search(r"\swarn\s", line)]
    assert len(warn_rows) == 2 and all(row[row.index("warn") + 1] == "warn" for row in warn_rows)
    assert sum(1 for line in lines if re.search(r"\s(fail|warn|error|skip)\s", line)) == 21  # 8 fail, 2 warn, 11 skip
    assert " pass " not in text
    cluster_rows = [line for line in lines if line.startswith("-  ")]
    assert [row.split()[1:3] for row in cluster_rows] == [
        ["Node/cgpu-binpack-0", "GPU202"],
        ["Node/share-0", "GPU205"],
        ["Node/unlabelled-gpu", "GPU206"],
        ["Node/unlabelled-gpu", "GPU217"],
    ]


def test_the_table_shows_passes_with_all_results(audit: scan.Audit) -> None:
    assert render.table(audit, all_results=True).count(" pass ") == 134


def test_a_clean_audit_says_so(pod: PodFactory) -> None:
    clean = scan.run(scan.Inventory.of([pod(limits={"nvidia.com/gpu": 1})]), settings=settings_.Settings(), now=NOW)
    assert render.table(clean).splitlines()[0] == "No findings."
    assert "No findings." in render.markdown(clean)
    assert "No findings." in render.html_page(clean)


def test_markdown_has_a_summary_table_a_section_per_namespace_and_the_inspect_table(audit: scan.Audit) -> None:
    text = render.markdown(audit)
    assert text.startswith("## gpu-admission audit\n")
    assert "| 8 | 2 | 0 | 11 | 134 | 14 |" in text  # two warn-level failures counted as warn
    assert [line for line in text.splitlines() if line.startswith("### ")] == [
        "### Namespace `kube-system`",
        "### Namespace `ml`",
        "### Namespace `ops`",
        "### Cluster (nodes)",
        "### GPU allocation",
    ]
    assert "| `Node/cgpu-binpack-0` | GPU202 | ❌ fail | enforce | high |" in text
    assert "cgpu-binpack-0  -          14/15                  21/15" in text  # the inspect table, verbatim


def test_markdown_escapes_pipes_and_flattens_lines(pod: PodFactory) -> None:
    odd = pod("odd", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "a|b\nc"}])
    text = render.markdown(scan.run(scan.Inventory.of([odd]), settings=settings_.Settings(), now=NOW))
    (row,) = [line for line in text.splitlines() if "GPU001" in line]
    assert "NVIDIA_VISIBLE_DEVICES=a\\|b c" in row
    assert row.count(" | ") == 5  # six cells, no stray separators


def test_the_html_page_is_self_contained_and_escaped(audit: scan.Audit, pod: PodFactory) -> None:
    page = render.html_page(audit)
    assert page.startswith("<!DOCTYPE html>")
    assert "<style>" in page
    for external in ("<script", "<link", "<img", "src=", "@import", "url(", "http://", "https://"):
        assert external not in page, external
    hostile = pod("x", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "<script>alert(1)</script>"}])
    escaped = render.html_page(scan.run(scan.Inventory.of([hostile]), settings=settings_.Settings(), now=NOW))
    assert "<script>" not in escaped and "&lt;script&gt;alert(1)&lt;/script&gt;" in escaped


def test_the_html_page_draws_a_bar_per_card_with_allocated_over_total(audit: scan.Audit) -> None:
    page = render.html_page(audit)
    assert page.count('class="gpu"') == 4 + 2 + 4  # cgpu-binpack-0, core-mem-0, share-0
    assert '<div class="fill over" style="width:100%"></div></div><span class="num">21/15 GiB</span>' in page
    assert '<span class="num">10/22 GiB, 50% cores</span>' in page
    assert "on no card of this node: ml/lost-card (2 GiB)" in page


def _png_pixels(data: bytes) -> tuple[int, int, bytes]:
    """Width, height and the inflated scanlines of a PNG (enough to tell a blank page from a drawn one)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    position, width, height, idat = 8, 0, 0, b""
    while position < len(data):
        (length,) = struct.unpack(">I", data[position : position + 4])
        kind = data[position + 4 : position + 8]
        body = data[position + 8 : position + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        position += 12 + length
    return width, height, zlib.decompress(idat)


def test_the_html_page_renders_in_a_headless_browser(audit: scan.Audit, tmp_path: pathlib.Path) -> None:
    browser = shutil.which("chromium")
    if browser is None:
        why = "no chromium on PATH (Debian: apt-get install chromium)"
        if os.environ.get(BROWSER_REQUIRE_ENV) == "require":
            pytest.fail(f"{why}; CI requires it ({BROWSER_REQUIRE_ENV}=require, installed by .ci/run's setup)")
        pytest.skip(why)
    page = tmp_path / "audit.html"
    page.write_text(render.html_page(audit), encoding="utf-8")
    shot = tmp_path / "audit.png"
    completed = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1280,1600",
            f"--screenshot={shot}",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    width, height, pixels = _png_pixels(shot.read_bytes())
    assert (width, height) == (1280, 1600)
    assert len(set(pixels)) > 50, "the screenshot is (nearly) blank"
