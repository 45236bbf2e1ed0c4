"""PolicyViolation Events on denied objects: the Event's shape, the rate limit, the bounded queue,
and that the admission answer never waits for (or fails with) an Event."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from policies import settings, trustzone
from webhook.admission import app as admission_app
from webhook.admission import events, keys

NOW = 1_750_000_000.5
GPU_ENV = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]


def denial(name: str = "trainer", *, policies: tuple[str, ...] = ("GPU001",), namespace: str = "team-a") -> events.Denial:
    return events.Denial(
        namespace=namespace,
        kind="Deployment",
        name=name,
        api_version="apps/v1",
        operation="CREATE",
        policies=policies,
        message="m",
    )


def test_the_event_names_the_object_and_the_policy_in_the_objects_namespace() -> None:
    body = events.event_body(
        events.Denial(
            namespace="team-a",
            kind="Deployment",
            name="trainer",
            api_version="apps/v1",
            uid="u-9",
            operation="UPDATE",
            policies=("GPU001", "GPU003"),
            message="GPU001: container main sets NVIDIA_VISIBLE_DEVICES",
        ),
        now=NOW,
    )
    assert body == {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"trainer.{int(NOW * 1e9):x}",
            "namespace": "team-a",
            "labels": {"app.kubernetes.io/managed-by": "gpu-admission"},
        },
        "involvedObject": {"kind": "Deployment", "namespace": "team-a", "name": "trainer", "apiVersion": "apps/v1", "uid": "u-9"},
        "reason": "PolicyViolation",
        "message": "UPDATE denied by GPU001, GPU003: GPU001: container main sets NVIDIA_VISIBLE_DEVICES",
        "type": "Warning",
        "source": {"component": "gpu-admission"},
        "firstTimestamp": "2025-06-15T15:06:40Z",
        "lastTimestamp": "2025-06-15T15:06:40Z",
        "count": 1,
    }


def test_a_long_message_is_cut_to_the_event_limit() -> None:
    body = events.event_body(events.Denial(namespace="n", kind="Pod", name="p", message="x" * 5000), now=NOW)
    assert len(body["message"]) == events.MAX_MESSAGE and body["message"].endswith("...")


def test_a_denial_is_taken_from_the_reviewed_object() -> None:
    obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "trainer-7d9f-", "uid": "u-1"}}
    found = events.Denial.of(
        obj, namespace="team-a", kind="Pod", operation="CREATE", policies=["GPU002", "GPU001", "GPU002"], message="m"
    )
    # a CREATE's object does not exist yet: no uid; a generateName names it
    assert found == events.Denial(
        namespace="team-a",
        kind="Pod",
        name="trainer-7d9f-",
        api_version="v1",
        operation="CREATE",
        policies=("GPU001", "GPU002"),
        message="m",
    )
    assert events.event_body(found, now=NOW)["metadata"]["name"].startswith("trainer-7d9f.")
    updated = events.Denial.of(
        obj | {"metadata": {"name": "p", "uid": "u-1"}}, namespace="t", kind="Pod", operation="UPDATE", policies=[], message=""
    )
    assert updated is not None and updated.uid == "u-1"


@pytest.mark.parametrize(
    "obj",
    [None, {}, {"metadata": "x"}, {"metadata": {"name": 7}}, {"metadata": {}}, "text"],
)
def test_a_malformed_or_nameless_object_gives_no_denial_and_never_raises(obj: Any) -> None:
    assert events.Denial.of(obj, namespace="team-a", kind="Pod", operation="CREATE", policies=["GPU001"], message="m") is None
    assert (
        events.Denial.of({"metadata": {"name": "p"}}, namespace="", kind="Pod", operation="CREATE", policies=[], message="")
        is None
    )


async def test_one_event_per_object_and_policies_per_interval() -> None:
    sent: list[dict[str, Any]] = []
    clock = [100.0]
    recorder = events.Recorder(sent.append, interval_s=60.0, clock=lambda: clock[0], wall=lambda: NOW)
    async with recorder.running():
        assert recorder.record(denial()) is True
        assert recorder.record(denial()) is False  # the same object and policies within a minute
        assert recorder.record(denial(policies=("GPU003",))) is True  # another policy: its own event
        assert recorder.record(denial("other")) is True
        assert recorder.record(denial(namespace="team-b")) is True
        clock[0] += 60.0
        assert recorder.record(denial()) is True  # a minute later: again
        await _until(lambda: len(sent) == 5)
    assert (recorder.recorded, recorder.suppressed, recorder.sent) == (5, 1, 5)
    assert [b["involvedObject"]["name"] for b in sent] == ["trainer", "trainer", "other", "trainer", "trainer"]


async def test_a_full_queue_drops_events_instead_of_waiting() -> None:
    release = threading.Event()
    sent: list[dict[str, Any]] = []

    def slow(body: dict[str, Any]) -> None:
        release.wait(5)
        sent.append(body)

    recorder = events.Recorder(slow, queue_size=2)
    async with recorder.running():
        started = time.perf_counter()
        results = [recorder.record(denial(f"p{i}")) for i in range(10)]
        assert time.perf_counter() - started < 0.05
        # one taken by the sender (maybe), two queued; the rest dropped
        assert results[:2] == [True, True] and results.count(True) <= 3
        assert recorder.dropped == 10 - results.count(True)
        release.set()
        await _until(lambda: len(sent) == results.count(True))


async def test_a_failing_write_is_counted_and_the_next_one_still_goes() -> None:
    calls: list[str] = []

    def flaky(body: dict[str, Any]) -> None:
        calls.append(body["involvedObject"]["name"])
        if len(calls) == 1:
            raise OSError("403 Forbidden: events is forbidden")

    recorder = events.Recorder(flaky)
    async with recorder.running():
        recorder.record(denial("first"))
        recorder.record(denial("second"))
        await _until(lambda: recorder.sent == 1 and recorder.failed == 1)
    assert calls == ["first", "second"]


def test_outside_its_lifetime_the_recorder_drops_and_never_raises() -> None:
    recorder = events.Recorder(lambda body: None)
    assert recorder.record(denial()) is False and recorder.dropped == 1
    assert recorder.record(None) is False


# --- through the webhook --------------------------------------------------------------------------


def _review(obj: dict[str, Any], *, dry_run: bool = False, operation: str = "CREATE") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
            "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
            "namespace": "team-a",
            "name": "trainer",
            "operation": operation,
            "userInfo": {"username": "alice"},
            "object": obj,
            "dryRun": dry_run,
        },
    }


def _deployment(env: list[dict[str, str]] | None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "i"}
    if env:
        container["env"] = env
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "trainer", "namespace": "team-a"},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [container]}},
        },
    }


async def test_a_denied_workload_gets_an_event_and_the_answer_does_not_wait_for_it(aiohttp_client: Callable[..., Any]) -> None:
    release = threading.Event()
    sent: list[dict[str, Any]] = []

    def blocked(body: dict[str, Any]) -> None:
        release.wait(10)  # an apiserver that does not answer
        sent.append(body)

    recorder = events.Recorder(blocked)
    client = await _recording_client(aiohttp_client, recorder)
    started = time.perf_counter()
    answered = await (await client.post("/validate", json=_review(_deployment(GPU_ENV)))).json()
    assert time.perf_counter() - started < 2.0
    assert answered["response"]["allowed"] is False
    assert recorder.recorded == 1
    release.set()
    await _until(lambda: len(sent) == 1)
    (body,) = sent
    assert body["involvedObject"] == {"kind": "Deployment", "namespace": "team-a", "name": "trainer", "apiVersion": "apps/v1"}
    assert body["metadata"]["namespace"] == "team-a" and body["reason"] == "PolicyViolation"
    assert body["message"].startswith("CREATE denied by GPU001: ")
    assert answered["response"]["status"]["message"] in body["message"]


async def test_allowed_and_dry_run_reviews_record_nothing(aiohttp_client: Callable[..., Any]) -> None:
    sent: list[dict[str, Any]] = []
    recorder = events.Recorder(sent.append)
    client = await _recording_client(aiohttp_client, recorder)
    allowed = await (await client.post("/validate", json=_review(_deployment(None)))).json()
    dry = await (await client.post("/validate", json=_review(_deployment(GPU_ENV), dry_run=True))).json()
    assert allowed["response"]["allowed"] is True and dry["response"]["allowed"] is False
    await asyncio.sleep(0)
    assert recorder.recorded == 0 and recorder.dropped == 0 and sent == []


async def _recording_client(aiohttp_client: Callable[..., Any], recorder: events.Recorder) -> Any:
    """A test client of the admission app with the default settings, its Events sent to `recorder`."""
    app = admission_app.make_app(settings.Settings())
    app[keys.EVENTS] = recorder
    app.cleanup_ctx.append(recorder.lifetime)
    return await aiohttp_client(app)


async def _until(condition: Callable[[], bool], *, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def _kept_off_pod(*, privileged: bool = True, name: str = "dind-x7k2p") -> dict[str, Any]:
    """A pod as /validate sees it: generated name and uid set, GPU103's affinity in place."""
    terms = [{"matchExpressions": [dict(e) for e in trustzone.DEFAULT_ZONE.keep_off]}]
    container: dict[str, Any] = {"name": "dind", "image": "docker:dind"}
    if privileged:
        container["securityContext"] = {"privileged": True}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "generateName": "dind-", "namespace": "ci", "uid": "3f1c-uid"},
        "spec": {
            "containers": [container],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}},
        },
    }


