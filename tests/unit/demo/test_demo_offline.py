"""`gpu-admission demo` where no cluster can be built: the offline dry-run of the same examples."""

from __future__ import annotations

import pytest

from webhook import cli


def test_the_offline_demo_judges_every_example_and_says_why_it_is_offline(capsys: pytest.CaptureFixture[str]) -> None:
    status = cli.main(["demo", "--offline"])
    out = capsys.readouterr().out
    assert status == 0
    assert out.startswith("demo: --offline; showing the offline dry-run of the same examples instead.")
    for policy in ("GPU001", "GPU002", "GPU003", "GPU004", "GPU005"):
        assert policy in out
    assert out.rstrip().endswith("every workload admitted and every bypass refused")


def test_without_go_the_demo_falls_back_to_the_dry_run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None)
    monkeypatch.delenv("GPU_ADMISSION_BIN_DIR", raising=False)
    assert cli.main(["demo"]) == 0
    assert capsys.readouterr().out.startswith("demo: no Go toolchain to build the local control plane;")
