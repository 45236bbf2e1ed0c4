"""The engine: actions, exemptions, short-circuits, crashing policies, ordering and robustness."""

from __future__ import annotations

from typing import Any, NoReturn

import pytest

from policies import engine, model, policy
from policies.builtin import gpu001_visible_devices, gpu104_void_devices
from tests.unit.policies.conftest import ContainerFactory, Evaluate, Patched, PodFactory, ResultOf, WorkloadFactory

ALL = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}
VOID_ENV = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}


def test_registry_lists_every_policy_once_in_id_order_with_its_sentence_and_default() -> None:
    ids = [p.id for p in engine.POLICIES]

    assert ids == [
        "GPU001",
        "GPU002",
        "GPU003",
        "GPU004",
        "GPU005",
        "GPU006",
        "GPU007",
        "GPU008",
        "GPU009",
        "GPU010",
        "GPU011",
        "GPU012",
        "GPU013",
        "GPU014",
        "GPU101",
        "GPU102",
        "GPU103",
        "GPU104",
        "GPU105",
        "GPU106",
        "GPU107",
    ]
    assert {p.id: p.kind for p in engine.POLICIES} == {
        **{i: model.PolicyKind.VALIDATE for i in ids if i.startswith("GPU0")},
        **{i: model.PolicyKind.MUTATE for i in ids if i.startswith("GPU1")},
    }
    # GPU014 only warns by default: a pod over its namespace's GPU budget waits, it is not refused.
    assert {p.id: p.default_action for p in engine.POLICIES} == {
        **{i: model.Action.ENFORCE for i in ids},
        "GPU014": model.Action.WARN,
    }
    for item in engine.POLICIES:
        assert item.summary and not item.summary.endswith(".") and ":" not in item.summary


