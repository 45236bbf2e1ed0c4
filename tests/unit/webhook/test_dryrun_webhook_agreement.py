"""Property: dry-run and the webhook agree on every object (verdict, patch, denial message, warnings)."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import jsonpatch
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from policies import settings as engine_settings
from webhook.admission import response
from webhook.cmdline import manifests
from webhook.commands import dryrun

GPU_RESOURCES = ("nvidia.com/gpu", "aliyun.com/gpu-mem", "aliyun.com/gpu-core.percentage", "aliyun.com/gpu", "cpu")
MODES = ("default", "cgpu", "core_mem", "share", "mps", "topology", "bogus")

# Mostly well-formed so that mutation paths get exercised too; sometimes malformed (GPU004).
valid_quantities = st.one_of(st.integers(min_value=1, max_value=8), st.sampled_from(["1", "2", "50"]))
quantities = st.one_of(valid_quantities, valid_quantities, valid_quantities, st.sampled_from([0, -1, 101, "0.5", "abc"]))
limits = st.dictionaries(st.sampled_from(GPU_RESOURCES), quantities, max_size=1)
env_values = st.sampled_from(["all", "void", "none", "0", "0,1", "GPU-4b6c", ""])
env = st.lists(
    st.one_of(
        st.builds(lambda v: {"name": "NVIDIA_VISIBLE_DEVICES", "value": v}, env_values),
        st.just({"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {"name": "gpu", "key": "devices"}}}),
        st.just({"name": "PASSWORD", "value": "mypassw0rdv"}),
    ),
    max_size=1,
)


@st.composite
def containers(draw: st.DrawFn, name: str) -> dict[str, Any]:
    container: dict[str, Any] = {"name": name, "image": "registry.example/app:1"}
    chosen = draw(limits)
    if chosen:
        container["resources"] = {"limits": chosen}
        if draw(st.booleans()):
            container["resources"]["requests"] = dict(chosen)
    if draw(st.booleans()) and (variables := draw(env)):
        container["env"] = variables
    if not draw(st.integers(min_value=0, max_value=4)):
        container["envFrom"] = [{"prefix": draw(st.sampled_from(["", "NVIDIA_", "APP_"])), "configMapRef": {"name": "settings"}}]
    privileged = draw(st.sampled_from([None, None, None, True, False]))
    if privileged is not None:
        container["securityContext"] = {"privileged": privileged}
    return container


@st.composite
def pod_specs(draw: st.DrawFn) -> dict[str, Any]:
    count = draw(st.integers(min_value=1, max_value=3))
    spec: dict[str, Any] = {"containers": [draw(containers(f"c{i}")) for i in range(count)]}
    if draw(st.booleans()):
        spec["initContainers"] = [draw(containers("init"))]
    if draw(st.booleans()):
        spec["nodeSelector"] = {"ack.node.gpu.schedule": draw(st.sampled_from(MODES))}
    if not draw(st.integers(min_value=0, max_value=3)):
        path = draw(st.sampled_from(["/dev", "/dev/nvidia0", "/run/nvidia", "/var/lib/kubelet/device-plugins", "/data", "/"]))
        spec["volumes"] = [{"name": "host", "hostPath": {"path": path}}]
    if draw(st.booleans()):
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "ack.node.gpu.schedule", "operator": "In", "values": [draw(st.sampled_from(MODES))]}
                            ]
                        }
                    ]
                }
            }
        }
    return spec


@st.composite
def objects(draw: st.DrawFn) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "generated"}
    namespace = draw(st.sampled_from([None, "default", "team-a", "kube-system"]))
    if namespace is not None:
        metadata["namespace"] = namespace
    annotations = draw(
        st.dictionaries(
            st.sampled_from(
                ["gpu-admission.io/gpu-model", "gpu-admission.io/exclude-gpu-model", "gpu-admission.io/min-gpu-memory"]
            ),
            st.sampled_from(["Tesla-V100-SXM2-32GB", "Tesla-M40", "12000", "lots"]),
            max_size=2,
        )
    )
    spec = draw(pod_specs())
    kind = draw(st.sampled_from(["Pod", "Pod", "Deployment", "Job"]))
    if kind == "Pod":
        if annotations:
            metadata["annotations"] = annotations
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
    template: dict[str, Any] = {"metadata": {"labels": {"app": "generated"}}, "spec": spec}
    if annotations:
        template["metadata"]["annotations"] = annotations
    api_version = "apps/v1" if kind == "Deployment" else "batch/v1"
    return {"apiVersion": api_version, "kind": kind, "metadata": metadata, "spec": {"template": template}}


def _decoded_patch(answer: dict[str, Any]) -> list[Any]:
    patch = answer["response"].get("patch")
    return json.loads(base64.b64decode(patch)) if patch else []


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(obj=objects())
async def test_dry_run_and_webhook_agree_on_every_object(webhook: Any, make_review: Any, obj: dict[str, Any]) -> None:
    client = webhook  # one server for all examples: the app keeps no state between reviews
    (document,) = manifests.parse(yaml.safe_dump(obj), name="generated.yaml")
    (outcome,) = dryrun.evaluate([document], settings=engine_settings.Settings())
    (offline,) = dryrun.report([outcome])["results"]

    # kube-apiserver fills in the namespace a namespaced object is created in.
    review = make_review(obj, namespace=offline["namespace"])
    async with client.post("/mutate", json=review) as answer:
        mutated = await answer.json()
    # kube-apiserver sends /validate the object every mutating webhook has patched: it is judged as stored.
    stored = copy.deepcopy(review)
    stored["request"]["object"] = jsonpatch.apply_patch(obj, _decoded_patch(mutated))
    async with client.post("/validate", json=stored) as answer:
        validated = await answer.json()

    event(f"allowed={offline['allowed']} patched={bool(offline['patch'])}")
    assert validated["response"]["allowed"] is offline["allowed"]
    assert _decoded_patch(mutated) == offline["patch"]
    enforced = [v["message"] for v in offline["violations"] if v["action"] == "enforce"]
    if not offline["allowed"]:
        assert validated["response"]["status"] == {"code": 403, "message": "; ".join(enforced)}
    assert validated["response"].get("warnings", []) == response.bounded_warnings(outcome.decision.warnings)
