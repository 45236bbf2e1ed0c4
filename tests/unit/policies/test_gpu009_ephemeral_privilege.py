"""GPU009: no ephemeral container with a privilege GPU nodes do not allow, added to a pod that is, or may end up, on a GPU node."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from policies import engine, lookups, model, settings
from policies.trustzone import DEFAULT_ZONE

KEEP_OFF = [dict(e) for e in DEFAULT_ZONE.keep_off]

PREFIX = "GPU009: privileged ephemeral containers cannot be added to pods on GPU nodes: "
INSTEAD = (
    "; use a debug profile without privilege (kubectl debug --profile=general or baseline), "
    "or debug a copy of the pod on a node without GPUs"
)
GPU_NODE = {"ack.node.gpu.schedule": "cgpu", "aliyun.accelerator/nvidia_name": "Tesla-T4", "kubernetes.io/hostname": "gpu-0"}
CPU_NODE = {"kubernetes.io/hostname": "cpu-0", "kubernetes.io/os": "linux"}
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
OFF_GPU = {"key": "aliyun.accelerator/nvidia_name", "operator": "DoesNotExist"}
SYSADMIN = {"privileged": True}  # what kubectl debug --profile=sysadmin sets
NETADMIN = {"capabilities": {"add": ["NET_ADMIN", "NET_RAW"]}}  # --profile=netadmin


def debug(name: str = "debugger-abc", *, security: Mapping[str, Any] | None = SYSADMIN) -> dict[str, Any]:
    container: dict[str, Any] = {"name": name, "image": "busybox:1", "targetContainerName": "main"}
    if security is not None:
        container["securityContext"] = dict(security)
    return container


def running(
    *,
    node: str | None = "gpu-0",
    ephemeral: list[dict[str, Any]] | None = None,
    limits: Mapping[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    main: dict[str, Any] = {"name": "main", "image": "registry.example/app:1"}
    if limits:
        main["resources"] = {"limits": dict(limits)}
    pod_spec: dict[str, Any] = {"containers": [main], **spec}
    if node is not None:
        pod_spec["nodeName"] = node
    if ephemeral is not None:
        pod_spec["ephemeralContainers"] = ephemeral
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "app", "namespace": "team-a"}, "spec": pod_spec}


def attach(
    old: dict[str, Any],
    *added: dict[str, Any],
    node_labels: Mapping[str, str] | None = None,
    config: Mapping[str, Any] | None = None,
) -> model.Decision:
    """The decision on adding `added` to `old` through the ephemeralcontainers subresource."""
    new = {**old, "spec": {**old["spec"], "ephemeralContainers": [*old["spec"].get("ephemeralContainers", []), *added]}}
    request = model.Request(
        operation="UPDATE",
        object=new,
        old_object=old,
        namespace="team-a",
        subresource="ephemeralcontainers",
        node_labels=node_labels,
    )
    return engine.evaluate(request, settings=settings.from_mapping(config) if config else settings.Settings())


def outcome(decision: model.Decision, policy_id: str = "GPU009") -> model.Result:
    return next(r.result for r in decision.results if r.policy == policy_id)


def off_gpu_affinity(*extra_terms: Mapping[str, Any]) -> dict[str, Any]:
    terms = [{"matchExpressions": KEEP_OFF}, *extra_terms]
    return {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": terms}}}


def test_kubectl_debug_sysadmin_on_a_pod_bound_to_a_gpu_node_is_denied() -> None:
    decision = attach(running(), debug(), node_labels=GPU_NODE)

    assert not decision.allowed
    assert decision.denial_message == (
        PREFIX + 'ephemeral container "debugger-abc" is privileged; the pod runs on the GPU node gpu-0 '
        "(label ack.node.gpu.schedule)" + INSTEAD
    )


@pytest.mark.parametrize("added", [["SYS_ADMIN"], ["CAP_SYS_ADMIN"], ["sys_admin"], ["ALL"], ["NET_RAW", "all"]])
def test_a_sys_admin_or_all_ephemeral_container_on_a_gpu_node_is_denied(added: list[str]) -> None:
    decision = attach(running(), debug(security={"capabilities": {"add": added}}), node_labels=GPU_NODE)

    assert not decision.allowed
    assert (
        f'ephemeral container "debugger-abc" adds capability {", ".join(added)}; the pod runs on the GPU node gpu-0'
        in decision.denial_message
    )


def test_a_node_with_only_a_mode_label_counts_as_a_gpu_node() -> None:
    decision = attach(running(), debug(), node_labels={"ack.node.gpu.schedule": "default"})

    assert not decision.allowed
    assert "(label ack.node.gpu.schedule)" in decision.denial_message


def test_kubectl_debug_sysadmin_on_a_cpu_only_node_is_allowed() -> None:
    decision = attach(running(node="cpu-0"), debug(), node_labels=CPU_NODE)

    assert decision.allowed and decision.violations == ()
    assert outcome(decision) is model.Result.PASS


@pytest.mark.parametrize(("labels", "allowed"), [(GPU_NODE, False), (None, False), (CPU_NODE, True)])
def test_kubectl_debug_netadmin_is_refused_where_the_pod_may_be_on_a_gpu_node(
    labels: Mapping[str, str] | None, allowed: bool
) -> None:
    # NET_ADMIN opens nf_tables to the container: the kernel code behind most recent escapes.
    decision = attach(running(), debug(security=NETADMIN), node_labels=labels)

    assert decision.allowed is allowed
    assert allowed or 'ephemeral container "debugger-abc" adds capability NET_ADMIN, NET_RAW' in decision.denial_message


@pytest.mark.parametrize(
    "security", [None, {"capabilities": {"add": ["SYS_PTRACE"]}}, {"privileged": False}, {"runAsNonRoot": True}]
)
def test_ordinary_debug_containers_on_a_gpu_node_are_allowed(security: Mapping[str, Any] | None) -> None:
    decision = attach(running(), debug(security=security), node_labels=GPU_NODE)

    assert decision.allowed and outcome(decision) is model.Result.PASS


def test_offline_a_bound_pod_without_the_off_gpu_affinity_fails_closed() -> None:
    decision = attach(running(node="somewhere"), debug(), node_labels=None)

    assert not decision.allowed
    assert decision.denial_message == (
        PREFIX + 'ephemeral container "debugger-abc" is privileged; nothing keeps the pod off GPU nodes (no required '
        "node affinity against every GPU node label)" + INSTEAD
    )


def test_offline_a_pod_that_gpu103_kept_off_gpu_nodes_may_get_the_debug_container() -> None:
    decision = attach(running(node="somewhere", affinity=off_gpu_affinity()), debug(), node_labels=None)

    assert decision.allowed and outcome(decision) is model.Result.PASS


def test_offline_one_affinity_term_without_the_requirement_is_not_proof() -> None:
    zone = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}

    decision = attach(running(node="somewhere", affinity=off_gpu_affinity(zone)), debug(), node_labels=None)

    assert not decision.allowed


def test_a_known_gpu_node_wins_over_an_affinity_that_only_names_the_card_label() -> None:
    # The node is a GPU node by its mode label even without nvidia_name, so the affinity proved nothing.
    decision = attach(running(affinity=off_gpu_affinity()), debug(), node_labels={"ack.node.gpu.schedule": "cgpu"})

    assert not decision.allowed


def test_a_pod_not_bound_yet_may_still_land_on_a_gpu_node() -> None:
    decision = attach(running(node=None), debug())

    assert not decision.allowed
    assert "nothing keeps the pod off GPU nodes" in decision.denial_message
    assert attach(running(node=None, affinity=off_gpu_affinity()), debug()).allowed


def test_only_newly_added_ephemeral_containers_are_judged() -> None:
    old = running(node="cpu-0", ephemeral=[debug("earlier")])

    decision = attach(old, debug("later", security=None), node_labels=GPU_NODE)

    assert decision.allowed and outcome(decision) is model.Result.PASS


def test_each_new_privileged_ephemeral_container_is_named() -> None:
    decision = attach(
        running(),
        debug("one"),
        debug("two", security=None),
        debug("three", security={"capabilities": {"add": ["ALL"]}}),
        node_labels=GPU_NODE,
    )

    assert [v.message.split(";")[0].removeprefix(PREFIX) for v in decision.violations] == [
        'ephemeral container "one" is privileged',
        'ephemeral container "three" adds capability ALL',
    ]


def test_a_gpu_pods_new_privileged_ephemeral_container_is_refused_by_gpu009_alone() -> None:
    decision = attach(running(limits={"aliyun.com/gpu-mem": 2}), debug(), node_labels=None)

    assert not decision.allowed
    assert [v.policy for v in decision.violations] == ["GPU009"]
    assert "; the pod requests the GPU resource aliyun.com/gpu-mem;" in decision.denial_message
    assert outcome(decision, "GPU002") is model.Result.PASS


def test_on_create_the_whole_pod_is_judged_by_gpu002_and_gpu103_instead() -> None:
    pod = running(node=None, ephemeral=None)
    pod["spec"]["containers"][0]["securityContext"] = {"privileged": True}

    decision = engine.evaluate(model.Request(operation="CREATE", object=pod, namespace="team-a"), settings=settings.Settings())

    assert decision.allowed
    assert outcome(decision) is model.Result.PASS
    assert any(op["path"] == "/spec/affinity" for op in decision.patch)


def test_warn_mode_admits_with_the_message_as_a_warning() -> None:
    decision = attach(running(), debug(), node_labels=GPU_NODE, config={"policies": {"GPU009": {"action": "warn"}}})

    assert decision.allowed
    assert decision.warnings[0].startswith(PREFIX + 'ephemeral container "debugger-abc" is privileged')


@pytest.mark.parametrize(
    "spec",
    [
        {
            "containers": [{"name": "main"}],
            "nodeName": 7,
            "ephemeralContainers": [{"name": "d", "securityContext": {"privileged": True}}],
        },
        {"containers": [{"name": "main"}], "nodeName": "gpu-0", "ephemeralContainers": "oops"},
        {
            "containers": [{"name": "main"}],
            "nodeName": "gpu-0",
            "ephemeralContainers": [None, {"name": "d", "securityContext": "x"}],
        },
        {
            "containers": [{"name": "main"}],
            "affinity": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": "x"}}},
            "ephemeralContainers": [{"name": "d", "securityContext": {"privileged": True}}],
        },
    ],
)
def test_malformed_pods_are_judged_without_an_error(spec: dict[str, Any]) -> None:
    new = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "app"}, "spec": spec}
    old = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "app"}, "spec": {"containers": [{"name": "main"}]}}
    request = model.Request(
        operation="UPDATE", object=new, old_object=old, subresource="ephemeralcontainers", node_labels=GPU_NODE
    )

    decision = engine.evaluate(request, settings=settings.Settings())

    assert outcome(decision) in (model.Result.PASS, model.Result.FAIL)
    assert lookups.node_to_look_up(new, old_object=old, subresource="ephemeralcontainers") in ("", "gpu-0")


def test_the_node_is_looked_up_only_for_a_new_privileged_ephemeral_container_on_a_bound_pod() -> None:
    old = running()
    with_debug = {**old, "spec": {**old["spec"], "ephemeralContainers": [debug()]}}
    with_netadmin = {**old, "spec": {**old["spec"], "ephemeralContainers": [debug(security=NETADMIN)]}}
    unbound = running(node=None, ephemeral=[debug()])

    assert lookups.node_to_look_up(with_debug, old_object=old, subresource="ephemeralcontainers") == "gpu-0"
    assert lookups.node_to_look_up(with_debug, old_object=with_debug, subresource="ephemeralcontainers") == ""
    assert lookups.node_to_look_up(with_netadmin, old_object=old, subresource="ephemeralcontainers") == "gpu-0"
    with_general = {
        **old,
        "spec": {**old["spec"], "ephemeralContainers": [debug(security={"capabilities": {"add": ["SYS_PTRACE"]}})]},
    }
    assert lookups.node_to_look_up(with_general, old_object=old, subresource="ephemeralcontainers") == ""
    assert lookups.node_to_look_up(unbound, old_object=running(node=None), subresource="ephemeralcontainers") == ""
    assert lookups.node_to_look_up(with_debug, old_object=old, subresource="") == ""
    assert lookups.node_to_look_up(None, old_object=None, subresource="ephemeralcontainers") == ""


def test_a_pod_that_asked_for_gpu_nodes_is_refused_wherever_it_runs() -> None:
    targeting = running(nodeSelector={"ack.node.gpu.schedule": "cgpu"})

    decision = attach(targeting, debug(), node_labels=None)

    assert [v.policy for v in decision.violations] == ["GPU009"]
    assert 'ephemeral container "debugger-abc" is privileged' in decision.denial_message


@pytest.mark.parametrize(
    ("labels", "allowed"),
    [
        ({"nvidia.com/gpu.present": "true"}, False),
        ({"feature.node.kubernetes.io/pci-10de.present": "true"}, False),
        ({"nvidia.com/gpu.present": "false"}, True),
        ({"feature.node.kubernetes.io/pci-10de.present": "false", "kubernetes.io/os": "linux"}, True),
    ],
)
def test_gpu_operator_and_nfd_labels_mark_a_gpu_node_when_true(labels: Mapping[str, str], allowed: bool) -> None:
    decision = attach(running(node="n-0"), debug(), node_labels=labels)

    assert decision.allowed is allowed
