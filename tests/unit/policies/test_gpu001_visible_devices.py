"""GPU001: no container chooses its GPUs through NVIDIA_VISIBLE_DEVICES."""

from __future__ import annotations

import pytest

from policies import model

PREFIX = "GPU001: containers must not choose GPUs through NVIDIA_VISIBLE_DEVICES: "
ALL = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}


def test_visible_devices_set_to_all_is_denied(pod, container, evaluate):
    decision = evaluate(pod(container(env=[ALL])))

    assert not decision.allowed
    assert decision.denial_message == (
        PREFIX + 'container "main" sets NVIDIA_VISIBLE_DEVICES=all; '
        "request GPUs as resources, or use void"
    )


@pytest.mark.parametrize("value", ["void", "none", "VOID", " None "])
def test_visible_devices_void_or_none_is_allowed(pod, container, evaluate, result, value):
    decision = evaluate(pod(container(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": value}])))

    assert decision.allowed
    assert result(decision, "GPU001") is model.Result.PASS


def test_visible_devices_listing_card_ids_in_an_init_container_is_denied(
    pod, container, evaluate, violation_messages
):
    setup = container("setup", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1"}])
    decision = evaluate(pod(container(gpu={"nvidia.com/gpu": 1}), init=[setup]))

    assert not decision.allowed
    assert violation_messages(decision, "GPU001") == [
        PREFIX + 'init container "setup" sets NVIDIA_VISIBLE_DEVICES=0,1; '
        "request GPUs as resources, or use void"
    ]


def test_visible_devices_set_empty_is_denied_because_only_void_and_none_are_safe(
    pod, container, evaluate
):
    decision = evaluate(pod(container(env=[{"name": "NVIDIA_VISIBLE_DEVICES"}])))

    assert not decision.allowed
    assert "sets NVIDIA_VISIBLE_DEVICES=;" in decision.denial_message


def test_visible_devices_in_a_deployment_template_is_denied(pod, container, workload, evaluate):
    decision = evaluate(workload("Deployment", pod(container(env=[ALL]))))

    assert not decision.allowed
    assert decision.denial_message.startswith(PREFIX + 'container "main"')


def test_visible_devices_in_a_new_ephemeral_container_is_denied(pod, container, evaluate):
    old = pod(container())
    new = pod(container(), ephemeral=[container("debug", env=[ALL])])

    decision = evaluate(new, operation="UPDATE", subresource="ephemeralcontainers", old=old)

    assert not decision.allowed
    assert 'ephemeral container "debug" sets NVIDIA_VISIBLE_DEVICES=all' in decision.denial_message


def test_existing_ephemeral_containers_are_not_judged_again(pod, container, evaluate):
    # An ephemeral container already in the pod cannot change; only the added one is in scope.
    earlier = container("earlier", env=[ALL])
    old = pod(container(), ephemeral=[earlier])
    new = pod(container(), ephemeral=[earlier, container("debug")])

    decision = evaluate(new, operation="UPDATE", subresource="ephemeralcontainers", old=old)

    assert decision.allowed


def test_visible_devices_from_an_unreadable_config_map_key_is_denied(pod, container, evaluate):
    entry = {
        "name": "NVIDIA_VISIBLE_DEVICES",
        "valueFrom": {"configMapKeyRef": {"name": "gpus", "key": "devices"}},
    }
    decision = evaluate(pod(container(env=[entry])))

    assert not decision.allowed
    assert decision.denial_message == (
        PREFIX + "container \"main\" sets NVIDIA_VISIBLE_DEVICES from ConfigMap 'gpus' key "
        "'devices', whose value cannot be checked"
    )


def test_visible_devices_from_a_field_ref_is_denied(pod, container, evaluate):
    entry = {
        "name": "NVIDIA_VISIBLE_DEVICES",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['gpus']"}},
    }
    decision = evaluate(pod(container(env=[entry])))

    assert not decision.allowed
    assert "through valueFrom, whose value cannot be checked" in decision.denial_message


def test_visible_devices_from_a_secret_key_is_judged_by_its_looked_up_value(
    pod, container, evaluate
):
    entry = {
        "name": "NVIDIA_VISIBLE_DEVICES",
        "valueFrom": {"secretKeyRef": {"name": "gpus", "key": "devices"}},
    }
    asked: list[model.EnvSource] = []

    def lookup(source: model.EnvSource) -> dict[str, str]:
        asked.append(source)
        return {"devices": "all"}

    decision = evaluate(pod(container(env=[entry])), lookup=lookup)

    assert asked == [model.EnvSource(kind="Secret", namespace="team-a", name="gpus")]
    assert not decision.allowed
    assert "sets NVIDIA_VISIBLE_DEVICES=all from Secret 'gpus' key 'devices'" in (
        decision.denial_message
    )


def test_visible_devices_from_a_config_map_key_holding_void_is_allowed(pod, container, evaluate):
    entry = {
        "name": "NVIDIA_VISIBLE_DEVICES",
        "valueFrom": {"configMapKeyRef": {"name": "gpus", "key": "devices"}},
    }
    decision = evaluate(pod(container(env=[entry])), lookup=lambda source: {"devices": "void"})

    assert decision.allowed


def test_env_from_without_prefix_on_a_gpu_container_warns_when_offline(
    pod, container, evaluate, result
):
    gpu_container = container(gpu={"nvidia.com/gpu": 1}, env_from=[{"configMapRef": {"name": "app"}}])

    decision = evaluate(pod(gpu_container))

    assert decision.allowed
    assert result(decision, "GPU001") is model.Result.WARN
    assert decision.warnings == (
        PREFIX + "container \"main\" takes envFrom ConfigMap 'app', which may set "
        "NVIDIA_VISIBLE_DEVICES; set NVIDIA_VISIBLE_DEVICES=void in env to rule it out",
    )


def test_env_from_that_sets_visible_devices_is_denied_when_looked_up(pod, container, evaluate):
    gpu_container = container(
        gpu={"nvidia.com/gpu": 1}, env_from=[{"prefix": "NVIDIA_", "secretRef": {"name": "app"}}]
    )

    decision = evaluate(pod(gpu_container), lookup=lambda source: {"VISIBLE_DEVICES": "all"})

    assert not decision.allowed
    assert (
        "sets NVIDIA_VISIBLE_DEVICES=all through envFrom Secret 'app' key 'VISIBLE_DEVICES'"
        in decision.denial_message
    )


def test_env_from_whose_looked_up_data_lacks_the_variable_is_allowed(pod, container, evaluate):
    gpu_container = container(gpu={"nvidia.com/gpu": 1}, env_from=[{"configMapRef": {"name": "app"}}])

    decision = evaluate(pod(gpu_container), lookup=lambda source: {"LOG_LEVEL": "debug"})

    assert decision.allowed
    assert decision.warnings == ()


def test_env_from_with_a_prefix_that_cannot_produce_the_variable_is_allowed(
    pod, container, evaluate
):
    gpu_container = container(
        gpu={"nvidia.com/gpu": 1}, env_from=[{"prefix": "APP_", "configMapRef": {"name": "app"}}]
    )

    decision = evaluate(pod(gpu_container))

    assert decision.allowed
    assert decision.warnings == ()


def test_env_from_on_a_container_without_gpus_is_neutralised_by_the_added_void(
    pod, container, evaluate
):
    # GPU104 adds NVIDIA_VISIBLE_DEVICES=void to env, which takes precedence over envFrom.
    decision = evaluate(pod(container(env_from=[{"configMapRef": {"name": "app"}}])))

    assert decision.allowed
    assert decision.warnings == ()


def test_env_from_on_a_container_without_gpus_warns_when_the_void_mutator_is_off(
    pod, container, evaluate
):
    decision = evaluate(
        pod(container(env_from=[{"configMapRef": {"name": "app"}}])),
        config={"policies": {"GPU104": {"action": "off"}}},
    )

    assert decision.allowed
    assert len(decision.warnings) == 1
    assert decision.warnings[0].startswith(PREFIX)
