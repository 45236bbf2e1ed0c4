"""policies/ordinary.py: the validating webhook's `pod-create-not-ordinary` match condition.

The proof that skipping the validating call changes no verdict: generated pods (well formed, as
kube-apiserver validates a pod before its validating webhooks see it) go through the mutation as the
/mutate call applies it, then through the condition evaluated with the CEL runtime the user policies
use; for every pod the condition skips, the engine's full evaluation of the mutated pod (what /validate
would answer) allows it with no violation and no warning, under every sound settings variant.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import hypothesis
import jsonpatch
import pytest
import yaml
from hypothesis import strategies as st

from policies import cel, engine, gpu, model, nodeaffinity, ordinary, policy, settings, trustzone

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
CREATE = {"operation": "CREATE", "resource": {"group": "", "version": "v1", "resource": "pods"}}


def configurations() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / "webhook-configurations.yaml").read_text()) if d]


def validating_hook() -> dict[str, Any]:
    [configuration] = [d for d in configurations() if d["kind"] == "ValidatingWebhookConfiguration"]
    [hook] = [h for h in configuration["webhooks"] if h["name"] == ordinary.VALIDATING_WEBHOOK]
    found: dict[str, Any] = hook
    return found


@pytest.fixture(scope="module")
def condition() -> cel.Expression:
    return compiled()


def compiled() -> cel.Expression:
    return cel.compile_expression(cel.environment(), ordinary.condition_expression(), field=ordinary.CONDITION_NAME)


def sent(expression: cel.Expression, obj: Any, req: Mapping[str, Any] = CREATE) -> bool:
    result = cel.evaluate(expression, {"request": dict(req), "object": obj, "oldObject": None})
    assert isinstance(result, bool)
    return result


# --- the YAML is the generated text ----------------------------------------------------------------


def test_the_yaml_condition_is_the_generated_one() -> None:
    [found] = [c for c in validating_hook()["matchConditions"] if c["name"] == ordinary.CONDITION_NAME]
    assert found["expression"] == ordinary.condition_expression()


def test_the_condition_is_on_the_validating_webhook_only() -> None:
    [mutating] = [d for d in configurations() if d["kind"] == "MutatingWebhookConfiguration"]
    for hook in mutating["webhooks"]:
        assert ordinary.CONDITION_NAME not in [c["name"] for c in hook.get("matchConditions", [])]
    [configuration] = [d for d in configurations() if d["kind"] == "ValidatingWebhookConfiguration"]
    for hook in configuration["webhooks"]:
        names = [c["name"] for c in hook.get("matchConditions", [])]
        assert (ordinary.CONDITION_NAME in names) == (hook["name"] == ordinary.VALIDATING_WEBHOOK)


def test_the_lists_cover_the_python_predicates() -> None:
    for key in [
        *gpu.ALLOCATION_ANNOTATIONS,
        *gpu.CRIO_DEVICES_ANNOTATIONS,
        *gpu.DEVICE_ANNOTATION_DOMAINS,
        "org.systemd.property.DeviceAllow",
    ]:
        written = key if not key.endswith(".") else key + "x"
        assert (
            gpu.is_device_annotation(written) or written in gpu.ALLOCATION_ANNOTATIONS or written in gpu.CRIO_DEVICES_ANNOTATIONS
        )
        assert (
            written in ordinary.ANNOTATION_KEYS
            or written.startswith(ordinary.ANNOTATION_PREFIXES)
            or any(written == d or written.startswith(d + "/") for d in ordinary.DEVICE_DOMAINS)
        ), written
    for name in [*gpu.GPU_RESOURCES, "nvidia.com/gpu", "nvidia.com/mig-1g.5gb", "nvidia.com/gpu.shared"]:
        assert gpu.is_gpu_resource(name) and name.startswith(ordinary.RESOURCE_PREFIXES)
    for label in [*nodeaffinity.GPU_NODE_LABELS, *nodeaffinity.GPU_NODE_TRUE_LABELS, "aliyun.accelerator/nvidia_name"]:
        assert nodeaffinity.is_gpu_node_label(label)
        assert label in ordinary.NODE_LABELS or label.startswith(ordinary.NODE_LABEL_PREFIXES)
    assert all(gpu.is_safe_visible_devices(v) for v in ordinary.NEUTRAL_VALUES)
    # What GPU104 may write; an empty value (configurable) is not listed, so such pods are sent.
    assert set(settings.NEUTRAL_VISIBLE_DEVICES_CHOICES) - {""} <= set(ordinary.NEUTRAL_VALUES)
    assert len(ordinary.condition_expression()) <= cel.MAX_EXPRESSION_CHARS


# --- examples: the ordinary pod is skipped, one field more sends it ---------------------------------


def pod(*, annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    main = {"name": "main", "image": "nginx", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]}
    body: dict[str, Any] = {"containers": [main], **spec}
    metadata: dict[str, Any] = {"name": "p", "namespace": "team-a"}
    if annotations is not None:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": body}


def with_container(**fields: Any) -> dict[str, Any]:
    found = pod()
    found["spec"]["containers"][0].update(fields)
    return found


ORDINARY = [
    pod(),
    pod(annotations={"team": "ml", "prometheus.io/scrape": "true"}, nodeSelector={"kubernetes.io/os": "linux"}),
    pod(volumes=[{"name": "d", "emptyDir": {}}, {"name": "c", "configMap": {"name": "c"}}]),
    pod(
        affinity={
            "podAntiAffinity": {},
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]
                }
            },
        }
    ),
    with_container(resources={"limits": {"cpu": "1", "memory": "1Gi"}}, securityContext={"runAsNonRoot": True}),
    with_container(
        env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}, {"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]
    ),
    with_container(volumeMounts=[{"name": "d", "mountPath": "/var/run"}]),
    with_container(ports=[{"containerPort": 8080, "protocol": "TCP"}, {"name": "metrics", "containerPort": 9090, "hostPort": 0}]),
]


@pytest.mark.parametrize("obj", ORDINARY)
def test_ordinary_pods_are_skipped_and_the_engine_agrees(condition: cel.Expression, obj: dict[str, Any]) -> None:
    assert not sent(condition, obj)
    decision = engine.evaluate(
        model.Request(operation="CREATE", object=obj, namespace="team-a"), settings=settings.from_mapping({})
    )
    assert decision.allowed and not decision.violations and not decision.warnings and not decision.patch


GPU_LABEL_TERM = {
    "nodeSelectorTerms": [{"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]}]
}
NOT_ORDINARY = {
    "hostPath /run": pod(volumes=[{"name": "h", "hostPath": {"path": "/run"}}]),
    "hostPath /tmp": pod(volumes=[{"name": "h", "hostPath": {"path": "/tmp"}}]),
    "gpu": with_container(resources={"limits": {"nvidia.com/gpu": 1}}),
    "gpu in requests": with_container(resources={"requests": {"aliyun.com/gpu-mem": 1}}),
    "mig": with_container(resources={"limits": {"nvidia.com/mig-1g.5gb": 1}}),
    "privileged": with_container(securityContext={"privileged": True}),
    "capability": with_container(securityContext={"capabilities": {"add": ["cap_sys_admin"]}}),
    "visible all": with_container(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]),
    "visible Void": with_container(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": " Void"}]),
    "visible from": with_container(
        env=[{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]
    ),
    "isolation": with_container(
        env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}, {"name": "CGPU_DISABLE", "value": "true"}]
    ),
    "envFrom": with_container(envFrom=[{"configMapRef": {"name": "c"}}]),
    "device list mount": with_container(volumeMounts=[{"name": "d", "mountPath": "/var/run/nvidia-container-devices/all"}]),
    "device list device": with_container(volumeDevices=[{"name": "d", "devicePath": "/run//nvidia-container-devices"}]),
    "allocation": pod(annotations={"ALIYUN_COM_GPU_MEM_IDX": "0"}),
    "cdi": pod(annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=all"}),
    "nri": pod(annotations={"devices.nri.io": "x"}),
    "crio": pod(annotations={"io.kubernetes.cri-o.Devices": "/dev/nvidia0"}),
    "card model": pod(annotations={"gpu-admission.io/gpu-model": ","}),
    "nodeName": pod(nodeName="gpu-0"),
    "gpu selector": pod(nodeSelector={"ack.node.gpu.schedule": "cgpu"}),
    "gpu label prefix": pod(nodeSelector={"aliyun.accelerator/nvidia_name": "A10"}),
    "required affinity": pod(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": GPU_LABEL_TERM}}),
    "preferred affinity": pod(
        affinity={
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 1, "preference": {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "Exists"}]}}
                ]
            }
        }
    ),
    "ephemeral": pod(ephemeralContainers=[{"name": "dbg", "image": "busybox"}]),
    # Any host port is sent (the allowlist is /validate's to judge): the kubelet's, and the notebook's.
    "hostPort kubelet": with_container(ports=[{"containerPort": 10250, "hostPort": 10250}]),
    "hostPort allowed": with_container(ports=[{"containerPort": 80}, {"containerPort": 8888, "hostPort": 8888}]),
    "ephemeral hostPort": pod(
        ephemeralContainers=[{"name": "dbg", "image": "busybox", "ports": [{"containerPort": 1, "hostPort": 10250}]}]
    ),
}


@pytest.mark.parametrize("obj", NOT_ORDINARY.values(), ids=NOT_ORDINARY.keys())
def test_one_more_field_sends_the_review(condition: cel.Expression, obj: dict[str, Any]) -> None:
    assert sent(condition, obj)


@pytest.mark.parametrize("obj", NOT_ORDINARY.values(), ids=NOT_ORDINARY.keys())
def test_each_field_also_sends_it_from_an_init_container(condition: cel.Expression, obj: dict[str, Any]) -> None:
    # The container-level cases, moved into an init container beside an ordinary main container.
    containers = obj["spec"]["containers"]
    moved = copy.deepcopy(obj)
    moved["spec"]["initContainers"] = copy.deepcopy(containers)
    moved["spec"]["containers"] = copy.deepcopy(pod()["spec"]["containers"])
    assert sent(condition, moved)


@pytest.mark.parametrize(
    "req",
    [
        {**CREATE, "operation": "UPDATE"},
        {**CREATE, "subResource": "ephemeralcontainers", "operation": "UPDATE"},
        {**CREATE, "resource": {"group": "apps", "version": "v1", "resource": "deployments"}},
        {**CREATE, "subResource": "binding"},
    ],
    ids=["pod-update", "ephemeral", "deployment", "subresource"],
)
def test_everything_but_a_pod_create_is_sent(condition: cel.Expression, req: dict[str, Any]) -> None:
    assert sent(condition, pod(), req)


def test_a_pod_without_spec_is_sent(condition: cel.Expression) -> None:
    assert sent(condition, {"kind": "Pod", "metadata": {"name": "p"}})


# --- settings that make the skip unsound ------------------------------------------------------------


class _UserPolicy(policy.Validator):
    id = "TEAM001"
    summary = "refuses everything"

    def validate(self, context: policy.Context) -> Iterable[policy.Finding]:
        del context
        return [policy.Finding(detail="no")]


def test_default_settings_are_sound() -> None:
    assert ordinary.unsound_reasons(settings.from_mapping({})) == ()
    assert ordinary.unsound_reasons(settings.from_mapping({"policies": {"GPU001": {"action": "warn"}}})) == ()


def test_user_policies_make_the_skip_unsound_and_would_refuse_an_ordinary_pod(condition: cel.Expression) -> None:
    parsed = settings.from_mapping({}, user_policies=[_UserPolicy()])
    [reason] = ordinary.unsound_reasons(parsed)
    assert "TEAM001" in reason
    obj = ORDINARY[0]
    assert not sent(condition, obj)  # why they must remove the condition:
    assert not engine.evaluate(model.Request(operation="CREATE", object=obj, namespace="team-a"), settings=parsed).allowed


@pytest.mark.parametrize(
    "config",
    [
        {"policies": {"GPU104": {"action": "warn"}}},
        {"policies": {"GPU103": {"action": "audit"}}},
        {"namespaceOverrides": [{"name": "ops", "namespaces": ["ops"], "policies": {"GPU104": {"action": "warn"}}}]},
    ],
)
def test_a_quiet_mutator_makes_the_skip_unsound(config: dict[str, Any]) -> None:
    [reason] = ordinary.unsound_reasons(settings.from_mapping(config))
    assert "GPU10" in reason


def test_without_the_condition_keeps_every_other_condition() -> None:
    documents = configurations()
    stripped = [ordinary.without_ordinary_condition(d) for d in documents]
    for before, after in zip(documents, stripped, strict=True):
        for old, new in zip(before["webhooks"], after["webhooks"], strict=True):
            kept = [c for c in old.get("matchConditions", []) if c["name"] != ordinary.CONDITION_NAME]
            assert new.get("matchConditions", []) == kept
    assert any(ordinary.CONDITION_NAME in str(d) for d in documents)
    assert not any(ordinary.CONDITION_NAME in str(d) for d in stripped)


# --- the property: no skipped pod would have been refused or warned on -------------------------------

CONTAINER_RESOURCES = [
    "cpu",
    "memory",
    "nvidia.com/gpu",
    "nvidia.com/mig-1g.5gb",
    "aliyun.com/gpu-mem",
    "aliyun.com/gpu-core.percentage",
    "aliyun.com/gpu",
    "aliyun.com/gpu-count",
    "example.com/fpga",
]
ENV_NAMES = ["LOG_LEVEL", "NVIDIA_VISIBLE_DEVICES", "CGPU_DISABLE", "ALIYUN_COM_GPU_MEM_CONTAINER", "NVIDIA_DRIVER_CAPABILITIES"]
ENV_VALUES = ["void", "none", "all", "0", "", " void", "VOID", "None"]
CAPABILITIES = ["NET_ADMIN", "SYS_ADMIN", "sys_admin", "CAP_SYS_ADMIN", "ALL", "NET_BIND_SERVICE"]
HOST_PATHS = ["/run", "/var/run/docker.sock", "/tmp", "/data", "/dev/shm", "/sys/fs/cgroup", "/etc/localtime"]
MOUNT_PATHS = ["/data", "/var/run", "/var/run/nvidia-container-devices/all", "/run/nvidia-container-devices", "/cache"]
ANNOTATION_KEYS = [
    "team",
    "prometheus.io/scrape",
    *gpu.ALLOCATION_ANNOTATIONS,
    *gpu.CRIO_DEVICES_ANNOTATIONS,
    "cdi.k8s.io/gpu",
    "nvidia.cdi.k8s.io",
    "mounts.nri.io/x",
    "example.com/cdi.k8s.io",
    "gpu-admission.io/gpu-model",
    "gpu-admission.io/min-gpu-memory",
    "gpu-admission.io/note",
]
ANNOTATION_VALUES = ["A10", "16Gi", "x", "/dev/fuse", "/dev/nvidia0", "nvidia.com/gpu=all", ",", "true"]
NODE_LABEL_KEYS = [
    "kubernetes.io/os",
    "topology.kubernetes.io/zone",
    "ack.node.gpu.schedule",
    "nvidia.com/gpu.present",
    "aliyun.accelerator/nvidia_name",
    "nvidia.com/gpu.product",
    "feature.node.kubernetes.io/pci-10de.present",
]
NODE_LABEL_VALUES = ["linux", "a", "cgpu", "true", "false", "A10"]


def sometimes(strategy: st.SearchStrategy[Any], weight: int = 3) -> st.SearchStrategy[Any]:
    """`strategy`, or None (the field left out) `weight` times as often, so ordinary pods stay common."""
    return st.one_of(*([st.none()] * weight), strategy)


# Half the draws are what an ordinary pod holds, so that ordinary pods stay common among the others.
resource_names = st.one_of(st.sampled_from(["cpu", "memory", "example.com/fpga"]), st.sampled_from(CONTAINER_RESOURCES))
env_entry = st.one_of(
    st.builds(lambda n: {"name": n, "value": "1"}, st.sampled_from(["LOG_LEVEL", "NVIDIA_DRIVER_CAPABILITIES"])),
    st.builds(lambda v: {"name": "NVIDIA_VISIBLE_DEVICES", "value": v}, st.sampled_from(["void", "none"])),
    st.builds(lambda n, v: {"name": n, "value": v}, st.sampled_from(ENV_NAMES), st.sampled_from(ENV_VALUES)),
    st.builds(lambda n: {"name": n, "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}, st.sampled_from(ENV_NAMES)),
)
env_from_entry = st.builds(
    lambda prefix, kind: {kind: {"name": "src"}, **({"prefix": prefix} if prefix else {})},
    st.sampled_from(["", "APP_", "NVIDIA_", "CGPU_"]),
    st.sampled_from(["configMapRef", "secretRef"]),
)
quantity = st.one_of(st.integers(0, 3).map(str), st.sampled_from(["100m", "1Gi", "2"]))


@st.composite
def containers(draw: st.DrawFn, name: str) -> dict[str, Any]:
    found: dict[str, Any] = {"name": name, "image": "app"}
    limits = draw(sometimes(st.dictionaries(resource_names, quantity, min_size=1, max_size=2), weight=1))
    requests = draw(sometimes(st.dictionaries(resource_names, quantity, min_size=1, max_size=2)))
    if limits or requests:
        found["resources"] = {k: v for k, v in (("limits", limits), ("requests", requests)) if v}
    privileged = draw(sometimes(st.booleans(), weight=8))
    add = draw(sometimes(st.lists(st.sampled_from(CAPABILITIES), max_size=2), weight=10))
    if privileged is not None or add is not None:
        context: dict[str, Any] = {}
        if privileged is not None:
            context["privileged"] = privileged
        if add is not None:
            context["capabilities"] = {"add": add}
        found["securityContext"] = context
    env = draw(sometimes(st.lists(env_entry, max_size=2), weight=2))
    if env is not None:
        found["env"] = env
    env_from = draw(sometimes(st.lists(env_from_entry, min_size=1, max_size=1), weight=8))
    if env_from is not None:
        found["envFrom"] = env_from
    mounts = draw(sometimes(st.lists(st.sampled_from(MOUNT_PATHS), min_size=1, max_size=2), weight=4))
    if mounts is not None:
        found["volumeMounts"] = [{"name": f"v{i}", "mountPath": p} for i, p in enumerate(mounts)]
    host_port = draw(sometimes(st.sampled_from([0, 8888, 10250, 2379]), weight=6))
    if host_port is not None:
        found["ports"] = [{"containerPort": 8080}, {"containerPort": 9000, "hostPort": host_port}]
    if draw(st.integers(0, 15)) == 0:
        found["volumeDevices"] = [{"name": "blk", "devicePath": draw(st.sampled_from(MOUNT_PATHS))}]
    return found


def affinity_terms(draw: st.DrawFn) -> list[dict[str, Any]]:
    keys = draw(st.lists(st.sampled_from(NODE_LABEL_KEYS), min_size=1, max_size=2))
    operator = draw(st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"]))
    return [{"key": k, "operator": operator, **({"values": ["true"]} if operator in ("In", "NotIn") else {})} for k in keys]


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [draw(containers("main"))]}
    if draw(st.integers(0, 3)) == 0:
        spec["containers"].append(draw(containers("side")))
    if draw(st.integers(0, 3)) == 0:
        spec["initContainers"] = [draw(containers("init"))]
    if draw(st.integers(0, 12)) == 0:
        spec["ephemeralContainers"] = [draw(containers("debug"))]
    volumes = draw(sometimes(st.lists(st.sampled_from(HOST_PATHS), min_size=1, max_size=2), weight=5))
    spec["volumes"] = [{"name": "e", "emptyDir": {}}]
    if volumes:
        spec["volumes"] += [{"name": f"h{i}", "hostPath": {"path": p}} for i, p in enumerate(volumes)]
    selector = draw(
        sometimes(
            st.dictionaries(
                st.one_of(st.sampled_from(NODE_LABEL_KEYS[:2]), st.sampled_from(NODE_LABEL_KEYS)),
                st.sampled_from(NODE_LABEL_VALUES),
                min_size=1,
                max_size=2,
            )
        )
    )
    if selector:
        spec["nodeSelector"] = selector
    which = draw(st.integers(0, 7))
    if which == 0:
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": affinity_terms(draw)}]
                }
            }
        }
    elif which == 1:
        spec["affinity"] = {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 1, "preference": {"matchExpressions": affinity_terms(draw)}}
                ]
            }
        }
    if draw(st.integers(0, 10)) == 0:
        spec["nodeName"] = "node-1"
    spec["schedulerName"] = draw(st.sampled_from(["default-scheduler", "default-scheduler", "volcano"]))
    metadata: dict[str, Any] = {"name": "p", "namespace": "team-a"}
    annotations = draw(
        sometimes(
            st.dictionaries(
                st.one_of(st.sampled_from(["team", "app.kubernetes.io/name"]), st.sampled_from(ANNOTATION_KEYS)),
                st.sampled_from(ANNOTATION_VALUES),
                min_size=1,
                max_size=2,
            ),
            weight=2,
        )
    )
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


CATEGORIES = [
    "security",
    "resources",
    "env",
    "envFrom",
    "mounts",
    "volumes",
    "annotations",
    "selector",
    "affinity",
    "nodeName",
    "ephemeral",
    "ports",
]


def _plain(obj: dict[str, Any], keep: str | None) -> dict[str, Any]:
    """`obj` with every kind of field a policy reads taken out, except `keep`'s: mostly-ordinary pods,
    so that the property meets many pods on either side of the line, one field away from it."""
    spec, metadata = obj["spec"], obj["metadata"]
    for container in [*spec["containers"], *spec.get("initContainers", [])]:
        if keep != "security":
            container.pop("securityContext", None)
        if keep != "resources":
            container.pop("resources", None)
        if keep != "env":
            container["env"] = [e for e in container.get("env", []) if e["name"] not in gpu.GUARDED_ENV]
        if keep != "envFrom":
            container.pop("envFrom", None)
        if keep != "mounts":
            container.pop("volumeMounts", None)
            container.pop("volumeDevices", None)
        if keep != "ports":
            container.pop("ports", None)
    if keep != "volumes":
        spec["volumes"] = [v for v in spec["volumes"] if "hostPath" not in v]
    if keep != "annotations":
        metadata.pop("annotations", None)
    if keep != "selector":
        spec.pop("nodeSelector", None)
    if keep != "affinity":
        spec.pop("affinity", None)
    if keep != "nodeName":
        spec.pop("nodeName", None)
    if keep != "ephemeral":
        spec.pop("ephemeralContainers", None)
    return obj


@st.composite
def mixed_pods(draw: st.DrawFn) -> dict[str, Any]:
    """Half generated pods as they come, half with at most one kind of field a policy reads."""
    obj = draw(pods())
    if draw(st.booleans()):
        return obj
    return _plain(obj, draw(st.one_of(st.none(), st.sampled_from(CATEGORIES))))


def _fetch_guarded(source: model.EnvSource) -> Mapping[str, str]:
    del source
    return {"NVIDIA_VISIBLE_DEVICES": "all"}


SOUND_SETTINGS: list[dict[str, Any]] = [
    {},
    {"keepNonGpuPodsOffGpuNodes": True},
    {"visibleDevicesNeutralValue": "none", "gpuSchedulerName": "gpu-scheduler"},
    {"visibleDevicesNeutralValue": ""},
    {"exceptions": [{"name": "legacy", "policies": ["GPU007"], "match": {"namespaces": ["team-a"]}}]},
    {"policies": {p.id: {"action": "warn"} for p in engine.POLICIES if not isinstance(p, policy.Mutator)}},
    {
        "namespaceOverrides": [{"name": "team", "namespaces": ["team-a"], "policies": {"GPU003": {"action": "audit"}}}],
        "hostPaths": {"protect": ["/data"]},
    },
]


def mutated(obj: Mapping[str, Any], parsed: settings.Settings, lookup: Any) -> dict[str, Any]:
    """The pod as the validating stage sees it: /mutate's patch applied."""
    decision = engine.evaluate(
        model.Request(operation="CREATE", object=obj, namespace="team-a", env_lookup=lookup), settings=parsed
    )
    result: dict[str, Any] = jsonpatch.apply_patch(copy.deepcopy(dict(obj)), list(decision.patch))
    return result


