"""The verdict memo's key made in place (`verdicts.dumped_in_place`, issue 19): the same bytes as the
reference key, the pod left exactly as it was, and no verdict shared that a plain run would not give.

The reference is `verdicts.normalized` dumped with orjson (a rebuilt copy of the pod less what its
replicas differ in). The fast key renames the token volume in the pod itself for the dump and names
it back; equal bytes mean the key is exactly as discriminating as before.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import hypothesis
import orjson
import pytest
from hypothesis import strategies as st

from policies import model, replicas
from policies import settings as settings_
from tests.unit.audit.conftest import NOW, allocation, build_node, build_pod
from tests.unit.audit.test_audit_memo import SETTINGS, _everything, _listed, _outputs
from tests.unit.policies import test_properties
from webhook.audit import findings, scan, verdicts

TOKEN = "kube-api-access-q7x2k"
MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"


def _reference(obj: Any, *, keeps_names: bool) -> tuple[bytes, list[str]]:
    slim, volatile = verdicts.normalized(obj, keeps_names=keeps_names)
    try:
        return orjson.dumps(slim), volatile
    except (TypeError, orjson.JSONEncodeError):
        return b"", volatile


garbage = st.one_of(st.none(), st.integers(-2, 2), st.text(max_size=3), st.lists(st.integers(), max_size=2))
token_names = st.one_of(st.just(TOKEN), st.just("kube-api-access-"), st.text(max_size=4).map(lambda t: "kube-api-access-" + t))


@st.composite
def listed_objects(draw: st.DrawFn) -> dict[str, Any]:
    """A generated Pod or workload as listed: identity metadata, maybe a token volume (one, two, or
    a same-named plain volume beside it) mounted by some containers, any status."""
    if draw(st.integers(0, 3)):  # mostly Pods: only a Pod's token volume is renamed
        obj: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": copy.deepcopy(draw(test_properties.metadata)),
            "spec": copy.deepcopy(draw(test_properties.pod_spec)),
        }
    else:
        obj = copy.deepcopy(draw(test_properties.objects()))
    metadata = obj.get("metadata")
    if isinstance(metadata, dict):
        for field, value in (
            ("uid", "uid-1"),
            ("generateName", "app-"),
            ("resourceVersion", "7"),
            ("creationTimestamp", "2026-01-01T00:00:00Z"),
        ):
            if draw(st.booleans()):
                metadata[field] = draw(st.one_of(st.just(value), garbage))
        if draw(st.booleans()):
            metadata["managedFields"] = [{"manager": "kubelet"}]
    if draw(st.booleans()):
        obj["metadata"] = draw(garbage)
    spec = obj.get("spec")
    if obj.get("kind") == "Pod" and isinstance(spec, dict):
        volumes = spec.get("volumes")
        if not isinstance(volumes, list):
            volumes = [] if draw(st.booleans()) else volumes
            if isinstance(volumes, list):
                spec["volumes"] = volumes
        if isinstance(volumes, list):
            token = draw(token_names)
            for _ in range(draw(st.integers(0, 2))):  # none, one, or two token volumes
                volumes.insert(
                    draw(st.integers(0, len(volumes))),
                    {"name": token, "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}},
                )
                token = draw(token_names)
            if bool(volumes) and draw(st.booleans()):  # a plain volume that shares the token's name
                projected = [v["name"] for v in volumes if isinstance(v, dict) and "projected" in v]
                first = (
                    projected[0]
                    if projected
                    else next((v["name"] for v in volumes if isinstance(v, dict) and isinstance(v.get("name"), str)), "v")
                )
                volumes.append({"name": first, "hostPath": {"path": draw(st.sampled_from(["/dev", "/tmp"]))}})
            names = [v["name"] for v in volumes if isinstance(v, dict) and isinstance(v.get("name"), str)]
            for field in ("containers", "initContainers", "ephemeralContainers"):
                containers = spec.get(field)
                if not isinstance(containers, list):
                    continue
                for container in containers:
                    if isinstance(container, dict) and bool(names) and draw(st.booleans()):
                        mounts = container.setdefault("volumeMounts", [])
                        if isinstance(mounts, list):
                            mounts.append(
                                {
                                    "name": draw(st.sampled_from(names)),
                                    "mountPath": draw(st.sampled_from([MOUNT_PATH, "/run/nvidia-container-devices"])),
                                }
                            )
    status = draw(
        st.one_of(st.none(), st.just({"phase": "Running", "podIP": "10.0.0.1"}), st.just({"podIP": "10.0.0.1"}), garbage)
    )
    if status is not None or draw(st.booleans()):
        obj["status"] = status
    unaliased: dict[str, Any] = test_properties.unaliased(obj)
    return unaliased


@hypothesis.settings(test_properties.PROPERTY_SETTINGS, max_examples=500)
@hypothesis.given(obj=listed_objects(), keeps_names=st.booleans())
def test_the_key_made_in_place_is_the_reference_keys_bytes_and_leaves_the_object_as_it_was(
    obj: dict[str, Any], keeps_names: bool
) -> None:
    before = copy.deepcopy(obj)
    order = json.dumps(obj)  # key order included
    expected = _reference(obj, keeps_names=keeps_names)

    found = verdicts.dumped_in_place(obj, keeps_names=keeps_names)

    assert found is not None
    assert found == expected
    assert obj == before and json.dumps(obj) == order


def test_a_pod_orjson_cannot_write_keeps_no_key_and_gets_its_token_volume_back() -> None:
    pod = _listed(build_pod("app", node_name="cpu-0"), 1)
    pod["metadata"]["labels"] = {"big": 2**70}  # past 64 bits
    token = pod["spec"]["volumes"][0]["name"]

    assert verdicts.dumped_in_place(pod, keeps_names=False) == (b"", ["app-0001", "app-", "uid-00000001", token])
    assert verdicts.Memo(settings_.Settings()).key(pod) is None
    assert pod["spec"]["volumes"][0]["name"] == token and pod["spec"]["containers"][0]["volumeMounts"][0]["name"] == token


def test_objects_that_are_not_plain_decoded_json_take_the_reference_path() -> None:
    from types import MappingProxyType

    pod = _listed(build_pod("app"), 1)
    proxied = {**pod, "spec": {**pod["spec"], "volumes": [MappingProxyType(pod["spec"]["volumes"][0])]}}

    assert verdicts.dumped_in_place(MappingProxyType(pod), keeps_names=False) is None
    assert verdicts.dumped_in_place(proxied, keeps_names=False) is None
    memo = verdicts.Memo(settings_.Settings())
    assert memo.key(pod) == (replicas.digest(_reference(pod, keeps_names=False)[0]), _reference(pod, keeps_names=False)[1])


# --- tenant side: replicas that differ where the key looks, or only where it does not ---------------


def _tenant_objects() -> list[dict[str, Any]]:
    """Replicas of one template that a tenant varies: the token volume's mount path (a device list),
    a plain volume named like the token (a hostPath), the allocation's node, the phase, and an env
    value equal to the pod's own token volume name; each next to unvaried replicas."""
    base = build_pod(
        "t",
        namespace="team-a",
        node_name="cgpu-0",
        gpu_mem=2,
        node_selector={"ack.node.gpu.schedule": "cgpu"},
        annotations=allocation("cgpu-0", [1], mem=2),
    )
    pods = [_listed(base, i) for i in range(4)]
    device_list = _listed(base, 4)
    device_list["spec"]["containers"][0]["volumeMounts"][0]["mountPath"] = "/var/run/nvidia-container-devices"
    host_path = _listed(base, 5)
    host_path["spec"]["volumes"].append({"name": host_path["spec"]["volumes"][0]["name"], "hostPath": {"path": "/dev"}})
    host_tmp = _listed(base, 6)
    host_tmp["spec"]["volumes"].append({"name": host_tmp["spec"]["volumes"][0]["name"], "hostPath": {"path": "/tmp"}})
    elsewhere = _listed(base, 7)
    elsewhere["metadata"]["annotations"] = allocation("cgpu-1", [1], mem=2)
    finished = _listed(base, 8)
    finished["status"]["phase"] = "Succeeded"
    own_token = _listed(base, 9)
    own_token["spec"]["containers"][0]["env"] = [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": own_token["spec"]["volumes"][0]["name"]}
    ]
    other_token = _listed(base, 10)
    other_token["spec"]["containers"][0]["env"] = [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": own_token["spec"]["volumes"][0]["name"]}
    ]
    two_tokens = _listed(base, 11)
    two_tokens["spec"]["volumes"].append({"name": "kube-api-access-zzzzz", "projected": {"sources": []}})
    return [
        build_node("cgpu-0"),
        build_node("cgpu-1"),
        *pods,
        device_list,
        host_path,
        host_tmp,
        elsewhere,
        finished,
        own_token,
        other_token,
        two_tokens,
        _listed(base, 12),
    ]


