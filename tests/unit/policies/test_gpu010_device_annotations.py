"""GPU010: pod annotations that container runtimes or their NRI plugins read as device requests are
refused on create, on workload templates and when a pod UPDATE adds or changes one; ordinary
annotations, removals and kubelet-delivered devices pass."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from policies import engine, gpu, model, settings
from tests.unit.policies.conftest import ContainerFactory, Evaluate, PodFactory, WorkloadFactory
from webhook.audit import scan

SUMMARY = "GPU010: pod annotations must not ask the container runtime for devices (CDI or NRI device injection): "
INSTEAD = (
    "ask for GPUs as resources (nvidia.com/gpu, aliyun.com/gpu-mem) so the scheduler and the device plugin "
    "hand them out, or ask an admin for a namespace exception for a trusted device workload"
)
# Every key spelling a reader on the node acts on (CDI's prefix, the toolkit's NRI plugin with its
# container/pod scopes and bare key, NRI's device-injector).
DEVICE_KEYS = [
    "cdi.k8s.io/gpu",
    "cdi.k8s.io/nvidia.com_gpu-all",
    "nvidia.cdi.k8s.io/container.main",
    "nvidia.cdi.k8s.io/pod",
    "nvidia.cdi.k8s.io",
    "cdi-devices.noderesource.dev/container.main",
    "cdi-devices.nri.io/pod",
    "devices.noderesource.dev/container.main",
    "devices.nri.io",
    "mounts.noderesource.dev/pod",
    "mounts.nri.io/container.main",
]


def gpu010(decision: model.Decision) -> list[str]:
    return [v.message for v in decision.violations if v.policy == "GPU010"]


@pytest.mark.parametrize("key", DEVICE_KEYS)
def test_a_device_annotation_on_a_pod_is_refused_with_the_key_and_what_to_do(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, key: str
) -> None:
    decision = evaluate(pod(container(), annotations={key: "nvidia.com/gpu=all", "team": "ml"}))

    assert not decision.allowed
    assert gpu010(decision) == [
        f"{SUMMARY}annotation {key} asks the node's container runtime for devices (CDI or NRI device injection) "
        f"outside the scheduler's accounting; remove it and {INSTEAD}"
    ]


def test_several_keys_are_named_together(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    decision = evaluate(
        pod(
            container(gpu={"nvidia.com/gpu": 1}),
            annotations={"nvidia.cdi.k8s.io/pod": "runtime.nvidia.com/gpu=all", "cdi.k8s.io/x": "nvidia.com/gpu=all"},
        )
    )

    [message] = gpu010(decision)
    assert "annotation cdi.k8s.io/x, nvidia.cdi.k8s.io/pod asks" in message and "remove them and" in message


@pytest.mark.parametrize(
    "kind", ["Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "ReplicationController", "Job", "CronJob"]
)
def test_a_workload_template_carrying_one_is_refused(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, workload: WorkloadFactory, kind: str
) -> None:
    decision = evaluate(workload(kind, pod(container(), annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=0"})))

    [message] = gpu010(decision)
    assert message.startswith(f"{SUMMARY}the pod template: annotation cdi.k8s.io/gpu asks")


@pytest.mark.parametrize(
    "key",
    [
        "CDI.K8S.IO/gpu",  # keys are case-sensitive: no reader looks this up
        "cdi.k8s.io.gpu",  # not the prefix
        "xcdi.k8s.io/gpu",
        "cdi.k8s.iox/gpu",
        "example.com/cdi.k8s.io",
        "nvidia.com/gpu",
        "kubectl.kubernetes.io/default-container",
        "gpu-admission.io/gpu-model",
        "prometheus.io/scrape",
    ],
)
def test_other_annotations_pass(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, key: str) -> None:
    decision = evaluate(pod(container(gpu={"nvidia.com/gpu": 1}), annotations={key: "nvidia.com/gpu=all"}))

    assert gpu010(decision) == []
    assert next(r.result for r in decision.results if r.policy == "GPU010") is model.Result.PASS


def test_a_pod_without_annotations_or_with_malformed_ones_passes(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    plain = evaluate(pod(container()))
    malformed = pod(container())
    malformed["metadata"]["annotations"] = ["cdi.k8s.io/gpu"]

    assert plain.allowed and gpu010(plain) == []
    assert gpu010(evaluate(malformed)) == []


def test_kubelet_delivered_cdi_devices_are_not_pod_annotations(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    # A device plugin or DRA driver answers the kubelet with CDI devices (or annotations) for the CRI
    # container config; the pod asks only for the resource or claim, which passes.
    claims = pod(
        container(gpu={"nvidia.com/gpu": 2}, resources={"limits": {"nvidia.com/gpu": 2}, "claims": [{"name": "gpu"}]}),
        resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}],
    )

    assert evaluate(claims).allowed


# --- pod UPDATE -------------------------------------------------------------------------------------


def update(evaluate: Any, old: dict[str, Any], new: dict[str, Any]) -> model.Decision:
    decision: model.Decision = evaluate(new, operation="UPDATE", old=old)
    return decision


def test_an_update_that_adds_one_is_refused(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    old = pod(container(), annotations={"team": "ml"})
    new = pod(container(), annotations={"team": "ml", "nvidia.cdi.k8s.io/container.main": "nvidia.com/gpu=all"})

    assert gpu010(update(evaluate, old, new)) == [
        f"{SUMMARY}the update adds nvidia.cdi.k8s.io/container.main, which asks the node's container runtime for "
        f"devices outside the scheduler's accounting; leave it out: {INSTEAD}"
    ]


def test_an_update_that_changes_one_is_refused_and_one_that_keeps_or_removes_it_passes(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    # A pod admitted before GPU010 (or in an exempt namespace, then moved on) keeps taking edits.
    old = pod(container(), annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=0"})
    changed = pod(container(), annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=all"})
    kept = pod(container(), annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=0", "note": "x"})
    removed = pod(container(), annotations={"note": "x"})

    [message] = gpu010(update(evaluate, old, changed))
    assert "the update changes cdi.k8s.io/gpu, which asks" in message
    assert gpu010(update(evaluate, old, kept)) == []
    assert gpu010(update(evaluate, old, removed)) == []


def test_an_update_with_no_old_object_reads_as_adding(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    new = pod(container(), annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=all"})

    [message] = gpu010(evaluate(new, operation="UPDATE", old=None))
    assert "the update adds cdi.k8s.io/gpu" in message


def test_ordinary_updates_of_a_running_gpu_pod_pass(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    old = pod(container(gpu={"nvidia.com/gpu": 1}), annotations={"team": "ml"})
    new = pod(container(gpu={"nvidia.com/gpu": 1}), annotations={"team": "ml", "note": "relabelled"})

    decision = update(evaluate, old, new)
    assert decision.allowed and gpu010(decision) == []


def test_the_ephemeral_containers_subresource_is_not_judged(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    old = pod(container(), annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=all"})
    new = pod(
        container(), ephemeral=[{"name": "debug", "image": "busybox"}], annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=all"}
    )

    decision = evaluate(new, operation="UPDATE", old=old, subresource="ephemeralcontainers")
    assert gpu010(decision) == []


def test_the_policy_judges_pod_updates_and_stored_pods() -> None:
    [policy] = [p for p in engine.POLICIES if p.id == "GPU010"]

    assert policy.pod_updates and policy.stored_objects
    assert policy in scan.VALIDATORS


@pytest.mark.parametrize("key", DEVICE_KEYS)
def test_the_vocabulary_names_every_key_a_reader_acts_on(key: str) -> None:
    assert gpu.is_device_annotation(key)


@pytest.mark.parametrize("key", [None, 3, "", "/", "cdi.k8s.io.", "Cdi.k8s.io/x", "nvidia.cdi.k8s.io.pod"])
def test_the_vocabulary_refuses_nothing_else(key: object) -> None:
    assert not gpu.is_device_annotation(key)


# --- CRI-O's devices annotation ---------------------------------------------------------------------

CRIO_ALLOWED = "/dev/fuse, /dev/net/tun"


@pytest.mark.parametrize("key", gpu.CRIO_DEVICES_ANNOTATIONS)
@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("/dev/nvidia0", "/dev/nvidia0"),
        ("/dev/fuse,/dev/nvidiactl:/dev/nvidiactl:rw", "/dev/nvidiactl"),
        ("/dev/nvidia0,/dev/nvidia-uvm", "/dev/nvidia0, /dev/nvidia-uvm"),
        ("/dev/../dev/fuse", "/dev/../dev/fuse"),  # CRI-O compares the path exactly: not its default
    ],
)
def test_crios_devices_annotation_naming_another_device_is_refused(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, key: str, value: str, named: str
) -> None:
    decision = evaluate(pod(container(), annotations={key: value}))

    assert gpu010(decision) == [
        f"{SUMMARY}annotation {key} asks CRI-O for the host device {named}, beyond its default allowed devices "
        f"({CRIO_ALLOWED}); name only those, or {INSTEAD}"
    ]


@pytest.mark.parametrize("value", ["/dev/fuse", "/dev/fuse:/dev/fuse:rwm", "/dev/net/tun,/dev/fuse", "", ","])
@pytest.mark.parametrize("key", gpu.CRIO_DEVICES_ANNOTATIONS)
def test_crios_default_devices_pass(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, key: str, value: str
) -> None:
    # Rootless image builds in pods (buildah, podman) ask CRI-O for /dev/fuse this way.
    assert gpu010(evaluate(pod(container(), annotations={key: value}))) == []


def test_crios_devices_annotation_in_a_template_and_added_later_is_refused(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, workload: WorkloadFactory
) -> None:
    template = evaluate(workload("Job", pod(container(), annotations={"devices.crio.io": "/dev/nvidia0"})))
    old = pod(container(), annotations={"io.kubernetes.cri-o.Devices": "/dev/fuse"})
    widened = pod(container(), annotations={"io.kubernetes.cri-o.Devices": "/dev/fuse,/dev/nvidia0"})
    narrowed = pod(container(), annotations={"io.kubernetes.cri-o.Devices": "/dev/fuse", "note": "x"})

    [message] = gpu010(template)
    assert message.startswith(
        f"{SUMMARY}the pod template: annotation devices.crio.io asks CRI-O for the host device /dev/nvidia0"
    )
    [changed] = gpu010(update(evaluate, old, widened))
    assert "the update changes io.kubernetes.cri-o.Devices, which asks" in changed
    assert gpu010(update(evaluate, widened, narrowed)) == []


def test_a_malformed_crio_value_is_refused_not_guessed(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    obj = pod(container())
    obj["metadata"]["annotations"] = {"devices.crio.io": ["/dev/nvidia0"]}

    [message] = gpu010(evaluate(obj))
    assert "asks CRI-O for the host device ['/dev/nvidia0']" in message


def test_the_audit_reports_a_stored_pod_that_carries_one(pod: PodFactory, container: ContainerFactory) -> None:
    stored = pod(container(), annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=all"}, nodeName="gpu-0")

    audit = scan.run(
        scan.Inventory.of([stored]),
        settings=settings.Settings(),
        now=datetime.datetime(2026, 6, 1, tzinfo=datetime.UTC).timestamp(),
    )

    [finding] = [f for f in audit.findings if f.policy == "GPU010"]
    assert finding.result is model.Result.FAIL and "annotation cdi.k8s.io/gpu asks" in finding.message
