"""GPU001: no container sets the environment that chooses GPUs or switches off their isolation."""

from __future__ import annotations

from typing import Any

import pytest

from policies import gpu, lookups, model
from tests.unit.policies.conftest import ContainerFactory, Evaluate, PodFactory, ResultOf, ViolationMessages, WorkloadFactory

PREFIX = "GPU001: containers must not set the environment that chooses GPUs or switches off their isolation: "
ALL = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}


def test_visible_devices_set_to_all_is_denied(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    decision = evaluate(pod(container(env=[ALL])))

    assert not decision.allowed
    assert decision.denial_message == (
        PREFIX + 'container "main" sets NVIDIA_VISIBLE_DEVICES=all; request GPUs as resources, or use void'
    )


@pytest.mark.parametrize("value", ["void", "none", "VOID", " None "])
def test_visible_devices_void_or_none_is_allowed(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, value: str
) -> None:
    decision = evaluate(pod(container(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": value}])))

    assert decision.allowed
    assert result(decision, "GPU001") is model.Result.PASS


def test_visible_devices_listing_card_ids_in_an_init_container_is_denied(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, violation_messages: ViolationMessages
) -> None:
    setup = container("setup", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1"}])
    decision = evaluate(pod(container(gpu={"nvidia.com/gpu": 1}), init=[setup]))

    assert not decision.allowed
    assert violation_messages(decision, "GPU001") == [
        PREFIX + 'init container "setup" sets NVIDIA_VISIBLE_DEVICES=0,1; request GPUs as resources, or use void'
    ]


def test_visible_devices_set_empty_is_denied_because_only_void_and_none_are_safe(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    decision = evaluate(pod(container(env=[{"name": "NVIDIA_VISIBLE_DEVICES"}])))

    assert not decision.allowed
    assert "sets NVIDIA_VISIBLE_DEVICES=;" in decision.denial_message


def test_visible_devices_in_a_deployment_template_is_denied(
    pod: PodFactory, container: ContainerFactory, workload: WorkloadFactory, evaluate: Evaluate
) -> None:
    decision = evaluate(workload("Deployment", pod(container(env=[ALL]))))

    assert not decision.allowed
    assert decision.denial_message.startswith(PREFIX + 'container "main"')


def test_visible_devices_in_a_new_ephemeral_container_is_denied(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    old = pod(container())
    new = pod(container(), ephemeral=[container("debug", env=[ALL])])

    decision = evaluate(new, operation="UPDATE", subresource="ephemeralcontainers", old=old)

    assert not decision.allowed
    assert 'ephemeral container "debug" sets NVIDIA_VISIBLE_DEVICES=all' in decision.denial_message


def test_existing_ephemeral_containers_are_not_judged_again(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    # An ephemeral container already in the pod cannot change; only the added one is in scope.
    earlier = container("earlier", env=[ALL])
    old = pod(container(), ephemeral=[earlier])
    new = pod(container(), ephemeral=[earlier, container("debug")])

    decision = evaluate(new, operation="UPDATE", subresource="ephemeralcontainers", old=old)

    assert decision.allowed


# --- valueFrom: refused for every guarded name, whatever the source holds today -------------------


def test_visible_devices_from_a_config_map_key_is_denied_without_reading_it(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    entry = {
        "name": "NVIDIA_VISIBLE_DEVICES",
        "valueFrom": {"configMapKeyRef": {"name": "gpus", "key": "devices"}},
    }
    asked: list[model.EnvSource] = []

    def lookup(source: model.EnvSource) -> dict[str, str]:
        asked.append(source)
        return {"devices": "void"}

    decision = evaluate(pod(container(env=[entry])), lookup=lookup)

    # A value that is void today can be edited before the container restarts: refused anyway.
    assert not decision.allowed
    assert asked == []
    assert decision.denial_message == (
        PREFIX + "container \"main\" sets NVIDIA_VISIBLE_DEVICES from ConfigMap 'gpus' key 'devices', "
        "which can change after admission; set it by value to void or drop it"
    )


def test_visible_devices_from_a_secret_key_is_denied_and_the_value_never_shown(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    entry = {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"secretKeyRef": {"name": "gpus", "key": "devices"}}}

    decision = evaluate(pod(container(env=[entry])), lookup=lambda source: {"devices": "hunter2-secret"})

    assert not decision.allowed
    assert "sets NVIDIA_VISIBLE_DEVICES from Secret 'gpus' key 'devices'" in decision.denial_message
    assert "hunter2" not in repr(decision)


@pytest.mark.parametrize(
    ("reference", "shown"),
    [
        ({"fieldRef": {"fieldPath": "metadata.annotations['gpus']"}}, "fieldRef"),
        ({"resourceFieldRef": {"resource": "limits.cpu"}}, "resourceFieldRef"),
        ({}, "valueFrom"),
    ],
)
def test_visible_devices_from_any_other_reference_is_denied(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, reference: dict[str, Any], shown: str
) -> None:
    entry = {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": reference}

    decision = evaluate(pod(container(env=[entry])))

    assert not decision.allowed
    assert f'container "main" sets NVIDIA_VISIBLE_DEVICES from {shown}, which can change' in decision.denial_message


def test_an_isolation_variable_from_a_config_map_key_is_denied(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    entry = {"name": "ALIYUN_COM_GPU_MEM_CONTAINER", "valueFrom": {"configMapKeyRef": {"name": "sizes", "key": "mem"}}}

    decision = evaluate(pod(container(gpu={"aliyun.com/gpu-mem": 1}, env=[entry])))

    assert not decision.allowed
    assert decision.denial_message == (
        PREFIX + "container \"main\" sets ALIYUN_COM_GPU_MEM_CONTAINER from ConfigMap 'sizes' key 'mem', "
        "which can change after admission; drop it"
    )


# --- the isolation variables: the pod may not set them at all ---------------------------------------


def test_cgpu_disable_in_a_gpu_mem_container_is_denied(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    main = container(gpu={"aliyun.com/gpu-mem": 1}, env=[{"name": "CGPU_DISABLE", "value": "true"}])

    decision = evaluate(pod(main))

    assert not decision.allowed
    assert decision.denial_message == (
        PREFIX + 'container "main" sets CGPU_DISABLE=true, which the GPU-sharing device plugin sets to what '
        "the scheduler allocated; remove it and request aliyun.com/gpu-mem instead"
    )


@pytest.mark.parametrize("name", sorted(gpu.ISOLATION_ENV))
@pytest.mark.parametrize("value", ["15", "", "0"])
def test_every_isolation_variable_is_denied_whatever_its_value(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, name: str, value: str
) -> None:
    main = container(gpu={"aliyun.com/gpu-mem": 1}, env=[{"name": name, "value": value}])

    decision = evaluate(pod(main))

    assert not decision.allowed
    assert f'container "main" sets {name}={value}, which the GPU-sharing device plugin' in decision.denial_message


@pytest.mark.parametrize(
    "where",
    ["sidecar", "init", "ephemeral", "CronJob", "Deployment", "no-gpu"],
)
def test_an_isolation_variable_is_denied_in_every_container_kind_and_template(
    pod: PodFactory, container: ContainerFactory, workload: WorkloadFactory, evaluate: Evaluate, where: str
) -> None:
    bad = [{"name": "ALIYUN_COM_GPU_MEM_CONTAINER", "value": "15"}]
    gpu_main = container(gpu={"aliyun.com/gpu-mem": 1})
    if where == "sidecar":
        decision = evaluate(pod(gpu_main, init=[container("proxy", env=bad, restartPolicy="Always")]))
        label = 'init container "proxy"'
    elif where == "init":
        decision = evaluate(pod(gpu_main, init=[container("setup", env=bad)]))
        label = 'init container "setup"'
    elif where == "ephemeral":
        old = pod(gpu_main)
        new = pod(gpu_main, ephemeral=[container("debug", env=bad)])
        decision = evaluate(new, operation="UPDATE", subresource="ephemeralcontainers", old=old)
        label = 'ephemeral container "debug"'
    elif where == "no-gpu":
        decision = evaluate(pod(container(env=bad)))
        label = 'container "main"'
    else:
        decision = evaluate(workload(where, pod(container(gpu={"aliyun.com/gpu-mem": 1}, env=bad))))
        label = 'container "main"'

    assert not decision.allowed
    assert f"{label} sets ALIYUN_COM_GPU_MEM_CONTAINER=15" in decision.denial_message


@pytest.mark.parametrize(
    "name",
    [
        "cgpu_disable",  # the environment is case-sensitive: not what cGPU reads
        "MY_CGPU_DISABLE",
        "CGPU_DISABLED",
        "CUDA_VISIBLE_DEVICES",  # narrows within what the container already has
        "NVIDIA_DRIVER_CAPABILITIES",
        "NVIDIA_REQUIRE_CUDA",
        "ALIYUN_COM_GPU_MEM",
    ],
)
def test_look_alike_and_ordinary_gpu_variables_are_allowed(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, name: str
) -> None:
    main = container(gpu={"aliyun.com/gpu-mem": 1}, env=[{"name": name, "value": "all"}])

    decision = evaluate(pod(main))

    assert decision.allowed
    assert result(decision, "GPU001") is model.Result.PASS


# --- envFrom with a prefix that composes a guarded name -------------------------------------------


def test_env_from_with_prefix_nvidia_is_denied_offline(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    main = container(gpu={"nvidia.com/gpu": 1}, env_from=[{"prefix": "NVIDIA_", "configMapRef": {"name": "app"}}])

    decision = evaluate(pod(main))

    assert not decision.allowed
    assert decision.denial_message == (
        PREFIX + "container \"main\" takes envFrom ConfigMap 'app' with prefix 'NVIDIA_', which composes "
        "NVIDIA_VISIBLE_DEVICES from a key such as 'VISIBLE_DEVICES'; use a prefix that begins no GPU "
        "variable (e.g. APP_)"
    )


@pytest.mark.parametrize(
    ("prefix", "composed"),
    [
        ("NVIDIA_VISIBLE_", "NVIDIA_VISIBLE_DEVICES"),
        ("N", "NVIDIA_VISIBLE_DEVICES"),
        ("ALIYUN_COM_GPU_MEM_", "ALIYUN_COM_GPU_MEM_CONTAINER"),
        ("ALIYUN_", "ALIYUN_COM_GPU_VISIBLE_DEVICES"),
        ("CGPU_", "CGPU_DISABLE"),
        ("C", "CGPU_DISABLE"),
        ("CGPU_DISABL", "CGPU_DISABLE"),
    ],
)
def test_env_from_prefixes_that_begin_a_guarded_name_are_denied(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, prefix: str, composed: str
) -> None:
    main = container(gpu={"aliyun.com/gpu-mem": 1}, env_from=[{"prefix": prefix, "secretRef": {"name": "app"}}])

    decision = evaluate(pod(main))

    assert not decision.allowed
    assert f"takes envFrom Secret 'app' with prefix {prefix!r}, which composes" in decision.denial_message
    assert composed in decision.denial_message


@pytest.mark.parametrize("where", ["init", "ephemeral", "Job", "StatefulSet"])
def test_env_from_prefix_is_denied_in_every_container_kind_and_template(
    pod: PodFactory, container: ContainerFactory, workload: WorkloadFactory, evaluate: Evaluate, where: str
) -> None:
    source = [{"prefix": "CGPU_", "configMapRef": {"name": "app"}}]
    gpu_main = container(gpu={"aliyun.com/gpu-mem": 1})
    if where == "init":
        decision = evaluate(pod(gpu_main, init=[container("setup", env_from=source)]))
    elif where == "ephemeral":
        decision = evaluate(
            pod(gpu_main, ephemeral=[container("debug", env_from=source)]),
            operation="UPDATE",
            subresource="ephemeralcontainers",
            old=pod(gpu_main),
        )
    else:
        decision = evaluate(workload(where, pod(container(gpu={"aliyun.com/gpu-mem": 1}, env_from=source))))

    assert not decision.allowed
    assert "with prefix 'CGPU_', which composes CGPU_DISABLE" in decision.denial_message


@pytest.mark.parametrize(
    "prefix",
    ["APP_", "NVIDIA_VISIBLE_DEVICES", "CGPU_DISABLE", "nvidia_", "X_NVIDIA_", "", None],
)
def test_env_from_prefixes_that_begin_no_guarded_name_are_allowed(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, prefix: str | None
) -> None:
    source: dict[str, object] = {"configMapRef": {"name": "app"}}
    if prefix is not None:
        source["prefix"] = prefix
    main = container(gpu={"nvidia.com/gpu": 1}, env_from=[source])

    decision = evaluate(pod(main))

    assert decision.allowed
    assert decision.warnings == ()
    assert result(decision, "GPU001") is model.Result.PASS


def test_env_from_prefix_nvidia_is_allowed_where_env_sets_the_variable_to_void(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    # env beats envFrom: the composed NVIDIA_VISIBLE_DEVICES is never the one the container gets.
    main = container(
        gpu={"nvidia.com/gpu": 1},
        env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}],
        env_from=[{"prefix": "NVIDIA_", "configMapRef": {"name": "app"}}],
    )

    assert evaluate(pod(main)).allowed


def test_env_from_prefix_nvidia_in_a_container_without_gpus_is_neutralised_by_the_added_void(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    decision = evaluate(pod(container(env_from=[{"prefix": "NVIDIA_", "configMapRef": {"name": "app"}}])))

    assert decision.allowed


def test_env_from_prefix_that_composes_an_isolation_variable_is_denied_even_without_gpus(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    # GPU104's void covers NVIDIA_VISIBLE_DEVICES only; the isolation variables have no neutral value.
    decision = evaluate(pod(container(env_from=[{"prefix": "C", "configMapRef": {"name": "app"}}])))

    assert not decision.allowed
    assert "which composes CGPU_DISABLE from a key such as 'GPU_DISABLE'" in decision.denial_message


# --- envFrom without a prefix: admitted, because GPU007 guards the sources' keys ------------------


def test_env_from_without_prefix_on_a_gpu_container_is_allowed_offline(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf
) -> None:
    main = container(
        gpu={"aliyun.com/gpu-mem": 1},
        env_from=[{"configMapRef": {"name": "not-created-yet"}}, {"secretRef": {"name": "creds"}}],
    )

    decision = evaluate(pod(main))

    assert decision.allowed
    assert decision.warnings == ()
    assert result(decision, "GPU001") is model.Result.PASS


def test_env_from_without_prefix_warns_where_gpu007_is_not_enforced(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf
) -> None:
    main = container(gpu={"nvidia.com/gpu": 1}, env_from=[{"configMapRef": {"name": "app"}}])

    decision = evaluate(pod(main), config={"policies": {"GPU007": {"action": "warn"}}})

    assert decision.allowed
    assert result(decision, "GPU001") is model.Result.WARN
    assert decision.warnings == (
        PREFIX
        + "container \"main\" takes envFrom ConfigMap 'app', which may set "
        + ", ".join(sorted(gpu.GUARDED_ENV))
        + " (GPU007 does not guard its keys in namespace team-a); set NVIDIA_VISIBLE_DEVICES=void in env "
        "or enforce GPU007",
    )


def test_env_from_without_prefix_warns_where_an_exception_lifts_gpu007_in_the_namespace(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf
) -> None:
    main = container(gpu={"nvidia.com/gpu": 1}, env_from=[{"configMapRef": {"name": "app"}}])
    config = {"exceptions": [{"name": "legacy", "policies": ["GPU007"], "match": {"namespaces": ["team-a"]}}]}

    assert result(evaluate(pod(main), config=config), "GPU001") is model.Result.WARN
    assert result(evaluate(pod(main), config=config, namespace="team-b"), "GPU001") is model.Result.PASS


def test_env_from_a_source_holding_a_guarded_key_is_denied_naming_keys_not_values(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    main = container(gpu={"aliyun.com/gpu-mem": 1}, env_from=[{"secretRef": {"name": "creds"}}])
    held = {"CGPU_DISABLE": "s3cr3t-value", "NVIDIA_VISIBLE_DEVICES": "void", "TOKEN": "abc"}

    decision = evaluate(pod(main), lookup=lambda source: held)

    assert not decision.allowed
    assert decision.denial_message == (
        PREFIX + "container \"main\" takes envFrom Secret 'creds', whose keys CGPU_DISABLE, NVIDIA_VISIBLE_DEVICES "
        "would set the GPU environment; remove them from the Secret"
    )
    assert "s3cr3t" not in repr(decision)


def test_env_from_a_source_whose_guarded_key_env_overrides_with_void_is_allowed(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    main = container(
        gpu={"nvidia.com/gpu": 1},
        env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}],
        env_from=[{"configMapRef": {"name": "app"}}],
    )

    assert evaluate(pod(main), lookup=lambda source: {"NVIDIA_VISIBLE_DEVICES": "all"}).allowed


def test_env_from_whose_looked_up_data_lacks_guarded_keys_is_allowed(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    main = container(gpu={"nvidia.com/gpu": 1}, env_from=[{"configMapRef": {"name": "app"}}])

    decision = evaluate(pod(main), lookup=lambda source: {"LOG_LEVEL": "debug"})

    assert decision.allowed
    assert decision.warnings == ()


def test_sources_lists_only_prefixless_env_from_references(pod: PodFactory, container: ContainerFactory) -> None:
    main = container(
        env=[{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {"name": "keyed", "key": "k"}}}],
        env_from=[
            {"configMapRef": {"name": "plain"}},
            {"prefix": "APP_", "configMapRef": {"name": "prefixed"}},
            {"secretRef": {"name": "creds"}},
        ],
    )

    found = lookups.env_sources(pod(main), namespace="team-a")

    assert found == {
        model.EnvSource(kind="ConfigMap", namespace="team-a", name="plain"),
        model.EnvSource(kind="Secret", namespace="team-a", name="creds"),
    }


@pytest.mark.parametrize(
    "main",
    [
        {"name": "main", "env": [{"name": 7, "value": "all"}, "junk"], "envFrom": ["junk", {"prefix": 3, "configMapRef": "x"}]},
        {"name": "main", "envFrom": [{"prefix": ["NVIDIA_"], "configMapRef": {"name": 5}}]},
        {"name": "main", "env": [{"name": "CGPU_DISABLE", "valueFrom": "junk"}]},
    ],
)
def test_malformed_env_never_crashes(pod: PodFactory, evaluate: Evaluate, result: ResultOf, main: dict[str, Any]) -> None:
    decision = evaluate(pod(main))

    assert result(decision, "GPU001") in (model.Result.PASS, model.Result.FAIL)
    assert isinstance(lookups.env_sources(pod(main), namespace="team-a"), frozenset)