@pytest.mark.parametrize("name", list(SETTINGS))
def test_tenant_variations_get_their_own_verdicts_and_the_objects_are_left_unchanged(name: str) -> None:
    settings = settings_.from_mapping(SETTINGS[name])
    objects = _tenant_objects()
    before = copy.deepcopy(objects)

    plain = scan.run(scan.Inventory.of(copy.deepcopy(objects)), settings=settings, now=NOW, remember=False)
    fast = scan.run(scan.Inventory.of(objects), settings=settings, now=NOW)

    assert _everything(fast) == _everything(plain)
    assert _outputs(fast) == _outputs(plain)
    assert objects == before and json.dumps(objects) == json.dumps(before)
    by_subject: dict[tuple[str, str], set[str]] = {}
    for found in plain.findings:
        if found.result in (model.Result.FAIL, model.Result.WARN):
            by_subject.setdefault((found.policy, found.subject.name), set()).add(found.message)
    assert any(policy == "GPU203" and pod.startswith("t-0007") for policy, pod in by_subject), "the replica reserving elsewhere"
    assert not any(policy == "GPU203" and pod.startswith("t-0008") for policy, pod in by_subject), "a finished pod holds nothing"
    assert any(pod.startswith("t-0005") for _, pod in by_subject), "the replica with a hostPath /dev volume"
    assert not any(pod.startswith(("t-0000", "t-0001", "t-000c")) for _, pod in by_subject)


