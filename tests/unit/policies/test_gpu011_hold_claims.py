"""GPU011 and the extender's hold claims: the claim the extender writes in its own namespace (where
no DeviceTaintRule API is served) asks for no GPU class and has no selector, so it is admitted; a
tenant who copies its label onto a GPU claim gains nothing."""

from __future__ import annotations

import copy

from policies import model
from policies.gpu import dra
from tests.unit.policies.conftest import Evaluate, ResultOf

DEVICE = dra.Device(driver="gpu.nvidia.com", pool="gpu-0", name="gpu-0", node="gpu-0", uuid="GPU-0000", card_uuid="GPU-0000")


def test_the_extenders_hold_claim_is_admitted(evaluate: Evaluate, result: ResultOf) -> None:
    # In the extender's own namespace (exempt by default) ...
    assert evaluate(dra.hold_claim(DEVICE, namespace="gpu-admission"), namespace="gpu-admission").allowed
    # ... and in a ledger namespace of its own (`--ledger-namespace`) that no exemption names.
    decision = evaluate(dra.hold_claim(DEVICE, namespace="gpu-ledger"), namespace="gpu-ledger")
    assert decision.allowed
    assert result(decision, "GPU011") is model.Result.PASS


def test_a_tenant_gpu_claim_with_the_hold_label_is_still_denied(evaluate: Evaluate) -> None:
    claim = copy.deepcopy(dra.hold_claim(DEVICE, namespace="team-a"))
    claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "gpu.nvidia.com"
    decision = evaluate(claim, namespace="team-a")
    assert not decision.allowed
    assert "GPU DeviceClass 'gpu.nvidia.com'" in decision.denial_message
