"""Per-pod GPU use on shared cards: the figures (use beside allocation), their metrics as pods come
and go (no stale series), the stale flag, and the limits (Events in observe, evictions in evict)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from policies import gpu, settings
from policies.gpu import allocation, usage
from webhook.kube import errors as kube_errors
from webhook.labeler import health, inventory, limits, podusage, runner
from webhook.serving import metrics

NODE = "gpu-0"
UID_A = "6f0c2a1e-9b7d-4c3e-8a5f-1d2e3f4a5b6c"
UID_B = "7a1d3b2f-0c8e-4d4f-9b6a-2e3f4a5b6c7d"
UID_W = "8b2e4c3a-1d9f-4e5a-8c7b-3f4a5b6c7d8e"


def cgroup(uid: str, cid: str) -> str:
    return f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid.replace('-', '_')}.slice/cri-containerd-{cid}.scope\n"


def pod(uid: str, name: str, *, cards: list[int], gib: int, whole: bool = False, namespace: str = "ml") -> dict[str, Any]:
    annotation = json.dumps(
        {"node": NODE, "cards": cards, "memGiB": gib, "corePercent": 0, "whole": whole, "assumedAt": "2026-11-26T12:00:00.000Z"}
    )
    return {
        "metadata": {"uid": uid, "namespace": namespace, "name": name, "annotations": {gpu.ALLOCATION_ANNOTATION: annotation}},
        "spec": {"nodeName": NODE},
        "status": {"phase": "Running"},
    }


def summary(*cards: tuple[int, list[tuple[str, str, int]]], unknown: tuple[int, ...] = ()) -> usage.NodeUsage:
    return usage.NodeUsage(
        cards=tuple(
            usage.CardUse(
                index=index,
                total_mib=16384,
                pods=tuple(usage.PodUse(uid=u, namespace="ml", name=n, used_mib=m) for u, n, m in pods),
                unknown=unknown if index == 0 else (),
            )
            for index, pods in cards
        )
    )


# --- the figures -------------------------------------------------------------------------------------


def test_figures_put_each_pods_use_beside_its_allocation_per_card() -> None:
    found = podusage.figures(
        summary((0, [(UID_A, "train-0", 6144)]), (1, [(UID_A, "train-0", 100)])),
        [pod(UID_A, "train-0", cards=[0], gib=4), pod(UID_B, "idle-0", cards=[1], gib=2)],
        node=NODE,
        mode=gpu.Mode.SHARE,
        now=0.0,
    )
    assert [(f.name, f.card, f.used_mib, f.requested_mib, f.over_mib) for f in found] == [
        ("idle-0", 1, 0, 2048, 0),  # allocated, no process yet
        ("train-0", 0, 6144, 4096, 2048),  # share: any excess counts
        ("train-0", 1, 100, 0, 100),  # a card it was not given
    ]


def test_the_tolerance_applies_off_share_and_whole_cards_are_never_over() -> None:
    found = podusage.figures(
        summary((0, [(UID_A, "train-0", 4096 + 512)]), (1, [(UID_W, "whole-0", 16000)])),
        [pod(UID_A, "train-0", cards=[0], gib=4), pod(UID_W, "whole-0", cards=[1], gib=16, whole=True)],
        node=NODE,
        mode=gpu.Mode.CGPU,
        now=0.0,
    )
    assert [(f.name, f.over_mib, f.whole) for f in found] == [("train-0", 0, False), ("whole-0", 0, True)]


def test_a_pod_without_an_allocation_has_no_request_to_compare() -> None:
    unallocated = {"metadata": {"uid": UID_B, "namespace": "ml", "name": "gpu-op"}, "spec": {"nodeName": NODE}}
    found = podusage.figures(summary((0, [(UID_B, "gpu-op", 9000)])), [unallocated], node=NODE, mode=gpu.Mode.SHARE, now=0.0)
    assert [(f.name, f.requested_mib, f.over_mib) for f in found] == [("gpu-op", None, 0)]
    assert allocation.pod_allocation(unallocated, now=0.0) is None


# --- the runner, the metrics, pods coming and going ----------------------------------------------------


class Pods:
    def __init__(self, pods: list[Mapping[str, Any]]) -> None:
        self.pods = pods
        self.fail = False

    def pods_on(self, node_name: str) -> list[Mapping[str, Any]]:
        if self.fail:
            raise kube_errors.ServerError("list pods: 500")
        return list(self.pods)


class Actions:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, bool]] = []
        self.evicted: list[str] = []
        self.refuse: kube_errors.KubeError | None = None

    def record(self, pod: limits.Target, *, reason: str, message: str, warning: bool) -> None:
        self.events.append((pod.name, reason, warning))
        self.messages = [*getattr(self, "messages", []), message]

    def evict(self, pod: limits.Target) -> None:
        if self.refuse is not None:
            raise self.refuse
        self.evicted.append(pod.name)


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def card(index: int, processes: tuple[tuple[int, int], ...]) -> inventory.Card:
    return inventory.Card(
        index=index,
        uuid=f"GPU-{index}",
        name="Tesla T4",
        memory_mib=16384,
        used_mib=sum(m for _, m in processes),
        processes=tuple(inventory.Process(pid=pid, used_mib=mib) for pid, mib in processes),
    )


@pytest.fixture
def world(tmp_path: Path, fake_nodes: Any, node: Any) -> Any:
    root = tmp_path / "proc"
    for pid, uid in ((100, UID_A), (200, UID_B)):
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cgroup").write_text(cgroup(uid, "ab" * 32))
    nodes = fake_nodes(node(NODE, labels={gpu.SCHEDULE_LABEL: "share"}))
    pods = Pods([pod(UID_A, "train-0", cards=[0], gib=4), pod(UID_B, "infer-0", cards=[0], gib=8)])
    state: dict[str, Any] = {"inv": inventory.make([card(0, ((100, 2048), (200, 4096)))]), "fail": None}
    clock = Clock()
    actions = Actions()

    def source() -> inventory.Inventory:
        if state["fail"] is not None:
            raise state["fail"]
        return state["inv"]  # type: ignore[no-any-return]

    def make(limit_settings: settings.Settings = settings.Settings()) -> runner.Runner:
        enforcer = limits.Enforcer(node=NODE, limit_of=limit_settings.usage_limit, actions=actions, base_s=10, cap_s=40)
        return runner.Runner(
            source=source,
            nodes=nodes,
            pods=pods,
            clock=clock,
            wall_clock=lambda: 1_700_000_000.0,
            enforcer=enforcer,
            options=runner.Options(node_name=NODE, proc_root=root),
        )

    return state, pods, clock, actions, make


def pod_samples(loop: runner.Runner, metric: str) -> dict[tuple[str, str, str], float]:
    found = {}
    for (name, labels), value in metrics.samples(health.registry(loop).render()).items():
        if name == metric:
            by = dict(labels)
            found[(by["namespace"], by["pod"], by["card"])] = value
    return found


def test_per_pod_series_follow_the_pods_and_none_stays_behind(world: Any) -> None:
    state, pods, _, _, make = world
    loop = make()
    loop.step()
    assert pod_samples(loop, health.POD_USED_METRIC) == {("ml", "train-0", "0"): 2048, ("ml", "infer-0", "0"): 4096}
    assert pod_samples(loop, health.POD_REQUESTED_METRIC) == {("ml", "train-0", "0"): 4096, ("ml", "infer-0", "0"): 8192}
    assert metrics.sample(health.registry(loop).render(), health.USAGE_STALE_METRIC) == 0
    # infer-0 ends: its process goes, the pod is deleted; its series go with it.
    state["inv"] = inventory.make([card(0, ((100, 2048),))])
    pods.pods = pods.pods[:1]
    loop.step()
    assert pod_samples(loop, health.POD_USED_METRIC) == {("ml", "train-0", "0"): 2048}
    assert pod_samples(loop, health.POD_REQUESTED_METRIC) == {("ml", "train-0", "0"): 4096}
    # A new pod comes: its series appear.
    pods.pods = [*pods.pods, pod(UID_B, "infer-1", cards=[0], gib=2)]
    state["inv"] = inventory.make([card(0, ((100, 2048), (200, 1024)))])
    loop.step()
    assert pod_samples(loop, health.POD_USED_METRIC) == {("ml", "train-0", "0"): 2048, ("ml", "infer-1", "0"): 1024}


def test_a_failed_read_or_pod_list_marks_the_figures_stale_and_nothing_acts(world: Any) -> None:
    from webhook.labeler import nvml

    state, pods, clock, actions, make = world
    state["inv"] = inventory.make([card(0, ((100, 9000),))])
    loop = make(
        settings.from_mapping({"usageLimits": [{"name": "ml", "namespaces": ["ml"], "mode": "evict", "gracePeriodSeconds": 0}]})
    )
    state["fail"] = nvml.Unavailable("no libnvidia-ml")
    loop.step()  # never read: nothing at all
    assert loop.usage_stale and metrics.sample(health.registry(loop).render(), health.USAGE_STALE_METRIC) == 1
    state["fail"] = None
    pods.fail = True
    loop.step()
    assert loop.usage_stale == "listing the node's pods failed"
    assert actions.events == [] and actions.evicted == []
    pods.fail = False
    state["inv"] = inventory.make([card(0, ((100, 9000), (999, 10)))])  # pid 999: no cgroup to read
    loop.step()
    assert loop.usage_stale == "the cgroups of 1 GPU process(es) could not be read"
    assert actions.events == [] and actions.evicted == []
    state["inv"] = inventory.make([card(0, ((100, 9000),))])
    loop.step()
    assert loop.usage_stale == "" and actions.evicted == ["train-0"]


def test_observe_sends_an_event_going_above_and_one_coming_back(world: Any) -> None:
    state, _, clock, actions, make = world
    loop = make()
    loop.step()
    assert actions.events == []  # both within their request
    state["inv"] = inventory.make([card(0, ((100, 6144), (200, 4096)))])
    for _ in range(3):
        clock.now += 600
        loop.step()
    assert actions.events == [("train-0", limits.ABOVE_REASON, True)]  # once, however long, never evicted
    assert "card 0 holds 6144 MiB of its 4096 MiB, 2048 MiB above" in actions.messages[0]
    state["inv"] = inventory.make([card(0, ((100, 3000), (200, 4096)))])
    loop.step()
    assert actions.events[1:] == [("train-0", limits.UNDER_REASON, False)] and actions.evicted == []


def test_a_pod_whose_processes_end_gets_its_event_back_under(world: Any) -> None:
    state, _, _, actions, make = world
    loop = make()
    state["inv"] = inventory.make([card(0, ((100, 6144),))])
    loop.step()
    state["inv"] = inventory.make([card(0, ())])  # its processes ended; the pod is still there
    loop.step()
    assert actions.events == [("train-0", limits.ABOVE_REASON, True), ("train-0", limits.UNDER_REASON, False)]
    loop.step()
    assert len(actions.events) == 2


EVICT_ML = {"usageLimits": [{"name": "ml-batch", "namespaces": ["ml"], "mode": "evict", "gracePeriodSeconds": 300}]}


def test_evict_waits_for_the_grace_period_and_touches_only_the_pod_above(world: Any) -> None:
    state, _, clock, actions, make = world
    loop = make(settings.from_mapping(EVICT_ML))
    state["inv"] = inventory.make([card(0, ((100, 6144), (200, 4096)))])
    loop.step()
    clock.now += 299
    loop.step()
    assert actions.evicted == []  # not before the grace period
    clock.now += 1
    loop.step()
    assert actions.evicted == ["train-0"]
    assert [e[1] for e in actions.events] == [limits.ABOVE_REASON, limits.EVICTED_REASON]
    assert (
        "evicted: above its GPU memory request on node gpu-0: card 0 holds 6144 MiB of its 4096 MiB, 2048 MiB above, for 300s"
        in actions.messages[1]
    )
    clock.now += 600
    loop.step()
    assert actions.evicted == ["train-0"]  # once
    text = health.registry(loop).render()
    assert metrics.sample(text, health.EVICTIONS_METRIC, result="evicted") == 1


def test_a_refused_eviction_is_reported_once_and_retried_with_backoff_never_forced(world: Any) -> None:
    state, _, clock, actions, make = world
    loop = make(
        settings.from_mapping({"usageLimits": [{"name": "ml", "namespaces": ["ml"], "mode": "evict", "gracePeriodSeconds": 0}]})
    )
    actions.refuse = kube_errors.TooManyRequests(
        "evict pod ml/train-0: 429 Cannot evict pod as it would violate the pod's disruption budget."
    )
    state["inv"] = inventory.make([card(0, ((100, 6144),))])
    tries = []
    for _ in range(8):
        before = loop.enforcer.evictions.get("refused", 0) if loop.enforcer else 0
        loop.step()
        after = loop.enforcer.evictions.get("refused", 0) if loop.enforcer else 0
        tries.append(after - before)
        clock.now += 10
    assert tries == [1, 1, 0, 1, 0, 0, 0, 1]  # waits of 10, 20, 40 s (capped at 40)
    refused = [m for m in actions.messages if "eviction refused" in m]
    assert len(refused) == 1 and "disruption budget" in refused[0] and actions.evicted == []
    actions.refuse = None
    clock.now += 40
    loop.step()
    assert actions.evicted == ["train-0"]


def test_pods_in_other_namespaces_and_whole_card_pods_are_never_evicted(world: Any) -> None:
    state, pods, clock, actions, make = world
    pods.pods = [
        pod(UID_A, "train-0", cards=[0], gib=4, namespace="research"),
        pod(UID_B, "whole-0", cards=[0], gib=16, whole=True),
    ]
    loop = make(settings.from_mapping(EVICT_ML))
    state["inv"] = inventory.make([card(0, ((100, 9000), (200, 16000)))])
    for _ in range(3):
        loop.step()
        clock.now += 1000
    assert actions.evicted == [] and actions.events == [("train-0", limits.ABOVE_REASON, True)]


# --- settings -----------------------------------------------------------------------------------------


def test_usage_limits_default_to_observe_and_the_first_match_decides() -> None:
    found = settings.from_mapping({"usageLimits": [*EVICT_ML["usageLimits"], {"name": "all-ml", "namespaces": ["ml", "lab"]}]})
    assert found.usage_limit("ml").mode == "evict" and found.usage_limit("ml").grace_s == 300
    assert found.usage_limit("lab").mode == "observe" and found.usage_limit("lab").grace_s == settings.DEFAULT_USAGE_GRACE_S
    assert found.usage_limit("other") == settings.DEFAULT_USAGE_LIMIT and settings.Settings().usage_limit("ml").mode == "observe"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"name": "x", "mode": "evict"}, r"usageLimits\[0\]: entry 'x' is not anchored to namespaces"),
        (
            {"name": "x", "namespaces": ["ml"], "mode": "kill"},
            r"usageLimits\[0\].mode: must be one of observe, evict, got 'kill'",
        ),
        (
            {"name": "x", "namespaces": ["ml"], "gracePeriodSeconds": "5m"},
            r"usageLimits\[0\].gracePeriodSeconds: must be a whole number",
        ),
        ({"name": "x", "namespaces": ["ml"], "graceperiod": 5}, r"usageLimits\[0\].graceperiod: unknown key"),
        (
            {"name": "x", "namespaceSelector": {"matchExpressions": [{"key": "t", "operator": "NotIn", "values": ["a"]}]}},
            "not anchored",
        ),
    ],
)
def test_bad_usage_limits_are_refused_naming_the_key(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(settings.InvalidSettings, match=message):
        settings.from_mapping({"usageLimits": [entry]})


def test_the_labeler_reads_only_usage_limits_and_refuses_what_it_cannot_judge(tmp_path: Path) -> None:
    from webhook.cmdline import errors
    from webhook.labeler import cli

    good = tmp_path / "config.yaml"
    good.write_text(
        json.dumps({"policies": {"TEAM001": {"action": "warn"}}, **EVICT_ML})
    )  # a user policy the labeler does not load
    assert cli._usage_limits(good).usage_limit("ml").mode == "evict"
    selector = tmp_path / "selector.yaml"
    selector.write_text(json.dumps({"usageLimits": [{"name": "x", "namespaceSelector": {"matchLabels": {"team": "ml"}}}]}))
    with pytest.raises(errors.InputError, match=r"usageLimits\[0\].namespaceSelector: the labeler reads no namespace labels"):
        cli._usage_limits(selector)
    bad = tmp_path / "bad.yaml"
    bad.write_text(json.dumps({"usageLimits": [{"name": "x", "namespaces": ["ml"], "mode": "kill"}]}))
    with pytest.raises(errors.InputError, match=r"usageLimits\[0\].mode: must be one of observe, evict"):
        cli._usage_limits(bad)


def test_the_limits_file_is_read_again_when_it_changes_and_a_bad_change_keeps_the_last_good(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from webhook.cmdline import errors
    from webhook.labeler import cli

    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(EVICT_ML))
    now = [0.0]
    live = limits.LimitsFile(path, read=cli._usage_limits, every_s=10.0, clock=lambda: now[0])
    assert live.usage_limit("ml").mode == "evict"
    path.write_text(json.dumps({"usageLimits": [{"name": "ml", "namespaces": ["ml"], "mode": "observe"}]}))
    now[0] = 5.0
    assert live.usage_limit("ml").mode == "evict" and live.reloads == 0  # looked at no more than once per every_s
    now[0] = 11.0
    assert live.usage_limit("ml").mode == "observe" and live.reloads == 1
    path.write_text(json.dumps({"usageLimits": [{"name": "ml", "namespaces": ["ml"], "mode": "kill"}]}))
    now[0] = 22.0
    with caplog.at_level(logging.ERROR, logger="webhook.labeler.limits"):
        assert live.usage_limit("ml").mode == "observe"  # the last good limits stay
    assert live.refusals == 1 and "usageLimits[0].mode: must be one of observe, evict" in caplog.text
    now[0] = 33.0
    assert live.usage_limit("ml").mode == "observe" and live.refusals == 1  # the same bad bytes: not read again
    path.unlink()
    now[0] = 44.0
    assert live.usage_limit("ml").mode == "observe" and live.refusals == 2  # gone: refused, the last good stay
    path.write_text(json.dumps(EVICT_ML))
    now[0] = 55.0
    assert live.usage_limit("ml").mode == "evict" and live.reloads == 2
    # At start a bad file is an error, not a default.
    path.write_text(json.dumps({"usageLimits": [{"name": "x", "namespaces": ["ml"], "mode": "kill"}]}))
    with pytest.raises(errors.InputError, match=r"usageLimits\[0\].mode"):
        limits.LimitsFile(path, read=cli._usage_limits)
