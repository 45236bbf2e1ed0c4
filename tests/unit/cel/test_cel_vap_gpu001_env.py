"""GPU001's ValidatingAdmissionPolicy against the webhook on the environment routes.

The export may admit what the webhook refuses (where CEL cannot see as much) but never refuses what
the webhook admits. The apiserver runs the policy after the mutating webhooks, so each pod is
mutated by the engine first, as GPU104's `void` would be in the apiserver.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from policies import engine, model, settings
from tests.unit.cel.test_cel_vap_export import admits, exported, policy_named

GPU = {"resources": {"limits": {"aliyun.com/gpu-mem": 1}}}


def pod(*containers: dict[str, Any], init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": f"c{i}", "image": "app", **c} for i, c in enumerate(containers)]}
    if init:
        spec["initContainers"] = [{"name": f"i{i}", "image": "app", **c} for i, c in enumerate(init)]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"}, "spec": spec}


CASES: list[tuple[str, dict[str, Any], bool]] = [
    ("cgpu-disable", pod({**GPU, "env": [{"name": "CGPU_DISABLE", "value": "true"}]}), False),
    ("mem-container", pod({**GPU, "env": [{"name": "ALIYUN_COM_GPU_MEM_CONTAINER", "value": "15"}]}), False),
    (
        "isolation-from-config-map",
        pod({**GPU, "env": [{"name": "ALIYUN_COM_GPU_MEM_DEV", "valueFrom": {"configMapKeyRef": {"name": "m", "key": "k"}}}]}),
        False,
    ),
    ("sidecar-isolation", pod(GPU, init=[{"restartPolicy": "Always", "env": [{"name": "CGPU_DISABLE", "value": ""}]}]), False),
    ("prefix-nvidia", pod({**GPU, "envFrom": [{"prefix": "NVIDIA_", "configMapRef": {"name": "m"}}]}), False),
    ("prefix-n", pod({**GPU, "envFrom": [{"prefix": "N", "secretRef": {"name": "s"}}]}), False),
    ("prefix-cgpu", pod({**GPU, "envFrom": [{"prefix": "CGPU_", "configMapRef": {"name": "m"}}]}), False),
    ("prefix-c-without-gpu", pod({"envFrom": [{"prefix": "C", "configMapRef": {"name": "m"}}]}), False),
    (
        "value-from-void-source",
        pod({**GPU, "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {"name": "m", "key": "k"}}}]}),
        False,
    ),
    ("prefix-nvidia-without-gpu", pod({"envFrom": [{"prefix": "NVIDIA_", "configMapRef": {"name": "m"}}]}), True),
    (
        "prefix-nvidia-env-void",
        pod(
            {
                **GPU,
                "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}],
                "envFrom": [{"prefix": "NVIDIA_", "configMapRef": {"name": "m"}}],
            }
        ),
        True,
    ),
    ("prefix-app", pod({**GPU, "envFrom": [{"prefix": "APP_", "configMapRef": {"name": "m"}}]}), True),
    ("prefix-empty", pod({**GPU, "envFrom": [{"prefix": "", "configMapRef": {"name": "m"}}]}), True),
    ("no-prefix", pod({**GPU, "envFrom": [{"configMapRef": {"name": "m"}}, {"secretRef": {"name": "s"}}]}), True),
    (
        "look-alikes",
        pod({**GPU, "env": [{"name": "cgpu_disable", "value": "1"}, {"name": "CUDA_VISIBLE_DEVICES", "value": "0"}]}),
        True,
    ),
]


@pytest.mark.parametrize(("name", "obj", "webhook_admits"), CASES, ids=[c[0] for c in CASES])
def test_the_export_agrees_with_the_webhook(name: str, obj: dict[str, Any], webhook_admits: bool) -> None:
    decision = engine.evaluate(model.Request(operation="CREATE", object=obj, namespace="team-a"), settings=settings.Settings())
    gpu001 = next(r for r in decision.results if r.policy == "GPU001")
    assert (gpu001.result is not model.Result.FAIL) is webhook_admits, name
    mutated = jsonpatch.apply_patch(copy.deepcopy(obj), list(decision.patch))

    assert admits(policy_named(exported(), "gpu-admission-gpu001"), mutated) is webhook_admits