def test_results_cover_every_policy_in_id_order(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    decision = evaluate(pod(container(gpu={"nvidia.com/gpu": 1})))

    # Every policy that judges Pods (GPU007 judges ConfigMaps and Secrets only).
    assert [r.policy for r in decision.results] == [p.id for p in engine.POLICIES if policy.judges(p, "Pod")]


@pytest.mark.parametrize("namespace", ["kube-system", "kube-node-lease", "gpu-admission"])
def test_exempt_namespace_is_allowed_untouched(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, namespace: str
) -> None:
    decision = evaluate(pod(container(env=[ALL], privileged=True)), namespace=namespace)

    assert decision.allowed
    assert decision.patch == ()
    assert decision.exempt_reason == f"namespace {namespace} is exempt"


def test_configured_exempt_namespaces_replace_the_defaults(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    config = {"exemptNamespaces": ["monitoring"]}

    assert evaluate(pod(container(env=[ALL])), namespace="monitoring", config=config).allowed
    assert not evaluate(pod(container(env=[ALL])), namespace="kube-system", config=config).allowed


def test_namespace_falls_back_to_the_object_metadata(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    obj = pod(container(env=[ALL]))
    obj["metadata"]["namespace"] = "kube-system"

    assert evaluate(obj, namespace="").exempt_reason == "namespace kube-system is exempt"


def test_enforce_denies_with_every_enforced_message(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    decision = evaluate(pod(container(env=[ALL], gpu={"nvidia.com/gpu": 0})))

    assert not decision.allowed
    assert decision.denial_message == "; ".join(v.message for v in decision.violations if v.action is model.Action.ENFORCE)
    assert {v.policy for v in decision.violations} == {"GPU001", "GPU004"}


def test_a_denied_request_carries_no_patch(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    decision = evaluate(pod(container(env=[ALL]), container("sidecar")))

    assert not decision.allowed
    assert decision.patch == ()


def test_warn_allows_and_returns_the_message_as_a_warning(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf
) -> None:
    decision = evaluate(pod(container(env=[ALL])), config={"policies": {"GPU001": {"action": "warn"}}})

    assert decision.allowed
    assert result(decision, "GPU001") is model.Result.FAIL
    assert decision.warnings == (decision.violations[0].message,)
    assert decision.violations[0].action is model.Action.WARN


def test_audit_allows_silently_and_records_the_violation(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf
) -> None:
    decision = evaluate(pod(container(env=[ALL])), config={"policies": {"GPU001": {"action": "audit"}}})

    assert decision.allowed
    assert decision.warnings == ()
    assert result(decision, "GPU001") is model.Result.FAIL
    assert [v.action for v in decision.violations] == [model.Action.AUDIT]


@pytest.mark.parametrize("off", ["off", False])
def test_off_skips_the_policy(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, off: str | bool
) -> None:
    decision = evaluate(pod(container(env=[ALL])), config={"policies": {"GPU001": {"action": off}}})

    assert decision.allowed
    assert result(decision, "GPU001") is model.Result.SKIP
    assert decision.violations == ()


def test_mutator_under_warn_only_says_what_it_would_add(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf
) -> None:
    decision = evaluate(pod(container()), config={"policies": {"GPU104": {"action": "warn"}}})

    assert decision.allowed
    assert decision.patch == ()
    assert decision.warnings == (
        "GPU104: containers that request no GPU get NVIDIA_VISIBLE_DEVICES=void: would have "
        'container "main": added NVIDIA_VISIBLE_DEVICES=void',
    )
    assert result(decision, "GPU104") is model.Result.PASS


def test_mutator_under_audit_only_records_what_it_would_add(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    decision = evaluate(pod(container()), config={"policies": {"GPU104": {"action": "audit"}}})

    assert decision.patch == ()
    assert decision.warnings == ()
    gpu104 = next(r for r in decision.results if r.policy == "GPU104")
    assert gpu104.message.startswith("would have ")


def test_mutation_runs_before_validation(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    # A pod-level GPU selector is injected first, then GPU005 judges the injected value.
    decision = evaluate(pod(container(gpu={"aliyun.com/gpu": 1})))

    assert decision.allowed
    assert decision.patch[0]["value"] == {"ack.node.gpu.schedule": "topology"}


def boom(*args: object, **kwargs: object) -> NoReturn:
    raise RuntimeError("boom")


def test_crashing_validator_is_an_error_that_denies_by_default(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpu001_visible_devices.VisibleDevices, "check_container", boom)

    decision = evaluate(pod(container(env=[VOID_ENV])))

    assert not decision.allowed
    assert result(decision, "GPU001") is model.Result.ERROR
    assert decision.denial_message == "GPU001: policy error: RuntimeError: boom"


def test_crashing_validator_only_warns_when_validate_errors_warn(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpu001_visible_devices.VisibleDevices, "check_container", boom)

    decision = evaluate(pod(container(env=[VOID_ENV])), config={"errorActions": {"validate": "warn"}})

    assert decision.allowed
    assert decision.warnings == ("GPU001: policy error: RuntimeError: boom",)


def test_crashing_audited_validator_never_denies(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpu001_visible_devices.VisibleDevices, "check_container", boom)

    decision = evaluate(pod(container(env=[VOID_ENV])), config={"policies": {"GPU001": {"action": "audit"}}})

    assert decision.allowed
    assert decision.warnings == ()
    assert [v.action for v in decision.violations] == [model.Action.AUDIT]


def test_crashing_mutator_warns_and_the_other_mutators_still_apply(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpu104_void_devices.VoidDevices, "mutate_container", boom)

    # The sidecar requests no GPU, so GPU104 has work here (its pre-check lets it run) and crashes.
    decision = evaluate(pod(container(gpu={"aliyun.com/gpu-mem": 1}), container("sidecar")))

    assert decision.allowed
    assert result(decision, "GPU104") is model.Result.ERROR
    assert decision.warnings == ("GPU104: policy error: RuntimeError: boom",)
    assert decision.patch == ({"op": "add", "path": "/spec/nodeSelector", "value": {"ack.node.gpu.schedule": "cgpu"}},)


def test_crashing_mutator_denies_when_mutate_errors_enforce(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpu104_void_devices.VoidDevices, "mutate_container", boom)

    decision = evaluate(pod(container()), config={"errorActions": {"mutate": "enforce"}})

    assert not decision.allowed


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        ({"apiVersion": "v1", "kind": "Service", "spec": {}}, "kind 'Service' has no pod template"),
        ({"kind": "Pod"}, "kind 'Pod' has no pod template"),
        ({}, "kind None has no pod template"),
    ],
)
def test_objects_without_a_pod_template_are_allowed_with_a_reason(evaluate: Evaluate, obj: dict[str, Any], reason: str) -> None:
    decision = evaluate(obj)

    assert decision.allowed
    assert decision.exempt_reason == reason


@pytest.mark.parametrize("operation", ["DELETE", "CONNECT"])
def test_delete_and_connect_are_not_evaluated(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, operation: str
) -> None:
    decision = evaluate(pod(container(env=[ALL])), operation=operation)

    assert decision.allowed
    assert decision.exempt_reason == f"operation {operation} is not evaluated"


def test_a_plain_pod_update_is_judged_only_by_the_policies_that_declare_pod_updates(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    # A running pod that predates a policy (here GPU001's) keeps taking label edits: only GPU008,
    # GPU010 and GPU013, which judge the allocation and device annotations and the budget gate an
    # update can change, run; nothing is patched.
    old = pod(container(env=[ALL]))
    new = pod(container(env=[ALL]))
    new["metadata"]["labels"] = {"team": "b"}

    decision = evaluate(new, operation="UPDATE", old=old)

    assert decision.allowed and decision.patch == () and decision.warnings == ()
    assert [(r.policy, r.result) for r in decision.results] == [
        ("GPU008", model.Result.PASS),
        ("GPU010", model.Result.PASS),
        ("GPU013", model.Result.PASS),
    ]
    assert [p.id for p in engine.POLICIES if p.pod_updates] == ["GPU008", "GPU010", "GPU013"]


@pytest.mark.parametrize("subresource", ["status", "binding", "resize"])
def test_pod_updates_through_other_subresources_are_not_evaluated(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, subresource: str
) -> None:
    obj = pod(container(env=[ALL]))

    decision = evaluate(obj, operation="UPDATE", old=obj, subresource=subresource)

    assert decision.allowed
    assert decision.exempt_reason == f"subresource {subresource} is not evaluated"


def test_workload_update_with_an_unchanged_template_is_not_evaluated(
    pod: PodFactory, container: ContainerFactory, workload: WorkloadFactory, evaluate: Evaluate
) -> None:
    old = workload("Deployment", pod(container(env=[ALL])))
    new = workload("Deployment", pod(container(env=[ALL])))
    new["spec"]["replicas"] = 5

    decision = evaluate(new, operation="UPDATE", old=old)

    assert decision.allowed
    assert decision.exempt_reason == "the pod template is unchanged"


def test_workload_update_that_changes_the_template_is_evaluated(
    pod: PodFactory, container: ContainerFactory, workload: WorkloadFactory, evaluate: Evaluate
) -> None:
    old = workload("Deployment", pod(container()))
    new = workload("Deployment", pod(container(env=[ALL])))

    decision = evaluate(new, operation="UPDATE", old=old)

    assert not decision.allowed


@pytest.mark.parametrize(
    ("obj", "denied_by"),
    [
        ({"kind": "Pod", "spec": {"containers": "x"}}, None),
        ({"kind": "Pod", "spec": {"containers": [5, None, "x", {"resources": {"limits": 5}}]}}, None),
        ({"kind": "Pod", "spec": {"containers": [{"env": "x", "envFrom": [1, {"prefix": 3, "configMapRef": "x"}]}]}}, None),
        ({"kind": "Pod", "spec": {"containers": [{"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": 7}]}]}}, "GPU001"),
        (
            {"kind": "Pod", "spec": {"containers": [{"resources": {"limits": {"aliyun.com/gpu-mem": [1]}, "requests": "x"}}]}},
            None,
        ),
        ({"kind": "Pod", "spec": {"nodeSelector": "x", "affinity": "x", "volumes": "x", "containers": [{}]}}, None),
        (
            {
                "kind": "Pod",
                "spec": {
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [5, {"matchExpressions": "x"}]
                            }
                        }
                    },
                    "containers": [{"securityContext": {"privileged": True}}],
                },
            },
            "GPU002",
        ),
        ({"kind": "Pod", "spec": {"volumes": [{"hostPath": {"path": 5}}, {"hostPath": "x"}, 3], "containers": []}}, None),
        (
            {
                "kind": "Pod",
                "metadata": {"annotations": {"gpu-admission.io/gpu-model": 5, "gpu-admission.io/min-gpu-memory": ["1"]}},
                "spec": {"containers": [{}]},
            },
            None,
        ),
        ({"kind": "Deployment", "spec": {"template": "x"}}, None),
        ({"kind": "CronJob", "spec": {"jobTemplate": {"spec": {"template": {"spec": {"containers": [{"name": 5}]}}}}}}, None),
        ({"kind": 5, "spec": {}}, None),
    ],
)
def test_malformed_objects_never_make_the_engine_raise(
    evaluate: Evaluate, patched: Patched, obj: dict[str, Any], denied_by: str | None
) -> None:
    decision = evaluate(obj)

    assert isinstance(decision, model.Decision)
    patched(obj, decision.patch)
    if denied_by is not None:
        # Malformed elsewhere, the privileged container and the env var taken from valueFrom are still seen.
        assert not decision.allowed
        assert decision.denial_message is not None and f"{denied_by}:" in decision.denial_message


def test_engine_failure_outside_policies_denies_instead_of_raising(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine, "_short_circuit", boom)

    decision = evaluate(pod(container()))

    assert not decision.allowed
    assert decision.denial_message == "engine error: RuntimeError: boom"


def test_engine_failure_only_warns_when_validate_errors_warn(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine, "_short_circuit", boom)

    decision = evaluate(pod(container()), config={"errorActions": {"validate": "warn"}})

    assert decision.allowed
    assert decision.warnings == ("engine error: RuntimeError: boom",)


def _count_contexts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every evaluation context the engine builds (the pod kind it was built for)."""
    built: list[str] = []
    real = engine._context

    def counting(request: model.Request, **kwargs: Any) -> policy.Context:
        context = real(request, **kwargs)
        built.append(context.template.kind)
        return context

    monkeypatch.setattr(engine, "_context", counting)
    return built


def _every_policy(action: str, **except_for: str) -> dict[str, Any]:
    return {"policies": {p.id: {"action": except_for.get(p.id, action)} for p in engine.POLICIES}}


def test_policies_that_are_off_are_skipped_before_any_context_is_built(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = _count_contexts(monkeypatch)
    for item in engine.POLICIES:  # nothing of a policy that is off may run, not even `enabled`
        monkeypatch.setattr(type(item), "enabled", boom)

    decision = evaluate(pod(container(env=[ALL], privileged=True, gpu={"nvidia.com/gpu": 1})), config=_every_policy("off"))

    assert built == []
    assert decision.allowed and decision.patch == () and decision.violations == ()
    assert [(r.policy, r.result, r.message) for r in decision.results] == [
        (p.id, model.Result.SKIP, "off") for p in engine.POLICIES if policy.judges(p, "Pod")
    ]


def test_a_namespace_override_to_off_skips_before_the_context_and_elsewhere_the_policy_runs(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = _count_contexts(monkeypatch)
    config = {
        **_every_policy("off", GPU001="enforce"),
        "namespaceOverrides": [{"name": "lab", "namespaces": ["lab"], "policies": {"GPU001": {"action": "off"}}}],
    }
    obj = pod(container(env=[ALL]))

    in_lab = evaluate(obj, config=config, namespace="lab")
    assert built == []
    assert in_lab.allowed and result(in_lab, "GPU001") is model.Result.SKIP

    elsewhere = evaluate(obj, config=config, namespace="team-a")
    assert built == ["Pod"]  # once, for GPU001 alone
    assert not elsewhere.allowed and result(elsewhere, "GPU001") is model.Result.FAIL


def test_policies_under_an_exception_are_skipped_before_any_context_is_built(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = _count_contexts(monkeypatch)
    config = {
        **_every_policy("off", GPU001="enforce", GPU104="enforce"),
        "exceptions": [
            {"name": "legacy", "policies": ["GPU001", "GPU104"], "match": {"namespaces": ["team-a"], "names": ["app"]}}
        ],
    }

    decision = evaluate(pod(container(env=[ALL])), config=config)

    assert built == []
    assert decision.allowed and decision.patch == ()
    assert {r.policy: r.message for r in decision.results if r.message != "off"} == {
        "GPU001": "exception legacy",
        "GPU104": "exception legacy",
    }


def test_the_context_is_built_once_and_rebuilt_only_after_a_mutation_lands(
    pod: PodFactory, container: ContainerFactory, workload: WorkloadFactory, evaluate: Evaluate, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = _count_contexts(monkeypatch)
    # GPU104 (enforce) adds NVIDIA_VISIBLE_DEVICES=void; GPU101-103 and GPU105 are off in between.
    config = _every_policy("off", GPU001="enforce", GPU104="enforce")

    decision = evaluate(workload("Deployment", pod(container())), config=config)

    assert built == ["Deployment", "Deployment"]  # for GPU104, then for GPU001 on the mutated template
    assert decision.allowed
    assert [op["path"] for op in decision.patch] == ["/spec/template/spec/containers/0/env"]
