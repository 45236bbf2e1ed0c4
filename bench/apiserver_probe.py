"""What kube-apiserver spends on a benchmark round, read from the apiserver itself.

- `Snapshot`: its `/metrics` counters that say where requests and watch traffic go: requests by
  (verb, resource, subresource), watch events sent and their bytes by resource, and the watches
  open at the moment (`apiserver_longrunning_requests`, verb WATCH) by resource. Two snapshots
  around a round give what the round cost (`Snapshot.minus`).
- `Profile`: a CPU profile of kube-apiserver (`/debug/pprof/profile`, enabled by default) taken
  over a window of a round, summarised with `go tool pprof` when Go is installed.
- `idle_cores`: the apiserver's and etcd's CPU rate with nothing scheduled (KWOK's heartbeats,
  controllers), the background every round pays for as long as it lasts.

Used by `extender_throughput.py --profile`; a bench helper, not part of the product.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import ssl
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from webhook.cluster import controlplane

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def fetch(state: controlplane.State, path: str, *, timeout: float = 120.0, server: str = "") -> bytes:
    """GET `path` from the cluster's apiserver as the admin user (client certificate); from
    `server` instead (a component's own port, e.g. kube-scheduler's, whose serving certificate is
    self-signed and not checked) when given."""
    pki = state.directory / "pki"
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if server:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    with urllib.request.urlopen((server or state.server) + path, context=context, timeout=timeout) as answer:
        return bytes(answer.read())


def families(text: str, names: set[str]) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The samples of the metric families `names` in a Prometheus text exposition."""
    found: dict[str, list[tuple[dict[str, str], float]]] = {name: [] for name in names}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        match = _SAMPLE.match(line)
        if match is None or match["name"] not in names:
            continue
        labels = dict(_LABEL.findall(match["labels"] or ""))
        try:
            found[match["name"]].append((labels, float(match["value"])))
        except ValueError:
            continue
    return found


def _resource(labels: dict[str, str]) -> str:
    """`resource` (or, in older apiservers, `kind`) with its group, e.g. `leases.coordination.k8s.io`."""
    name = labels.get("resource") or labels.get("kind", "").lower()
    group = labels.get("group", "")
    return f"{name}.{group}" if group else name


@dataclasses.dataclass
class Snapshot:
    requests: dict[str, float]  # "VERB resource[/subresource]" -> count, over codes and scopes
    watch_events: dict[str, float]  # resource -> events sent to watchers
    watch_bytes: dict[str, float]  # resource -> bytes of those events
    watches_open: dict[str, float]  # resource -> watches open now (a gauge, not a counter)

    def minus(self, earlier: Snapshot) -> Snapshot:
        def delta(now: dict[str, float], then: dict[str, float]) -> dict[str, float]:
            return {key: value - then.get(key, 0.0) for key, value in now.items() if value - then.get(key, 0.0) > 0}

        return Snapshot(
            requests=delta(self.requests, earlier.requests),
            watch_events=delta(self.watch_events, earlier.watch_events),
            watch_bytes=delta(self.watch_bytes, earlier.watch_bytes),
            watches_open=dict(self.watches_open),
        )


def snapshot(state: controlplane.State) -> Snapshot:
    text = fetch(state, "/metrics").decode()
    found = families(
        text,
        {
            "apiserver_request_total",
            "apiserver_watch_events_total",
            "apiserver_watch_events_sizes_sum",
            "apiserver_longrunning_requests",
        },
    )
    requests: dict[str, float] = {}
    for labels, value in found["apiserver_request_total"]:
        sub = labels.get("subresource", "")
        key = f"{labels.get('verb', '')} {_resource(labels)}{'/' + sub if sub else ''}"
        requests[key] = requests.get(key, 0.0) + value
    events: dict[str, float] = {}
    for labels, value in found["apiserver_watch_events_total"]:
        events[_resource(labels)] = events.get(_resource(labels), 0.0) + value
    sizes: dict[str, float] = {}
    for labels, value in found["apiserver_watch_events_sizes_sum"]:
        sizes[_resource(labels)] = sizes.get(_resource(labels), 0.0) + value
    watches: dict[str, float] = {}
    for labels, value in found["apiserver_longrunning_requests"]:
        if labels.get("verb") == "WATCH":
            watches[_resource(labels)] = watches.get(_resource(labels), 0.0) + value
    return Snapshot(requests=requests, watch_events=events, watch_bytes=sizes, watches_open=watches)


