"""`inspect` shows the DRA claims whose device no ResourceSlice publishes with a UUID (so no card can
be named for them): a `draUnmatched` list in JSON and YAML, a closing section in the tables. The
extender's own hold claims are never listed; without such claims the views are unchanged."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from policies.gpu import dra, reservations
from tests import dra_objects
from webhook.extender import cli as extender_cli
from webhook.extender import kube as extender_kube

NO_UUID_SLICE = dra_objects.slice_for("gpu-0", ["GPU-0000"])
for _device in NO_UUID_SLICE["spec"]["devices"]:
    _device["attributes"] = {}  # a driver that publishes no UUID: nothing to match a card by


def serve(monkeypatch: pytest.MonkeyPatch, make_node: Callable[..., dict[str, Any]], claims: list[dict[str, Any]]) -> None:
    listed = {
        "/api/v1/nodes": [make_node("gpu-0")],
        "/api/v1/pods": [],
        f"/apis/coordination.k8s.io/v1/namespaces/{reservations.LEDGER_NAMESPACE}/leases": [],
        dra.SLICES_PATH: [NO_UUID_SLICE],
        dra.CLAIMS_PATH: claims,
    }

    class Api:
        def __init__(self, _client: Any) -> None:
            pass

        def list(self, path: str, *, label_selector: str = "") -> tuple[list[Any], str]:
            return listed[path], "1"

    monkeypatch.setattr(extender_kube, "KubeApi", Api)
    monkeypatch.setattr(extender_kube, "load_client", lambda *_args, **_kwargs: object())


TENANT = dra_objects.claim("train", namespace="ml", uid="c-1", allocated=("gpu-0", "gpu-0"))


def _hold() -> dict[str, Any]:
    device = dra.Device(driver="gpu.nvidia.com", pool="gpu-0", name="gpu-0", node="gpu-0", uuid="", card_uuid="")
    claim = dra.hold_claim(device, namespace=reservations.LEDGER_NAMESPACE)
    return {**claim, "metadata": {**claim["metadata"], "uid": "h-1"}, "status": {"allocation": dra.hold_allocation(device)}}


def test_a_claim_on_a_device_without_uuid_is_listed_in_every_view(
    monkeypatch: pytest.MonkeyPatch, make_node: Callable[..., dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    serve(monkeypatch, make_node, [TENANT, _hold()])
    assert extender_cli.inspect_main(["-o", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["draUnmatched"] == [
        {"claim": "ml/train", "driver": "gpu.nvidia.com", "pool": "gpu-0", "device": "gpu-0", "shared": False}
    ]
    assert all(not d.get("dra") for d in document["nodes"][0]["devs"])  # on no card
    assert extender_cli.inspect_main(["-o", "yaml"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["draUnmatched"][0]["claim"] == "ml/train"
    for view in ([], ["-d"], ["-o", "wide"]):
        assert extender_cli.inspect_main(view) == 0
        printed = capsys.readouterr().out
        assert "not matched to any card" in printed and "ml/train: device gpu-0 of driver gpu.nvidia.com, pool gpu-0" in printed
        assert "gpu-admission/" not in printed  # the extender's hold claim is no DRA booking


def test_without_unmatched_claims_the_views_are_unchanged(
    monkeypatch: pytest.MonkeyPatch, make_node: Callable[..., dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    serve(monkeypatch, make_node, [_hold()])
    assert extender_cli.inspect_main(["-o", "json"]) == 0
    assert "draUnmatched" not in json.loads(capsys.readouterr().out)
    assert extender_cli.inspect_main([]) == 0
    assert "not matched" not in capsys.readouterr().out