def test_gpu203_on_pods_is_remembered_with_the_template_and_aimed_at_each_replica() -> None:
    base = build_pod("r", namespace="team-a", node_name="cgpu-0", gpu_mem=2, annotations=allocation("cgpu-1", [0], mem=2))
    objects = [build_node("cgpu-0"), build_node("cgpu-1"), *(_listed(base, i) for i in range(3))]

    audit = scan.run(scan.Inventory.of(objects), settings=settings_.Settings(), now=NOW)

    failed = sorted(
        (f.subject.name, f.subject.uid) for f in audit.findings if f.policy == "GPU203" and f.result is model.Result.FAIL
    )
    assert failed == [(f"r-{i:04x}", f"uid-{i:08d}") for i in range(3)]


def test_the_fast_constructors_make_the_same_instances_as_the_dataclasses_own() -> None:
    import dataclasses
    import tracemalloc

    from webhook.audit import findings

    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "", "generateName": "app-", "namespace": "team-a", "uid": "u1"},
    }
    ref = findings.ObjectRef(namespace="team-a", kind="Pod", name="app-", api_version="v1", uid="u1")
    assert findings.ObjectRef.of(pod) == ref and repr(findings.ObjectRef.of(pod)) == repr(ref)
    assert findings.ObjectRef.of({"metadata": "odd", "kind": 3}) == findings.ObjectRef(namespace="", kind="", name="")
    related = (findings.ObjectRef(namespace="", kind="Node", name="n"),)
    fields = dict(
        policy="GPU203",
        rule="r",
        result=model.Result.FAIL,
        action=model.Action.WARN,
        severity=findings.Severity.MEDIUM,
        category="c",
        message="m",
        subject=ref,
        related=related,
    )
    normal = findings.Finding(**fields)  # type: ignore[arg-type]
    fast = findings.finding(**fields)  # type: ignore[arg-type]
    assert fast == normal and repr(fast) == repr(normal) and hash(fast) == hash(normal)
    other = findings.ObjectRef(namespace="team-b", kind="Pod", name="x")
    assert verdicts.retarget(fast, other) == dataclasses.replace(normal, subject=other)

    def held(make: Any) -> int:  # bytes held by 2,000 instances
        tracemalloc.start()
        try:
            made = [make() for _ in range(2_000)]
            size = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        del made
        return size

    plain = held(lambda: findings.Finding(**fields))  # type: ignore[arg-type]
    assert held(lambda: findings.finding(**fields)) <= plain * 1.1  # type: ignore[arg-type]
    assert held(lambda: verdicts.retarget(fast, other)) <= plain * 1.1, "no attribute dict of its own (twice the bytes)"


