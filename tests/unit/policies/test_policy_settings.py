"""Settings: the defaults, the YAML document schema and its one-line error messages."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from policies import engine, gpu, model, settings


def test_defaults_enforce_every_policy_and_exempt_the_system_namespaces() -> None:
    defaults = settings.Settings()

    assert {p.id: defaults.action(p.id) for p in engine.POLICIES} == {
        **{p.id: model.Action.ENFORCE for p in engine.POLICIES},
        "GPU014": model.Action.WARN,  # a pod over its namespace's GPU budget is warned about, not refused
    }
    assert defaults.exempt_namespaces == {"kube-system", "kube-node-lease", "gpu-admission"}
    assert defaults.default_shared_mode is gpu.Mode.CGPU
    assert defaults.gpu_scheduler_name == ""
    assert defaults.keep_non_gpu_pods_off_gpu_nodes is False
    assert defaults.error_action(model.PolicyKind.VALIDATE) is model.Action.ENFORCE
    assert defaults.error_action(model.PolicyKind.MUTATE) is model.Action.WARN


@pytest.mark.parametrize("empty", [None, {}])
def test_an_empty_document_gives_the_defaults(empty: dict[str, Any] | None) -> None:
    assert settings.from_mapping(empty) == settings.Settings()


def test_a_full_document_is_read() -> None:
    document = yaml.safe_load(
        """
        policies:
          GPU001: {action: warn}
          GPU003: {action: audit}
          GPU104: {action: off}
        exemptNamespaces: [monitoring]
        defaultSharedMode: mps
        gpuSchedulerName: " gpu-scheduler "
        keepNonGpuPodsOffGpuNodes: true
        errorActions: {validate: warn, mutate: audit}
        """
    )

    parsed = settings.from_mapping(document)

    assert parsed.action("GPU001") is model.Action.WARN
    assert parsed.action("GPU003") is model.Action.AUDIT
    assert parsed.action("GPU104") is model.Action.OFF  # YAML's bare `off` arrives as False
    assert parsed.action("GPU002") is model.Action.ENFORCE
    assert parsed.exempt_namespaces == {"monitoring"}
    assert parsed.default_shared_mode is gpu.Mode.MPS
    assert parsed.gpu_scheduler_name == "gpu-scheduler"
    assert parsed.keep_non_gpu_pods_off_gpu_nodes is True
    assert parsed.error_action(model.PolicyKind.VALIDATE) is model.Action.WARN
    assert parsed.error_action(model.PolicyKind.MUTATE) is model.Action.AUDIT


@pytest.mark.parametrize("action", ["enforce", "warn", "audit", "off", "Enforce"])
def test_each_action_is_accepted(action: str) -> None:
    parsed = settings.from_mapping({"policies": {"GPU005": {"action": action}}})

    assert parsed.action("GPU005") is model.Action(action.lower())


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            {"policies": {"GPU001": {"action": "deny"}}},
            "policies.GPU001.action: must be one of enforce, warn, audit, off, got 'deny'",
        ),
        (
            {"policies": {"GPU001": {"action": True}}},
            "policies.GPU001.action: must be one of enforce, warn, audit, off, got True",
        ),
        (
            {"policies": {"GPU999": {"action": "warn"}}},
            # Every registered ID, in order (the registry grows; the message must name them all).
            f"policies.GPU999: unknown policy; known: {', '.join(sorted(p.id for p in engine.POLICIES))}",
        ),
        ({"policies": {"GPU001": "warn"}}, "policies.GPU001: must be a mapping like {action: enforce}, got 'warn'"),
        ({"policies": {"GPU001": {"mode": "warn"}}}, "policies.GPU001.mode: unknown key; known: action"),
        ({"policies": ["GPU001"]}, "policies: must be a mapping of policy ID to {action: ...}, got ['GPU001']"),
        (
            {"exemptNamespace": ["x"]},
            "exemptNamespace: unknown key; known: policies, namespaceOverrides, exceptions, exemptNamespaces, "
            "defaultSharedMode, gpuSchedulerName, extenderSchedulers, visibleDevicesNeutralValue, userPolicyBudgetSeconds, "
            "keepNonGpuPodsOffGpuNodes, trustZone, hostPaths, errorActions, dra, usageLimits, gpuBudgets, scheduler",
        ),
        ({"exemptNamespaces": "kube-system"}, "exemptNamespaces: must be a list of namespace names, got 'kube-system'"),
        ({"exemptNamespaces": ["ok", ""]}, "exemptNamespaces: must be a list of namespace names, got ['ok', '']"),
        ({"defaultSharedMode": "topology"}, "defaultSharedMode: must be one of cgpu, share, mps, got 'topology'"),
        ({"defaultSharedMode": "core_mem"}, "defaultSharedMode: must be one of cgpu, share, mps, got 'core_mem'"),
        ({"gpuSchedulerName": 3}, "gpuSchedulerName: must be a string, got 3"),
        ({"keepNonGpuPodsOffGpuNodes": "yes"}, "keepNonGpuPodsOffGpuNodes: must be true or false, got 'yes'"),
        ({"errorActions": {"admit": "warn"}}, "errorActions.admit: unknown key; known: validate, mutate"),
        (
            {"errorActions": {"mutate": "loud"}},
            "errorActions.mutate: must be one of enforce, warn, audit, off, got 'loud'",
        ),
        (["policies"], "settings: must be a mapping, got list"),
    ],
)
def test_invalid_documents_are_refused_with_one_line_naming_the_field(document: dict[str, Any], message: str) -> None:
    with pytest.raises(settings.InvalidSettings) as raised:
        settings.from_mapping(document)

    assert str(raised.value) == message
    assert "\n" not in str(raised.value)


def test_invalid_settings_is_a_value_error() -> None:
    assert issubclass(settings.InvalidSettings, ValueError)
