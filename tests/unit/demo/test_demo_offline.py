"""`gpu-admission demo` where no cluster can be built: the offline dry-run of the same examples."""

from __future__ import annotations

from pathlib import Path

import pytest

from webhook import cli
from webhook.cluster import binaries, install
from webhook.commands import demo


def test_the_offline_demo_judges_every_example_and_says_why_it_is_offline(capsys: pytest.CaptureFixture[str]) -> None:
    status = cli.main(["demo", "--offline"])
    out = capsys.readouterr().out
    assert status == 0
    assert out.startswith("demo: --offline; showing the offline dry-run of the same examples instead.")
    for policy in ("GPU001", "GPU002", "GPU003", "GPU004", "GPU005"):
        assert policy in out
    assert out.rstrip().endswith("every workload admitted and every bypass refused")


def test_without_go_the_demo_falls_back_to_the_dry_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None)
    monkeypatch.delenv("GPU_ADMISSION_BIN_DIR", raising=False)
    assert cli.main(["demo"]) == 0
    assert capsys.readouterr().out.startswith("demo: no Go toolchain to build the local control plane;")


def test_without_a_source_checkout_the_demo_falls_back_and_says_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # As installed from a wheel: no deploy/ and no Go tools module beside the package, Go or not.
    monkeypatch.setattr(install, "deploy_dir", lambda: tmp_path / "deploy")
    monkeypatch.setattr(binaries, "build_script", lambda: tmp_path / "tests" / "e2e" / "controlplane" / "build.sh")
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    monkeypatch.delenv(binaries.ENV_BIN_DIR, raising=False)
    assert cli.main(["demo"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == (
        "demo: not run from a source checkout (the local cluster is built from its deploy/ and Go tools module); "
        "showing the offline dry-run of the same examples instead."
    )
    assert out.rstrip().endswith("every workload admitted and every bypass refused")


def test_prebuilt_binaries_do_not_stand_in_for_deploy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(binaries.ENV_BIN_DIR, str(tmp_path))
    assert demo.no_cluster() is None  # the checkout's deploy/ is here; the binaries are prebuilt
    monkeypatch.setattr(install, "deploy_dir", lambda: tmp_path / "deploy")
    assert demo.no_cluster() == "not run from a source checkout (the local cluster is built from its deploy/ and Go tools module)"


def test_in_a_source_checkout_with_go_the_demo_builds_a_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    monkeypatch.delenv(binaries.ENV_BIN_DIR, raising=False)
    assert demo.no_cluster() is None
    assert demo.no_cluster(real_node=True) is None  # tests/e2e/image/build.sh is in the checkout too


def test_the_wheel_s_examples_come_first_and_the_checkout_s_otherwise(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert demo.examples_dir() == demo.SOURCE_EXAMPLES  # a checkout has no webhook/examples
    assert sorted((demo.examples_dir() / "bypasses").glob("*.yaml"))
    packaged = tmp_path / "examples"
    packaged.mkdir()
    monkeypatch.setattr(demo, "PACKAGED_EXAMPLES", packaged)
    assert demo.examples_dir() == packaged