# --- the policies' results keyed without the node and the allocation (`verdicts.policies_form`) ------

BOUND_VALUES = st.one_of(st.sampled_from(["0", "1", "true", "false", "cgpu-0", '{"node": "cgpu-0", "cards": [1]}', ""]), garbage)


@st.composite
def bound_variants(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """A generated Pod, and the same Pod with its nodeName and allocation annotations changed, added or gone."""
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": copy.deepcopy(draw(test_properties.metadata)),
        "spec": copy.deepcopy(draw(test_properties.pod_spec)),
    }
    pod["metadata"].update(
        namespace=draw(st.sampled_from(["team-a", "team-b", "kube-system"])), name=draw(st.sampled_from(["leak-0001", "app"]))
    )
    if draw(st.booleans()):
        pod["metadata"]["labels"] = {"tier": draw(st.sampled_from(["dev", "prod"]))}
    pod = test_properties.unaliased(pod)
    other = copy.deepcopy(pod)
    for one in (pod, other):
        annotations = one["metadata"].get("annotations")
        if not isinstance(annotations, dict):
            annotations = {} if draw(st.booleans()) else annotations
            if isinstance(annotations, dict):
                one["metadata"]["annotations"] = annotations
        if isinstance(annotations, dict):
            for key in sorted(verdicts.BOUND_ANNOTATIONS):
                if draw(st.booleans()):
                    annotations[key] = draw(BOUND_VALUES)
                else:
                    annotations.pop(key, None)
        node = draw(st.one_of(st.none(), st.sampled_from(["", "cgpu-0", "cpu-0", "exclusive-0"]), garbage))
        if node is None:
            one["spec"].pop("nodeName", None)
        else:
            one["spec"]["nodeName"] = node
    return pod, other


@hypothesis.settings(test_properties.PROPERTY_SETTINGS, max_examples=400)
@hypothesis.given(pair=bound_variants(), name=st.sampled_from(list(SETTINGS)))
def test_no_policy_or_template_check_result_depends_on_the_node_or_the_allocation_annotations(
    pair: tuple[dict[str, Any], dict[str, Any]], name: str
) -> None:
    settings = settings_.from_mapping(SETTINGS[name])
    effective = scan.audit_settings(settings)
    pod, other = pair
    form, other_form = verdicts.policies_form(pod), verdicts.policies_form(other)
    assert form is not None and other_form is not None

    def judged(obj: dict[str, Any]) -> list[Any]:
        namespace = obj["metadata"]["namespace"]
        return scan.evaluate_policies(
            obj,
            namespace=namespace,
            configured=settings,
            effective=effective,
            now=None,
            namespace_labels={"tier": "dev"} if namespace == "team-b" else None,
        )

    def template_checks(obj: dict[str, Any]) -> list[Any]:  # remembered under the same key (`scan.run`)
        return [check.check_template(obj) for check in scan.TEMPLATE_CHECKS]

    assert judged(pod) == judged(other)
    assert template_checks(pod) == template_checks(other)
    annotations = form[0]["metadata"].get("annotations")
    assert "nodeName" not in form[0]["spec"]
    assert not isinstance(annotations, dict) or not verdicts.BOUND_ANNOTATIONS & set(annotations)


