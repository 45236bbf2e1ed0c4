"""`policies export-vap`: the manifests, their CEL evaluated here as the apiserver would, and the settings' effect."""

from __future__ import annotations

import argparse
import copy
import datetime
import itertools
import pathlib
from typing import Any

import jsonpatch
import pytest
import yaml

from policies import builtin, cel, settings
from policies import engine as policies_engine
from policies import model as policies_model
from policies.trustzone import DEFAULT_ZONE
from tests import bypasses
from webhook import config
from webhook.commands import policies_cli, vap

REPO = pathlib.Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"
NOW = datetime.datetime(2026, 6, 1, tzinfo=datetime.UTC)


def exported(document: dict[str, Any] | None = None, *, policies_dir: pathlib.Path | None = None) -> vap.Export:
    user = config.load(None, policies_dir=str(policies_dir)).user_policies if policies_dir else ()
    return vap.export(settings.from_mapping(document or {}, user_policies=user), now=NOW)


def policy_named(export: vap.Export, name: str) -> dict[str, Any]:
    return next(m for m in export.manifests if m["kind"] == "ValidatingAdmissionPolicy" and m["metadata"]["name"] == name)


def as_pod(document: dict[str, Any]) -> dict[str, Any]:
    if document["kind"] == "Pod":
        return document
    spec = document["spec"]
    template = spec["jobTemplate"]["spec"]["template"] if document["kind"] == "CronJob" else spec["template"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": template.get("metadata") or {"name": "p"}, "spec": template["spec"]}


def without_nulls(value: Any) -> Any:
    """The object as the apiserver hands it to CEL: a typed Pod has no null fields (`env:` alone drops out)."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def admits(
    policy: dict[str, Any], pod: dict[str, Any], *, namespace: str = "team-a", labels: dict[str, str] | None = None
) -> bool:
    """What kube-apiserver concludes for `pod`: match conditions, then the variables and every
    validation (CEL run here)."""
    env = cel.environment(extra=("variables",))
    activation: dict[str, Any] = {
        "object": without_nulls(pod),
        "oldObject": None,
        "request": {"namespace": namespace, "operation": "CREATE", "resource": {"resource": "pods"}},
        "namespaceObject": {
            "metadata": {"name": namespace, "labels": {"kubernetes.io/metadata.name": namespace, **(labels or {})}}
        },
    }
    spec = policy["spec"]
    for condition in spec["matchConditions"]:
        if not cel.evaluate(cel.compile_expression(env, condition["expression"], field=condition["name"]), activation):
            return True
    variables: dict[str, Any] = {}
    activation["variables"] = variables
    for v in spec.get("variables", []):  # in order: a variable may name the ones before it, as in the apiserver
        variables[v["name"]] = cel.evaluate(cel.compile_expression(env, f"dyn({v['expression']})", field=v["name"]), activation)
    return all(
        cel.evaluate(cel.compile_expression(env, v["expression"], field="validation"), activation) is True
        for v in spec["validations"]
    )


def test_each_exported_policy_comes_with_a_deny_binding_excluding_the_webhooks_namespaces() -> None:
    manifests = exported().manifests
    webhook = yaml.safe_load_all((REPO / "deploy" / "webhook-configurations.yaml").read_text())
    excluded = {
        tuple(e["values"])
        for configuration in webhook
        for hook in configuration["webhooks"]
        for e in hook["namespaceSelector"]["matchExpressions"]
        if e["operator"] == "NotIn"  # the settings ConfigMap's own check selects the webhook's namespace (In)
    }

    assert [(m["kind"], m["metadata"]["name"]) for m in manifests] == [
        (kind, f"gpu-admission-gpu00{n}")
        for n in range(1, 5)
        for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    ]
    for binding in manifests[1::2]:
        assert binding["apiVersion"] == "admissionregistration.k8s.io/v1"
        assert binding["spec"]["validationActions"] == ["Deny"]
        (expression,) = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
        assert expression["key"] == "kubernetes.io/metadata.name" and expression["operator"] == "NotIn"
        assert {tuple(sorted(expression["values"]))} == {tuple(sorted(v)) for v in excluded}
    for policy in manifests[0::2]:
        assert policy["spec"]["failurePolicy"] == "Fail"


@pytest.mark.parametrize(("bypass", "policy"), bypasses.REFUSED_BY_POLICY)
def test_the_exported_cel_refuses_each_bypass_pod_and_only_with_its_policy(bypass: str, policy: str) -> None:
    export = exported()
    pod = as_pod(yaml.safe_load((EXAMPLES / "bypasses" / bypass).read_text()))

    verdicts = {m["metadata"]["name"]: admits(m, pod) for m in export.manifests if m["kind"] == "ValidatingAdmissionPolicy"}

    assert [name for name, allowed in verdicts.items() if not allowed] == [policy]


def test_the_exported_cel_admits_every_seed_workload() -> None:
    export = exported()
    workloads = sorted((EXAMPLES / "workloads").glob("*.yaml"))
    assert workloads, "no seed workloads under examples/workloads"
    judged = 0
    for path in workloads:
        for document in yaml.safe_load_all(path.read_text()):
            if document and document["kind"] not in ("Service", "ConfigMap"):
                pod = as_pod(document)
                assert all(admits(m, pod) for m in export.manifests if m["kind"] == "ValidatingAdmissionPolicy"), path.name
                judged += 1
    assert judged >= len(workloads)


@pytest.mark.parametrize(
    ("value", "allowed"),
    [("void", True), (" None ", True), ("all", False), ("0", False), ("", False)],
)
def test_gpu001_by_value_follows_the_neutral_values(value: str, allowed: bool) -> None:
    pod: dict[str, Any] = {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": value}]}]},
    }
    if not value:
        del pod["spec"]["containers"][0]["env"][0]["value"]

    assert admits(policy_named(exported(), "gpu-admission-gpu001"), pod) is allowed
    assert admits(policy_named(exported({"visibleDevicesNeutralValue": ""}), "gpu-admission-gpu001"), pod) is (
        allowed or not value
    )


GPU = {"limits": {"nvidia.com/gpu": 1}}
OFF_GPU_NODES = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [dict(e) for e in DEFAULT_ZONE.keep_off]}]
        }
    }
}


def host_path_pod(path: str, *, gpu: bool = True, affinity: dict[str, Any] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "volumeMounts": [{"name": "v", "mountPath": "/h", "readOnly": True}]}
    if gpu:
        container["resources"] = GPU
    spec: dict[str, Any] = {"containers": [container], "volumes": [{"name": "v", "hostPath": {"path": path}}]}
    if affinity is not None:
        spec["affinity"] = affinity
    return {"metadata": {"name": "p"}, "spec": spec}


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        ("/dev/nvidia0", False),
        ("//dev//nvidiactl/", False),
        ("/dev", False),
        ("/", False),
        ("/var/lib/kubelet/device-plugins/kubelet.sock", False),
        ("/run/nvidia/driver", False),
        ("/dev/shm", False),
        ("/data", False),
        ("/var/lib/docker", False),
        ("/var/run/docker.sock", False),
        ("//run///containerd/", False),
        ("/var/./run", False),
        ("run/containerd", False),
        ("/var/lib/container/kubelet", False),
        ("/usr/libexec/kubernetes/kubelet-plugins/volume/exec", False),
        ("/etc/ld.so.preload", False),
        ("/etc/cron.d", False),
        ("/etc/udev/rules.d", False),
        ("/etc/modprobe.d", False),
        ("/etc/systemd/system", False),
        ("/opt/nri/plugins", False),
        ("/etc/localtime/../passwd", False),
        ("/etc/localtime", True),
        ("//etc/./localtime", True),
        ("/usr/share/zoneinfo/Asia/Shanghai", True),
        ("/var/lib/lxcfs/proc/meminfo", True),
        ("var/lib/lxcfs/proc/cpuinfo", True),
    ],
)
def test_gpu003_admits_only_allowed_host_paths_in_pods_that_can_reach_a_gpu_node(path: str, allowed: bool) -> None:
    gpu003 = policy_named(exported(), "gpu-admission-gpu003")
    if ".." in path:
        # The apiserver refuses a hostPath with `..` before any admission policy sees it, so the CEL
        # does not resolve it; the webhook does, and must refuse where it leads (/etc/passwd).
        assert (settings.from_mapping({}).allowance("team-a").host_path(path) is not None) is allowed
        return
    assert admits(gpu003, host_path_pod(path)) is allowed
    # A pod without GPUs that carries GPU103's affinity cannot reach a GPU node: any path passes.
    assert admits(gpu003, host_path_pod(path, gpu=False, affinity=OFF_GPU_NODES))
    # Without it (GPU103 did not act), it could: the same rule as a GPU pod's.
    assert admits(gpu003, host_path_pod(path, gpu=False)) is allowed


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        ("/run/flannel", True),
        ("/var/run/flannel/subnet.env", False),
        ("/run/./flannel/", True),
        ("/run", False),
        ("/run/flannelx", False),
        ("/opt/models/llama", True),
        ("/opt", False),
        ("/srv/www", False),
    ],
)
def test_gpu003_follows_the_trust_zone_settings(path: str, allowed: bool) -> None:
    document = {"trustZone": {"allow": {"hostPaths": ["/opt/models"]}}, "hostPaths": {"allow": ["/var/run/flannel"]}}
    loaded = settings.from_mapping(document)

    assert admits(policy_named(exported(document), "gpu-admission-gpu003"), host_path_pod(path)) is allowed
    assert (loaded.allowance("team-a").host_path(path) is not None) is allowed


def test_gpu003_export_agrees_with_the_webhook_on_every_path_the_apiserver_accepts() -> None:
    # Every path of up to three components (the apiserver refuses `..`, so none has one), absolute
    # and relative, with an allowed path of the settings in play, in a pod that requests a GPU.
    document = {"trustZone": {"allow": {"hostPaths": ["/run/flannel", "/srv"]}}}
    gpu003 = policy_named(exported(document), "gpu-admission-gpu003")
    allowance = settings.from_mapping(document).allowance("team-a")
    parts = ["", "var", "run", "lock", "kubelet", "etc", "localtime", ".", "srv", "flannel"]
    paths = {"/" + "/".join(p) for p in itertools.product(parts, repeat=3)} | {
        "/".join(p) for p in itertools.product(parts[1:], repeat=2)
    }

    disagree = [
        path for path in sorted(paths) if admits(gpu003, host_path_pod(path)) is not (allowance.host_path(path) is not None)
    ]
    assert len(paths) > 1000
    assert disagree == []


def test_a_policy_not_enforced_anywhere_is_left_out_with_a_note() -> None:
    export = exported({"policies": {"GPU002": {"action": "warn"}, "GPU003": {"action": "off"}}})

    names = {m["metadata"]["name"] for m in export.manifests}
    assert "gpu-admission-gpu002" not in names and "gpu-admission-gpu003" not in names
    assert export.notes == (
        "GPU002: left out: its action is not enforce in any namespace",
        "GPU003: left out: its action is not enforce in any namespace",
    )


def test_namespace_overrides_become_a_match_condition() -> None:
    document = {
        "policies": {"GPU002": {"action": "warn"}},
        "namespaceOverrides": [
            {"namespaces": ["prod"], "policies": {"GPU001": {"action": "audit"}, "GPU002": {"action": "enforce"}}},
            {"namespaceSelector": {"matchLabels": {"tier": "lab"}}, "policies": {"GPU001": {"action": "warn"}}},
        ],
    }
    export = exported(document)
    privileged = as_pod(yaml.safe_load((EXAMPLES / "bypasses" / "gpu002-privileged-gpu.yaml").read_text()))
    visible = as_pod(yaml.safe_load((EXAMPLES / "bypasses" / "gpu001-visible-devices-env.yaml").read_text()))

    gpu002 = policy_named(export, "gpu-admission-gpu002")
    assert not admits(gpu002, privileged, namespace="prod")
    assert admits(gpu002, privileged, namespace="team-a")
    gpu001 = policy_named(export, "gpu-admission-gpu001")
    assert admits(gpu001, visible, namespace="prod")
    assert admits(gpu001, visible, namespace="x", labels={"tier": "lab"})
    assert not admits(gpu001, visible, namespace="x")


def test_active_exceptions_leave_their_objects_out_and_expiring_ones_are_noted() -> None:
    document = {
        "exceptions": [
            {
                "name": "DCGM exporter",
                "policies": ["GPU003"],
                "match": {"namespaces": ["monitoring"], "names": ["dcgm-*"]},
                "expires": "2026-12-31T00:00:00Z",
            },
            {"name": "gone", "policies": ["GPU003"], "match": {"namespaces": ["team-a"]}, "expires": "2026-01-01T00:00:00Z"},
        ]
    }
    export = exported(document)
    pod = as_pod(yaml.safe_load((EXAMPLES / "bypasses" / "gpu003-host-path-devices.yaml").read_text()))
    named = copy.deepcopy(pod)
    named["metadata"]["name"] = "dcgm-exporter-1"
    unnamed = copy.deepcopy(pod)
    unnamed["metadata"] = {"generateName": "dcgm-exporter-"}
    gpu003 = policy_named(export, "gpu-admission-gpu003")

    assert admits(gpu003, named, namespace="monitoring")
    assert admits(gpu003, unnamed, namespace="monitoring")
    assert not admits(gpu003, pod, namespace="monitoring")
    assert not admits(gpu003, named, namespace="team-a")  # the expired exception is not exported
    assert [c["name"] for c in gpu003["spec"]["matchConditions"]] == ["not-a-mirror-pod", "exception-0-dcgm-exporter"]
    assert export.notes == (
        "GPU003: exception DCGM exporter expires 2026-12-31T00:00:00+00:00; export again after that, the apiserver cannot tell",
    )


def test_user_policies_are_exported_with_params_written_in() -> None:
    export = exported(policies_dir=EXAMPLES / "policies")
    policy = policy_named(export, "gpu-admission-max-gpus-per-pod")

    assert "params" not in " ".join(v["expression"] for v in policy["spec"]["validations"]).replace("'", "")
    assert policy["metadata"]["annotations"]["gpu-admission.io/policy-id"] == "USR001"
    assert policy["spec"]["validations"][0]["messageExpression"].startswith(
        "'USR001: pods in a GPU-limited namespace ask for at most a few whole GPUs: ' + ("
    )
    three = yaml.safe_load((EXAMPLES / "policies" / "manifests" / "max-gpus-per-pod-denied.yaml").read_text())
    two = yaml.safe_load((EXAMPLES / "policies" / "manifests" / "max-gpus-per-pod-allowed.yaml").read_text())
    assert not admits(policy, three, namespace="team-small")
    assert admits(policy, two, namespace="team-small")
    assert admits(policy, three, namespace="team-big")
    card = policy_named(export, "gpu-admission-card-model-required")
    assert card["spec"]["matchConstraints"]["namespaceSelector"] == {
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["inference"]}]
    }


def test_params_are_rewritten_only_where_they_are_the_variable() -> None:
    literal = vap._dyn_lit({"n": 2, "names": ["a"]})

    assert literal == "{'n': dyn(2), 'names': dyn([dyn('a')])}"
    assert vap.rewrite_params("params.n > x.params && 'params' != \"params\" && paramsx", literal="P") == (
        "(P).n > x.params && 'params' != \"params\" && paramsx"
    )


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    policies_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["policies", *argv])
    status: int = args.func(args)
    return status


def test_the_cli_writes_the_manifests_to_a_file_or_stdout(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "vap.yaml"

    assert run_cli("export-vap", "--policies-dir", str(EXAMPLES / "policies"), "--output-file", str(target)) == 0
    written = [d for d in yaml.safe_load_all(target.read_text()) if d]
    assert len(written) == 14
    assert "wrote 14 manifests" in capsys.readouterr().err
    assert run_cli("export-vap") == 0
    assert len([d for d in yaml.safe_load_all(capsys.readouterr().out) if d]) == 8


def test_the_cli_lists_every_policy_with_action_and_source(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("list", "--policies-dir", str(EXAMPLES / "policies")) == 0

    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["ID", "KIND", "ACTION", "SOURCE"]
    assert [line.split()[0] for line in lines[1:]] == [
        *(p.id for p in builtin.POLICIES),  # the registry, in ID order
        "USR002",
        "USR003",
        "USR001",
    ]


@pytest.mark.parametrize(
    ("added", "allowed"),
    [
        (["SYS_ADMIN"], False),
        (["cap_sys_admin"], False),
        ([" ALL "], False),
        (["NET_ADMIN", "all"], False),
        (["SYS_MODULE"], False),
        (["dac_read_search"], False),
        (["CAP_SYS_RAWIO"], False),
        (["BPF"], False),
        (["PERFMON"], False),
        (["SYS_TIME"], False),
        (["MADE_UP_LATER"], False),
        (["NET_BIND_SERVICE", "SYS_PTRACE"], True),
        (["NET_ADMIN"], False),
        (["net_raw"], False),
        (["ipc_lock", "CAP_SYS_NICE", " sys_resource "], True),
        ([], True),
    ],
)
def test_gpu002_admits_only_allowed_capabilities_as_the_webhook_does(added: list[str], allowed: bool) -> None:
    (gpu002,) = [
        m
        for m in exported().manifests
        if m["metadata"]["name"] == "gpu-admission-gpu002" and m["kind"] == "ValidatingAdmissionPolicy"
    ]
    container = {"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}, "securityContext": {"capabilities": {"add": added}}}
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "main"}], "initContainers": [container]}}

    assert admits(gpu002, pod) is allowed
    # Without GPUs and with GPU103's affinity, the pod cannot reach a GPU node: any capability passes.
    cpu = {"containers": [{"name": "main"}], "initContainers": [{**container, "resources": {}}], "affinity": OFF_GPU_NODES}
    assert admits(gpu002, {**pod, "spec": cpu})


@pytest.mark.parametrize(
    ("spec", "allowed"),
    [
        ({"hostPID": True}, False),
        ({"hostIPC": True}, False),
        ({"hostNetwork": True}, False),
        ({"securityContext": {"seLinuxOptions": {"type": "spc_t"}}}, False),
        ({"securityContext": {"seLinuxOptions": {"type": "container_t"}}}, True),
        ({"securityContext": {"windowsOptions": {"hostProcess": True}}}, False),
        ({"hostPID": False, "hostNetwork": False}, True),
    ],
)
def test_gpu002_refuses_host_namespaces_and_node_security_options_in_pods_that_can_reach_a_gpu_node(
    spec: dict[str, Any], allowed: bool
) -> None:
    gpu002 = policy_named(exported(), "gpu-admission-gpu002")
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "resources": GPU}], **spec}}

    assert admits(gpu002, pod) is allowed
    assert admits(gpu002, {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}], "affinity": OFF_GPU_NODES, **spec}})


def test_gpu002_follows_a_namespace_allowance_only_as_widely_as_it_can_tell() -> None:
    # The export cannot tell namespaces apart: an allowance anywhere is admitted everywhere (it may
    # admit what the webhook refuses, never the reverse).
    document = {
        "trustZone": {
            "namespaces": [
                {
                    "name": "nccl",
                    "namespaces": ["training"],
                    "allow": {"hostNetwork": True, "capabilities": ["SYS_TIME", "NET_ADMIN"]},
                }
            ]
        }
    }
    gpu002 = policy_named(exported(document), "gpu-admission-gpu002")
    spec: dict[str, Any] = {
        "hostNetwork": True,
        "containers": [{"name": "c", "resources": GPU, "securityContext": {"capabilities": {"add": ["SYS_TIME"]}}}],
    }

    assert admits(gpu002, {"metadata": {"name": "p"}, "spec": spec})
    assert not admits(gpu002, {"metadata": {"name": "p"}, "spec": {**spec, "hostPID": True}})
    # NET_ADMIN needs the pod's own network namespace, allowance or not (as trustzone.NEEDS_OWN_NAMESPACE).
    tuned = {"name": "c", "resources": GPU, "securityContext": {"capabilities": {"add": ["net_admin"]}}}
    assert not admits(gpu002, {"metadata": {"name": "p"}, "spec": {**spec, "containers": [tuned]}})
    assert admits(gpu002, {"metadata": {"name": "p"}, "spec": {"containers": [tuned]}})


@pytest.mark.parametrize("resource", ["nvidia.com/mig-1g.5gb", "nvidia.com/gpu.shared"])
def test_mig_slices_and_shared_cards_are_gpu_requests_in_the_export_as_in_the_webhook(resource: str) -> None:
    manifests = {m["metadata"]["name"]: m for m in exported().manifests if m["kind"] == "ValidatingAdmissionPolicy"}
    gpu002, gpu004 = manifests["gpu-admission-gpu002"], manifests["gpu-admission-gpu004"]
    slice_ = {"name": "app", "resources": {"limits": {resource: 1}}}
    privileged = {"name": "tool", "securityContext": {"privileged": True}}

    assert admits(gpu002, {"metadata": {"name": "p"}, "spec": {"containers": [slice_]}})
    assert not admits(gpu002, {"metadata": {"name": "p"}, "spec": {"containers": [slice_, privileged]}})
    assert admits(
        gpu004,
        {
            "metadata": {"name": "p"},
            "spec": {"containers": [slice_, {"name": "b", "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
        },
    )
    assert not admits(
        gpu004,
        {
            "metadata": {"name": "p"},
            "spec": {"containers": [slice_, {"name": "b", "resources": {"limits": {"aliyun.com/gpu-mem": 2}}}]},
        },
    )
    assert not admits(
        gpu004, {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "app", "resources": {"limits": {resource: "0"}}}]}}
    )


TRUST_ZONE = REPO / "tests" / "data" / "manifests" / "trustzone"


def _zone_pods() -> list[tuple[str, dict[str, Any]]]:
    """Every pod-bearing manifest of the trust-zone fixtures as a Pod, as written and asking for a GPU."""
    found: list[tuple[str, dict[str, Any]]] = []
    manifests = sorted(TRUST_ZONE.glob("*.yaml"))
    assert manifests, f"no trust-zone fixtures under {TRUST_ZONE}"
    for path in manifests:
        for document in yaml.safe_load_all(path.read_text()):
            if not document or document["kind"] not in ("Pod", "Deployment", "DaemonSet", "Job"):
                continue
            as_written = as_pod(document)
            found.append((path.name, as_written))
            asking = copy.deepcopy(as_written)
            asking["spec"]["containers"][0].setdefault("resources", {}).setdefault("limits", {})["nvidia.com/gpu"] = 1
            found.append((f"{path.name}+gpu", asking))
    return found


@pytest.mark.parametrize(("name", "pod"), _zone_pods(), ids=[name for name, _ in _zone_pods()])
def test_the_export_never_refuses_what_the_webhook_admits_and_refuses_the_same_gpu_pods(name: str, pod: dict[str, Any]) -> None:
    # The apiserver runs the VAPs on the pod after the mutating webhook: the engine's patch applied.
    decision = policies_engine.evaluate(
        policies_model.Request(operation="CREATE", object=pod, namespace="team-a"), settings=settings.Settings()
    )
    manifests = {m["metadata"]["name"]: m for m in exported().manifests if m["kind"] == "ValidatingAdmissionPolicy"}
    if decision.allowed:
        mutated = jsonpatch.apply_patch(copy.deepcopy(pod), list(decision.patch))
        assert all(admits(m, mutated) for m in manifests.values()), name
    refused = {v.policy for v in decision.violations if v.action is policies_model.Action.ENFORCE}
    for policy_id in ("GPU002", "GPU003"):
        if policy_id in refused:  # the webhook's GPU002/GPU003 refusals hold in the apiserver too
            assert not admits(manifests[f"gpu-admission-{policy_id.lower()}"], pod), name


@pytest.mark.parametrize(
    ("port", "gpu", "admitted"), [(10250, True, False), (9100, True, False), (8888, True, True), (10250, False, True)]
)
def test_the_export_judges_host_ports_as_the_webhook_does(port: int, gpu: bool, admitted: bool) -> None:
    gpu002 = policy_named(exported(), "gpu-admission-gpu002")
    container: dict[str, Any] = {"name": "c", "ports": [{"containerPort": 80, "hostPort": port}]}
    spec: dict[str, Any] = {"containers": [container]}
    if gpu:
        container["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    else:
        spec["affinity"] = OFF_GPU_NODES
    obj = {"metadata": {"name": "p"}, "spec": spec}

    assert admits(gpu002, obj) is admitted
    request = policies_model.Request(operation="CREATE", object={"apiVersion": "v1", "kind": "Pod", **obj}, namespace="team-a")
    assert policies_engine.evaluate(request, settings=settings.Settings()).allowed is admitted
