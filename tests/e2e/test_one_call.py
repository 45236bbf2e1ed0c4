"""An ordinary pod costs kube-apiserver one webhook call: the validating webhook's match condition
`pod-create-not-ordinary` (policies/ordinary.py) skips /validate for it, evaluated inside the real
apiserver on the pod after /mutate. Calls are counted in the webhook's own log (one line per review,
`endpoint=<mutate|validate> CREATE Pod/<name> ns=<namespace>`)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from policies import ordinary
from policies.trustzone import DEFAULT_ZONE
from tests.e2e.harness import Cluster, eventually, webhook_settings

pytestmark = pytest.mark.e2e


def pod(name: str, **container: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "registry.example/app:1", **container}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def calls(cluster: Cluster, *, name: str, namespace: str) -> dict[str, int]:
    log = (cluster.state.directory / "logs" / "webhook.log").read_text(errors="replace")
    return {
        endpoint: len(re.findall(rf"endpoint={endpoint} CREATE Pod/{re.escape(name)} ns={re.escape(namespace)} ", log))
        for endpoint in ("mutate", "validate")
    }


def settled(cluster: Cluster, *, name: str, namespace: str, mutate: int, validate: int) -> None:
    # Log lines may land a moment after the answer; wait for the expected counts, then hold them.
    eventually(
        lambda: calls(cluster, name=name, namespace=namespace) == {"mutate": mutate, "validate": validate},
        what=f"{name}: {mutate} mutate and {validate} validate calls, got {calls(cluster, name=name, namespace=namespace)}",
        timeout=20,
    )


def test_an_ordinary_pod_reaches_the_webhook_once_and_is_mutated(cluster: Cluster) -> None:
    ns = cluster.namespace()
    completed = cluster.apply(pod("plain"), namespace=ns)
    assert completed.returncode == 0, completed.stderr
    stored = cluster.get("pod", "plain", namespace=ns)
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in stored["spec"]["containers"][0]["env"]
    settled(cluster, name="plain", namespace=ns, mutate=1, validate=0)


def test_a_gpu_pod_reaches_it_twice(cluster: Cluster) -> None:
    ns = cluster.namespace()
    completed = cluster.apply(pod("gpu", resources={"limits": {"nvidia.com/gpu": 1}}), namespace=ns)
    assert completed.returncode == 0, completed.stderr
    settled(cluster, name="gpu", namespace=ns, mutate=1, validate=1)


def test_a_pod_made_non_ordinary_by_a_host_port_alone_is_still_judged(cluster: Cluster) -> None:
    # The kubelet's read-only port and nothing else: sent to /validate (so a later webhook that
    # dropped the keep-off affinity would be seen there), admitted and kept off GPU nodes. A
    # containerPort alone stays ordinary. (Not 10250: test_trust_zone's CPU Deployment takes that
    # port on the CPU node of the same cluster.)
    ns = cluster.namespace()
    completed = cluster.apply(pod("squatter", ports=[{"containerPort": 80, "hostPort": 10255}]), namespace=ns)
    assert completed.returncode == 0, completed.stderr
    assert "GPU103: pods that use no GPU but have node power are kept off GPU nodes" in completed.stderr
    settled(cluster, name="squatter", namespace=ns, mutate=1, validate=1)
    stored = cluster.get("pod", "squatter", namespace=ns)
    terms = stored["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [dict(e) for e in DEFAULT_ZONE.keep_off]}]
    web = pod("web", ports=[{"containerPort": 80}])
    # A preferred term the condition reads (and finds no GPU node label in) on the way.
    web["spec"]["affinity"] = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 1,
                    "preference": {
                        "matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]
                    },
                }
            ]
        }
    }
    plain = cluster.apply(web, namespace=ns)
    assert plain.returncode == 0, plain.stderr
    settled(cluster, name="web", namespace=ns, mutate=1, validate=0)
    # Free the CPU node's port for the tests after this one.
    deleted = cluster.kubectl("delete", "pod", "squatter", "-n", ns, "--grace-period=0", "--force")
    assert deleted.returncode == 0, deleted.stderr


def test_a_pod_made_non_ordinary_by_a_host_path_alone_is_still_judged(cluster: Cluster) -> None:
    ns = cluster.namespace()
    manifest = pod("runner", volumeMounts=[{"name": "run", "mountPath": "/host-run"}])
    manifest["spec"]["volumes"] = [{"name": "run", "hostPath": {"path": "/run"}}]
    completed = cluster.apply(manifest, namespace=ns)
    # Without GPUs it is admitted and kept off GPU nodes, which the validation checks (it is sent).
    assert completed.returncode == 0, completed.stderr
    assert "GPU103: pods that use no GPU but have node power are kept off GPU nodes" in completed.stderr
    settled(cluster, name="runner", namespace=ns, mutate=1, validate=1)
    stored = cluster.pod_once(
        "runner", namespace=ns, condition=lambda found: bool(found["spec"].get("nodeName")), what="runner scheduled"
    )
    terms = stored["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [dict(e) for e in DEFAULT_ZONE.keep_off]}]
    assert stored["spec"]["nodeName"] == "cpu-0"  # the only node without GPUs in the default node set
    asking = pod(
        "gpu-runner", volumeMounts=[{"name": "run", "mountPath": "/host-run"}], resources={"limits": {"aliyun.com/gpu-mem": 1}}
    )
    asking["spec"]["volumes"] = [{"name": "run", "hostPath": {"path": "/run"}}]
    refused = cluster.apply(asking, namespace=ns)
    assert refused.returncode != 0
    assert 'admission webhook "validate.gpu-admission.io" denied the request' in refused.stderr
    assert "GPU003" in refused.stderr
    settled(cluster, name="gpu-runner", namespace=ns, mutate=1, validate=1)


def test_a_pod_made_non_ordinary_by_its_environment_alone_is_still_refused(cluster: Cluster) -> None:
    ns = cluster.namespace()
    completed = cluster.apply(pod("isolation", env=[{"name": "CGPU_DISABLE", "value": "true"}]), namespace=ns)
    assert completed.returncode != 0
    assert "GPU001" in completed.stderr
    assert cluster.pods(namespace=ns) == []


def test_settings_that_make_the_skip_unsound_switch_it_off_through_the_mutation(cluster: Cluster, tmp_path: Path) -> None:
    # GPU104 acting warn reports at validation only; /mutate then marks every pod so it is sent.
    with webhook_settings(cluster, {"policies": {"GPU104": {"action": "warn"}}}, directory=tmp_path):
        ns = cluster.namespace()
        completed = cluster.apply(pod("quiet"), namespace=ns)
        assert completed.returncode == 0, completed.stderr
        assert "GPU104" in completed.stderr  # the warning the skip would have lost
        stored = cluster.get("pod", "quiet", namespace=ns)
        assert stored["metadata"]["annotations"][ordinary.REVIEW_ANNOTATION] == ordinary.REVIEW_VALUE
        settled(cluster, name="quiet", namespace=ns, mutate=1, validate=1)


def test_a_large_ordinary_pod_is_still_admitted_within_the_conditions_cost_budget(cluster: Cluster) -> None:
    # The condition walks every env entry; a CEL cost overrun would refuse the pod (failurePolicy Fail).
    ns = cluster.namespace()
    env = [{"name": f"SETTING_{i}", "value": "x"} for i in range(8000)]
    manifest = pod("large", env=env)
    manifest["spec"]["initContainers"] = [
        {"name": f"init{i}", "image": "registry.example/app:1", "env": env[:2000]} for i in range(4)
    ]
    completed = cluster.kubectl("create", "--dry-run=server", "-n", ns, "-f", "-", stdin=json.dumps(manifest))
    assert completed.returncode == 0, completed.stderr[-2000:]
