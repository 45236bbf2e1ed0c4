"""deploy/: the webhook Deployment is hardened and highly available, its RBAC minimal, the kustomize
base complete, and every argument in the manifests one the CLI accepts."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook import cli, config
from webhook.certificates import provision

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
COMPONENT = DEPLOY / "overlays" / "cert-manager"


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.fixture(scope="module")
def webhook() -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in documents(DEPLOY / "webhook.yaml")}


def deployment(objects: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    return objects[("Deployment", provision.SERVICE)]


def pod_spec(objects: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment(objects)["spec"]["template"]["spec"]
    return spec


def serve_args(args: list[str]) -> argparse.Namespace:
    """Parse a container's args with the real CLI parser ($(VAR) references stand for strings)."""
    return cli.make_parser().parse_args(args)


def test_the_webhook_runs_at_least_two_replicas_spread_over_nodes_with_a_disruption_budget(
    webhook: dict[tuple[str, str], dict[str, Any]],
) -> None:
    spec = deployment(webhook)["spec"]
    assert spec["replicas"] >= 2
    assert spec["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    terms = pod_spec(webhook)["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert terms[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert terms[0]["podAffinityTerm"]["labelSelector"] == spec["selector"]
    budget = webhook[("PodDisruptionBudget", provision.SERVICE)]["spec"]
    assert budget["selector"] == spec["selector"] and budget["maxUnavailable"] == 1


def test_the_container_is_non_root_read_only_without_capabilities_and_with_the_runtime_seccomp_profile(
    webhook: dict[tuple[str, str], dict[str, Any]],
) -> None:
    spec = pod_spec(webhook)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == 65532  # the Dockerfile's user
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = spec["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"], "a writable /tmp for the TLS pair file"


def test_probes_use_readyz_and_healthz_over_https_on_the_serving_port(webhook: dict[tuple[str, str], dict[str, Any]]) -> None:
    (container,) = pod_spec(webhook)["containers"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "https", "scheme": "HTTPS"}
    assert container["ports"] == [{"name": "https", "containerPort": 8443, "protocol": "TCP"}]
    service = webhook[("Service", provision.SERVICE)]["spec"]
    assert service["ports"][0]["port"] == 443 and service["ports"][0]["targetPort"] == "https"
    assert service["selector"] == deployment(webhook)["spec"]["selector"]["matchLabels"]


def test_the_args_are_self_managed_certificates_for_the_service_the_configurations_call(
    webhook: dict[tuple[str, str], dict[str, Any]],
) -> None:
    (container,) = pod_spec(webhook)["containers"]
    args = serve_args(container["args"])
    assert args.self_managed_certs and args.tls_cert_file is None
    assert (args.certs_secret, args.service, args.webhook_configuration) == (
        provision.SECRET,
        provision.SERVICE,
        provision.WEBHOOK_CONFIGURATION,
    )
    assert args.namespace == "$(POD_NAMESPACE)" and {e["name"] for e in container["env"]} >= {"POD_NAME", "POD_NAMESPACE"}
    assert args.port == 8443
    for configuration in documents(DEPLOY / "webhook-configurations.yaml"):
        assert configuration["metadata"]["name"] == args.webhook_configuration
        for hook in configuration["webhooks"]:
            assert hook["clientConfig"]["service"]["name"] == args.service
            assert hook["clientConfig"]["service"]["namespace"] == "gpu-admission"


def test_the_grace_period_covers_both_drain_phases_and_requests_in_flight(webhook: dict[tuple[str, str], dict[str, Any]]) -> None:
    (container,) = pod_spec(webhook)["containers"]
    args = serve_args(container["args"])
    assert args.drain_seconds > 0 and args.drain_idle_seconds > 90, "longer than kube-apiserver's 90 s idle timeout"
    assert pod_spec(webhook)["terminationGracePeriodSeconds"] > args.drain_seconds + args.drain_idle_seconds + 5


def test_rbac_grants_only_the_secret_the_lease_and_the_two_configurations_by_name(
    webhook: dict[tuple[str, str], dict[str, Any]],
) -> None:
    role = webhook[("Role", provision.SERVICE)]
    rules = {(r["apiGroups"][0], r["resources"][0], tuple(r.get("resourceNames", ()))): sorted(r["verbs"]) for r in role["rules"]}
    assert rules == {
        ("", "secrets", ()): ["create"],
        ("", "secrets", (provision.SECRET,)): ["get", "update"],
        ("coordination.k8s.io", "leases", ()): ["create"],
        ("coordination.k8s.io", "leases", (provision.LEASE,)): ["get", "update"],
    }
    [cluster_rule] = webhook[("ClusterRole", provision.SERVICE)]["rules"]
    assert cluster_rule == {
        "apiGroups": ["admissionregistration.k8s.io"],
        "resources": ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"],
        "resourceNames": [provision.WEBHOOK_CONFIGURATION],
        "verbs": ["get", "update"],
    }
    account = pod_spec(webhook)["serviceAccountName"]
    for kind, name in (
        ("RoleBinding", provision.SERVICE),
        ("ClusterRoleBinding", provision.SERVICE),
        ("ClusterRoleBinding", CONTEXT),
    ):
        binding = webhook[(kind, name)]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "gpu-admission"}]


