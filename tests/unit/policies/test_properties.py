"""Properties of the engine over generated pods and workloads, well formed or not.

- evaluate never raises, and no policy crashes (an ERROR result would hide a bug behind the guard);
- every patch is add-only and applies cleanly with jsonpatch;
- a second pass over the patched object adds nothing and reaches the same verdict;
- allowed is False exactly when some violation acts `enforce`;
- a user's nodeSelector entries survive the patch.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

import hypothesis
import jsonpatch
from hypothesis import strategies as st

from policies import engine, model, settings
from tests.unit.policies.conftest import WORKLOAD_TEMPLATE_PATHS

PROPERTY_SETTINGS = hypothesis.settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[hypothesis.HealthCheck.too_slow, hypothesis.HealthCheck.data_too_large],
)

GPU_KEYS = [
    "nvidia.com/gpu",
    "aliyun.com/gpu-mem",
    "aliyun.com/gpu-count",
    "aliyun.com/gpu-core.percentage",
    "aliyun.com/gpu",
]
NODE_KEYS = [
    "ack.node.gpu.schedule",
    "aliyun.accelerator/nvidia_name",
    "gpu-admission.io/gpu-memory-mib",
    "topology.kubernetes.io/zone",
]
MODES = ["default", "cgpu", "core_mem", "share", "mps", "topology", "bogus"]

garbage = st.one_of(st.none(), st.integers(-3, 3), st.text(max_size=3), st.booleans(), st.just([1]))
quantity = st.one_of(st.integers(-1, 150), st.sampled_from(["1", "2", "100", "0", "1.5", "abc", "3Gi"]), st.floats(0, 3), garbage)
resource_map = st.dictionaries(st.sampled_from([*GPU_KEYS, "cpu"]), quantity, max_size=3)
# Weighted towards well-formed GPU requests, so that the mutators and GPU005 have work to do.
gpu_limits = st.fixed_dictionaries(
    {"limits": st.dictionaries(st.sampled_from(GPU_KEYS[:2] + GPU_KEYS[3:]), st.integers(1, 4), min_size=1, max_size=2)}
)
resources = st.one_of(
    gpu_limits,
    gpu_limits,
    st.fixed_dictionaries({}, optional={"limits": st.one_of(resource_map, garbage), "requests": resource_map}),
    garbage,
)
env_value = st.sampled_from(["all", "void", "none", "NONE", "0,1", ""])
env_entry = st.one_of(
    st.fixed_dictionaries(
        {"name": st.sampled_from(["NVIDIA_VISIBLE_DEVICES", "LOG_LEVEL"])},
        optional={
            "value": env_value,
            "valueFrom": st.one_of(
                st.fixed_dictionaries({"configMapKeyRef": st.fixed_dictionaries({"name": st.just("cm"), "key": st.just("k")})}),
                garbage,
            ),
        },
    ),
    garbage,
)
env_from_entry = st.fixed_dictionaries(
    {},
    optional={
        "prefix": st.one_of(st.sampled_from(["", "NVIDIA_", "APP_", "NVIDIA_VISIBLE_DEVICES"]), garbage),
        "configMapRef": st.one_of(st.fixed_dictionaries({"name": st.just("cm")}), garbage),
        "secretRef": st.fixed_dictionaries({"name": st.just("s")}),
    },
)
container = st.fixed_dictionaries(
    {"name": st.sampled_from(["main", "side", "debug", "init"])},
    optional={
        "resources": resources,
        "env": st.one_of(st.lists(env_entry, max_size=3), garbage),
        "envFrom": st.one_of(st.lists(env_from_entry, max_size=2), garbage),
        "securityContext": st.one_of(
            st.fixed_dictionaries({"privileged": st.booleans()}),
            st.fixed_dictionaries({"privileged": garbage}),
            garbage,
        ),
    },
)
containers = st.one_of(
    st.lists(container, min_size=1, max_size=3),
    st.lists(st.one_of(container, garbage), max_size=3),
    garbage,
)
expression = st.one_of(
    st.fixed_dictionaries(
        {
            "key": st.sampled_from(NODE_KEYS),
            "operator": st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Odd"]),
        },
        optional={"values": st.one_of(st.lists(st.sampled_from([*MODES, "A10", "5"]), max_size=2), garbage)},
    ),
    garbage,
)
term = st.one_of(
    st.fixed_dictionaries({}, optional={"matchExpressions": st.one_of(st.lists(expression, max_size=3), garbage)}),
    garbage,
)
affinity = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "nodeAffinity": st.one_of(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "requiredDuringSchedulingIgnoredDuringExecution": st.one_of(
                            st.fixed_dictionaries(
                                {}, optional={"nodeSelectorTerms": st.one_of(st.lists(term, max_size=3), garbage)}
                            ),
                            garbage,
                        ),
                        "preferredDuringSchedulingIgnoredDuringExecution": st.lists(
                            st.fixed_dictionaries({"weight": st.just(1), "preference": term}), max_size=1
                        ),
                    },
                ),
                garbage,
            ),
            "podAntiAffinity": st.just({}),
        },
    ),
    garbage,
)
node_selector = st.one_of(
    st.dictionaries(st.sampled_from(NODE_KEYS), st.one_of(st.sampled_from(MODES), garbage), max_size=2), garbage
)
volume = st.one_of(
    st.fixed_dictionaries(
        {"name": st.just("v")},
        optional={
            "hostPath": st.one_of(
                st.fixed_dictionaries(
                    {
                        "path": st.one_of(
                            st.sampled_from(["/dev", "/dev/shm", "/tmp", "/var/lib/kubelet/", "/run/../dev"]), garbage
                        )
                    }
                ),
                garbage,
            )
        },
    ),
    garbage,
)
pod_spec = st.fixed_dictionaries(
    {"containers": containers},
    optional={
        "initContainers": st.lists(container, max_size=2),
        "ephemeralContainers": st.lists(container, max_size=1),
        "nodeSelector": node_selector,
        "affinity": affinity,
        "volumes": st.one_of(st.lists(volume, max_size=2), garbage),
        "schedulerName": st.one_of(st.sampled_from(["", "default-scheduler", "volcano"]), garbage),
        "nodeName": st.one_of(st.sampled_from(["", "gpu-0"]), garbage),
    },
)
annotation_maps = st.one_of(
    st.dictionaries(
        st.sampled_from(
            [
                "gpu-admission.io/gpu-model",
                "gpu-admission.io/exclude-gpu-model",
                "gpu-admission.io/min-gpu-memory",
                "team",
                "ALIYUN_COM_GPU_MEM_IDX",
                "gpu-admission.io/allocation",
            ]
        ),
        st.one_of(st.sampled_from(["A10", "Tesla V100, T4", "", ",", "16Gi", "16384", "lots", "a/b"]), garbage),
        max_size=3,
    ),
    garbage,
)
metadata = st.fixed_dictionaries({"name": st.just("app")}, optional={"annotations": annotation_maps})


@st.composite
def objects(draw: st.DrawFn) -> dict[str, Any]:
    """A Pod or a workload around a generated pod spec."""
    kind = draw(st.sampled_from(["Pod", *WORKLOAD_TEMPLATE_PATHS]))
    spec, meta = draw(pod_spec), draw(metadata)
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    root: dict[str, Any] = {"kind": kind, "metadata": {"name": "app"}}
    node = root
    tokens = WORKLOAD_TEMPLATE_PATHS[kind]
    for token in tokens[:-1]:
        node = node.setdefault(token, {})
    node[tokens[-1]] = {"metadata": meta, "spec": spec}
    return root


CONFIGS: list[dict[str, Any]] = [
    {},
    {"gpuSchedulerName": "gpu-scheduler", "keepNonGpuPodsOffGpuNodes": True},
    {"defaultSharedMode": "share", "policies": {"GPU001": {"action": "warn"}, "GPU004": {"action": "audit"}}},
    {"policies": {"GPU104": {"action": "warn"}, "GPU101": {"action": "audit"}, "GPU002": {"action": "off"}}},
]
configs = st.sampled_from([settings.from_mapping(c) for c in CONFIGS])
lookups = st.sampled_from([None, lambda source: {"k": "all", "NVIDIA_VISIBLE_DEVICES": "void"}, lambda source: None])


def run(obj: Mapping[str, Any], parsed: settings.Settings, lookup: Any, **kwargs: Any) -> model.Decision:
    request = model.Request(operation="CREATE", object=obj, namespace="team-a", env_lookup=lookup, **kwargs)
    return engine.evaluate(request, settings=parsed)


def assert_consistent(decision: model.Decision) -> None:
    assert all(r.result is not model.Result.ERROR for r in decision.results), decision.results
    assert all(v.policy != "engine" for v in decision.violations), decision.violations
    enforced = any(v.action is model.Action.ENFORCE for v in decision.violations)
    assert decision.allowed is not enforced
    assert all(op["op"] == "add" for op in decision.patch)


def template_spec(obj: Mapping[str, Any]) -> Any:
    node: Any = obj
    tokens = ("spec",) if obj["kind"] == "Pod" else (*WORKLOAD_TEMPLATE_PATHS[obj["kind"]], "spec")
    for token in tokens:
        node = node.get(token) if isinstance(node, Mapping) else None
    return node


def unaliased(obj: Any) -> Any:
    """A copy that shares no list or dict between two places, as every object decoded from JSON is.

    Generated garbage can put one list object in several fields; `copy.deepcopy` keeps that aliasing,
    and a patch appending to one of them would then change the others too.
    """
    return json.loads(json.dumps(obj))


@PROPERTY_SETTINGS
@hypothesis.given(obj=objects(), parsed=configs, lookup=lookups)
def test_evaluation_is_total_add_only_and_idempotent(
    obj: dict[str, Any], parsed: settings.Settings, lookup: model.EnvLookup | None
) -> None:
    obj = unaliased(obj)
    original = copy.deepcopy(obj)

    decision = run(obj, parsed, lookup)

    assert obj == original  # the request object is never modified
    assert_consistent(decision)
    result = jsonpatch.apply_patch(copy.deepcopy(obj), list(decision.patch))
    again = run(result, parsed, lookup)
    assert_consistent(again)
    assert again.patch == ()
    assert again.allowed is decision.allowed
    before, after = template_spec(obj), template_spec(result)
    if isinstance(before, Mapping) and isinstance(before.get("nodeSelector"), Mapping):
        assert before["nodeSelector"].items() <= after["nodeSelector"].items()


@PROPERTY_SETTINGS
@hypothesis.given(spec=pod_spec, added=st.lists(container, min_size=1, max_size=2), parsed=configs)
def test_ephemeral_container_updates_only_touch_the_new_ephemeral_containers(
    spec: dict[str, Any], added: list[dict[str, Any]], parsed: settings.Settings
) -> None:
    old = {"kind": "Pod", "metadata": {"name": "app"}, "spec": spec}
    old = unaliased(old)
    new = copy.deepcopy(old)
    existing = spec.get("ephemeralContainers") or []
    fresh = [dict(c, name=f"new-{i}") for i, c in enumerate(added)]
    new["spec"]["ephemeralContainers"] = [*existing, *fresh]

    decision = run(new, parsed, None, old_object=old, subresource="ephemeralcontainers")

    assert_consistent(decision)
    first_new = len(existing)
    for op in decision.patch:
        index = int(op["path"].split("/")[3])
        assert op["path"].startswith("/spec/ephemeralContainers/") and index >= first_new
    result = jsonpatch.apply_patch(copy.deepcopy(new), list(decision.patch))
    again = run(result, parsed, None, old_object=old, subresource="ephemeralcontainers")
    assert again.patch == ()