def test_no_skipped_pod_would_be_refused_or_warned_on() -> None:
    expression = compiled()
    parsed_all = [settings.from_mapping(c) for c in SOUND_SETTINGS]
    assert all(ordinary.unsound_reasons(p) == () for p in parsed_all)
    counts = {"skipped": 0, "sent": 0, "sent_and_refused_or_warned": 0}

    @hypothesis.settings(max_examples=2000, deadline=None, suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(
        obj=mixed_pods(), index=st.integers(0, len(SOUND_SETTINGS) - 1), lookup=st.sampled_from([None, _fetch_guarded])
    )
    def check(obj: dict[str, Any], index: int, lookup: Any) -> None:
        parsed = parsed_all[index]
        after = mutated(obj, parsed, lookup)
        decision = engine.evaluate(
            model.Request(operation="CREATE", object=after, namespace="team-a", env_lookup=lookup), settings=parsed
        )
        # A later mutating webhook may drop GPU103's keep-off affinity: a pod it leaves skipped must
        # hold no node power (a host port off the allowlist, ...), or nothing would refuse it.
        bare = copy.deepcopy(after)
        bare["spec"].pop("affinity", None)
        if not sent(expression, bare):
            assert not trustzone.has_node_power(bare["spec"]), obj
        if sent(expression, after):
            counts["sent"] += 1
            if not decision.allowed or decision.warnings or decision.violations:
                counts["sent_and_refused_or_warned"] += 1
            return
        counts["skipped"] += 1
        assert decision.allowed, (obj, decision)
        assert not decision.warnings and not decision.violations, (obj, decision)
        assert not decision.patch, (obj, decision)  # /mutate's output is a fixed point

    check()
    total = sum(counts[k] for k in ("skipped", "sent"))
    # The generator must exercise both sides: ordinary pods and pods a policy speaks about.
    assert counts["skipped"] >= total // 10, counts
    assert counts["sent_and_refused_or_warned"] >= total // 10, counts


# --- the review mark: /mutate switches the skip off while the settings make it unsound ---------------


@pytest.mark.parametrize("annotations", [None, {}, {"team": "ml"}])
def test_the_review_mark_makes_any_ordinary_pod_sent(condition: cel.Expression, annotations: dict[str, str] | None) -> None:
    obj = pod(annotations=annotations)
    assert not sent(condition, obj)
    mark = list(ordinary.review_mark(obj))
    marked = jsonpatch.apply_patch(copy.deepcopy(obj), mark)
    assert marked["metadata"]["annotations"] == {**(annotations or {}), ordinary.REVIEW_ANNOTATION: ordinary.REVIEW_VALUE}
    assert sent(condition, marked)
    assert ordinary.review_mark(marked) == ()  # a second pass adds nothing
    decision = engine.evaluate(
        model.Request(operation="CREATE", object=marked, namespace="team-a"), settings=settings.from_mapping({})
    )
    assert decision.allowed and not decision.violations and not decision.warnings  # no policy reads the mark


def test_the_review_mark_ignores_objects_without_metadata() -> None:
    assert ordinary.review_mark(None) == ()
    assert ordinary.review_mark({"kind": "Pod", "metadata": "x"}) == ()


def test_the_cached_reasons_follow_a_settings_change() -> None:
    quiet = settings.from_mapping({"policies": {"GPU104": {"action": "warn"}}})
    default = settings.from_mapping({})
    assert ordinary.cached_unsound_reasons(quiet) and not ordinary.cached_unsound_reasons(default)
    assert ordinary.cached_unsound_reasons(quiet)


def test_the_engine_properties_generator_agrees_too() -> None:
    """The engine-property generator's pods (malformed fields included, which kube-apiserver would
    have refused before this stage; a CEL error there counts as sent): no skipped pod is refused."""
    from tests.unit.policies.test_properties import objects  # noqa: PLC0415 - the other suite's generator

    expression = compiled()
    parsed = settings.from_mapping({})
    skipped = []

    @hypothesis.settings(max_examples=400, deadline=None, suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(obj=objects().filter(lambda o: o["kind"] == "Pod"))
    def check(obj: dict[str, Any]) -> None:
        after = mutated(obj, parsed, None)
        try:
            if sent(expression, after):
                return
        except cel.EvaluationError:
            return
        skipped.append(obj)
        decision = engine.evaluate(model.Request(operation="CREATE", object=after, namespace="team-a"), settings=parsed)
        assert decision.allowed and not decision.warnings and not decision.violations, (obj, decision)

    check()
    assert skipped  # the generator reaches the ordinary side at least sometimes