def per_pod(counts: dict[str, float], pods: int, *, top: int = 12, floor: float = 0.005) -> dict[str, float]:
    """The largest `top` entries of `counts` divided by `pods`, those under `floor` left out."""
    ranked = sorted(counts.items(), key=lambda item: -item[1])[:top]
    return {key: round(value / pods, 3) for key, value in ranked if value / pods >= floor}


class Profile:
    """A kube-apiserver CPU profile of `seconds` (of another component's, at `server`), started in
    a thread once `ready()` is true (polled every 50 ms); `window` is when it ran (monotonic), to
    count what happened inside it."""

    def __init__(
        self, state: controlplane.State, path: Path, *, seconds: int, ready: Callable[[], bool], server: str = ""
    ) -> None:
        self.state, self.path, self.seconds, self.ready, self.server = state, path, seconds, ready, server
        self.window: tuple[float, float] | None = None
        self.error = ""
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.ready():
            if self.stopped.wait(0.05):
                return
        began = time.monotonic()
        try:
            data = fetch(
                self.state, f"/debug/pprof/profile?seconds={self.seconds}", timeout=self.seconds + 60, server=self.server
            )
        except Exception as error:  # noqa: BLE001 - a bench figure, reported, not fatal
            self.error = str(error)
            return
        self.window = (began, time.monotonic())
        self.path.write_bytes(data)

    def join(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=self.seconds + 90)


def go_binary() -> str | None:
    return shutil.which("go") or next((p for p in ("/usr/local/go/bin/go",) if os.access(p, os.X_OK)), None)


def pprof_top(path: Path, *, cumulative: bool = False, count: int = 25, focus: str = "") -> str:
    """`go tool pprof -top` of a profile (empty without Go)."""
    go = go_binary()
    if go is None or not path.exists():
        return ""
    command = [
        go,
        "tool",
        "pprof",
        "-top",
        f"-nodecount={count}",
        *(["-cum"] if cumulative else []),
        *([f"-focus={focus}"] if focus else []),
        str(path),
    ]
    completed = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
    return completed.stdout


# Where kube-apiserver's CPU goes, by function (cumulative time: a bucket includes what it calls,
# and buckets overlap, e.g. a Binding's etcd update is in both "Binding" and "etcd update").
BUCKETS: tuple[tuple[str, str], ...] = (
    ("request filters + handler goroutine (all requests)", r"filterlatency\.trackStarted\.func1$"),
    ("  store work (finishRequest goroutine)", r"handlers/finisher\.finishRequest\.func1$"),
    ("  Binding (pods/binding)", r"pod/storage\.\(\*BindingREST\)\.Create$"),
    ("  pod status update (PATCH pods/status)", r"pod/storage\.\(\*StatusREST\)\.Update$"),
    ("etcd update (GuaranteedUpdate)", r"etcd3\.\(\*store\)\.GuaranteedUpdate$"),
    ("etcd create", r"etcd3\.\(\*store\)\.Create$"),
    ("LIST from the watch cache", r"cacher\.\(\*CacheDelegator\)\.GetList$"),
    ("watch serving (WatchServer)", r"handlers\.\(\*WatchServer\)\.HandleHTTP$"),
    ("  encode once per encoding (cachingObject)", r"cacher\.\(\*cachingObject\)\.CacheEncode$"),
    ("JSON encode", r"serializer/json\.\(\*Serializer\)\.doEncode$"),
    ("protobuf encode", r"serializer/protobuf\.\(\*Serializer\)\.doEncode$"),
    ("JSON decode", r"serializer/json\.\(\*Serializer\)\.Decode$"),
    ("cacher dispatch to watchers", r"cacher\.\(\*Cacher\)\.dispatchEvents$"),
    ("client-cert authentication (x509 verify, per request)", r"request/x509\.\(\*Authenticator\)\.AuthenticateRequest$"),
    ("TLS handshake", r"crypto/tls\.\(\*Conn\)\.serverHandshake$"),
    ("TLS write", r"crypto/tls\.\(\*Conn\)\.Write$"),
    ("TLS read", r"crypto/tls\.\(\*Conn\)\.Read$"),
    ("GC mark (background)", r"runtime\.gcBgMarkWorker$"),
    ("malloc", r"runtime\.mallocgc$"),
)