def _with_and_without_memo(objects: list[dict[str, Any]]) -> tuple[scan.Audit, scan.Audit, verdicts.Memo]:
    """The scan of ``objects`` with the verdict memo and without it (every output held equal), and the run's memo."""
    made: list[verdicts.Memo] = []
    original = verdicts.Memo.__init__

    def counted(self: verdicts.Memo, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        made.append(self)

    try:
        verdicts.Memo.__init__ = counted  # type: ignore[method-assign]
        fast = scan.run(scan.Inventory.of(copy.deepcopy(objects)), settings=settings_.Settings(), now=NOW)
    finally:
        verdicts.Memo.__init__ = original  # type: ignore[method-assign]
    plain = scan.run(scan.Inventory.of(copy.deepcopy(objects)), settings=settings_.Settings(), now=NOW, remember=False)
    assert _everything(fast) == _everything(plain)
    assert _outputs(fast) == _outputs(plain)
    (memo,) = made
    return fast, plain, memo


def test_replicas_on_other_nodes_and_cards_share_the_policies_results_and_keep_their_own_checks() -> None:
    base = build_pod("s", namespace="team-a", node_name="cgpu-0", gpu_mem=2, node_selector={"ack.node.gpu.schedule": "cgpu"})
    pods = []
    for i, (node, card) in enumerate([("cgpu-0", 0), ("cgpu-0", 1), ("cgpu-1", 2), ("cgpu-1", 3), ("nowhere", 0)]):
        pod = _listed(base, i)
        pod["spec"]["nodeName"] = "cgpu-1" if node == "nowhere" else node
        pod["metadata"]["annotations"] = allocation(node, [card], mem=2)
        pods.append(pod)
    leak = _listed(
        build_pod("leak", namespace="team-a", node_name="cpu-0", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]), 9
    )
    leak["metadata"]["annotations"] = allocation("cpu-0", [0], mem=2)  # forged: GPU001 must still fail it
    objects = [build_node("cgpu-0"), build_node("cgpu-1"), build_node("cpu-0", mode=None), *pods, leak]
    fast, plain, memo = _with_and_without_memo(objects)
    assert memo.policy_hits == 4, "five replicas on other nodes and cards: the policies judged once"
    assert any(f.policy == "GPU203" and f.result is model.Result.FAIL and f.subject.name == "s-0004" for f in plain.findings)
    assert any(f.policy == "GPU001" and f.result is model.Result.FAIL and f.subject.name == "leak-0009" for f in plain.findings)


def test_gpu207_is_remembered_with_the_policies_and_a_tenant_cannot_borrow_a_pinned_replicas_pass() -> None:
    """GPU207 (a template check) is judged once per policies key: replicas of an unpinned gpu-mem
    template on other nodes and cards all fail it; a tenant's pod that differs only in pinning a mode
    (or only in its node and a forged allocation) gets its own verdict, as without the memo."""
    unpinned = build_pod("free", namespace="team-a", node_name="cgpu-0", gpu_mem=2)
    pinned = build_pod("free", namespace="team-a", node_name="cgpu-0", gpu_mem=2, node_selector={"ack.node.gpu.schedule": "cgpu"})
    pods = []
    for i, (node, card) in enumerate([("cgpu-0", 0), ("cgpu-1", 1), ("cgpu-1", 2)]):
        pod = _listed(unpinned, i)
        pod["spec"]["nodeName"] = node
        pod["metadata"]["annotations"] = allocation(node, [card], mem=2)
        pods.append(pod)
    tenant = _listed(pinned, 7)  # pinned: a PASS that the unpinned replicas must not borrow, nor lend their FAIL to
    tenant["metadata"]["annotations"] = allocation("cgpu-0", [3], mem=2)
    forged = _listed(unpinned, 8)  # unpinned on a CPU node with a forged allocation: still fails GPU207
    forged["spec"]["nodeName"] = "cpu-0"
    forged["metadata"]["annotations"] = allocation("cgpu-1", [0], mem=2)
    objects = [build_node("cgpu-0"), build_node("cgpu-1"), build_node("cpu-0", mode=None), *pods, tenant, forged]
    fast, plain, memo = _with_and_without_memo(objects)
    assert memo.policy_hits == 3, "three more unpinned replicas: policies and GPU207 judged once for four pods"
    gpu207 = {f.subject.name: f.result for f in fast.findings if f.policy == "GPU207"}
    assert gpu207 == {
        "free-0000": model.Result.FAIL,
        "free-0001": model.Result.FAIL,
        "free-0002": model.Result.FAIL,
        "free-0007": model.Result.PASS,
        "free-0008": model.Result.FAIL,
    }


