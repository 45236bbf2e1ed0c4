"""`gpu-admission labeler` from the command line: dry-run output, flags, exit statuses."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies import gpu
from webhook.labeler import cli, labels, nvml, ownership, publisher

DATA = Path(__file__).resolve().parents[2] / "data" / "labeler"
V100 = DATA / "v100x8.yaml"


def run(*argv: str) -> int:
    return cli.main(["labeler", *argv])


def test_dry_run_json_prints_labels_annotations_and_capacity_per_mode(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("--dry-run", "-o", "json", "--inventory", str(V100), "--node-name", "topology-0") == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"node", "source", "labels", "annotations", "capacity", "usage"}
    assert report["node"] == "topology-0"
    assert report["source"] == f"inventory {V100}"
    assert report["labels"] == {
        gpu.CARD_COUNT_LABEL: "8",
        gpu.CARD_MEMORY_LABEL: "32510MiB",
        gpu.CARD_NAME_LABEL: "Tesla-V100-SXM2-32GB",
        labels.CUDA_VERSION_LABEL: "12.4",
        labels.DRIVER_VERSION_LABEL: "550.107.02",
        gpu.CARD_MEMORY_MIB_LABEL: "32510",
    }
    assert set(report["annotations"]) == {gpu.INVENTORY_ANNOTATION, gpu.TOPOLOGY_ANNOTATION, ownership.OWNED_ANNOTATION}
    assert len(json.loads(report["annotations"][gpu.INVENTORY_ANNOTATION])) == 8
    assert set(report["capacity"]) == {str(mode) for mode in gpu.Mode}
    assert report["capacity"]["topology"]["aliyun.com/gpu"] == "8"
    assert report["capacity"]["cgpu"]["aliyun.com/gpu-mem"] == "248"
    assert "nvidia.com/gpu" not in report["capacity"]["default"]


def test_dry_run_touches_no_cluster(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def refuse(_: Any, **__: Any) -> Any:
        raise AssertionError("dry-run connected to a cluster")

    monkeypatch.setattr(publisher, "connect", refuse)
    assert run("--dry-run", "--inventory", str(V100), "--kubeconfig", "/nonexistent", "--advertise") == 0
    out = capsys.readouterr().out
    assert "aliyun.accelerator/nvidia_name=Tesla-V100-SXM2-32GB" in out
    assert "topology: " in out


def test_dry_run_yaml_and_the_node_name_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NODE_NAME", "from-env")
    assert run("--dry-run", "-o", "yaml", "--inventory", str(V100)) == 0
    assert yaml.safe_load(capsys.readouterr().out)["node"] == "from-env"


def test_dry_run_without_nvml_says_so_in_one_line_and_exits_3(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def unavailable() -> Any:
        raise nvml.Unavailable("NVML Shared Library Not Found")

    monkeypatch.setattr(nvml, "read", unavailable)
    assert run("--once", "--dry-run", "-o", "json") == cli.EXIT_NO_NVML
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert "NVML is not available" in captured.err


def test_dry_run_on_a_read_error_exits_1(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def broken() -> Any:
        raise nvml.ReadError("nvmlDeviceGetCount: Unknown Error")

    monkeypatch.setattr(nvml, "read", broken)
    assert run("--dry-run") == cli.EXIT_FAILED
    assert "Unknown Error" in capsys.readouterr().err


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch, fake_nodes: Any, node: Callable[..., Any]) -> Any:
    nodes = fake_nodes(node("gpu-0", labels={gpu.SCHEDULE_LABEL: "topology"}))
    monkeypatch.setattr(publisher, "connect", lambda kubeconfig, **_: nodes)
    return nodes


def test_once_labels_the_node_and_exits_0(cluster: Any) -> None:
    assert run("--once", "--node-name", "gpu-0", "--inventory", str(V100), "--advertise") == 0
    assert cluster.labels("gpu-0")[gpu.CARD_COUNT_LABEL] == "8"
    assert cluster.capacity("gpu-0")["aliyun.com/gpu"] == "8"


def test_once_without_nvml_writes_nothing_and_exits_3(cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable() -> Any:
        raise nvml.Unavailable("Driver Not Loaded")

    monkeypatch.setattr(nvml, "read", unavailable)
    assert run("--once", "--node-name", "gpu-0") == cli.EXIT_NO_NVML
    assert cluster.patches == []


def test_once_on_a_missing_node_exits_1(cluster: Any) -> None:
    assert run("--once", "--node-name", "nope", "--inventory", str(V100)) == cli.EXIT_FAILED


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--once", "--inventory", str(V100)], "--node-name (or $NODE_NAME) is required"),
        (["--once", "--node-name", "n", "--inventory", "/nonexistent/inv.yaml"], "/nonexistent/inv.yaml: No such file"),
        (["--once", "--node-name", "n", "--inventory", str(V100), "--health-port", "70000"], "--health-port must be 0-65535"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert run(*argv) == cli.EXIT_INPUT_ERROR
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1


def test_an_unusable_kubeconfig_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("not: a kubeconfig\n")
    assert run("--once", "--node-name", "n", "--inventory", str(V100), "--kubeconfig", str(kubeconfig)) == cli.EXIT_INPUT_ERROR
    assert f"cannot load {kubeconfig}: Invalid kube-config file" in capsys.readouterr().err


def test_once_and_interval_cannot_be_combined(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        run("--once", "--interval", "2s", "--node-name", "n")
    assert exited.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers())
    return parser.parse_args(["labeler", *argv])


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("2s", 2.0),
        ("60s", 60.0),
        ("1m", 60.0),
        ("1m30s", 90.0),
        ("500ms", 0.5),
        ("1h", 3600.0),
        ("45", 45.0),
        ("0.5", 0.5),
        (" 2s ", 2.0),
    ],
)
def test_intervals_read_like_go_durations(text: str, seconds: float) -> None:
    args = _parse("--interval", text, "--usage-interval", text)
    assert (args.interval, args.usage_interval) == (seconds, seconds)


@pytest.mark.parametrize("text", ["", "0s", "0", "-1s", "2x", "s", "1m-1s", "2 s", "nan", "inf", "1y"])
def test_bad_intervals_are_refused(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    for flag in ("--interval", "--usage-interval"):
        with pytest.raises(SystemExit) as exited:
            _parse(flag, text)
        assert exited.value.code == 2
        assert f"argument {flag}: " in capsys.readouterr().err


def test_the_interval_flag_accepts_the_local_cluster_spelling() -> None:
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(
        ["labeler", "--node-name", "n", "--kubeconfig", "k", "--inventory", "i.yaml", "--interval", "2s", "--advertise"]
    )
    assert args.interval == 2.0
    assert args.advertise and not args.once and not args.take_over
    assert args.func is cli.run


def test_dry_run_needs_no_kubernetes_client() -> None:
    # A GPU host checking its labels should not need the (large) kubernetes client installed.
    script = (
        "import sys\n"
        "from webhook.labeler import cli\n"
        f"status = cli.main(['labeler', '--dry-run', '-o', 'json', '--inventory', {str(V100)!r}])\n"
        "assert status == 0, status\n"
        "assert 'kubernetes' not in sys.modules, 'kubernetes was imported'\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert completed.returncode == 0, completed.stderr