# The same for kube-scheduler: its scheduling cycle, the extender calls, its binding.
SCHEDULER_BUCKETS: tuple[tuple[str, str], ...] = (
    ("scheduling cycle", r"scheduler\.\(\*Scheduler\)\.schedulingCycle$"),
    ("  in-tree filters (findNodesThatPassFilters)", r"\.\(\*Scheduler\)\.findNodesThatPassFilters$"),
    ("  in-tree scores (RunScorePlugins)", r"runtime\.\(\*frameworkImpl\)\.RunScorePlugins$"),
    ("  extender filter call", r"scheduler\.\(\*HTTPExtender\)\.Filter$"),
    ("  extender prioritize call", r"scheduler\.\(\*HTTPExtender\)\.Prioritize$"),
    ("binding cycle", r"scheduler\.\(\*Scheduler\)\.bindingCycle$"),
    ("  extender bind call", r"scheduler\.\(\*HTTPExtender\)\.Bind$"),
    ("extender HTTP (send: encode, round trip, decode)", r"scheduler\.\(\*HTTPExtender\)\.send$"),
    ("JSON encode (encoding/json)", r"encoding/json\.\(\*Encoder\)\.Encode$"),
    ("JSON decode (encoding/json)", r"encoding/json\.\(\*Decoder\)\.Decode$"),
    ("informer event handling (pods, nodes)", r"cache\.\(\*processorListener\)\.run$"),
    ("GC mark (background)", r"runtime\.gcBgMarkWorker$"),
    ("malloc", r"runtime\.mallocgc$"),
)


def buckets(path: Path, table: tuple[tuple[str, str], ...] = BUCKETS) -> dict[str, float]:
    """CPU seconds per `table` entry (cumulative), from `go tool pprof -top -cum`."""
    listing = pprof_top(path, cumulative=True, count=100000)
    units = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "ms": 1e-3, "s": 1.0, "mins": 60.0}
    rows: list[tuple[str, float]] = []
    for line in listing.splitlines():
        fields = line.split(None, 5)
        if len(fields) < 6:
            continue
        match = re.fullmatch(r"([\d.]+)(ns|us|\u00b5s|ms|s|mins)", fields[3])
        if match is None:
            continue
        rows.append((fields[5].removesuffix(" (inline)"), float(match[1]) * units[match[2]]))
    found: dict[str, float] = {}
    for label, pattern in table:
        compiled = re.compile(pattern)
        found[label] = sum(seconds for name, seconds in rows if compiled.search(name))
    return found


def profile_cpu_seconds(path: Path) -> float | None:
    """The CPU seconds a profile sampled ("Total samples = 3.2s"), from `go tool pprof -top`."""
    match = re.search(r"Total samples = ([\d.]+)(ms|s|mins)", pprof_top(path, count=1))
    if match is None:
        return None
    return float(match[1]) * {"ms": 0.001, "s": 1.0, "mins": 60.0}[match[2]]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its reaped children, from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def idle_cores(state: controlplane.State, names: list[str], *, seconds: float) -> dict[str, float]:
    """CPU cores each of `names` uses over `seconds` with nothing else asked of the cluster."""
    before = {name: cpu_seconds(state.pids[name]) for name in names if name in state.pids}
    time.sleep(seconds)
    return {name: round((cpu_seconds(state.pids[name]) - value) / seconds, 3) for name, value in before.items()}
