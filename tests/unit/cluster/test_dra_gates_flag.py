"""`cluster up --dra-device-taints` and `demo --dra-device-taints` turn DRA device taints (alpha in
Kubernetes 1.34) on, on kube-apiserver and kube-scheduler; without the flag both start as shipped,
so the extender's hold claims (docs/dra.md) are what keeps shared cards from DRA."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from webhook import cli
from webhook.cluster import binaries, controlplane, install, nodes
from webhook.commands import demo


class Captured(Exception):
    pass


@pytest.fixture
def bring_up(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def fake(directory: Path, **kwargs: Any) -> Any:
        seen.update(kwargs)
        raise Captured

    monkeypatch.setattr(install, "bring_up", fake)
    monkeypatch.setattr(binaries, "ensure", lambda **_: Path("/nonexistent"))
    monkeypatch.setattr(nodes, "load", lambda _: [])
    monkeypatch.setattr(controlplane.State, "load", staticmethod(lambda _: None))
    return seen


@pytest.mark.parametrize("on", [True, False])
def test_cluster_up_passes_the_gates_only_when_asked(bring_up: dict[str, Any], tmp_path: Path, on: bool) -> None:
    args = cli.make_parser().parse_args(["cluster", "up", "--dir", str(tmp_path), *(["--dra-device-taints"] if on else [])])
    with pytest.raises(Captured):
        args.func(args)
    if on:
        assert "--feature-gates=DRADeviceTaints=true" in bring_up["apiserver_flags"]
        assert "--runtime-config=resource.k8s.io/v1alpha3=true" in bring_up["apiserver_flags"]
        assert bring_up["scheduler_flags"] == ("--feature-gates=DRADeviceTaints=true",)
    else:
        assert tuple(bring_up["apiserver_flags"]) == () and tuple(bring_up["scheduler_flags"]) == ()


@pytest.mark.parametrize("on", [True, False])
def test_the_demo_passes_the_gates_only_when_asked(bring_up: dict[str, Any], tmp_path: Path, on: bool) -> None:
    with pytest.raises(Captured):
        demo._on_cluster(tmp_path, dra_device_taints=on)
    assert bool(bring_up["apiserver_flags"]) is on and bool(bring_up["scheduler_flags"]) is on
    assert cli.make_parser().parse_args(["demo", "--dra-device-taints"]).dra_device_taints is True
    assert cli.make_parser().parse_args(["demo"]).dra_device_taints is False
