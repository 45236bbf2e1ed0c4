"""webhook/commands/mutating_policy.py: GPU104 as a MutatingAdmissionPolicy (`policies export-map`).

The exact objects under the default settings; the settings that shape them (action, overrides,
exceptions, neutral value, exempt namespaces); and the proof that the CEL says what GPU104 says:
generated pods go through the policy's match condition and variables (evaluated with the CEL runtime
the user policies use) and through the engine's /mutate, and every container gets the same env.
The apply configuration itself (``Object{...}``, which only kube-apiserver can evaluate) is run in
tests/e2e/test_mutating_policy.py against the webhook's result.
"""

from __future__ import annotations

import copy
import datetime
import json
from pathlib import Path
from typing import Any

import hypothesis
import jsonpatch
import pytest
import yaml
from hypothesis import strategies as st

from policies import cel, engine, model, ordinary, settings
from webhook import cli
from webhook.commands import mutating_policy

NOW = datetime.datetime(2026, 6, 1, tzinfo=datetime.UTC)
CREATE = {
    "operation": "CREATE",
    "resource": {"group": "", "version": "v1", "resource": "pods"},
    "userInfo": {"username": "alice"},
}

# The per-container test, written out once: no GPU resource named in limits or requests (the
# explicit list and MIG slices: a NIC under nvidia.com/ is no GPU), and the variable not named in env.
GPU_NAMES = (
    "['aliyun.com/gpu', 'aliyun.com/gpu-core.percentage', 'aliyun.com/gpu-count', 'aliyun.com/gpu-mem', "
    "'nvidia.com/gpu', 'nvidia.com/gpu.shared']"
)
IS_GPU = f"(r in {GPU_NAMES} || r.startsWith('nvidia.com/mig-'))"
NEEDS = (
    f"!(c.?resources.?limits.orValue({{}}).exists(r, {IS_GPU}) || "
    f"c.?resources.?requests.orValue({{}}).exists(r, {IS_GPU})) && "
    "!c.?env.orValue([]).exists(e, e.name == 'NVIDIA_VISIBLE_DEVICES')"
)
MIRROR = (
    "request.resource.resource != 'pods' || !has(object.metadata.annotations) || "
    "!('kubernetes.io/config.mirror' in object.metadata.annotations) || "
    "!request.userInfo.username.startsWith('system:node:')"
)
LABELS = {"app.kubernetes.io/name": "gpu-admission", "app.kubernetes.io/component": "mutating-admission-policy"}


def expected_policy(neutral: str = "void", extra_conditions: tuple[dict[str, str], ...] = ()) -> dict[str, Any]:
    mutation = (
        "Object{spec: Object.spec{"
        "?containers: size(variables.containersNeedingVoid) > 0 ? optional.of(variables.containersNeedingVoid.map(c, "
        f"Object.spec.containers{{name: c.name, env: [Object.spec.containers.env{{name: 'NVIDIA_VISIBLE_DEVICES', value: '{neutral}'}}]}})) "
        ": optional.none(), "
        "?initContainers: size(variables.initContainersNeedingVoid) > 0 ? optional.of(variables.initContainersNeedingVoid.map(c, "
        f"Object.spec.initContainers{{name: c.name, env: [Object.spec.initContainers.env{{name: 'NVIDIA_VISIBLE_DEVICES', value: '{neutral}'}}]}})) "
        ": optional.none()}}"
    )
    return {
        "apiVersion": "admissionregistration.k8s.io/v1beta1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {
            "name": "gpu-admission-gpu104",
            "labels": LABELS,
            "annotations": {
                "gpu-admission.io/policy-id": "GPU104",
                "gpu-admission.io/source": "built-in",
                "gpu-admission.io/summary": "containers that request no GPU get NVIDIA_VISIBLE_DEVICES=void",
            },
        },
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ]
            },
            "matchConditions": [
                {"name": "not-a-mirror-pod", "expression": MIRROR},
                {
                    "name": "a-container-needs-the-neutral-value",
                    "expression": f"object.spec.?containers.orValue([]).exists(c, {NEEDS}) || object.spec.?initContainers.orValue([]).exists(c, {NEEDS})",
                },
                *extra_conditions,
            ],
            "reinvocationPolicy": "IfNeeded",
            "variables": [
                {"name": "containersNeedingVoid", "expression": f"object.spec.?containers.orValue([]).filter(c, {NEEDS})"},
                {
                    "name": "initContainersNeedingVoid",
                    "expression": f"object.spec.?initContainers.orValue([]).filter(c, {NEEDS})",
                },
            ],
            "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": mutation}}],
        },
    }


