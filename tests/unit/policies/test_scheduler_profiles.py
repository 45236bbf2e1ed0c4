"""Scheduler profiles: in front of HAMi, Volcano, koordinator or KAI the gate lets that scheduler's own
service accounts write its device annotations, treats its resource names as GPUs, and still refuses
every bypass to tenants. The pods and annotation values are the schedulers' own
(tests/data/schedulers/, each file names its source)."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies import engine, gpu, model, schedulers, settings
from webhook.admission import configwatch, keys
from webhook.serving import metrics

DATA = Path(__file__).resolve().parents[2] / "data" / "schedulers"
WRITTEN: dict[str, dict[str, str]] = yaml.safe_load((DATA / "annotations.yaml").read_text())
HAMI_SCHEDULER = "system:serviceaccount:kube-system:hami-scheduler"
KOORD_SCHEDULER = "system:serviceaccount:koordinator-system:koord-scheduler"
WRITER = {
    "hami": HAMI_SCHEDULER,
    "volcano": "system:serviceaccount:volcano-system:volcano-scheduler",
    "koordinator": KOORD_SCHEDULER,
}
EXAMPLES = {
    "hami": "hami-default_use.yaml",
    "volcano": "volcano-vgpu-case01.yml",
    "koordinator": "koordinator-gpu-share.yaml",
}


def example(name: str) -> dict[str, Any]:
    found = yaml.safe_load((DATA / name).read_text())
    assert found["kind"] == "Pod"
    return dict(found)


def decide(
    obj: dict[str, Any],
    *,
    profile: str | dict[str, Any],
    operation: str = "CREATE",
    old: dict[str, Any] | None = None,
    user: str = "alice",
) -> model.Decision:
    request = model.Request(operation=operation, object=obj, old_object=old, namespace="team-a", user=user)
    return engine.evaluate(request, settings=settings.from_mapping({"scheduler": profile}))


def messages(decision: model.Decision, policy: str) -> list[str]:
    return [v.message for v in decision.violations if v.policy == policy]


def annotated(pod: dict[str, Any], annotations: dict[str, str]) -> dict[str, Any]:
    new = copy.deepcopy(pod)
    new.setdefault("metadata", {}).setdefault("annotations", {}).update(annotations)
    return new


def test_every_profile_named_in_the_settings_is_one_frozen_profile_and_gpushare_is_the_default() -> None:
    assert [str(n) for n in schedulers.Name] == ["gpushare", "hami", "volcano", "koordinator", "kai"]
    assert settings.Settings().scheduler.profile is schedulers.GPUSHARE
    assert settings.from_mapping({}).scheduler == settings.Settings().scheduler
    for name in schedulers.Name:
        profile = settings.from_mapping({"scheduler": str(name)}).scheduler.profile
        assert profile is schedulers.PROFILES[name]
        assert bool(profile.notice) is (name != schedulers.Name.GPUSHARE)
        # every annotation a scheduler may write is one GPU010 refuses from anyone else
        assert all(gpu.is_device_annotation(k) for k in profile.writer_annotations)


@pytest.mark.parametrize("profile", ["hami", "volcano", "koordinator"])
def test_the_schedulers_own_service_account_may_write_its_device_annotations_by_update(profile: str) -> None:
    pod = example(EXAMPLES[profile])
    written = annotated(pod, WRITTEN[profile])

    admitted = decide(written, profile=profile, operation="UPDATE", old=pod, user=WRITER[profile])
    refused = decide(written, profile=profile, operation="UPDATE", old=pod, user="alice")

    assert messages(admitted, "GPU010") == []
    assert admitted.allowed
    assert not refused.allowed
    [message] = messages(refused, "GPU010")
    for key in WRITTEN[profile]:
        assert f"adds {key}" in message


@pytest.mark.parametrize("profile", ["hami", "volcano", "koordinator"])
def test_nobody_creates_a_pod_carrying_them_not_even_the_scheduler(profile: str) -> None:
    forged = annotated(example(EXAMPLES[profile]), WRITTEN[profile])

    for user in ("alice", WRITER[profile]):
        decision = decide(forged, profile=profile, user=user)
        assert not decision.allowed
        [message] = messages(decision, "GPU010")
        assert sorted(WRITTEN[profile])[0] in message


def test_a_tenant_naming_a_service_account_of_the_same_name_in_its_own_namespace_is_no_writer() -> None:
    pod = example(EXAMPLES["hami"])
    written = annotated(pod, WRITTEN["hami"])

    for impostor in (
        "system:serviceaccount:team-a:hami-scheduler",
        "system:serviceaccount:kube-system:hami-scheduler-x",
        "system:serviceaccount:kube-system:hami-scheduler ",
        "hami-scheduler",
        "system:serviceaccounts:kube-system",
    ):
        decision = decide(written, profile="hami", operation="UPDATE", old=pod, user=impostor)
        assert not decision.allowed, impostor
    # and only where the settings name it: with writers given, the chart's defaults are no longer trusted
    custom = {"profile": "hami", "writers": [{"namespace": "gpu-sharing", "serviceAccount": "hami-scheduler"}]}
    assert not decide(written, profile=custom, operation="UPDATE", old=pod, user=HAMI_SCHEDULER).allowed
    assert decide(
        written, profile=custom, operation="UPDATE", old=pod, user="system:serviceaccount:gpu-sharing:hami-scheduler"
    ).allowed


def test_a_writer_may_write_only_its_schedulers_annotations_not_another_device_annotation() -> None:
    pod = example(EXAMPLES["hami"])
    cdi = annotated(pod, {**WRITTEN["hami"], "cdi.k8s.io/x": "nvidia.com/gpu=all"})
    koord = annotated(pod, WRITTEN["koordinator"])

    [message] = messages(decide(cdi, profile="hami", operation="UPDATE", old=pod, user=HAMI_SCHEDULER), "GPU010")
    assert "adds cdi.k8s.io/x" in message and "hami.io" not in message
    assert not decide(koord, profile="hami", operation="UPDATE", old=pod, user=HAMI_SCHEDULER).allowed


def test_the_default_profile_trusts_no_writer() -> None:
    pod = example(EXAMPLES["koordinator"])
    written = annotated(pod, WRITTEN["koordinator"])

    decision = decide(written, profile="gpushare", operation="UPDATE", old=pod, user=KOORD_SCHEDULER)

    assert not decision.allowed
    assert messages(decision, "GPU010")


@pytest.mark.parametrize("profile", ["hami", "volcano", "koordinator"])
def test_a_tenant_pod_with_the_schedulers_resources_and_privileged_or_all_devices_is_refused(profile: str) -> None:
    privileged = example(EXAMPLES[profile])
    privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    all_cards = example(EXAMPLES[profile])
    all_cards["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]

    refused = decide(privileged, profile=profile)
    assert not refused.allowed
    [message] = messages(refused, "GPU002")
    assert "is privileged" in message

    assert not decide(all_cards, profile=profile).allowed
    assert messages(decide(all_cards, profile=profile), "GPU001")


def test_a_koordinator_gpu_share_pod_is_a_gpu_pod_so_its_gpu_container_keeps_its_devices_and_a_sidecar_gets_void() -> None:
    pod = example(EXAMPLES["koordinator"])
    pod["spec"]["containers"].append({"name": "log", "image": "busybox"})

    koord = decide(pod, profile="koordinator")
    default = decide(pod, profile="gpushare")

    assert koord.allowed
    # koordinator.sh/gpu-core is a GPU there: only the sidecar gets void
    assert list(koord.patch) == [
        {"op": "add", "path": "/spec/containers/1/env", "value": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]}
    ]
    # without the profile the engine does not know the name, and voids the GPU container too
    assert {
        "op": "add",
        "path": "/spec/containers/0/env",
        "value": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}],
    } in default.patch


@pytest.mark.parametrize("profile", ["hami", "volcano", "koordinator", "kai"])
def test_the_extender_rules_do_not_apply_in_front_of_another_scheduler(profile: str) -> None:
    loaded = settings.from_mapping({"scheduler": profile})
    # GPU008 would refuse a gpu-mem pod that names another scheduler; GPU105 would rename it
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {
            "schedulerName": "other",
            "containers": [{"name": "m", "image": "i", "resources": {"limits": {"aliyun.com/gpu-mem": 1}}}],
        },
    }

    assert {p: loaded.action(p) for p in sorted(schedulers.EXTENDER_POLICIES)} == dict.fromkeys(
        sorted(schedulers.EXTENDER_POLICIES), model.Action.OFF
    )
    assert messages(decide(pod, profile=profile), "GPU008") == []
    assert messages(decide(pod, profile="gpushare"), "GPU008")
    # the rest still enforce
    assert loaded.action("GPU001") is model.Action.ENFORCE
    assert loaded.action("GPU010") is model.Action.ENFORCE


def test_a_kai_fraction_example_pod_names_its_scheduler_and_carries_a_fraction_annotation() -> None:
    pod = example("kai-gpu-sharing.yaml")

    assert pod["spec"]["schedulerName"] in schedulers.KAI.scheduler_names
    assert set(pod["metadata"]["annotations"]) & set(schedulers.KAI.gpu_annotations) == {"gpu-fraction"}
    decision = decide(pod, profile="kai")
    assert decision.allowed
    assert messages(decision, "GPU008") == []


@pytest.mark.parametrize(
    ("document", "line"),
    [
        (
            {"scheduler": "slurm"},
            "scheduler: unknown scheduler profile 'slurm'; known: gpushare, hami, volcano, koordinator, kai",
        ),
        (
            {"scheduler": {"profile": "HAMi"}},
            "scheduler.profile: unknown scheduler profile 'HAMi'; known: gpushare, hami, volcano, koordinator, kai",
        ),
        (
            {"scheduler": {"profile": "hami", "writers": [{"serviceAccount": "hami-scheduler"}]}},
            "scheduler.writers[0].namespace: is required",
        ),
        (
            {"scheduler": {"profile": "hami", "writers": [{"namespace": "kube-system"}]}},
            "scheduler.writers[0].serviceAccount: is required",
        ),
        (
            {"scheduler": {"profile": "hami", "writers": [{"namespace": "Kube_System", "serviceAccount": "x"}]}},
            "scheduler.writers[0].namespace: is required",
        ),
        (
            {"scheduler": {"profile": "hami", "writers": ["kube-system/hami-scheduler"]}},
            "scheduler.writers[0]: must be {namespace: ..., serviceAccount: ...}",
        ),
        (
            {"scheduler": {"profile": "hami", "writers": [{"namespace": "a", "serviceAccount": "b", "user": "c"}]}},
            "scheduler.writers[0].user: unknown key",
        ),
        ({"scheduler": {"profile": "kai", "writers": []}}, "scheduler.writers: the kai profile has no device annotations"),
        ({"scheduler": {"writer": []}}, "scheduler.writer: unknown key; known: profile, writers"),
        ({"scheduler": 7}, "scheduler: must be a profile name"),
    ],
)
def test_an_unknown_profile_or_a_malformed_identity_is_refused_at_load_with_one_line_naming_the_key(
    document: dict[str, Any], line: str
) -> None:
    with pytest.raises(settings.InvalidSettings) as raised:
        settings.from_mapping(document)

    assert str(raised.value).startswith(line)
    assert "\n" not in str(raised.value)


def test_a_bad_scheduler_setting_on_reload_keeps_the_last_good_settings(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("scheduler: hami\n")
    source = configwatch.Source(config_path=str(path))
    watcher = configwatch.Watcher(
        source=source,
        live=keys.LiveSettings(current=configwatch.load(source)),
        meters=configwatch.register(metrics.Registry()),
        seen=configwatch.fingerprint(source),
    )

    path.write_text("scheduler: {profile: hami, writers: [{serviceAccount: hami-scheduler}]}\n")
    reloaded = asyncio.run(watcher.check())

    assert reloaded is False
    assert watcher.live.current.scheduler.profile is schedulers.HAMI
    assert watcher.live.current.scheduler.writers == schedulers.HAMI.default_writers


HAMI_ENV = Path(__file__).resolve().parents[3] / "examples" / "schedulers"


@pytest.mark.parametrize(
    ("where", "entry"),
    [
        ("containers", {"env": [{"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "80g"}]}),
        ("containers", {"env": [{"name": "CUDA_DEVICE_SM_LIMIT", "value": "100"}]}),
        ("initContainers", {"env": [{"name": "CUDA_OVERSUBSCRIBE", "value": "true"}]}),
        ("containers", {"envFrom": [{"prefix": "CUDA_", "configMapRef": {"name": "limits"}}]}),
    ],
)
def test_the_hami_isolation_user_policy_refuses_a_pod_setting_hami_cores_limits_and_admits_ordinary_env(
    where: str, entry: dict[str, Any]
) -> None:
    from webhook.config import userpolicies

    loaded = settings.from_mapping({"scheduler": "hami"}, user_policies=userpolicies.load(str(HAMI_ENV)))
    pod = example(EXAMPLES["hami"])
    pod["spec"].setdefault(where, [{"name": "init", "image": "i"}])[0].update(entry)
    ordinary = example(EXAMPLES["hami"])
    ordinary["spec"]["containers"][0]["env"] = [{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}]
    ordinary["spec"]["containers"][0]["envFrom"] = [{"prefix": "APP_", "configMapRef": {"name": "app"}}]

    def judged(obj: dict[str, Any]) -> model.Decision:
        return engine.evaluate(model.Request(operation="CREATE", object=obj, namespace="team-a"), settings=loaded)

    refused = judged(pod)
    assert not refused.allowed
    [message] = messages(refused, "HAM001")
    assert message.startswith("HAM001: containers must not set HAMi-core's GPU limits themselves: containers ")
    assert judged(ordinary).allowed


@pytest.mark.parametrize("profile", ["hami", "volcano", "koordinator"])
def test_the_audit_takes_a_stored_pod_carrying_its_schedulers_annotations_as_written_by_design(profile: str) -> None:
    from webhook.audit import scan

    stored = annotated(example(EXAMPLES[profile]), WRITTEN[profile])
    stored["metadata"]["namespace"] = "team-a"
    stored["spec"]["nodeName"] = "gpu-0"
    cdi = annotated(stored, {"cdi.k8s.io/x": "nvidia.com/gpu=all"})
    cdi["metadata"]["name"] = "cdi"
    now = 1_800_000_000.0

    def gpu010(configured: settings.Settings) -> dict[str, model.Result]:
        audit = scan.run(scan.Inventory.of([stored, cdi]), settings=configured, now=now)
        return {f.subject.name: f.result for f in audit.findings if f.policy == "GPU010"}

    assert gpu010(settings.from_mapping({"scheduler": profile})) == {
        stored["metadata"]["name"]: model.Result.PASS,
        "cdi": model.Result.FAIL,
    }
    # in front of the default scheduler the same stored pod is reported, as before
    assert gpu010(settings.Settings())[stored["metadata"]["name"]] is model.Result.FAIL


# KAI-Scheduler's fractions (docs/schedulers/kai.md): the pod as KAI's webhook returns it takes
# NVIDIA_VISIBLE_DEVICES from a ConfigMap that KAI's binder writes. Nothing binds that ConfigMap to
# one pod (the name comes from an annotation a tenant may set first, and the binder re-owns a
# ConfigMap a second pod names), so the shape stays refused in every profile, KAI's own included.
KAI_BINDER = "system:serviceaccount:kai-scheduler:binder"
KAI_CONFIG_MAP = "gpu-sharing-abc1234-shared-gpu-0"


def kai_config_map() -> dict[str, Any]:
    found = yaml.safe_load((DATA / "kai-shared-gpu-configmap.yaml").read_text())
    assert found["kind"] == "ConfigMap" and found["metadata"]["name"] == KAI_CONFIG_MAP
    return dict(found)


@pytest.mark.parametrize("profile", ["kai", "gpushare"])
def test_a_kai_fraction_pod_as_kais_webhook_returns_it_is_refused_for_its_configmap_devices(profile: str) -> None:
    mutated = example("kai-gpu-sharing-mutated.yaml")
    plain = example("kai-gpu-sharing.yaml")
    assert mutated["metadata"]["annotations"]["runai/shared-gpu-configmap"] + "-0" == KAI_CONFIG_MAP

    decision = decide(mutated, profile=profile)

    assert not decision.allowed
    [message] = messages(decision, "GPU001")
    assert (
        f"sets NVIDIA_VISIBLE_DEVICES from ConfigMap {KAI_CONFIG_MAP!r} key 'NVIDIA_VISIBLE_DEVICES', "
        "which can change after admission" in message
    )
    # the same pod before KAI's webhook, and its other ConfigMap entries, are not what is refused
    assert decide(plain, profile="kai").allowed


@pytest.mark.parametrize(
    "route",
    [
        "second pod naming the first pod's ConfigMap",
        "second pod copying the first pod's annotation",
        "pod without a fraction annotation",
        "pod for the default scheduler",
    ],
)
def test_every_tenant_route_to_a_kai_configmap_stays_refused(route: str) -> None:
    pod = example("kai-gpu-sharing-mutated.yaml")
    if route.startswith("second pod"):
        pod["metadata"]["name"] = "gpu-sharing-2"
        if route.endswith("ConfigMap"):
            del pod["metadata"]["annotations"]["runai/shared-gpu-configmap"]
    elif route == "pod without a fraction annotation":
        del pod["metadata"]["annotations"]["gpu-fraction"]
    else:
        pod["spec"]["schedulerName"] = "default-scheduler"

    decision = decide(pod, profile="kai")

    assert not decision.allowed, route
    assert KAI_CONFIG_MAP in messages(decision, "GPU001")[0]


@pytest.mark.parametrize(
    ("operation", "user"),
    [("UPDATE", KAI_BINDER), ("UPDATE", "alice"), ("CREATE", "alice"), ("CREATE", KAI_BINDER)],
)
def test_the_kai_configmap_carrying_a_card_is_refused_from_the_binder_and_from_a_tenant(operation: str, user: str) -> None:
    written = kai_config_map()
    empty = copy.deepcopy(written)
    del empty["data"]
    tenant_all = copy.deepcopy(written)
    tenant_all["data"]["NVIDIA_VISIBLE_DEVICES"] = "all"

    for obj in (written, tenant_all):
        old = empty if operation == "UPDATE" else None
        decision = decide(obj, profile="kai", operation=operation, old=old, user=user)
        assert not decision.allowed
        [message] = messages(decision, "GPU007")
        assert f"ConfigMap {KAI_CONFIG_MAP!r} has the key NVIDIA_VISIBLE_DEVICES;" in message
    # the binder's first write (empty, pkg/binder/common/gpusharingconfigmap/config_map.go) and
    # KAI's RUNAI_NUM_OF_GPUS and GPU_PORTION keys are ordinary
    portion = copy.deepcopy(written)
    del portion["data"]["NVIDIA_VISIBLE_DEVICES"]
    assert decide(empty, profile="kai", user=KAI_BINDER).allowed
    assert decide(portion, profile="kai", operation="UPDATE", old=empty, user=KAI_BINDER).allowed


def test_kai_fractions_run_only_where_an_exception_for_gpu001_and_gpu007_names_the_namespace() -> None:
    loaded = settings.from_mapping(
        {
            "scheduler": "kai",
            "exceptions": [
                {
                    "name": "kai-fractions",
                    "policies": ["GPU001", "GPU007"],
                    "match": {"namespaces": ["trusted-fractions"]},
                    "reason": "KAI's ConfigMap is not bound to one pod (docs/schedulers/kai.md)",
                }
            ],
        }
    )
    pod = example("kai-gpu-sharing-mutated.yaml")
    written = kai_config_map()

    def judged(obj: dict[str, Any], namespace: str, operation: str = "CREATE") -> model.Decision:
        obj = copy.deepcopy(obj)
        obj["metadata"]["namespace"] = namespace
        request = model.Request(operation=operation, object=obj, namespace=namespace, user=KAI_BINDER)
        return engine.evaluate(request, settings=loaded)

    trusted = judged(pod, "trusted-fractions")
    assert trusted.allowed
    assert list(trusted.patch) == []  # GPU104 leaves the container KAI's webhook gave a source alone
    assert judged(written, "trusted-fractions", "UPDATE").allowed
    assert messages(judged(pod, "team-a"), "GPU001")
    assert messages(judged(written, "team-a", "UPDATE"), "GPU007")
