"""The configuration document: namespace overrides, exceptions with expiry, the neutral env value."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
import yaml

from policies import builtin, engine, model, settings
from tests.conftest import PodFactory

NOW = datetime.datetime(2026, 6, 1, 12, 0, tzinfo=datetime.UTC)
PRIVILEGED_GPU = {"limits": {"nvidia.com/gpu": 1}, "privileged": True}

FULL_DOCUMENT = """
policies:
  GPU002: {action: enforce}
  GPU104: {action: off}
namespaceOverrides:
  - name: research
    namespaces: [research]
    policies:
      GPU002: {action: warn}
  - name: labs
    namespaceSelector:
      matchLabels: {gpu-admission.io/tier: lab}
      matchExpressions: [{key: env, operator: In, values: [dev, test]}]
    policies:
      GPU002: {action: audit}
      GPU104: {action: enforce}
exceptions:
  - name: dcgm-exporter
    policies: [GPU002, GPU003]
    match:
      namespaces: [monitoring]
      names: ["dcgm-exporter-*"]
      objectSelector: {matchLabels: {app: dcgm-exporter}}
    expires: 2026-12-31T00:00:00Z
    reason: needs the device nodes, OPS-1234
  - name: old-tool
    policies: [GPU002]
    match: {namespaces: [tools]}
    expires: 2026-01-01
