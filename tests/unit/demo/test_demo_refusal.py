"""`gpu-admission demo` counts a bypass as refused only when the webhook denied it naming the expected policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from webhook.commands import demo

DENIED = 'Error from server (Forbidden): error when creating "STDIN": admission webhook "validate.gpu-admission.io" denied the request: '


def test_every_bypass_example_names_its_policy_in_its_file_name() -> None:
    bypasses = sorted((demo.EXAMPLES / "bypasses").glob("*.yaml"))
    assert len(bypasses) >= 8
    assert {demo.expected_policy(path) for path in bypasses} >= {"GPU001", "GPU002", "GPU003", "GPU004", "GPU005"}
    assert all(demo.expected_policy(path).startswith("GPU0") for path in bypasses)
    assert demo.expected_policy(Path("gpu003-host-path-devices.yaml")) == "GPU003"


def test_the_webhooks_denial_naming_the_policy_is_a_refusal() -> None:
    assert demo.validating_webhooks() >= {"validate.gpu-admission.io", "validate-env-sources.gpu-admission.io"}
    assert demo.refused_by(DENIED + "GPU003: hostPath /dev is not allowed", "GPU003")
    # GPU007 is the ConfigMaps' and Secrets' webhook's.
    assert demo.refused_by(
        'Error from server: error when creating "STDIN": admission webhook "validate-env-sources.gpu-admission.io" '
        "denied the request: GPU007: ConfigMaps and Secrets must not carry a key named like a GPU environment variable",
        "GPU007",
    )
    assert demo.refused_by("Warning: something\n" + DENIED + "GPU002: privileged; GPU003: hostPath /dev", "GPU003")


@pytest.mark.parametrize(
    "stderr",
    [
        # Another policy's denial.
        DENIED + "GPU002: privileged container on a GPU node",
        # A schema error, a missing namespace, an unreachable webhook: kubectl fails, the webhook refused nothing.
        'error: error validating "STDIN": error validating data: ValidationError(Pod.spec): unknown field "containerz"',
        'Error from server (NotFound): error when creating "STDIN": namespaces "demo" not found',
        'Error from server (InternalError): error when creating "STDIN": Internal error occurred: failed calling webhook '
        '"validate.gpu-admission.io": GPU003: connection refused',
        # Another webhook's denial that happens to name the policy.
        'Error from server (Forbidden): admission webhook "other.example.com" denied the request: GPU003: no',
        "",
    ],
)
def test_anything_else_is_not_a_refusal(stderr: str) -> None:
    assert not demo.refused_by(stderr, "GPU003")
