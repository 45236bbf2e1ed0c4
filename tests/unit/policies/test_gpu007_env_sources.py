"""GPU007: no ConfigMap or Secret carries a key named like a guarded GPU environment variable."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from policies import envsources, gpu, model
from tests.unit.policies.conftest import ContainerFactory, Evaluate, PodFactory, ResultOf

PREFIX = "GPU007: ConfigMaps and Secrets must not carry a key named like a GPU environment variable: "


def config_map(data: dict[str, str] | None = None, *, name: str = "app", **fields: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "team-a"}}
    if data is not None:
        obj["data"] = data
    obj.update(fields)
    return obj


def secret(data: dict[str, str] | None = None, *, name: str = "creds", **fields: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": name, "namespace": "team-a"},
    }
    if data is not None:
        obj["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    obj.update(fields)
    return obj


def test_a_config_map_with_the_visible_devices_key_is_denied(evaluate: Evaluate) -> None:
    decision = evaluate(config_map({"NVIDIA_VISIBLE_DEVICES": "all"}, name="gpus"))

    assert not decision.allowed
    assert decision.denial_message == (
        PREFIX + "ConfigMap 'gpus' has the key NVIDIA_VISIBLE_DEVICES; envFrom would make it a container's "
        "variable, over what the scheduler allocated: rename or remove it (values are not read)"
    )


@pytest.mark.parametrize("value", ["void", "none", "", "all"])
def test_the_key_is_denied_whatever_its_value(evaluate: Evaluate, value: str) -> None:
    # A value that is harmless today can be edited later; a refused key cannot appear.
    assert not evaluate(config_map({"NVIDIA_VISIBLE_DEVICES": value})).allowed


@pytest.mark.parametrize("name", sorted(gpu.GUARDED_ENV))
def test_every_guarded_name_is_denied_as_a_key(evaluate: Evaluate, name: str) -> None:
    decision = evaluate(config_map({name: "1", "LOG_LEVEL": "debug"}))

    assert not decision.allowed
    assert f"has the key {name};" in decision.denial_message


def test_a_secret_with_guarded_keys_is_denied_naming_keys_never_values(evaluate: Evaluate) -> None:
    decision = evaluate(secret({"CGPU_DISABLE": "t0p-s3cret", "ALIYUN_COM_GPU_MEM_CONTAINER": "15", "TOKEN": "x"}))

    assert not decision.allowed
    assert decision.denial_message == (
        PREFIX + "Secret 'creds' has the keys ALIYUN_COM_GPU_MEM_CONTAINER, CGPU_DISABLE; envFrom would make "
        "them a container's variables, over what the scheduler allocated: rename or remove them (values are not read)"
    )
    encoded = base64.b64encode(b"t0p-s3cret").decode()
    assert "t0p-s3cret" not in repr(decision) and encoded not in repr(decision)


def test_a_secret_with_the_key_in_string_data_is_denied(evaluate: Evaluate) -> None:
    assert not evaluate(secret(stringData={"NVIDIA_VISIBLE_DEVICES": "all"})).allowed


def test_a_config_map_with_the_key_in_binary_data_is_denied(evaluate: Evaluate) -> None:
    assert not evaluate(config_map(binaryData={"CGPU_DISABLE": base64.b64encode(b"1").decode()})).allowed


def test_an_update_that_keeps_the_key_is_denied_and_one_that_removes_it_is_allowed(evaluate: Evaluate) -> None:
    old = config_map({"NVIDIA_VISIBLE_DEVICES": "void"})

    edited = evaluate(config_map({"NVIDIA_VISIBLE_DEVICES": "all"}), operation="UPDATE", old=old)
    removed = evaluate(config_map({"OTHER": "x"}), operation="UPDATE", old=old)

    assert not edited.allowed
    assert removed.allowed


@pytest.mark.parametrize(
    "obj",
    [
        config_map({"LOG_LEVEL": "debug", "nvidia_visible_devices": "all", "VISIBLE_DEVICES": "all"}),
        config_map({"NVIDIA_VISIBLE_DEVICES_BACKUP": "all", "MY_CGPU_DISABLE": "1", "CUDA_VISIBLE_DEVICES": "0"}),
        config_map(),
        config_map({"config.yaml": "NVIDIA_VISIBLE_DEVICES: all\n"}),  # values are not keys
        secret({"password": "x"}),
        secret(type="kubernetes.io/service-account-token"),
    ],
)
def test_ordinary_config_maps_and_secrets_are_allowed(evaluate: Evaluate, result: ResultOf, obj: dict[str, Any]) -> None:
    decision = evaluate(obj)

    assert decision.allowed
    assert result(decision, "GPU007") is model.Result.PASS


def test_only_gpu007_judges_a_config_map(evaluate: Evaluate) -> None:
    decision = evaluate(config_map({"LOG_LEVEL": "debug"}))

    assert [r.policy for r in decision.results] == ["GPU007"]
    assert decision.patch == ()


def test_gpu007_never_judges_a_pod(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    decision = evaluate(pod(container(env=[{"name": "LOG_LEVEL", "value": "x"}])))

    assert "GPU007" not in {r.policy for r in decision.results}


def test_a_config_map_in_an_exempt_namespace_is_not_judged(evaluate: Evaluate) -> None:
    decision = evaluate(config_map({"NVIDIA_VISIBLE_DEVICES": "all"}), namespace="kube-system")

    assert decision.allowed
    assert decision.exempt_reason == "namespace kube-system is exempt"


def test_delete_is_not_judged(evaluate: Evaluate) -> None:
    decision = evaluate(config_map({"NVIDIA_VISIBLE_DEVICES": "all"}), operation="DELETE")

    assert decision.allowed
    assert decision.exempt_reason == "operation DELETE is not evaluated"


@pytest.mark.parametrize("action", ["warn", "audit"])
def test_a_milder_action_admits_and_records(evaluate: Evaluate, result: ResultOf, action: str) -> None:
    decision = evaluate(config_map({"CGPU_DISABLE": "1"}), config={"policies": {"GPU007": {"action": action}}})

    assert decision.allowed
    assert result(decision, "GPU007") is model.Result.FAIL
    assert (len(decision.warnings) == 1) is (action == "warn")


def test_an_exception_anchored_to_the_namespace_lifts_it(evaluate: Evaluate, result: ResultOf) -> None:
    config = {"exceptions": [{"name": "drivers", "policies": ["GPU007"], "match": {"namespaces": ["team-a"]}}]}

    decision = evaluate(config_map({"NVIDIA_VISIBLE_DEVICES": "all"}), config=config)

    assert decision.allowed
    assert result(decision, "GPU007") is model.Result.SKIP


def test_other_kinds_without_a_pod_template_are_still_not_evaluated(evaluate: Evaluate) -> None:
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "data": {"NVIDIA_VISIBLE_DEVICES": "all"}}

    decision = evaluate(service)

    assert decision.allowed
    assert decision.exempt_reason == "kind 'Service' has no pod template"


@pytest.mark.parametrize(
    "obj",
    [
        {"kind": "ConfigMap", "data": ["NVIDIA_VISIBLE_DEVICES"]},
        {"kind": "ConfigMap", "metadata": "junk", "data": {"CGPU_DISABLE": None}},
        {"kind": "Secret", "stringData": "junk", "data": None},
        {"kind": "ConfigMap", "metadata": {"name": 5}, "binaryData": {"CGPU_DISABLE": 3}},
    ],
)
def test_malformed_sources_never_crash(evaluate: Evaluate, result: ResultOf, obj: dict[str, Any]) -> None:
    decision = evaluate(obj)

    assert result(decision, "GPU007") in (model.Result.PASS, model.Result.FAIL)
    assert decision.allowed is (not envsources.guarded_keys(obj))
