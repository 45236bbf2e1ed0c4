"""The labeler's real-use reading: the inventory file's usage fields, process -> pod attribution,
the rate-limited usage annotation, and `--dry-run`'s per-process view."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from policies import gpu
from policies.gpu import usage
from webhook.kube import errors as kube_errors
from webhook.labeler import attribution, cgroups, cli, inventory, runner

NODE = "gpu-0"
UID_A = "6f0c2a1e-9b7d-4c3e-8a5f-1d2e3f4a5b6c"
UID_GONE = "11111111-2222-4333-8444-555555555555"
STATIC_HASH = "d41d8cd98f00b204e9800998ecf8427e"
CID = "ab" * 32


def cgroup_systemd(uid: str) -> str:
    return f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n"


def proc_root(tmp_path: Path, entries: Mapping[int, str]) -> Path:
    root = tmp_path / "proc"
    for pid, text in entries.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cgroup").write_text(text)
    return root


PROCS = {
    100: cgroup_systemd(UID_A),
    101: f"0::/kubepods/burstable/pod{UID_A}/{'cd' * 32}\n",  # the same pod, a second process
    200: f"0::/system.slice/docker-{CID}.scope\n",  # docker run --gpus
    300: cgroup_systemd(UID_GONE),  # a pod the apiserver does not have (deleted, leftover)
    400: f"0::/kubepods/besteffort/pod{STATIC_HASH}/{CID}\n",  # a static pod, mirrored
    500: "0::/user.slice/user-0.slice/session-1.scope\n",  # a shell on the node
}
PODS = [
    attribution.PodRef(uid=UID_A, namespace="ml", name="train-0"),
    attribution.PodRef(uid="mirror-uid", namespace="kube-system", name="gpu-probe-gpu-0", config_hash=STATIC_HASH),
]


def card(index: int = 0, *, used: int | None = 12000, processes: tuple[tuple[int, int | None], ...] = ()) -> inventory.Card:
    return inventory.Card(
        index=index,
        uuid=f"GPU-{index}",
        name="Tesla T4",
        memory_mib=15360,
        used_mib=used,
        processes=tuple(inventory.Process(pid=pid, used_mib=mib) for pid, mib in processes),
    )


ALL = ((100, 1000), (101, 500), (200, 3000), (300, 700), (400, 200), (500, None), (999, 50))


# --- the inventory file ---------------------------------------------------------------------------


def test_the_inventory_file_carries_used_memory_and_processes() -> None:
    document = {
        "gpus": [
            {
                "index": 0,
                "uuid": "GPU-0",
                "name": "T4",
                "memoryMiB": 15360,
                "usedMiB": 9300,
                "processes": [{"pid": 41233, "usedMiB": 5200}, {"pid": 41250}],
            }
        ]
    }
    read = inventory.parse(document, source="f").cards[0]
    assert read.used_mib == 9300
    assert read.processes == (inventory.Process(pid=41233, used_mib=5200), inventory.Process(pid=41250, used_mib=None))


def test_an_inventory_without_usage_fields_reads_as_unknown_use() -> None:
    read = inventory.parse({"gpus": [{"index": 0, "uuid": "GPU-0", "name": "T4", "memoryMiB": 1}]}, source="f").cards[0]
    assert (read.used_mib, read.processes) == (None, ())


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("usedMiB", -1, "usedMiB: expected a non-negative integer"),
        ("usedMiB", "9GiB", "usedMiB: expected a non-negative integer"),
        ("processes", {"pid": 1}, "processes: expected a list"),
        ("processes", [7], "processes[0]: expected a mapping"),
        ("processes", [{"pid": 0}], "processes[0].pid: expected a positive integer"),
        ("processes", [{"pid": True}], "processes[0].pid: expected a positive integer"),
        ("processes", [{"pid": 5, "usedMiB": 1.5}], "processes[0].usedMiB"),
        ("processes", [{"pid": 5}, {"pid": 5}], "listed twice"),
    ],
)
def test_bad_usage_fields_are_named(field: str, value: Any, message: str) -> None:
    entry = {"index": 0, "uuid": "GPU-0", "name": "T4", "memoryMiB": 1, field: value}
    with pytest.raises(inventory.InventoryError, match=message.replace("[", r"\[").replace("]", r"\]")):
        inventory.parse({"gpus": [entry]}, source="f")


# --- attribution -----------------------------------------------------------------------------------


def test_processes_are_attributed_to_pods_and_the_rest_is_out_of_band(tmp_path: Path) -> None:
    root = proc_root(tmp_path, PROCS)
    inv = inventory.make([card(0, processes=ALL), card(1, used=0)])
    summary = attribution.summarise(inv, pods=PODS, identify=lambda pid: cgroups.read(pid, proc_root=root), now=0.0)
    first = summary.cards[0]
    assert {(p.uid, p.namespace, p.name, p.used_mib, p.pids) for p in first.pods} == {
        (UID_A, "ml", "train-0", 1500, 2),
        ("mirror-uid", "kube-system", "gpu-probe-gpu-0", 200, 1),  # a static pod is its mirror pod
    }
    assert {(o.pid, o.used_mib, o.container_id, o.pod_uid) for o in first.out_of_band} == {
        (200, 3000, CID, ""),
        (300, 700, CID, UID_GONE),
        (500, None, "", ""),
    }
    assert first.unknown == (999,)  # no /proc entry: neither blamed nor counted
    assert first.out_of_band_mib == 3700
    assert summary.cards[1] == usage.CardUse(index=1, total_mib=15360, used_mib=0)
    assert summary.at == "1970-01-01T00:00:00Z"


def test_without_the_hosts_proc_every_process_is_unknown_never_out_of_band(tmp_path: Path) -> None:
    # The base DaemonSet (restricted Pod Security) mounts nothing at its --proc-root.
    missing = tmp_path / "host" / "proc"
    inv = inventory.make([card(0, processes=ALL)])
    summary = attribution.summarise(inv, pods=PODS, identify=lambda pid: cgroups.read(pid, proc_root=missing), now=0.0)
    (only,) = summary.cards
    assert only.unknown == tuple(pid for pid, _ in ALL)
    assert only.out_of_band == () and only.pods == ()
    assert only.used_mib == 12000  # the card's memory in use is still published


def test_a_runner_without_the_hosts_proc_says_so_once_and_still_writes_the_summary(
    setup: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    nodes, pods, clock, state, make = setup
    loop = make(proc_root=tmp_path / "host" / "proc")
    caplog.set_level("INFO")
    assert loop.step() is runner.Outcome.CHANGED
    state["inv"] = inventory.make([card(0, used=14000, processes=((100, 1000), (200, 3000)))])
    clock.now += 3600
    loop.step()
    said = [r.getMessage() for r in caplog.records if "process attribution is off" in r.getMessage()]
    assert len(said) == 1 and "host" in said[0]
    written = usage.parse(nodes.annotations(NODE)[usage.USAGE_ANNOTATION])
    assert written is not None and written.cards[0].unknown == (100, 200) and written.cards[0].out_of_band == ()


def test_without_a_pod_list_a_pod_cgroup_is_its_pod_by_uid_alone(tmp_path: Path) -> None:
    root = proc_root(tmp_path, PROCS)
    inv = inventory.make([card(0, processes=((100, 1), (300, 2), (200, 3)))])
    views = attribution.views(inv, pods=None, identify=lambda pid: cgroups.read(pid, proc_root=root))
    by_pid = {v.pid: v for v in views}
    assert by_pid[100].pod == attribution.PodRef(uid=UID_A, namespace="", name="")
    assert by_pid[300].pod is not None and not by_pid[300].out_of_band
    assert by_pid[200].out_of_band and by_pid[200].pod is None


def test_pod_refs_read_from_pod_objects_never_raise() -> None:
    mirror = {
        "metadata": {
            "uid": "u",
            "namespace": "kube-system",
            "name": "m",
            "annotations": {attribution.MIRROR_HASH_ANNOTATION: "h"},
        }
    }
    assert attribution.PodRef.from_object(mirror) == attribution.PodRef(
        uid="u", namespace="kube-system", name="m", config_hash="h"
    )
    assert attribution.PodRef.from_object({"metadata": "x"}) == attribution.PodRef(uid="", namespace="", name="")
    assert attribution.PodRef.from_object({"metadata": {"annotations": [1]}}).config_hash == ""


# --- the runner writes the summary, rate-limited -----------------------------------------------------


class FakePods:
    def __init__(self, pods: list[Mapping[str, Any]]) -> None:
        self.pods = pods
        self.calls: list[str] = []
        self.fail: Exception | None = None

    def pods_on(self, node_name: str) -> list[Mapping[str, Any]]:
        self.calls.append(node_name)
        if self.fail is not None:
            raise self.fail
        return list(self.pods)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


POD_OBJECTS: list[Mapping[str, Any]] = [{"metadata": {"uid": UID_A, "namespace": "ml", "name": "train-0"}}]


@pytest.fixture
def setup(tmp_path: Path, fake_nodes: Any, node: Any) -> Any:
    root = proc_root(tmp_path, PROCS)
    nodes = fake_nodes(node(NODE, labels={gpu.SCHEDULE_LABEL: "share"}))
    pods = FakePods(POD_OBJECTS)
    clock = Clock()
    state: dict[str, inventory.Inventory] = {"inv": inventory.make([card(0, processes=((100, 1000),))])}

    def make(**options: Any) -> runner.Runner:
        return runner.Runner(
            source=lambda: state["inv"],
            nodes=nodes,
            pods=pods,
            clock=clock,
            wall_clock=lambda: 0.0,
            options=runner.Options(node_name=NODE, usage_interval_s=60.0, **{"proc_root": root, **options}),
        )

    return nodes, pods, clock, state, make


def usage_patches(nodes: Any) -> list[str | None]:
    return [
        body["metadata"]["annotations"][usage.USAGE_ANNOTATION]
        for _, body in nodes.patches
        if usage.USAGE_ANNOTATION in body.get("metadata", {}).get("annotations", {})
    ]


def test_the_first_pass_writes_the_summary_and_lists_only_this_nodes_pods(setup: Any) -> None:
    nodes, pods, _, _, make = setup
    loop = make()
    assert loop.step() is runner.Outcome.CHANGED
    written = usage.parse(nodes.annotations(NODE)[usage.USAGE_ANNOTATION])
    assert written is not None and written.cards[0].pods[0].name == "train-0"
    assert pods.calls == [NODE]
    assert len(usage_patches(nodes)) == 1


def test_an_insignificant_change_writes_nothing(setup: Any) -> None:
    nodes, _, clock, state, make = setup
    loop = make()
    loop.step()
    clock.now += 3600
    state["inv"] = inventory.make([card(0, used=12000 + 100, processes=((100, 1100),))])
    assert loop.step() is runner.Outcome.UNCHANGED
    assert len(usage_patches(nodes)) == 1


def test_a_significant_change_waits_for_the_interval_then_is_written(setup: Any) -> None:
    nodes, _, clock, state, make = setup
    loop = make()
    loop.step()
    state["inv"] = inventory.make([card(0, processes=((100, 1000), (200, 3000)))])  # docker run appears
    clock.now += 30
    assert loop.step() is runner.Outcome.UNCHANGED  # too soon after the last write
    assert len(usage_patches(nodes)) == 1
    clock.now += 30
    assert loop.step() is runner.Outcome.CHANGED
    patches = usage_patches(nodes)
    assert len(patches) == 2
    last = usage.parse(patches[-1])
    assert last is not None and [o.pid for o in last.cards[0].out_of_band] == [200]
    assert loop.usage_writes == 2


def test_a_restarted_labeler_does_not_rewrite_an_equal_summary(setup: Any) -> None:
    nodes, _, _, _, make = setup
    make().step()
    assert make().step() is runner.Outcome.UNCHANGED
    assert len(usage_patches(nodes)) == 1


def test_a_failed_pod_list_keeps_the_last_summary(setup: Any, caplog: pytest.LogCaptureFixture) -> None:
    nodes, pods, clock, state, make = setup
    loop = make()
    loop.step()
    pods.fail = kube_errors.KubeError("list pods on node gpu-0: 403 Forbidden: no", status=403)
    state["inv"] = inventory.make([card(0, processes=((200, 3000),))])
    clock.now += 120
    assert loop.step() is runner.Outcome.UNCHANGED
    assert len(usage_patches(nodes)) == 1
    assert "listing the pods of node gpu-0 failed" in caplog.text


def test_a_source_that_knows_no_use_writes_no_summary_and_removes_ours(setup: Any) -> None:
    nodes, _, clock, state, make = setup
    loop = make()
    loop.step()
    state["inv"] = inventory.make([inventory.Card(index=0, uuid="GPU-0", name="Tesla T4", memory_mib=15360)])
    clock.now += 120
    loop.step()
    assert usage.USAGE_ANNOTATION not in nodes.annotations(NODE)
    assert usage_patches(nodes)[-1] is None
    loop.step()
    assert usage_patches(nodes).count(None) == 1


def test_cards_without_processes_need_no_pod_list(setup: Any) -> None:
    nodes, pods, _, state, make = setup
    state["inv"] = inventory.make([card(0, used=300), card(1, used=0)])
    make().step()
    assert pods.calls == []
    written = usage.parse(nodes.annotations(NODE)[usage.USAGE_ANNOTATION])
    assert written is not None and [c.used_mib for c in written.cards] == [300, 0]


def test_without_a_pod_lister_the_runner_writes_no_summary(fake_nodes: Any, node: Any) -> None:
    nodes = fake_nodes(node(NODE))
    loop = runner.Runner(
        source=lambda: inventory.make([card(0, processes=((1, 1),))]), nodes=nodes, options=runner.Options(node_name=NODE)
    )
    loop.step()
    assert usage.USAGE_ANNOTATION not in nodes.annotations(NODE)


# --- --dry-run ---------------------------------------------------------------------------------------


def test_dry_run_json_shows_each_process_with_its_pod_or_out_of_band(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = proc_root(tmp_path, PROCS)
    inventory_file = tmp_path / "inventory.yaml"
    inventory_file.write_text(
        json.dumps(
            {
                "gpus": [
                    {
                        "index": 0,
                        "uuid": "GPU-0",
                        "name": "Tesla T4",
                        "memoryMiB": 15360,
                        "usedMiB": 5000,
                        "processes": [{"pid": 100, "usedMiB": 1000}, {"pid": 200, "usedMiB": 3000}, {"pid": 999}],
                    },
                ]
            }
        )
    )
    status = cli.main(
        [
            "labeler",
            "--once",
            "--dry-run",
            "-o",
            "json",
            "--inventory",
            str(inventory_file),
            "--node-name",
            NODE,
            "--proc-root",
            str(root),
        ]
    )
    assert status == 0
    report = json.loads(capsys.readouterr().out)
    assert report["usage"] == [
        {
            "index": 0,
            "usedMiB": 5000,
            "totalMiB": 15360,
            "processes": [
                {"pid": 100, "usedMiB": 1000, "pod": {"namespace": None, "name": None, "uid": UID_A}, "containerID": CID},
                {"pid": 200, "usedMiB": 3000, "outOfBand": True, "containerID": CID},
                {"pid": 999, "usedMiB": None, "unknown": True},
            ],
        }
    ]


def test_dry_run_with_list_pods_names_the_pods(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from webhook.labeler import publisher

    class Connected:
        def pods_on(self, node_name: str) -> list[Mapping[str, Any]]:
            assert node_name == NODE
            return POD_OBJECTS

    monkeypatch.setattr(publisher, "connect", lambda _, **__: Connected())
    root = proc_root(tmp_path, PROCS)
    inventory_file = tmp_path / "inventory.yaml"
    inventory_file.write_text(
        json.dumps(
            {
                "gpus": [
                    {
                        "index": 0,
                        "uuid": "GPU-0",
                        "name": "Tesla T4",
                        "memoryMiB": 15360,
                        "processes": [{"pid": 100, "usedMiB": 1}, {"pid": 300, "usedMiB": 2}],
                    },
                ]
            }
        )
    )
    args = [
        "labeler",
        "--dry-run",
        "--list-pods",
        "-o",
        "json",
        "--inventory",
        str(inventory_file),
        "--node-name",
        NODE,
        "--proc-root",
        str(root),
    ]
    assert cli.main(args) == 0
    processes = json.loads(capsys.readouterr().out)["usage"][0]["processes"]
    assert processes[0]["pod"] == {"namespace": "ml", "name": "train-0", "uid": UID_A}
    assert processes[1] == {"pid": 300, "usedMiB": 2, "outOfBand": True, "containerID": CID, "podUID": UID_GONE}


def test_dry_run_table_marks_out_of_band_processes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = proc_root(tmp_path, PROCS)
    inventory_file = tmp_path / "inventory.yaml"
    inventory_file.write_text(
        json.dumps(
            {
                "gpus": [
                    {
                        "index": 0,
                        "uuid": "GPU-0",
                        "name": "Tesla T4",
                        "memoryMiB": 15360,
                        "processes": [{"pid": 200, "usedMiB": 3000}],
                    },
                ]
            }
        )
    )
    assert (
        cli.main(["labeler", "--dry-run", "--inventory", str(inventory_file), "--node-name", NODE, "--proc-root", str(root)]) == 0
    )
    assert f"pid 200: 3000 MiB, OUT-OF-BAND container {CID[:12]}" in capsys.readouterr().out


# --- the pod list against the kubernetes client ------------------------------------------------------


def test_the_publisher_lists_only_its_nodes_pods_from_the_watch_cache() -> None:
    import types

    from webhook.labeler import publisher

    calls: list[dict[str, Any]] = []

    class Api:
        def list_pod_for_all_namespaces(self, **kwargs: Any) -> Any:
            calls.append(kwargs)
            metadata = types.SimpleNamespace(uid=UID_A, namespace="ml", name="train-0", annotations=None)
            return types.SimpleNamespace(items=[types.SimpleNamespace(metadata=metadata)])

    listed = publisher.Publisher(Api()).pods_on(NODE)
    assert listed == [{"metadata": {"uid": UID_A, "namespace": "ml", "name": "train-0", "annotations": {}}}]
    assert calls[0]["field_selector"] == f"spec.nodeName={NODE}" and calls[0]["resource_version"] == "0"


def test_a_forbidden_pod_list_is_an_api_error() -> None:
    from webhook.kube import client
    from webhook.labeler import publisher

    class Api:
        def list_pod_for_all_namespaces(self, **kwargs: Any) -> Any:
            raise client.ApiException(status=403, reason="Forbidden")

    with pytest.raises(kube_errors.KubeError, match="list pods on node gpu-0: 403 Forbidden"):
        publisher.Publisher(Api()).pods_on(NODE)


# --- metrics -----------------------------------------------------------------------------------------


def test_metrics_expose_real_use_and_out_of_band_processes_per_card(setup: Any) -> None:
    from webhook.labeler import health
    from webhook.serving import metrics

    _, _, _, state, make = setup
    state["inv"] = inventory.make([card(0, used=7000, processes=((100, 1000), (200, 6000))), card(1, used=0)])
    loop = make()
    loop.step()
    text = health.registry(loop).render()
    assert metrics.sample(text, health.CARD_USED_METRIC, card="0") == 7000
    assert metrics.sample(text, health.OUT_OF_BAND_MIB_METRIC, card="0") == 6000
    assert metrics.sample(text, health.OUT_OF_BAND_PROCESSES_METRIC, card="0") == 1
    assert metrics.sample(text, health.OUT_OF_BAND_PROCESSES_METRIC, card="1") == 0
    assert metrics.sample(text, health.USAGE_WRITES_METRIC) == 1