def test_a_value_found_only_in_a_failures_policy_id_does_not_keep_the_set_out_and_one_in_its_detail_does() -> None:
    memo = verdicts.Memo(settings_.Settings())
    subject = findings.ObjectRef(namespace="team-a", kind="Pod", name="free-0000", uid="uid-0")
    other = findings.ObjectRef(namespace="team-a", kind="Pod", name="free-0001", uid="uid-1")

    def failing(detail: str) -> findings.Finding:
        return findings.finding(
            "GPU207",
            "mode-selector",
            model.Result.FAIL,
            model.Action.WARN,
            findings.Severity.MEDIUM,
            "GPU Scheduling",
            f"GPU207: summary: {detail}",
            subject,
        )

    memo.put_policies(b"id-only", ["2", "0"], subject, [failing("no nodeSelector")])
    memo.put_policies(b"in-detail", ["2", "0"], subject, [failing("card 2 of node cgpu-0")])
    memo.put_policies(b"prefix-only", ["GPU207"], subject, [failing("no nodeSelector")])
    memo.put_policies(b"no-prefix", ["GPU207"], subject, [dataclasses.replace(failing("x"), message="see GPU207")])
    remembered = memo.get_policies(b"id-only", other)
    assert remembered is not None and [f.subject for f in remembered] == [other]
    assert remembered[0].message == "GPU207: summary: no nodeSelector"
    assert memo.get_policies(b"in-detail", other) is None
    assert memo.get_policies(b"prefix-only", other) is not None
    assert memo.get_policies(b"no-prefix", other) is None


identity_values = st.one_of(st.sampled_from(["", "app-0001", "app-", "team-a", "Pod", "v1", "u1"]), garbage)


@hypothesis.settings(test_properties.PROPERTY_SETTINGS, max_examples=300)
@hypothesis.given(
    fields=st.dictionaries(st.sampled_from(["namespace", "name", "generateName", "uid"]), identity_values),
    top=st.dictionaries(st.sampled_from(["kind", "apiVersion"]), identity_values),
    metadata_shape=st.sampled_from(["dict", "missing", "garbage"]),
)
def test_a_reference_made_field_by_field_is_the_dataclass_reference_of_any_object(
    fields: dict[str, Any], top: dict[str, Any], metadata_shape: str
) -> None:
    obj: dict[str, Any] = dict(top)
    if metadata_shape == "dict":
        obj["metadata"] = fields
    elif metadata_shape == "garbage":
        obj["metadata"] = ["odd"]
    metadata: dict[str, Any] = obj["metadata"] if isinstance(obj.get("metadata"), dict) else {}

    def text(value: object) -> str:
        return value if isinstance(value, str) else ""

    expected = findings.ObjectRef(
        namespace=text(metadata.get("namespace")),
        kind=text(obj.get("kind")),
        name=text(metadata.get("name")) or text(metadata.get("generateName")),
        api_version=text(obj.get("apiVersion")),
        uid=text(metadata.get("uid")),
    )
    made = findings.ObjectRef.of(obj)
    assert made == expected and repr(made) == repr(expected) and made.__dict__ == expected.__dict__
