"""The engine's pre-checks (policies.applicability, each policy's `relevant`) change no decision.

A pre-check that wrongly says "nothing to find" would let a pod past a policy, so the engine with
pre-checks must give the very decision (verdict, results, violations with their messages,
warnings, patch) of the engine running every policy:

- over generated Pods and workloads, well formed or not, under several settings, as a CREATE,
  as an `ephemeralcontainers` update and as a plain Pod UPDATE;
- over mostly-ordinary pods one field away from the line (the ordinary-pod generator);
- and for each field a pre-check reads, from the tenant's side: the field hidden where a
  pre-check could overlook it (an init or ephemeral container, envFrom alone, odd types and
  spellings), each with the refusal or the patch it must still get.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import hypothesis
import pytest
from hypothesis import strategies as st

from policies import applicability, engine, model, settings
from policies.trustzone import DEFAULT_ZONE
from tests.unit.policies import test_ordinary, test_properties
from tests.unit.policies.conftest import build_container, build_pod

KEEP_OFF = [dict(e) for e in DEFAULT_ZONE.keep_off]

SETTINGS = [
    settings.from_mapping(c)
    for c in (
        *test_properties.CONFIGS,
        *test_ordinary.SOUND_SETTINGS,
        {"exceptions": [{"name": "dev", "policies": ["GPU002", "GPU104"], "match": {"namespaces": ["team-a"]}}]},
    )
]
OPERATIONS = ["CREATE", "ephemeral", "UPDATE"]
# What the apiserver adds to every pod with a ServiceAccount: a projected volume and its mount.
TOKEN_VOLUMES = [{"name": "kube-api-access-x7k2p", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}]
TOKEN_MOUNTS = [{"name": "kube-api-access-x7k2p", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": True}]


def both(obj: Mapping[str, Any], parsed: settings.Settings, *, operation: str = "CREATE", lookup: Any = None) -> model.Decision:
    """The decision with pre-checks, after asserting it equals the one without."""
    old: Mapping[str, Any] | None = None
    subresource = ""
    if operation == "ephemeral":
        # The stored pod had no ephemeral containers: every one in `obj` is new.
        old = copy.deepcopy(dict(obj))
        spec = old.get("spec")
        if isinstance(spec, dict):
            spec.pop("ephemeralContainers", None)
        operation, subresource = "UPDATE", engine.EPHEMERAL_SUBRESOURCE
    elif operation == "UPDATE":
        old = {**obj, "metadata": {"name": "app", "annotations": {"team": "a"}}}
    request = model.Request(
        operation=operation, object=obj, old_object=old, subresource=subresource, namespace="team-a", env_lookup=lookup
    )
    fast = engine.evaluate(request, settings=parsed)
    full = engine.evaluate(request, settings=parsed, prechecks=False)
    assert fast == full
    return fast


@test_properties.PROPERTY_SETTINGS
@hypothesis.given(
    obj=test_properties.objects(),
    parsed=st.sampled_from(SETTINGS),
    operation=st.sampled_from(OPERATIONS),
    lookup=test_properties.lookups,
)
def test_generated_objects_get_the_same_decision_with_and_without_prechecks(
    obj: dict[str, Any], parsed: settings.Settings, operation: str, lookup: Any
) -> None:
    both(test_properties.unaliased(obj), parsed, operation=operation, lookup=lookup)


@hypothesis.settings(max_examples=500, deadline=None, suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(obj=test_ordinary.mixed_pods(), parsed=st.sampled_from(SETTINGS), operation=st.sampled_from(OPERATIONS))
def test_pods_one_field_from_ordinary_get_the_same_decision(
    obj: dict[str, Any], parsed: settings.Settings, operation: str
) -> None:
    both(test_properties.unaliased(obj), parsed, operation=operation)


def test_an_ordinary_gpu_pod_skips_the_policies_with_nothing_to_find() -> None:
    # As the apiserver sends it: the ServiceAccount token volume and its mount (no hostPath, no
    # device-list path), which GPU003 and GPU006 have nothing to find in.
    obj = build_pod(build_container(gpu={"aliyun.com/gpu-mem": 3}, volumeMounts=TOKEN_MOUNTS), volumes=TOKEN_VOLUMES)
    request = model.Request(operation="CREATE", object=obj, namespace="team-a")
    ran: list[str] = []
    defaults = settings.Settings()
    for item in engine.POLICIES:
        relevant = getattr(item, "relevant", None)
        if relevant is None:
            continue
        context = engine._context(request, settings=defaults, working=obj, ephemeral_only=False)
        if relevant(context, applicability.of(context)):
            ran.append(item.id)

    assert ran == ["GPU004", "GPU005", "GPU101"]
    decision = both(obj, defaults)
    assert decision.allowed
    assert decision.patch == ({"op": "add", "path": "/spec/nodeSelector", "value": {"ack.node.gpu.schedule": "cgpu"}},)


# --- from the tenant's side: each fact a pre-check reads, hidden where it could be overlooked ----

GPU = {"aliyun.com/gpu-mem": 3}


def denied_by(decision: model.Decision) -> set[str]:
    return {v.policy for v in decision.violations if v.action is model.Action.ENFORCE}


@pytest.mark.parametrize(
    ("name", "obj", "policy_id"),
    [
        (
            "privileged init container",
            build_pod(build_container(gpu=GPU), init=[build_container("setup", privileged=True)]),
            "GPU002",
        ),
        (
            "SYS_ADMIN in a sidecar, lowercase",
            build_pod(
                build_container(gpu=GPU), build_container("side", securityContext={"capabilities": {"add": ["sys_admin"]}})
            ),
            "GPU002",
        ),
        (
            "privileged ephemeral container",
            build_pod(build_container(gpu=GPU), ephemeral=[build_container("dbg", privileged=True)]),
            "GPU002",
        ),
        ("host network of a GPU pod", build_pod(build_container(gpu=GPU), hostNetwork=True), "GPU002"),
        (
            "a gitRepo volume of a GPU pod",
            build_pod(build_container(gpu=GPU), volumes=[{"name": "g", "gitRepo": {"repository": "r"}}]),
            "GPU003",
        ),
        (
            "NVIDIA_VISIBLE_DEVICES in an init container",
            build_pod(
                build_container(gpu=GPU),
                init=[build_container("setup", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])],
            ),
            "GPU001",
        ),
        (
            "isolation variable in an ephemeral container",
            build_pod(
                build_container(gpu=GPU), ephemeral=[build_container("dbg", env=[{"name": "CGPU_DISABLE", "value": "true"}])]
            ),
            "GPU001",
        ),
        (
            "envFrom prefix alone, no env",
            build_pod(build_container(gpu=GPU, env_from=[{"prefix": "NVIDIA_", "configMapRef": {"name": "cm"}}])),
            "GPU001",
        ),
        (
            "a garbage env entry before the guarded one",
            build_pod(
                {
                    **build_container(),
                    "env": [{"name": ["NVIDIA_VISIBLE_DEVICES"]}, 7, {"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}],
                }
            ),
            "GPU001",
        ),
        (
            "hostPath volume mounted by no container",
            build_pod(build_container(gpu=GPU), volumes=[{"name": "d", "hostPath": {"path": "/dev"}}]),
            "GPU003",
        ),
        (
            "device-list mount in an init container",
            build_pod(
                build_container(),
                init=[
                    build_container("setup", volumeMounts=[{"name": "v", "mountPath": "/var/run/nvidia-container-devices/all"}])
                ],
            ),
            "GPU006",
        ),
        (
            "hostPath after the token volume and an emptyDir",
            build_pod(
                build_container(gpu=GPU),
                volumes=[
                    *TOKEN_VOLUMES,
                    {"name": "e", "emptyDir": {}},
                    {"name": "h", "hostPath": {"path": "/run/../dev/nvidia0"}},
                ],
            ),
            "GPU003",
        ),
        (
            "device-list mount beside the token mount, spelled oddly",
            build_pod(
                build_container(
                    volumeMounts=[
                        *TOKEN_MOUNTS,
                        {"name": "d", "mountPath": "/run//./nvidia-container-devices/../nvidia-container-devices/0"},
                    ]
                ),
                volumes=TOKEN_VOLUMES,
            ),
            "GPU006",
        ),
        (
            "volumeDevices only",
            build_pod(build_container(volumeDevices=[{"name": "v", "devicePath": "/run/nvidia-container-devices/0"}])),
            "GPU006",
        ),
        (
            "GPU resource only in requests of an init container",
            build_pod(build_container(), init=[build_container("setup", requests={"aliyun.com/gpu-mem": 1})]),
            "GPU004",
        ),
        (
            "CDI annotation on a CPU pod",
            build_pod(build_container(), annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=all"}),
            "GPU010",
        ),
        (
            "unreadable card-model annotation on a CPU pod",
            build_pod(build_container(), annotations={"gpu-admission.io/min-gpu-memory": "lots"}),
            "GPU102",
        ),
    ],
)
def test_a_field_a_precheck_reads_is_found_wherever_it_hides(name: str, obj: dict[str, Any], policy_id: str) -> None:
    decision = both(obj, settings.Settings())

    assert not decision.allowed, name
    assert policy_id in denied_by(decision), (name, decision.violations)


def test_a_privileged_cpu_pod_is_still_kept_off_gpu_nodes() -> None:
    obj = build_pod(build_container(), init=[build_container("setup", privileged=True)])

    decision = both(obj, settings.Settings())

    assert decision.allowed
    assert {
        "op": "add",
        "path": "/spec/affinity",
        "value": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": KEEP_OFF}]}
            }
        },
    } in decision.patch


def test_a_cpu_sidecar_of_a_gpu_pod_still_gets_void_devices() -> None:
    obj = build_pod(build_container(gpu=GPU), build_container("side"))

    decision = both(obj, settings.Settings())

    assert decision.allowed
    assert {
        "op": "add",
        "path": "/spec/containers/1/env",
        "value": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}],
    } in decision.patch


def test_a_privileged_ephemeral_container_added_to_a_gpu_pod_is_refused() -> None:
    obj = build_pod(build_container(gpu=GPU), ephemeral=[build_container("dbg", privileged=True)])

    decision = both(obj, settings.Settings(), operation="ephemeral")

    assert "GPU009" in denied_by(decision)


def test_an_ordinary_cpu_pod_passes_every_policy_and_gets_only_void_devices() -> None:
    decision = both(build_pod(build_container()), settings.Settings())

    assert decision.allowed
    assert decision.patch == (
        {"op": "add", "path": "/spec/containers/0/env", "value": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]},
    )
    assert {r.result for r in decision.results} == {model.Result.PASS, model.Result.SKIP}
