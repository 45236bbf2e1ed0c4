"""bench/apiserver_probe.py: the parsing behind the extender bench's apiserver figures (metrics
text, counter deltas, per-pod ranking, pprof listings), on fixed inputs."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType

import pytest

ROOT = pathlib.Path(__file__).parents[3]


def _probe() -> ModuleType:
    spec = importlib.util.spec_from_file_location("apiserver_probe", ROOT / "bench" / "apiserver_probe.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("apiserver_probe", module)
    spec.loader.exec_module(module)
    return module


probe = _probe()

METRICS = """\
# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",group="",resource="pods",scope="resource",subresource="binding",verb="POST",version="v1"} 1000
apiserver_request_total{code="409",component="apiserver",group="",resource="pods",scope="resource",subresource="binding",verb="POST",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 450
apiserver_watch_events_total{group="",resource="pods",version="v1"} 7000
apiserver_watch_events_sizes_sum{group="",resource="pods",version="v1"} 1.6e+07
apiserver_watch_events_total{group="",kind="Node",version="v1"} 300
apiserver_longrunning_requests{component="apiserver",group="",resource="pods",scope="cluster",subresource="",verb="WATCH",version="v1"} 4
apiserver_longrunning_requests{component="apiserver",group="",resource="pods",scope="namespace",subresource="exec",verb="CONNECT",version="v1"} 2
apiserver_other_total{label="a \\"quoted\\" value"} 9
"""


def test_families_reads_only_the_named_metrics_and_their_labels() -> None:
    found = probe.families(METRICS, {"apiserver_request_total", "apiserver_other_total"})
    assert [value for _, value in found["apiserver_request_total"]] == [1000.0, 3.0, 450.0]
    assert found["apiserver_request_total"][2][0]["group"] == "coordination.k8s.io"
    assert found["apiserver_other_total"] == [({"label": 'a \\"quoted\\" value'}, 9.0)]


def test_snapshot_sums_codes_names_groups_and_keeps_only_watches_open(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "fetch", lambda state, path: METRICS.encode())
    taken = probe.snapshot(None)
    assert taken.requests == {"POST pods/binding": 1003.0, "PUT leases.coordination.k8s.io": 450.0}
    assert taken.watch_events == {"pods": 7000.0, "node": 300.0}  # an older apiserver's `kind` label
    assert taken.watch_bytes == {"pods": 1.6e7}
    assert taken.watches_open == {"pods": 4.0}  # CONNECT (exec) is not a watch


def test_minus_keeps_what_grew_and_the_gauge_as_it_is_now() -> None:
    earlier = probe.Snapshot(
        requests={"a": 10.0, "b": 5.0}, watch_events={"pods": 1.0}, watch_bytes={}, watches_open={"pods": 3.0}
    )
    later = probe.Snapshot(
        requests={"a": 25.0, "b": 5.0, "c": 2.0},
        watch_events={"pods": 4.0},
        watch_bytes={"pods": 8.0},
        watches_open={"pods": 5.0},
    )
    delta = later.minus(earlier)
    assert delta.requests == {"a": 15.0, "c": 2.0}
    assert delta.watch_events == {"pods": 3.0}
    assert delta.watch_bytes == {"pods": 8.0}
    assert delta.watches_open == {"pods": 5.0}


def test_per_pod_ranks_divides_and_drops_the_negligible() -> None:
    counts = {"small": 1.0, "big": 3000.0, "mid": 500.0, "other": 20.0}
    assert probe.per_pod(counts, 1000) == {"big": 3.0, "mid": 0.5, "other": 0.02}
    assert probe.per_pod(counts, 1000, top=2) == {"big": 3.0, "mid": 0.5}


LISTING = """\
File: kube-apiserver
Type: cpu
Duration: 4s, Total samples = 1.97s (49.25%)
Showing nodes accounting for 0.10s, 5.08% of 1.97s total
      flat  flat%   sum%        cum   cum%
         0     0%     0%      1.20s 60.91%  net/http.HandlerFunc.ServeHTTP
         0     0%     0%      250ms 12.69%  k8s.io/apiserver/pkg/storage/etcd3.(*store).GuaranteedUpdate
      10ms  0.51%  0.51%      150ms  7.61%  k8s.io/apiserver/pkg/authentication/request/x509.(*Authenticator).AuthenticateRequest
         0     0%  0.51%       40ms  2.03%  k8s.io/apimachinery/pkg/runtime/serializer/json.(*Serializer).doEncode (inline)
         0     0%  0.51%       0.5s 25.38%  runtime.gcBgMarkWorker
"""


def test_buckets_read_cumulative_times_in_any_unit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "pprof_top", lambda path, **_: LISTING)
    found = probe.buckets(pathlib.Path("unused.pprof"))
    assert found["etcd update (GuaranteedUpdate)"] == pytest.approx(0.25)
    assert found["client-cert authentication (x509 verify, per request)"] == pytest.approx(0.15)
    assert found["JSON encode"] == pytest.approx(0.04)  # "(inline)" stripped
    assert found["GC mark (background)"] == pytest.approx(0.5)
    assert found["TLS handshake"] == 0.0
    assert set(found) == {label for label, _ in probe.BUCKETS}


@pytest.mark.parametrize(
    ("header", "seconds"), [("Total samples = 1.97s (49%)", 1.97), ("Total samples = 990ms (48%)", 0.99), ("nothing", None)]
)
def test_profile_cpu_seconds_from_the_header(monkeypatch: pytest.MonkeyPatch, header: str, seconds: float | None) -> None:
    monkeypatch.setattr(probe, "pprof_top", lambda path, **_: f"Duration: 4s, {header}\n")
    assert probe.profile_cpu_seconds(pathlib.Path("unused.pprof")) == (pytest.approx(seconds) if seconds is not None else None)