EXPECTED_BINDING = {
    "apiVersion": "admissionregistration.k8s.io/v1beta1",
    "kind": "MutatingAdmissionPolicyBinding",
    "metadata": {"name": "gpu-admission-gpu104", "labels": LABELS},
    "spec": {
        "policyName": "gpu-admission-gpu104",
        "matchResources": {
            "namespaceSelector": {
                "matchExpressions": [
                    {
                        "key": "kubernetes.io/metadata.name",
                        "operator": "NotIn",
                        "values": ["gpu-admission", "kube-node-lease", "kube-system"],
                    }
                ]
            }
        },
    },
}


def exported(document: dict[str, Any] | None = None) -> Any:
    return mutating_policy.export(settings.from_mapping(document or {}), now=NOW)


def test_the_default_export_is_exactly_the_policy_and_its_binding() -> None:
    export = exported()
    assert list(export.manifests) == [expected_policy(), EXPECTED_BINDING]
    assert export.notes == (
        "the mutating webhook may now skip ordinary pod CREATEs: give it the validating webhook's match condition pod-create-not-ordinary",
    )


def test_the_neutral_value_setting_is_the_value_written() -> None:
    [policy, _] = exported({"visibleDevicesNeutralValue": "none"}).manifests
    assert policy == expected_policy(neutral="none")


def test_gpu104_off_everywhere_exports_nothing() -> None:
    export = exported({"policies": {"GPU104": {"action": "off"}}})
    assert export.manifests == ()
    assert export.notes == ("GPU104: left out: its action is not enforce in any namespace",)


def test_a_namespace_override_and_an_exception_become_match_conditions() -> None:
    document = {
        "namespaceOverrides": [{"namespaces": ["lab"], "policies": {"GPU104": {"action": "off"}}}],
        "exceptions": [
            {
                "name": "Debug shells",
                "policies": ["GPU104"],
                "match": {"namespaces": ["ops"], "names": ["debug-*"]},
                "expires": "2026-12-31T00:00:00Z",
            },
            {"name": "gone", "policies": ["GPU104"], "match": {"namespaces": ["old"]}, "expires": "2026-01-01T00:00:00Z"},
            {"name": "other policy", "policies": ["GPU003"], "match": {"namespaces": ["x"]}},
        ],
        "exemptNamespaces": ["kube-system"],
    }
    export = exported(document)
    [policy, binding] = export.manifests
    name = "(object.metadata.?name.orValue('') != '' ? object.metadata.name : object.metadata.?generateName.orValue('') + '*')"
    assert policy == expected_policy(
        extra_conditions=(
            {"name": "enforced-in-this-namespace", "expression": "((request.namespace in ['lab']) ? false : true)"},
            {
                "name": "exception-0-debug-shells",
                "expression": f"!((request.namespace in ['ops']) && {name}.matches('^(debug\\\\-.*)$'))",
            },
        )
    )
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system"]
    assert (
        export.notes[0]
        == "GPU104: exception Debug shells expires 2026-12-31T00:00:00+00:00; export again after that, the apiserver cannot tell"
    )


def test_no_exempt_namespaces_means_a_binding_without_match_resources() -> None:
    [_, binding] = exported({"exemptNamespaces": []}).manifests
    assert binding["spec"] == {"policyName": "gpu-admission-gpu104"}


# --- when the mutating webhook may skip ordinary pods --------------------------------------------


