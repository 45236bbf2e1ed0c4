"""User policies in CEL: loading, refusal at load with positions, evaluation through the one engine, bounds."""

from __future__ import annotations

import pathlib
import sys
import textwrap
from typing import Any

import pytest
import yaml

from policies import cel, engine, model, policy, settings
from tests.conftest import PodFactory
from webhook import config
from webhook.cmdline import errors, manifests
from webhook.commands import dryrun
from webhook.config import userpolicies

REPO = pathlib.Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples" / "policies"


def policy_document(
    *,
    policy_id: str = "TST001",
    validations: list[dict[str, Any]] | None = None,
    conditions: list[dict[str, Any]] | None = None,
    resources: list[str] | None = None,
    operations: list[str] | None = None,
    params: Any = None,
    action: str = "enforce",
    **constraints: Any,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "id": policy_id,
        "action": action,
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": ["", "apps"],
                    "apiVersions": ["v1"],
                    "operations": operations or ["CREATE"],
                    "resources": resources or ["pods"],
                }
            ],
            **constraints,
        },
        "validations": validations or [{"expression": "true"}],
    }
    if conditions is not None:
        spec["matchConditions"] = conditions
    if params is not None:
        spec["params"] = params
    return {
        "apiVersion": "gpu-admission.io/v1alpha1",
        "kind": "GpuAdmissionPolicy",
        "metadata": {"name": policy_id.lower()},
        "spec": spec,
    }


def with_policies(*documents: dict[str, Any], document: dict[str, Any] | None = None) -> settings.Settings:
    compiled = [cel.compile_policy(d, source=f"test#{i}") for i, d in enumerate(documents)]
    return settings.from_mapping(document or {}, user_policies=compiled)


def decide(obj: dict[str, Any], config_: settings.Settings, *, namespace: str = "team-a", **request: Any) -> model.Decision:
    return engine.evaluate(
        model.Request(operation=request.pop("operation", "CREATE"), object=obj, namespace=namespace, **request),
        settings=config_,
    )


def result(decision: model.Decision, policy_id: str = "TST001") -> model.PolicyResult:
    return next(r for r in decision.results if r.policy == policy_id)


# --- the shipped examples ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("manifest", "policy_id", "allowed"),
    [
        ("max-gpus-per-pod-allowed.yaml", "USR001", True),
        ("max-gpus-per-pod-denied.yaml", "USR001", False),
        ("card-model-required-allowed.yaml", "USR002", True),
        ("card-model-required-denied.yaml", "USR002", False),
        ("gpu-mem-limit-allowed.yaml", "USR003", True),
        ("gpu-mem-limit-denied.yaml", "USR003", False),
    ],
)
def test_each_example_policy_allows_one_manifest_and_denies_another(manifest: str, policy_id: str, allowed: bool) -> None:
    loaded = config.load(None, policies_dir=str(EXAMPLES))
    documents = manifests.read([str(EXAMPLES / "manifests" / manifest)], stdin=sys.stdin)

    (outcome,) = dryrun.evaluate(documents, settings=loaded)

    assert outcome.decision.allowed is allowed
    assert result(outcome.decision, policy_id).result is (model.Result.PASS if allowed else model.Result.FAIL)


def test_the_example_messages_say_what_is_wrong() -> None:
    loaded = config.load(None, policies_dir=str(EXAMPLES))
    documents = manifests.read([str(EXAMPLES / "manifests")], stdin=sys.stdin)

    denials = {
        o.document.object["metadata"]["name"]: o.decision.denial_message for o in dryrun.evaluate(documents, settings=loaded)
    }

    assert denials["three-cards"] == (
        "USR001: pods in a GPU-limited namespace ask for at most a few whole GPUs: "
        "the pod asks for 3 GPUs; at most 2 are allowed in team-small"
    )
    assert denials["serve-any-card"].endswith("add the annotation gpu-admission.io/gpu-model (e.g. Tesla-V100-SXM2-32GB)")
    assert denials["big-share"].endswith("containers notebook ask for more than 16 GiB of aliyun.com/gpu-mem")


