"""deploy/components/usage-limits: the labeler reads usageLimits, may create Events and evictions and
nothing more, and its evictions go to the webhook's node check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from policies import settings
from webhook.admission import evictions

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
COMPONENT = DEPLOY / "components" / "usage-limits"


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_the_labeler_reads_the_settings_config_map_with_usage_limits() -> None:
    component = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    assert component["kind"] == "Component" and component["resources"] == ["rbac.yaml"]
    patches = [yaml.safe_load(p["patch"]) for p in component["patches"]]
    [arg] = [op["value"] for ops in patches if isinstance(ops, list) for op in ops if op["path"].endswith("/args/-")]
    assert arg == "--usage-limits=/etc/gpu-admission/config/config.yaml"
    [merge] = [p for p in patches if isinstance(p, dict)]
    spec = merge["spec"]["template"]["spec"]
    assert spec["containers"][0]["volumeMounts"] == [
        {"name": "usage-limits", "mountPath": "/etc/gpu-admission/config", "readOnly": True}
    ]
    [config_map] = [d for d in documents(DEPLOY / "policy-config.yaml") if d["kind"] == "ConfigMap"]
    assert spec["volumes"] == [{"name": "usage-limits", "configMap": {"name": config_map["metadata"]["name"]}}]
    # The shipped settings parse, and the labeler's own reader takes them (observe everywhere).
    document = yaml.safe_load(config_map["data"]["config.yaml"])
    assert settings.usage_limits_of(document) == () and settings.from_mapping(document).usage_limits == ()


def test_the_labeler_gets_events_and_evictions_only_and_the_webhook_get_on_pods() -> None:
    objects = {(d["kind"], d["metadata"]["name"]): d for d in documents(COMPONENT / "rbac.yaml")}
    labeler_rules = objects[("ClusterRole", "gpu-admission-labeler-usage-limits")]["rules"]
    assert [(r["apiGroups"], r["resources"], r["verbs"]) for r in labeler_rules] == [
        ([""], ["events"], ["create"]),
        ([""], ["pods/eviction"], ["create"]),
    ]
    assert objects[("ClusterRoleBinding", "gpu-admission-labeler-usage-limits")]["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpu-admission-labeler", "namespace": "gpu-admission"}
    ]
    webhook_rules = objects[("ClusterRole", "gpu-admission-webhook-eviction-guard")]["rules"]
    assert [(r["resources"], r["verbs"]) for r in webhook_rules] == [(["pods"], ["get"])]


def test_the_labelers_evictions_go_to_the_node_check_and_fail_closed() -> None:
    component = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    [entry] = [
        op["value"]
        for p in component["patches"]
        if p["target"]["kind"] == "ValidatingWebhookConfiguration"
        for op in yaml.safe_load(p["patch"])
    ]
    assert entry["clientConfig"]["service"]["path"] == "/validate-eviction" and entry["failurePolicy"] == "Fail"
    assert entry["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods/eviction"],
            "scope": "Namespaced",
        }
    ]
    [condition] = entry["matchConditions"]
    assert condition["expression"] == f"request.userInfo.username == '{evictions.LABELER_USER}'"
    [configuration] = [
        d for d in documents(DEPLOY / "webhook-configurations.yaml") if d["kind"] == "ValidatingWebhookConfiguration"
    ]
    assert component["patches"][-1]["target"]["name"] == configuration["metadata"]["name"]  # its caBundle is kept by the webhook