def test_skip_reasons() -> None:
    assert mutating_policy.skip_reasons(settings.from_mapping({})) == ()
    assert mutating_policy.skip_reasons(settings.from_mapping({"keepNonGpuPodsOffGpuNodes": True})) == (
        "keepNonGpuPodsOffGpuNodes: GPU103 changes every pod that asks for no GPU",
    )
    assert (
        mutating_policy.skip_reasons(
            settings.from_mapping({"keepNonGpuPodsOffGpuNodes": True, "policies": {"GPU103": {"action": "off"}}})
        )
        == ()
    )
    quiet = settings.from_mapping({"policies": {"GPU104": {"action": "warn"}}})
    assert mutating_policy.skip_reasons(quiet) == ("mutator GPU104 acts warn: it reports at validation only",)
    export = mutating_policy.export(settings.from_mapping({"keepNonGpuPodsOffGpuNodes": True}), now=NOW)
    assert export.notes == (
        "the mutating webhook must keep receiving ordinary pods: keepNonGpuPodsOffGpuNodes: GPU103 changes every pod that asks for no GPU",
    )


def test_with_webhook_condition_adds_the_ordinary_condition_to_mutating_webhooks_only_once() -> None:
    documents = [
        d
        for d in yaml.safe_load_all((Path(__file__).resolve().parents[3] / "deploy" / "webhook-configurations.yaml").read_text())
        if d
    ]
    mutating = next(d for d in documents if d["kind"] == "MutatingWebhookConfiguration")
    validating = next(d for d in documents if d["kind"] == "ValidatingWebhookConfiguration")
    changed = mutating_policy.with_webhook_condition(mutating)
    [hook] = changed["webhooks"]
    # deploy/'s mutating webhook has no conditions (it answers a kubelet's mirror pods itself).
    assert [c["name"] for c in hook["matchConditions"]] == ["pod-create-not-ordinary"]
    assert hook["matchConditions"][0]["expression"] == ordinary.condition_expression()
    assert mutating_policy.with_webhook_condition(changed) == changed
    assert "matchConditions" not in mutating["webhooks"][0], "the input is not changed"
    assert mutating_policy.with_webhook_condition(validating) == validating


# --- the CEL agrees with GPU104 ------------------------------------------------------------------


@pytest.fixture(scope="module")
def compiled() -> dict[str, cel.Expression]:
    env = cel.environment()
    [policy, _] = exported().manifests
    found = {c["name"]: cel.compile_expression(env, c["expression"], field=c["name"]) for c in policy["spec"]["matchConditions"]}
    # a variable is a list; dyn() lets the checker (which wants a bool or dyn) take it as written
    found.update(
        {v["name"]: cel.compile_expression(env, f"dyn({v['expression']})", field=v["name"]) for v in policy["spec"]["variables"]}
    )
    return found


def run(compiled: dict[str, cel.Expression], name: str, obj: dict[str, Any]) -> Any:
    return cel.evaluate(compiled[name], {"request": CREATE, "object": obj, "oldObject": None})


def by_policy(compiled: dict[str, cel.Expression], obj: dict[str, Any]) -> dict[str, Any]:
    """The pod after the policy, the apply configuration's merge done by hand: the entry appended
    to each listed container's env (env created where absent)."""
    result = copy.deepcopy(obj)
    if not run(compiled, "a-container-needs-the-neutral-value", obj):
        return result
    for kind in ("containers", "initContainers"):
        names = {c["name"] for c in run(compiled, f"{kind}NeedingVoid", obj)}
        for container in result["spec"].get(kind, []):
            if container["name"] in names:
                container.setdefault("env", []).append({"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"})
    return result


def by_webhook(obj: dict[str, Any]) -> dict[str, Any]:
    decision = engine.evaluate(
        model.Request(operation="CREATE", object=obj, namespace="team-a"), settings=settings.from_mapping({})
    )
    assert decision.allowed, decision.violations
    patched: dict[str, Any] = jsonpatch.apply_patch(obj, list(decision.patch)) if decision.patch else copy.deepcopy(obj)
    return patched


def envs(obj: dict[str, Any]) -> dict[str, Any]:
    return {f"{kind}/{c['name']}": c.get("env") for kind in ("initContainers", "containers") for c in obj["spec"].get(kind, [])}