def test_a_policy_in_a_namespace_outside_its_match_is_not_judged(make_pod: PodFactory) -> None:
    loaded = config.load(None, policies_dir=str(EXAMPLES))
    greedy = make_pod(limits={"nvidia.com/gpu": 4}, namespace="team-big")

    assert result(decide(greedy, loaded, namespace="team-big"), "USR001").result is model.Result.PASS
    assert not decide(greedy, loaded, namespace="team-small").allowed


# --- loading and refusal at load ---------------------------------------------------------------------


def write(directory: pathlib.Path, name: str, *documents: dict[str, Any]) -> pathlib.Path:
    path = directory / name
    path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    return path


def test_a_syntax_error_is_refused_with_file_policy_field_and_position(tmp_path: pathlib.Path) -> None:
    bad = policy_document(validations=[{"expression": "true"}, {"expression": "object.spec.containers.all(c,\n  c.name ==)"}])
    path = write(tmp_path, "bad.yaml", bad)

    with pytest.raises(errors.InputError) as raised:
        userpolicies.load(str(tmp_path))

    assert str(raised.value).startswith(
        f"{path}#0: policy TST001: spec.validations[1].expression: line 2, column 12: Syntax error:"
    )
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        (
            "objekt.metadata.name == 'x'",
            "spec.validations[0].expression: line 1, column 16: undeclared reference to 'objekt.metadata.name'",
        ),
        (
            "object.metadata.name.quantity() > 1",
            "spec.validations[0].expression: line 1, column 30: undeclared reference to 'quantity'",
        ),
        (
            "1 == 1.0",
            "spec.validations[0].expression: line 1, column 3: found no matching overload for '_==_' applied to '(int, double)'",
        ),
        ("'not a bool'", "spec.validations[0].expression: must evaluate to a bool, but its type is string"),
        ("x" * 5001, "spec.validations[0].expression: 5001 characters, more than the limit of 5000"),
    ],
)
def test_expressions_that_cannot_work_are_refused_at_load(expression: str, message: str) -> None:
    with pytest.raises(cel.InvalidPolicy) as raised:
        cel.compile_policy(policy_document(validations=[{"expression": expression}]), source="p.yaml#0")

    assert str(raised.value).startswith(f"p.yaml#0: policy TST001: {message}")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"id": "lower"}, "p#0: spec.id: must be 2-32 upper-case letters"),
        ({"action": "deny"}, "p#0: policy TST001: spec.action: must be one of enforce, warn, audit, off, got 'deny'"),
        ({"mutations": []}, "p#0: policy TST001: spec.mutations: unknown key"),
        ({"validations": []}, "p#0: policy TST001: spec.validations: must be a non-empty list, got []"),
        ({"matchConstraints": {}}, "p#0: policy TST001: spec.matchConstraints.resourceRules: must be a non-empty list"),
        (
            {
                "matchConstraints": {
                    "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["DELETE"], "resources": ["pods"]}]
                }
            },
            "p#0: policy TST001: spec.matchConstraints.resourceRules[0].operations[0]: must be CREATE, UPDATE or *",
        ),
        (
            {
                "matchConstraints": {
                    "resourceRules": [
                        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["services"]}
                    ]
                }
            },
            "p#0: policy TST001: spec.matchConstraints.resourceRules[0].resources[0]: 'services' is not evaluated here",
        ),
        (
            {"matchConditions": [{"name": "a"}]},
            "p#0: policy TST001: spec.matchConditions[0].expression: must be a non-empty CEL expression",
        ),
        (
            {"validations": [{"expression": "true", "messageExpression": "1 + 1"}]},
            "p#0: policy TST001: spec.validations[0].messageExpression: must evaluate to a string, but its type is int",
        ),
    ],
)
def test_malformed_policy_documents_are_refused_naming_the_field(change: dict[str, Any], message: str) -> None:
    document = policy_document()
    document["spec"].update(change)

    with pytest.raises(cel.InvalidPolicy) as raised:
        cel.compile_policy(document, source="p#0")

    assert str(raised.value).startswith(message)


