"""PolicyViolation Events through the real apiserver: a denied workload gets one Event in its
namespace naming the policy; repeats within the rate-limit window add none; allowed objects and
server-side dry runs get none; the refusal reaches kubectl unchanged."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.e2e import harness
from tests.e2e.harness import Cluster, eventually

pytestmark = pytest.mark.e2e


def deployment(name: str, *, env: dict[str, str] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "registry.example/app:1"}
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return harness.deployment(name, {"containers": [container]}, app=name)


def policy_events(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    completed = cluster.kubectl("get", "events", "-n", namespace, "-o", "json", "--field-selector", "reason=PolicyViolation")
    assert completed.returncode == 0, completed.stderr
    items: list[dict[str, Any]] = json.loads(completed.stdout)["items"]
    return items


def test_a_denied_deployment_gets_one_rate_limited_event_naming_the_policy(cluster: Cluster) -> None:
    ns = cluster.namespace()
    sneaky = deployment("sneaky", env={"NVIDIA_VISIBLE_DEVICES": "all"})
    started = time.monotonic()
    refused = cluster.apply(sneaky, namespace=ns)
    assert refused.returncode != 0 and "GPU001" in refused.stderr
    assert time.monotonic() - started < 10
    eventually(lambda: len(policy_events(cluster, ns)) == 1, what="the PolicyViolation event", timeout=30)
    (event,) = policy_events(cluster, ns)
    assert event["type"] == "Warning" and event["source"]["component"] == "gpu-admission"
    assert {k: event["involvedObject"].get(k) for k in ("kind", "name", "namespace")} == {
        "kind": "Deployment",
        "name": "sneaky",
        "namespace": ns,
    }
    assert event["message"].startswith("CREATE denied by GPU001: ")
    # kubectl finds it by the object's name, as `kubectl get events --field-selector involvedObject.name=...`
    by_name = cluster.kubectl("get", "events", "-n", ns, "--field-selector", "involvedObject.name=sneaky", "-o", "name")
    assert by_name.returncode == 0 and by_name.stdout.strip()

    for _ in range(3):  # the same refusal again within a minute: still refused, no new event
        again = cluster.apply(sneaky, namespace=ns)
        assert again.returncode != 0 and "GPU001" in again.stderr
    plain = cluster.apply(deployment("plain"), namespace=ns)
    assert plain.returncode == 0, plain.stderr
    dry = cluster.kubectl(
        "apply", "-n", ns, "--dry-run=server", "-f", "-", stdin=json.dumps(deployment("dry", env={"NVIDIA_VISIBLE_DEVICES": "0"}))
    )
    assert dry.returncode != 0 and "GPU001" in dry.stderr
    # a later, different refusal in the same namespace is written (the writer is alive), and only it
    other = cluster.apply(deployment("other", env={"NVIDIA_VISIBLE_DEVICES": "1"}), namespace=ns)
    assert other.returncode != 0
    eventually(lambda: len(policy_events(cluster, ns)) == 2, what="the second object's event", timeout=30)
    assert sorted(e["involvedObject"]["name"] for e in policy_events(cluster, ns)) == ["other", "sneaky"]
    cluster.kubectl("delete", "namespace", ns, "--wait=false")