CONTEXT = "gpu-admission-webhook-context"


def test_the_cluster_context_reads_namespaces_and_config_maps_but_no_secrets(
    webhook: dict[tuple[str, str], dict[str, Any]],
) -> None:
    rules = {(r["apiGroups"][0], tuple(r["resources"])): sorted(r["verbs"]) for r in webhook[("ClusterRole", CONTEXT)]["rules"]}
    assert rules == {
        ("", ("namespaces",)): ["get", "list", "watch"],
        ("", ("configmaps",)): ["get"],
        ("", ("nodes",)): ["get"],
        ("", ("events",)): ["create"],  # the PolicyViolation Event on a denied object, create only
        # GPU011: the DRA claims and claim templates a pod names, one get each (docs/dra.md)
        ("resource.k8s.io", ("resourceclaims", "resourceclaimtemplates")): ["get"],
    }
    assert webhook[("ClusterRoleBinding", CONTEXT)]["roleRef"]["name"] == CONTEXT
    (container,) = pod_spec(webhook)["containers"]
    args = serve_args(container["args"])
    assert args.namespace_labels is True and args.lookup_configmaps is True and args.lookup_secrets is False
    assert args.lookup_nodes is True
    assert "automountServiceAccountToken" not in pod_spec(webhook)


def test_user_policies_come_from_a_config_map_mounted_as_a_directory(webhook: dict[tuple[str, str], dict[str, Any]]) -> None:
    [config_map] = documents(DEPLOY / "user-policies.yaml")
    (container,) = pod_spec(webhook)["containers"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "policies")
    assert "subPath" not in mount, "a subPath mount never sees ConfigMap updates"
    assert serve_args(container["args"]).policies_dir == mount["mountPath"]
    volume = next(v for v in pod_spec(webhook)["volumes"] if v["name"] == "policies")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    for mounted in container["volumeMounts"]:
        assert "subPath" not in mounted, mounted


def test_the_policy_config_map_is_a_valid_settings_document_mounted_where_serve_reads_it(
    webhook: dict[tuple[str, str], dict[str, Any]], tmp_path: Path
) -> None:
    [config_map] = documents(DEPLOY / "policy-config.yaml")
    path = tmp_path / "config.yaml"
    path.write_text(config_map["data"]["config.yaml"])
    loaded = config.load(str(path))
    assert "gpu-admission" in loaded.exempt_namespaces
    (container,) = pod_spec(webhook)["containers"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    assert serve_args(container["args"]).config == f"{mount['mountPath']}/config.yaml"
    volume = next(v for v in pod_spec(webhook)["volumes"] if v["name"] == "config")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]


def test_the_namespace_enforces_restricted_pod_security() -> None:
    [namespace] = documents(DEPLOY / "namespace.yaml")
    assert namespace["metadata"]["name"] == "gpu-admission"
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


# The volume types Pod Security "restricted" (and "baseline") admits (kubernetes pod-security-admission
# policy/check_restrictedVolumes.go); hostPath is not among them.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}
BASE_FILES = ("webhook.yaml", "extender.yaml", "labeler.yaml")