exemptNamespaces: [kube-system]
defaultSharedMode: share
gpuSchedulerName: gpu-scheduler
visibleDevicesNeutralValue: none
keepNonGpuPodsOffGpuNodes: false
errorActions: {validate: enforce, mutate: warn}
"""


def parsed(text: str = FULL_DOCUMENT) -> settings.Settings:
    return settings.from_mapping(yaml.safe_load(text))


def decide(
    obj: dict[str, Any],
    config: settings.Settings,
    *,
    namespace: str,
    labels: dict[str, str] | None = None,
    now: datetime.datetime | None = NOW,
) -> model.Decision:
    request = model.Request(operation="CREATE", object=obj, namespace=namespace, namespace_labels=labels, now=now)
    return engine.evaluate(request, settings=config)


def outcome(decision: model.Decision, policy_id: str) -> model.PolicyResult:
    return next(r for r in decision.results if r.policy == policy_id)


def test_the_full_example_document_is_read() -> None:
    config = parsed()

    assert [o.name for o in config.namespace_overrides] == ["research", "labs"]
    assert [e.name for e in config.exceptions] == ["dcgm-exporter", "old-tool"]
    assert config.exceptions[0].expires == datetime.datetime(2026, 12, 31, tzinfo=datetime.UTC)
    assert config.exceptions[1].expires == datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    assert config.exceptions[0].reason == "needs the device nodes, OPS-1234"
    assert config.visible_devices_neutral_value == "none"


def test_without_a_namespace_the_cluster_wide_action_is_given() -> None:
    assert parsed().action("GPU002") is model.Action.ENFORCE


def test_an_override_by_namespace_name_changes_the_action_there_only() -> None:
    config = parsed()

    assert config.action("GPU002", namespace="research") is model.Action.WARN
    assert config.action("GPU002", namespace="team-a") is model.Action.ENFORCE
    assert config.action("GPU003", namespace="research") is model.Action.ENFORCE  # not named there


def test_an_override_by_label_selector_needs_the_namespace_labels() -> None:
    config = parsed()
    lab = {"gpu-admission.io/tier": "lab", "env": "dev"}

    assert config.action("GPU002", namespace="x", namespace_labels=lab) is model.Action.AUDIT
    assert config.action("GPU002", namespace="x", namespace_labels={**lab, "env": "prod"}) is model.Action.ENFORCE
    assert config.action("GPU002", namespace="x") is model.Action.ENFORCE  # labels unknown: no match


def test_the_first_matching_override_that_names_the_policy_wins() -> None:
    config = parsed()
    lab = {"gpu-admission.io/tier": "lab", "env": "test"}

    assert config.action("GPU002", namespace="research", namespace_labels=lab) is model.Action.WARN
    assert config.action("GPU104", namespace="research", namespace_labels=lab) is model.Action.ENFORCE


def test_the_namespace_name_label_is_always_known() -> None:
    config = parsed(
        """
        namespaceOverrides:
          - namespaceSelector:
              matchExpressions: [{key: kubernetes.io/metadata.name, operator: In, values: [sandbox]}]
            policies: {GPU002: {action: warn}}
        """
    )

    assert config.action("GPU002", namespace="sandbox") is model.Action.WARN


def test_the_engine_applies_overrides(make_pod: PodFactory) -> None:
    pod = make_pod(**PRIVILEGED_GPU)
    config = parsed()

    assert not decide(pod, config, namespace="team-a").allowed
    relaxed = decide(pod, config, namespace="research")
    assert relaxed.allowed
    assert [v.action for v in relaxed.violations if v.policy == "GPU002"] == [model.Action.WARN]


def test_an_active_exception_skips_the_policy_with_its_name(make_pod: PodFactory) -> None:
    pod = make_pod(name="dcgm-exporter-x1", **PRIVILEGED_GPU)
    pod["metadata"]["labels"] = {"app": "dcgm-exporter"}

    decision = decide(pod, parsed(), namespace="monitoring")

    assert decision.allowed
    assert outcome(decision, "GPU002") == model.PolicyResult(
        policy="GPU002", result=model.Result.SKIP, message="exception dcgm-exporter"
    )


@pytest.mark.parametrize(
    ("namespace", "name", "labels"),
    [
        ("team-a", "dcgm-exporter-x1", {"app": "dcgm-exporter"}),  # other namespace
        ("monitoring", "node-exporter", {"app": "dcgm-exporter"}),  # other name
        ("monitoring", "dcgm-exporter-x1", {"app": "other"}),  # other labels
    ],
)
def test_every_match_field_of_an_exception_must_hold(
    make_pod: PodFactory, namespace: str, name: str, labels: dict[str, str]
) -> None:
    pod = make_pod(name=name, **PRIVILEGED_GPU)
    pod["metadata"]["labels"] = labels

    assert not decide(pod, parsed(), namespace=namespace).allowed


def test_a_pod_with_only_a_generate_name_matches_a_name_pattern(make_pod: PodFactory) -> None:
    pod = make_pod(**PRIVILEGED_GPU)
    pod["metadata"] = {"generateName": "dcgm-exporter-", "labels": {"app": "dcgm-exporter"}}

    assert decide(pod, parsed(), namespace="monitoring").allowed


def test_a_workload_matches_by_its_pod_template_labels(make_pod: PodFactory) -> None:
    template = make_pod(**PRIVILEGED_GPU)
    template["metadata"] = {"labels": {"app": "dcgm-exporter"}}
    daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "dcgm-exporter-ds", "namespace": "monitoring"},
        "spec": {"selector": {"matchLabels": {"app": "dcgm-exporter"}}, "template": template},
    }

    assert decide(daemonset, parsed(), namespace="monitoring").allowed


def test_an_expired_exception_no_longer_applies(make_pod: PodFactory) -> None:
    pod = make_pod(**PRIVILEGED_GPU)

    before = decide(pod, parsed(), namespace="tools", now=datetime.datetime(2025, 12, 31, 23, 59, tzinfo=datetime.UTC))
    after = decide(pod, parsed(), namespace="tools", now=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC))

    assert before.allowed
    assert not after.allowed


def test_without_a_clock_an_exception_with_an_expiry_does_not_apply(make_pod: PodFactory) -> None:
    pod = make_pod(**PRIVILEGED_GPU)
    forever = parsed("exceptions: [{name: forever, policies: [GPU002], match: {namespaces: [tools]}}]")

    assert not decide(pod, parsed(), namespace="tools", now=None).allowed
    assert decide(pod, forever, namespace="tools", now=None).allowed


def test_expired_exceptions_are_listed_for_audit() -> None:
    config = parsed()

    assert [e.name for e in settings.expired_exceptions(config, now=NOW)] == ["old-tool"]
    assert settings.expired_exceptions(config, now=datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)) == []
    later = datetime.datetime(2027, 1, 1, tzinfo=datetime.UTC)
    assert [e.name for e in settings.expired_exceptions(config, now=later)] == ["dcgm-exporter", "old-tool"]


def test_the_neutral_value_is_what_gpu104_writes_and_gpu001_accepts(make_pod: PodFactory) -> None:
    config = parsed('visibleDevicesNeutralValue: ""')
    plain = make_pod()
    blank = make_pod(limits={"nvidia.com/gpu": 1}, env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": ""}])

    patch = decide(plain, config, namespace="team-a").patch
    assert {"op": "add", "path": "/spec/containers/0/env", "value": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": ""}]} in patch
    assert decide(blank, config, namespace="team-a").allowed
    assert not decide(blank, settings.Settings(), namespace="team-a").allowed  # not neutral by default


def test_the_default_neutral_value_is_void(make_pod: PodFactory) -> None:
    patch = decide(make_pod(), settings.Settings(), namespace="team-a").patch

    assert patch[-1]["value"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "visibleDevicesNeutralValue: all",
            "visibleDevicesNeutralValue: must be one of 'void', 'none', '' (values that expose no GPU), got 'all'",
        ),
        ("namespaceOverrides: {}", "namespaceOverrides: must be a list, got {}"),
        (
            "namespaceOverrides: [{policies: {GPU002: {action: warn}}}]",
            "namespaceOverrides[0]: needs namespaces and/or namespaceSelector",
        ),
        ("namespaceOverrides: [{namespaces: [a]}]", "namespaceOverrides[0].policies: is required"),
        (
            "namespaceOverrides: [{namespaces: [a], policies: {GPU002: {action: deny}}}]",
            "namespaceOverrides[0].policies.GPU002.action: must be one of enforce, warn, audit, off, got 'deny'",
        ),
        (
            "namespaceOverrides: [{namespaces: [Not_A_Name], policies: {}}]",
            "namespaceOverrides[0].namespaces[0]: 'Not_A_Name' is not a namespace name",
        ),
        (
            "namespaceOverrides: [{namespaceSelector: {matchExpressions: [{key: a, operator: Has}]}, policies: {}}]",
            "namespaceOverrides[0].namespaceSelector.matchExpressions[0].operator: must be one of In, NotIn, Exists, DoesNotExist, got 'Has'",
        ),
        (
            "namespaceOverrides: [{namespaceSelector: {matchExpressions: [{key: a, operator: In}]}, policies: {}}]",
            "namespaceOverrides[0].namespaceSelector.matchExpressions[0].values: must not be empty for In",
        ),
        (
            "namespaceOverrides: [{namespaceSelector: {matchLabel: {}}, policies: {}}]",
            "namespaceOverrides[0].namespaceSelector.matchLabel: unknown key; known: matchLabels, matchExpressions",
        ),
        (
            "exceptions: [{policies: [GPU002], match: {namespaces: [a]}}]",
            "exceptions[0].name: is required (a non-empty string), got None",
        ),
        (
            "exceptions: [{name: x, match: {namespaces: [a]}}]",
            "exceptions[0].policies: must be a list of non-empty strings, got None",
        ),
        (
            "exceptions: [{name: x, policies: [GPU999], match: {namespaces: [a]}}]",
            f"exceptions[0].policies[0]: unknown policy 'GPU999'; known: {', '.join(sorted(p.id for p in builtin.POLICIES))}",
        ),
        (
            "exceptions: [{name: x, policies: [GPU002]}]",
            "exceptions[0].match: is required: namespaces, namespaceSelector, names and/or objectSelector",
        ),
        (
            "exceptions: [{name: x, policies: [GPU002], match: {name: a}}]",
            "exceptions[0].match.name: unknown key; known: namespaces, namespaceSelector, names, objectSelector",
        ),
        (
            "exceptions: [{name: x, policies: [GPU002], match: {namespaces: [a], names: [a]}, expires: next week}]",
            "exceptions[0].expires: must be an RFC 3339 time like 2026-12-31T00:00:00Z, got 'next week'",
        ),
        (
            "exceptions: [{name: x, policies: [GPU002], match: {namespaces: [a], names: [a]}}, {name: x, policies: [GPU003], match: {namespaces: [a], names: [b]}}]",
            "exceptions[1].name: 'x' is used by an earlier exception",
        ),
        (
            "exceptions: [{name: x, policies: [GPU002], match: {namespaces: [a], names: [a]}, until: 1}]",
            "exceptions[0].until: unknown key; known: name, policies, match, expires, reason",
        ),
    ],
)
def test_an_invalid_document_is_refused_with_one_line_naming_the_field(text: str, message: str) -> None:
    with pytest.raises(settings.InvalidSettings) as raised:
        parsed(text)

    assert str(raised.value) == message