# Pods as kube-apiserver admits them and the webhook allows them (a refused pod is never
# mutated): a GPU resource only in limits (extended resources need a limit), one family per pod.
FAMILIES = (("nvidia.com/gpu", "nvidia.com/mig-1g.5gb"), ("aliyun.com/gpu-mem",), ("aliyun.com/gpu",))
PLAIN = ("cpu", "memory", "example.com/fpga")


ENV_ENTRY = st.one_of(
    st.builds(lambda n, v: {"name": n, "value": v}, st.sampled_from(["A", "B"]), st.sampled_from(["void", "x"])),
    # a user's own value: only the ones GPU001 allows (any other is refused, so never mutated)
    st.builds(lambda v: {"name": "NVIDIA_VISIBLE_DEVICES", "value": v}, st.sampled_from(["void", "none"])),
    st.just({"name": "C", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}),
)


@st.composite
def containers(draw: st.DrawFn, prefix: str, *, min_size: int, family: tuple[str, ...]) -> list[dict[str, Any]]:
    found = []
    for index in range(draw(st.integers(min_size, 3))):
        container: dict[str, Any] = {"name": f"{prefix}{index}", "image": "registry.example/app:1"}
        limits = {name: "1" for name in draw(st.sets(st.sampled_from([*PLAIN, *family]), max_size=2))}
        requests = {name: "1" for name in draw(st.sets(st.sampled_from(PLAIN), max_size=2))}
        resources: dict[str, dict[str, str]] = {}
        for part, values in (("limits", limits), ("requests", requests)):
            if bool(values) or draw(st.booleans()):  # an empty map now and then
                resources[part] = values
        if resources:
            container["resources"] = resources
        env = draw(st.one_of(st.none(), st.lists(ENV_ENTRY, max_size=3, unique_by=lambda e: e["name"])))
        if env is not None:
            container["env"] = env
        found.append(container)
    return found


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    family = draw(st.sampled_from(FAMILIES))
    spec: dict[str, Any] = {"containers": draw(containers("c", min_size=1, family=family))}
    init = draw(containers("i", min_size=0, family=family))
    if init:
        spec["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"}, "spec": spec}


@hypothesis.settings(max_examples=300, deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow])
@hypothesis.given(obj=pods())
def test_the_policy_adds_exactly_what_the_webhook_adds_and_a_second_pass_nothing(
    compiled: dict[str, cel.Expression], obj: dict[str, Any]
) -> None:
    once = by_policy(compiled, obj)
    assert envs(once) == envs(by_webhook(obj))
    assert not run(compiled, "a-container-needs-the-neutral-value", once), "a mutated pod is not sent again"
    assert by_policy(compiled, once) == once