def _restricted_violations(spec: dict[str, Any]) -> list[str]:
    found = [f"{key}: true" for key in ("hostPID", "hostNetwork", "hostIPC") if spec.get(key)]
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        found += [f"volume {volume['name']}: {kind}" for kind in sorted(kinds - RESTRICTED_VOLUMES)]
    pod_context = spec.get("securityContext", {})
    for container in spec.get("initContainers", []) + spec["containers"]:
        context = container.get("securityContext", {})
        name = container["name"]
        if context.get("runAsNonRoot", pod_context.get("runAsNonRoot")) is not True:
            found.append(f"{name}: runAsNonRoot")
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation")
        if context.get("capabilities", {}).get("drop") != ["ALL"] or context.get("capabilities", {}).get("add"):
            found.append(f"{name}: capabilities")
        if context.get("privileged"):
            found.append(f"{name}: privileged")
        if container.get("ports") and any("hostPort" in port for port in container["ports"]):
            found.append(f"{name}: hostPort")
        seccomp = context.get("seccompProfile", pod_context.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{name}: seccompProfile")
    return found


@pytest.mark.parametrize("file", BASE_FILES)
def test_every_pod_of_the_base_passes_restricted_pod_security(file: str) -> None:
    # The namespace enforces restricted: a pod template that breaks it is refused when its
    # controller creates the pods (a DaemonSet's refusals show only as events), not on apply.
    templates = [d["spec"]["template"]["spec"] for d in documents(DEPLOY / file) if d["kind"] in ("Deployment", "DaemonSet")]
    assert templates
    for spec in templates:
        assert _restricted_violations(spec) == []


def test_the_restricted_check_catches_host_access() -> None:
    [labeler] = [d for d in documents(DEPLOY / "labeler.yaml") if d["kind"] == "DaemonSet"]
    spec = labeler["spec"]["template"]["spec"]
    spec = {**spec, "hostPID": True, "volumes": [{"name": "host-proc", "hostPath": {"path": "/proc"}}]}
    assert _restricted_violations(spec) == ["hostPID: true", "volume host-proc: hostPath"]


def test_the_process_attribution_component_mounts_proc_read_only_without_host_pid() -> None:
    component = yaml.safe_load((DEPLOY / "components" / "process-attribution" / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"
    patches = {p["target"]["kind"]: yaml.safe_load(p["patch"]) for p in component["patches"]}
    daemonset = {op["path"]: op["value"] for op in patches["DaemonSet"]}
    assert daemonset["/spec/template/spec/containers/0/volumeMounts"] == [
        {"name": "host-proc", "mountPath": "/host/proc", "readOnly": True}
    ]
    assert daemonset["/spec/template/spec/volumes"] == [{"name": "host-proc", "hostPath": {"path": "/proc", "type": "Directory"}}]
    assert not any("hostPID" in path for path in daemonset)
    # The mount is where the base's labeler already reads (--proc-root).
    [labeler] = [d for d in documents(DEPLOY / "labeler.yaml") if d["kind"] == "DaemonSet"]
    assert "--proc-root=/host/proc" in labeler["spec"]["template"]["spec"]["containers"][0]["args"]
    # With the host's /proc, a shared UID would let the labeler read the webhook's and the
    # extender's /proc/<pid>/environ and root: the component gives it a UID of its own.
    assert daemonset["/spec/template/spec/securityContext/runAsUser"] == 65533
    assert daemonset["/spec/template/spec/securityContext/runAsGroup"] == 65533
    others = {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
        for name in ("webhook.yaml", "extender.yaml")
        for d in documents(DEPLOY / name)
        if d["kind"] == "Deployment"
    }
    assert others and 65533 not in others.values(), others
    # hostPath is admitted only by "privileged"; warn and audit stay "restricted".
    assert patches["Namespace"] == [
        {"op": "replace", "path": "/metadata/labels/pod-security.kubernetes.io~1enforce", "value": "privileged"}
    ]


# --- the kustomize base -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kustomization() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    return loaded


def test_the_base_lists_only_files_that_exist(kustomization: dict[str, Any]) -> None:
    for entry in kustomization["resources"]:
        assert (DEPLOY / entry).is_file(), entry
    for generator in kustomization["configMapGenerator"]:
        for item in generator["files"]:
            assert (DEPLOY / item.split("=", 1)[-1]).is_file(), item


def test_the_base_labels_everything_part_of_gpu_admission_without_touching_selectors(kustomization: dict[str, Any]) -> None:
    [labels] = kustomization["labels"]
    assert labels["pairs"] == {"app.kubernetes.io/part-of": "gpu-admission"}
    assert labels["includeSelectors"] is False


def _component_manifests() -> set[str]:
    """deploy/*.yaml files that hold Kubernetes objects (not kustomize or scheduler configuration)."""
    found = set()
    for path in DEPLOY.glob("*.yaml"):
        kinds = {d.get("kind") for d in documents(path)}
        if kinds and not kinds & {"Kustomization", "KubeSchedulerConfiguration"}:
            found.add(path.name)
    return found


def test_the_base_lists_every_manifest_except_those_that_still_carry_their_own_namespace(kustomization: dict[str, Any]) -> None:
    listed = set(kustomization["resources"])
    for name in sorted(_component_manifests() - listed):
        kinds = [d["kind"] for d in documents(DEPLOY / name)]
        assert "Namespace" in kinds, f"deploy/{name} no longer carries a Namespace: list it in deploy/kustomization.yaml"
    namespaces = [name for name in listed if any(d["kind"] == "Namespace" for d in documents(DEPLOY / name))]
    assert namespaces == ["namespace.yaml"], "kustomize refuses a second gpu-admission Namespace"


def test_the_second_scheduler_configuration_is_shipped_as_a_config_map(kustomization: dict[str, Any]) -> None:
    [generator] = kustomization["configMapGenerator"]
    assert generator["namespace"] == "gpu-admission" and generator["options"]["disableNameSuffixHash"] is True
    [item] = generator["files"]
    key, source = item.split("=", 1)
    assert key == "scheduler-config.yaml"
    [document] = documents(DEPLOY / source)
    assert document["kind"] == "KubeSchedulerConfiguration"


# --- the cert-manager component ---------------------------------------------------------------------


def test_the_cert_manager_component_serves_files_from_the_certificates_secret() -> None:
    [patch] = documents(COMPONENT / "webhook-files-mode.yaml")
    spec = patch["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    args = serve_args(container["args"])
    assert not args.self_managed_certs
    [mount] = container["volumeMounts"]
    assert args.tls_cert_file == f"{mount['mountPath']}/tls.crt" and args.tls_private_key_file == f"{mount['mountPath']}/tls.key"
    [volume] = spec["volumes"]
    certificates = {d["metadata"]["name"]: d for d in documents(COMPONENT / "certificates.yaml") if d["kind"] == "Certificate"}
    serving = certificates["gpu-admission-webhook"]["spec"]
    assert volume["secret"]["secretName"] == serving["secretName"]
    assert set(serving["dnsNames"]) == set(provision.service_hosts(provision.SERVICE, "gpu-admission"))
    assert serving["renewBefore"] == "1440h", "60 days, as in the self-managed mode"


def test_the_cert_manager_component_keeps_the_cluster_context() -> None:
    [patch] = documents(COMPONENT / "webhook-files-mode.yaml")
    spec = patch["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    args = serve_args(container["args"])
    assert args.namespace_labels and args.lookup_configmaps and args.policies_dir == "/etc/gpu-admission/policies"
    assert spec.get("automountServiceAccountToken") is not False, "the cluster context needs the token"


def test_the_cert_manager_component_injects_the_ca_and_drops_the_self_managed_rbac() -> None:
    component: dict[str, Any] = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"
    patches = [yaml.safe_load(p["patch"]) for p in component["patches"] if "patch" in p]
    injected = {
        p["kind"]
        for p in patches
        if p["metadata"].get("annotations", {}).get("cert-manager.io/inject-ca-from") == "gpu-admission/gpu-admission-webhook"
    }
    assert injected == {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
    deleted = {p["kind"] for p in patches if p.get("$patch") == "delete"}
    assert deleted == {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}


# --- the background-audit component -----------------------------------------------------------------

AUDIT = DEPLOY / "overlays" / "background-audit"


def test_the_background_audit_component_turns_the_audit_on_with_exactly_its_rbac() -> None:
    component: dict[str, Any] = yaml.safe_load((AUDIT / "kustomization.yaml").read_text())
    assert component["kind"] == "Component" and component["resources"] == ["rbac.yaml"]
    [patch] = component["patches"]
    [operation] = yaml.safe_load(patch["patch"])
    assert operation["op"] == "add" and operation["path"].endswith("/args/-")
    assert serve_args(["serve", "--self-managed-certs", operation["value"]]).audit_interval == 600
    objects = {(d["kind"], d["metadata"]["name"]): d for d in documents(AUDIT / "rbac.yaml")}
    verbs = {
        (group, resource): sorted(rule["verbs"])
        for rule in objects[("ClusterRole", "gpu-admission-webhook-audit")]["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    listed = {
        ("", "pods"),
        ("", "nodes"),
        ("", "replicationcontrollers"),
        ("apps", "deployments"),
        ("apps", "statefulsets"),
        ("apps", "daemonsets"),
        ("apps", "replicasets"),
        ("batch", "jobs"),
        ("batch", "cronjobs"),
        ("", "configmaps"),
    }  # GPU211 (keys only); Secrets are an opt-in left commented out
    assert {key: ["list"] for key in listed} == {key: value for key, value in verbs.items() if key in listed}
    assert (
        verbs[("wgpolicyk8s.io", "policyreports")]
        == verbs[("wgpolicyk8s.io", "clusterpolicyreports")]
        == ["create", "delete", "get", "list", "update"]
    )
    assert set(verbs) == listed | {("wgpolicyk8s.io", "policyreports"), ("wgpolicyk8s.io", "clusterpolicyreports")}
    lease_rules = objects[("Role", "gpu-admission-webhook-audit")]["rules"]
    assert {(tuple(r.get("resourceNames", ())), tuple(r["verbs"])) for r in lease_rules} == {
        ((), ("create",)),
        (("gpu-admission-audit",), ("get", "update")),
        ((), ("list",)),  # the extender's reservation ledgers, in this namespace only
    }
    assert all(r["resources"] == ["leases"] and r["apiGroups"] == ["coordination.k8s.io"] for r in lease_rules)
    assert objects[("Role", "gpu-admission-webhook-audit")]["metadata"]["namespace"] == "gpu-admission"
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        assert objects[(kind, "gpu-admission-webhook-audit")]["subjects"][0]["name"] == "gpu-admission-webhook"