def test_ids_are_unique_across_files_and_built_ins(tmp_path: pathlib.Path) -> None:
    write(tmp_path, "a.yaml", policy_document())
    second = write(tmp_path, "b.yaml", policy_document())

    with pytest.raises(errors.InputError) as raised:
        userpolicies.load(str(tmp_path))
    assert str(raised.value) == f"{second}#0: policy TST001: spec.id: already used by {tmp_path / 'a.yaml'}#0"

    second.write_text(yaml.safe_dump(policy_document(policy_id="GPU001")))
    with pytest.raises(errors.InputError, match="spec.id: already used by a built-in policy"):
        userpolicies.load(str(tmp_path))


def test_hidden_entries_and_subdirectories_are_not_loaded(tmp_path: pathlib.Path) -> None:
    write(tmp_path, "one.yaml", policy_document(), policy_document(policy_id="TST002"))
    (tmp_path / "..data").mkdir()
    write(tmp_path / "..data", "one.yaml", policy_document(policy_id="TST003"))
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests" / "pod.yaml").write_text("apiVersion: v1\nkind: Pod\n")
    (tmp_path / "notes.txt").write_text("not a policy")

    assert [p.id for p in userpolicies.load(str(tmp_path))] == ["TST001", "TST002"]


def test_a_missing_directory_and_broken_yaml_are_one_line_errors(tmp_path: pathlib.Path) -> None:
    with pytest.raises(errors.InputError, match="--policies-dir is not a directory"):
        userpolicies.load(str(tmp_path / "absent"))
    (tmp_path / "broken.yaml").write_text("spec: [unclosed\n")
    with pytest.raises(errors.InputError, match=r"broken.yaml#0: invalid YAML: .*\(line 2, column 1\)"):
        userpolicies.load(str(tmp_path))


def test_the_settings_document_may_name_user_policies(tmp_path: pathlib.Path) -> None:
    (tmp_path / "policies").mkdir()
    write(tmp_path / "policies", "p.yaml", policy_document())
    document = tmp_path / "config.yaml"
    document.write_text(
        "policies: {TST001: {action: warn}}\nexceptions: [{name: e, policies: [TST001], match: {namespaces: [x]}}]\n"
    )

    loaded = config.load(str(document), policies_dir=str(tmp_path / "policies"))

    assert loaded.action("TST001") is model.Action.WARN
    with pytest.raises(errors.InputError, match="policies.TST001: unknown policy"):
        config.load(str(document))


# --- evaluation --------------------------------------------------------------------------------------


def test_a_false_validation_is_a_finding_with_its_message(make_pod: PodFactory) -> None:
    config_ = with_policies(
        policy_document(validations=[{"expression": "object.metadata.name.startsWith('team-')", "message": "name pods team-*"}])
    )

    decision = decide(make_pod(name="trainer"), config_)

    assert not decision.allowed
    assert decision.denial_message == "TST001: tst001: name pods team-*"
    assert decide(make_pod(name="team-trainer"), config_).allowed


def test_message_expression_falls_back_to_message_then_to_the_expression(make_pod: PodFactory) -> None:
    config_ = with_policies(
        policy_document(
            validations=[
                {"expression": "false", "messageExpression": "'pod ' + object.metadata.name"},
                {"expression": "false", "messageExpression": "object.metadata.absent", "message": "plain"},
                {"expression": "1 > 2"},
            ]
        )
    )

    assert result(decide(make_pod(), config_)).message == "pod trainer; plain; failed expression: 1 > 2"


