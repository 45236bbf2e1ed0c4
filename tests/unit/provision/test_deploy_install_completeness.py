"""deploy/ needs no manual step and removes only what it installed: the extender's certificates come
from its init container, and the shared PolicyReport CRDs are applied on their own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from webhook import cli
from webhook.certificates import extendercerts

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def extender_objects() -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in documents(DEPLOY / "extender.yaml")}


def test_the_extender_pod_takes_its_certificates_from_its_init_container_not_from_secrets_made_by_hand() -> None:
    spec = extender_objects()[("Deployment", extendercerts.SERVICE)]["spec"]["template"]["spec"]
    [init] = spec["initContainers"]
    [container] = spec["containers"]
    parsed_init = cli.make_parser().parse_args(init["args"])
    assert parsed_init.func is extendercerts.run
    assert init["image"] == container["image"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert all("secret" not in v for v in volumes.values()), "no volume waits for a Secret nobody made"
    [written] = [m for m in init["volumeMounts"] if m["mountPath"] == parsed_init.out_dir]
    assert volumes[written["name"]]["emptyDir"]["medium"] == "Memory"
    [read] = [m for m in container["volumeMounts"] if m["name"] == written["name"]]
    assert read["readOnly"] is True
    served = cli.make_parser().parse_args(container["args"])
    for flag, name in (("tls_cert_file", "tls.crt"), ("tls_private_key_file", "tls.key"), ("tls_client_ca_file", "ca.crt")):
        assert getattr(served, flag) == f"{read['mountPath']}/{name}", flag
    hardened = init["securityContext"]
    assert (
        hardened["readOnlyRootFilesystem"]
        and not hardened["allowPrivilegeEscalation"]
        and hardened["capabilities"]["drop"] == ["ALL"]
    )


def test_the_extender_may_write_only_its_two_secrets_in_its_namespace() -> None:
    objects = extender_objects()
    role = objects[("Role", "gpu-admission-extender-certs")]
    assert role["metadata"]["namespace"] == "gpu-admission"
    named = [r for r in role["rules"] if r.get("resourceNames")]
    [unnamed] = [r for r in role["rules"] if not r.get("resourceNames")]
    assert unnamed == {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}
    [rule] = named
    assert sorted(rule["resourceNames"]) == sorted([extendercerts.SERVING_SECRET, extendercerts.CLIENT_SECRET])
    assert rule["verbs"] == ["get", "update"]
    binding = objects[("RoleBinding", "gpu-admission-extender-certs")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": extendercerts.SERVICE, "namespace": "gpu-admission"}]
    cluster_rules = objects[("ClusterRole", extendercerts.SERVICE)]["rules"]
    assert all("secrets" not in r["resources"] for r in cluster_rules), "no Secret anywhere else"


def test_the_extender_keeps_its_ledger_leases_in_its_own_namespace_and_nowhere_else() -> None:
    """The reservation ledger is a Lease per node in the extender's namespace: a Role there (never a
    ClusterRole: a Lease elsewhere is a tenant's, never a ledger) with what the compare-and-swap needs."""
    objects = extender_objects()
    role = objects[("Role", "gpu-admission-extender-ledger")]
    assert role["metadata"]["namespace"] == "gpu-admission"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "list", "watch", "create", "update"]}
    ]
    binding = objects[("RoleBinding", "gpu-admission-extender-ledger")]
    assert binding["metadata"]["namespace"] == "gpu-admission"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "gpu-admission-extender-ledger",
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": extendercerts.SERVICE, "namespace": "gpu-admission"}]
    cluster_rules = objects[("ClusterRole", extendercerts.SERVICE)]["rules"]
    assert all("leases" not in r["resources"] for r in cluster_rules), "no Lease in any other namespace"
    # The extender is told that namespace: its own, whatever it is installed into.
    [container] = objects[("Deployment", extendercerts.SERVICE)]["spec"]["template"]["spec"]["containers"]
    assert cli.make_parser().parse_args(container["args"]).ledger_namespace == "$(POD_NAMESPACE)"
    assert {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}} in container["env"]


def test_the_base_does_not_carry_the_shared_policy_report_crds() -> None:
    base = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert not [entry for entry in base["resources"] if "crds" in entry]
    for name in base["resources"]:
        kinds = {d["kind"] for d in documents(DEPLOY / name)}
        assert "CustomResourceDefinition" not in kinds, name


def test_the_crds_are_their_own_kustomization_without_our_part_of_label() -> None:
    crds = yaml.safe_load((DEPLOY / "crds" / "kustomization.yaml").read_text())
    assert crds["kind"] == "Kustomization" and "labels" not in crds and "commonLabels" not in crds
    assert sorted(crds["resources"]) == sorted(p.name for p in (DEPLOY / "crds").glob("wgpolicyk8s.io_*.yaml"))
    for name in crds["resources"]:
        [crd] = documents(DEPLOY / "crds" / name)
        assert crd["kind"] == "CustomResourceDefinition"
        assert "app.kubernetes.io/part-of" not in (crd["metadata"].get("labels") or {}), name