def _pod_review(obj: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
    review = _review(obj, dry_run=dry_run)
    request = review["request"]
    request.update(
        kind={"group": "", "version": "v1", "kind": "Pod"}, resource={"group": "", "version": "v1", "resource": "pods"}
    )
    request.update(namespace="ci", name=obj["metadata"]["name"])
    return review


async def test_a_pod_kept_off_gpu_nodes_gets_gpu103s_notice_as_an_event_with_its_uid(aiohttp_client: Callable[..., Any]) -> None:
    sent: list[dict[str, Any]] = []
    recorder = events.Recorder(sent.append)
    client = await _recording_client(aiohttp_client, recorder)

    answered = await (await client.post("/validate", json=_pod_review(_kept_off_pod()))).json()
    assert answered["response"]["allowed"] is True
    await _until(lambda: len(sent) == 1)
    (body,) = sent
    assert body["involvedObject"] == {
        "kind": "Pod",
        "namespace": "ci",
        "name": "dind-x7k2p",
        "apiVersion": "v1",
        "uid": "3f1c-uid",
    }
    assert body["reason"] == "KeptOffGpuNodes" and body["type"] == "Normal"
    assert body["message"] == (
        'GPU103: kept off GPU nodes (required node affinity against every GPU node label): container "dind" is '
        "privileged, which GPU nodes do not allow"
    )

    # No node power, a dry run, or an affinity that leaves a GPU node open: no notice.
    plain = await (await client.post("/validate", json=_pod_review(_kept_off_pod(privileged=False, name="plain")))).json()
    dry = await (await client.post("/validate", json=_pod_review(_kept_off_pod(name="dry"), dry_run=True))).json()
    assert plain["response"]["allowed"] is True and dry["response"]["allowed"] is True
    await asyncio.sleep(0.05)
    assert len(sent) == 1