def test_a_missing_field_is_an_error_result_that_fails_closed(make_pod: PodFactory) -> None:
    config_ = with_policies(policy_document(validations=[{"expression": "object.spec.nodeSelector.size() == 0"}]))

    decision = decide(make_pod(), config_)

    assert result(decision).result is model.Result.ERROR
    assert "Key not found in map" in result(decision).message
    assert not decision.allowed


def test_an_audited_policy_that_errors_does_not_deny(make_pod: PodFactory) -> None:
    config_ = with_policies(policy_document(action="audit", validations=[{"expression": "object.spec.absent"}]))

    decision = decide(make_pod(), config_)

    assert decision.allowed
    assert result(decision).result is model.Result.ERROR


def test_a_runaway_expression_is_stopped_by_the_iteration_budget(make_pod: PodFactory) -> None:
    pod = make_pod(env=[{"name": f"V{i}", "value": "x"} for i in range(200)])
    runaway = "object.spec.containers[0].env.all(a, object.spec.containers[0].env.all(b, a.name != b.name || a == b))"
    config_ = with_policies(policy_document(validations=[{"expression": runaway}]))

    decision = decide(pod, config_)

    assert result(decision).result is model.Result.ERROR
    assert "Iteration budget exceeded" in result(decision).message
    assert not decision.allowed


def test_an_object_past_the_input_limit_is_an_error_not_an_evaluation(make_pod: PodFactory) -> None:
    pod = make_pod(annotations={"big": "x" * (cel.MAX_INPUT_CHARS + 1)})
    config_ = with_policies(policy_document())

    decision = decide(pod, config_)

    assert result(decision).result is model.Result.ERROR
    assert "past the CEL input limit" in result(decision).message


def test_match_conditions_decide_whether_the_validations_run(make_pod: PodFactory) -> None:
    config_ = with_policies(
        policy_document(
            conditions=[{"name": "gpu", "expression": "object.spec.containers.exists(c, has(c.resources))"}],
            validations=[{"expression": "false", "message": "no"}],
        )
    )

    assert decide(make_pod(), config_).allowed
    assert not decide(make_pod(limits={"nvidia.com/gpu": 1}), config_).allowed


def test_resource_rules_choose_kinds_and_operations(make_pod: PodFactory) -> None:
    deny = [{"expression": "false", "message": "no"}]
    pods_only = with_policies(policy_document(validations=deny))
    deployments = with_policies(policy_document(validations=deny, resources=["deployments"], operations=["CREATE", "UPDATE"]))
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "team-a"},
        "spec": {"template": {"metadata": {}, "spec": make_pod()["spec"]}},
    }

    assert decide(deployment, pods_only).allowed
    assert not decide(deployment, deployments).allowed
    assert decide(make_pod(), deployments).allowed


def test_selectors_use_namespace_and_object_labels(make_pod: PodFactory) -> None:
    deny = [{"expression": "false"}]
    by_namespace = with_policies(policy_document(validations=deny, namespaceSelector={"matchLabels": {"gpu": "limited"}}))
    by_object = with_policies(policy_document(validations=deny, objectSelector={"matchLabels": {"team": "a"}}))
    labelled = make_pod()
    labelled["metadata"]["labels"] = {"team": "a"}

    assert decide(make_pod(), by_namespace).allowed
    assert not decide(make_pod(), by_namespace, namespace_labels={"gpu": "limited"}).allowed
    assert decide(make_pod(), by_object).allowed
    assert not decide(labelled, by_object).allowed


def test_expressions_see_request_old_object_params_and_namespace(make_pod: PodFactory) -> None:
    expression = textwrap.dedent(
        """\
        request.operation == 'CREATE' && request.userInfo.username == 'alice' &&
        request.kind.kind == 'Pod' && request.namespace == 'team-a' && oldObject == null &&
        params.allowed == ['trainer'] && namespaceObject.metadata.labels['tier'] == 'gold' &&
        object.metadata.name in params.allowed"""
    )
    config_ = with_policies(policy_document(params={"allowed": ["trainer"]}, validations=[{"expression": expression}]))

    decision = decide(make_pod(), config_, user="alice", namespace_labels={"tier": "gold"})

    assert result(decision).result is model.Result.PASS