def test_examples(compiled: dict[str, cel.Expression]) -> None:
    cpu = {"spec": {"containers": [{"name": "a", "resources": {"limits": {"cpu": "1"}}}]}}
    gpu = {"spec": {"containers": [{"name": "a", "resources": {"requests": {"nvidia.com/mig-1g.5gb": 1}}}]}}
    named = {"spec": {"containers": [{"name": "a", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}}
    sidecar = {
        "spec": {
            "containers": [{"name": "a", "resources": {"limits": {"aliyun.com/gpu-mem": 2}}}, {"name": "s"}],
            "initContainers": [{"name": "i"}],
        }
    }
    assert run(compiled, "a-container-needs-the-neutral-value", cpu)
    assert not run(compiled, "a-container-needs-the-neutral-value", gpu)
    assert not run(compiled, "a-container-needs-the-neutral-value", named), "a user's own value is GPU001's to judge"
    assert [c["name"] for c in run(compiled, "containersNeedingVoid", sidecar)] == ["s"]
    assert [c["name"] for c in run(compiled, "initContainersNeedingVoid", sidecar)] == ["i"]
    mirror = {"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}}, "spec": cpu["spec"]}
    kubelet = {**CREATE, "userInfo": {"username": "system:node:n1"}}
    assert not cel.evaluate(compiled["not-a-mirror-pod"], {"request": kubelet, "object": mirror, "oldObject": None})
    assert cel.evaluate(compiled["not-a-mirror-pod"], {"request": CREATE, "object": mirror, "oldObject": None})


# --- the command ---------------------------------------------------------------------------------


def test_export_map_writes_yaml_or_a_json_list_to_the_output_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["policies", "export-map"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("# Generated by `gpu-admission policies export-map`")
    assert [d for d in yaml.safe_load_all(out) if d] == [expected_policy(), EXPECTED_BINDING]
    assert "note: the mutating webhook may now skip ordinary pod CREATEs" in err
    target = tmp_path / "map.json"
    assert cli.main(["policies", "export-map", "-o", "json", "--output-file", str(target)]) == 0
    out, err = capsys.readouterr()
    assert out == "" and f"wrote 2 manifests to {target}" in err
    assert json.loads(target.read_text()) == {"apiVersion": "v1", "kind": "List", "items": [expected_policy(), EXPECTED_BINDING]}


def test_export_map_with_gpu104_off_writes_an_empty_stream(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "settings.yaml"
    config.write_text("policies:\n  GPU104:\n    action: off\n")
    assert cli.main(["policies", "export-map", "--config", str(config), "-o", "json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["items"] == [] and "GPU104: left out" in err


# --- with the policy, skipping the mutating webhook for ordinary pods changes nothing ------------


def test_an_ordinary_pod_the_mutating_webhook_would_skip_gets_from_the_policy_exactly_its_patch() -> None:
    """Generated pods (the ordinary-pod proof's generator), before any mutation, as the mutating
    webhook's match condition sees them: for every pod the condition skips, the webhook's whole
    patch applied gives the very pod the policy gives, under the default settings and every other
    setting skip_reasons() allows."""
    from tests.unit.policies.test_ordinary import SOUND_SETTINGS, mixed_pods  # the same generator as the proof

    env = cel.environment()
    condition = cel.compile_expression(env, ordinary.condition_expression(), field=ordinary.CONDITION_NAME)
    variants = []
    for document in SOUND_SETTINGS:
        parsed = settings.from_mapping(document)
        if mutating_policy.skip_reasons(parsed) != ():
            continue
        [policy, _] = mutating_policy.export(parsed, now=NOW).manifests
        needs = cel.compile_expression(env, policy["spec"]["matchConditions"][1]["expression"], field="needs")
        lists = {
            v["name"].removesuffix("NeedingVoid"): cel.compile_expression(env, f"dyn({v['expression']})", field=v["name"])
            for v in policy["spec"]["variables"]
        }
        variants.append((parsed, needs, lists))
    assert variants, "at least the defaults allow the skip"
    counts = {"skipped": 0, "sent": 0}

    @hypothesis.settings(max_examples=400, deadline=None, suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(obj=mixed_pods(), index=st.integers(0, len(variants) - 1))
    def check(obj: dict[str, Any], index: int) -> None:
        activation = {"request": CREATE, "object": obj, "oldObject": None}
        if cel.evaluate(condition, activation):
            counts["sent"] += 1
            return
        counts["skipped"] += 1
        parsed, needs, lists = variants[index]
        decision = engine.evaluate(model.Request(operation="CREATE", object=obj, namespace="team-a"), settings=parsed)
        assert decision.allowed, decision.violations
        by_hook: dict[str, Any] = jsonpatch.apply_patch(copy.deepcopy(obj), list(decision.patch)) if decision.patch else obj
        after = copy.deepcopy(obj)
        if cel.evaluate(needs, activation):
            for kind, expression in lists.items():
                names = {c["name"] for c in cel.evaluate(expression, activation)}
                for container in after["spec"].get(kind, []):
                    if container.get("name") in names:
                        container.setdefault("env", []).append(
                            {"name": "NVIDIA_VISIBLE_DEVICES", "value": parsed.visible_devices_neutral_value}
                        )
        assert after == by_hook

    check()
    assert counts["skipped"] >= 40 and counts["sent"] >= 40, counts
