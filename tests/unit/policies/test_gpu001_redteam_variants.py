"""GPU001 against spellings a tenant may try: duplicate entries, `$(VAR)` expansion, newer
`valueFrom` sources, whitespace and case. Each is judged as the kubelet and the NVIDIA toolkit
would read it, and the ordinary neighbours still pass."""

from __future__ import annotations

from typing import Any

import pytest

from policies import model
from tests.unit.policies.conftest import ContainerFactory, Evaluate, PodFactory, ResultOf, ViolationMessages

GPU_MEM = {"aliyun.com/gpu-mem": 2}
VISIBLE = "NVIDIA_VISIBLE_DEVICES"


@pytest.mark.parametrize(
    "env",
    [
        # The kubelet keeps the last entry of a name: every entry is judged, whichever comes last.
        [{"name": VISIBLE, "value": "void"}, {"name": VISIBLE, "value": "all"}],
        [{"name": VISIBLE, "value": "all"}, {"name": VISIBLE, "value": "void"}],
        # The kubelet expands $(VAR) after admission: a reference is not a neutral value.
        [{"name": "CARDS", "value": "all"}, {"name": VISIBLE, "value": "$(CARDS)"}],
        [{"name": VISIBLE, "value": "void$(SUFFIX)"}],
        # A newer valueFrom source (EnvFiles, 1.34 alpha) is a reference like the others.
        [{"name": VISIBLE, "valueFrom": {"fileKeyRef": {"volumeName": "cfg", "path": "env", "key": "k"}}}],
        [{"name": "CGPU_DISABLE", "valueFrom": {"fileKeyRef": {"volumeName": "cfg", "path": "env", "key": "k"}}}],
        # An isolation variable set twice, once harmlessly named.
        [{"name": "CGPU_DISABLE_X", "value": "1"}, {"name": "CGPU_DISABLE", "value": "false"}],
    ],
    ids=[
        "void-then-all",
        "all-then-void",
        "expansion",
        "void-with-expansion",
        "file-key-ref",
        "file-key-ref-isolation",
        "isolation",
    ],
)
def test_spellings_that_could_deliver_a_card_are_denied(
    pod: PodFactory,
    container: ContainerFactory,
    evaluate: Evaluate,
    violation_messages: ViolationMessages,
    env: list[dict[str, Any]],
) -> None:
    decision = evaluate(pod(container(gpu=GPU_MEM, env=env)))

    assert not decision.allowed
    assert violation_messages(decision, "GPU001")


@pytest.mark.parametrize(
    "env",
    [
        [{"name": VISIBLE, "value": "void"}, {"name": VISIBLE, "value": "none"}],
        [{"name": "nvidia_visible_devices", "value": "all"}],  # Linux names are case-sensitive: not read
        [{"name": " NVIDIA_VISIBLE_DEVICES", "value": "all"}],  # another name (relaxed env-name validation)
        [{"name": "NVIDIA_VISIBLE_DEVICES_BACKUP", "value": "all"}],
        [{"name": "APP_CARDS", "value": "$(NVIDIA_VISIBLE_DEVICES)"}],  # reading it chooses nothing
    ],
    ids=["void-then-none", "lower-case", "leading-space", "longer-name", "reads-it"],
)
def test_names_the_toolkit_does_not_read_and_neutral_duplicates_pass(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, env: list[dict[str, Any]]
) -> None:
    decision = evaluate(pod(container(gpu=GPU_MEM, env=env)))

    assert decision.allowed
    assert result(decision, "GPU001") is model.Result.PASS