def test_user_policies_see_the_object_after_the_built_in_mutators(make_pod: PodFactory) -> None:
    selected = "object.spec.nodeSelector['ack.node.gpu.schedule'] == 'cgpu'"
    config_ = with_policies(policy_document(validations=[{"expression": selected}]))

    assert decide(make_pod(limits={"aliyun.com/gpu-mem": 4}), config_).allowed


def test_settings_overrides_and_exceptions_apply_to_user_policies(make_pod: PodFactory) -> None:
    document = {
        "namespaceOverrides": [{"namespaces": ["lab"], "policies": {"TST001": {"action": "warn"}}}],
        "exceptions": [{"name": "legacy", "policies": ["TST001"], "match": {"namespaces": ["team-a"], "names": ["legacy-*"]}}],
    }
    config_ = with_policies(policy_document(validations=[{"expression": "false", "message": "no"}]), document=document)

    assert not decide(make_pod(), config_).allowed
    assert decide(make_pod(), config_, namespace="lab").warnings == ("TST001: tst001: no",)
    skipped = decide(make_pod(name="legacy-1"), config_)
    assert skipped.allowed
    assert result(skipped) == model.PolicyResult(policy="TST001", result=model.Result.SKIP, message="exception legacy")


def test_sum_adds_a_list_of_numbers_as_kubernetes_does() -> None:
    env = cel.environment()

    assert cel.evaluate(cel.compile_expression(env, "[1, 2, 3].sum() == 6", field="f"), {}) is True
    with pytest.raises(cel.EvaluationError, match="sum\\(\\) needs a list of numbers"):
        cel.evaluate(cel.compile_expression(env, "['a'].sum() == 1", field="f"), {})


def test_user_policy_results_follow_the_built_ins(make_pod: PodFactory) -> None:
    config_ = with_policies(policy_document(policy_id="ZZZ001"), policy_document(policy_id="AAA001"))

    ids = [r.policy for r in decide(make_pod(), config_).results]

    assert ids[-2:] == ["ZZZ001", "AAA001"]
    assert ids[:-2] == [p.id for p in engine.POLICIES if policy.judges(p, "Pod")]


def test_user_policies_past_the_time_budget_are_errors_not_evaluations(make_pod: PodFactory) -> None:
    ticks = iter([0.0, 0.6, 1.2])  # each user policy starts 0.6 s after the previous one
    config_ = with_policies(
        policy_document(policy_id="TST001"),
        policy_document(policy_id="TST002"),
        policy_document(policy_id="TST003", action="audit"),
        document={"userPolicyBudgetSeconds": 1},
    )

    decision = decide(make_pod(), config_, clock=lambda: next(ticks))

    assert [result(decision, f"TST00{n}").result for n in (1, 2, 3)] == [
        model.Result.PASS,
        model.Result.PASS,
        model.Result.ERROR,
    ]
    assert result(decision, "TST003").message == (
        "TST003: policy error: TimeoutError: the 1 s budget for user policies was spent before it ran"
    )
    assert decision.allowed  # the late policy is audited: its error acts no more than audit


def test_without_a_clock_there_is_no_time_budget(make_pod: PodFactory) -> None:
    config_ = with_policies(policy_document(), document={"userPolicyBudgetSeconds": 0.001})

    assert result(decide(make_pod(), config_)).result is model.Result.PASS


@pytest.mark.parametrize("value", [0, -1, 31, "1s", True])
def test_the_time_budget_is_a_positive_number_of_seconds(value: Any) -> None:
    with pytest.raises(settings.InvalidSettings, match="userPolicyBudgetSeconds: must be a number of seconds"):
        settings.from_mapping({"userPolicyBudgetSeconds": value})
